"""`jdtr.trace` and `jdtr.grad(..., log=path)`: operator logs of JAX computations.

The reference is `jdtr.grad` itself: replaying a recorded log with
`jdtr.simulate` under the same budget in bytes must take the run's decisions
(the same peak, evictions and rematerializations), because the log holds
exactly what the program asked of the runtime.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jdtr
from budgets import biting
from jdtr import models
from jdtr.oplog import Annotate, Call, Constant, Copy, CopyFrom, Release, Trace
from jdtr.transform import normalize
from jdtr.transform.planner import MAX_OVERHEAD

# Small, with activations (not weights) dominating the peak, so that budgets bite.
MODELS = {
    "mlp": lambda: models.mlp_chain(layers=16, width=32, batch=128),
    "resnet": lambda: models.resnet(blocks=2, channels=8, image=8, batch=8),
    "transformer": lambda: models.transformer(blocks=1, dim=32, heads=4, seq=32, batch=4, vocab=32),
    "rnn": lambda: models.rnn(steps=12, hidden=32, features=8, batch=32),
}
# h_DTR^eq is the default. LRU and size read no costs, so whole-nanosecond
# rounding cannot flip their choices: their replays are exact at any budget.
HEURISTICS = {"mlp": ("dtr_eq", "lookahead", "lru", "size"), "resnet": ("dtr_eq", "size"), "transformer": ("dtr_eq", "lookahead", "size"),
              "rnn": ("dtr_eq",)}  # fmt: skip


@functools.cache
def model(name):
    return MODELS[name]()


def decisions(result):
    return result.peak_bytes, result.evictions, result.rematerializations


@pytest.mark.parametrize("name", sorted(MODELS))
def test_simulating_the_trace_takes_the_runs_decisions(name):
    m = model(name)
    trace = jdtr.trace(m.loss, m.params, m.batch)
    _, full = jdtr.grad(m.loss, budget=1.0, return_stats=True, scans="unroll")(m.params, m.batch)
    baseline = jdtr.simulate(trace, full.budget_bytes)
    assert decisions(baseline) == decisions(full) == (full.unconstrained_peak_bytes, 0, 0)
    # TIME is the cost model's seconds as whole nanoseconds.
    assert baseline.baseline_cost == pytest.approx(full.base_cost * 1e9, rel=1e-9)
    remats = 0
    for heuristic in HEURISTICS[name]:
        for ratio in (0.7, 0.5):
            budget = int(ratio * full.unconstrained_peak_bytes)
            simulated = jdtr.simulate(trace, budget, heuristic, overhead_limit=None)
            try:
                _, stats = jdtr.grad(m.loss, budget=budget, heuristic=heuristic, return_stats=True, scans="unroll")(m.params, m.batch)
            except jdtr.OverheadLimitError:  # the plan's simulation was cut off thrashing at MAX_OVERHEAD
                assert simulated.status == "oom" or simulated.overhead > MAX_OVERHEAD, (heuristic, ratio)
                continue
            except jdtr.OutOfBudgetError:
                assert simulated.status == "oom", (heuristic, ratio)
                continue
            assert simulated.status == "ok"
            assert decisions(simulated) == decisions(stats), (heuristic, ratio)
            assert simulated.remat_cost == pytest.approx(stats.remat_cost * 1e9, rel=1e-9)
            remats += stats.rematerializations
    assert remats > 0  # the budgets did bite


def tiny_loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"]) ** 2)


def tiny_args():
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((8, 16), np.float32), "w2": rng.standard_normal((16, 4), np.float32)}
    return params, rng.standard_normal((32, 8), np.float32)


def test_log_records_the_program_as_the_paper_format_says():
    params, x = tiny_args()
    trace = jdtr.trace(tiny_loss, params, x)
    closed = jax.make_jaxpr(jax.value_and_grad(tiny_loss))(params, x)
    program = normalize(closed)
    records = trace.records
    assert records[0] == Annotate("START")
    # Outputs (value, dw1, dw2) are made in another order than returned, so
    # the log names them up front, in the program's order.
    assert records[1:4] == (Constant("output0", 0), Constant("output1", 0), Constant("output2", 0))
    arguments = [r for r in records if isinstance(r, Constant) and r.name.startswith("argument")]
    assert [r.memory for r in arguments] == [v.nbytes for v in program.inputs] == [8 * 16 * 4, 16 * 4 * 4, 32 * 8 * 4]
    calls = [r for r in records if isinstance(r, Call)]
    assert [c.name for c in calls] == [eq.name for eq in program.body]
    for call, eq in zip(calls, program.body):
        assert call.memory == tuple(v.nbytes for v in eq.outputs)
        assert call.time == eq.cost and call.alias == (-1,) * len(eq.outputs)
    names = [n for c in calls for n in c.result] + [r.name for r in records if isinstance(r, Constant)]
    assert len(names) == len(set(names))  # unique tensor names
    # Every value but the outputs is released once, after its last use.
    released = [r.name for r in records if isinstance(r, Release)]
    assert len(released) == len(set(released))
    moved = [r for r in records if isinstance(r, CopyFrom)]
    assert [r.dst for r in moved] == ["output0", "output1", "output2"] and released[-3:] == [r.src for r in moved]
    program_out = trace.program
    assert [program_out.value_names[v] for v in program_out.outputs] == [r.src for r in moved]
    assert program_out.compute_cost == sum(c.time for c in calls)


def test_log_keyword_writes_the_same_log_and_it_round_trips(tmp_path):
    params, x = tiny_args()
    path = tmp_path / "step.log"
    _, stats = jdtr.grad(tiny_loss, budget=biting(tiny_loss, (params, x), 0.8), return_stats=True, log=path)(params, x)
    logged = Trace.from_log(path)
    assert logged == jdtr.trace(tiny_loss, params, x)  # the log does not depend on the budget
    assert Trace.from_lines(logged.to_lines()) == logged
    assert decisions(jdtr.simulate(logged, stats.budget_bytes, jdtr.DEFAULT_HEURISTIC)) == decisions(stats)
    assert stats.rematerializations > 0

    def with_aux(params, x):
        return tiny_loss(params, x), {"mean": jnp.mean(x)}

    jdtr.value_and_grad(with_aux, has_aux=True, log=tmp_path / "aux.log")(params, x)
    aux_trace = Trace.from_log(tmp_path / "aux.log")
    assert aux_trace == jdtr.trace(with_aux, params, x, has_aux=True)
    assert len(aux_trace.program.outputs) == 4  # value, aux, two gradients
    argnums = jdtr.trace(tiny_loss, params, x, argnums=(0, 1))
    assert len(argnums.program.outputs) == 4  # value, dw1, dw2, dx


def branchy_loss(w, x):
    h = jnp.tanh(x @ w)

    def big(h):
        return jnp.sum(jnp.outer(h.ravel(), h.ravel())) * h

    h = lax.cond(x[0, 0] > 100.0, big, jnp.sin, h)
    jax.debug.callback(lambda v: None, h.sum())  # no outputs
    return jnp.mean(jnp.tanh(h @ w) ** 2)


def test_cond_trace_takes_the_largest_branch_and_a_logged_run_the_branch_taken(tmp_path):
    w, x = jnp.full((8, 8), 0.1), jnp.ones((16, 8))
    simulated = [c for c in jdtr.trace(branchy_loss, w, x).records if isinstance(c, Call)]
    _, stats = jdtr.grad(branchy_loss, return_stats=True, log=tmp_path / "run.log")(w, x)
    logged = Trace.from_log(tmp_path / "run.log")
    taken = [c for c in logged.records if isinstance(c, Call)]
    outer = (16 * 8) ** 2 * 4  # the big branch's outer product
    assert max(m for c in simulated for m in c.memory) == outer
    assert max(m for c in taken for m in c.memory) < outer  # the predicate is false here
    assert "sin" in {c.name for c in taken} and "sin" not in {c.name for c in simulated}
    callback = next(c for c in taken if c.name == "debug_callback")
    assert callback.memory == (0,)  # no outputs: one 0-byte result, released at once
    assert Release(callback.result[0]) in logged.records
    assert any(isinstance(r, Copy) for r in logged.records)  # the branch's references to its operands
    replay = jdtr.simulate(logged, stats.budget_bytes, jdtr.DEFAULT_HEURISTIC)
    assert replay.status == "ok" and replay.peak_bytes == stats.peak_bytes


def test_xla_temporaries_are_reserved_while_their_operator_runs(tmp_path):
    """Found on an H100: XLA takes memory beside an operator's outputs while
    it runs (a matmul's cuBLAS workspace, LAPACK's for `eigh` on the CPU),
    which jdtr did not count, so the device exceeded budgets jdtr's count
    kept. They are reserved with the outputs while the operator runs; its
    log's `CALL` has one more result "workspace<n>" of that size, released
    right after, which the simulator reads back as the operator's workspace."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((16, 16)), jnp.float32)

    def loss(x):
        return jnp.sum(jnp.linalg.eigvalsh(x @ x.T + 2.0 * jnp.eye(16)) ** 2)

    a = x @ x.T + 2.0 * jnp.eye(16)
    eigh = lambda a: lax.linalg.eigh(a, lower=True, symmetrize_input=False)  # noqa: E731 - the primitive alone
    temp = jax.jit(eigh).lower(a).compile().memory_analysis().temp_size_in_bytes
    assert temp > 0  # else this test no longer tells

    log = tmp_path / "run.log"
    grads, stats = jdtr.grad(loss, return_stats=True, log=str(log))(x)
    np.testing.assert_allclose(grads, jax.grad(loss)(x), rtol=1e-4, atol=1e-4)
    records = Trace.from_log(log).records
    (i,) = [k for k, r in enumerate(records) if isinstance(r, Call) and r.name == "eigh"]
    call = records[i]
    outputs = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in jax.eval_shape(eigh, a))
    assert call.memory[:-1] and sum(call.memory[:-1]) == outputs
    assert call.memory[-1] == temp and call.result[-1].startswith("workspace")
    assert records[i + 1] == Release(call.result[-1])
    # read back as the operator's workspace, not a value
    (step,) = [s for s in Trace.from_log(log).program.steps if getattr(s, "name", None) == "eigh"]
    assert step.workspace == temp and len(step.outputs) == len(call.result) - 1
    # budget 1.0 holds it without evicting, and the replay agrees with the run
    assert stats.evictions == 0 and stats.peak_bytes <= stats.budget_bytes
    assert jdtr.simulate(Trace.from_log(log), stats.budget_bytes).peak_bytes == stats.peak_bytes
