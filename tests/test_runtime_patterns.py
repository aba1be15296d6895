"""Spark layer, the run-time side of the patterns: identity (plumbing nodes), the splitter's
partitioned channel sink, deterministic batches of hot-standby replicas, the stream selector over
replica channels and endpoint retargeting of channel sources. Inputs come from test-owned
`ChannelWriter`s or the generator; every oracle is plain Python over the same rows
(`input_rows`, the reference twin of the generator); outputs are read with real ZeroMQ readers
or from the exactly-once file sink."""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pytest

from executor.channels import Batch, ChannelReader, ChannelWriter
from executor.endpoints_file import endpoints_path, write_endpoints
from executor.runtime import ChannelHub, TaskRuntime, channel_reader_id
from executor.shapes import arrow_schema
from executor.sources import source_log_path
from executor.spark_codegen import NO_DATA_BATCHES
from test_runtime_ops import AGGS, SENSOR, assert_windows_match, sensor_aggregates, window_oracle
from test_runtime_support import START, input_rows, read_sink, wait_drained, wait_for

pytestmark = pytest.mark.spark

ARROW_SENSOR = arrow_schema(SENSOR)
WINDOW = timedelta(milliseconds=400)
DELAY = timedelta(milliseconds=200)


def sensor_key(row: dict) -> tuple:
    return (row["sensor"], row["ts"], row["temp"], row["humidity"])


def table_of(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ARROW_SENSOR)


def chunks(rows: list[dict], size: int) -> list[list[dict]]:
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def send_all(writer: ChannelWriter, batches: Iterable[tuple[int, list[dict]]]) -> None:
    for tag, rows in batches:
        writer.send(table_of(rows), tag)


def stop(*runtimes: TaskRuntime) -> None:
    for rt in runtimes:
        rt.stop()


class Collector:
    """A test-side reader of one channel: subscribes from seq 1, keeps every batch, acks."""

    def __init__(self, channel: str, task: str, endpoint: str, schema: pa.Schema) -> None:
        self.reader = ChannelReader(channel, channel_reader_id(task, channel), endpoint, schema)
        self.reader.subscribe(from_seq=1)
        self.batches: list[Batch] = []

    def pump(self) -> int:
        new = self.reader.poll(0.1)
        if new:
            self.batches.extend(new)
            self.reader.ack(new[-1].seq)
        return sum(b.table.num_rows for b in self.batches)

    def rows(self) -> list[dict]:
        return [row for b in self.batches for row in b.table.to_pylist()]

    def close(self) -> None:
        self.reader.close()


