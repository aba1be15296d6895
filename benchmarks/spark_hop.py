"""What one channel hop costs a plan inside Spark, and how fast one channel source reads.

Owns this benchmark only (not a test). One SparkSession (`build_session(2, ...)`) in this
process runs `executor.runtime.TaskRuntime` queries exactly as an executor builds them, their
channels through one `ChannelHub` (real ZeroMQ sockets on 127.0.0.1, the spool receivers and the
`elastiq_spool` reader of the task that reads):

- `one-task`: generator (shape "sensor", unpaced above what 2 cores process, `--rows` rows) ->
  filter `temp > 39.5` (~1.7 %: the hop, not the JSON sink, is measured) -> exactly-once file sink;
- `two-task`: the same split in two tasks at the channel: generator -> channel sink | channel
  source -> filter -> file sink (both queries in the same session, as on one agent).
  Throughput of each = rows / (queries started -> the sink holds every oracle row); median of
  `--repeats`, plans alternating; ratio two-task / one-task (goal >= 0.8);
- window latency at 2,000 rows/s: the compiled spec generator -> filter -> 1 s tumbling window
  per sensor (200 ms watermark) -> file sink, in one task and with the window in a second task
  (`pipeline="split"`), the tasks run as the executor runs them; per window, the time from the
  generator's release of the tuple whose event time closes it to its first line in the sink
  (polled every 5 ms); p50/p99 pooled over repeats; ratio two-task / one-task (goal <= 1.3);
  with each task's median micro-batch time, which that latency is made of;
- `channel source`: a writer in this process sends `--source-rows` rows of ~100 bytes (id,
  ts, sensor, a 64-character payload) in batches of 100k as fast as the channel admits them; one
  task reads them (channel source -> filter keeping 1 in 1,000 -> file sink). Rows/s = rows /
  (first send -> the sink holds every row); goal >= 1 M rows/s.

Honesty: every sink must equal its oracle, computed without Spark (pyarrow compute over the
generator's own rows for the filter; plain Python for the channel-source rows); `results exact`
says so per plan.

With `--agent-cpus C` the whole benchmark (this process, Spark's JVM, its Python workers) runs
in a cgroup of C cpus, as one isolated agent (issue 31), and the throughput section prints each
plan's cpu microseconds per row from the cgroup's accounting: the hop's cost per row, and
two-task / one-task per cpu second (issue 11's goal stated per cpu).

    PYTHONPATH=$PWD python benchmarks/spark_hop.py [--rows 6000000] [--repeats 3]
        [--only throughput|latency] [--quick] [--agent-cpus C]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench_util import (LineCounter, OwnCgroup, fmt, format_table, median_of, percentile,
                        ratio, use_repo_on_path)

use_repo_on_path()

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from common.types import Schema  # noqa: E402
from compiler.pipeline import compile_spec_text  # noqa: E402
from executor import shapes  # noqa: E402
from executor.channels import ChannelWriter  # noqa: E402
from executor.runtime import ChannelHub, TaskRuntime, channel_reader_id  # noqa: E402
from executor.spark_session import build_session  # noqa: E402
from executor.task_runner import TaskRunner  # noqa: E402
from testkit.waiting import poll  # noqa: E402
from spark_vs_handwritten import (PROGRESS_RETENTION, warm_batch_ms,  # noqa: E402
                                  warm_throughput)

SENSOR = shapes.shape_named("sensor").columns
SEED, START = 7, "2026-01-01T00:00:00Z"
OFFERED = 2_000_000.0  # rows/s: more than 2 cores process, micro-batches stay below 64 MB frames
THRESHOLD = 39.5
WIDE = Schema.of(("id", "int"), ("ts", "timestamp"), ("sensor", "string"), ("payload", "string"))
log = logging.getLogger("bench.spark_hop")


def oracle_count(rows: int) -> int:
    """Rows of the generator with temp > THRESHOLD, by pyarrow over its own batches (no Spark)."""
    shape, start_us = shapes.shape_named("sensor"), shapes.parse_start(START)
    kept = 0
    for lo in range(0, rows, 500_000):
        batch = shapes.generate_batch(shape, SENSOR, SEED, start_us, OFFERED, lo,
                                      min(rows, lo + 500_000))
        kept += pc.sum(pc.greater(batch.column("temp"), THRESHOLD)).as_py() or 0
    return kept


def wait_until(done: Callable[[], bool], timeout: float, what: str,
               runtimes: list[TaskRuntime]) -> None:
    """`testkit.waiting.poll` until `done()`; fails at once when one of `runtimes`' queries
    died, and when `timeout` passes."""
    def finished() -> bool:
        if done():
            return True
        for rt in runtimes:
            if rt.query is not None and not rt.query.isActive:
                raise RuntimeError(f"{what}: query {rt.task_id} died: {rt.query.exception()}")
        return False

    if not poll(finished, timeout, 0.02):
        raise TimeoutError(f"{what}: not done within {timeout} s")


def generator(rt: TaskRuntime, rows: int) -> None:
    rt.generator(op="gen", output="raw", schema=SENSOR, shape="sensor", seed=SEED,
                 rate=OFFERED, limit=rows, start=START)


def run_plan(spark: Any, plan: str, rows: int, expected: int, work: Path) -> tuple[float, float]:
    """(rows/s over the whole run, warm rows/s) of one run of `plan` ("one-task", "two-task");
    warm: the last query's data micro-batches after its first, over their wall span."""
    folder = Path(tempfile.mkdtemp(prefix=f"{plan}-", dir=work))
    out = folder / "out.jsonl"
    hub = ChannelHub()
    runtimes: list[TaskRuntime] = []
    try:
        began = time.monotonic()
        if plan == "one-task":
            rt = TaskRuntime(spark, query_id="hop", task_id="t0", checkpoint_dir=str(folder / "t0"))
            runtimes.append(rt)
            generator(rt, rows)
            rt.filter(op="hot", input="raw", output="hot", condition=f"temp > {THRESHOLD}")
            rt.file_sink(op="sink", input="hot", path=str(out))
        else:
            up = TaskRuntime(spark, query_id="hop", task_id="up", checkpoint_dir=str(folder / "up"),
                             channels=hub)
            down = TaskRuntime(spark, query_id="hop", task_id="down",
                               checkpoint_dir=str(folder / "down"), channels=hub)
            runtimes += [up, down]
            generator(up, rows)
            up.channel_sink(input="raw", channel="hop.raw", readers=["down"])
            down.channel_source(output="raw", schema=SENSOR, channel="hop.raw")
            down.filter(op="hot", input="raw", output="hot", condition=f"temp > {THRESHOLD}")
            down.file_sink(op="sink", input="hot", path=str(out))
        lines = LineCounter(out)
        wait_until(lambda: lines.count() >= expected, 600, plan, runtimes)
        elapsed = time.monotonic() - began
        if lines.count() != expected:
            raise RuntimeError(f"{plan}: sink has {lines.count()} rows, oracle {expected}")
        last = runtimes[-1].query
        assert last is not None
        return rows / elapsed, warm_throughput(last.recentProgress)[0]
    finally:
        for rt in runtimes:
            rt.stop()
        hub.close()


