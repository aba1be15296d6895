"""The DPC scenario's upstreams on hosts of their own (docs/availability.md, "Between network
namespaces"): a1 and a2 each a source process in a network namespace of a
`testkit.netns.NetnsNetwork`, serving its channel over a veth to the downstream tasks in the
caller's namespace; a2's link is cut by taking its bridge port down (packets are dropped, no
connection is reset: the downstream side sees a partition, as between two machines).

Owns the source process (`python -m testkit.dpc_netns ...`, `main`): a product `ChannelWriter`
bound on its host's address that numbers and retains batches of the generator's rows (the
product's `shapes.generate_batch`, the rows `dpc_support.input_rows` computes in plain Python),
paced at `rate` from a start time its parent gives on stdin, one batch per trigger interval,
as a generator task with a channel sink sends them; `SourceHost`, the parent's handle on one;
and `NetnsUpstreams`, the `dpc_support.Upstreams` made of two, and `SelectorUpstreams`, made of
three (a live source and two replicas of one stream, read through a stream selector). It owns
no product behaviour.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Sequence

from testkit.dpc_support import READING_FIELDS, START, TRIGGER_SECONDS, read_channels
from testkit.e2e_support import pythonpath
from testkit.netns import NetnsNetwork
from testkit.waiting import wait_for

log = logging.getLogger("testkit.dpc_netns")
READY = "DPC_SOURCE "  # the prefix of the source process's JSON lines on stdout
HOSTS = ("a1", "a2")  # a1's link stays up, a2's is cut
# `SelectorUpstreams`: a1 as above; a2's stream served by replicas on a2 and a3
SELECTOR_HOSTS = ("a1", "a2", "a3")
SELECTOR_SPOOL = "select:r2"  # the downstream's spool of the replicas (`selector_source`'s op)


# --- the source process ---------------------------------------------------------------------

def due_rows(elapsed: float, rate: float, limit: int) -> int:
    """How many rows a source paced at `rate` from its start has released after `elapsed` s
    (row i is due at i / rate, the offset of its event time from the generator's start)."""
    return max(0, min(limit, math.floor(elapsed * rate) + 1)) if elapsed >= 0 else 0


def _say(**fields: Any) -> None:
    print(READY + json.dumps(fields), flush=True)


def _serve(args: argparse.Namespace) -> None:
    from common.types import Schema
    from executor import shapes
    from executor.channels import ChannelWriter

    schema = Schema.of(*READING_FIELDS)
    wire = shapes.arrow_schema(schema)
    shape, start_us = shapes.shape_named("sensor"), shapes.parse_start(START)
    writer = ChannelWriter(args.channel, wire, bind=args.bind,
                           expected_readers=args.readers.split(","))
    try:
        _say(endpoint=writer.endpoint)
        go = float(sys.stdin.readline().split()[1])  # "go <epoch seconds>"
        sent, tag, seq = 0, 0, 0
        while sent < args.limit:
            time.sleep(max(0.0, go + tag * TRIGGER_SECONDS - time.time()))  # the pace
            # the rows due at the tag's time, not at the wake-up's: two sources of one seed
            # (hot-standby replicas) number the same rows alike
            due = due_rows(tag * TRIGGER_SECONDS, args.rate, args.limit)
            if due > sent:
                batch = shapes.generate_batch(shape, schema, args.seed, start_us, args.rate,
                                              sent, due)
                seq = writer.send(batch, tag)
                sent = due
            tag += 1
        seq = writer.end()  # its stream ends here: a union need not wait for it once gone
        _say(sent=sent, last_seq=seq)
        sys.stdin.readline()  # serve (retained batches, probes) until the parent closes stdin
    finally:
        writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a DPC test's source host (testkit.dpc_netns)")
    parser.add_argument("--channel", required=True)
    parser.add_argument("--bind", required=True, help="tcp://ADDRESS:0 on this host")
    parser.add_argument("--readers", required=True, help="reader ids, comma-separated")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--limit", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _serve(args)
    return 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the writer is closed on the way out


# --- the parent's side ----------------------------------------------------------------------

class SourceHost:
    """One source process in `host`'s namespace, serving `channel` (seed `seed`)."""

    def __init__(self, net: NetnsNetwork, host: str, channel: str, seed: int, rate: float,
                 limit: int, readers: Sequence[str], work_dir: Path) -> None:
        self.host, self.channel = host, channel
        work_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = work_dir / f"source-{host}.log"
        argv = [sys.executable, "-m", "testkit.dpc_netns", "--channel", channel,
                "--bind", f"tcp://{net.address(host)}:0", "--readers", ",".join(readers),
                "--seed", str(seed), "--rate", str(rate), "--limit", str(limit)]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            net.exec_argv(host, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, start_new_session=True, text=True,
            env={**os.environ, "PYTHONPATH": pythonpath()})
        self.said: dict[str, Any] = {}
        self._lines: queue.Queue[dict[str, Any]] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=_read_lines, args=(self.process.stdout, self._lines),
                         daemon=True, name=f"dpc-source-{host}").start()
        self.endpoint: str = self._await("endpoint", 60)

    def _await(self, key: str, timeout: float) -> Any:
        def said() -> bool:
            while not self._lines.empty():
                self.said.update(self._lines.get())
            assert self.process.poll() is None or key in self.said, (
                f"source on {self.host} exited ({self.process.returncode}): {self.log_tail()}")
            return key in self.said

        wait_for(f"the source on {self.host} to say {key}", said, timeout, 0.1, self.log_tail)
        return self.said[key]

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def go(self, at: float) -> None:
        """Start pacing from wall-clock time `at` (seconds since the epoch)."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"go {at!r}\n")
        self.process.stdin.flush()

    def finished(self) -> bool:
        while not self._lines.empty():
            self.said.update(self._lines.get())
        return "last_seq" in self.said

    def last_seq(self, timeout: float) -> int:
        return int(self._await("last_seq", timeout))

    def close(self) -> None:
        """Close its stdin (once it sent everything it closes its writer and exits); SIGTERM it
        if it does not within 2 s (still pacing: a test that failed half-way), SIGKILL its
        session if that does not end it within 10 s."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass
        steps: list[tuple[str, Callable[[], None], float]] = [
            ("", lambda: None, 2.0), ("SIGTERM", self.process.terminate, 10.0),
            ("SIGKILL to its session", lambda: os.killpg(self.process.pid, signal.SIGKILL), 10.0)]
        for what, stop, grace in steps:
            if what:
                log.warning("source on %s did not exit; %s", self.host, what)
            stop()
            try:
                self.process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


