"""Nearest upsampling's gather as a broadcast, and the scatter-add of its
pullback as a sum of strided slices (`transform/repeats.py`), on indices
that normalisation folds into constants."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jdtr
from jdtr.transform import repeats
from jdtr.transform.normalize import normalize
from jdtr.transform.program import Const, Equation


def _bits(x):
    return np.asarray(x).view(np.uint32)


def _eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        inner = e.params.get("jaxpr")  # (`jnp.take` and `lax.scatter_add` run under `jit`)
        if inner is not None:
            yield from _eqns(getattr(inner, "jaxpr", inner))


def _eqn(fn, *args, name):
    [eqn] = [e for e in _eqns(jax.make_jaxpr(fn)(*args).jaxpr) if e.primitive.name == name]
    return eqn


def _rewrite(eqn, consts):
    return repeats.substitute(eqn.primitive, eqn.params, [tuple(v.aval.shape) for v in eqn.invars], consts)


@pytest.mark.parametrize("axis,r", [(0, 2), (1, 3), (2, 2), (3, 4)])
def test_a_gather_of_repeated_indices_is_a_broadcast_bit_for_bit(axis, r):
    x = jnp.asarray(np.random.default_rng(axis).standard_normal((3, 5, 4, 2)).astype(np.float32))
    idx = np.arange(x.shape[axis] * r) // r
    eqn = _eqn(lambda x, i: jnp.take(x, i, axis=axis, mode="clip"), x, idx, name="gather")
    indices = np.asarray(idx, np.int32)[:, None]
    rewritten = _rewrite(eqn, [None, indices])
    assert rewritten is not None
    np.testing.assert_array_equal(_bits(rewritten(x, indices)), _bits(jnp.repeat(x, r, axis=axis)))


def test_a_scatter_add_of_repeated_indices_adds_in_the_scatter_s_order():
    """On an operand that is not zeros, each position's updates added one
    after another, as XLA's scatter: the same bits."""
    rng = np.random.default_rng(1)
    operand = jnp.asarray(rng.standard_normal((2, 6, 3)).astype(np.float32) * 1e3)
    updates = jnp.asarray(rng.standard_normal((2, 18, 3)).astype(np.float32))
    indices = (np.arange(18) // 3).astype(np.int32)[:, None]
    dnums = lax.ScatterDimensionNumbers(update_window_dims=(0, 2), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(1,))
    scatter = lambda o, i, u: lax.scatter_add(o, i, u, dnums, mode="promise_in_bounds")  # noqa: E731
    eqn = _eqn(scatter, operand, indices, updates, name="scatter-add")
    rewritten = _rewrite(eqn, [None, indices, None])
    assert rewritten is not None
    np.testing.assert_array_equal(_bits(rewritten(operand, indices, updates)), _bits(jax.jit(scatter)(operand, indices, updates)))


def test_what_is_left_to_jax():
    """Indices that are not constants, not repeats in order, or another
    form of gather bind as they are."""
    x = jnp.ones((4, 6))
    eqn = _eqn(lambda x, i: jnp.take(x, i, axis=1, mode="clip"), x, np.arange(12) // 2, name="gather")
    assert _rewrite(eqn, [None, None]) is None  # indices computed at run time
    assert _rewrite(eqn, [None, (np.arange(12)[::-1] // 2).astype(np.int32)[:, None]]) is None  # reversed
    assert _rewrite(eqn, [None, np.asarray([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 4], np.int32)[:, None]]) is None
    same = _eqn(lambda x, i: jnp.take(x, i, axis=1, mode="clip"), x, np.arange(6), name="gather")
    assert _rewrite(same, [None, np.arange(6, dtype=np.int32)[:, None]]) is None  # an identity: left as it is
    rows = _eqn(lambda x, i: x[i], x, np.arange(8) // 2, name="gather")  # (whole rows: `take` on axis 0 is fine)
    assert _rewrite(rows, [None, (np.arange(8) // 2).astype(np.int32)[:, None]]) is not None
    points = _eqn(lambda x, i, j: x[i, j], x, np.arange(4), np.arange(4), name="gather")  # two axes at once
    assert _rewrite(points, [None, np.zeros((4, 2), np.int32)]) is None


def _resize(x):
    return jax.image.resize(x, (x.shape[0], 2 * x.shape[1], 2 * x.shape[2], x.shape[3]), "nearest")


def test_normalisation_hands_a_resize_s_indices_to_its_gathers_as_constants():
    """The indices a nearest resize computes from an `iota` become constant
    operands of its gathers, and the equations that computed them go;
    constant computations that no rewrite asks for stay, and indices read
    from the arguments stay values."""
    x = jnp.ones((2, 4, 4, 3))
    program = normalize(jax.make_jaxpr(_resize)(x))
    names = [item.name for item in program.body if isinstance(item, Equation)]
    gathers = [item for item in program.body if isinstance(item, Equation) and item.name == "gather"]
    assert len(gathers) == 2 and all(isinstance(g.inputs[1], Const) for g in gathers)
    assert "iota" not in names, names
    kept = normalize(jax.make_jaxpr(lambda x: x + lax.iota(jnp.float32, 8))(jnp.ones(8)))
    assert any(isinstance(item, Equation) and item.name == "iota" for item in kept.body)
    read = normalize(jax.make_jaxpr(lambda x, i: jnp.take(x, i, axis=1, mode="clip"))(x, jnp.arange(8) // 2))
    [gather] = [item for item in read.body if isinstance(item, Equation) and item.name == "gather"]
    assert not isinstance(gather.inputs[1], Const)


def _unet_like(params, x):
    h = jnp.tanh(lax.conv_general_dilated(x, params["down"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
    u = _resize(h)
    y = lax.conv_general_dilated(jnp.concatenate([u, x], -1), params["up"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.mean(y**2)


def _model():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"down": jax.random.normal(k1, (3, 3, 3, 8)) * 0.3, "up": jax.random.normal(k2, (3, 3, 11, 4)) * 0.3}
    return params, jax.random.normal(k3, (4, 16, 16, 3))


def _close(got, expected):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_remat_plans_resize_without_a_scatter():
    """`jdtr.plan`'s step: no scatter in what it lowers (`jax.grad`'s own
    step has two), `jax.grad`'s gradients, and compiled bytes within the
    budget."""
    params, x = _model()
    expected = jax.grad(_unet_like)(params, x)
    assert "scatter" in jax.jit(jax.grad(_unet_like)).lower(params, x).as_text()
    plan = jdtr.plan(_unet_like, params, x, budget=0.9, autotune=False)
    assert "scatter" not in jax.jit(plan.grad).lower(params, x).as_text()
    assert plan.compiled_bytes <= plan.budget_bytes
    _close(jax.jit(plan.grad)(params, x), expected)


def test_jdtr_grad_runs_the_resize_s_pullback_rewritten():
    params, x = _model()
    expected = jax.grad(_unet_like)(params, x)
    got, stats = jdtr.grad(_unet_like, budget=0.92, return_stats=True)(params, x)
    assert stats.rematerializations > 0
    _close(got, expected)
