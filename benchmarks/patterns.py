"""The patterns at run time on the embedded cluster: failover gaps, overhead, partitioning speed-up.

Owns this benchmark only (not a test; nothing in tests/ imports it). It writes its own specs (XML
text generated here) into a temporary folder, compiles them with `compiler.pipeline`, runs them
on the stack of testkit/e2e_support.py (embedded Mesos-compatible master and agents, the framework
scheduler, one real executor + SparkSession per agent, all on 127.0.0.1) and kills real processes
with SIGKILL. Sections (--only gaps|overhead|partition|fold, default all):

- gaps: standby (filter), checkpoint and hot standby (window aggregates) under a steady load on a
  3-agent stack. A thread polls the sink file's size every 10 ms and records each change. Before
  any kill, the normal interval between sink writes (p50, max) is the baseline. Then 3 kills of
  the protected task's Spark source-runner process (the executor restarts the query in place)
  and K kills (--kills, default 5) of the whole executor of the agent running the protected task
  (hot standby: the two replicas in turn, each time waiting until the killed one runs again).
  Gap of a kill: from the SIGKILL to the first sink growth after the replacement runs (standby,
  checkpoint: the first growth once the scheduler reports the relaunched attempt running; hot
  standby and in-place restarts: the first growth after the kill). At the end the sink is
  compared with the plain-Python oracles of the pattern tests (testkit/patterns_support.py).
- overhead: the same query with and without the pattern attribute (standby on a filter;
  checkpoint and hot standby on a window aggregate) on one 3-agent stack, order rotating, median
  of the repeats. Throughput = rows of a finite input, offered faster than it is processed,
  over the time from every task running to the sink holding the oracle result; and the same
  from the source's first offered row (its pacing anchor), start-up spread included.
- fold: the overhead section's filter in one task, folded into the sink's task
  (min-parallelism="0" at parallelism 0) and split onto an agent of its own (at 1), throughput
  as in overhead; then a paced folded filter split and merged while it runs (`elastiq scale
  --split`/`--merge` through the API), each change's time to applied, splitter pause and (a
  merge) time until the split instance retired; the sink against the filter oracle.
- partition: a CPU-heavy project (four fields, each the sum of three chains of 20 nested
  sqrt/ln/exp/pow calls over temp and humidity; a cheap filter behind it keeps ~5 % for the sink) with parallelism="2" (splitter -> 2 instances -> merger) against one instance
  with the same two channel hops (parallelism="1" compiles to no plumbing at all and a one-input
  merger does not run, so the k=1 plan comes from a benchmark-owned rewrite rule
  `bench-partition-one` written into the temp folder: writer -> instance -> writer, three tasks
  like k=2 minus the second instance). A 2-agent stack, one Spark core per agent. With
  --agent-cpus C: k = 1, 2, 3 on 5 cgroup-isolated agents of C cpus, one task per agent, each
  run's agents' cpu use, limit and throttled periods printed (their /monitor/statistics);
  --chains N sets the project's chains per field (its cost per row; default 3).

    python benchmarks/patterns.py [--only gaps|overhead|partition|fold] [--kills K] [--repeats N]
                                  [--quick] [--agent-cpus C] [--rows N] [--chains N]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench_util import (ROOT, LineCounter, exit_on_sigterm, fmt, format_table, median_of,
                        percentile, ratio, use_repo_on_path)

use_repo_on_path()

from compiler.pipeline import compile_spec_text  # noqa: E402
from testkit.e2e_support import (  # noqa: E402
    Stack, generator_rows, hurry, java_child, kill_session, session_members, source_runner_pids,
    start_stack, stop_query, stop_stack, submit, wait_running, wait_until, window_oracle,
    windows_of)
from testkit.waiting import poll  # noqa: E402
from executor import shapes  # noqa: E402
from scheduler.config import ExecutorSpec  # noqa: E402

log = logging.getLogger("bench.patterns")

SEED = 61
START = "2024-01-01T00:00:00Z"
POLL_SECONDS = 0.010  # sink-size poller
STATUS_POLL = 0.05  # scheduler status poller while waiting for a relaunch
READING_KEY = ("sensor", "ts", "temp", "humidity")
WINDOW_KEY = ("window_start", "window_end", "sensor", "readings")
GOALS = {"hot-standby": 1.0, "standby": 3.0, "checkpoint": 10.0}
PARTITION_GOAL = 1.6
ISOLATED_GOALS = {2: 1.8, 3: 2.5}  # issue 31: k/k=1 with one instance per isolated agent
# the partition section's CPU-heavy project (heavy_expression)
HEAVY_DEPTH = 20
HEAVY_FIELDS = 4
HEAVY_CHAINS = 3  # chains summed per field: 4 x 3 x 20 = 240 math calls per row


# --- plans ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    kills: int
    inplace_kills: int
    repeats: int
    gap_rate: int  # rows/s of the steady load
    baseline_s: float
    settle_s: float  # steady time between kills
    overhead_rate: int
    window_rate: int  # the overhead section's window runs (they process more than overhead_rate)
    filter_rows: int
    window_rows: int
    partition_rows: int
    # --agent-cpus: the partition section on isolated agents of this many cpus (cgroups), one
    # task per agent (every operator asks for it less the executor's own share), k = 1, 2, 3
    agent_cpus: float | None = None
    heavy_chains: int = HEAVY_CHAINS  # --chains: the partition project's chains per field


FULL = Plan(kills=5, inplace_kills=3, repeats=3, gap_rate=500, baseline_s=10.0, settle_s=4.0,
            overhead_rate=500_000, window_rate=1_000_000, filter_rows=2_000_000,
            window_rows=6_000_000, partition_rows=1_000_000)
QUICK = Plan(kills=2, inplace_kills=1, repeats=1, gap_rate=500, baseline_s=6.0, settle_s=3.0,
             overhead_rate=500_000, window_rate=1_000_000, filter_rows=600_000,
             window_rows=2_000_000, partition_rows=300_000)


# --- specs (generated XML) -------------------------------------------------------------------

def generator_xml(rate: int, limit: int, seed: int = SEED, asks: str = "") -> str:
    return f"""  <operator name="src" type="generator"{asks}>
    <param name="shape" value="sensor"/>
    <param name="rate" value="{rate}"/>
    <param name="seed" value="{seed}"/>
    <param name="limit" value="{limit}"/>
    <param name="start" value="{START}"/>
    <output name="raw"/>
  </operator>"""


# the filter folded into the sink's task, or split onto an agent of its own (section fold)
FOLDING = {"folded": ' parallelism="0" min-parallelism="0" max-parallelism="1"',
           "split": ' parallelism="1" min-parallelism="0" max-parallelism="1"'}


def pattern_attr(pattern: str | None) -> str:
    return {None: "", "standby": ' ha="standby"', "checkpoint": ' ha="checkpoint"',
            "hot-standby": ' ha="hot-standby" replicas="2"', **FOLDING}[pattern]


def filter_spec(name: str, pattern: str | None, rate: int, limit: int) -> str:
    return f"""<dataflow name="{name}">
{generator_xml(rate, limit)}
  <operator name="warm" type="filter"{pattern_attr(pattern)}>
    <input name="raw"/>
    <param name="condition" value="raw.temp &gt; 25 and raw.humidity &lt; 60"/>
    <output name="warmReadings"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="warmReadings"/>
    <param name="path" value="out/{name}.jsonl"/>
  </operator>
