"""The DPC marks-across-a-channel scenario (docs/availability.md, "Marks across channels"):
upstream tasks a1 and a2 (paced generators) feed channels a1.raw and a2.raw; task "u" unions
them (a2's through `dpc_support.LinkProxy`) with max-delay and serves the union on the marked
channel u.out; task "f" reads u.out, keeps the rows with temp > THRESHOLD (a filter, then a
projection) and writes a file sink. `marked_cut_run` cuts a2's link once f's first rows are
out, heals it after `cut_seconds`, and returns what f's sink holds once everything drained;
`oracle` is the plain-Python filter over all input."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from testkit.dpc_support import (START, LinkProxy, _first_int, _sources_up, _wait_settled,
                                 input_rows)
from testkit.e2e_support import read_sink
from testkit.waiting import wait_for

THRESHOLD = 25.0
CONDITION = f"temp > {THRESHOLD}"

Key = tuple[str, datetime, float]


def oracle(rate: float, limit: int) -> list[Key]:
    """Every input row of a1 and a2 that passes the filter, sorted."""
    rows = input_rows(1, rate, limit) + input_rows(2, rate, limit)
    return sorted((r["sensor"], r["ts"], r["temp"]) for r in rows if r["temp"] > THRESHOLD)


def keys(rows: list[dict[str, Any]]) -> list[Key]:
    return sorted((r["sensor"], r["ts"], r["temp"]) for r in rows)


@dataclass
class MarkedRun:
    rows: list[dict[str, Any]]  # f's sink once every input drained
    at_heal: list[dict[str, Any]]  # f's sink when the link healed
    first_tentative: float  # seconds from the cut to f's first tentative row
    reconcile: float  # seconds u's reconcile took


def _upstream_task(spark: Any, tmp_path: Path, hub: Any, proxy: LinkProxy, schema: Any,
                   max_delay: str) -> Any:
    from executor.runtime import TaskRuntime

    u = TaskRuntime(spark, query_id="q", task_id="u", checkpoint_dir=str(tmp_path / "u"),
                    channels=hub, trigger_seconds=0.5, endpoints={"a2.raw": proxy.endpoint})
    u.channel_source(output="r1", schema=schema, channel="a1.raw")
    u.channel_source(output="r2", schema=schema, channel="a2.raw")
    u.union(op="u", inputs=("r1", "r2"), output="both", max_delay=max_delay)
    u.channel_sink(input="both", channel="u.out", readers=("f",), marks=True)
    assert u.dpc is not None, "the union's max-delay was not applied"
    _sources_up(u)
    return u


def _downstream_task(spark: Any, tmp_path: Path, hub: Any, schema: Any) -> Any:
    from executor.runtime import TaskRuntime

    f = TaskRuntime(spark, query_id="q", task_id="f", checkpoint_dir=str(tmp_path / "f"),
                    channels=hub, trigger_seconds=0.5)
    f.channel_source(output="in", schema=schema, channel="u.out", marks=True)
    f.filter(op="hot", input="in", output="hot", condition=CONDITION)
    f.project(op="p", input="hot", output="out",
              fields=(("sensor", "sensor"), ("ts", "ts"), ("temp", "temp")))
    f.file_sink(op="sink", input="out", path=str(tmp_path / "f.jsonl"))
    _sources_up(f)
    return f


def marked_cut_run(spark: Any, tmp_path: Path, *, rate: float, limit: int,
                   cut_seconds: float, max_delay: str) -> MarkedRun:
    from common import dpc_view
    from common.types import Schema
    from executor.runtime import ChannelHub, TaskRuntime, channel_reader_id
    from executor.shapes import arrow_schema
    from executor.spool_source import finished_seq

    reading = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"))
    hub = ChannelHub()
    writers = {ch: hub.writer(ch, arrow_schema(reading),
                              expected_readers=[channel_reader_id("u", ch)])
               for ch in ("a1.raw", "a2.raw")}
    proxy = LinkProxy(hub.endpoint("a2.raw") or "")
    out = tmp_path / "f.jsonl"
    ups = [TaskRuntime(spark, query_id="q", task_id=f"a{i}", checkpoint_dir=str(tmp_path / f"a{i}"),
                       channels=hub, trigger_seconds=0.5) for i in (1, 2)]
    tasks: list[Any] = []
    try:
        u = _upstream_task(spark, tmp_path, hub, proxy, reading, max_delay)
        tasks.append(u)
        f = _downstream_task(spark, tmp_path, hub, reading)
        tasks.append(f)
        for i, rt in enumerate(ups, start=1):
            rt.generator(op="src", output="raw", schema=reading, shape="sensor", seed=i,
                         rate=rate, limit=limit, start=START)
            rt.channel_sink(input="raw", channel=f"a{i}.raw")
        dpc = u.dpc
        wait_for("f's first rows", lambda: bool(read_sink(out)), 90)
        progress = ups[0].query.lastProgress
        assert progress and _first_int(progress["sources"][0]["endOffset"]) != limit, \
            "the input ended before the cut"
        proxy.cut()
        cut_at = time.monotonic()
        wait_for("tentative rows in f's sink during the cut",
                 lambda: any(dpc_view.TENTATIVE in r for r in read_sink(out)), 60)
        first = time.monotonic() - cut_at
        wait_for("the cut's end", lambda: time.monotonic() - cut_at >= cut_seconds,
                 cut_seconds + 30, 0.5)
        at_heal = read_sink(out)
        proxy.heal()
        wait_for("u's reconcile", lambda: bool(dpc.reconcile_seconds), 180)
        for rt in ups:
            _wait_settled(rt.query, lambda q=rt.query: _first_int(
                q.lastProgress["sources"][0]["endOffset"]) == limit, rt.task_id)
        lasts = {ch: w.retained_range()[1] for ch, w in writers.items()}
        u_dir = str(Path(u.checkpoint_dir) / "spark")
        _wait_settled(u.query, lambda: all((finished_seq(u_dir, ch) or 0) >= last
                                           for ch, last in lasts.items()), "u")
        u_last = u.sink.inner.writer.retained_range()[1]
        f_dir = str(Path(f.checkpoint_dir) / "spark")
        _wait_settled(f.query, lambda: (finished_seq(f_dir, "u.out") or 0) >= u_last, "f")
        return MarkedRun(read_sink(out), at_heal, first, dpc.reconcile_seconds[0])
    finally:
        for rt in (*tasks, *ups):
            rt.stop()
        proxy.close()
        hub.close()
