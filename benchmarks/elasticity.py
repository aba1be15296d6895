"""Elasticity at run time under a load step: automatic mode (or one rescale by hand) on a
CPU-heavy keyed operator, and whether it keeps up, how fast, and how much it pauses.

Owns this benchmark only (not a test; tests/test_elasticity_bench.py checks its pure parts: the
spec, the oracle and the figures). It runs one query it writes
itself on the stack of testkit/e2e_support.py (embedded master, one agent per task: the
generator's, the sink's and one per instance slot, each agent with room for its executor and one
task; the framework scheduler and its HTTP API; a real executor and SparkSession of
local[--spark-cores] per agent; 127.0.0.1 only):

    src := generator(sensor shape, paced)
      -> heavy := project partitioned by `sensor`, elastic="auto" min 1 max 3 (starts on 1)
      -> some := filter(humidity < 50) -> file sink

`heavy` is stateless; with `--window` it is a keyed tumbling window aggregate instead (the
issue's "the same with the window aggregate as the elastic operator"):

    src -> heavy := window-aggregate of WINDOW_SECONDS s per sensor (partitioned by sensor,
      elastic as above): n = count, top = max(humidity), h_i = count of the rows where
      <the i-th heavy field> > 0 (true of every row: the expression is the cost) -> file sink

Its CPU cost: besides the four input columns it computes FIELDS
columns `length(upper(concat(sensor, '<3,900 Greek letters>')))`; upper-casing non-ASCII text
takes Spark's slow path (~70 us per field and row here), so one instance (one Spark task on one
core) carries a few thousand rows/s; the expression language caps one expression at 4,096
characters, hence several fields. Their values are exact integers, so the sink is compared with
a plain-Python oracle (the reference generator's rows, Python's `str.upper`) exactly.

Phases (automatic mode): `steady` at RATE rows/s; the generator's rate x4 (a control tuple, what
`elastiq control Q src rate N` sends); the step phase lasts until the generator has produced all
but `down` seconds of its limit; the rate back to RATE (the step down); then until the sink holds
every row of the limit. The scheduler's status of the query is sampled once a second (the
operator's parallelism, slots, rescales and the policy's latest decision; the generator task's
backlog and rows out; the instances' rows in). Printed: time to detect (the step applied -> the
first automatic scale-out asked, and -> applied, and -> its new instances running), rescale
steps to a stable parallelism (goal 1), pause per rescale (the splitter's pause between two
micro-batches; goal < 2 s stateless), backlog peak and time to drain it, throughput before,
during (one instance) and after the scale-out, whether the backlog stops growing after the first
step, the scale-in after the step down, and every decision that was not "hold steady/cooldown".

`--manual`: the same query with elastic="manual": after the step, `elastiq scale` to 2 by hand
(the API route the CLI calls), after the step down back to 1; prints each rescale's pause.

On one 2-core machine the extra instances share the cores with the generator, the splitter,
the sink and the JVM, so the speed-up is bounded (about 2x at most); the cores and load
average are printed.

    python benchmarks/elasticity.py [--rate 700] [--fields 5] [--repeats 1] [--manual]
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository: `benchmarks.*` (as the tests import it), `common`
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_util import (Periodic, exit_on_sigterm, fmt, format_table,  # noqa: E402
                                   median_of, use_repo_on_path)

use_repo_on_path()

from compiler.pipeline import compile_spec_text  # noqa: E402
from testkit.e2e_support import (Stack, generator_rows, multiset_diff, read_sink,  # noqa: E402
                                 start_stack, stop_query, stop_stack, submit, wait_running,
                                 wait_until, window_oracle)
from testkit.heavy_fields import LITERAL_CHARS, heavy_field, literal  # noqa: E402

log = logging.getLogger("bench.elasticity")

QUERY = "bench-elastic"
OPERATOR = "heavy"
SOURCE = "src"
STEP = 4  # the load step: the rate x4
SEED = 7
HUMIDITY_BELOW = 50.0  # the cheap filter behind the heavy project keeps ~half
WINDOW_SECONDS = 10  # --window: the tumbling window's size
WINDOW_WATERMARK_MS = 500  # --window: how late a row may come (the generator's rows are in order)
SAMPLE_EVERY = 1.0  # s between status samples
# Each agent offers an executor (0.5 cpus, ExecutorSpec's default) and one stateless task (0.5,
# compiler.tasks.task_resources), so no two tasks share an executor: with local[1] two queries in
# one SparkSession take turns on its one Spark core, and a generator beside a busy instance could
# not make its rows (the 2026-11-24 runs in benchmarks/README.md).
AGENT_CPUS = 1.0
QUIET_HOLDS = ("steady", "cooldown")  # hold reasons only counted


# --- the query ----------------------------------------------------------------------------------





@dataclass(frozen=True)
class Plan:
    rate: float  # rows/s before the step and after the step down
    fields: int  # heavy fields
    steady: float  # s of steady load before the step
    step: float  # s of the stepped load (about: ends by the generator's count)
    down: float  # s of load after the step down (about: ends with the generator's limit)
    manual: bool
    spark_cores: int = 1  # Spark's local[N] in each executor
    max_parallelism: int = 3
    # isolated agents of this many cpus (half the executor's, half its task's: every operator
    # asks for cpus="agent_cpus / 2"); None: unisolated agents of AGENT_CPUS
    agent_cpus: float | None = None
    window: bool = False  # the elastic operator a keyed window aggregate (else a project)

    @property
    def pause_goal(self) -> float:
        """The issue's goal for a rescale's pause: < 2 s stateless, < 5 s keyed window."""
        return 5.0 if self.window else 2.0

    @property
    def task_cpus(self) -> float | None:
        return self.agent_cpus / 2 if self.agent_cpus is not None else None

    @property
    def agents(self) -> int:
        """One agent per task: the generator's, the sink's and one per instance slot."""
        return self.max_parallelism + 2

    @property
    def limit(self) -> int:
        """Rows the generator makes: the planned phases at their rates, + 150 s at the base rate
        for the start-up and the settling before the steady phase; what is left after the down
        phase is flushed at a higher rate, outside the figures."""
        return int(self.rate * (self.steady + 150 + self.down) + STEP * self.rate * self.step)

    def source(self) -> dict[str, str]:
        return {"shape": "sensor", "rate": f"{self.rate:g}", "seed": str(SEED),
                "limit": str(self.limit)}


def spec(plan: Plan) -> str:
    params = "".join(f'<param name="{k}" value="{v}"/>' for k, v in plan.source().items())
    asks = f' cpus="{plan.task_cpus:g}"' if plan.task_cpus is not None else ""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="{QUERY}">
  <operator name="{SOURCE}" type="generator"{asks}>
    {params}
    <output name="raw"/>
  </operator>
{window_operators(plan, asks) if plan.window else project_operators(plan, asks)}
  <operator name="sink" type="file-sink"{asks}>
    <input name="kept"/>
    <param name="path" value="out/elastic.jsonl"/>
  </operator>
</dataflow>
"""


