"""foreachBatch sinks of Elastiq task queries: jsonl file (exactly-once), console, channel, the
splitter's partitioned channels, and control tuples to the scheduler.

Owns how a micro-batch leaves Spark: rows are taken out as Arrow (`DataFrame.toArrow()`), turned
into JSON lines (`executor.json_lines`), or sent on a channel tagged with the batch id
(the split sink sends one table per partition channel, the partition of a row computed by Spark
as pmod(Murmur3 hash of the key columns, k), identical in every process).
The file sink is exactly-once across crashes: after each append it atomically replaces a sidecar
`<file>.commit` holding (last batch id, file length, the file's device and inode); a batch id at
or below the recorded one is skipped, and any bytes past the recorded length (a torn append) are
truncated before writing, only in the file the mark names. The file is opened once through
`common.safe_open` and checked to be the same file before every batch.
The control sink turns each micro-batch into control requests (`plan_control`, pure) and sends
them through the scheduler's API client; it is at most once per batch, never exactly once.
Does not own queries (`executor.runtime`) or the channel protocol (`executor.channels`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, TextIO

import pyarrow as pa
import pyarrow.compute as pc

from common.api_client import RequestRejected, SchedulerUnavailable
from common.atomic_file import replace_file
from common.operator_schemas import CONTROL_COLUMNS
from common import safe_open, upsert_log
from common.paths import PathRoots, confine, executor_roots
from common.safe_open import RootedPath, rooted
from executor.json_lines import table_to_lines
from executor import dpc_marks, routing

log = logging.getLogger(__name__)


# --- the exactly-once append log ----------------------------------------------------------------

FileIdentity = tuple[int, int]  # (device, inode) of a sink's file
MARK_BYTES = 4096  # a commit mark is read up to this many bytes


@dataclass(frozen=True)
class CommitMark:
    """What the sidecar records: the last batch id appended, the file length after it, which
    run of the query wrote it (its checkpoint: batch ids only mean something within one) and
    which file it describes (device, inode; None in a mark written before marks named it)."""

    batch_id: int
    length: int
    owner: str = ""
    file: FileIdentity | None = None


class UnreadableMark(ValueError):
    """A sidecar that is not a commit mark (damaged from outside: we replace it atomically)."""


def parse_mark(data: bytes, shown: str) -> CommitMark:
    """The commit mark `data` holds; UnreadableMark when it is not one (pure)."""
    try:
        fields = json.loads(data.decode("utf-8", errors="replace"))
        found = fields.get("file")
        file = None if found is None else (int(found[0]), int(found[1]))
        mark = CommitMark(int(fields["batch_id"]), int(fields["length"]),
                          str(fields.get("owner", "")), file)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        raise UnreadableMark(f"{shown} is not a commit mark ({type(exc).__name__})") from None
    if mark.length < 0:
        raise UnreadableMark(f"{shown} records a negative length")
    return mark


def read_mark(path: str) -> CommitMark | None:
    """The sidecar at `path`; None when there is none, UnreadableMark when it is not one."""
    try:
        with open(path, "rb") as f:
            data = f.read(MARK_BYTES)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise UnreadableMark(f"{path} is not a commit mark (a folder)") from None
    return parse_mark(data, path)


def trusted_mark(mark: CommitMark | None, size: int,
                 file: FileIdentity) -> CommitMark:
    """What a mark says about the sink's file of `size` bytes and identity `file` (pure): a
    missing mark, one that records more bytes than the file holds, or one written for another
    file says nothing true, so the file is taken as it is (as if another run wrote it): its
    bytes are never cut to a length recorded for some other file."""
    if mark is None or mark.length > size or (mark.file is not None and mark.file != file):
        return CommitMark(-1, size, "", file)
    return mark


def mark_text(mark: CommitMark) -> str:
    fields: dict[str, Any] = {"batch_id": mark.batch_id, "length": mark.length,
                              "owner": mark.owner}
    if mark.file is not None:
        fields["file"] = list(mark.file)
    return json.dumps(fields)


def write_mark(path: str, mark: CommitMark) -> None:
    replace_file(path, mark_text(mark), fsync=True)


def should_write(mark: CommitMark | None, batch_id: int) -> bool:
    """A batch is written unless the sidecar shows it (or a later one) already appended."""
    return mark is None or batch_id > mark.batch_id


def adopt(mark: CommitMark | None, owner: str) -> CommitMark | None:
    """The mark as seen by run `owner`: a mark written by another run (an earlier deployment
    with its own checkpoint) says nothing about this run's batch ids, so this run appends after
    that run's committed bytes."""
    if mark is None or mark.owner == owner:
        return mark
    return CommitMark(-1, mark.length, owner, mark.file)


