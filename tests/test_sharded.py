"""The compiled path on sharded arguments: a budget is bytes per device.

On 8 CPU devices, in a subprocess (the rest of the suite keeps one device):
a data-parallel mesh and a 2x4 data/model mesh, budgets 1.0, 0.5 and 0.3 of
`jax.jit(jax.grad)`'s bytes per device, with activations dominating. The
plan's compiled bytes are XLA's per device for the partitioned step
(`memory_analysis()`), and must be within the budget (and its stated
slack); gradients equal `jax.grad`'s, with its shardings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax

SCRIPT = textwrap.dedent(
    """
    import warnings
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import jdtr
    from jdtr import models
    assert len(jax.devices()) == 8
    SLACK = 0.10

    def per_device(fn, *args):
        a = jax.jit(fn).lower(*args).compile().memory_analysis()
        return a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes

    m = models.mlp_chain(layers=48, width=32, batch=4096)
    for shape, names, weights in (((8,), ("data",), P()), ((2, 4), ("data", "model"), P(None, "model"))):
        mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
        params = jax.device_put(m.params, NamedSharding(mesh, weights))
        x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
        full = per_device(jax.grad(m.loss), params, x)
        assert full < per_device(jax.grad(m.loss), m.params, m.batch)  # it is partitioned
        reference = jax.jit(jax.grad(m.loss))(params, x)
        for budget in (1.0, 0.5, 0.3):
            plan = jdtr.plan(m.loss, params, x, budget=budget, autotune=False)
            assert plan.budget_bytes == int(budget * full)
            assert plan.compiled_bytes == per_device(plan.grad, params, x)
            assert plan.compiled_bytes <= budget * full * (1 + SLACK), (shape, budget, plan.compiled_bytes, full)
            assert (plan.origin == "none") == (budget == 1.0)
            grads = jdtr.remat_grad(m.loss, budget=budget, autotune=False)(params, x)
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
    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))

    def layer(w, h):
        h = jnp.tanh(h @ w)
        return h * jax.lax.rsqrt(jax.lax.psum(jnp.mean(h * h), "data") / 8 + 1.0)

    def collective_loss(params, x):
        for w in params:
            x = shard_map(layer, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))(w, x)
        return jnp.mean(x ** 2)

    params = jax.device_put(m.params[:24], NamedSharding(mesh, P()))
    x = jax.device_put(m.batch, NamedSharding(mesh, P("data")))
    full = per_device(jax.grad(collective_loss), params, x)
    for budget in (0.5, 0.3):
        plan = jdtr.plan(collective_loss, params, x, budget=budget, autotune=False)
        assert plan.origin == "dtr" and any(s.recomputed for s in plan.segments)
        assert plan.compiled_bytes <= budget * full * (1 + SLACK)
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
        step = jdtr.remat_grad(m.loss, budget=0.5, autotune=False)
        grads = jax.jit(step)(params, x)
        (plan,) = step.plans.values()
        assert plan.unconstrained_compiled_bytes == full and plan.compiled_bytes <= 0.5 * full * (1 + SLACK)
        for g, r in zip(grads, jax.jit(jax.grad(m.loss))(params, x)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    print("explicit ok")

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


def test_plans_on_sharded_arguments_keep_a_budget_per_device():
    flags = "--xla_force_host_platform_device_count=8"
    if jax.__version_info__ >= (0, 10):
        # 8 devices' collectives on a busy 2-core machine can wait long for
        # each other; XLA's default 40 s before it aborts is too short there.
        flags += " --xla_cpu_collective_call_terminate_timeout_seconds=600"
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    for expected in ("mesh (2, 4) 0.3", "collectives ok", "arguments per device ok", "explicit ok", "auto warned"):
        assert expected in result.stdout, result.stdout
