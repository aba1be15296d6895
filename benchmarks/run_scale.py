"""Scale-out as a user would try it: `elastiq run SPEC --agents 5 --cpus 0.4` (issue 31).

Owns this benchmark only (not a test; nothing in tests/ imports it). It writes a spec into a
temporary folder: a generator faster than three instances can follow -> a CPU-heavy `project`
(benchmarks/patterns.py's heavy fields, `max-parallelism="3"`, `partition-by`) -> a cheap filter
keeping half the rows (`--keep-below`) -> a file sink, every operator with
`cpus="0.3"` (an agent of 0.4 holds one task and its executor's 0.1); runs it with
`elastiq run --agents 5 --cpus 0.4` in its own process group (agents isolated with cgroups where
they can be made, docs/deploy.md); measures the sink's rate at parallelism 1; asks for 3 with
`elastiq scale` (the command line, as a user); measures again. Each phase waits until the
instances run and a warm-up passes, then counts sink rows over its window.

Each agent's cpu use over a window is read from outside, through /proc: the processes whose
/proc/PID/cgroup names one of the agent's container cgroups (`elastiq-<agent>-...`), their
user + system ticks (children they waited for included) at the window's start and end; a
process that ended inside the window is counted up to its last reading. Every sink row is
checked against a plain-Python twin of the heavy fields over the generator's reference rows
(none wrong, none twice). The sink's rate is the least-squares slope of its row count, read every
second of the window (`scheduler.elastic_policy.slope`). Goals (issue 31): sink rate at
parallelism 3 >= 2.4x that at 1; every agent <= 1.15 x 0.4 cpus.

    python benchmarks/run_scale.py [--agents 5] [--cpus 0.4] [--rate 3000] [--warm 20]
                                   [--window 40] [--partition-by ts] [--fields 16]
                                   [--chains 12] [--keep-below 50] [--keep]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from bench_util import ROOT, exit_on_sigterm, use_repo_on_path

use_repo_on_path()

from patterns import (  # noqa: E402
    START, heavy_oracle, parse_value, partition_spec, sink_rows,
)
from peers import API_LINE, Job, free_port  # noqa: E402
from scheduler.elastic_policy import slope  # noqa: E402
from testkit.waiting import wait_for  # noqa: E402

CHAINS = 12  # heavy chains per field (an expression holds at most 4,096 characters: 12 fit)
FIELDS = 16  # heavy fields: 16 x 12 x 20 math calls per row
RATIO_GOAL = 2.4  # sink rate at parallelism 3 / at 1
CPU_GOAL = 1.15  # x the agent's cpus
USER_HZ = os.sysconf("SC_CLK_TCK")
CONTAINER = re.compile(r"^elastiq-[^/]+$")  # embedded_mesos.isolation.cgroup_name


# --- the spec and its oracle (pure) --------------------------------------------------------------

def spec_text(name: str, rate: int, limit: int, partition_by: str, chains: int,
              heavy_fields: int, keep_below: float) -> str:
    """patterns.py's partition query, its project elastic up to 3 instances by `partition_by`,
    every operator asking 0.3 cpus, its filter keeping humidity < `keep_below`."""
    return partition_spec(name, 1, rate, limit, cpus=0.3, chains=chains,
                          heavy_fields=heavy_fields,
                          heavy_attr=f' max-parallelism="3" partition-by="{partition_by}"',
                          keep_below=keep_below)


def checked_rows(path: Path, rate: int, chains: int, fields: int, keep_below: float
                 ) -> tuple[int, int, int]:
    """(rows, rows not equal to their plain-Python twin or not in the input, rows seen twice)
    of the sink: each row's (sensor, ts) names its generator row; the oracle is every kept row
    of the generator up to the latest ts the sink holds."""
    rows = list(sink_rows(path))
    if not rows:
        return 0, 0, 0
    last = max(r["ts"] for r in rows)
    start = parse_value(START)
    expected = heavy_oracle(rate, int((last - start).total_seconds() * rate) + 2, chains, fields,
                            keep_below)
    seen = Counter((r["sensor"], r["ts"]) for r in rows)
    wrong = sum(1 for r in rows
                if (want := expected.get((r["sensor"], r["ts"]))) is None
                or not all(math.isclose(r[f"v{i}"], w, rel_tol=1e-9)
                           for i, w in enumerate(want)))
    return len(rows), wrong, sum(n - 1 for n in seen.values() if n > 1)


# --- cpu per agent through /proc ------------------------------------------------------------------

def container_of_cgroup(text: str) -> str | None:
    """The container cgroup named in a process's /proc/PID/cgroup text (its cpu hierarchy's, or
    v2's), when it is one of an embedded agent's (`elastiq-<agent>-<container>`); an agent runs
    one executor container of the query's framework, so a container stands for its agent."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and ("cpu" in parts[1].split(",") or parts[1] == ""):
            last = parts[2].rstrip("/").rsplit("/", 1)[-1]
            if CONTAINER.match(last):
                return last
    return None


