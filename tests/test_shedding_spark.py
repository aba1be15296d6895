"""Spark layer: the drop operator (load shedding, docs/load.md) on a real streaming query,
checked against the same input computed in plain Python: idle it passes every row; a semantic
drop keeps only rows of the input, drops every row failing its keep condition at ratio 1 and
about `high_ratio` of the others; and the rows it keeps are exactly those its seeded row hash
picks on the same rows in a batch query (so a replayed micro-batch drops the same rows); every
dropped row is counted in the progress reports' observed metrics. Every row a drop passes
carries its keep share (`kept`, docs/load.md "What a sink's rows say about shedding")."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from common.kept import KEPT, LOST
from common.types import Schema
from executor import shapes
from executor.runtime import TaskRuntime, drop_keeps
from executor.task_runner import InputCounter
from test_runtime_support import START, input_rows, read_sink, wait_drained

pytestmark = pytest.mark.spark

SENSOR = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"),
                   ("humidity", "double"))
ROWS = 4000


def key_of(row: dict) -> tuple:
    """The row without its keep share (common/kept.py), which the tests check apart."""
    return tuple(sorted((k, v) for k, v in row.items() if k != KEPT))


def test_a_semantic_drop_keeps_only_rows_worth_keeping(runtime: TaskRuntime, spark: Any,
                                                       tmp_path: Path) -> None:
    runtime.generator(op="src", output="src_out", schema=SENSOR, shape="sensor", seed=42,
                      rate=2000.0, limit=ROWS, start=START)
    runtime.drop(op="src_drop", input="src_out", output="raw", ratio=1.0, high_ratio=0.5,
                 mode="semantic", seed=7, keep="raw.temp > 35")
    out = tmp_path / "out.jsonl"
    runtime.file_sink(op="sink", input="raw", path=str(out))
    assert runtime.query is not None
    wait_drained(runtime.query, [ROWS])
    written = read_sink(out)
    assert {r[KEPT] for r in written} == {0.5}  # 1 - high_ratio: every row kept is worth it
    got = Counter(key_of(r) for r in written)
    counted = InputCounter()
    counted.add(runtime.query.recentProgress)
    assert counted.dropped == ROWS - sum(got.values())  # every dropped row counted
    rows = input_rows("sensor", 42, 2000.0, ROWS)
    worth = [r for r in rows if r["temp"] > 35]
    assert 100 < len(worth) < ROWS
    assert not got - Counter(key_of(r) for r in worth)  # only input rows worth keeping
    assert 0.35 * len(worth) < sum(got.values()) < 0.65 * len(worth)
    batch = spark.createDataFrame([tuple(r[n] for n in SENSOR.names) for r in worth],
                                  "sensor string, ts timestamp, temp double, humidity double")
    picked = batch.filter(drop_keeps(SENSOR, 7, 0.5)).collect()
    values = Counter((r["sensor"], r["temp"], r["humidity"]) for r in picked)
    kept = Counter((r["sensor"], r["temp"], r["humidity"]) for r in map(dict, got.elements()))
    assert kept == values


def test_an_idle_drop_passes_every_row(runtime: TaskRuntime, tmp_path: Path) -> None:
    runtime.generator(op="src", output="src_out", schema=SENSOR, shape="sensor", seed=3,
                      rate=2000.0, limit=1000, start=START)
    runtime.drop(op="src_drop", input="src_out", output="raw", ratio=0.0)
    out = tmp_path / "out.jsonl"
    runtime.file_sink(op="sink", input="raw", path=str(out))
    assert runtime.query is not None
    wait_drained(runtime.query, [1000])
    written = read_sink(out)
    assert {r[KEPT] for r in written} == {1.0}
    assert Counter(key_of(r) for r in written) == \
        Counter(key_of(r) for r in input_rows("sensor", 3, 2000.0, 1000))


# ----------------------------------------------------------------------------------------------
# The share of input a shed stream's rows reflect (issue 32), against plain Python

WINDOW = timedelta(milliseconds=250)


def shed_window_query(runtime: TaskRuntime, ratio: float, high_ratio: float,
                      only_worth: bool = False) -> None:
    """generator -> semantic drop (keep temp > 35) [-> filter of the rows worth keeping] ->
    250 ms tumbling windows per sensor counting their rows."""
    runtime.generator(op="src", output="src_out", schema=SENSOR, shape="sensor", seed=11,
                      rate=2000.0, limit=ROWS, start=START)
    runtime.drop(op="src_drop", input="src_out", output="raw", ratio=ratio,
                 high_ratio=high_ratio, mode="semantic", seed=5, keep="raw.temp > 35")
    stream = "raw"
    if only_worth:
        runtime.filter(op="hot", input="raw", output="hot", condition="raw.temp > 35")
        stream = "hot"
    runtime.window_aggregate(op="w", input=stream, output="per_sensor", time="ts",
                             window="250 milliseconds", slide=None, watermark="0 seconds",
                             group_by=("sensor",), aggregates=(("n", "count", None),))


def kept_rows(spark: Any, rows: list[dict], ratio: float, high_ratio: float) -> list[dict]:
    """The input rows the drop keeps, picked by its row hash in a batch query (the first test
    shows the stream picks the same), each with its share computed here: 1 - the ratio of its
    class (worth keeping: temp > 35)."""
    frame = spark.createDataFrame([tuple(r[n] for n in SENSOR.names) for r in rows],
                                  "sensor string, ts timestamp, temp double, humidity double")
    picked = {(r["sensor"], r["temp"], r["humidity"]) for r in frame.filter(
        F.when(F.col("temp") > 35, drop_keeps(SENSOR, 5, high_ratio))
        .otherwise(drop_keeps(SENSOR, 5, ratio))).collect()}
    by_values = {(r["sensor"], r["temp"], r["humidity"]): r for r in rows}
    assert len(by_values) == len(rows)  # the values name a row
    return [{**r, "share": 1 - (high_ratio if r["temp"] > 35 else ratio)}
            for key, r in by_values.items() if key in picked]


def window_oracle(kept: list[dict]) -> dict[tuple, tuple[int, float, bool]]:
    """(window start, sensor) -> (rows, fraction of input reflected, lost input) of every
    window the watermark (the latest kept row's time) has closed, in plain Python: each kept
    row stands for 1/share arrivals."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in kept:
        groups[(r["ts"] - (r["ts"] - shapes.EPOCH) % WINDOW, r["sensor"])].append(r["share"])
    closed_by = max(start for start, _ in groups)
    return {k: (len(s), len(s) / sum(1 / x for x in s), any(x < 1 for x in s))
            for k, s in groups.items() if k[0] < closed_by}


def emitted_windows(got: list[dict]) -> dict[tuple, tuple[int, float, bool]]:
    found = {(r["window_start"], r["sensor"]): (r["n"], r[KEPT], r[LOST]) for r in got}
    assert len(found) == len(got), "a window was emitted twice"
    return found


def test_each_window_says_the_fraction_of_its_input_it_reflects(
        runtime: TaskRuntime, spark: Any, tmp_path: Path) -> None:
    """Semantic drop, 20 % of the rows worth keeping and 50 % of the others shed: every
    window's `kept` is the oracle's n / sum(1/share) of the rows the drop kept, and each is
    marked as having lost input."""
    shed_window_query(runtime, ratio=0.5, high_ratio=0.2)
    got = run_to_sink(runtime, tmp_path, "per_sensor")
    expected = window_oracle(kept_rows(spark, input_rows("sensor", 11, 2000.0, ROWS), 0.5, 0.2))
    emitted = emitted_windows(got)
    assert len(expected) > 20 and set(emitted) == set(expected)
    for key, (n, fraction, lost) in expected.items():
        assert emitted[key][0] == n and emitted[key][2] is lost is True, key
        assert math.isclose(emitted[key][1], fraction, rel_tol=1e-12), (key, emitted[key])
    fractions = {round(v[1], 9) for v in expected.values()}
    assert len(fractions) > 3 and all(0.5 <= f < 1 for f in fractions)  # mixes of both shares


def test_a_window_of_unshed_rows_reads_one(runtime: TaskRuntime, spark: Any,
                                           tmp_path: Path) -> None:
    """The same drop shedding only rows not worth keeping (high_ratio 0) and a filter keeping
    only the rows worth keeping: no window lost input, each reads 1.0, and holds every row."""
    shed_window_query(runtime, ratio=0.5, high_ratio=0.0, only_worth=True)
    got = run_to_sink(runtime, tmp_path, "per_sensor")
    rows = [r for r in kept_rows(spark, input_rows("sensor", 11, 2000.0, ROWS), 0.5, 0.0)
            if r["temp"] > 35]
    expected = window_oracle(rows)
    emitted = emitted_windows(got)
    assert len(expected) > 5
    assert emitted == expected
    assert all(v[1:] == (1.0, False) for v in emitted.values())


def test_stateless_rows_carry_the_product_of_their_drops_shares(runtime: TaskRuntime,
                                                                tmp_path: Path) -> None:
    """Two random drops in series (0.5, then 0.2), a filter and a projection: every row at the
    sink carries (1 - 0.5) * (1 - 0.2), and is a projection of an input row."""
    runtime.generator(op="src", output="src_out", schema=SENSOR, shape="sensor", seed=13,
                      rate=2000.0, limit=2000, start=START)
    runtime.drop(op="d1", input="src_out", output="once", ratio=0.5, seed=1)
    runtime.drop(op="d2", input="once", output="twice", ratio=0.2, seed=2)
    runtime.filter(op="f", input="twice", output="warm", condition="twice.temp > 20")
    runtime.project(op="p", input="warm", output="out",
                    fields=(("sensor", "warm.sensor"), ("t2", "warm.temp * 2")))
    got = run_to_sink(runtime, tmp_path, "out", limit=2000)
    inputs = Counter((r["sensor"], r["temp"] * 2) for r in input_rows("sensor", 13, 2000.0, 2000)
                     if r["temp"] > 20)
    assert 100 < len(got) < 0.5 * sum(inputs.values())
    assert not Counter((r["sensor"], r["t2"]) for r in got) - inputs
    assert {tuple(sorted(r)) for r in got} == {("kept", "sensor", "t2")}
    assert {r[KEPT] for r in got} == {(1 - 0.5) * (1 - 0.2)}


def run_to_sink(rt: TaskRuntime, tmp_path: Path, stream: str, limit: int = ROWS) -> list[dict]:
    out = tmp_path / "windows.jsonl"
    rt.file_sink(op="sink", input=stream, path=str(out))
    assert rt.query is not None
    wait_drained(rt.query, [limit])
    return read_sink(out)