def elastic_attributes(plan: Plan, asks: str) -> str:
    mode = "manual" if plan.manual else "auto"
    return (f'partition-by="sensor" min-parallelism="1" max-parallelism="{plan.max_parallelism}" '
            f'elastic="{mode}"{asks}')


def project_operators(plan: Plan, asks: str) -> str:
    """The heavy project, then the cheap filter (`raw` -> `kept`)."""
    heavy = "\n".join(f'    <field name="h{i}" value="{heavy_field("sensor", i)}"/>'
                      for i in range(plan.fields))
    return f"""  <operator name="{OPERATOR}" type="project" {elastic_attributes(plan, asks)}>
    <input name="raw"/>
    <field name="sensor" value="sensor"/>
    <field name="ts" value="ts"/>
    <field name="temp" value="temp"/>
    <field name="humidity" value="humidity"/>
{heavy}
    <output name="scored"/>
  </operator>
  <operator name="some" type="filter"{asks}>
    <input name="scored"/>
    <param name="condition" value="humidity &lt; {HUMIDITY_BELOW:g}"/>
    <output name="kept"/>
  </operator>"""


def window_operators(plan: Plan, asks: str) -> str:
    """The heavy keyed window aggregate (`raw` -> `kept`): each heavy field is the condition of
    a filtered count, true of every row, so each row costs what the project's row does."""
    heavy = "\n".join(f'    <aggregate name="h{i}" function="count" '
                      f'where="{heavy_field("sensor", i)} &gt; 0"/>' for i in range(plan.fields))
    elastic = elastic_attributes(plan, asks)
    return f"""  <operator name="{OPERATOR}" type="window-aggregate" {elastic}>
    <input name="raw"/>
    <param name="time" value="ts"/>
    <param name="size" value="{WINDOW_SECONDS} seconds"/>
    <param name="watermark" value="{WINDOW_WATERMARK_MS} milliseconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="n" function="count"/>
    <aggregate name="top" function="max" column="humidity"/>
{heavy}
    <output name="kept"/>
  </operator>"""


