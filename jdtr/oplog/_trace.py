"""`Trace`: an operator log of one training step, checked on construction."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Union

from ._log import format_lines, parse_lines
from ._program import Program, lower
from ._records import Record

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Trace:
    """An operator log in the DTR prototype's JSON-lines format (paper App. C.6).

    A trace is a sequence of records (`Constant`, `Call`, `Mutate`, `Copy`,
    `CopyFrom`, `Release`, `Annotate`), checked when it is built: a `Trace`
    always replays. Two traces are equal when their records are.

    Example:
      >>> trace = Trace.from_log("resnet32-56.log")       # doctest: +SKIP
      >>> jdtr.simulate(trace, 0.5).overhead               # doctest: +SKIP
      1.1068...

    Attributes:
      records: the instructions, in log order.
      line_numbers: the log line where each record starts (None when not read from a log).
      source: the log's path (None when not read from a file).

    Raises:
      LogFormatError: on construction, when the records cannot be replayed.
    """

    records: tuple[Record, ...]
    line_numbers: Optional[tuple[int, ...]] = field(default=None, compare=False, repr=False)
    source: Optional[str] = field(default=None, compare=False, repr=False)
    program: Program = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        records = tuple(self.records)
        object.__setattr__(self, "records", records)
        if self.line_numbers is not None:
            object.__setattr__(self, "line_numbers", tuple(self.line_numbers))
            if len(self.line_numbers) != len(records):
                raise ValueError(f"{len(self.line_numbers)} line numbers for {len(records)} records")
        # Lowering is the check: it resolves every name as a replay would.
        object.__setattr__(self, "program", lower(records, self.line_numbers, self.source))

    # ---------------------------------------------------------------- reading

    @classmethod
    def from_lines(cls, lines: Iterable["str | bytes"], source: Optional[str] = None) -> "Trace":
        """A trace from log lines (str or UTF-8 bytes, one JSON object each)."""
        records, numbers = parse_lines(lines, source)
        return cls(tuple(records), tuple(numbers), source)

    @classmethod
    def from_log(cls, path: PathLike) -> "Trace":
        """Reads a log file. Nothing in it is evaluated: each line goes through `json.loads`.

        Raises:
          LogFormatError: naming the first malformed line and what is wrong with it.
          OSError: when the file cannot be read.
        """
        data = Path(path).read_bytes()
        return cls.from_lines(data.splitlines(), source=os.fspath(path))

    # ---------------------------------------------------------------- writing

    def to_lines(self) -> list[str]:
        """The log lines, without terminators: compact JSON, sorted keys, numbers as strings."""
        return format_lines(self.records)

    def to_log(self, path: PathLike) -> None:
        """Writes the log; `Trace.from_log` reads back an equal trace (the same bytes for a prototype log)."""
        text = "".join(line + "\n" for line in self.to_lines())
        Path(path).write_bytes(text.encode("utf-8"))  # no newline translation

    def __len__(self) -> int:
        return len(self.records)
