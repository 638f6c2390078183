"""What a trace means: a program of pure operator calls and reference changes.

This is the log replaying of App. C.6, step by step as the paper authors'
simulator, simrd, reads a log:

* Replay starts after the first `ANNOTATE START` (from the top if there is none).
* Names map to *values* (tensors); `COPY` gives a value a second name, and each
  value counts the program's references to it.
* `MUTATE` is made pure, copy-on-write: the operator reads all its arguments
  and writes a fresh, non-aliasing value per overwritten argument, as large
  as that argument's whole storage; the argument's name then points at the
  new value and the old value loses a reference.
* A `RELEASE` of a name the step never defined is ignored (the reference
  simulator does the same: such names belong to tensors made before START).
* Every value still referenced after the last record is an output, in the
  order its first name appeared.
* jdtr's own extension, inside the format: a `CALL` result named
  `workspace<digits>` (not a view) is memory the operator needs only while
  it runs (XLA's temporaries). It becomes the step's `workspace`, reserved
  with the outputs at every run of the operator and given back after, not
  a value; its `RELEASE` is then one of a name never defined, ignored. Other
  tools read it as a result released at once. The paper's logs have no such
  names.

Lowering also checks that names are defined before use, defined only once,
and not used or released once every reference to their value is gone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from ._errors import LogFormatError
from ._records import Annotate, Call, Constant, Copy, CopyFrom, Mutate, Record, Release


WORKSPACE_PREFIX = "workspace"
_WORKSPACE_NAME = re.compile(WORKSPACE_PREFIX + r"[0-9]+")


@dataclass(frozen=True)
class ComputeStep:
    """Run one pure operator; its outputs are new values.

    Attributes:
      name: the operator (a constant's own tensor name for constants).
      inputs: value ids read, in order (may repeat).
      outputs: value ids written.
      sizes: bytes of each output, 0 for a view (it adds no memory).
      aliases: per output, -1 or the input position whose storage it views.
      cost: nanoseconds (a log's) or the program's cost model's unit; 0 for
        a constant; None: measured when it runs (a traced program's
        `cost_model="measured"`).
      constant: whether this is a constant (pinned, never recomputed).
      line: where it came from in the log, when known.
      workspace: bytes the operator needs only while it runs.

    A program lowered from a traced one (`jdtr.transform.lowering`) says
    more than a log can, and its replay hands it on to the runtime:
      payload: what runs the operator (the equation), or a constant's buffer.
      replayable: False for an operator with effects (its outputs are pinned).
      external: a constant the caller owns (never freed, never released).
      source: where the operator comes from in the user's code.
    """

    name: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    sizes: tuple[int, ...]
    aliases: tuple[int, ...]
    cost: Optional[float]
    constant: bool = False
    line: Optional[int] = None
    workspace: int = 0
    payload: Any = field(default=None, compare=False, repr=False)
    replayable: bool = True
    external: bool = False
    source: Optional[object] = None  # its str is the line (a traced program's is found when shown)


@dataclass(frozen=True)
class RetainStep:
    """The program took one more reference to a value."""

    value: int


@dataclass(frozen=True)
class ReleaseStep:
    """The program dropped one reference to a value."""

    value: int


@dataclass(frozen=True)
class ReadStep:
    """The driver reads a value's contents here (a `cond`'s predicate): the
    runtime makes it resident. Only a traced program's lowering has these."""

    value: int


@dataclass(frozen=True)
class AnnounceStep:
    """More reads of a value the program will make, known from here on (a
    branch's reads of its operands, once the branch is known): for
    heuristics that look ahead. Only a traced program's lowering has these."""

    value: int
    positions: tuple[float, ...]


Step = Union[ComputeStep, RetainStep, ReleaseStep, ReadStep, AnnounceStep]


@dataclass(frozen=True)
class Future:
    """Where a program stands at each step, when its lowering says so rather
    than the replay counting its operators' costs (a program with `cond`s:
    a `cond` advances it by its costliest branch, whichever runs, so that
    what a heuristic is told before a branch does not depend on the branch).

    Attributes:
      positions: per step, the program's position when it runs (operator
        calls and reads; None for the other steps).
      uses: per value, the positions at which the program reads it,
        announced when the value is made.
      end: the position at which the outputs are read.
    """

    positions: tuple[Optional[float], ...]
    uses: dict[int, tuple[float, ...]]
    end: float


@dataclass(frozen=True)
class Program:
    """A trace lowered to operator calls on numbered values.

    Attributes:
      steps: what to do, in order.
      value_names: a name for each value id (a mutated copy gets "$" appended).
      outputs: the values still referenced at the end, in first-name order
        (a log's), or the traced program's outputs in its order.
      compute_cost: the cost of running every operator once (the baseline;
        costs measured at run time count 0).
      constant_bytes: bytes of all constants (weights and inputs).
      largest_op_bytes: the most memory one operator needs at once: its
        outputs plus its inputs (the paper's Figure 2 "largest single op").
      future: the program's positions, when not its operators' costs in
        order (a lowering of `cond`s by paths).
    """

    steps: tuple[Step, ...]
    value_names: tuple[str, ...]
    outputs: tuple[int, ...]
    compute_cost: float
    constant_bytes: int
    largest_op_bytes: int
    future: Optional[Future] = None


class _Lowering:
    """The state of one pass over the records."""

    def __init__(self, lines: Optional[Sequence[int]], source: Optional[str]):
        self.lines = lines
        self.source = source
        self.index = 0
        self.names: dict[str, int] = {}  # name -> value, in first-definition order
        self.refs: list[int] = []  # per value: references the program holds
        self.storage_bytes: list[int] = []  # per value: size of the storage it views
        self.own_bytes: list[int] = []  # per value: 0 for a view, else its storage size
        self.value_names: list[str] = []
        self.steps: list[Step] = []
        self.compute_cost = 0
        self.constant_bytes = 0
        self.largest_op_bytes = 0

    def error(self, problem: str) -> LogFormatError:
        if self.lines is not None:
            return LogFormatError(problem, line=self.lines[self.index], source=self.source)
        return LogFormatError(problem, record=self.index, source=self.source)

    def where(self, value: int) -> str:
        return f"'{self.value_names[value]}'"

    def use(self, name: str, role: str) -> int:
        """The live value `name` refers to."""
        value = self.names.get(name)
        if value is None:
            raise self.error(f"{role} {name!r} is not defined")
        if self.refs[value] <= 0:
            raise self.error(f"{role} {name!r} is used after every reference to it was released")
        return value

    def define(self, name: str) -> None:
        if name in self.names:
            raise self.error(f"tensor {name!r} is already defined")

    def new_value(self, name: str, own_bytes: int, storage_bytes: int) -> int:
        self.refs.append(1)
        self.own_bytes.append(own_bytes)
        self.storage_bytes.append(storage_bytes)
        self.value_names.append(name)
        return len(self.refs) - 1

    def drop(self, value: int) -> None:
        if self.refs[value] <= 0:
            raise self.error(f"{self.where(value)} is released more often than it is referenced")
        self.refs[value] -= 1
        self.steps.append(ReleaseStep(value))

    def compute(
        self, name: str, inputs: list[int], outputs: list[int], aliases: Sequence[int], cost: int, workspace: int = 0
    ) -> None:
        sizes = tuple(self.own_bytes[v] for v in outputs)
        # Figure 2's gray area: outputs plus every input (a repeated input
        # counts each time, views count 0), as the reference simulator sums.
        needed = sum(sizes) + sum(self.own_bytes[v] for v in inputs) + workspace
        self.largest_op_bytes = max(self.largest_op_bytes, needed)
        line = self.lines[self.index] if self.lines is not None else None
        step = ComputeStep(name, tuple(inputs), tuple(outputs), sizes, tuple(aliases), cost, False, line, workspace)
        self.steps.append(step)

    def constant(self, record: Constant) -> None:
        self.define(record.name)
        value = self.new_value(record.name, record.memory, record.memory)
        self.names[record.name] = value
        self.constant_bytes += record.memory
        self.largest_op_bytes = max(self.largest_op_bytes, record.memory)
        line = self.lines[self.index] if self.lines is not None else None
        self.steps.append(ComputeStep(record.name, (), (value,), (record.memory,), (-1,), 0, True, line))

    def call(self, record: Call) -> None:
        inputs = [self.use(name, "argument") for name in record.args]
        for name in record.result:
            self.define(name)
        outputs, names, aliases, workspace = [], [], [], 0
        for name, memory, alias in zip(record.result, record.memory, record.alias):
            if alias < 0 and _WORKSPACE_NAME.fullmatch(name):
                workspace += memory  # needed while it runs, not a value
                continue
            if alias >= 0:  # a view: no memory of its own (App. C.6)
                outputs.append(self.new_value(name, 0, self.storage_bytes[inputs[alias]]))
            else:
                outputs.append(self.new_value(name, memory, memory))
            names.append(name)
            aliases.append(alias)
        self.compute(record.name, inputs, outputs, aliases, record.time, workspace)
        self.compute_cost += record.time
        for name, value in zip(names, outputs):
            self.names[name] = value

    def mutate(self, record: Mutate) -> None:
        inputs = [self.use(name, "argument") for name in record.args]
        outputs = []
        for index in record.mutate:
            arg = inputs[index]
            size = self.storage_bytes[arg]  # the whole storage, even if the argument is a view
            outputs.append(self.new_value(self.value_names[arg] + "$", size, size))
        self.compute(record.name, inputs, outputs, [-1] * len(outputs), record.time)
        self.compute_cost += record.time
        for index, new in zip(record.mutate, outputs):
            name = record.args[index]
            old = self.names[name]
            self.names[name] = new
            self.drop(old)

    def copy(self, record: Copy) -> None:
        value = self.use(record.src, "COPY source")
        self.define(record.dst)
        self.names[record.dst] = value
        self.refs[value] += 1
        self.steps.append(RetainStep(value))

    def copy_from(self, record: CopyFrom) -> None:
        old = self.use(record.dst, "COPY_FROM destination")
        value = self.use(record.src, "COPY_FROM source")
        self.names[record.dst] = value
        # Retained before the old value is released. The reference simulator
        # releases first, which is the same unless both names hold the same
        # value (`x = x`), where releasing first would free a live value.
        self.refs[value] += 1
        self.steps.append(RetainStep(value))
        self.drop(old)

    def release(self, record: Release) -> None:
        value = self.names.get(record.name)
        if value is not None:
            self.drop(value)

    def outputs(self) -> tuple[int, ...]:
        live = (v for v in self.names.values() if self.refs[v] > 0)
        return tuple(dict.fromkeys(live))


def replay_start(records: Sequence[Record]) -> int:
    """The index of the first record replayed: just after the first `ANNOTATE START`."""
    for index, record in enumerate(records):
        if isinstance(record, Annotate) and record.annotation == "START":
            return index + 1
    return 0


def lower(records: Sequence[Record], lines: Optional[Sequence[int]] = None, source: Optional[str] = None) -> Program:
    """Lowers trace records to a `Program`.

    Args:
      records: the trace.
      lines: the log line of each record, for error messages.
      source: the log's path, for error messages.

    Raises:
      LogFormatError: a name used before it is defined, defined twice, or
        used or released after its last reference was released.
    """
    state = _Lowering(lines, source)
    handlers = {
        Constant: state.constant,
        Call: state.call,
        Mutate: state.mutate,
        Copy: state.copy,
        CopyFrom: state.copy_from,
        Release: state.release,
    }
    for index in range(replay_start(records), len(records)):
        state.index = index
        record = records[index]
        handler = handlers.get(type(record))
        if handler is not None:
            handler(record)
        elif not isinstance(record, Annotate):
            raise state.error(f"not a trace record: {record!r}")
    return Program(
        steps=tuple(state.steps),
        value_names=tuple(state.value_names),
        outputs=state.outputs(),
        compute_cost=state.compute_cost,
        constant_bytes=state.constant_bytes,
        largest_op_bytes=state.largest_op_bytes,
    )