def oracle(plan: Plan) -> Counter:
    """The sink's rows computed in plain Python: the reference generator's rows, the fields'
    lengths by Python's own upper-casing, the filter by a plain comparison; with `--window` the
    windows an append-mode query emits, counted and maxed in Python."""
    if plan.window:
        return window_oracle_rows(plan)
    uppers = [len(literal(i).upper()) for i in range(plan.fields)]
    return Counter(row_key(r["sensor"], r["ts"], r["temp"], r["humidity"],
                           [len(r["sensor"]) + u for u in uppers])
                   for r in generator_rows(plan.source()) if r["humidity"] < HUMIDITY_BELOW)


def window_oracle_rows(plan: Plan) -> Counter:
    size = timedelta(seconds=WINDOW_SECONDS)
    windows = window_oracle(generator_rows(plan.source()), "ts", ["sensor"], size, size,
                            timedelta(milliseconds=WINDOW_WATERMARK_MS))
    return Counter(window_key(start, sensor, len(rows), max(r["humidity"] for r in rows),
                              [len(rows)] * plan.fields)
                   for (start, sensor), rows in windows.items())


def window_key(start: Any, sensor: str, n: int, top: float, heavy: Sequence[int]) -> tuple:
    return (start, sensor, n, top, *heavy)


def row_key(sensor: str, ts: Any, temp: float, humidity: float, heavy: Sequence[int]) -> tuple:
    return (sensor, ts, temp, humidity, *heavy)


def sink_key(plan: Plan, row: dict[str, Any]) -> tuple:
    if plan.window:
        return window_key(row["window_start"], row["sensor"], row["n"], row["top"],
                          [row[f"h{i}"] for i in range(plan.fields)])
    return row_key(row["sensor"], row["ts"], row["temp"], row["humidity"],
                   [row[f"h{i}"] for i in range(plan.fields)])


# --- sampling the status ------------------------------------------------------------------------

@dataclass
class Tick:
    """One status sample (monotonic time, the scheduler's clock)."""

    at: float
    parallelism: int
    slots: list[str]
    decision: dict[str, Any] | None
    produced: float  # the generator task's rows out (into the splitter)
    backlog: float  # the generator task's backlog (rows made available, not yet planned)
    processed: float  # rows in, summed over the operator's instance tasks
    sunk: float  # rows in of the sink task


class StatusSampler(Periodic):
    """Samples the query's status every SAMPLE_EVERY s on a thread; keeps every tick, every
    rescale (by request, latest view) and every decision that changed."""

    def __init__(self, stack: Stack, slots: Sequence[str], source_task: str,
                 sink_task: str) -> None:
        self.stack, self.slots = stack, list(slots)
        self.source_task, self.sink_task = source_task, sink_task
        self.ticks: list[Tick] = []
        self.rescales: dict[str, dict[str, Any]] = {}
        self.decisions: list[tuple[float, dict[str, Any]]] = []
        self.placements: set[tuple[str, str]] = set()  # (task, agent) seen running
        super().__init__(SAMPLE_EVERY, "status")

    def sample(self) -> None:
        status = self.stack.status(QUERY)
        view = next((e for e in status.get("elastic", []) if e["operator"] == OPERATOR), None)
        if view is None:
            return
        tasks = {t["task_id"]: t for t in status.get("tasks", [])}

        def figure(task: str, name: str) -> float:
            return float((tasks.get(task, {}).get("figures") or {}).get(name) or 0.0)

        tick = Tick(time.monotonic(), int(view["parallelism"]),
                    [s["state"] + ("*" if s["retiring"] else "") for s in view["slots"]],
                    view.get("decision"), figure(self.source_task, "tuples_out"),
                    figure(self.source_task, "backlog"),
                    sum(figure(t, "tuples_in") for t in self.slots),
                    figure(self.sink_task, "tuples_in"))
        if len(self.ticks) % 10 == 0:
            log.info("parallelism %s %s, produced %.0f, backlog %.0f, instances read %.0f, "
                     "decision: %s", tick.parallelism, tick.slots, tick.produced, tick.backlog,
                     tick.processed, (tick.decision or {}).get("explanation", "none"))
        with self._lock:
            self.ticks.append(tick)
            for r in view["rescales"]:
                self.rescales[r["request"]] = r
            self.placements |= {(t["task_id"], t["agent_id"]) for t in tasks.values()
                                if t.get("state") == "running" and t.get("agent_id")}
            d = tick.decision
            if d is not None and (not self.decisions or
                                  self.decisions[-1][1]["explanation"] != d["explanation"]):
                self.decisions.append((tick.at, d))

    def snapshot(self) -> tuple[list[Tick], list[dict[str, Any]], list[tuple[float, dict]],
                                set[tuple[str, str]]]:
        with self._lock:
            rescales = sorted(self.rescales.values(), key=lambda r: r["asked_at"])
            return list(self.ticks), rescales, list(self.decisions), set(self.placements)

    def latest(self) -> Tick | None:
        with self._lock:
            return self.ticks[-1] if self.ticks else None