def settle(collectors: list[Collector], seconds: float = 1.5) -> None:
    """Pump for `seconds` more: anything late (a duplicate) would arrive now."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for c in collectors:
            c.pump()


def collect_rows(collectors: list[Collector], total: int, timeout: float) -> None:
    """Pump until the collectors hold `total` rows, then settle."""
    wait_for(lambda: sum(c.pump() for c in collectors) >= total, timeout, f"{total} rows")
    settle(collectors)


# --- identity and split ---------------------------------------------------------------------------

def test_identity_renames_the_stream(spark: Any, tmp_path: Path) -> None:
    rt = TaskRuntime(spark, query_id="q", task_id="ident", checkpoint_dir=str(tmp_path / "ck"),
                     trigger_seconds=0.5)
    out = tmp_path / "out.jsonl"
    try:
        rt.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=13, rate=1000.0,
                     limit=600, start=START)
        rt.identity(op="reader", input="raw", output="moved")
        assert rt.streams["moved"].schema == SENSOR
        rt.filter(op="hot", input="moved", output="hot", condition="moved.temp > 25")
        rt.file_sink(op="sink", input="hot", path=str(out))
        assert rt.query is not None
        wait_drained(rt.query, [600])
    finally:
        stop(rt)
    expected = Counter(sensor_key(r) for r in input_rows("sensor", 13, 1000.0, 600)
                       if r["temp"] > 25)
    assert 0 < sum(expected.values()) < 600
    assert Counter(sensor_key(r) for r in read_sink(out)) == expected


@pytest.mark.parametrize("key, params", [
    (("sensor",), {}),
    # the program routes by all columns; a control tuple's routing key (partition-key) wins
    ((), {"split:q.split.p1+q.split.p2": {"key": ["sensor"]}}),
], ids=["program-key", "control-key"])
def test_split_sends_each_key_to_exactly_one_partition(spark: Any, tmp_path: Path,
                                                       key: tuple[str, ...],
                                                       params: dict[str, Any]) -> None:
    hub = ChannelHub()
    rt = TaskRuntime(spark, query_id="q", task_id="split", checkpoint_dir=str(tmp_path / "ck"),
                     channels=hub, trigger_seconds=0.5, params=params)
    channels = ("q.split.p1", "q.split.p2")
    collectors: list[Collector] = []
    try:
        rt.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=21, rate=1000.0,
                     limit=1500, start=START)
        rt.split_channel_sink(input="raw", channels=channels, key=key,
                              readers=(("d1",), ("d2",)))
        collectors = [Collector(ch, task, hub.endpoint(ch) or "", ARROW_SENSOR)
                      for ch, task in zip(channels, ("d1", "d2"))]
        collect_rows(collectors, 1500, 60)
        assert rt.query is not None and rt.query.exception() is None
        seqs = [hub.writer(ch, ARROW_SENSOR).retained_range()[1] for ch in channels]
    finally:
        stop(rt)
        for c in collectors:
            c.close()
        hub.close()
    parts = [c.rows() for c in collectors]
    expected = Counter(sensor_key(r) for r in input_rows("sensor", 21, 1000.0, 1500))
    assert Counter(sensor_key(r) for part in parts for r in part) == expected
    sensors = [{r["sensor"] for r in part} for part in parts]
    assert sensors[0] and sensors[1], "both partitions get rows"
    assert not sensors[0] & sensors[1], "a sensor appears in one partition only"
    assert all(seq >= 1 for seq in seqs)


def test_a_routing_key_switched_in_the_running_query_routes_from_the_epoch_on(
        spark: Any, tmp_path: Path) -> None:
    hub = ChannelHub()
    rt = TaskRuntime(spark, query_id="q", task_id="resplit", checkpoint_dir=str(tmp_path / "ck"),
                     channels=hub, trigger_seconds=0.5)
    channels = ("q.resplit.p1", "q.resplit.p2")
    collectors: list[Collector] = []
    try:
        rt.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=5, rate=300.0,
                     limit=1500, start=START)
        rt.split_channel_sink(input="raw", channels=channels, key=(), readers=(("d1",), ("d2",)))
        collectors = [Collector(ch, task, hub.endpoint(ch) or "", ARROW_SENSOR)
                      for ch, task in zip(channels, ("d1", "d2"))]
        wait_for(lambda: sum(c.pump() for c in collectors) >= 300, 60, "rows under all columns")
        switch = rt.live[(f"split:{'+'.join(channels)}", "key")].switch
        _, epoch = rt.gate.switch(lambda: switch(["sensor"]), str(tmp_path / "ck" / "spark"), 10)
        collect_rows(collectors, 1500, 60)
        assert rt.query is not None and rt.query.exception() is None
    finally:
        stop(rt)
        for c in collectors:
            c.close()
        hub.close()
    expected = Counter(sensor_key(r) for r in input_rows("sensor", 5, 300.0, 1500))
    assert Counter(sensor_key(r) for c in collectors for r in c.rows()) == expected

    def sensors(c: Collector, after: bool) -> set[str]:
        return {r["sensor"] for b in c.batches if (b.tag >= epoch) == after
                for r in b.table.to_pylist()}

    before, after = [sensors(c, False) for c in collectors], [sensors(c, True) for c in collectors]
    assert before[0] & before[1], "hashing all columns spreads a sensor over both partitions"
    assert after[0] and after[1] and not after[0] & after[1], "from the epoch, by sensor only"


# --- deterministic replicas -----------------------------------------------------------------------

def window_rows(rows: list[dict]) -> Counter:
    return Counter(tuple(sorted(r.items())) for r in rows)


def replica(spark: Any, tmp_path: Path, hub: ChannelHub, task: str, upstream: str) -> TaskRuntime:
    rt = TaskRuntime(spark, query_id="q", task_id=task, checkpoint_dir=str(tmp_path / task),
                     endpoints={"in.raw": upstream}, channels=hub, trigger_seconds=0.0)
    rt.deterministic_batches()
    rt.channel_source(output="raw", schema=SENSOR, channel="in.raw")
    rt.window_aggregate(op="w", input="raw", output="win", time="ts", window="400 milliseconds",
                        slide=None, watermark="200 milliseconds", group_by=("sensor",),
                        aggregates=AGGS)
    rt.channel_sink(input="win", channel=f"{task}.out", readers=("test",))
    return rt


def completed(rt: TaskRuntime) -> int:
    """How many micro-batches `rt`'s query has completed (its recent progress reports)."""
    return len(rt.query.recentProgress) if rt.query is not None else 0


