"""The interval relaxation: one binary per read of a value, solved in seconds.

Its bound is a lower bound on Checkmate's optimum; its decisions, run as a
stage schedule (`jdtr.offline.optimal.stages`), are an upper one. Nodes
where the two disagree can be *refined*: given Checkmate's own variables.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

from .graph import CheckmateGraph, Intervals
from .model import UNLIMITED, Model, WorkLimit, memory_unit


INTERVAL_TIME_LIMIT = 10.0




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
    return solve_intervals(graph, budget_bytes, time_limit, refined=frozenset(refined)).bound


def solve_intervals(
    graph: CheckmateGraph,
    budget_bytes: int,
    time_limit: Optional[float] = INTERVAL_TIME_LIMIT,
    rel_gap: float = 1e-4,
    price_inputs: bool = False,
    refined: frozenset[int] = frozenset(),
    work: WorkLimit = UNLIMITED,
) -> Intervals:
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
    unit = memory_unit(budget_bytes)
    model = Model()
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
        required = graph.constant_bytes + graph.sizes[t] + graph.transient_bytes(t) + sum(graph.sizes[i] for i in graph.deps[t])
        optional = sum(size for _, size in open_at[t])
        inputs = set(graph.deps[t])
        held = [(kept[i, t + 1], graph.sizes[i] / unit) for i in refined if i < t and i not in inputs and (i, t + 1) in kept]
        excess = required / unit + optional - budget_bytes / unit
        if excess <= 0 and not held:
            continue  # everything fits at this moment
        if not open_at[t] and not held:
            return Intervals(math.inf, {}, refined)  # some moment cannot fit even with everything optional dropped
        # dropped intervals free their size, values held past the stage take theirs
        model.constraint([*((var, size) for var, size in open_at[t]), *((k, -size) for k, size in held)], excess, math.inf)
    if not model.row_lower:
        return Intervals(baseline, {}, refined)  # every moment fits with everything kept
    solution = model.solve(time_limit, rel_gap, work)
    if solution.status == 2:
        return Intervals(math.inf, {}, refined)
    # The dual bound, not the schedule found: HiGHS stops within a gap of it.
    bound = getattr(solution, "mip_dual_bound", None)
    bound = baseline + (max(float(bound), 0.0) if bound is not None and math.isfinite(bound) else 0.0)
    decisions = Intervals(bound, {}, refined)
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
    model: Model, graph: CheckmateGraph, users: list[list[int]], outputs: set[int], refined: frozenset[int]
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
