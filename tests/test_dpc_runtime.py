"""Borealis DPC in the Spark layer with real ZeroMQ channels (docs/availability.md): tasks
"dpc" (max-delay) and "plain" (none) each union two channels (tasks a1 and a2, one session) and
count per sensor and second; the link from a2 to both goes through a TCP proxy the test cuts
and heals. With max-delay, results keep coming during the cut, marked tentative, and after the
heal the sink's stable view equals a plain-Python oracle over all input; without it nothing is
marked."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from common import dpc_view
from common.dpc import Mode
from executor.runtime import ChannelHub, TaskRuntime, channel_reader_id
from executor.spool_receiver import PROBE_SECONDS, PROBE_TIMEOUT
from test_runtime_support import START, input_rows, read_sink, wait_drained, wait_for

pytestmark = pytest.mark.spark

RATE, LIMIT, MAX_DELAY = 200.0, 3600, 2.0  # 18 s of input per upstream task
CUT_SECONDS = 6.0
WATERMARK = timedelta(seconds=4)


class LinkProxy:
    """A TCP forwarder on 127.0.0.1 to `target` ("tcp://host:port"); `cut` stops every byte
    (connections stay open, new ones wait: a partition, not a reset), `heal` lets them flow."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.up = threading.Event()
        self.up.set()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.up.clear()

    def heal(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.closed.set()
        self.up.set()
        for s in [self.listener, *self.sockets]:
            s.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            self.sockets.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        while not self.up.wait(0.2):
            if self.closed.is_set():
                return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            conn.close()
            return
        self.sockets.append(upstream)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.closed.is_set():
                if not self.up.wait(0.2):
                    continue
                if not select.select([src], [], [], 0.2)[0]:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                while not self.up.wait(0.2):  # read before the cut: held with the rest
                    if self.closed.is_set():
                        return
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _oracle() -> dict[tuple[Any, str], tuple[int, float]]:
    """(window start, sensor) -> (count, sum of temp) over both tasks' input, for the windows
    the final watermark (largest time minus WATERMARK) closes."""
    rows = input_rows("sensor", 1, RATE, LIMIT) + input_rows("sensor", 2, RATE, LIMIT)
    groups: dict[tuple[Any, str], list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["ts"].replace(microsecond=0), r["sensor"])].append(r["temp"])
    closed_by = max(r["ts"] for r in rows) - WATERMARK
    return {k: (len(v), sum(v)) for k, v in groups.items()
            if k[0] + timedelta(seconds=1) <= closed_by}


def _view(rows: list[dict[str, Any]]) -> dict[tuple[Any, str], tuple[int, float]]:
    out = {}
    for r in rows:
        key = (r["window_start"], r["sensor"])
        assert key not in out, f"window {key} twice in the stable view"
        out[key] = (r["n"], r["total"])
    return out


def _same(got: dict, expected: dict) -> bool:
    return got.keys() == expected.keys() and all(
        got[k][0] == expected[k][0] and got[k][1] == pytest.approx(expected[k][1], rel=1e-9)
        for k in expected)


def _read(path: Path) -> list[dict[str, Any]]:
    return read_sink(path)  # whole lines only: a batch being appended is read next time


@dataclass
class CutRun:
    rows: list[dict[str, Any]]  # the sink's records after both inputs drained
    tentative: list[dict[str, Any]]  # the tentative rows written before the heal
    before_heal: int  # sink records at the heal
    first_tentative: float | None = None  # seconds from the cut to the first tentative row
    reconcile: float | None = None  # seconds the reconcile took


def _wait_drained(b: TaskRuntime, writers: dict[str, Any]) -> None:
    """Until b's query has finished every batch both writers numbered and, twice 1 s apart,
    has nothing more to do (its last windows closed by a no-data batch)."""
    from executor.spool_source import finished_seq

    spark_dir = str(Path(b.checkpoint_dir) / "spark")
    lasts = {name: w.retained_range()[1] for name, w in writers.items()}
    streak = 0

    def settled() -> bool:
        nonlocal streak
        query = b.query
        assert query is not None and query.exception() is None, query and query.exception()
        done = all((finished_seq(spark_dir, n) or 0) >= last for n, last in lasts.items())
        progress, status = query.lastProgress, query.status
        idle = bool(progress) and progress["numInputRows"] == 0 and \
            not status["isDataAvailable"] and not status["isTriggerActive"]
        streak = streak + 1 if done and idle else 0
        return streak >= 2

    wait_for(settled, 90, f"{b.task_id} to finish both inputs", step=1.0)


def _downstream(spark: Any, tmp_path: Path, hub: ChannelHub, name: str, proxy: LinkProxy,
                schema: Any, max_delay: str | None) -> TaskRuntime:
    """Task `name`: union of a1.raw and a2.raw (a2's through the proxy), per-second counts per
    sensor with a 4 s watermark, file sink <name>.jsonl."""
    b = TaskRuntime(spark, query_id="q", task_id=name, checkpoint_dir=str(tmp_path / name),
                    channels=hub, trigger_seconds=0.5, endpoints={"a2.raw": proxy.endpoint})
    b.channel_source(output="r1", schema=schema, channel="a1.raw")
    b.channel_source(output="r2", schema=schema, channel="a2.raw")
    b.union(op="u", inputs=("r1", "r2"), output="both", max_delay=max_delay)
    b.window_aggregate(op="w", input="both", output="win", time="ts", window="1 seconds",
                       slide=None, watermark="4 seconds", group_by=("sensor",),
                       aggregates=(("n", "count", None), ("total", "sum", "temp")))
    b.file_sink(op="sink", input="win", path=str(tmp_path / f"{name}.jsonl"))
    assert (b.dpc is not None) == (max_delay is not None)
    return b


