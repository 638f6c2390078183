"""Budgets for tests that need one that bites, on whichever JAX runs them.

JAX versions make different programs of one function: JAX 0.11's gradient
of a small MLP holds fewer intermediate values at its peak than 0.10's, so a
fraction of the unconstrained peak that leaves room to evict on one version
can be below the smallest budget that fits on the other (the peak shrinks;
what one operation locks does not). A test whose subject is not the budget
itself (aux values, effects, logs, how chunks hold buffers) asks for
`biting(...)`: its fraction where that fits this JAX's program, else the
budget jdtr verified as fitting, which is below the peak and so still bites.
"""

from __future__ import annotations

from typing import Any, Callable

import jdtr


def biting(fun: Callable, args: tuple, fraction: float, **options: Any) -> int:
    """Bytes: `fraction` of `fun`'s unconstrained peak, or the smallest budget
    jdtr verified to fit where that fraction does not (`options` as
    `jdtr.value_and_grad` takes them: the same heuristic, scans, ...)."""
    # A function of its own: `fun`'s traces and plans, which jdtr shares by
    # function, stay as the test makes them.
    f = jdtr.value_and_grad(lambda *a: fun(*a), budget=fraction, return_stats=True, chunks="never", **options)
    try:
        _, stats = f(*args)
    except jdtr.OutOfBudgetError as err:
        if err.suggested_budget_bytes is not None:
            return err.suggested_budget_bytes
        # No budget verified (an online run of a program with a `cond` on data): a larger fraction.
        assert fraction < 1.0, err
        return biting(fun, args, min(fraction + 0.05, 1.0), **options)
    return stats.budget_bytes


def biting_plan(fun: Callable, *args: Any, fraction: float, **options: Any) -> jdtr.Plan:
    """`jdtr.plan(fun, *args)` at `fraction` of its step's peak, or at the
    smallest budget the planner verified where that fraction does not fit
    this JAX's program (0.11's leaner gradients: a tanh chain's plan at 0.5
    of 0.10's peak fits, at 0.5 of 0.11's it does not). For tests of what a
    plan carries (its policy, its caches), not of the budget it keeps."""
    try:
        return jdtr.plan(fun, *args, budget=fraction, **options)
    except jdtr.OutOfBudgetError as err:
        assert err.suggested_budget_bytes is not None, err
        return jdtr.plan(fun, *args, budget=err.suggested_budget_bytes, **options)


def searched_plan(monkeypatch: Any, model: Any, budget: Any) -> tuple:
    """`jdtr.plan` of `model` (a `jdtr.models.Model`) at `budget`, without
    autotuning, on a planning of its own (nothing measured before), and the
    `PlanSearch` that found it (recorded through `monkeypatch`)."""
    from jdtr.transform.plan_search import PlanSearch

    searches = []
    real = PlanSearch.run
    monkeypatch.setattr(PlanSearch, "run", lambda self, attempts, deadline=None: searches.append(self) or real(self, attempts, deadline))
    plan = jdtr.plan(lambda p, x: model.loss(p, x), model.params, model.batch, budget=budget, autotune=False)
    [search] = searches
    return plan, search