# --- one run ------------------------------------------------------------------------------------

@dataclass
class Run:
    plan: Plan
    began: float = math.nan  # the steady phase began
    step_at: float = math.nan  # the x4 rate applied (scheduler saw the ack)
    down_at: float = math.nan  # the rate back applied
    end_at: float = math.nan  # the down phase ended (the figures stop here)
    started_at: float = math.nan  # the first rows reached the sink
    ticks: list[Tick] = field(default_factory=list)
    rescales: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    manual: list[tuple[int, float]] = field(default_factory=list)  # (to, s request -> applied)
    placements: set[tuple[str, str]] = field(default_factory=set)  # (task, agent) seen running
    exact: bool = False
    diff: str = ""
    load: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())


def set_rate(stack: Stack, rate: float) -> float:
    """Send the generator's new rate; returns when the scheduler saw it applied. A query takes
    one control request at a time: while a rescale is still being applied (its new instances
    starting) the request is refused with "still being applied", and sent again."""
    from common.api_client import RequestRejected

    client = stack.client()

    def asked() -> str | None:
        try:
            return client.control(QUERY, [(SOURCE, "rate", f"{rate:g}")])["request"]
        except RequestRejected as exc:
            if "still being applied" not in str(exc):
                raise
            return None

    request = wait_until(asked, 300, f"the rate {rate:g} accepted (a rescale in flight)",
                         step=0.5)
    view = wait_until(lambda: (v := client.control_status(QUERY, request))["state"] != "pending"
                      and v, 120, f"the rate {rate:g} applied", step=0.05)
    if view["state"] != "applied":
        raise RuntimeError(f"the rate change was {view['state']}: {view.get('reason')}")
    return time.monotonic()


def scale_by_hand(stack: Stack, to: int) -> float:
    """`elastiq scale` through the API; returns the seconds until the rescale was applied."""
    asked = time.monotonic()
    reply = stack.client().scale(QUERY, OPERATOR, to)
    request = reply["request"]
    client = stack.client()
    view = wait_until(lambda: (v := client.control_status(QUERY, request))["state"] != "pending"
                      and v, 120, f"the scale to {to} applied", step=0.05)
    if view["state"] != "applied":
        raise RuntimeError(f"the scale to {to} was {view['state']}: {view.get('reason')}")
    return time.monotonic() - asked


def run_once(stack: Stack, work: Path, plan: Plan, expected: Counter) -> Run:
    query = compile_spec_text(spec(plan).encode(), str(work / f"{QUERY}.xml"), base_dir=work,
                              query_id=QUERY).query
    (elastic,) = query.elastic
    source_task = elastic.splitters[0][0]
    sink_task = next(t.task_id for t in query.tasks
                     if t.task_id not in (*elastic.slots, source_task))
    sink = work / "out" / "elastic.jsonl"
    result = Run(plan, load=(os.getloadavg(), ()))
    submit(stack, query)
    try:
        with StatusSampler(stack, elastic.slots, source_task, sink_task) as sampler:
            wait_running(stack, QUERY, timeout=300)
            wait_until(lambda: (t := sampler.latest()) is not None and t.sunk > 0, 240,
                       "first rows at the sink")
            result.started_at = time.monotonic()
            settle(sampler, plan)
            result.began = time.monotonic()
            log.info("steady at %g rows/s for %g s", plan.rate, plan.steady)
            time.sleep(plan.steady)
            result.step_at = set_rate(stack, STEP * plan.rate)
            log.info("stepped to %g rows/s", STEP * plan.rate)
            if plan.manual:
                time.sleep(10.0)  # let the backlog show, then react by hand
                result.manual.append((2, scale_by_hand(stack, 2)))
            last_step = plan.limit - plan.rate * (plan.down + 30)
            wait_until(lambda: time.monotonic() - result.step_at >= plan.step or
                       ((t := sampler.latest()) is not None and t.produced >= last_step),
                       plan.step + 60, "the end of the step phase", step=0.5)
            result.down_at = set_rate(stack, plan.rate)
            log.info("stepped down to %g rows/s", plan.rate)
            if plan.manual:
                time.sleep(10.0)
                result.manual.append((1, scale_by_hand(stack, 1)))
            wait_scale_in(sampler, plan, result.down_at)
            result.end_at = time.monotonic()
            log.info("flushing the rest of the generator's %s rows at %g rows/s (not measured)",
                     plan.limit, 2 * STEP * plan.rate)
            set_rate(stack, 2 * STEP * plan.rate)
            wait_flushed(sampler, plan, sink, expected)
            result.exact, result.diff = sink_matches(sink, plan, expected)
            result.ticks, result.rescales, result.decisions, result.placements = \
                sampler.snapshot()
    finally:
        stop_query(stack, QUERY)
    result.load = (result.load[0], os.getloadavg())
    return result