def opening_mark(mark: CommitMark | None, size: int, file: FileIdentity) -> CommitMark:
    """The mark a sink writes when it opens its file (pure): the one there, naming the file
    when it did not yet (a mark from before marks named files, whose length the file holds);
    otherwise the file as it is (`trusted_mark`), so a later torn append is cut back to what
    the file held when the sink found it, and never further."""
    if mark is not None and mark.file is None and mark.length <= size:
        return CommitMark(mark.batch_id, mark.length, mark.owner, file)
    return trusted_mark(mark, size, file)


class JsonlAppendLog:
    """An append-only jsonl file whose batches are written at most once (and, with Spark's
    replay of uncommitted batches, exactly once).

    The file and its folder are opened once, from the path root (`common.safe_open`: no link
    followed at any step, a regular file with one link), and kept open; before each batch the
    path is walked again and must still name them (`same_file`), so a file, folder or link
    swapped in while the query runs makes the batch fail (FileRefused) without a byte written
    anywhere. The commit mark is read and replaced through the folder's descriptor and names
    the file's device and inode: the sink only ever cuts back (a torn append) the file that a
    mark it wrote describes."""

    def __init__(self, path: str, owner: str = "", roots: PathRoots | None = None,
                 where: RootedPath | None = None) -> None:
        """`where`: the file as its root and the names below it, placed by the caller (a
        partition's file below its sink's folder: no link in it resolved, none followed);
        otherwise `path` is confined to `roots` and placed now (`common.safe_open.rooted`)."""
        self.path = path if where is None else where.path
        self.owner = owner  # the run appending (its checkpoint folder)
        self.mark_path = f"{self.path}.commit"
        if where is None:
            chosen = roots if roots is not None else executor_roots()
            where = rooted(confine(path, os.getcwd(), chosen), chosen)
        self.where = where
        self._mark_name = f"{self.where.name}.commit"
        self._folder, self._fd, self.created = _open_sink_file(self.where, self._mark_name)
        self._lock = threading.Lock()
        try:
            found = self._read_mark()
            opening = opening_mark(found, self._size(), self.file)
            if opening != found:  # (unchanged: not rewritten, so an attempt being fenced out
                self._write_mark(opening)  # cannot put back a mark older than its successor's)
        except BaseException:
            self.close()
            raise

    @property
    def file(self) -> FileIdentity:
        return safe_open.identity(self._fd)

    def _size(self) -> int:
        return os.fstat(self._fd).st_size

    def _read_mark(self) -> CommitMark | None:
        """The sidecar (read through the folder's descriptor); a damaged one is reported and
        taken as no mark (this run appends after the file's bytes: a batch written just before
        the damage may then be written twice, never lost or truncated away)."""
        try:
            data = safe_open.read_in(self._folder, self._mark_name, MARK_BYTES)
            return None if data is None else parse_mark(data, self.mark_path)
        except (UnreadableMark, safe_open.FileRefused) as exc:
            log.error("file sink %s: %s; appending after its %s bytes", self.path, exc,
                      self._size())
            return None

    def _write_mark(self, mark: CommitMark) -> None:
        replace_file(self._mark_name, mark_text(mark), fsync=True, dir_fd=self._folder)

    def _mark(self) -> CommitMark | None:
        return adopt(trusted_mark(self._read_mark(), self._size(), self.file), self.owner)

    def _truncate_to(self, mark: CommitMark | None) -> None:
        """Cut a torn append: only ever this sink's own file, to a length a mark naming it
        recorded (`trusted_mark`)."""
        length = mark.length if mark else 0
        if self._size() != length:
            os.ftruncate(self._fd, length)

    def append(self, batch_id: int, lines: list[str]) -> bool:
        """Append a batch's lines; False if that batch id was already written. FileRefused
        (nothing written) when the path no longer names the file the sink opened."""
        with self._lock:
            safe_open.same_file(self.where, self._folder, self._fd)
            mark = self._mark()
            if not should_write(mark, batch_id):
                return False
            self._truncate_to(mark)
            if not lines:  # nothing to make durable: no fsync, no new mark (a replay adds nothing)
                return True
            _write_all(self._fd, "".join(line + "\n" for line in lines).encode("utf-8"))
            os.fsync(self._fd)
            self._write_mark(CommitMark(batch_id, self._size(), self.owner, self.file))
            return True

    def remove_if_unused(self) -> None:
        """Unlink the file and mark this log made at open, if no batch went into the file."""
        if not self.created or self._size() != 0:
            return
        for name in (self.where.name, self._mark_name):
            try:
                os.unlink(name, dir_fd=self._folder)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        for fd in (self._fd, self._folder):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd = self._folder = -1

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            self.close()


