"""Checkmate's MILP (Jain et al., MLSys 2020, §4), with memory rows added lazily.

Most of its rows and continuous variables are the memory within stages
(U, FREE), and they are what make HiGHS slow. So `checkmate` leaves them
out at first, with one row per stage in their place (the moment its
frontier node runs), solves that relaxation, runs its solution as a stage
schedule, and adds the full memory rows of just the stages that overflow,
until the schedule fits: then it is Checkmate's optimum.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Iterable, Optional

from .graph import CheckmateGraph, Intervals, Scheduled, useful_until
from .model import UNLIMITED, Model, WorkLimit, memory_unit
from .stages import cost_of, realize


# (traces of about 200 operators), with the refinement, it proves optima
# within a minute down to 0.7 to 0.5 of the peak (docs/simulator.md). Above
# it, HiGHS gets little done in a minute: on the U-Net log (130,000
# binaries) at 0.9 of its peak, 300 s gave a bound below the one the
# refinement proves in seconds.
MILP_MAX_BINARIES = 50_000

# -------------------------------------------------------------------- the MILP







def build_model(
    graph: CheckmateGraph, budget_bytes: int, stages: Optional[Iterable[int]] = None
) -> tuple[Model, dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """The MILP of the module docstring, with its memory rows (U, FREE) for
    the given `stages` only (None: all of them, Checkmate's model).

    Every stage also gets one row for the moment its frontier node runs:
    constants, the node, its inputs and every earlier value kept into the
    next stage are resident then. That row is implied by the stage's memory
    rows but costs one row, not one per node, so without them the model is a
    relaxation whose solutions break the budget only while a stage
    recomputes (`checkmate` adds those stages' rows and solves again).

    Returns:
      The model, and its R and S variables by (stage, node).
    """
    n = len(graph)
    sizes, costs, deps = graph.sizes, graph.costs, graph.deps
    users = graph.users()
    last = useful_until(graph)
    model = Model()
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
    unit = memory_unit(budget_bytes)
    sizes = [size / unit for size in sizes]
    constant_memory = graph.constant_bytes / unit
    for t in range(n):  # the frontier's moment
        inputs = set(deps[t])
        required = constant_memory + sizes[t] + graph.transient_bytes(t) / unit + sum(sizes[i] for i in inputs)
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
            if graph.transient_bytes(k):  # while k runs it needs these too
                model.constraint([(memory, 1.0), (R[t, k], graph.transient_bytes(k) / unit)], -math.inf, budget_bytes / unit)
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





@dataclass(frozen=True)
class _Solved:
    """What `checkmate` found: the status, the best schedule's compute and
    recomputations (None: none found), a lower bound, and the last model's size."""

    status: str
    best: Optional[Scheduled]
    bound: float
    rounds: int
    stages_checked: int
    message: str
    solver: dict[str, int]


def checkmate(
    graph: CheckmateGraph,
    budget_bytes: int,
    deadline: Optional[float],
    rel_gap: float,
    lazy: bool = True,
    work: WorkLimit = UNLIMITED,
) -> _Solved:
    """Checkmate's MILP, solved with its memory rows added where needed.

    Most of the MILP's rows and continuous variables track memory inside
    each stage (U, FREE), and they make HiGHS slow: on `rnn(2, 32, 8, 64)`
    at ratio 0.6 of its peak it takes 7 minutes with every row, 1.5 s
    without. So the first model has only the frontier's row per stage (see
    `build_model`), a relaxation of Checkmate's; its solution runs as a stage
    schedule (`realize`), and every stage that breaks the budget gets its
    memory rows for the next solve. A solution whose schedule fits is
    Checkmate-feasible and optimal for a relaxation, so optimal for
    Checkmate; every round's dual bound is a bound. `work` limits each
    solve. `lazy=False` builds
    every stage's rows at once (Checkmate's model as published).
    """
    n = len(graph)
    checked: set[int] = set()
    bound, rounds, nodes = 0.0, 0, 0
    refined = frozenset(range(n))
    while True:
        model, R, S = build_model(graph, budget_bytes, checked if lazy else None)
        left = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
        solution = model.solve(left, rel_gap, work)
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
        decisions = Intervals(bound, {}, refined)
        for (t, i), var in S.items():
            if solution.x[var] > 0.5:
                decisions.kept.setdefault(i, set()).add(t)
        for (t, i), var in R.items():
            if t != i and solution.x[var] > 0.5:
                decisions.recomputed.setdefault(t, set()).add(i)
        realized = realize(graph, budget_bytes, decisions, hold_recomputed=False)
        if realized.stages is not None:
            best = cost_of(graph, realized.stages)
            optimum = solution.status == 0 or best.cost <= bound * (1 + rel_gap)
            return replace(solved, status="optimal" if optimum else "timeout", best=best)
        if solution.status != 0 or not lazy:
            return solved
        if checked.issuperset(realized.overflowing):  # its rows are in the model: tolerances, not the model
            return replace(solved, message=f"a stage overflows despite its memory rows; {solution.message}")
        checked.update(realized.overflowing)
