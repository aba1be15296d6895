"""Spark layer for the Nexmark features: session windows, the distinct counts, max_by/min_by and
deduplication within a watermark, each run through a real streaming query over the Nexmark (or
sequence) generator and compared with an oracle in plain Python over the same rows
(`shapes.reference_row`, the plain-Python twin of the Spark-side generator)."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest

from common.operator_schemas import APPROX_DISTINCT_RSD
from executor import shapes
from executor.runtime import RuntimeSpecError, TaskRuntime
from testkit.e2e_support import session_oracle
from test_runtime_support import START, input_rows, read_sink, wait_drained

pytestmark = pytest.mark.spark

SEQUENCE = shapes.shape_named("sequence").columns
BID = shapes.shape_named("bid").columns


def run_to_sink(rt: TaskRuntime, tmp_path: Path, stream: str, limit: int) -> list[dict]:
    out = tmp_path / "out.jsonl"
    rt.file_sink(op="sink", input=stream, path=str(out))
    assert rt.query is not None
    wait_drained(rt.query, [limit])
    return read_sink(out)


def test_session_windows_per_key_match_the_oracle(runtime: TaskRuntime, tmp_path: Path) -> None:
    """Five keys at 1000 rows/s: a key's rows are ~5 ms apart, so a 12 ms gap closes a few
    hundred sessions; some rows come exactly 12 ms after the last one (sessions that touch)."""
    runtime.generator(op="src", output="raw", schema=SEQUENCE, shape="sequence", seed=21,
                      rate=1000.0, limit=3000, start=START)
    runtime.window_aggregate(op="s", input="raw", output="sessions", time="ts", window=None,
                             slide=None, gap="12 milliseconds", watermark="100 milliseconds",
                             group_by=("key",), aggregates=(("n", "count", None),
                                                            ("first", "min", "id")))
    got = run_to_sink(runtime, tmp_path, "sessions", 3000)
    rows = input_rows("sequence", 21, 1000.0, 3000)
    expected = {k: len(v) for k, v in session_oracle(
        rows, "key", "ts", timedelta(milliseconds=12), timedelta(milliseconds=100)).items()}
    assert len(expected) > 100
    emitted = {(r["key"], r["window_start"], r["window_end"]): r["n"] for r in got}
    assert len(emitted) == len(got), "a session was emitted twice"
    assert emitted == expected
    firsts = {(r["key"], r["window_start"]): r["first"] for r in got}
    by_time = {(r["key"], r["ts"]): r["id"] for r in rows}
    assert all(by_time[k] == first for k, first in firsts.items())


def test_distinct_counts_and_arg_max_min_per_window_match_the_oracle(
        runtime: TaskRuntime, tmp_path: Path) -> None:
    """Per channel and 500 ms window of Nexmark bids: exact distinct bidders (over state),
    approximate ones within the stated error, and the bidder of the highest and lowest price
    (any bidder of a tied price)."""
    runtime.generator(op="src", output="bids", schema=BID, shape="bid", seed=5,
                      rate=2000.0, limit=4600, start=START)
    runtime.window_aggregate(
        op="w", input="bids", output="per_channel", time="date_time",
        window="500 milliseconds", slide=None, watermark="0 seconds", group_by=("channel",),
        aggregates=(("bidders", "count_distinct", "bidder"),
                    ("approx", "approx_count_distinct", "bidder"),
                    ("top", "max_by", "bidder", "price"), ("low", "min_by", "bidder", "price")))
    got = run_to_sink(runtime, tmp_path, "per_channel", 4600)
    rows = input_rows("bid", 5, 2000.0, 4600)
    size = timedelta(milliseconds=500)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    epoch = shapes.EPOCH
    for r in rows:
        groups[(r["date_time"] - (r["date_time"] - epoch) % size, r["channel"])].append(r)
    closed_by = max(r["date_time"] for r in rows)
    expected = {k: g for k, g in groups.items() if k[0] + size <= closed_by}
    emitted = {(r["window_start"], r["channel"]): r for r in got}
    assert len(emitted) == len(got) and set(emitted) == set(expected)
    assert max(len({r["bidder"] for r in g}) for g in expected.values()) >= 20
    for k, g in expected.items():
        row, bidders = emitted[k], {r["bidder"] for r in g}
        assert row["bidders"] == len(bidders)
        assert abs(row["approx"] - len(bidders)) <= max(1, 3 * APPROX_DISTINCT_RSD * len(bidders))
        top, low = max(r["price"] for r in g), min(r["price"] for r in g)
        assert row["top"] in {r["bidder"] for r in g if r["price"] == top}
        assert row["low"] in {r["bidder"] for r in g if r["price"] == low}


def test_deduplication_passes_one_tuple_per_key_within_the_watermark(
        runtime: TaskRuntime, tmp_path: Path) -> None:
    """With a watermark longer than the input, every key's duplicates fall within it: exactly
    one tuple per bidder comes out, and it is one of that bidder's bids."""
    runtime.generator(op="src", output="bids", schema=BID, shape="bid", seed=8,
                      rate=2000.0, limit=3000, start=START)
    runtime.deduplicate(op="d", input="bids", output="first", keys=("bidder",),
                        time="date_time", watermark="1 hours")
    got = run_to_sink(runtime, tmp_path, "first", 3000)
    rows = input_rows("bid", 8, 2000.0, 3000)
    assert len({r["bidder"] for r in rows}) < len(rows) / 2  # there are duplicates to drop
    assert sorted(r["bidder"] for r in got) == sorted({r["bidder"] for r in rows})
    seen = {tuple(sorted(r.items())) for r in rows}
    assert all(tuple(sorted(r.items())) in seen for r in got)


def test_a_window_has_a_size_or_a_gap(runtime: TaskRuntime) -> None:
    runtime.generator(op="src", output="raw", schema=SEQUENCE, shape="sequence", seed=1,
                      rate=1000.0, limit=10, start=START)
    with pytest.raises(RuntimeSpecError, match="a size or a gap"):
        runtime.window_aggregate(op="w", input="raw", output="x", time="ts",
                                 window="1 seconds", slide=None, gap="1 seconds",
                                 watermark="0 seconds", group_by=(),
                                 aggregates=(("n", "count", None),))