def settle(sampler: StatusSampler, plan: Plan) -> None:
    """Before the steady phase: wait (bounded, 150 s) until the operator runs on one instance
    and the generator's backlog is under 2 s of input: a start-up backlog (the generator runs
    before the rest of the query does) can make automatic mode scale out, then back in."""
    def quiet() -> bool:
        t = sampler.latest()
        return t is not None and t.parallelism == 1 and t.slots[0] == "running" and \
            all(s == "dormant" for s in t.slots[1:]) and t.backlog <= 2 * plan.rate
    try:
        wait_until(quiet, 150, "one instance and no backlog before the steady phase", step=0.5)
    except AssertionError as exc:
        log.warning("starting the steady phase anyway: %s", exc)


def wait_scale_in(sampler: StatusSampler, plan: Plan, since: float) -> None:
    """The down phase: until the operator is back on one instance and the others retired, then
    15 s more (a flap would show), at most `plan.down` s."""
    def back() -> bool:
        t = sampler.latest()
        return t is not None and t.parallelism == 1 and \
            all(s == "dormant" for s in t.slots[1:])
    try:
        wait_until(lambda: back() or time.monotonic() - since >= plan.down, plan.down + 30,
                   "the scale-in", step=0.5)
    except AssertionError:
        pass
    time.sleep(min(15.0, max(0.0, since + plan.down - time.monotonic())))


def wait_flushed(sampler: StatusSampler, plan: Plan, sink: Path, expected: Counter) -> None:
    """Until the sink task has read every generated row (behind the project and filter), or
    holds as many windows as the oracle (a window aggregate's sink reads windows, not rows)."""
    if plan.window:
        wait_until(lambda: len(read_sink(sink)) >= sum(expected.values()), 600,
                   "the sink to hold every closed window", step=1.0)
        return
    wait_until(lambda: (t := sampler.latest()) is not None and t.sunk >= plan.limit,
               600, "the sink task to read every generated row", step=0.5)


def sink_matches(sink: Path, plan: Plan, expected: Counter) -> tuple[bool, str]:
    """Whether the sink equals the oracle (waited for, bounded), and the difference if not."""
    def actual() -> Counter:
        return Counter(sink_key(plan, r) for r in read_sink(sink))

    try:
        wait_until(lambda: actual() == expected, 120, "the sink to equal the oracle", step=2.0)
    except AssertionError:
        return False, multiset_diff(expected, actual())
    return True, ""


# --- the figures --------------------------------------------------------------------------------

@dataclass
class Figures:
    detect_ask: float = math.nan  # step applied -> first scale-out asked
    detect_apply: float = math.nan  # -> applied at the splitter
    detect_running: float = math.nan  # -> every new instance running
    steps_out: int = 0  # scale-outs after the step until the step down
    stable_parallelism: int = 0
    pauses: list[float] = field(default_factory=list)
    backlog_peak: float = math.nan
    backlog_peak_at: float = math.nan  # s after the step
    drained_after: float = math.nan  # s after the first scale-out applied
    before: float = math.nan  # rows/s processed, steady phase
    saturated: float = math.nan  # rows/s processed, step -> first scale-out applied
    after: float = math.nan  # rows/s processed, once drained until the step down
    drain_rate: float = math.nan  # rows/s processed while draining
    slope_after: float = math.nan  # backlog rows/s over 15 s after the first scale-out
    scale_in_after: float = math.nan  # step down -> scale-in asked
    scale_in_to: int = 0
    scale_in_reason: str = ""
    final_parallelism: int = 0
    flaps: int = 0  # direction changes among the rescales of the step phase, of the down phase


