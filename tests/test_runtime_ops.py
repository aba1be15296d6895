"""Spark layer: each operator of TaskRuntime runs a finite generator through a real streaming query
to the jsonl file sink; the sink is compared with an oracle computed in plain Python from the
same input (rows from `shapes.reference_row`, the plain-Python twin of the Spark-side generator)."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import pytest

from common.types import Schema
from executor.runtime import RuntimeSpecError, TaskRuntime
from testkit.e2e_support import hot_items_oracle
from test_runtime_support import START, input_rows, read_sink, wait_drained

pytestmark = pytest.mark.spark

SENSOR = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"),
                   ("humidity", "double"))
SEQUENCE = Schema.of(("id", "int"), ("ts", "timestamp"), ("key", "string"), ("value", "double"))
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def run_to_sink(rt: TaskRuntime, tmp_path: Path, stream: str, limits: list[int]) -> list[dict]:
    out = tmp_path / "out.jsonl"
    rt.file_sink(op="sink", input=stream, path=str(out))
    assert rt.query is not None
    wait_drained(rt.query, limits)
    return read_sink(out)


def key_of(row: dict) -> tuple:
    return tuple(sorted((k, round(v, 9) if isinstance(v, float) else v) for k, v in row.items()))


def window_oracle(rows: list[dict], size: timedelta, slide: timedelta, delay: timedelta,
                  aggregate: Callable[[list[dict]], dict]) -> dict[tuple, dict]:
    """Append-mode windows: (window_start, sensor) -> aggregates, only windows closed by the final
    watermark (end <= max event time - delay)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        offset = (r["ts"] - EPOCH) % slide
        last_start = r["ts"] - offset
        start = last_start
        while start + size > r["ts"]:
            groups[(start, r["sensor"])].append(r)
            start -= slide
    closed_by = max(r["ts"] for r in rows) - delay
    return {k: aggregate(v) for k, v in groups.items() if k[0] + size <= closed_by}


def sensor_aggregates(group: list[dict]) -> dict:
    return {"n": len(group), "avg_temp": sum(r["temp"] for r in group) / len(group),
            "max_hum": max(r["humidity"] for r in group)}


def assert_windows_match(got: list[dict], expected: dict[tuple, dict], size: timedelta) -> None:
    keyed = {(r["window_start"], r["sensor"]): r for r in got}
    assert len(keyed) == len(got), "a window was emitted twice"
    assert set(keyed) == set(expected)
    for key, want in expected.items():
        row = keyed[key]
        assert row["window_end"] - row["window_start"] == size
        assert row["n"] == want["n"]
        assert row["avg_temp"] == pytest.approx(want["avg_temp"], rel=1e-12)
        assert row["max_hum"] == want["max_hum"]


AGGS = (("n", "count", None), ("avg_temp", "avg", "temp"), ("max_hum", "max", "humidity"))


def test_tumbling_window(runtime: TaskRuntime, tmp_path: Path) -> None:
    runtime.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=11,
                      rate=1000.0, limit=3000, start=START)
    runtime.window_aggregate(op="w", input="raw", output="win", time="ts",
                             window="500 milliseconds", slide=None, watermark="200 milliseconds",
                             group_by=("sensor",), aggregates=AGGS)
    got = run_to_sink(runtime, tmp_path, "win", [3000])
    size = timedelta(milliseconds=500)
    expected = window_oracle(input_rows("sensor", 11, 1000.0, 3000), size, size,
                             timedelta(milliseconds=200), sensor_aggregates)
    assert len(expected) == 50  # 5 closed windows x 10 sensors
    assert_windows_match(got, expected, size)


