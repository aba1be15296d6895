"""Load shedding under overload at max-parallelism (issue 32): the same overload with the
scheduler's shedding on and off, on isolated agents, where the LP's plan is worth more than
uniform random shedding.

Owns this benchmark only (tests/test_shedding_bench.py checks its pure parts: latency from the
sampled curves, the backlog, the offline LP against uniform and the achieved loss). Two
independent pipelines of testkit/shed_support.py's `pair_spec`, their results worth different
amounts (sink weights `--weight-a` and `--weight-b`):

    src_X := generator(sequence, shed="random") -> src_X_drop -> heavy_X := project of FIELDS
    upper-cased Greek texts, automatic, parallelism = min = max = 2 (held at its bound)
    -> sink_X (weight w_X)              for X in a, b

on the stack of testkit/e2e_support.py with cgroups isolation: four agents of `--agent-cpus`
cpus (0.4 by default: their sum, 1.6, fits the machine's 2 cores with room for the scheduler,
the master and this script, the rule of issue 31; with four agents of 1 cpu on 2 cores each
got ~0.5 of its cpu and the plan, which trusts the offered cpus, shed too little), of which the
executor asks 0.2, a source 0.8 (an agent each), a heavy instance 0.2, a sink 0.4 (`asks`);
Spark local[2]. The two instances of one operator are placed apart, so each of two agents holds
one of a's, one of b's and a sink: a's and b's instances compete for that agent's cpu, the
resource the LP divides. The report prints the placement, and the share of CFS periods in which
the heavy agents' containers were throttled (at their quota: they got the cpu they were
offered, no less).

Each mode (shedding on: the spec's `shed="random"`; off: the same spec without it) runs on a
fresh stack, off first: the query starts at `--rate` rows/s per source, the run waits until the
instances are out of their stabilization window, measures `--unloaded` s, then raises both
sources to half of `--factor` x the capacity for `--overload` s (a control tuple each, as
`elastiq control Q src_a rate N`), sampling the status and the agents' cgroup cpu once a second;
then stops. The capacity: `--capacity` rows/s assumed for the run without shedding; the rows/s
its four instances read in its overload's second half (saturated) for the run with it, so its
overload is `--factor` x the measured capacity. Latency is measured from the curves of both
pipelines together (rows kept in order): a row reaching a sink at t was made available at the
moment t' when the rows made so far, less those dropped, reached the rows at the sinks at t;
latency = t - t'. The backlog is the rows made and not yet at a sink nor dropped.

The loss is weighted as the scheduler's LP weighs it: sum over sinks of weight x (1 - the
share of its rows kept). Over the overload's second half of the run with shedding: achieved
(each source's rows dropped / made); the LP optimum (`scheduler.shedding.plan_shedding`
offline at those arrivals, on the cpu seconds per row measured in the run without shedding:
the cgroup cpu of the agents the instances run on, split between the pipelines by their
instances' busy time; each such agent at its cpus x the policy's headroom, as the scheduler
plans); uniform random at the same total drop (the same share of every source's rows; the same
load here, the pipelines costing alike).

`--repeats N` runs the mode with shedding N times, each on a fresh stack against the one run
without it (the baseline runs once, not per repeat, to save time: it only measures the
capacity and the cpu per row the offline optimum is computed on), prints each run's report and
then each goal's figure per run and its median beside the goal.

    python benchmarks/shedding.py [--agent-cpus 0.4] [--capacity 300] [--factor 3] [--overload 120]
                                  [--repeats 3]
"""

from __future__ import annotations

import argparse
import bisect
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_util import (  # noqa: E402
    Periodic, agents_statistics, exit_on_sigterm, fmt, format_table, median_of, use_repo_on_path,
)

use_repo_on_path()

from scheduler.shed_policy import ShedPolicy  # noqa: E402
from scheduler.shedding import (DropPoint, Operator, ShedProblem, Sink,  # noqa: E402
                                plan_shedding)

log = logging.getLogger("bench.shedding")

QUERY = "bench-shed"
SAMPLE_EVERY = 1.0
SEEDS = {"a": 11, "b": 12}
# shares of an agent's cpus: what the executor and each kind of operator ask (`asks`)
EXECUTOR_SHARE = 0.2
SHARES = {"source": 0.8, "heavy": 0.2, "sink": 0.4}
SPARK_CORES = 2
AGENTS = 4
STATISTICS = ("cpus_user_time_secs", "cpus_system_time_secs", "cpus_nr_periods",
              "cpus_nr_throttled")


