"""jdtr.grad / value_and_grad behave like jax.grad / value_and_grad."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdtr
from budgets import biting

KEY = jax.random.PRNGKey(0)


def chain(params, x):
    for w in params["layers"]:
        x = jnp.tanh(x @ w["w"] + w["b"])
    return jnp.mean(x**2)


def make_params(layers=8, width=16, batch=64):
    keys = jax.random.split(KEY, layers + 1)
    params = {
        "layers": [
            {"w": jax.random.normal(k, (width, width)) / jnp.sqrt(width), "b": jnp.zeros(width)} for k in keys[:-1]
        ]
    }
    return params, jax.random.normal(keys[-1], (batch, width))


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def live_ids():
    gc.collect()
    return {id(a) for a in jax.live_arrays()}


# ----------------------------------------------------------------- signatures


def test_has_aux_and_value():
    params, x = make_params()

    def loss(params, x):
        value = chain(params, x)
        return value, {"value_twice": 2 * value}

    (value, aux), grads = jdtr.value_and_grad(loss, has_aux=True, budget=0.4)(params, x)
    (rvalue, raux), rgrads = jax.value_and_grad(loss, has_aux=True)(params, x)
    assert_trees_close((value, aux, grads), (rvalue, raux, rgrads))
    grads2, aux2 = jdtr.grad(loss, has_aux=True, budget=0.4)(params, x)
    assert_trees_close((grads2, aux2), (rgrads, raux))


def test_tuple_argnums_and_kwargs():
    params, x = make_params()

    def loss(params, x, scale=1.0):
        return chain(params, x * scale)

    got = jdtr.grad(loss, argnums=(0, 1), budget=0.5)(params, x, scale=0.5)
    ref = jax.grad(loss, argnums=(0, 1))(params, x, scale=0.5)
    assert isinstance(got, tuple) and len(got) == 2
    assert_trees_close(got, ref)


def test_nested_pytrees_and_numpy_and_python_scalars():
    def loss(tree, s):
        a, (b, c) = tree["pair"]
        return jnp.sum(jnp.sin(a) * b) + c["z"] ** 2 * s

    tree = {"pair": (np.arange(4.0, dtype=np.float32), (jnp.ones(4), {"z": 3.0}))}
    got = jdtr.grad(loss, argnums=(0, 1), budget=1.0)(tree, 2.0)
    ref = jax.grad(loss, argnums=(0, 1))(tree, 2.0)
    assert_trees_close(got, ref)


def test_return_stats_fields():
    params, x = make_params()
    grads, stats = jdtr.grad(chain, budget=0.5, return_stats=True)(params, x)
    assert isinstance(stats, jdtr.Stats)
    assert stats.budget_bytes == int(0.5 * stats.unconstrained_peak_bytes)
    assert 0 < stats.peak_bytes <= stats.budget_bytes
    assert stats.pinned_bytes >= sum(a.nbytes for a in jax.tree_util.tree_leaves((params, x)))
    assert stats.overhead == pytest.approx((stats.base_cost + stats.remat_cost) / stats.base_cost)
    assert stats.wall_time_s > 0 and stats.equations > 0
    with pytest.raises(Exception):
        stats.peak_bytes = 0  # frozen


def test_budget_units():
    params, x = make_params()
    _, stats = jdtr.grad(chain, budget=1.0, return_stats=True)(params, x)
    peak = stats.unconstrained_peak_bytes
    for budget, expected in [(peak, peak), (f"{peak}B", peak), (f"{peak / 1024:.3f}KiB", None)]:
        _, s = jdtr.grad(chain, budget=budget, return_stats=True)(params, x)
        if expected is not None:
            assert s.budget_bytes == expected
        assert s.peak_bytes <= s.budget_bytes


def test_trace_cache_is_shared_and_keyed_on_structure():
    params, x = make_params()
    f = jdtr.grad(chain, budget=0.9, return_stats=True)
    _, first = f(params, x)
    _, second = f(params, x)
    _, other_budget = jdtr.grad(chain, budget=0.5, return_stats=True)(params, x)
    assert second.cache_hit and other_budget.cache_hit
    _, new_shape = f(params, x[:32])
    assert not new_shape.cache_hit


def test_deterministic_decisions():
    """A structure's calls, from its first (planned, run step by step) to its
    third (run as compiled chunks, perhaps by a plan made for fewer of them),
    take the same decisions each time the caches start empty."""
    params, x = make_params(layers=16)
    keys = ("peak_bytes", "evictions", "rematerializations", "base_cost", "remat_cost", "chunks")
    rounds = []
    for _ in range(2):
        jdtr.clear_caches()
        f = jdtr.grad(chain, budget=0.4, return_stats=True)
        rounds.append([[getattr(f(params, x)[1], k) for k in keys] for _ in range(3)])
    assert rounds[0] == rounds[1]


def test_measured_cost_model_and_custom_cost_model():
    params, x = make_params()
    ref = jax.grad(chain)(params, x)
    got, stats = jdtr.grad(chain, budget=0.5, cost_model="measured", return_stats=True)(params, x)
    assert_trees_close(got, ref)
    assert stats.base_cost > 0
    seen = []

    def flops_only(info: jdtr.OpInfo) -> float:
        seen.append(info.name)
        return 1.0 + info.flops

    got, stats = jdtr.grad(chain, budget=0.5, cost_model=flops_only, return_stats=True)(params, x)
    assert_trees_close(got, ref)
    assert "dot_general" in seen


def test_custom_heuristic_object():
    class Largest(jdtr.Heuristic):
        name = "largest"

        def score(self, storage, now):
            return -storage.size

    params, x = make_params()
    got, stats = jdtr.grad(chain, budget=0.5, heuristic=Largest(), return_stats=True)(params, x)
    assert_trees_close(got, jax.grad(chain)(params, x))
    assert stats.heuristic == "largest" and stats.evictions > 0


@pytest.mark.parametrize("dealloc", ["eager", "banish", "ignore"])
def test_dealloc_policies(dealloc):
    params, x = make_params()
    got, stats = jdtr.grad(chain, budget=0.7, dealloc=dealloc, return_stats=True, debug=True)(params, x)
    assert_trees_close(got, jax.grad(chain)(params, x))
    assert stats.live_peak_bytes <= stats.budget_bytes


# ----------------------------------------------------- memory: leaks, budgets


def test_no_leak_and_caller_arrays_intact():
    params, x = make_params()
    leaves = jax.tree_util.tree_leaves((params, x))
    before = live_ids()
    grads = jdtr.grad(chain, budget=0.4)(params, x)
    after = live_ids()
    assert all(not leaf.is_deleted() for leaf in leaves)
    assert after - before == {id(g) for g in jax.tree_util.tree_leaves(grads)}


def test_out_of_budget_error_states_the_numbers_and_keeps_arrays():
    params, x = make_params()
    leaves = jax.tree_util.tree_leaves((params, x))
    held = sum(a.nbytes for a in leaves)
    before = live_ids()
    with pytest.raises(jdtr.OutOfBudgetError) as info:
        jdtr.grad(chain, budget=held + 4096)(params, x)
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.budget_bytes == held + 4096
    assert err.pinned_bytes >= held and err.needed_bytes > err.free_bytes
    assert err.op_name and "budget" in str(err)
    assert err.source is None or "test_api.py" in err.source
    assert all(not leaf.is_deleted() for leaf in leaves)
    assert live_ids() <= before | set()  # nothing of the failed run survives
    # and the next call works
    grads = jdtr.grad(chain, budget=0.5)(params, x)
    assert_trees_close(grads, jax.grad(chain)(params, x))


def test_budget_below_the_arguments_fails_before_any_work():
    params, x = make_params()
    calls = []

    def loss(params, x):
        jax.debug.callback(lambda: calls.append(1))
        return chain(params, x)

    with pytest.raises(jdtr.OutOfBudgetError, match="arguments"):
        jdtr.grad(loss, budget=1024)(params, x)
    assert calls == []


# ------------------------------------------------------------------- effects


def test_measured_costs_time_an_executables_run_after_its_first():
    """An executable's first run pays a one-time cost (on the CPU about 5x
    its later runs, median): measuring costs, an executable that has not run
    in the process runs once untimed first. A pure callback shows the extra
    run; an effect still runs once."""
    params, x = make_params(layers=4)
    pure, effects = [], []

    def host(v):
        pure.append(1)
        return v

    def loss(params, x):
        h = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)  # (x is not differentiated)
        for w in params["layers"]:
            h = jnp.tanh(h @ w["w"] + w["b"])
        jax.debug.callback(lambda v: effects.append(1), jnp.sum(h))
        return jnp.mean(h**2)

    got, stats = jdtr.grad(loss, cost_model="measured", return_stats=True)(params, x)
    assert stats.execution == "online" and (len(pure), len(effects)) == (2, 1)
    assert_trees_close(got, jax.grad(loss)(params, x))  # (the callbacks run once more each)
    jdtr.grad(loss, cost_model="measured")(params, x)  # a new function, the same executables: run before
    assert (len(pure), len(effects)) == (4, 3)


def test_effects_run_once_and_are_never_replayed():
    params, x = make_params(layers=16)
    calls = []

    def loss(params, x):
        for i, w in enumerate(params["layers"]):
            x = jnp.tanh(x @ w["w"] + w["b"])
            if i == 3:
                jax.debug.callback(lambda v: calls.append(float(v)), jnp.sum(x))
        return jnp.mean(x**2)

    got, stats = jdtr.grad(loss, budget=0.35, return_stats=True)(params, x)
    assert stats.rematerializations > 0
    assert len(calls) == 1
    assert_trees_close(got, jax.grad(loss)(params, x))


# ---------------------------------------------------------------- control flow


def test_cond_runs_only_the_taken_branch():
    def loss(w, x):
        h = jnp.tanh(x @ w)
        h = jax.lax.cond(jnp.sum(h) > 0, lambda a: jnp.sin(a) * 3, lambda a: a @ w, h)
        return jnp.sum(h**2)

    w = jax.random.normal(KEY, (8, 8))
    for sign in (1.0, -1.0):
        x = sign * jnp.ones((4, 8))
        got = jdtr.grad(loss, budget=0.8)(w, x)
        np.testing.assert_allclose(got, jax.grad(loss)(w, x), rtol=1e-4, atol=1e-5)  # chunks fuse as XLA chooses: float32 rounding


def test_switch_with_three_branches_and_literal_outputs():
    def loss(x, i):
        y = jax.lax.switch(i, [lambda a: a * 2.0, lambda a: jnp.zeros_like(a), lambda a: a], x)
        return jnp.sum(y**2)

    x = jnp.arange(3.0)
    for i in range(3):
        got = jdtr.grad(loss, budget=1.0)(x, jnp.int32(i))
        np.testing.assert_allclose(got, jax.grad(loss)(x, jnp.int32(i)))


def test_jit_custom_jvp_custom_vjp_and_remat_are_inlined():
    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))

    @jax.jit
    def block(w, x):
        return jax.nn.gelu(x @ w)

    def loss(w, x):
        h = jax.checkpoint(block)(w, x)
        h = clip_grad(jax.nn.relu(h))
        return jnp.sum(jax.nn.softmax(h) * h)

    w = jax.random.normal(KEY, (16, 16))
    x = jax.random.normal(KEY, (32, 16))
    program = jdtr.transform.normalize(jax.make_jaxpr(jax.value_and_grad(loss))(w, x))
    names = {item.name for item in program.body}
    assert not names & {"jit", "pjit", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint"}
    got = jdtr.grad(loss, budget=biting(loss, (w, x), 0.8))(w, x)
    np.testing.assert_allclose(got, jax.grad(loss)(w, x), rtol=1e-5, atol=1e-6)


def test_fori_loop_scan_and_while_as_opaque_op():
    def loss(w, x):
        x = jax.lax.fori_loop(0, 5, lambda i, h: jnp.tanh(h @ w), x)
        n = jax.lax.while_loop(lambda c: c < 3, lambda c: c + 1, 0)  # not differentiated
        return jnp.sum(x**2) * n

    w = jax.random.normal(KEY, (8, 8)) / 3
    x = jnp.ones((4, 8))
    np.testing.assert_allclose(jdtr.grad(loss, budget=0.7)(w, x), jax.grad(loss)(w, x), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "budget, error, match",
    [
        (0, ValueError, "positive"),
        (-5, ValueError, "positive"),
        (0.0, ValueError, "fraction"),
        (1.5, ValueError, "fraction"),
        (float("nan"), ValueError, "fraction"),
        ("12 parsecs", ValueError, "unit"),
        ("-3MiB", ValueError, "cannot read"),
        (True, TypeError, "budget"),
        ([1], TypeError, "budget"),
    ],
)
def test_bad_budgets_fail_at_wrap_time(budget, error, match):
    with pytest.raises(error, match=match):
        jdtr.grad(chain, budget=budget)


def test_bad_options():
    with pytest.raises(ValueError, match="unknown heuristic 'belady'; expected 'auto' \\(the default\\), one of .*'lookahead'"):
        jdtr.grad(chain, heuristic="belady")
    with pytest.raises(ValueError, match="dealloc"):
        jdtr.grad(chain, dealloc="maybe")
    with pytest.raises(ValueError, match="cost_model"):
        jdtr.grad(chain, cost_model="guess")
    with pytest.raises(TypeError, match="argnums"):
        jdtr.grad(chain, argnums="0")
    with pytest.raises(TypeError, match="callable"):
        jdtr.grad(3)


def test_bad_arguments_are_reported_like_jax():
    params, x = make_params()
    with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
        jdtr.grad(lambda n: jnp.sum(n * 1.0))(jnp.arange(3))
    with pytest.raises(TypeError, match="scalar"):
        jdtr.grad(lambda v: v * 2)(jnp.ones(3))
    with pytest.raises(TypeError, match="positional arguments"):
        jdtr.grad(chain, argnums=2)(params, x)
    dead = jnp.ones(3)
    dead.delete()
    with pytest.raises(ValueError, match=r"argument 0 is a deleted"):
        jdtr.grad(lambda v: jnp.sum(v))(dead)
    with pytest.raises(ValueError, match=r"argument 1\[0\] is a deleted"):
        jdtr.grad(lambda a, b: jnp.sum(a) + jnp.sum(b[0]))(jnp.ones(2), [dead])
    with pytest.raises(TypeError, match="not a valid JAX type"):
        jdtr.grad(lambda s: 1.0)("text")


def test_a_calls_structure_is_the_same_on_jdtr_grads_fast_path_as_for_planning():
    """`jdtr.grad` flattens its concrete arguments by a path of its own (every
    call of a training loop); it reads the same structure as the general one:
    which leaves are differentiated (positional, keyword, empty subtrees),
    their specs, and the statics."""
    from jdtr.transform.arguments import flatten_arguments

    args = ({"a": jnp.ones(3), "b": [jnp.zeros((2, 2), jnp.int32), 2.0], "c": None}, np.ones(2), (), 3.0, "mode")
    kwargs = {"k": jnp.ones(1), "flag": True}
    fast = flatten_arguments((0, 3), args, kwargs, eager=True)[1]
    general = flatten_arguments((0, 3), args, kwargs, eager=False)[1]
    assert fast.differentiated == general.differentiated == (True, True, True, False, True, False, False, False)
    assert fast.specs == general.specs and fast.key == general.key and hash(fast.key) == hash(general.key)
    assert flatten_arguments(-1, args[:4], {}, eager=True)[1].differentiated == (False,) * 4 + (True,)
    # What the fast path also says: whether the leaves are the inputs as they are, and may carry a mesh.
    assert not fast.arrays_only and not fast.meshed
    arrays = flatten_arguments(0, (jnp.ones(3), {"w": jnp.ones((2, 2))}), {}, eager=True)[1]
    assert arrays.arrays_only and not arrays.meshed
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    placed = jax.device_put(jnp.ones(4), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    assert flatten_arguments(0, (placed,), {}, eager=True)[1].meshed  # a mesh of one device may still be one


def test_under_jit_gives_a_clear_error():
    with pytest.raises(TypeError, match="remat_grad"):
        jax.jit(jdtr.grad(lambda v: jnp.sum(v**2)))(jnp.ones(3))


def test_a_call_staged_on_arrays_it_closes_over_gives_the_same_clear_error():
    """Under jit, or in a scan body, jdtr.grad of concrete arrays the caller
    closes over: no argument is a tracer, but everything it would run is
    staged. Before, XLA options of its executables failed as "nested jit"
    (on the CPU) with nothing said of jdtr.grad. Under vmap alone, arrays
    vmap does not trace still run, and the gradients are jax.grad's."""
    w, x = jnp.ones((8, 8)) / 8, jnp.linspace(-1.0, 1.0, 32).reshape(4, 8)
    loss = lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2)
    step = jdtr.grad(loss)
    with pytest.raises(TypeError, match="inside jit, or in a scan, cond or checkpoint body"):
        jax.jit(lambda: step(w, x))()
    with pytest.raises(TypeError, match="inside jit, or in a scan, cond or checkpoint body"):
        jax.lax.scan(lambda c, _: (c + jnp.sum(step(w, x)), None), 0.0, None, length=2)
    scaled = jax.vmap(lambda s: s * step(w, x))(jnp.arange(2.0))
    np.testing.assert_allclose(scaled[1], jax.grad(loss)(w, x), rtol=1e-6)
    np.testing.assert_allclose(step(w, x), jax.grad(loss)(w, x), rtol=1e-6)  # and at the top level again


