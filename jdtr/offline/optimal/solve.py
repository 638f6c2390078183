"""`jdtr.optimal`: relaxation, refinement and the MILP, in the time given."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from ...budget import BudgetLike, parse_budget
from ...oplog import Trace
from ..driver import as_trace, log_workload
from .graph import Scheduled, Stages, checkmate_graph
from .milp import MILP_MAX_BINARIES, checkmate
from .model import WorkLimit
from .refine import realize_relaxations, refine
from .relaxation import INTERVAL_TIME_LIMIT, solve_intervals
from .stages import heuristic_schedule


STATUSES = ("optimal", "timeout", "infeasible")
METHODS = ("auto", "milp", "relaxation")
# Above this many binaries, "auto" does not build Checkmate's MILP. Up to it

@dataclass(frozen=True)
class OptimalResult:
    """The least total compute of any schedule of a trace under a memory budget.

    Costs are in the trace's unit (nanoseconds for operator logs), sizes in bytes.

    Attributes:
      status: "optimal" (proven, within `rel_gap`), "timeout" (not proven:
        the time limit came first, or the method ran out of means — nothing
        left to refine, or no MILP; `message` says which — `total_cost` is
        the best schedule found, if any, and `bound` what the optimum is at
        least), or "infeasible" (no schedule fits the budget).
      total_cost: compute of the best schedule found (baseline plus
        recomputation); None when none was found.
      baseline_cost: compute of running every operator once.
      overhead: total_cost / baseline_cost, comparable with
        `SimResult.overhead`; None without a schedule.
      budget_bytes: the budget.
      bound: a lower bound on the optimal total compute: the better of the
        solver's dual bound and a small relaxation's (`interval_bound`),
        equal to total_cost (up to `rel_gap`) when optimal. None only for
        "infeasible". After a timeout on a large trace, often the only
        answer: the optimum lies between it and the best schedule known.
      recomputations: node computations beyond the first of each; None
        without a schedule.
      unconstrained_peak_bytes: the model's memory peak when every node is
        computed once and freed after its last use, constants pinned: at any
        budget at least this, the optimum is the baseline.
      required_bytes: the least budget any schedule needs: constants plus the
        largest node with its inputs, or constants plus all outputs.
      constant_bytes: bytes of the constants, pinned throughout.
      nodes: nodes (stages) of the graph.
      variables: variables of the last MILP solved (0 when it was not
        built): Checkmate's, with memory rows for the stages that needed them.
      integer_variables: binary variables among them.
      constraints: constraints of the MILP.
      solver_nodes: branch-and-bound nodes HiGHS explored, over all the
        MILP's solves.
      solve_time_s: wall time of the whole call (relaxations, refinement
        and the MILP).
      solver: the solver, with the scipy version.
      message: the solver's message, or why no MILP was needed.
      stages: the best schedule found, as Checkmate's stages over the
        graph's nodes (`checkmate_graph`): per stage, the nodes computed in
        order and the nodes held after it; None without a schedule. Not in
        `to_dict`.
    """

    status: str
    total_cost: Optional[float]
    baseline_cost: float
    overhead: Optional[float]
    budget_bytes: int
    bound: Optional[float]
    recomputations: Optional[int]
    unconstrained_peak_bytes: int
    required_bytes: int
    constant_bytes: int
    nodes: int
    variables: int
    integer_variables: int
    constraints: int
    solver_nodes: int
    solve_time_s: float
    solver: str
    message: str
    stages: Optional[Stages] = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Whether a schedule was found (status "optimal", or "timeout" with an incumbent)."""
        return self.total_cost is not None

    def to_dict(self) -> dict[str, Any]:
        """The fields, for JSON (the schedule left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "stages"}



def _solver_name() -> str:
    import scipy

    return f"HiGHS (scipy.optimize.milp, scipy {scipy.__version__})"


def optimal(
    trace: "Trace | str | os.PathLike[str]",
    budget: BudgetLike,
    *,
    time_limit: Optional[float] = 60.0,
    rel_gap: float = 1e-6,
    method: str = "auto",
    node_limit: Optional[int] = None,
    solution_limit: Optional[int] = None,
    max_rounds: Optional[int] = None,
    priced: bool = True,
    stop_at_bound: Optional[float] = None,
) -> OptimalResult:
    """The least total compute of any rematerialization schedule of `trace` under `budget`.

    Solves Checkmate's MILP (Jain et al., MLSys 2020; see this module's
    docstring) on the trace's linear graph with HiGHS, unless a relaxation's
    schedule already meets the relaxation's lower bound (then `variables` is
    0 and `message` says so). The relaxation (`interval_bound`) is solved
    first; where its schedule falls short, the nodes it misses are refined
    round by round, each round's bound a bound and its schedule a schedule,
    and then, if the MILP is small enough, it is solved in the time left.
    With its memory rows added only where needed (`checkmate`), HiGHS
    proves optima within a minute for traces of up to about two hundred
    operators down to budgets of 0.7 to 0.5 of their peak, depending on
    the model (and every budget of the 60-operator `rnn(2, 32, 8, 64)`,
    which the refinement alone leaves open at 0.5); at tighter
    budgets, or on larger traces, expect "timeout" with the best schedule
    and bound found, the optimum between them (docs/simulator.md).

    How the model's memory relates to the simulator's (`jdtr.simulate`):

    * Both count constants as resident throughout (the simulator pins them),
      and both count an operator's output while its inputs are resident, at
      the moment it runs.
    * The simulator frees a value when the program releases it (`RELEASE`)
      or when the heuristic evicts it; a released value can never be kept.
      The MILP frees a value right after the last computation of its stage
      that reads it, unless it keeps it for the next stage — also values the
      program has already released. Its unconstrained peak
      (`OptimalResult.unconstrained_peak_bytes`) keeps constants resident, the
      simulator's baseline frees them at their last release, so the two
      peaks can differ.
    * A multi-output call is one node per output, sharing the call's cost;
      the simulator replays the whole call for any of them.
    * First computations happen in trace order, and a stage recomputes each
      node at most once, in trace order (Checkmate's frontier-advancing
      schedules); DTR interleaves recomputations as it needs them.

    So a DTR run that rematerializes each operator at most once between two
    first computations is one of these schedules, costing what the run did
    or less (`heuristic_schedule`), and the optimum bounds its compute
    from below. `optimal` runs `SEED_HEURISTICS` at the budget and starts
    from the cheapest such run, so its schedule is never worse than theirs
    (`message` names the heuristic when its run is the answer). A run that
    recomputes an operator twice within a stage is no stage schedule, and
    the optimum says nothing about it.

    Args:
      trace: a `Trace`, or the path of a log.
      budget: bytes (int), a size with a unit ("4GB"), or a float in (0, 1]:
        a fraction of the simulator's unconstrained peak (as `jdtr.simulate`
        reads it, so that both get the same budget in bytes).
      time_limit: seconds for the refinement and the MILP together (None:
        no limit); the first relaxations (plain and priced) take at most
        `INTERVAL_TIME_LIMIT` (10 s) each more, usually milliseconds.
      rel_gap: HiGHS stops once the best schedule is within this fraction of
        the lower bound; 0 proves optimality exactly.
      method: "auto" (relaxation, refinement for up to 80% of
        `time_limit`, then the MILP if it has at most `MILP_MAX_BINARIES`
        binaries, else refinement for all of it), "milp" (relaxation, then
        the MILP), or "relaxation" (relaxation and refinement, no MILP). Every method stops at the first
        relaxation when its schedule meets its bound. The MILP's memory
        rows are added stage by stage where its solutions overflow (see
        `checkmate`); its answer is Checkmate's.
      node_limit: branch-and-bound nodes for each of HiGHS's solves (None:
        no limit). With `time_limit=None` and `max_rounds`, a limit on work
        rather than time: the same trace always gets the same answer (the
        first relaxations then have no time limit either). It does not
        bound the root node's work, which can take seconds.
      solution_limit: improving solutions each of HiGHS's solves may find
        (None: no limit); a limit on work as `node_limit` is, and one that
        bounds the root node's search for schedules (`WorkLimit`).
      max_rounds: rounds of refinement at most (None: no limit).
      priced: also solve, for schedules, the relaxation that prices what
        recomputing needs (often a cheaper schedule; often most of the time).
      stop_at_bound: stop refining (and skip the MILP) once the lower bound
        on the total compute reaches this: a caller holding a schedule that
        costs C, content with one within a factor f of the optimum, passes
        C / f, and once the bound reaches it no schedule can be better by
        that factor. The result's status is then "timeout", with the bound
        and the best schedule found (None: no limit).

    Returns:
      An `OptimalResult`. Infeasible budgets and timeouts are results, not errors.

    Raises:
      ValueError: `method` is not one of `METHODS`.
      ImportError: scipy is not installed (`pip install scipy`).
      LogFormatError: `trace` is a path to a malformed log.

    Example:
      >>> result = jdtr.optimal(jdtr.trace(loss, params, batch), 0.5)   # doctest: +SKIP
      >>> result.status, result.overhead                               # doctest: +SKIP
      ('optimal', 1.03...)
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, not {method!r}")
    try:
        import scipy.optimize  # noqa: F401  (checked here, used by `Model.solve`)
    except ImportError as err:  # scipy is an optional dependency
        raise ImportError(
            "jdtr.optimal solves a MILP with scipy's HiGHS, but scipy is not installed: "
            "pip install scipy (or pip install 'jdtr[optimal]')"
        ) from err
    start = time.perf_counter()
    trace = as_trace(trace)
    graph = checkmate_graph(trace.program)
    workload = log_workload(trace)
    unconstrained = workload.baseline
    budget_bytes = parse_budget(budget).resolve(unconstrained.peak_bytes)
    baseline = float(sum(graph.costs))
    facts = dict(
        baseline_cost=baseline,
        budget_bytes=int(budget_bytes),
        unconstrained_peak_bytes=graph.unconstrained_peak_bytes(),
        required_bytes=graph.required_bytes(),
        constant_bytes=graph.constant_bytes,
        nodes=len(graph),
        solver=_solver_name(),
    )

    seed: Optional[Scheduled] = None  # the best heuristic's run, once known

    def result(status: str, message: str, best: Optional[Scheduled] = None, bound: Optional[float] = None, **solver: int) -> OptimalResult:
        if seed is not None and best is not None and best.cost == seed.cost:
            message += f"; the schedule is {seed.source}'s run"
        total = None if best is None else best.cost
        return OptimalResult(
            status=status,
            total_cost=total,
            overhead=None if total is None else (total / baseline if baseline > 0 else 1.0),
            bound=bound,
            recomputations=None if best is None else best.recomputations,
            solve_time_s=time.perf_counter() - start,
            message=message,
            stages=None if best is None else best.stages,
            **{"variables": 0, "integer_variables": 0, "constraints": 0, "solver_nodes": 0, **solver},
            **facts,
        )

    if facts["required_bytes"] > budget_bytes:
        return result("infeasible", f"no schedule fits: it needs at least {facts['required_bytes']} bytes")
    if not len(graph):
        return result("optimal", "nothing to compute", Scheduled(0.0, 0, []), 0.0)
    # With a limit on work alone, no solve has a limit on time.
    work = WorkLimit(node_limit, solution_limit)
    first_limit = None if time_limit is None and work.bounded else INTERVAL_TIME_LIMIT
    intervals = solve_intervals(graph, budget_bytes, first_limit, rel_gap=rel_gap, work=work)
    relaxed = intervals.bound
    if relaxed == math.inf:
        return result("infeasible", "no schedule fits: some step's values alone exceed the budget")
    stop_at = math.inf if stop_at_bound is None else float(stop_at_bound)
    if relaxed >= stop_at:
        return result("timeout", f"the interval relaxation's bound {relaxed:.6g} reached stop_at_bound", bound=relaxed)
    # The relaxation's decisions, run as a schedule: where that schedule
    # costs no more than the relaxation's bound, it is optimal, and the
    # large MILP is not needed; else it is a schedule the MILP must beat.
    realized, schedules = realize_relaxations(
        graph, budget_bytes, intervals, relaxed, rel_gap, first_limit, work, priced
    )
    # DTR's own runs at this budget are stage schedules too, often better
    # than the relaxations' at tight budgets: the schedule to beat.
    seed = heuristic_schedule(workload, graph, budget_bytes)
    if seed is not None and (realized is None or seed.cost < realized.cost):
        realized = seed
    if realized is not None and realized.cost <= relaxed * (1 + rel_gap):
        return result(
            "optimal", "the interval relaxation's bound proves a schedule optimal", realized, min(relaxed, realized.cost)
        )
    binaries = graph.milp_binaries()
    solve_milp = method == "milp" or (method == "auto" and binaries <= MILP_MAX_BINARIES)
    deadline = None if time_limit is None else time.perf_counter() + max(time_limit, 0.0)
    done = ""
    if method != "milp":
        # The refinement first: within seconds its bounds are often tighter
        # than HiGHS's on the MILP in a minute, and it proves most optima the
        # MILP does and more. It stops early when it has nothing left to
        # refine, which is where the MILP proves what it cannot (rnn(2, 32,
        # 8, 64) at 0.6 and 0.5: in a second); where it is still refining
        # at its deadline, the MILP rarely finishes either (rnn(4, 32, 8,
        # 64) at 0.5: nothing in 450 s). So it gets most of the time.
        share = 0.8 if solve_milp else 1.0
        limit = None if time_limit is None else time.perf_counter() + share * max(time_limit, 0.0)
        relaxed, realized, rounds, refined = refine(
            graph, budget_bytes, intervals, schedules, realized, limit, rel_gap, work, max_rounds, priced, stop_at
        )
        if relaxed == math.inf:
            return result("infeasible", "no schedule fits: the refined relaxation has no solution")
        done = f"{rounds} round{'s' if rounds != 1 else ''} of refinement, {refined} nodes refined"
        if realized is not None and realized.cost <= relaxed * (1 + rel_gap):
            return result(
                "optimal", f"the refined relaxation's bound proves a schedule optimal ({done})", realized,
                min(relaxed, realized.cost),
            )
        if relaxed >= stop_at:
            return result("timeout", f"the refined relaxation's bound {relaxed:.6g} reached stop_at_bound ({done})", realized, relaxed)
        if not solve_milp:
            why = "method='relaxation'" if method == "relaxation" else (
                f"Checkmate's MILP would have {binaries:,} binaries (more than {MILP_MAX_BINARIES:,}): not built"
            )
            return result("timeout", f"{why}; {done}", realized, relaxed)
    solved = checkmate(graph, budget_bytes, deadline, rel_gap, work=work)
    rows = f"memory rows for {solved.stages_checked} of {len(graph)} stages, {solved.rounds} solve{'s' if solved.rounds != 1 else ''}"
    message = f"Checkmate's MILP ({rows}): {solved.message}" + (f"; before it, {done}" if done else "")
    if solved.status == "infeasible":
        if realized is not None:  # HiGHS's "infeasible" despite a schedule that fits: numerical, not a proof
            return result("timeout", f"HiGHS called a model with a schedule infeasible ({rows})", realized, relaxed, **solved.solver)
        return result("infeasible", message, **solved.solver)
    bound = max(solved.bound, relaxed)
    best = min((s for s in (solved.best, realized) if s is not None), default=None)
    status = solved.status
    if best is not None and best.cost <= bound * (1 + rel_gap):
        status = "optimal"  # the relaxation proves the schedule found optimal
    if best is None:
        return result(status, message, bound=bound, **solved.solver)
    if status == "optimal":
        bound = min(bound, best.cost)
    return result(status, message, best, bound, **solved.solver)
