"""Planned runs of programs with a `cond` on data (jdtr/transform/paths.py).

A plan goes by the largest branch of each `cond`, reads each predicate
where its `cond` starts, and where a branch read is another follows the
plan of the path read so far, made then and cached. What is checked: the
gradients of `jax.grad` on every path, the budget by the plan's count and
by `jax.live_arrays()`, nothing leaked, the plans of any two paths agree up
to where the paths part (what lets a run follow another plan with the
arrays it has), a run's statistics are its path's simulation, paths are
planned once, and a path that does not fit raises at its branch with the
caller's arrays intact.
"""

from __future__ import annotations

import gc
import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdtr
from budgets import biting
from jdtr import models
from jdtr.transform import paths as paths_module
from jdtr.transform.paths import _check_same_before
from jdtr.transform.planner import plan_path, plan_run
from jdtr.transform.program import Cond


def live_ids():
    gc.collect()
    return {id(a) for a in jax.live_arrays()}


def assert_grads(got, want):
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        scale = float(jnp.max(jnp.abs(r))) + 1e-6
        np.testing.assert_allclose(np.asarray(g) / scale, np.asarray(r) / scale, atol=2e-5)


def layered(w, x, s):
    """Three `cond`s on data, each branch with its own work; `s` (its signs)
    picks the path."""
    h = jnp.tanh(x @ w)
    for i in range(3):
        h = jax.lax.cond(
            s[i] > 0,
            lambda a: jnp.tanh(jnp.tanh(a @ w) @ w) * 2,
            lambda a: jnp.sin(a) - 1,
            h,
        )
        h = jnp.tanh(h @ w)
    return jnp.sum(h**2)


def switched(w, x, s):
    """A three-way `lax.switch` (one of its indices out of range: clamped)
    whose middle branch holds a nested `cond`, between two layers."""
    h = jnp.tanh(x @ w)

    def middle(a):
        a = jnp.tanh(a @ w)
        return jax.lax.cond(s[1] > 0, lambda b: jnp.cos(b @ w), lambda b: b * 3, a)

    h = jax.lax.switch(jnp.int32(s[0] * 2), [lambda a: jnp.tanh(a @ w) + a, middle, lambda a: a * a], h)
    h = jnp.tanh(h @ w)
    return jnp.sum(jnp.sin(h) ** 2)


def scanned(w, x, s):
    """A `cond` in a `scan` (of 3 steps, unrolled: one `cond` per step; from
    `MIN_KEPT_LENGTH` steps on, the scan stays whole, `cond` and all)."""

    def step(h, sign):
        h = jax.lax.cond(sign > 0, lambda a: jnp.tanh(a @ w), lambda a: jnp.sin(a @ w) * 0.5, h)
        return h, jnp.sum(h)

    h, sums = jax.lax.scan(step, jnp.tanh(x @ w), s)
    return jnp.sum(h**2) + jnp.sum(sums)


PROGRAMS = {"layered": (layered, 3), "switched": (switched, 2), "scanned": (scanned, 3)}


def arguments(signs):
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    w = jax.random.normal(k[0], (48, 48)) * 0.2
    x = jax.random.normal(k[1], (96, 48))
    return w, x, jnp.asarray(signs, jnp.float32)


def sign_patterns(n):
    """Paths of `n` two-way predicates: all false, all true, alternating,
    and one out of range."""
    return [[-1.0] * n, [1.0] * n, [(-1.0) ** i for i in range(n)], [5.0] * n]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("heuristic", ["auto", "dtr_eq"])
def test_every_path_matches_jax_grad_within_the_budget(name, heuristic):
    fun, n = PROGRAMS[name]
    f = jdtr.grad(fun, budget=0.55, heuristic=heuristic, return_stats=True, debug=True)
    w, x, _ = arguments([])
    reference = jax.jit(jax.grad(fun))  # (eager, each call would compile its conds again)
    before = live_ids()
    for signs in sign_patterns(n):
        args = (w, x, jnp.asarray(signs, jnp.float32))
        for _ in range(2):  # planned step by step, then by chunks
            grads, stats = f(*args)
            assert_grads(grads, reference(*args))
            assert stats.execution in ("steps", "chunks")
            assert stats.peak_bytes <= stats.budget_bytes and stats.live_peak_bytes <= stats.budget_bytes
        del grads, args
    traced = next(iter(f.cache.values()))
    assert any(plan.paths for plan in traced.plans.values()), "some path parted from the first plan"
    gc.collect()
    assert live_ids() - before <= {id(a) for a in jax.live_arrays() if a.size <= 1}  # the plans' literals only


