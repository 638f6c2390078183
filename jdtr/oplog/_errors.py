"""The error a malformed operator log raises."""

from __future__ import annotations

from typing import Optional


class LogFormatError(ValueError):
    """An operator log (or a list of trace records) that cannot be replayed.

    Attributes:
      problem: what is wrong, in words.
      line: the 1-based line of the log where it is wrong, when read from a log.
      record: the 0-based index of the offending record, when built from records.
      source: the log's path, when read from a file.
    """

    def __init__(
        self,
        problem: str,
        line: Optional[int] = None,
        record: Optional[int] = None,
        source: Optional[str] = None,
    ):
        self.problem = problem
        self.line = line
        self.record = record
        self.source = source
        if line is not None:
            where = f"line {line}"
        elif record is not None:
            where = f"record {record}"
        else:
            where = ""
        prefix = ", ".join(p for p in (source, where) if p)
        super().__init__(f"{prefix}: {problem}" if prefix else problem)
