"""Borealis DPC marks across a channel (docs/availability.md, "Marks across channels"), pure.

A channel written by a DPC task's union or join for a downstream task carries two more Arrow
columns in every DATA frame's table, after the stream's own:
- TENTATIVE_MARK (int64, null on a stable row): the episode of a tentative row;
- REVISION_MARK (int64): on the rows of the upstream's first re-run batch after episode N, N
  (null everywhere else): the stable rows of that re-run and after replace episode N's.
They are data like any column: the frame's body is an Arrow IPC stream checked against the
channel's schema (`executor.wire.decode_table`), and `check_marks` refuses a table whose marks
are not well formed (an episode out of range, a row both tentative and a revision, two episodes
revised in one batch), which the reader counts as a refused frame and asks again for; nothing
in a mark is ever run.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from common.dpc_view import MAX_EPISODE, REVISION_MARK, TENTATIVE_MARK
from common.types import ColumnType, Field, Schema

MARK_COLUMNS = (TENTATIVE_MARK, REVISION_MARK)
__all__ = ["MAX_EPISODE", "REVISION_MARK", "TENTATIVE_MARK", "MARK_COLUMNS", "MarkError",
           "with_marks", "carries_marks", "mark_table", "check_marks", "revision_of"]


class MarkError(ValueError):
    """A table whose marks are not well formed; the message says which and where."""


def with_marks(schema: Schema) -> Schema:
    """The wire schema of a marked channel: `schema` and the two mark columns."""
    clash = [name for name in MARK_COLUMNS if name in schema.names]
    if clash:
        raise ValueError(f"stream already has column(s) {clash}, reserved for DPC marks")
    return Schema((*schema.fields, Field(TENTATIVE_MARK, ColumnType.INT),
                   Field(REVISION_MARK, ColumnType.INT)))


def carries_marks(schema: pa.Schema) -> bool:
    return all(name in schema.names for name in MARK_COLUMNS)


def _episode_array(value: int | None, rows: int) -> pa.Array:
    if value is not None and not 1 <= value <= MAX_EPISODE:
        raise MarkError(f"episode {value} is outside 1..{MAX_EPISODE}")
    return pa.array([value] * rows, pa.int64())


def mark_table(table: pa.Table, schema: pa.Schema, tentative: int | None,
               revision: int | None) -> pa.Table:
    """`table`'s stream columns as the marked wire `schema`, every row tentative in episode
    `tentative` and revising episode `revision` (None: not); a row is never both."""
    if tentative is not None and revision is not None:
        raise MarkError(f"a batch both tentative ({tentative}) and revising ({revision})")
    stream = [name for name in schema.names if name not in MARK_COLUMNS]
    base = table.select(stream)
    rows = base.num_rows
    marked = base.append_column(TENTATIVE_MARK, _episode_array(tentative, rows)) \
        .append_column(REVISION_MARK, _episode_array(revision, rows))
    return marked.cast(schema)


def check_marks(table: pa.Table) -> int | None:
    """The episode `table` revises (None: none), or MarkError naming the first bad mark."""
    tentative, revision = table.column(TENTATIVE_MARK), table.column(REVISION_MARK)
    for name, column in ((TENTATIVE_MARK, tentative), (REVISION_MARK, revision)):
        if not pa.types.is_int64(column.type):
            raise MarkError(f"{name} is {column.type}, not int64")
        low, high = pc.min(column).as_py(), pc.max(column).as_py()
        if low is not None and (low < 1 or high > MAX_EPISODE):
            raise MarkError(f"{name} holds {low if low < 1 else high}, outside 1..{MAX_EPISODE}")
    both = pc.sum(pc.and_(pc.is_valid(tentative), pc.is_valid(revision))).as_py() or 0
    if both:
        raise MarkError(f"{both} row(s) both tentative and a revision")
    low, high = pc.min(revision).as_py(), pc.max(revision).as_py()
    if low != high:
        raise MarkError(f"one batch revises episodes {low} and {high}")
    return None if low is None else int(low)


def revision_of(table: pa.Table) -> int | None:
    """The episode a spooled batch of a marked channel revises (None: none; checked on
    arrival)."""
    if REVISION_MARK not in table.column_names:
        return None
    value = pc.max(table.column(REVISION_MARK)).as_py()
    return None if value is None else int(value)
