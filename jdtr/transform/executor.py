"""Runs a planned run on device buffers: step by step, or chunk by chunk.

The plan (`planner.py`) already took every decision, so running it is a
loop over slots: call an executable on the arrays in its input slots, put
its results in its output slots, `delete()` the array of a freed slot.
Nothing blocks: deletions follow JAX's own ordering of the work in flight,
except a `Read` (a `cond`'s predicate), where a run stops for the driver to
read the branch and go on, by the same line or another plan's (`follow`).

Step by step, each equation is one dispatch of its cached executable; in
chunks (`chunks.py`), a run of equations is one dispatch of one compiled
program. Arrays the run was handed and does not own (the caller's
arguments, the program's constants) are never deleted, also when an error
stops the run, which frees everything else it made.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from ..offline import Compute, Free, Read, StraightLine
from . import _jax_core, rental
from .chunks import Chunk, Delete, Item, cut
from .devices import spread
from .program import Program


def slot_avals(line: StraightLine, program: Program) -> list[Any]:
    """The abstract value (shape, dtype, weak type; its sharding over a
    mesh) of each slot of a plan of `program`."""
    avals: list[Any] = [None] * line.num_slots
    for slot, value in zip(line.arguments, program.inputs):
        avals[slot] = value
    for slot, array in line.externals.items():
        # (a constant's array: placed where it is, which a chunk must expect)
        aval, placed = _jax_core.aval_of(array), spread(getattr(array, "sharding", None))
        avals[slot] = jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=placed)
    for step in line.steps:
        if type(step) is Compute:
            for slot, value in zip(step.outputs, step.payload.outputs):
                avals[slot] = value
    return avals


def chunks_for(
    plan: Any, program: Program, policy: str, budget_bytes: int, chunked: Optional[bool] = None, device: Any = None
) -> tuple[Optional[list[Item]], float]:
    """The compiled chunks a planned run (`planner.PlannedRun`) runs by, or
    None to run it step by step, as `policy` says ("always", "never", or
    "auto": once its step-by-step runs took as long as compiling is
    expected to, `rental.py`), or as `chunked` says where that was decided
    before (`compiles`, before the plan was settled for chunks); and the
    seconds cutting and compiling took now. Counts the run. `device`: where
    the run is placed, if not the backend's first (`run_device`);
    a plan's chunks are compiled again for a call on another device (each
    distinct chunk program once per device: `chunks.cut`'s cache)."""
    if chunked is None:
        chunked = compiles(plan, policy)
    plan.rent.runs += 1
    if not chunked:
        return None, 0.0
    if plan.compiled is not None and plan.compiled_on == device:
        return plan.compiled, 0.0
    start = time.perf_counter()
    plan.compiled = cut(plan.line, slot_avals(plan.line, program), budget_bytes, device)
    plan.compiled_on = device
    elapsed = time.perf_counter() - start
    plan.compile_s += elapsed
    rental.COMPILE_RATE.observe(operations(plan.line), elapsed)
    return plan.compiled, elapsed


def run_device(program: Program, inputs: Sequence[Any]) -> Any:
    """The device a run of `program` (not over a mesh) on `inputs` is
    placed on, where it is not the backend's first: the one its committed
    arguments are on (`arguments` checked they share it), else JAX's
    default (`jax.default_device`). Each equation, jitted, follows its
    inputs there; a compiled chunk runs where it was compiled for, so one
    compiled for the first device refused arrays committed to another
    (`jax.device_put(params, jax.devices()[1])`)."""
    if program.devices > 1:
        return None
    device = next((next(iter(x.sharding.device_set)) for x in inputs if getattr(x, "committed", False)), None)
    if device is None:
        device = _jax_core.chosen_default_device()
        if device is None:  # (the common case, read on every call: a few microseconds)
            return None
    return None if device == _jax_core.first_device(device.platform) else device


def renting(plan: Any, policy: str) -> bool:
    """Whether `plan`'s step-by-step runs count towards compiling it (`rental.py`)."""
    return policy == "auto" and plan.compiled is None


def compiles(plan: Any, policy: str) -> bool:
    """Whether `plan`'s next run is in compiled chunks, by `policy` (`rental.pays`)."""
    if plan.compiled is not None:
        return policy != "never"
    deterministic = jax.process_count() > 1
    return rental.pays(policy, plan.rent, operations(plan.line) if policy == "auto" else 0, deterministic)


def operations(line: StraightLine) -> int:
    """The distinct operations of a plan's line: its computations with
    executables of their own (what its compile is estimated by, `rental.py`)."""
    return len({id(step.payload.executable) for step in line.steps if type(step) is Compute})


