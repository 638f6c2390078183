"""A plan about to run as compiled chunks is made for a little less than the
budget where that cuts the run into far fewer chunks (`transform/slack.py`):
fewer chunks, the budget kept by `jax.live_arrays()` and by XLA's analysis
of every chunk, jax.grad's gradients, and the trade priced as documented."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jdtr
from jdtr import models
from jdtr.transform import slack
from jdtr.transform.chunks import Chunk, count
from jdtr.transform.planner import OPTIMAL, plan_run


def _plan(f):
    (traced,) = f.cache.values()
    (plan,) = traced.plans.values()
    return plan


def _priced(plan, per_chunk, budget_bytes):
    return plan.counters.base_cost + plan.counters.remat_cost + count(plan.line, budget_bytes) * per_chunk


def _plan_at_the_budget(tight):
    """The tight model's plan made at its budget (run step by step), its
    program, the arguments it owns (none) and the budget in bytes."""
    model, args, _ = tight
    f = jdtr.grad(model.loss, budget=0.3, return_stats=True, chunks="never")
    budget = f(*args)[1].budget_bytes
    program = next(iter(f.cache.values())).program
    return _plan(f), program, [False] * len(program.inputs), budget


@pytest.fixture
def tight():
    """A 48-layer MLP at 0.3 of its peak: a plan at the budget sits at it
    through the backward pass, where chunks are cut short."""
    model = models.mlp_chain(layers=48, width=16, batch=64)
    return model, (model.params, model.batch), jax.grad(model.loss)(model.params, model.batch)


def test_a_plan_sitting_at_the_budget_runs_as_fewer_chunks_within_it(tight, monkeypatch):
    model, args, expected = tight
    runs = {}
    for name, slacks in (("at the budget", ()), ("with slack", slack.SLACKS)):
        monkeypatch.setattr(slack, "SLACKS", slacks)
        f = jdtr.grad(lambda *a: model.loss(*a), budget=0.3, return_stats=True, debug=True)
        first = f(*args)[1]
        grads, stats = f(*args)
        assert first.execution == "steps" and stats.execution == "chunks"
        for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(expected)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
        plan = _plan(f)
        # Within the budget by the plan's count, by live arrays (debug) and by XLA's analysis of each chunk.
        assert stats.peak_bytes <= stats.budget_bytes
        assert all(item.peak_bytes <= stats.budget_bytes for item in plan.compiled if isinstance(item, Chunk))
        runs[name] = (first, stats, plan)
    first, at_budget, plan_at = runs["at the budget"]
    _, slacked, plan = runs["with slack"]
    assert plan_at.slack == at_budget.slack_bytes == 0 and plan.slack == slacked.slack_bytes > 0 and first.slack_bytes == 0
    assert plan.result.budget_bytes == slacked.budget_bytes - plan.slack
    assert slacked.peak_bytes <= slacked.budget_bytes - plan.slack < at_budget.peak_bytes
    # Fewer chunks (for a little more compute, as priced below); the first call's plan (run step by step) was the one at the budget.
    assert slacked.chunks * 2 <= at_budget.chunks
    assert (first.evictions, first.overhead) == (at_budget.evictions, at_budget.overhead)
    # Chosen as priced: a chunk as much as the program's average equation.
    per_chunk = plan_at.counters.base_cost / slacked.equations
    assert _priced(plan, per_chunk, slacked.budget_bytes) < _priced(plan_at, per_chunk, slacked.budget_bytes)


def test_the_slack_is_the_cheapest_of_those_tried(tight, monkeypatch):
    """Each slack alone, then all: the plan kept is the one priced least."""
    plan, program, owned, budget = _plan_at_the_budget(tight)
    per_chunk = plan.counters.base_cost / program.num_equations
    priced = {0.0: _priced(plan, per_chunk, budget)}
    for s in slack.SLACKS:
        monkeypatch.setattr(slack, "SLACKS", (s,))
        priced[s] = _priced(slack.plan_for_chunks(plan, program, owned, "eager", budget), per_chunk, budget)
    monkeypatch.setattr(slack, "SLACKS", tuple(priced)[1:])
    best = slack.plan_for_chunks(plan, program, owned, "eager", budget)
    assert _priced(best, per_chunk, budget) == min(priced.values()) < priced[0.0]


def test_a_chunk_priced_higher_buys_fewer_chunks_for_more_compute(tight, monkeypatch):
    """`CHUNK_PRICE` prices a chunk in average equations: the higher, the
    fewer chunks the plan kept runs as, for as much compute or more; priced
    at nothing, the plan at the budget is kept."""
    plan, program, owned, budget = _plan_at_the_budget(tight)
    kept = {}
    for price in (0.0, 1.0, 1e9):
        monkeypatch.setattr(slack, "CHUNK_PRICE", price)
        best = slack.plan_for_chunks(plan, program, owned, "eager", budget)
        kept[price] = (count(best.line, budget), best.counters.base_cost + best.counters.remat_cost)
    assert kept[0.0] == (count(plan.line, budget), plan.counters.base_cost + plan.counters.remat_cost)
    (free_chunks, free_compute), (chunks, compute), (dear_chunks, dear_compute) = kept.values()
    assert dear_chunks <= chunks < free_chunks and dear_compute >= compute > free_compute, kept


def test_a_plan_in_few_chunks_is_kept():
    """At the whole peak nothing is evicted: one or two chunks, and no slack to buy."""
    model = models.mlp_chain(layers=16, width=16, batch=64)
    f = jdtr.grad(model.loss, budget=1.0, return_stats=True)
    first = f(model.params, model.batch)[1]
    stats = f(model.params, model.batch)[1]
    assert stats.execution == "chunks" and stats.chunks <= slack.FEW_CHUNKS
    assert _plan(f).slack == 0 and stats.peak_bytes == first.peak_bytes == stats.budget_bytes


def test_a_call_writing_a_log_keeps_the_plan_at_the_budget(tight, tmp_path):
    """Its log replays at the budget, with `jdtr.simulate`, to the run's decisions."""
    model, args, _ = tight
    log = tmp_path / "run.log"
    f = jdtr.grad(lambda *a: model.loss(*a), budget=0.3, return_stats=True, log=log)
    f(*args)
    stats = f(*args)[1]
    assert stats.execution == "chunks" and _plan(f).slack == 0
    sim = jdtr.simulate(jdtr.Trace.from_log(log), stats.budget_bytes, stats.heuristic, overhead_limit=None)
    assert (sim.peak_bytes, sim.evictions, sim.rematerializations) == (stats.peak_bytes, stats.evictions, stats.rematerializations)


