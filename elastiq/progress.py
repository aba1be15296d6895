"""The live progress line of `elastiq run` and `elastiq status --watch`.

Owns turning a query's status (as the scheduler reports it, with the figures of the executors'
heartbeats) into one short line, and drawing that line in place on a terminal. Rates are derived
here from successive counts; nothing is stored anywhere else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, TextIO


@dataclass
class ProgressLine:
    """Draws one status line in place (on a terminal) or every few seconds (in a log)."""

    stream: TextIO
    enabled: bool = True
    _shown: bool = False
    _last_plain: float = 0.0

    def show(self, text: str) -> None:
        if not self.enabled or not text:
            return
        if self.stream.isatty():
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()
            self._shown = True
        elif time.monotonic() - self._last_plain >= 5.0:
            self._last_plain = time.monotonic()
            print(text, file=self.stream, flush=True)

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._shown = False


@dataclass
class RateMeter:
    """Tuples per second from successive cumulative counts."""

    _previous: tuple[float, int] | None = None
    rate: float = 0.0

    def update(self, count: int, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        if self._previous is not None and now > self._previous[0]:
            elapsed = now - self._previous[0]
            if elapsed >= 3.0:  # heartbeats come each second: average over a few
                self.rate = max(0, count - self._previous[1]) / elapsed
                self._previous = (now, count)
        else:
            self._previous = (now, count)
        return self.rate


@dataclass
class AgentCpu:
    """Each agent's cpu use against the cpus it offers, from successive cumulative cpu seconds
    of its executors (its `/monitor/statistics`): `cpu 0.48/0.5 0.31/0.5` (pure; the caller
    measures, at most every `every` seconds)."""

    every: float = 3.0
    _previous: dict[str, tuple[float, float]] = field(default_factory=dict)  # agent -> (t, s)
    rates: dict[str, float] = field(default_factory=dict)

    def due(self, now: float) -> bool:
        return not self._previous or now - min(t for t, _ in self._previous.values()) >= self.every

    def update(self, used: Mapping[str, float], now: float) -> None:
        """`used`: agent -> its executors' cpu seconds so far (a drop: an executor ended)."""
        for agent, seconds in used.items():
            before = self._previous.get(agent)
            if before is not None and now > before[0]:
                self.rates[agent] = max(0.0, seconds - before[1]) / (now - before[0])
            self._previous[agent] = (now, seconds)

    def line(self, limits: Mapping[str, float]) -> str:
        """`cpu USED/LIMIT ...` per agent in id order; "" before two measurements."""
        known = [a for a in sorted(limits) if a in self.rates]
        if not known:
            return ""
        return "cpu " + " ".join(f"{self.rates[a]:.2f}/{limits[a]:g}" for a in known)


@dataclass
class Summary:
    meter: RateMeter = field(default_factory=RateMeter)

    def __call__(self, status: dict[str, Any] | None) -> str:
        return summarize(status, self.meter)


def summarize(status: dict[str, Any] | None, meter: RateMeter | None = None) -> str:
    """`running | tasks 2/2 running | 12,345 tuples in (1,980/s) | 60 out | batch 210 ms | ...`
    (tuples in: read by the query's sources; out: written by its sinks)."""
    if not status:
        return "waiting for the scheduler"
    tasks = status.get("tasks", [])
    running = sum(1 for t in tasks if t.get("state") == "running")
    figures = [t.get("figures") or {} for t in tasks]
    # in: what the sources read (tasks fed by no channel); out: what the sinks wrote (tasks
    # serving no channel), so channel hops between tasks count neither way
    into = sum(int((t.get("figures") or {}).get("tuples_in", 0) or 0) for t in tasks
               if not t.get("reads_channels"))
    out = sum(int((t.get("figures") or {}).get("tuples_out", 0) or 0) for t in tasks
              if not t.get("serves_channels"))
    parts = [str(status.get("status", status.get("phase", "?"))),
             f"tasks {running}/{len(tasks)} running", f"{into:,} tuples in"]
    if meter is not None:
        parts[-1] += f" ({meter.update(into):,.0f}/s)"
    parts.append(f"{out:,} out")
    batch = [float(f["batch_ms"]) for f in figures if f.get("batch_ms")]
    if batch:
        parts.append(f"batch {max(batch):,.0f} ms")
    latency = [float(f["latency_ms"]) for f in figures if f.get("latency_ms")]
    if latency:
        parts.append(f"latency {max(latency) / 1000:.1f} s")
    waiting = [t.get("waiting_for") for t in tasks if t.get("waiting_for")] or \
        [w for w in (first_output_wait(tasks, out),) if w]
    if waiting:
        parts.append(f"waiting: {waiting[0]}")
    if status.get("failure"):  # why the query failed, in the scheduler's words
        parts.append(f"why: {status['failure']}")
    return " | ".join(parts)


def first_output_wait(tasks: list[dict[str, Any]], out: int) -> str:
    """What a query without results yet waits for, once its tasks are placed (pure): the
    executor (a JVM and a SparkSession, then the task's query), its first micro-batch, or its
    first result (a window emits once the watermark passes its end)."""
    if out or not tasks:
        return ""
    if any(t.get("state") in ("staging", "starting") for t in tasks):
        return "executor start (JVM, SparkSession) and the task's query"
    if not all(t.get("state") == "running" for t in tasks):
        return ""
    if not any((t.get("figures") or {}).get("batch_ms") for t in tasks):
        return "the first micro-batch"
    return "the first result (a window emits once the watermark passes its end)"


# what a moving task waits for in each phase of `elastiq migrate` (the phase: `migration_phase`)
MIGRATION_WAITS = {
    "stopping": "the old attempt to finish its micro-batch and stop",
    "pending": "an offer from the target agent",
    "staging": "the target agent's executor to take the task (on an agent that runs no executor "
               "yet, a new executor process starts first)",
    "starting": "the executor's SparkSession (a new JVM on an agent that ran no executor: "
                "~10 s) and the task's query",
}


def migration_phase(task: dict[str, Any], old_attempt: int) -> str:
    """The phase a task being moved is in, from its status view (pure): `stopping` while its
    old attempt runs, then its new attempt's state (pending, staging, starting, running, or a
    terminal one)."""
    if int(task.get("attempt", 0) or 0) <= old_attempt:
        return "stopping"
    return str(task.get("state", "?"))


@dataclass
class Timeline:
    """The phases a task went through and how long each lasted (seconds from a start)."""

    started: float
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, began at)

    def observe(self, phase: str, now: float) -> bool:
        """Record `phase` seen at `now`; True when it is a new one."""
        if self.phases and self.phases[-1][0] == phase:
            return False
        self.phases.append((phase, now))
        return True

    def durations(self, now: float) -> list[tuple[str, float]]:
        """Each phase but the current one with its length; the current one up to `now`."""
        ends = [at for _, at in self.phases[1:]] + [now]
        return [(phase, end - at) for (phase, at), end in zip(self.phases, ends)]

    def summary(self, now: float) -> str:
        """`stopping 0.3 s, pending 0.1 s, starting 11.2 s` without the last phase (the one the
        task is in now)."""
        return ", ".join(f"{phase} {seconds:.1f} s"
                         for phase, seconds in self.durations(now)[:-1])