def test_static_python_arguments_select_structure():
    def loss(w, depth):
        h = w
        for _ in range(depth):
            h = jnp.sin(h)
        return jnp.sum(h)

    f = jdtr.grad(loss, budget=1.0, return_stats=True)
    w = jnp.ones(4)
    for depth in (1, 3):
        got, _ = f(w, depth)
        np.testing.assert_allclose(got, jax.grad(loss)(w, depth), rtol=1e-6)
    _, stats = f(w, 3)
    assert stats.cache_hit


def test_holomorphic_as_in_jax_grad():
    """`holomorphic=` is `jax.grad`'s."""

    def f(z, w):
        for _ in range(4):
            z = jnp.tanh(z @ w)
        return jnp.sum(z**2)

    key = jax.random.split(jax.random.PRNGKey(0), 4)
    z = (jax.random.normal(key[0], (64, 8)) + 1j * jax.random.normal(key[1], (64, 8))).astype(jnp.complex64) * 0.3
    w = (jax.random.normal(key[2], (8, 8)) + 1j * jax.random.normal(key[3], (8, 8))).astype(jnp.complex64) * 0.3
    expected = jax.grad(f, (0, 1), holomorphic=True)(z, w)
    for mode in ("planned", "online"):
        got, stats = jdtr.grad(f, (0, 1), holomorphic=True, budget=0.6, mode=mode, return_stats=True)(z, w)
        assert stats.rematerializations > 0
        for a, e in zip(got, expected):
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-4, atol=1e-5)
    value, got = jdtr.value_and_grad(f, holomorphic=True)(z, w)
    np.testing.assert_allclose(np.asarray(value), np.asarray(f(z, w)), rtol=1e-5)
    with pytest.raises(TypeError, match="holomorphic"):  # as jax.grad says it
        jdtr.grad(f)(z, w)
    assert jdtr.grad(f, allow_int=False, budget=0.9)(z.real, w.real).shape == (64, 8)