def _open_sink_file(where: RootedPath, mark_name: str) -> tuple[int, int, bool]:
    """(folder, file descriptor, whether created) of a sink's file, before any batch is: its
    folders made (0700), the file opened for appending (created empty if missing). OSError
    (FileRefused for a link, a file that is not regular or has other links) when it cannot be
    used or its folder (where the commit mark lives) may not be written."""
    folder, fd, created = safe_open.open_file(where, write=True, create=True)
    try:
        if stat.S_ISDIR(_lstat_mode(folder, mark_name)):
            raise IsADirectoryError(errno.EISDIR, "is a folder, not a file",
                                    where.sibling(mark_name).path)
        if not os.access(".", os.W_OK, dir_fd=folder):
            raise PermissionError(errno.EACCES, "its folder may not be written (the commit "
                                                "mark lives next to the file)", where.path)
    except BaseException:
        if created:
            os.unlink(where.name, dir_fd=folder)
        os.close(fd)
        os.close(folder)
        raise
    return folder, fd, created


def _lstat_mode(folder: int, name: str) -> int:
    try:
        return os.lstat(name, dir_fd=folder).st_mode
    except FileNotFoundError:
        return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# --- sinks (callables for foreachBatch) ---------------------------------------------------------

class BatchSink(Protocol):
    rows_out: int

    def __call__(self, df: Any, batch_id: int) -> None: ...


