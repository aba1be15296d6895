"""Borealis DPC marks across a channel (docs/availability.md, "Marks across channels"), pure.

A channel written by a DPC task's union or join for a downstream task (or a network sink's
channel for any reader) carries two more Arrow columns in every DATA frame's table, after the
stream's own:
- TENTATIVE_MARK (int64, null on a stable row): the episode of a tentative row;
- REVISION_MARK (int64): on the stable rows of a batch that revises episode N, N (null
  everywhere else): the stable rows of that batch and after replace episode N's.
A batch that revises but has no stable row to carry it (a downstream filter dropped them all),
or revises several episodes, carries one correction row per episode first instead: both marks
N, every stream column null (no data row is ever both tentative and a revision). A reader of
the Spark side drops correction rows (`without_corrections`); the revision is read from the
spooled batch (`revisions_of`).
They are data like any column: the frame's body is an Arrow IPC stream checked against the
channel's schema (`executor.wire.decode_table`), and `check_marks` refuses a table whose marks
are not well formed (an episode out of range, a row tentative in one episode and revising
another, a correction row with data, two episodes revised by one batch's stable rows), which
the reader counts as a refused frame and asks again for; nothing in a mark is ever run.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from common.dpc_view import MAX_EPISODE, REVISION_MARK, TENTATIVE_MARK
from common.types import ColumnType, Field, Schema

MARK_COLUMNS = (TENTATIVE_MARK, REVISION_MARK)
__all__ = ["MAX_EPISODE", "REVISION_MARK", "TENTATIVE_MARK", "MARK_COLUMNS", "MarkError",
           "with_marks", "carries_marks", "mark_rows", "mark_table", "check_marks",
           "revisions_of", "without_corrections", "without_superseded"]


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


def _check_episodes(episodes: Sequence[int | None]) -> None:
    for value in episodes:
        if value is not None and not 1 <= value <= MAX_EPISODE:
            raise MarkError(f"episode {value} is outside 1..{MAX_EPISODE}")


def mark_rows(table: pa.Table, schema: pa.Schema, tentative: Sequence[int | None],
              revisions: Sequence[int]) -> pa.Table:
    """`table`'s stream columns as the marked wire `schema`, row i tentative in episode
    `tentative[i]` (None: stable), the batch revising the episodes `revisions`: as
    REVISION_MARK on its stable rows when it revises one episode and has a stable row, else as
    one correction row per episode first (both marks the episode, no data)."""
    _check_episodes([*tentative, *revisions])
    stream = [name for name in schema.names if name not in MARK_COLUMNS]
    base = table.select(stream)
    marks = pa.array(list(tentative), pa.int64())
    stable = [value is None for value in tentative]
    carried = len(revisions) == 1 and any(stable)
    revision = pa.array([revisions[0] if carried and s else None for s in stable], pa.int64())
    marked = base.append_column(TENTATIVE_MARK, marks).append_column(REVISION_MARK, revision)
    if not revisions or carried:
        return marked.cast(schema)
    episodes = pa.array(sorted(set(revisions)), pa.int64())
    corrections = pa.table({**{f.name: pa.nulls(len(episodes), f.type)
                               for f in schema if f.name not in MARK_COLUMNS},
                            TENTATIVE_MARK: episodes, REVISION_MARK: episodes})
    return pa.concat_tables([corrections.cast(schema), marked.cast(schema)])


def mark_table(table: pa.Table, schema: pa.Schema, tentative: int | None,
               revision: int | None) -> pa.Table:
    """`mark_rows` for a batch marked as a whole: every row tentative in episode `tentative`,
    or the batch revising episode `revision` (None: not); never both."""
    if tentative is not None and revision is not None:
        raise MarkError(f"a batch both tentative ({tentative}) and revising ({revision})")
    return mark_rows(table, schema, [tentative] * table.num_rows,
                     [] if revision is None else [revision])


def _corrections(table: pa.Table) -> pa.ChunkedArray:
    """Whether each row is a correction row (both marks valid)."""
    return pc.and_(pc.is_valid(table.column(TENTATIVE_MARK)),
                   pc.is_valid(table.column(REVISION_MARK)))


def check_marks(table: pa.Table) -> list[int]:
    """The episodes `table` revises, or MarkError naming the first bad mark."""
    tentative, revision = table.column(TENTATIVE_MARK), table.column(REVISION_MARK)
    for name, column in ((TENTATIVE_MARK, tentative), (REVISION_MARK, revision)):
        if not pa.types.is_int64(column.type):
            raise MarkError(f"{name} is {column.type}, not int64")
        low, high = pc.min(column).as_py(), pc.max(column).as_py()
        if low is not None and (low < 1 or high > MAX_EPISODE):
            raise MarkError(f"{name} holds {low if low < 1 else high}, outside 1..{MAX_EPISODE}")
    both = _corrections(table)
    other = pc.sum(pc.and_(both, pc.not_equal(tentative, revision))).as_py() or 0
    if other:
        raise MarkError(f"{other} row(s) tentative in one episode and revising another")
    corrections = table.filter(both)
    data = [name for name in table.column_names if name not in MARK_COLUMNS
            and corrections.column(name).null_count != corrections.num_rows]
    if data:
        raise MarkError(f"a correction row (both marks) holds data in {data[:3]}")
    carried = pc.unique(revision.filter(pc.invert(both))).drop_null()
    if len(carried) > 1:
        raise MarkError(f"one batch's rows revise episodes {sorted(carried.to_pylist())[:2]}")
    return revisions_of(table)


def revisions_of(table: pa.Table) -> list[int]:
    """The episodes a batch of a marked channel revises, sorted (none: []; a spooled batch's
    marks were checked on arrival)."""
    if REVISION_MARK not in table.column_names:
        return []
    return sorted(int(e) for e in pc.unique(table.column(REVISION_MARK)).drop_null().to_pylist())


def without_corrections(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` without its correction rows (what Spark reads of a marked channel's spool: a
    correction row is no data, its revision is read from the spool)."""
    if not carries_marks(batch.schema):
        return batch
    both = pc.and_(pc.is_valid(batch.column(TENTATIVE_MARK)),
                   pc.is_valid(batch.column(REVISION_MARK)))
    return batch.filter(pc.invert(both)) if pc.any(both).as_py() else batch


def without_superseded(batch: pa.RecordBatch, superseded: int) -> pa.RecordBatch:
    """`batch` without its tentative rows of episodes 1..`superseded` (a stateful downstream
    task's re-run from its stable point: the upstream's stable re-run rows replace them,
    docs/availability.md, "A stateful downstream task"); as it is when `superseded` is 0 or it
    carries no marks."""
    if superseded <= 0 or TENTATIVE_MARK not in batch.schema.names:
        return batch
    tentative = batch.column(TENTATIVE_MARK)
    gone = pc.fill_null(pc.less_equal(tentative, superseded), False)
    return batch.filter(pc.invert(gone)) if pc.any(gone).as_py() else batch