def _read_lines(stream: IO[str], into: "queue.Queue[dict[str, Any]]") -> None:
    for line in stream:
        if line.startswith(READY):
            into.put(json.loads(line[len(READY):]))


def _source_hosts(net: NetnsNetwork, tmp_path: Path, rate: float, limit: int,
                  readers: Sequence[str], placed: Sequence[tuple[str, str, int]]
                  ) -> list[SourceHost]:
    """A `SourceHost` per (host, channel, seed) of `placed`, each channel declared for the
    reader tasks `readers`; those started are closed if one fails."""
    from executor.runtime import channel_reader_id

    hosts: list[SourceHost] = []
    try:
        for host, channel, seed in placed:
            hosts.append(SourceHost(
                net, host, channel, seed, rate, limit,
                [channel_reader_id(n, channel) for n in readers], tmp_path / "sources"))
    except BaseException:
        for h in hosts:
            h.close()
        raise
    return hosts


def _go(hosts: Sequence[SourceHost]) -> None:
    at = time.time() + 0.2  # all from the same instant
    for h in hosts:
        h.go(at)


class NetnsUpstreams:
    """`dpc_support.Upstreams` on `net`'s hosts a1 and a2 (a source process each); a2's link is
    cut by taking its bridge port down."""

    def __init__(self, net: NetnsNetwork, tmp_path: Path, rate: float, limit: int,
                 readers: Sequence[str]) -> None:
        self.net, self.rate, self.limit = net, rate, limit
        self.hosts = _source_hosts(net, tmp_path, rate, limit, readers,
                                   [(host, f"{host}.raw", seed)
                                    for seed, host in enumerate(HOSTS, start=1)])
        self.endpoints = {h.channel: h.endpoint for h in self.hosts}

    @classmethod
    def on(cls, net: NetnsNetwork) -> Any:
        """The `dpc_support.OpenUpstreams` that places them on `net` (made with hosts a1, a2)."""
        return lambda spark, tmp_path, rate, limit, readers: cls(net, tmp_path, rate, limit,
                                                                 readers)

    def read(self, b: Any, schema: Any) -> None:
        read_channels(b, schema)

    def start(self) -> None:
        _go(self.hosts)

    def producing(self) -> bool:
        return not self.hosts[0].finished()

    def cut(self) -> None:
        self.net.cut("a2")

    def heal(self) -> None:
        self.net.restore("a2")

    def last_seqs(self) -> dict[str, int]:
        timeout = self.limit / self.rate + 60
        return {h.channel: h.last_seq(timeout) for h in self.hosts}

    def close(self) -> None:
        for h in self.hosts:
            h.close()


