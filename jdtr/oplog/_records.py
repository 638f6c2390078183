"""The records of an operator log (paper App. C.6), one frozen dataclass per instruction.

A log is a sequence of JSON objects, one per line. `MEMORY` and `ALIAS` lines
only ever complete the instruction before them (a `CONSTANT`, or a `CALL`
with one `MEMORY` + `ALIAS` pair per result), so they are folded into
`Constant` and `Call` here: a record is one whole instruction, and a record
that would need a missing line cannot be built. Field names are those of the
log, lower-cased; numbers are ints (the log writes them as strings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ._errors import LogFormatError

# An instruction's fields, exactly as they appear in a log (their JSON keys).
LOG_FIELDS: dict[str, frozenset[str]] = {
    "ANNOTATE": frozenset({"INSTRUCTION", "ANNOTATION"}),
    "CONSTANT": frozenset({"INSTRUCTION", "NAME"}),
    "MEMORY": frozenset({"INSTRUCTION", "NAME", "MEMORY"}),
    "ALIAS": frozenset({"INSTRUCTION", "NAME", "ALIAS"}),
    "CALL": frozenset({"INSTRUCTION", "NAME", "ARGS", "RESULT", "TIME"}),
    "MUTATE": frozenset({"INSTRUCTION", "NAME", "ARGS", "MUTATE", "TIME"}),
    "COPY": frozenset({"INSTRUCTION", "DST", "SRC"}),
    "COPY_FROM": frozenset({"INSTRUCTION", "DST", "SRC"}),
    "RELEASE": frozenset({"INSTRUCTION", "NAME"}),
}


def _check_name(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise LogFormatError(f"{what} must be a tensor name (a string), got {value!r}")


def names_of(values: object, what: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise LogFormatError(f"{what} must be a list of tensor names, got {values!r}")
    for value in values:
        _check_name(value, f"each of {what}")
    return tuple(values)


def _ints(values: object, what: str) -> tuple[int, ...]:
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise LogFormatError(f"{what} must be a list of integers, got {values!r}")
    for value in values:
        _check_count(value, f"each of {what}")
    return tuple(values)


def _check_count(value: object, what: str) -> None:
    """A non-negative int (bytes, nanoseconds, an argument index)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LogFormatError(f"{what} must be an integer, got {value!r}")
    if value < 0:
        raise LogFormatError(f"{what} must not be negative, got {value}")


@dataclass(frozen=True)
class Annotate:
    """`ANNOTATE`: a marker. "START" begins the logged step (records before it
    are not replayed); "BACKWARD" marks the start of the backward pass."""

    annotation: str

    def __post_init__(self) -> None:
        if not isinstance(self.annotation, str):
            raise LogFormatError(f"ANNOTATION must be a string, got {self.annotation!r}")


@dataclass(frozen=True)
class Constant:
    """`CONSTANT` and its `MEMORY` line: a tensor the step did not compute
    (weights, inputs). Constants are pinned: never evicted.

    Attributes:
      name: the tensor's name.
      memory: its size in bytes.
    """

    name: str
    memory: int

    def __post_init__(self) -> None:
        _check_name(self.name, "NAME")
        _check_count(self.memory, "MEMORY")


@dataclass(frozen=True)
class Call:
    """`CALL` and, per result, its `MEMORY` and `ALIAS` lines: a pure operator call.

    Attributes:
      name: the operator, e.g. "cudnn_convolution".
      args: argument tensor names, in order (a name may repeat).
      result: result tensor names, new and distinct.
      time: compute cost in nanoseconds.
      memory: per result, its size in bytes as logged. A view's logged size
        is kept but adds no memory: it shares its argument's storage.
      alias: per result, -1 for a new storage, or the index in `args` of the
        argument whose storage the result views.
    """

    name: str
    args: tuple[str, ...]
    result: tuple[str, ...]
    time: int
    memory: tuple[int, ...]
    alias: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_name(self.name, "NAME")
        object.__setattr__(self, "args", names_of(self.args, "ARGS"))
        object.__setattr__(self, "result", names_of(self.result, "RESULT"))
        object.__setattr__(self, "memory", _ints(self.memory, "MEMORY"))
        if isinstance(self.alias, str) or not isinstance(self.alias, (list, tuple)):
            raise LogFormatError(f"ALIAS must be a list of integers, got {self.alias!r}")
        object.__setattr__(self, "alias", tuple(self.alias))
        _check_count(self.time, "TIME")
        if not self.result:
            raise LogFormatError(f"CALL {self.name!r} has no RESULT")
        if len(set(self.result)) != len(self.result):
            raise LogFormatError(f"CALL {self.name!r} names a result twice: {list(self.result)}")
        if not len(self.memory) == len(self.alias) == len(self.result):
            raise LogFormatError(
                f"CALL {self.name!r} has {len(self.result)} results but {len(self.memory)} MEMORY "
                f"and {len(self.alias)} ALIAS entries"
            )
        for name, alias in zip(self.result, self.alias):
            if isinstance(alias, bool) or not isinstance(alias, int) or not -1 <= alias < len(self.args):
                raise LogFormatError(
                    f"ALIAS of {name!r} must be -1 or an index into the {len(self.args)} ARGS, got {alias!r}"
                )


@dataclass(frozen=True)
class Mutate:
    """`MUTATE`: an in-place operator call that overwrites some of its arguments.

    Attributes:
      name: the operator, e.g. "add_".
      args: argument tensor names, in order.
      mutate: the positions in `args` it overwrites (distinct).
      time: compute cost in nanoseconds.
    """

    name: str
    args: tuple[str, ...]
    mutate: tuple[int, ...]
    time: int

    def __post_init__(self) -> None:
        _check_name(self.name, "NAME")
        object.__setattr__(self, "args", names_of(self.args, "ARGS"))
        object.__setattr__(self, "mutate", _ints(self.mutate, "MUTATE"))
        _check_count(self.time, "TIME")
        if not self.mutate:
            raise LogFormatError(f"MUTATE {self.name!r} overwrites no argument (empty MUTATE list)")
        if len(set(self.mutate)) != len(self.mutate):
            raise LogFormatError(f"MUTATE {self.name!r} lists an argument position twice: {list(self.mutate)}")
        for index in self.mutate:
            if index >= len(self.args):
                raise LogFormatError(f"MUTATE index {index} is out of range for the {len(self.args)} ARGS")


@dataclass(frozen=True)
class Copy:
    """`COPY`: `dst = src` for a new name `dst`: one more reference to src's tensor."""

    dst: str
    src: str

    def __post_init__(self) -> None:
        _check_name(self.dst, "DST")
        _check_name(self.src, "SRC")


@dataclass(frozen=True)
class CopyFrom:
    """`COPY_FROM`: `dst = src` for an existing name `dst`: dst's old tensor
    loses a reference, src's tensor gains one."""

    dst: str
    src: str

    def __post_init__(self) -> None:
        _check_name(self.dst, "DST")
        _check_name(self.src, "SRC")


@dataclass(frozen=True)
class Release:
    """`RELEASE`: the program dropped one reference to a tensor."""

    name: str

    def __post_init__(self) -> None:
        _check_name(self.name, "NAME")


Record = Union[Annotate, Constant, Call, Mutate, Copy, CopyFrom, Release]
