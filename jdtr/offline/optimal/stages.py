"""Stage schedules: decisions run as Checkmate's stages, and DTR runs read as such.

A relaxation's decisions (`Intervals`) are realized as a stage schedule
(`realize`); a DTR run at the budget is read back into decisions by an
observer (`StageRecorder`), so that a heuristic's run is a schedule the
solvers start from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from ...runtime import Observer
from ..driver import Workload, run
from .graph import CheckmateGraph, Intervals, Scheduled, Stages, useful_until


# DTR's heuristics whose runs at the budget `optimal` reads as stage
# schedules (`heuristic_schedule`): a schedule to beat from the start, and
# often the optimum at tight budgets, where the MILP's own are poor.
SEED_HEURISTICS = ("dtr_eq", "dtr_full", "lookahead")

@dataclass(frozen=True)
class Realized:
    """A relaxation's decisions run as a stage schedule (`realize`).

    `stages` is None when some stage does not fit; `overflowing` lists those
    stages (each run on past the budget, so all are found at once) and
    `overflow` the nodes the first of them computes."""

    stages: Optional[Stages]
    overflow: tuple[int, ...] = ()
    overflowing: tuple[int, ...] = ()


def realize(graph: CheckmateGraph, budget_bytes: int, decisions: Intervals, hold_recomputed: bool) -> Realized:
    """`schedule_from_intervals`, and the stages that did not fit (if some did not)."""
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
            if memory + graph.sizes[k] + graph.transient_bytes(k) > budget_bytes and not (overflowing and overflowing[-1] == t):
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
    return Realized(None if overflowing else stages, overflow, tuple(overflowing))


def cheapest_schedule(graph: CheckmateGraph, budget_bytes: int, decisions: Intervals) -> Optional[Scheduled]:
    """The cheaper of the two schedules for these decisions (holding values
    recomputed only as inputs, or not)."""
    schedules = (schedule_from_intervals(graph, budget_bytes, decisions, hold) for hold in (True, False))
    return min((cost_of(graph, stages) for stages in schedules if stages is not None), default=None)


class StageRecorder(Observer):
    """Reads a DTR run as Checkmate's stage decisions (`Intervals`, every node refined).

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

    def decisions(self, graph: CheckmateGraph) -> Optional[Intervals]:
        """The run's decisions; None if its operators are not the graph's nodes."""
        if len(self.tensors) != len(graph):
            return None
        recomputed = self._take_pending()
        if recomputed:  # outputs brought back after the last operator: in the last stage
            self.recomputed.setdefault(len(graph) - 1, set()).update(recomputed)
        return Intervals(0.0, {}, frozenset(range(len(graph))), self.kept, self.recomputed)


def heuristic_schedule(
    workload: Workload, graph: CheckmateGraph, budget_bytes: int
) -> Optional[Scheduled]:
    """The cheapest of `SEED_HEURISTICS`' runs at the budget, as stage schedules.

    A run is one of Checkmate's schedules as long as it rematerializes each
    operator at most once between two first computations, and then the
    schedule (`realize` of `StageRecorder`'s decisions) costs what the run
    did or less. So `optimal` is never worse than these heuristics.

    Returns:
      The schedule, its `source` the heuristic; None if no run finished or
      fits as a stage schedule.
    """
    until = useful_until(graph)
    best: Optional[Scheduled] = None
    for heuristic in SEED_HEURISTICS:
        recorder = StageRecorder(until)
        if not run(workload, budget_bytes, heuristic, observers=[recorder]).ok:
            continue
        decisions = recorder.decisions(graph)
        if decisions is None:
            return None
        schedule = cheapest_schedule(graph, budget_bytes, decisions)
        if schedule is not None and (best is None or schedule.cost < best.cost):
            best = replace(schedule, source=heuristic)
    return best



def cost_of(graph: CheckmateGraph, stages: Stages) -> Scheduled:
    """A stage schedule with its total compute and its computations beyond the first of each node."""
    computed = [k for order, _ in stages for k in order]
    return Scheduled(float(sum(graph.costs[k] for k in computed)), len(computed) - len(graph), stages)



def schedule_from_intervals(
    graph: CheckmateGraph, budget_bytes: int, decisions: Intervals, hold_recomputed: bool = False
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
    return realize(graph, budget_bytes, decisions, hold_recomputed).stages