def _assert_as_jax_gives_them(got, expected):
    """Equal trees: the same structure, dtypes (`float0` included) and values."""
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert (a.dtype, a.shape) == (e.dtype, e.shape)
        if e.dtype != jax.dtypes.float0:
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-7)


def test_allow_int_gives_float0_gradients_as_jax_grad():
    """`allow_int=True`, which `jax.grad`'s error for an integer input
    suggests, is taken by `jdtr.grad`, `jdtr.value_and_grad` and the compiled
    path (under `jit` and `vmap` too): integer and boolean leaves of the
    differentiated arguments (a step count, a mask, an integer argument) get
    `float0` zeros, the others their gradient, within the budget. (It raised
    `NotImplementedError`; `remat_grad` had no such argument.)"""
    keys = jax.random.split(jax.random.PRNGKey(0), 9)
    params = {"w": [jax.random.normal(k, (64, 64)) / 8 for k in keys[:8]], "step": jnp.int32(3), "mask": jnp.arange(64) % 5 > 0}
    x = jax.random.normal(keys[-1], (1024, 64))

    def loss(params, x, scale):
        for w in params["w"]:
            x = jnp.tanh(x @ w) * params["mask"]
        return jnp.mean(x**2) * params["step"] * scale, {"step": params["step"]}

    for argnums in (0, (0, -2, -1)):  # (-1: the integer `scale`)
        expected = jax.value_and_grad(loss, argnums, has_aux=True, allow_int=True)(params, x, 2)
        run = jdtr.value_and_grad(loss, argnums, has_aux=True, allow_int=True, budget=0.5, return_stats=True)
        for call in range(2):
            got, stats = run(params, x, 2)
            _assert_as_jax_gives_them(got, expected)
            assert stats.peak_bytes <= stats.budget_bytes and stats.evictions > 0
            assert stats.cache_hit == (call == 1)  # one trace for the structure
        got = jdtr.grad(loss, argnums, has_aux=True, allow_int=True, budget=0.5)(params, x, 2)
        _assert_as_jax_gives_them(got, (expected[1], expected[0][1]))
        step = jdtr.remat_value_and_grad(loss, argnums, has_aux=True, allow_int=True, budget=0.5, autotune=False)
        _assert_as_jax_gives_them(step(params, x, 2), expected)
        _assert_as_jax_gives_them(jax.jit(step, static_argnums=2)(params, x, 2), expected)
    per_example = jax.vmap(jdtr.remat_grad(lambda p, x: loss(p, x, 1)[0], allow_int=True, budget=1.0), in_axes=(None, 0))
    xs = x.reshape(4, 256, 64)
    expected = jax.vmap(jax.grad(lambda p, x: loss(p, x, 1)[0], allow_int=True), in_axes=(None, 0))(params, xs)
    _assert_as_jax_gives_them(jax.jit(per_example)(params, xs), expected)


