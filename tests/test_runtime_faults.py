"""Spark layer, supervision and channels: TaskRunner restarts a query whose Python source runner
was SIGKILLed mid-stream, and the exactly-once file sink still matches the oracle; two tasks in one
session talk over a real ZeroMQ channel."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from executor.runtime import ChannelHub, TaskRuntime
from testkit.spark_processes import jvm_pid, program_runner, source_runner_pids
from test_runtime_support import START, input_rows, read_sink, wait_drained, wait_for

pytestmark = pytest.mark.spark

PROGRAM = '''
from common.types import Schema
READING = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"))
def build(rt):
    rt.generator(op="src", output="raw", schema=READING, shape="sensor", seed=77, rate=500.0,
                 limit=8000, start="2024-01-01T00:00:00Z")
    rt.window_aggregate(op="w", input="raw", output="win", time="ts", window="1 seconds",
                        slide=None, watermark="500 milliseconds", group_by=("sensor",),
                        aggregates=(("n", "count", None), ("total", "sum", "temp")))
    rt.file_sink(op="sink", input="win", path=OUT)
'''


def test_sigkilled_source_runner_is_restarted_and_sink_is_exact(spark: Any, tmp_path: Path) -> None:
    """Kills mid-stream on purpose: a crash after the source is exhausted but before the final
    no-data batch leaves the last windows unemitted until new data arrives (Spark recovers the
    watermark from the offset log, which lags one batch)."""
    out = tmp_path / "win.jsonl"
    program = tmp_path / "program.py"
    program.write_text(f"OUT = {str(out)!r}\n" + PROGRAM, encoding="utf-8")
    runner = program_runner(spark, program, "fault", tmp_path / "ck")
    jvm = jvm_pid(spark)
    try:
        runner.start()
        wait_for(lambda: out.exists() and out.stat().st_size > 0, 60, "first windows")
        progress = runner.runtime.query.lastProgress  # type: ignore[union-attr]
        assert '8000' not in str(progress["sources"][0]["endOffset"]), "too late to kill mid-stream"
        victims = source_runner_pids(jvm)
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        wait_for(lambda: runner.status().restarts >= 1 and runner.status().state == "running",
                 60, "a restart")
        # the kill is behind: the rest of the input comes unpaced (a control tuple's rate,
        # applied by rebuilding the query from its checkpoint; event times stay 500/s's)
        runner.reconfigure(1, {"src": {"rate": 8000.0}})
        assert runner.runtime is not None and runner.runtime.query is not None
        wait_drained(runner.runtime.query, [8000], timeout=90)
        metrics = runner.metrics()
        assert metrics is not None and metrics.backlog == 0
    finally:
        runner.stop()
    assert runner.status().state == "finished"
    rows = input_rows("sensor", 77, 500.0, 8000)
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        start = r["ts"].replace(microsecond=0)
        groups[(start, r["sensor"])].append(r["temp"])
    closed_by = rows[-1]["ts"] - timedelta(milliseconds=500)
    expected = {k: v for k, v in groups.items() if k[0] + timedelta(seconds=1) <= closed_by}
    got = read_sink(out)
    assert Counter((r["window_start"], r["sensor"]) for r in got) == Counter(expected.keys())
    for r in got:
        temps = expected[(r["window_start"], r["sensor"])]
        assert r["n"] == len(temps)
        assert r["total"] == pytest.approx(sum(temps), rel=1e-12)


def test_channel_between_two_tasks_in_one_session(spark: Any, tmp_path: Path) -> None:
    from common.types import Schema
    from executor.runtime import channel_reader_id
    from executor.shapes import arrow_schema

    reading = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"))
    hub = ChannelHub()
    hub.writer("a.raw", arrow_schema(reading), expected_readers=[channel_reader_id("b", "a.raw")])
    a = TaskRuntime(spark, query_id="q", task_id="a", checkpoint_dir=str(tmp_path / "a"),
                    channels=hub, trigger_seconds=0.5)
    b = TaskRuntime(spark, query_id="q", task_id="b", checkpoint_dir=str(tmp_path / "b"),
                    channels=hub, trigger_seconds=0.5)
    out = tmp_path / "b.jsonl"
    try:
        a.generator(op="src", output="raw", schema=reading, shape="sensor", seed=3, rate=1000.0,
                    limit=3000, start=START)
        a.channel_sink(input="raw", channel="a.raw")
        b.channel_source(output="raw", schema=reading, channel="a.raw")
        b.file_sink(op="sink", input="raw", path=str(out))
        assert a.query is not None and b.query is not None
        wait_drained(a.query, [3000])
        expected = Counter((r["sensor"], r["ts"], r["temp"])
                           for r in input_rows("sensor", 3, 1000.0, 3000))
        wait_for(lambda: len(read_sink(out)) >= 3000, 60, "task b's output")
        time.sleep(1.5)  # anything extra (a duplicate) would arrive now
        got = Counter((r["sensor"], r["ts"], r["temp"]) for r in read_sink(out))
        assert got == expected
        last_seq = hub.writer("a.raw", arrow_schema(reading)).retained_range()[1]
        assert last_seq >= 2  # several micro-batches crossed the channel
    finally:
        for rt in (a, b):
            rt.stop()
        hub.close()
