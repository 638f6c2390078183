"""Runs a planned run on device buffers: step by step, or chunk by chunk.

The plan (`planner.py`) already took every decision, so running it is a
loop over slots: call an executable on the arrays in its input slots, put
its results in its output slots, `delete()` the array of a freed slot.
Nothing blocks: deletions follow JAX's own ordering of the work in flight.

Step by step, each equation is one dispatch of its cached executable; in
chunks (`chunks.py`), a run of equations is one dispatch of one compiled
program. Arrays the run was handed and does not own (the caller's
arguments, the program's constants) are never deleted, also when an error
stops the run, which frees everything else it made.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from ..offline import Compute, StraightLine
from . import _jax_core
from .chunks import Chunk, Item
from .program import Program


def slot_avals(line: StraightLine, program: Program) -> list[Any]:
    """The abstract value (shape, dtype, weak type) of each slot of a plan of `program`."""
    avals: list[Any] = [None] * line.num_slots
    for slot, value in zip(line.arguments, program.inputs):
        avals[slot] = value
    for slot, array in line.externals.items():
        avals[slot] = _jax_core.aval_of(array)
    for step in line.steps:
        if type(step) is Compute:
            for slot, value in zip(step.outputs, step.payload.outputs):
                avals[slot] = value
    return avals


class Execution:
    """One run of a plan on `args`; `owned[i]` marks the arguments the run may free."""

    def __init__(self, line: StraightLine, args: Sequence[Any], owned: Sequence[bool], after: Optional[Callable[[], None]]):
        self.line = line
        self.after = after  # called once each dispatch is made (the debug check)
        self.slots: list[Any] = [None] * line.num_slots
        for slot, array in zip(line.arguments, args):
            self.slots[slot] = array
        for slot, array in line.externals.items():
            self.slots[slot] = array
        self.kept = {slot for slot, mine in zip(line.arguments, owned) if not mine} | set(line.externals)

    def steps(self) -> list[Any]:
        """Each equation in turn, with its cached executable."""
        slots = self.slots
        try:
            for step in self.line.steps:
                if type(step) is Compute:
                    outs = step.payload.fn(*[slots[s] for s in step.inputs])
                    for slot, out in zip(step.outputs, outs):
                        slots[slot] = out
                    if self.after is not None:
                        self.after()
                else:
                    self._delete(step.slot)
        except BaseException:
            self._abandon()
            raise
        return self._outputs()

    def chunks(self, items: Sequence[Item]) -> list[Any]:
        """Each chunk as one dispatch, then what the plan freed meanwhile."""
        slots = self.slots
        try:
            for item in items:
                if type(item) is Chunk:
                    outs = item.call(*[slots[s] for s in item.inputs])
                    for slot, out in zip(item.outputs, outs):
                        slots[slot] = out
                    if self.after is not None:
                        self.after()
                    for slot in item.frees:
                        self._delete(slot)
                else:
                    for slot in item.slots:
                        self._delete(slot)
        except BaseException:
            self._abandon()
            raise
        return self._outputs()

    def _delete(self, slot: int) -> None:
        array = self.slots[slot]
        self.slots[slot] = None
        if slot not in self.kept and array is not None and not array.is_deleted():
            array.delete()  # a donated input is already gone

    def _outputs(self) -> list[Any]:
        outputs = [self.slots[s] for s in self.line.outputs]
        self.slots = []
        return outputs

    def _abandon(self) -> None:
        """After an error: frees every array the run made; the caller's stay."""
        for slot in range(len(self.slots)):
            try:
                self._delete(slot)
            except Exception:  # noqa: BLE001 - a failed free must not hide the first error
                pass
        self.slots = []
