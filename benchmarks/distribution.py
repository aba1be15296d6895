"""Load distribution on the embedded cluster (issue 32, Xing-Zdonik-Hwang): two isolated agents,
four tasks whose loads follow two anti-correlated waves, first fit against the distributor.

Owns this benchmark only (not a test; tests/test_distribution_bench.py checks its pure parts:
the spec, the oracle, the waves, the figures and the mean-only balancer; the cluster test
tests/test_distribution_cluster.py runs the same query shape with steady rates). It runs one
query it writes itself, `distribute="true"`, of four chains, each one task:

    g<i> := generator(sensor shape, paced) -> heavy<i> := project with FIELDS heavy columns
      -> keep<i> := filter(humidity < 26) -> file sink out/c<i>.jsonl

on the stack of testkit/e2e_support.py: two embedded agents isolated with cgroups (each
executor container held to its executor's and tasks' cpus), the framework scheduler with the
load distributor on (its `DistributionSettings`: rounds every 30 s, 24 slots of 5 s of history),
one real executor and SparkSession per agent. Every task asks for 0.3 cpus and each agent has
1.0 (the executor's 0.1 and three tasks), so gang first fit puts three tasks on one agent (A)
and the fourth on the other (B). The benchmark then drives the generators' rates through control
tuples (what `elastiq control` sends) in two anti-correlated square waves of WAVE_SECONDS: two
tasks of A on wave 1, the third task of A and B's task on wave 2, so A's two wave-1 tasks peak
together (the issue's example; `tests/test_distributor.py` has it in pure form).

Each agent's load is its executor container's cpu seconds per second (cgroup cpuacct, the
agent's `GET /monitor/statistics`), sampled once a second and averaged over 5 s slots.
Figures: the busiest agent's peak slot under first fit (from the first full wave until the
distributor's first move) and after it (from one wave after the moved task runs again, for
MEASURE_WAVES waves); the distributor's moves; the moves a balancer of mean load only would have
made over the same per-task loads (`mean_only_moves`: offline, pure, every round over the last
round's slots as a balancer of current load does; and the one it makes over the distributor's
whole window, with the peak its choice leaves); and whether every sink equals a plain-Python
oracle (moves lose nothing). Goals (issue 32): the peak of the busiest agent drops by >= 25 %
against first fit; fewer moves than a placement balancing mean load only; results exact.

    python benchmarks/distribution.py [--fields 5] [--high 1500] [--low 100] [--repeats 1]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository: `benchmarks.*` (as the tests import it), `common`
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_util import (  # noqa: E402
    Periodic, agents_cpu_seconds, exit_on_sigterm, format_table, median_of, use_repo_on_path,
)

use_repo_on_path()

from testkit.distribution_support import (CHAINS, oracle, set_rates, sink_key,  # noqa: E402
                                          sink_paths, spec)
from testkit.heavy_fields import LITERAL_CHARS  # noqa: E402

log = logging.getLogger("bench.distribution")

QUERY = "bench-distribute"
SLOT_SECONDS = 5.0  # the scheduler's load history slots (scheduler.load_history)


# --- the waves and the figures (pure) -----------------------------------------------------------

def wave_of(placement: Mapping[str, str]) -> dict[str, int]:
    """Each task's wave (1 or 2) from first fit's placement (task -> agent): the first two tasks
    of the agent with three peak together (wave 1), its third and the other agent's task peak
    against them (wave 2)."""
    per_agent: dict[str, list[str]] = {}
    for task, agent in sorted(placement.items()):
        per_agent.setdefault(agent, []).append(task)
    sizes = sorted(len(ts) for ts in per_agent.values())
    if sizes != [1, 3]:
        raise ValueError(f"first fit placed {dict(placement)}, not three tasks and one")
    three = next(ts for ts in per_agent.values() if len(ts) == 3)
    return {t: 1 if t in three[:2] else 2 for t in placement}


def rates_at(half: int, waves: Mapping[str, int], generator: Mapping[str, str], high: float,
             low: float) -> dict[str, float]:
    """Generator -> rate in half-wave number `half` (0, 1, ...): wave 1 high in even halves,
    wave 2 in odd ones."""
    return {generator[t]: high if (w == 1) == (half % 2 == 0) else low for t, w in waves.items()}


def slot_loads(samples: Sequence[tuple[float, float]], slot: float = SLOT_SECONDS
               ) -> dict[int, float]:
    """Cumulative cpu seconds sampled at (time, seconds) -> the mean cpu s/s in each slot of
    `slot` seconds (slot number = time // slot) that the samples' intervals cover; an interval
    is counted in the slot of its end; a counter that falls makes no interval."""
    sums: dict[int, tuple[float, float]] = {}
    for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
        if t1 <= t0 or c1 < c0:
            continue
        s = int(t1 // slot)
        used, spent = sums.get(s, (0.0, 0.0))
        sums[s] = (used + c1 - c0, spent + t1 - t0)
    return {s: used / spent for s, (used, spent) in sums.items() if spent > 0}


def peak(agent_slots: Mapping[str, Mapping[int, float]], first: int, last: int) -> float:
    """The highest slot load of any agent in slots first..last (NaN when none)."""
    values = [v for slots in agent_slots.values() for s, v in slots.items() if first <= s <= last]
    return max(values) if values else math.nan


@dataclass(frozen=True)
class MeanOnly:
    """What a balancer of mean load only does over the same per-task loads (offline)."""
    moves: int
    peak_after: float  # the busiest agent's peak over the `after` slots under its placement
    placement: dict[str, str]  # where it left the tasks


def mean_only_moves(task_slots: Mapping[str, Mapping[int, float]], first_fit: Mapping[str, str],
                    first: int, last: int, after: tuple[int, int], window: int | None,
                    period_slots: int, min_slots: int, threshold: float,
                    pair_cooldown_slots: int, task_cooldown_slots: int) -> MeanOnly:
    """Rounds every `period_slots` over slots first..last of the tasks' loads, from first fit,
    with the distributor's threshold, minimum history and cool-downs, but choosing by mean load
    only: once `min_slots` slots are seen, each round compares the two agents' mean loads over
    the last `window` slots (None: every slot so far, as the distributor's history) and, while
    the gap is at least `threshold` and a move narrows it, moves the busier agent's task whose
    move leaves the smallest gap. Returns the moves made, where the tasks ended and the
    busiest agent's peak over the `after` slots (each slot under the placement of its time)."""
    agents = sorted(set(first_fit.values()))
    where = dict(first_fit)
    slots = [s for s in range(first, last + 1) if all(s in task_slots[t] for t in where)]
    load = {t: [task_slots[t][s] for s in slots] for t in where}
    placed_at: list[dict[str, str]] = []
    moves, task_moved, pair_moved = 0, {t: -10**9 for t in where}, -10**9
    for i, s in enumerate(slots):
        if i + 1 >= min_slots and (i + 1 - min_slots) % period_slots == 0 and \
                i - pair_moved >= pair_cooldown_slots and len(agents) == 2:
            lo = 0 if window is None else max(0, i + 1 - window)

            def mean(agent: str) -> float:
                return sum(sum(load[t][lo:i + 1]) / (i + 1 - lo)
                           for t in where if where[t] == agent)
            busy, idle = sorted(agents, key=mean, reverse=True)
            gap = mean(busy) - mean(idle)
            if gap >= threshold:
                while True:
                    options = []
                    for t in sorted(where):
                        if where[t] != busy or i - task_moved[t] < task_cooldown_slots:
                            continue
                        m = sum(load[t][lo:i + 1]) / (i + 1 - lo)
                        options.append((abs(gap - 2 * m), t, m))
                    if not options or min(options)[0] >= abs(gap):
                        break
                    _, t, m = min(options)
                    where[t], gap = idle, gap - 2 * m
                    moves, task_moved[t], pair_moved = moves + 1, i, i
        placed_at.append(dict(where))
    highest = math.nan
    for s, placed in zip(slots, placed_at):
        if after[0] <= s <= after[1]:
            for a in agents:
                v = sum(task_slots[t][s] for t in placed if placed[t] == a)
                highest = v if math.isnan(highest) else max(highest, v)
    return MeanOnly(moves, highest, where)


# --- one run on the cluster ---------------------------------------------------------------------

AGENT_CPUS = 1.0  # each agent: the executor's 0.1 and three tasks of 0.3
EXECUTOR_CPUS = 0.1
TASK_CPUS = 0.3
WAVE_SECONDS = 60.0  # one period of the square waves (each half 30 s: six 5 s slots)
SETTLE_WAVES = 1  # after the moved task runs again, before the `after` figures
MEASURE_WAVES = 2  # waves measured after the move
FIRST_MOVE_WITHIN = 300.0  # s from the first wave; else the run reports no move
MIN_BATCH_SECONDS = "1.0"  # the executors' ELASTIQ_MIN_BATCH_INTERVAL (docs/deploy.md)
# The distributor's other settings are its defaults; its minimum history is two minutes, not
# one: the history starts with the tasks (their executors' start-up, before any wave) and should
# hold a wave and a half before the first round may move (with one minute, the first run moved
# 38 s after the waves began, on a score of 0.11).
MIN_SLOTS = 24


@dataclass
class Sample:
    at: float
    cpu: dict[str, float]  # agent -> its executor container's cumulative cpu seconds
    tasks: dict[str, tuple[str, str, float]]  # task -> (agent, state, busy seconds this attempt)


class Sampler(Periodic):
    """Once a second: each agent's `/monitor/statistics` and the query's status (tasks' agents,
    states and busy time; the distributor's view), on a thread."""

    def __init__(self, stack: Any, query: str) -> None:
        self.stack, self.query = stack, query
        self.samples: list[Sample] = []
        self.distribution: dict[str, Any] = {}
        self.decisions: list[tuple[float, dict[str, Any]]] = []
        super().__init__(1.0, "sampler")

    def sample(self) -> None:
        cpu = agents_cpu_seconds(self.stack.cluster.agents)
        at = time.monotonic()
        status = self.stack.service.status()
        view = (status.get("queries") or {}).get(self.query) or {}
        tasks = {t["task_id"]: (t.get("agent_id") or "", t["state"],
                                float((t.get("figures") or {}).get("busy_ms") or 0.0) / 1000.0)
                 for t in view.get("tasks", [])}
        with self._lock:
            self.samples.append(Sample(at, cpu, tasks))
            self.distribution = status.get("distribution") or {}
            d = self.distribution.get("decision")
            if d and (not self.decisions or self.decisions[-1][1]["at"] != d["at"]):
                self.decisions.append((at, d))

    def snapshot(self) -> tuple[list[Sample], dict[str, Any], list[tuple[float, dict]]]:
        with self._lock:
            return list(self.samples), dict(self.distribution), list(self.decisions)


@dataclass
class Run:
    first_fit: dict[str, str] = field(default_factory=dict)  # task -> agent
    waves: dict[str, int] = field(default_factory=dict)
    waves_at: float = math.nan  # the first half-wave's rates taken
    move_at: float = math.nan  # the distributor's first move seen started
    moved_running_at: float = math.nan  # the moved task running on its target
    end_at: float = math.nan
    moves: list[dict[str, Any]] = field(default_factory=list)  # the distributor's, started
    decisions: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    flips: list[float] = field(default_factory=list)
    exact: bool = False
    diff: str = ""
    load: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())


@dataclass(frozen=True)
class Plan:
    fields: int
    high: float  # rows/s of a generator at its wave's crest
    low: float  # and in its trough

    @property
    def limit(self) -> int:
        """Rows per generator: the mean rate for 480 s (start-up, first fit, the move, the
        settling and the measured waves); the rest is made at a high rate at the end."""
        return int((self.high + self.low) / 2 * 480)


def run_once(stack: Any, work: Path, plan: Plan) -> Run:
    from compiler.pipeline import compile_spec_text
    from testkit.e2e_support import stop_query, submit, wait_running

    query = compile_spec_text(spec(QUERY, plan.low, plan.limit, plan.fields, TASK_CPUS).encode(),
                              str(work / f"{QUERY}.xml"), base_dir=work, query_id=QUERY).query
    generator = {t.task_id: next(o for o in t.operators if o.startswith("g"))
                 for t in query.tasks}
    result = Run(load=(os.getloadavg(), ()))
    submit(stack, query)
    try:
        with Sampler(stack, QUERY) as sampler:
            view = wait_running(stack, QUERY, timeout=300)
            result.first_fit = {t["task_id"]: t["agent_id"] for t in view["tasks"]}
            result.waves = wave_of(result.first_fit)
            log.info("first fit: %s; waves %s", result.first_fit, result.waves)
            half, started = 0, math.nan
            phase_end = math.inf
            while time.monotonic() < phase_end:
                set_rates(stack, QUERY, rates_at(half, result.waves, generator, plan.high,
                                                 plan.low))
                now = time.monotonic()
                if half == 0:
                    started = result.waves_at = now
                result.flips.append(now)
                samples, _, _ = sampler.snapshot()
                log.info("half-wave %s; agents' cpu s/s over the last 30 s: %s", half, {
                    a[-5:]: round(_recent(samples, a, 30.0), 3)
                    for a in (samples[-1].cpu if samples else {})})
                half += 1
                next_flip = started + half * WAVE_SECONDS / 2
                while time.monotonic() < min(next_flip, phase_end):
                    time.sleep(0.5)
                    _, dist, _ = sampler.snapshot()
                    moved = [m for m in dist.get("recent", []) if m["started"]]
                    if moved and math.isnan(result.move_at):
                        result.move_at = time.monotonic()
                        log.info("the distributor moved: %s", moved)
                    if moved and math.isnan(result.moved_running_at):
                        m = moved[0]
                        t = stack.tasks(QUERY).get(m["task"], {})
                        if t.get("state") == "running" and t.get("agent_id") == m["to"]:
                            result.moved_running_at = time.monotonic()
                            phase_end = result.moved_running_at + \
                                (SETTLE_WAVES + MEASURE_WAVES) * WAVE_SECONDS
                    if not moved and time.monotonic() - started > FIRST_MOVE_WITHIN:
                        log.warning("no move within %.0f s of the first wave",
                                    FIRST_MOVE_WITHIN)
                        phase_end = time.monotonic()
            result.end_at = time.monotonic()
            result.samples, dist, result.decisions = sampler.snapshot()
            result.moves = [m for m in dist.get("recent", []) if m["started"]]
        log.info("flushing the rest of the generators' %s rows each (not measured)", plan.limit)
        set_rates(stack, QUERY, {g: 20 * plan.high for g in generator.values()})
        result.exact, result.diff = sinks_match(work, plan)
    finally:
        stop_query(stack, QUERY)
    result.load = (result.load[0], os.getloadavg())
    return result


def _recent(samples: Sequence[Sample], agent: str, seconds: float) -> float:
    """The agent's cpu s/s over the last `seconds` of samples (for the log)."""
    recent = [s for s in samples if s.at >= samples[-1].at - seconds and agent in s.cpu]
    if len(recent) < 2:
        return math.nan
    return (recent[-1].cpu[agent] - recent[0].cpu[agent]) / (recent[-1].at - recent[0].at)


def sinks_match(work: Path, plan: Plan) -> tuple[bool, str]:
    """Whether every sink equals its oracle (waited for, bounded), and the differences if not."""
    from testkit.e2e_support import multiset_diff, read_sink, wait_until

    diffs = []
    for c, path in enumerate(sink_paths(work)):
        expected = oracle(plan.low, plan.limit, plan.fields, c)

        def actual(p: Path = path) -> Counter:
            return Counter(sink_key(r, plan.fields) for r in read_sink(p))

        def equal(e: Counter = expected, p: Path = path) -> bool:
            return actual(p) == e
        try:
            wait_until(equal, 300, f"sink {c} = its oracle", step=2.0)
        except AssertionError:
            diffs.append(f"sink {c}: {multiset_diff(expected, actual())}")
    return not diffs, "\n".join(diffs)


# --- the figures of a run -----------------------------------------------------------------------

@dataclass
class Figures:
    agent_slots: dict[str, dict[int, float]]  # agent -> slot -> cpu s/s (cgroup)
    task_slots: dict[str, dict[int, float]]  # task -> slot -> cpu s/s (the scheduler's split)
    first_fit: tuple[int, int]  # slots measured under first fit
    after: tuple[int, int]  # slots measured after the move
    peak_before: float
    peak_after: float
    means_before: dict[str, float]
    means_after: dict[str, float]
    moves: int
    offline_after: float  # the busiest agent's peak after, summed from the task loads
    current: MeanOnly  # a mean-only balancer over each round's slots
    history: MeanOnly  # a mean-only balancer over the distributor's history

    @property
    def drop(self) -> float:
        return 1.0 - self.peak_after / self.peak_before


def task_loads(samples: Sequence[Sample]) -> dict[str, dict[int, float]]:
    """Each task's load per slot, as the scheduler computes it (`scheduler.load_history`: the
    agent's cpu split by busy time), from the sampled cgroup cpu and busy seconds."""
    from scheduler.load_history import LoadHistory

    history = LoadHistory(slot_seconds=SLOT_SECONDS, max_slots=10_000)
    for s in samples:
        for agent, cpu in s.cpu.items():
            history.observe(s.at, agent, cpu, {t: busy for t, (a, state, busy) in s.tasks.items()
                                               if a == agent and state == "running"})
    end = samples[-1].at + SLOT_SECONDS if samples else 0.0
    tasks = {t for s in samples for t in s.tasks}
    return {t: history.slots(t, end) for t in sorted(tasks)}


def figures_of(run: Run, settings: Any) -> Figures:
    agents = sorted({a for s in run.samples for a in s.cpu})
    agent_slots = {a: slot_loads([(s.at, s.cpu[a]) for s in run.samples if a in s.cpu])
                   for a in agents}
    tasks = task_loads(run.samples)
    slot = SLOT_SECONDS
    first = int(run.waves_at // slot) + 1
    move = run.move_at if not math.isnan(run.move_at) else run.end_at
    ff = (first, int(move // slot) - 1)
    settled = run.moved_running_at + SETTLE_WAVES * WAVE_SECONDS
    after = (int(settled // slot) + 1, int(run.end_at // slot) - 1) \
        if not math.isnan(settled) else (0, -1)

    def means(window: tuple[int, int]) -> dict[str, float]:
        out = {}
        for a, slots in agent_slots.items():
            values = [v for s, v in slots.items() if window[0] <= s <= window[1]]
            out[a] = sum(values) / len(values) if values else math.nan
        return out

    placed: dict[int, dict[str, str]] = {}
    for s in run.samples:
        placed[int(s.at // slot)] = {t: a for t, (a, state, _) in s.tasks.items()}
    offline = [sum(tasks[t].get(n, 0.0) for t, a2 in placed[n].items() if a2 == a)
               for n in range(after[0], after[1] + 1) if n in placed for a in agents]
    period = max(1, round(settings.period_seconds / slot))

    def balancer(window: int | None) -> MeanOnly:
        return mean_only_moves(tasks, run.first_fit, first, int(run.end_at // slot) - 1,
                               after, window, period, settings.min_slots, settings.threshold,
                               round(settings.pair_cooldown_seconds / slot),
                               round(settings.task_cooldown_seconds / slot))
    return Figures(agent_slots, tasks, ff, after, peak(agent_slots, *ff),
                   peak(agent_slots, *after), means(ff), means(after), len(run.moves),
                   max(offline, default=math.nan), balancer(period), balancer(None))


def verdict(ok: bool, why: str = "") -> str:
    return "MET" if ok else f"MISSED{f' ({why})' if why else ''}"


def report(plan: Plan, runs: Sequence[Run], figs: Sequence[Figures], settings: Any,
           wall: float) -> str:
    def s(value: float, digits: int = 2) -> str:
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"

    before = median_of([f.peak_before for f in figs])
    after = median_of([f.peak_after for f in figs])
    drop = median_of([f.drop for f in figs])
    moves = median_of([float(f.moves) for f in figs])
    current = median_of([float(f.current.moves) for f in figs])
    history = median_of([float(f.history.moves) for f in figs])
    exact = all(r.exact for r in runs)
    n = len(runs)
    of = f"median of {n}" if n > 1 else "1 run"
    rows = [
        ["busiest agent's peak slot, first fit -> after the distributor's moves (CPU s/s)",
         f"{s(before)} -> {s(after)} ({-drop * 100:+.0f} %)", "-25 % or more",
         verdict(drop >= 0.25, "" if drop >= 0.25 else "the peak fell less")],
        ["moves by the distributor (correlation scores)", s(moves, 0),
         "fewer than mean-only", verdict(moves < current,
                                         "a mean-only balancer needed as few")],
        ["moves by a mean-only balancer, each round's 30 s (current load), offline",
         s(current, 0), "shown", ""],
        ["  its busiest agent's peak after (CPU s/s, from task loads)",
         s(median_of([f.current.peak_after for f in figs])), "shown", ""],
        ["moves by a mean-only balancer over the distributor's history, offline",
         s(history, 0), "shown", ""],
        ["  its busiest agent's peak after (CPU s/s, from task loads)",
         s(median_of([f.history.peak_after for f in figs])), "shown", ""],
        ["the distributor's placement: peak after (CPU s/s, from task loads)",
         s(median_of([f.offline_after for f in figs])), "shown", ""],
        ["results exact (every sink = plain-Python oracle)", "yes" if exact else "NO",
         "exact", verdict(exact, "a sink differs")],
    ]
    lines = [
        f"Load distribution: 2 agents isolated with cgroups, each {AGENT_CPUS:g} cpus "
        f"(executor {EXECUTOR_CPUS:g} + three tasks of {TASK_CPUS:g}; a container is held to "
        f"what its executor and tasks ask: {EXECUTOR_CPUS + 3 * TASK_CPUS:g} with three tasks, "
        f"{EXECUTOR_CPUS + 2 * TASK_CPUS:g} with two, {EXECUTOR_CPUS + TASK_CPUS:g} with one); "
        f"one query, distribute=\"true\", of {CHAINS} chains generator(sensor) -> project with "
        f"{plan.fields} fields of upper(<{LITERAL_CHARS} Greek letters>) -> filter -> file sink, "
        f"one task each; square waves of {WAVE_SECONDS:g} s between {plan.high:g} and "
        f"{plan.low:g} rows/s per generator (control tuples), two anti-correlated; executors "
        f"with micro-batches at least {MIN_BATCH_SECONDS} s apart; distributor settings "
        f"{settings}; {of}",
        f"machine: {os.cpu_count()} cores; load average (1/5/15 min) at the start of each run: "
        + "; ".join(" ".join(f"{x:.1f}" for x in r.load[0]) for r in runs) + ", at the end: "
        + "; ".join(" ".join(f"{x:.1f}" for x in r.load[1]) for r in runs),
        "(agent load = its executor container's cpu s/s from the agent's /monitor/statistics, "
        "mean per 5 s slot; first fit = from the first wave to the distributor's first move; "
        f"after = from {SETTLE_WAVES} wave after the moved task ran again, for "
        f"{MEASURE_WAVES} waves; task loads = the agent's cpu split by busy time, as the "
        "scheduler does; the mean-only balancers run offline over the same task loads with the "
        "distributor's period, threshold, minimum history and cool-downs)",
        format_table(["figure", "value", "goal", "verdict"], rows),
    ]
    for i, (run, f) in enumerate(zip(runs, figs), 1):
        lines.append(f"run {i}: first fit {dict(sorted(run.first_fit.items()))}, waves "
                     f"{dict(sorted(run.waves.items()))}")
        lines.append(f"run {i}: peak {s(f.peak_before)} -> {s(f.peak_after)} CPU s/s "
                     f"({-f.drop * 100:+.0f} %); mean loads first fit "
                     + ", ".join(f"{a[-5:]} {s(v)}" for a, v in f.means_before.items())
                     + "; after " + ", ".join(f"{a[-5:]} {s(v)}" for a, v in
                                             f.means_after.items())
                     + f"; slots first fit {f.first_fit[1] - f.first_fit[0] + 1}, after "
                     f"{f.after[1] - f.after[0] + 1}")
        for m in run.moves:
            lines.append(f"run {i}: moved {m['task']} (wave {run.waves.get(m['task'])}) "
                         f"{m['from'][-5:]} -> {m['to'][-5:]} (score {m['score']:+.3f})")
        for a, slots in f.agent_slots.items():
            lines.append(f"run {i}: {a[-5:]} CPU s/s per slot, first fit: " + " ".join(
                f"{v:.2f}" for n, v in sorted(slots.items()) if f.first_fit[0] <= n <=
                f.first_fit[1]) + "; after: " + " ".join(
                f"{v:.2f}" for n, v in sorted(slots.items()) if f.after[0] <= n <= f.after[1]))
        holds = Counter(d["reason"] for _, d in run.decisions if d["kind"] == "hold")
        for _, d in run.decisions:
            if d["kind"] == "move":
                lines.append(f"run {i}: decision: {d['explanation']}")
        lines.append(f"run {i}: rounds held: " + (", ".join(f"{r} {k}" for r, k in
                                                            holds.most_common()) or "none"))
        lines.append(f"run {i}: mean-only (each round) moves {f.current.moves}, ends "
                     f"{dict(sorted(f.current.placement.items()))}; mean-only (history) moves "
                     f"{f.history.moves}, ends {dict(sorted(f.history.placement.items()))}")
        if not run.exact:
            lines.append(f"run {i}: sinks differ from the oracle:\n{run.diff}")
    lines.append(f"wall time {wall:.0f} s")
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------

def cgroups_usable() -> str:
    """Why isolated agents cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "not root: the embedded agents' cgroups isolation needs root"
    if not os.access("/sys/fs/cgroup/cpu", os.W_OK):
        return "/sys/fs/cgroup/cpu is not writable"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fields", type=int, default=5, help="heavy fields per row")
    parser.add_argument("--high", type=float, default=1500.0, help="rows/s at a wave's crest")
    parser.add_argument("--low", type=float, default=100.0, help="rows/s in a wave's trough")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if not 1 <= args.fields <= 12 or not 0 < args.low < args.high or args.repeats < 1:
        parser.error("--fields 1..12, 0 < --low < --high, --repeats >= 1")
    why = cgroups_usable()
    if why:
        print(f"cannot run: {why}")
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    for noisy in ("executor", "scheduler", "elastiq", "pymesos", "tests.e2e", "embedded_mesos"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from scheduler.distributor import DistributionSettings
    from testkit.e2e_support import MIN_BATCH_ENV, start_stack, stop_stack

    os.environ[MIN_BATCH_ENV] = MIN_BATCH_SECONDS
    plan = Plan(args.fields, args.high, args.low)
    settings = DistributionSettings(min_slots=MIN_SLOTS)
    began = time.monotonic()
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="elastiq-bench-distribute-") as tmp:
            stack = start_stack(Path(tmp) / "stack", cpus_per_agent=AGENT_CPUS, agents=2,
                                isolation="cgroups", executor_cpus=EXECUTOR_CPUS,
                                distribution=settings)
            try:
                runs.append(run_once(stack, Path(tmp), plan))
            finally:
                leftovers = stop_stack(stack)
                if leftovers:
                    log.warning("SIGKILLed leftover executor processes %s", leftovers)
        log.info("run %s of %s done", repeat + 1, args.repeats)
    figs = [figures_of(r, settings) for r in runs]
    print(report(plan, runs, figs, settings, time.monotonic() - began))
    return 0 if all(r.exact for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
