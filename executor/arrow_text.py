"""Typed values across Arrow as text, for the operators that keep Python state per key in
Spark's state store (`applyInPandasWithState`: the pattern operator, `executor.cep.spark`; count
windows and updating aggregates, `executor.keyed_state_frame`).

Every non-string column crosses as its text (ints and timestamps as decimal integers, doubles as
Java prints them), so nulls, NaN and 64-bit values arrive unchanged; results come back the same
way and are cast to their types. Pure but for the Spark Column expressions it builds.
"""

from __future__ import annotations

import math
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from common.types import ColumnType, Field


def to_text(stream: str, field: Field, name: str | None = None) -> Column:
    """The column `stream`.`field` as text, named `name` (default: the field's name)."""
    column = F.col(f"`{stream}`.`{field.name}`")
    if field.type is ColumnType.TIMESTAMP:
        column = F.unix_micros(column)
    return column.cast("string").alias(field.name if name is None else name)


def from_text(value: Any, kind: ColumnType) -> Any:
    """A text value back as the Python value of its type (None for null or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if kind in (ColumnType.INT, ColumnType.TIMESTAMP):
        return int(value)
    if kind is ColumnType.DOUBLE:
        return float(value)
    if kind is ColumnType.BOOLEAN:
        return value == "true"
    return value


def text(value: Any) -> str | None:
    """A Python result value as the text `typed` casts back (Java's spelling of NaN and the
    infinities)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    return str(value)


def typed(name: str, kind: ColumnType) -> Column:
    """The text column `name` cast to `kind`."""
    column = F.col(f"`{name}`")
    if kind is ColumnType.TIMESTAMP:
        return F.timestamp_micros(column.cast("bigint")).alias(name)
    return column.cast(kind.spark_type_name()).alias(name)
