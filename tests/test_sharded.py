"""The compiled path on sharded arguments: a budget is bytes per device.

On 8 CPU devices, in a subprocess (the rest of the suite keeps one device):
a data-parallel mesh and a 2x4 data/model mesh, budgets 1.0, 0.5 and 0.3 of
`jax.jit(jax.grad)`'s bytes per device, with activations dominating. The
plan's compiled bytes are XLA's per device for the partitioned step
(`memory_analysis()`), and must be within the budget (or, where no plan
fits a fraction, within the budget the planner suggests); gradients equal
`jax.grad`'s, with its shardings.
"""

from __future__ import annotations

import textwrap

import jax
import pytest

from host_devices import run_on_8_devices

# Both scripts' loss with collectives: a shard_map with a psum in every layer.
COLLECTIVE_LOSS = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map

    def collective_loss_on(mesh):
        def layer(w, h):
            h = jnp.tanh(h @ w)
            return h * jax.lax.rsqrt(jax.lax.psum(jnp.mean(h * h), "data") / 8 + 1.0)

        def collective_loss(ws, x):
            for w in ws:
                x = shard_map(layer, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))(w, x)
            return jnp.mean(x ** 2)

        return collective_loss
    """
)

SCRIPT = COLLECTIVE_LOSS + textwrap.dedent(
    """
    import warnings
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import jdtr
    from jdtr import models
    assert len(jax.devices()) == 8

    def plan_at(loss, *args, budget):
        # The plan at `budget`, or at the budget the planner verified where none
        # fits it (the error's suggestion, a plan's bytes per device: below the
        # next fraction checked, so the budget still bites).
        try:
            return jdtr.plan(loss, *args, budget=budget, autotune=False)
        except jdtr.OutOfBudgetError as err:
            assert budget < 1.0 and err.suggested_budget_bytes is not None, err
            print("suggested", budget, err.suggested_budget_bytes)
            return jdtr.plan(loss, *args, budget=err.suggested_budget_bytes, autotune=False)

    def per_device(fn, *args):
        a = jax.jit(fn).lower(*args).compile().memory_analysis()
        return a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes

    m = models.mlp_chain(layers=24, width=32, batch=4096)
    for shape, names, weights in (((8,), ("data",), P()), ((2, 4), ("data", "model"), P(None, "model"))):
        mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
        params = jax.device_put(m.params, NamedSharding(mesh, weights))
        x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
        full = per_device(jax.grad(m.loss), params, x)
        assert full < per_device(jax.grad(m.loss), m.params, m.batch)  # it is partitioned
        reference = jax.jit(jax.grad(m.loss))(params, x)
        for budget in (1.0, 0.5, 0.3):
            plan = plan_at(m.loss, params, x, budget=budget)
            assert plan.budget_bytes == int(budget * full) or budget * full < plan.budget_bytes < (budget + 0.1) * full
            assert plan.compiled_bytes == per_device(plan.grad, params, x)
            assert plan.compiled_bytes <= plan.budget_bytes, (shape, budget, plan.compiled_bytes, full)
            assert (plan.origin == "none") == (budget == 1.0)
            grads = jdtr.remat_grad(m.loss, budget=plan.budget_bytes, autotune=False)(params, x)
            for g, r in zip(grads, reference):
                assert g.sharding.is_equivalent_to(r.sharding, g.ndim), (g.sharding, r.sharding)
                np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
            print("mesh", shape, budget, round(plan.compiled_bytes / full, 3))
        # Autotuning times the candidates on the sharded arrays themselves.
        tuned = jdtr.plan(m.loss, params, x, budget=0.5)
        assert tuned.timings and all(t.compiled_bytes <= tuned.budget_bytes for t in tuned.timings)

    # Collectives in the traced step (shard_map with a psum in every layer):
    # every device runs the same plan, so a segment's recomputation replays
    # them in the backward pass, on every device alike.
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    collective_loss = collective_loss_on(mesh)

    params = jax.device_put(m.params[:24], NamedSharding(mesh, P()))
    x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
    full = per_device(jax.grad(collective_loss), params, x)
    for budget in (0.5, 0.3):
        plan = plan_at(collective_loss, params, x, budget=budget)
        assert plan.origin == "dtr" and any(s.recomputed for s in plan.segments)
        assert plan.compiled_bytes <= plan.budget_bytes < (budget + 0.1) * full
        for g, r in zip(jax.jit(plan.grad)(params, x), jax.jit(jax.grad(collective_loss))(params, x)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    print("collectives ok")

    # Arguments and gradients alone over the budget: said per device.
    small = models.mlp_chain(layers=4, width=256, batch=64)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    params = jax.device_put(small.params, NamedSharding(mesh, P()))
    x = jax.device_put(small.batch, NamedSharding(mesh, P("data")))
    try:
        jdtr.plan(small.loss, params, x, budget=0.3, autotune=False)
        raise AssertionError("planned a budget below its arguments")
    except jdtr.OutOfBudgetError as err:
        assert "per device" in str(err), err
    print("arguments per device ok")

    # Under jax.jit, a mesh with Explicit axes says the shardings: planned per device.
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        params = jax.device_put(m.params, NamedSharding(mesh, P()))
        x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
        full = per_device(jax.grad(m.loss), params, x)
        budget = plan_at(m.loss, params, x, budget=0.5).budget_bytes
        step = jdtr.remat_grad(m.loss, budget=budget, autotune=False)
        grads = jax.jit(step)(params, x)
        (plan,) = step.plans.values()
        assert plan.unconstrained_compiled_bytes == full and plan.compiled_bytes <= budget < 0.6 * full
        for g, r in zip(grads, jax.jit(jax.grad(m.loss))(params, x)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    print("explicit ok")

    # The same without `jax.set_mesh` (as `jax.make_mesh`'s Explicit default is
    # most often used), and with it, on the 2x4 mesh, autotuned: planned per
    # device on a concrete mesh of its shape, the candidates timed on example
    # inputs placed as the arguments are.
    import contextlib
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    params = jax.device_put(m.params, NamedSharding(mesh, P(None, "model")))
    x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
    full = per_device(jax.grad(m.loss), params, x)
    budget = plan_at(m.loss, params, x, budget=0.5).budget_bytes
    reference = jax.jit(jax.grad(m.loss))(params, x)
    for context in (contextlib.nullcontext(), jax.set_mesh(mesh)):
        step = jdtr.remat_grad(m.loss, budget=budget)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with context:
                grads = jax.jit(step)(params, x)
                nbytes = per_device(step, params, x)
        assert not any("per device" in str(w.message) for w in seen), [str(w.message) for w in seen]
        (plan,) = step.plans.values()
        assert plan.unconstrained_compiled_bytes == full and plan.timings, (plan.unconstrained_compiled_bytes, full)
        assert nbytes <= budget < 0.6 * full, (nbytes, budget, full)
        for g, r in zip(grads, reference):
            assert g.sharding.is_equivalent_to(r.sharding, g.ndim), (g.sharding, r.sharding)
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    print("explicit without a context ok")

    # With Auto axes, a trace under jax.jit does not carry the shardings: it says so.
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    params = jax.device_put(m.params, NamedSharding(mesh, P()))
    x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        jax.jit(jdtr.remat_grad(m.loss, budget=0.5, autotune=False))(params, x)
    assert any("bytes per device" in str(w.message) for w in seen), [str(w.message) for w in seen]
    print("auto warned")
    """
)


@pytest.mark.long
def test_plans_on_sharded_arguments_keep_a_budget_per_device():
    stdout = run_on_8_devices(SCRIPT)
    for expected in (
        "mesh (2, 4) 0.3", "collectives ok", "arguments per device ok", "explicit ok", "explicit without a context ok",
        "auto warned",
    ):
        assert expected in stdout, stdout


GRAD_SCRIPT = COLLECTIVE_LOSS + textwrap.dedent(
    """
    from collections import Counter
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import jdtr, jdtr.nnx
    from flax import nnx
    from jdtr import models
    from jdtr.transform import rental
    assert len(jax.devices()) == 8
    rental.COMPILE_RATE = rental.CompileRate(0.0, weight=None)  # chunks from the second call on (conftest.py)

    def loss(ws, x):  # 16 layers; on the 2x4 mesh, weights alternate column and row sharding (Megatron's)
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    def live():  # the arrays alive, by placement and shape
        return sorted((str(a.sharding), a.shape) for a in jax.live_arrays())

    m = models.mlp_chain(layers=16, width=64, batch=8192)
    one_device = jdtr.grad(m.loss, return_stats=True)(m.params, m.batch)[1].unconstrained_peak_bytes
    meshes = (
        ((8,), ("data",), [P()] * 16, AxisType.Auto, (1.0, 0.5, 0.3)),
        ((2, 4), ("data", "model"), [P(None, "model"), P("model", None)] * 8, AxisType.Auto, (1.0, 0.5, 0.3)),
        # jax.make_mesh's default: shardings are part of the arrays' types, and
        # JAX runs an operation on them only with the mesh set (jdtr sets it).
        ((8,), ("data",), [P()] * 16, AxisType.Explicit, (0.5,)),
    )
    for shape, names, specs, axis_type, budgets in meshes:
        mesh = jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))
        params = [jax.device_put(w, NamedSharding(mesh, s)) for w, s in zip(m.params, specs)]
        x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
        reference = jax.jit(jax.grad(loss))(params, x)
        expected = [np.asarray(r) for r in reference]  # (reading an array caches its shards on it)
        before = live()
        for budget in budgets:
            step = jdtr.grad(loss, budget=budget, return_stats=True, debug=True)
            for call in range(3):  # step by step, then as compiled chunks
                grads, stats = step(params, x)
                assert stats.devices == 8
                assert stats.unconstrained_peak_bytes < one_device / 2, (stats.unconstrained_peak_bytes, one_device)
                assert stats.budget_bytes == int(budget * stats.unconstrained_peak_bytes)
                # Per device, counted over the arrays' shards (debug=True checks it after every step).
                assert stats.peak_bytes <= stats.budget_bytes and stats.live_peak_bytes <= stats.budget_bytes
                for g, r, e in zip(grads, reference, expected):
                    assert g.sharding.is_equivalent_to(r.sharding, g.ndim), (g.sharding, r.sharding)
                    np.testing.assert_allclose(np.asarray(g), e, rtol=1e-4, atol=1e-6)
            assert stats.execution == "chunks", stats
            assert (stats.rematerializations > 0) == (budget < 1.0), stats
            del grads, g
            assert not Counter(live()) - Counter(before), "a run left arrays behind"
            print("grad", shape, axis_type.name, budget, stats.execution, stats.chunks, round(stats.peak_bytes / stats.unconstrained_peak_bytes, 3))
        (value, grads), stats = jdtr.value_and_grad(loss, budget=0.5, mode="online", return_stats=True, debug=True)(params, x)
        assert stats.execution == "online" and stats.live_peak_bytes <= stats.budget_bytes
        np.testing.assert_allclose(value, loss(m.params, m.batch), rtol=1e-5)
        for g, r, e in zip(grads, reference, expected):
            assert g.sharding.is_equivalent_to(r.sharding, g.ndim)
            np.testing.assert_allclose(np.asarray(g), e, rtol=1e-4, atol=1e-6)
        print("online", shape, axis_type.name)

    # Flax NNX, data parallel: gradients and batch statistics as nnx.grad's.
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(64, 64, rngs=rngs) for _ in range(6)])
            self.bn = nnx.BatchNorm(64, rngs=rngs)

        def __call__(self, x):
            for layer in self.layers:
                x = jnp.tanh(layer(x))
            return self.bn(x)

    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    model = Net(nnx.Rngs(0))
    nnx.update(model, jax.device_put(nnx.state(model), NamedSharding(mesh, P())))
    twin = nnx.clone(model)
    x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
    objective = lambda net, x: jnp.mean(net(x) ** 2)
    expected = nnx.grad(objective)(twin, x)
    got, stats = jdtr.nnx.grad(objective, budget=0.4, return_stats=True, debug=True)(model, x)
    assert stats.devices == 8 and stats.live_peak_bytes <= stats.budget_bytes
    for g, r in zip(jax.tree.leaves(nnx.state(got)), jax.tree.leaves(nnx.state(expected))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(model.bn.mean[...]), np.asarray(twin.bn.mean[...]), rtol=1e-5, atol=1e-7)
    print("nnx ok")

    # A GPT on the 2x4 mesh (Auto axes), its kernels split over the model axis: the
    # partitioner shards some gradients otherwise for one equation than for the whole
    # step (LayerNorm biases, the attention's kernel); they come back as the step's.
    grid = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    gpt = models.flax_gpt_megatron(grid, blocks=2, dim=32, seq=16, batch=16, vocab=64)
    gpt_loss, state, tokens = gpt.loss, gpt.params, gpt.batch
    reference = jax.jit(jax.grad(gpt_loss))(state, tokens)
    # (the test's premise: on one equation, XLA places these gradients otherwise)
    assert any(r.sharding.spec == P("model") for r in jax.tree.leaves(reference)), reference
    step = jdtr.grad(gpt_loss, budget=0.5, return_stats=True, debug=True)
    for call in range(2):  # step by step, then as compiled chunks
        grads, stats = step(state, tokens)
        assert stats.live_peak_bytes <= stats.budget_bytes, stats
        for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference)):
            assert g.sharding.is_equivalent_to(r.sharding, g.ndim), (g.sharding, r.sharding)
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    assert stats.execution == "chunks" and stats.rematerializations > 0, stats
    print("gpt shardings ok")

    # A loss closing over sharded arrays (a frozen embedding table, a frozen layer): constants
    # of the step, which chunks must take as they are placed (a second call failed before).
    table = jax.device_put(jax.random.normal(jax.random.PRNGKey(2), (128, 64)), NamedSharding(grid, P(None, "model")))
    frozen = jax.device_put(jax.random.normal(jax.random.PRNGKey(3), (64, 64)) / 8, NamedSharding(grid, P("model", None)))

    def tuned_loss(ws, tokens):
        h = jnp.tanh(table[tokens] @ frozen)
        for w in ws:
            h = jnp.tanh(h @ w) + h
        return jnp.mean(h ** 2)

    ws = [jax.device_put(w, NamedSharding(grid, s)) for w, s in zip(m.params[:8], [P(None, "model"), P("model", None)] * 4)]
    tokens = jax.device_put(jax.random.randint(jax.random.PRNGKey(4), (256,), 0, 128), NamedSharding(grid, P("data")))
    reference = jax.jit(jax.grad(tuned_loss))(ws, tokens)
    step = jdtr.grad(tuned_loss, budget=0.5, return_stats=True, debug=True)
    for call in range(2):  # step by step, then as compiled chunks
        grads, stats = step(ws, tokens)
        assert stats.live_peak_bytes <= stats.budget_bytes, stats
        for g, r in zip(grads, reference):
            assert g.sharding.is_equivalent_to(r.sharding, g.ndim), (g.sharding, r.sharding)
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    assert stats.execution == "chunks" and stats.rematerializations > 0, stats
    print("closed over ok")

    # Collectives in the step: shard_map with a psum in every layer.
    collective_loss = collective_loss_on(mesh)

    params = [jax.device_put(w, NamedSharding(mesh, P())) for w in m.params]
    reference = jax.jit(jax.grad(collective_loss))(params, x)
    for budget in (0.5, 0.3):
        step = jdtr.grad(collective_loss, budget=budget, return_stats=True, debug=True)
        for call in range(2):
            grads, stats = step(params, x)
            assert stats.rematerializations > 0 and stats.live_peak_bytes <= stats.budget_bytes
            for g, r in zip(grads, reference):
                np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    print("collectives ok")

    # Arguments on a mesh over the budget: the error says it is per device.
    try:
        jdtr.grad(loss, budget=0.05)(params, x)
        raise AssertionError("ran below its arguments' bytes")
    except jdtr.OutOfBudgetError as err:
        assert "per device" in str(err) + " ".join(getattr(err, "__notes__", [])), err
    print("errors ok")

    # Reading a cond's predicate leaves a single-device view of its shard, cached on it:
    # the debug check counts that buffer once (at 1.0 the budget has no byte to spare).
    def branching(ws, x):
        for i, w in enumerate(ws):
            x = jnp.tanh(x @ w)
            if i == 3:
                x = jax.lax.cond(jnp.mean(x) > 0, lambda h: h * 0.5, lambda h: h * 2.0, x)
        return jnp.mean(x ** 2)

    params = [jax.device_put(w, NamedSharding(mesh, P())) for w in m.params[:8]]
    reference = jax.jit(jax.grad(branching))(params, x)
    for call in range(2):
        grads, stats = jdtr.grad(branching, budget=1.0, return_stats=True, debug=True)(params, x)
        assert stats.live_peak_bytes <= stats.budget_bytes
        for g, r in zip(grads, reference):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    print("views ok")

    # Arguments committed to one device other than JAX's default: the chunks are compiled for
    # it (before, compiled for the default device, they refused the arrays on the second call),
    # again for a call on the default device, and a cond on data runs by its paths there too.
    third, ws, batch = jax.devices()[3], m.params[:8], m.batch[:1024]
    for fn, placements in ((loss, (third, jax.devices()[0], third)), (branching, (third,))):
        params, x = jax.device_put(ws, third), jax.device_put(batch, third)
        expected = [np.asarray(r) for r in jax.jit(jax.grad(fn))(params, x)]
        step = jdtr.grad(fn, budget=0.5, return_stats=True, debug=True)
        for device in placements:
            for call in range(3):  # (a cond on data: its path's plan compiles a run later)
                grads, stats = step(*jax.device_put((ws, batch), device))
                assert stats.live_peak_bytes <= stats.budget_bytes, stats
                for g, e in zip(grads, expected):
                    assert g.devices() == {device}, (g.devices(), device)
                    np.testing.assert_allclose(np.asarray(g), e, rtol=1e-4, atol=1e-6)
            assert stats.execution == "chunks", stats
    with jax.default_device(jax.devices()[5]):  # uncommitted arrays run on the default device
        fresh = [jnp.array(np.asarray(w)) for w in ws], jnp.array(np.asarray(batch))
        for call in range(2):
            grads, stats = step(*fresh)
        assert stats.execution == "chunks" and all(g.devices() == {jax.devices()[5]} for g in grads), stats
    print("one device ok")

    # A loss that is one shard_map (Megatron-style layers, a psum over each axis): its body is
    # inlined, each equation a shard_map of its own, so DTR plans inside it. Before, the two
    # shard_maps of its gradient were two operators holding every residual: no run below ~1.0.
    # (on Explicit axes, the loss's cotangent, made on one device, is placed by the shard_map's in_specs first)
    for axis_type, budgets in ((AxisType.Auto, (0.6, 0.5)), (AxisType.Explicit, (0.5,))):
        grid = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
        manual = models.megatron_shard_map(grid, layers=4, width=128, batch=2048, seed=1)
        manual_loss, ws, x = manual.loss, manual.params, manual.batch
        reference = jax.jit(jax.grad(manual_loss))(ws, x)
        for budget in budgets:
            step = jdtr.grad(manual_loss, budget=budget, return_stats=True, debug=True)
            for call in range(2):
                grads, stats = step(ws, x)
                assert stats.rematerializations > 0 and stats.live_peak_bytes <= stats.budget_bytes, stats
                for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference)):
                    assert g.sharding.is_equivalent_to(r.sharding, g.ndim), (g.sharding, r.sharding)
                    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
            print("one shard_map", axis_type.name, budget, stats.equations, round(stats.peak_bytes / stats.unconstrained_peak_bytes, 3))
    """
)


@pytest.mark.long
def test_grad_on_sharded_arguments_keeps_a_budget_per_device():
    """`jdtr.grad`, `value_and_grad` and `jdtr.nnx` on arguments sharded over
    8 CPU devices: the run's steps and chunks are XLA's partitioned programs,
    every value counted on one device by the sharding XLA gives it."""
    stdout = run_on_8_devices(GRAD_SCRIPT)
    for expected in ("grad (2, 4) Auto 0.3", "online (2, 4)", "grad (8,) Explicit 0.5", "online (8,) Explicit", "nnx ok", "gpt shardings ok", "closed over ok", "collectives ok", "errors ok", "views ok", "one device ok", "one shard_map Auto 0.5", "one shard_map Explicit 0.5"):
        assert expected in stdout, stdout


def test_a_keys_bytes_per_device_are_its_physical_words():
    """`devices.device_bytes` counts a typed PRNG key by its physical words,
    whether given the key array or its `ShapeDtypeStruct` (a sharded step's
    key argument; autotuning's example key). The spec's raised: its dtype
    is no NumPy dtype, and only abstract values were mapped to words."""
    from jdtr.transform.devices import device_bytes

    for impl in ("threefry2x32", "rbg"):
        keys = jax.random.split(jax.random.key(0, impl=impl), 4)
        assert device_bytes(keys) == keys.nbytes
        assert device_bytes(jax.ShapeDtypeStruct(keys.shape, keys.dtype)) == keys.nbytes


IN_SHARD_MAP_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jdtr
    assert len(jax.devices()) == 8
    mesh = jax.make_mesh((8,), ("data",))
    key = jax.random.PRNGKey(0)
    ws = [jax.device_put(jax.random.normal(jax.random.fold_in(key, i), (64, 64)) / 8, NamedSharding(mesh, P())) for i in range(16)]
    x = jax.device_put(jax.random.normal(key, (8 * 4096, 64)), NamedSharding(mesh, P("data")))

    def loss(ws, x):  # one device's batch; the weights replicated: JAX casts them to vary where they meet it
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    def step(grad):
        per_device = lambda ws, x: jax.tree.map(lambda g: jax.lax.pmean(g, "data"), grad(ws, x))
        return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))

    def nbytes(f):
        m = f.lower(ws, x).compile().memory_analysis()
        return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes

    reference = step(jax.grad(loss))
    expected = reference(ws, x)
    for budget in (0.5, 0.3):
        planned = step(jdtr.remat_grad(loss, budget=budget, autotune=False))
        for g, e in zip(planned(ws, x), expected):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-7)
        ratio = nbytes(planned) / nbytes(reference)
        assert ratio <= budget + 0.02, (budget, ratio)  # (the pmean's buffers beside the planned step)
        print("in shard_map", budget, round(ratio, 3))

    # A scan the plan keeps: its body, traced outside, bound in the body too.
    cells = {"w": ws[0], "u": ws[1]}
    xs = jax.device_put(jax.random.normal(key, (8 * 256, 128, 64)), NamedSharding(mesh, P("data")))

    def rnn(cells, xs):
        def cell(h, x):
            h = jnp.tanh(h @ cells["w"] + x @ cells["u"])
            return h, h
        _, hs = jax.lax.scan(cell, jnp.zeros_like(xs[:, 0]), jnp.swapaxes(xs, 0, 1))
        return jnp.mean(hs ** 2)

    expected = step(jax.grad(rnn))(cells, xs)
    planned = jdtr.remat_grad(rnn, budget=0.8, autotune=False)
    got = step(planned)(cells, xs)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-7)
    print("scan kept in shard_map", len(planned.plans[next(iter(planned.plans))].scans))
    """
)


