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
passes the best one's so far: it could not win.

Planning effort follows reuse, as compiling does. The first plan of a
structure stops at the first candidate that fits within `QUICK_OVERHEAD`:
a program seen once (a TreeLSTM's fresh tree) pays one simulation, about
what the online run pays deciding as it goes. When the structure comes back,
`refine` tries the candidates the first plan skipped, each cut off at the
plan's compute, and so ends where the whole portfolio would have: the plan a
static model trains with does not depend on when it was made. Only when no candidate fits
is the budget too small, and the error then carries a budget the portfolio
was verified to fit in simulation (`OutOfBudgetError.suggested_budget_bytes`).
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from ..offline import (
    RecordingBackend,
    SimResult,
    StraightLine,
    checkmate_graph,
    optimal,
    run,
    stage_line,
)
from ..runtime import Counters, Heuristic, OutOfBudgetError, OverheadLimitError, Timeline
from ..oplog import Floor, Trace, TraceRecorder, floor
from .collection import collection_paused
from .lowering import BranchRead, lower, lower_by_path, recording, simulation
from .program import Equation, Program
from .rental import Rent
from .suggestion import suggest_budget

# The portfolio of `heuristic="auto"`, in order of preference between equals:
# the lookahead heuristic first (it won on most logs, docs/heuristics.md),
# then the paper's, then those that got through where the paper's did not
# (a BatchNorm CNN at 0.6 of its peak: dtr_local and msps, issue 21), and
# last `jdtr.optimal`'s schedule, on programs of at most OPTIMAL_MAX_EQUATIONS.
OPTIMAL = "optimal"
PORTFOLIO = ("lookahead", "dtr_eq", "dtr_local", "msps", "dtr_full", OPTIMAL)
AUTO = "auto"
# `jdtr.optimal` in the portfolio: on programs this small, by its refined
# relaxation (no MILP, no priced relaxation: those took minutes where this
# takes seconds) under limits on work (HiGHS's root node only, two rounds of
# refinement), never on time, so that a program always gets the same plan.
# Only where the heuristics' best may be more than OPTIMAL_WORTH_ABOVE times
# the optimum: not where their overhead is below that factor (the optimum
# costs at least the baseline), and the solve stops once a bound of its own
# (the interval relaxation's, a solve of milliseconds, then each round's)
# is above the heuristics' best over that factor. The issue-21
# BatchNorm CNN (141 equations): at 0.7 of its peak the optimum (1.095) in
# 1 s, where the heuristics' best is 1.58; at 0.6, 1.26 in 3 s, where
# theirs is 1.90. Each round's solve grows with the nodes refined (5 s a
# round on a 12-layer MLP, which the bound spares).
# The root node alone can take seconds: HiGHS's sub-MIPs search there for
# schedules until they find one, and on an 8-layer MLP of width 16 (biases,
# 0.4 of its peak) each round took 9-11 s for schedules 20x the heuristics'.
# A round keeps its third improving schedule at most: that MLP then takes
# 2.8 s instead of 22 s, where the CNN's plans above are unchanged (a limit of
# 2 loses its 0.6 plan, 1.26 becoming msps's 1.90). docs/benchmarks.md.
OPTIMAL_MAX_EQUATIONS = 200
OPTIMAL_NODE_LIMIT = 1
OPTIMAL_SOLUTION_LIMIT = 3
OPTIMAL_MAX_ROUNDS = 2
OPTIMAL_WORTH_ABOVE = 1.2
# Where no heuristic fits, the solver refines one round: a second round then
# stalled the error for seconds and found nothing (a 12-layer MLP of width 32
# at 0.4 of its peak: 21 s of HiGHS's root node on the refined model; an 8-layer
# MLP, 20 s; on six small models at 0.92 and 0.97 of their least fitting
# budget, two rounds and one raised or fitted alike). docs/benchmarks.md.
OPTIMAL_ROUNDS_WITHOUT_A_FIT = 1

# A structure's first plan keeps the first candidate within this overhead
# (cost-model units): DTR's usual at half the peak (docs/benchmarks.md), well
# short of thrashing (the lookahead's 6.2 on an MLP at 0.47, test_planned).
QUICK_OVERHEAD = 1.5
# A plan over this overhead recomputes more than the step again: the
# simulator's "thrash" (its default overhead limit). jdtr.grad warns, with a
# budget that avoids it (`PlannedRun.calm_budget_bytes`).
THRASH_OVERHEAD = 2.0
# Each probe of the suggestion's bisection simulates the candidates cut off at
# this overhead: a suggested budget runs without thrashing, so a call at it
# is not warned of thrashing (at 3, the limit before, a ResNet's suggestion
# ran at 2.5 and was). A run cut off there also ends twice as soon as at 3:
# near the boundary, where every candidate thrashes, that is most of the
# search (docs/benchmarks.md, 2026-11-28).
SUGGESTION_OVERHEAD_LIMIT = THRASH_OVERHEAD
# No planned run recomputes more than this (compute over the step's): a
# candidate with no schedule to beat is cut off there, and where every one
# is, the call raises `OverheadLimitError` with a budget that runs without
# thrashing. Past it a simulation's cost grows with the thrashing (the
# evicted regions scored grow): dtr_eq on a fresh TreeLSTM at half its peak
# simulated 110 s to a 30x plan, 5.7 s to this cut-off (docs/benchmarks.md).
MAX_OVERHEAD = 4.0


def plannable(program: Program) -> bool:
    """Whether a run of `program` can be decided before it starts: every cost
    is known (not measured at run time), in every branch of its `cond`s."""
    if program in _PLANNABLE:  # asked on every call; a cost once known stays known
        return True
    known = all(
        item.cost is not None if type(item) is Equation else all(plannable(branch) for branch in item.branches)
        for item in program.body
    )
    if known:
        _PLANNABLE.add(program)
    return known


_PLANNABLE: "weakref.WeakSet[Program]" = weakref.WeakSet()


def branching(program: Program) -> bool:
    """Whether `program` has a `cond` (its run is planned per path, `paths.py`)."""
    return program.has_conds


def candidates(heuristic: Union[str, Heuristic], program: Program) -> tuple[Union[str, Heuristic], ...]:
    """The heuristics a plan tries: the portfolio for "auto" (with
    `jdtr.optimal` only on small programs without `cond`s: its schedule is
    not a runtime's, which a run by paths goes on with), else the one named."""
    if heuristic != AUTO:
        return (heuristic,)
    small = program.num_equations <= OPTIMAL_MAX_EQUATIONS and not branching(program)
    return tuple(c for c in PORTFOLIO if c != OPTIMAL or small)


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
      remaining: the candidates a quick plan did not try (`refine` tries them).
      calm_budget_bytes: when the run thrashes (overhead over
        THRASH_OVERHEAD), the least budget found at which a candidate runs
        within it, verified in simulation.
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
    remaining: tuple[Union[str, Heuristic], ...] = ()
    calm_budget_bytes: Optional[int] = None  # where thrashing (overhead > THRASH_OVERHEAD): a budget that is not
    compiled: Any = None  # the executor's chunks, once compiled (when the plan is run again)
    compiled_on: Any = None  # the device they run on, if the arguments were committed to another one
    slack: int = 0  # bytes under the budget it was made for, to run as fewer chunks (`slack.py`)
    # A program with `cond`s is planned per path (`paths.py`): the branches
    # this plan knows, and per `Read` of its line, the `cond` and the branch
    # it goes on by (known, or guessed).
    path: Optional[tuple[int, ...]] = None
    reads: tuple[BranchRead, ...] = ()
    rent: Rent = field(default_factory=Rent)  # its runs, and their seconds step by step (when to compile: `rental.py`)
    # The plans of the paths that parted from it (an error: the path does not fit).
    paths: "OrderedDict[tuple[int, ...], Union[PlannedRun, OutOfBudgetError]]" = field(default_factory=OrderedDict, repr=False)
    warned: bool = False  # a run by it thrashing was said (a path's plan: once it ran)
    whole: Any = None  # the step as one program (`whole_step.WholeStep`), False where none fits
    trial: Any = None  # chunks="auto": its chunks timed against that program (`whole_choice.WholeTrial`), False: none
    compile_s: float = 0.0  # seconds its chunks took to cut and compile
    watched: set = field(default_factory=set, repr=False)  # its runs whose allocator use was read ("steps", "chunks")
    last_taken: dict = field(default_factory=dict, repr=False)  # per cond (and per count of branches), the branch taken last
    timeline: Optional[tuple] = field(default=None, repr=False)
    log: Optional[Trace] = field(default=None, repr=False)
    # Where the trace keeps scans whole (`scan_variants.py`): the program
    # planned (a scan strategy's), what it does with the scans, and the cost
    # of the program as JAX differentiates it, which the overhead is of.
    program: Optional[Program] = field(default=None, repr=False)
    scans: Optional[str] = None
    baseline_cost: Optional[float] = None

    @property
    def overhead(self) -> float:
        """(base + remat) / base; under a scan strategy, of the program as JAX
        differentiates it, so that the strategy's recomputation counts."""
        if not self.baseline_cost:
            return self.counters.overhead
        return (self.counters.base_cost + self.counters.remat_cost) / self.baseline_cost

    def keeps_scans_of(self, other: "PlannedRun") -> "PlannedRun":
        """This plan, of the program `other` was planned on (a plan refined,
        or a path's, goes by its scan strategy)."""
        self.program, self.scans, self.baseline_cost = other.program, other.scans, other.baseline_cost
        return self


class _Reads:
    """Hands the simulation's reads to the backend of the run under way. (Not
    a method of `_Simulation`: its workload keeps this, and a bound method
    would make the two a reference cycle, whose lowered program only the
    cycle collector could free.)"""

    def __init__(self) -> None:
        self.backend: Optional[RecordingBackend] = None

    def __call__(self, buffer: Any) -> None:
        self.backend.read(buffer)


class _Simulation:
    """Simulates one program under budgets and heuristics, each run recorded:
    the program is lowered once (`lowering.lower`), and every candidate
    replays that."""

    def __init__(
        self, program: Program, owned: Sequence[bool], dealloc: str, path: Optional[Sequence[int]] = None, guess=None
    ):
        self.program = program
        self.dealloc = dealloc
        self.returned: list = []
        # Slots 0..n-1 are the arguments: a RecordingBackend registers them first.
        arguments = range(len(program.inputs))
        self.path = None if path is None else tuple(path)
        self.reads: tuple[BranchRead, ...] = ()
        if self.path is None:
            lowered = lower(program, owned, arguments=arguments)
        else:
            lowered, self.reads = lower_by_path(program, self.path, owned, arguments=arguments, guess=guess)
        self._reads = _Reads()
        self.workload = simulation(program, returned=self.returned, lowered=lowered, on_read=self._reads)
        self.lowered = lowered
        self.reference: Optional[tuple[SimResult, StraightLine, Trace]] = None
        self.events: tuple = ()  # the residency events of the last `optimal` run that fit

    @functools.cached_property
    def floor(self) -> Floor:
        """No run of the program fits under this (`oplog.floor`): computed
        when first asked (by `plan_run` and the suggestion's search; the
        simulations that refine or observe a plan never ask)."""
        return floor(self.lowered)

    def __call__(
        self,
        budget_bytes: int,
        heuristic: Union[str, Heuristic],
        remat_limit: Optional[float] = None,
        observers: Sequence[Any] = (),
        recorder: Optional[TraceRecorder] = None,
    ) -> tuple[SimResult, Counters, Optional[StraightLine]]:
        if heuristic == OPTIMAL:
            return self.optimal(budget_bytes, remat_limit)
        backend = self._reads.backend = RecordingBackend()
        for value in self.program.inputs:
            backend.argument(value.nbytes)
        counters = Counters()
        self.returned.clear()
        play = self.workload if recorder is None else recording(self.workload, recorder)
        baseline = play.baseline.cost
        limit = None if remat_limit is None or baseline <= 0 else 1.0 + remat_limit / baseline
        result = run(play, budget_bytes, heuristic, self.dealloc, limit, [counters, *observers], backend=backend)
        line = backend.line(self.returned) if result.ok else None
        return result, counters, line

    def optimal(
        self, budget_bytes: int, remat_limit: Optional[float] = None, rounds: int = OPTIMAL_MAX_ROUNDS
    ) -> tuple[SimResult, Counters, Optional[StraightLine]]:
        """`jdtr.optimal`'s schedule as a run: solved on the program's operator
        log, written over the operators of a run without a budget (the log's
        recording), and measured (`stage_line`). Its status is "oom" when the
        solver found no schedule or its run would not fit, "thrash" when a
        schedule recomputing `remat_limit` is within OPTIMAL_WORTH_ABOVE of
        the optimum by a bound of the solver's, before it found a schedule
        (no need to solve further). `rounds`: of the solver's refinement, at most."""
        if self.reference is None:
            recorder = TraceRecorder()
            result, _, line = self(math.inf, "dtr_eq", recorder=recorder)
            self.reference = (result, line, recorder.trace())
        reference, line, trace = self.reference
        graph = checkmate_graph(trace.program)
        base = self.workload.baseline.cost
        # With an incumbent, a bound on the optimum within OPTIMAL_WORTH_ABOVE
        # of it ends the solve: the incumbent is as good as asked (the solve
        # would take seconds a round to find a schedule no better).
        enough = None
        if remat_limit is not None and base > 0:
            enough = sum(graph.costs) * (1.0 + remat_limit / base) / OPTIMAL_WORTH_ABOVE
        solved = optimal(
            trace,
            budget_bytes,
            time_limit=None,
            method="relaxation",
            node_limit=OPTIMAL_NODE_LIMIT,
            solution_limit=OPTIMAL_SOLUTION_LIMIT,
            max_rounds=rounds,
            priced=False,
            stop_at_bound=enough,
        )
        if enough is not None and solved.bound is not None and solved.bound >= enough and solved.stages is None:
            cut = replace(reference, status="thrash", overhead=None, heuristic=OPTIMAL, error=None,
                          message=f"within {OPTIMAL_WORTH_ABOVE}x of the optimum's bound {solved.bound / max(solved.baseline_cost, 1e-12):.4f}")
            return cut, Counters(), None
        staged = None
        if solved.stages is not None:
            staged = stage_line(line, graph, solved.stages, budget_bytes)
        if staged is not None:
            self.events = tuple(staged.events)
        counters = staged.counters if staged is not None else Counters()
        result = replace(
            reference,
            status="ok" if staged is not None else "oom",
            overhead=(base + counters.remat_cost) / base if staged is not None and base > 0 else (1.0 if staged else None),
            budget_bytes=int(budget_bytes),
            remat_cost=counters.remat_cost,
            heuristic=OPTIMAL,
            heuristic_evaluations=0,
            metadata_accesses=0,
            message=None if staged is not None else f"jdtr.optimal: {solved.status}, {solved.message}",
            error=None,
            **counters.totals(),
        )
        return result, counters, staged.line if staged is not None else None


@collection_paused()
def plan_run(
    program: Program,
    budget_bytes: int,
    heuristic: Union[str, Heuristic],
    dealloc: str,
    owned: Sequence[bool],
    quick: bool = False,
    suggest: bool = True,
) -> PlannedRun:
    """The cheapest schedule of `program` under `budget_bytes` among the
    candidates of `heuristic` or, `quick`, the first within `QUICK_OVERHEAD`
    (the rest left for `refine`). Raises `OutOfBudgetError` (with a
    suggested budget, searched for unless `suggest` is False: a caller with
    other programs to try) when none fits. A program with a `cond` on data
    is planned by paths (`paths.py`), from the empty one: nothing read yet
    (`lowering.lower_by_path`).

    Whether it has one is read off the program planned, not passed down:
    the program as first traced keeps its scans whole, which hide the
    `cond`s in their bodies, and unrolled, a scan whose body branches on
    data is a program that does. Planned as if it did not, its run went by
    the branches it guessed (the largest), not by those its predicates
    took: every gradient was wrong."""
    start = time.perf_counter()
    simulate = _Simulation(program, owned, dealloc, () if branching(program) else None)
    least = simulate.floor
    if budget_bytes < least.total_bytes:
        # Every candidate would fail, most after thrashing for seconds (a
        # 64-layer MLP at 0.1 of its peak: 39-44 s): said at once.
        error = OutOfBudgetError(least.held_bytes, max(budget_bytes - least.external_bytes, 0), least.external_bytes, 0,
                                 budget_bytes, least.op_name, least.source)
        if not suggest:
            raise error
        raise error.suggest(_suggest_budget(simulate, candidates(heuristic, program), budget_bytes))
    search = _search(simulate, budget_bytes, candidates(heuristic, program), None, QUICK_OVERHEAD if quick else None)
    if search.best is None:
        assert search.error is not None, "a candidate with no schedule to beat fits, runs out of memory or passes MAX_OVERHEAD"
        if not suggest:
            raise search.error
        raise search.error.suggest(_suggest_budget(simulate, candidates(heuristic, program), budget_bytes))
    result, counters, line, chosen = search.best
    plan = _planned(simulate, line, result, counters, chosen, search.tried, 0.0, search.remaining)
    plan.path, plan.reads = simulate.path, simulate.reads
    if counters.overhead > THRASH_OVERHEAD:
        tried = candidates(heuristic, program)
        plan.calm_budget_bytes = _suggest_budget(simulate, tried, budget_bytes, THRASH_OVERHEAD)
    plan.planning_time_s = time.perf_counter() - start
    return plan


@collection_paused()
def refine(plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str) -> PlannedRun:
    """`plan` with the candidates it skipped tried too, each cut off at its
    compute: the plan itself if none does better, else a new one, as the whole
    portfolio would have chosen."""
    if not plan.remaining:
        return plan
    start = time.perf_counter()
    simulate = _Simulation(program, owned, dealloc, plan.path)
    incumbent = (plan.result, plan.counters, plan.line, plan.candidate)
    search = _search(simulate, plan.result.budget_bytes, plan.remaining, incumbent, None)
    result, counters, line, chosen = search.best
    elapsed = time.perf_counter() - start
    tried = plan.tried + search.tried
    if chosen is plan.candidate:
        plan.tried, plan.remaining, plan.planning_time_s = tried, (), plan.planning_time_s + elapsed
        return plan
    better = _planned(simulate, line, result, counters, chosen, tried, plan.planning_time_s + elapsed, ())
    better.path, better.reads, better.rent = plan.path, plan.reads, plan.rent  # (its paths are planned anew: another candidate)
    better.keeps_scans_of(plan)
    if counters.overhead > THRASH_OVERHEAD:
        better.calm_budget_bytes = plan.calm_budget_bytes
    return better


def plans_below(
    plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, budgets: Sequence[int], remat_limit: Callable[[], float]
) -> Iterator[Optional[PlannedRun]]:
    """The runs of `program` by `plan`'s candidate under each of `budgets`
    in turn, each simulated only until it recomputes `remat_limit()` (cost
    units, asked anew for each): None for one that is cut off there or does
    not fit. Lowered once for all of them."""
    simulate = _Simulation(program, owned, dealloc)
    for budget_bytes in budgets:
        start = time.perf_counter()
        with collection_paused():
            yield _by_candidate(simulate, plan.candidate, budget_bytes, start, remat_limit=max(remat_limit(), 0.0))[1]


@collection_paused()
def plan_path(
    plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, path: Sequence[int], guess=None
) -> PlannedRun:
    """The run of `plan`'s program whose `cond`s take the branches of `path`
    (the rest as `guess(cond)` says, else their largest), by
    `plan`'s candidate: up to where its path parts from `plan`'s, the same
    steps (`lowering.lower_by_path`). Raises `OutOfBudgetError` where it
    does not fit."""
    start = time.perf_counter()
    simulate = _Simulation(program, owned, dealloc, path, guess)
    result, followed = _by_candidate(simulate, plan.candidate, plan.result.budget_bytes, start)
    if followed is None:
        assert result.error is not None, "a run without a remat limit either fits or runs out of memory"
        raise result.error
    followed.path, followed.reads = simulate.path, simulate.reads
    return followed.keeps_scans_of(plan)


def _by_candidate(
    simulate: _Simulation, candidate: Union[str, Heuristic], budget_bytes: int, start: float, remat_limit: Optional[float] = None
) -> tuple[Any, Optional[PlannedRun]]:
    """One candidate's run simulated at `budget_bytes` (stopped once it
    recomputes `remat_limit`), and the planned run it makes, timed from
    `start`; None where it does not fit or was stopped."""
    result, counters, line = simulate(budget_bytes, candidate, remat_limit=remat_limit)
    if not result.ok:
        return result, None
    run = _planned(simulate, line, result, counters, candidate, ((result.heuristic, result.overhead),), 0.0, ())
    run.planning_time_s = time.perf_counter() - start
    return result, run


@collection_paused()
def verified_budget(program: Program, owned: Sequence[bool], dealloc: str, heuristic: Union[str, Heuristic], failed_bytes: int) -> Optional[int]:
    """For a run that did not fit `failed_bytes` deciding as it went (the
    online mode, by `heuristic`, a single one): the least budget at which
    that run fits, verified by simulating it (its decisions are the
    simulation's), as `plan_run`'s errors carry. None where the run cannot
    be decided ahead: costs measured at run time, or `cond`s on data."""
    if not plannable(program) or branching(program):
        return None
    return _suggest_budget(_Simulation(program, owned, dealloc), (heuristic,), failed_bytes)


def _planned(simulate: _Simulation, line, result, counters, chosen, tried, planning_time_s, remaining) -> PlannedRun:
    plan = PlannedRun(line, result, counters, result.heuristic, chosen, tried, planning_time_s, remaining)
    if chosen == OPTIMAL:  # the solver's run has no runtime to observe: its events come with it
        plan.timeline = simulate.events
    return plan


@dataclass
class _Search:
    best: Optional[tuple[SimResult, Counters, StraightLine, Union[str, Heuristic]]]
    tried: tuple[tuple[str, Optional[float]], ...]
    remaining: tuple[Union[str, Heuristic], ...]
    error: Optional[OutOfBudgetError]


def _search(simulate: _Simulation, budget_bytes: int, pending: Sequence[Union[str, Heuristic]], best, quick: Optional[float]) -> _Search:
    """Simulates `pending` in order, keeping the cheapest fitting run (ties to
    the earlier, `best` first of all); stops early at a run with nothing to
    recompute, or, with `quick`, at one within that overhead. A candidate is
    cut off at the best run's compute, or, before any fits, at MAX_OVERHEAD
    (where every one is, the error is an `OverheadLimitError`)."""
    tried: list[tuple[str, Optional[float]]] = []
    first_error: Optional[OutOfBudgetError] = None
    thrashing: list[str] = []  # candidates cut off at MAX_OVERHEAD
    cap = (MAX_OVERHEAD - 1.0) * simulate.workload.baseline.cost
    for i, candidate in enumerate(pending):
        if candidate == OPTIMAL and best is not None:
            if quick is not None:  # a solve takes seconds: when the structure comes back
                return _Search(best, tuple(tried), tuple(pending[i:]), first_error)
            if best[0].overhead <= OPTIMAL_WORTH_ABOVE:
                continue  # within that of any optimum: it costs at least the baseline
        limit = best[0].remat_cost if best is not None else cap
        if candidate == OPTIMAL and best is None:
            result, counters, line = simulate.optimal(budget_bytes, rounds=OPTIMAL_ROUNDS_WITHOUT_A_FIT)
            if result.ok and result.remat_cost > cap:  # the optimum itself thrashes past the cap
                result = replace(result, status="thrash", overhead=None)
        else:
            result, counters, line = simulate(budget_bytes, candidate, remat_limit=limit)
        tried.append((result.heuristic, result.overhead))
        if result.status == "thrash" and best is None:
            thrashing.append(result.heuristic)
        if result.ok and (best is None or result.remat_cost < best[0].remat_cost):
            best = (result, counters, line, candidate)
            if result.remat_cost == 0:
                break  # nothing to recompute: no candidate does better
            if quick is not None and result.overhead <= quick:
                return _Search(best, tuple(tried), tuple(pending[i + 1 :]), first_error)
        elif result.status == "oom" and first_error is None and result.error is not None:
            first_error = result.error
    if best is None and thrashing:
        # Some candidate kept the budget as far as the cut-off: said so, rather
        # than another's running out of memory.
        first_error = OverheadLimitError(MAX_OVERHEAD, budget_bytes, tuple(thrashing))
    return _Search(best, tuple(tried), (), first_error)


def observe(plan: PlannedRun, program: Program, owned: Sequence[bool], dealloc: str, timeline: bool, log: bool) -> None:
    """Fills the plan's timeline and operator log, as asked, by simulating its
    chosen run once more with the observers attached (it is deterministic)."""
    if (not timeline or plan.timeline is not None) and (not log or plan.log is not None):
        return
    observer = Timeline()
    recorder = TraceRecorder()
    simulate = _Simulation(program, owned, dealloc)
    if plan.candidate == OPTIMAL:  # the log is the program's requests, whatever the schedule
        simulate(math.inf, "dtr_eq", recorder=recorder)
    else:
        simulate(plan.result.budget_bytes, plan.candidate, observers=[observer], recorder=recorder)
        plan.timeline = tuple(observer.events)
    plan.log = recorder.trace()


def _suggest_budget(
    simulate: _Simulation, tried: Sequence[Union[str, Heuristic]], failed: int, overhead: float = SUGGESTION_OVERHEAD_LIMIT
) -> int:
    """The least budget above `failed` (within the suggestion's tolerance of
    the peak) at which a candidate fits within `overhead`
    (`suggestion.suggest_budget`: the heuristics probed, not the solver)."""
    return suggest_budget(simulate, [c for c in tried if c != OPTIMAL], failed, overhead)