def wide_table(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table({"id": ids, "ts": [1_700_000_000_000_000 + i for i in ids],
                     "sensor": [f"s{i % 97}" for i in ids],
                     "payload": [f"{i:064d}" for i in ids]},
                    schema=shapes.arrow_schema(WIDE))


def run_source(spark: Any, rows: int, work: Path) -> tuple[float, float, bool]:
    """(rows/s through one channel source, warm rows/s, sink equal to the oracle)."""
    folder = Path(tempfile.mkdtemp(prefix="source-", dir=work))
    out = folder / "out.jsonl"
    batch = 100_000
    tables = [wide_table(lo, min(rows, lo + batch)) for lo in range(0, rows, batch)]
    reader_id = channel_reader_id("down", "src.raw")
    writer = ChannelWriter("src.raw", shapes.arrow_schema(WIDE), expected_readers=[reader_id],
                           max_retained_bytes=512 << 20)
    rt = TaskRuntime(spark, query_id="hop", task_id="down", checkpoint_dir=str(folder / "down"),
                     endpoints={"src.raw": writer.endpoint})
    try:
        rt.channel_source(output="raw", schema=WIDE, channel="src.raw")
        rt.filter(op="few", input="raw", output="few", condition="id % 1000 = 0")
        rt.file_sink(op="sink", input="few", path=str(out))
        time.sleep(3.0)  # the query's start (first empty batches) is not the channel's speed
        began = time.monotonic()
        for tag, table in enumerate(tables):
            writer.send(table, tag)
        expected = len(range(0, rows, 1000))
        lines = LineCounter(out)
        wait_until(lambda: lines.count() >= expected, 600, "channel source", [rt])
        elapsed = time.monotonic() - began
        assert rt.query is not None
        warm = warm_throughput(rt.query.recentProgress)[0]
    finally:
        rt.stop()
        writer.close()
    got = Counter(json.loads(line)["id"] for line in out.read_text(encoding="utf-8").splitlines())
    exact = got == Counter(i for i in range(rows) if i % 1000 == 0)
    return rows / elapsed, warm, exact


# --- window latency at 2,000 rows/s: one task vs the window in a second task ---------------------

LATENCY_RATE, LATENCY_ROWS = 2000.0, 44_000  # 22 s of event time: 20 windows of 1 s close
LATENCY_WINDOW_US, LATENCY_WATERMARK_US = 1_000_000, 200_000


def latency_spec(sink: Path, split: bool) -> str:
    """generator -> filter -> 1 s tumbling window per sensor (200 ms watermark) -> file sink;
    `split`: the window in its own task (pipeline="split": one channel hop before it)."""
    pipeline = ' pipeline="split"' if split else ""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="bench-hop-latency">
  <type name="reading">
    <column name="sensor" type="string"/><column name="ts" type="timestamp"/>
    <column name="temp" type="double"/><column name="humidity" type="double"/>
  </type>
  <operator name="src" type="generator">
    <param name="shape" value="sensor"/><param name="rate" value="{LATENCY_RATE:.1f}"/>
    <param name="limit" value="{LATENCY_ROWS}"/><param name="seed" value="{SEED}"/>
    <param name="start" value="{START}"/><output name="raw" type="reading"/>
  </operator>
  <operator name="hot" type="filter">
    <input name="raw"/><param name="condition" value="raw.temp &gt; 30"/>
    <output name="hotReadings" type="reading"/>
  </operator>
  <operator name="avg" type="window-aggregate"{pipeline}>
    <input name="hotReadings"/><param name="time" value="ts"/>
    <param name="size" value="{LATENCY_WINDOW_US // 1000} milliseconds"/>
    <param name="watermark" value="{LATENCY_WATERMARK_US // 1000} milliseconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="readings" function="count"/>
    <output name="counts"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="counts"/><param name="path" value="{sink}"/>
  </operator>
</dataflow>
"""


def close_latencies(seen: Sequence[tuple[float, int]], anchor: float) -> list[float]:
    """Seconds from the release of the tuple whose event time lets each window close (window
    end + watermark) to the first sink line of that window (`seen`: (wall, window end us)),
    one sample per window."""
    first_seen: dict[int, float] = {}
    for wall, end_us in seen:
        first_seen.setdefault(end_us, wall)
    start_us = shapes.parse_start(START)
    out = []
    for end_us, wall in first_seen.items():
        closer = max(0, math.ceil((end_us + LATENCY_WATERMARK_US - start_us) * LATENCY_RATE
                                  / 1e6))
        while shapes.event_time_us(start_us, LATENCY_RATE, closer) < \
                end_us + LATENCY_WATERMARK_US:
            closer += 1
        out.append(wall - (anchor + (closer + 1) / LATENCY_RATE))
    return out


def watch_sink(path: Path, seen: list[tuple[float, int]], stop: threading.Event) -> None:
    """Stamp each new sink line with the wall time it was first seen (polled every 5 ms)."""
    offset = 0
    while not stop.wait(0.005):
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        if size <= offset:
            continue
        now = time.time()
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read(size - offset)
        complete = chunk[: chunk.rfind(b"\n") + 1]
        offset += len(complete)
        for line in complete.decode("utf-8").splitlines():
            end = datetime.fromisoformat(json.loads(line)["window_end"].replace("Z", "+00:00"))
            seen.append((now, (end - shapes.EPOCH) // timedelta(microseconds=1)))


def run_latency(spark: Any, split: bool, work: Path) -> tuple[list[float], list[list[float]]]:
    """Window-close latencies (s) of one run of the compiled spec (tasks as the executor runs
    them, in this session, their channel through one hub), and each task's micro-batch times
    (ms, after the first data batch: `warm_batch_ms`), upstream first."""
    folder = Path(tempfile.mkdtemp(prefix="latency-", dir=work))
    sink = folder / "out.jsonl"
    compiled = compile_spec_text(latency_spec(sink, split), str(folder / "bench.xml"),
                                 base_dir=folder, query_id="lat").query
    hub = ChannelHub()
    runners: list[TaskRunner] = []
    seen: list[tuple[float, int]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch_sink, args=(sink, seen, stop), daemon=True)
    watcher.start()
    try:
        for task in compiled.tasks:  # upstream first: its writer's endpoint is in the hub
            program = folder / f"{task.task_id}.py"
            program.write_text(task.program, encoding="utf-8")
            runner = TaskRunner(spark, program, {"query_id": task.query_id,
                                                 "task_id": task.task_id, "channels": hub,
                                                 "checkpoint_dir": str(folder / task.task_id)})
            runner.start()
            runners.append(runner)
        deadline = time.monotonic() + LATENCY_ROWS / LATENCY_RATE + 120
        windows = LATENCY_ROWS / LATENCY_RATE - 2  # those whose watermark the input passes
        while len({end for _, end in seen}) < windows and time.monotonic() < deadline:
            time.sleep(0.1)
        anchor_file = folder / compiled.tasks[0].task_id / "pacing" / "src.anchor"
        anchor = json.loads(anchor_file.read_text(encoding="utf-8"))["anchor"]
        batches = [warm_batch_ms(r.runtime.query.recentProgress)
                   if r.runtime and r.runtime.query else [] for r in runners]
    finally:
        stop.set()
        watcher.join(5)
        for runner in reversed(runners):
            runner.stop()
        hub.close()
    return close_latencies(seen, anchor), batches


def throughput_section(spark: Any, args: argparse.Namespace, work: Path,
                       box: OwnCgroup | None) -> None:
    expected = oracle_count(args.rows)
    print(f"{args.rows:,} generator rows, {expected:,} pass the filter; "
          f"{args.source_rows:,} channel-source rows")
    run_plan(spark, "one-task", 200_000, oracle_count(200_000), work)  # warm-up, not measured
    figures: dict[str, list[tuple[float, float]]] = {"one-task": [], "two-task": []}
    cpu_us: dict[str, list[float]] = {"one-task": [], "two-task": []}  # cpu us per row
    for repeat in range(args.repeats):
        order = ["one-task", "two-task"] if repeat % 2 == 0 else ["two-task", "one-task"]
        for plan in order:
            used = box.cpu_seconds() if box else math.nan
            figures[plan].append(run_plan(spark, plan, args.rows, expected, work))
            cpu_us[plan].append(((box.cpu_seconds() if box else math.nan) - used)
                                / args.rows * 1e6)
            log.warning("%s run %s: %.0f rows/s, warm %.0f, %.3f cpu us/row", plan,
                        repeat + 1, *figures[plan][-1], cpu_us[plan][-1])
    source = [run_source(spark, args.source_rows, work) for _ in range(args.repeats)]
    table = []
    medians: dict[str, tuple[float, float]] = {}
    for plan, runs in [*figures.items(), ("channel source", [s[:2] for s in source])]:
        medians[plan] = (median_of([r[0] for r in runs]), median_of([r[1] for r in runs]))
        exact = "yes" if plan != "channel source" or all(s[2] for s in source) else "NO"
        table.append([plan, fmt(medians[plan][0]), fmt(medians[plan][1]),
                      ", ".join(f"{fmt(r[0])}/{fmt(r[1])}" for r in runs), exact])
    print(format_table(["plan", "rows/s", "warm rows/s", "runs (all/warm)", "results exact"],
                       table))
    for what, index in (("whole run", 0), ("warm", 1)):
        hop = ratio(medians["two-task"][index], medians["one-task"][index])
        print(f"two-task / one-task, {what}: {hop:.2f} "
              f"(goal >= 0.8: {'met' if hop >= 0.8 else 'MISSED'})")
    if box:
        per_cpu_section(box, args, cpu_us, medians)
    src = medians["channel source"]
    print(f"channel source: {src[0] / 1e6:.2f} M rows/s of ~100-byte rows, warm "
          f"{src[1] / 1e6:.2f} M (goal >= 1 M, warm: {'met' if src[1] >= 1e6 else 'MISSED'})")


def per_cpu_section(box: OwnCgroup, args: argparse.Namespace, cpu_us: dict[str, list[float]],
                    medians: dict[str, tuple[float, float]]) -> None:
    """Issue 11's throughput goal stated per cpu (issue 31): what each plan costs per row in
    cpu microseconds, inside a cgroup of `--agent-cpus` cpus; the hop's cost is the difference.
    Per cpu second, two-task / one-task is the goal's ratio where each plan had the same cpus."""
    one, two = median_of(cpu_us["one-task"]), median_of(cpu_us["two-task"])
    print(f"inside a cgroup of {box.cpus:g} cpus (CFS quota, as an isolated agent): cpu per "
          f"row, median of {args.repeats}: one-task {one:.3f} us, two-task {two:.3f} us; "
          f"the hop costs {two - one:.3f} cpu us per row ({ratio(two - one, one):.2f}x the "
          f"one-task plan's whole cost)")
    per_cpu = {plan: medians[plan][0] / box.cpus for plan in ("one-task", "two-task")}
    hop = ratio(one, two)
    print(f"rows per cpu second: one-task {fmt(1e6 / one)}, two-task {fmt(1e6 / two)}; "
          f"two-task / one-task per cpu: {hop:.2f} (goal >= 0.8: "
          f"{'met' if hop >= 0.8 else 'MISSED'}); rows/s per offered cpu: one-task "
          f"{fmt(per_cpu['one-task'])}, two-task {fmt(per_cpu['two-task'])}")


def latency_section(spark: Any, args: argparse.Namespace, work: Path) -> None:
    lat: dict[str, list[float]] = {"one-task": [], "two-task": []}
    batches: dict[str, list[list[float]]] = {"one-task": [[]], "two-task": [[], []]}
    run_latency(spark, False, work)  # warm-up, not measured
    for repeat in range(args.repeats):
        for split in ((False, True) if repeat % 2 == 0 else (True, False)):
            plan = "two-task" if split else "one-task"
            closes, per_task = run_latency(spark, split, work)
            lat[plan] += closes
            for pooled, run in zip(batches[plan], per_task):
                pooled += run
    p50 = {plan: percentile(values, 50) * 1000 for plan, values in lat.items()}
    for plan, values in lat.items():
        tasks = ", ".join(f"t{i} {median_of(ms):,.0f} ms" for i, ms in enumerate(batches[plan]))
        print(f"window latency at {LATENCY_RATE:,.0f} rows/s, {plan}: p50 {p50[plan]:,.0f} ms, "
              f"p99 {percentile(values, 99) * 1000:,.0f} ms ({len(values)} window closes); "
              f"micro-batch p50: {tasks}")
    slower = ratio(p50["two-task"], p50["one-task"])
    print(f"two-task / one-task latency p50: {slower:.2f} "
          f"(goal <= 1.3: {'met' if slower <= 1.3 else 'MISSED'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--source-rows", type=int, default=5_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("throughput", "latency"))
    parser.add_argument("--quick", action="store_true", help="1 repeat, smaller inputs")
    parser.add_argument("--agent-cpus", type=float, default=None,
                        help="run inside a cgroup of this many cpus (needs root and cgroups), "
                             "as one isolated agent, and print each plan's cpu per row")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.source_rows, args.repeats = 2_000_000, 2_000_000, 1
    logging.basicConfig(level=logging.WARNING)
    if args.agent_cpus is None:
        run_sections(args, None)
        return
    with OwnCgroup(args.agent_cpus) as box:
        run_sections(args, box)


def run_sections(args: argparse.Namespace, box: OwnCgroup | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-spark-hop-"))
    spark = build_session(2, "bench-spark-hop", str(work / "session"))
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(PROGRESS_RETENTION))
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    if args.only in (None, "throughput"):
        throughput_section(spark, args, work, box)
    if args.only in (None, "latency"):
        latency_section(spark, args, work)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    spark.stop()


if __name__ == "__main__":
    main()
