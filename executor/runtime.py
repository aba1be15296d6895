"""The API generated task programs call to build one Spark Structured Streaming query.

Owns `TaskRuntime` (one instance per start of a task's query: sources, operators, exactly one
sink that starts the query; streams tracked by name, each DataFrame aliased with its stream name
so `executor.expression_lowering.to_column` can address columns as `stream`.`col`; the patterns'
plumbing calls too: identity, split sink, stream selector, deterministic batches; and, in `live`, the
parameters its running query takes without a rebuild: a sink's destination and routing) and
`ChannelHub`
(the executor-lifetime registry of channel writers, which must outlive any one query so a
restarted query finds its upstream backup intact). User text (conditions, computed columns)
only ever goes through `compiler.expr` (parsed and type-checked) and
`executor.expression_lowering` (lowered to Spark). Does not own supervision/restarts
(`executor.task_runner`), the sources and sinks themselves (`executor.sources`, `executor.sinks`)
or the channel protocol (`executor.channels`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence
from urllib.parse import quote

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from common.operator_schemas import (AGGREGATE_FUNCTIONS, APPROX_DISTINCT_RSD, aggregate_type, control_schema_problems,
                                     join_output_names)
from common import top_n
from common.top_n import OrderKey
from common.paths import PathRefused, confine_at_open
from common.tasks import splitter_op_id
from common.types import ColumnType, Field, Schema
from compiler import expr
from common.kafka_params import KafkaParamError, transactional_id
from common import keyed_aggregates, side_table, time_partitions
from common import kept as kept_share
from common.time_partitions import Level
from executor import (dpc_marks, kafka_handover, kafka_io, kafka_realtime, kafka_records,
                      keyed_state_frame, routing, shapes, sinks, spark_codegen, sources,
                      spool_source, top_n_frame)
from executor.cep import match as cep_match, spark as cep_spark, stage as cep_stage
from executor.batch_gate import BatchGate, await_commit
from executor.dpc import DpcController, DpcInput, DpcSink
from executor.dpc_downstream import MarkedSink, RedoController, RedoSink
from executor.partitioned_sink import PartitionedFileSink
from executor.fencing import Fence
from executor.channels.auth import (ChannelKeyError, TaskKeys, WriterAuth, parse_readers,
                                   read_key_file, reader_auth, save_key_file)
from executor.endpoints_file import endpoints_path
from executor.spool_receiver import Replica, SpoolReceiver
from executor.expression_lowering import to_column

if TYPE_CHECKING:
    from executor.channels import ChannelWriter

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^(\d+) (milliseconds|seconds|minutes|hours)$")

_CONF_LOCK = threading.Lock()
"""Held while a task's query is started with settings of its own (`spark_codegen`): a query
clones the session's SQL conf at start, so set -> start -> restore must not interleave with
another task's start on the shared session."""


CONTROL_TIMEOUT_SECONDS = 5.0
"""How long a control sink waits for the scheduler's answer; the micro-batch waits with it."""


class RuntimeSpecError(ValueError):
    """A task program asked for something invalid; names the task and operator."""

    def __init__(self, task_id: str, op: str, message: str) -> None:
        super().__init__(f"task {task_id}, operator {op}: {message}")
        self.task_id, self.op = task_id, op


class SwitchRefused(ValueError):
    """A join's splitter, relaunched while a rescale was pending, was launched with the planned
    switch time but had routed past it before it died: it cannot switch there. Not a broken
    program: the scheduler undoes the rescale and relaunches the task with the old routing."""

    def __init__(self, task_id: str, op: str, message: str) -> None:
        super().__init__(f"task {task_id}, operator {op}: {message}")


def parse_duration(text: str) -> timedelta:
    """A canonical duration "<n> milliseconds|seconds|minutes|hours" -> timedelta."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"duration {text!r} is not '<n> milliseconds|seconds|minutes|hours'")
    return timedelta(**{match.group(2): int(match.group(1))})


def channel_reader_id(task_id: str, channel: str) -> str:
    """The reader id a task's channel_source uses; the executor passes it to the writer as an
    expected reader so nothing is trimmed before the reading task subscribes."""
    return f"{task_id}/read:{channel}"


def _qcol(stream: str, name: str) -> Column:
    return F.col(f"`{stream}`.`{name}`")


Undo = Callable[[], None]


@dataclass(frozen=True)
class LiveParam:
    """A parameter the running query takes without a rebuild. `switch(value)` makes the sink use
    `value` from its next call on and returns how to go back; if it cannot, it raises and
    nothing changed. `program_value` is the program's own value (what a withdrawn change goes
    back to)."""

    program_value: Any
    switch: Callable[[Any], Undo]


@dataclass(frozen=True)
class Stream:
    name: str
    df: DataFrame
    schema: Schema


WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"  # Spark's mark of an event-time column


def blocked_of(stats: Mapping[str, Any]) -> tuple[float, float]:
    """(seconds the longest-blocked send has waited for backup room, seconds no reader has been
    subscribed to that writer); (0, 0) when no send waits."""
    waiting = [s for s in stats.values() if s.blocked_seconds > 0]
    if not waiting:
        return 0.0, 0.0
    worst = max(waiting, key=lambda s: s.blocked_seconds)
    return worst.blocked_seconds, worst.readerless_seconds


def retained_of_stats(stats: Mapping[str, Any]) -> dict[str, int]:
    """Per channel, the batches not yet acknowledged by every reader (0: its readers committed
    all it sent; a scale-in retires an instance then)."""
    return {c: s.retained_batches for c, s in stats.items()}


def with_tick(schema: Schema, bounded: bool = False) -> Schema:
    """A partition channel's schema under an event-time switch: the rows and their tick mark,
    and for a sliding window the window starts each row counts for (`routing.sliding_copies`)."""
    bounds = (Field(sinks.FROM_COLUMN, ColumnType.TIMESTAMP),
              Field(sinks.UNTIL_COLUMN, ColumnType.TIMESTAMP)) if bounded else ()
    return Schema((*schema.fields, Field(sinks.TICK_COLUMN, ColumnType.BOOLEAN), *bounds))


def _windowed_within_bounds(df: DataFrame, window: Column) -> DataFrame:
    """`df`'s rows, one per window they lie in (column `window`), kept only where the window
    starts within the row's bounds, the copy's share of a sliding window's switch; the bound
    columns dropped. Without bounds, `df` as it is (the window is taken when grouping)."""
    if sinks.FROM_COLUMN not in df.columns:
        return df
    start = F.col("window.start")
    lo, hi = F.col(f"`{sinks.FROM_COLUMN}`"), F.col(f"`{sinks.UNTIL_COLUMN}`")
    inside = (lo.isNull() | (start >= lo)) & (hi.isNull() | (start < hi))
    return (df.select(window.alias("window"), *[F.col(f"`{c}`") for c in df.columns])
            .where(inside).drop(sinks.FROM_COLUMN, sinks.UNTIL_COLUMN))


def _time_bounds(left: Column, right: Column, within: Column, end: Column | None
                 ) -> list[Column]:
    """A join's time condition: |left - right| <= within; with a right `end`, right <= left
    <= end and left <= right + within. Spark drops a left row's state once the watermark
    passes its time (left >= right) and a right row's once it passes right + within: both are
    conditions between the two watermarked time columns, which is what its state eviction
    reads; `end` alone bounds nothing (it is not an event-time column)."""
    if end is None:
        return [left >= right - within, left <= right + within]
    return [left >= right, left <= end, left <= right + within]


# A processing-time window's own time column (the micro-batch's timestamp): a spec's column names
# are identifiers (compiler/schema/dataflow.xsd), which have no spaces, so it clashes with none.
PROCESSING_TIME = "elastiq processing time"


def _without_ticks(df: DataFrame, time: str) -> DataFrame:
    """`df` without its splitter's ticks, dropped after the watermark saw them: a tick only
    moves an instance's event time on (a retiring instance's, past the switch). The condition
    names the event-time column `time` (true for every row that has one: ticks always do), so
    Spark's optimizer cannot push it below the watermark, as it does with other filters."""
    if sinks.TICK_COLUMN not in df.columns:
        return df
    keep = ~F.col(f"`{sinks.TICK_COLUMN}`") | F.col(f"`{time}`").isNull()
    return df.filter(keep).drop(sinks.TICK_COLUMN)


# Each aggregate function as a Spark aggregate of (column, by column). Spark refuses an exact
# distinct count in a streaming aggregation ("distinct aggregations are not supported"), so
# count_distinct counts the set of values the group's state holds (exact; its state grows with
# the distinct values of a window); approx_count_distinct is HyperLogLog++ at the stated rsd.
_AGGREGATES: dict[str, Callable[[Column, Column | None], Column]] = {
    "count": lambda c, _: F.count(c), "sum": lambda c, _: F.sum(c),
    "avg": lambda c, _: F.avg(c), "min": lambda c, _: F.min(c), "max": lambda c, _: F.max(c),
    "count_distinct": lambda c, _: F.size(F.collect_set(c)),
    "approx_count_distinct": lambda c, _: F.approx_count_distinct(c, APPROX_DISTINCT_RSD),
    "max_by": lambda c, by: F.max_by(c, _ordering(by)),
    "min_by": lambda c, by: F.min_by(c, _ordering(by)),
}


def _ordering(by: Column | None) -> Column:
    """max_by's and min_by's `by` column (`aggregate_type` refuses them without one)."""
    if by is None:
        raise ValueError("max_by and min_by need a by column")
    return by


def event_time_columns(df: DataFrame) -> set[str]:
    """The columns of `df` that carry a watermark from upstream in the same query."""
    return {f.name for f in df.schema.fields if WATERMARK_DELAY_KEY in f.metadata}


class ChannelHub:
    """Get-or-create channel writers by channel id; lives as long as the executor process."""

    def __init__(self, bind_host: str = "127.0.0.1") -> None:
        self.bind_host = bind_host
        self._writers: dict[str, "ChannelWriter"] = {}
        self._binds: dict[str, str | None] = {}  # the bind each writer was opened with
        self._owners: dict[str, str] = {}  # channel id -> the task whose sink writes it
        # channel id -> readers admitted before its writer opened (reader id -> key)
        self._admitted: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def writer(self, channel_id: str, schema: pa.Schema, *, bind: str | None = None,
               expected_readers: Sequence[str] = (),
               log_dir: str | None = None, auth: WriterAuth | None = None,
               open_readers: bool = False, owner: str | None = None,
               published: bool = False) -> "ChannelWriter":
        """The channel's writer, created on first use; `log_dir` makes its upstream backup
        durable there (a writer opened later on the same folder resumes from it). Asked for
        another `bind` than the writer has (a control tuple moved a network sink), the writer is
        closed and reopened there on the same log: numbering and unacknowledged batches carry
        over, its readers follow it to the new endpoint. `auth` and `open_readers`: see
        `ChannelWriter` (a writer that exists already keeps what it was opened with). `owner`:
        the task whose sink writes the channel (see `stats`)."""
        with self._lock:
            if owner is not None:
                self._owners[channel_id] = owner
            existing = self._writers.get(channel_id)
            if existing is not None and bind is not None and self._binds.get(channel_id) \
                    not in (None, bind):
                log.info("hub: channel %s moves from %s to %s", channel_id, existing.endpoint,
                         bind)
                del self._writers[channel_id]
                existing.close()
                existing = None
            if existing is not None:
                return existing
            from executor.channels import ChannelWriter

            kwargs: dict[str, Any] = {"expected_readers": list(expected_readers),
                                      "auth": auth, "open_readers": open_readers}
            if published:
                kwargs["published"] = True
            if bind is not None:
                kwargs["bind"] = bind
            if log_dir is not None:
                kwargs["log_dir"] = log_dir
            writer = ChannelWriter(channel_id, schema, **kwargs)
            for reader_id, key in self._admitted.get(channel_id, {}).items():
                writer.add_reader(reader_id, 0, key or None)
            self._writers[channel_id] = writer
            self._binds[channel_id] = bind
            log.info("hub: channel %s writer at %s", channel_id, writer.endpoint)
            return writer

    def stats(self, owner: str) -> dict[str, Any]:
        """The `WriterStats` of each channel `owner`'s sink writes, read once (`blocked_of`
        and `retained_of_stats` derive the heartbeat's figures from them)."""
        with self._lock:
            writers = {c: w for c, w in self._writers.items() if self._owners.get(c) == owner}
        return {c: w.stats() for c, w in writers.items() if hasattr(w, "stats")}

    def bind_of(self, channel_id: str) -> str | None:
        """The bind the channel's writer was opened with (None: a free local port)."""
        with self._lock:
            return self._binds.get(channel_id)

    def admit(self, channel_id: str, add: Mapping[str, str], drop: Sequence[str]) -> bool:
        """Another query's readers of a published channel come (reader id -> public key; None
        key on a plain-text writer) or go; False when this hub has no writer of it (its task
        starts with them in its launch keys, or it is gone)."""
        with self._lock:
            kept = self._admitted.setdefault(channel_id, {})
            kept.update(add)
            for reader_id in drop:
                kept.pop(reader_id, None)
            writer = self._writers.get(channel_id)
        if writer is None:
            return False
        for reader_id in drop:
            writer.drop_reader(reader_id)
        for reader_id, key in add.items():
            writer.add_reader(reader_id, 0, key or None)
        return True

    def release(self, channel_id: str) -> None:
        """Close a channel's writer and free its port (its task was killed or has ended)."""
        with self._lock:
            writer = self._writers.pop(channel_id, None)
        if writer is not None:
            writer.close()

    def endpoint(self, channel_id: str) -> str | None:
        writer = self._writers.get(channel_id)
        return writer.endpoint if writer is not None else None

    def close(self) -> None:
        with self._lock:
            for channel_id, writer in self._writers.items():
                close = getattr(writer, "close", None)
                if close is not None:
                    close()
                log.info("hub: channel %s closed", channel_id)
            self._writers.clear()


