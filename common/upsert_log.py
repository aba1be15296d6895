"""The file sink's upsert log: how updating results (an `aggregate`'s, an updating `top-n`'s)
are written and read (pure).

Each record is one JSON object per line: the row's columns, and `@key`, the names of the columns
that identify the row (`{"@key":["category"],"category":10,"avg_price":12.5}`); a later
record with the same values in those columns replaces an earlier one. A deletion names its key
columns in `@delete` and has only those (`{"@delete":["auction","rank"],"auction":7,"rank":3}`):
the key leaves the view. The current view is the last record of each key not deleted since, in
the order the keys first appeared (after their last deletion). `@key` and `@delete` cannot be
column names (names are letters, digits and `_`). Does not own writing the file
(`executor.sinks.FileSink`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

KEY_MEMBER = "@key"
DELETE_MEMBER = "@delete"


def record_prefix(key: Sequence[str], member: str = KEY_MEMBER) -> str:
    """What the sink puts before a row's JSON members: `{"@key":[...],` (a deletion's:
    `{"@delete":[...],`)."""
    return "{" + json.dumps(member) + ":" + json.dumps(list(key), separators=(",", ":")) + ","


def keyed_line(prefix: str, line: str) -> str:
    """A row's JSON object line (`{...}`, at least one member) as an upsert record."""
    if not line.startswith("{") or line == "{}":
        raise ValueError(f"not a JSON object with members: {line[:40]!r}")
    return prefix + line[1:]


class UpsertLogError(ValueError):
    """A line that is not an upsert record; names the line."""


def current_view(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The last record of each key not deleted since (without `@key`), in the order keys first
    appeared (after their last deletion). Blank lines are skipped; any other line that is not a
    record or a deletion raises UpsertLogError with its number."""
    return _fold((f"line {number}", _parsed(number, line))
                 for number, line in enumerate(lines, 1) if line.strip())


def fold(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`current_view` of records already read (a DPC reader's stable or current view of an
    upsert log, `common.dpc_view.folded`); UpsertLogError names the first bad one's position."""
    return _fold((f"record {number}", dict(record)) for number, record in enumerate(records, 1))


def _fold(records: Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    view: dict[tuple, dict[str, Any]] = {}
    for where, record in records:
        member = _member(where, record)
        names = record.pop(member)
        key = tuple(json.dumps(record.get(n), sort_keys=True) for n in names)
        if member == KEY_MEMBER:
            view[key] = record
        else:
            view.pop(key, None)
    return list(view.values())


def _parsed(number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise UpsertLogError(f"line {number}: not JSON ({exc})") from None


def _member(where: str, record: Any) -> str:
    """Which of `@key` (a record) or `@delete` (a deletion) `record` has."""
    if not isinstance(record, dict):
        record = {}
    member = DELETE_MEMBER if DELETE_MEMBER in record and KEY_MEMBER not in record else KEY_MEMBER
    names = record.get(member)
    if not isinstance(names, list) or not all(isinstance(n, str) and n in record for n in names):
        raise UpsertLogError(f"{where}: not an upsert record (no {KEY_MEMBER} or "
                             f"{DELETE_MEMBER} naming its key columns)")
    return member


def is_record(record: Any) -> bool:
    """Whether `record` is an upsert record or deletion (has `@key` or `@delete`)."""
    return isinstance(record, dict) and (KEY_MEMBER in record or DELETE_MEMBER in record)


def read_current(path: str) -> list[dict[str, Any]]:
    """The current view of an upsert log file (a last line without a line feed, being
    written, is left out)."""
    return current_view(complete_lines(path))


def complete_lines(path: str) -> list[str]:
    """The lines of a file up to its last line feed (a last line without one, being written, is
    left out)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text[:text.rfind("\n") + 1].splitlines()
