"""The DPC marks-across-a-channel scenario (docs/availability.md, "Marks across channels"):
upstream tasks a1 and a2 (paced generators) feed channels a1.raw and a2.raw; task "u" unions
them (a2's through `dpc_support.LinkProxy`) with max-delay and serves the union on the marked
channel u.out; task "f" reads u.out, keeps the rows with temp > THRESHOLD (a filter, then a
projection) and writes a file sink. `marked_cut_run` cuts a2's link once f's first rows are
out, heals it after `cut_seconds`, and returns what f's sink holds once everything drained;
`oracle` is the plain-Python filter over all input. The other runs change whose sink is read:
u's own network sink (`network_cut_run`) or Kafka sink (`kafka_cut_run`), or two downstream
tasks filtering u.out into a network sink and a Kafka sink (`downstream_sinks_cut_run`), or
two stateful tasks, a window and an updating aggregate, each straight into its file sink
(`stateful_cut_run`: checkpoint/redo; `window_oracle` and `totals_oracle` the plain-Python
results over all input)."""

from __future__ import annotations

import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

from common.types import Schema
from testkit.dpc_support import (START, LinkProxy, _first_int, _sources_up, _wait_settled,
                                 input_rows)
from testkit.e2e_support import read_sink
from testkit.waiting import wait_for

READING = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"))
THRESHOLD = 25.0
CONDITION = f"temp > {THRESHOLD}"

Key = tuple[str, datetime, float]


def union_oracle(rate: float, limit: int) -> list[Key]:
    """Every input row of a1 and a2, sorted: the union's exact result."""
    return keys(input_rows(1, rate, limit) + input_rows(2, rate, limit))


def oracle(rate: float, limit: int) -> list[Key]:
    """Every input row of a1 and a2 that passes the filter, sorted."""
    rows = input_rows(1, rate, limit) + input_rows(2, rate, limit)
    return sorted((r["sensor"], r["ts"], r["temp"]) for r in rows if r["temp"] > THRESHOLD)


def keys(rows: list[dict[str, Any]]) -> list[Key]:
    return sorted((r["sensor"], r["ts"], r["temp"]) for r in rows)


@dataclass
class MarkedRun:
    rows: list[dict[str, Any]]  # f's sink once every input drained
    at_heal: list[dict[str, Any]]  # f's sink when the link healed
    first_tentative: float  # seconds from the cut to f's first tentative row
    reconcile: float  # seconds u's reconcile took
    cut_at: float = 0.0  # time.monotonic() of the cut
    healed_at: float = 0.0  # and of the heal


def _union_task(spark: Any, tmp_path: Path, hub: Any, proxy: LinkProxy, schema: Any,
                max_delay: str) -> Any:
    """Task u: the union `both` of a1's channel and a2's (through the proxy the test cuts),
    with `max_delay`; its sink is the caller's."""
    from executor.runtime import TaskRuntime

    u = TaskRuntime(spark, query_id="q", task_id="u", checkpoint_dir=str(tmp_path / "u"),
                    channels=hub, trigger_seconds=0.5, endpoints={"a2.raw": proxy.endpoint})
    u.channel_source(output="r1", schema=schema, channel="a1.raw")
    u.channel_source(output="r2", schema=schema, channel="a2.raw")
    u.union(op="u", inputs=("r1", "r2"), output="both", max_delay=max_delay)
    return u


def _upstream_task(spark: Any, tmp_path: Path, hub: Any, proxy: LinkProxy, schema: Any,
                   max_delay: str, readers: tuple[str, ...] = ("f",)) -> Any:
    u = _union_task(spark, tmp_path, hub, proxy, schema, max_delay)
    u.channel_sink(input="both", channel="u.out", readers=readers, marks=True)
    assert u.dpc is not None, "the union's max-delay was not applied"
    _sources_up(u)
    return u


