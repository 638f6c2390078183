"""Interpreter versus direct JAX, primitive by primitive.

Each case is a small function built around a family of lax primitives. The
interpreted value-and-grad must equal JAX's, with nothing evicted (budget
1.0) and under pressure (0.6, where rematerialization replays the
primitives). The sweep must cover every primitive that appears in the
gradients of the reference models.
"""

from __future__ import annotations

import functools
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jdtr
from jdtr import models
from jdtr.transform import _jax_core, normalize

K = jax.random.PRNGKey(1)
A = jax.random.normal(K, (6, 8))
B = jax.random.normal(jax.random.PRNGKey(2), (8, 5))
IMG = jax.random.normal(K, (2, 6, 6, 3))
KER = jax.random.normal(K, (3, 3, 3, 4))

CASES = {
    "unary": (lambda x: jnp.sum(jnp.sin(x) * jnp.cos(x) + jnp.tanh(x) + jnp.exp(x / 4) + jax.nn.sigmoid(x)), (A,)),
    "logs_roots": (lambda x: jnp.sum(jnp.log(x**2 + 1) + jnp.sqrt(x**2 + 1) + lax.rsqrt(x**2 + 1) + jnp.log1p(x**2)), (A,)),
    "powers": (lambda x: jnp.sum(x**3 + jnp.square(x) + jnp.abs(x) ** 1.5 + lax.integer_pow(x, 2)), (A,)),
    "special": (lambda x: jnp.sum(jax.scipy.special.erf(x) + jnp.arctan2(x, 1.5) - jnp.expm1(x / 8)), (A,)),
    "binary": (lambda x, y: jnp.sum(jnp.maximum(x, y) * jnp.minimum(x, y) + x / (jnp.abs(y) + 1) - y), (A, A[::-1])),
    "select": (lambda x: jnp.sum(jnp.where(x > 0, x * 2, -x) + jnp.clip(x, -0.5, 0.5)), (A,)),
    "matmul": (lambda x, y: jnp.sum(jnp.tanh(x @ y) ** 2), (A, B)),
    "batched_dot": (lambda x: jnp.sum(jnp.einsum("bij,bjk->bik", x, x.transpose(0, 2, 1)) ** 2), (A.reshape(2, 3, 8),)),
    "conv": (lambda x, k: jnp.sum(jax.nn.relu(lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))), (IMG, KER)),
    "strided_conv": (lambda x, k: jnp.mean(lax.conv_general_dilated(x, k, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")) ** 2), (IMG, KER)),
    "reductions": (lambda x: jnp.sum(x, 0).max() + jnp.max(x, 1).sum() + jnp.min(x) + jnp.prod(x[:2, :3] + 2) + jnp.mean(x**2), (A,)),
    "argmax_side": (lambda x: jnp.sum(x * jax.nn.one_hot(jnp.argmax(x, axis=1), 8)), (A,)),
    "cumulative": (lambda x: jnp.sum(jnp.cumsum(x, axis=1) ** 2) + jnp.sum(lax.cummax(x, axis=0)) + jnp.sum(jnp.cumprod(x[:, :3] / 4 + 1, 0)), (A,)),
    "broadcast": (lambda x, b: jnp.sum((x[:, None, :] + b[None, :, None]) ** 2), (A, jnp.arange(4.0))),
    "shapes": (lambda x: jnp.sum(jnp.transpose(x.reshape(2, 3, 8), (2, 0, 1)).reshape(8, 6)[::2] ** 2 * jnp.expand_dims(jnp.squeeze(x[:1]), 1)[:4]), (A,)),
    "slicing": (lambda x: jnp.sum(x[1:4, 2:7] ** 2) + jnp.sum(lax.dynamic_slice(x, (1, 2), (3, 3))) + jnp.sum(lax.dynamic_update_slice(x, jnp.ones((2, 2)), (2, 2)) ** 2), (A,)),
    "gather_scatter": (lambda x: jnp.sum(x[jnp.array([0, 2, 2, 5])] ** 2) + jnp.sum(x.at[jnp.array([1, 1, 3])].add(3.0) ** 2) + jnp.sum(jnp.take_along_axis(x, jnp.argsort(x, 1), 1)[:, :2]), (A,)),
    "concat_pad_rev": (lambda x: jnp.sum(jnp.concatenate([x, jnp.flip(x, 1), jnp.pad(x, ((1, 1), (0, 0)))[1:-1]], 1) ** 2) + sum(jnp.sum(p**2) for p in jnp.split(x, 2, 1)), (A,)),
    "sort_topk": (lambda x: jnp.sum(jnp.sort(x, axis=1)[:, -3:] ** 2) + jnp.sum(lax.top_k(x, 2)[0]), (A,)),
    "softmax_norm": (lambda x: jnp.sum(jax.nn.softmax(x) * jax.nn.log_softmax(x)) + jnp.sum(jax.nn.logsumexp(x, 1)) + jnp.sum(jax.nn.gelu(x)) + jnp.sum(jax.nn.standardize(x, axis=1) ** 3), (A,)),
    "iota_mask": (lambda x: jnp.sum(jnp.where(jnp.tril(jnp.ones((6, 8), bool)), x, 0.0) ** 2 * jnp.arange(8.0)), (A,)),
    "dtype_casts": (lambda x: jnp.sum(x.astype(jnp.bfloat16).astype(jnp.float32) ** 2 + x.astype(jnp.float16).astype(jnp.float32)), (A,)),
    "prng_replay": (lambda x, key: jnp.sum((x * jax.random.normal(key, x.shape)) ** 2) + jnp.sum(jax.random.bernoulli(key, 0.5, x.shape) * x), (A, K)),
    "dropout_mlp": (lambda x, key: jnp.sum(jnp.tanh(jnp.tanh(x @ B) * jax.random.bernoulli(key, 0.8, (6, 5)) @ B.T) ** 2), (A, K)),
    "scan_reverse": (lambda x: jnp.sum(lax.scan(lambda c, r: (jnp.tanh(c + r), c * r), jnp.zeros(8), x, reverse=True)[1] ** 2), (A,)),
    "fori": (lambda x: jnp.sum(lax.fori_loop(0, 4, lambda i, h: jnp.sin(h) * (i + 1.0), x)), (A,)),
    "cond_switch": (lambda x: jnp.sum(lax.switch(jnp.argmax(jnp.sum(x, 1)) % 3, [jnp.sin, jnp.cos, jnp.tanh], x) ** 2), (A,)),
    "map_vmap": (lambda x: jnp.sum(jax.vmap(lambda r: jnp.dot(r, r) * r)(x)) + jnp.sum(lax.map(jnp.sin, x)), (A,)),
    "stop_gradient": (lambda x: jnp.sum(lax.stop_gradient(x) * x ** 2), (A,)),
}


@functools.lru_cache(maxsize=None)
def reference(name):
    fun, args = CASES[name]
    return jax.value_and_grad(fun, argnums=0)(*args)


@pytest.mark.parametrize("budget", [1.0, 0.6])
@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreter_matches_jax(name, budget):
    fun, args = CASES[name]
    ref_value, ref_grad = reference(name)
    try:
        (value, grad), stats = jdtr.value_and_grad(fun, budget=budget, return_stats=True, debug=True)(*args)
    except jdtr.OutOfBudgetError:
        assert budget < 1.0
        return
    np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-5)
    assert stats.live_peak_bytes <= stats.budget_bytes


def _program_primitives(program):
    names = set()
    for item in program.body:
        if hasattr(item, "branches"):
            names |= {"cond"}
            for branch in item.branches:
                names |= _program_primitives(branch)
        else:
            names.add(item.name)
    return names


def test_sweep_covers_the_primitives_of_the_reference_models():
    covered = set()
    for fun, args in CASES.values():
        covered |= _program_primitives(normalize(jax.make_jaxpr(jax.value_and_grad(fun))(*args)))
    needed = set()
    for model in (models.mlp_chain(4, 8, 8), models.resnet(1, 4, 8, 2), models.transformer(1, 16, 2, 8, 2, 16), models.rnn(3, 8, 4, 2)):
        closed = jax.make_jaxpr(jax.value_and_grad(model.loss))(model.params, model.batch)
        needed |= _program_primitives(normalize(closed))
    assert needed <= covered, f"primitives not swept: {sorted(needed - covered)}"
    assert len(covered) >= 50


def _scanned(scale, const=None, length=4):
    """A loss of three `lax.scan`s, each traced from a fresh closure (so a
    jaxpr object of its own), computing `scale` (a literal) times its carry."""

    def loss(x):
        for _ in range(3):
            def body(c, _):
                c = jnp.tanh(c * scale)
                return (c + const if const is not None else c), None

            x = lax.scan(body, x, None, length=length)[0]
        return jnp.sum(x**2)

    return loss


def _scan_executables(loss, x):
    program = normalize(jax.make_jaxpr(jax.value_and_grad(loss))(x), keep_scans=True)
    return [item.executable for item in program.body if item.name == "scan"]


def test_equal_jaxprs_in_parameters_share_one_executable_and_different_ones_do_not():
    """Equations whose parameters hold jaxprs (a scan's body; a `shard_map`'s,
    a `cond`'s branches) share one executable where those jaxprs are equal
    in structure though traced apart, and so one compilation; a literal, a
    constant, a shape or a parameter that differs keeps them apart."""
    x = jnp.linspace(-1.0, 1.0, 8)
    forward, backward = _scan_executables(_scanned(0.5), x)[:3], _scan_executables(_scanned(0.5), x)[3:]
    assert len(forward) == len(backward) == 3
    assert len({id(e) for e in forward}) == 1 and len({id(e) for e in backward}) == 1
    (same,) = {id(e) for e in _scan_executables(_scanned(0.5), x)[:3]}  # traced again: still that one
    assert same == id(forward[0])
    assert id(_scan_executables(_scanned(0.25), x)[0]) != same  # another literal
    assert id(_scan_executables(_scanned(0.5, length=5), x)[0]) != same  # another parameter
    assert id(_scan_executables(_scanned(0.5), jnp.ones(4))[0]) != same  # another shape
    # A scan's closed-over array is an operand (its executable is shared); a jaxpr's own
    # constants count by identity: the same values in another array are another constant.
    one, other = jnp.full(8, 0.1), jnp.full(8, 0.1)
    assert len({id(e) for e in _scan_executables(_scanned(0.5, const=one), x)[:3]}) == 1
    closed = [jax.make_jaxpr(lambda v, c=c: jnp.sin(v) + c)(x) for c in (one, one, other)]
    assert [len(c.consts) for c in closed] == [1, 1, 1] and closed[0] is not closed[1]
    keys = [_jax_core.structural_key({"jaxpr": c}) for c in closed]
    assert keys[0] == keys[1] and hash(keys[0]) == hash(keys[1]) and keys[0] != keys[2]
    # And each computes its own: the interpreter's gradients are JAX's.
    for loss in (_scanned(0.5), _scanned(0.25), _scanned(0.5, const=one)):
        value, grad = jdtr.value_and_grad(loss, budget=0.6)(x)
        ref_value, ref_grad = jax.value_and_grad(loss)(x)
        np.testing.assert_allclose(value, ref_value, rtol=1e-6)
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-6)


def test_a_jaxprs_structure_is_remembered_without_keeping_it_alive():
    """The structure of a jaxpr in an equation's parameters is walked once
    per jaxpr object, and the memo does not keep the jaxpr (or the device
    arrays among its constants) alive."""
    x = jnp.ones(8)
    closed = jax.make_jaxpr(lambda v: jnp.sin(v) + jnp.full(8, 0.5))(x)
    first = _jax_core.structural_key({"jaxpr": closed})
    assert _jax_core.structural_key({"jaxpr": closed})[0][1] is first[0][1]  # remembered, not walked again
    dead = weakref.ref(closed)
    del closed, first
    gc.collect()
    assert dead() is None
