"""Spark layer for the Nexmark features: session windows, the distinct counts, max_by/min_by and
deduplication within a watermark, each run through a real streaming query over the Nexmark (or
sequence) generator and compared with an oracle in plain Python over the same rows
(`shapes.reference_row`, the plain-Python twin of the Spark-side generator)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from common import side_table
from common.operator_schemas import APPROX_DISTINCT_RSD
from executor import shapes
from executor.runtime import RuntimeSpecError, TaskRuntime
from testkit.e2e_support import session_oracle
from test_runtime_support import START, input_rows, read_sink, wait_drained, wait_for

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


def test_filtered_aggregates_per_window_match_the_oracle(runtime: TaskRuntime,
                                                        tmp_path: Path) -> None:
    """Aggregates with a where (SQL's FILTER, Nexmark q15's price ranks) per channel and 500 ms
    window of Nexmark bids: counts, a distinct count, a sum, an arg-max and an average over
    the rows each condition is true of; null where no row of the window passes."""
    runtime.generator(op="src", output="bids", schema=BID, shape="bid", seed=6,
                      rate=2000.0, limit=4600, start=START)
    runtime.window_aggregate(
        op="w", input="bids", output="ranks", time="date_time",
        window="500 milliseconds", slide=None, watermark="0 seconds", group_by=("channel",),
        aggregates=(("all", "count", None, None, "true"),
                    ("r1", "count", None, None, "price < 10000"),
                    ("r2_bidders", "count_distinct", "bidder", None,
                     "price >= 10000 and price < 1000000"),
                    ("r3_sum", "sum", "price", None, "bids.price >= 1000000"),
                    ("r1_top", "max_by", "bidder", "price", "price < 10000"),
                    ("none_avg", "avg", "price", None, "channel = 'nobody'")))
    got = run_to_sink(runtime, tmp_path, "ranks", 4600)
    rows = input_rows("bid", 6, 2000.0, 4600)
    size = timedelta(milliseconds=500)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["date_time"] - (r["date_time"] - shapes.EPOCH) % size, r["channel"])].append(r)
    closed_by = max(r["date_time"] for r in rows)
    expected = {k: g for k, g in groups.items() if k[0] + size <= closed_by}
    emitted = {(r["window_start"], r["channel"]): r for r in got}
    assert len(emitted) == len(got) and set(emitted) == set(expected)
    for k, g in expected.items():
        rank1 = [r for r in g if r["price"] < 10000]
        rank3 = [r["price"] for r in g if r["price"] >= 1000000]
        top = max((r["price"] for r in rank1), default=None)
        row = emitted[k]
        assert (row["all"], row["r1"]) == (len(g), len(rank1))
        assert row["r2_bidders"] == len({r["bidder"] for r in g
                                         if 10000 <= r["price"] < 1000000})
        assert row["r3_sum"] == (sum(rank3) if rank3 else None)
        assert row["r1_top"] in ({r["bidder"] for r in rank1 if r["price"] == top}
                                 if rank1 else {None})
        assert row["none_avg"] is None
    assert sum(1 for r in got if r["r1_top"] is None) > 0 and any(r["r1"] for r in got)


def test_a_where_that_is_not_a_condition_is_refused_before_the_query_starts(
        runtime: TaskRuntime) -> None:
    runtime.generator(op="src", output="bids", schema=BID, shape="bid", seed=1,
                      rate=1000.0, limit=10, start=START)
    for where in ("__import__('os').system('id')", "price + 1"):
        with pytest.raises(RuntimeSpecError, match="where|condition|expression"):
            runtime.window_aggregate(op="w", input="bids", output="x", time="date_time",
                                     window="1 seconds", slide=None, watermark="0 seconds",
                                     group_by=(), aggregates=(("n", "count", None, None, where),))
    assert runtime.query is None


SIDE = (("key", "int"), ("value", "string"), ("weight", "double"))


def side_rows() -> list[dict]:
    """Keys 0..39 (bids' keys run 0..49: some find none), key 7 twice, one null key."""
    rows = [{"key": k, "value": f"v{k}", "weight": k / 4} for k in range(40)]
    return rows + [{"key": 7, "value": "again", "weight": None},
                   {"key": None, "value": "nobody", "weight": 1.0}]


def test_a_lookup_join_matches_the_oracle(runtime: TaskRuntime, tmp_path: Path) -> None:
    """Each bid with the side table's rows of its key (auction % 50), inner: a key with no
    row drops the bid, a key with two rows gives two, a null key matches nothing."""
    side = tmp_path / "side.jsonl"
    side.write_text("".join(json.dumps(r) + "\n" for r in side_rows()))
    runtime.generator(op="src", output="bids", schema=BID, shape="bid", seed=9,
                      rate=2000.0, limit=2000, start=START)
    runtime.project(op="p", input="bids", output="keyed",
                    fields=(("auction", "auction"), ("price", "price"),
                            ("key", "auction % 50")))
    runtime.lookup_join(op="j", input="keyed", output="joined", path=str(side), format="jsonl",
                        side="side_row", side_columns=SIDE, left_keys=("key",),
                        right_keys=("key",))
    got = run_to_sink(runtime, tmp_path, "joined", 2000)
    table: dict[int, list[dict]] = defaultdict(list)
    for r in side_rows():
        if r["key"] is not None:
            table[r["key"]].append(r)
    want = Counter((b["auction"], b["price"], b["auction"] % 50, s["key"], s["value"],
                    s["weight"]) for b in input_rows("bid", 9, 2000.0, 2000)
                   for s in table.get(b["auction"] % 50, ()))
    have = Counter((r["auction"], r["price"], r["key"], r["side_row_key"], r["value"],
                    r["weight"]) for r in got)
    assert have == want
    assert any(k[3] == 7 for k in want) and len(want) < 2000 * 1.1


def test_a_bad_side_file_is_refused_before_the_query_starts(
        runtime: TaskRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing, malformed, a link out of the path roots, too large: each refused with the
    file (and the bad line), nothing started."""
    monkeypatch.setenv("ELASTIQ_PATH_ROOTS", str(tmp_path))
    runtime.generator(op="src", output="bids", schema=BID, shape="bid", seed=1,
                      rate=1000.0, limit=10, start=START)
    runtime.project(op="p", input="bids", output="keyed", fields=(("key", "auction"),))
    (tmp_path / "bad.jsonl").write_text('{"key": 1, "value": "a"}\n[1]\n{"key": "x"}\n')
    (tmp_path / "link.jsonl").symlink_to("/etc/hostname")
    with open(tmp_path / "big.jsonl", "wb") as f:
        f.truncate(side_table.MAX_SIDE_BYTES + 1)
    cases = (("missing.jsonl", "does not exist"), ("bad.jsonl", "line 2: not a JSON object"),
             ("bad.jsonl", "line 3: column 'key' is int"), ("link.jsonl", "outside|not a file"),
             ("big.jsonl", "more than"))
    for name, message in cases:
        with pytest.raises(RuntimeSpecError, match=message):
            runtime.lookup_join(op="j", input="keyed", output="joined",
                                path=str(tmp_path / name), format="jsonl", side="side_row",
                                side_columns=SIDE, left_keys=("key",), right_keys=("key",))
    assert runtime.query is None


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


# Nexmark q10's sink: bids from 1.5 s before midnight, so a run's rows fall in two days
PARTITION_START = "2024-01-01T23:59:58.500Z"
PARTITION_BY = "dt=yyyy-MM-dd/t=HH:mm:ss"


def partition_oracle(rows: list[dict]) -> dict[tuple[str, ...], Counter]:
    """The bids per partition folder, named by strftime in plain Python (':' as Hive's %3A)."""
    want: dict[tuple[str, ...], Counter] = defaultdict(Counter)
    for r in rows:
        when = r["date_time"]
        want[(f"dt={when:%Y-%m-%d}", f"t={when:%H}%3A{when:%M}%3A{when:%S}")][
            tuple(r[c.name] for c in BID)] += 1
    return want


def partitions_read(folder: Path) -> dict[tuple[str, ...], Counter]:
    return {f.relative_to(folder).parts[:-1]: Counter(tuple(r[c.name] for c in BID)
                                                       for r in read_sink(f))
            for f in folder.rglob("bids.jsonl")}


def rows_read(folder: Path) -> int:
    return sum(sum(c.values()) for c in partitions_read(folder).values())


def test_a_time_partitioned_sink_is_exact_across_a_restart_that_replays_a_batch(
        spark: Any, tmp_path: Path) -> None:
    """Bids at 500/s partitioned by day and second. Stopped after its first partitions, the
    last planned batch's commit (if it has one) taken out of Spark's checkpoint, as a crash
    between the sink's write and Spark's commit leaves it, and started again: Spark runs that
    batch again, the partitions it reached skip it, and the files read back are the oracle's
    rows partitioned in plain Python, each once."""
    limit, rate, ck = 1500, 500.0, tmp_path / "ck"
    out = tmp_path / "out" / "bids.jsonl"

    def start(task: str) -> TaskRuntime:
        rt = TaskRuntime(spark, query_id="q", task_id=task, checkpoint_dir=str(ck),
                         trigger_seconds=0.5)
        rt.generator(op="src", output="bids", schema=BID, shape="bid", seed=10, rate=rate,
                     limit=limit, start=PARTITION_START)
        rt.file_sink(op="sink", input="bids", path=str(out), partition_time="date_time",
                     partition_by=PARTITION_BY)
        return rt

    first = start("t-first")
    try:
        wait_for(lambda: len(partitions_read(out.parent)) >= 2, 120, "two partitions")
    finally:
        first.stop()
    spark_dir = ck / "spark"
    last = max(int(p.name) for p in (spark_dir / "offsets").iterdir() if p.name.isdigit())
    if (spark_dir / "commits" / str(last)).exists():  # else Spark runs it again anyway
        marks = [json.loads(m.read_text())["batch_id"] for m in out.parent.rglob("*.commit")]
        assert max(marks) == last, "the sink had not written the batch whose commit goes"
        (spark_dir / "commits" / str(last)).unlink()
        (spark_dir / "commits" / f".{last}.crc").unlink(missing_ok=True)
    before = rows_read(out.parent)
    second = start("t-second")
    try:  # (the batch run again comes first: once every row is back, any twice is too)
        wait_for(lambda: rows_read(out.parent) >= limit, 120, "every row in its partition")
    finally:
        second.stop()
    start_us = shapes.parse_start(PARTITION_START)
    shape = shapes.shape_named("bid")
    want = partition_oracle([shapes.reference_row(shape, 10, start_us, rate, i)
                             for i in range(limit)])
    assert 0 < before < limit, "the restart did not come midway"
    assert len(want) >= 4 and {f[0] for f in want} == {"dt=2024-01-01", "dt=2024-01-02"}
    assert partitions_read(out.parent) == want
    assert not out.exists()  # the rows are in the partitions only
