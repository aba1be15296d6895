"""Spark layer with authenticated channels: a task given its launch keys reads its input channel
over CURVE and serves its output over CURVE to its declared reader task only; a network source
reads a CURVE network sink with a key file and the sink's public key. Inputs come from
test-owned `ChannelWriter`s; every oracle is plain Python over the same rows (`input_rows`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from executor.channels.auth import KeyPair, ReaderAuth, TaskKeys, WriterAuth, write_key_file
from executor.channels import ChannelError, ChannelReader, ChannelWriter
from executor.runtime import ChannelHub, TaskRuntime, channel_reader_id
from executor.shapes import arrow_schema
from test_runtime_ops import SENSOR
from test_runtime_support import input_rows, read_sink, wait_for

pytestmark = pytest.mark.spark

ARROW_SENSOR = arrow_schema(SENSOR)


def key(row: dict) -> tuple:
    return (row["sensor"], row["ts"], row["temp"], row["humidity"])


def send_rows(writer: ChannelWriter, rows: list[dict], size: int) -> None:
    for tag, start in enumerate(range(0, len(rows), size)):
        writer.send(pa.Table.from_pylist(rows[start:start + size], schema=ARROW_SENSOR), tag)


def test_a_task_with_launch_keys_reads_and_serves_over_curve(spark: Any, tmp_path: Path) -> None:
    rows = input_rows("sensor", 41, 1000.0, 600)
    producer, task, consumer = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    upstream = ChannelWriter("q/in", ARROW_SENSOR, auth=WriterAuth(
        producer, {channel_reader_id("t", "q/in"): task.public}))
    keys = TaskKeys(task, {"q/in": producer.public}, {"q/out": {"d": consumer.public}})
    hub = ChannelHub()
    rt = TaskRuntime(spark, query_id="q", task_id="t", checkpoint_dir=str(tmp_path / "ck"),
                     endpoints={"q/in": upstream.endpoint}, channels=hub, trigger_seconds=0.5,
                     keys=keys)
    got: list[dict] = []
    reader = stranger = None
    try:
        rt.channel_source(output="raw", schema=SENSOR, channel="q/in")
        rt.channel_sink(input="raw", channel="q/out", readers=("d",))
        key_file = tmp_path / "ck" / "channel-key.json"
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        plan = rt.streams["raw"].df._jdf.queryExecution().toString()
        assert task.secret not in plan  # the source's config names the file, not the secret
        send_rows(upstream, rows, 100)
        endpoint = hub.endpoint("q/out")
        assert endpoint is not None and hub.writer("q/out", ARROW_SENSOR).stats().authenticated
        stranger = ChannelReader("q/out", channel_reader_id("d", "q/out"), endpoint,
                                 ARROW_SENSOR, auth=ReaderAuth(KeyPair.generate(),
                                                               task.public))
        with pytest.raises(ChannelError):
            stranger.subscribe(from_seq=1, timeout=2)  # an undeclared key: no answer at all
        reader = ChannelReader("q/out", channel_reader_id("d", "q/out"), endpoint, ARROW_SENSOR,
                               auth=ReaderAuth(consumer, task.public))
        reader.subscribe(from_seq=1, timeout=10)

        def pump() -> int:
            for batch in reader.poll(0.2):
                got.extend(batch.table.to_pylist())
                reader.ack(batch.seq)
            return len(got)
        wait_for(lambda: pump() >= len(rows), 90, f"{len(rows)} rows over CURVE")
        # Spark commits a micro-batch's input when it plans the next one: one more batch, and
        # the channel source's acknowledgements (over its CURVE connection) trim the upstream
        upstream.send(pa.Table.from_pylist(rows[:1], schema=ARROW_SENSOR), 6)
        wait_for(lambda: upstream.stats().acked[channel_reader_id("t", "q/in")] >= 6, 60,
                 "the task's acknowledgements")
        assert upstream.stats().unauthorized_frames == 0
        wait_for(lambda: pump() >= len(rows) + 1, 60, "the last row")
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            pump()  # a duplicate would arrive now
        assert rt.query is not None and rt.query.exception() is None
    finally:
        rt.stop()
        for r in (reader, stranger):
            if r is not None:
                r.close()
        hub.close()
        upstream.close()
    assert sorted(map(key, got)) == sorted(map(key, rows + rows[:1]))


def test_a_network_source_reads_a_curve_sink_with_its_key_file(spark: Any,
                                                               tmp_path: Path) -> None:
    rows = input_rows("sensor", 43, 1000.0, 300)
    sink, mine = KeyPair.generate(), KeyPair.generate()
    write_key_file(str(tmp_path / "mine.key"), mine)
    writer = ChannelWriter("ext", ARROW_SENSOR, auth=WriterAuth(sink, {"partner": mine.public}))
    out = tmp_path / "out.jsonl"
    rt = TaskRuntime(spark, query_id="q", task_id="n", checkpoint_dir=str(tmp_path / "ck"),
                     trigger_seconds=0.5)
    try:
        rt.network_source(op="in", output="raw", schema=SENSOR, endpoint=writer.endpoint,
                          channel="ext", reader="partner", key_file=str(tmp_path / "mine.key"),
                          server_key=sink.public)
        rt.file_sink(op="sink", input="raw", path=str(out))
        send_rows(writer, rows, 60)
        wait_for(lambda: len(read_sink(out)) >= len(rows), 90, "the network source's rows")
        writer.send(pa.Table.from_pylist(rows[:1], schema=ARROW_SENSOR), 5)  # commits the rest
        wait_for(lambda: writer.stats().acked["partner"] >= 5, 60, "its acknowledgements")
        assert list(writer.stats().acked) == ["partner"]
        wait_for(lambda: len(read_sink(out)) >= len(rows) + 1, 30, "the last row")
        assert rt.query is not None and rt.query.exception() is None
    finally:
        rt.stop()
        writer.close()
    assert sorted(map(key, read_sink(out))) == sorted(map(key, rows + rows[:1]))
