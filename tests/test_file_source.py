"""Spark layer: the file replay source through a real streaming query to the jsonl file sink.
A paced replay read in one partition is stopped part-way and restarted from its checkpoint in
three partitions: the sink holds every line of the file exactly once, in file order, equal to a
plain-Python parse of the file (offsets are line counts, so replay does not depend on the split)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from executor.runtime import TaskRuntime
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