def _cut_run(spark: Any, tmp_path: Path) -> tuple[CutRun, CutRun]:
    """a1, a2 -> "dpc" (with max-delay) and "plain" (without); the a2 link of both cut for
    CUT_SECONDS once both have written their first windows, then healed; returns once every
    input is drained, what each sink holds."""
    from common.types import Schema
    from executor.shapes import arrow_schema

    reading = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"))
    hub = ChannelHub()
    names = ("dpc", "plain")
    writers = {ch: hub.writer(ch, arrow_schema(reading),
                              expected_readers=[channel_reader_id(n, ch) for n in names])
               for ch in ("a1.raw", "a2.raw")}
    proxy = LinkProxy(hub.endpoint("a2.raw") or "")
    outs = [tmp_path / f"{n}.jsonl" for n in names]
    ups = [TaskRuntime(spark, query_id="q", task_id=f"a{i}", checkpoint_dir=str(tmp_path / f"a{i}"),
                       channels=hub, trigger_seconds=0.5) for i in (1, 2)]
    downs: list[TaskRuntime] = []
    try:
        for i, rt in enumerate(ups, start=1):
            rt.generator(op="src", output="raw", schema=reading, shape="sensor", seed=i,
                         rate=RATE, limit=LIMIT, start=START)
            rt.channel_sink(input="raw", channel=f"a{i}.raw")
        for name, delay in zip(names, (f"{int(MAX_DELAY)} seconds", None)):
            downs.append(_downstream(spark, tmp_path, hub, name, proxy, reading, delay))
        dpc = downs[0].dpc
        assert dpc is not None
        wait_for(lambda: all(len(_read(o)) > 0 for o in outs), 90, "the first windows")
        assert ups[0].query is not None and ups[0].query.lastProgress is not None
        assert str(LIMIT) not in str(ups[0].query.lastProgress["sources"][0]["endOffset"]), \
            "the input ended before the cut"
        proxy.cut()
        cut_at = time.monotonic()
        wait_for(lambda: any(dpc_view.TENTATIVE in r for r in _read(outs[0])), 60,
                 "tentative windows during the cut")
        first = time.monotonic() - cut_at
        assert dpc.mode is Mode.TENTATIVE
        wait_for(lambda: time.monotonic() - cut_at >= CUT_SECONDS, 30, "the cut's end", step=0.5)
        at_heal = [_read(o) for o in outs]
        proxy.heal()
        healed = time.monotonic()
        wait_for(lambda: bool(dpc.reconcile_seconds), 120, "the reconcile")
        assert dpc.mode is Mode.STABLE
        for rt in ups:
            assert rt.query is not None
            wait_drained(rt.query, [LIMIT], timeout=90)
        for b in downs:
            _wait_drained(b, writers)
        print(f"drained {time.monotonic() - healed:.1f} s after the heal")
        runs = tuple(CutRun(_read(o), [r for r in h if dpc_view.TENTATIVE in r], len(h))
                     for o, h in zip(outs, at_heal))
        runs[0].first_tentative, runs[0].reconcile = first, dpc.reconcile_seconds[0]
        return runs[0], runs[1]
    finally:
        for rt in (*downs, *ups):
            rt.stop()
        proxy.close()
        hub.close()


def test_a_cut_input_goes_tentative_and_is_corrected_with_max_delay_unmarked_without(
        spark: Any, tmp_path: Path) -> None:
    """With max-delay: tentative rows within max-delay (+ the probe and a batch), and after
    the heal a stable view equal to the oracle. Without it (today's union, the same cut): no
    waiting, no mark; its window's watermark follows a1 through the cut, so a2's rows that
    come back behind it are dropped as late: windows may lack them (counted and printed),
    never hold more than the oracle."""
    run, plain = _cut_run(spark, tmp_path)
    expected = _oracle()
    assert run.first_tentative is not None and run.reconcile is not None
    print(f"first tentative row {run.first_tentative:.2f} s after the cut (goal: max-delay "
          f"{MAX_DELAY} s + probe {PROBE_SECONDS + PROBE_TIMEOUT} s + a micro-batch); "
          f"reconciled in {run.reconcile:.2f} s after a {CUT_SECONDS} s cut; "
          f"{len(run.tentative)} tentative rows replaced")
    assert run.tentative, "no tentative row was written during the cut"
    assert run.first_tentative <= MAX_DELAY + PROBE_SECONDS + PROBE_TIMEOUT + 5.0
    assert _same(_view(dpc_view.stable_view(run.rows)), expected)
    assert dpc_view.open_episodes(run.rows) == []
    assert [r[dpc_view.REVISION] for r in run.rows if dpc_view.REVISION in r] == [1]

    assert not any(dpc_view.TENTATIVE in r or dpc_view.REVISION in r for r in plain.rows)
    assert len(plain.rows) > plain.before_heal, "no results after the heal"
    got = _view(plain.rows)
    assert got.keys() <= expected.keys()
    assert all(got[k][0] <= expected[k][0] for k in got)
    short = sum(expected[k][0] - got[k][0] for k in got) + sum(
        expected[k][0] for k in expected.keys() - got.keys())
    print(f"without max-delay: {short} of {2 * LIMIT} input rows missing from the closed "
          f"windows ({len(expected.keys() - got.keys())} windows never written)")