@pytest.mark.parametrize("heuristic", ["lookahead", "dtr_eq", "msps"])
def test_the_plans_of_two_paths_agree_until_they_part(heuristic):
    fun, n = PROGRAMS["layered"]
    args = arguments([1.0] * n)
    f = jdtr.grad(fun, budget=0.5, heuristic=heuristic, return_stats=True)
    _, stats = f(*args)
    traced = next(iter(f.cache.values()))
    program, owned = traced.program, [False] * len(traced.program.inputs)
    first = plan_run(program, stats.budget_bytes, heuristic, "eager", owned)  # (by paths: it has conds)
    went_by = [r.branch for r in first.reads]
    # The forward conds go by their largest branches, their transposes (on the same predicates) by theirs.
    assert went_by[:n] == [c.largest_branch() for c in _conds(program)][:n] and went_by[n:] == went_by[:n][::-1]
    evicted = 0
    for path in itertools.product([0, 1], repeat=n):
        for parted in range(1, n + 1):  # the path as the run reads it, one predicate at a time
            known = path[:parted]
            followed = plan_path(first, program, owned, "eager", known)
            assert [r.branch for r in followed.reads][:parted] == list(known)
            # Up to the read where they part, the same steps: a run can follow it there.
            parts = next((i for i, b in enumerate(known) if b != first.reads[i].branch), parted - 1)
            _check_same_before(first.line.steps, followed.line.steps, 1 + parts)
            evicted += followed.counters.evictions
    assert evicted > 0, "the budget must make the heuristic choose"


def _conds(program):
    return [item for item in program.body if isinstance(item, Cond)]


def test_a_run_is_its_paths_simulation_and_each_path_is_planned_once():
    n = 3
    f = jdtr.grad(lambda *args: layered(*args), budget=0.5, return_stats=True)  # its own traces and plans
    runs = {}
    for signs in ([1.0, -1.0, 1.0], [-1.0, -1.0, -1.0], [1.0, -1.0, 1.0], [-1.0, -1.0, -1.0]) * 2:
        args = arguments(signs)
        _, stats = f(*args)
        runs.setdefault(tuple(signs), []).append(stats)
    assert runs[(1.0, -1.0, 1.0)][0].execution == "steps"  # the first call: step by step
    traced = next(iter(f.cache.values()))
    first = traced.plans[(stats.budget_bytes, "auto", "eager", (False, False, False))]
    program, owned = traced.program, [False] * len(traced.program.inputs)
    assert len(first.reads) == 2 * n  # each cond's transpose reads its predicate again, in reverse order
    for signs, stats in runs.items():
        forward = tuple(1 if s > 0 else 0 for s in signs)  # a cond's branch 1 is its true one
        path = forward + forward[::-1]
        alone = plan_path(first, program, owned, "eager", path)
        for s in stats[1:]:  # the first ran by the structure's quick plan, refined when it came back
            assert (s.evictions, s.rematerializations, s.peak_bytes, s.overhead) == (
                alone.counters.evictions,
                alone.counters.rematerializations,
                alone.counters.peak_bytes,
                alone.counters.overhead,
            )
        assert stats[-1].planning_time_s == 0.0 and stats[-1].execution == "chunks"
        assert stats[-1].chunks < stats[-1].equations  # one dispatch per chunk, not per equation
    # A plan per path where a forward predicate parted from the branch the
    # plan went by (the transposes take the branches their forward cond took).
    forwards = {tuple(1 if s > 0 else 0 for s in signs) for signs in runs}
    assert first.paths and all(any(fwd[: len(path)] == path for fwd in forwards) for path in first.paths)


