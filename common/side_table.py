"""A lookup join's side table: a bounded file of typed rows, parsed in plain Python (pure).

Owns how the bytes of a side file (JSON lines, one object per line with the declared type's
columns as keys; or CSV with a header row naming them) become rows of the declared type, and
every problem with them, each naming the file's line: the compiler reports them at the spec's
`path` value (`compiler.validate.check_side_table`), the runtime refuses the task with them
(`executor.runtime.TaskRuntime.lookup_join`). Nothing in a side file is ever code: values are
read by `json` and `csv` and converted by the closed table below. Does not open files (the
runtime reads them through `common.safe_open`, the compiler through `common.paths`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime, timezone
from typing import Any, Callable

from common.types import ColumnType, Schema

# A side table is read whole into the task's driver and broadcast to Spark's tasks: at most this
# many bytes (Nexmark q13's side input is 10,000 short rows, ~150 KB).
MAX_SIDE_BYTES = 16 * 1024 * 1024
# At most this many problems are listed (then how many more there are).
MAX_PROBLEMS = 20
FORMATS = ("jsonl", "csv")

Row = tuple[Any, ...]


class SideTableError(ValueError):
    """A side file that is not rows of its type: every problem, each naming its line."""

    def __init__(self, problems: list[str]) -> None:
        shown = problems[:MAX_PROBLEMS]
        more = len(problems) - len(shown)
        super().__init__("; ".join(shown) + (f"; and {more} more" if more else ""))
        self.problems = problems


def format_of(path: str, given: str | None) -> str:
    """The side file's format: as given, else csv for a `.csv` name, else jsonl (pure)."""
    return given or ("csv" if path.endswith(".csv") else "jsonl")


def parse(data: bytes, fmt: str, schema: Schema) -> list[Row]:
    """The rows of a side file's bytes, in the column order of `schema`; SideTableError with
    every problem (a file over MAX_SIDE_BYTES, bytes that are not UTF-8, a line that is not an
    object, a missing CSV column, a value not of its column's type)."""
    if len(data) > MAX_SIDE_BYTES:
        raise SideTableError([f"the file has more than {MAX_SIDE_BYTES:,} bytes (a side table "
                              "is read whole into each task)"])
    if fmt not in FORMATS:
        raise SideTableError([f"format {fmt!r} is not one of {', '.join(FORMATS)}"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SideTableError([f"byte {exc.start} is not UTF-8"]) from None
    problems: list[str] = []
    rows = _jsonl(text, schema, problems) if fmt == "jsonl" else _csv(text, schema, problems)
    if problems:
        raise SideTableError(problems)
    return rows


def _jsonl(text: str, schema: Schema, problems: list[str]) -> list[Row]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: not JSON ({exc.msg})")
            continue
        if not isinstance(value, dict):
            problems.append(f"line {number}: not a JSON object")
            continue
        rows.append(tuple(_value(value.get(f.name), f.type, f.name, number, problems, False)
                          for f in schema))
    return rows


def _csv(text: str, schema: Schema, problems: list[str]) -> list[Row]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except (StopIteration, csv.Error):
        problems.append("line 1: no header row naming the columns")
        return []
    missing = [f.name for f in schema if f.name not in header]
    if missing:
        problems.append(f"line 1: the header has no column {', '.join(missing)} "
                        f"(it has {', '.join(header) or 'none'})")
        return []
    index = [header.index(f.name) for f in schema]
    rows = []
    try:
        for cells in reader:
            number = reader.line_num
            if not cells:
                continue
            if len(cells) != len(header):
                problems.append(f"line {number}: {len(cells)} field(s) where the header has "
                                f"{len(header)}")
                continue
            rows.append(tuple(_value(cells[i], f.type, f.name, number, problems, True)
                              for i, f in zip(index, schema)))
    except csv.Error as exc:
        problems.append(f"line {reader.line_num}: {exc}")
    return rows


def _value(raw: Any, kind: ColumnType, column: str, line: int, problems: list[str],
           text: bool) -> Any:
    """`raw` as a value of `kind` (None for null; in CSV, an empty field of a column that is
    not a string); a problem naming the line and column when it is not one."""
    if raw is None or (text and raw == "" and kind is not ColumnType.STRING):
        return None
    convert = (_TEXT if text else _JSON)[kind]
    try:
        return convert(raw)
    except (TypeError, ValueError, OverflowError):
        problems.append(f"line {line}: column {column!r} is {kind.value}, the value "
                        f"{_shown(raw)} is not")
        return None


def _shown(raw: Any) -> str:
    text = json.dumps(raw) if not isinstance(raw, str) else repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not -(2**63) <= raw < 2**63:
        raise ValueError(raw)
    return raw


def _double(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ValueError(raw)
    return float(raw)


def _string(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError(raw)
    return raw


def _boolean(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(raw)
    return raw


def _timestamp(raw: Any) -> datetime:
    """An ISO 8601 timestamp; without an offset, UTC."""
    if not isinstance(raw, str):
        raise ValueError(raw)
    value = datetime.fromisoformat(raw.strip())
    return (value.replace(tzinfo=timezone.utc) if value.tzinfo is None
            else value.astimezone(timezone.utc))


def _text_int(raw: str) -> int:
    if not raw.strip().lstrip("+-").isdigit() or not raw.strip().isascii():
        raise ValueError(raw)
    return _int(int(raw))


def _text_boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(raw)
    return lowered == "true"


def _text_double(raw: str) -> float:
    return _double(float(raw))


_JSON: dict[ColumnType, Callable[[Any], Any]] = {
    ColumnType.INT: _int, ColumnType.DOUBLE: _double, ColumnType.STRING: _string,
    ColumnType.BOOLEAN: _boolean, ColumnType.TIMESTAMP: _timestamp}
_TEXT: dict[ColumnType, Callable[[Any], Any]] = {
    ColumnType.INT: _text_int, ColumnType.DOUBLE: _text_double, ColumnType.STRING: _string,
    ColumnType.BOOLEAN: _text_boolean, ColumnType.TIMESTAMP: _timestamp}
