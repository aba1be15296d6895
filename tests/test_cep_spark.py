"""Spark layer: the example examples/tick-shape.xml (the paper's tick-shaped pattern AB+CD+ per
stock symbol) compiled by the compiler and run through a real streaming query with Spark's state
store; the matches in its file sink are compared with the independent backtracking matcher
(tests/cep_oracle.py) over the generator's rows computed in plain Python, with the tick
conditions and the measures written here in Python."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest

from compiler.expr import pattern as pt
from compiler.spec import load_spec
from compiler.validate import check_or_raise
from executor.runtime import TaskRuntime
from tests import cep_oracle
from test_runtime_support import START, input_rows, read_sink, wait_drained

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tick-shape.xml"
RATE, LIMIT, SEED = 1000.0, 6000, 7
WITHIN = timedelta(seconds=1)  # shorter than the example's 30 s, so 6 s of ticks decide most
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def runtime(spark: Any, tmp_path: Path) -> Iterator[TaskRuntime]:
    rt = TaskRuntime(spark, query_id="q", task_id=f"t-{tmp_path.name}",
                     checkpoint_dir=str(tmp_path / "ck"), trigger_seconds=0.5)
    yield rt
    if rt.query is not None and rt.query.isActive:
        rt.query.stop()


def _first(rows: list[dict], labels: list[str], var: str) -> float | None:
    return next((r["price"] for r, v in zip(rows, labels) if v == var), None)


def _rising(rows: list[dict]) -> bool:
    return len(rows) > 1 and rows[-1]["price"] > rows[-2]["price"]


TICK = {
    "B": lambda rows, lb: len(rows) > 1 and rows[-1]["price"] < rows[-2]["price"],
    "C": lambda rows, lb: _rising(rows) and rows[-1]["price"] < _first(rows, lb, "A"),
    "D": lambda rows, lb: _rising(rows) and rows[-1]["price"] > _first(rows, lb, "A"),
}


def _expected(rows: list[dict], within_us: int) -> dict[str, list[dict]]:
    by_symbol: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_symbol[r["symbol"]].append({**r, "t": (r["ts"] - EPOCH) // timedelta(microseconds=1)})
    tree = pt.parse_pattern("A B+ C D+")
    out: dict[str, list[dict]] = {}
    for symbol, own in by_symbol.items():
        own.sort(key=lambda r: r["t"])
        out[symbol] = []
        for i, labels in cep_oracle.all_matches(tree, own, TICK, within_us, "t"):
            match = own[i:i + len(labels)]
            of = lambda v: [r for r, lb in zip(match, labels) if lb == v]  # noqa: E731
            out[symbol].append({
                "symbol": symbol, "start": of("A")[0]["ts"], "finish": of("D")[-1]["ts"],
                "open": of("A")[0]["price"], "bottom": min(r["price"] for r in of("B")),
                "top": max(r["price"] for r in of("D")), "falls": len(of("B")),
                "rises": len(of("D"))})
    return out


def test_tick_shape_example_on_spark_equals_the_backtracking_matcher(
        runtime: TaskRuntime, tmp_path: Path) -> None:
    graph = check_or_raise(load_spec(str(EXAMPLE)))
    node = graph.node("tick")
    params = dict(node.params)
    assert params["pattern"] == "A B+ C D+"
    runtime.generator(op="ticks", output="stock", schema=graph.stream("stock").schema,
                      shape="stock", seed=SEED, rate=RATE, limit=LIMIT, start=START)
    runtime.pattern(op="tick", input="stock", output="shapes", time="ts",
                    partition_by=params["partition-by"], pattern=params["pattern"],
                    within="1 seconds", watermark="1 seconds", defines=params["defines"],
                    measures=params["measures"], max_partial=params["max-partial-matches"])
    out = tmp_path / "out.jsonl"
    runtime.file_sink(op="sink", input="shapes", path=str(out))
    assert runtime.query is not None
    wait_drained(runtime.query, [LIMIT], timeout=240.0)
    got = read_sink(out)
    rows = input_rows("stock", SEED, RATE, LIMIT)
    expected = _expected(rows, WITHIN // timedelta(microseconds=1))
    final_watermark = max(r["ts"] for r in rows) - timedelta(seconds=1)
    got_by: dict[str, list[dict]] = defaultdict(list)
    for row in sorted(got, key=lambda r: r["start"]):
        got_by[row["symbol"]].append(row)
    decided = 0
    for symbol, want in expected.items():
        mine = got_by.get(symbol, [])
        assert mine == want[:len(mine)], symbol  # what was emitted is the oracle's, in order
        sure = [m for m in want if m["start"] + WITHIN < final_watermark]
        assert len(mine) >= len(sure), (symbol, len(mine), len(sure))
        decided += len(sure)
    assert set(got_by) <= set(expected)
    assert decided > 50
