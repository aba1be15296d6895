"""Task migration on the embedded cluster: how long a moved task pauses, stateless and stateful.

Owns this benchmark only (not a test; nothing in tests/ imports it). It runs the pipelined specs
of tests/specs (a filter, and a window aggregate whose task keeps its state in its checkpoint)
on the stack of testkit/e2e_support.py (embedded master, 3 agents, the framework scheduler, one
real executor and SparkSession per agent, 127.0.0.1 only), moves the consuming task between
agents with the scheduler's API (what `elastiq migrate` calls) N times under a steady load, and
prints per kind of task:
- `to running`: from the migrate request until the scheduler reports the task running on the
  target (quiesce: its query stops after the current micro-batch; relaunch there);
- `output gap`: from the request to the first growth of the sink after the task runs there,
  against the normal interval between sink writes measured before the first move (p50, max);
- whether the sink equals the plain-Python oracle at the end (nothing lost, nothing twice).
Goals (issue 5): a pause under 2 s for a stateless task and under 5 s for a stateful one.

    python benchmarks/migration.py [--moves N]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from bench_util import (ROOT, exit_on_sigterm, fmt, format_table, median_of, percentile,
                        use_repo_on_path)

use_repo_on_path()

from testkit.e2e_support import (  # noqa: E402
    Stack, compile_spec, generator_rows, read_sink, spec_params, start_stack, stop_query,
    stop_stack, submit, wait_running, wait_until, window_oracle)
from patterns import SizeWatcher  # noqa: E402  (the sink-size poller of the pattern benchmark)

log = logging.getLogger("bench.migration")
SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Case:
    kind: str  # "stateless" | "stateful"
    spec: str
    task: str  # the task moved (its suffix)
    expected: Callable[[], Counter]
    key: Callable[[dict[str, Any]], tuple]


def filter_oracle() -> Counter:
    rows = generator_rows(spec_params("e2e-standby.xml")["src"])
    return Counter((r["sensor"], r["ts"], r["temp"], r["humidity"]) for r in rows
                   if r["temp"] > 25 and r["humidity"] < 60)


def window_counts() -> Counter:
    windows = window_oracle(generator_rows(spec_params("e2e-checkpoint.xml")["src"]), "ts",
                            ["sensor"], 2 * SECOND, 2 * SECOND, timedelta(milliseconds=500))
    return Counter((start, start + 2 * SECOND, sensor, len(rows))
                   for (start, sensor), rows in windows.items())


CASES = (
    Case("stateless", "e2e-standby.xml", "t1", filter_oracle,
         lambda r: (r["sensor"], r["ts"], r["temp"], r["humidity"])),
    Case("stateful", "e2e-checkpoint.xml", "t1", window_counts,
         lambda r: (r["window_start"], r["window_end"], r["sensor"], r["readings"])),
)


@dataclass
class Moves:
    kind: str
    to_running: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    exact: bool = False


def task_view(stack: Stack, qid: str, task: str) -> dict[str, Any]:
    return stack.tasks(qid)[task]


def run_case(stack: Stack, work: Path, case: Case, moves: int) -> Moves:
    base = work / case.kind
    base.mkdir()
    query = compile_spec(case.spec, base, query_id=f"bench-migrate-{case.kind}")
    qid, task = query.query_id, f"{query.query_id}.{case.task}"
    sink = base / spec_params(case.spec)["sink"]["path"]
    result = Moves(case.kind)
    submit(stack, query)
    try:
        with SizeWatcher(sink) as watcher:
            wait_running(stack, qid, timeout=180)
            began = time.monotonic()
            wait_until(lambda: len(watcher.write_intervals(began, time.monotonic())) >= 5, 120,
                       "steady output before the first move")
            result.baseline = watcher.write_intervals(began, time.monotonic())
            for move in range(moves):
                move_once(stack, qid, task, watcher, result, move)
                time.sleep(3.0)
        expected = case.expected()
        result.exact = bool(wait_until(
            lambda: Counter(case.key(r) for r in read_sink(sink)) == expected, 300,
            f"the {case.kind} sink to equal the oracle", step=1.0))
    finally:
        stop_query(stack, qid)
    return result


def move_once(stack: Stack, qid: str, task: str, watcher: SizeWatcher, result: Moves,
              move: int) -> None:
    """Move `task` to the next agent; record the time to running there and to output."""
    agents = [a.agent_id for a in stack.cluster.agents]
    view = task_view(stack, qid, task)
    here, attempt = view["agent_id"], view["attempt"]
    there = agents[(agents.index(here) + 1) % len(agents)]
    asked = time.monotonic()
    reply = stack.service.migrate_task(qid, task, there)
    assert reply.accepted, reply.message
    wait_until(lambda: (v := task_view(stack, qid, task))["attempt"] > attempt
               and v["state"] == "running" and v["agent_id"] == there, 120,
               f"move {move + 1} of {task} to {there}", step=0.02)
    running = time.monotonic()
    size = watcher.size_at(running)
    grew = wait_until(lambda: watcher.first_growth(running, size), 120,
                      f"output after move {move + 1}", step=0.02)
    result.to_running.append(running - asked)
    result.gaps.append(grew - asked)
    log.info("%s move %s: %s -> %s, running after %.2f s, output after %.2f s", result.kind,
             move + 1, here, there, result.to_running[-1], result.gaps[-1])


def table(results: list[Moves]) -> str:
    rows = []
    for r in results:
        rows.append([r.kind, str(len(r.to_running)),
                     fmt(median_of(r.to_running), 2), fmt(max(r.to_running, default=float("nan")), 2),
                     fmt(median_of(r.gaps), 2), fmt(max(r.gaps, default=float("nan")), 2),
                     f"{fmt(percentile(r.baseline, 50), 2)} / {fmt(max(r.baseline), 2)}",
                     "yes" if r.exact else "NO",
                     "2" if r.kind == "stateless" else "5"])
    return format_table(["task", "moves", "to running p50 s", "max s", "output gap p50 s",
                         "max s", "normal write interval p50/max s", "exact", "goal s"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=4)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="elastiq-bench-migration-"))
    stack = start_stack(work / "stack", cpus_per_agent=2.5, agents=3)
    results = []
    try:
        for case in CASES:
            results.append(run_case(stack, work, case, args.moves))
    finally:
        stop_stack(stack)
    print(table(results))
    return 0 if all(r.exact for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