def test_a_path_that_does_not_fit_runs_online_and_raises_with_the_callers_arrays_intact():
    """The largest branch (by peak: many values alive at once, each small)
    fits by recomputing; the other makes one value larger than the budget:
    its path's plan does not fit (known when it comes back), the call runs
    online, which does not fit either."""

    def fun(w, x, s):
        def wide(a):
            parts = [jnp.tanh(a * (i + 1)) for i in range(12)]
            return sum(p * q for p, q in zip(parts, parts[1:]))

        def one_big(a):
            return jnp.sum(jnp.tile(a, (1, 8)).reshape(a.shape[0], 8, -1), axis=1)

        return jnp.sum(jax.lax.cond(s[0] > 0, wide, one_big, jnp.tanh(x @ w)) ** 2)

    w, x, _ = arguments([1.0])
    f = jdtr.grad(fun, budget=0.3, return_stats=True)
    grads, stats = f(w, x, jnp.asarray([1.0]))
    assert_grads(grads, jax.grad(fun)(w, x, jnp.asarray([1.0])))
    assert stats.peak_bytes <= stats.budget_bytes and stats.rematerializations > 0 and stats.execution == "steps"
    del grads
    before = live_ids()
    other = jnp.asarray([-1.0])
    for _ in range(2):
        with pytest.raises(jdtr.OutOfBudgetError):
            f(w, x, other)
        assert not any(a.is_deleted() for a in (w, x, other))
        assert live_ids() - before <= {id(a) for a in jax.live_arrays() if a.size <= 1}
    (traced,) = f.cache.values()
    (first,) = traced.plans.values()
    (failed,) = first.paths.values()
    assert isinstance(failed, jdtr.OutOfBudgetError) and "does not fit" in failed.__notes__[-1]
    assert failed.__traceback__ is None  # cached without the call's frames, which hold the caller's arrays


def test_a_path_whose_plan_does_not_fit_runs_online_where_that_fits():
    """The gated model at 0.35 of its peak: its first plan (the skips, its
    guess) fits; the path run (blocks mostly run) does not by that plan's
    heuristic, and runs online, deciding as it goes, to jax.grad's values."""
    model = models.gated_mlp(blocks=6, width=32, batch=64)
    budget = biting(model.loss, (model.params, model.batch), 0.35, mode="online")
    f = jdtr.grad(lambda *args: model.loss(*args), budget=budget, return_stats=True)
    expected = jax.grad(model.loss)(model.params, model.batch)
    for _ in range(2):
        grads, stats = f(model.params, model.batch)
        assert_grads(grads, expected)
        assert stats.execution == "online" and stats.peak_bytes <= stats.budget_bytes


def test_timeline_and_log_of_a_program_with_conds_run_online(tmp_path):
    fun, n = PROGRAMS["layered"]
    args = arguments([1.0, -1.0, 1.0])
    grads, stats = jdtr.grad(fun, budget=0.6, return_stats=True, timeline=True, log=tmp_path / "run.log")(*args)
    assert stats.execution == "online" and stats.timeline
    assert_grads(grads, jax.grad(fun)(*args))
    replayed = jdtr.simulate(str(tmp_path / "run.log"), stats.budget_bytes, heuristic="lookahead")
    assert replayed.ok


def test_the_gated_model_runs_its_path_in_chunks():
    """`models.gated_mlp` (a `cond` on data per block, the benchmarks'), its
    path fixed by its batch: from the second run on, its plan runs as
    compiled chunks, a chunk ending at each predicate read."""
    model = models.gated_mlp(blocks=6, width=32, batch=64)
    f = jdtr.grad(model.loss, budget=0.5, return_stats=True)
    runs = [f(model.params, model.batch) for _ in range(3)]
    expected = jax.grad(model.loss)(model.params, model.batch)
    for grads, stats in runs:
        assert_grads(grads, expected)
        assert stats.peak_bytes <= stats.budget_bytes and stats.rematerializations > 0
    # (the second call refines the structure's quick plan: its paths are planned again, run step by step)
    assert (runs[0][1].execution, runs[2][1].execution) == ("steps", "chunks")
    conds = 2 * 6  # each block's and its transpose's
    assert conds < runs[-1][1].chunks < runs[0][1].chunks / 4


def test_paths_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(paths_module, "MAX_PATHS", 2)
    f = jdtr.grad(lambda *args: layered(*args), budget=0.5, return_stats=True)
    w, x, _ = arguments([])
    reference = jax.jit(jax.grad(layered))
    for signs in sign_patterns(3):
        grads, _ = f(w, x, jnp.asarray(signs, jnp.float32))
        assert_grads(grads, reference(w, x, jnp.asarray(signs, jnp.float32)))
    (traced,) = f.cache.values()
    assert all(len(plan.paths) <= 2 for plan in traced.plans.values())
    assert any(plan.paths for plan in traced.plans.values())


