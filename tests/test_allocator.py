"""A plan learns what a device's allocator holds beyond jdtr's count (`transform/allocator.py`).

The CPU reports no allocator, so these tests give jdtr one: a reader of the
bytes in use that counts every array the run made `factor` times over (as a
GPU's allocator hands out blocks larger than the buffers), plus the run's
arguments. The numbers it learns from are then known: the count's own.
"""

from __future__ import annotations

import warnings

import jax

import jdtr
from jdtr.transform import allocator
from test_planned import MODELS, assert_close


def _allocator(factor: float):
    """A stand-in for `allocator.allocator_bytes` on a device whose allocator
    holds `factor` times each array the run has made."""

    def reader(inputs, held):
        before = {id(a) for a in jax.live_arrays()}

        def read() -> int:
            made = sum(a.nbytes for a in jax.live_arrays() if id(a) not in before and not a.is_deleted())
            return held + int(factor * made)

        return read

    return reader


def _planned(monkeypatch, factor: float):
    """`jdtr.grad` of the MLP at 0.6 on a device whose allocator holds `factor` times each array; its arguments."""
    model = MODELS["mlp"]()
    monkeypatch.setattr(allocator, "allocator_bytes", _allocator(factor))
    return jdtr.grad(model.loss, budget=0.6, return_stats=True), (model.params, model.batch)


def _calls(f, args, n):
    """`n` calls of `f`: their stats and the `AllocatorWarning`s they raised."""
    expected = jax.grad(MODELS["mlp"]().loss)(*args)
    runs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n):
            grads, stats = f(*args)
            assert_close(grads, expected)
            runs.append(stats)
    return runs, [w.message for w in caught if isinstance(w.message, jdtr.AllocatorWarning)]


def test_a_plan_learns_the_allocators_excess_until_its_runs_keep_the_budget(monkeypatch):
    f, args = _planned(monkeypatch, 1.25)
    runs, warned = _calls(f, args, 12)
    budget = runs[0].budget_bytes
    measured = [(s.execution, s.allocator_peak_bytes) for s in runs if s.allocator_peak_bytes is not None]
    # The first run of each plan step by step and as chunks is read; its first plan's exceeds the budget.
    assert measured[0][0] == "steps" and measured[0][1] > budget and "chunks" in {e for e, _ in measured}
    assert warned and warned[0].peak_bytes == measured[0][1] and warned[0].budget_bytes == budget
    assert all(s.budget_bytes == budget for s in runs)  # the caller's budget, whatever is planned for
    # Each warning plans for less, by the excess it measured, until a run keeps the budget.
    planned = [w.planned_bytes for w in warned]
    assert planned == sorted(planned, reverse=True) and planned[-1] < budget
    assert measured[-1][1] <= budget, measured
    assert runs[-1].peak_bytes <= planned[-1]  # later runs count within what they planned for
    assert len(warned) == sum(peak > budget for _, peak in measured)


def test_where_no_plan_fits_the_margin_the_counts_plan_runs(monkeypatch):
    """An allocator that holds three times each buffer: no plan fits the
    budget less that, so the plan for the budget by count runs, and nothing
    more is learned."""
    f, args = _planned(monkeypatch, 3.0)
    runs, warned = _calls(f, args, 8)
    assert warned and all(s.peak_bytes <= s.budget_bytes for s in runs)
    (traced,) = f.cache.values()
    assert traced.margins.exhausted and not _calls(f, args, 2)[1]


def test_a_device_that_reports_no_allocator_reads_nothing():
    model = MODELS["mlp"]()
    f = jdtr.grad(model.loss, budget=0.6, return_stats=True)
    for _ in range(3):
        _, stats = f(model.params, model.batch)
        assert stats.allocator_peak_bytes is None
    (traced,) = f.cache.values()
    assert not traced.margins.learned and not traced.margins.exhausted


def test_an_allocator_that_holds_the_count_changes_nothing(monkeypatch):
    f, args = _planned(monkeypatch, 1.0)
    runs, warned = _calls(f, args, 3)
    assert not warned and runs[0].allocator_peak_bytes <= runs[0].budget_bytes
    assert [s.execution for s in runs] == ["steps", "chunks", "chunks"]
    assert runs[1].allocator_peak_bytes is not None and runs[2].allocator_peak_bytes is None
