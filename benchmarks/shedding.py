"""Load shedding under overload at max-parallelism (issue 32): the same overload with the
scheduler's shedding on and off, on isolated agents.

Owns this benchmark only (tests/test_shedding_bench.py checks its pure parts: latency from the
sampled curves, the backlog, the offline LP and the verdicts). It runs the query of
testkit/shed_support.py on the stack of testkit/e2e_support.py with cgroups isolation, one
agent per task (the generator's, each of the two instance slots', the sink's), each agent
`--agent-cpus` cpus, half for its executor and half for its task (every operator asks
cpus="C/2"), Spark local[1] per executor:

    src := generator(sequence, shed="random") -> src_drop -> heavy := project of FIELDS
    upper-cased Greek texts, automatic, parallelism = min = max = 2 (held at its bound) -> sink

Each mode (shedding on: the spec's `shed="random"`; off: the same spec without it) runs on a
fresh stack: the query starts at `--rate` rows/s, the run waits until the instances are out of
their stabilization window, measures `--unloaded` s, then raises the rate to `--factor` x
`--capacity` rows/s for `--overload` s (a control tuple, as `elastiq control Q src rate N`),
sampling the status once a second; then stops. Latency is measured from the curves (rows are
kept in order): a row reaching the sink at t was made available by the generator at the
moment t' when the rows made so far, less those dropped, reached the rows at the sink at t;
latency = t - t'. The backlog is the rows made and not yet at the sink nor dropped. The LP
optimum is computed offline (`scheduler.shedding.plan_shedding`) on the costs measured in the
run without shedding (each instance's busy seconds per row while saturated), with the
arrival the run with shedding measured; uniform random shedding at the same total drop loses,
with one source and one sink, exactly that drop (every plan dropping the same rows of one
stream loses the same), which the verdict says.

    python benchmarks/shedding.py [--capacity 600] [--factor 3] [--overload 120]
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

from benchmarks.bench_util import (Periodic, exit_on_sigterm, fmt, format_table,  # noqa: E402
                                   median_of, use_repo_on_path)

use_repo_on_path()

from scheduler.shedding import (DropPoint, Operator, ShedProblem, Sink,  # noqa: E402
                                plan_shedding, uniform_keep, weighted_loss)

log = logging.getLogger("bench.shedding")

QUERY = "bench-shed"
SAMPLE_EVERY = 1.0
SEED = 11


# --- the plan -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    fields: int
    rate: float  # rows/s while unloaded
    capacity: float  # rows/s the two instances are expected to sustain (sets the overload)
    factor: float  # the overload: factor x capacity
    unloaded: float  # s measured unloaded
    overload: float  # s of overload
    agent_cpus: float

    @property
    def overload_rate(self) -> float:
        return self.factor * self.capacity

    @property
    def limit(self) -> int:
        """More rows than the run can make: the run stops the query, not the generator."""
        return int(self.rate * (self.unloaded + 600) + self.overload_rate * (self.overload + 60))

    def source(self) -> dict[str, str]:
        return {"shape": "sequence", "rate": f"{self.rate:g}", "seed": str(SEED),
                "limit": str(self.limit)}


# --- sampling -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tick:
    at: float  # monotonic s
    made: float  # rows the generator made available (read + its backlog)
    dropped: float  # rows the drop shed
    sunk: float  # rows the sink task read
    busy: tuple[float, ...]  # each instance's busy ms
    rows: tuple[float, ...]  # each instance's rows in
    ratio: float
    decision: str


class Sampler(Periodic):
    """The query's status once a second, on a thread."""

    def __init__(self, stack: Any, source: str, slots: Sequence[str], sink: str) -> None:
        self.stack, self.source, self.slots, self.sink = stack, source, list(slots), sink
        self.ticks: list[Tick] = []
        self.elastic = ""
        super().__init__(SAMPLE_EVERY, "status")

    def sample(self) -> None:
        status = self.stack.status(QUERY)
        tasks = {t["task_id"]: t.get("figures") or {} for t in status.get("tasks", [])}

        def fig(task: str, name: str) -> float:
            return float(tasks.get(task, {}).get(name) or 0.0)

        shed = status.get("shedding") or {}
        drops = shed.get("drops") or [{}]
        decision = shed.get("decision") or {}
        elastic = ((status.get("elastic") or [{}])[0].get("decision") or {})
        tick = Tick(time.monotonic(), fig(self.source, "tuples_in") + fig(self.source, "backlog"),
                    fig(self.source, "rows_dropped"), fig(self.sink, "tuples_in"),
                    tuple(fig(s, "busy_ms") for s in self.slots),
                    tuple(fig(s, "tuples_in") for s in self.slots),
                    float(drops[0].get("ratio", 0.0)),
                    f"{decision.get('kind', '')} ({decision.get('reason', '')})")
        with self._lock:
            if self.ticks:  # counters never fall: a heartbeat without figures (the generator's
                last = self.ticks[-1]  # query rebuilt for a new rate) is not a fall
                tick = Tick(tick.at, max(tick.made, last.made), max(tick.dropped, last.dropped),
                            max(tick.sunk, last.sunk),
                            tuple(max(a, b) for a, b in zip(tick.busy, last.busy)),
                            tuple(max(a, b) for a, b in zip(tick.rows, last.rows)),
                            tick.ratio, tick.decision)
            self.ticks.append(tick)
            self.elastic = str(elastic.get("reason") or "")
            if len(self.ticks) % 15 == 0:
                log.info("made %.0f dropped %.0f sunk %.0f ratio %.2f shedding %s elastic %s",
                         tick.made, tick.dropped, tick.sunk, tick.ratio, tick.decision,
                         self.elastic)

    def snapshot(self) -> list[Tick]:
        with self._lock:
            return list(self.ticks)


