"""The fraction of input a shed stream's rows reflect (issue 32; docs/load.md, "What a sink's
rows say about shedding"), pure: what the validator, the compiler and the runtime share.

Owns the two column names and their meaning, the reserved-name check, and the arithmetic:
- KEPT (double), from a drop operator on: the row's keep share, the probability that a row like
  it survived every drop it passed (1 - ratio; semantic drops: 1 - high_ratio for the rows
  `keep` is true of, 1 - ratio for the others), multiplied across drops in series. Stateless
  operators carry it row by row. A window aggregate's result holds instead the fraction of its
  input it reflects, estimated Horvitz-Thompson style: each kept row stands for 1/share
  arrivals, so the fraction is kept rows / sum over them of 1/share.
- LOST (boolean), on a window aggregate's results only: some row of the window had a share
  under 1, i.e. the window lost input (exact, where the estimate's float could round).
The arithmetic runs in Spark (`executor.runtime`: the drop's share, `_window_shares`);
tests/test_kept_share.py holds its plain-Python reference. Does not own running it nor where
shed points are (`compiler.validate`).
"""

from __future__ import annotations

from collections.abc import Iterable

from common.types import ColumnType, Field, Schema

KEPT = "kept"
LOST = "lost_input"
RESERVED = (KEPT, LOST)


def with_kept(schema: Schema) -> Schema:
    """A stream's schema from a drop on: its columns and KEPT (unchanged if it has it)."""
    if KEPT in schema.names:
        return schema
    return Schema((*schema.fields, Field(KEPT, ColumnType.DOUBLE)))


def without_kept(schema: Schema) -> Schema:
    return Schema(tuple(f for f in schema.fields if f.name not in RESERVED))


def carries(schema: Schema) -> bool:
    return KEPT in schema.names


def aggregate_fields() -> tuple[Field, Field]:
    """The columns a window aggregate over a shed stream appends to its results."""
    return Field(KEPT, ColumnType.DOUBLE), Field(LOST, ColumnType.BOOLEAN)


def clashes(names: Iterable[str]) -> list[str]:
    """The names among `names` (case-insensitively, as Spark resolves them) that are reserved
    for the shed columns."""
    return [n for n in names if n.casefold() in RESERVED]
