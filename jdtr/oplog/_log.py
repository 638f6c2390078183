"""Reading and writing the JSON-lines log format of the DTR prototype (App. C.6).

Reading never evaluates anything: each line goes through `json.loads` and is
then checked field by field. Every problem is reported with its line.
Writing produces one compact JSON object per line with sorted keys and all
numbers as strings, which is the prototype's own layout, so a log read and
written again comes back byte for byte.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Iterator, Optional

from ._errors import LogFormatError
from ._records import LOG_FIELDS, Annotate, Call, Constant, Copy, CopyFrom, Mutate, Record, Release, names_of

_INTEGER = re.compile(r"-?[0-9]+")


class _Line:
    """One parsed line: its number and its JSON object, fields checked."""

    __slots__ = ("number", "instruction", "fields")

    def __init__(self, number: int, fields: dict[str, Any]):
        self.number = number
        self.instruction: str = fields["INSTRUCTION"]
        self.fields = fields


def _error(problem: str, line: int, source: Optional[str]) -> LogFormatError:
    return LogFormatError(problem, line=line, source=source)


def _integer(value: Any, field: str) -> int:
    """A number written as a string, as the prototype writes them ("1200", "-1")."""
    if not isinstance(value, str):
        raise LogFormatError(f'{field} must be a number written as a string (e.g. "1200"), got {value!r}')
    if not _INTEGER.fullmatch(value):
        raise LogFormatError(f"{field} must be an integer, got {value!r}")
    digits = value.lstrip("+-").lstrip("0")
    if len(digits) > _MAX_DIGITS:  # before int(): Python refuses over 4,300 digits, and it takes time
        raise LogFormatError(f"{field} is too large ({len(digits)} digits; at most {_MAX_DIGITS})")
    return int(value)


# Sizes in bytes and times in nanoseconds fit in 64 bits (2**63 is 19 digits):
# 18 digits is 1 EB or 31 years, more than any real operator.
_MAX_DIGITS = 18


def _count(value: Any, field: str) -> int:
    """A non-negative number written as a string: bytes or nanoseconds."""
    number = _integer(value, field)
    if number < 0:
        raise LogFormatError(f"{field} must not be negative, got {value!r}")
    return number


def _at(line: _Line, value: Any, field: str, source: Optional[str]) -> int:
    """`_count` of a field of another line than the one being parsed, reported at that line."""
    try:
        return _count(value, field)
    except LogFormatError as err:
        raise _error(err.problem, line.number, source) from None


def _read_line(text: str, number: int, source: Optional[str]) -> _Line:
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as err:
        raise _error(f"not valid JSON ({err.msg} at column {err.colno})", number, source) from None
    except RecursionError:
        raise _error("not valid JSON (nested too deeply)", number, source) from None
    if not isinstance(fields, dict):
        raise _error(f"expected a JSON object, got {type(fields).__name__}", number, source)
    instruction = fields.get("INSTRUCTION")
    if instruction is None:
        raise _error("the object has no INSTRUCTION field", number, source)
    if not isinstance(instruction, str) or instruction not in LOG_FIELDS:
        known = ", ".join(sorted(LOG_FIELDS))
        raise _error(f"unknown instruction {instruction!r}; expected one of {known}", number, source)
    expected = LOG_FIELDS[instruction]
    missing = sorted(expected - fields.keys())
    if missing:
        raise _error(f"{instruction} lacks field(s) {', '.join(missing)}", number, source)
    unexpected = sorted(fields.keys() - expected)
    if unexpected:
        raise _error(f"{instruction} has unexpected field(s) {', '.join(unexpected)}", number, source)
    return _Line(number, fields)


def _decoded(lines: Iterable["str | bytes"], source: Optional[str]) -> Iterator[_Line]:
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise _error(f"not UTF-8 text ({err.reason} at byte {err.start})", number, source) from None
        text = raw.strip()
        if text:  # blank lines carry nothing
            yield _read_line(text, number, source)


def _expect(
    lines: list[_Line], position: int, instruction: str, name: str, owner: _Line, source: Optional[str]
) -> _Line:
    """The line at `position`, which must be `instruction` for tensor `name`."""
    what = f"the {instruction} line of {name!r} (for the {owner.instruction} on line {owner.number})"
    if position >= len(lines):
        raise _error(f"the log ends where {what} was expected", owner.number, source)
    line = lines[position]
    if line.instruction != instruction:
        raise _error(f"expected {what}, found {line.instruction}", line.number, source)
    if line.fields["NAME"] != name:
        raise _error(f"expected {what}, found one for {line.fields['NAME']!r}", line.number, source)
    return line


def parse_lines(lines: Iterable["str | bytes"], source: Optional[str] = None) -> tuple[list[Record], list[int]]:
    """Parses log lines into records and the line number where each record starts.

    Raises:
      LogFormatError: on the first malformed line, naming it.
    """
    parsed = list(_decoded(lines, source))
    records: list[Record] = []
    numbers: list[int] = []
    position = 0
    while position < len(parsed):
        line = parsed[position]
        fields = line.fields
        position += 1
        try:
            if line.instruction == "CONSTANT":
                memory = _expect(parsed, position, "MEMORY", fields["NAME"], line, source)
                position += 1
                record: Record = Constant(fields["NAME"], _at(memory, memory.fields["MEMORY"], "MEMORY", source))
            elif line.instruction == "CALL":
                result = names_of(fields["RESULT"], "RESULT")
                sizes, aliases = [], []
                for name in result:
                    memory = _expect(parsed, position, "MEMORY", name, line, source)
                    alias = _expect(parsed, position + 1, "ALIAS", name, line, source)
                    position += 2
                    sizes.append(_at(memory, memory.fields["MEMORY"], "MEMORY", source))
                    try:
                        aliases.append(_integer(alias.fields["ALIAS"], "ALIAS"))
                    except LogFormatError as err:
                        raise _error(err.problem, alias.number, source) from None
                record = Call(fields["NAME"], fields["ARGS"], result, _count(fields["TIME"], "TIME"), sizes, aliases)
            elif line.instruction == "MUTATE":
                record = Mutate(fields["NAME"], fields["ARGS"], fields["MUTATE"], _count(fields["TIME"], "TIME"))
            elif line.instruction == "COPY":
                record = Copy(fields["DST"], fields["SRC"])
            elif line.instruction == "COPY_FROM":
                record = CopyFrom(fields["DST"], fields["SRC"])
            elif line.instruction == "RELEASE":
                record = Release(fields["NAME"])
            elif line.instruction == "ANNOTATE":
                record = Annotate(fields["ANNOTATION"])
            else:  # MEMORY or ALIAS: they only ever complete a CONSTANT or a CALL
                raise LogFormatError(
                    f"{line.instruction} line for {fields['NAME']!r} does not follow a CONSTANT or CALL of that tensor"
                )
        except LogFormatError as err:
            if err.line is not None:
                raise
            raise _error(err.problem, line.number, source) from None
        records.append(record)
        numbers.append(line.number)
    return records, numbers


def _objects(record: Record) -> list[dict[str, Any]]:
    """The log lines of one record, as JSON objects."""
    if isinstance(record, Call):
        objects: list[dict[str, Any]] = [
            {
                "INSTRUCTION": "CALL",
                "NAME": record.name,
                "ARGS": list(record.args),
                "RESULT": list(record.result),
                "TIME": str(record.time),
            }
        ]
        for name, memory, alias in zip(record.result, record.memory, record.alias):
            objects.append({"INSTRUCTION": "MEMORY", "NAME": name, "MEMORY": str(memory)})
            objects.append({"INSTRUCTION": "ALIAS", "NAME": name, "ALIAS": str(alias)})
        return objects
    if isinstance(record, Constant):
        return [
            {"INSTRUCTION": "CONSTANT", "NAME": record.name},
            {"INSTRUCTION": "MEMORY", "NAME": record.name, "MEMORY": str(record.memory)},
        ]
    if isinstance(record, Mutate):
        return [
            {
                "INSTRUCTION": "MUTATE",
                "NAME": record.name,
                "ARGS": list(record.args),
                "MUTATE": list(record.mutate),
                "TIME": str(record.time),
            }
        ]
    if isinstance(record, Copy):
        return [{"INSTRUCTION": "COPY", "DST": record.dst, "SRC": record.src}]
    if isinstance(record, CopyFrom):
        return [{"INSTRUCTION": "COPY_FROM", "DST": record.dst, "SRC": record.src}]
    if isinstance(record, Release):
        return [{"INSTRUCTION": "RELEASE", "NAME": record.name}]
    if isinstance(record, Annotate):
        return [{"INSTRUCTION": "ANNOTATE", "ANNOTATION": record.annotation}]
    raise TypeError(f"not a trace record: {record!r}")


def format_lines(records: Iterable[Record]) -> list[str]:
    """The log lines of `records`, without line terminators."""
    return [
        json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        for record in records
        for obj in _objects(record)
    ]