# --- the figures (pure) -------------------------------------------------------------------------

def latencies(ticks: Sequence[Tick], t0: float, t1: float) -> list[float]:
    """For each sample in [t0, t1]: how long ago the rows now at the sink were made, the rows
    being kept in order (see the module docstring); NaN-free (samples before any match are
    left out)."""
    kept = [(t.at, t.made - t.dropped) for t in ticks]
    levels = [k for _, k in kept]
    out = []
    for t in ticks:
        if not t0 <= t.at <= t1 or t.sunk <= 0:
            continue
        i = bisect.bisect_left(levels, t.sunk)
        if i == 0 or i >= len(kept):
            if i < len(kept) and levels[i] == t.sunk:
                out.append(t.at - kept[i][0])
            continue
        (a, ka), (b, kb) = kept[i - 1], kept[i]
        made_at = a + (b - a) * (t.sunk - ka) / (kb - ka) if kb > ka else b
        out.append(max(0.0, t.at - made_at))
    return out


def backlog_at(ticks: Sequence[Tick], at: float) -> float:
    """Rows made and neither at the sink nor dropped, at the sample nearest `at`."""
    t = min(ticks, key=lambda x: abs(x.at - at))
    return max(0.0, t.made - t.dropped - t.sunk)


def between(ticks: Sequence[Tick], t0: float, t1: float) -> tuple[Tick, Tick]:
    inside = [t for t in ticks if t0 <= t.at <= t1]
    return inside[0], inside[-1]


def per_row_costs(ticks: Sequence[Tick], t0: float, t1: float) -> tuple[float, ...]:
    """Each instance's busy seconds per row read over [t0, t1] (NaN for none read)."""
    a, b = between(ticks, t0, t1)
    return tuple((bb - ba) / 1000.0 / (rb - ra) if rb > ra else math.nan
                 for ba, bb, ra, rb in zip(a.busy, b.busy, a.rows, b.rows))


def lp_problem(arrival: float, costs: Sequence[float]) -> ShedProblem:
    """The offline problem: the drop point at `arrival` rows/s, the generator's task (free),
    each instance reading its share (1/n) of the rows at its measured cost, the sink; each task
    alone on its agent, at most 1 busy s/s (a task runs its batches one after another)."""
    n = len(costs)
    instances = tuple(Operator(f"heavy{i + 1}", f"agent{i + 1}", c / n, 1.0 / n, ("src",))
                      for i, c in enumerate(costs))
    operators = (Operator("src", "agent0", 0.0, 1.0, ("src_drop",)), *instances,
                 Operator("sink", "agentS", 0.0, 1.0, tuple(o.name for o in instances)))
    capacity = {o.agent: 1.0 for o in operators}
    return ShedProblem((DropPoint("src_drop", arrival),), operators, (Sink("sink", "sink"),),
                       capacity, {o.name: 1.0 for o in operators})


def lp_loss(arrival: float, costs: Sequence[float]) -> float:
    return plan_shedding(lp_problem(arrival, costs)).loss


def uniform_loss(arrival: float, costs: Sequence[float], drop: float) -> float:
    problem = lp_problem(arrival, costs)
    return weighted_loss(problem, uniform_keep(problem, drop))


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


# --- one run ------------------------------------------------------------------------------------

@dataclass
class Run:
    shed: bool
    ticks: list[Tick] = field(default_factory=list)
    unloaded: tuple[float, float] = (math.nan, math.nan)
    overload: tuple[float, float] = (math.nan, math.nan)
    sound: bool = False
    sink_note: str = ""
    rows_at_sink: int = 0