def test_the_solvers_plan_is_cut_as_it_is(monkeypatch):
    """`jdtr.optimal`'s plan is not planned again below the budget for fewer
    chunks: each budget there would be a solve of its own, seconds each."""
    model = models.mlp_chain(layers=8, width=16, batch=32)
    f = jdtr.grad(model.loss, return_stats=True, chunks="never")
    peak = f(model.params, model.batch)[1].unconstrained_peak_bytes
    (traced,) = f.cache.values()
    program, owned = traced.program, [False] * len(traced.program.inputs)
    budget = int(0.6 * peak)
    plan = plan_run(program, budget, OPTIMAL, "eager", owned)
    assert plan.candidate == OPTIMAL and count(plan.line, budget) > slack.FEW_CHUNKS  # a heuristic's would be re-planned

    def planned_below(*args, **kwargs):
        raise AssertionError("planned again below the budget")

    monkeypatch.setattr(slack, "plans_below", planned_below)
    assert slack.plan_for_chunks(plan, program, owned, "eager", budget) is plan
    heuristic = plan_run(program, budget, "dtr_eq", "eager", owned)
    with pytest.raises(AssertionError, match="planned again"):
        slack.plan_for_chunks(heuristic, program, owned, "eager", budget)


def test_an_accelerators_chunk_is_priced_by_its_hosts_time(monkeypatch):
    """On an accelerator a chunk costs what the host spends on it
    (`slack.AcceleratorPrice`), in the cost model's seconds, where that is
    more than the average equation: the plan kept is the cheapest of those
    tried so priced, in fewer chunks than by the average equation alone.
    On the CPU nothing is added; a cost model of the user's own (its unit
    unknown) adds nothing either."""
    model = models.mlp_chain(layers=48, width=16, batch=64)
    f = jdtr.grad(model.loss, budget=0.5, return_stats=True, chunks="never")
    budget = f(model.params, model.batch)[1].budget_bytes
    plan, program = _plan(f), next(iter(f.cache.values())).program
    owned = [False] * len(program.inputs)
    assert slack.chunk_seconds([jax.numpy.zeros(3)], None) == 0.0  # this machine's CPU
    price = slack.AcceleratorPrice(host_seconds=1e-4, speedup=10.0)
    assert price.seconds(None) == price.seconds("xla") == pytest.approx(1e-3)
    assert price.seconds("measured") == 1e-4 and price.seconds(lambda op: 1.0) == 0.0
    average = (plan.baseline_cost or plan.counters.base_cost) / program.num_equations
    chunk_s = 30 * average * 1e-9  # the runtime counts nanoseconds
    by_host = slack.plan_for_chunks(plan, program, owned, "eager", budget, chunk_s)
    by_average = slack.plan_for_chunks(plan, program, owned, "eager", budget)
    assert count(by_host.line, budget) < count(by_average.line, budget), (count(by_host.line, budget), count(by_average.line, budget))
    assert _cost(by_host) > _cost(by_average) and by_host.result.budget_bytes < by_average.result.budget_bytes
    per_chunk = round(chunk_s * 1e9)
    priced = [_priced(plan, per_chunk, budget)]
    for s in slack.SLACKS:
        monkeypatch.setattr(slack, "SLACKS", (s,))
        priced.append(_priced(slack.plan_for_chunks(plan, program, owned, "eager", budget, chunk_s), per_chunk, budget))
    assert _priced(by_host, per_chunk, budget) == min(priced)


def _cost(plan):
    return plan.counters.base_cost + plan.counters.remat_cost
