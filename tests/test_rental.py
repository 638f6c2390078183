"""When a plan's chunks are compiled (`chunks="auto"`): the ski-rental rule
of `jdtr/transform/rental.py`, with rates set by each test (conftest.py
fixes the suite's at nothing, so elsewhere plans compile on their second run)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jdtr
from jdtr import models
from jdtr.transform import executor, rental
from jdtr.transform.rental import CompileRate, Rent, pays


def test_the_rate_starts_at_its_prior_and_moves_with_what_compiles_took():
    rate = CompileRate(0.004, weight=1000)
    assert rate.estimate(500) == pytest.approx(2.0)
    rate.observe(1000, 8.0)  # 8 ms an operation
    assert rate.seconds_per_operation() == pytest.approx((0.004 * 1000 + 8.0) / 2000)
    rate.observe(0, 5.0)  # nothing compiled: nothing learnt
    assert rate.estimate(100) == pytest.approx(100 * 0.006)
    fixed = CompileRate(0.5, weight=None)
    fixed.observe(10, 100.0)
    assert fixed.estimate(4) == 2.0
    for prior, weight in ((-1.0, 10), (0.1, 0)):
        with pytest.raises(ValueError, match="compile rate"):
            CompileRate(prior, weight)


def test_a_plan_compiles_once_its_step_by_step_seconds_reach_the_estimate():
    rate = CompileRate(0.01, weight=None)  # 100 operations: 1 s to compile
    assert pays("always", Rent(), 100, False, rate)
    assert not pays("never", Rent(runs=50, stepped_s=1e6), 100, False, rate)
    assert not pays("auto", Rent(runs=0, stepped_s=5.0), 100, False, rate)  # a first run is step by step
    assert not pays("auto", Rent(runs=3, stepped_s=0.99), 100, False, rate)
    assert pays("auto", Rent(runs=3, stepped_s=1.0), 100, False, rate)
    assert not pays("auto", Rent(runs=3, stepped_s=1.0), 101, False, rate)
    # Across processes: by the count of runs alone, the same in each.
    assert pays("auto", Rent(runs=1, stepped_s=0.0), 100, True, rate)
    assert not pays("auto", Rent(runs=0), 100, True, rate)


def _plan(f):
    (traced,) = f.cache.values()
    (plan,) = traced.plans.values()
    return plan


def test_grad_rents_until_the_steps_took_what_compiling_is_expected_to(monkeypatch):
    """Through `jdtr.grad`: the call that compiles is the first whose
    step-by-step runs before it took at least the estimate, whatever this
    machine's timings; its gradients are `jax.grad`'s."""
    m = models.mlp_chain(layers=8, width=32, batch=64)
    f = jdtr.grad(m.loss, budget=0.6, return_stats=True)
    stats = [f(m.params, m.batch)[1]]
    assert stats[0].execution == "steps" and stats[0].rematerializations > 0
    operations = [executor.operations(_plan(f).line)]  # of the plan each call ran by
    per_operation = 4 * stats[0].wall_time_s / operations[0]  # several runs' worth for the plan
    monkeypatch.setattr(rental, "COMPILE_RATE", CompileRate(per_operation, weight=None))
    for _ in range(200):
        grads, s = f(m.params, m.batch)
        stats.append(s)
        operations.append(executor.operations(_plan(f).line))
        if s.execution == "chunks":
            break
    assert stats[-1].execution == "chunks", [s.execution for s in stats]
    assert all(s.execution == "steps" for s in stats[:-1])
    assert len(stats) >= 3  # the rule waited: not the second call
    # A call decides by the plan the call before it ran.
    stepped = [s.wall_time_s for s in stats[:-1]]
    price = [per_operation * n for n in operations[:-1]]
    assert sum(stepped) >= price[-1] * (1 - 1e-9), (stepped, price)
    assert sum(stepped[:-1]) < price[-2], (stepped, price)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(jax.grad(m.loss)(m.params, m.batch))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-7)


def test_distinct_operations_count_a_repeated_layer_once():
    m = models.mlp_chain(layers=16, width=32, batch=64)
    f = jdtr.grad(m.loss, budget=1.0, return_stats=True, chunks="never")
    _, stats = f(m.params, m.batch)
    line = _plan(f).line
    assert stats.chunks == line.computations == stats.equations
    wider = models.mlp_chain(layers=32, width=32, batch=64)
    g = jdtr.grad(wider.loss, budget=1.0, chunks="never")
    g(wider.params, wider.batch)
    # Twice the layers, the same operations: a layer's equations share executables.
    assert executor.operations(_plan(g).line) == executor.operations(line) < line.computations / 4


def test_a_structure_called_a_few_times_compiles_nothing_and_always_compiles_at_once(monkeypatch):
    monkeypatch.setattr(rental, "COMPILE_RATE", CompileRate(1e6, weight=None))  # never worth it in a test
    m = models.mlp_chain(layers=6, width=32, batch=64)
    f = jdtr.grad(m.loss, budget=0.6, return_stats=True)
    runs = [f(m.params, m.batch)[1] for _ in range(4)]
    assert [s.execution for s in runs] == ["steps"] * 4
    assert all(s.chunks == s.equations + s.rematerializations for s in runs)  # a dispatch per computation
    _, at_once = jdtr.grad(m.loss, budget=0.6, return_stats=True, chunks="always")(m.params, m.batch)
    assert at_once.execution == "chunks"


def test_the_process_rate_learns_from_a_compile(monkeypatch):
    rate = CompileRate(0.0, weight=1)  # compiles on the second run, and learns from it
    monkeypatch.setattr(rental, "COMPILE_RATE", rate)
    m = models.mlp_chain(layers=6, width=32, batch=64)
    f = jdtr.grad(m.loss, budget=0.6, return_stats=True)
    _, first = f(m.params, m.batch)
    _, second = f(m.params, m.batch)
    assert (first.execution, second.execution) == ("steps", "chunks")
    # What it learnt: the operations of the plan compiled, in seconds that the compile took and
    # the call reported (with the plan's settling for chunks).
    assert rate._operations == executor.operations(_plan(f).line) > 0
    assert 0 < rate._seconds <= second.planning_time_s and rate.seconds_per_operation() > 0


def test_several_processes_compile_on_the_second_run_whatever_the_rate(monkeypatch):
    """Each process of a multi-process run must dispatch the same programs:
    the rule goes by the count of runs, not by times measured."""
    monkeypatch.setattr(rental, "COMPILE_RATE", CompileRate(1e6, weight=None))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    m = models.mlp_chain(layers=6, width=32, batch=64)
    f = jdtr.grad(m.loss, budget=0.6, return_stats=True)
    assert [f(m.params, m.batch)[1].execution for _ in range(3)] == ["steps", "chunks", "chunks"]
