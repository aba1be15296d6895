"""The cpu time an executor's container spent in each micro-batch, for the cost model.

Why: under a CFS quota a batch's busy *wall* time is its cpu time stretched by throttling and by
whatever else the machine runs, and that stretch persists from batch to batch. Batches run back
to back, so a slow batch makes the next one larger (more rows arrived meanwhile) and slow too:
fitted on wall time, the cost per row reads as 1 / the arrival rate (issue 31's run at 0.35 cpu:
3.9-8.3 ms per row at 150 rows/s, 1.8 ms at 600), and the capacity follows the load. Cpu time is
the work itself: the scheduler fits the model on it and converts it to batch time at the cpu
the batches ran with (`scheduler.elastic_policy.modelled`).

Owns:
- `CpuTrace` (pure): a bounded series of (wall-clock seconds, cumulative cpu seconds) readings
  and `between(start, end)`, the cpu used in an interval, interpolated between readings (None
  when the readings do not cover it);
- `container_cpu_seconds`: the cumulative cpu time of the cgroup the executor is in (v1
  `cpuacct.usage`, v2 `cpu.stat` `usage_usec`), None in the root cgroup or when unreadable;
- `CpuSampler`: a daemon thread reading it every `interval` seconds into a trace, and
  `batch_cpu_seconds(report)`: the cpu of one Spark progress report's batch
  ([timestamp, timestamp + triggerExecution]); `shared_sampler()` starts one per process, only
  when the executor is in a cgroup it can read (elsewhere batches carry no cpu figure and the
  model fits wall time, as before).
Counts the whole container: with several tasks in one executor, concurrent batches are each
charged all of it (an over-estimate of cost: scale-outs come earlier, never later).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from executor.usage import CGROUP_ROOT, PROC, parse_cgroup_paths, parse_keyed

SAMPLE_SECONDS = 0.1  # between readings: a batch's cpu is then off by at most 2 x 0.1 x its cpus
KEEP_READINGS = 1200  # two minutes of readings (a batch longer than that gets no cpu figure)


class CpuTrace:
    """Readings of (wall-clock seconds, cumulative cpu seconds), oldest first, at most `keep`;
    one not later than the last is ignored."""

    def __init__(self, keep: int = KEEP_READINGS) -> None:
        self._times: deque[float] = deque(maxlen=keep)
        self._cpu: deque[float] = deque(maxlen=keep)

    def add(self, at: float, cpu: float) -> None:
        if self._times and at <= self._times[-1]:
            return
        self._times.append(at)
        self._cpu.append(cpu)

    @property
    def last(self) -> float | None:
        return self._times[-1] if self._times else None

    def cpu_at(self, at: float) -> float | None:
        """Cumulative cpu seconds at `at`, linear between the readings around it (None outside
        them)."""
        times = list(self._times)
        if not times or not times[0] <= at <= times[-1]:
            return None
        i = bisect.bisect_left(times, at)
        if times[i] == at:
            return self._cpu[i]
        t0, t1, c0, c1 = times[i - 1], times[i], self._cpu[i - 1], self._cpu[i]
        return c0 + (c1 - c0) * (at - t0) / (t1 - t0)

    def between(self, start: float, end: float) -> float | None:
        """Cpu seconds used in [start, end] (>= 0), None when the readings do not cover it."""
        if end < start:
            return None
        first, last = self.cpu_at(start), self.cpu_at(end)
        if first is None or last is None:
            return None
        return max(0.0, last - first)


def container_cpu_seconds(proc_self_cgroup: str, root: Path = CGROUP_ROOT) -> float | None:
    """The cumulative cpu seconds of the cgroup named by /proc/PID/cgroup text (v1's cpuacct,
    else v2's unified hierarchy); None in the root cgroup or when it cannot be read."""
    paths = parse_cgroup_paths(proc_self_cgroup)
    try:
        if "cpuacct" in paths:
            path = paths["cpuacct"]
            if path in ("", "/"):
                return None
            text = (root / "cpuacct" / path.lstrip("/") / "cpuacct.usage").read_text()
            return int(text.strip()) / 1e9
        if "2" in paths and paths["2"] not in ("", "/"):
            stat = parse_keyed((root / paths["2"].lstrip("/") / "cpu.stat").read_text())
            return stat["usage_usec"] / 1e6 if "usage_usec" in stat else None
    except (OSError, ValueError):
        return None
    return None


def batch_interval(report: Mapping[str, Any]) -> tuple[float, float] | None:
    """(start, end) in wall-clock seconds of a progress report's batch: its `timestamp` (the
    trigger's start, ISO-8601) and `durationMs.triggerExecution` after; None when absent."""
    text = report.get("timestamp")
    duration = (report.get("durationMs") or {}).get("triggerExecution")
    if not isinstance(text, str) or not isinstance(duration, (int, float)):
        return None
    try:
        start = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    begin = start.timestamp()
    return begin, begin + duration / 1000.0


class CpuSampler:
    """Reads `read()` (cumulative cpu seconds, None: unreadable) every `interval` seconds into
    a trace, in a daemon thread started by `start`."""

    def __init__(self, read: Callable[[], float | None], interval: float = SAMPLE_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.read, self.interval, self.clock = read, interval, clock
        self.trace = CpuTrace()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def sample(self) -> None:
        cpu = self.read()
        if cpu is not None:
            with self._lock:
                self.trace.add(self.clock(), cpu)

    def start(self) -> None:
        threading.Thread(target=self._run, name="cpu-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def batch_cpu_seconds(self, report: Mapping[str, Any]) -> float | None:
        """The container's cpu seconds in the batch of a progress report (None: unknown)."""
        interval = batch_interval(report)
        if interval is None:
            return None
        last = self.trace.last
        if last is None or interval[1] > last:  # ended after the last reading: read now
            self.sample()
        with self._lock:
            return self.trace.between(*interval)


_SHARED: list[CpuSampler | None] = []
_SHARED_LOCK = threading.Lock()


def shared_sampler(proc: Path = PROC) -> CpuSampler | None:
    """This process's sampler, started on first use; None when the executor is in no cgroup
    whose cpu time it can read."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(_start_sampler(proc))
        return _SHARED[0]


def _start_sampler(proc: Path) -> CpuSampler | None:
    def read() -> float | None:
        try:
            return container_cpu_seconds((proc / "self" / "cgroup").read_text())
        except OSError:
            return None

    if read() is None:
        return None
    sampler = CpuSampler(read)
    sampler.sample()
    sampler.start()
    return sampler


__all__ = ["CpuTrace", "CpuSampler", "container_cpu_seconds", "batch_interval",
           "shared_sampler", "SAMPLE_SECONDS"]
