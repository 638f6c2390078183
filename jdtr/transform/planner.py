"""Plans a `jdtr.grad` run before it starts: DTR simulated on the traced program.

With a deterministic cost model, DTR's decisions need no device: the
runtime is run on the traced program with a `RecordingBackend`, and what it
asked of its backend is the run, as a straight line of computations and
frees (`jdtr.offline.StraightLine`), ready to be replayed on device buffers
(`executor.py`) or compiled in chunks (`chunks.py`).

Deciding ahead also lets jdtr try more than one heuristic. With
`heuristic="auto"` it simulates a portfolio and keeps the schedule that
fits with the least rematerialization compute, the first of equals in the
portfolio's order, so the same program always gets the same plan. A
candidate is cut off (`ThrashError`) once its rematerialization compute
passes the best one's so far: it could not win. Only when no candidate fits
is the budget too small, and the error then carries a budget the portfolio
was verified to fit in simulation (`OutOfBudgetError.suggested_budget_bytes`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from ..offline import RecordingBackend, SimResult, StraightLine, run
from ..runtime import Counters, Heuristic, OutOfBudgetError, Timeline
from ..oplog import Trace, TraceRecorder
from .interpreter import workload
from .program import Equation, Program

# The portfolio of `heuristic="auto"`, in order of preference between equals:
# the lookahead heuristic first (it won on most logs, docs/heuristics.md),
# then the paper's, then those that got through where the paper's did not
# (a BatchNorm CNN at 0.6 of its peak: dtr_local and msps, issue 21).
PORTFOLIO = ("lookahead", "dtr_eq", "dtr_local", "msps", "dtr_full")
AUTO = "auto"

# The suggested budget is searched by bisection to within this fraction of
# the unconstrained peak; each probe simulates the candidates, cut off at this
# overhead (a budget that needs more compute is no use to suggest).
SUGGESTION_TOLERANCE = 1 / 256
SUGGESTION_OVERHEAD_LIMIT = 3.0


def plannable(program: Program) -> bool:
    """Whether a run of `program` can be decided before it starts: every cost
    is known (not measured at run time) and no `cond` needs a predicate read."""
    return all(type(item) is Equation and item.cost is not None for item in program.body)


def candidates(heuristic: Union[str, Heuristic]) -> tuple[Union[str, Heuristic], ...]:
    """The heuristics a plan tries: the portfolio for "auto", else the one named."""
    return PORTFOLIO if heuristic == AUTO else (heuristic,)


@dataclass
class PlannedRun:
    """A run decided before it starts.

    Attributes:
      line: its computations and frees, in order.
      result: the chosen candidate's simulation.
      counters: its totals, as `jdtr.Stats` reports them.
      heuristic: the chosen candidate's name.
      candidate: the chosen candidate (a name or the caller's instance).
      tried: each candidate tried, with its overhead (None: it did not fit,
        or was cut off).
      planning_time_s: the time the simulations took.
      executions: how many times the plan has run (its executor compiles
        chunks once it is run again).
      timeline, log: the chosen run's residency events and operator log,
        when a caller asked for them (simulated again, once).
    """

    line: StraightLine
    result: SimResult
    counters: Counters
    heuristic: str
    candidate: Union[str, Heuristic]
    tried: tuple[tuple[str, Optional[float]], ...]
    planning_time_s: float
    executions: int = 0
    compiled: Any = None  # the executor's chunks, once compiled
    timeline: Optional[tuple] = field(default=None, repr=False)
    log: Optional[Trace] = field(default=None, repr=False)


class _Simulation:
    """Simulates one program under budgets and heuristics, each run recorded."""

    def __init__(self, program: Program, owned: Sequence[bool], dealloc: str):
        self.program = program
        self.dealloc = dealloc
        self.owned = list(owned)
        self.returned: list = []
        # Slots 0..n-1 are the arguments: a RecordingBackend registers them first.
        self.workload = workload(program, owned, arguments=range(len(program.inputs)), returned=self.returned)

    def __call__(
        self,
        budget_bytes: int,
        heuristic: Union[str, Heuristic],
        remat_limit: Optional[float] = None,
        observers: Sequence[Any] = (),
        recorder: Optional[TraceRecorder] = None,
    ) -> tuple[SimResult, Counters, Optional[StraightLine]]:
        backend = RecordingBackend()
        for value in self.program.inputs:
            backend.argument(value.nbytes)
        counters = Counters()
        self.returned.clear()
        play = self.workload
        if recorder is not None:
            play = workload(self.program, self.owned, recorder, range(len(self.program.inputs)), self.returned)
        baseline = play.baseline.cost
        limit = None if remat_limit is None or baseline <= 0 else 1.0 + remat_limit / baseline
        result = run(play, budget_bytes, heuristic, self.dealloc, limit, [counters, *observers], backend=backend)
        line = backend.line(self.returned) if result.ok else None
        return result, counters, line


def plan_run(
    program: Program,
    budget_bytes: int,
    heuristic: Union[str, Heuristic],
    dealloc: str,
    owned: Sequence[bool],
) -> PlannedRun:
    """The cheapest schedule of `program` under `budget_bytes` among the
    candidates of `heuristic`. Raises `OutOfBudgetError` (with a suggested
    budget) when none fits."""
    start = time.perf_counter()
    simulate = _Simulation(program, owned, dealloc)
    best: Optional[tuple[SimResult, Counters, StraightLine, Union[str, Heuristic]]] = None
    tried: list[tuple[str, Optional[float]]] = []
    first_error: Optional[OutOfBudgetError] = None
    for candidate in candidates(heuristic):
        limit = best[0].remat_cost if best is not None else None
        result, counters, line = simulate(budget_bytes, candidate, remat_limit=limit)
        tried.append((result.heuristic, result.overhead))
        if result.ok and (best is None or result.remat_cost < best[0].remat_cost):
            best = (result, counters, line, candidate)
            if result.remat_cost == 0:
                break  # nothing to recompute: no candidate does better
        elif result.status == "oom" and first_error is None:
            first_error = result.error
    if best is None:
        assert first_error is not None, "a candidate without a remat limit either fits or runs out of memory"
        raise first_error.suggest(_suggest_budget(simulate, heuristic, budget_bytes))
    result, counters, line, chosen = best
    return PlannedRun(line, result, counters, result.heuristic, chosen, tuple(tried), time.perf_counter() - start)


def observe(plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, timeline: bool, log: bool) -> None:
    """Fills the plan's timeline and operator log, as asked, by simulating its
    chosen run once more with the observers attached (it is deterministic)."""
    if (not timeline or plan.timeline is not None) and (not log or plan.log is not None):
        return
    observer = Timeline()
    recorder = TraceRecorder()
    _Simulation(program, owned, dealloc)(plan.result.budget_bytes, plan.candidate, observers=[observer], recorder=recorder)
    plan.timeline = tuple(observer.events)
    plan.log = recorder.trace()


def _suggest_budget(simulate: _Simulation, heuristic: Union[str, Heuristic], failed: int) -> int:
    """The least budget (within `SUGGESTION_TOLERANCE` of the peak) at which a
    candidate fits, found by bisection between one that failed and the
    unconstrained peak."""
    limit = simulate.workload.baseline.cost * (SUGGESTION_OVERHEAD_LIMIT - 1.0)

    def fits(budget: int) -> bool:
        for candidate in candidates(heuristic):
            if simulate(budget, candidate, remat_limit=limit)[0].ok:
                return True
        return False

    peak = simulate.workload.baseline.peak_bytes
    low, high = failed, max(peak, failed + 1)
    while not fits(high):  # the unconstrained peak fits by construction; this guards literals it omits
        low, high = high, 2 * high
    step = max(int(peak * SUGGESTION_TOLERANCE), 1)
    while high - low > step:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high
