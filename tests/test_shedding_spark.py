"""Spark layer: the drop operator (load shedding, docs/load.md) on a real streaming query,
checked against the same input computed in plain Python: idle it passes every row; a semantic
drop keeps only rows of the input, drops every row failing its keep condition at ratio 1 and
about `high_ratio` of the others; and the rows it keeps are exactly those its seeded row hash
picks on the same rows in a batch query (so a replayed micro-batch drops the same rows); every
dropped row is counted in the progress reports' observed metrics."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from common.types import Schema
from executor.runtime import TaskRuntime, drop_keeps
from executor.task_runner import InputCounter
from test_runtime_support import START, input_rows, read_sink, wait_drained

pytestmark = pytest.mark.spark

SENSOR = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"),
                   ("humidity", "double"))
ROWS = 4000


def key_of(row: dict) -> tuple:
    return tuple(sorted(row.items()))


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
    got = Counter(key_of(r) for r in read_sink(out))
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
    assert Counter(key_of(r) for r in read_sink(out)) == \
        Counter(key_of(r) for r in input_rows("sensor", 3, 2000.0, 1000))
