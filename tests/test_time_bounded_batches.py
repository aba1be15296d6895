"""Spark layer, issue 31's micro-batches bounded in time: a channel input with a backlog waiting
takes it in batches sized by the time its batches take (`executor.spool_source`,
`common.batch_cost.time_bounded`), not all at once; and the runner's batch count, which the
heartbeats carry, matches Spark's own progress. Oracles: the rows the test sent (the sink must
hold each once) and Spark's progress reports read directly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from executor.channels import ChannelWriter
from executor.runtime import TaskRuntime, channel_reader_id
from executor.shapes import arrow_schema
from executor.spool_source import MIN_BATCH_BYTES
from executor.task_runner import InputCounter, executed
from test_runtime_ops import SENSOR
from test_runtime_support import input_rows, read_sink, wait_for

pytestmark = pytest.mark.spark

ARROW_SENSOR = arrow_schema(SENSOR)
SENT_BATCHES, ROWS_PER_BATCH = 120, 500


def key(row: dict) -> tuple:
    return (row["sensor"], row["ts"], row["temp"], row["humidity"])


def test_a_backlog_comes_in_batches_bounded_by_their_time(spark: Any, tmp_path: Path) -> None:
    rows = input_rows("sensor", 77, 1000.0, SENT_BATCHES * ROWS_PER_BATCH)
    reader = channel_reader_id("bounded", "up.raw")
    writer = ChannelWriter("up.raw", ARROW_SENSOR, expected_readers=[reader])
    for i in range(SENT_BATCHES):  # the whole backlog waits before the query starts
        part = rows[i * ROWS_PER_BATCH:(i + 1) * ROWS_PER_BATCH]
        writer.send(pa.Table.from_pylist(part, schema=ARROW_SENSOR), i)
    batch_bytes = pa.Table.from_pylist(rows[:ROWS_PER_BATCH], schema=ARROW_SENSOR).nbytes
    out = tmp_path / "out.jsonl"
    rt = TaskRuntime(spark, query_id="q", task_id="bounded", checkpoint_dir=str(tmp_path / "ck"),
                     endpoints={"up.raw": writer.endpoint}, trigger_seconds=0.0)
    try:
        rt.channel_source(output="raw", schema=SENSOR, channel="up.raw")
        rt.file_sink(op="sink", input="raw", path=str(out))
        assert rt.query is not None
        query = rt.query

        def done() -> bool:
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            return len(read_sink(out)) >= len(rows)

        wait_for(done, 180, f"{len(rows)} rows in the sink")
        reports = [r for r in query.recentProgress if executed(r)]
    finally:
        rt.stop()
        writer.close()
    assert Counter(key(r) for r in read_sink(out)) == Counter(map(key, rows))
    sizes = [int(r["numInputRows"]) for r in reports if int(r["numInputRows"]) > 0]
    # the first batch (nothing timed yet) takes the floor's bytes, at least one spooled batch:
    # a backlog of 60,000 rows came in a 48 MB cap's single batch before
    floor_rows = max(1, MIN_BATCH_BYTES // batch_bytes) * ROWS_PER_BATCH
    assert sizes[0] <= max(floor_rows, ROWS_PER_BATCH), sizes
    assert len(sizes) >= 3 and max(sizes) > sizes[0], sizes  # then the measured rate decides
    # the runner's count of ended batches is Spark's own, each executed batch once
    counter = InputCounter()
    counter.add(reports)
    counter.add(reports)
    assert (counter.batches, counter.total) == (len(reports), sum(
        int(r["numInputRows"]) for r in reports))