class TaskRuntime:
    """Builds one streaming query from a generated program's calls.

    Arguments: `spark` (the executor's session); `query_id`, `task_id` (ids for names and logs);
    `checkpoint_dir` (this task's directory: Spark checkpoint under `spark/`, source pacing
    anchors next to it - reuse it across restarts); `endpoints` (channel id -> ZeroMQ endpoint of
    its writer, for channel_source); `channels` (the executor's ChannelHub, needed by channel
    sources/sinks); `trigger_seconds` (micro-batch interval, 0 = back to back);
    `source_partitions` (Spark partitions a generator, file or channel batch is split into);
    `params` (operator id -> runtime keyword -> value: the parameters control tuples changed,
    which win over the program's own arguments); `keys` (the task's channel keys from its launch:
    its channels are then CURVE-authenticated; None: plain text, a run outside a cluster);
    `fence` (this attempt's fence, `executor.fencing`: every sink call checks it; None: unfenced).
    """

    def __init__(self, spark: SparkSession, *, query_id: str, task_id: str, checkpoint_dir: str,
                 endpoints: Mapping[str, str] = {}, channels: ChannelHub | None = None,
                 trigger_seconds: float = 0.0, source_partitions: int = 2,
                 channel_poll_seconds: float = 0.05,
                 params: Mapping[str, Mapping[str, Any]] = {},
                 keys: TaskKeys | None = None, fence: Fence | None = None) -> None:
        self.spark = spark
        self.keys = keys
        # channel -> how its writer admits readers (auth, expected readers, open), for a move
        self._access: dict[str, tuple[WriterAuth | None, tuple[str, ...], bool]] = {}
        self._published: set[str] = set()  # channels other queries read by name
        self.query_id, self.task_id = query_id, task_id
        self.checkpoint_dir = checkpoint_dir
        self.endpoints = dict(endpoints)
        self.channels = channels
        self.trigger_seconds = trigger_seconds
        self.source_partitions = source_partitions
        self.channel_poll_seconds = channel_poll_seconds
        self.streams: dict[str, Stream] = {}
        self.sink: sinks.BatchSink | None = None
        self.query: StreamingQuery | None = None
        self.deterministic = False
        self.expression_nodes = 0  # in every checked tree, for `query_settings`
        self.batch_bytes = sources.MAX_BATCH_BYTES  # Arrow data per source micro-batch
        self.params = {op: dict(values) for op, values in params.items()}
        self.fence = fence
        self.gate = BatchGate(fence.holding) if fence is not None else BatchGate()
        self.live: dict[tuple[str, str], LiveParam] = {}  # (operator id, keyword) -> how
        self.notices: list[str] = []  # persisted state found unreadable and replaced
        self.receivers: list[SpoolReceiver] = []  # channel inputs, closed with the query
        self.channel_inputs: dict[str, DpcInput] = {}  # stream -> a channel or a selector
        self.dpc: DpcController | None = None  # max-delay on a union or join (availability.md)
        # stream -> the (spool name, folder) of the marked channel its DPC marks came from
        self.marked: dict[str, tuple[str, str]] = {}
        # stream -> that channel, for the output of a stateful operator over a marked stream,
        # written tentative or stable as a whole by checkpoint/redo (`dpc_downstream`)
        self.redo_marked: dict[str, tuple[str, str]] = {}
        self.redo: RedoController | None = None
        self._stream_writer: Any = None  # the started query's DataStreamWriter (a DPC re-run's)
        # how far each paced source lags behind its rate, in tuples (`sources.generator_backlog`)
        self.backlogs: list[Callable[[], int]] = []
        # what the last live switch decided that its acknowledgement reports (a splitter's
        # event-time switch, `switch_ms`; -1: at once)
        self.switch_detail: dict[str, float] = {}
        # Spark's real-time mode (`real_time_mode`): its checkpoint interval, None: micro-batch
        self.real_time: str | None = None
        self.bad_records = kafka_realtime.BadRecords()
        self._fence_watch: kafka_realtime.FenceWatch | None = None
        for source in sources.ALL_SOURCES + (spool_source.SpoolSource,):
            spark.dataSource.register(source)

    def stop(self) -> None:
        """Stop the query (if running) and the receivers of its channel inputs."""
        if self.dpc is not None:
            self.dpc.close()
        if self.redo is not None:
            self.redo.close()
        if self._fence_watch is not None:
            self._fence_watch.close()
        try:
            if self.query is not None and self.query.isActive:
                self.query.stop()
        finally:
            self.close_receivers()
            self.close_sink()

    def close_sink(self) -> None:
        """Release what the sink holds once its query is stopped (a Kafka sink's producer: its
        threads and broker connections would otherwise outlive the task)."""
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()

    def stop_at_boundary(self, timeout: float = 60.0) -> int | None:
        """Stop the query between two micro-batches, as a rescale's handover needs it: no sink
        call starts any more (`BatchGate.close`: a batch Spark plans meanwhile fails before
        writing), the one being written finishes and Spark commits it, then the query stops.
        Records the stop (`executor.kafka_handover.mark_stopped`) and returns the last
        committed batch (None: none). TimeoutError, and no record, if a batch being written
        does not finish and commit within `timeout` s."""
        query, spark_dir = self.query, os.path.join(self.checkpoint_dir, "spark")
        deadline = time.monotonic() + timeout
        if not self.gate.close(timeout):
            raise TimeoutError(f"task {self.task_id}: a batch was still being written after "
                               f"{timeout} s")
        alive = (lambda: False) if query is None else (lambda: bool(query.isActive))
        if not await_commit(spark_dir, self.gate.last_written, deadline, alive):
            raise TimeoutError(f"task {self.task_id}: batch {self.gate.last_written} was "
                               "written but not committed; not stopped at a batch boundary")
        self.stop()
        last = kafka_handover.last_committed_batch(spark_dir)
        kafka_handover.mark_stopped(self.checkpoint_dir, last)
        log.info("task %s: stopped at a batch boundary after batch %s", self.task_id, last)
        return last

    def backlog(self) -> int | None:
        """Tuples the task's paced sources have made available beyond what it planned; None
        when it has none (Spark's progress is then the only measure)."""
        if not self.backlogs:
            return None
        total = 0
        for lag in self.backlogs:
            try:
                total += lag()
            except (OSError, ValueError) as exc:  # a pacing file being replaced
                log.debug("task %s: backlog unknown: %s", self.task_id, exc)
        return total

    def close_receivers(self) -> None:
        """Stop receiving this runtime's channel inputs (its query is stopped or has died)."""
        receivers, self.receivers = self.receivers, []
        for receiver in receivers:
            receiver.close()

    # --- stream bookkeeping --------------------------------------------------------------------

    def _param(self, op: str, keyword: str, value: Any) -> Any:
        """The program's `value` of an operator's argument, or what a control tuple set."""
        changed = self.params.get(op, {})
        if keyword in changed:
            log.info("task %s: %s.%s = %r (set by control)", self.task_id, op, keyword,
                     changed[keyword])
            return changed[keyword]
        return value

    def _error(self, op: str, message: str) -> RuntimeSpecError:
        return RuntimeSpecError(self.task_id, op, message)

    def _put(self, op: str, name: str, df: DataFrame, schema: Schema) -> None:
        if name in self.streams:
            raise self._error(op, f"stream {name!r} is defined twice")
        self.streams[name] = Stream(name, df.alias(name), schema)
        log.debug("task %s: %s defines stream %s (%s)", self.task_id, op, name, schema.names)

    def _get(self, op: str, name: str, marks: bool = False) -> Stream:
        """The stream `name`; one carrying DPC marks only for an operator that propagates them
        (`marks`: a filter, a projection, a file, console or Kafka sink, a network sink with
        marks; docs/availability.md); a stateful operator's over marks only for a sink."""
        stream = self.streams.get(name)
        if stream is None:
            raise self._error(op, f"unknown input stream {name!r} (known: {sorted(self.streams)})")
        if name in self.marked and not marks:
            raise self._error(op, f"stream {name!r} carries DPC marks (tentative rows) from its "
                                  "upstream task; only filters, projections, an event-time "
                                  "window or updating aggregate and a file, console or Kafka "
                                  "sink or a marked network sink take them "
                                  "(docs/availability.md)")
        if name in self.redo_marked and not marks:
            raise self._error(op, f"stream {name!r} is a stateful operator's over DPC marks "
                                  "(written tentative or stable as a whole by checkpoint/redo):"
                                  " only a sink may follow it (docs/availability.md)")
        return stream

    def _stateful_input(self, op: str, name: str) -> Stream:
        """The input of a window or updating aggregate: a marked stream without its hidden
        tentative mark (the task's checkpoint/redo keeps its output's stable view exact:
        `_redo_output`); any other stream as `_get` gives it."""
        stream = self._get(op, name, marks=name in self.marked)
        if name not in self.marked:
            return stream
        if self.redo_marked:
            raise self._error(op, "one stateful operator per task may read a marked stream "
                                  "(docs/availability.md)")
        df = stream.df.drop(dpc_marks.TENTATIVE_MARK).alias(name)
        return Stream(stream.name, df, stream.schema)

    def _redo_output(self, input: str, output: str) -> None:
        """`output` of a stateful operator over `input`: if that is marked, the task's sink
        writes it by checkpoint/redo (`_start`)."""
        if input in self.marked:
            self.redo_marked[output] = self.marked[input]

    def _field(self, op: str, stream: Stream, name: str) -> Field:
        return self._column(op, stream.schema, stream.name, name)

    def _column(self, op: str, schema: Schema, stream: str, name: str) -> Field:
        field = schema.get(name)
        if field is None:
            raise self._error(op, f"stream {stream!r} has no column {name!r} "
                                  f"(it has {list(schema.names)})")
        return field

    def _duration(self, op: str, text: str) -> str:
        try:
            parse_duration(text)
        except ValueError as exc:
            raise self._error(op, str(exc)) from None
        return text

    def _anchor_path(self, op: str) -> str:
        return os.path.join(self.checkpoint_dir, "pacing", f"{op}.anchor")

    def _pacing(self, op: str, rate: float | None) -> str:
        """The source's pacing file; an unreadable one is replaced now, and said (log, and the
        task's status through `notices`), so the source resumes where Spark planned it."""
        path = self._anchor_path(op)
        notice = sources.repair_pacing(path, time.time(), rate)
        if notice is not None:
            log.warning("task %s: %s", self.task_id, notice)
            self.notices.append(f"{op}: {notice}")
        return path

    def _load(self, fmt: str, config: Any) -> DataFrame:
        return (self.spark.readStream.format(fmt)
                .option(sources.CONFIG_OPTION, sources.encode_config(config)).load())

    def paced_batches(self, *, seconds: float) -> None:
        """Start a micro-batch at most every `seconds` (a task multicasting to hot-standby
        replicas: they take one input batch per micro-batch, so they keep up only if input
        batches come no faster than they process one)."""
        if not seconds > 0:
            raise self._error("paced_batches", f"seconds must be > 0, got {seconds}")
        self.trigger_seconds = max(self.trigger_seconds, float(seconds))

    def large_batches(self) -> None:
        """Let this task's sources take up to LARGE_BATCH_BYTES per micro-batch instead of
        MAX_BATCH_BYTES, so a backlog (a file read from its start, a restart after downtime)
        comes in fewer micro-batches, each of which costs ~0.5 s however small. The compiler
        asks for it when the task writes an aggregate's results to a local sink: an output
        batch then does not grow with its input, and no channel frame bounds it."""
        self._before_sources("large_batches", "large_batches()")
        self.batch_bytes = sources.LARGE_BATCH_BYTES

    def _before_sources(self, op: str, call: str) -> None:
        """Refuse a task-wide call made after a source: that source has its settings already."""
        if self.streams:
            raise self._error(op, f"{call} must come before any source "
                                  f"(streams so far: {sorted(self.streams)})")

    def real_time_mode(self, *, checkpoint_interval: str = kafka_realtime.CHECKPOINT_INTERVAL
                       ) -> None:
        """Run this task in Spark's real-time mode (`compiler.realtime` chose it): the Kafka
        source parses in the JVM (bad records dropped and counted, `bad_records`), the Kafka
        sink is Spark's own under the real-time trigger (`executor.kafka_realtime`)."""
        self._before_sources("real_time_mode", "real_time_mode()")
        self._duration("real_time_mode", checkpoint_interval)
        self.real_time = checkpoint_interval

    def dropped_records(self) -> int:
        """Records a real-time task's source dropped (they did not parse), so far."""
        if self.query is None or self.real_time is None:
            return self.bad_records.bad
        return self.bad_records.add(self.query.recentProgress)

    def deterministic_batches(self) -> None:
        """Make this task's output a function of its numbered input (hot-standby replicas): every
        channel source takes exactly one channel batch per micro-batch and the query runs without
        no-data micro-batches, so micro-batch b depends only on input batches <= b (its watermark
        comes from batch b-1). Two replicas then send identical batches with identical seqs."""
        self._before_sources("deterministic", "deterministic_batches()")
        self.deterministic = True
        log.info("task %s: deterministic batches (one channel batch per micro-batch, no no-data "
                 "batches)", self.task_id)

    def _endpoints_file(self) -> str:
        return endpoints_path(self.checkpoint_dir)

    # --- sources -------------------------------------------------------------------------------

    def generator(self, *, op: str, output: str, schema: Schema, shape: str, seed: int,
                  rate: float, limit: int | None, start: str) -> None:
        try:
            the_shape = shapes.shape_named(shape)
            shapes.check_schema(the_shape, schema)
            start_us = shapes.parse_start(start)
        except shapes.ShapeError as exc:
            raise self._error(op, str(exc)) from None
        # rows per second: a Nexmark shape holds its share of the `rate` events per second
        pace = float(self._param(op, "rate", rate)) * the_shape.share
        if not (rate > 0 and pace > 0 and sources.usable_rate(float(rate))
                and sources.usable_rate(pace)):
            raise self._error(op, f"generator rate must be a finite number > 0, got {pace}")
        if limit is not None and limit < 0:
            raise self._error(op, f"generator limit must be >= 0, got {limit}")
        config = sources.GeneratorConfig(
            self.task_id, op, shape, sources.schema_pairs(schema), seed, float(rate), limit,
            start_us, self._pacing(op, pace), self.source_partitions, pace, self.batch_bytes)
        anchor = config.anchor_path
        self.backlogs.append(
            lambda: sources.generator_backlog(anchor, pace, limit, time.time()))
        self._put(op, output, self._load(sources.GeneratorSource.name(), config), schema)

    def file_source(self, *, op: str, output: str, schema: Schema, path: str,
                    format: Literal["jsonl", "csv"], rate: float | None) -> None:
        rate = self._param(op, "rate", rate)
        if format not in ("jsonl", "csv"):
            raise self._error(op, f"file format must be jsonl or csv, got {format!r}")
        try:
            where = sources.rooted_input(confine_at_open(path), "")
            for fd in sources.open_input(where):  # as the source opens it: no link followed
                os.close(fd)
        except PathRefused as exc:
            raise self._error(op, str(exc)) from None
        except FileNotFoundError:
            raise self._error(op, f"input file {path!r} does not exist") from None
        except OSError as exc:
            raise self._error(op, f"input file {path!r} cannot be read: {exc}") from None
        if rate is not None and not (rate > 0 and sources.usable_rate(float(rate))):
            raise self._error(op, f"file replay rate must be a finite number > 0, got {rate}")
        config = sources.FileConfig(self.task_id, op, where.path, format,
                                    sources.schema_pairs(schema), rate, self._pacing(op, rate),
                                    self.source_partitions, self.batch_bytes, where.root)
        self._put(op, output, self._load(sources.FileSource.name(), config), schema)

    def kafka_source(self, *, op: str, output: str, schema: Schema, bootstrap: str,
                     starting_offsets: str, format: Literal["jsonl", "csv"],
                     metadata: Sequence[tuple[str, str]], topics: Sequence[str] = (),
                     topic_pattern: str | None = None, starting_timestamp: str | None = None,
                     dead_letter: str | None = None, security_file: str | None = None,
                     max_records: int | None = None, share: int | None = None,
                     shares: int | None = None) -> None:
        """Records of Kafka `topics` (or those matching `topic_pattern`) as rows of `schema`
        (`executor.kafka_io`); records that do not parse go to `dead_letter` (default: under
        the task's checkpoint folder). With `share` i of `shares` k, only instance i's block of
        the topics' partitions (`common.kafka_partitions`), fixed at the task's first start in
        its checkpoint folder."""
        dead = dead_letter or os.path.join(self.checkpoint_dir, "dead-letters", f"{op}.jsonl")
        try:
            dead = confine_at_open(dead) if dead_letter else dead
            security = kafka_io.read_security_file(
                security_file and confine_at_open(security_file))
        except (OSError, PathRefused, KafkaParamError) as exc:
            raise self._error(op, str(exc)) from None
        settings = kafka_io.SourceSettings(
            bootstrap, tuple(topics), topic_pattern, starting_offsets,
            None if starting_timestamp is None else kafka_io.timestamp_ms(starting_timestamp),
            max_records, security.java, security.librdkafka,
            None if share is None or shares is None else kafka_io.Share(
                share, shares, os.path.join(self.checkpoint_dir, f"kafka-share-{op}.json"),
                os.path.join(self.checkpoint_dir, f"kafka-handover-{op}.json")))
        if share is not None:  # the query starts: a stop it recorded no longer holds
            kafka_handover.clear_stopped(self.checkpoint_dir)
        layout = kafka_records.RecordLayout(sources.schema_pairs(schema), tuple(
            (field, column) for field, column in metadata), format)
        try:
            if self.real_time is not None:
                df = kafka_realtime.source_frame(
                    kafka_io.raw_frame(self.spark, settings), layout.value_schema,
                    layout.metadata, schema)
            else:
                df = kafka_io.source_frame(self.spark, settings, layout, dead)
        except kafka_io.KafkaSetupError as exc:
            raise self._error(op, str(exc)) from None
        except kafka_io.KafkaUnavailable as exc:  # retried: the broker or topic may come
            raise kafka_io.KafkaUnavailable(f"task {self.task_id}, operator {op}: {exc}") \
                from None
        self._put(op, output, df, schema)

    def _spool(self, op: str, output: str, schema: Schema, name: str, folder: str,
               replicas: Sequence[Replica], key_file: str, ticks: bool = False,
               bounded: bool = False, from_now: bool = False, marks: bool = False) -> None:
        """Receive `replicas` (one writer, or a hot-standby group's) into the spool `folder`
        and read it as the stream `output` (`executor.spool_source`); with `ticks`, its rows
        carry the splitter's tick mark (`sinks.TICK_COLUMN`), which the stream keeps hidden
        until a window drops the ticks after its watermark; with `bounded` (a sliding window's
        partition) also each row's window-start bounds, hidden until the window applies them;
        with `marks` (a DPC task's channel, `executor.dpc_marks`) each row's tentative episode,
        hidden, which filters and projections keep (the revision mark stays in the spool)."""
        spark_dir = os.path.join(self.checkpoint_dir, "spark")
        wire = with_tick(schema, bounded) if ticks else schema
        if marks and ticks:
            raise self._error(op, "a splitter's partition channel carries no DPC marks")
        read = schema
        if marks:
            wire = dpc_marks.with_marks(schema)
            read = Schema(wire.fields[:-1])  # the revision mark is read from the spool only
        receiver = SpoolReceiver(self.task_id, folder, replicas, shapes.arrow_schema(wire),
                                 key_file=key_file, endpoints_file=self._endpoints_file(),
                                 log_file=sources.source_log_path(self.checkpoint_dir),
                                 finished=lambda: spool_source.finished_seq(spark_dir, name),
                                 from_now=from_now)
        self.receivers.append(receiver.start())
        if not ticks and not marks:  # a channel, or a hot-standby selector's stream
            self.channel_inputs[output] = DpcInput(name, receiver, folder)
        if marks:
            self.marked[output] = (name, folder)
        config = spool_source.SpoolConfig(
            self.task_id, name, folder, os.path.join(self.checkpoint_dir, "spark"),
            sources.schema_pairs(read if marks else wire), self.source_partitions,
            self.deterministic,
            idle_seconds=self.channel_poll_seconds, max_batch_bytes=self.batch_bytes)
        df = (self.spark.readStream.format(spool_source.SpoolSource.name())
              .option(spool_source.CONFIG_OPTION, spool_source.encode_config(config)).load())
        self._put(op, output, df, schema)

    def _spool_folder(self, name: str) -> str:
        return os.path.join(self.checkpoint_dir, "spool", quote(name, safe=""))

    def _channel_stream(self, op: str, output: str, schema: Schema, channel: str,
                        endpoint: str, reader_id: str, key_file: str = "",
                        server_key: str = "", ticks: bool = False,
                        bounded: bool = False, marks: bool = False) -> None:
        self._spool(op, output, schema, channel, self._spool_folder(channel),
                    [Replica(channel, reader_id, endpoint, server_key)], key_file, ticks,
                    bounded, marks=marks)

    def network_source(self, *, op: str, output: str, schema: Schema, endpoint: str,
                       channel: str, reader: str | None = None, key_file: str | None = None,
                       server_key: str | None = None, marks: bool = False) -> None:
        """Another query's network-sink (or any program speaking the channel protocol) serving
        `channel` at `endpoint`; with `key_file` (this reader's keypair, `elastiq keygen`) and
        `server_key` (the writer's public key) over CURVE, as reader id `reader` (default
        "<task>/<op>"), which the writer must have declared with this key. `marks`: the writer
        sends DPC marks (a network sink after a union or join with max-delay), read as a
        marked channel's (`channel_source`'s `marks`; each frame's marks checked on arrival)."""
        try:
            reader_auth(key_file or "", server_key or "")
        except ChannelKeyError as exc:
            raise self._error(op, str(exc)) from None
        self._channel_stream(op, output, schema, channel, self._param(op, "endpoint", endpoint),
                             reader or f"{self.task_id}/{op}", key_file or "", server_key or "",
                             marks=marks)

    def channel_source(self, *, output: str, schema: Schema, channel: str,
                       ticks: bool = False, bounded: bool = False, marks: bool = False) -> None:
        """Read `channel` as `output`; `ticks`: a partition channel of a stateful operator's
        splitter, whose rows carry the tick mark (`split_channel_sink`'s `switch`); `bounded`:
        one of a sliding window's, whose rows also carry their window-start bounds; `marks`: a
        DPC task's channel, whose rows carry their marks (`channel_sink`'s `marks`)."""
        op = f"read:{channel}"
        key_file, server_key = self._reader_keys(op, channel)
        self._channel_stream(op, output, schema, channel, self._endpoint_of(op, channel),
                             channel_reader_id(self.task_id, channel), key_file, server_key,
                             ticks, bounded, marks)

    def stream_source(self, *, op: str, output: str, schema: Schema, stream: str,
                      start: str = "retained") -> None:
        """Another query's published `stream` ("QUERY/STREAM", its channel id), at the endpoint
        and with the writer's key the scheduler gave; a new reader starts at the oldest batch
        the writer retains (`start` "retained") or at its next one ("now")."""
        if start not in ("retained", "now"):
            raise self._error(op, f"start must be 'retained' or 'now', not {start!r}")
        key_file, server_key = self._reader_keys(op, stream)
        self._spool(op, output, schema, stream, self._spool_folder(stream),
                    [Replica(stream, channel_reader_id(self.task_id, stream),
                             self._endpoint_of(op, stream), server_key)], key_file,
                    from_now=start == "now")

    def _reader_keys(self, op: str, channel: str) -> tuple[str, str]:
        """(key file, producer's public key) for reading a channel of this query; ("", "")
        without keys. The key file (0600, next to the checkpoint) is how the Spark source,
        which gets its config as text, finds this task's secret key without it being in the
        config."""
        if self.keys is None:
            return "", ""
        try:
            server_key = self.keys.server_key(channel)
        except ChannelKeyError as exc:
            raise self._error(op, str(exc)) from None
        path = os.path.join(self.checkpoint_dir, "channel-key.json")
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        save_key_file(path, self.keys.own)
        return path, server_key

    def _endpoint_of(self, op: str, channel: str) -> str:
        """Where `channel`'s writer is: the launch's endpoints, else this executor's hub; ""
        when neither knows (a producer not placed yet, e.g. a dormant instance of an elastic
        operator: the receiver waits until the endpoints file names it)."""
        endpoint = self.endpoints.get(channel)
        if endpoint is None and self.channels is not None:
            endpoint = self.channels.endpoint(channel)
        if endpoint is None:
            log.info("task %s: no endpoint known yet for channel %s; waiting for one",
                     self.task_id, channel)
        return endpoint or ""

    def selector_source(self, *, output: str, schema: Schema, channels: Sequence[str]) -> None:
        """One numbered stream read from k replica channels (a hot-standby group's outputs):
        batches come from whichever replica has them, a replica that fails is skipped."""
        op = f"select:{output}"
        if not channels or len(set(channels)) != len(channels):
            raise self._error(op, f"a selector needs distinct replica channels, got {channels}")
        keys = {c: self._reader_keys(op, c) for c in channels}
        replicas = [Replica(c, channel_reader_id(self.task_id, c), self._endpoint_of(op, c),
                            keys[c][1]) for c in channels]
        self._spool(op, output, schema, op, self._spool_folder(op), replicas,
                    keys[channels[0]][0])

    # --- operators -----------------------------------------------------------------------------

    def identity(self, *, op: str, input: str, output: str) -> None:
        """`input` under the name `output`, same schema (network reader/writer, multicast and
        failover nodes: the plumbing itself is the channel around them)."""
        stream = self._get(op, input)
        self._put(op, output, stream.df, stream.schema)

    def _compile(self, op: str, text: str, scope: expr.Scope,
                 compile: Callable[[str, expr.Scope], expr.TypedExpr] = expr.compile_expression
                 ) -> expr.TypedExpr:
        try:
            typed = compile(text, scope)
        except expr.NotBoolean as exc:
            raise self._error(op, f"condition {text!r} is {exc.type.value}, not boolean") \
                from None
        except expr.ExpressionError as exc:
            raise self._error(op, f"expression {text!r}: {exc}") from None
        self.expression_nodes += spark_codegen.nodes(typed.expr)
        return typed

    def filter(self, *, op: str, input: str, output: str, condition: str) -> None:
        condition = self._param(op, "condition", condition)
        stream = self._get(op, input, marks=True)
        scope = expr.Scope({input: stream.schema})
        typed = self._compile(op, condition, scope, expr.compile_condition)
        df = stream.df.filter(to_column(typed.expr, scope))
        self._put(op, output, df, stream.schema)
        self._propagate(input, output)

    def project(self, *, op: str, input: str, output: str,
                fields: Sequence[tuple[str, str]]) -> None:
        stream = self._get(op, input, marks=True)
        scope = expr.Scope({input: stream.schema})
        columns, out_fields = [], []
        for name, text in fields:
            typed = self._compile(op, text, scope)
            columns.append(to_column(typed.expr, scope).alias(name))
            out_fields.append(Field(name, typed.type))
        names = [f.name for f in out_fields]
        if len(set(names)) != len(names):
            raise self._error(op, f"projection names are not unique: {names}")
        if kept_share.carries(stream.schema) and kept_share.KEPT not in names:
            columns.append(F.col(f"`{kept_share.KEPT}`"))  # a shed row's share follows it
            out_fields.append(Field(kept_share.KEPT, ColumnType.DOUBLE))
        if input in self.marked:  # a row derived from a tentative row is tentative
            columns.append(F.col(f"`{dpc_marks.TENTATIVE_MARK}`"))
        self._put(op, output, stream.df.select(*columns), Schema(tuple(out_fields)))
        self._propagate(input, output)

    def _propagate(self, input: str, output: str) -> None:
        """`output`, derived row by row from `input`, carries its DPC marks."""
        if input in self.marked:
            self.marked[output] = self.marked[input]

    def _aggregate_column(self, op: str, stream: Stream, name: str, function: str,
                          column: str | None, by: str | None = None,
                          where: str | None = None) -> tuple[Column, Field]:
        """An aggregate as a Spark Column; with `where` (SQL's FILTER (WHERE ...)) it reads only
        the rows the condition is true of: its column (and by column) are null on the others,
        which every aggregate here skips (count(*) counts a literal that is null there)."""
        if function not in AGGREGATE_FUNCTIONS:
            raise self._error(op, f"unknown aggregate {function!r} (known: {AGGREGATE_FUNCTIONS})")
        field = None if column is None else self._field(op, stream, column)
        by_field = None if by is None else self._field(op, stream, by)
        try:
            result_type = aggregate_type(function, field, by_field)
        except ValueError as exc:
            raise self._error(op, str(exc)) from None
        source = F.lit(1) if field is None else _qcol(stream.name, field.name)
        order = None if by_field is None else _qcol(stream.name, by_field.name)
        if where is not None:
            kept = self._aggregate_filter(op, stream, name, where)
            source = F.when(kept, source)
            order = None if order is None else F.when(kept, order)
        agg = _AGGREGATES[function](source, order).cast(result_type.spark_type_name())
        return agg.alias(name), Field(name, result_type)

    def _aggregate_filter(self, op: str, stream: Stream, name: str, where: str) -> Column:
        """An aggregate's `where`: a boolean expression of the closed language over the input
        stream (never code), true for the rows it reads (null counts as false)."""
        scope = expr.Scope({stream.name: stream.schema})
        typed = self._compile(op, where, scope, expr.compile_condition)
        return F.coalesce(to_column(typed.expr, scope), F.lit(False))

    def window_aggregate(self, *, op: str, input: str, output: str, time: str | None,
                         window: str | None, slide: str | None, watermark: str,
                         group_by: Sequence[str], aggregates: Sequence[tuple[Any, ...]],
                         gap: str | None = None, clock: str = "event",
                         rows: int | None = None) -> None:
        """Tumbling or sliding windows of size `window`, or session windows of `gap`, over
        event time `time`, or with `clock` "processing" over the time each micro-batch is
        processed (each aggregate: name, function, column, and max_by/min_by's by column); or,
        with `rows`, count windows: each key's last `rows` rows (`count_window`)."""
        if rows is not None:
            if window is not None or slide is not None or gap is not None or clock != "event":
                raise self._error(op, "a count window (rows) has no size, slide, gap or clock")
            self.count_window(op=op, input=input, output=output, time=time, rows=rows,
                              watermark=watermark, group_by=group_by, aggregates=aggregates)
            return
        stream = self._stateful_input(op, input)
        keys = [self._field(op, stream, g) for g in group_by]
        aggs = [self._aggregate_column(op, stream, *a) for a in aggregates]
        if clock == "processing" and input in self.marked:
            raise self._error(op, f"a processing-time window over DPC marks (stream {input!r}):"
                                  " its re-run from the stable point would count rows in other "
                                  "windows; use event time (docs/availability.md)")
        if clock == "processing":
            time, frame = PROCESSING_TIME, self._processing_rows(op, stream, time, gap)
        elif clock != "event" or time is None:
            raise self._error(op, f"a window needs a time column or clock 'processing' "
                                  f"(time={time!r}, clock={clock!r})")
        else:
            time_field = self._field(op, stream, time)
            if time_field.type is not ColumnType.TIMESTAMP:
                raise self._error(op, f"time column {time!r} is {time_field.type.value}, "
                                      "not timestamp")
            frame = _without_ticks(self._watermarked(op, stream, time, watermark), time)
        windowed = self._window_column(op, _qcol(input, time), window, slide, gap)
        bounded = _windowed_within_bounds(frame, windowed)
        if bounded is not frame:  # each row already in its windows
            frame, windowed = bounded.alias(input), F.col("window")
        shares = _window_shares(input, stream.schema) if kept_share.carries(stream.schema) else []
        shed = list(kept_share.aggregate_fields()) if shares else []
        df = (frame.groupBy(windowed.alias("window"), *[_qcol(input, k.name) for k in keys])
              .agg(*[a for a, _ in aggs], *shares))
        event_time = {WATERMARK_DELAY_KEY: df.schema["window"].metadata[WATERMARK_DELAY_KEY]}
        df = df.select(F.col("window.start").alias("window_start"),
                       F.col("window.end").alias("window_end", metadata=event_time),
                       *[F.col(f"`{k.name}`") for k in keys],
                       *[F.col(f"`{n}`") for n, *_ in aggregates],
                       *[F.col(f"`{f.name}`") for f in shed])
        schema = Schema((Field("window_start", ColumnType.TIMESTAMP),
                         Field("window_end", ColumnType.TIMESTAMP), *keys, *[f for _, f in aggs],
                         *shed))
        self._put(op, output, df, schema)
        self._redo_output(input, output)

    def _keyed_aggregates(self, op: str, stream: Stream, time: str | None,
                          group_by: Sequence[str], aggregates: Sequence[tuple[Any, ...]]
                          ) -> tuple[list[Field], list[keyed_state_frame.Aggregate]]:
        """The key fields and aggregates of an operator whose state is kept per key in Python
        (`executor.keyed_state_frame`): a timestamp time column, no event time upstream (the
        validator refuses it: Spark runs no such operator after an aggregation, and a second
        watermark would hold the first), functions among `keyed_aggregates.ROW_FUNCTIONS`."""
        if time is None or self._field(op, stream, time).type is not ColumnType.TIMESTAMP:
            raise self._error(op, f"time column {time!r} is not a timestamp")
        if event_time_columns(stream.df):
            raise self._error(op, f"stream {stream.name!r} has event time already (it comes "
                                  "after a window or join): read it in another dataflow")
        keys = [self._field(op, stream, g) for g in group_by]
        result = []
        for name, function, column, *by in aggregates:
            if len(by) > 1:
                raise self._error(op, f"aggregate {name!r}: a count window or updating "
                                      "aggregate takes no where")
            if function not in keyed_aggregates.ROW_FUNCTIONS or by:
                raise self._error(op, f"aggregate {name!r}: {function!r} is not one of "
                                      f"{keyed_aggregates.ROW_FUNCTIONS}")
            field = None if column is None else self._field(op, stream, column)
            try:
                kind = aggregate_type(function, field)
            except ValueError as exc:
                raise self._error(op, str(exc)) from None
            result.append(keyed_state_frame.Aggregate(name, function, field, Field(name, kind)))
        return keys, result

    def count_window(self, *, op: str, input: str, output: str, time: str | None, rows: int,
                     watermark: str, group_by: Sequence[str],
                     aggregates: Sequence[tuple[Any, ...]]) -> None:
        """Count windows: for each row, once the watermark passes it, the aggregates over its
        key's last `rows` rows in event-time order (`keyed_state_frame.count_window_frame`)."""
        stream = self._get(op, input)
        if isinstance(rows, bool) or not isinstance(rows, int) or \
                not 1 <= rows <= keyed_aggregates.MAX_WINDOW_ROWS:
            raise self._error(op, f"rows {rows!r} is not a whole number from 1 to "
                                  f"{keyed_aggregates.MAX_WINDOW_ROWS}")
        keys, aggs = self._keyed_aggregates(op, stream, time, group_by, aggregates)
        assert time is not None  # checked by _keyed_aggregates
        df, schema = keyed_state_frame.count_window_frame(
            stream.df, input, time, keys, aggs, rows, self._duration(op, watermark))
        self._put(op, output, df, schema)

    def updating_aggregate(self, *, op: str, input: str, output: str, time: str, ttl: str,
                           watermark: str, group_by: Sequence[str],
                           aggregates: Sequence[tuple[Any, ...]]) -> None:
        """Aggregates over the whole stream per key, one upsert record per key and micro-batch
        that brought it rows; a key's state ends `ttl` of event time after its last row
        (`keyed_state_frame.updating_frame`). Its sink keeps the records as an upsert log."""
        stream = self._stateful_input(op, input)
        ttl_us = parse_duration(self._duration(op, ttl)) // timedelta(microseconds=1)
        if ttl_us <= 0:
            raise self._error(op, f"ttl {ttl!r} must be above zero")
        keys, aggs = self._keyed_aggregates(op, stream, time, group_by, aggregates)
        df, schema = keyed_state_frame.updating_frame(
            stream.df, input, time, keys, aggs, ttl_us, self._duration(op, watermark))
        self._put(op, output, df, schema)
        self._redo_output(input, output)

    def top_n(self, *, op: str, input: str, output: str, time: str, window: str | None,
              slide: str | None, watermark: str, group_by: Sequence[str], n: int,
              order_by: str, ttl: str | None = None) -> None:
        """The first `n` rows of each window (of size `window`, sliding by `slide`) and group
        in `order_by`'s order, ranked once the watermark passes the window's end
        (`executor.top_n_frame`); with `ttl` instead of a window, the updating ranking over the
        whole stream (`updating_top_n`)."""
        stream = self._get(op, input)
        if self._field(op, stream, time).type is not ColumnType.TIMESTAMP:
            raise self._error(op, f"time column {time!r} is not a timestamp")
        if not isinstance(n, int) or not 1 <= n <= top_n.MAX_TOP_N:
            raise self._error(op, f"n {n!r} is not a whole number from 1 to {top_n.MAX_TOP_N}")
        order, problems = top_n.parse_order(order_by)
        for key in order:
            if not self._field(op, stream, key.column).type.is_orderable:
                problems.append(f"column {key.column!r} has no order")
        if problems:
            raise self._error(op, f"order-by {order_by!r}: {'; '.join(problems)}")
        keys = [self._field(op, stream, g).name for g in group_by]
        clashes = top_n.reserved_clashes(stream.schema, updating=ttl is not None)
        if clashes:
            raise self._error(op, f"input columns {clashes} clash with the output's "
                                  + ("rank" if ttl is not None
                                     else "window_start, window_end, rank"))
        if ttl is not None:
            if window is not None or slide is not None:
                raise self._error(op, "a top-n has a window (size, slide) or a ttl, not both")
            self.updating_top_n(op, stream, output, time, ttl, watermark, keys, order, n)
            return
        if window is None:
            raise self._error(op, "a top-n needs a window size or a ttl")
        windowed = self._window_column(op, _qcol(input, time), window, slide, None)
        rows = _without_ticks(self._watermarked(op, stream, time, watermark), time)
        bounded = _windowed_within_bounds(rows, windowed)
        if bounded is not rows:  # each row already in its windows
            rows, windowed = bounded.alias(input), F.col("window")
        carried = [f.name for f in top_n.carried_fields(stream.schema, tuple(keys))]
        df = top_n_frame.ranked(rows, windowed, [_qcol(input, k).alias(k) for k in keys], keys,
                                [_qcol(input, c) for c in carried], carried, order, n,
                                WATERMARK_DELAY_KEY)
        self._put(op, output, df, top_n.output_schema(stream.schema, tuple(keys)))

    def updating_top_n(self, op: str, stream: Stream, output: str, time: str, ttl: str,
                       watermark: str, keys: Sequence[str], order: Sequence[OrderKey],
                       n: int) -> None:
        """The updating ranking: each group's first `n` rows over the whole stream, one upsert
        record per changed rank and micro-batch (`top_n_frame.updating_ranked`); a group's
        state ends `ttl` of event time after its last row. No event time upstream (the
        validator refuses it, as for the updating aggregate: Spark runs no per-key Python
        state after an aggregation)."""
        ttl_us = parse_duration(self._duration(op, ttl)) // timedelta(microseconds=1)
        if ttl_us <= 0:
            raise self._error(op, f"ttl {ttl!r} must be above zero")
        if event_time_columns(stream.df):
            raise self._error(op, f"stream {stream.name!r} has event time already (it comes "
                                  "after a window or join): read it in another dataflow")
        fields = [self._field(op, stream, k) for k in keys]
        carried = top_n.carried_fields(stream.schema, tuple(keys))
        df, schema = top_n_frame.updating_ranked(stream.df, stream.name, time, fields, carried,
                                                 order, n, ttl_us, self._duration(op, watermark))
        self._put(op, output, df, schema)

    def deduplicate(self, *, op: str, input: str, output: str, keys: Sequence[str], time: str,
                    watermark: str) -> None:
        """The first tuple of each key; its duplicates dropped until the watermark passes its
        time plus `watermark` (Spark's dropDuplicatesWithinWatermark: the state of a key lives
        that long)."""
        stream = self._get(op, input)
        if self._field(op, stream, time).type is not ColumnType.TIMESTAMP:
            raise self._error(op, f"time column {time!r} is not a timestamp")
        if not keys:
            raise self._error(op, "deduplicate needs key columns")
        names = [self._field(op, stream, k).name for k in keys]
        rows = _without_ticks(self._watermarked(op, stream, time, watermark), time)
        self._put(op, output, rows.dropDuplicatesWithinWatermark(names), stream.schema)

    def _window_column(self, op: str, time: Column, window: str | None, slide: str | None,
                       gap: str | None) -> Column:
        """Spark's window of a row: `window()` of a size (and slide), or `session_window()` of
        a gap, exactly one of the two."""
        if (window is None) == (gap is None):
            raise self._error(op, f"a window needs a size or a gap, not both (size={window!r}, "
                                  f"gap={gap!r})")
        if gap is not None:
            if slide is not None:
                raise self._error(op, "a session window (gap) has no slide")
            return F.session_window(time, self._duration(op, gap))
        assert window is not None  # exactly one of window and gap
        slide_text = self._duration(op, slide) if slide is not None else None
        return F.window(time, self._duration(op, window), slide_text)

    def _processing_rows(self, op: str, stream: Stream, time: str | None,
                         gap: str | None) -> DataFrame:
        """The stream's rows with their processing time in PROCESSING_TIME, watermarked
        without delay. `current_timestamp()` in a streaming query is the micro-batch's
        timestamp, which Spark records in the batch's offset log entry: a batch replayed after
        a restart has the time it had, so each row is counted once, in the window of the batch
        that first held it. No time column, no gap, no event time upstream."""
        if time is not None or gap is not None:
            raise self._error(op, "a processing-time window has no time column and no gap")
        if event_time_columns(stream.df):
            raise self._error(op, f"stream {stream.name!r} has event time: a processing-time "
                                  "window cannot add a second watermark to the query")
        rows = (stream.df.withColumn(PROCESSING_TIME, F.current_timestamp())
                .withWatermark(f"`{PROCESSING_TIME}`", "0 seconds"))
        return _without_ticks(rows, PROCESSING_TIME).alias(stream.name)

    def _watermarked(self, op: str, stream: Stream, time: str, watermark: str) -> DataFrame:
        """The stream with event time `time`: a watermark on it, unless the stream already has
        event time (it comes from a window or a join in this query, whose watermark it carries
        on `window_end` or the join's time columns). Then `time` must be one of those columns
        and no second watermark is added: Spark keeps the minimum of a query's watermarks, and
        one that sees rows only once the upstream window closes would hold the upstream at 0."""
        delay = self._duration(op, watermark)
        times = event_time_columns(stream.df)
        if not times:
            return stream.df.withWatermark(time, delay)
        if time not in times:
            raise self._error(op, f"{time!r} is not an event-time column of stream "
                                  f"{stream.name!r} (it comes after a window or join; its "
                                  f"event-time columns: {sorted(times)}); use window_end")
        return stream.df

    def pattern(self, *, op: str, input: str, output: str, time: str, partition_by: Sequence[str],
                pattern: str, within: str, watermark: str, defines: Sequence[tuple[str, str]],
                measures: Sequence[tuple[str, str]], max_partial: int,
                after_match: str = "skip-past-last-row",
                share: tuple[int, int] | None = None,
                stage: tuple[int, int, int] | None = None,
                row_schema: Schema | None = None) -> None:
        """Row pattern recognition per key (`executor.cep.spark`): one row per match; with `share`
        (i, k), instance i of a partitioned pattern; with `stage` (i, k, rows), stage i of a
        pattern pipelined over k stages, which after the first reads the stream the stage
        before writes, its rows of type `row_schema` (docs/patterns.md)."""
        stream = self._get(op, input)
        rows = stream.schema if stage is None or stage[0] == 1 else row_schema
        if rows is None:
            raise self._error(op, f"stage {stage} of a pipelined pattern needs the row schema")
        if self._column(op, rows, stream.name, time).type is not ColumnType.TIMESTAMP:
            raise self._error(op, f"time column {time!r} is not a timestamp")
        keys = [self._field(op, stream, k) for k in partition_by]
        within_us = parse_duration(self._duration(op, within)) // timedelta(microseconds=1)
        try:
            program, typed = cep_match.build_program(input, rows, time, pattern,
                                                     defines, measures, within_us, max_partial,
                                                     after_match, share)
            where = None if stage is None else cep_stage.Stage(*stage)
            if where is not None:
                cep_stage.StageMatcher(program, where)  # refuses a program stages cannot run
        except (expr.ExpressionError, ValueError) as exc:
            raise self._error(op, f"pattern {pattern!r}: {exc}") from None
        fields = [Field(name, t.type) for (name, _), t in zip(measures, typed)]
        delay = self._duration(op, watermark)
        if where is None:
            df, schema = cep_spark.pattern_frame(stream.df, input, program, keys, fields, delay)
        else:
            df, schema = cep_spark.stage_frame(stream.df, input, program, keys, fields, delay, where)
        self._put(op, output, df, schema)

    def join(self, *, op: str, left: str, right: str, output: str, left_keys: Sequence[str],
             right_keys: Sequence[str], left_time: str, right_time: str, within: str,
             watermark: str, right_end: str | None = None,
             max_delay: str | None = None) -> None:
        """Inner equi-join: pairs whose left time is within `within` of the right time or,
        with `right_end`, between the right time and the right row's `right_end` (and at most
        `within` after the right time: the bound that lets Spark drop a right row's state).
        With `max_delay`, it goes on without a cut-off channel input (docs/availability.md)."""
        if left == right:
            raise self._error(op, f"a join needs two different streams, got {left!r} twice")
        if max_delay is not None:
            self._dpc(op, (left, right), parse_duration(self._duration(op, max_delay)))
        ls, rs = self._get(op, left), self._get(op, right)
        if len(left_keys) != len(right_keys) or not left_keys:
            raise self._error(op, "left_keys and right_keys must be non-empty and of equal length")
        for lk, rk in zip(left_keys, right_keys):
            lt, rt = self._field(op, ls, lk).type, self._field(op, rs, rk).type
            if lt is not rt:
                raise self._error(op, f"join key {lk} ({lt.value}) vs {rk} ({rt.value})")
        times = [(ls, left_time), (rs, right_time)] + ([(rs, right_end)] if right_end is not None else [])
        for stream, name in times:
            if self._field(op, stream, name).type is not ColumnType.TIMESTAMP:
                raise self._error(op, f"{stream.name}.{name} is not a timestamp")
        bound = F.lit(parse_duration(self._duration(op, within)))
        ldf = _without_ticks(self._watermarked(op, ls, left_time, watermark), left_time)\
            .alias(left)
        rdf = _without_ticks(self._watermarked(op, rs, right_time, watermark), right_time)\
            .alias(right)
        cond = [_qcol(left, lk) == _qcol(right, rk) for lk, rk in zip(left_keys, right_keys)]
        cond += _time_bounds(_qcol(left, left_time), _qcol(right, right_time), bound,
                             None if right_end is None else _qcol(right, right_end))
        right_names = join_output_names(ls.schema, rs.schema, right)
        joined = ldf.join(rdf, on=cond, how="inner").select(
            *[_qcol(left, n).alias(n) for n in ls.schema.names],
            *[_qcol(right, n).alias(new) for n, new in zip(rs.schema.names, right_names)])
        schema = Schema((*ls.schema.fields,
                         *[Field(new, f.type) for f, new in zip(rs.schema.fields, right_names)]))
        self._put(op, output, joined, schema)

    def lookup_join(self, *, op: str, input: str, output: str, path: str, format: str,
                    side: str, side_columns: Sequence[tuple[str, str]],
                    left_keys: Sequence[str], right_keys: Sequence[str]) -> None:
        """Stream-table lookup join: each row of `input` with the side table's rows of equal
        keys (inner). The side file (rows of `side_columns`) is read once, now, through the
        path roots without following a link (`common.safe_open`), parsed in plain Python
        (`common.side_table`) and kept as a broadcast local relation: a file changed later is
        read again only when the task starts again."""
        stream = self._get(op, input)
        try:
            table = Schema.of(*side_columns)
        except ValueError as exc:
            raise self._error(op, f"side table columns {side_columns!r}: {exc}") from None
        if len(left_keys) != len(right_keys) or not left_keys:
            raise self._error(op, "left_keys and right_keys must be non-empty and of equal length")
        for lk, rk in zip(left_keys, right_keys):
            lt, rt = self._field(op, stream, lk).type, self._column(op, table, side, rk).type
            if lt is not rt:
                raise self._error(op, f"lookup key {lk} ({lt.value}) vs {rk} ({rt.value})")
        rows = self._side_rows(op, path, format, table)
        alias = f"{side} side of {op}"  # spaces: a spec's stream names (identifiers) have none
        right = F.broadcast(self.spark.createDataFrame(rows, schema=table.ddl())).alias(alias)
        left = stream.df.alias(input)
        cond = [_qcol(input, lk) == _qcol(alias, rk) for lk, rk in zip(left_keys, right_keys)]
        names = join_output_names(stream.schema, table, side)
        joined = left.join(right, on=cond, how="inner").select(
            *[_qcol(input, n).alias(n) for n in stream.schema.names],
            *[_qcol(alias, n).alias(new) for n, new in zip(table.names, names)])
        schema = Schema((*stream.schema.fields,
                         *[Field(new, f.type) for f, new in zip(table.fields, names)]))
        self._put(op, output, joined, schema)

    def _side_rows(self, op: str, path: str, format: str, table: Schema) -> list[tuple]:
        """The side file's rows; a refusal naming the file (and each bad line) when it is
        missing, outside the roots, a link, too large or not rows of the table's type."""
        try:
            where = sources.rooted_input(confine_at_open(path), "")
            folder, fd = sources.open_input(where)
            try:
                data = b""
                while len(data) <= side_table.MAX_SIDE_BYTES:
                    chunk = os.read(fd, side_table.MAX_SIDE_BYTES + 1 - len(data))
                    if not chunk:
                        break
                    data += chunk
            finally:
                os.close(fd)
                os.close(folder)
            return side_table.parse(data, format, table)
        except PathRefused as exc:
            raise self._error(op, str(exc)) from None
        except FileNotFoundError:
            raise self._error(op, f"side file {path!r} does not exist") from None
        except side_table.SideTableError as exc:
            raise self._error(op, f"side file {path!r}: {exc}") from None
        except OSError as exc:
            raise self._error(op, f"side file {path!r} cannot be read: {exc}") from None

    def drop(self, *, op: str, input: str, output: str, ratio: float, high_ratio: float = 0.0,
             mode: str = "random", seed: int = 0, keep: str | None = None) -> None:
        """Load shedding (docs/load.md): drop a live `ratio` of the rows (semantic: of the rows
        `keep` is not true of; `high_ratio` of those it is true of), idle at 0. Rows are picked
        by a seeded hash of all their columns, so a replayed batch drops the same rows."""
        ratio = self._ratio(op, "ratio", self._param(op, "ratio", ratio))
        high_ratio = self._ratio(op, "high_ratio", self._param(op, "high_ratio", high_ratio))
        stream = self._get(op, input)
        df = stream.df.alias(output)
        if mode == "semantic" and keep is not None:
            scope = expr.Scope({output: stream.schema})
            worth = F.coalesce(to_column(self._compile(op, keep, scope, expr.compile_condition)
                                         .expr, scope), F.lit(False))
            kept = F.when(worth, drop_keeps(stream.schema, seed, high_ratio)) \
                .otherwise(drop_keeps(stream.schema, seed, ratio))
            share = F.when(worth, F.lit(1.0 - high_ratio)).otherwise(F.lit(1.0 - ratio))
        else:
            kept = drop_keeps(stream.schema, seed, ratio)
            share = F.lit(1.0 - ratio)
        schema = kept_share.with_kept(stream.schema)
        if ratio <= 0 and high_ratio <= 0:  # idle: the rows untouched, each kept whole
            self._put(op, output, _with_share(stream, F.lit(1.0)), schema)
            return
        counted = df.observe(f"{SHED_OBSERVATION}{op}", F.count(F.lit(1)).alias("rows"),
                             F.sum(F.when(kept, 0).otherwise(1)).alias("dropped"))
        shed = Stream(output, counted.filter(kept), stream.schema)
        self._put(op, output, _with_share(shed, share), schema)

    def _ratio(self, op: str, name: str, value: Any) -> float:
        try:
            ratio = float(value)
        except (TypeError, ValueError):
            raise self._error(op, f"{name} {value!r} is not a number") from None
        if not 0.0 <= ratio <= 1.0:
            raise self._error(op, f"{name} {ratio} is outside 0..1")
        return ratio

    def union(self, *, op: str, inputs: Sequence[str], output: str,
              max_delay: str | None = None, merger: bool = False) -> None:
        """The rows of every input. With `max_delay`, Borealis DPC (docs/availability.md);
        without it, consistency without loss: while a channel input's writer is unreachable
        Spark is handed nothing new, without a limit (`_dpc` with no max-delay). A `merger` (of
        a partitioned operator's instances) waits, or goes on after its `max_delay`, for its
        active instances only: a dormant slot, never launched or retired by a rescale, has no
        writer placed (`messages.UNPLACED`) and is never waited for
        (`common.dpc.waited_for`)."""
        self._dpc(op, inputs, None if max_delay is None
                  else parse_duration(self._duration(op, max_delay)))
        streams = [self._get(op, name) for name in inputs]
        if len(streams) < 2:
            raise self._error(op, "a union needs at least two inputs")
        first = streams[0]
        for other in streams[1:]:
            if other.schema != first.schema:
                raise self._error(op, f"union inputs differ: {first.name} {first.schema.names} "
                                      f"vs {other.name} {other.schema.names}")
        names = [f"`{n}`" for n in first.schema.names]
        df = first.df.select(*names)
        for other in streams[1:]:
            df = df.union(other.df.select(*names))
        self._put(op, output, df, first.schema)

    def _dpc(self, op: str, inputs: Sequence[str], max_delay: timedelta | None) -> None:
        """A union or join that goes on without a cut-off channel input after `max_delay`, or
        (None, a union without max-delay) waits for it without a limit. One controller per
        task: a second union without max-delay adds its channel inputs to the first's; a union
        or join with max-delay takes the place of a waiting one (whose union then waits no
        more: logged) and refuses a second one with max-delay."""
        channels = [self.channel_inputs[name] for name in inputs if name in self.channel_inputs]
        if not channels:
            log.info("task %s: %s reads no channel, so none can be cut off: %s has nothing to "
                     "wait for", self.task_id, op,
                     "max-delay" if max_delay is not None else "the union")
            return
        current = self.dpc
        if max_delay is None and current is not None:
            if current.max_delay is not None:
                log.warning("task %s: %s (a union without max-delay) does not wait for a cut "
                            "input: the task's %s controller has max-delay "
                            "(docs/availability.md, \"Not built yet\")", self.task_id, op,
                            current.task_id)
                return
            channels = list(current.inputs) + [c for c in channels if c not in current.inputs]
        elif current is not None and current.max_delay is not None:
            raise self._error(op, "one union or join per task may have max-delay")
        elif current is not None:
            log.warning("task %s: the union(s) without max-delay over %s do not wait for a cut "
                        "input: %s has max-delay (docs/availability.md, \"Not built yet\")",
                        self.task_id, ", ".join(i.name for i in current.inputs), op)
        self.dpc = DpcController(self.task_id, self.checkpoint_dir, channels,
                                 None if max_delay is None else max_delay.total_seconds(),
                                 self._stop_for_rerun, self._start_rerun)

    def _stop_for_rerun(self) -> None:
        """Stop the query between micro-batches (its inputs are held): a batch in flight is
        let finish (it is re-run anyway), so Spark is not interrupted inside the sink."""
        query = self.query
        if query is None or not query.isActive:
            return
        self.gate.drain(lambda: query.isActive and bool(query.status["isTriggerActive"]),
                        CONTROL_TIMEOUT_SECONDS)
        query.stop()

    def _start_rerun(self) -> None:
        self.query = self._start_query(self._stream_writer)
        log.info("task %s: query %s started again from the DPC stable point", self.task_id,
                 self.query.id)

    # --- sinks ---------------------------------------------------------------------------------

    def _start(self, op: str, input: str, sink: sinks.BatchSink) -> None:
        if self.real_time is not None:
            raise self._error(op, "a real-time task ends in a kafka-sink (compiler.realtime)")
        if self.query is not None:
            raise self._error(op, "a task has exactly one sink; the query is already started")
        if self.dpc is not None and self.dpc.max_delay is not None:  # (waiting marks nothing)
            try:
                sink = DpcSink(sink, self.dpc)
            except TypeError as exc:
                log.warning("task %s: %s; max-delay is not applied: the union or join waits "
                            "for a cut input without a limit instead, marking nothing "
                            "(docs/availability.md)", self.task_id, exc)
                self.dpc = DpcController(self.task_id, self.checkpoint_dir, self.dpc.inputs,
                                         None, self._stop_for_rerun, self._start_rerun)
        stream = self._get(op, input, marks=True)
        if input in self.marked:
            try:
                sink = MarkedSink(sink, os.path.join(self.checkpoint_dir, "spark"),
                                  [self.marked[input]])
            except TypeError as exc:
                raise self._error(op, f"stream {input!r} carries DPC marks (tentative rows): "
                                      f"{exc} (docs/availability.md)") from None
        if input in self.redo_marked:
            redo = RedoController(self.task_id, self.checkpoint_dir, self.redo_marked[input],
                                  self._stop_for_rerun, self._start_rerun)
            try:
                sink = RedoSink(sink, redo)
            except TypeError as exc:
                raise self._error(op, f"stream {input!r} is a stateful operator's over DPC "
                                      f"marks: {exc} (docs/availability.md)") from None
            self.redo = redo
        writer = (stream.df.writeStream.foreachBatch(self.gate.wrap(sink))
                  .queryName(f"{self.query_id}.{self.task_id}")
                  .option("checkpointLocation", os.path.join(self.checkpoint_dir, "spark")))
        if self.trigger_seconds > 0:
            writer = writer.trigger(processingTime=f"{int(self.trigger_seconds * 1000)} milliseconds")
        self.sink = sink
        self._stream_writer = writer
        self.query = self._start_query(writer)
        log.info("task %s: query %s started (sink %s)", self.task_id, self.query.id, op)
        if self.dpc is not None:
            self.dpc.start()
        if self.redo is not None:
            self.redo.start()

    def _start_query(self, writer: Any) -> StreamingQuery:
        """Start the query with its own settings (`spark_codegen.query_settings`: no-data
        micro-batches off for a deterministic task, whole-stage code generation off for large
        expressions). The query keeps the conf it was started with, so the session's is
        restored at once."""
        settings = spark_codegen.query_settings(self.deterministic, self.expression_nodes)
        if spark_codegen.WHOLE_STAGE in settings:
            log.info("task %s: its expressions hold %d nodes (over %d): its query runs without "
                     "whole-stage code generation", self.task_id, self.expression_nodes,
                     spark_codegen.WHOLE_STAGE_MAX_NODES)
        if not settings:
            return writer.start()
        with _CONF_LOCK:
            before = {key: self.spark.conf.getAll.get(key) for key in settings}  # None: unset
            for key, value in settings.items():
                self.spark.conf.set(key, value)
            try:
                return writer.start()
            finally:
                for key, earlier in before.items():
                    if earlier is None:
                        self.spark.conf.unset(key)
                    else:
                        self.spark.conf.set(key, earlier)

    def file_sink(self, *, op: str, input: str, path: str,
                  format: Literal["jsonl"] = "jsonl", upsert_key: Sequence[str] | None = None,
                  partition_time: str | None = None, partition_by: str | None = None,
                  upsert_deletes_by: str | None = None) -> None:
        """JSON lines appended exactly once; with `upsert_key` (the input is an updating
        aggregate's or top-n's, keyed by those columns) an upsert log (`common.upsert_log`),
        in which a row negative in `upsert_deletes_by` (an updating top-n's rank) is a
        deletion; with
        `partition_time` and `partition_by`, one file per time partition
        (`executor.partitioned_sink`)."""
        if format != "jsonl":
            raise self._error(op, f"file sink format must be jsonl, got {format!r}")
        if upsert_key is not None:
            for name in upsert_key:
                self._field(op, self._get(op, input, marks=True), name)
        if upsert_deletes_by is not None and upsert_deletes_by not in (upsert_key or ()):
            raise self._error(op, f"upsert_deletes_by {upsert_deletes_by!r} is not a column of "
                                  f"the upsert key {upsert_key!r}")
        partitioned = self._partitions(op, input, upsert_key, partition_time, partition_by)
        try:
            if partitioned is not None:
                sink: sinks.FileSink | PartitionedFileSink = PartitionedFileSink(
                    self.task_id, self._param(op, "path", path), partitioned[0], partitioned[1],
                    owner=self.checkpoint_dir)
            else:
                sink = sinks.FileSink(self.task_id, self._param(op, "path", path),
                                      owner=self.checkpoint_dir, upsert_key=upsert_key,
                                      deletes_by=upsert_deletes_by)
        except (OSError, PathRefused) as exc:
            raise self._error(op, f"cannot write the output file: {exc}") from None
        self.live[(op, "path")] = LiveParam(path, sink.retarget)
        self._start(op, input, sink)

    def _partitions(self, op: str, input: str, upsert_key: Sequence[str] | None,
                    time: str | None, by: str | None) -> tuple[str, tuple[Level, ...]] | None:
        """A partitioned file sink's time column and folders, checked again here (the
        program's values: a timestamp column of the input, a pattern of the closed set)."""
        if time is None and by is None:
            return None
        if time is None or by is None:
            raise self._error(op, "a partitioned file sink needs both partition_time and "
                                  "partition_by")
        if upsert_key is not None:
            raise self._error(op, "an upsert log is one file; it cannot be partitioned")
        field = self._field(op, self._get(op, input), time)
        if field.type is not ColumnType.TIMESTAMP:
            raise self._error(op, f"partition time {time!r} is {field.type.value}, not a "
                                  "timestamp")
        levels, problems = time_partitions.parse(by)
        if problems:
            raise self._error(op, f"partition_by {by!r}: "
                                  + "; ".join(p.message for p in problems))
        return time, levels

    def kafka_sink(self, *, op: str, input: str, bootstrap: str, topic: str,
                   format: Literal["jsonl", "csv"], delivery: str,
                   key_column: str | None = None, security_file: str | None = None) -> None:
        """Rows as records of `topic`; exactly once for read_committed readers, or at least
        once (`executor.kafka_io.KafkaSink`); a marked input's DPC marks as record headers
        (docs/kafka.md), not in real-time mode."""
        stream = self._get(op, input, marks=self.real_time is None)
        if key_column is not None:
            self._field(op, stream, key_column)
        if delivery not in ("exactly-once", "at-least-once"):
            raise self._error(op, f"delivery must be exactly-once or at-least-once, "
                                  f"got {delivery!r}")
        try:
            security = kafka_io.read_security_file(
                security_file and confine_at_open(security_file))
        except (OSError, PathRefused, KafkaParamError) as exc:
            raise self._error(op, str(exc)) from None
        try:
            kafka_io.check_broker(bootstrap, (), dict(security.librdkafka))
        except kafka_io.KafkaUnavailable as exc:
            raise kafka_io.KafkaUnavailable(f"task {self.task_id}, operator {op}: {exc}") \
                from None
        spark_dir = os.path.join(self.checkpoint_dir, "spark")
        if self.real_time is not None:
            self._real_time_sink(op, stream, kafka_realtime.SinkSettings(
                bootstrap, topic, key_column, security.java), delivery, format)
            return
        sink = kafka_io.KafkaSink(
            self.task_id, bootstrap=bootstrap, topic=topic, fmt=format, key_column=key_column,
            exactly_once=delivery == "exactly-once",
            transactional_id=transactional_id(self.query_id, self.task_id, op),
            run_id=lambda: kafka_io.query_run_id(spark_dir),
            security=dict(security.librdkafka))
        self._start(op, input, sink)

    def _real_time_sink(self, op: str, stream: Stream, settings: kafka_realtime.SinkSettings,
                        delivery: str, format: str) -> None:
        """Start the real-time query; its fence is checked first and then watched."""
        if self.query is not None:
            raise self._error(op, "a task has exactly one sink; the query is already started")
        if delivery != "at-least-once" or format != "jsonl":
            raise self._error(op, "real-time mode writes JSON values at least once; got "
                                  f"delivery={delivery!r}, format={format!r}")
        fence = self.fence
        if fence is not None:
            with fence.holding():  # a stale attempt starts nothing (Fenced)
                pass
        self.query = kafka_realtime.start_query(
            self.spark, stream.df, stream.schema, settings,
            name=f"{self.query_id}.{self.task_id}",
            checkpoint=os.path.join(self.checkpoint_dir, "spark"), interval=self.real_time or
            kafka_realtime.CHECKPOINT_INTERVAL)
        if fence is not None and fence.epoch:
            query = self.query
            self._fence_watch = kafka_realtime.FenceWatch(
                lambda: fence.current() > fence.epoch, query.stop)
        log.info("task %s: real-time query %s started (sink %s)", self.task_id, self.query.id,
                 op)

    def console_sink(self, *, op: str, input: str) -> None:
        self._start(op, input, sinks.ConsoleSink(self.task_id))

    def discard_sink(self, *, op: str, input: str) -> None:
        self._start(op, input, sinks.DiscardSink(self.task_id))

    def _channel_sink(self, op: str, input: str, channel: str, bind: str | None,
                      readers: Sequence[str] = (), marks: bool = False) -> None:
        """Serve `input` as `channel` to this query's reader tasks `readers`."""
        self._serve(op, input, channel, bind, self._declared(op, channel, readers), marks)

    def _declared(self, op: str, channel: str,
                  readers: Sequence[str]) -> tuple[WriterAuth | None, tuple[str, ...], bool]:
        """How this query's writer of `channel` admits its reader tasks `readers`: by their
        CURVE keys from the launch (plain text without keys), each under its reader id."""
        keyed = self.keys.readers.get(channel, {}) if self.keys is not None else {}
        # the launch's keys also name other queries' tasks reading a published channel
        ids = {task: channel_reader_id(task, channel) for task in (*readers, *keyed)}
        try:
            auth = self.keys.writer_auth(channel, ids) if self.keys is not None else None
        except ChannelKeyError as exc:
            raise self._error(op, str(exc)) from None
        return auth, tuple(ids.values()), False

    def _serve(self, op: str, input: str, channel: str, bind: str | None,
               access: tuple[WriterAuth | None, tuple[str, ...], bool],
               marks: bool = False, relay: bool = False) -> None:
        """`relay`: a marked input may be served (a network sink's, with `marks`); a channel
        to another task does not carry marks on (docs/availability.md, "Not built yet")."""
        if self.channels is None:
            raise self._error(op, "channel sinks need the executor's ChannelHub")
        stream = self._get(op, input, marks=relay).schema
        schema = shapes.arrow_schema(dpc_marks.with_marks(stream) if marks else stream)
        self._access[channel] = access
        writer = self._writer(channel, schema, bind)
        self._start(op, input, sinks.ChannelSink(self.task_id, writer, schema))

    def _writer(self, channel: str, schema: pa.Schema, bind: str | None) -> "ChannelWriter":
        """The hub's writer of `channel`, admitting the readers `_access` declares for it, with
        its upstream backup logged under this task's checkpoint folder: a relaunch of the task
        (in a new executor, on any agent reaching that folder) continues the same numbering and
        still serves every batch its readers had not acknowledged."""
        assert self.channels is not None
        auth, expected, open_readers = self._access[channel]
        log_dir = os.path.join(self.checkpoint_dir, "channels", quote(channel, safe=""))
        return self.channels.writer(channel, schema, bind=bind, log_dir=log_dir,
                                    expected_readers=expected, auth=auth,
                                    open_readers=open_readers, owner=self.task_id,
                                    published=channel in self._published)

    def control_sink(self, *, op: str, input: str, scheduler: str | None = None) -> None:
        """Send `input`'s rows (string columns query, operator, parameter, value) as control
        tuples to the scheduler API at `scheduler` (None: the executor's ELASTIQ_SCHEDULER,
        else the default address), with the token in the file ELASTIQ_TOKEN_FILE names, if
        set. The rows are data: the scheduler checks every tuple before anything changes."""
        from common.api_client import DEFAULT_URL, SchedulerClient
        from common.api_token import read_token_file

        problems = control_schema_problems(self._get(op, input).schema)
        if problems:
            raise self._error(op, f"stream {input!r} is not a control stream: "
                                  f"{'; '.join(problems)}")
        url = scheduler or os.environ.get("ELASTIQ_SCHEDULER") or DEFAULT_URL
        try:
            client = SchedulerClient(url, timeout=CONTROL_TIMEOUT_SECONDS,
                                     token=read_token_file(os.environ.get("ELASTIQ_TOKEN_FILE")))
        except (ValueError, OSError) as exc:
            raise self._error(op, str(exc)) from None
        log.info("task %s: control sink %s sends to %s", self.task_id, op, url)
        self._start(op, input, sinks.ControlSink(self.task_id, client))

    def network_sink(self, *, op: str, input: str, endpoint: str, channel: str,
                     readers: str | None = None, key_file: str | None = None,
                     marks: bool = False) -> None:
        """Serve the results as `channel` at `endpoint` for other queries or programs: the
        readers "id=PUBLICKEY, ..." over CURVE with the keypair in `key_file`; without a key
        file, plain text to the reader ids `readers` names; with neither, plain text to whoever
        subscribes (a trusted network only: any peer can read, ack or pin the backup).
        `marks` (the compiler's `network_sink_marks`: the task's union or join has max-delay,
        or its input comes through filters and projections from a marked channel): each row
        carries its DPC marks, as on a marked channel (`executor.dpc_marks`)."""
        try:
            declared = parse_readers(readers or "")
            auth = WriterAuth(read_key_file(key_file), declared) if key_file else None
        except ChannelKeyError as exc:
            raise self._error(op, str(exc)) from None
        if auth is not None and not declared:
            raise self._error(op, "a network sink with a key file must declare its readers "
                                  "(readers=\"id=PUBLICKEY, ...\")")
        if auth is None and not declared:
            log.warning("task %s: network sink %s serves %s in plain text to any peer; declare "
                        "its readers and a key file to authenticate them", self.task_id, op,
                        channel)
        access = (auth, () if auth is not None else tuple(declared), not declared)
        self._serve(op, input, channel, self._param(op, "endpoint", endpoint), access, marks,
                    relay=marks)
        sink = self.sink.inner if isinstance(self.sink, (DpcSink, MarkedSink, RedoSink)) \
            else self.sink
        assert isinstance(sink, sinks.ChannelSink)
        self.live[(op, "endpoint")] = LiveParam(
            endpoint, lambda bind: self._move_writer(op, sink, channel, str(bind)))

    def _move_writer(self, op: str, sink: sinks.ChannelSink, channel: str, bind: str) -> Undo:
        """Reopen the channel's writer at `bind` on the same log (numbering and unacknowledged
        batches carry over; its readers follow) and hand it to `sink`; returns how to go back."""
        before = self.channels.bind_of(channel) if self.channels is not None else None
        if before is None:
            raise self._error(op, f"channel {channel}'s writer has no bind to move from")
        self._rebind(sink, channel, bind, before)

        def undo() -> None:
            self._rebind(sink, channel, before, bind)
        return undo

    def _rebind(self, sink: sinks.ChannelSink, channel: str, bind: str, fallback: str) -> None:
        """`sink`'s writer reopened at `bind`; if that fails, at `fallback`, and the error raised."""
        try:
            sink.writer = self._writer(channel, sink.schema, bind)
        except Exception:
            sink.writer = self._writer(channel, sink.schema, fallback)
            raise

    def channel_sink(self, *, input: str, channel: str, readers: Sequence[str] = (),
                     published: bool = False, marks: bool = False) -> None:
        """Serve `input` to the tasks `readers` on the endpoint the scheduler assigned (a free
        local port when run outside a cluster); the writer keeps every batch until each reader
        has acknowledged it. `published`: other queries may read it too (`ChannelWriter`);
        `marks`: each row carries its DPC marks (`executor.dpc_marks`: the task's union or join
        with max-delay marks them, else they are null), for a reader with `marks`."""
        if published:
            self._published.add(channel)
        self._channel_sink(f"write:{channel}", input, channel, self.endpoints.get(channel),
                           readers, marks)

    def split_channel_sink(self, *, input: str, channels: Sequence[str], key: Sequence[str],
                           readers: Sequence[Sequence[str]], active: int | None = None,
                           switch: tuple[Any, ...] | None = None, folded: bool = False) -> None:
        """Serve `input` split over the first `active` (default all) of k = len(channels)
        partitions, partition i+1 on channels[i] for the tasks readers[i]; a row goes to
        pmod(hash(key columns), active) (all columns when `key` is empty), Spark's Murmur3
        hash, the same in every process. `key` and `active` are live: a control tuple changes
        them between two micro-batches (a rescale). With `switch` (a stateful operator's time
        column, window size, tick horizon and slide, ms; for a join's splitters also the
        spread, the join bound on the right input, and 1: switches are planned by the
        scheduler) a new `active` takes over for the windows from the next window start on, or
        for a join from the event time the scheduler planned, `active` = [n, at]
        (`executor.routing`); the schedule is kept next to the checkpoint, so a restarted query
        routes as before. `folded`: the last channel feeds the operator's instance folded into
        the merger's task, routed to alone while `active` is 0, never by the hash."""
        op = splitter_op_id(channels)
        if self.channels is None:
            raise self._error(op, "channel sinks need the executor's ChannelHub")
        if not channels or len(set(channels)) != len(channels):
            raise self._error(op, f"a split needs distinct partition channels, got {channels}")
        if len(readers) != len(channels):
            raise self._error(op, f"{len(channels)} channels but {len(readers)} reader lists")
        stream = self._get(op, input)
        timing = routing.Switch.of(self._field(op, stream, switch[0]).name,
                                   [int(v) for v in switch[1:5]], bool(switch[5:] and switch[5])) \
            if switch is not None else None
        schema = shapes.arrow_schema(with_tick(stream.schema, timing.sliding)
                                     if timing is not None else stream.schema)
        for channel, tasks in zip(channels, readers):
            self._access[channel] = self._declared(op, channel, tasks)
        writers = [self._writer(channel, schema, self.endpoints.get(channel))
                   for channel in channels]
        slots = len(channels) - 1 if folded else len(channels)
        initial = slots if active is None else active
        n, planned = self._planned(op, self._param(op, "active", initial), slots, folded)
        path = os.path.join(self.checkpoint_dir, "routing", quote(op, safe="") + ".json")
        schedule = routing.load(path) if timing is not None else None
        if schedule is None or schedule.entries[-1][1] > len(channels):
            schedule = routing.Schedule([(None, n)])
        sink = sinks.SplitChannelSink(self.task_id, writers, schema,
                                      self._hash(op, stream, self._param(op, "key", key)),
                                      schedule, timing, path if timing is not None else None,
                                      folded)

        def switch_to(n: int, planned: int | None, refused: type[ValueError] = RuntimeSpecError
                      ) -> tuple[Undo, int | None]:
            try:
                return sink.rescale(n, planned)
            except ValueError as exc:
                raise refused(self.task_id, op, f"cannot switch to {n} instances: {exc}; "
                                                "ask again") from None

        if schedule.active != n:  # changed while the query was down: switch now
            switch_to(n, planned, SwitchRefused)  # a join's splitter at the planned time

        def rescale(value: Any) -> Undo:
            undo, at = switch_to(*self._planned(op, value, slots, folded))
            self.switch_detail["switch_ms"] = float(at) if at is not None else -1.0
            return undo
        self.live[(op, "key")] = LiveParam(
            list(key), lambda new: sink.route(self._hash(op, stream, new)))
        self.live[(op, "active")] = LiveParam(initial, rescale)
        self._start(op, input, sink)

    def _planned(self, op: str, value: Any, slots: int, folded: bool = False
                 ) -> tuple[int, int | None]:
        """The number of partitions routed to, and the event time (ms) the scheduler planned
        the switch at: `n`, or `[n, at]` for a join's splitters."""
        if isinstance(value, (list, tuple)) and len(value) == 2:
            at = value[1]
            if isinstance(at, bool) or not isinstance(at, int) or at < 0:
                raise self._error(op, f"a planned switch is at an event time in ms, not {at!r}")
            return self._active(op, value[0], slots, folded), at
        return self._active(op, value, slots, folded), None

    def _active(self, op: str, value: Any, slots: int, folded: bool = False) -> int:
        """The number of partitions routed to: a whole number in 1..slots (0..slots when 0
        routes to the folded instance)."""
        low = 0 if folded else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= slots:
            raise self._error(op, f"a split over {slots} channels routes to {low}..{slots} of "
                                  f"them, not {value!r}")
        return value

    def _hash(self, op: str, stream: Stream, key: Sequence[str]) -> Column:
        """A row's key hash: Spark's Murmur3 `hash` of the key columns (all columns when `key`
        is empty), the same in every process (Python's `hash()` is salted per process)."""
        names = [self._field(op, stream, k).name for k in key] or list(stream.schema.names)
        return F.hash(*[F.col(f"`{k}`") for k in names])