def test_sliding_window(runtime: TaskRuntime, tmp_path: Path) -> None:
    runtime.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=12,
                      rate=1000.0, limit=3000, start=START)
    runtime.window_aggregate(op="w", input="raw", output="win", time="ts", window="1 seconds",
                             slide="500 milliseconds", watermark="300 milliseconds",
                             group_by=("sensor",), aggregates=AGGS)
    got = run_to_sink(runtime, tmp_path, "win", [3000])
    size = timedelta(seconds=1)
    expected = window_oracle(input_rows("sensor", 12, 1000.0, 3000), size,
                             timedelta(milliseconds=500), timedelta(milliseconds=300),
                             sensor_aggregates)
    assert {k[0] for k in expected} >= {datetime(2024, 1, 1, tzinfo=timezone.utc)}
    assert_windows_match(got, expected, size)


def test_join_within_time_bound(runtime: TaskRuntime, tmp_path: Path) -> None:
    runtime.generator(op="l", output="left", schema=SENSOR, shape="sensor", seed=1,
                      rate=500.0, limit=1000, start=START)
    runtime.generator(op="r", output="right", schema=SENSOR, shape="sensor", seed=2,
                      rate=250.0, limit=500, start=START)
    runtime.join(op="j", left="left", right="right", output="pairs", left_keys=("sensor",),
                 right_keys=("sensor",), left_time="ts", right_time="ts",
                 within="100 milliseconds", watermark="5 seconds")
    got = run_to_sink(runtime, tmp_path, "pairs", [1000, 500])
    within = timedelta(milliseconds=100)
    expected = Counter(
        key_of({**l, **{f"right_{k}": v for k, v in r.items()}})
        for l in input_rows("sensor", 1, 500.0, 1000) for r in input_rows("sensor", 2, 250.0, 500)
        if l["sensor"] == r["sensor"] and abs(l["ts"] - r["ts"]) <= within)
    assert sum(expected.values()) > 1000
    assert list(got[0]) == ["sensor", "ts", "temp", "humidity", "right_sensor", "right_ts",
                            "right_temp", "right_humidity"]
    assert Counter(key_of(r) for r in got) == expected


def test_union_keeps_every_tuple_of_both_inputs(runtime: TaskRuntime, tmp_path: Path) -> None:
    runtime.generator(op="a", output="a", schema=SEQUENCE, shape="sequence", seed=5,
                      rate=1000.0, limit=1500, start=START)
    runtime.generator(op="b", output="b", schema=SEQUENCE, shape="sequence", seed=6,
                      rate=500.0, limit=700, start=START)
    runtime.union(op="u", inputs=("a", "b"), output="both")
    got = run_to_sink(runtime, tmp_path, "both", [1500, 700])
    expected = Counter(key_of(r) for r in input_rows("sequence", 5, 1000.0, 1500)
                       + input_rows("sequence", 6, 500.0, 700))
    assert Counter(key_of(r) for r in got) == expected


def test_filter_matches_python_predicate(runtime: TaskRuntime, tmp_path: Path) -> None:
    runtime.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=42,
                      rate=2000.0, limit=4000, start=START)
    runtime.filter(op="hot", input="raw", output="hot", condition="raw.temp > 30")
    got = run_to_sink(runtime, tmp_path, "hot", [4000])
    expected = Counter(key_of(r) for r in input_rows("sensor", 42, 2000.0, 4000)
                       if r["temp"] > 30)
    assert 0 < sum(expected.values()) < 4000
    assert Counter(key_of(r) for r in got) == expected


def test_a_discard_sink_counts_every_row_and_writes_nothing(runtime: TaskRuntime,
                                                           tmp_path: Path) -> None:
    runtime.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=42,
                      rate=2000.0, limit=4000, start=START)
    runtime.filter(op="hot", input="raw", output="hot", condition="raw.temp > 30")
    runtime.discard_sink(op="sink", input="hot")
    assert runtime.query is not None and runtime.sink is not None
    wait_drained(runtime.query, [4000])
    expected = sum(1 for r in input_rows("sensor", 42, 2000.0, 4000) if r["temp"] > 30)
    assert 0 < expected < 4000
    assert runtime.sink.rows_out == expected
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # the checkpoint, no output


