"""What one micro-batch costs with the executor's session settings, against the same session
with each of two of Spark's defaults put back: checkpoint files on Hadoop's checksummed local
file system, and checkpoint files written through Hadoop's FileContext API.

Owns this benchmark only (nothing imports it). Each run is a child process (a JVM keeps the
file system it first made, so the settings cannot share one): it builds the session as an
executor does (`executor.spark_session.build_session`), with one variant's settings over the
product's, compiles examples/hot-sensors.xml (generator at 2,000 rows/s, filter, 10 s tumbling
windows per sensor on RocksDB state, exactly-once file sink) and runs its task (`TaskRunner`)
for `--seconds`. It prints, as JSON, the median of each micro-batch phase
(`StreamingQuery.recentProgress` durations, the first 3 micro-batches left out) and the CPU per
micro-batch of the session's JVM and everything it started (its own time, its reaped children's
and its live descendants', from /proc, over the same micro-batches). The parent rotates the
order of the variants per repeat and prints one table of medians over the runs' medians, and
each variant's ratio product / variant.

    python benchmarks/batch_overhead.py [--repeats 3] [--seconds 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_util import fmt, format_table, median_of, ratio, start_task, use_repo_on_path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("triggerExecution", "addBatch", "walCommit", "commitOffsets", "queryPlanning")
CPU = "cpuPerBatch"  # ms of CPU per micro-batch: the JVM and every process it started
VARIANTS = {  # name -> the settings put over the product's (Spark's defaults)
    "product": {},
    "checksummed": {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",
                    "spark.hadoop.fs.AbstractFileSystem.file.impl":
                        "org.apache.hadoop.fs.local.LocalFs"},
    "file-context": {"spark.sql.streaming.checkpointFileManagerClass":
                         "org.apache.spark.sql.execution.streaming.checkpointing."
                         "FileContextBasedCheckpointFileManager"},
}
SKIPPED_BATCHES = 3  # the first micro-batches plan and warm up the query


def child(variant: str, seconds: float, work: Path) -> None:
    """Run hot-sensors' task for `seconds` and print its phase medians as one JSON line."""
    use_repo_on_path()
    import executor.spark_session as spark_session

    product = spark_session.session_settings
    spark_session.session_settings = lambda *args: {**product(*args), **VARIANTS[variant]}
    spark = spark_session.build_session(2, f"bench-batch-overhead-{variant}",
                                        str(work / "session"))
    gateway = spark.sparkContext._jvm
    assert gateway is not None, "the session has no JVM gateway"
    jvm = int(gateway.java.lang.ProcessHandle.current().pid())
    spec = (ROOT / "examples" / "hot-sensors.xml").read_text(encoding="utf-8")
    runner = start_task(spark, spec, work / "hot-sensors.xml", work, "bench", work)
    try:
        query = runner.runtime.query
        while len(query.recentProgress) < SKIPPED_BATCHES:
            time.sleep(0.2)
        first, cpu_before = len(query.recentProgress), tree_cpu_seconds(jvm)
        time.sleep(seconds)
        cpu_after, progress = tree_cpu_seconds(jvm), query.recentProgress
    finally:
        runner.stop()
        spark.stop()
    measured = progress[SKIPPED_BATCHES:]
    medians = {p: median_of([float(x["durationMs"].get(p, 0)) for x in measured])
               for p in PHASES}
    medians[CPU] = 1000 * (cpu_after - cpu_before) / max(len(progress) - first, 1)
    print(json.dumps({"variant": variant, "batches": len(measured), "medians": medians}))


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process `pid`, of its reaped children and of its live descendants (their
    own and their reaped children's), from /proc (Linux)."""
    ticks: dict[int, tuple[int, int]] = {}  # pid -> (parent, own + reaped children's ticks)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # ended meanwhile
            fields = stat[stat.rfind(")") + 2:].split()
            ticks[int(entry)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
    total, todo = 0, [pid]
    while todo:
        parent = todo.pop()
        total += ticks.get(parent, (0, 0))[1]
        todo.extend(child for child, (ppid, _) in ticks.items() if ppid == parent)
    return total / os.sysconf("SC_CLK_TCK")


def run_child(variant: str, seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="elastiq-batch-overhead-") as tmp:
        done = subprocess.run([sys.executable, __file__, "--child", variant, "--seconds",
                               str(seconds), "--work", tmp],
                              capture_output=True, text=True, timeout=seconds + 240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{variant} run failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--child", choices=tuple(VARIANTS))
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds, args.work)
        return
    names = tuple(VARIANTS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for variant in names[shift:] + names[:shift]:
            result = run_child(variant, args.seconds)
            runs[variant].append(result)
            print(f"  run {repeat} {variant}: {result['batches']} batches, "
                  f"{ {p: fmt(v) for p, v in result['medians'].items()} }", flush=True)
    measures = (*PHASES, CPU)
    medians = {v: {p: median_of([r["medians"][p] for r in rs]) for p in measures}
               for v, rs in runs.items()}
    others = names[1:]
    rows = [[p, *(fmt(medians[v][p]) for v in names),
             *(fmt(ratio(medians["product"][p], medians[v][p]), 2) for v in others)]
            for p in measures]
    print(f"Micro-batch phases (ms) and CPU per micro-batch (ms, {CPU}), hot-sensors at 2,000 "
          f"rows/s, medians of {args.repeats} runs of {args.seconds:g} s")
    print(format_table(["measure", *names, *(f"product/{v}" for v in others)], rows))
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