def rate_between(ticks: Sequence[Tick], t0: float, t1: float, attr: str = "processed") -> float:
    inside = [t for t in ticks if t0 <= t.at <= t1]
    if len(inside) < 2 or inside[-1].at <= inside[0].at:
        return math.nan
    return (getattr(inside[-1], attr) - getattr(inside[0], attr)) / (inside[-1].at - inside[0].at)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y)."""
    if len(points) < 3:
        return math.nan
    mt = sum(t for t, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den if den else math.nan


def figures_of(run: Run) -> Figures:
    f = Figures()
    ticks = [t for t in run.ticks if t.at <= run.end_at]
    step, down = run.step_at, run.down_at
    f.before = rate_between(ticks, run.began, step)
    auto = [r for r in run.rescales if r["state"] == "applied" and step <= r["asked_at"] <=
            run.end_at]
    f.pauses = [float(r["pause_s"]) for r in run.rescales  # every rescale, start-up's too
                if r["state"] == "applied" and r["pause_s"] is not None and
                r["asked_at"] <= run.end_at]
    outs = [r for r in auto if r["to"] > r["from"] and step <= r["asked_at"] < down]
    f.steps_out = len(outs)
    f.flaps = reversals([r for r in auto if r["asked_at"] < down]) + \
        reversals([r for r in auto if r["asked_at"] >= down])
    during = [t for t in ticks if step <= t.at <= down]
    f.stable_parallelism = during[-1].parallelism if during else 0
    if during:
        peak = max(during, key=lambda t: t.backlog)
        f.backlog_peak, f.backlog_peak_at = peak.backlog, peak.at - step
    if outs:
        first = outs[0]
        f.detect_ask = first["asked_at"] - step
        f.detect_apply = (first["applied_at"] or math.nan) - step
        running = next((t.at for t in ticks if t.at >= first["asked_at"] and
                        all(s == "running" for s in t.slots[:first["to"]])), math.nan)
        f.detect_running = running - step
        applied = first["applied_at"] or math.nan
        f.saturated = rate_between(ticks, step, applied)
        f.slope_after = slope([(t.at, t.backlog) for t in ticks
                               if running + 2 <= t.at <= running + 17])
        threshold = drained_threshold(run)
        drained = next((t.at for t in ticks if t.at >= applied and t.at >= step +
                        f.backlog_peak_at and t.backlog <= threshold), math.nan)
        f.drained_after = drained - applied
        f.drain_rate = rate_between(ticks, running, drained)
        f.after = rate_between(ticks, drained, down)
    ins = [r for r in auto if r["to"] < r["from"] and r["asked_at"] >= down]
    if ins:
        f.scale_in_after = ins[0]["asked_at"] - down
        f.scale_in_to = ins[0]["to"]
        f.scale_in_reason = ins[0].get("reason", "")
    f.final_parallelism = ticks[-1].parallelism if ticks else 0
    return f


def reversals(rescales: Sequence[dict[str, Any]]) -> int:
    """How often the direction of consecutive rescales turned (a flap) under one load."""
    ups = [r["to"] > r["from"] for r in rescales]
    return sum(1 for a, b in zip(ups, ups[1:]) if a != b)


def drained_threshold(run: Run) -> float:
    """A backlog counts as drained at most 1 s of input at the stepped rate, or the steady
    phase's largest backlog if that was higher (a paced source is always a little behind)."""
    steady = [t.backlog for t in run.ticks if run.began <= t.at <= run.step_at]
    return max(STEP * run.plan.rate, max(steady, default=0.0))


# --- printing -----------------------------------------------------------------------------------

def s(value: float, digits: int = 1) -> str:
    return fmt(value, digits)


def run_table(runs: Sequence[Run], figs: Sequence[Figures]) -> str:
    rows = []
    for n, (run, f) in enumerate(zip(runs, figs), 1):
        rows.append([str(n), s(f.detect_ask), s(f.detect_apply), s(f.detect_running),
                     str(f.steps_out), str(f.stable_parallelism),
                     ", ".join(f"{p:.2f}" for p in f.pauses) or "-", fmt(f.backlog_peak),
                     s(f.drained_after), fmt(f.before), fmt(f.saturated), fmt(f.drain_rate),
                     fmt(f.after), fmt(f.slope_after), s(f.scale_in_after),
                     str(f.final_parallelism), "yes" if run.exact else "NO"])
    return format_table(["run", "detect s", "applied s", "running s", "steps", "stable at",
                         "pauses s", "backlog peak", "drained s", "before r/s", "1 inst r/s",
                         "draining r/s", "after r/s", "backlog slope/s", "scale-in s",
                         "final", "exact"], rows)


