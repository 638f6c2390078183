"""`jdtr.optimal`: the least compute a trace needs under a budget, by Checkmate's MILP.

Checkmate (Jain et al., "Checkmate: Breaking the memory wall with optimal
tensor rematerialization", MLSys 2020, §4) schedules a computation graph in
*stages*: stage t computes node t for the first time, and may recompute any
earlier nodes before it, each at most once and in graph order. Binary
variables say what each stage does:

  R[t, i] = 1   node i is computed in stage t (R[t, t] = 1: the frontier advances),
  S[t, i] = 1   node i's value is kept (checkpointed) from stage t-1 into stage t,

and continuous ones account for memory within a stage:

  FREE[t, i, k] = 1   i's memory is freed right after node k runs in stage t,
  U[t, k]             the memory in use while node k runs in stage t.

Constraints (t = stage, k = node, i in deps(k)):

  R[t, k] <= R[t, i] + S[t, i]                 an input is computed or kept
  S[t+1, i] <= S[t, i] + R[t, i]               only what was present can be kept
  FREE[t, i, k] <= R[t, k],  <= 1 - S[t+1, i],  <= 1 - R[t, j] for every later
                                               user j of i in the stage
  U[t, first] = constants + sum_i M_i S[t, i] + M_first R[t, first]
  U[t, next]  = U[t, k] - sum_i M_i FREE[t, i, k] + M_next R[t, next]
  U[t, k] <= budget
  S[T+1, o] = 1 for every output o             outputs are resident at the end

and the objective is the total compute, sum C_i R[t, i]. Cuts that exclude
only wasteful schedules help the solver: a stage recomputes or holds a value
only if it reads it or keeps it, and never recomputes a value it holds.
It is solved with HiGHS through `scipy.optimize.milp`.

Most of its rows and continuous variables are the memory within stages
(U, FREE), and they are what make HiGHS slow. So `_checkmate` leaves them
out at first, with one row per stage in their place (the moment its
frontier node runs), solves that relaxation, runs its solution as a stage
schedule, and adds the full memory rows of just the stages that overflow,
until the schedule fits: then it is Checkmate's optimum. The solutions
rarely overflow (a stage would have to recompute much at once), so one or
two solves usually do, each much faster than the full model.

Even so the MILP has on the order of n^2 binaries, beyond HiGHS for the
paper's logs (several hundred nodes). So `optimal` first solves a
relaxation with one binary per read of a value (`interval_bound`; seconds
even for those logs) and runs its decisions as a stage schedule: where the
schedule costs no more than the relaxation's bound, that proves it optimal
and the MILP is skipped. Else it refines that relaxation where the
schedule shows it wrong (Checkmate's own variables for those nodes only)
and tries again; then, on graphs of at most `MILP_MAX_BINARIES` binaries,
it solves the MILP in the time left. It reports the best schedule and the
best bound when the time limit comes first.

DTR's own runs at the budget are stage schedules too (`_StageRecorder`),
often the best known at tight budgets, where HiGHS's are poor: `optimal`
starts from the cheapest of them.

The graph is Checkmate's linear graph of the trace (`checkmate_graph`): one
node per storage a `CALL` creates, with its size and cost, and edges from the
storages its arguments live in. Constants (weights, inputs) are not nodes:
they are pinned, resident and counted in memory throughout.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Optional

from ..budget import BudgetLike, parse_budget
from ..runtime import Observer
from ..trace import ComputeStep, Program, Trace
from ._simulate import Baseline, as_trace, run_baseline, run_budget

STATUSES = ("optimal", "timeout", "infeasible")
METHODS = ("auto", "milp", "relaxation")
# Above this many binaries, "auto" does not build Checkmate's MILP. Up to it
# (traces of about 200 operators), with the refinement, it proves optima
# within a minute down to 0.7 to 0.5 of the peak (docs/simulator.md). Above
# it, HiGHS gets little done in a minute: on the U-Net log (130,000
# binaries) at 0.9 of its peak, 300 s gave a bound below the one the
# refinement proves in seconds.
MILP_MAX_BINARIES = 50_000
# Seconds the interval relaxation (`interval_bound`) may take at most.
INTERVAL_TIME_LIMIT = 10.0
# DTR's heuristics whose runs at the budget `optimal` reads as stage
# schedules (`_heuristic_schedule`): a schedule to beat from the start, and
# often the optimum at tight budgets, where the MILP's own are poor.
SEED_HEURISTICS = ("dtr_eq", "dtr_full", "lookahead")


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

    @property
    def ok(self) -> bool:
        """Whether a schedule was found (status "optimal", or "timeout" with an incumbent)."""
        return self.total_cost is not None

    def to_dict(self) -> dict[str, Any]:
        """The fields, for JSON."""
        return asdict(self)


# ------------------------------------------------------------------ the graph


@dataclass(frozen=True)
class CheckmateGraph:
    """Checkmate's linear graph of a trace, nodes in trace order (a topological order).

    Attributes:
      names: per node, the trace's name of the value.
      sizes: per node, bytes (0 for a view: it lives in another node's storage).
      costs: per node, compute cost; the outputs of one multi-output call
        share its cost equally, so the costs add up to the trace's compute.
      deps: per node, the nodes it reads (distinct, all earlier): the
        storages of its call's arguments, and for an argument that is a
        view, the storage it views too.
      outputs: nodes that must be resident at the end.
      constant_bytes: bytes of constants, resident throughout.
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    costs: tuple[float, ...]
    deps: tuple[tuple[int, ...], ...]
    outputs: tuple[int, ...]
    constant_bytes: int

    def __len__(self) -> int:
        return len(self.sizes)

    def users(self) -> list[list[int]]:
        """Per node, the nodes that read it, in order."""
        users: list[list[int]] = [[] for _ in self.sizes]
        for k, deps in enumerate(self.deps):
            for i in deps:
                users[i].append(k)
        return users

    def unconstrained_peak_bytes(self) -> int:
        """Peak memory of computing every node once, in order, each freed after its last use."""
        users = self.users()
        last_use = [max(u) if u else k for k, u in enumerate(users)]
        kept = set(self.outputs)
        frees: dict[int, list[int]] = {}
        for i, k in enumerate(last_use):
            if i not in kept:
                frees.setdefault(k, []).append(i)
        memory = peak = self.constant_bytes
        for k, size in enumerate(self.sizes):
            memory += size
            peak = max(peak, memory)
            memory -= sum(self.sizes[i] for i in frees.get(k, ()))
        return peak

    def milp_binaries(self) -> int:
        """Binaries (R and S) of Checkmate's MILP on this graph, without building it."""
        return _milp_binaries(self)

    def required_bytes(self) -> int:
        """The least budget any schedule needs: each node with its inputs, and the outputs together."""
        one_op = max((self.sizes[k] + sum(self.sizes[i] for i in deps) for k, deps in enumerate(self.deps)), default=0)
        outputs = sum(self.sizes[o] for o in self.outputs)
        return self.constant_bytes + max(one_op, outputs)


def checkmate_graph(program: Program) -> CheckmateGraph:
    """The linear graph of a lowered trace (`Trace.program`).

    Every output of a `ComputeStep` that is not a constant is a node; a view
    (`ALIAS` >= 0) is a 0-byte node whose readers also read the storage it
    views. `RELEASE`s are dropped: when to free is the MILP's decision.
    """
    node_of: dict[int, Optional[int]] = {}  # value -> its node, None for a constant
    root_of: dict[int, Optional[int]] = {}  # value -> the node of the storage it lives in
    names: list[str] = []
    sizes: list[int] = []
    costs: list[float] = []
    deps: list[tuple[int, ...]] = []
    constant_bytes = 0
    for step in program.steps:
        if not isinstance(step, ComputeStep):
            continue
        if step.constant:
            node_of[step.outputs[0]] = root_of[step.outputs[0]] = None
            constant_bytes += step.sizes[0]
            continue
        reads = []
        for value in step.inputs:
            reads += [node_of[value], root_of[value]]
        inputs = tuple(sorted({n for n in reads if n is not None}))
        for value, size, alias in zip(step.outputs, step.sizes, step.aliases):
            node = len(sizes)
            node_of[value] = node
            root_of[value] = root_of[step.inputs[alias]] if alias >= 0 else node
            names.append(program.value_names[value])
            sizes.append(size)
            costs.append(step.cost / len(step.outputs))
            deps.append(inputs)
    outputs = set()
    for value in program.outputs:
        outputs.update(n for n in (node_of[value], root_of[value]) if n is not None)
    return CheckmateGraph(tuple(names), tuple(sizes), tuple(costs), tuple(deps), tuple(sorted(outputs)), constant_bytes)


# -------------------------------------------------------------------- the MILP


class _Model:
    """Variables and sparse constraint rows of a MILP, in scipy's terms."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.objective: list[float] = []
        self.integer: list[int] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.values: list[float] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []

    def variable(self, lower: float, upper: float, cost: float = 0.0, integer: bool = False) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.objective.append(cost)
        self.integer.append(1 if integer else 0)
        return len(self.lower) - 1

    def constraint(self, terms: list[tuple[int, float]], lower: float, upper: float) -> None:
        row = len(self.row_lower)
        for col, value in terms:
            self.rows.append(row)
            self.cols.append(col)
            self.values.append(value)
        self.row_lower.append(lower)
        self.row_upper.append(upper)

    def solve(self, time_limit: Optional[float], rel_gap: float) -> Any:
        """HiGHS's solution (`scipy.optimize.milp`), within `rel_gap` of optimal or by `time_limit` seconds."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array

        matrix = csr_array(
            (self.values, (self.rows, self.cols)), shape=(len(self.row_lower), len(self.lower)), dtype=float
        )
        options: dict[str, Any] = {"disp": False, "mip_rel_gap": rel_gap}
        if time_limit is not None:
            options["time_limit"] = max(float(time_limit), 0.0)
        return milp(
            np.asarray(self.objective),
            integrality=np.asarray(self.integer),
            bounds=Bounds(np.asarray(self.lower), np.asarray(self.upper)),
            constraints=LinearConstraint(matrix, np.asarray(self.row_lower), np.asarray(self.row_upper)),
            options=options,
        )

    def size(self) -> dict[str, int]:
        """Variables, binaries and constraints, as `OptimalResult` reports them."""
        return {"variables": len(self.lower), "integer_variables": sum(self.integer), "constraints": len(self.row_lower)}


def _useful_until(graph: CheckmateGraph) -> list[int]:
    """Per node, the last stage in which it can be of use (n: after the end,
    for outputs). Recomputing or keeping it later is pointless, so the MILP
    leaves those variables out: a node is useful while a reader may still run."""
    n = len(graph)
    users = graph.users()
    outputs = set(graph.outputs)
    last = [0] * n
    for i in reversed(range(n)):
        last[i] = n if i in outputs else max([i, *(min(last[u], n - 1) for u in users[i])])
    return last


def _milp_binaries(graph: CheckmateGraph) -> int:
    """The binaries (R and S) of `_build`'s MILP, without building it."""
    n = len(graph)
    return sum(min(last, n - 1) - i + 1 + last - i for i, last in enumerate(_useful_until(graph)))


def _build(
    graph: CheckmateGraph, budget_bytes: int, stages: Optional[Iterable[int]] = None
) -> tuple[_Model, dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """The MILP of the module docstring, with its memory rows (U, FREE) for
    the given `stages` only (None: all of them, Checkmate's model).

    Every stage also gets one row for the moment its frontier node runs:
    constants, the node, its inputs and every earlier value kept into the
    next stage are resident then. That row is implied by the stage's memory
    rows but costs one row, not one per node, so without them the model is a
    relaxation whose solutions break the budget only while a stage
    recomputes (`_checkmate` adds those stages' rows and solves again).

    Returns:
      The model, and its R and S variables by (stage, node).
    """
    n = len(graph)
    sizes, costs, deps = graph.sizes, graph.costs, graph.deps
    users = graph.users()
    last = _useful_until(graph)
    model = _Model()
    R: dict[tuple[int, int], int] = {}
    S: dict[tuple[int, int], int] = {}
    for i in range(n):
        for t in range(i, min(last[i], n - 1) + 1):
            R[t, i] = model.variable(1.0 if t == i else 0.0, 1.0, costs[i], integer=True)
        for t in range(i + 1, last[i] + 1):
            S[t, i] = model.variable(1.0 if t == n else 0.0, 1.0, integer=True)  # outputs: kept past the end

    for (t, k), r in R.items():
        for i in deps[k]:  # an input is computed in the stage or kept from the last one
            model.constraint([(r, 1.0), (R[t, i], -1.0), (S[t, i], -1.0)], -math.inf, 0.0)
    for (t, i), s in S.items():  # keep only what the previous stage had
        terms = [(s, 1.0), (R[t - 1, i], -1.0)]
        if (t - 1, i) in S:
            terms.append((S[t - 1, i], -1.0))
        model.constraint(terms, -math.inf, 0.0)
    # Cuts that remove only wasteful schedules, so the optimum stays: a stage
    # recomputes or holds a value only if it reads it or keeps it for the next.
    for (t, i), var in (*R.items(), *S.items()):
        if t == i or t == n:
            continue  # the frontier is always computed; outputs are held at the end
        readers = [(R[t, j], -1.0) for j in users[i] if j <= t and (t, j) in R]
        onward = [(S[t + 1, i], -1.0)] if (t + 1, i) in S else []
        model.constraint([(var, 1.0), *readers, *onward], -math.inf, 0.0)
    for (t, i), s in S.items():  # nor recomputes a value it holds
        if (t, i) in R:
            model.constraint([(s, 1.0), (R[t, i], 1.0)], -math.inf, 1.0)
    unit = _memory_unit(budget_bytes)
    sizes = [size / unit for size in sizes]
    constant_memory = graph.constant_bytes / unit
    for t in range(n):  # the frontier's moment
        inputs = set(deps[t])
        required = constant_memory + sizes[t] + sum(sizes[i] for i in inputs)
        held = [(S[t + 1, i], sizes[i]) for i in range(t) if i not in inputs and sizes[i] and (t + 1, i) in S]
        if held:
            model.constraint(held, -math.inf, budget_bytes / unit - required)
    for t in range(n) if stages is None else sorted(set(stages)):
        computed = [k for k in range(t + 1) if (t, k) in R]
        kept = [(S[t, i], sizes[i]) for i in range(t) if (t, i) in S and sizes[i]]
        previous: Optional[int] = None
        frees: list[tuple[int, float]] = []
        for k in computed:
            memory = model.variable(0.0, budget_bytes / unit)
            if previous is None:  # the stage starts with the constants and what was kept
                terms = [(memory, 1.0), *((s, -float(size)) for s, size in kept)]
                model.constraint([*terms, (R[t, k], -float(sizes[k]))], constant_memory, constant_memory)
            else:
                terms = [(memory, 1.0), (previous, -1.0), *frees, (R[t, k], -float(sizes[k]))]
                model.constraint(terms, 0.0, 0.0)
            frees = []
            for i in (*deps[k], k):  # what may be freed once k has run
                if not sizes[i]:
                    continue
                free = model.variable(0.0, 1.0)
                model.constraint([(free, 1.0), (R[t, k], -1.0)], -math.inf, 0.0)
                if (t + 1, i) in S:
                    model.constraint([(free, 1.0), (S[t + 1, i], 1.0)], -math.inf, 1.0)
                for j in users[i]:
                    if k < j <= t and (t, j) in R:
                        model.constraint([(free, 1.0), (R[t, j], 1.0)], -math.inf, 1.0)
                frees.append((free, float(sizes[i])))
            previous = memory
    return model, R, S


def _memory_unit(budget_bytes: int) -> float:
    """Bytes per unit of memory in the solver's models: a ten-thousandth of
    the budget. Coefficients in bytes (up to 1e10 for the paper's logs) are
    beyond HiGHS's tolerances, and its presolve then calls feasible models
    infeasible."""
    return max(1.0, budget_bytes / 1e4)


# A stage schedule: per stage, the nodes computed (in order) and the nodes held after it.
Stages = list[tuple[tuple[int, ...], frozenset[int]]]


@dataclass(frozen=True)
class _Intervals:
    """The interval relaxation's solution: its bound and its decisions.

    `bound` is a lower bound on the optimum only for the unpriced relaxation
    (`_solve_intervals(..., price_inputs=False)`). `dropped[i]` lists, for a
    node i outside `refined`, the reads (node indices; `len(graph)` for the
    end) before which it is absent since the read before them. For a node i
    in `refined`, `kept[i]` lists the stages it is kept into, and
    `recomputed[t]` the refined nodes stage t recomputes."""

    bound: float
    dropped: dict[int, set[int]]
    refined: frozenset[int] = frozenset()
    kept: dict[int, set[int]] = field(default_factory=dict)
    recomputed: dict[int, set[int]] = field(default_factory=dict)


def interval_bound(
    graph: CheckmateGraph,
    budget_bytes: int,
    time_limit: Optional[float] = INTERVAL_TIME_LIMIT,
    refined: Iterable[int] = (),
) -> float:
    """A lower bound on the optimum's total compute, from a small relaxation.

    Look at the moments the nodes are first computed (in order, as in every
    frontier-advancing schedule and in every DTR run). Between two reads of
    a value (or its computation and its first read, or its last read and
    the end, for an output) it is either resident at each of these moments
    or, if absent at one, computed again before the next read — once per
    such interval at least, since the intervals do not overlap. At the
    moment node t runs, memory holds the constants, node t and its inputs,
    and every value in an interval around t that was not dropped. Choosing
    the intervals to drop at least cost (a knapsack per moment, shared
    variables) bounds the optimum from below: recomputing a value is
    charged once, and what that recomputation itself needs (its inputs,
    their memory) is left out. The relaxation has one binary per read, not
    per stage and node, so HiGHS solves it for the paper's logs in seconds;
    on a time limit, its own dual bound is still a bound.

    Nodes in `refined` are modelled as Checkmate does instead, stage by
    stage (kept into stage t, recomputed in stage t; a recomputation needs
    its refined inputs computed or kept in that stage), with memory counted
    only at the moment each node is first computed. That still bounds the
    optimum from below for any set (a recomputation's transient memory and
    its inputs outside the set are left out), and more tightly the more
    nodes are refined; `optimal` refines the nodes its schedules show the
    bound missing.
    """
    return _solve_intervals(graph, budget_bytes, time_limit, refined=frozenset(refined)).bound


def _solve_intervals(
    graph: CheckmateGraph,
    budget_bytes: int,
    time_limit: Optional[float] = INTERVAL_TIME_LIMIT,
    rel_gap: float = 1e-4,
    price_inputs: bool = False,
    refined: frozenset[int] = frozenset(),
) -> _Intervals:
    """The interval relaxation (see `interval_bound`). With `price_inputs`,
    dropping a value also costs recomputing its inputs that are gone by
    then (read for the last time before the interval), recursively: no
    longer a bound, but decisions whose schedule costs what they predict
    more often."""
    n = len(graph)
    baseline = float(sum(graph.costs))
    users = graph.users()
    outputs = set(graph.outputs)
    refined = frozenset(i for i in refined if graph.sizes[i])
    unit = _memory_unit(budget_bytes)
    model = _Model()
    intervals: list[tuple[int, int, int]] = []  # (variable, node, the read it ends at)
    open_at: list[list[tuple[int, float]]] = [[] for _ in range(n)]  # moment -> (variable, size)
    for i in range(n):
        if not graph.sizes[i] or i in refined:
            continue
        reads = sorted(set(users[i])) + ([n] if i in outputs else [])
        previous = i
        for read in reads:
            if read - previous > 1:  # a moment in between: the value may be absent there
                extra = _gone_inputs_cost(graph, users, outputs, i, previous) if price_inputs else 0.0
                var = model.variable(0.0, 1.0, graph.costs[i] + extra, integer=True)
                intervals.append((var, i, read))
                for t in range(previous + 1, read):
                    open_at[t].append((var, graph.sizes[i] / unit))
            previous = read
    kept, recompute = _refined_variables(model, graph, users, outputs, refined)
    for t in range(n):
        required = graph.constant_bytes + graph.sizes[t] + sum(graph.sizes[i] for i in graph.deps[t])
        optional = sum(size for _, size in open_at[t])
        inputs = set(graph.deps[t])
        held = [(kept[i, t + 1], graph.sizes[i] / unit) for i in refined if i < t and i not in inputs and (i, t + 1) in kept]
        excess = required / unit + optional - budget_bytes / unit
        if excess <= 0 and not held:
            continue  # everything fits at this moment
        if not open_at[t] and not held:
            return _Intervals(math.inf, {}, refined)  # some moment cannot fit even with everything optional dropped
        # dropped intervals free their size, values held past the stage take theirs
        model.constraint([*((var, size) for var, size in open_at[t]), *((k, -size) for k, size in held)], excess, math.inf)
    if not model.row_lower:
        return _Intervals(baseline, {}, refined)  # every moment fits with everything kept
    solution = model.solve(time_limit, rel_gap)
    if solution.status == 2:
        return _Intervals(math.inf, {}, refined)
    # The dual bound, not the schedule found: HiGHS stops within a gap of it.
    bound = getattr(solution, "mip_dual_bound", None)
    bound = baseline + (max(float(bound), 0.0) if bound is not None and math.isfinite(bound) else 0.0)
    decisions = _Intervals(bound, {}, refined)
    if solution.x is not None:
        for var, i, read in intervals:
            if solution.x[var] > 0.5:
                decisions.dropped.setdefault(i, set()).add(read)
        for (i, t), var in kept.items():
            if solution.x[var] > 0.5:
                decisions.kept.setdefault(i, set()).add(t)
        for (i, t), var in recompute.items():
            if solution.x[var] > 0.5:
                decisions.recomputed.setdefault(t, set()).add(i)
    return decisions


def _refined_variables(
    model: _Model, graph: CheckmateGraph, users: list[list[int]], outputs: set[int], refined: frozenset[int]
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """Checkmate's variables and constraints for the refined nodes (see
    `interval_bound`): kept[i, t] (i held from stage t-1 into stage t) and
    recompute[i, t]. A refined node lives until its last read, or as long as
    a refined reader may be recomputed (later than that is never of use);
    outputs until the end."""
    n = len(graph)
    horizon: dict[int, int] = {}
    for i in sorted(refined, reverse=True):
        later = [min(horizon[j], n - 1) for j in users[i] if j in refined]
        horizon[i] = n if i in outputs else max([i, *users[i], *later])
    kept: dict[tuple[int, int], int] = {}
    recompute: dict[tuple[int, int], int] = {}
    for i in sorted(refined):
        for t in range(i + 1, horizon[i] + 1):
            kept[i, t] = model.variable(1.0 if t == n else 0.0, 1.0, integer=True)  # outputs: held at the end
            if t < n:
                recompute[i, t] = model.variable(0.0, 1.0, graph.costs[i], integer=True)
        for t in range(i + 2, horizon[i] + 1):  # held only if held or computed in the stage before
            model.constraint([(kept[i, t], 1.0), (kept[i, t - 1], -1.0), (recompute[i, t - 1], -1.0)], -math.inf, 0.0)
        for t in set(users[i]):  # present where read
            model.constraint([(kept[i, t], 1.0), (recompute[i, t], 1.0)], 1.0, math.inf)
    for (i, t), var in recompute.items():  # recomputing needs the refined inputs in the stage
        for u in graph.deps[i]:
            if u in refined:
                model.constraint([(var, 1.0), (kept[u, t], -1.0), (recompute[u, t], -1.0)], -math.inf, 0.0)
    return kept, recompute


def _gone_inputs_cost(graph: CheckmateGraph, users: list[list[int]], outputs: set[int], node: int, after: int) -> float:
    """The compute of recomputing `node`'s inputs that nothing reads after
    moment `after` (so a schedule following the relaxation has freed them),
    and recursively theirs."""
    total, seen, stack = 0.0, set(), list(graph.deps[node])
    while stack:
        u = stack.pop()
        if u in seen or u in outputs or not graph.sizes[u] or max(users[u], default=u) > after:
            continue
        seen.add(u)
        total += graph.costs[u]
        stack.extend(graph.deps[u])
    return total


def _schedule_from_intervals(
    graph: CheckmateGraph, budget_bytes: int, decisions: _Intervals, hold_recomputed: bool = False
) -> Optional[Stages]:
    """The stage schedule the interval relaxation's decisions describe, if it fits.

    Stage t computes node t, first recomputing those of its inputs that are
    absent (and, recursively, theirs) and the refined nodes the decisions
    recompute there, in graph order: one of Checkmate's stage schedules.
    After a stage, a value stays resident until its next read unless the
    relaxation dropped that interval (or it has no read left); a refined
    value stays while the decisions keep it, and leaves at the start of a
    stage that does not. The last stage also brings back dropped outputs.
    The relaxation leaves out what recomputing needs, so this schedule costs
    at least its bound; where it costs no more, it is optimal. With
    `hold_recomputed`, a value recomputed only as the input of another
    recomputation stays until its own next read, where it would otherwise
    be computed again: one computation instead of two, if the memory allows.

    Returns:
      Per stage, the nodes computed (in order) and the nodes held after it;
      None if some computation would exceed the budget.
    """
    return _realize(graph, budget_bytes, decisions, hold_recomputed).stages


@dataclass(frozen=True)
class _Realized:
    """A relaxation's decisions run as a stage schedule (`_realize`).

    `stages` is None when some stage does not fit; `overflowing` lists those
    stages (each run on past the budget, so all are found at once) and
    `overflow` the nodes the first of them computes."""

    stages: Optional[Stages]
    overflow: tuple[int, ...] = ()
    overflowing: tuple[int, ...] = ()


def _realize(graph: CheckmateGraph, budget_bytes: int, decisions: _Intervals, hold_recomputed: bool) -> _Realized:
    """`_schedule_from_intervals`, and the stages that did not fit (if some did not)."""
    n = len(graph)
    users = graph.users()
    outputs = set(graph.outputs)
    reads = [sorted(set(u)) + ([n] if i in outputs else []) for i, u in enumerate(users)]
    refined = decisions.refined
    resident: set[int] = set()
    memory = graph.constant_bytes
    stages: Stages = []
    overflowing: list[int] = []
    overflow: tuple[int, ...] = ()

    def keep_after(i: int, t: int, recursive: bool) -> bool:
        """Whether value i stays resident from stage t into stage t+1."""
        if not graph.sizes[i]:
            return True  # views take no memory
        if i in refined:  # as the decisions keep it (outputs stay at the end, with or without decisions)
            return t + 1 in decisions.kept.get(i, ()) or (t == n - 1 and i in outputs)
        following = [r for r in reads[i] if r > t]
        if not following:
            return False
        return following[0] == t + 1 or following[0] not in decisions.dropped.get(i, ()) or (hold_recomputed and recursive)

    for t in range(n):
        wanted = (*graph.deps[t], *outputs - {t}) if t == n - 1 else graph.deps[t]
        recomputed: set[int] = set()
        stack = [i for i in (*wanted, *decisions.recomputed.get(t, ())) if i not in resident]
        while stack:
            i = stack.pop()
            if i not in recomputed:
                recomputed.add(i)
                stack.extend(j for j in graph.deps[i] if j not in resident)
        order = (*sorted(recomputed), t)
        last_read = {i: k for k in order for i in graph.deps[k]}
        for i in [i for i in resident if i in refined and i not in last_read]:
            if not keep_after(i, t, False):  # let go before the stage: nothing in it reads it
                resident.discard(i)
                memory -= graph.sizes[i]
        for k in order:
            if memory + graph.sizes[k] > budget_bytes and not (overflowing and overflowing[-1] == t):
                overflowing.append(t)
                overflow = overflow or order
            memory += graph.sizes[k]
            resident.add(k)
            for i in {*graph.deps[k], k}:  # free what this stage no longer reads and does not keep
                if i in resident and last_read.get(i, -1) <= k and not keep_after(i, t, i in recomputed and i not in wanted):
                    resident.discard(i)
                    memory -= graph.sizes[i]
        stages.append((order, frozenset(resident)))
    if not outputs <= resident and not (overflowing and overflowing[-1] == n - 1):
        overflowing.append(n - 1)
        overflow = overflow or (n - 1,)
    return _Realized(None if overflowing else stages, overflow, tuple(overflowing))


def _cheapest_schedule(
    graph: CheckmateGraph, budget_bytes: int, decisions: _Intervals
) -> Optional[tuple[float, int]]:
    """The cheaper of the two schedules for these decisions (holding values
    recomputed only as inputs, or not): total compute and recomputations."""
    schedules = (_schedule_from_intervals(graph, budget_bytes, decisions, hold) for hold in (True, False))
    return min((_cost_of(graph, stages) for stages in schedules if stages is not None), default=None)


class _StageRecorder(Observer):
    """Reads a DTR run as Checkmate's stage decisions (`_Intervals`, every node refined).

    First computations come in trace order, one operator after another, so
    the run falls into Checkmate's stages: stage t is node t's first
    computation and the rematerializations just before it. The recorder
    notes the nodes each stage recomputes and, when a stage ends, the nodes
    resident then (kept into the next stage, if still of use). Nodes are
    numbered as `checkmate_graph` numbers them: an operator's outputs in
    turn, in the order operators first run.
    """

    def __init__(self, useful_until: list[int]) -> None:
        self.useful_until = useful_until
        self.nodes: dict[int, range] = {}  # operator id -> its nodes
        self.tensors: list[Any] = []  # node -> its tensor
        self.live: set[int] = set()  # nodes that were resident at the last stage's end, or computed since
        self.pending: list[int] = []  # operators rematerialized since the last first computation
        self.kept: dict[int, set[int]] = {}
        self.recomputed: dict[int, set[int]] = {}

    def on_compute(self, op: Any, cost: float, rematerialization: bool, clock: float) -> None:
        if rematerialization:
            self.pending.append(op.id)
            self.live.update(self.nodes[op.id])
            return
        nodes = range(len(self.tensors), len(self.tensors) + len(op.outputs))
        self.nodes[op.id] = nodes
        self.tensors.extend(op.outputs)
        self._stage_ends(nodes)

    def _stage_ends(self, stages: range) -> None:
        """The stages of one operator's outputs have run: record them."""
        if not stages:
            return  # an operator without outputs is no stage: its rematerializations join the next
        recomputed = self._take_pending()
        if recomputed:
            self.recomputed.setdefault(stages[0], set()).update(recomputed)
        for i in recomputed:  # resident when the last stage ended, evicted since: not kept after all
            self.kept.get(i, set()).discard(stages[0])
        # An operator's own outputs are not marked resident until it returns.
        self.live = {i for i in (*self.live, *stages) if i in stages or self.tensors[i].storage.resident}
        for t in stages:
            for i in self.live:
                if i <= t and self.useful_until[i] > t:
                    self.kept.setdefault(i, set()).add(t + 1)

    def _take_pending(self) -> set[int]:
        """The nodes of the operators rematerialized since the last stage ended, now handed to a stage."""
        nodes = {i for op in self.pending for i in self.nodes[op]}
        self.pending = []
        return nodes

    def decisions(self, graph: CheckmateGraph) -> Optional[_Intervals]:
        """The run's decisions; None if its operators are not the graph's nodes."""
        if len(self.tensors) != len(graph):
            return None
        recomputed = self._take_pending()
        if recomputed:  # outputs brought back after the last operator: in the last stage
            self.recomputed.setdefault(len(graph) - 1, set()).update(recomputed)
        return _Intervals(0.0, {}, frozenset(range(len(graph))), self.kept, self.recomputed)


def _heuristic_schedule(
    trace: Trace, graph: CheckmateGraph, baseline: Baseline, budget_bytes: int
) -> Optional[tuple[float, int, str]]:
    """The cheapest of `SEED_HEURISTICS`' runs at the budget, as stage schedules.

    A run is one of Checkmate's schedules as long as it rematerializes each
    operator at most once between two first computations, and then the
    schedule (`_realize` of `_StageRecorder`'s decisions) costs what the run
    did or less. So `optimal` is never worse than these heuristics.

    Returns:
      Total compute, recomputations and the heuristic; None if no run
      finished or fits as a stage schedule.
    """
    useful_until = _useful_until(graph)
    best: Optional[tuple[float, int, str]] = None
    for heuristic in SEED_HEURISTICS:
        recorder = _StageRecorder(useful_until)
        if not run_budget(trace, baseline, budget_bytes, heuristic, observers=[recorder]).ok:
            continue
        decisions = recorder.decisions(graph)
        if decisions is None:
            return None
        schedule = _cheapest_schedule(graph, budget_bytes, decisions)
        if schedule is not None and (best is None or schedule[0] < best[0]):
            best = (*schedule, heuristic)
    return best


def _refine(
    graph: CheckmateGraph,
    budget_bytes: int,
    decisions: _Intervals,
    schedules: list[_Realized],
    best: Optional[tuple[float, int]],
    deadline: Optional[float],
    rel_gap: float,
) -> tuple[float, Optional[tuple[float, int]], int, int]:
    """Tighten the interval relaxation where its schedules show it wrong.

    `schedules` are the first decisions' realizations (`_schedules`), `best` the best known.
    Each round runs the current decisions as a schedule (and those of the
    relaxation that prices recomputation inputs, refined alike) and refines (see
    `interval_bound`) the nodes it recomputes more often than the relaxation
    charged, with the recomputations that read them — or, when it does not
    fit, the nodes of the stage that overflows and their inputs — then
    solves again. Every round's bound is a bound and every schedule a
    schedule, so the best of each is kept. It stops when a schedule meets
    the bound, when there is nothing left to refine, or at `deadline`
    (`time.perf_counter()` seconds).

    Returns:
      The best bound (inf: no schedule fits), the best schedule's compute and
      recomputations, the rounds solved and the nodes refined.
    """
    bound, refined, rounds = decisions.bound, frozenset(), 0

    def remaining() -> Optional[float]:
        return None if deadline is None else deadline - time.perf_counter()

    while best is None or best[0] > bound * (1 + rel_gap):
        wanted = _missed_by(graph, decisions, schedules) - refined
        left = remaining()
        if not wanted or (left is not None and left <= 0):
            break
        refined |= wanted
        decisions = _solve_intervals(graph, budget_bytes, left, rel_gap, refined=refined)
        rounds += 1
        if decisions.bound == math.inf and best is not None:
            break  # HiGHS's "infeasible" despite a schedule that fits: a numerical failure, not a bound
        bound = max(bound, decisions.bound)
        if bound == math.inf:
            break
        left = remaining()
        limit = INTERVAL_TIME_LIMIT if left is None else min(INTERVAL_TIME_LIMIT, max(left, 0.0))
        found, schedules = _schedules(graph, budget_bytes, decisions, bound, rel_gap, limit)
        best = min((s for s in (best, found) if s is not None), default=None)
    return bound, best, rounds, len(refined)


def _schedules(
    graph: CheckmateGraph, budget_bytes: int, decisions: _Intervals, bound: float, rel_gap: float, time_limit: float
) -> tuple[Optional[tuple[float, int]], list[_Realized]]:
    """The cheapest schedule these decisions give (compute, recomputations)
    or, where it does not meet `bound`, the cheaper with that of the
    relaxation that prices what recomputing needs (same refined nodes;
    often cheaper); and the decisions' own two realizations (`_realize`,
    not holding and holding values recomputed only as inputs)."""
    realized = [_realize(graph, budget_bytes, decisions, hold) for hold in (False, True)]
    best = min((_cost_of(graph, r.stages) for r in realized if r.stages is not None), default=None)
    if best is None or best[0] > bound * (1 + rel_gap):
        priced = _solve_intervals(graph, budget_bytes, time_limit, rel_gap, price_inputs=True, refined=decisions.refined)
        other = _cheapest_schedule(graph, budget_bytes, priced)
        best = min((s for s in (best, other) if s is not None), default=None)
    return best, realized


def _missed_by(
    graph: CheckmateGraph, decisions: _Intervals, schedules: list[_Realized]
) -> frozenset[int]:
    """The nodes whose cost or memory the `schedules` realized from these
    decisions show the relaxation missing (see `_refine`)."""
    fitting = [r.stages for r in schedules if r.stages is not None]
    if not fitting:
        overflow = schedules[0].overflow
        return frozenset(i for k in overflow for i in (k, *graph.deps[k]) if graph.sizes[i])
    stages = min(fitting, key=lambda s: _cost_of(graph, s))
    charged = {i: len(reads) for i, reads in decisions.dropped.items()}
    for nodes in decisions.recomputed.values():
        for i in nodes:
            charged[i] = charged.get(i, 0) + 1
    computed: dict[int, int] = {}
    for t, (order, _) in enumerate(stages):
        for k in order[:-1]:
            computed[k] = computed.get(k, 0) + 1
    missed = {k for k, count in computed.items() if count > charged.get(k, 0)}
    readers = {k for order, _ in stages for k in order[:-1] if missed.intersection(graph.deps[k])}
    return frozenset(i for i in missed | readers if graph.sizes[i])


def _cost_of(graph: CheckmateGraph, stages: Stages) -> tuple[float, int]:
    """Total compute of a stage schedule, and its computations beyond the first of each node."""
    computed = [k for order, _ in stages for k in order]
    return float(sum(graph.costs[k] for k in computed)), len(computed) - len(graph)


@dataclass(frozen=True)
class _Solved:
    """What `_checkmate` found: the status, the best schedule's compute and
    recomputations (None: none found), a lower bound, and the last model's size."""

    status: str
    best: Optional[tuple[float, int]]
    bound: float
    rounds: int
    stages_checked: int
    message: str
    solver: dict[str, int]


def _checkmate(
    graph: CheckmateGraph,
    budget_bytes: int,
    deadline: Optional[float],
    rel_gap: float,
    lazy: bool = True,
) -> _Solved:
    """Checkmate's MILP, solved with its memory rows added where needed.

    Most of the MILP's rows and continuous variables track memory inside
    each stage (U, FREE), and they make HiGHS slow: on `rnn(2, 32, 8, 64)`
    at ratio 0.6 of its peak it takes 7 minutes with every row, 1.5 s
    without. So the first model has only the frontier's row per stage (see
    `_build`), a relaxation of Checkmate's; its solution runs as a stage
    schedule (`_realize`), and every stage that breaks the budget gets its
    memory rows for the next solve. A solution whose schedule fits is
    Checkmate-feasible and optimal for a relaxation, so optimal for
    Checkmate; every round's dual bound is a bound. `lazy=False` builds
    every stage's rows at once (Checkmate's model as published).
    """
    n = len(graph)
    checked: set[int] = set()
    bound, rounds, nodes = 0.0, 0, 0
    refined = frozenset(range(n))
    while True:
        model, R, S = _build(graph, budget_bytes, checked if lazy else None)
        left = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
        solution = model.solve(left, rel_gap)
        rounds += 1
        nodes += int(getattr(solution, "mip_node_count", 0) or 0)
        if solution.status not in (0, 1, 2):
            raise RuntimeError(f"HiGHS failed on the rematerialization MILP: {solution.message}")
        dual = getattr(solution, "mip_dual_bound", None)
        if solution.status != 2 and dual is not None and math.isfinite(dual):
            bound = max(bound, float(dual))
        solver = {**model.size(), "solver_nodes": nodes}
        solved = _Solved("timeout", None, bound, rounds, len(checked) if lazy else n, solution.message, solver)
        if solution.status == 2:
            return replace(solved, status="infeasible")
        if solution.x is None:
            return solved
        decisions = _Intervals(bound, {}, refined)
        for (t, i), var in S.items():
            if solution.x[var] > 0.5:
                decisions.kept.setdefault(i, set()).add(t)
        for (t, i), var in R.items():
            if t != i and solution.x[var] > 0.5:
                decisions.recomputed.setdefault(t, set()).add(i)
        realized = _realize(graph, budget_bytes, decisions, hold_recomputed=False)
        if realized.stages is not None:
            best = _cost_of(graph, realized.stages)
            optimum = solution.status == 0 or best[0] <= bound * (1 + rel_gap)
            return replace(solved, status="optimal" if optimum else "timeout", best=best)
        if solution.status != 0 or not lazy:
            return solved
        if checked.issuperset(realized.overflowing):  # its rows are in the model: tolerances, not the model
            return replace(solved, message=f"a stage overflows despite its memory rows; {solution.message}")
        checked.update(realized.overflowing)


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
) -> OptimalResult:
    """The least total compute of any rematerialization schedule of `trace` under `budget`.

    Solves Checkmate's MILP (Jain et al., MLSys 2020; see this module's
    docstring) on the trace's linear graph with HiGHS, unless a relaxation's
    schedule already meets the relaxation's lower bound (then `variables` is
    0 and `message` says so). The relaxation (`interval_bound`) is solved
    first; where its schedule falls short, the nodes it misses are refined
    round by round, each round's bound a bound and its schedule a schedule,
    and then, if the MILP is small enough, it is solved in the time left.
    With its memory rows added only where needed (`_checkmate`), HiGHS
    proves optima within a minute for traces of up to about two hundred
    operators down to budgets of 0.7 to 0.5 of their peak, depending on
    the model (and every budget of the 60-operator `rnn(2, 32, 8, 64)`,
    which the refinement alone leaves open at 0.6 and 0.5); at tighter
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
    or less (`_heuristic_schedule`), and the optimum bounds its compute
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
        `_checkmate`); its answer is Checkmate's.

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
        import scipy.optimize  # noqa: F401  (checked here, used by `_Model.solve`)
    except ImportError as err:  # scipy is an optional dependency
        raise ImportError(
            "jdtr.optimal solves a MILP with scipy's HiGHS, but scipy is not installed: "
            "pip install scipy (or pip install 'jdtr[optimal]')"
        ) from err
    start = time.perf_counter()
    trace = as_trace(trace)
    graph = checkmate_graph(trace.program)
    unconstrained = run_baseline(trace.program)
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

    seed: Optional[tuple[float, int, str]] = None  # the best heuristic's run, once known

    def result(
        status: str,
        message: str,
        total: Optional[float] = None,
        bound: Optional[float] = None,
        recomputations: Optional[int] = None,
        **solver: int,
    ) -> OptimalResult:
        if seed is not None and total is not None and total == seed[0]:
            message += f"; the schedule is {seed[2]}'s run"
        return OptimalResult(
            status=status,
            total_cost=total,
            overhead=None if total is None else (total / baseline if baseline > 0 else 1.0),
            bound=bound,
            recomputations=recomputations,
            solve_time_s=time.perf_counter() - start,
            message=message,
            **{"variables": 0, "integer_variables": 0, "constraints": 0, "solver_nodes": 0, **solver},
            **facts,
        )

    if facts["required_bytes"] > budget_bytes:
        return result("infeasible", f"no schedule fits: it needs at least {facts['required_bytes']} bytes")
    if not len(graph):
        return result("optimal", "nothing to compute", 0.0, 0.0, 0)
    intervals = _solve_intervals(graph, budget_bytes, rel_gap=rel_gap)
    relaxed = intervals.bound
    if relaxed == math.inf:
        return result("infeasible", "no schedule fits: some step's values alone exceed the budget")
    # The relaxation's decisions, run as a schedule: where that schedule
    # costs no more than the relaxation's bound, it is optimal, and the
    # large MILP is not needed; else it is a schedule the MILP must beat.
    realized, schedules = _schedules(graph, budget_bytes, intervals, relaxed, rel_gap, INTERVAL_TIME_LIMIT)
    # DTR's own runs at this budget are stage schedules too, often better
    # than the relaxations' at tight budgets: the schedule to beat.
    seed = _heuristic_schedule(trace, graph, unconstrained, budget_bytes)
    if seed is not None and (realized is None or seed[0] < realized[0]):
        realized = seed[:2]
    if realized is not None and realized[0] <= relaxed * (1 + rel_gap):
        return result(
            "optimal", "the interval relaxation's bound proves a schedule optimal", realized[0],
            min(relaxed, realized[0]), realized[1],
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
        relaxed, realized, rounds, refined = _refine(graph, budget_bytes, intervals, schedules, realized, limit, rel_gap)
        if relaxed == math.inf:
            return result("infeasible", "no schedule fits: the refined relaxation has no solution")
        done = f"{rounds} round{'s' if rounds != 1 else ''} of refinement, {refined} nodes refined"
        if realized is not None and realized[0] <= relaxed * (1 + rel_gap):
            return result(
                "optimal", f"the refined relaxation's bound proves a schedule optimal ({done})", realized[0],
                min(relaxed, realized[0]), realized[1],
            )
        if not solve_milp:
            why = "method='relaxation'" if method == "relaxation" else (
                f"Checkmate's MILP would have {binaries:,} binaries (more than {MILP_MAX_BINARIES:,}): not built"
            )
            total, recomputations = realized if realized is not None else (None, None)
            return result("timeout", f"{why}; {done}", total, relaxed, recomputations)
    solved = _checkmate(graph, budget_bytes, deadline, rel_gap)
    rows = f"memory rows for {solved.stages_checked} of {len(graph)} stages, {solved.rounds} solve{'s' if solved.rounds != 1 else ''}"
    message = f"Checkmate's MILP ({rows}): {solved.message}" + (f"; before it, {done}" if done else "")
    if solved.status == "infeasible":
        if realized is not None:  # HiGHS's "infeasible" despite a schedule that fits: numerical, not a proof
            return result(
                "timeout", f"HiGHS called a model with a schedule infeasible ({rows})", realized[0], relaxed,
                realized[1], **solved.solver,
            )
        return result("infeasible", message, **solved.solver)
    bound = max(solved.bound, relaxed)
    best = min((s for s in (solved.best, realized) if s is not None), default=None)
    status = solved.status
    if best is not None and best[0] <= bound * (1 + rel_gap):
        status = "optimal"  # the relaxation proves the schedule found optimal
    if best is None:
        return result(status, message, bound=bound, **solved.solver)
    if status == "optimal":
        bound = min(bound, best[0])
    return result(status, message, best[0], bound, best[1], **solved.solver)
