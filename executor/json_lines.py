"""JSON lines of Arrow tables: one compact JSON object per row, columns in table order.

Owns the text every JSON-writing sink emits (file sink, console, Kafka values, DPC's marked
lines): integers and booleans as JSON literals, doubles as Python's `repr` (NaN as null, the
infinities as the strings "Infinity" and "-Infinity"), text JSON-escaped to ASCII, timestamps as
ISO-8601 UTC with microseconds and a `Z`, nulls as null.

The common column types are encoded column by column (Arrow casts and C string escaping), which
is several times faster than building a dict per row; any other column (a nested type, a
timestamp outside years 1000-9999 or at another unit) goes value by value through the same rules.
Both paths give the same bytes (tests/test_json_lines.py holds them to a plain-Python oracle).
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime, timezone
from json.encoder import encode_basestring_ascii  # json.dumps' own
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ISO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_ARROW_ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # %S of a microsecond timestamp carries its fraction
# Python's %Y pads no year below 1000 and no datetime holds one past 9999: the column path
# formats only timestamps in between, the value path the rest.
_FIRST_US = int((datetime(1000, 1, 1, tzinfo=timezone.utc) - _EPOCH).total_seconds()) * 10**6
_LAST_US = int((datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc) - _EPOCH)
               .total_seconds()) * 10**6 + 999_999


def iso_utc(value: datetime) -> str:
    """An instant as ISO-8601 UTC with microseconds and a `Z` (a naive one is read as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime(_ISO_FORMAT)


def json_value(value: Any) -> Any:
    """A Python value as the JSON value it is written as (before `json.dumps`)."""
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def table_to_lines(table: pa.Table) -> list[str]:
    """One compact JSON object per row of `table`, columns in table order."""
    if table.num_columns == 0:
        return ["{}"] * table.num_rows
    names = [encode_basestring_ascii(name) for name in table.column_names]
    template = "{" + ",".join(f"{name.replace('%', '%%')}:%s" for name in names) + "}"
    columns = [encoded_column(column) for column in table.columns]
    return [template % values for values in zip(*columns)]


def encoded_column(column: pa.ChunkedArray) -> list[str]:
    """Each value of `column` as its JSON text."""
    encode = _COLUMN_ENCODERS.get(_kind(column.type))
    if encode is not None:
        encoded = encode(column)
        if encoded is not None:
            return encoded
    return [json.dumps(json_value(v), separators=(",", ":")) for v in column.to_pylist()]


def _kind(type_: pa.DataType) -> str:
    if pa.types.is_integer(type_):
        return "integer"
    if pa.types.is_boolean(type_):
        return "boolean"
    if pa.types.is_floating(type_):
        return "floating"
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "string"
    if pa.types.is_timestamp(type_) and type_.unit == "us":
        return "timestamp"
    return "other"


def _literals(column: pa.ChunkedArray) -> list[str]:
    """Integers and booleans: Arrow's text of them is JSON's."""
    return pc.fill_null(pc.cast(column, pa.string()), "null").to_pylist()


def _floats(column: pa.ChunkedArray) -> list[str]:
    return [_float_text(v) for v in column.to_pylist()]


def _float_text(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "null"
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    return repr(value)


def _strings(column: pa.ChunkedArray) -> list[str]:
    return ["null" if v is None else encode_basestring_ascii(v) for v in column.to_pylist()]


def _timestamps(column: pa.ChunkedArray) -> list[str] | None:
    """ISO-8601 UTC text of a microsecond timestamp column, or None when a value lies outside
    years 1000-9999 (the value path formats those)."""
    plain = column.cast(pa.timestamp("us"))  # the same instants (Arrow keeps UTC), zone dropped
    bounds = pc.min_max(plain.cast(pa.int64()))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is not None and (low < _FIRST_US or high > _LAST_US):
        return None
    text = pc.strftime(plain, format=_ARROW_ISO_FORMAT)
    return ["null" if v is None else f'"{v}"' for v in text.to_pylist()]


_COLUMN_ENCODERS: dict[str, Callable[[pa.ChunkedArray], list[str] | None]] = {
    "integer": _literals,
    "boolean": _literals,
    "floating": _floats,
    "string": _strings,
    "timestamp": _timestamps,
}