class SelectorUpstreams:
    """`dpc_support.Upstreams` with a hot-standby stream (issue 34's selector case): a1 serves
    a1.raw (seed 1) on host a1, and the second input is one stream of seed 2 served by two
    replicas, on a2 (a2.raw) and a3 (a3.raw), which number the same rows alike; a downstream
    task reads it through a stream selector as r2 (`selector_source`). `cut` first takes down
    alone, for `single_cut_seconds`, the port of the replica the selector reads (`reading()`,
    a replica's channel; the selector must go on with the other: nothing may wait), then the
    other's too (the stream is cut); `heal` sets both up. `on_phase("one cut")` and
    `on_phase("both cut")` are called as each cut begins, for the test to see the sinks
    then."""

    def __init__(self, net: NetnsNetwork, tmp_path: Path, rate: float, limit: int,
                 readers: Sequence[str], single_cut_seconds: float,
                 reading: Callable[[], str], on_phase: Callable[[str], None]) -> None:
        self.net, self.rate, self.limit = net, rate, limit
        self.single_cut_seconds, self.on_phase = single_cut_seconds, on_phase
        self.reading = reading
        self.hosts = _source_hosts(net, tmp_path, rate, limit, readers,
                                   [("a1", "a1.raw", 1), ("a2", "a2.raw", 2),
                                    ("a3", "a3.raw", 2)])
        self.endpoints = {h.channel: h.endpoint for h in self.hosts}

    @classmethod
    def on(cls, net: NetnsNetwork, single_cut_seconds: float, reading: Callable[[], str],
           on_phase: Callable[[str], None]) -> Any:
        """The `dpc_support.OpenUpstreams` that places them on `net` (made with
        SELECTOR_HOSTS)."""
        return lambda spark, tmp_path, rate, limit, readers: cls(
            net, tmp_path, rate, limit, readers, single_cut_seconds, reading, on_phase)

    def read(self, b: Any, schema: Any) -> None:
        b.channel_source(output="r1", schema=schema, channel="a1.raw")
        b.selector_source(output="r2", schema=schema, channels=("a2.raw", "a3.raw"))

    def start(self) -> None:
        _go(self.hosts)

    def producing(self) -> bool:
        return not self.hosts[0].finished()

    def cut(self) -> None:
        first = self.reading().removesuffix(".raw")
        assert first in ("a2", "a3"), first
        self.on_phase("one cut")
        self.net.cut(first)
        started = time.monotonic()
        wait_for("the single replica's cut to end",
                 lambda: time.monotonic() - started >= self.single_cut_seconds,
                 self.single_cut_seconds + 30, 0.2)
        self.on_phase("both cut")
        self.net.cut("a3" if first == "a2" else "a2")

    def heal(self) -> None:
        for host in ("a2", "a3"):
            self.net.restore(host)

    def last_seqs(self) -> dict[str, int]:
        """a1.raw's last seq, and the replicated stream's under the selector's spool name
        (both replicas numbered the same rows alike: checked)."""
        timeout = self.limit / self.rate + 60
        a1, a2, a3 = (h.last_seq(timeout) for h in self.hosts)
        assert a2 == a3, f"the replicas numbered their rows differently: {a2} vs {a3}"
        return {"a1.raw": a1, SELECTOR_SPOOL: a2}

    def close(self) -> None:
        for h in self.hosts:
            h.close()


if __name__ == "__main__":
    sys.exit(main())
