"""Interpreter versus direct JAX, primitive by primitive.

Each case is a small function built around a family of lax primitives. The
interpreted value-and-grad must equal JAX's, with nothing evicted (budget
1.0) and under pressure (0.6, where rematerialization replays the
primitives). The sweep must cover every primitive that appears in the
gradients of the reference models.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jdtr
from jdtr import models
from jdtr.transform import normalize

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