class FileSink:
    """JSON lines appended exactly once; with `upsert_key`, each line an upsert record naming
    its key columns (`common.upsert_log`); with `deletes_by` too (a key column, an updating
    top-n's rank), a row whose value there is negative is a deletion of the key with that value
    negated."""

    def __init__(self, task_id: str, path: str, owner: str = "",
                 roots: PathRoots | None = None,
                 upsert_key: Sequence[str] | None = None,
                 deletes_by: str | None = None) -> None:
        if deletes_by is not None and (upsert_key is None or deletes_by not in upsert_key):
            raise ValueError(f"deletes_by {deletes_by!r} is not a column of the upsert key")
        self.task_id = task_id
        self.key = None if upsert_key is None else tuple(upsert_key)
        self.deletes_by = deletes_by
        self.prefix = None if upsert_key is None else upsert_log.record_prefix(upsert_key)
        self.log = JsonlAppendLog(path, owner, roots)
        self.roots = roots
        self.rows_out = 0

    def retarget(self, path: Any) -> Callable[[], None]:
        """Append the next batches to `path`; returns how to go back to the current file.
        Opened (`JsonlAppendLog`: confined, no link followed) before anything changes: OSError
        or PathRefused, the sink still on its file, when the new one cannot be used."""
        before, self.log = self.log, JsonlAppendLog(str(path), self.log.owner, self.roots)
        moved = self.log
        log.info("task %s: sink moves from %s to %s", self.task_id, before.path, path)

        def undo() -> None:
            self.log = before
            moved.remove_if_unused()  # the empty file (and mark) the open made
            moved.close()
        return undo

    def lines(self, table: pa.Table) -> list[str]:
        """The batch's lines as this sink writes them: its rows, or upsert records and
        deletions (pure)."""
        if self.prefix is None:
            return table_to_lines(table)
        if self.deletes_by is None:
            return [upsert_log.keyed_line(self.prefix, line) for line in table_to_lines(table)]
        assert self.key is not None
        gone = pc.fill_null(pc.less(table[self.deletes_by], 0), False)
        deleted = table.filter(gone).select(list(self.key))
        at = deleted.column_names.index(self.deletes_by)
        deleted = deleted.set_column(at, self.deletes_by, pc.negate(deleted[self.deletes_by]))
        remove = upsert_log.record_prefix(self.key, upsert_log.DELETE_MEMBER)
        return ([upsert_log.keyed_line(self.prefix, line)
                 for line in table_to_lines(table.filter(pc.invert(gone)))]
                + [upsert_log.keyed_line(remove, line) for line in table_to_lines(deleted)])

    def __call__(self, df: Any, batch_id: int) -> None:
        lines = self.lines(df.toArrow())
        if self.log.append(batch_id, lines):
            self.rows_out += len(lines)
            log.debug("task %s: batch %s -> %s rows to %s", self.task_id, batch_id, len(lines),
                      self.log.path)
        else:
            log.info("task %s: batch %s already in %s, skipped", self.task_id, batch_id,
                     self.log.path)


class ConsoleSink:
    def __init__(self, task_id: str, out: Callable[[], TextIO] = lambda: sys.stdout) -> None:
        self.task_id = task_id
        self.out = out
        self.rows_out = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        lines = table_to_lines(df.toArrow())
        stream = self.out()
        for line in lines:
            stream.write(f"[{self.task_id} #{batch_id}] {line}\n")
        stream.flush()
        self.rows_out += len(lines)