def test_deterministic_replicas_send_identical_batches(spark: Any, tmp_path: Path) -> None:
    """Two replicas, the second started once the first has completed micro-batches (until
    2026-11-30 a fixed 3 s apart), input arriving while they run (half of the rest once the
    second replica has completed a micro-batch of its own, the other half after it): the same
    output batches under the same seqs, and every window the final watermark closes (each input
    batch is followed by a flush step, so the last windows come although no input follows
    them). A plain query started afterwards on the same session gets the session's conf back
    (no-data micro-batches on): the conf change stayed with the replicas' queries."""
    rows = input_rows("sensor", 31, 1000.0, 2000)
    batches = list(enumerate(chunks(rows, 200)))
    readers = [channel_reader_id(t, "in.raw") for t in ("r1", "r2", "plain")]
    upstream = ChannelWriter("in.raw", ARROW_SENSOR, expected_readers=readers)
    hub = ChannelHub()
    runtimes: list[TaskRuntime] = []
    collectors: list[Collector] = []
    out = tmp_path / "plain.jsonl"
    # every window the final watermark closes, for the replicas (their flush step after the
    # last input batch) as for the plain query (its no-data micro-batch)
    expected = window_oracle(rows, WINDOW, WINDOW, DELAY, sensor_aggregates)
    closed_before_the_last_batch = window_oracle(rows[:-200], WINDOW, WINDOW, DELAY,
                                                 sensor_aggregates)
    assert len(closed_before_the_last_batch) < len(expected)
    try:
        send_all(upstream, batches[:4])
        runtimes.append(replica(spark, tmp_path, hub, "r1", upstream.endpoint))
        wait_for(lambda: completed(runtimes[0]) >= 2, 60, "replica 1's first micro-batches")
        runtimes.append(replica(spark, tmp_path, hub, "r2", upstream.endpoint))
        assert spark.conf.get(NO_DATA_BATCHES) == "true", "the session's conf is restored"
        plain = TaskRuntime(spark, query_id="q", task_id="plain",
                            checkpoint_dir=str(tmp_path / "plain"),
                            endpoints={"in.raw": upstream.endpoint}, trigger_seconds=0.5)
        runtimes.append(plain)
        plain.channel_source(output="raw", schema=SENSOR, channel="in.raw")
        plain.window_aggregate(op="w", input="raw", output="win", time="ts",
                               window="400 milliseconds", slide=None,
                               watermark="200 milliseconds", group_by=("sensor",),
                               aggregates=AGGS)
        plain.file_sink(op="sink", input="win", path=str(out))
        send_all(upstream, batches[4:7])
        wait_for(lambda: completed(runtimes[1]) >= 1, 60, "replica 2's first micro-batch")
        send_all(upstream, batches[7:])
        schema = arrow_schema(runtimes[0].streams["win"].schema)
        collectors = [Collector(f"{t}.out", "test", hub.endpoint(f"{t}.out") or "", schema)
                      for t in ("r1", "r2")]
        collect_rows(collectors, 2 * len(expected), 90)
        wait_for(lambda: len(read_sink(out)) >= len(expected), 60, "the plain windows")
        for rt in runtimes:
            assert rt.query is not None and rt.query.exception() is None
    finally:
        stop(*runtimes)
        for c in collectors:
            c.close()
        hub.close()
        upstream.close()
    first, second = (c.batches for c in collectors)
    assert sum(b.table.num_rows for b in first) == len(expected)
    assert [b.seq for b in first] == [b.seq for b in second] == list(range(1, len(first) + 1))
    assert len(first) >= 2, "several output batches"
    for a, b in zip(first, second):
        assert a.tag == b.tag, f"seq {a.seq}: micro-batch {a.tag} vs {b.tag}"
        assert window_rows(a.table.to_pylist()) == window_rows(b.table.to_pylist()), a.seq
    assert_windows_match(collectors[0].rows(), expected, WINDOW)
    assert_windows_match(read_sink(out), expected, WINDOW)


