"""Small helpers shared by the scripts in benchmarks/: repo on the import path, statistics, tables.

Owns only presentation and arithmetic (percentiles, medians, ratios, a plain-text table),
putting the repository on `sys.path` and `PYTHONPATH` (so Spark's Python workers, started later by
the JVM, import `executor.*` the way an executor launched by Elastiq does), starting a one-task
spec's task as an executor does (`start_task`), counting a growing sink's lines cheaply
(`LineCounter`: a probe polled while a run is measured must not take the cores it
measures), reading each embedded agent's containers' cpu seconds (`agents_cpu_seconds`), putting an
in-process benchmark in a cgroup of its own as an isolated agent (`OwnCgroup`), and turning
SIGTERM into an exit that runs the scripts' `finally` blocks (`exit_on_sigterm`).
Does not own any measurement: each benchmark script measures its own thing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
import sys
import threading
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[1]


def exit_on_sigterm() -> None:
    """Make SIGTERM (`kill`, `timeout`) end the script as Ctrl-C does, through its `finally`
    blocks, so the clusters, executors and sessions it started are stopped, not orphaned."""
    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)


def use_repo_on_path() -> None:
    """Make `compiler`, `executor`, ... importable here and in child processes (Spark workers)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    existing = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in existing.split(os.pathsep):
        os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{existing}" if existing else str(ROOT)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median_of(values: Sequence[float]) -> float:
    """Median ignoring NaN; NaN when nothing is left."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned first column, right-aligned figures, one line per row."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = str(cells[0]).ljust(widths[0])
        rest = [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest])

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([line(header), rule, *[line(r) for r in rows]])


def fmt(value: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def start_task(spark: Any, spec: str, spec_path: Path, base_dir: Path, query_id: str,
               run_dir: Path) -> Any:
    """Compile `spec` (a plan of one task) and start that task as an executor does: its
    generated program written to `run_dir`, run by a `TaskRunner` whose checkpoint is
    `run_dir/checkpoint`. Returns the started runner (its query is `runner.runtime.query`)."""
    from compiler.pipeline import compile_spec_text
    from executor.task_runner import TaskRunner

    compilation = compile_spec_text(spec, str(spec_path), base_dir=base_dir, query_id=query_id)
    (task,) = compilation.query.tasks
    program = run_dir / "program.py"
    program.write_text(task.program, encoding="utf-8")
    runner = TaskRunner(spark, program, {"query_id": task.query_id, "task_id": task.task_id,
                                         "checkpoint_dir": str(run_dir / "checkpoint")})
    runner.start()
    assert runner.runtime is not None and runner.runtime.query is not None
    return runner


class LineCounter:
    """Counts the lines of a growing file incrementally (a cheap completeness probe)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.lines = path, 0, 0

    def count(self) -> int:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return 0
        if size < self.offset:  # a torn append cut back: count again
            self.offset, self.lines = 0, 0
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        cut = chunk.rfind(b"\n") + 1
        self.lines += chunk.count(b"\n", 0, cut)
        self.offset += cut
        return self.lines


class Periodic:
    """Calls `sample()` every `every` seconds on a daemon thread from `__enter__` to `__exit__`
    (the benchmarks' status samplers). A sample that fails (a status taken while the query
    stops) is logged and sampling goes on. A subclass sets its own state, calls
    `super().__init__(every, name)` and holds `self._lock` around what `sample` and its readers
    share."""

    def __init__(self, every: float, name: str) -> None:
        self._every = every
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.sample()
            except Exception:
                logging.getLogger("bench").exception("%s: a sample failed", self._thread.name)

    def sample(self) -> None:
        raise NotImplementedError


def agents_statistics(agents: Sequence[Any], names: Sequence[str]
                      ) -> dict[str, tuple[float, ...]]:
    """agent id -> each of `names` (fields of Mesos 1.11's `/monitor/statistics`, e.g.
    `cpus_nr_throttled`) summed over its executor containers, from each agent's endpoint (the
    agents' `url` and `agent_id`)."""
    out = {}
    for agent in agents:
        with urllib.request.urlopen(f"{agent.url}/monitor/statistics", timeout=10) as r:
            entries = json.load(r)
        out[agent.agent_id] = tuple(sum(float(e["statistics"].get(n, 0.0)) for e in entries)
                                    for n in names)
    return out


def agents_cpu_seconds(agents: Sequence[Any]) -> dict[str, float]:
    """agent id -> the user + system cpu seconds of its executor containers so far."""
    return {a: sum(v) for a, v in agents_statistics(
        agents, ("cpus_user_time_secs", "cpus_system_time_secs")).items()}


class OwnCgroup:
    """This benchmark process, and every process it starts afterwards (Spark's JVM and its
    Python workers), in a cgroup of `cpus` (`embedded_mesos.isolation`: the CFS quota and shares
    an agent of that size gives its container), so an in-process benchmark runs as one isolated
    agent would and reads the cpu seconds it used (`cpu_seconds`). Use as a context manager,
    entered before the SparkSession starts and left after it stopped: leaving moves this process
    back to the top cgroup and destroys its own (killing anything left in it)."""

    def __init__(self, cpus: float, mem_mb: float = 8192.0) -> None:
        from embedded_mesos.isolation import ContainerCgroup, probe

        found = probe()
        if found.hierarchy is None:
            raise RuntimeError(f"no cgroup can be made here: {found.reason}")
        self.cpus = cpus
        self.cgroup = ContainerCgroup(found.hierarchy, f"elastiq-bench-{os.getpid()}")
        self.cgroup.create(cpus, mem_mb)

    def __enter__(self) -> Self:
        for procs in self.cgroup.procs_files():
            procs.write_text(str(os.getpid()))
        return self

    def cpu_seconds(self) -> float:
        stats = self.cgroup.statistics(0.0)
        return stats["cpus_user_time_secs"] + stats["cpus_system_time_secs"]

    def __exit__(self, *exc: object) -> None:
        for directory in self.cgroup.directories():
            (directory.parent / "cgroup.procs").write_text(str(os.getpid()))
        self.cgroup.destroy()
