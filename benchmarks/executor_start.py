"""What an executor's Spark start costs with the class archive (executor.class_archive) against
the same start without it.

Owns this benchmark only (nothing imports it). Each run is a child process, as an executor's
start is: it builds the session as an executor does (`executor.spark_session.build_session`),
with the archive's mapping options or none, and runs the archive's representative task query (a
file source, an event-time window aggregate on the RocksDB state store, a Python foreachBatch)
to its end. The parent alternates the two per repeat and prints the medians of the wall time
(start of the process to the query's end) and of the CPU the process tree used (its children's
rusage: the JVM, the launcher JVM and the Python workers), and the ratios with / without.
`--test-jvm` gives the JVMs the options the test suite gives executors (C1 only, serial GC).

    python benchmarks/executor_start.py [--repeats 3] [--test-jvm]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_util import fmt, format_table, median_of, ratio, use_repo_on_path

GOAL_CPU_RATIO = 0.7  # the archive should save at least 30 % of a start's CPU
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def child(variant: str, work: Path) -> None:
    use_repo_on_path()
    from executor import class_archive, class_archive_build

    archive = class_archive.archive_path()
    options = ""
    if variant == "archive":
        if archive is None or not class_archive.proven(archive):
            raise SystemExit("no proven class archive: run `python -m "
                             "executor.class_archive_build build` first")
        options = class_archive.mapping_options(archive)
    class_archive_build.representative_run(options, work)


def run_child(variant: str, test_jvm: bool) -> dict[str, float]:
    env = dict(os.environ)
    if test_jvm:
        env["JAVA_TOOL_OPTIONS"] = TEST_JVM_OPTIONS
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="elastiq-executor-start-") as tmp:
        done = subprocess.run([sys.executable, __file__, "--child", variant, "--work", tmp],
                              capture_output=True, text=True, timeout=600, env=env)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} run failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--test-jvm", action="store_true",
                        help="the JVM options the tests give executors (C1 only, serial GC)")
    parser.add_argument("--child", choices=("archive", "none"))
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.work)
        return
    runs: dict[str, list[dict[str, float]]] = {"archive": [], "none": []}
    for repeat in range(args.repeats):
        order = ("archive", "none") if repeat % 2 == 0 else ("none", "archive")
        for variant in order:
            result = run_child(variant, args.test_jvm)
            runs[variant].append(result)
            print(f"  run {repeat} {variant}: wall {result['wall']:.1f} s, "
                  f"cpu {result['cpu']:.1f} s", flush=True)
    medians = {v: {k: median_of([r[k] for r in rs]) for k in ("wall", "cpu")}
               for v, rs in runs.items()}
    rows = [[what, fmt(medians["archive"][what], 1), fmt(medians["none"][what], 1),
             fmt(ratio(medians["archive"][what], medians["none"][what]), 2),
             f"<= {GOAL_CPU_RATIO}" if what == "cpu" else ""] for what in ("wall", "cpu")]
    jvm = "tests' JVM options" if args.test_jvm else "the JVM's defaults"
    print(f"Executor start (session + first task query), s, medians of {args.repeats} runs, "
          f"{jvm}")
    print(format_table(["", "with archive", "without", "with/without", "goal"], rows))
    cpu_ratio = ratio(medians["archive"]["cpu"], medians["none"]["cpu"])
    print(f"cpu goal {'met' if cpu_ratio <= GOAL_CPU_RATIO else 'MISSED'}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(json.dumps({"medians": medians, "repeats": args.repeats, "test_jvm": args.test_jvm}))


if __name__ == "__main__":
    main()
