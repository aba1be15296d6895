"""Spark layer: the example examples/tick-shape.xml (the paper's tick-shaped pattern AB+CD+ per
stock symbol), checked by the compiler, run as a real streaming query under the TaskRunner with
the matchers in Spark's state store; the query is SIGKILLed mid-stream (its Python source
runner) and restarted from its checkpoint. The matches in its exactly-once file sink are
compared with the independent backtracking matcher (tests/cep_oracle.py) over the generator's
rows computed in plain Python, with the tick conditions and the measures written here in
Python: no match lost, none twice, none different. Then the plan the pattern-partitioning rule
makes of it (two instances reading every row, each with its share of the partial matches, as
two queries, and the union of their matches) is checked against the same matcher with
skip-to-next-row; and so is the plan the pattern-pipelining rule makes of it (three stages, as
three queries, each reading what the one before wrote)."""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from compiler.expr import pattern as pt
from compiler.spec import load_spec
from compiler.validate import check_or_raise
from testkit.spark_processes import jvm_pid, program_runner, source_runner_pids
from tests import cep_oracle
from test_runtime_support import START, input_rows, read_sink, wait_drained, wait_for

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tick-shape.xml"
RATE, LIMIT, SEED = 60.0, 1800, 7  # 30 s of ticks: the kill lands mid-stream; 80 decided
# The tests that kill nothing pace their ticks ten times faster (a control parameter: the rows'
# event times stay RATE's, and so does every match): their 15 s of ticks come in 1.5 s. The
# kill test switches to it once its kill is behind it.
UNPACED = {"ticks": {"rate": RATE * 10}}
WITHIN = timedelta(seconds=1)  # shorter than the example's 30 s, so 6 s of ticks decide most
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _first(rows: list[dict], labels: list[str], var: str) -> float | None:
    return next((r["price"] for r, v in zip(rows, labels) if v == var), None)


def _rising(rows: list[dict]) -> bool:
    return len(rows) > 1 and rows[-1]["price"] > rows[-2]["price"]


TICK = {
    "B": lambda rows, lb: len(rows) > 1 and rows[-1]["price"] < rows[-2]["price"],
    "C": lambda rows, lb: _rising(rows) and rows[-1]["price"] < _first(rows, lb, "A"),
    "D": lambda rows, lb: _rising(rows) and rows[-1]["price"] > _first(rows, lb, "A"),
}