def test_remat_grad_inside_a_shard_map_body_with_its_types_checked():
    """`remat_grad` as a `shard_map` body's per-device step (data parallel,
    the weights replicated). JAX's own operations cast the invariant weights
    to vary where they meet the batch; a plan's program, traced outside the
    body, binds primitives without those casts, and JAX refused them
    ("requires varying manual axes to match"): they are made where a bind
    asks for them (`executable.vary_alike`)."""
    if not hasattr(jax, "shard_map"):
        pytest.skip("jax.shard_map with checked types: JAX 0.7 and later")
    stdout = run_on_8_devices(IN_SHARD_MAP_SCRIPT, timeout=600)
    assert "in shard_map 0.3" in stdout and "scan kept in shard_map 1" in stdout, stdout


ONE_SHARD_MAP_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType
    import jdtr
    from jdtr import models
    assert len(jax.devices()) == 8

    def per_device(f, *args):
        m = jax.jit(f).lower(*args).compile().memory_analysis()
        return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes

    for axis_type, budgets in ((AxisType.Explicit, (0.5, 0.3)), (AxisType.Auto, (0.5,))):
        grid = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
        manual = models.megatron_shard_map(grid, layers=6, width=128, batch=2048, seed=1)
        loss, ws, x = manual.loss, manual.params, manual.batch
        reference = jax.jit(jax.grad(loss))(ws, x)
        full = per_device(jax.grad(loss), ws, x)
        for budget in budgets:
            try:
                plan = jdtr.plan(loss, ws, x, budget=budget, autotune=False)
            except jdtr.OutOfBudgetError as err:  # a call at the budget it verified runs (before: 1.0 and more)
                assert budget < 0.5 and err.suggested_budget_bytes < 0.6 * full, (budget, err.suggested_budget_bytes / full)
                assert any("call remat_grad inside the body" in n for n in getattr(err, "__notes__", ())), err
                plan = jdtr.plan(loss, ws, x, budget=err.suggested_budget_bytes, autotune=False)
            measured = per_device(plan.grad, ws, x)
            assert measured == plan.compiled_bytes <= plan.budget_bytes, (measured, plan.compiled_bytes, plan.budget_bytes)
            assert any(s.recomputed for s in plan.segments), plan.segments
            for g, r in zip(jax.tree.leaves(jax.jit(plan.grad)(ws, x)), jax.tree.leaves(reference)):
                assert g.sharding.is_equivalent_to(r.sharding, g.ndim), (g.sharding, r.sharding)
                np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
            print("one shard_map", axis_type.name, budget, round(measured / full, 3))
        if axis_type == AxisType.Explicit:  # under jax.jit, the arguments' types carry their shardings
            step = jdtr.remat_grad(loss, budget=0.5, autotune=False)
            for g, r in zip(jax.tree.leaves(jax.jit(step)(ws, x)), jax.tree.leaves(reference)):
                np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
            print("under jit", round(per_device(step, ws, x) / full, 3))
        else:  # called eagerly, autotuned: its candidates timed on the arrays' mesh
            for g, r in zip(jax.tree.leaves(jdtr.remat_grad(loss, budget=0.5)(ws, x)), jax.tree.leaves(reference)):
                np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
            print("eager autotuned")
    """
)


@pytest.mark.long
def test_remat_grad_plans_inside_a_loss_written_as_one_shard_map():
    """A loss that is one `shard_map` (Megatron-style layers on a 2x4 mesh,
    a `psum` over each axis). As one equation, its gradient is two `shard_map`s,
    the backward body needing every residual of the forward body at once:
    no plan below about `jax.grad`'s own bytes per device. Its body is
    inlined for planning (`manual.py`), each equation a `shard_map` of its
    own, and the plan's segments cut inside it. (The residuals JAX's
    `shard_map` rule makes beside each small `shard_map`'s output must count
    as read, `planning._backward_reads`: without them, the smallest plan
    the search found for these 6 layers at 0.5 was 0.64.)"""
    if not hasattr(jax, "shard_map"):
        pytest.skip("jax.shard_map with checked types: JAX 0.7 and later")
    stdout = run_on_8_devices(ONE_SHARD_MAP_SCRIPT)
    for expected in ("one shard_map Explicit 0.3", "one shard_map Auto 0.5", "under jit", "eager autotuned"):
        assert expected in stdout, stdout