def set_rate(stack: Any, rate: float) -> None:
    from common.api_client import RequestRejected
    from testkit.e2e_support import wait_until

    client = stack.client()

    def asked() -> str | None:
        try:
            return str(client.control(QUERY, [("src", "rate", f"{rate:g}")])["request"])
        except RequestRejected as exc:
            if exc.status != 409 and "still being applied" not in str(exc):
                raise
            return None

    request = wait_until(asked, 120, f"the rate {rate:g} accepted", step=0.5)
    wait_until(lambda: client.control_status(QUERY, request)["state"] != "pending", 120,
               f"the rate {rate:g} applied", step=0.1)


def run_once(plan: Plan, shed: bool, expected: dict[int, tuple]) -> Run:
    from compiler.pipeline import compile_spec_text
    from testkit.e2e_support import (read_sink, start_stack, stop_query, stop_stack, submit,
                                     wait_running, wait_until)
    from testkit.shed_support import DROP, check_sink, sink_key, spec

    run = Run(shed)
    with tempfile.TemporaryDirectory(prefix="elastiq-bench-shed-") as tmp:
        work = Path(tmp)
        text = spec(QUERY, plan.source(), plan.fields, "out/shed.jsonl", shed=shed,
                    cpus=plan.agent_cpus / 2, instances=2)
        query = compile_spec_text(text.encode(), str(work / f"{QUERY}.xml"), base_dir=work,
                                  query_id=QUERY).query
        (elastic,) = query.elastic
        source = elastic.splitters[0][0]
        sink_task = next(t.task_id for t in query.tasks if "sink" in t.operators)
        stack = start_stack(work / "stack", cpus_per_agent=plan.agent_cpus, agents=4,
                            spark_cores=1, isolation="cgroups", executor_cpus=plan.agent_cpus / 2)
        try:
            submit(stack, query)
            with Sampler(stack, source, elastic.slots, sink_task) as sampler:
                wait_running(stack, QUERY, timeout=300)
                wait_until(lambda: (t := sampler.snapshot()) and t[-1].sunk > 0, 300,
                           "first rows at the sink")
                wait_until(lambda: sampler.elastic not in ("", "stabilizing"), 240,
                           "the instances out of their stabilization window", step=0.5)
                began = time.monotonic()
                time.sleep(plan.unloaded)  # measuring: the sampler runs meanwhile
                run.unloaded = (began, time.monotonic())
                set_rate(stack, plan.overload_rate)
                began = time.monotonic()
                log.info("%s: overload at %g rows/s for %g s", "shed" if shed else "no shed",
                         plan.overload_rate, plan.overload)
                time.sleep(plan.overload)
                run.overload = (began, time.monotonic())
                run.ticks = sampler.snapshot()
            try:
                stop_query(stack, QUERY)
            except AssertionError as exc:  # a long queue: stop_stack ends it below
                log.warning("%s", exc)
            rows = read_sink(work / "out" / "shed.jsonl")
            checked = check_sink([sink_key(r, plan.fields) for r in rows], expected)
            run.sound, run.sink_note, run.rows_at_sink = checked.sound, checked.describe(), \
                len(rows)
            assert DROP in query.task(source).operators or not shed
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
    arrival: float  # rows/s made during the overload
    processed: float  # rows/s the instances read during the overload's second half
    dropped: float  # rows dropped during the overload
    drop_ratio: float  # of the rows made during the overload


def figures_of(run: Run) -> Figures:
    t = run.ticks
    (u0, u1), (o0, o1) = run.unloaded, run.overload
    mid = (o0 + o1) / 2
    a, b = between(t, o0, o1)
    m, _ = between(t, mid, o1)
    made = b.made - a.made
    return Figures(
        median_of(latencies(t, u0, u1)), median_of(latencies(t, mid, o1)),
        median_of(latencies(t, o0, o0 + 20)),
        backlog_at(t, o0), backlog_at(t, mid), backlog_at(t, o1),
        made / (b.at - a.at), (sum(b.rows) - sum(m.rows)) / (b.at - m.at),
        b.dropped - a.dropped, (b.dropped - a.dropped) / made if made > 0 else math.nan)