def test_aux_values_come_back_as_jax_returns_them():
    """Strings, Python numbers, NumPy arrays and None in aux are returned as
    they are (also by a cached call); array leaves as arrays (issue 23, item 2)."""

    def f(w, x):
        y = jnp.tanh(x @ w)
        aux = {"name": "layer", "count": 3, "scale": 0.5, "mean": jnp.mean(y), "table": np.arange(3), "none": None}
        return jnp.sum(y**2), aux

    w, x = jnp.ones((8, 8)) * 0.1, jnp.ones((32, 8))
    (value_e, aux_e), grads_e = jax.value_and_grad(f, has_aux=True)(w, x)
    g = jdtr.value_and_grad(f, has_aux=True, budget=biting(f, (w, x), 0.7, has_aux=True), return_stats=True)
    for call in range(2):
        ((value, aux), grads), stats = g(w, x)
        assert stats.cache_hit == (call == 1)
        assert aux.keys() == aux_e.keys()
        assert aux["name"] == "layer" and aux["none"] is None
        assert type(aux["count"]) is int and aux["count"] == 3 and type(aux["scale"]) is float and aux["scale"] == 0.5
        assert isinstance(aux["table"], np.ndarray) and list(aux["table"]) == [0, 1, 2]
        assert isinstance(aux["mean"], jax.Array)
        np.testing.assert_allclose(aux["mean"], aux_e["mean"], rtol=1e-6)
        np.testing.assert_allclose(grads, grads_e, rtol=1e-5)
    grads, aux = jdtr.grad(lambda w, x: (f(w, x)[0], "only a string"), has_aux=True)(w, x)
    assert aux == "only a string"