def _downstream_task(spark: Any, tmp_path: Path, hub: Any, schema: Any,
                     task_id: str = "f", sink: Callable[[Any], None] | None = None) -> Any:
    """Task `task_id` reads u.out (marked), keeps the hot rows, projects them and writes them
    with `sink(task)` (default: the file sink f.jsonl)."""
    from executor.runtime import TaskRuntime

    f = TaskRuntime(spark, query_id="q", task_id=task_id,
                    checkpoint_dir=str(tmp_path / task_id), channels=hub, trigger_seconds=0.5)
    f.channel_source(output="in", schema=schema, channel="u.out", marks=True)
    f.filter(op="hot", input="in", output="hot", condition=CONDITION)
    f.project(op="p", input="hot", output="out",
              fields=(("sensor", "sensor"), ("ts", "ts"), ("temp", "temp")))
    if sink is None:
        f.file_sink(op="sink", input="out", path=str(tmp_path / "f.jsonl"))
    else:
        sink(f)
    _sources_up(f)
    return f


def _read_all_of_u(u: Any, f: Any) -> None:
    """Until downstream task `f` finished every batch u sent it."""
    from executor.spool_source import finished_seq

    u_last = u.sink.inner.writer.retained_range()[1]
    f_dir = str(Path(f.checkpoint_dir) / "spark")
    _wait_settled(f.query, lambda: (finished_seq(f_dir, "u.out") or 0) >= u_last, f.task_id)


@dataclass
class Scenario:
    """What `_drive` needs of one variant: `build(hub, proxy)` starts the DPC task u (and what
    reads it) and returns the tasks to stop; `read()` is what the sink holds now, as records
    (`common.dpc_view`); `drained(u, tasks)` waits until the sink holds everything u wrote."""

    build: Callable[[Any, LinkProxy], list[Any]]
    read: Callable[[], list[dict[str, Any]]]
    drained: Callable[[Any, list[Any]], None]


def _drive(spark: Any, tmp_path: Path, scenario: Scenario, *, rate: float, limit: int,
           cut_seconds: float) -> MarkedRun:
    """Start a1 and a2, u (its a2 link through a proxy) and its reader; cut a2's link once the
    sink holds rows, heal it after `cut_seconds`, and return the sink once everything drained."""
    from common import dpc_view
    from executor.runtime import ChannelHub, TaskRuntime, channel_reader_id
    from executor.shapes import arrow_schema
    from executor.spool_source import finished_seq

    hub = ChannelHub()
    writers = {ch: hub.writer(ch, arrow_schema(READING),
                              expected_readers=[channel_reader_id("u", ch)])
               for ch in ("a1.raw", "a2.raw")}
    proxy = LinkProxy(hub.endpoint("a2.raw") or "")
    ups = [TaskRuntime(spark, query_id="q", task_id=f"a{i}", checkpoint_dir=str(tmp_path / f"a{i}"),
                       channels=hub, trigger_seconds=0.5) for i in (1, 2)]
    tasks: list[Any] = []
    try:
        tasks += scenario.build(hub, proxy)
        u = tasks[0]
        for i, rt in enumerate(ups, start=1):
            rt.generator(op="src", output="raw", schema=READING, shape="sensor", seed=i,
                         rate=rate, limit=limit, start=START)
            rt.channel_sink(input="raw", channel=f"a{i}.raw")
        dpc = u.dpc
        wait_for("the sink's first rows", lambda: bool(scenario.read()), 90)
        progress = ups[0].query.lastProgress
        assert progress and _first_int(progress["sources"][0]["endOffset"]) != limit, \
            "the input ended before the cut"
        proxy.cut()
        cut_at = time.monotonic()
        wait_for("tentative rows in the sink during the cut",
                 lambda: any(dpc_view.TENTATIVE in r for r in scenario.read()), 60)
        first = time.monotonic() - cut_at
        wait_for("the cut's end", lambda: time.monotonic() - cut_at >= cut_seconds,
                 cut_seconds + 30, 0.5)
        at_heal = scenario.read()
        proxy.heal()
        healed_at = time.monotonic()
        wait_for("u's reconcile", lambda: bool(dpc.reconcile_seconds), 180)
        for rt in ups:
            _wait_settled(rt.query, lambda q=rt.query: _first_int(
                q.lastProgress["sources"][0]["endOffset"]) == limit, rt.task_id)
        lasts = {ch: w.retained_range()[1] for ch, w in writers.items()}
        u_dir = str(Path(u.checkpoint_dir) / "spark")
        _wait_settled(u.query, lambda: all((finished_seq(u_dir, ch) or 0) >= last
                                           for ch, last in lasts.items()), "u")
        scenario.drained(u, tasks)
        return MarkedRun(scenario.read(), at_heal, first, dpc.reconcile_seconds[0], cut_at,
                         healed_at)
    finally:
        for rt in (*reversed(tasks), *ups):
            rt.stop()
        proxy.close()
        hub.close()