def _expected(rows: list[dict], within_us: int, skip_to_next: bool = False
              ) -> dict[str, list[dict]]:
    by_symbol: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_symbol[r["symbol"]].append({**r, "t": (r["ts"] - EPOCH) // timedelta(microseconds=1)})
    tree = pt.parse_pattern("A B+ C D+")
    out: dict[str, list[dict]] = {}
    for symbol, own in by_symbol.items():
        own.sort(key=lambda r: r["t"])
        out[symbol] = []
        for i, labels in cep_oracle.all_matches(tree, own, TICK, within_us, "t", skip_to_next):
            match = own[i:i + len(labels)]
            of = lambda v: [r for r, lb in zip(match, labels) if lb == v]  # noqa: E731
            out[symbol].append({
                "symbol": symbol, "start": of("A")[0]["ts"], "finish": of("D")[-1]["ts"],
                "open": of("A")[0]["price"], "bottom": min(r["price"] for r in of("B")),
                "top": max(r["price"] for r in of("D")), "falls": len(of("B")),
                "rises": len(of("D"))})
    return out


def _program(out: Path) -> str:
    """A task program: the example's pattern operator (its parameters as the compiler checked
    them) over a finite stock generator, with a shorter time bound, to a file sink."""
    graph = check_or_raise(load_spec(str(EXAMPLE)))
    params = dict(graph.node("tick").params)
    assert params["pattern"] == "A B+ C D+" and params["partition-by"] == ("symbol",)
    schema = [(f.name, f.type.value) for f in graph.stream("stock").schema]
    return f"""
from common.types import Schema
def build(rt):
    rt.generator(op="ticks", output="stock", schema=Schema.of(*{schema!r}), shape="stock",
                 seed={SEED}, rate={RATE}, limit={LIMIT}, start={START!r})
    rt.pattern(op="tick", input="stock", output="shapes", time="ts",
               partition_by={params["partition-by"]!r}, pattern={params["pattern"]!r},
               within="1 seconds", watermark={"1 seconds"!r}, defines={params["defines"]!r},
               measures={params["measures"]!r}, max_partial={params["max-partial-matches"]!r})
    rt.file_sink(op="sink", input="shapes", path={str(out)!r})
"""


def test_tick_shape_example_on_spark_killed_mid_stream_equals_the_backtracking_matcher(
        spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "shapes.jsonl"
    program = tmp_path / "program.py"
    program.write_text(_program(out), encoding="utf-8")
    runner = program_runner(spark, program, "tick", tmp_path / "ck")
    jvm = jvm_pid(spark)
    try:
        runner.start()
        wait_for(lambda: out.exists() and out.stat().st_size > 0, 90, "first matches")
        progress = runner.runtime.query.lastProgress  # type: ignore[union-attr]
        assert str(LIMIT) not in str(progress["sources"][0]["endOffset"]), \
            "too late to kill mid-stream"
        victims = source_runner_pids(jvm)
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        wait_for(lambda: runner.status().restarts >= 1 and runner.status().state == "running",
                 60, "a restart")
        # the kill is behind: the rest of the ticks come unpaced (as `hurry` ends a cluster
        # test: a control tuple's rate, applied at a batch boundary by rebuilding the query
        # from its checkpoint; the rows' event times stay RATE's)
        runner.reconfigure(1, UNPACED)
        assert runner.runtime is not None and runner.runtime.query is not None
        wait_drained(runner.runtime.query, [LIMIT], timeout=240.0)
    finally:
        runner.stop()
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


def _instance_program(out: Path, limit: int, share: int) -> str:
    """One instance of the rewritten plan as its generated program calls it: every row, matches
    started at its share of them; the generator stands for the multicast channel (it gives every
    instance the same rows)."""
    graph = check_or_raise(load_spec(str(EXAMPLE)))
    params = dict(graph.node("tick").params)
    schema = [(f.name, f.type.value) for f in graph.stream("stock").schema]
    return f"""
from common.types import Schema
def build(rt):
    rt.generator(op="ticks", output="stock", schema=Schema.of(*{schema!r}), shape="stock",
                 seed={SEED}, rate={RATE}, limit={limit}, start={START!r})
    rt.pattern(op="tick_{share}", input="stock", output="shapes", time="ts",
               partition_by=("symbol",), pattern={params["pattern"]!r}, within="1 seconds",
               watermark="1 seconds", defines={params["defines"]!r},
               measures={params["measures"]!r}, max_partial=100000,
               after_match="skip-to-next-row", share=({share}, 2))
    rt.file_sink(op="sink", input="shapes", path={str(out)!r})
"""


def test_the_partitioned_tick_pattern_on_spark_equals_the_matcher_with_skip_to_next_row(
        spark: Any, tmp_path: Path) -> None:
    """Two instances, each its own streaming query in the shared session (as the rule's two
    tasks), their sinks' union as the merger: nothing twice, nothing the matcher does not find,
    nothing decided missing."""
    limit = 900  # 15 s of ticks (in event time; UNPACED: they come in 1.5 s)
    runners, outs = [], []
    for share in (1, 2):
        outs.append(tmp_path / f"shapes_{share}.jsonl")
        program = tmp_path / f"program_{share}.py"
        program.write_text(_instance_program(outs[-1], limit, share), encoding="utf-8")
        runners.append(program_runner(spark, program, f"tick_{share}", tmp_path / f"ck{share}",
                                      max_restarts=0, params=UNPACED))
    try:
        for runner in runners:
            runner.start()
        for runner in runners:
            wait_for(lambda: runner.runtime is not None and runner.runtime.query is not None,
                     90, "the query")
            wait_drained(runner.runtime.query, [limit], timeout=240.0)  # type: ignore
    finally:
        for runner in runners:
            runner.stop()
    parts = [read_sink(out) for out in outs]
    assert all(parts), "an instance found nothing"
    _assert_the_next_row_matchers(parts[0] + parts[1], limit)


def _assert_the_next_row_matchers(got: list[dict], limit: int) -> None:
    """`got` holds no match twice, none the backtracking matcher (skip-to-next-row) does not
    find over the generator's first `limit` rows, and every match it decides before the final
    watermark."""
    rows = input_rows("stock", SEED, RATE, limit)
    expected = _expected(rows, WITHIN // timedelta(microseconds=1), skip_to_next=True)
    final_watermark = max(r["ts"] for r in rows) - timedelta(seconds=1)
    key = lambda m: (m["symbol"], m["start"])  # noqa: E731
    assert len({key(m) for m in got}) == len(got), "a match found twice"
    want = {key(m): m for ms in expected.values() for m in ms}
    assert all(want.get(key(m)) == m for m in got), "a match the matcher does not find"
    sure = [m for m in want.values() if m["start"] + WITHIN < final_watermark]
    assert {key(m) for m in sure} <= {key(m) for m in got}, "a decided match missing"
    assert len(sure) > 25


def _stage_program(source: str, out: Path, stage: int, stages: int) -> str:
    """Stage `stage` of the tick pattern pipelined over `stages`, as its generated program calls
    it; `source` is the call that feeds it (the generator for the first stage, the file the
    stage before wrote for the others, standing for the channel between them)."""
    graph = check_or_raise(load_spec(str(EXAMPLE)))
    params = dict(graph.node("tick").params)
    schema = [(f.name, f.type.value) for f in graph.stream("stock").schema]
    return f"""
from common.types import Schema
from common.pattern_stages import stage_schema
ROWS = Schema.of(*{schema!r})
BETWEEN = stage_schema([ROWS.get("symbol")])
def build(rt):
    {source}
    rt.pattern(op="tick_{stage}", input="in", output="out", time="ts",
               partition_by=("symbol",), pattern={params["pattern"]!r}, within="1 seconds",
               watermark="1 seconds", defines={params["defines"]!r},
               measures={params["measures"]!r}, max_partial=100000,
               after_match="skip-to-next-row", stage=({stage}, {stages}, 2),
               row_schema={"None" if stage == 1 else "ROWS"})
    rt.file_sink(op="sink", input="out", path={str(out)!r})
"""


def test_the_pipelined_tick_pattern_on_spark_equals_the_matcher_with_skip_to_next_row(
        spark: Any, tmp_path: Path) -> None:
    """Three stages, each its own streaming query (as the rule's three tasks), run one after
    the other: each stage's items, written by its exactly-once sink, are what the next stage
    reads. The last stage's matches: nothing twice, nothing the matcher does not find, nothing
    decided missing; and partial matches did move down the chain (the later stages found
    matches)."""
    limit, stages = 900, 3
    files = [tmp_path / f"stage_{i}.jsonl" for i in range(1, stages + 1)]
    for i in range(1, stages + 1):
        source = (f'rt.generator(op="ticks", output="in", schema=ROWS, shape="stock", '
                  f'seed={SEED}, rate={RATE}, limit={limit}, start={START!r})' if i == 1 else
                  f'rt.file_source(op="items", output="in", schema=BETWEEN, '
                  f'path={str(files[i - 2])!r}, format="jsonl", rate=None)')
        program = tmp_path / f"program_{i}.py"
        program.write_text(_stage_program(source, files[i - 1], i, stages), encoding="utf-8")
        runner = program_runner(spark, program, f"tick_{i}", tmp_path / f"ck{i}",
                                max_restarts=0, params=UNPACED if i == 1 else None)
        fed = limit if i == 1 else len(files[i - 2].read_text().splitlines())
        try:
            runner.start()
            wait_for(lambda: runner.runtime is not None and runner.runtime.query is not None,
                     90, "the query")
            wait_drained(runner.runtime.query, [fed], timeout=240.0)  # type: ignore
        finally:
            runner.stop()
        assert files[i - 1].exists(), f"stage {i} wrote nothing"
    items = [read_sink(f) for f in files[:-1]]
    kinds = [{json.loads(r["__elastiq_stage_item"])[0] for r in part} for part in items]
    assert all({"row", "attempt", "tick"} <= k for k in kinds), kinds
    _assert_the_next_row_matchers(read_sink(files[-1]), limit)