def test_python_control_flow_on_traced_values_says_what_to_do():
    """Issue 23, item 4: JAX's tracer errors name jdtr's wrapper; the error
    says that jdtr traces the step ahead, and what to use instead."""

    def branch(w):
        if jnp.sum(w) > 0:
            return jnp.sum(w**2)
        return jnp.sum(w)

    def number(w):
        return jnp.sum(w) * float(jnp.sum(w))

    def index(w):
        return jnp.sum(w[: int(jnp.sum(w))])

    for fun in (branch, number, index):
        with pytest.raises(jax.errors.JAXTypeError) as caught:
            jdtr.grad(fun, budget=0.9)(jnp.ones(3))
        notes = "\n".join(getattr(caught.value, "__notes__", []))
        assert "traces the whole step before it runs it" in notes and "lax.cond" in notes, fun.__name__
    # The same step with the branch written as JAX control flow runs.
    fixed = lambda w: jax.lax.cond(jnp.sum(w) > 0, lambda w: jnp.sum(w**2), jnp.sum, w)  # noqa: E731
    np.testing.assert_allclose(jdtr.grad(fixed)(jnp.ones(3)), jax.grad(fixed)(jnp.ones(3)))
    # A Python number argument is static: control flow on it is fine.
    scaled = lambda w, k: jnp.sum(w**2) if k > 1 else jnp.sum(w)  # noqa: E731
    np.testing.assert_allclose(jdtr.grad(scaled)(jnp.ones(3), 2), jax.grad(scaled)(jnp.ones(3), 2))