def marked_cut_run(spark: Any, tmp_path: Path, *, rate: float, limit: int,
                   cut_seconds: float, max_delay: str) -> MarkedRun:
    """u serves the union on the marked channel u.out; f filters it into a file sink."""
    out = tmp_path / "f.jsonl"

    def build(hub: Any, proxy: LinkProxy) -> list[Any]:
        u = _upstream_task(spark, tmp_path, hub, proxy, READING, max_delay)
        return [u, _downstream_task(spark, tmp_path, hub, READING)]

    def drained(u: Any, tasks: list[Any]) -> None:
        _read_all_of_u(u, tasks[1])

    return _drive(spark, tmp_path, Scenario(build, lambda: read_sink(out), drained),
                  rate=rate, limit=limit, cut_seconds=cut_seconds)


class MarkedChannelReader:
    """A plain reader of a DPC task's network sink (a real ZeroMQ `ChannelReader` on a thread,
    acknowledging each batch): keeps each batch's rows, with their mark columns, by seq."""

    def __init__(self, channel: str, reader_id: str, endpoint: str) -> None:
        from executor.channels.reader import ChannelReader
        from executor.dpc_marks import with_marks
        from executor.shapes import arrow_schema

        schema = arrow_schema(with_marks(READING))
        self.reader = ChannelReader(channel, reader_id, endpoint, schema)
        self.batches: dict[int, list[dict[str, Any]]] = {}
        self.arrived: dict[int, float] = {}  # seq -> time.monotonic() it came
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "MarkedChannelReader":
        self.reader.subscribe(from_seq=1)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for batch in self.reader.poll(0.2):
                with self._lock:
                    self.batches[batch.seq] = batch.table.to_pylist()
                    self.arrived.setdefault(batch.seq, time.monotonic())
                self.reader.ack(batch.seq)

    def high(self) -> int:
        with self._lock:
            return max(self.batches, default=0)

    def first_tentative(self) -> float | None:
        """When the first batch with a tentative row came (time.monotonic(); None: none)."""
        from executor.dpc_marks import REVISION_MARK, TENTATIVE_MARK

        return self._first(lambda r: r[TENTATIVE_MARK] is not None and r[REVISION_MARK] is None)

    def first_revision(self) -> float | None:
        """When the first batch revising an episode came (on its rows or a correction row)."""
        from executor.dpc_marks import REVISION_MARK

        return self._first(lambda r: r[REVISION_MARK] is not None)

    def _first(self, wanted: Callable[[dict[str, Any]], bool]) -> float | None:
        with self._lock:
            times = [self.arrived[seq] for seq, rows in self.batches.items()
                     if any(wanted(r) for r in rows)]
        return min(times, default=None)

    def records(self) -> list[dict[str, Any]]:
        """The batches so far as a file sink's records (`common.dpc_view.channel_records`)."""
        from common import dpc_view

        with self._lock:
            ordered = [self.batches[seq] for seq in sorted(self.batches)]
        return dpc_view.channel_records(ordered)

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(5)
        self.reader.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def network_cut_run(spark: Any, tmp_path: Path, *, rate: float, limit: int,
                    cut_seconds: float, max_delay: str) -> tuple[MarkedRun, int]:
    """u serves the union on its network sink u.net (marked); a plain channel reader reads it.
    Returns the run (the reader's batches as records) and the frames the reader refused."""
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    reader = MarkedChannelReader("u.net", "test-reader", endpoint)

    def build(hub: Any, proxy: LinkProxy) -> list[Any]:
        u = _union_task(spark, tmp_path, hub, proxy, READING, max_delay)
        u.network_sink(op="out", input="both", endpoint=endpoint, channel="u.net",
                       marks=True)  # plain text to any peer: the test's reader
        assert u.dpc is not None and u.dpc.max_delay is not None, "max-delay not applied"
        _sources_up(u)
        reader.start()
        return [u]

    def drained(u: Any, tasks: list[Any]) -> None:
        last = u.sink.inner.writer.retained_range()[1]
        wait_for(f"the reader's seq {last}", lambda: reader.high() >= last, 60)

    try:
        run = _drive(spark, tmp_path, Scenario(build, reader.records, drained),
                     rate=rate, limit=limit, cut_seconds=cut_seconds)
        return run, reader.reader.stats().refused_frames
    finally:
        reader.stop()


