"""Max pooling's pullback computed from strided slices on the CPU
(`transform/pooling.py`): the same values as JAX's `select_and_scatter_add`,
bit for bit, without the temporaries XLA's expansion of it takes, in both
compiled paths."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jdtr
from jdtr import models
from jdtr.transform import pooling
from jdtr.transform.executable import binder

from host_devices import run_on_8_devices

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the rewrite applies on the CPU only")


def _bits(x):
    return np.asarray(x).view(np.uint32)


def _close(got, expected):
    """Equal but for rounding: NaNs where `expected` has them, the rest
    within rounding of sums of a few unit cotangents."""
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6, equal_nan=True)


def _input(rng, shape, ties=False, special=False):
    x = rng.standard_normal(shape).astype(np.float32)
    if ties:
        x = np.round(x * 2)
    if special:  # NaNs, infinities of both signs, signed zeros
        flat = x.reshape(-1)
        picked = rng.choice(flat.size, size=flat.size // 8, replace=False)
        for i, value in enumerate((np.nan, -np.inf, np.inf, -0.0)):
            flat[picked[i::4]] = value
    return jnp.asarray(x)


def _pads(shape, window, strides, padding):
    if isinstance(padding, str):
        padding = lax.padtype_to_pads(shape, window, strides, padding)
    return tuple(tuple(p) for p in padding)


# (shape, window, strides, padding): pools that do not overlap, with and
# without a remainder, that overlap (a 3x3 stem with stride 2), padded
# either way, and a 1-D one.
POOLS = [
    ((4, 8, 8, 3), (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
    ((4, 9, 7, 3), (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
    ((4, 9, 7, 3), (1, 2, 2, 1), (1, 2, 2, 1), "SAME"),
    ((2, 8, 8, 3), (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
    ((2, 8, 8, 3), (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0))),
    ((2, 8, 8, 3), (1, 3, 3, 1), (1, 1, 1, 1), "VALID"),
    ((3, 17), (1, 4), (1, 3), ((0, 0), (2, 1))),
]


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("shape,window,strides,padding", POOLS)
def test_the_pullback_is_select_and_scatter_add_bit_for_bit(shape, window, strides, padding, kind):
    rng = np.random.default_rng(len(shape) * 7 + window[1])
    init, op, prim, select = (
        (-jnp.inf, lax.max, lax.reduce_window_max_p, "ge") if kind == "max" else (jnp.inf, lax.min, lax.reduce_window_min_p, "le")
    )
    reference = lambda x: lax.reduce_window(x, init, op, window, strides, padding)  # noqa: E731
    pads = _pads(shape, window, strides, padding)
    pool = pooling.pooled(prim, select, window, strides, pads)
    # Where windows overlap, an element's contributions are summed in an
    # order of the rewrite's own: the same bits on JAX 0.10's XLA, not on
    # every version's (JAX 0.6: 2 ulps on one element of 384).
    overlap = any(s < w for s, w in zip(strides, window))
    same = _close if overlap else (lambda a, b: np.testing.assert_array_equal(_bits(a), _bits(b)))
    for ties, special in ((False, False), (True, False), (True, True)):
        x = _input(rng, shape, ties, special)
        y, pullback = jax.vjp(reference, x)
        ct = jnp.asarray(rng.standard_normal(y.shape).astype(np.float32))
        expected = pullback(ct)[0]
        y_new, pullback_new = jax.vjp(pool, x)
        np.testing.assert_array_equal(_bits(y_new), _bits(y))
        same(pullback_new(ct)[0], expected)
        same(jax.jit(lambda x, ct: jax.vjp(pool, x)[1](ct)[0])(x, ct), jax.jit(lambda x, ct: pullback(ct)[0])(x, ct))
        # What replaces `select_and_scatter_add` in a value-and-grad program.
        same(pooling.scatter_selected(ct, x, select, window, strides, pads), expected)
        if not ties:  # (JAX's own forward mode may pick another of tied elements than its pullback)
            t = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
            np.testing.assert_array_equal(
                _bits(jax.jvp(pool, (x,), (t,))[1]), _bits(jax.jvp(reference, (x,), (t,))[1])
            )


def test_padding_alone_keeps_its_selection():
    """XLA's select-and-scatter on the CPU selects padding where a window's
    real elements are all -inf (ties keep the first), dropping their
    cotangent; so does the rewrite."""
    x = jnp.full((2, 3, 3, 1), -jnp.inf)
    padding = ((0, 0), (1, 1), (1, 1), (0, 0))
    reference = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), padding)  # noqa: E731
    y, pullback = jax.vjp(reference, x)
    ct = jnp.arange(1, y.size + 1, dtype=jnp.float32).reshape(y.shape)
    pool = pooling.pooled(lax.reduce_window_max_p, "ge", (1, 2, 2, 1), (1, 2, 2, 1), padding)
    expected = pullback(ct)[0]
    assert 0 < int(jnp.sum(expected != 0)) < x.size  # some cotangent dropped, some kept
    np.testing.assert_array_equal(jax.vjp(pool, x)[1](ct)[0], expected)


def test_what_is_left_to_jax():
    """Integer pools, dilated or very large windows, and other primitives bind as they are."""
    window = dict(window_dimensions=(1, 2, 2, 1), window_strides=(1, 2, 2, 1), padding=((0, 0),) * 4)
    unit = dict(base_dilation=(1,) * 4, window_dilation=(1,) * 4)
    assert pooling.substitute(lax.reduce_window_max_p, {**window, **unit}, jnp.float32) is not None
    assert pooling.substitute(lax.reduce_window_max_p, {**window, **unit}, jnp.int32) is None
    assert pooling.substitute(lax.reduce_window_max_p, {**window, **unit, "window_dilation": (1, 2, 2, 1)}, jnp.float32) is None
    big = dict(window_dimensions=(1, 9, 9, 1), window_strides=(1, 1, 1, 1), padding=((0, 0),) * 4)
    assert pooling.substitute(lax.reduce_window_max_p, {**big, **unit}, jnp.float32) is None
    assert pooling.substitute(lax.reduce_window_sum_p, {**window, **unit}, jnp.float32) is None


def _temps(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_the_rewrite_takes_no_temporaries_where_xla_s_expansion_takes_several_inputs():
    """XLA's `memory_analysis()` of the pullback of a 2x2 pool: the
    select-and-scatter expansion takes several times the input in
    temporaries; the rewrite, fused, less than one input."""
    x = jnp.ones((8, 32, 32, 16))
    window = (1, 2, 2, 1)
    reference = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, window, window, "VALID")  # noqa: E731
    pool = pooling.pooled(lax.reduce_window_max_p, "ge", window, window, ((0, 0),) * 4)
    ct = jnp.ones((8, 16, 16, 16))
    xla = _temps(lambda x, ct: jax.vjp(reference, x)[1](ct)[0], x, ct)
    rewritten = _temps(lambda x, ct: jax.vjp(pool, x)[1](ct)[0], x, ct)
    assert xla > 3 * x.nbytes
    assert rewritten < x.nbytes


def _vgg():
    return models.plain_cnn(4, 8, 16, 4, pools=(1,))


def _max_difference(got, expected):
    return max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)))


def test_remat_plans_pool_without_select_and_scatter():
    """`jdtr.plan`'s step on a CNN with max pools: the gradients of
    `jax.grad` (to rounding: XLA fuses the convolutions of the two programs
    apart), and no select-and-scatter in what it lowers (`jax.grad`'s own
    step has one)."""
    model = _vgg()
    plan = jdtr.plan(model.loss, model.params, model.batch, budget=0.7, autotune=False)
    assert plan.segments
    got = jax.jit(plan.grad)(model.params, model.batch)
    assert _max_difference(got, jax.grad(model.loss)(model.params, model.batch)) < 1e-6
    assert "select_and_scatter" in jax.jit(jax.grad(model.loss)).lower(model.params, model.batch).as_text()
    assert "select_and_scatter" not in jax.jit(plan.grad).lower(model.params, model.batch).as_text()


def test_an_equation_of_select_and_scatter_add_binds_the_rewrite():
    """What `jdtr.grad`'s equations bind (`executable.binder`): JAX's
    `select_and_scatter_add` lowers without a select-and-scatter, to the
    same values."""
    x = _input(np.random.default_rng(3), (4, 8, 8, 3), ties=True)
    reference = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")  # noqa: E731
    ct = jnp.ones((4, 4, 4, 3))
    closed = jax.make_jaxpr(lambda x, ct: jax.vjp(reference, x)[1](ct))(x, ct)
    [eqn] = [e for e in closed.jaxpr.eqns if e.primitive.name == "select_and_scatter_add"]
    bind = binder(eqn, [None] * len(eqn.invars))
    step = jax.jit(lambda *args: bind(args))
    assert "select_and_scatter" not in step.lower(ct, x).as_text()
    np.testing.assert_array_equal(_bits(step(ct, x)), _bits(jax.vjp(reference, x)[1](ct)[0]))


def test_jdtr_grad_runs_the_pool_s_pullback_rewritten():
    """`jdtr.grad` (its program holds JAX's `select_and_scatter_add`): the
    gradients of `jax.grad` at a budget that recomputes."""
    model = _vgg()
    expected = jax.grad(model.loss)(model.params, model.batch)
    got, stats = jdtr.grad(model.loss, budget=0.8, return_stats=True)(model.params, model.batch)
    assert stats.rematerializations > 0
    assert _max_difference(got, expected) < 1e-6


def _pool_of_a_reshape(activation, reduce):
    """A loss whose pool reads a reshape (to XLA, a bitcast) of an
    activation whose backward pass reads the activation's output."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    w, x = jax.random.normal(keys[0], (64, 64)) / 8, jax.random.normal(keys[1], (128, 64))
    init, op = (-jnp.inf, lax.max) if reduce == "max" else (jnp.inf, lax.min)

    def loss(w, x):
        h = activation(x @ w).reshape(1, 128, 64, 1)
        return jnp.mean(lax.reduce_window(h, init, op, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") ** 2)

    return loss, w, x


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("activation", [jnp.tanh, jax.nn.sigmoid], ids=["tanh", "sigmoid"])
def test_a_pool_of_a_reshaped_activation_has_jax_grads_compiled(activation, reduce):
    """The offsets a pool selects are made apart from the loop that reads
    them. Fused into it, XLA on the CPU wrote the activation's cotangent
    over the activation's own buffer while the loop still read windows of
    it through the reshape: every gradient of the step was wrong (a relative
    error of 0.5-1.7), under `jax.jit` of the rewritten pool, of
    `jdtr.remat_grad`'s plans and of `jdtr.grad`'s chunks alike."""
    loss, w, x = _pool_of_a_reshape(activation, reduce)
    expected = jax.grad(loss)(w, x)
    select = "ge" if reduce == "max" else "le"
    pool = pooling.pooled(lax.reduce_window_max_p if reduce == "max" else lax.reduce_window_min_p, select, (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4)
    rewritten = lambda w, x: jnp.mean(pool(activation(x @ w).reshape(1, 128, 64, 1)) ** 2)  # noqa: E731
    assert _max_difference(jax.jit(jax.grad(rewritten))(w, x), expected) < 1e-7
    try:  # (a plan that recomputes; where none fits 0.6 on this JAX's XLA, the smallest it verified)
        plan = jdtr.plan(loss, w, x, budget=0.6)
    except jdtr.OutOfBudgetError as err:
        plan = jdtr.plan(loss, w, x, budget=err.suggested_budget_bytes)
    assert plan.segments and _max_difference(jax.jit(plan.grad)(w, x), expected) < 1e-7
    got, stats = jdtr.grad(loss, budget=1.0, chunks="always", return_stats=True)(w, x)
    assert stats.execution == "chunks" and _max_difference(got, expected) < 1e-7


MESH_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, jdtr
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jdtr import models
    m = models.plain_cnn(4, 8, 16, 32, pools=(1,))
    mesh = jax.make_mesh((8,), ("data",))  # Explicit axes on this JAX: selects must match shardings
    x, y = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in m.batch)
    params = jax.device_put(m.params, NamedSharding(mesh, P()))
    expected = jax.jit(jax.grad(m.loss))(params, (x, y))
    def difference(got):
        return max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)))
    got, stats = jdtr.grad(m.loss, budget=1.0, return_stats=True)(params, (x, y))
    assert difference(got) < 1e-6 and stats.peak_bytes <= stats.budget_bytes
    plan = jdtr.plan(m.loss, params, (x, y), budget=0.7, autotune=False)
    assert difference(jax.jit(plan.grad)(params, (x, y))) < 1e-6 and plan.compiled_bytes <= plan.budget_bytes
    print("mesh ok")
    """
)


def test_pools_on_a_mesh_of_8_devices():
    """Batch-sharded arguments: the rewrite's zeros take their operand's
    sharding (a select between sharded and unsharded arrays is refused on
    Explicit axes), in both paths."""
    assert "mesh ok" in run_on_8_devices(MESH_SCRIPT, timeout=600)
