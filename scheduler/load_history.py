"""The load history of every task, for dynamic load distribution (pure; docs/load.md).

Owns `LoadHistory`: from each executor heartbeat (its container's cumulative cpu seconds, the
`usage` figures `cpus_user_time_secs` + `cpus_system_time_secs`, and each of its tasks'
cumulative busy seconds, `busy_ms` summed over attempts) the load of every task in CPU seconds per
second over the interval since its previous heartbeat: the agent's measured cpu split between its
tasks in proportion to their busy time in that interval (`split`), or, where the executor
measures no cpu, the task's busy seconds per second. Loads are averaged into time slots of
`slot_seconds` on the scheduler's clock, each interval weighted by its length (a heartbeat that
arrives late makes one long interval and one short one: unweighted, the short one's rate counted
as much as the rest of the slot, and a 1-cpu agent measured 15 CPU s/s on the cluster), so every
task's series has its points at the same times (heartbeats of different executors do not arrive
together); at most `max_slots` per task are kept. `series` gives the tasks' loads at the
complete slots they all have (an agent's series is the sum of its tasks',
`scheduler.load_distribution`). A counter that falls (a new executor) makes
no interval. A heartbeat without cpu figures (the executor's pulse, sent every second beside
its full heartbeats, carries none) leaves the agent's last reading in place: the pulses used to
forget it, so nearly every interval had no cpu and the tasks carried their busy seconds per
second instead (on the cluster, three tasks on an isolated 1-cpu agent summed to ~1.5 while its
cgroup said 0.6). Beside the slots, the intervals whose load came from the agent's cpu are kept
for `recent_seconds`: `measured` gives a task's mean cpu load over those that ended in a recent
window (the shedding problem's per-row costs, `scheduler.shed_problem`), None where no cpu was
measured. Reads no clock, does no I/O. Does not own the decision (`scheduler.distributor`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

CPU_FIGURES = ("cpus_user_time_secs", "cpus_system_time_secs")


def cpu_seconds(usage: Mapping[str, float]) -> float | None:
    """The container's cumulative cpu seconds from an executor's usage figures (None: it
    measured none)."""
    if not all(name in usage for name in CPU_FIGURES):
        return None
    return float(sum(usage[name] for name in CPU_FIGURES))


def split(agent_load: float | None, busy: Mapping[str, tuple[float, float]]
          ) -> dict[str, float]:
    """Each task's load from its (busy seconds, interval seconds): the agent's load shared in
    proportion to the tasks' busy seconds per second, or (no agent load) those themselves."""
    rates = {t: b / dt for t, (b, dt) in busy.items() if dt > 0}
    if agent_load is None:
        return rates
    total = sum(rates.values())
    if total <= 0:
        return {t: 0.0 for t in rates}
    return {t: agent_load * r / total for t, r in rates.items()}


@dataclass
class LoadHistory:
    slot_seconds: float = 5.0
    max_slots: int = 60
    # task -> slot number -> (cpu seconds: the sum of load x interval, the intervals' seconds)
    _slots: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    _busy: dict[str, tuple[float, float]] = field(default_factory=dict)  # task -> (at, busy s)
    _cpu: dict[str, tuple[float, float]] = field(default_factory=dict)  # agent -> (at, cpu s)
    recent_seconds: float = 60.0
    # task -> the intervals split from its agent's cpu, oldest first: (ended at, seconds, load)
    _measured: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.slot_seconds > 0 and self.max_slots >= 2):
            raise ValueError("a load history needs slots of more than 0 s and at least 2 slots")

    def observe(self, at: float, agent: str, cpu: float | None,
                busy: Mapping[str, float]) -> dict[str, float]:
        """One heartbeat from `agent`'s executor at `at`: its cumulative cpu seconds (None: not
        measured) and each task's cumulative busy seconds. Records and returns each task's load
        over the interval since its previous heartbeat (a task seen first has none yet)."""
        agent_load = self._agent_load(at, agent, cpu)
        intervals: dict[str, tuple[float, float]] = {}
        for task, seconds in busy.items():
            previous = self._busy.get(task)
            if previous is not None and at <= previous[0]:
                continue  # a duplicate or reordered heartbeat
            self._busy[task] = (at, seconds)
            if previous is not None and seconds >= previous[1]:
                intervals[task] = (seconds - previous[1], at - previous[0])
        loads = split(agent_load, intervals)
        for task, load in loads.items():
            self._add(task, at, load, intervals[task][1])
            if agent_load is not None:
                self._keep_measured(task, at, load, intervals[task][1])
        return loads

    def _keep_measured(self, task: str, at: float, load: float, seconds: float) -> None:
        kept = self._measured.setdefault(task, [])
        kept.append((at, seconds, load))
        first = next((i for i, k in enumerate(kept) if k[0] >= at - self.recent_seconds),
                     len(kept))
        del kept[:first]

    def measured(self, task: str, since: float) -> float | None:
        """The task's mean load (CPU seconds per second) over the intervals that ended at or
        after `since` whose load came from its agent's measured cpu, weighted by their length;
        None when there is none (no cpu measured: the caller falls back on busy time)."""
        recent = [(seconds, load) for at, seconds, load in self._measured.get(task, ())
                  if at >= since]
        spent = sum(seconds for seconds, _ in recent)
        return sum(s * load for s, load in recent) / spent if spent > 0 else None

    def _agent_load(self, at: float, agent: str, cpu: float | None) -> float | None:
        if cpu is None:  # a pulse (no figures, executor.mesos_executor.pulse) or no cgroup:
            return None  # the last reading stays, the next interval starts from it
        previous = self._cpu.get(agent)
        if previous is not None and at <= previous[0]:
            return None
        self._cpu[agent] = (at, cpu)
        if previous is None or cpu < previous[1]:
            return None
        return (cpu - previous[1]) / (at - previous[0])

    def _add(self, task: str, at: float, load: float, seconds: float) -> None:
        slots = self._slots.setdefault(task, {})
        slot = int(at // self.slot_seconds)
        total, spent = slots.get(slot, (0.0, 0.0))
        slots[slot] = (total + load * seconds, spent + seconds)
        for old in sorted(slots)[:-self.max_slots]:
            del slots[old]

    def slots(self, task: str, now: float) -> dict[int, float]:
        """The task's mean load in each complete slot (before the one `now` is in), over the
        intervals that ended in it, weighted by their length."""
        current = int(now // self.slot_seconds)
        return {s: total / spent for s, (total, spent) in self._slots.get(task, {}).items()
                if s < current and spent > 0}

    def series(self, tasks: Iterable[str], now: float) -> tuple[dict[str, list[float]], int]:
        """Every task's loads at the complete slots all of them have, oldest first, and how many
        those are (0 when one of them has none)."""
        per_task = {t: self.slots(t, now) for t in tasks}
        common = set.intersection(*(set(s) for s in per_task.values())) if per_task else set()
        order = sorted(common)
        return {t: [s[i] for i in order] for t, s in per_task.items()}, len(order)

    def keep_only(self, tasks: Iterable[str]) -> None:
        """Forget every task not in `tasks` (its query gone)."""
        wanted = set(tasks)
        for store in (self._slots, self._busy, self._measured):
            for key in [k for k in store if k not in wanted]:
                del store[key]