def report(plan: Plan, on: Run, off: Run, wall: float) -> str:
    f, g = figures_of(on), figures_of(off)
    mid = (off.overload[0] + off.overload[1]) / 2
    costs = per_row_costs(off.ticks, mid, off.overload[1])
    capacity = sum(1.0 / c for c in costs if c > 0)
    # the loss over the overload's second half, once the ratio holds (the first seconds are
    # the policy's detection, when nothing is shed yet)
    a, b = between(on.ticks, (on.overload[0] + on.overload[1]) / 2, on.overload[1])
    made = b.made - a.made
    achieved = (b.dropped - a.dropped) / made if made > 0 else math.nan
    arrival = made / (b.at - a.at)
    optimum = lp_loss(arrival, costs)
    uniform = uniform_loss(arrival, costs, achieved)
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
        ["rows / s the instances read, 2nd half", fmt(f.processed), fmt(g.processed), "-"],
        ["rows dropped during overload", fmt(f.dropped), fmt(g.dropped), "-"],
        ["rows dropped / made during overload", fmt(f.drop_ratio, 3), fmt(g.drop_ratio, 3),
         "-"],
    ]
    grew = g.backlog_end > g.backlog_mid > g.backlog_start and \
        g.latency_overload > g.latency_first
    lines = [
        f"Load shedding at max-parallelism: generator(sequence) -> heavy project of "
        f"{plan.fields} upper-cased Greek fields, automatic, 2 instances (min = max = 2) -> "
        f"file sink; 4 agents of {plan.agent_cpus:g} cpus each, isolated (cgroups; executor "
        f"and task {plan.agent_cpus / 2:g} cpus each), Spark local[1]; {plan.rate:g} rows/s "
        f"unloaded for {plan.unloaded:g} s, then {plan.overload_rate:g} rows/s ({plan.factor:g}"
        f" x the {plan.capacity:g} rows/s assumed) for {plan.overload:g} s; one run per mode",
        f"machine: {os.cpu_count()} cores, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "(latency: a row at the sink at t minus when the generator made it, rows kept in "
        "order, from 1 s status samples; backlog: rows made and neither at the sink nor "
        "dropped)",
        format_table(["figure", "shedding on", "shedding off", "goal"], rows),
        f"measured capacity (run without shedding, 2nd half, busy s per row of each instance: "
        f"{', '.join(f'{c * 1000:.2f} ms' for c in costs)}): {capacity:,.0f} rows/s; the "
        f"overload was {g.arrival / capacity:.2f}x it (goal x3)" if capacity > 0 else
        "measured capacity: none",
        f"goal: latency with shedding within 2x unloaded: "
        f"{verdict(f.latency_overload <= 2 * f.latency_unloaded)} ({fmt(f.latency_overload, 1)}"
        f" s against {fmt(f.latency_unloaded, 1)} s)",
        f"goal: backlog with shedding does not grow (2nd half): "
        f"{verdict(f.backlog_end <= f.backlog_mid + f.arrival)} ({fmt(f.backlog_mid)} -> "
        f"{fmt(f.backlog_end)} rows; 'grows' = by more than 1 s of arrival)",
        f"goal: weighted loss within 10 % of the LP optimum on the measured costs: "
        f"{verdict(achieved <= 1.1 * optimum)} (achieved {achieved:.3f} over the 2nd half at "
        f"{arrival:,.0f} rows/s, optimum {optimum:.3f}, x{achieved / optimum:.2f})"
        if optimum > 0 else f"goal: loss vs LP optimum: optimum 0 (achieved {achieved:.3f})",
        f"goal: lower than uniform random at the same total drop: "
        f"{verdict(achieved < uniform - 1e-9)} (uniform {uniform:.3f}: with one source and one "
        f"sink every plan dropping the same share of one stream loses the same; the LP can "
        f"only do better where sinks or sources differ)",
        f"goal: without shedding the backlog and latency grow: "
        f"{verdict(grew)}"
        f" (backlog {fmt(g.backlog_start)} -> {fmt(g.backlog_mid)} -> {fmt(g.backlog_end)}; "
        f"latency {fmt(g.latency_first, 1)} -> {fmt(g.latency_overload, 1)} s)",
        f"sinks: every emitted row a correct result of its input row, none twice: with "
        f"{'yes' if on.sound else 'NO'} ({on.rows_at_sink:,} rows; {on.sink_note}), without "
        f"{'yes' if off.sound else 'NO'} ({off.rows_at_sink:,} rows; {off.sink_note})",
        "shedding decisions (with): " + "; ".join(sorted({t.decision for t in on.ticks})),
        f"wall time {wall:.0f} s",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fields", type=int, default=6)
    parser.add_argument("--rate", type=float, default=150.0, help="rows/s unloaded")
    parser.add_argument("--capacity", type=float, default=600.0,
                        help="rows/s the two instances are expected to sustain")
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--unloaded", type=float, default=30.0)
    parser.add_argument("--overload", type=float, default=120.0,
                        help="s of overload (the issue's goal: 120)")
    parser.add_argument("--agent-cpus", type=float, default=1.0)
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
                args.overload, args.agent_cpus)
    expected = oracle(plan.source(), plan.fields)
    began = time.monotonic()
    on = run_once(plan, True, expected)
    off = run_once(plan, False, expected)
    print(report(plan, on, off, time.monotonic() - began))
    return 0 if on.sound and off.sound else 1


if __name__ == "__main__":
    raise SystemExit(main())
