"""A stage schedule written as the straight line of the run it describes.

`jdtr.optimal` answers in Checkmate's stages over the nodes of a trace's
graph (`checkmate_graph`): stage t computes node t for the first time,
recomputing some earlier nodes before it, and keeps a set of nodes into the
next stage. To run such a schedule, `jdtr.grad`'s planner needs it as the
requests a run makes (`StraightLine`): compute this operator on these
buffers, free that buffer. The operators and their buffers come from a
*reference*: the same program run once without a budget and recorded both
as an operator log (from which the graph was made) and as a straight line,
so that the k-th operator of one is the k-th of the other.

The graph counts memory as Checkmate does, and that is not quite what a run
holds: computing one output of a multi-output operator makes all of them
(the others are freed at once), and an operator needs its workspace (XLA's
temporaries) while it runs, which the graph leaves out. So the line is
measured as it is built, and a schedule whose line would pass the budget is
no answer here (`stage_line` returns None).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..runtime import Counters, TimelineEvent
from .optimal.graph import CheckmateGraph, Stages
from .straightline import Compute, Free, StraightLine, Step


@dataclass
class StagedRun:
    """A stage schedule as a line, with the totals `jdtr.Stats` reports and
    its residency events (as `jdtr.runtime.Timeline` records a run's; a
    storage is a graph node)."""

    line: StraightLine
    counters: Counters
    events: list[TimelineEvent]


def stage_line(reference: StraightLine, graph: CheckmateGraph, stages: Stages, budget_bytes: int) -> Optional[StagedRun]:
    """The run `stages` describe, over the operators and buffers of
    `reference` (a run of the program without evictions, in program order);
    None if its operators are not the graph's nodes or the run would hold
    more than `budget_bytes` at some computation."""
    computes = [step for step in reference.steps if type(step) is Compute]
    # Node numbering of `checkmate_graph`: each operator's outputs in turn,
    # one 0-byte node for an operator without any (the log gives it a result).
    node_of: list[tuple[int, Optional[int]]] = []  # node -> (operator, output position)
    nodes_of: list[list[int]] = []  # operator -> its nodes
    for k, step in enumerate(computes):
        positions = list(range(len(step.outputs))) or [None]
        nodes_of.append(list(range(len(node_of), len(node_of) + len(positions))))
        node_of.extend((k, j) for j in positions)
    if len(node_of) != len(graph) or any(r.rematerialization for r in computes):
        return None
    made_by = {computes[k].outputs[j]: node for node, (k, j) in enumerate(node_of) if j is not None}
    return _Builder(reference, graph, computes, node_of, nodes_of, made_by, budget_bytes).build(stages)


class _Builder:
    """Writes a stage schedule down step by step, measuring the memory."""

    def __init__(self, reference, graph, computes, node_of, nodes_of, made_by, budget_bytes):
        self.reference = reference
        self.graph = graph
        self.computes: list[Compute] = computes
        self.node_of = node_of
        self.nodes_of = nodes_of
        self.made_by: dict[int, int] = made_by  # a reference slot -> the node it holds
        self.budget = budget_bytes
        # Arguments and the program's own buffers keep their reference slots.
        fixed = [*reference.arguments, *reference.externals]
        self.slot = {s: s for s in fixed}
        self.sizes = list(reference.sizes)
        self.steps: list[Step] = []
        self.where: dict[int, int] = {}  # a resident node -> its slot
        self.memory = sum(reference.sizes[s] for s in fixed)
        self.counters = Counters(peak_bytes=self.memory)
        self.computed: set[int] = set()  # operators run once
        self.fits = True
        self.frees: list[tuple[int, int, int]] = []  # (step, operator, event) of each node given back
        self.events: list[TimelineEvent] = []
        self.clock = 1.0  # the runtime's clock: it starts at 1

    def build(self, stages: Stages) -> Optional[StagedRun]:
        graph = self.graph
        for order, held in stages:
            last_read: dict[int, int] = {}
            for p, k in enumerate(order):
                for i in graph.deps[k]:
                    last_read[i] = p
            for i in [i for i in self.where if i not in held and i not in last_read]:
                self._free(i)  # neither read in this stage nor kept past it
            run: set[int] = set()  # operators this stage has run
            wanted = set(order)
            for p, k in enumerate(order):
                op = self.node_of[k][0]
                if op not in run:
                    run.add(op)
                    if not self._compute(op, wanted):
                        return None
                for i in (*graph.deps[k], k):  # free what the stage reads no more and does not keep
                    if i in self.where and i not in held and last_read.get(i, -1) <= p:
                        self._free(i)
            if not self.fits:
                return None
        return self._finish()

    def _compute(self, op: int, wanted: set[int]) -> bool:
        step = self.computes[op]
        inputs = [self._holding(s) for s in step.inputs]
        if None in inputs:
            return False  # an input the schedule does not hold: not a schedule of this program
        outputs = tuple(self._new_slot(self.reference.sizes[s]) for s in step.outputs)
        made = sum(self.sizes[s] for s in outputs)
        peak = self.memory + made + step.workspace
        self.counters.peak_bytes = max(self.counters.peak_bytes, peak)
        if peak > self.budget:
            self.fits = False
        self.memory += made
        again = op in self.computed
        self.computed.add(op)
        self.steps.append(Compute(step.payload, tuple(inputs), outputs, again, step.workspace))
        cost = sum(self.graph.costs[n] for n in self.nodes_of[op])
        self.counters.on_compute(None, cost, again, self.clock)
        self.clock += cost
        kind = "rematerialize" if again else "compute"
        for n, slot in zip(self.nodes_of[op], outputs):
            if n in wanted and n not in self.where:
                self.where[n] = slot
                self.events.append(TimelineEvent(self.counters.computations, self.clock, n, self.sizes[slot], kind, self.memory))
            else:  # made with the others, or a copy of one already held: given back at once
                self._release(slot)
        return True

    def _holding(self, reference_slot: int) -> Optional[int]:
        """The slot holding the value of `reference_slot` now, None if no slot does."""
        if reference_slot in self.slot:
            return self.slot[reference_slot]
        return self.where.get(self.made_by.get(reference_slot, -1))

    def _new_slot(self, size: int) -> int:
        self.sizes.append(size)
        return len(self.sizes) - 1

    def _release(self, slot: int) -> None:
        self.steps.append(Free(slot))
        self.memory -= self.sizes[slot]

    def _free(self, node: int) -> None:
        self.frees.append((len(self.steps), self.node_of[node][0], len(self.events)))
        slot = self.where.pop(node)
        self._release(slot)
        self.events.append(TimelineEvent(self.counters.computations, self.clock, node, self.sizes[slot], "dealloc", self.memory))

    def _finish(self) -> Optional[StagedRun]:
        outputs = [self._holding(s) for s in self.reference.outputs]
        if None in outputs:
            return None  # an output the schedule does not hold at the end
        kept = set(outputs) | set(self.reference.externals)
        freed_arguments = {step.slot for step in self.reference.steps if type(step) is Free} & set(self.reference.arguments)
        for node in list(self.where):
            if self.where[node] not in kept:
                self._free(node)
        for slot in sorted(freed_arguments - kept):  # arguments the run may free: at the end
            self._release(slot)
        # A node given back and computed again later was evicted; else it was dead.
        last_run = {}
        for i, step in enumerate(self.steps):
            if type(step) is Compute:
                last_run[id(step.payload)] = i
        for at, op, event in self.frees:
            evicted = last_run.get(id(self.computes[op].payload), -1) > at
            self.counters.on_evict(None, evicted, self.events[event].clock)
            if evicted:
                self.events[event] = replace(self.events[event], kind="evict")
        line = StraightLine(self.reference.arguments, dict(self.reference.externals), self.steps, tuple(outputs), self.sizes)
        return StagedRun(line, self.counters, self.events)