@pytest.mark.parametrize("heuristic", ["lru", "dtr_eq"])
def test_thrashing_is_said_of_the_path_run(heuristic):
    """A run by paths warns `ThrashWarning` when the path it ran thrashes
    (not the path its first plan guessed), once per path's plan."""
    model = models.gated_mlp(blocks=6, width=32, batch=64)
    # Step by step: compiling a thrashing plan's chunks (lru's) is not what this tests.
    f = jdtr.grad(lambda *args: model.loss(*args), budget=0.5, heuristic=heuristic, return_stats=True, chunks="never")
    for call in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, stats = f(model.params, model.batch)
        said = [w.message for w in caught if isinstance(w.message, jdtr.ThrashWarning)]
        if call == 0:  # (lru thrashes here, at 2.7; dtr_eq runs at 1.1)
            assert bool(said) == (stats.overhead > 2.0), (stats.overhead, said)
            assert all(w.overhead == pytest.approx(stats.overhead) for w in said)
        else:
            assert not said  # said once


def _conds_within(program):
    """The `cond`s of `program`, those in branches included."""
    return sum(isinstance(item, Cond) + sum(_conds_within(b) for b in getattr(item, "branches", ())) for item in program.body)


def test_a_cond_on_constants_alone_is_decided_when_traced():
    """`lax.platform_dependent` (in `jnp.linalg.cholesky`'s gradient, among
    others) is a `cond` on `platform_index`, and a predicate may come from a
    constant the loss closes over: neither depends on the arguments, so the
    branch is inlined as traced, with no predicate read on the host at each
    run (a chunk's end). A predicate on the arguments stays a `cond`."""
    flag = jnp.asarray(-1.0)  # a constant of the trace

    def loss(w, x):
        k = x.T @ x / x.shape[0] + jnp.eye(x.shape[1])
        chol = jnp.linalg.cholesky(k * jnp.exp(w[0, 0]))
        h = jax.lax.platform_dependent(x @ w, cpu=jnp.sin, default=jnp.cos)
        h = jax.lax.cond(flag > 0, jnp.tanh, lambda a: a * 2, h)
        return jnp.sum(jnp.log(jnp.diag(chol))) + jnp.sum(h**2)

    w, x, _ = arguments([])
    f = jdtr.grad(loss, budget=1.0, return_stats=True, chunks="always")
    for _ in range(2):
        grads, stats = f(w, x)
        assert_grads(grads, jax.grad(loss)(w, x))
    (traced,) = f.cache.values()
    assert _conds_within(traced.program) == 0 and stats.execution == "chunks" and stats.chunks == 1
    g = jdtr.grad(lambda w, x, s: layered(w, x, s), budget=1.0)
    g(*arguments([1.0] * 3))
    assert _conds_within(next(iter(g.cache.values())).program) == 6  # three forward, three in the gradient


def test_a_scan_whose_body_branches_on_data_runs_by_paths_where_it_is_unrolled():
    """A kept scan hides the `cond` in its body; where no scan strategy fits
    the budget, the plan is of the scan unrolled, whose `cond`s are on data.
    That plan was made as if there were none (the caller's path was of the
    program as traced): its run went by the branches it guessed, and every
    gradient was zero. Its run is by paths, on inputs whose predicates
    take either branch in every iteration."""
    weights = jax.random.normal(jax.random.PRNGKey(0), (4, 32, 32)) / np.sqrt(32)

    def loss(ws, x):
        def body(h, w):
            h = jnp.tanh(h @ w)
            return jax.lax.cond(jnp.mean(h) > 0, lambda g: g * 1.5, lambda g: jnp.tanh(g @ w), h), None

        h, _ = jax.lax.scan(body, x, ws)
        return jnp.mean(h**2)

    step = jdtr.grad(loss, budget=0.3, return_stats=True, chunks="always")
    taken = set()
    for i in range(4):
        x = jax.random.normal(jax.random.PRNGKey(1 + i), (64, 32)) * (1 + i % 3) - (i % 2)
        grads, stats = step(weights, x)
        assert stats.scans.startswith("unrolled"), stats.scans  # the premise: no strategy fits
        assert stats.peak_bytes <= stats.budget_bytes and stats.rematerializations > 0
        assert_grads(grads, jax.grad(loss)(weights, x))
        h = x
        for w in weights:  # the branches this input takes
            h = jnp.tanh(h @ w)
            taken.add(bool(jnp.mean(h) > 0))
            h = h * 1.5 if jnp.mean(h) > 0 else jnp.tanh(h @ w)
    assert taken == {True, False}
    # With a timeline, the run is the online one, as for any program with `cond`s on data
    # (the events of a run by paths would be a guessed path's simulation).
    grads, stats = jdtr.grad(loss, budget=0.3, return_stats=True, timeline=True)(weights, x)
    assert stats.execution == "online" and stats.timeline
    assert_grads(grads, jax.grad(loss)(weights, x))
