"""Meshes that span several processes (multi-host), on the CPU.

Two processes on this machine, four CPU devices each, joined by
`jax.distributed` (gloo collectives): one global 2x4 mesh, of which each
process holds half the shards and can read no whole array. The same calls
as on one process's mesh (`tests/test_sharded.py`):

* `jdtr.grad` with a `cond` on data at budgets 1.0 and 0.3 per device,
  step by step and in chunks: gradients equal `jax.jit(jax.grad)`'s, shard
  by shard, and the debug check holds after every step;
* `cost_model="measured"` (this process's timings) is refused;
* `jdtr.plan` / `remat_grad`: the same plan on both processes, chosen by
  memory (autotuning would time candidates, which differ between
  processes, and says it is off), within the budget;
* collectives in the step (a `psum` in every layer's `shard_map`),
  recomputed by both processes alike.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap

import jax
import pytest
from test_sharded import COLLECTIVE_LOSS

# Joined before anything touches a device; then the loss with collectives of tests/test_sharded.py.
_JOIN = textwrap.dedent(
    """
    import sys
    process, port = int(sys.argv[1]), sys.argv[2]
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=process)
    """
)

SCRIPT = _JOIN + COLLECTIVE_LOSS + textwrap.dedent(
    """
    import hashlib, warnings
    import jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import jdtr
    from jdtr import models
    assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4

    def put(a, sharding):  # a global array: each process makes its own devices' shards
        a = np.asarray(a)
        return jax.make_array_from_callback(a.shape, sharding, lambda index: a[index])

    def same(got, want):  # shard by shard: no process can read a whole array
        for g, w in zip(got, want):
            assert g.sharding.is_equivalent_to(w.sharding, g.ndim), (g.sharding, w.sharding)
            assert not g.is_fully_addressable
            for a, b in zip(g.addressable_shards, w.addressable_shards):
                np.testing.assert_allclose(np.asarray(a.data), np.asarray(b.data), rtol=1e-4, atol=1e-6)

    def loss(ws, x):  # weights alternate column and row sharding (Megatron's)
        for i, w in enumerate(ws):
            x = jnp.tanh(x @ w)
            if i == 7:  # a cond on data: its predicate is read on every process alike
                x = jax.lax.cond(jnp.mean(x) > 0, lambda h: h * 0.5, lambda h: h * 2.0, x)
        return jnp.mean(x ** 2)

    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    m = models.mlp_chain(layers=16, width=64, batch=8192)
    params = [put(w, NamedSharding(mesh, s)) for w, s in zip(m.params, [P(None, "model"), P("model", None)] * 8)]
    x = put(m.batch, NamedSharding(mesh, P("data")))
    reference = jax.jit(jax.grad(loss))(params, x)
    for budget in (1.0, 0.3):
        step = jdtr.grad(loss, budget=budget, return_stats=True, debug=True)
        for call in range(3):  # step by step, then in chunks
            grads, stats = step(params, x)
            same(grads, reference)
            assert stats.devices == 8 and stats.live_peak_bytes <= stats.budget_bytes, stats
        assert (stats.rematerializations > 0) == (budget < 1.0) and stats.execution == "chunks", stats
        print("grad", budget, stats.rematerializations, stats.peak_bytes, stats.budget_bytes, flush=True)
    try:
        jdtr.grad(loss, budget=0.5, cost_model="measured")(params, x)
        raise AssertionError("planned from this process's timings")
    except ValueError as err:
        assert "processes" in str(err), err
    print("measured refused", flush=True)

    c = models.mlp_chain(layers=48, width=32, batch=4096)  # activations dominate
    params = [put(w, NamedSharding(mesh, P(None, "model"))) for w in c.params]
    x = put(c.batch, NamedSharding(mesh, P("data")))
    reference = jax.jit(jax.grad(c.loss))(params, x)
    for budget in (0.3,):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            plan = jdtr.plan(c.loss, params, x, budget=budget, autotune=True)
        assert any("autotune is off" in str(w.message) for w in seen), [str(w.message) for w in seen]
        assert plan.origin == "dtr" and not plan.timings
        assert plan.compiled_bytes <= budget * plan.unconstrained_compiled_bytes, plan.report()
        same(jax.jit(plan.grad)(params, x), reference)
        same(jdtr.remat_grad(c.loss, budget=budget)(params, x), reference)
        layout = repr([(s.start, s.stop, sorted(v.id for v in s.saved)) for s in plan.segments])
        print("plan", budget, plan.compiled_bytes, hashlib.sha1(layout.encode()).hexdigest(), flush=True)

    data = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    collective_loss = collective_loss_on(data)
    params = [put(w, NamedSharding(data, P())) for w in m.params[:8]]
    x = put(m.batch, NamedSharding(data, P("data")))
    step = jdtr.grad(collective_loss, budget=0.5, return_stats=True, debug=True)
    for call in range(2):
        grads, stats = step(params, x)
        same(grads, jax.jit(jax.grad(collective_loss))(params, x))
        assert stats.rematerializations > 0 and stats.live_peak_bytes <= stats.budget_bytes
    plan = jdtr.plan(collective_loss, params, x, budget=0.5)
    assert any(s.recomputed for s in plan.segments)
    same(jax.jit(plan.grad)(params, x), jax.jit(jax.grad(collective_loss))(params, x))
    print("collectives ok", flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(
    not hasattr(jax.config, "jax_cpu_collectives_implementation"), reason="this JAX has no CPU collectives across processes"
)
@pytest.mark.long
def test_a_mesh_over_two_processes_runs_the_same_plan_on_both():
    flags = "--xla_force_host_platform_device_count=4"
    if jax.__version_info__ >= (0, 10):
        flags += " --xla_cpu_collective_call_terminate_timeout_seconds=600"
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    port = str(_free_port())
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(i), port], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for p in processes:
            outputs.append(p.communicate(timeout=600))
    finally:
        for p in processes:  # one that failed leaves the other waiting on its collectives
            p.kill()
    for p, (out, err) in zip(processes, outputs):
        assert p.returncode == 0, out[-2000:] + err[-4000:]
        for expected in ("grad 0.3", "measured refused", "plan 0.3", "collectives ok"):
            assert expected in out, out
    # Both processes planned alike: the same segments and saved values, the same bytes.
    plans = [re.findall(r"^plan .*$", out, re.MULTILINE) for out, _ in outputs]
    assert plans[0] == plans[1] and len(plans[0]) == 1, plans
