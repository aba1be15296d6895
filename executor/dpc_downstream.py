"""A task downstream of a DPC task: its file or console sink writes the marks its marked channel
input brought (docs/availability.md, "Marks across channels").

The task's stream keeps each row's tentative episode in the hidden column
`dpc_marks.TENTATIVE_MARK` through its filters and projections (a row derived from a tentative
row is tentative); `MarkedSink` writes such a row with `"_tentative": N`, the upstream's episode,
as the upstream's own file sink would. A revision travels on the spooled batches of the channel
(`dpc_marks.REVISION_MARK`), not through Spark (a filter could drop every row carrying it):
micro-batch b writes `{"_revision": N}` before its rows when a spooled batch it read (the seqs
between its offsets and batch b - 1's in Spark's offset log) revises episode N. The spooled
batches of a micro-batch stay until Spark commits it, so a replayed batch finds them again.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from executor import dpc_marks, spool
from executor.dpc import TENTATIVE_COLUMN, revision_line, write_lines
from executor.json_lines import table_to_lines
from executor.sources import batch_offsets


def derived_lines(table: pa.Table) -> list[str]:
    """The JSON lines of a micro-batch whose rows carry TENTATIVE_MARK: stable rows as they are,
    tentative ones with `"_tentative": N` (pure)."""
    if dpc_marks.TENTATIVE_MARK not in table.column_names:
        return table_to_lines(table)
    mark = table.column(dpc_marks.TENTATIVE_MARK)
    rest = table.drop_columns([dpc_marks.TENTATIVE_MARK])
    valid = pc.is_valid(mark)
    stable = rest.filter(pc.invert(valid))
    tentative = rest.filter(valid).append_column(TENTATIVE_COLUMN, mark.filter(valid))
    return table_to_lines(stable) + table_to_lines(tentative)


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
                    episode = dpc_marks.revision_of(pa.ipc.open_file(source).read_all())
                if episode is not None:
                    found.add(episode)
    return sorted(found)


class MarkedSink:
    """A file or console sink (`inner`) fed by a marked channel's rows: tentative rows carry
    `_tentative`, a micro-batch that read a revision starts with its record."""

    def __init__(self, inner: Any, spark_dir: str, spools: Sequence[tuple[str, str]]) -> None:
        from executor import sinks

        if isinstance(inner, sinks.FileSink) and inner.prefix is not None:
            raise TypeError("an upsert file sink does not write DPC marks")
        if not isinstance(inner, (sinks.FileSink, sinks.ConsoleSink)):
            raise TypeError(f"DPC marks are written by file and console sinks, not "
                            f"{type(inner).__name__}")
        self.inner, self.spark_dir, self.spools = inner, spark_dir, tuple(spools)
        self.rows_out = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        lines = [revision_line(e) for e in revisions_in(self.spark_dir, batch_id, self.spools)]
        lines += derived_lines(df.toArrow())
        self.rows_out += write_lines(self.inner, batch_id, batch_id, lines)