def serial_dispatch(program: Program) -> bool:
    """Whether a run of `program` must wait for each dispatch before the
    next: on a mesh of CPU devices. There, programs with collectives in
    flight together can deadlock XLA's CPU runtime (its threads wait in one
    program's all-reduce for devices that are busy in another's; seen with
    16 layers of 256-wide matmuls on 8 devices over 2 cores: the run hung
    until XLA aborted it). A GPU or TPU orders each device's work in
    streams, and dispatches ahead."""
    if program.devices <= 1:
        return False
    placed = next(v.sharding for v in program.inputs if v.sharding is not None)
    return any(device.platform == "cpu" for device in placed.device_set)


class Execution:
    """One run of a plan on `args`; `owned[i]` marks the arguments the run may free.

    `steps` or `chunks` runs the line to its end, or to its next `Read`,
    whose index they return (the length of the line or of the chunks at the
    end); `dispatches` counts the executables called. `serial`: each
    dispatch waits for the one before it (`serial_dispatch`). `device`:
    where its chunks run (`run_device`)."""

    def __init__(
        self,
        line: StraightLine,
        args: Sequence[Any],
        owned: Sequence[bool],
        after: Optional[Callable[[], None]],
        serial: bool = False,
        device: Any = None,
    ):
        self.line = line
        self.after = after  # called once each dispatch is made (the debug check)
        self.serial = serial
        self.device = device
        self.dispatches = 0
        self.slots: list[Any] = [None] * line.num_slots
        for slot, array in zip(line.arguments, args):
            self.slots[slot] = array
        for slot, array in line.externals.items():
            self.slots[slot] = array
        self.kept = {slot for slot, mine in zip(line.arguments, owned) if not mine} | set(line.externals)

    def run(self, items: Optional[Sequence[Item]], wait: bool) -> tuple[list[Any], float]:
        """The whole line, in `items` (compiled chunks) or step by step: its
        outputs, and the seconds to their dispatch (to their being ready, where `wait`)."""
        start = time.perf_counter()
        if items is not None:
            self.chunks(items)
        else:
            self.steps()
        outputs = self.outputs()
        if wait:
            jax.block_until_ready(outputs)
        return outputs, time.perf_counter() - start

    def steps(self, start: int = 0) -> int:
        """Each equation in turn, with its cached executable."""
        slots, steps = self.slots, self.line.steps
        try:
            for t in range(start, len(steps)):
                step = steps[t]
                if type(step) is Compute:
                    outs = step.payload.fn(*[slots[s] for s in step.inputs])
                    self.dispatches += 1
                    if self.serial:
                        jax.block_until_ready(outs)
                    for slot, out in zip(step.outputs, outs):
                        slots[slot] = out
                    if self.after is not None:
                        self.after()
                elif type(step) is Free:
                    self._delete(step.slot)
                else:
                    return t
        except BaseException:
            self.abandon()
            raise
        return len(steps)

    def chunks(self, items: Sequence[Item], start: int = 0) -> int:
        """Each chunk as one dispatch, then what the plan freed meanwhile."""
        slots = self.slots
        try:
            for k in range(start, len(items)):
                item = items[k]
                if type(item) is Chunk:
                    outs = item.call(*[slots[s] for s in item.inputs])
                    self.dispatches += 1
                    if self.serial:
                        jax.block_until_ready(outs)
                    for slot, out in zip(item.outputs, outs):
                        slots[slot] = out
                    if self.after is not None:
                        self.after()
                    for slot in item.frees:
                        self._delete(slot)
                elif type(item) is Delete:
                    for slot in item.slots:
                        self._delete(slot)
                else:
                    return k
        except BaseException:
            self.abandon()
            raise
        return len(items)

    def read(self, read: Read) -> int:
        """The integer in a `Read`'s slot (waits for it to be computed)."""
        try:
            return int(np.asarray(self.slots[read.slot]))
        except BaseException:
            self.abandon()
            raise

    def follow(self, line: StraightLine) -> None:
        """Goes on by `line`, a plan whose steps so far are this one's (so are
        its slots: those of the literals that only this line uses later may
        be its computed values there, and are cleared)."""
        self.slots.extend([None] * (line.num_slots - len(self.slots)))
        for slot in self.line.externals.keys() - line.externals.keys():
            self.slots[slot] = None  # the plan's literal, not the run's to delete
            self.kept.discard(slot)
        for slot, array in line.externals.items():
            self.slots[slot] = array  # the same literals before the read, maybe others after it
            self.kept.add(slot)
        self.line = line

    def outputs(self) -> list[Any]:
        """The run's outputs; the run is over."""
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

    def abandon(self) -> None:
        """After an error: frees every array the run made; the caller's stay."""
        for slot in range(len(self.slots)):
            try:
                self._delete(slot)
            except Exception:  # noqa: BLE001 - a failed free must not hide the first error
                pass
        self.slots = []
