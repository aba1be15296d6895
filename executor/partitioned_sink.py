"""A file sink partitioned by time: each row appended, exactly once, to the file of its time
partition, in Hive-style folders (`dt=2024-01-01/hm=10%3A15`) below the sink's folder.

Owns `partition_rows` (which rows of a batch go to which folders: the names are
`common.time_partitions`'), `PartitionedAppendLog` (one `executor.sinks.JsonlAppendLog` per
partition, opened when a batch first has rows for it, at most MAX_OPEN kept open) and
`PartitionedFileSink` (the foreachBatch sink). The sink's path is confined to the roots and
placed once, when the sink opens, as a plain file sink's is (`common.safe_open.rooted`); a
partition's file is that place with the partition's folders put before the file's name, its
folders made (0700) and opened from the root's descriptor without following any link, and
walked again before every batch (`JsonlAppendLog`): a link put or swapped in for a partition
folder fails the batch before a byte is written. The folder names come only from formatting
a timestamp, so no row's text becomes a path. Exactly once per partition: each partition's file
keeps its own commit mark, so a batch Spark replays is skipped in the partitions it reached and
written to the others. Does not own the names (`common.time_partitions`) or the append log.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common import safe_open, time_partitions
from common.paths import PathRoots, confine, executor_roots
from common.safe_open import RootedPath, rooted
from common.time_partitions import Level
from executor.json_lines import table_to_lines
from executor.sinks import JsonlAppendLog

log = logging.getLogger(__name__)

MAX_OPEN = 32  # partitions whose file and folder stay open (the least recently used close)
Folders = tuple[str, ...]
_PER_US = {"s": 1_000_000, "ms": 1_000, "us": 1}


def micros_of(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(microseconds since the epoch, 0 where null; whether null) of a timestamp column."""
    if not pa.types.is_timestamp(column.type):
        raise TypeError(f"a partition time must be a timestamp, not {column.type}")
    nulls = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    raw = np.asarray(pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False),
                     dtype=np.int64)
    unit = column.type.unit
    return (np.floor_divide(raw, 1_000) if unit == "ns" else raw * _PER_US[unit]), nulls


def partition_rows(table: pa.Table, time: str,
                   levels: tuple[Level, ...]) -> list[tuple[Folders, np.ndarray]]:
    """The folders of each partition the batch's rows fall in, by folders, with the indices of
    its rows in batch order: the rows' times grouped by `time_partitions.span_us`, each group
    named once."""
    micros, nulls = micros_of(table.column(time))
    span = time_partitions.span_us(levels)
    groups: dict[Folders, list[np.ndarray]] = {}
    valid = np.flatnonzero(~nulls)
    if len(valid):
        keys, inverse = np.unique(np.floor_divide(micros[valid], span), return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.cumsum(np.bincount(inverse, minlength=len(keys)))[:-1]
        for key, rows in zip(keys, np.split(valid[order], bounds)):
            folders = time_partitions.folder_names(levels, int(key) * span)
            groups.setdefault(folders, []).append(rows)
    if nulls.any():
        groups.setdefault(time_partitions.folder_names(levels, None), []).append(
            np.flatnonzero(nulls))
    return [(folders, np.sort(np.concatenate(parts))) for folders, parts in sorted(groups.items())]


class PartitionedAppendLog:
    """The partitions of one sink path, each an exactly-once `JsonlAppendLog` named
    `<folder of path>/<partition folders>/<file name of path>`."""

    def __init__(self, path: str, owner: str = "", roots: PathRoots | None = None) -> None:
        chosen = roots if roots is not None else executor_roots()
        self.path, self.owner = path, owner
        self.base = rooted(confine(path, os.getcwd(), chosen), chosen)
        _check_folder(self.base)
        self._open: OrderedDict[Folders, JsonlAppendLog] = OrderedDict()
        self._lock = threading.Lock()

    def where(self, folders: Folders) -> RootedPath:
        """A partition's file: the sink's place with its folders before the file's name."""
        parts = self.base.parts
        return RootedPath(self.base.root, parts[:-1] + folders + parts[-1:])

    def append(self, batch_id: int, partitions: Sequence[tuple[Folders, list[str]]]
               ) -> list[Folders]:
        """Append each partition's lines as batch `batch_id`; the partitions written (one that
        holds the batch already is skipped). FileRefused (or another OSError) from the first
        partition that cannot be written: those before it keep the batch, and Spark's replay
        writes the rest."""
        written = []
        with self._lock:
            for folders, lines in partitions:
                if self._log(folders).append(batch_id, lines):
                    written.append(folders)
        return written

    def _log(self, folders: Folders) -> JsonlAppendLog:
        found = self._open.pop(folders, None)
        if found is None:
            where = self.where(folders)
            found = JsonlAppendLog(where.path, self.owner, where=where)
        self._open[folders] = found
        while len(self._open) > MAX_OPEN:
            self._open.popitem(last=False)[1].close()
        return found

    def close(self) -> None:
        with self._lock:
            for opened in self._open.values():
                opened.close()
            self._open.clear()


def _check_folder(base: RootedPath) -> None:
    """The sink's folder is there (made 0700 if missing, no link followed) and may be written:
    OSError otherwise, before any batch."""
    folder = safe_open.open_folder(base, create=True)
    try:
        if not os.access(".", os.W_OK, dir_fd=folder):
            raise PermissionError(errno.EACCES, "its folder may not be written (the partition "
                                                "folders are made in it)", base.path)
    finally:
        os.close(folder)


class PartitionedFileSink:
    """JSON lines appended exactly once to the file of each row's time partition: `time` a
    timestamp column, `levels` the partition folders (`common.time_partitions`)."""

    def __init__(self, task_id: str, path: str, time: str, levels: tuple[Level, ...],
                 owner: str = "", roots: PathRoots | None = None) -> None:
        self.task_id, self.time, self.levels, self.roots = task_id, time, levels, roots
        self.log = PartitionedAppendLog(path, owner, roots)
        self.rows_out = 0

    def retarget(self, path: Any) -> Callable[[], None]:
        """Partition the next batches below `path`; returns how to go back. Its folder is
        checked (confined, no link followed, writable) before anything changes."""
        before, self.log = self.log, PartitionedAppendLog(str(path), self.log.owner, self.roots)
        moved = self.log
        log.info("task %s: partitioned sink moves from %s to %s", self.task_id, before.path, path)

        def undo() -> None:
            self.log = before
            moved.close()
        return undo

    def __call__(self, df: Any, batch_id: int) -> None:
        table = df.toArrow()
        lines = table_to_lines(table)
        parts = [(folders, [lines[i] for i in rows])
                 for folders, rows in partition_rows(table, self.time, self.levels)]
        written = set(self.log.append(batch_id, parts))
        self.rows_out += sum(len(rows) for folders, rows in parts if folders in written)
        if len(written) < len(parts):
            log.info("task %s: batch %s already in %s of its %s partitions, skipped there",
                     self.task_id, batch_id, len(parts) - len(written), len(parts))