def process_ticks(proc: Path = Path("/proc")) -> dict[int, tuple[str, int]]:
    """pid -> (agent, user + system ticks with waited-for children) of our containers'
    processes."""
    found: dict[int, tuple[str, int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            agent = container_of_cgroup((entry / "cgroup").read_text())
            if agent is None:
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        found[int(entry.name)] = (agent, sum(int(fields[i]) for i in (11, 12, 13, 14)))
    return found


@dataclass
class CpuWindow:
    """Each agent's cpu seconds over a window, from repeated /proc readings."""

    first: dict[int, tuple[str, int]]
    last: dict[int, tuple[str, int]]
    started: float
    ended: float = math.nan

    @classmethod
    def begin(cls) -> CpuWindow:
        now = process_ticks()
        return cls(now, dict(now), time.monotonic())

    def sample(self) -> None:
        for pid, (agent, ticks) in process_ticks().items():
            self.last[pid] = (agent, ticks)
        self.ended = time.monotonic()

    def per_agent(self) -> dict[str, float]:
        """cpus used per agent over the window (cpu seconds / wall seconds)."""
        used: Counter[str] = Counter()
        for pid, (agent, ticks) in self.last.items():
            used[agent] += ticks - self.first.get(pid, (agent, 0))[1]
        span = self.ended - self.started
        return {a: t / USER_HZ / span for a, t in sorted(used.items())}


# --- the run ------------------------------------------------------------------------------------

@dataclass
class Phase:
    parallelism: int
    rows_per_s: float
    cpus: dict[str, float]  # container cgroup name -> cpus used over the window
    tasks: dict[str, str] = field(default_factory=dict)  # agent id -> its running tasks

    def named_cpus(self) -> list[str]:
        """Each container's cpus, named by the tasks its agent ran ("t1 0.40")."""
        def name(container: str) -> str:
            return next((t for a, t in self.tasks.items()
                         if container.startswith(f"elastiq-{a}-")), container)
        return [f"{name(c)} {v:.2f}" for c, v in self.cpus.items()]


def agent_tasks(port: int, token_file: Path, query: str) -> dict[str, str]:
    """agent id -> the query's running tasks on it ("t0+t4"), from the scheduler's status."""
    from common.api_client import SchedulerClient

    client = SchedulerClient(f"http://127.0.0.1:{port}", token=token_file.read_text().strip())
    status = client.status(query)
    view = status.get("queries", {}).get(query, status)
    on: dict[str, list[str]] = {}
    for t in view.get("tasks", []):
        if t.get("state") == "running" and t.get("agent_id"):
            on.setdefault(t["agent_id"], []).append(t["task_id"].rsplit(".", 1)[-1])
    return {a: "+".join(sorted(ts)) for a, ts in on.items()}


def sink_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [line for line in text.split("\n")[:-1] if line.strip()]


def measure(sink: Path, k: int, warm: float, window: float) -> Phase:
    time.sleep(warm)
    cpu = CpuWindow.begin()
    t0 = time.monotonic()
    counts = [(0.0, float(len(sink_lines(sink))))]
    while (now := time.monotonic()) < t0 + window:
        time.sleep(1.0)
        cpu.sample()
        counts.append((now - t0, float(len(sink_lines(sink)))))
    return Phase(k, slope(counts), cpu.per_agent())


def scale(port: int, token_file: Path, query: str, k: int) -> None:
    """`elastiq scale QUERY heavy K`, as a user types it; waits until it is done."""
    done = subprocess.run(
        [sys.executable, "-m", "elastiq.cli", "scale", query, "heavy", str(k), "--scheduler",
         f"http://127.0.0.1:{port}", "--token-file", str(token_file)],
        capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"elastiq scale failed: {done.stdout}{done.stderr}")


def run(args: argparse.Namespace, work: Path) -> tuple[list[Phase], tuple[int, int, int]]:
    name = "run-scale"
    spec = work / "spec.xml"
    spec.write_text(spec_text(name, args.rate, 10_000_000, args.partition_by, args.chains,
                              args.fields, args.keep_below), encoding="utf-8")
    sink = work / "out" / f"{name}.jsonl"
    sink.parent.mkdir()
    port, xdg = free_port(), work / "xdg"
    argv = [sys.executable, "-m", "elastiq.cli", "run", str(spec), "--agents", str(args.agents),
            "--cpus", f"{args.cpus:g}", "--state-dir", str(work / "state"), "--no-progress",
            "--api-port", str(port), "--path-root", str(work)]
    job = Job("elastiq", argv, work, env={"PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(xdg)})
    try:
        wait_for("the first sink rows", lambda: sink_lines(sink) or not job.alive(), 300, 0.5)
        if not job.alive():
            raise RuntimeError(f"elastiq run ended: {job.log_path.read_text()[-2000:]}")
        found = API_LINE.search(job.log_path.read_text(encoding="utf-8", errors="replace"))
        assert found is not None, "elastiq run names no API port"
        port = int(found.group(1))
        token = xdg / "elastiq" / f"api-token-{port}"
        phases = [measure(sink, 1, args.warm, args.window)]
        phases[-1].tasks = agent_tasks(port, token, name)
        scale(port, token, name, 3)
        phases.append(measure(sink, 3, args.warm, args.window))
        phases[-1].tasks = agent_tasks(port, token, name)
    finally:
        job.stop(signal.SIGINT, grace=60.0)
    return phases, checked_rows(sink, args.rate, args.chains, args.fields, args.keep_below)


def report(phases: Sequence[Phase], checked: tuple[int, int, int], args: argparse.Namespace) -> str:
    limit = CPU_GOAL * args.cpus
    lines = [f"elastiq run --agents {args.agents} --cpus {args.cpus:g}: heavy project "
             f"({args.fields} fields x {args.chains} chains), partition-by {args.partition_by}, "
             f"generator {args.rate} rows/s; warm-up {args.warm:g} s, window {args.window:g} s"]
    for p in phases:
        cpus = ", ".join(p.named_cpus())
        top = max(p.cpus.values(), default=math.nan)
        lines.append(f"parallelism {p.parallelism}: sink {p.rows_per_s:,.1f} rows/s; each "
                     f"agent's container's cpus (/proc), by its tasks: {cpus}; busiest {top:.2f} "
                     f"(goal <= {limit:.2f}: {'met' if top <= limit else 'MISSED'})")
        if p.rows_per_s == 0:
            lines.append("  no micro-batch reached the sink inside the window: an overloaded "
                         "instance's batches grow with its backlog and outlast the window "
                         "(give a longer --window or a lower --rate)")
    ratio = phases[1].rows_per_s / phases[0].rows_per_s if phases[0].rows_per_s else math.nan
    lines.append(f"sink rate p3 / p1: {ratio:.2f} (goal >= {RATIO_GOAL}: "
                 f"{'met' if ratio >= RATIO_GOAL else 'MISSED'})")
    rows, wrong, twice = checked
    lines.append(f"sink rows: {rows:,}, {wrong} wrong, {twice} twice (goal 0, 0: "
                 f"{'met' if wrong == twice == 0 else 'MISSED'})")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--cpus", type=float, default=0.4)
    parser.add_argument("--rate", type=int, default=3000, help="generator rows/s")
    parser.add_argument("--warm", type=float, default=20.0, help="seconds before a window")
    parser.add_argument("--window", type=float, default=40.0, help="seconds counted")
    parser.add_argument("--partition-by", default="ts", help="the project's partition key")
    parser.add_argument("--fields", type=int, default=FIELDS, help="heavy fields per row")
    parser.add_argument("--chains", type=int, default=CHAINS,
                        help="heavy chains per field (the cost per row)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's folder (state, executor logs, sink) for a look")
    parser.add_argument("--keep-below", type=float, default=50.0,
                        help="the filter keeps humidity (20..80) below this: 50 keeps half, so "
                             "a window's count at the sink is not a few batches' worth")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="run-scale-"))
    try:
        phases, checked = run(args, work)
    finally:  # the run's state, logs and sink (~50 MB a run), unless asked to keep them
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(report(phases, checked, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
