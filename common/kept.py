"""The fraction of input a shed stream's rows reflect (issue 32; docs/load.md, "What a sink's
rows say about shedding"), pure: what the validator, the compiler and the runtime share.

Owns the two column names and their meaning, the reserved-name check, and the arithmetic:
- KEPT (double), from a drop operator on: the row's keep share, the probability that a row like
  it survived every drop it passed (1 - ratio; semantic drops: 1 - high_ratio for the rows
  `keep` is true of, 1 - ratio for the others), multiplied across drops in series. Stateless
  operators carry it row by row. A window aggregate's result holds instead the fraction of its
  input it reflects, estimated Horvitz-Thompson style: each kept row stands for 1/share
  arrivals, so the fraction is kept rows / sum over them of 1/share (`estimate`).
- LOST (boolean), on a window aggregate's results only: some row of the window had a share
  under 1, i.e. the window lost input (`lost`; exact, where the estimate's float could round).
Does not own running it (`executor.runtime`) nor where shed points are (`compiler.validate`).
"""

from __future__ import annotations

from collections.abc import Iterable

from common.types import ColumnType, Field, Schema

KEPT = "kept"
LOST = "lost_input"
RESERVED = (KEPT, LOST)


def keep_share(ratio: float, high_ratio: float = 0.0, worth: bool = False) -> float:
    """A row's keep share at one drop: 1 - the ratio that applies to it."""
    return 1.0 - (high_ratio if worth else ratio)


def estimate(shares: Iterable[float]) -> float:
    """The fraction of its input a window of kept rows with these shares reflects: n / sum(1 /
    share) (1.0 for a window none of whose rows was shed; every share is above 0, a row at
    share 0 was dropped)."""
    values = list(shares)
    if not values:
        raise ValueError("a window has at least one row")
    if any(not 0.0 < s <= 1.0 for s in values):
        raise ValueError(f"a share is outside (0, 1]: {values}")
    return len(values) / sum(1.0 / s for s in values)


def lost(shares: Iterable[float]) -> bool:
    """The window lost input: some of its rows passed a drop that was shedding."""
    return any(s < 1.0 for s in shares)


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