def test_project_computes_columns(runtime: TaskRuntime, tmp_path: Path) -> None:
    runtime.generator(op="src", output="raw", schema=SEQUENCE, shape="sequence", seed=9,
                      rate=2000.0, limit=2000, start=START)
    runtime.project(op="p", input="raw", output="proj",
                    fields=(("id", "raw.id"), ("scaled", "raw.value * 2 + 1")))
    got = run_to_sink(runtime, tmp_path, "proj", [2000])
    expected = Counter(key_of({"id": r["id"], "scaled": r["value"] * 2 + 1})
                       for r in input_rows("sequence", 9, 2000.0, 2000))
    assert Counter(key_of(r) for r in got) == expected
    assert "*(" in executed_plan(runtime), "a small projection keeps whole-stage code generation"


def executed_plan(rt: TaskRuntime) -> str:
    """The physical plan of the task query's last micro-batch, as Spark prints it (an operator
    in a whole-stage generated stage is printed `*(n) Name`)."""
    assert rt.query is not None
    return str(rt.query._jsq.streamingQuery().lastExecution().executedPlan().toString())


def test_large_expressions_run_without_whole_stage_code_generation(
        runtime: TaskRuntime, tmp_path: Path, spark: Any) -> None:
    """12 fields of 12 terms each (564 expression nodes, over `WHOLE_STAGE_MAX_NODES`): the
    task's query runs without whole-stage code generation, the session keeps it, and the
    results are the plain-Python ones."""
    from executor.spark_codegen import WHOLE_STAGE
    terms = range(1, 13)
    fields = tuple((f"f{i}", " + ".join(f"raw.value * {i * t}" for t in terms)) for i in terms)
    runtime.generator(op="src", output="raw", schema=SEQUENCE, shape="sequence", seed=9,
                      rate=2000.0, limit=1000, start=START)
    runtime.project(op="p", input="raw", output="proj", fields=(("id", "raw.id"), *fields))
    got = run_to_sink(runtime, tmp_path, "proj", [1000])
    rows = input_rows("sequence", 9, 2000.0, 1000)
    expected = Counter(key_of({"id": r["id"], **{f"f{i}": sum(r["value"] * (i * t) for t in terms)
                                                 for i in terms}}) for r in rows)
    assert Counter(key_of(r) for r in got) == expected
    assert "*(" not in executed_plan(runtime)
    assert spark.conf.get(WHOLE_STAGE) == "true", "the session's conf is restored"


def test_bad_program_calls_fail_clearly_without_starting(runtime: TaskRuntime) -> None:
    with pytest.raises(RuntimeSpecError, match="operator src: .*not produced by shape"):
        runtime.generator(op="src", output="raw", schema=Schema.of(("price", "double")),
                          shape="sensor", seed=1, rate=10.0, limit=10, start=START)
    runtime.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=1, rate=10.0,
                      limit=10, start=START)
    with pytest.raises(RuntimeSpecError, match="operator w: duration"):
        runtime.window_aggregate(op="w", input="raw", output="x", time="ts", window="1 fortnight",
                                 slide=None, watermark="1 seconds", group_by=(), aggregates=())
    with pytest.raises(RuntimeSpecError, match="unknown input stream 'nope'"):
        runtime.union(op="u", inputs=("raw", "nope"), output="y")
    assert runtime.query is None


STOCK = Schema.of(("symbol", "string"), ("ts", "timestamp"), ("price", "double"),
                  ("volume", "int"))


