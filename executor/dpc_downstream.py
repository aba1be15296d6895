"""A task downstream of a DPC task: its sink writes the marks its marked channel input brought
(docs/availability.md, "Marks across channels").

The task's stream keeps each row's tentative episode in the hidden column
`dpc_marks.TENTATIVE_MARK` through its filters and projections (a row derived from a tentative
row is tentative); `MarkedSink` writes each micro-batch with those marks as the upstream's own
sink of that kind would (`executor.dpc.write_marked`): a file or console sink's
`"_tentative": N`, a network sink's mark columns, a Kafka sink's `elastiq-tentative` header.
A revision travels on the spooled batches of the channel (`dpc_marks.REVISION_MARK`, or a
correction row), not through Spark (a filter could drop every row carrying it): micro-batch b
announces revision N before its rows (a file's `{"_revision": N}`, a network sink's revision
mark or correction row, a Kafka correction record), with or without rows of its own, when a
spooled batch it read (the seqs between its offsets and batch b - 1's in Spark's offset log)
revises episode N. The spooled batches of a micro-batch stay until Spark commits it, so a
replayed batch finds them again.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import pyarrow as pa

from executor import dpc_marks, spool
from executor.dpc import close_inner, refusal, write_marked
from executor.sources import batch_offsets


def row_marks(table: pa.Table) -> tuple[pa.Table, list[int | None]]:
    """A micro-batch's rows without TENTATIVE_MARK, and each row's tentative episode (None:
    stable) (pure)."""
    if dpc_marks.TENTATIVE_MARK not in table.column_names:
        return table, [None] * table.num_rows
    marks = table.column(dpc_marks.TENTATIVE_MARK).to_pylist()
    return table.drop_columns([dpc_marks.TENTATIVE_MARK]), marks


def _seq_of(offsets: list[dict], name: str) -> int | None:
    found = [o.get("seq") for o in offsets if o.get("spool") == name]
    return found[0] if found and isinstance(found[0], int) else None


def revisions_in(spark_dir: str, batch_id: int, spools: Sequence[tuple[str, str]]) -> list[int]:
    """The episodes the spooled batches of micro-batch `batch_id` revise, for `spools` (name,
    folder) of marked channels."""
    found: set[int] = set()
    now, before = batch_offsets(spark_dir, batch_id), batch_offsets(spark_dir, batch_id - 1)
    for name, folder in spools:
        end = _seq_of(now, name)
        start = _seq_of(before, name)
        if end is None:
            continue
        for seq, batch in spool.listing(folder).items():
            if (start is None or seq > start) and seq <= end:
                path = os.path.join(folder, spool.batch_name(seq, batch.chunks, batch.size))
                with pa.memory_map(path) as source:
                    found.update(dpc_marks.revisions_of(pa.ipc.open_file(source).read_all()))
    return sorted(found)


class MarkedSink:
    """A sink fed by a marked channel's rows (`inner`: a file or console sink, a marked network
    sink or a Kafka sink): tentative rows carry their episode, a micro-batch that read a
    revision announces it first."""

    def __init__(self, inner: Any, spark_dir: str, spools: Sequence[tuple[str, str]]) -> None:
        from executor import sinks

        reason = refusal(inner)
        if isinstance(inner, sinks.FileSink) and inner.prefix is not None:
            reason = "an upsert file sink after a marked stream (its rows' marks differ)"
        if reason is not None:
            raise TypeError(reason)
        self.inner, self.spark_dir, self.spools = inner, spark_dir, tuple(spools)
        self.rows_out = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        table, tentative = row_marks(df.toArrow())
        revisions = revisions_in(self.spark_dir, batch_id, self.spools)
        self.rows_out += write_marked(self.inner, table, tentative, revisions, batch_id,
                                      batch_id)

    def close(self) -> None:
        close_inner(self.inner)