class HeaderReader:
    """A read_committed reader of a Kafka topic on a thread (confluent-kafka): keeps each
    record's (headers, value), which `common.dpc_view.kafka_records` turns into records."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{topic}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                  "isolation.level": "read_committed"})
        self.consumer.subscribe([topic])
        self.messages: list[tuple[Any, bytes | None]] = []
        self.arrived: list[float] = []  # time.monotonic() each message came
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self.consumer.consume(1000, 0.2):
                if message.error() is None:
                    with self._lock:
                        self.messages.append((message.headers(), message.value()))
                        self.arrived.append(time.monotonic())

    def count(self) -> int:
        with self._lock:
            return len(self.messages)

    def first_with(self, header: str) -> float | None:
        """When the first record with `header` came (time.monotonic(); None: none)."""
        with self._lock:
            times = [at for (headers, _), at in zip(self.messages, self.arrived)
                     if any(name == header for name, _ in headers or ())]
        return min(times, default=None)

    def read(self) -> Any:
        """`common.dpc_view.KafkaRead` of every record so far, ISO-8601 `...Z` strings as
        aware datetimes (as `e2e_support.read_sink` reads a file sink)."""
        from common import dpc_view

        with self._lock:
            messages = list(self.messages)
        read = dpc_view.kafka_records(messages)
        return dpc_view.KafkaRead([_with_times(r) for r in read.records], read.refused)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.consumer.close()


def _with_times(record: dict[str, Any]) -> dict[str, Any]:
    return {k: datetime.fromisoformat(v.replace("Z", "+00:00"))
            if isinstance(v, str) and v.endswith("Z") and "T" in v else v
            for k, v in record.items()}


def kafka_cut_run(spark: Any, tmp_path: Path, bootstrap: str, topic: str, *, rate: float,
                  limit: int, cut_seconds: float, max_delay: str) -> tuple[MarkedRun, Any]:
    """u writes the union to its exactly-once kafka-sink; a read_committed reader reads the
    topic's headers and values. Returns the run (the records as a file sink's) and the
    reader's last `KafkaRead` (records refused, if any)."""
    reader = HeaderReader(bootstrap, topic)

    def build(hub: Any, proxy: LinkProxy) -> list[Any]:
        u = _union_task(spark, tmp_path, hub, proxy, READING, max_delay)
        u.kafka_sink(op="out", input="both", bootstrap=bootstrap, topic=topic, format="jsonl",
                     delivery="exactly-once")
        assert u.dpc is not None and u.dpc.max_delay is not None, "max-delay not applied"
        _sources_up(u)
        return [u]

    def drained(u: Any, tasks: list[Any]) -> None:
        written = u.sink.inner.rows_out + len(u.dpc.reconcile_seconds)  # rows, corrections
        wait_for(f"{written} records at the reader", lambda: reader.count() >= written, 60)
        settle = time.monotonic() + 1.0  # a record written twice would show by then
        wait_for("the reader's settle", lambda: time.monotonic() >= settle, 5, 0.2)

    try:
        run = _drive(spark, tmp_path, Scenario(build, lambda: reader.read().records, drained),
                     rate=rate, limit=limit, cut_seconds=cut_seconds)
        return run, reader.read()
    finally:
        reader.stop()


