"""Spark layer for processing-time windows (Nexmark q12: bids per bidder per window of the time
they were processed). Processing time is not reproducible, so the oracle is built from what the
task itself records: Spark's offset log holds, per micro-batch, the batch's timestamp (the
`current_timestamp()` its rows saw) and the generator's end offset (which rows it held). The
plain-Python oracle puts each row in the window of its batch's timestamp and counts per bidder;
every closed window must match exactly, also when the query is stopped and restarted midway (a
replayed batch keeps its logged timestamp: each row is counted once)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from executor import shapes, sources
from executor.runtime import TaskRuntime
from test_runtime_support import START, input_rows, read_sink, wait_drained, wait_for

pytestmark = pytest.mark.spark

BID = shapes.shape_named("bid").columns
RATE, LIMIT, SEED = 4000.0, 6000, 12
# At most this many rows per micro-batch (the source's cap, `sources.batch_row_cap`): at least
# ten batches however loaded the machine is (a slow batch would otherwise read the whole backlog),
# each at least a trigger (0.5 s) after the one before, so several 1 s windows close.
ROWS_PER_BATCH = 600
BID_WIDTH = 96  # the bytes `batch_row_cap` counts for a bid row
SIZE = timedelta(seconds=1)


def start_query(rt: TaskRuntime, out: Path) -> None:
    rt.batch_bytes = ROWS_PER_BATCH * BID_WIDTH
    assert sources.batch_row_cap(BID, rt.batch_bytes) == ROWS_PER_BATCH
    rt.generator(op="src", output="bids", schema=BID, shape="bid", seed=SEED, rate=RATE,
                 limit=LIMIT, start=START)
    rt.window_aggregate(op="w", input="bids", output="per_bidder", time=None,
                        window="1 seconds", slide=None, watermark="0 seconds",
                        group_by=("bidder",), aggregates=(("n", "count", None),),
                        clock="processing")
    rt.file_sink(op="sink", input="per_bidder", path=str(out))


def logged_batches(spark_dir: Path) -> list[tuple[int, int]]:
    """(batch timestamp in ms, the generator's end offset) of each batch in the offset log: its
    lines are a version, the batch's metadata, then one offset per source."""
    batches = []
    for entry in sorted((spark_dir / "offsets").iterdir(), key=lambda p: int(p.name)):
        lines = entry.read_text(encoding="utf-8").splitlines()
        batches.append((json.loads(lines[1])["batchTimestampMs"], json.loads(lines[2])["index"]))
    return batches


def oracle(batches: list[tuple[int, int]], rows: list[dict[str, Any]]) -> Counter:
    """(window_start, bidder) -> count over the windows the watermark closed, as Spark counts
    them: each batch's new rows in the window holding its timestamp. The watermark (delay 0) a
    batch sees is the latest timestamp of the earlier batches that held rows; a window whose end
    it has reached is out already, and rows that would fall in it are dropped as late (only if
    the clock steps back); a window is emitted once the final watermark reaches its end."""
    counts: Counter = Counter()
    done, watermark = 0, shapes.EPOCH
    for stamp, end in batches:
        at = datetime.fromtimestamp(stamp / 1000, timezone.utc)
        start = at - (at - shapes.EPOCH) % SIZE
        for row in rows[done:end] if start + SIZE > watermark else ():
            counts[(start, row["bidder"])] += 1
        watermark = max(watermark, at) if end > done else watermark
        done = max(done, end)
    assert done == len(rows)
    return Counter({k: n for k, n in counts.items() if k[0] + SIZE <= watermark})


def window_totals(counts: Counter) -> list[tuple[str, int]]:
    """Rows per window (for a failure's message)."""
    totals: Counter = Counter()
    for (start, _), n in counts.items():
        totals[start.strftime("%H:%M:%S")] += n
    return sorted(totals.items())


def emitted(out: Path) -> Counter:
    got = read_sink(out)
    found = Counter({(r["window_start"], r["bidder"]): r["n"] for r in got})
    assert len(found) == len(got), "a window and bidder was emitted twice"
    assert all(r["window_end"] - r["window_start"] == SIZE for r in got)
    return found


def test_processing_time_counts_per_bidder_match_the_logged_batches(
        runtime: TaskRuntime, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    start_query(runtime, out)
    assert runtime.query is not None
    wait_drained(runtime.query, [LIMIT], timeout=600)
    batches = logged_batches(tmp_path / "ck" / "spark")
    expected = oracle(batches, input_rows("bid", SEED, RATE, LIMIT))
    assert len({start for start, _ in expected}) >= 2, f"too few windows closed: {batches}"
    got = emitted(out)
    assert got == expected, (window_totals(got), window_totals(expected), batches)


def test_processing_time_counts_each_row_once_across_a_restart(spark: Any,
                                                                tmp_path: Path) -> None:
    """Stopped after its first rows and restarted on the same checkpoint: the windows of both
    runs still match the batches the log records (a batch planned before the stop is replayed
    at its logged timestamp)."""
    out, ck = tmp_path / "out.jsonl", tmp_path / "ck"
    first = TaskRuntime(spark, query_id="q", task_id="t-first", checkpoint_dir=str(ck),
                        trigger_seconds=0.5)
    try:
        start_query(first, out)
        query = first.query
        assert query is not None
        wait_for(lambda: any(p["numInputRows"] > 0 for p in query.recentProgress), 300,
                 "a first batch with rows")
    finally:
        first.stop()
    second = TaskRuntime(spark, query_id="q", task_id="t-second", checkpoint_dir=str(ck),
                         trigger_seconds=0.5)
    try:
        start_query(second, out)
        assert second.query is not None
        wait_drained(second.query, [LIMIT], timeout=600)
    finally:
        second.stop()
    expected = oracle(logged_batches(ck / "spark"), input_rows("bid", SEED, RATE, LIMIT))
    assert len({start for start, _ in expected}) >= 2, "too few windows closed to compare"
    assert emitted(out) == expected