def asks(agent_cpus: float) -> tuple[float, dict[str, float]]:
    """(the executor's cpus, each kind of operator's) on agents of `agent_cpus`: their shares of
    it, rounded so that an agent's asks add up to its size, not a hair over."""
    return (round(EXECUTOR_SHARE * agent_cpus, 4),
            {k: round(v * agent_cpus, 4) for k, v in SHARES.items()})


# --- the plan -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    fields: int
    rate: float  # rows/s per source while unloaded
    capacity: float  # rows/s both pipelines' instances are assumed to sustain (run without)
    factor: float  # the overload: factor x capacity, split evenly between the sources
    unloaded: float  # s measured unloaded
    overload: float  # s of overload
    agent_cpus: float
    weights: tuple[float, float]  # sink_a's, sink_b's

    def overload_rate(self, capacity: float) -> float:
        """Rows/s per source: half of factor x `capacity`."""
        return self.factor * capacity / 2

    @property
    def limit(self) -> int:
        """More rows than a run can make: the run stops the query, not the generators."""
        top = self.overload_rate(self.capacity * 3)
        return int(self.rate * (self.unloaded + 600) + top * (self.overload + 60))

    def pipelines(self) -> tuple[Any, ...]:
        from testkit.shed_support import Pipeline

        return tuple(Pipeline(name, self.source(name), self.fields, weight,
                              f"out/{name}.jsonl")
                     for name, weight in zip(("a", "b"), self.weights))

    def source(self, name: str) -> dict[str, str]:
        return {"shape": "sequence", "rate": f"{self.rate:g}", "seed": str(SEEDS[name]),
                "limit": str(self.limit)}


# --- sampling -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tick:
    at: float  # monotonic s
    made: tuple[float, ...]  # per pipeline: rows its generator made available (read + backlog)
    dropped: tuple[float, ...]  # per pipeline: rows its drop shed
    sunk: tuple[float, ...]  # per pipeline: rows its sink task read
    busy: tuple[float, ...]  # each instance's busy ms (pipeline a's, then b's)
    rows: tuple[float, ...]  # each instance's rows in
    cpu: float  # the cgroup cpu seconds of the agents the heavy instances run on, summed
    ratios: tuple[float, ...]  # each drop's ratio
    decision: str
    periods: float = 0.0  # the CFS periods of those agents' containers, summed
    throttled: float = 0.0  # ... and those in which they were throttled (at their quota)

    @property
    def kept(self) -> float:
        return sum(self.made) - sum(self.dropped)


@dataclass(frozen=True)
class Layout:
    """The query's tasks: per pipeline its source task, its instance tasks and its sink task."""

    sources: tuple[str, ...]
    instances: tuple[tuple[str, ...], ...]
    sinks: tuple[str, ...]

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(t for group in self.instances for t in group)


def grown(new: tuple[float, ...], old: tuple[float, ...]) -> tuple[float, ...]:
    """Counters never fall: a heartbeat without figures (a generator's query rebuilt for a new
    rate) is not a fall."""
    return tuple(max(a, b) for a, b in zip(new, old))


class Sampler(Periodic):
    """The query's status and every agent's cgroup cpu once a second, on a thread."""

    def __init__(self, stack: Any, layout: Layout) -> None:
        self.stack, self.layout = stack, layout
        self.ticks: list[Tick] = []
        self.elastic = ""
        self.shed_explanation = ""  # the latest shed decision's (what its costs came from)
        self.said = ""  # the latest decision logged
        self.agents: dict[str, str] = {}  # task -> agent
        super().__init__(SAMPLE_EVERY, "status")

    def sample(self) -> None:
        stats = agents_statistics(self.stack.cluster.agents, STATISTICS)
        status = self.stack.status(QUERY)
        views = status.get("tasks", [])
        tasks = {t["task_id"]: t.get("figures") or {} for t in views}
        agents = {t["task_id"]: t.get("agent_id") or "" for t in views}

        def fig(task: str, name: str) -> float:
            return float(tasks.get(task, {}).get(name) or 0.0)

        shed = status.get("shedding") or {}
        ratios = {d.get("task"): float(d.get("ratio", 0.0)) for d in shed.get("drops") or []}
        decision = shed.get("decision") or {}
        elastic = ((status.get("elastic") or [{}])[0].get("decision") or {})
        lay = self.layout
        heavy = {agents.get(t, "") for t in lay.slots} - {""}
        tick = Tick(time.monotonic(),
                    tuple(fig(s, "tuples_in") + fig(s, "backlog") for s in lay.sources),
                    tuple(fig(s, "rows_dropped") for s in lay.sources),
                    tuple(fig(s, "tuples_in") for s in lay.sinks),
                    tuple(fig(s, "busy_ms") for s in lay.slots),
                    tuple(fig(s, "tuples_in") for s in lay.slots),
                    sum(sum(stats.get(a, (0.0,) * 4)[:2]) for a in heavy),
                    tuple(ratios.get(s, 0.0) for s in lay.sources),
                    f"{decision.get('kind', '')} ({decision.get('reason', '')})",
                    sum(stats.get(a, (0.0,) * 4)[2] for a in heavy),
                    sum(stats.get(a, (0.0,) * 4)[3] for a in heavy))
        with self._lock:
            if self.ticks:
                last = self.ticks[-1]
                tick = Tick(tick.at, grown(tick.made, last.made),
                            grown(tick.dropped, last.dropped), grown(tick.sunk, last.sunk),
                            grown(tick.busy, last.busy), grown(tick.rows, last.rows),
                            max(tick.cpu, last.cpu), tick.ratios, tick.decision,
                            max(tick.periods, last.periods),
                            max(tick.throttled, last.throttled))
            self.ticks.append(tick)
            self.agents = agents
            self.elastic = str(elastic.get("reason") or "")
            said = f"{decision.get('kind')} ({decision.get('reason')}): " \
                f"{decision.get('explanation')}"
            if decision and said != self.said:  # every new decision, for the record
                log.info("shedding decision %s", said)
                self.said = said
            if decision.get("kind") == "shed":
                self.shed_explanation = str(decision.get("explanation") or "")
            if len(self.ticks) % 15 == 0:
                log.info("made %s dropped %s sunk %s ratios %s shedding %s elastic %s",
                         fmt_all(tick.made), fmt_all(tick.dropped), fmt_all(tick.sunk),
                         tick.ratios, tick.decision, self.elastic)

    def snapshot(self) -> list[Tick]:
        with self._lock:
            return list(self.ticks)