@dataclass
class DownstreamRun:
    """The downstream network and Kafka sinks' records after a cut run, and when each first
    showed a tentative row (seconds after the cut; None: never)."""

    run: MarkedRun  # its rows: the network sink's
    kafka: Any  # the Kafka reader's last `common.dpc_view.KafkaRead`
    refused_frames: int  # frames the network reader refused
    network_first: float | None
    kafka_first: float | None
    network_revised: float | None  # seconds from the heal to the revision at each reader
    kafka_revised: float | None


def downstream_sinks_cut_run(spark: Any, tmp_path: Path, bootstrap: str, topic: str, *,
                             rate: float, limit: int, cut_seconds: float,
                             max_delay: str) -> DownstreamRun:
    """u serves the union on the marked channel u.out to two stateless downstream tasks: "fn"
    filters it into a network sink (marked, read by a plain channel reader) and "fk" into an
    exactly-once kafka-sink (read read_committed). The run's rows are the network reader's."""
    from common import dpc_view

    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    net = MarkedChannelReader("fn.net", "test-reader", endpoint)
    kafka = HeaderReader(bootstrap, topic)

    def network(f: Any) -> None:
        f.network_sink(op="net", input="out", endpoint=endpoint, channel="fn.net", marks=True)

    def to_kafka(f: Any) -> None:
        f.kafka_sink(op="k", input="out", bootstrap=bootstrap, topic=topic, format="jsonl",
                     delivery="exactly-once")

    def build(hub: Any, proxy: LinkProxy) -> list[Any]:
        u = _upstream_task(spark, tmp_path, hub, proxy, READING, max_delay, ("fn", "fk"))
        fn = _downstream_task(spark, tmp_path, hub, READING, "fn", network)
        net.start()
        return [u, fn, _downstream_task(spark, tmp_path, hub, READING, "fk", to_kafka)]

    def drained(u: Any, tasks: list[Any]) -> None:
        fn, fk = tasks[1], tasks[2]
        for f in (fn, fk):
            _read_all_of_u(u, f)
        last = fn.sink.inner.writer.retained_range()[1]
        wait_for(f"the network reader's seq {last}", lambda: net.high() >= last, 60)
        rows = fk.sink.inner.rows_out
        wait_for(f"{rows} rows at the Kafka reader", lambda: len(
            [r for r in kafka.read().records if dpc_view.REVISION not in r]) >= rows, 60)
        settle = time.monotonic() + 1.0  # a record written twice would show by then
        wait_for("the Kafka reader's settle", lambda: time.monotonic() >= settle, 5, 0.2)

    try:
        run = _drive(spark, tmp_path, Scenario(build, net.records, drained),
                     rate=rate, limit=limit, cut_seconds=cut_seconds)
        firsts = [None if t is None else t - run.cut_at
                  for t in (net.first_tentative(), kafka.first_with(dpc_view.TENTATIVE_HEADER))]
        revised = [None if t is None else t - run.healed_at
                   for t in (net.first_revision(), kafka.first_with(dpc_view.REVISION_HEADER))]
        return DownstreamRun(run, kafka.read(), net.reader.stats().refused_frames, *firsts,
                             *revised)
    finally:
        net.stop()
        kafka.stop()


# -- a stateful downstream task: checkpoint/redo (docs/availability.md, "A stateful downstream
# task")

REDO_WATERMARK = timedelta(seconds=3)  # w's and t's (a2 may lag a1 by seconds under load)
Windows = dict[tuple[datetime, str], tuple[int, float]]
Totals = dict[str, tuple[int, float]]


def window_oracle(rate: float, limit: int) -> Windows:
    """(window start, sensor) -> (count, sum of temp) of 1 s windows over every input row of
    a1 and a2, for the windows the final watermark (largest time minus REDO_WATERMARK) closes
    (plain Python)."""
    groups: dict[tuple[datetime, str], list[float]] = defaultdict(list)
    rows = input_rows(1, rate, limit) + input_rows(2, rate, limit)
    for r in rows:
        groups[(r["ts"].replace(microsecond=0), r["sensor"])].append(r["temp"])
    closed_by = max(r["ts"] for r in rows) - REDO_WATERMARK
    return {k: (len(v), sum(v)) for k, v in groups.items()
            if k[0] + timedelta(seconds=1) <= closed_by}