class DiscardSink:
    """Computes every row of each micro-batch and keeps none (Spark's `noop` writer: the rows
    are produced in the JVM, nothing is collected to the driver), counting them: a query's
    cost without its output's, as Flink's blackhole connector."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.rows_out = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import Observation, functions as F

        seen = Observation(f"discard-{self.task_id}-{batch_id}")
        df.observe(seen, F.count(F.lit(1)).alias("rows")).write.format("noop") \
            .mode("overwrite").save()
        self.rows_out += int(seen.get["rows"])


class ChannelSink:
    """Sends each micro-batch as one Arrow table tagged with its batch id; the writer drops a
    tag it has already sent, so a replayed batch is not sent twice."""

    def __init__(self, task_id: str, writer: Any, schema: pa.Schema) -> None:
        self.task_id = task_id
        self.writer = writer
        self.schema = schema
        self.rows_out = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        table = df.toArrow()
        if dpc_marks.carries_marks(self.schema):  # a marked channel, its task without DPC
            table = dpc_marks.mark_table(table, self.schema, None, None)
        table = table.select(self.schema.names).cast(self.schema)
        seq = self.writer.send(table, batch_id)
        self.rows_out += table.num_rows
        log.debug("task %s: batch %s -> seq %s (%s rows)", self.task_id, batch_id, seq,
                  table.num_rows)


PARTITION_COLUMN = "__elastiq_partition"
# Under an event-time switch a splitter's rows carry this mark: true for a tick, a copy of the
# batch's latest row that only moves a retiring instance's watermark (`executor.routing`)
TICK_COLUMN = "__elastiq_tick"
# Under a sliding window's switch, each copy of a row counts only for the windows starting in
# [from, until) (null: unbounded), so a window spanning the switch is whole on its one instance
FROM_COLUMN, UNTIL_COLUMN = "__elastiq_from", "__elastiq_until"
HIDDEN_COLUMNS = (TICK_COLUMN, FROM_COLUMN, UNTIL_COLUMN)  # the splitter adds them, never Spark


class SplitChannelSink:
    """Sends each micro-batch as k tables, partition i to `writers[i]`, every one tagged with the
    batch id (an empty partition still advances its writer's tag, so seqs stay aligned with
    batch ids and a replayed batch is dropped by every writer). Spark adds each row's key hash
    (`hash`, a Column over the stream's columns); the partition is pmod(hash, n) with the n
    the routing schedule (`executor.routing`) has in force, at the row's event time for a
    stateful operator (`switch`), whose schedule is kept in `schedule_path` across restarts.
    `folded`: the last writer feeds the instance folded into the merger's task, which gets
    every row while n is 0 and none otherwise (a stateless operator split or merged)."""

    def __init__(self, task_id: str, writers: list[Any], schema: pa.Schema, hash: Any,
                 schedule: routing.Schedule, switch: routing.Switch | None = None,
                 schedule_path: str | None = None, folded: bool = False) -> None:
        self.task_id = task_id
        self.writers = writers
        self.schema = schema
        self.hash = hash
        self.schedule = schedule
        self.switch = switch
        self.schedule_path = schedule_path
        self.folded = folded
        self.rows_out = 0
        self.late_rows = 0

    def route(self, hash: Any) -> Callable[[], None]:
        """Hash the next batches' rows by `hash` (a new key); returns how to go back."""
        before, self.hash = self.hash, hash

        def undo() -> None:
            self.hash = before
        return undo

    def rescale(self, n: int, at: int | None = None) -> tuple[Callable[[], None], int | None]:
        """Route the next batches to `n` partitions: at once (stateless), for rows from the
        next window start on (a window), or from the event time `at` the scheduler planned
        (a join's splitters, ValueError when this one is past it already); returns how to go
        back and the switch's event time (ms; None: at once)."""
        before = self.schedule
        if at is not None and self.switch is not None:
            self.schedule = routing.rescaled_at(before, n, at, self.switch.spread_ms)
        else:
            self.schedule, at = routing.rescaled(before, n, self.switch)
        self._persist()

        def undo() -> None:
            self.schedule = before
            self._persist()
        return undo, at

    def _persist(self) -> None:
        if self.schedule_path is not None:
            routing.save(self.schedule_path, self.schedule)

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        table = df.select(*[F.col(f"`{n}`") for n in self.schema.names
                            if n not in HIDDEN_COLUMNS],
                          self.hash.alias(PARTITION_COLUMN)).toArrow()
        hashes = table.column(PARTITION_COLUMN).to_numpy(zero_copy_only=False)
        times = self._times(table)
        if times is not None and len(times):
            latest = int(times.max())
            if self.schedule.max_seen is None or latest > self.schedule.max_seen:
                self.schedule.max_seen = latest
                self._persist()
        rest = table.drop_columns([PARTITION_COLUMN])
        if self.switch is not None:
            rest = rest.append_column(TICK_COLUMN, pa.array([False] * rest.num_rows))
        if self.switch is not None and self.switch.sliding and times is not None:
            copies = routing.sliding_copies(hashes, times, self.schedule,
                                            self.switch.window_ms, self.switch.slide)
            rest, parts, times = self._bounded(rest.take(copies.rows), copies), copies.parts, \
                times[copies.rows]
        elif self.switch is not None and self.switch.spread_ms and times is not None:
            rows, parts = routing.spread_partitions(hashes, times, self.schedule,
                                                    self.switch.spread_ms)
            rest, times = rest.take(rows), times[rows]
        elif self.folded and self.schedule.active == 0:
            parts = routing.folded(len(hashes), len(self.writers))
        else:
            parts = routing.partitions(hashes, times, self.schedule)
        keep = None
        if times is not None and self.switch is not None:
            late = routing.too_late(parts, times, self.schedule, self.switch.horizon_ms)
            if late.any():
                self.late_rows += int(late.sum())
                keep = ~late
        rest = rest.select(self.schema.names).cast(self.schema)
        ticks = self._ticks(rest, times)
        for index, writer in enumerate(self.writers):
            mask = parts == index if keep is None else (parts == index) & keep
            part = rest.filter(pa.array(mask))
            if index in ticks and ticks[index] is not None:
                part = pa.concat_tables([part, ticks[index]])
            seq = writer.send(part, batch_id)
            log.debug("task %s: batch %s partition %s -> seq %s (%s rows)", self.task_id,
                      batch_id, index + 1, seq, part.num_rows)
        self.rows_out += table.num_rows

    def _bounded(self, rows: pa.Table, copies: routing.Copies) -> pa.Table:
        """`rows` (a batch's row copies) with the window-start bounds of each copy."""
        for name, bound in ((FROM_COLUMN, copies.lo), (UNTIL_COLUMN, copies.hi)):
            unit = self.schema.field(name).type
            ms = pa.array(bound, mask=bound == routing.UNBOUNDED, type=pa.int64())
            rows = rows.append_column(name, ms.cast(pa.timestamp("ms")).cast(unit))
        return rows

    def _times(self, table: pa.Table) -> Any:
        """The rows' event times in ms (None for a stateless operator)."""
        if self.switch is None:
            return None
        column = table.column(self.switch.time)
        unit = {"s": 1000, "ms": 1, "us": 1 / 1000, "ns": 1 / 1_000_000}[column.type.unit]
        raw = column.cast(pa.int64()).to_numpy(zero_copy_only=False)
        return (raw * unit).astype("int64") if unit != 1 else raw

    def _ticks(self, rows: pa.Table, times: Any) -> dict[int, pa.Table | None]:
        """A copy of the batch's latest row, marked as a tick, for each partition a scale-in
        retires: it moves that instance's watermark past the switch, and its window operator
        drops it after the watermark saw it (`runtime._without_ticks`)."""
        if self.switch is None or times is None or not len(times):
            return {}
        slots = routing.ticked(self.schedule, self.switch.horizon_ms)
        if not slots:
            return {}
        latest = rows.slice(int(times.argmax()), 1)
        marks = latest.schema.get_field_index(TICK_COLUMN)
        tick = latest.set_column(marks, TICK_COLUMN, pa.array([True]))
        self.schedule.ticks += 1
        self._persist()
        return {i: tick for i in slots}


# --- control tuples: the closed loop ------------------------------------------------------------

ControlTuple = tuple[str, str, str]  # (operator, parameter, value)


@dataclass(frozen=True)
class ControlPlan:
    """What one micro-batch of a control stream asks for: per query (sorted), the tuples of
    its one request (sorted, no duplicates); and what was left out, each with the reason."""

    requests: tuple[tuple[str, tuple[ControlTuple, ...]], ...]
    dropped: tuple[str, ...] = ()


def plan_control(rows: Iterable[Mapping[str, Any]]) -> ControlPlan:
    """The control requests of a batch's rows (dicts with the four control columns), pure.

    A row with a null column is no tuple and is left out. Equal rows count once. A query for
    which the batch sets one parameter to two values gets nothing from this batch: the rows of
    a micro-batch have no order, so neither value is the later one."""
    values: dict[str, dict[tuple[str, str], set[str]]] = {}
    nulls = 0
    for row in rows:
        cells = [row.get(c) for c in CONTROL_COLUMNS]
        if any(cell is None for cell in cells):
            nulls += 1
            continue
        query, operator, parameter, value = (str(cell) for cell in cells)
        values.setdefault(query, {}).setdefault((operator, parameter), set()).add(value)
    dropped = [f"{nulls} row(s) with a null column (no tuple)"] if nulls else []
    requests = []
    for query in sorted(values):
        clashes = sorted(f"{o}.{p} = {' | '.join(sorted(v))}"
                         for (o, p), v in values[query].items() if len(v) > 1)
        if clashes:
            dropped.append(f"query {query}: one batch sets {'; '.join(clashes)}; nothing sent "
                           "to it from this batch")
            continue
        requests.append((query, tuple(sorted((o, p, next(iter(v)))
                                             for (o, p), v in values[query].items()))))
    return ControlPlan(tuple(requests), tuple(dropped))


class ControlClient(Protocol):
    """What the control sink needs of `common.api_client.SchedulerClient`."""

    def control(self, query_id: str, tuples: list[ControlTuple]) -> dict[str, Any]: ...


class ControlSink:
    """Sends each micro-batch's control tuples to the scheduler, one request per query the
    batch names (all or nothing at the scheduler, which checks every tuple: rows are data, never
    code). Nothing is sent for an empty batch, nor for a query whose tuples equal the last ones
    the scheduler accepted from this sink (a monitor repeating its verdict every window does not
    rebuild the controlled query every window; that memory starts empty with every start of the
    task's query, so a restarted sink may send its last tuples once more, which sets the same
    values again). A refused request (bad tuple, unknown query, a change still being applied) is
    logged and not retried: the next batch that asks for it sends it again. When the scheduler
    cannot be reached the batch's tuples are logged and dropped, and the query goes on. Not
    exactly once: a replayed batch may send its tuples again (the same values). An accepted
    request a task later refuses is undone by the scheduler; this sink does not follow it."""

    def __init__(self, task_id: str, client: ControlClient,
                 out: Callable[[], TextIO] = lambda: sys.stdout) -> None:
        self.task_id = task_id
        self.client = client
        self.out = out  # what it sends and how the scheduler answered, as a console sink shows
        self.last_sent: dict[str, tuple[ControlTuple, ...]] = {}
        self.rows_out = 0  # tuples the scheduler accepted
        self.sent = self.unchanged = self.refused = self.unreachable = 0  # requests

    def __call__(self, df: Any, batch_id: int) -> None:
        table = df.toArrow()
        if table.num_rows:
            self.send(batch_id, table.select(list(CONTROL_COLUMNS)).to_pylist())

    def send(self, batch_id: int, rows: list[dict[str, Any]]) -> None:
        """Send one batch's rows (dicts with the four control columns)."""
        plan = plan_control(rows)
        for note in plan.dropped:
            log.warning("task %s: control batch %s: %s", self.task_id, batch_id, note)
        for query, tuples in plan.requests:
            if self.last_sent.get(query) == tuples:
                self.unchanged += 1
                log.debug("task %s: control batch %s: %s unchanged, not sent", self.task_id,
                          batch_id, query)
                continue
            shown = f"control {query}: {describe_tuples(tuples)}"
            try:
                reply = self.client.control(query, list(tuples))
            except RequestRejected as exc:
                self.refused += 1
                log.warning("task %s: control batch %s: %s refused %s: %s", self.task_id,
                            batch_id, query, list(tuples), exc)
                self._show(batch_id, f"{shown} -> refused: {exc}")
                continue
            except SchedulerUnavailable as exc:
                self.unreachable += 1
                log.warning("task %s: control batch %s: tuples for %s dropped %s: %s",
                            self.task_id, batch_id, query, list(tuples), exc)
                self._show(batch_id, f"{shown} -> not sent, the scheduler is unreachable")
                continue
            self.last_sent[query] = tuples
            self.sent += 1
            self.rows_out += len(tuples)
            log.info("task %s: control batch %s: %s %s -> request %s", self.task_id, batch_id,
                     query, list(tuples), reply.get("request", "?"))
            self._show(batch_id, f"{shown} -> accepted as request {reply.get('request', '?')} "
                                 f"({reply.get('state', 'pending')})")

    def _show(self, batch_id: int, line: str) -> None:
        stream = self.out()
        stream.write(f"[{self.task_id} #{batch_id}] {line}\n")
        stream.flush()


def describe_tuples(tuples: Sequence[ControlTuple]) -> str:
    """`hot.condition = 'raw.temp > 35', src.rate = '10'` (pure)."""
    return ", ".join(f"{t[0]}.{t[1]} = {t[2]!r}" for t in tuples)
