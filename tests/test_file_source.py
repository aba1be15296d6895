"""Spark layer: the file replay source through a real streaming query to the jsonl file sink.
A paced replay read in one partition is stopped part-way and restarted from its checkpoint in
three partitions: the sink holds every line of the file exactly once, in file order, equal to a
plain-Python parse of the file (offsets are line counts, so replay does not depend on the split)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from datetime import timedelta

from testkit.e2e_support import read_sink as read_windows
from testkit.e2e_support import window_oracle
from executor.runtime import RuntimeSpecError, TaskRuntime
from test_file_lines import SENSOR, oracle_parse, sensor_rows, write_input
from test_runtime_support import read_sink, wait_drained, wait_for

pytestmark = pytest.mark.spark

ROWS = 6000


def start_replay(spark: Any, tmp_path: Path, path: Path, partitions: int,
                 rate: float) -> TaskRuntime:
    rt = TaskRuntime(spark, query_id="q", task_id="t-file", checkpoint_dir=str(tmp_path / "ck"),
                     trigger_seconds=0.3, source_partitions=partitions)
    rt.file_source(op="replay", output="raw", schema=SENSOR, path=str(path), format="csv",
                   rate=rate)
    rt.file_sink(op="sink", input="raw", path=str(tmp_path / "out.jsonl"))
    return rt


def test_a_restarted_replay_in_more_partitions_writes_each_line_once_in_order(
        spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    write_input(path, "csv", sensor_rows(ROWS))
    out = tmp_path / "out.jsonl"
    first = start_replay(spark, tmp_path, path, partitions=1, rate=100.0)
    assert first.query is not None
    try:
        wait_for(lambda: len(read_sink(out)) >= 1, 90.0, "the first rows in the sink")
    finally:
        first.query.stop()
    stopped_at = len(read_sink(out))
    assert stopped_at < ROWS, "the paced replay finished before it could be stopped"
    second = start_replay(spark, tmp_path, path, partitions=3, rate=1e6)
    assert second.query is not None
    try:
        wait_drained(second.query, [ROWS], timeout=120.0)
    finally:
        second.query.stop()
    assert read_sink(out) == oracle_parse(path, "csv")


def test_large_batches_count_windows_as_the_oracle_and_come_before_any_source(
        spark: Any, tmp_path: Path) -> None:
    """A task that writes an aggregate locally reads with the large cap: the config reaches the
    planner-side reader through Spark, and the windows equal a plain-Python count. Asking for
    it after a source is refused: the source already has its cap."""
    path = tmp_path / "in.jsonl"
    write_input(path, "jsonl", sensor_rows(ROWS))
    out = tmp_path / "windows.jsonl"
    rt = TaskRuntime(spark, query_id="q", task_id="t-large", checkpoint_dir=str(tmp_path / "ck"),
                     trigger_seconds=0.0)
    rt.large_batches()
    rt.file_source(op="replay", output="raw", schema=SENSOR, path=str(path), format="jsonl",
                   rate=None)
    with pytest.raises(RuntimeSpecError, match="before any source"):
        rt.large_batches()
    rt.window_aggregate(op="w", input="raw", output="win", time="ts", window="5 seconds",
                        slide=None, watermark="1 seconds", group_by=("sensor",),
                        aggregates=(("n", "count", None),))
    rt.file_sink(op="sink", input="win", path=str(out))
    assert rt.query is not None
    expected = window_oracle(oracle_parse(path, "jsonl"), "ts", ["sensor"],
                             timedelta(seconds=5), timedelta(seconds=5), timedelta(seconds=1))
    try:
        wait_for(lambda: len(read_windows(out)) >= len(expected), 120.0, "every closed window")
        wait_drained(rt.query, [ROWS], timeout=60.0)
    finally:
        rt.query.stop()
    got = {(r["window_start"], r["sensor"]): r["n"] for r in read_windows(out)}
    assert got == {key: len(rows) for key, rows in expected.items()}
    assert len(read_windows(out)) == len(got)  # no window twice