# --- selector and retargeting ---------------------------------------------------------------------

def wait_rows(path: Path, count: int, rt: TaskRuntime, timeout: float = 60.0) -> None:
    def enough() -> bool:
        assert rt.query is not None
        if rt.query.exception() is not None:
            raise AssertionError(f"query failed: {rt.query.exception()}")
        return len(read_sink(path)) >= count

    wait_for(enough, timeout, f"{count} rows in {path.name}")


def test_selector_switches_replica_without_gap_or_duplicate(spark: Any, tmp_path: Path) -> None:
    rows = input_rows("sensor", 41, 1000.0, 800)
    batches = list(enumerate(chunks(rows, 100)))
    first = ChannelWriter("rep.1", ARROW_SENSOR,
                          expected_readers=[channel_reader_id("sel", "rep.1")])
    second = ChannelWriter("rep.2", ARROW_SENSOR,
                           expected_readers=[channel_reader_id("sel", "rep.2")])
    rt = TaskRuntime(spark, query_id="q", task_id="sel", checkpoint_dir=str(tmp_path / "ck"),
                     endpoints={"rep.1": first.endpoint, "rep.2": second.endpoint},
                     trigger_seconds=0.5)
    out = tmp_path / "out.jsonl"
    try:
        send_all(first, batches[:4])  # replica 2 lags: replica 1 supplies seqs 1-4
        rt.selector_source(output="sel", schema=SENSOR, channels=("rep.1", "rep.2"))
        rt.file_sink(op="sink", input="sel", path=str(out))
        wait_rows(out, 400, rt)
        send_all(second, batches[:4])
        first.close()  # replica 1 fails half way
        for tag, part in batches[4:]:  # one batch at a time: several micro-batches after it
            second.send(table_of(part), tag)
            wait_rows(out, 100 * (tag + 1), rt)
        time.sleep(1.5)  # a duplicate would arrive now
        # commit(end) runs when the next micro-batch is planned: the last one stays unacked
        acked = second.stats().acked[channel_reader_id("sel", "rep.2")]
    finally:
        stop(rt)
        first.close()
        second.close()
    assert Counter(sensor_key(r) for r in read_sink(out)) == Counter(map(sensor_key, rows))
    assert acked >= 5, f"acknowledged on the surviving replica: {acked}"
    logged = Path(source_log_path(str(tmp_path / "ck"))).read_text(encoding="utf-8")
    assert "selector now reads replica rep.1 at seq 1" in logged
    assert "selector now reads replica rep.2 at seq 5" in logged


def test_channel_source_follows_the_endpoints_file(spark: Any, tmp_path: Path) -> None:
    rows = input_rows("sensor", 51, 1000.0, 800)
    batches = list(enumerate(chunks(rows, 100)))
    reader_id = channel_reader_id("moved", "up.raw")
    old = ChannelWriter("up.raw", ARROW_SENSOR, expected_readers=[reader_id])
    new = ChannelWriter("up.raw", ARROW_SENSOR, expected_readers=[reader_id])
    checkpoint = tmp_path / "ck"
    rt = TaskRuntime(spark, query_id="q", task_id="moved", checkpoint_dir=str(checkpoint),
                     endpoints={"up.raw": old.endpoint}, trigger_seconds=0.5)
    out = tmp_path / "out.jsonl"
    try:
        send_all(old, batches[:4])
        send_all(new, batches[:4])  # the new writer serves the same seqs
        rt.channel_source(output="raw", schema=SENSOR, channel="up.raw")
        rt.file_sink(op="sink", input="raw", path=str(out))
        wait_rows(out, 400, rt)
        write_endpoints(endpoints_path(str(checkpoint)), {"up.raw": new.endpoint})
        old.close()
        for tag, part in batches[4:]:  # only the new writer has the rest, a batch at a time
            new.send(table_of(part), tag)
            wait_rows(out, 100 * (tag + 1), rt)
        time.sleep(1.5)
        acked = new.stats().acked[reader_id]
    finally:
        stop(rt)
        old.close()
        new.close()
    assert Counter(sensor_key(r) for r in read_sink(out)) == Counter(map(sensor_key, rows))
    assert acked >= 5, f"acknowledged to the new writer: {acked}"
    logged = Path(source_log_path(str(checkpoint))).read_text(encoding="utf-8")
    assert f"channel up.raw moves {old.endpoint} -> {new.endpoint}" in logged