def fmt_all(values: Sequence[float]) -> str:
    return "/".join(fmt(v) for v in values)


# --- the figures (pure) -------------------------------------------------------------------------

def latencies(ticks: Sequence[Tick], t0: float, t1: float) -> list[float]:
    """For each sample in [t0, t1]: how long ago the rows now at the sinks were made, the rows
    being kept in order (see the module docstring); samples before any match are left out."""
    kept = [(t.at, t.kept) for t in ticks]
    levels = [k for _, k in kept]
    out = []
    for t in ticks:
        sunk = sum(t.sunk)
        if not t0 <= t.at <= t1 or sunk <= 0:
            continue
        i = bisect.bisect_left(levels, sunk)
        if i == 0 or i >= len(kept):
            if i < len(kept) and levels[i] == sunk:
                out.append(t.at - kept[i][0])
            continue
        (a, ka), (b, kb) = kept[i - 1], kept[i]
        made_at = a + (b - a) * (sunk - ka) / (kb - ka) if kb > ka else b
        out.append(max(0.0, t.at - made_at))
    return out


def backlog_at(ticks: Sequence[Tick], at: float) -> float:
    """Rows made and neither at a sink nor dropped, at the sample nearest `at`."""
    t = min(ticks, key=lambda x: abs(x.at - at))
    return max(0.0, t.kept - sum(t.sunk))


def between(ticks: Sequence[Tick], t0: float, t1: float) -> tuple[Tick, Tick]:
    inside = [t for t in ticks if t0 <= t.at <= t1]
    return inside[0], inside[-1]


@dataclass(frozen=True)
class Window:
    """What a window of samples measured: per pipeline rows/s made, rows/s dropped, rows/s its
    instances read and their busy s/s; the heavy agents' cpu s/s and the share of their CFS
    periods in which they were throttled (NaN: no period counted)."""

    made: tuple[float, ...]
    dropped: tuple[float, ...]
    read: tuple[float, ...]
    busy: tuple[float, ...]
    cpu: float
    throttled: float = math.nan

    @property
    def capacity(self) -> float:
        """Rows/s the instances read together (their capacity when they were saturated)."""
        return sum(self.read)

    def costs(self) -> tuple[float, ...]:
        """Each pipeline's cpu seconds per row its instances read: the agent's cpu split
        between the pipelines by their instances' busy time (NaN: no cpu or rows measured)."""
        total = sum(self.busy)
        return tuple(self.cpu * b / total / r if total > 0 and r > 0 and self.cpu > 0
                     else math.nan for b, r in zip(self.busy, self.read))

    def kept_shares(self) -> tuple[float, ...]:
        return tuple(1.0 - d / m if m > 0 else 1.0 for m, d in zip(self.made, self.dropped))


