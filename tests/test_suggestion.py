"""The budget an out-of-budget error suggests (`transform/suggestion.py`):
the program's least fitting budget, searched once per structure, and never
one at or below the budget that failed."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from types import SimpleNamespace

import jax
import numpy as np
import pytest

import jdtr
from jdtr import models
from jdtr.transform import planner, suggestion


_PROGRAMS = itertools.count()


class Scripted:
    """A stand-in simulation whose runs fit where `fits` says, each counted;
    each of another program (its requests' digest)."""

    def __init__(self, fits, peak=1024, floor=100):
        self.lowered = SimpleNamespace(steps=(), outputs=(next(_PROGRAMS),), compute_cost=1.0, constant_bytes=0,
                                       largest_op_bytes=0, future=None)
        self.dealloc = "eager"
        self.workload = SimpleNamespace(baseline=SimpleNamespace(cost=1.0, peak_bytes=peak))
        self.floor = SimpleNamespace(total_bytes=floor)
        self.fits, self.probes = fits, []

    def __call__(self, budget_bytes, heuristic, remat_limit=None):
        self.probes.append((budget_bytes, heuristic))
        return (SimpleNamespace(ok=self.fits(budget_bytes)),)


def test_the_answer_is_the_programs_whichever_budget_failed():
    simulate = Scripted(lambda b: b >= 300)
    first = suggestion.suggest_budget(simulate, ["a", "b"], 150, 2.0)
    step = max(int(1024 * suggestion.SUGGESTION_TOLERANCE), 1)
    assert 300 <= first < 300 + step
    assert all(b >= simulate.floor.total_bytes for b, _ in simulate.probes)  # none below the floor is run
    simulate.probes.clear()
    assert suggestion.suggest_budget(simulate, ["a", "b"], 250, 2.0) == first
    assert simulate.probes == []  # kept: nothing simulated again
    # Other candidates, or another overhead, are another question.
    suggestion.suggest_budget(simulate, ["b"], 250, 2.0)
    assert simulate.probes
    simulate.probes.clear()
    suggestion.suggest_budget(simulate, ["a", "b"], 250, 3.0)
    assert simulate.probes


def test_where_the_least_fitting_budget_is_not_above_the_failed_one_it_searches_above_that():
    # Not monotonic: no run fits in [600, 700), where a call failed; the program's least is 300.
    fits = lambda b: b >= 300 and not 600 <= b < 700  # noqa: E731
    simulate = Scripted(fits)
    step = max(int(1024 * suggestion.SUGGESTION_TOLERANCE), 1)
    suggested = suggestion.suggest_budget(simulate, ["a"], 650, 2.0)
    assert suggested > 650 and fits(suggested) and suggested < 700 + step
    # The program's own answer was kept; a call failing below it gets it.
    simulate.probes.clear()
    least = suggestion.suggest_budget(simulate, ["a"], 200, 2.0)
    assert 300 <= least < 300 + step and simulate.probes == []


def test_a_callers_heuristic_instance_is_searched_each_time():
    heuristic = object()  # (a caller's Heuristic instance; the stand-in never runs it)
    simulate = Scripted(lambda b: b >= 300)
    suggestion.suggest_budget(simulate, [heuristic], 150, 2.0)
    simulate.probes.clear()
    suggestion.suggest_budget(simulate, [heuristic], 150, 2.0)
    assert simulate.probes


def test_a_second_error_on_a_structure_suggests_the_same_budget_without_a_search(monkeypatch):
    model = models.mlp_chain(layers=12, width=32, batch=64)
    f = jdtr.grad(model.loss, return_stats=True)
    peak = f(model.params, model.batch)[1].unconstrained_peak_bytes
    monkeypatch.setattr(suggestion, "_SUGGESTED", OrderedDict())  # as in a fresh process (other tests plan this MLP)
    searches = []
    real = suggestion._bisect
    monkeypatch.setattr(suggestion, "_bisect", lambda *a: searches.append(a[2]) or real(*a))
    errors = []
    for fraction in (0.12, 0.15):
        with pytest.raises(jdtr.OutOfBudgetError) as info:
            jdtr.grad(model.loss, budget=int(fraction * peak))(model.params, model.batch)
        errors.append(info.value)
    # Each call is a jdtr.grad of its own, which traces the loss again: the same requests.
    first, second = errors
    assert first.suggested_budget_bytes == second.suggested_budget_bytes > second.budget_bytes
    assert len(searches) == 1
    # The same answer as a search from the floor on a fresh simulation of the program.
    traced = next(iter(f.cache.values()))
    fresh = planner._Simulation(traced.program, [False] * len(traced.program.inputs), "eager")
    tried = [c for c in planner.candidates("auto", traced.program) if c != planner.OPTIMAL]
    assert real(fresh, tried, fresh.floor.total_bytes - 1, planner.SUGGESTION_OVERHEAD_LIMIT) == first.suggested_budget_bytes
    monkeypatch.undo()
    grads, stats = jdtr.grad(model.loss, budget=first.suggested_budget_bytes, return_stats=True)(model.params, model.batch)
    assert stats.peak_bytes <= first.suggested_budget_bytes
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(jax.grad(model.loss)(model.params, model.batch))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6)


def test_programs_that_differ_in_a_size_are_kept_apart():
    def lowered(batch):
        model = models.mlp_chain(layers=4, width=32, batch=batch)
        f = jdtr.grad(model.loss)
        f(model.params, model.batch)
        traced = next(iter(f.cache.values()))
        return planner._Simulation(traced.program, [False] * len(traced.program.inputs), "eager").lowered

    assert suggestion._requests(lowered(64)) == suggestion._requests(lowered(64))  # a new trace: the same requests
    assert suggestion._requests(lowered(64)) != suggestion._requests(lowered(65))
