"""Column types of the dataflow language and stream schemas.

Owns the closed set of column types a user can name in a spec, how each maps to a Spark SQL type
and an Arrow type, and `Schema`, the ordered, typed column list of a stream. Does not own
expressions (see `compiler.expr`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterator


class ColumnType(str, Enum):
    """A column type as written in a spec (`<column type="...">`)."""

    INT = "int"  # 64-bit signed integer
    DOUBLE = "double"  # IEEE 754 binary64
    STRING = "string"  # UTF-8 text
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"  # microsecond precision, UTC

    @property
    def is_numeric(self) -> bool:
        return self in (ColumnType.INT, ColumnType.DOUBLE)

    @property
    def is_orderable(self) -> bool:
        return self is not ColumnType.BOOLEAN

    def spark_type_name(self) -> str:
        """Spark SQL's name of this type, as used in DDL schema strings."""
        return _SPARK_NAMES[self]

    @classmethod
    def names(cls) -> list[str]:
        return [t.value for t in cls]


_SPARK_NAMES = {
    ColumnType.INT: "bigint",
    ColumnType.DOUBLE: "double",
    ColumnType.STRING: "string",
    ColumnType.BOOLEAN: "boolean",
    ColumnType.TIMESTAMP: "timestamp",
}


@dataclass(frozen=True)
class Field:
    """One named, typed column of a stream."""

    name: str
    type: ColumnType


@dataclass(frozen=True)
class Schema:
    """The ordered columns of a stream; column names are unique."""

    fields: tuple[Field, ...]

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def get(self, name: str) -> Field | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None

    def ddl(self) -> str:
        """Spark DDL string such as `sensor string, ts timestamp` (names are validated
        identifiers, quoted with backticks all the same)."""
        return ", ".join(f"`{f.name}` {f.type.spark_type_name()}" for f in self.fields)

    def to_json(self) -> list[dict[str, str]]:
        return [{"name": f.name, "type": f.type.value} for f in self.fields]

    @classmethod
    def from_json(cls, data: list[dict[str, str]]) -> "Schema":
        return cls(tuple(Field(d["name"], ColumnType(d["type"])) for d in data))

    @classmethod
    def of(cls, *pairs: tuple[str, str | ColumnType]) -> "Schema":
        return cls(tuple(Field(n, ColumnType(t)) for n, t in pairs))