def test_a_window_over_a_windows_results_emits_the_oracles_hot_items(
        runtime: TaskRuntime, tmp_path: Path) -> None:
    """Nexmark's "hot items" in one query: counts per symbol in sliding windows, then per
    tumbling window over their `window_end` the top count. The second window adds no watermark
    of its own (it would hold the query's at 0); the first's reaches it through `window_end`."""
    runtime.generator(op="src", output="raw", schema=STOCK, shape="stock", seed=31,
                      rate=1000.0, limit=3000, start=START)
    runtime.window_aggregate(op="per_symbol", input="raw", output="counts", time="ts",
                             window="1 seconds", slide="500 milliseconds",
                             watermark="200 milliseconds", group_by=("symbol",),
                             aggregates=(("n", "count", None),))
    runtime.window_aggregate(op="hot", input="counts", output="hot", time="window_end",
                             window="500 milliseconds", slide=None, watermark="0 seconds",
                             group_by=(), aggregates=(("top", "max", "n"),
                                                      ("windows", "count", None)))
    got = run_to_sink(runtime, tmp_path, "hot", [3000])
    expected = hot_items_oracle(input_rows("stock", 31, 1000.0, 3000), "symbol",
                                timedelta(seconds=1), timedelta(milliseconds=500),
                                timedelta(milliseconds=200), timedelta(milliseconds=500))
    assert len(expected) >= 3, expected
    assert Counter((r["window_start"], r["window_end"], r["top"], r["windows"])
                   for r in got) == expected


def test_a_window_over_a_windows_results_must_use_window_end(runtime: TaskRuntime) -> None:
    runtime.generator(op="src", output="raw", schema=STOCK, shape="stock", seed=31,
                      rate=1000.0, limit=10, start=START)
    runtime.window_aggregate(op="per_symbol", input="raw", output="counts", time="ts",
                             window="1 seconds", slide=None, watermark="0 seconds",
                             group_by=("symbol",), aggregates=(("n", "count", None),))
    with pytest.raises(RuntimeSpecError, match="not an event-time column.*window_end"):
        runtime.window_aggregate(op="hot", input="counts", output="hot", time="window_start",
                                 window="1 seconds", slide=None, watermark="0 seconds",
                                 group_by=(), aggregates=(("top", "max", "n"),))


def test_a_window_over_a_joins_output_uses_its_time_column_and_counts_exactly(
        runtime: TaskRuntime, tmp_path: Path) -> None:
    """A join's time columns carry its watermark, so a window over them adds none. Each
    emitted window holds exactly the oracle's pairs, and the windows come out in order (all
    of the oracle's up to the last one emitted)."""
    runtime.generator(op="l", output="left", schema=SENSOR, shape="sensor", seed=1,
                      rate=500.0, limit=1000, start=START)
    runtime.generator(op="r", output="right", schema=SENSOR, shape="sensor", seed=2,
                      rate=250.0, limit=500, start=START)
    runtime.join(op="j", left="left", right="right", output="pairs", left_keys=("sensor",),
                 right_keys=("sensor",), left_time="ts", right_time="ts",
                 within="100 milliseconds", watermark="200 milliseconds")
    runtime.window_aggregate(op="w", input="pairs", output="per_window", time="ts",
                             window="500 milliseconds", slide=None, watermark="0 seconds",
                             group_by=("sensor",), aggregates=(("pairs", "count", None),))
    got = run_to_sink(runtime, tmp_path, "per_window", [1000, 500])
    within, size = timedelta(milliseconds=100), timedelta(milliseconds=500)
    expected: Counter = Counter()
    for l in input_rows("sensor", 1, 500.0, 1000):
        for r in input_rows("sensor", 2, 250.0, 500):
            if l["sensor"] == r["sensor"] and abs(l["ts"] - r["ts"]) <= within:
                expected[(l["ts"] - (l["ts"] - EPOCH) % size, l["sensor"])] += 1
    emitted = {(r["window_start"], r["sensor"]): r["pairs"] for r in got}
    assert len(emitted) == len(got), "a window was emitted twice"
    assert len({start for start, _ in emitted}) >= 2, emitted
    last = max(start for start, _ in emitted)
    assert emitted == {k: n for k, n in expected.items() if k[0] <= last}