def decision_lines(run: Run) -> list[str]:
    """Every decision to move, in full; the holds counted by reason, each reason's first one
    of the step phase (or of the run) in full."""
    lines, holds = [], Counter()
    shown: set[str] = set()
    in_step = [(at, d) for at, d in run.decisions if at >= run.step_at]
    firsts = {d["reason"]: (at, d) for at, d in reversed(in_step or run.decisions)
              if d["kind"] == "hold"}
    for at, d in run.decisions:
        if d["kind"] == "hold":
            holds[d["reason"]] += 1
            if firsts.get(d["reason"]) != (at, d) or d["reason"] in QUIET_HOLDS or \
                    d["reason"] in shown:
                continue
            shown.add(d["reason"])
        lines.append(f"  t={at - run.step_at:+7.1f} s: {d['explanation']}")
    lines.append("  holds (distinct decisions, by reason): " +
                 (", ".join(f"{r} {n}" for r, n in holds.most_common()) or "none"))
    return lines


def verdicts(runs: Sequence[Run], figs: Sequence[Figures]) -> list[str]:
    steps = median_of([float(f.steps_out) for f in figs])
    pauses = [p for f in figs for p in f.pauses]
    worst = max(pauses, default=math.nan)
    slopes = median_of([f.slope_after for f in figs])
    scale_in = all(f.scale_in_to and f.scale_in_to < f.stable_parallelism for f in figs)
    exact = all(r.exact for r in runs)
    plan = runs[0].plan
    rate = plan.rate * STEP

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    return [
        f"goal: one rescale step to a stable parallelism in every run: "
        f"{verdict(all(f.steps_out == 1 for f in figs))} ("
        f"{sum(f.steps_out == 1 for f in figs)} of {len(figs)} runs; median {s(steps, 1)} steps)",
        f"goal: pause per rescale < {plan.pause_goal:g} s "
        f"({'keyed window' if plan.window else 'stateless'}): {verdict(worst < plan.pause_goal)} "
        f"(worst {s(worst, 2)} s of {len(pauses)})",
        f"goal: the backlog stops growing after one step: {verdict(slopes <= 0.02 * rate)} "
        f"(median slope {fmt(slopes)} rows/s over 15 s after the new instances ran; "
        f"'stops' = at most 2 % of the {rate:,.0f} rows/s offered)",
        f"scale-in after the step down: {'yes' if scale_in else 'NO'}",
        f"results exact (sink = plain-Python oracle, every run): {'yes' if exact else 'NO'}",
    ]


