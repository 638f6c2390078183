"""A DTR run written down as a straight-line program over buffer slots.

DTR's decisions depend only on the program, the budget, the heuristic and
the costs; with a deterministic cost model none of them needs a device. So
a run can be simulated before it starts, and what the runtime asked of its
backend in that simulation — compute this operator on these buffers, free
that buffer — is the whole run: replaying those requests on device buffers
takes the same decisions without the runtime (its bookkeeping, the
heuristic's scoring) in the loop, and a run of consecutive requests can be
compiled into one program (`jdtr.transform.chunks`).

`RecordingBackend` is the runtime's backend in that simulation: its buffers
are slot numbers, and it writes down every request as a `Compute` or a
`Free` step, and the driver's reads of a buffer's contents (a `cond`'s
predicate) as `Read` steps, where a run goes on by the branch read. No JAX
here: a payload is whatever the program handed the runtime (an equation,
for `jdtr.grad`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from ..runtime import Operator


@dataclass(frozen=True, eq=False)
class Compute:
    """Run `payload` on the buffers in `inputs`; its results go to `outputs`.

    `rematerialization` marks a replay of a payload computed before;
    `workspace` is the memory it takes beside its outputs while it runs."""

    payload: Any
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    rematerialization: bool
    workspace: int = 0


@dataclass(frozen=True)
class Free:
    """Give back the buffer in `slot` (an eviction, a dead value, or the end of the run)."""

    slot: int


@dataclass(frozen=True)
class Read:
    """The driver reads the buffer in `slot` here (a `cond`'s predicate), and
    goes on by the branch it selects."""

    slot: int


Step = Union[Compute, Free, Read]


@dataclass
class StraightLine:
    """The requests of one simulated run, in order.

    Attributes:
      arguments: the slot of each argument the run was given.
      externals: slots holding buffers the program itself handed the runtime
        (constants, literals), with those buffers; the run never frees them.
      steps: the requests.
      outputs: the slots the run returns.
      sizes: bytes of each slot's buffer.
    """

    arguments: tuple[int, ...]
    externals: dict[int, Any]
    steps: list[Step]
    outputs: tuple[int, ...]
    sizes: list[int]

    @property
    def num_slots(self) -> int:
        return len(self.sizes)

    def resident_before(self) -> list[int]:
        """Per step, the bytes of the buffers alive just before it runs
        (arguments and externals included), and at the end one more entry."""
        alive = sum(self.sizes[s] for s in self.arguments) + sum(self.sizes[s] for s in self.externals)
        resident = []
        for step in self.steps:
            resident.append(alive)
            if type(step) is Compute:
                alive += sum(self.sizes[s] for s in step.outputs)
            elif type(step) is Free:
                alive -= self.sizes[step.slot]
        resident.append(alive)
        return resident

    @property
    def computations(self) -> int:
        return sum(1 for step in self.steps if type(step) is Compute)

    @property
    def rematerializations(self) -> int:
        return sum(1 for step in self.steps if type(step) is Compute and step.rematerialization)


class RecordingBackend:
    """The runtime's backend in a planning simulation: buffers are slots.

    Arguments get their slots from `argument` before the run; any other
    buffer the program hands the runtime (a constant's array) becomes an
    external slot on first use, kept by identity.
    """

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.steps: list[Step] = []
        self.arguments: list[int] = []
        self.externals: dict[int, Any] = {}
        self._external_slots: dict[int, int] = {}  # id(buffer) -> slot
        self._computed: set[int] = set()  # ids of payloads run once

    def _new_slot(self, size: int) -> int:
        self.sizes.append(int(size))
        return len(self.sizes) - 1

    def argument(self, size: int) -> int:
        slot = self._new_slot(size)
        self.arguments.append(slot)
        return slot

    def slot_of(self, buffer: Any, size: int = 0) -> int:
        """The slot of a buffer the run was handed (an external one is registered)."""
        if type(buffer) is int:
            return buffer
        slot = self._external_slots.get(id(buffer))
        if slot is None:
            slot = self._new_slot(size or int(getattr(buffer, "nbytes", 0)))
            self._external_slots[id(buffer)] = slot
            self.externals[slot] = buffer
        return slot

    def compute(self, op: Operator, args: list[Any]) -> tuple[list[Any], Optional[float]]:
        inputs = tuple(self.slot_of(a, t.size) for a, t in zip(args, op.inputs))
        outputs = tuple(self._new_slot(t.storage.size if not t.is_alias else 0) for t in op.outputs)
        key = id(op.payload)
        self.steps.append(Compute(op.payload, inputs, outputs, key in self._computed, op.workspace))
        self._computed.add(key)
        return list(outputs), None

    def free(self, buffer: Any) -> None:
        if type(buffer) is int and buffer not in self.externals:
            self.steps.append(Free(buffer))

    def read(self, buffer: Any) -> None:
        """The program reads `buffer` here (it is resident)."""
        self.steps.append(Read(self.slot_of(buffer)))

    def line(self, outputs: list[Any]) -> StraightLine:
        """The recorded run, returning the buffers `outputs`."""
        return StraightLine(
            tuple(self.arguments),
            dict(self.externals),
            list(self.steps),
            tuple(self.slot_of(b) for b in outputs),
            list(self.sizes),
        )