SHED_OBSERVATION = "shed:"  # a drop's observed metrics (rows, dropped) in each progress report


def _with_share(stream: Stream, share: Column) -> DataFrame:
    """`stream`'s rows with their keep share (common/kept.py): `share` times the share they
    already carry from a drop upstream (drops in series multiply), or `share`."""
    if kept_share.carries(stream.schema):
        share = F.col(f"`{kept_share.KEPT}`") * share
    return stream.df.withColumn(kept_share.KEPT, share.cast("double"))


def _window_shares(input: str, schema: Schema) -> list[Column]:
    """A window's results over a shed stream (common/kept.py): the fraction of its input it
    reflects, n / sum(1/share) of its rows (each stands for 1/share arrivals), and whether it
    lost input (a row with a share under 1, or an upstream result that lost input)."""
    share = _qcol(input, kept_share.KEPT)
    fraction = (F.count(F.lit(1)) / F.sum(F.lit(1.0) / share)).cast("double")
    lost = F.min(share) < F.lit(1.0)
    if kept_share.LOST in schema.names:
        lost = lost | F.coalesce(F.max(_qcol(input, kept_share.LOST)), F.lit(False))
    return [fraction.alias(kept_share.KEPT), lost.alias(kept_share.LOST)]


DROP_BUCKETS = 1 << 30  # a row's hash, reduced to [0, 1) in steps of 2**-30


def drop_keeps(schema: Schema, seed: int, ratio: float) -> Column:
    """True of the rows a drop keeps at `ratio`: those whose seeded hash of every column falls
    at or above `ratio` of [0, 1). Deterministic (a replay keeps the same rows) and, over many
    distinct rows, drops `ratio` of them."""
    if ratio <= 0.0:
        return F.lit(True)
    if ratio >= 1.0:
        return F.lit(False)
    hashed = F.xxhash64(F.lit(int(seed)), *[F.col(f"`{n}`") for n in schema.names])
    return F.pmod(hashed, F.lit(DROP_BUCKETS)) >= F.lit(int(ratio * DROP_BUCKETS))
