"""One channel hop: throughput and batch latency of `executor.channels` between two processes.

Owns the benchmark only (not a test). One writer here, one reader in a child process, ~100-byte
tuples (int64 id, timestamp, double, 75-byte string) in batches of 1k/10k/100k rows. For each
size it reports, as medians over repeats:
  - tuples/s saturated (first send() call -> last batch decoded in the reader);
  - batch latency p50/p99 under that load (send() call -> reader has the batch decoded), and
    unloaded (batches paced at half the measured capacity);
  - the same bytes over a plain ZeroMQ PUSH/PULL (Arrow IPC encode/decode, no numbering, acks,
    credit or retention; HWM 8 like the channel's credit) and the ratio channel/baseline.
Then a backpressure run: a reader that never acknowledges, the writer's retained bytes and RSS
growth against `max_retained_bytes`. Both processes use CLOCK_MONOTONIC, comparable on one host.
With --durable it measures only the cost of the durable upstream backup: saturated tuples/s of
the channel with the in-memory backup against the same channel with a `log_dir` (a fresh temp
folder per run, no fsync, segments trimmed as the reader acknowledges), and their ratio.

    python benchmarks/channel_hop.py [--repeats 3] [--sizes 1000,10000,100000]
With --curve it measures the cost of authentication and encryption: saturated tuples/s of the
plain-text channel against the same channel over CURVE (the reader's keypair in a 0600 file,
the writer admitting only its key), runs interleaved, and their ratio.

    python benchmarks/channel_hop.py --durable [--repeats 3] [--sizes 1000,10000]
    python benchmarks/channel_hop.py --curve [--repeats 3] [--sizes 1000,10000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.channels.auth import (KeyPair, WriterAuth, reader_auth,  # noqa: E402
                                   write_key_file)
from executor.channels import ChannelFull, ChannelReader, ChannelWriter  # noqa: E402
from executor.wire import decode_table, encode_table  # noqa: E402

SCHEMA = pa.schema(
    [("id", pa.int64()), ("ts", pa.timestamp("us")), ("value", pa.float64()), ("text", pa.string())]
)
TOTAL_ROWS = {1000: 3_000_000, 10_000: 5_000_000, 100_000: 5_000_000}
PACED_BATCHES = 40
DURABLE_ROWS = TOTAL_ROWS  # rows per run in --durable mode too (2 sizes x 2 modes x 3: ~1 min)
CHANNEL = "bench"


def make_table(rows: int) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    text = [f"{i:012d}-" + "x" * 62 for i in range(rows)]  # 75 bytes
    return pa.table(
        {"id": ids, "ts": pa.array(ids * 1000, pa.timestamp("us")),
         "value": ids.astype(np.float64) * 0.5, "text": text},
        schema=SCHEMA,
    )


# --- the reader child ------------------------------------------------------------------------


def run_reader(mode: str, endpoint: str, batches: int, key_file: str = "",
               server_key: str = "") -> None:
    """Child process: receive `batches` batches, print the decode time of each as JSON; over
    CURVE with the keypair in `key_file` when given."""
    recv_ns: list[int] = []
    deadline = time.monotonic() + 120
    if mode == "stuck":  # takes what its credit allows and never acknowledges
        reader = ChannelReader(CHANNEL, "stuck", endpoint, SCHEMA, credit=8)
        reader.subscribe(timeout=10)
        print("ready", flush=True)
        while time.monotonic() < deadline:
            reader.poll(0.2)
        return
    if mode == "channel":
        reader = ChannelReader(CHANNEL, "bench", endpoint, SCHEMA, credit=8,
                               auth=reader_auth(key_file, server_key))
        reader.subscribe(timeout=10)
        print("ready", flush=True)
        while len(recv_ns) < batches and time.monotonic() < deadline:
            got = reader.poll(1.0)
            now = time.monotonic_ns()
            recv_ns.extend(now for _ in got)
            if got:
                reader.ack(got[-1].seq)
        reader.close()
    else:
        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 8)
        sock.connect(endpoint)
        print("ready", flush=True)
        while len(recv_ns) < batches and time.monotonic() < deadline:
            if sock.poll(1000):
                _, body = sock.recv_multipart(copy=False)
                decode_table(body.buffer, SCHEMA)
                recv_ns.append(time.monotonic_ns())
        sock.close(linger=0)
    print(json.dumps(recv_ns), flush=True)


# --- the writer side -------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    tuples_per_s: float
    p50_ms: float
    p99_ms: float


def spawn_reader(mode: str, endpoint: str, batches: int,
                 curve: tuple[str, str] | None = None) -> subprocess.Popen:
    args = [sys.executable, __file__, "--role", "reader", "--mode", mode,
            "--endpoint", endpoint, "--batches", str(batches)]
    if curve is not None:
        args += ["--key-file", curve[0], "--server-key", curve[1]]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError("reader did not start")
    return proc


def finish(proc: subprocess.Popen) -> list[int]:
    out, _ = proc.communicate(timeout=150)
    return json.loads(out.strip().splitlines()[-1])


def summarise(send_ns: list[int], recv_ns: list[int], rows: int) -> Run:
    if len(recv_ns) != len(send_ns):
        raise RuntimeError(f"reader got {len(recv_ns)} of {len(send_ns)} batches")
    lat = sorted((r - s) / 1e6 for s, r in zip(send_ns, recv_ns))
    seconds = (recv_ns[-1] - send_ns[0]) / 1e9
    return Run(rows * len(send_ns) / seconds, lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))])


def channel_run(table: pa.Table, batches: int, gap_s: float = 0.0,
                log_dir: str | None = None, curve: bool = False) -> Run:
    with tempfile.TemporaryDirectory(prefix="channel-hop-keys-") as folder:
        auth, child = None, None
        if curve:
            server, reader = KeyPair.generate(), KeyPair.generate()
            write_key_file(os.path.join(folder, "reader.key"), reader)
            auth = WriterAuth(server, {"bench": reader.public})
            child = (os.path.join(folder, "reader.key"), server.public)
        writer = ChannelWriter(CHANNEL, SCHEMA, expected_readers=("bench",), log_dir=log_dir,
                               auth=auth)
        return _timed_run(writer, spawn_reader("channel", writer.endpoint, batches, child),
                          table, batches, gap_s)


def _timed_run(writer: ChannelWriter, proc: subprocess.Popen, table: pa.Table, batches: int,
               gap_s: float) -> Run:
    send_ns = []
    try:
        for tag in range(batches):
            send_ns.append(time.monotonic_ns())
            writer.send(table, tag, timeout=60)
            if gap_s:
                time.sleep(gap_s)
        return summarise(send_ns, finish(proc), table.num_rows)
    finally:
        proc.kill()
        writer.close()


def pushpull_run(table: pa.Table, batches: int, gap_s: float = 0.0) -> Run:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 8)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    proc = spawn_reader("pushpull", f"tcp://127.0.0.1:{port}", batches)
    send_ns = []
    try:
        for seq in range(batches):
            send_ns.append(time.monotonic_ns())
            sock.send_multipart([seq.to_bytes(8, "big"), encode_table(table)], copy=False)
            if gap_s:
                time.sleep(gap_s)
        return summarise(send_ns, finish(proc), table.num_rows)
    finally:
        proc.kill()
        sock.close(linger=0)


def median_run(runs: list[Run]) -> Run:
    return Run(*(statistics.median(getattr(r, f) for r in runs) for f in ("tuples_per_s", "p50_ms", "p99_ms")))


def bench_size(rows: int, repeats: int) -> None:
    table = make_table(rows)
    batches = TOTAL_ROWS.get(rows, 1_000_000) // rows
    chan = median_run([channel_run(table, batches) for _ in range(repeats)])
    base = median_run([pushpull_run(table, batches) for _ in range(repeats)])
    gap = 2 * rows / chan.tuples_per_s
    paced = median_run([channel_run(table, PACED_BATCHES, gap) for _ in range(repeats)])
    paced_base = median_run([pushpull_run(table, PACED_BATCHES, gap) for _ in range(repeats)])
    ipc = len(encode_table(table))
    print(f"rows/batch={rows:>7} ipc={ipc / rows:.0f} B/row batches={batches}")
    print(f"  channel   {chan.tuples_per_s:>12,.0f} tuples/s  loaded p50 {chan.p50_ms:8.2f} ms"
          f" p99 {chan.p99_ms:8.2f} ms | unloaded p50 {paced.p50_ms:7.2f} ms p99 {paced.p99_ms:7.2f} ms")
    print(f"  push/pull {base.tuples_per_s:>12,.0f} tuples/s  loaded p50 {base.p50_ms:8.2f} ms"
          f" p99 {base.p99_ms:8.2f} ms | unloaded p50 {paced_base.p50_ms:7.2f} ms"
          f" p99 {paced_base.p99_ms:7.2f} ms")
    print(f"  ratio channel/push-pull throughput {chan.tuples_per_s / base.tuples_per_s:.2f}", flush=True)


def durable_run(table: pa.Table, batches: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="channel-hop-log-") as folder:
        return channel_run(table, batches, log_dir=folder)


def bench_durable(rows: int, repeats: int) -> None:
    """In-memory against durable upstream backup, runs interleaved so drift hits both alike."""
    table = make_table(rows)
    batches = DURABLE_ROWS.get(rows, 1_000_000) // rows
    memory, durable = [], []
    for _ in range(repeats):
        memory.append(channel_run(table, batches))
        durable.append(durable_run(table, batches))
    mem, dur = median_run(memory), median_run(durable)
    print(f"rows/batch={rows:>7} batches={batches} ipc={len(encode_table(table)) / rows:.0f} B/row")
    print(f"  in-memory {mem.tuples_per_s:>12,.0f} tuples/s  p50 {mem.p50_ms:8.2f} ms"
          f"  p99 {mem.p99_ms:8.2f} ms   runs {[round(r.tuples_per_s) for r in memory]}")
    print(f"  durable   {dur.tuples_per_s:>12,.0f} tuples/s  p50 {dur.p50_ms:8.2f} ms"
          f"  p99 {dur.p99_ms:8.2f} ms   runs {[round(r.tuples_per_s) for r in durable]}")
    print(f"  ratio durable/in-memory throughput {dur.tuples_per_s / mem.tuples_per_s:.2f}",
          flush=True)


def bench_curve(rows: int, repeats: int) -> None:
    """Plain text against CURVE, runs interleaved so drift hits both alike."""
    table = make_table(rows)
    batches = DURABLE_ROWS.get(rows, 1_000_000) // rows
    plain, curve = [], []
    for _ in range(repeats):
        plain.append(channel_run(table, batches))
        curve.append(channel_run(table, batches, curve=True))
    pl, cu = median_run(plain), median_run(curve)
    print(f"rows/batch={rows:>7} batches={batches} ipc={len(encode_table(table)) / rows:.0f} B/row")
    print(f"  plain     {pl.tuples_per_s:>12,.0f} tuples/s  p50 {pl.p50_ms:8.2f} ms"
          f"  p99 {pl.p99_ms:8.2f} ms   runs {[round(r.tuples_per_s) for r in plain]}")
    print(f"  CURVE     {cu.tuples_per_s:>12,.0f} tuples/s  p50 {cu.p50_ms:8.2f} ms"
          f"  p99 {cu.p99_ms:8.2f} ms   runs {[round(r.tuples_per_s) for r in curve]}")
    print(f"  ratio CURVE/plain throughput {cu.tuples_per_s / pl.tuples_per_s:.2f}", flush=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_memory_bound(rows: int = 10_000, bound: int = 64 << 20) -> None:
    """A reader process that takes its credit and never acknowledges: retention fills, send
    blocks; the writer process's RSS growth is compared with the bound."""
    table = make_table(rows)
    writer = ChannelWriter(CHANNEL, SCHEMA, expected_readers=("stuck",), max_retained_bytes=bound,
                           max_retained_batches=100_000)
    proc = spawn_reader("stuck", writer.endpoint, 0)
    before = rss_bytes()
    sent, full = 0, False
    try:
        while not full and sent < 10_000:
            try:
                writer.send(table, sent, timeout=1.0)
                sent += 1
            except ChannelFull:
                full = True
        stats = writer.stats()
        growth = rss_bytes() - before
    finally:
        proc.kill()
        proc.wait()
        writer.close()
    print(f"backpressure: {sent} batches of {rows} rows admitted, then ChannelFull={full}; "
          f"retained {stats.retained_bytes / 2**20:.1f} MiB of bound {bound / 2**20:.0f} MiB; "
          f"writer process RSS growth {growth / 2**20:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="writer", choices=("writer", "reader"))
    parser.add_argument("--mode", default="channel", choices=("channel", "pushpull", "stuck"))
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--batches", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default=None,
                        help="rows per batch (default 1000,10000,100000; with --durable 1000,10000)")
    parser.add_argument("--durable", action="store_true",
                        help="compare the in-memory and the durable (log_dir) upstream backup")
    parser.add_argument("--curve", action="store_true",
                        help="compare the plain-text and the CURVE channel")
    parser.add_argument("--key-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--server-key", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "reader":
        run_reader(args.mode, args.endpoint, args.batches, args.key_file, args.server_key)
        return
    sizes = [int(s) for s in (args.sizes or ("1000,10000" if args.durable or args.curve else
                                             "1000,10000,100000")).split(",")]
    if args.curve:
        print(f"channel hop, CURVE vs plain text: {args.repeats} repeats, medians; "
              f"{os.cpu_count()} cores")
        for rows in sizes:
            bench_curve(rows, args.repeats)
        return
    if args.durable:
        print(f"channel hop, durable vs in-memory upstream backup: {args.repeats} repeats, "
              f"medians; {os.cpu_count()} cores; log in {tempfile.gettempdir()}")
        for rows in sizes:
            bench_durable(rows, args.repeats)
        return
    print(f"channel hop benchmark: {args.repeats} repeats, medians; {os.cpu_count()} cores")
    bench_memory_bound()  # first, before earlier runs leave memory in the allocators' pools
    for rows in sizes:
        bench_size(rows, args.repeats)


if __name__ == "__main__":
    main()
