"""Refinement: the interval relaxation given Checkmate's variables where its schedule shows it wrong."""

from __future__ import annotations

import math
import time
from typing import Optional

from .graph import CheckmateGraph, Intervals, Scheduled
from .model import UNLIMITED, WorkLimit
from .relaxation import INTERVAL_TIME_LIMIT, solve_intervals
from .stages import Realized, cheapest_schedule, cost_of, realize


def refine(
    graph: CheckmateGraph,
    budget_bytes: int,
    decisions: Intervals,
    schedules: list[Realized],
    best: Optional[Scheduled],
    deadline: Optional[float],
    rel_gap: float,
    work: WorkLimit = UNLIMITED,
    max_rounds: Optional[int] = None,
    priced: bool = True,
    stop_at: float = math.inf,
) -> tuple[float, Optional[Scheduled], int, int]:
    """Tighten the interval relaxation where its schedules show it wrong.

    `schedules` are the first decisions' realizations (`schedules`), `best` the best known.
    Each round runs the current decisions as a schedule (and those of the
    relaxation that prices recomputation inputs, refined alike) and refines (see
    `interval_bound`) the nodes it recomputes more often than the relaxation
    charged, with the recomputations that read them — or, when it does not
    fit, the nodes of the stage that overflows and their inputs — then
    solves again. Every round's bound is a bound and every schedule a
    schedule, so the best of each is kept. It stops when a schedule meets
    the bound, when there is nothing left to refine, when the bound reaches
    `stop_at`, at `deadline` (`time.perf_counter()` seconds), or after
    `max_rounds`. `work`
    limits each of HiGHS's solves; `priced` also solves
    the relaxation that prices recomputation inputs for schedules.

    Returns:
      The best bound (inf: no schedule fits), the best schedule, the rounds
      solved and the nodes refined.
    """
    bound, refined, rounds = decisions.bound, frozenset(), 0

    def remaining() -> Optional[float]:
        return None if deadline is None else deadline - time.perf_counter()

    while (best is None or best.cost > bound * (1 + rel_gap)) and bound < stop_at:
        wanted = _missed_by(graph, decisions, schedules) - refined
        left = remaining()
        if not wanted or (left is not None and left <= 0) or (max_rounds is not None and rounds >= max_rounds):
            break
        refined |= wanted
        decisions = solve_intervals(graph, budget_bytes, left, rel_gap, refined=refined, work=work)
        rounds += 1
        if decisions.bound == math.inf and best is not None:
            break  # HiGHS's "infeasible" despite a schedule that fits: a numerical failure, not a bound
        bound = max(bound, decisions.bound)
        if bound == math.inf:
            break
        left = remaining()
        if left is not None:
            limit: Optional[float] = min(INTERVAL_TIME_LIMIT, max(left, 0.0))
        else:
            limit = None if work.bounded else INTERVAL_TIME_LIMIT
        found, schedules = realize_relaxations(graph, budget_bytes, decisions, bound, rel_gap, limit, work, priced)
        best = min((s for s in (best, found) if s is not None), default=None)
    return bound, best, rounds, len(refined)


def realize_relaxations(
    graph: CheckmateGraph,
    budget_bytes: int,
    decisions: Intervals,
    bound: float,
    rel_gap: float,
    time_limit: Optional[float],
    work: WorkLimit = UNLIMITED,
    priced: bool = True,
) -> tuple[Optional[Scheduled], list[Realized]]:
    """The cheapest schedule these decisions give (compute, recomputations)
    or, where it does not meet `bound`, the cheaper with that of the
    relaxation that prices what recomputing needs (same refined nodes;
    often cheaper; with `priced` only); and the decisions' own two realizations (`realize`,
    not holding and holding values recomputed only as inputs)."""
    realized = [realize(graph, budget_bytes, decisions, hold) for hold in (False, True)]
    best = min((cost_of(graph, r.stages) for r in realized if r.stages is not None), default=None)
    if priced and (best is None or best.cost > bound * (1 + rel_gap)):
        other_decisions = solve_intervals(
            graph, budget_bytes, time_limit, rel_gap, price_inputs=True, refined=decisions.refined, work=work
        )
        other = cheapest_schedule(graph, budget_bytes, other_decisions)
        best = min((s for s in (best, other) if s is not None), default=None)
    return best, realized


def _missed_by(
    graph: CheckmateGraph, decisions: Intervals, schedules: list[Realized]
) -> frozenset[int]:
    """The nodes whose cost or memory the `schedules` realized from these
    decisions show the relaxation missing (see `refine`)."""
    fitting = [r.stages for r in schedules if r.stages is not None]
    if not fitting:
        overflow = schedules[0].overflow
        return frozenset(i for k in overflow for i in (k, *graph.deps[k]) if graph.sizes[i])
    stages = min(fitting, key=lambda s: cost_of(graph, s))
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