</dataflow>
"""


@dataclass(frozen=True)
class Windows:
    size_ms: int
    watermark_ms: int


def window_spec(name: str, pattern: str | None, rate: int, limit: int, w: Windows) -> str:
    return f"""<dataflow name="{name}">
{generator_xml(rate, limit)}
  <operator name="counts" type="window-aggregate"{pattern_attr(pattern)}>
    <input name="raw"/>
    <param name="time" value="ts"/>
    <param name="size" value="{w.size_ms} milliseconds"/>
    <param name="watermark" value="{w.watermark_ms} milliseconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="readings" function="count"/>
    <aggregate name="total_temp" function="sum" column="temp"/>
    <output name="countsPerWindow"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="countsPerWindow"/>
    <param name="path" value="out/{name}.jsonl"/>
  </operator>
</dataflow>
"""


# The CPU-heavy projection: each step wraps the previous expression x once, so the text stays
# linear (the language caps an expression at 4096 characters) and values stay finite and > 0.
HEAVY_STEPS: tuple[tuple[str, Callable[[float, float, float], float]], ...] = (
    ("sqrt(pow({x}, 2) + humidity)", lambda x, t, h: math.sqrt(math.pow(x, 2) + h)),
    ("ln({x} + temp)", lambda x, t, h: math.log(x + t)),
    ("exp({x} / 8)", lambda x, t, h: math.exp(x / 8)),
    ("pow({x} + 1, 1.5)", lambda x, t, h: math.pow(x + 1, 1.5)),
    ("sqrt({x} * temp)", lambda x, t, h: math.sqrt(x * t)),
)
KEEP_BELOW = 23.0  # the filter after the heavy project keeps humidity < this (of 20..80): ~5 %,
# so the sink stays cheap


def heavy_chain(variant: int) -> tuple[str, Callable[[float, float], float]]:
    """(expression text, plain-Python twin) of one chain of HEAVY_DEPTH nested calls; `variant`
    shifts the start value and the step order so that no two chains share subexpressions."""
    text, steps = f"(temp + {variant})", []
    for depth in range(HEAVY_DEPTH):
        template, fn = HEAVY_STEPS[(depth + variant) % len(HEAVY_STEPS)]
        text = template.format(x=text)
        steps.append(fn)

    def twin(temp: float, humidity: float) -> float:
        x = temp + variant
        for fn in steps:
            x = fn(x, temp, humidity)
        return x

    return text, twin


def heavy_expression(field_no: int, count: int = HEAVY_CHAINS
                     ) -> tuple[str, Callable[[float, float], float]]:
    """One output field: the sum of `count` chains (~300 characters of text each)."""
    chains = [heavy_chain(field_no * count + j) for j in range(count)]
    text = " + ".join(t for t, _ in chains)

    def twin(temp: float, humidity: float) -> float:
        total = 0.0
        for _, fn in chains:
            total = total + fn(temp, humidity)
        return total

    return text, twin


def partition_spec(name: str, k: int, rate: int, limit: int, cpus: float | None = None,
                   chains: int = HEAVY_CHAINS, heavy_fields: int = HEAVY_FIELDS,
                   heavy_attr: str | None = None, keep_below: float = KEEP_BELOW) -> str:
    """k>=2: parallelism="k" (a project names no key: rows split by the hash of all columns);
    k=1: pipeline="split", which the benchmark's rule `bench-partition-one` turns into
    source | channel | one instance | channel | sink. `cpus`: what every operator asks;
    `chains`: the heavy chains summed per field (the instances' cost per row, rows as wide);
    `heavy_attr`: the project's attributes instead of k's (run_scale.py: max-parallelism);
    `keep_below`: the filter's humidity bound (rows of 20..80 kept below it)."""
    attr = heavy_attr if heavy_attr is not None else (
        f' parallelism="{k}"' if k >= 2 else ' pipeline="split"')
    asks = f' cpus="{cpus:g}"' if cpus is not None else ""
    fields = "\n".join(f'    <field name="v{i}" value="{heavy_expression(i, chains)[0]}"/>'
                       for i in range(heavy_fields))
    return f"""<dataflow name="{name}">
{generator_xml(rate, limit, asks=asks)}
  <operator name="heavy" type="project"{attr}{asks}>
    <input name="raw"/>
    <field name="sensor" value="sensor"/>
    <field name="ts" value="ts"/>
    <field name="humidity" value="humidity"/>
{fields}
    <output name="scored"/>
  </operator>
  <operator name="few" type="filter"{asks}>
    <input name="scored"/>
    <param name="condition" value="humidity &lt; {keep_below:g}"/>
    <output name="kept"/>
  </operator>
  <operator name="sink" type="file-sink"{asks}>
    <input name="kept"/>
    <param name="path" value="out/{name}.jsonl"/>
  </operator>
</dataflow>
"""


PARTITION_ONE_RULE = """# benchmarks/patterns.py: parallelism="1" is no change (no plumbing), and a splitter or
# merger with one partition does not run (the runtime's union needs two inputs), so the k=1
# baseline asks for pipeline="split" on its project and this rule gives it the k=2 plan's task
# shape: source | channel | instance on its own placement label | channel | sink
rule bench-partition-one
phase partitioning
focus f
match a2 := any(f := any(a1 := any*))
when  wants(f, pipeline, split), kind(f, project)
=>    a2(i := network-reader(o := network-writer(
          f@p1(r := network-reader@p1(w := network-writer(a1))))))
"""


def compile_query(text: str, folder: Path, query_id: str, rules: Path | None = None) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{query_id}.xml"
    path.write_text(text, encoding="utf-8")
    return compile_spec_text(text.encode(), str(path), base_dir=folder, query_id=query_id,
                             rules_dir=rules).query


def sink_file(folder: Path, name: str) -> Path:
    return folder / "out" / f"{name}.jsonl"


# --- oracles (plain Python over executor.shapes.reference_row) --------------------------------

def gen_params(rate: int, limit: int) -> dict[str, str]:
    return {"shape": "sensor", "rate": str(rate), "seed": str(SEED), "limit": str(limit),
            "start": START}


def filter_keep(row: dict[str, Any]) -> bool:
    return row["temp"] > 25 and row["humidity"] < 60


def filter_oracle(rate: int, limit: int) -> Counter:
    """The tests' filter oracle: the kept readings as a multiset."""
    return Counter(tuple(r[c] for c in READING_KEY) for r in generator_rows(gen_params(rate, limit))
                   if filter_keep(r))


def windows_oracle(rate: int, limit: int, w: Windows) -> dict[tuple, float]:
    """The tests' window oracle: (start, end, sensor, readings) -> total temp."""
    size, delay = timedelta(milliseconds=w.size_ms), timedelta(milliseconds=w.watermark_ms)
    groups = window_oracle(generator_rows(gen_params(rate, limit)), "ts", ["sensor"], size, size,
                           delay)
    return {(start, start + size, sensor, len(rows)): sum(r["temp"] for r in rows)
            for (start, sensor), rows in groups.items()}


def reference_rows(rate: int, limit: int) -> Iterator[dict[str, Any]]:
    """The generator's rows one at a time (the big inputs do not fit a list comfortably)."""
    shape = shapes.shape_named("sensor")
    start_us = shapes.parse_start(START)
    for i in range(limit):
        yield shapes.reference_row(shape, SEED, start_us, float(rate), i)


@dataclass(frozen=True)
class Digest:
    """An order-independent fingerprint of a multiset of rows: count and sum of row hashes."""
    count: int
    total: int


def digest(keys: Iterator[tuple]) -> Digest:
    count, total = 0, 0
    for key in keys:
        count += 1
        total = (total + hash(key)) & 0xFFFF_FFFF_FFFF_FFFF
    return Digest(count, total)


@dataclass(frozen=True)
class BigOracle:
    """Oracles of the overhead and partition inputs, computed in one streaming pass each."""
    filter_digest: Digest | None = None
    windows: dict[tuple, float] | None = None
    heavy: dict[tuple, tuple[float, ...]] | None = None


def big_filter_oracle(rate: int, limit: int) -> Digest:
    return digest(tuple(r[c] for c in READING_KEY) for r in reference_rows(rate, limit)
                  if filter_keep(r))


def big_window_oracle(rate: int, limit: int, w: Windows) -> dict[tuple, float]:
    """Same as windows_oracle without holding the rows: count and sum per (window, sensor)."""
    size, delay = timedelta(milliseconds=w.size_ms), timedelta(milliseconds=w.watermark_ms)
    counts: dict[tuple, int] = defaultdict(int)
    sums: dict[tuple, float] = defaultdict(float)
    latest = None
    for r in reference_rows(rate, limit):
        latest = r["ts"] if latest is None or r["ts"] > latest else latest
        for start in windows_of(r["ts"], size, size):
            counts[(start, r["sensor"])] += 1
            sums[(start, r["sensor"])] += r["temp"]
    closed_by = latest - delay
    return {(s, s + size, g, n): sums[(s, g)] for (s, g), n in counts.items()
            if s + size <= closed_by}


def heavy_oracle(rate: int, limit: int, chains: int = HEAVY_CHAINS,
                 fields: int = HEAVY_FIELDS, keep_below: float = KEEP_BELOW
                 ) -> dict[tuple, tuple[float, ...]]:
    """(sensor, ts) -> v0.. of the generator's first `limit` rows the partition query keeps
    (`partition_spec`'s), computed in plain Python (`math`)."""
    twins = [heavy_expression(i, chains)[1] for i in range(fields)]
    return {(r["sensor"], r["ts"]): tuple(t(r["temp"], r["humidity"]) for t in twins)
            for r in reference_rows(rate, limit) if r["humidity"] < keep_below}


# --- reading sinks ---------------------------------------------------------------------------

def parse_value(v: Any) -> Any:
    if isinstance(v, str) and v.endswith("Z") and "T" in v:
        return datetime.fromisoformat(v.replace("Z", "+00:00"))
    return v


def sink_rows(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield {k: parse_value(v) for k, v in json.loads(line).items()}


def exact_filter(path: Path, expected: Counter) -> bool:
    return Counter(tuple(r[c] for c in READING_KEY) for r in sink_rows(path)) == expected


def exact_windows(path: Path, expected: dict[tuple, float]) -> bool:
    rows = list(sink_rows(path))
    got = Counter(tuple(r[c] for c in WINDOW_KEY) for r in rows)
    if got != Counter(expected.keys()):
        return False
    return all(math.isclose(r["total_temp"], expected[tuple(r[c] for c in WINDOW_KEY)],
                            rel_tol=1e-12, abs_tol=1e-9) for r in rows)


def exact_heavy(path: Path, expected: dict[tuple, tuple[float, ...]]) -> bool:
    rows = list(sink_rows(path))
    if Counter((r["sensor"], r["ts"]) for r in rows) != Counter(expected.keys()):
        return False
    return all(all(math.isclose(r[f"v{i}"], want, rel_tol=1e-9)
                   for i, want in enumerate(expected[(r["sensor"], r["ts"])])) for r in rows)


# --- the sink-size poller --------------------------------------------------------------------

class SizeWatcher:
    """Records (monotonic time, size) of a file at every change, polled every 10 ms."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sink-size", daemon=True)

    def __enter__(self) -> SizeWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        last = -1
        while not self._stop.is_set():
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size != last:
                with self._lock:
                    self.events.append((time.monotonic(), size))
                last = size
            time.sleep(POLL_SECONDS)

    def snapshot(self) -> list[tuple[float, int]]:
        with self._lock:
            return list(self.events)

    def size_at(self, t: float) -> int:
        size = 0
        for when, s in self.snapshot():
            if when > t:
                break
            size = s
        return size

    def first_growth(self, after: float, than: int) -> float | None:
        """The first recorded time > `after` with a size above `than`."""
        for when, s in self.snapshot():
            if when > after and s > than:
                return when
        return None

    def write_intervals(self, since: float, until: float) -> list[float]:
        times = [t for t, s in self.snapshot() if since <= t <= until and s > 0]
        return [b - a for a, b in zip(times, times[1:])]


# --- processes -------------------------------------------------------------------------------

def task_view(stack: Stack, qid: str, task: str) -> dict[str, Any]:
    return stack.tasks(qid).get(task, {})


def co_located(stack: Stack, qid: str, task: str) -> int:
    """How many other tasks of the query run on the agent of `task`."""
    views = stack.tasks(qid)
    agent = views[task]["agent_id"]
    return sum(1 for t, v in views.items() if t != task and v.get("agent_id") == agent
               and v.get("state") == "running")


def kill_executor_of(stack: Stack, agent: str) -> float:
    """SIGKILL the whole executor session on `agent`; returns the time of the kill."""
    executor = wait_until(lambda: stack.executor_pid(agent), 30, f"the executor on {agent}")
    killed_at = time.monotonic()
    victims = kill_session(executor)
    log.info("SIGKILLed the executor session %s on %s: %s", executor, agent, victims)
    # a process forked while the session was being killed (a Spark Python worker) survives the
    # first sweep: sweep again until the session is empty
    wait_until(lambda: not kill_session(executor), 30, f"the killed executor on {agent} to end",
               lambda: f"still alive: {session_members(executor)}")
    return killed_at


def kill_source_runner_on(stack: Stack, agent: str) -> float:
    executor = wait_until(lambda: stack.executor_pid(agent), 30, f"the executor on {agent}")
    jvm = wait_until(lambda: java_child(executor), 30, f"the Spark JVM on {agent}")
    runners = wait_until(lambda: source_runner_pids(jvm), 30, f"a source runner on {agent}")
    if len(runners) != 1:
        raise RuntimeError(f"expected one query on {agent}, found source runners {runners}")
    killed_at = time.monotonic()
    os.kill(runners[0], signal.SIGKILL)
    log.info("SIGKILLed source runner %s on %s", runners[0], agent)
    return killed_at


def wait_relaunched(stack: Stack, qid: str, task: str, after_attempt: int,
                    timeout: float) -> float | None:
    """Time the scheduler first reported an attempt > `after_attempt` running (polled)."""
    def relaunched() -> float | None:
        v = task_view(stack, qid, task)
        running = v.get("attempt", 0) > after_attempt and v.get("state") == "running"
        return time.monotonic() if running else None

    found: float | None = poll(relaunched, timeout, STATUS_POLL)
    return found


def wait_growth(watcher: SizeWatcher, after: float, than: int, timeout: float) -> float | None:
    """When the sink first grew past `than` after `after` (a monotonic time), or None."""
    found: float | None = poll(lambda: watcher.first_growth(after, than), timeout, POLL_SECONDS)
    return found


# --- section 1: failover gaps ----------------------------------------------------------------

@dataclass
class GapRun:
    pattern: str
    baseline: list[float] = field(default_factory=list)
    executor_gaps: list[float] = field(default_factory=list)
    inplace_gaps: list[float] = field(default_factory=list)
    relaunch_s: list[float] = field(default_factory=list)  # kill -> relaunch reported running
    shared: list[bool] = field(default_factory=list)  # per executor kill: agent ran other tasks
    notes: list[str] = field(default_factory=list)
    exact: bool = False
    seconds: float = 0.0


GAP_WINDOWS = Windows(size_ms=500, watermark_ms=200)
RECOVERY_BOUND = 90.0  # seconds a kill may leave the sink without growth before we give up


def gap_limit(plan: Plan) -> int:
    """Enough steady input for the baseline and every kill (generous: ~12 s per kill)."""
    seconds = 40 + plan.baseline_s + 12 * (plan.kills + plan.inplace_kills)
    return int(plan.gap_rate * seconds)


def protected_tasks(query: Any, pattern: str) -> list[str]:
    mode = "replica" if pattern == "hot-standby" else pattern
    return [t.task_id for t in query.tasks if t.failover == mode]


def run_gaps(stack: Stack, work: Path, pattern: str, plan: Plan) -> GapRun:
    began = time.monotonic()
    out = GapRun(pattern)
    name = f"gap-{pattern}"
    limit = gap_limit(plan)
    if pattern == "standby":
        text = filter_spec(name, pattern, plan.gap_rate, limit)
        expected_filter = filter_oracle(plan.gap_rate, limit)
        total = sum(expected_filter.values())
    else:
        text = window_spec(name, pattern, plan.gap_rate, limit, GAP_WINDOWS)
        expected_windows = windows_oracle(plan.gap_rate, limit, GAP_WINDOWS)
        total = len(expected_windows)
    folder = work / name
    query = compile_query(text, folder, name)
    sink = sink_file(folder, name)
    targets = protected_tasks(query, pattern)
    qid = query.query_id
    lines = LineCounter(sink)
    submit(stack, query)
    input_ends = time.monotonic() + limit / plan.gap_rate  # the paced generator's last row
    try:
        wait_running(stack, qid, timeout=180)
        with SizeWatcher(sink) as watcher:
            wait_until(lambda: sink.exists() and sink.stat().st_size > 0, 120, f"{name} output")
            t0 = time.monotonic()
            time.sleep(plan.baseline_s)
            out.baseline = watcher.write_intervals(t0, time.monotonic())

            def too_late(what: str) -> bool:
                if lines.count() >= total:
                    out.notes.append(f"the sink was complete before {what}; stopped killing")
                    return True
                return False

            for n in range(plan.inplace_kills):
                target = targets[n % len(targets)]
                if too_late(f"in-place kill {n + 1}"):
                    break
                v = task_view(stack, qid, target)
                restarts = (v.get("figures") or {}).get("restarts", 0)
                killed = kill_source_runner_on(stack, v["agent_id"])
                grown = wait_growth(watcher, killed, watcher.size_at(killed), 120)
                if grown is None:
                    out.notes.append(f"no sink growth within 120 s of in-place kill {n + 1}")
                    break
                out.inplace_gaps.append(grown - killed)
                log.info("%s: in-place kill %d: gap %.2f s", pattern, n + 1, grown - killed)
                try:
                    wait_until(lambda: (task_view(stack, qid, target).get("figures") or {})
                               .get("restarts", 0) > restarts, 60, "the in-place restart")
                except AssertionError:
                    out.notes.append(f"in-place kill {n + 1}: no restart in the heartbeats")
                time.sleep(plan.settle_s)

            for n in range(plan.kills):
                target = targets[n % len(targets)]
                if too_late(f"executor kill {n + 1}"):
                    break
                v = task_view(stack, qid, target)
                attempt, agent = v["attempt"], v["agent_id"]
                shared = co_located(stack, qid, target) > 0
                killed = kill_executor_of(stack, agent)
                size = watcher.size_at(killed)
                running = wait_relaunched(stack, qid, target, attempt, 120)
                if running is None:
                    out.notes.append(f"{target} not relaunched within 120 s of kill {n + 1}")
                    break
                after = killed if pattern == "hot-standby" else running
                grown = wait_growth(watcher, after, size, RECOVERY_BOUND)
                if grown is None:
                    out.notes.append(f"no sink growth within {RECOVERY_BOUND:.0f} s after "
                                     f"executor kill {n + 1} (shared agent: {shared})")
                    break
                out.executor_gaps.append(grown - killed)
                out.relaunch_s.append(running - killed)
                log.info("%s: executor kill %d: gap %.2f s, relaunch reported after %.2f s, "
                         "shared agent %s", pattern, n + 1, grown - killed, running - killed,
                         shared)
                out.shared.append(shared)
                time.sleep(plan.settle_s)
        try:
            wait_until(lambda: lines.count() >= total,
                       max(60.0, input_ends + 60.0 - time.monotonic()), f"{name} complete",
                       lambda: f"{lines.count()} of {total} rows")
            time.sleep(2.0)  # a late duplicate would show
        except AssertionError as exc:
            out.notes.append(str(exc).splitlines()[0])
        out.exact = (exact_filter(sink, expected_filter) if pattern == "standby"
                     else exact_windows(sink, expected_windows))
    finally:
        stop_query(stack, qid)
    out.seconds = time.monotonic() - began
    return out


def gaps_table(runs: Sequence[GapRun]) -> str:
    rows = []
    for r in runs:
        base = (f"{fmt(percentile(r.baseline, 50) * 1000)} / "
                f"{fmt(max(r.baseline, default=math.nan) * 1000)}")
        for kind, gaps in (("executor kill", r.executor_gaps), ("in-place", r.inplace_gaps)):
            goal = GOALS[r.pattern] if kind == "executor kill" else math.nan
            worst = max(gaps, default=math.nan)
            verdict = "" if math.isnan(goal) else ("met" if worst < goal else "MISSED")
            rows.append([r.pattern, kind, str(len(gaps)), fmt(median_of(gaps), 2),
                         fmt(worst, 2), base,
                         fmt(median_of(r.relaunch_s), 2) if kind == "executor kill" else "",
                         "" if math.isnan(goal) else f"< {goal:g} s {verdict}"])
    return format_table(["pattern", "kill", "n", "gap p50 s", "gap max s",
                         "baseline write p50/max ms", "relaunch p50 s", "goal (worst)"], rows)


def section_gaps(work: Path, plan: Plan) -> None:
    runs = []
    stack = start_stack(work / "stack-gaps", cpus_per_agent=2.5, agents=3)
    try:
        for pattern in ("standby", "checkpoint", "hot-standby"):
            log.info("gaps: %s", pattern)
            try:
                runs.append(run_gaps(stack, work, pattern, plan))
            except Exception as exc:  # report it and go on with the next pattern
                log.exception("gaps: %s failed", pattern)
                failed = GapRun(pattern)
                failed.notes.append(f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                runs.append(failed)
    finally:
        leftovers = stop_stack(stack)
        if leftovers:
            log.warning("gaps: SIGKILLed leftover executor processes %s", leftovers)
    print()
    print(f"Failover gaps: 3 agents, steady {plan.gap_rate} rows/s, {plan.inplace_kills} in-place "
          f"and {plan.kills} executor kills per pattern; gap = SIGKILL -> first sink growth "
          "after the replacement runs")
    print(gaps_table(runs))
    for r in runs:
        rel = ratio(median_of(r.executor_gaps), percentile(r.baseline, 50))
        print(f"{r.pattern}: results exact: {'yes' if r.exact else 'no'}; executor-kill gap p50 "
              f"/ baseline write p50 = {fmt(rel, 1)}; {r.seconds:.0f} s")
        print("  executor-kill gaps s: " + ", ".join(
            f"{g:.2f}{'*' if s else ''}" for g, s in zip(r.executor_gaps, r.shared))
            + "  (* = the killed executor also ran other tasks of the query)")
        print("  in-place gaps s: " + ", ".join(f"{g:.2f}" for g in r.inplace_gaps))
        for note in r.notes:
            print(f"  NOTE {r.pattern}: {note}")


# --- section 2: overhead ---------------------------------------------------------------------

OVERHEAD_WINDOWS = Windows(size_ms=100, watermark_ms=10)


@dataclass(frozen=True)
class Throughput:
    rows_per_s: float  # over `seconds`
    seconds: float  # every task reported running -> the measured result
    exact: bool
    complete: bool  # the sink reached the whole oracle result (not only `measure_lines`)
    offered_rows_per_s: float = math.nan  # from the source's first offered row instead
    layout: str = ""  # the query's tasks per agent, most first (`layout_of`)
    agents: tuple[AgentUse, ...] = ()  # with `watch_agents`: the query's agents over `seconds`
    steady_rows_per_s: float = math.nan  # rows between the sink's 10 % and 100 % (`steady_rate`)


STEADY_FROM = 0.1  # the steady-state rate leaves out the sink's first 10 % (start-up, first batch)


def steady_rate(rows: int, lines: int, at_from: float | None, at_end: float) -> float:
    """Rows per second while the sink went from STEADY_FROM of its `lines` to all of them
    (pure; `rows` the input rows behind `lines`): a run's rate once every task has started
    and taken its first micro-batch, which a short input at a low quota never reaches. NaN
    when the sink passed STEADY_FROM before it was watched."""
    if at_from is None or at_end <= at_from or lines <= 0:
        return math.nan
    return rows * (1.0 - STEADY_FROM) / (at_end - at_from)


@dataclass(frozen=True)
class AgentUse:
    """One agent's executor container over a measured run, from its `GET /monitor/statistics`
    before and after: cpu seconds per second against its limit, and the share of CFS periods
    in which it was throttled. `role`: what the query runs there (source, instance, sink)."""
    role: str
    limit: float
    cpus: float
    throttled: float

    def text(self) -> str:
        return (f"{self.role} {self.cpus:.2f}/{self.limit:g} cpu, "
                f"throttled {self.throttled * 100:.0f} %")


def agent_statistics(stack: Stack) -> dict[str, dict[str, float]]:
    """agent id -> its executor containers' `/monitor/statistics` figures, summed (the stack
    runs one framework, so one container per agent)."""
    out: dict[str, dict[str, float]] = {}
    for agent in stack.cluster.agents:
        with urllib.request.urlopen(f"{agent.url}/monitor/statistics", timeout=10) as answer:
            entries = json.load(answer)
        figures: dict[str, float] = defaultdict(float)
        for entry in entries:
            for key, value in entry["statistics"].items():
                if isinstance(value, (int, float)):
                    figures[key] += value
        out[agent.agent_id] = dict(figures)
    return out


def role_of(task: Mapping[str, Any]) -> str:
    """source (reads no channel), sink (serves none) or instance (both)."""
    if not task.get("reads_channels"):
        return "source"
    return "sink" if not task.get("serves_channels") else "instance"


def agent_uses(before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]],
               seconds: float, tasks: Mapping[str, Mapping[str, Any]]) -> tuple[AgentUse, ...]:
    """The query's agents over a run, sources first, sinks last."""
    roles = {t.get("agent_id"): role_of(t) for t in tasks.values()}
    uses = []
    for agent_id, role in roles.items():
        x0, x1 = before.get(str(agent_id), {}), after.get(str(agent_id), {})

        def grew(key: str) -> float:
            return x1.get(key, 0.0) - x0.get(key, 0.0)
        cpu = grew("cpus_user_time_secs") + grew("cpus_system_time_secs")
        uses.append(AgentUse(role, x1.get("cpus_limit", math.nan), cpu / seconds,
                             grew("cpus_nr_throttled") / max(grew("cpus_nr_periods"), 1.0)))
    order = {"source": 0, "instance": 1, "sink": 2}
    return tuple(sorted(uses, key=lambda u: order[u.role]))


def layout_of(tasks: Mapping[str, Mapping[str, Any]]) -> str:
    """How a query's tasks sat on the agents, as counts per agent, most first ("3+1")."""
    per_agent = Counter(t.get("agent_id") or "?" for t in tasks.values())
    return "+".join(str(n) for n in sorted(per_agent.values(), reverse=True))


def source_start(stack: Stack, query_id: str) -> float:
    """When the query's generator began offering rows (wall time): the earliest pacing anchor
    the runtime wrote under any of its tasks' checkpoints."""
    anchors = [json.loads(path.read_text(encoding="utf-8"))["anchor"]
               for path in stack.work.rglob(f"{query_id}.t*/checkpoint/pacing/*.anchor")]
    if not anchors:
        raise RuntimeError(f"{query_id}: no source pacing anchor under {stack.work}")
    return min(anchors)


def timed_run(stack: Stack, folder: Path, name: str, text: str, rows: int,
              expected_lines: int, check: Callable[[Path], bool], timeout: float,
              rules: Path | None = None, measure_lines: int | None = None,
              tail_timeout: float = 60.0, watch_agents: bool = False) -> Throughput:
    """Submit; time from every task running to the sink holding `measure_lines` lines
    (default: all `expected_lines`), and from the source's first offered row (`source_start`)
    to the same point; then wait at most `tail_timeout` more for the rest. `watch_agents`:
    the query's agents' usage over the same time (`agent_uses`)."""
    query = compile_query(text, folder, name, rules)
    sink = sink_file(folder, name)
    lines = LineCounter(sink)
    target = expected_lines if measure_lines is None else measure_lines
    submit(stack, query)
    try:
        wait_running(stack, query.query_id, timeout=180)
        before = agent_statistics(stack) if watch_agents else {}
        t0 = time.time()
        deadline = time.monotonic() + timeout
        steady_from = math.ceil(STEADY_FROM * target)
        watched = lines.count() < steady_from  # else it passed 10 % unseen: no steady rate
        at_from: float | None = None  # when the sink reached `steady_from` lines
        while lines.count() < target and time.monotonic() < deadline:
            if watched and at_from is None and lines.count() >= steady_from:
                at_from = time.time()
            time.sleep(0.05)
        t1 = time.time()
        steady = steady_rate(rows, target, at_from, t1)
        after = agent_statistics(stack) if watch_agents else {}
        measured = lines.count() >= target
        deadline = time.monotonic() + tail_timeout
        while measured and lines.count() < expected_lines and time.monotonic() < deadline:
            time.sleep(0.05)
        complete = lines.count() >= expected_lines
        offered = t1 - source_start(stack, query.query_id)
        tasks = stack.tasks(query.query_id)
        layout = layout_of(tasks)
        agents = agent_uses(before, after, t1 - t0, tasks) if watch_agents else ()
    finally:
        stop_query(stack, query.query_id)
    if not measured:
        log.warning("%s: %d of %d lines after %.0f s", name, lines.count(), target, timeout)
        return Throughput(math.nan, t1 - t0, False, False)
    exact = complete and check(sink)
    log.info("%s: %d rows in %.1f s = %.0f rows/s (%.1f s = %.0f rows/s from the first row "
             "offered), tasks per agent %s, complete %s, exact %s%s", name, rows, t1 - t0,
             rows / (t1 - t0), offered, rows / offered, layout, complete, exact,
             "".join(f"; {a.text()}" for a in agents))
    return Throughput(rows / (t1 - t0), t1 - t0, exact, complete, rows / offered, layout,
                      agents, steady)


def rotations(items: Sequence[str], repeats: int) -> list[list[str]]:
    """Repeat r runs the items rotated by r (plain first, then last, ...)."""
    return [[*items[r % len(items):], *items[:r % len(items)]] for r in range(repeats)]


def section_overhead(work: Path, plan: Plan) -> None:
    rate, wrate = plan.overhead_rate, plan.window_rate
    log.info("overhead: computing the oracles (%d + %d rows)", plan.filter_rows,
             plan.window_rows)
    fdig = big_filter_oracle(rate, plan.filter_rows)
    wexp = big_window_oracle(wrate, plan.window_rows, OVERHEAD_WINDOWS)

    # the window runs are timed to every window but the last closable one: hot-standby
    # replicas run without no-data micro-batches, so the windows that only the final watermark
    # of a finite input closes may never come (reported as "complete: no")
    last_end = max(k[1] for k in wexp)
    last_window = sum(1 for k in wexp if k[1] == last_end)

    def check_filter(path: Path) -> bool:
        return digest(tuple(r[c] for c in READING_KEY) for r in sink_rows(path)) == fdig

    def check_windows(path: Path) -> bool:
        return exact_windows(path, wexp)

    results: dict[str, list[Throughput]] = defaultdict(list)
    stack = start_stack(work / "stack-overhead", cpus_per_agent=2.5, agents=3)
    try:
        # one unmeasured warm-up, so every measured run finds warm executors
        timed_run(stack, work / "overhead", "warmup", filter_spec("warmup", None, rate, 100_000),
                  100_000, 1, lambda p: True, 120)
        for r, order in enumerate(rotations(["plain", "standby"], plan.repeats)):
            for variant in order:
                name = f"filter-{variant}-{r}"
                results[f"filter/{variant}"].append(timed_run(
                    stack, work / "overhead", name,
                    filter_spec(name, None if variant == "plain" else variant, rate,
                                plan.filter_rows),
                    plan.filter_rows, fdig.count, check_filter, 300))
        for r, order in enumerate(rotations(["plain", "checkpoint", "hot-standby"],
                                            plan.repeats)):
            for variant in order:
                name = f"window-{variant}-{r}"
                results[f"window/{variant}"].append(timed_run(
                    stack, work / "overhead", name,
                    window_spec(name, None if variant == "plain" else variant, wrate,
                                plan.window_rows, OVERHEAD_WINDOWS),
                    plan.window_rows, len(wexp), check_windows, 120,
                    measure_lines=len(wexp) - last_window))
    finally:
        stop_stack(stack)
    print()
    print(f"Overhead: rows/s from every task running to the oracle result, median of "
          f"{plan.repeats}; {plan.filter_rows:,} rows (filter) offered at {rate:,} rows/s, "
          f"{plan.window_rows:,} rows (windows of {OVERHEAD_WINDOWS.size_ms} ms) at {wrate:,}; "
          f"3 agents")
    print("(window runs timed to every oracle window but the last closable one; 'complete' ="
          " the last one came too; 'from first row': the ratio timed from the source's first"
          " offered row instead)")
    print(format_table(["query", "pattern", "plain rows/s", "pattern rows/s", "pattern/plain",
                        "from first row", "complete", "results exact"],
                       overhead_rows(results)))
    for key, runs in sorted(results.items()):
        print(f"  {key} (from running / from first row): " + ", ".join(
            f"{fmt(t.rows_per_s)} / {fmt(t.offered_rows_per_s)}"
            if not math.isnan(t.rows_per_s) else "timeout" for t in runs))
    for key, offered in (("filter", rate), ("window", wrate)):
        if any(t.offered_rows_per_s > 0.85 * offered for k, runs in results.items()
               if k.startswith(key) for t in runs):
            print(f"WARNING: a {key} run came within 15 % of the offered {offered:,} rows/s: "
                  "the source may have limited it")


def overhead_rows(results: Mapping[str, Sequence[Throughput]]) -> list[list[str]]:
    """One table row per pattern: medians of the plain and the pattern runs, and their ratio."""
    rows = []
    for query, plain_key, pattern in (("filter", "filter/plain", "standby"),
                                      ("window aggregate", "window/plain", "checkpoint"),
                                      ("window aggregate", "window/plain", "hot-standby")):
        plain_runs = results[plain_key]
        pat_runs = results[f"{plain_key.split('/')[0]}/{pattern}"]
        plain = median_of([t.rows_per_s for t in plain_runs])
        pat = median_of([t.rows_per_s for t in pat_runs])
        from_offer = ratio(median_of([t.offered_rows_per_s for t in pat_runs]),
                           median_of([t.offered_rows_per_s for t in plain_runs]))
        exact = all(t.exact for t in [*plain_runs, *pat_runs])
        complete = all(t.complete for t in pat_runs)
        rows.append([query, pattern, fmt(plain), fmt(pat), fmt(ratio(pat, plain), 2),
                     fmt(from_offer, 2), "yes" if complete else "no", "yes" if exact else "no"])
    return rows


# --- section 3: partitioning speed-up --------------------------------------------------------

def section_partition(work: Path, plan: Plan) -> None:
    """k=1 and k=2 on 2 unisolated agents; with `plan.agent_cpus`, k=1, 2 and 3 on k_max + 2
    isolated agents of that many cpus, one task per agent (so one instance per agent), each
    agent's use against its limit printed per run."""
    rate, rows, chains = plan.overhead_rate, plan.partition_rows, plan.heavy_chains
    rules = work / "rules"
    rules.mkdir(parents=True, exist_ok=True)
    (rules / "bench-partition-one.rule").write_text(PARTITION_ONE_RULE, encoding="utf-8")
    log.info("partition: computing the oracle (%d rows)", rows)
    expected = heavy_oracle(rate, rows, chains)

    def check(path: Path) -> bool:
        return exact_heavy(path, expected)

    isolated = plan.agent_cpus is not None
    ks = (1, 2, 3) if isolated else (1, 2)
    cpus = round(plan.agent_cpus - ExecutorSpec.cpus, 3) if plan.agent_cpus is not None else None
    results: dict[int, list[Throughput]] = defaultdict(list)
    if plan.agent_cpus is not None:
        stack = start_stack(work / "stack-partition", cpus_per_agent=plan.agent_cpus,
                            agents=max(ks) + 2, spark_cores=1, isolation="cgroups")
    else:
        stack = start_stack(work / "stack-partition", cpus_per_agent=4.0, agents=2, spark_cores=1)
    try:
        # the warm-up runs the largest k, so that every agent's executor (its JVM and
        # SparkSession) has started and run a query before any measured run: an executor that
        # starts inside a measured run spends its first seconds of quota on its own start-up
        warm = max(ks)
        timed_run(stack, work / "partition", "warmup",
                  partition_spec("warmup", warm, rate, 20_000, cpus, chains), 20_000, 1,
                  lambda p: True, 180)
        for r, order in enumerate(rotations([str(k) for k in ks], plan.repeats)):
            for k in map(int, order):
                name = f"heavy-k{k}-{r}"
                results[k].append(timed_run(stack, work / "partition", name,
                                            partition_spec(name, k, rate, rows, cpus, chains),
                                            rows, len(expected), check, 900,
                                            rules if k == 1 else None, watch_agents=isolated))
    finally:
        stop_stack(stack)
    print_partition(plan, ks, cpus, results)


def print_partition(plan: Plan, ks: Sequence[int], cpus: float | None,
                    results: Mapping[int, Sequence[Throughput]]) -> None:
    isolated = plan.agent_cpus is not None
    exact = all(t.exact for runs in results.values() for t in runs)
    agents = max(ks) + 2
    where = (f"{agents} isolated agents of {plan.agent_cpus:g} cpus, {agents * plan.agent_cpus:g} "
             f"of this machine's {os.cpu_count()} cores (cgroups; every operator asks {cpus:g}, "
             f"the executor {ExecutorSpec.cpus:g}: one task per agent)"
             if plan.agent_cpus is not None else "2 agents")
    print()
    print(f"Partitioning: project with {HEAVY_FIELDS} fields x {plan.heavy_chains} chains x "
          f"{HEAVY_DEPTH} nested sqrt/ln/exp/pow, {plan.partition_rows:,} rows offered at "
          f"{plan.overhead_rate:,} rows/s; k>=2: splitter -> k instances -> merger, k=1: "
          f"channel -> 1 instance -> channel; {where} x 1 Spark core, median of {plan.repeats}; "
          f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("(rows/s: every task running -> the whole result; steady: the sink's 10 % -> 100 %)")
    print(format_table(["plan", "rows/s", "steady rows/s", "runs rows/s / steady (tasks per agent)",
                        "results exact"], [
        [f"k={k}", fmt(median_of([t.rows_per_s for t in results[k]])),
         fmt(median_of([t.steady_rows_per_s for t in results[k]])),
         ", ".join(f"{fmt(t.rows_per_s)} / {fmt(t.steady_rows_per_s)} ({t.layout})"
                   for t in results[k]),
         "yes" if all(t.exact for t in results[k]) else "no"] for k in ks]))
    if isolated:
        print("each agent over each run (its /monitor/statistics: cpu used / limit, share of "
              "CFS periods throttled):")
        for k in ks:
            for n, t in enumerate(results[k]):
                print(f"  k={k} run {n + 1}: " + "; ".join(a.text() for a in t.agents))
    goals = ISOLATED_GOALS if isolated else {2: PARTITION_GOAL}
    for label, rate_of in (("", lambda t: t.rows_per_s),
                           (" steady", lambda t: t.steady_rows_per_s)):
        one = median_of([rate_of(t) for t in results[1]])
        for k, goal in goals.items():
            speedup = ratio(median_of([rate_of(t) for t in results[k]]), one)
            print(f"speed-up{label} k={k}/k=1: {fmt(speedup, 2)} (goal >= {goal}: "
                  f"{'met' if speedup >= goal else 'MISSED'})")
    print(f"results exact: {'yes' if exact else 'no'}")
    if plan.agent_cpus is not None:
        total, cores = agents * plan.agent_cpus, os.cpu_count() or 1
        print(f"agents' cpus {total:g} of {cores} cores: "
              f"{'fit' if total < cores else 'do NOT fit'} in its cores "
              f"(the goals' rule: agents of equal cpus whose sum fits the machine)")


# --- section 4: splitting and merging a running operator ------------------------------------

@dataclass(frozen=True)
class Change:
    """One split or merge of the running filter: seconds from the request to applied (a
    split: its instance started and the splitter switched), the splitter's pause, and for a
    merge the seconds from applied until the split instance retired (drained and stopped)."""
    to: int
    applied_s: float
    pause_s: float
    retired_s: float | None


def change_filter(stack: Stack, qid: str, to: int, timeout: float = 300) -> Change:
    """`elastiq scale --split` (to=1) or `--merge` (to=0) through the API; waits until the
    slot settled (a merge: the split instance retired)."""
    client = stack.client()
    request = client.scale(qid, "warm", to)["request"]
    view = wait_until(lambda: (v := client.control_status(qid, request))["state"] != "pending"
                      and v, timeout, f"the change to {to} applied", step=0.05)
    if view["state"] != "applied":
        raise RuntimeError(f"the change to {to} was {view['state']}: {view.get('reason')}")

    def settled() -> dict[str, Any] | None:
        (e,) = stack.status(qid)["elastic"]
        last = e["rescales"][-1]
        slot = e["slots"][0]["state"]
        done = slot == "running" if to else (slot == "dormant" and last["retired_at"])
        return last if done and last["request"] == request else None

    last = wait_until(settled, timeout, f"the filter settled at {to}", step=0.1)
    retired = last["retired_at"] - last["applied_at"] if last["retired_at"] else None
    return Change(to, last["applied_at"] - last["asked_at"], last["pause_s"] or 0.0, retired)


def fold_cycles(stack: Stack, work: Path, plan: Plan) -> tuple[list[Change], bool]:
    """A paced folded filter split and merged `plan.repeats` times, `plan.settle_s` of steady
    output between changes; then the rest of the input at full speed and the sink against the
    oracle."""
    rate = 4 * plan.gap_rate
    limit = int(rate * (60 + 60 * plan.repeats))
    name = "fold-cycles"
    query = compile_query(filter_spec(name, "folded", rate, limit), work / "fold", name)
    sink = sink_file(work / "fold", name)
    changes: list[Change] = []
    submit(stack, query)
    try:
        wait_running(stack, name, timeout=180)
        wait_until(lambda: LineCounter(sink).count() > 0, 120, "first output, folded")
        for _ in range(plan.repeats):
            for to in (1, 0):
                changes.append(change_filter(stack, name, to))
                log.info("fold: %s", changes[-1])
                time.sleep(plan.settle_s)
        hurry(stack, name, rate=str(plan.overhead_rate))
        expected = filter_oracle(rate, limit)
        exact = wait_until(lambda: exact_filter(sink, expected), 300,
                           "the split and merged filter's sink to equal the oracle", step=2.0)
    finally:
        stop_query(stack, name)
    return changes, bool(exact)


def section_fold(work: Path, plan: Plan) -> None:
    rate = plan.overhead_rate
    log.info("fold: computing the oracle (%d rows)", plan.filter_rows)
    fdig = big_filter_oracle(rate, plan.filter_rows)

    def check(path: Path) -> bool:
        return digest(tuple(r[c] for c in READING_KEY) for r in sink_rows(path)) == fdig

    results: dict[str, list[Throughput]] = defaultdict(list)
    stack = start_stack(work / "stack-fold", cpus_per_agent=2.5, agents=3)
    try:
        timed_run(stack, work / "fold", "warmup", filter_spec("warmup", None, rate, 100_000),
                  100_000, 1, lambda p: True, 120)
        for r, order in enumerate(rotations(["plain", "folded", "split"], plan.repeats)):
            for variant in order:
                name = f"fold-{variant}-{r}"
                results[variant].append(timed_run(
                    stack, work / "fold", name,
                    filter_spec(name, None if variant == "plain" else variant, rate,
                                plan.filter_rows),
                    plan.filter_rows, fdig.count, check, 300))
        changes, exact = fold_cycles(stack, work, plan)
    finally:
        stop_stack(stack)
    plain = median_of([t.rows_per_s for t in results["plain"]])
    print()
    print(f"Folding: the filter of the overhead section in one task (plain), folded into the "
          f"sink's task (min-parallelism=0 at 0) and split onto an agent of its own (at 1); "
          f"{plan.filter_rows:,} rows offered at {rate:,} rows/s, 3 agents, median of "
          f"{plan.repeats}")
    print(format_table(["plan", "rows/s", "/plain", "runs rows/s", "results exact"], [
        [v, fmt(median_of([t.rows_per_s for t in results[v]])),
         fmt(ratio(median_of([t.rows_per_s for t in results[v]]), plain), 2),
         ", ".join(fmt(t.rows_per_s) for t in results[v]),
         "yes" if all(t.exact for t in results[v]) else "no"]
        for v in ("plain", "folded", "split")]))
    splits = [c for c in changes if c.to == 1]
    merges = [c for c in changes if c.to == 0]
    print(f"Split and merged {plan.repeats} times while running at {4 * plan.gap_rate:,} "
          f"rows/s (seconds, median / max):")
    print(format_table(["change", "request -> applied", "splitter pause", "applied -> retired"], [
        ["split (--split)", _med_max([c.applied_s for c in splits]),
         _med_max([c.pause_s for c in splits]), "-"],
        ["merge (--merge)", _med_max([c.applied_s for c in merges]),
         _med_max([c.pause_s for c in merges]),
         _med_max([c.retired_s or math.nan for c in merges])]]))
    pause = max((c.pause_s for c in changes), default=math.nan)
    print(f"largest splitter pause {pause:.3f} s (goal < 2 s: "
          f"{'met' if pause < 2.0 else 'MISSED'}); results exact: {'yes' if exact else 'no'}")


def _med_max(values: Sequence[float]) -> str:
    return f"{median_of(values):.3f} / {max(values):.3f}" if values else "-"


# --- main ------------------------------------------------------------------------------------

SECTIONS: dict[str, Callable[[Path, Plan], None]] = {
    "gaps": section_gaps, "overhead": section_overhead, "partition": section_partition,
    "fold": section_fold}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append",
                        help="run only this section (repeatable); default: all four")
    parser.add_argument("--quick", action="store_true",
                        help="2 executor kills, 1 in-place kill, 1 repeat, smaller inputs")
    parser.add_argument("--kills", type=int, default=None, help="executor kills per pattern")
    parser.add_argument("--repeats", type=int, default=None, help="repeats of overhead/partition")
    parser.add_argument("--agent-cpus", type=float, default=None,
                        help="partition on isolated agents of this many cpus, k = 1, 2, 3")
    parser.add_argument("--rows", type=int, default=None, help="rows of each partition run")
    parser.add_argument("--chains", type=int, default=None,
                        help=f"heavy chains per field of the partition project (default "
                             f"{HEAVY_CHAINS})")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    plan = QUICK if args.quick else FULL
    if args.kills is not None:
        plan = Plan(**{**plan.__dict__, "kills": args.kills})
    if args.repeats is not None:
        plan = Plan(**{**plan.__dict__, "repeats": args.repeats})
    if args.agent_cpus is not None:
        if not args.agent_cpus > ExecutorSpec.cpus:
            parser.error(f"--agent-cpus must be above the executor's own {ExecutorSpec.cpus:g}")
        plan = Plan(**{**plan.__dict__, "agent_cpus": args.agent_cpus})
    if args.rows is not None:
        plan = Plan(**{**plan.__dict__, "partition_rows": args.rows})
    if args.chains is not None:
        if not 1 <= args.chains <= 12:
            parser.error("--chains must be 1..12 (a field's text stays under 4096 characters)")
        plan = Plan(**{**plan.__dict__, "heavy_chains": args.chains})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("executor", "scheduler", "elastiq", "pymesos", "tests.e2e"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    began = time.monotonic()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="elastiq-bench-patterns-") as tmp:
        for name in args.only or ["gaps", "overhead", "partition", "fold"]:
            t = time.monotonic()
            SECTIONS[name](Path(tmp), plan)
            print(f"section {name}: {time.monotonic() - t:.0f} s; load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(f"wall time: {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
