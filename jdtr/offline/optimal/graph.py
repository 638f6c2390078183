"""Checkmate's linear graph of a trace: what the optimum is computed on.

One node per storage a `CALL` creates, with its size and cost, and edges
from the storages its arguments live in. Constants (weights, inputs) are not
nodes: they are pinned, resident and counted in memory throughout. Also the
vocabulary the solvers share: a stage schedule (`Stages`) and a
relaxation's decisions (`Intervals`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...oplog import ComputeStep, Program


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
      transient: per node, bytes it needs beside its own size while it is
        computed (empty: none): its call's workspace (XLA's temporaries).
        A call's other outputs are not counted (as Checkmate does not): a
        run that makes them all at once measures itself
        (`jdtr.offline.stage_line`).
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    costs: tuple[float, ...]
    deps: tuple[tuple[int, ...], ...]
    outputs: tuple[int, ...]
    constant_bytes: int
    transient: tuple[int, ...] = ()

    def transient_bytes(self, k: int) -> int:
        """Bytes node k needs beside its size while it is computed."""
        return self.transient[k] if self.transient else 0

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
            peak = max(peak, memory + self.transient_bytes(k))
            memory -= sum(self.sizes[i] for i in frees.get(k, ()))
        return peak

    def milp_binaries(self) -> int:
        """Binaries (R and S) of Checkmate's MILP on this graph, without building it."""
        return milp_binaries(self)

    def required_bytes(self) -> int:
        """The least budget any schedule needs: each node with its inputs, and the outputs together."""
        one_op = max(
            (self.sizes[k] + self.transient_bytes(k) + sum(self.sizes[i] for i in deps) for k, deps in enumerate(self.deps)),
            default=0,
        )
        outputs = sum(self.sizes[o] for o in self.outputs)
        return self.constant_bytes + max(one_op, outputs)


def checkmate_graph(program: Program) -> CheckmateGraph:
    """The linear graph of a lowered trace (`Trace.program`).

    Every output of a `ComputeStep` that is not a constant is a node; a view
    (`ALIAS` >= 0) is a 0-byte node whose readers also read the storage it
    views. `RELEASE`s are dropped: when to free is the MILP's decision.
    A call's workspace is each of its nodes' `transient` bytes.
    """
    node_of: dict[int, Optional[int]] = {}  # value -> its node, None for a constant
    root_of: dict[int, Optional[int]] = {}  # value -> the node of the storage it lives in
    names: list[str] = []
    sizes: list[int] = []
    costs: list[float] = []
    deps: list[tuple[int, ...]] = []
    transient: list[int] = []
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
            transient.append(step.workspace)
    outputs = set()
    for value in program.outputs:
        outputs.update(n for n in (node_of[value], root_of[value]) if n is not None)
    return CheckmateGraph(
        tuple(names), tuple(sizes), tuple(costs), tuple(deps), tuple(sorted(outputs)), constant_bytes, tuple(transient)
    )



# A stage schedule: per stage, the nodes computed (in order) and the nodes held after it.
Stages = list[tuple[tuple[int, ...], frozenset[int]]]


@dataclass(frozen=True, order=True)
class Scheduled:
    """A stage schedule with its total compute and its computations beyond
    the first of each node; ordered by those two, cheapest first. `source`
    names the heuristic whose run it is, if one is."""

    cost: float
    recomputations: int
    stages: Stages = field(compare=False, repr=False)
    source: str = field(default="", compare=False)


def useful_until(graph: CheckmateGraph) -> list[int]:
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



def milp_binaries(graph: CheckmateGraph) -> int:
    """The binaries (R and S) of `_build`'s MILP, without building it."""
    n = len(graph)
    return sum(min(last, n - 1) - i + 1 + last - i for i, last in enumerate(useful_until(graph)))



@dataclass(frozen=True)
class Intervals:
    """The interval relaxation's solution: its bound and its decisions.

    `bound` is a lower bound on the optimum only for the unpriced relaxation
    (`solve_intervals(..., price_inputs=False)`). `dropped[i]` lists, for a
    node i outside `refined`, the reads (node indices; `len(graph)` for the
    end) before which it is absent since the read before them. For a node i
    in `refined`, `kept[i]` lists the stages it is kept into, and
    `recomputed[t]` the refined nodes stage t recomputes."""

    bound: float
    dropped: dict[int, set[int]]
    refined: frozenset[int] = frozenset()
    kept: dict[int, set[int]] = field(default_factory=dict)
    recomputed: dict[int, set[int]] = field(default_factory=dict)
