"""`jdtr.grad` with its scans kept whole: one traced program per scan strategy.

A `jdtr.grad` run used to unroll every `scan`: DTR then decides on each
iteration's tensors, but the program grows with the trip count (a 64-step
LSTM: 3,479 equations), every chunk of a tight plan differs (compiling
them took a minute), and chunks cut at the budget fuse less than the scan
XLA makes of the loop. A scan's iterations are alike, so, as the compiled
path does (`scans.py`), `jdtr.grad` keeps a scan of `MIN_KEPT_LENGTH` or
more iterations as one equation, whose memory (its outputs, XLA's
temporaries for it by `memory_analysis()`) the runtime accounts like any
other's, and lets a `ScanStrategy` decide what its iterations keep.

A strategy changes the program, not only its schedule: the backward scan
of "carry" recomputes each iteration. So each strategy is a trace of its
own: the user's function is traced once on shapes, and evaluated with each
kept scan run under the strategy (`run_scan`), and that is differentiated
and traced as the first trace was. `ScanVariants` makes them when a plan
first needs them, and the unrolled program last, for the online mode and
as the fallback where no strategy fits.

`plan_strategies` plans each in turn, least recompute first, and keeps the
plan of least total compute (the strategy's recomputation plus DTR's): a
strategy that fits without rematerializing ends the search, as does one
whose program alone costs more than the best plan so far. The unrolled
program is planned where no strategy fits, or where the best recomputes
more than `UNROLL_ABOVE` times the step.

`first_plan` makes a structure's first plan at a budget: of the program
(or its strategies); and, on a mesh, where that does not fit or recomputes
more than `INLINE_ABOVE`, of the variant whose `shard_map`s' bodies are
inlined (`manual.py`), if it does better.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence, Union

from ..runtime import Heuristic, OutOfBudgetError
from . import _jax_core
from .collection import collection_paused
from .planner import QUICK_OVERHEAD, THRASH_OVERHEAD, PlannedRun, plan_run
from .program import Program
from .scans import STRATEGIES, ScanStrategy, cuts_a_body, for_length, keepable_scans_in, kept_scans, nested_scans

# A plan of the step as written that recomputes more than this (overhead)
# is compared with the plan of its `shard_map`s' bodies inlined (`manual.py`):
# a whole `shard_map` runs fastest, so it is kept where DTR copes around it.
INLINE_ABOVE = QUICK_OVERHEAD
# Where the best strategy's plan computes more than this times the program
# as JAX differentiates it (it thrashes), the unrolled program is planned
# too. Not below: the carry in 2 nested levels recomputes the forward pass
# twice, 1.6x on an LSTM, where DTR on its 3,479 unrolled equations took
# 2.2x and 30 s more to plan.
UNROLL_ABOVE = THRASH_OVERHEAD


def run_as(closed: Any, strategy: ScanStrategy) -> ScanStrategy:
    """`strategy` as `with_scans_under(closed, strategy)` runs the kept
    scans: "pieces" is "carry" where no body has a cut (`run_scan`), and
    `inner` is off where no body holds a scan (`body_function`): the same
    program, which a planner need not trace and plan twice."""
    if strategy.saves != "pieces" and not strategy.inner:
        return strategy
    found = [_jax_core.scan_layout(eqn.params) for eqn in keepable_scans_in(_jax_core.open_jaxpr(closed)[0])]
    if strategy.inner and not any(nested_scans(layout) for layout in found):
        strategy = replace(strategy, inner=False)
    if strategy.saves == "pieces" and not cuts_a_body(strategy, found):
        strategy = replace(strategy, saves="carry")
    return strategy


@dataclass(eq=False)
class ScanVariants:
    """The programs of one traced structure under each scan strategy, made
    on demand: `trace(strategy)` traces the value-and-grad with its scans
    under `strategy`, `unroll()` normalises the first trace unrolled."""

    first: Program  # the program as JAX differentiates it ("all"), scans kept
    trace: Callable[[ScanStrategy], Program]
    unroll: Callable[[], Program]
    run_as: Callable[[ScanStrategy], ScanStrategy] = lambda strategy: strategy  # what `trace` runs it as
    failed: dict = field(default_factory=dict, repr=False)  # per strategy, why it could not be traced
    _programs: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def program(self, strategy: Optional[ScanStrategy]) -> Optional[Program]:
        """The program under `strategy` (None: unrolled); None where the
        strategy could not be traced (`failed` says why)."""
        with self._lock:
            if strategy in self._programs:
                return self._programs[strategy]
            found = None
            if strategy is None:
                found = self.unroll()
            elif strategy == STRATEGIES[0]:
                found = self.first
            else:
                try:
                    found = self.trace(strategy)
                except Exception as err:  # noqa: BLE001 - a strategy that cannot be traced is one less to try
                    self.failed[strategy] = err
            self._programs[strategy] = found
            return found

    def describe(self, strategy: Optional[ScanStrategy], fitted: bool = False) -> str:
        """What the plan under `strategy` does with the program's scans
        (unrolled where None, though a strategy `fitted`)."""
        if strategy is None:
            return "unrolled: it computes less than any scan strategy that fits" if fitted else "unrolled: no scan strategy fits"
        longest = self.longest()
        lengths = sorted({e.scan.length for e in kept_scans(self.first).values()})
        return f"kept whole ({', '.join(map(str, lengths))} iterations): {self.effective(strategy).describe(longest)}"

    def longest(self) -> int:
        return max(e.scan.length for e in kept_scans(self.first).values())

    def effective(self, strategy: ScanStrategy) -> ScanStrategy:
        """`strategy` as the longest scan runs it (in fewer levels where its
        outer scan would be too short to keep), and as "carry" where it
        cuts no body (`run_as`)."""
        return self.run_as(for_length(strategy, self.longest()))


@collection_paused()  # it traces the strategies' programs, as the first trace did, with the collector paused
def plan_strategies(
    variants: ScanVariants,
    budget_bytes: int,
    heuristic: Union[str, Heuristic],
    dealloc: str,
    owned: Sequence[bool],
    quick: bool,
) -> PlannedRun:
    """The plan of least total compute over the strategies (or unrolled),
    with the program it is of, what it does with the scans, and the cost of
    the program as JAX differentiates it (its overhead's baseline). Raises
    the unrolled program's `OutOfBudgetError` (with its verified budget)
    where nothing fits."""
    start = time.perf_counter()
    baseline = variants.first.simulated_cost()
    best: Optional[tuple[float, PlannedRun, Program, Optional[ScanStrategy]]] = None
    for strategy in STRATEGIES:
        if variants.effective(strategy) != strategy:
            continue  # the same program as a strategy of fewer levels, or "carry"
        program = variants.program(strategy)
        if program is None:
            continue
        cost = program.simulated_cost()
        if best is not None and cost >= best[0]:
            break  # it recomputes more than the best plan does in all
        try:
            plan = plan_run(program, budget_bytes, heuristic, dealloc, owned, quick=quick, suggest=False)
        except OutOfBudgetError:
            continue
        total = cost + plan.counters.remat_cost
        if best is None or total < best[0]:
            best = (total, plan, program, strategy)
        if plan.counters.remat_cost == 0:
            break  # the strategies after it only recompute more
    fitted = best is not None
    if best is None or best[0] > UNROLL_ABOVE * baseline:
        # None fits, or the best recomputes much: DTR on every iteration's
        # tensors may do better (it raises, with a budget that fits, where
        # nothing does).
        program = variants.program(None)
        try:
            plan = plan_run(program, budget_bytes, heuristic, dealloc, owned, quick=quick, suggest=best is None)
        except OutOfBudgetError:
            if best is None:
                raise
        else:
            total = program.simulated_cost() + plan.counters.remat_cost
            if best is None or total < best[0]:
                best = (total, plan, program, None)
    _, plan, program, strategy = best
    plan.planning_time_s = time.perf_counter() - start  # tracing the strategies' programs included
    plan.program, plan.scans, plan.baseline_cost = program, variants.describe(strategy, fitted), baseline
    return plan


def first_plan(traced: Any, budget_bytes: int, heuristic, dealloc: str, owned: list) -> PlannedRun:
    """A structure's first plan at this budget: of its program or, where its
    scans are kept whole, of the scan strategy that computes least; where
    that does not fit or recomputes much, and the program has `shard_map`s,
    the plan with their bodies inlined (`manual.py`) if it does better."""
    try:
        if traced.variants is None:
            plan = plan_run(traced.program, budget_bytes, heuristic, dealloc, owned, quick=True)
        else:
            plan = plan_strategies(traced.variants, budget_bytes, heuristic, dealloc, owned, quick=True)
    except OutOfBudgetError as err:
        inlined = traced.inlined()
        if inlined is None:
            raise
        try:
            return _inlined(inlined, budget_bytes, heuristic, dealloc, owned, suggest=True)
        except OutOfBudgetError as other:  # the error that suggests the smaller budget
            raise min((err, other), key=lambda e: e.suggested_budget_bytes or float("inf")) from None
    if plan.overhead > INLINE_ABOVE and traced.inlined() is not None:
        try:
            inlined = _inlined(traced.inlined(), budget_bytes, heuristic, dealloc, owned)
        except OutOfBudgetError:
            return plan
        if inlined.overhead < plan.overhead:
            return inlined
    return plan


def _inlined(program, budget_bytes: int, heuristic, dealloc: str, owned: list, suggest: bool = False) -> PlannedRun:
    plan = plan_run(program, budget_bytes, heuristic, dealloc, owned, quick=True, suggest=suggest)
    plan.program = program
    return plan