def totals_oracle(rate: float, limit: int) -> Totals:
    """sensor -> (count, sum of temp) over every input row of a1 and a2 (plain Python)."""
    out: Totals = {}
    for r in input_rows(1, rate, limit) + input_rows(2, rate, limit):
        n, total = out.get(r["sensor"], (0, 0.0))
        out[r["sensor"]] = (n + 1, total + r["temp"])
    return out


def written_windows(rows: list[dict[str, Any]]) -> Windows:
    """A view's windows; a window in it twice is an error."""
    out: Windows = {}
    for r in rows:
        key = (r["window_start"], r["sensor"])
        assert key not in out, f"window {key} twice in one view"
        out[key] = (r["n"], r["total"])
    return out


def written_totals(rows: list[dict[str, Any]]) -> Totals:
    """An upsert log's view folded per sensor (the last record of each)."""
    from common import dpc_view

    return {r["sensor"]: (r["n"], r["total"]) for r in dpc_view.folded(rows)}


@dataclass
class RedoRun:
    """The stateful downstream tasks' sinks after a cut run: "w" (1 s windows per sensor, a
    file sink) and "t" (running totals per sensor, an upsert log), and how long each one's
    reconcile took (s)."""

    run: MarkedRun  # its rows: t's upsert log
    windows: list[dict[str, Any]]  # w's file sink
    w_reconcile: list[float]
    t_reconcile: list[float]


def _stateful_task(spark: Any, tmp_path: Path, hub: Any, task_id: str) -> Any:
    """Task "w" or "t": reads u.out (marked) into a window aggregate or an updating aggregate
    (count and sum of temp per sensor) straight into its file sink (t's an upsert log)."""
    from executor.runtime import TaskRuntime

    b = TaskRuntime(spark, query_id="q", task_id=task_id,
                    checkpoint_dir=str(tmp_path / task_id), channels=hub, trigger_seconds=0.5)
    b.channel_source(output="in", schema=READING, channel="u.out", marks=True)
    aggregates = (("n", "count", None), ("total", "sum", "temp"))
    watermark = f"{int(REDO_WATERMARK.total_seconds())} seconds"
    if task_id == "w":
        b.window_aggregate(op="agg", input="in", output="out", time="ts", window="1 seconds",
                           slide=None, watermark=watermark, group_by=("sensor",),
                           aggregates=aggregates)
        b.file_sink(op="sink", input="out", path=str(tmp_path / "w.jsonl"))
    else:
        b.updating_aggregate(op="agg", input="in", output="out", time="ts", ttl="1 hours",
                             watermark=watermark, group_by=("sensor",), aggregates=aggregates)
        b.file_sink(op="sink", input="out", path=str(tmp_path / "t.jsonl"),
                    upsert_key=("sensor",))
    assert b.redo is not None, f"{task_id}: no checkpoint/redo over the marked stream"
    _sources_up(b)
    return b


def stateful_cut_run(spark: Any, tmp_path: Path, *, rate: float, limit: int,
                     cut_seconds: float, max_delay: str) -> RedoRun:
    """u serves the union on the marked channel u.out to two stateful tasks, "w" and "t"
    (`_stateful_task`); the run's rows are t's upsert log."""

    def build(hub: Any, proxy: LinkProxy) -> list[Any]:
        u = _upstream_task(spark, tmp_path, hub, proxy, READING, max_delay, ("w", "t"))
        return [u, _stateful_task(spark, tmp_path, hub, "w"),
                _stateful_task(spark, tmp_path, hub, "t")]

    seconds: dict[str, list[float]] = {}

    def drained(u: Any, tasks: list[Any]) -> None:
        for b in tasks[1:]:
            wait_for(f"{b.task_id}'s reconcile", lambda b=b: bool(b.redo.reconcile_seconds), 120)
            _read_all_of_u(u, b)
            seconds[b.task_id] = list(b.redo.reconcile_seconds)

    run = _drive(spark, tmp_path, Scenario(build, lambda: read_sink(tmp_path / "t.jsonl"),
                                           drained),
                 rate=rate, limit=limit, cut_seconds=cut_seconds)
    return RedoRun(run, read_sink(tmp_path / "w.jsonl"), seconds["w"], seconds["t"])
