"""What one micro-batch costs with the executor's session settings, against the same session
with checkpoint files on Hadoop's checksummed local file system (Spark's default).

Owns this benchmark only (nothing imports it). Each run is a child process (a JVM keeps the
file system it first made, so the two settings cannot share one): it builds the session as an
executor does (`executor.spark_session.build_session`), optionally with
`spark.hadoop.fs.file.impl` and `spark.hadoop.fs.AbstractFileSystem.file.impl` set back to
Hadoop's checksummed `LocalFileSystem` / `LocalFs`, compiles examples/hot-sensors.xml (generator
at 2,000 rows/s, filter, 10 s tumbling windows per sensor, exactly-once file sink) and runs its
task (`TaskRunner`) for `--seconds`. It prints the median of each micro-batch phase
(`StreamingQuery.recentProgress` durations, the first 3 micro-batches left out) as JSON. The
parent alternates the two settings per repeat and prints one table of medians over the runs'
medians, and the ratio raw / checksummed of the micro-batch (`triggerExecution`) time.

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
CHECKSUMMED = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",
               "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.LocalFs"}
SKIPPED_BATCHES = 3  # the first micro-batches plan and warm up the query


def child(variant: str, seconds: float, work: Path) -> None:
    """Run hot-sensors' task for `seconds` and print its phase medians as one JSON line."""
    use_repo_on_path()
    import executor.spark_session as spark_session

    if variant == "checksummed":
        product = spark_session.session_settings
        spark_session.session_settings = lambda *args: {**product(*args), **CHECKSUMMED}
    spark = spark_session.build_session(2, f"bench-batch-overhead-{variant}",
                                        str(work / "session"))
    spec = (ROOT / "examples" / "hot-sensors.xml").read_text(encoding="utf-8")
    runner = start_task(spark, spec, work / "hot-sensors.xml", work, "bench", work)
    try:
        time.sleep(seconds)
        progress = runner.runtime.query.recentProgress[SKIPPED_BATCHES:]
    finally:
        runner.stop()
        spark.stop()
    medians = {p: median_of([float(x["durationMs"].get(p, 0)) for x in progress])
               for p in PHASES}
    print(json.dumps({"variant": variant, "batches": len(progress), "medians": medians}))


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
    parser.add_argument("--child", choices=("raw", "checksummed"))
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds, args.work)
        return
    runs: dict[str, list[dict]] = {"raw": [], "checksummed": []}
    for repeat in range(args.repeats):
        order = ("raw", "checksummed") if repeat % 2 == 0 else ("checksummed", "raw")
        for variant in order:
            result = run_child(variant, args.seconds)
            runs[variant].append(result)
            print(f"  run {repeat} {variant}: {result['batches']} batches, "
                  f"{ {p: fmt(v) for p, v in result['medians'].items()} }", flush=True)
    medians = {v: {p: median_of([r["medians"][p] for r in rs]) for p in PHASES}
               for v, rs in runs.items()}
    rows = [[p, fmt(medians["raw"][p]), fmt(medians["checksummed"][p]),
             fmt(ratio(medians["raw"][p], medians["checksummed"][p]), 2)] for p in PHASES]
    print(f"Micro-batch phases, ms, hot-sensors at 2,000 rows/s, medians of {args.repeats} "
          f"runs of {args.seconds:g} s")
    print(format_table(["phase", "raw (product)", "checksummed", "raw/checksummed"], rows))
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