def window_of(ticks: Sequence[Tick], t0: float, t1: float, pipelines: int) -> Window:
    a, b = between(ticks, t0, t1)
    span = b.at - a.at
    per = len(a.busy) // pipelines

    def grouped(x: tuple[float, ...], y: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(sum(y[i * per:(i + 1) * per]) - sum(x[i * per:(i + 1) * per])
                     for i in range(pipelines))

    return Window(tuple((y - x) / span for x, y in zip(a.made, b.made)),
                  tuple((y - x) / span for x, y in zip(a.dropped, b.dropped)),
                  tuple(r / span for r in grouped(a.rows, b.rows)),
                  tuple(m / 1000.0 / span for m in grouped(a.busy, b.busy)),
                  (b.cpu - a.cpu) / span,
                  (b.throttled - a.throttled) / (b.periods - a.periods)
                  if b.periods > a.periods else math.nan)


def lp_problem(arrivals: Sequence[float], costs: Sequence[float], weights: Sequence[float],
               capacity: float, placement: Sequence[Sequence[str]]) -> ShedProblem:
    """The offline problem: pipeline i's drop point at arrivals[i] rows/s; each of its
    instances, on the agent placement[i] names, reading an even share of the rows it keeps at
    costs[i] cpu s per row; its sink at weights[i]; every agent hosting instances at `capacity`
    cpu s/s (the sources and sinks on agents of their own, or cheap: not what binds)."""
    points = tuple(DropPoint(f"p{i}_drop", r) for i, r in enumerate(arrivals))
    operators = tuple(Operator(f"p{i}_heavy{j}", agent, c / len(agents), 1.0 / len(agents),
                               (f"p{i}_drop",))
                      for i, (c, agents) in enumerate(zip(costs, placement))
                      for j, agent in enumerate(agents))
    merged = tuple(Operator(f"p{i}_merge", "sinks", 0.0, 1.0,
                            tuple(o.name for o in operators if o.name.startswith(f"p{i}_heavy")))
                   for i in range(len(weights)))
    sinks = tuple(Sink(f"p{i}_sink", f"p{i}_merge", w) for i, w in enumerate(weights))
    agents = {a for group in placement for a in group}
    return ShedProblem(points, operators + merged, sinks,
                       {**{a: capacity for a in sorted(agents)}, "sinks": 1e9})


def lp_loss(arrivals: Sequence[float], costs: Sequence[float], weights: Sequence[float],
            capacity: float, placement: Sequence[Sequence[str]]) -> float:
    return plan_shedding(lp_problem(arrivals, costs, weights, capacity, placement)).loss


def achieved_loss(kept: Sequence[float], weights: Sequence[float]) -> float:
    """The weighted loss of keeping kept[i] of pipeline i's rows: sum of w x (1 - kept)."""
    return sum(w * (1.0 - k) for k, w in zip(kept, weights))


def uniform_loss(made: Sequence[float], dropped: Sequence[float],
                 weights: Sequence[float]) -> float:
    """The weighted loss of dropping the same total share from every source."""
    share = sum(dropped) / sum(made) if sum(made) > 0 else 0.0
    return sum(w * share for w in weights)


def within_tenth(achieved: float, optimum: float) -> bool:
    """The achieved loss within 10 % of the optimum, either side (below it the plan kept more
    rows than the capacity takes: they queue, and the loss counts dropped rows only)."""
    return abs(achieved - optimum) <= 0.1 * optimum + 1e-9


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


# --- one run ------------------------------------------------------------------------------------

@dataclass
class Run:
    shed: bool
    rate: float  # rows/s per source during the overload
    ticks: list[Tick] = field(default_factory=list)
    unloaded: tuple[float, float] = (math.nan, math.nan)
    overload: tuple[float, float] = (math.nan, math.nan)
    sound: bool = False
    sink_note: str = ""
    rows_at_sink: int = 0
    agents: dict[str, str] = field(default_factory=dict)  # task -> agent
    layout: Layout | None = None
    shed_explanation: str = ""  # the latest shed decision's

    def placement(self) -> tuple[tuple[str, ...], ...]:
        """Per pipeline, the agent of each of its instances."""
        groups = self.layout.instances if self.layout else ()
        return tuple(tuple(self.agents.get(t, "") for t in g) for g in groups)

    def heavy_agents(self) -> list[str]:
        return sorted({a for g in self.placement() for a in g})

    def describe_layout(self) -> str:
        names = {a: f"A{i}" for i, a in enumerate(sorted(set(self.agents.values())))}
        return ", ".join(f"{t.split('.')[-1]}@{names[a]}" for t, a in sorted(self.agents.items()))


def set_rates(stack: Any, sources: Sequence[str], rate: float) -> None:
    """Every source's rate in one control request, sent until taken and waited for."""
    from common.api_client import RequestRejected
    from testkit.e2e_support import wait_until

    client = stack.client()

    def asked() -> str | None:
        try:
            return str(client.control(QUERY, [(s, "rate", f"{rate:g}") for s in sources])
                       ["request"])
        except RequestRejected as exc:
            if exc.status != 409 and "still being applied" not in str(exc):
                raise
            return None

    request = wait_until(asked, 120, f"the rate {rate:g} accepted", step=0.5)
    wait_until(lambda: client.control_status(QUERY, request)["state"] != "pending", 120,
               f"the rate {rate:g} applied", step=0.1)


def layout_of(query: Any, pipelines: Sequence[Any]) -> Layout:
    def task_of(operator: str) -> str:
        return next(t.task_id for t in query.tasks if operator in t.operators)

    slots = {e.splitters[0][0]: e.slots for e in query.elastic}
    sources = tuple(task_of(p.src) for p in pipelines)
    return Layout(sources, tuple(tuple(slots[s]) for s in sources),
                  tuple(task_of(p.sink) for p in pipelines))


def run_once(plan: Plan, shed: bool, rate: float, expected: dict[str, dict[int, tuple]]
             ) -> Run:
    from compiler.pipeline import compile_spec_text
    from testkit.e2e_support import (read_sink, start_stack, stop_query, stop_stack, submit,
                                     wait_running, wait_until)
    from testkit.shed_support import check_sink, pair_spec, sink_key

    run = Run(shed, rate)
    pipelines = plan.pipelines()
    with tempfile.TemporaryDirectory(prefix="elastiq-bench-shed-") as tmp:
        work = Path(tmp)
        executor_cpus, cpus = asks(plan.agent_cpus)
        text = pair_spec(QUERY, pipelines, shed=shed, cpus=cpus)
        query = compile_spec_text(text.encode(), str(work / f"{QUERY}.xml"), base_dir=work,
                                  query_id=QUERY).query
        run.layout = layout = layout_of(query, pipelines)
        stack = start_stack(work / "stack", cpus_per_agent=plan.agent_cpus, agents=AGENTS,
                            spark_cores=SPARK_CORES, isolation="cgroups",
                            executor_cpus=executor_cpus)
        try:
            submit(stack, query)
            with Sampler(stack, layout) as sampler:
                wait_running(stack, QUERY, timeout=300)
                wait_until(lambda: (t := sampler.snapshot()) and min(t[-1].sunk) > 0, 300,
                           "first rows at both sinks")
                wait_until(lambda: sampler.elastic not in ("", "stabilizing"), 240,
                           "the instances out of their stabilization window", step=0.5)
                began = time.monotonic()
                time.sleep(plan.unloaded)  # measuring: the sampler runs meanwhile
                run.unloaded = (began, time.monotonic())
                set_rates(stack, [p.src for p in pipelines], rate)
                began = time.monotonic()
                log.info("%s: overload at %g rows/s per source for %g s",
                         "shed" if shed else "no shed", rate, plan.overload)
                time.sleep(plan.overload)
                run.overload = (began, time.monotonic())
                run.ticks = sampler.snapshot()
                run.agents = dict(sampler.agents)
                run.shed_explanation = sampler.shed_explanation
            try:
                stop_query(stack, QUERY)
            except AssertionError as exc:  # a long queue: stop_stack ends it below
                log.warning("%s", exc)
            notes, run.sound = [], True
            for p in pipelines:
                rows = read_sink(work / p.path)
                checked = check_sink([sink_key(r, plan.fields) for r in rows], expected[p.name])
                run.sound = run.sound and checked.sound
                run.rows_at_sink += len(rows)
                notes.append(f"{p.sink}: {len(rows):,} rows, {checked.describe()}")
            run.sink_note = "; ".join(notes)
        finally:
            leftovers = stop_stack(stack)
            if leftovers:
                log.warning("SIGKILLed leftover executor processes %s", leftovers)
    return run


# --- the report ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Figures:
    latency_unloaded: float
    latency_overload: float  # p50 over the overload's second half
    latency_first: float  # p50 over the overload's first 20 s
    backlog_start: float
    backlog_mid: float
    backlog_end: float
    arrival: float  # rows/s made during the overload (both sources)
    second: Window  # the overload's second half
    dropped: float  # rows dropped during the overload
    drop_ratio: float  # of the rows made during the overload


def figures_of(run: Run) -> Figures:
    t = run.ticks
    (u0, u1), (o0, o1) = run.unloaded, run.overload
    mid = (o0 + o1) / 2
    a, b = between(t, o0, o1)
    made = sum(b.made) - sum(a.made)
    dropped = sum(b.dropped) - sum(a.dropped)
    return Figures(
        median_of(latencies(t, u0, u1)), median_of(latencies(t, mid, o1)),
        median_of(latencies(t, o0, o0 + 20)),
        backlog_at(t, o0), backlog_at(t, mid), backlog_at(t, o1),
        made / (b.at - a.at), window_of(t, mid, o1, len(a.made)), dropped,
        dropped / made if made > 0 else math.nan)


@dataclass(frozen=True)
class Outcome:
    """One run with shedding against the run without it: the figures its goals read (the
    loss over the overload's 2nd half; NaN optimum: no cgroup cpu measured)."""

    latency_unloaded: float
    latency_overload: float
    backlog_mid: float
    backlog_end: float
    arrival: float
    achieved: float
    optimum: float
    uniform: float
    sound: bool

    @property
    def latency_met(self) -> bool:
        return self.latency_overload <= 2 * self.latency_unloaded

    @property
    def backlog_met(self) -> bool:
        """Not growing: by at most 1 s of arrival over the 2nd half."""
        return self.backlog_end <= self.backlog_mid + self.arrival

    @property
    def loss_ratio(self) -> float:
        return self.achieved / self.optimum if self.optimum > 0 else math.nan

    @property
    def loss_met(self) -> bool:
        return not math.isnan(self.optimum) and within_tenth(self.achieved, self.optimum)

    @property
    def uniform_met(self) -> bool:
        return self.achieved < self.uniform - 1e-9


def outcome_of(plan: Plan, on: Run, f: Figures, g: Figures) -> Outcome:
    w = f.second
    costs = g.second.costs()
    optimum = math.nan if any(math.isnan(c) for c in costs) else lp_loss(
        w.made, costs, plan.weights, plan.agent_cpus * ShedPolicy().headroom, on.placement())
    return Outcome(f.latency_unloaded, f.latency_overload, f.backlog_mid, f.backlog_end,
                   f.arrival, achieved_loss(w.kept_shares(), plan.weights), optimum,
                   uniform_loss(w.made, w.dropped, plan.weights), on.sound)


def loss_lines(plan: Plan, on: Run, f: Figures, g: Figures) -> list[str]:
    """The weighted loss of the run with shedding (overload's 2nd half) beside the offline LP
    optimum and uniform random at the same total drop, with verdicts."""
    w = f.second
    costs = g.second.costs()
    o = outcome_of(plan, on, f, g)
    achieved, optimum, uniform = o.achieved, o.optimum, o.uniform
    head = (f"weighted loss (sum of weight x share of the sink's rows lost; weights "
            f"{plan.weights[0]:g} and {plan.weights[1]:g}, so 0..{sum(plan.weights):g}), "
            f"overload's 2nd half with shedding: kept shares "
            f"{', '.join(f'{k:.3f}' for k in w.kept_shares())} at "
            f"{', '.join(fmt(m) for m in w.made)} rows/s made")
    if math.isnan(optimum):
        return [head, f"LP optimum: not computed (no cgroup cpu measured: costs {costs})"]
    # what the agents with instances got without shedding, saturated, each (the machine's
    # cores shared by every agent and the stack): the capacity the plan could really use
    got = g.second.cpu / max(1, len(on.heavy_agents()))
    real = lp_loss(w.made, costs, plan.weights, got * ShedPolicy().headroom, on.placement())
    return [
        head,
        f"LP optimum offline: {optimum:.3f} (cpu per row measured without shedding: "
        f"{', '.join(f'{c * 1000:.2f} ms' for c in costs)}; each of the "
        f"{len(on.heavy_agents())} agents with instances at {plan.agent_cpus:g} cpus x "
        f"headroom {ShedPolicy().headroom:g})",
        f"goal: weighted loss within 10 % of the LP optimum (either side: a loss under it "
        f"means rows kept beyond capacity, left queued): "
        f"{verdict(o.loss_met)} (achieved {achieved:.3f}, optimum "
        f"{optimum:.3f}" + (f", x{o.loss_ratio:.2f})" if optimum > 0 else ")"),
        f"LP optimum offline at the cpu the agents got without shedding ({got:.2f} cpu s/s "
        f"each, saturated, x headroom): {real:.3f} (the achieved loss counts dropped rows "
        f"only: rows left queued are not in it)",
        f"goal: lower than uniform random at the same total drop: "
        f"{verdict(o.uniform_met)} (achieved {achieved:.3f}, uniform "
        f"{uniform:.3f} dropping {sum(w.dropped) / sum(w.made):.3f} of every source's rows)",
    ]


def medians_report(outcomes: Sequence[Outcome]) -> str:
    """Each run's goal figures and their medians beside the goals; a goal is met by the
    medians (latency and loss: the median of each run's ratio)."""
    def col(o: Outcome) -> list[str]:
        return [f"{fmt(o.latency_unloaded, 1)} -> {fmt(o.latency_overload, 1)}",
                f"{fmt(o.backlog_mid)} -> {fmt(o.backlog_end)}",
                f"{o.achieved:.3f} / {o.optimum:.3f} (x{o.loss_ratio:.2f})",
                f"{o.achieved:.3f} / {o.uniform:.3f}", "exact" if o.sound else "NOT exact"]
    latency = median_of([o.latency_overload / o.latency_unloaded for o in outcomes])
    growth = median_of([o.backlog_end - o.backlog_mid - o.arrival for o in outcomes])
    loss = median_of([o.loss_ratio for o in outcomes])
    below_uniform = median_of([o.uniform - o.achieved for o in outcomes])
    medians = [f"x{latency:.2f}", f"end - middle - 1 s of arrival: {fmt(growth)}",
               f"x{loss:.2f}", f"uniform - achieved: {below_uniform:.3f}",
               f"{sum(o.sound for o in outcomes)} of {len(outcomes)} exact"]
    goals = [f"<= x2: {verdict(latency <= 2)}", f"<= 0: {verdict(growth <= 0)}",
             f"x0.90..x1.10: {verdict(abs(loss - 1) <= 0.1 + 1e-9)}",
             f"> 0: {verdict(below_uniform > 1e-9)}",
             f"all: {verdict(all(o.sound for o in outcomes))}"]
    names = ["latency p50 with, unloaded -> overload 2nd half (s)",
             "backlog with, middle -> end (rows)", "weighted loss: achieved / LP optimum",
             "weighted loss: achieved / uniform random", "sinks"]
    header = ["figure", *[f"run {i + 1}" for i in range(len(outcomes))], "median", "goal"]
    rows = [[name, *[col(o)[i] for o in outcomes], medians[i], goals[i]]
            for i, name in enumerate(names)]
    return (f"medians of {len(outcomes)} runs with shedding, each against the one run without "
            f"it (run once to save time, not per repeat):\n" + format_table(header, rows))


def report(plan: Plan, on: Run, off: Run, wall: float, title: str = "") -> str:
    f, g = figures_of(on), figures_of(off)
    capacity = g.second.capacity
    rows = [
        ["latency p50, unloaded (s)", fmt(f.latency_unloaded, 1), fmt(g.latency_unloaded, 1),
         "-"],
        ["latency p50, overload first 20 s (s)", fmt(f.latency_first, 1),
         fmt(g.latency_first, 1), "-"],
        ["latency p50, overload 2nd half (s)", fmt(f.latency_overload, 1),
         fmt(g.latency_overload, 1), "with: <= 2x unloaded"],
        ["backlog at overload start (rows)", fmt(f.backlog_start), fmt(g.backlog_start), "-"],
        ["backlog at overload middle (rows)", fmt(f.backlog_mid), fmt(g.backlog_mid), "-"],
        ["backlog at overload end (rows)", fmt(f.backlog_end), fmt(g.backlog_end),
         "with: does not grow (end <= middle)"],
        ["rows made / s during overload", fmt(f.arrival), fmt(g.arrival), "-"],
        ["rows / s the instances read, 2nd half (a/b)", fmt_all(f.second.read),
         fmt_all(g.second.read), "-"],
        ["heavy agents' cpu s/s, 2nd half", fmt(f.second.cpu, 2), fmt(g.second.cpu, 2), "-"],
        ["heavy agents' periods throttled, 2nd half", fmt(f.second.throttled, 2),
         fmt(g.second.throttled, 2), "-"],
        ["rows dropped during overload", fmt(f.dropped), fmt(g.dropped), "-"],
        ["rows dropped / made during overload", fmt(f.drop_ratio, 3), fmt(g.drop_ratio, 3),
         "-"],
    ]
    grew = g.backlog_end > g.backlog_mid > g.backlog_start and \
        g.latency_overload > g.latency_first
    executor_cpus, cpus = asks(plan.agent_cpus)
    outcome = outcome_of(plan, on, f, g)
    lines = [
        f"Load shedding at max-parallelism, two pipelines: generator(sequence, shed) -> heavy "
        f"project of {plan.fields} upper-cased Greek fields, automatic, 2 instances (min = max "
        f"= 2) -> file sink, weights {plan.weights[0]:g} (a) and {plan.weights[1]:g} (b); "
        f"{AGENTS} agents of {plan.agent_cpus:g} cpus, isolated (cgroups), executor "
        f"{executor_cpus:g} cpus, sources {cpus['source']:g}, heavy instances "
        f"{cpus['heavy']:g}, sinks {cpus['sink']:g}; Spark "
        f"local[{SPARK_CORES}]; {plan.rate:g} rows/s per source unloaded for "
        f"{plan.unloaded:g} s, then the overload for {plan.overload:g} s; "
        f"{title or 'one run per mode'}",
        f"machine: {os.cpu_count()} cores, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "(latency: a row at a sink at t minus when its generator made it, rows kept in order, "
        "both pipelines' curves summed, from 1 s status samples; backlog: rows made and "
        "neither at a sink nor dropped)",
        format_table(["figure", "shedding on", "shedding off", "goal"], rows),
        f"measured capacity (run without shedding, 2nd half, rows/s its four instances read): "
        f"{capacity:,.0f} rows/s; the overload: without {g.arrival / capacity:.2f}x it "
        f"({plan.capacity:g} rows/s assumed), with {f.arrival / capacity:.2f}x it (goal x3)"
        if capacity > 0 else "measured capacity: none",
        f"goal: latency with shedding within 2x unloaded: "
        f"{verdict(outcome.latency_met)} ({fmt(f.latency_overload, 1)}"
        f" s against {fmt(f.latency_unloaded, 1)} s)",
        f"goal: backlog with shedding does not grow (2nd half): "
        f"{verdict(outcome.backlog_met)} ({fmt(f.backlog_mid)} -> "
        f"{fmt(f.backlog_end)} rows; 'grows' = by more than 1 s of arrival)",
        *loss_lines(plan, on, f, g),
        f"goal: without shedding the backlog and latency grow: {verdict(grew)}"
        f" (backlog {fmt(g.backlog_start)} -> {fmt(g.backlog_mid)} -> {fmt(g.backlog_end)}; "
        f"latency {fmt(g.latency_first, 1)} -> {fmt(g.latency_overload, 1)} s)",
        f"sinks: every emitted row a correct result of its input row, none twice: with "
        f"{'yes' if on.sound else 'NO'} ({on.sink_note}), without "
        f"{'yes' if off.sound else 'NO'} ({off.sink_note})",
        f"placement (with): {on.describe_layout()}; (without): {off.describe_layout()}",
        "shedding decisions (with): " + "; ".join(sorted({t.decision for t in on.ticks})),
        f"latest shed decision's explanation (with): {on.shed_explanation or '-'}",
        "drop ratios (with), as sampled: " + " -> ".join(
            str(r) for i, r in enumerate(t.ratios for t in on.ticks)
            if i == 0 or r != on.ticks[i - 1].ratios),
        f"wall time {wall:.0f} s",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fields", type=int, default=12)
    parser.add_argument("--rate", type=float, default=50.0, help="rows/s per source unloaded")
    parser.add_argument("--capacity", type=float, default=300.0,
                        help="rows/s both pipelines' instances are assumed to sustain (sets "
                             "the overload of the run without shedding)")
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--unloaded", type=float, default=30.0)
    parser.add_argument("--overload", type=float, default=120.0,
                        help="s of overload (the issue's goal: 120)")
    parser.add_argument("--agent-cpus", type=float, default=0.4,
                        help="each agent's cpus; the four together should fit the machine "
                             "with room for the scheduler (issue 31's rule)")
    parser.add_argument("--weight-a", type=float, default=3.0)
    parser.add_argument("--weight-b", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs with shedding, each printed, then their medians; the run "
                             "without shedding (the baseline) runs once")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    for noisy in ("executor", "scheduler", "elastiq", "pymesos", "tests.e2e"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu").is_dir():
        print("isolated agents need root and the cgroup v1 cpu controller "
              "(/sys/fs/cgroup/cpu): not available here")
        return 2
    from testkit.shed_support import oracle

    plan = Plan(args.fields, args.rate, args.capacity, args.factor, args.unloaded,
                args.overload, args.agent_cpus, (args.weight_a, args.weight_b))
    expected = {p.name: oracle(p.source, plan.fields) for p in plan.pipelines()}
    began = time.monotonic()
    off = run_once(plan, False, plan.overload_rate(plan.capacity), expected)
    measured = figures_of(off).second.capacity
    log.info("measured capacity without shedding: %.0f rows/s", measured)
    outcomes = []
    for i in range(max(1, args.repeats)):
        on = run_once(plan, True, plan.overload_rate(measured if measured > 0 else plan.capacity),
                      expected)
        title = (f"run {i + 1} of {args.repeats} with shedding, against the one run without it"
                 f" (run once, not per repeat)" if args.repeats > 1 else "")
        print(f"=== {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
        print(report(plan, on, off, time.monotonic() - began, title), flush=True)
        f, g = figures_of(on), figures_of(off)
        outcomes.append(outcome_of(plan, on, f, g))
    if len(outcomes) > 1:
        print(medians_report(outcomes), flush=True)
    return 0 if all(o.sound for o in outcomes) and off.sound else 1


if __name__ == "__main__":
    raise SystemExit(main())
