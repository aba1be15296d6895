"""Borealis DPC in the Spark layer with real ZeroMQ channels (docs/availability.md): task b
unions two channels (tasks a1 and a2, one session) and counts per sensor and second; the link
from a2 to b goes through a TCP proxy the test cuts and heals. With max-delay, results keep
coming during the cut, marked tentative, and after the heal the sink's stable view equals a
plain-Python oracle over all input."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from common import dpc_view
from common.dpc import Mode
from executor.runtime import ChannelHub, TaskRuntime, channel_reader_id
from test_runtime_support import START, input_rows, read_sink, wait_drained, wait_for

pytestmark = pytest.mark.spark

RATE, LIMIT, MAX_DELAY = 200.0, 4400, 2.0  # 22 s of input per upstream task
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


def test_a_cut_input_goes_tentative_after_max_delay_and_is_corrected_on_heal(
        spark: Any, tmp_path: Path) -> None:
    from common.types import Schema
    from executor.shapes import arrow_schema

    reading = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"))
    hub = ChannelHub()
    for name in ("a1.raw", "a2.raw"):
        hub.writer(name, arrow_schema(reading), expected_readers=[channel_reader_id("b", name)])
    proxy = LinkProxy(hub.endpoint("a2.raw") or "")
    out = tmp_path / "b.jsonl"
    ups = [TaskRuntime(spark, query_id="q", task_id=f"a{i}", checkpoint_dir=str(tmp_path / f"a{i}"),
                       channels=hub, trigger_seconds=0.5) for i in (1, 2)]
    b = TaskRuntime(spark, query_id="q", task_id="b", checkpoint_dir=str(tmp_path / "b"),
                    channels=hub, trigger_seconds=0.5, endpoints={"a2.raw": proxy.endpoint})
    try:
        for i, rt in enumerate(ups, start=1):
            rt.generator(op="src", output="raw", schema=reading, shape="sensor", seed=i,
                         rate=RATE, limit=LIMIT, start=START)
            rt.channel_sink(input="raw", channel=f"a{i}.raw")
        b.channel_source(output="r1", schema=reading, channel="a1.raw")
        b.channel_source(output="r2", schema=reading, channel="a2.raw")
        b.union(op="u", inputs=("r1", "r2"), output="both", max_delay=f"{int(MAX_DELAY)} seconds")
        b.window_aggregate(op="w", input="both", output="win", time="ts", window="1 seconds",
                           slide=None, watermark="4 seconds", group_by=("sensor",),
                           aggregates=(("n", "count", None), ("total", "sum", "temp")))
        b.file_sink(op="sink", input="win", path=str(out))
        assert b.dpc is not None
        wait_for(lambda: len(_read(out)) > 0, 90, "b's first stable windows")

        proxy.cut()
        cut_at = time.monotonic()
        wait_for(lambda: any(dpc_view.TENTATIVE in r for r in _read(out)), 60,
                 "tentative windows during the cut")
        first_tentative = time.monotonic() - cut_at
        print(f"first tentative row {first_tentative:.2f} s after the cut "
              f"(goal: max-delay {MAX_DELAY} s + a micro-batch)")
        assert b.dpc.mode is Mode.TENTATIVE
        wait_for(lambda: time.monotonic() - cut_at >= 8.0, 30, "an 8 s cut", step=0.5)
        tentative = [r for r in _read(out) if dpc_view.TENTATIVE in r]
        proxy.heal()
        wait_for(lambda: bool(b.dpc and b.dpc.reconcile_seconds), 120, "the reconcile")
        print(f"reconciled in {b.dpc.reconcile_seconds[0]:.2f} s; {len(tentative)} tentative "
              f"rows replaced")
        assert b.dpc.mode is Mode.STABLE
        for rt in ups:
            assert rt.query is not None
            wait_drained(rt.query, [LIMIT], timeout=90)
        expected = _oracle()
        wait_for(lambda: _same(_view(dpc_view.stable_view(_read(out))), expected), 90,
                 "the stable view to equal the oracle")
        rows = _read(out)
        assert dpc_view.open_episodes(rows) == []
        assert any(dpc_view.REVISION in r for r in rows)
        assert tentative, "no tentative row was written during the cut"
    finally:
        for rt in (b, *ups):
            rt.stop()
        proxy.close()
        hub.close()
