"""Output-schema facts that both the validator and the runtime use.

Owns the columns of a control stream, the aggregate functions and their result types, and the
names of a join's output columns (all pure). Does not own the operator catalogue
(`compiler.operators`).
"""

from __future__ import annotations

from common.types import ColumnType, Field, Schema

# The columns, all strings, of a control-sink's input: one control tuple per row.
CONTROL_COLUMNS = ("query", "operator", "parameter", "value")


AGGREGATE_FUNCTIONS = ("count", "sum", "avg", "min", "max", "count_distinct",
                       "approx_count_distinct", "max_by", "min_by")
# The relative standard deviation approx_count_distinct is asked for (Spark's HyperLogLog++).
APPROX_DISTINCT_RSD = 0.05
# Aggregates that take a second column, `by`: the value of `column` on the row with the
# largest (max_by) or least (min_by) `by`.
BY_FUNCTIONS = ("max_by", "min_by")


def aggregate_type(function: str, column: Field | None, by: Field | None = None) -> ColumnType:
    """The result type of an aggregate (pure): the counts -> int, avg -> double, else the
    input's; max_by and min_by also need an orderable `by` column."""
    if function == "count":
        return ColumnType.INT
    if column is None:
        raise ValueError(f"aggregate {function} needs a column")
    if function in ("count_distinct", "approx_count_distinct"):
        return ColumnType.INT
    if function in BY_FUNCTIONS:
        if by is None:
            least = "largest" if function == "max_by" else "least"
            raise ValueError(f"{function}({column.name}) needs a by column: {column.name} is "
                             f"taken from the row with the {least} value of it")
        if not by.type.is_orderable:
            raise ValueError(f"{function}({column.name}) needs an orderable by column, "
                             f"{by.name} is {by.type.value}")
        return column.type
    if function in ("sum", "avg") and not column.type.is_numeric:
        raise ValueError(f"{function}({column.name}) needs a numeric column, it is "
                         f"{column.type.value}")
    if function in ("min", "max") and not column.type.is_orderable:
        raise ValueError(f"{function}({column.name}) needs an orderable column")
    return ColumnType.DOUBLE if function == "avg" else column.type


def control_schema_problems(schema: Schema) -> list[str]:
    """What keeps a stream from being a control stream, whose columns are exactly query,
    operator, parameter and value, all strings, in any order (pure; empty when it is one)."""
    missing = [n for n in CONTROL_COLUMNS if schema.get(n) is None]
    extra = [f.name for f in schema if f.name not in CONTROL_COLUMNS]
    problems = [f"no column {', '.join(missing)}"] if missing else []
    problems += [f"{f.name} is {f.type.value}, not string" for f in schema
                 if f.name in CONTROL_COLUMNS and f.type is not ColumnType.STRING]
    problems += [f"other columns {', '.join(extra)}"] if extra else []
    return problems


def join_output_names(left: Schema, right: Schema, right_name: str) -> list[str]:
    """Right column names after renaming clashes with left names to f"{right}_{name}" (pure)."""
    taken = set(left.names)
    return [f"{right_name}_{n}" if n in taken else n for n in right.names]