def report(runs: Sequence[Run], figs: Sequence[Figures], wall: float) -> str:
    plan = runs[0].plan
    mode = "manual (elastiq scale by hand)" if plan.manual else "automatic (elastic=\"auto\")"
    operator = (f"tumbling window aggregate of {WINDOW_SECONDS} s per sensor, keyed, "
                f"{plan.fields} counts where upper(<{LITERAL_CHARS} Greek letters>) per row"
                if plan.window else
                f"project partitioned by sensor, stateless, {plan.fields} fields of "
                f"upper(<{LITERAL_CHARS} Greek letters>) per row")
    after = "" if plan.window else f" -> filter humidity < {HUMIDITY_BELOW:g}"
    lines = [f"Elasticity: generator(sensor) -> {operator}, min 1 max "
             f"{plan.max_parallelism}, {mode}{after} -> file "
             f"sink; {plan.agents} agents of " + (
                 f"{plan.agent_cpus:g} cpus, isolated (cgroups; executor and task "
                 f"{plan.task_cpus:g} each)" if plan.agent_cpus is not None else
                 f"{AGENT_CPUS:g} cpus, unisolated") + " (one task each), an "
             f"executor with Spark local[{plan.spark_cores}] on each; {plan.rate:g} rows/s for "
             f"{plan.steady:g} s, x{STEP} = {STEP * plan.rate:g} rows/s for ~{plan.step:g} s, "
             f"back to {plan.rate:g} rows/s; limit {plan.limit:,} rows",
             f"machine: {os.cpu_count()} cores; load average (1/5/15 min) at the start of each "
             f"run: " + "; ".join(" ".join(f"{x:.1f}" for x in r.load[0]) for r in runs) +
             ", at the end: " + "; ".join(" ".join(f"{x:.1f}" for x in r.load[1])
                                          for r in runs),
             "(times in s after the x4 step was applied; detect = first scale-out asked; "
             "applied = the splitter routes to the new slots; running = every new instance runs; "
             "steps = scale-outs between the step and the step down; pauses = every rescale's "
             "splitter pause; drained = backlog back to <= 1 s of stepped input, after the first "
             "scale-out applied; r/s = rows/s the instances read; backlog slope = over the 15 s "
             "after the new instances ran; scale-in = step down -> scale-in asked)",
             run_table(runs, figs)]
    if plan.manual:
        for n, run in enumerate(runs, 1):
            lines.append(f"run {n}: by hand " + ", ".join(
                f"scale to {to}: applied {t:.2f} s after the request" for to, t in run.manual))
    else:
        lines += verdicts(runs, figs)
    for n, (run, f) in enumerate(zip(runs, figs), 1):
        lines.append(f"run {n}: rescales: " + "; ".join(
            f"{r['from']}->{r['to']} {r['trigger']} asked t={r['asked_at'] - run.step_at:+.1f} "
            f"s, pause {r['pause_s'] if r['pause_s'] is None else round(r['pause_s'], 2)} s, "
            f"{r['state']}" for r in run.rescales) + (f"; flaps {f.flaps}" if f.flaps else ""))
        lines.append(f"run {n}: tasks ran on: " + ", ".join(
            f"{task} {agent[-6:]}" for task, agent in sorted(run.placements)))
        if f.scale_in_reason:
            lines.append(f"run {n}: scale-in decision: {f.scale_in_reason}")
        lines.append(f"run {n}: decisions to move, and the first hold of each other reason "
                     f"after the step (t after the step; step down at "
                     f"t={run.down_at - run.step_at:+.1f} s, figures end at "
                     f"t={run.end_at - run.step_at:+.1f} s):")
        lines += decision_lines(run) or ["  none"]
        if not run.exact:
            lines.append(f"run {n}: sink differs from the oracle:\n{run.diff}")
    lines.append(f"wall time {wall:.0f} s")
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=700.0,
                        help="rows/s before the x4 step and after the step down (default 700)")
    parser.add_argument("--fields", type=int, default=5,
                        help="heavy fields per row (~70 us each here; default 5)")
    parser.add_argument("--steady", type=float, default=30.0, help="s before the step")
    parser.add_argument("--step", type=float, default=100.0, help="s of stepped load (about)")
    parser.add_argument("--down", type=float, default=80.0, help="s after the step down (about)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--spark-cores", type=int, default=1,
                        help="Spark's local[N] in each executor (default 1: an instance is one "
                             "core, as on 1-CPU agents; with 2 on this 2-core machine one "
                             "instance already uses every core, and more instances add none)")
    parser.add_argument("--agent-cpus", type=float, default=None,
                        help="agents isolated (cgroups, as Mesos's cgroups/cpu) with this many "
                             "cpus each, half for the executor and half for its task (every "
                             "operator asks cpus=C/2); default: unisolated agents of 1 cpu")
    parser.add_argument("--window", action="store_true",
                        help="the elastic operator a keyed tumbling window aggregate (pause "
                             "goal 5 s) instead of the stateless project")
    parser.add_argument("--manual", action="store_true",
                        help="elastic=\"manual\": one scale to 2 by hand, then back to 1")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if not 1 <= args.fields <= 12 or args.rate <= 0 or args.repeats < 1 or \
            args.spark_cores < 1 or (args.agent_cpus is not None and not args.agent_cpus > 0):
        parser.error("--fields 1..12, --rate > 0, --repeats >= 1, --spark-cores >= 1, "
                     "--agent-cpus > 0")
    plan = Plan(args.rate, args.fields, args.steady, args.step, args.down, args.manual,
                args.spark_cores, agent_cpus=args.agent_cpus, window=args.window)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    for noisy in ("executor", "scheduler", "elastiq", "pymesos", "tests.e2e"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    expected = oracle(plan)
    log.info("oracle: %s rows at the sink of %s generated", sum(expected.values()), plan.limit)
    began = time.monotonic()
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="elastiq-bench-elastic-") as tmp:
            stack = start_stack(Path(tmp) / "stack", cpus_per_agent=plan.agent_cpus or AGENT_CPUS,
                                agents=plan.agents, spark_cores=plan.spark_cores,
                                isolation="cgroups" if plan.agent_cpus else "auto",
                                executor_cpus=plan.task_cpus)
            try:
                runs.append(run_once(stack, Path(tmp), plan, expected))
            finally:
                leftovers = stop_stack(stack)
                if leftovers:
                    log.warning("SIGKILLed leftover executor processes %s", leftovers)
        log.info("run %s of %s done", repeat + 1, args.repeats)
    figs = [figures_of(r) for r in runs]
    print(report(runs, figs, time.monotonic() - began))
    return 0 if all(r.exact for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
