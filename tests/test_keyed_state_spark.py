"""Spark layer for issue 37's count windows (`window-aggregate` with `rows`) and updating
aggregates (`aggregate`, written by the file sink as an upsert log): each runs as a real
streaming query over the built-in generators and is compared with an oracle in plain Python over
the same rows (`shapes.reference_row`), also across a stop and a restart from the checkpoint."""

from __future__ import annotations

import math
import os
import signal
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

import pytest

from common.upsert_log import KEY_MEMBER, read_current
from executor import shapes
from executor.runtime import RuntimeSpecError, TaskRuntime
from testkit.spark_processes import jvm_pid, program_runner, python_workers
from test_runtime_support import drained, input_rows, read_sink, wait_drained, wait_for

pytestmark = pytest.mark.spark

BID = shapes.shape_named("bid").columns
SEQUENCE = shapes.shape_named("sequence").columns
START = "2024-01-01T00:00:00Z"
RATE = 2000.0
# 8,000 bids take 16 s: at RATE (4 s) a quiet machine emitted them all before the stop
RESTART_RATE = 500.0
Row = dict[str, Any]


def watermark_at_end(rows: list[Row], time: str, delay: timedelta) -> datetime:
    """Spark's last watermark: the largest event time in whole milliseconds less `delay`."""
    latest = max(r[time] for r in rows)
    return latest - timedelta(microseconds=latest.microsecond % 1000) - delay


def count_window_oracle(rows: list[Row], key: str, n: int, delay: timedelta) -> list[tuple]:
    """(window_start, window_end, key, avg price, count, max price) for every row the final
    watermark passed: its key's last n rows in event-time order (equal times by price)."""
    limit = watermark_at_end(rows, "date_time", delay)
    per_key: dict[Any, list[Row]] = defaultdict(list)
    for r in rows:
        per_key[r[key]].append(r)
    out = []
    for k, members in per_key.items():
        ordered = sorted(members, key=lambda r: (r["date_time"], r["price"]))
        for i, r in enumerate(ordered):
            if r["date_time"] > limit:
                break
            window = ordered[max(0, i + 1 - n):i + 1]
            prices = [w["price"] for w in window]
            out.append((window[0]["date_time"], r["date_time"], k, sum(prices) / len(prices),
                        len(prices), max(prices)))
    return sorted(out)


def start_count_window(rt: TaskRuntime, out: Path, limit: int, n: int,
                       rate: float = RATE) -> None:
    rt.generator(op="src", output="bids", schema=BID, shape="bid", seed=21, rate=rate,
                 limit=limit, start=START)
    rt.window_aggregate(op="w", input="bids", output="last", time="date_time", window=None,
                        slide=None, watermark="2 milliseconds", group_by=("bidder",),
                        aggregates=(("avg_price", "avg", "price"), ("n", "count", None),
                                    ("top", "max", "price")), rows=n)
    rt.file_sink(op="sink", input="last", path=str(out))


def emitted_windows(out: Path) -> list[tuple]:
    return sorted((r["window_start"], r["window_end"], r["bidder"], r["avg_price"], r["n"],
                   r["top"]) for r in read_sink(out))


def test_a_count_window_gives_each_rows_last_n_in_event_time_order(
        runtime: TaskRuntime, tmp_path: Path) -> None:
    """Nexmark bids per bidder, the last 5 of each (the hot bidder has hundreds, others a few):
    one result per bid the watermark passed, exactly the oracle's; the state holds at most 4
    released rows per bidder and the rows not yet passed."""
    limit, out = 3000, tmp_path / "out.jsonl"
    start_count_window(runtime, out, limit, 5)
    assert runtime.query is not None
    wait_drained(runtime.query, [limit], timeout=300)
    expected = count_window_oracle(input_rows("bid", 21, RATE, limit), "bidder", 5,
                                   timedelta(milliseconds=2))
    assert sum(1 for e in expected if e[4] == 5) > 100, "too few full windows to test"
    assert emitted_windows(out) == expected


def stopped_and_resumed(spark: Any, ck: Path, out: Path, limit: int,
                        start: Callable[[TaskRuntime], None],
                        resume_rate: float | None = None) -> tuple[int, Any]:
    """A task built by `start` stopped after its first results and started again on checkpoint
    `ck` until its `limit` input rows are drained: (the rows out before the restart, the
    resumed query's last progress). With `resume_rate`, the resumed task's generator `src` is
    paced at that rate (a control parameter, as a relaunch after a rate change gets it; the
    rows' event times stay the program's)."""
    first = TaskRuntime(spark, query_id="q", task_id="t-first", checkpoint_dir=str(ck),
                        trigger_seconds=0.5)
    try:
        start(first)
        wait_for(lambda: read_sink(out), 300, "a first batch of results")
    finally:
        first.stop()
    before = len(read_sink(out))
    params = {} if resume_rate is None else {"src": {"rate": resume_rate}}
    second = TaskRuntime(spark, query_id="q", task_id="t-second", checkpoint_dir=str(ck),
                         trigger_seconds=0.5, params=params)
    try:
        start(second)
        assert second.query is not None
        wait_drained(second.query, [limit], timeout=300)
        return before, second.query.lastProgress
    finally:
        second.stop()


def test_a_count_window_restarted_from_its_checkpoint_gives_the_same_results(
        spark: Any, tmp_path: Path) -> None:
    """Stopped after its first rows and started again on the same checkpoint: each bid's
    result comes once, and all of them are the oracle's (the pending rows and each key's last
    rows came back from the state store). The stop paced at RESTART_RATE comes midway; the rest
    of the input comes unpaced (~10 s of pacing that proved nothing)."""
    limit, out = 8000, tmp_path / "out.jsonl"
    before, _ = stopped_and_resumed(spark, tmp_path / "ck", out, limit,
                                    lambda rt: start_count_window(rt, out, limit, 10,
                                                                  RESTART_RATE),
                                    resume_rate=RATE * 10)
    expected = count_window_oracle(input_rows("bid", 21, RESTART_RATE, limit), "bidder", 10,
                                   timedelta(milliseconds=2))
    assert 0 < before < len(expected), "the restart did not come midway"
    assert emitted_windows(out) == expected


def updating_oracle(rows: list[Row], key: str, value: str, time: str, ttl: timedelta
                    ) -> dict[Any, tuple[int, Any, float]]:
    """Per key: (count, sum, avg) of its rows since the last gap longer than ttl between one
    row and the latest before it, in event-time order (equal times by value)."""
    per_key: dict[Any, list[Row]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r[time], r[value])):
        per_key[r[key]].append(r)
    view = {}
    for k, members in per_key.items():
        run: list[Row] = []
        for r in members:
            if run and r[time] > run[-1][time] + ttl:
                run = []
            run.append(r)
        total = sum(m[value] for m in run)
        view[k] = (len(run), total, total / len(run))
    return view


def start_updating(rt: TaskRuntime, out: Path, shape: str, limit: int, key: str,
                   value: str, time: str, ttl: str) -> None:
    schema = BID if shape == "bid" else SEQUENCE
    rt.generator(op="src", output="rows", schema=schema, shape=shape, seed=5, rate=RATE,
                 limit=limit, start=START)
    rt.updating_aggregate(op="agg", input="rows", output="totals", time=time, ttl=ttl,
                          watermark="0 seconds", group_by=(key,),
                          aggregates=(("n", "count", None), ("total", "sum", value),
                                      ("mean", "avg", value)))
    rt.file_sink(op="sink", input="totals", path=str(out), upsert_key=(key,))


def current(out: Path, key: str) -> dict[Any, tuple[int, Any, float]]:
    return {r[key]: (r["n"], r["total"], r["mean"]) for r in read_current(str(out))}


def assert_views_equal(have: dict, want: dict) -> None:
    assert set(have) == set(want)
    for k, (n, total, mean) in want.items():
        got = have[k]
        assert got[0] == n and math.isclose(got[1], total, rel_tol=1e-12) \
            and math.isclose(got[2], mean, rel_tol=1e-12), (k, got, want[k])


def test_an_updating_aggregate_writes_an_upsert_log_whose_view_is_the_oracles(
        runtime: TaskRuntime, tmp_path: Path) -> None:
    """Totals per sequence key over the whole stream (a ttl longer than the run): several
    records per key (one per micro-batch that had its rows), each naming its key; the view,
    the last record of each key, equals the oracle's totals."""
    limit, out = 3000, tmp_path / "out.jsonl"
    start_updating(runtime, out, "sequence", limit, "key", "value", "ts", "1 hours")
    assert runtime.query is not None
    wait_drained(runtime.query, [limit], timeout=300)
    records = read_sink(out)
    assert all(r[KEY_MEMBER] == ["key"] for r in records)
    assert len(records) > len({r["key"] for r in records}), "no key was updated twice"
    want = updating_oracle(input_rows("sequence", 5, RATE, limit), "key", "value", "ts",
                           timedelta(hours=1))
    assert_views_equal(current(out, "key"), want)


def test_an_updating_aggregates_ttl_bounds_its_state_and_restarts_quiet_keys(
        spark: Any, tmp_path: Path) -> None:
    """Totals per auction with a 20 ms ttl (auctions are bid on for a few ms each, and the hot
    auction changes): a bid more than 20 ms after its auction's latest starts the totals anew,
    and keys quiet for 20 ms of watermark leave the state, which ends far smaller than the
    number of auctions. Stopped after its first rows and restarted from the checkpoint, the
    view is still the oracle's."""
    limit, out = 8000, tmp_path / "out.jsonl"
    before, last = stopped_and_resumed(
        spark, tmp_path / "ck", out, limit,
        lambda rt: start_updating(rt, out, "bid", limit, "auction", "price", "date_time",
                                  "20 milliseconds"))
    rows = input_rows("bid", 5, RATE, limit)
    want = updating_oracle(rows, "auction", "price", "date_time", timedelta(milliseconds=20))
    whole = updating_oracle(rows, "auction", "price", "date_time", timedelta(days=1))
    assert want != whole, "no auction had a gap longer than the ttl: the reset is untested"
    assert 0 < before < len(read_sink(out)), "the restart did not come midway"
    assert_views_equal(current(out, "auction"), want)
    assert last is not None
    state = sum(s["numRowsTotal"] for s in last["stateOperators"])
    assert state < len(want) / 4, f"{state} keys in state of {len(want)}: the ttl bounds nothing"


def test_keyed_operators_refuse_what_they_cannot_compute(runtime: TaskRuntime) -> None:
    runtime.generator(op="src", output="bids", schema=BID, shape="bid", seed=1, rate=1000.0,
                      limit=10, start=START)
    for bad in (
            dict(rows=0), dict(rows=10_001), dict(rows=5, window="1 seconds"),
            dict(rows=5, aggregates=(("d", "count_distinct", "price"),)),
            dict(rows=5, time="price")):
        args: dict[str, Any] = dict(op="w", input="bids", output="o", time="date_time",
                                    window=None, slide=None, watermark="0 seconds",
                                    group_by=(), aggregates=(("n", "count", None),))
        args.update(bad)
        with pytest.raises(RuntimeSpecError):
            runtime.window_aggregate(**args)
    with pytest.raises(RuntimeSpecError, match="ttl"):
        runtime.updating_aggregate(op="a", input="bids", output="o", time="date_time",
                                   ttl="0 seconds", watermark="0 seconds", group_by=(),
                                   aggregates=(("n", "count", None),))



PROGRAM = '''
from common.types import Schema
BID = Schema.of(("auction", "int"), ("bidder", "int"), ("price", "int"), ("channel", "string"),
                ("url", "string"), ("date_time", "timestamp"))
def build(rt):
    rt.generator(op="src", output="bids", schema=BID, shape="bid", seed=21, rate=KILL_RATE,
                 limit=LIMIT, start="2024-01-01T00:00:00Z")
    rt.window_aggregate(op="w", input="bids", output="last", time="date_time", window=None,
                        slide=None, watermark="2 milliseconds", group_by=("bidder",),
                        aggregates=(("avg_price", "avg", "price"), ("n", "count", None),
                                    ("top", "max", "price")), rows=10)
    rt.file_sink(op="sink", input="last", path=OUT)
'''


KILL_RATE = 250.0  # 6,000 bids take ~26 s: the kill comes mid-stream, after the first results
FAST = 10000.0  # the rest, once two micro-batches ran on the workers that replaced the killed


def test_a_count_window_whose_python_workers_are_sigkilled_stays_exact(
        spark: Any, tmp_path: Path) -> None:
    """Mid-stream, every Python worker of the session (where the per-key state function runs)
    is SIGKILLed: every bid's result is still there once, exactly the oracle's. (In our runs
    Spark replaced the workers without failing the query, restarts 0; the task runner would
    restart a failed query from its checkpoint, which the stop-and-restart test covers.) Two
    micro-batches after the kill, the rest of the input comes unpaced (a control tuple's rate:
    the query is rebuilt from its checkpoint; event times stay KILL_RATE's)."""
    limit, out = 6000, tmp_path / "out.jsonl"
    program = tmp_path / "program.py"
    program.write_text(f"OUT = {str(out)!r}\nLIMIT = {limit}\nKILL_RATE = {KILL_RATE}\n"
                       + PROGRAM, encoding="utf-8")
    runner = program_runner(spark, program, "kill", tmp_path / "ck")
    jvm = jvm_pid(spark)
    try:
        runner.start()
        wait_for(lambda: read_sink(out), 120, "a first batch of results")
        assert runner.runtime is not None and runner.runtime.query is not None
        progress = runner.runtime.query.lastProgress
        assert progress is not None
        assert str(limit) not in str(progress["sources"][0]["endOffset"]), "too late to kill"
        victims = python_workers(jvm)
        assert victims, "no Python worker to kill"
        at_kill = progress["batchId"]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

        def batches_after_kill() -> int:
            query = runner.runtime.query if runner.runtime is not None else None
            last = query.lastProgress if query is not None else None
            return -1 if last is None else int(last["batchId"]) - at_kill

        wait_for(lambda: batches_after_kill() >= 2, 120, "two micro-batches after the kill")
        runner.reconfigure(1, {"src": {"rate": FAST}})
        wait_for(lambda: runner.runtime is not None and runner.runtime.query is not None
                 and drained(runner.runtime.query, [limit]), 300, "the rest after the kill")
        assert runner.runtime is not None and runner.runtime.query is not None
        wait_drained(runner.runtime.query, [limit], timeout=120)
    finally:
        runner.stop()
    expected = count_window_oracle(input_rows("bid", 21, KILL_RATE, limit), "bidder", 10,
                                   timedelta(milliseconds=2))
    assert emitted_windows(out) == expected, f"restarts: {runner.status().restarts}"
