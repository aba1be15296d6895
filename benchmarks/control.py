"""Control tuples on the embedded cluster: how long a change takes to be acknowledged and to show.

Owns this benchmark only (not a test; nothing in tests/ imports it). It runs one query it writes
itself, `nums := generator(sequence, paced) -> keep := filter(condition) -> out := network-sink`,
on the stack of testkit/e2e_support.py (embedded master, 1 agent of 2.5 cpus, the framework
scheduler and its HTTP API, one real executor and SparkSession, 127.0.0.1 only), reads the sink's
channel here with the ZeroMQ `FollowingReader` of tests/test_control_cluster.py (each batch's
arrival time is recorded) and sends control tuples through `common.api_client.SchedulerClient`
(what `elastiq control` calls). Per kind of change it measures:
- `ack`: from the `control()` call until `control_status()` shows the request applied (polled
  every 10 ms), and the executor's own `pause_s` (filter, rate: batch gate closed -> query
  stopped -> rebuilt from its checkpoint with the new parameters -> started; endpoint, switched
  in the running query: until no sink call was in progress and the last written batch was
  committed, then the writer reopened at the new port);
- `1st batch`: from the call until the first batch tagged >= the acknowledged epoch reaches the
  reader; `1st new row` (filter changes): until the first row that satisfies the new condition
  but not the old one (`nums.id % 2 = 0` <-> `nums.id % 3 = 0`, alternating);
- the baseline: the query's micro-batch during 15 s of steady output before any change (6 s with
  --quick), as the interval between consecutive batches at the reader and as Spark's
  `triggerExecution` of the task (sampled from the executor heartbeats' figures), so that
  `ack / micro-batch` and the goal "acknowledged within one micro-batch + 50 ms" can be printed;
- for the rebuilt kinds, how long the rebuilt query's first micro-batch took to commit, from
  the file times of the task's Spark commit log (read only), and whether it re-ran the batch
  before the epoch.
Kinds: filter `condition` (N changes, --changes, after one unmeasured warm-up change), generator
`rate` (200 <-> 400 rows/s) and network-sink `endpoint` (a fresh port each time; the reader
follows once the move is acknowledged). At the end it checks that every row the reader got
satisfies the condition in force at its batch and that no batch was lost or came twice.

    python benchmarks/control.py [--changes N] [--quick]
"""

from __future__ import annotations

import argparse
import bisect
import logging
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_util import (exit_on_sigterm, fmt, format_table, median_of, percentile, ratio,
                        use_repo_on_path)

use_repo_on_path()

from common.api_client import SchedulerClient  # noqa: E402
from compiler.pipeline import compile_spec_text  # noqa: E402
from testkit.e2e_support import (Stack, start_stack, stop_query, stop_stack, submit,  # noqa: E402
                                 wait_running, wait_until)
from testkit.control_reader import SPEC, FollowingReader, free_port  # noqa: E402

log = logging.getLogger("bench.control")

QUERY = "bench-control"
REBUILT = ("filter condition", "generator rate")  # the kinds applied by rebuilding the query
KINDS = (*REBUILT, "sink endpoint")  # the endpoint is switched in the running query
RATES = ("200", "400")  # rows/s, the generator starts at the first
CONDITIONS = ("nums.id % 2 = 0", "nums.id % 3 = 0")  # the filter starts with the first
KEEPS: dict[str, Callable[[int], bool]] = {CONDITIONS[0]: lambda i: i % 2 == 0,
                                           CONDITIONS[1]: lambda i: i % 3 == 0}
STATUS_POLL = 0.010  # control_status() while a request is pending
SETTLE_BATCHES = 3  # batches of the new query to see before the next change
GOAL_SLACK = 0.050  # "within one micro-batch + 50 ms"



@dataclass(frozen=True)
class Plan:
    filters: int
    rates: int
    endpoints: int
    steady: float  # s of steady output measured as the baseline, before any change


FULL = Plan(filters=20, rates=6, endpoints=12, steady=15.0)
QUICK = Plan(filters=6, rates=2, endpoints=2, steady=6.0)


# --- the reader, with arrival times ---------------------------------------------------------------

class _Stamped(list):
    """The reader's list of batches; remembers when each was appended (the reader appends right
    after the batch is decoded, under its lock)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: Any) -> None:
        self.times.append(time.monotonic())
        super().append(item)


class TimedReader(FollowingReader):
    """tests/test_control_cluster.py's reader (acks each batch, follows a moved writer), plus
    the monotonic arrival time of every batch."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.batches = _Stamped()

    def arrivals(self) -> list[tuple[float, int, str, list[int]]]:
        """(arrival, tag, endpoint, ids) per batch, in arrival order."""
        with self._lock:
            return [(t, tag, ep, ids) for t, (_, tag, ep, ids)
                    in zip(self.batches.times, self.batches)]

    def seqs(self) -> list[int]:
        with self._lock:
            return [seq for seq, *_ in self.batches]

    def alive(self) -> bool:
        return self.thread.is_alive()


# --- the baseline from Spark's progress -----------------------------------------------------------

class FigureSampler:
    """Polls the scheduler's view of the task every 0.25 s and keeps `batch_ms` (the last
    micro-batch's triggerExecution, reported with each executor heartbeat, ~1/s) whenever the
    task's input count moved (a new heartbeat with new data)."""

    def __init__(self, stack: Stack, task_id: str) -> None:
        self.stack, self.task_id = stack, task_id
        self.batch_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="figures", daemon=True)

    def __enter__(self) -> FigureSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        last = None
        while not self._stop.wait(0.25):
            figures = self.stack.tasks(QUERY).get(self.task_id, {}).get("figures") or {}
            key = (figures.get("tuples_in"), figures.get("batch_ms"))
            if figures.get("batch_ms") and key != last:
                self.batch_ms.append(float(figures["batch_ms"]))
            last = key


# --- one change -----------------------------------------------------------------------------------

@dataclass
class Change:
    kind: str
    value: str
    ack: float = math.nan  # s, call -> applied visible at the scheduler
    pause: float = math.nan  # s, the executor's pause_s
    to_executor_done: float = math.nan  # s, call -> the executor finished (its wall clock)
    epoch: int = -1
    first_batch: float = math.nan  # s, call -> first batch tagged >= epoch at the reader
    first_distinct: float = math.nan  # s, call -> first row only the new condition keeps
    rebuilt_first: float = math.nan  # s, rebuilt query started -> its first batch committed
    replayed: bool = False  # that first batch was epoch - 1 again (written, not committed)
    refused: str = ""


@dataclass
class Run:
    changes: list[Change] = field(default_factory=list)
    warmup: Change | None = None
    cadence: list[float] = field(default_factory=list)  # s between consecutive batches
    spark_batch_ms: list[float] = field(default_factory=list)
    rows_consistent: bool = False
    batches_contiguous: bool = False


def send(client: SchedulerClient, reader: TimedReader, spark_dir: Path, task_id: str,
         kind: str, op: str, param: str, value: str, old_keep: Callable[[int], bool] | None = None,
         new_keep: Callable[[int], bool] | None = None, follow: bool = False) -> Change:
    """One control tuple; waits for its acknowledgement and for SETTLE_BATCHES batches of the
    rebuilt query at the reader. `spark_dir`: the task's Spark checkpoint, read (only) to time
    the rebuilt query's first micro-batch."""
    change = Change(kind, value)
    began_wall, began = time.time(), time.monotonic()
    request = client.control(QUERY, [(op, param, value)])["request"]
    view = wait_until(lambda: (v := client.control_status(QUERY, request))["state"] != "pending"
                      and v, 60, f"the acknowledgement of {op}.{param}={value}",
                      step=STATUS_POLL)
    change.ack = time.monotonic() - began
    answer = view["tasks"].get(task_id) or {}
    if view["state"] != "applied":
        change.refused = f"{view['state']}: {view.get('reason', '')}"
        log.warning("%s %s: %s", kind, value, change.refused)
        return change
    if follow:
        reader.follow(value)
    change.epoch, change.pause = int(answer["epoch"]), float(answer["pause_s"])
    change.to_executor_done = float(answer["at"]) - began_wall

    def settled() -> bool:
        newer = [(at, ids) for at, tag, _, ids in reader.arrivals() if tag >= change.epoch]
        if newer and math.isnan(change.first_batch):
            change.first_batch = newer[0][0] - began
        if new_keep is not None and old_keep is not None and math.isnan(change.first_distinct):
            change.first_distinct = next((at - began for at, ids in newer
                                          if any(new_keep(i) and not old_keep(i) for i in ids)),
                                         math.nan)
        return (len(newer) >= SETTLE_BATCHES and not math.isnan(change.first_batch)
                and (new_keep is None or not math.isnan(change.first_distinct))) \
            or not reader.alive()

    wait_until(settled, 60, f"{SETTLE_BATCHES} batches from micro-batch {change.epoch} on",
               step=0.02)
    if not reader.alive():
        raise RuntimeError("the reader thread stopped (its 400 s deadline?)")
    first_commit(spark_dir, float(answer["at"]), change)
    log.info("%s -> %s: ack %.3f s (pause %.3f s, executor done %.3f s), epoch %s, "
             "first batch %.3f s, first distinct row %.3f s; the rebuilt query's first batch "
             "committed %.3f s after it started%s", kind, value, change.ack, change.pause,
             change.to_executor_done, change.epoch, change.first_batch, change.first_distinct,
             change.rebuilt_first, " (a replay of the last written batch)"
             if change.replayed else "")
    return change


def first_commit(spark_dir: Path, started_wall: float, change: Change) -> None:
    """The first micro-batch Spark committed after the rebuilt query started (the executor's
    wall clock when the query was rebuilt, about when it started): how long after, and whether
    it was the batch before the epoch again (the sink had written it, but the old query was
    stopped before Spark logged its commit; its re-run is dropped by the channel writer)."""
    commits = []
    for entry in (spark_dir / "commits").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            when = entry.stat().st_mtime
        except FileNotFoundError:  # an old one Spark cleaned up meanwhile
            continue
        if when >= started_wall:
            commits.append((when, int(entry.name)))
    if commits:
        when, batch = min(commits)
        change.rebuilt_first, change.replayed = when - started_wall, batch < change.epoch


# --- the run --------------------------------------------------------------------------------------

def run(stack: Stack, work: Path, plan: Plan) -> Run:
    first = f"tcp://127.0.0.1:{free_port()}"
    text = SPEC.format(name=QUERY, rate=RATES[0], condition=CONDITIONS[0],
                       endpoint=first)
    query = compile_spec_text(text.encode(), str(work / "bench-control.xml"), base_dir=work,
                              query_id=QUERY).query
    task_id = query.tasks[0].task_id
    spark_dir = stack.work / "state" / task_id / "checkpoint" / "spark"
    client = stack.client()
    result = Run()
    submit(stack, query)
    reader = TimedReader(first)
    try:
        wait_running(stack, QUERY, timeout=180)
        reader.start()
        wait_until(lambda: len(reader.arrivals()) >= 10, 120, "steady output")
        time.sleep(2.0)
        with FigureSampler(stack, task_id) as figures:  # the baseline: no change meanwhile
            since = time.monotonic()
            time.sleep(plan.steady)
            until = time.monotonic()
        result.spark_batch_ms = figures.batch_ms
        steady = [(at, tag) for at, tag, _, _ in reader.arrivals() if since <= at <= until]
        result.cadence = [b[0] - a[0] for a, b in zip(steady, steady[1:]) if b[1] == a[1] + 1]
        condition = 0  # index into CONDITIONS in force
        epochs: list[tuple[int, str]] = [(0, CONDITIONS[0])]

        def flip() -> Change:
            nonlocal condition
            old, new = CONDITIONS[condition], CONDITIONS[1 - condition]
            c = send(client, reader, spark_dir, task_id, "filter condition", "keep",
                     "condition", new, KEEPS[old], KEEPS[new])
            if not c.refused:
                condition = 1 - condition
                epochs.append((c.epoch, new))
            return c

        result.warmup = flip()
        for _ in range(plan.filters):
            result.changes.append(flip())
        for n in range(plan.rates):
            result.changes.append(send(client, reader, spark_dir, task_id, "generator rate",
                                       "src", "rate", RATES[(n + 1) % 2]))
        for _ in range(plan.endpoints):
            result.changes.append(send(client, reader, spark_dir, task_id, "sink endpoint",
                                       "out", "endpoint", f"tcp://127.0.0.1:{free_port()}",
                                       follow=True))
        time.sleep(1.0)
    finally:
        if reader.thread.ident is not None:
            reader.close()
        stop_query(stack, QUERY)
    arrivals = reader.arrivals()
    result.rows_consistent = all(
        KEEPS[condition_at(epochs, tag)](i) for _, tag, _, ids in arrivals for i in ids)
    seqs, tags = reader.seqs(), [tag for _, tag, _, _ in arrivals]
    result.batches_contiguous = seqs == list(range(seqs[0], seqs[0] + len(seqs))) and \
        tags == list(range(tags[0], tags[0] + len(tags)))
    log.info("reader: %s batches, tags %s..%s, %s rows", len(arrivals), tags[0], tags[-1],
             sum(len(ids) for *_, ids in arrivals))
    return result


def condition_at(epochs: Sequence[tuple[int, str]], tag: int) -> str:
    """The condition in force at micro-batch `tag` (epochs ascending)."""
    starts = [e for e, _ in epochs]
    return epochs[bisect.bisect_right(starts, tag) - 1][1]


# --- printing -------------------------------------------------------------------------------------

def ms(values: Sequence[float], q: float) -> str:
    return fmt(percentile([v for v in values if not math.isnan(v)], q) * 1000)


def table(result: Run) -> str:
    rows = []
    for kind in KINDS:
        done = [c for c in result.changes if c.kind == kind and not c.refused]
        refused = sum(1 for c in result.changes if c.kind == kind and c.refused)
        acks, pauses = [c.ack for c in done], [c.pause for c in done]
        batches, distinct = [c.first_batch for c in done], [c.first_distinct for c in done]
        rows.append([kind, f"{len(done)}" + (f" (+{refused} refused)" if refused else ""),
                     ms(acks, 50), ms(acks, 99), ms(acks, 0), ms(acks, 100),
                     ms(pauses, 50), ms(pauses, 99), ms(batches, 50), ms(batches, 99),
                     ms(distinct, 50) if kind == "filter condition" else "",
                     ms(distinct, 99) if kind == "filter condition" else ""])
    return format_table(["change", "n", "ack p50 ms", "p99", "min", "max", "pause p50 ms", "p99",
                         "1st batch p50 ms", "p99", "1st new row p50 ms", "p99"], rows)


def report(result: Run, plan: Plan, wall: float) -> str:
    filters = [c for c in result.changes if c.kind == "filter condition" and not c.refused]
    acks = [c.ack for c in filters]
    every = [c for c in result.changes if not c.refused]
    cadence_p50 = percentile(result.cadence, 50)
    spark_p50 = percentile(result.spark_batch_ms, 50) / 1000
    lines = [f"Control tuples: 1 agent, generator(sequence, {RATES[0]} rows/s) -> filter -> "
             f"network sink read here; {plan.filters} filter changes ({CONDITIONS[0]!r} <-> "
             f"{CONDITIONS[1]!r}, after 1 warm-up), {plan.rates} rate changes "
             f"({' <-> '.join(RATES)} rows/s), {plan.endpoints} endpoint moves",
             "(ack = control() call -> state applied at the scheduler, polled every 10 ms; "
             "1st batch = call -> first batch tagged >= the epoch at the reader; 1st new row = "
             "call -> first row the new condition keeps and the old one drops)",
             table(result)]
    if result.warmup is not None:
        w = result.warmup
        lines.append(f"warm-up filter change (not in the table): ack {fmt(w.ack * 1000)} ms, "
                     f"pause {fmt(w.pause * 1000)} ms, 1st new row {fmt(w.first_distinct * 1000)} "
                     f"ms{' REFUSED ' + w.refused if w.refused else ''}")
    to_task = [c.to_executor_done - c.pause for c in every]
    back = [c.ack - c.to_executor_done for c in every]
    lines.append(f"ack, all kinds, p50: {ms([c.ack for c in every], 50)} ms = to the executor "
                 f"{ms(to_task, 50)} + pause {ms([c.pause for c in every], 50)} + ack back to the "
                 f"scheduler and seen {ms(back, 50)} ms (p50 of each part; executor wall clock)")
    rebuilt = [c for c in every if c.kind in REBUILT]
    replays = [c for c in rebuilt if c.replayed]
    lines.append(f"the rebuilt query's first micro-batch committed p50 "
                 f"{ms([c.rebuilt_first for c in rebuilt], 50)} / max "
                 f"{ms([c.rebuilt_first for c in rebuilt], 100)} ms after it started (filter and "
                 f"rate changes, from the task's Spark commit log); it re-ran the batch before "
                 f"the epoch (written by the old query, not yet committed; dropped by the channel "
                 f"writer) in {len(replays)} of {len(rebuilt)} changes")
    lines.append(f"micro-batch (baseline): between batches at the reader p50 "
                 f"{fmt(cadence_p50 * 1000)} / p99 {ms(result.cadence, 99)} ms "
                 f"({len(result.cadence)} intervals); Spark "
                 f"triggerExecution p50 {fmt(spark_p50 * 1000)} / p99 "
                 f"{fmt(percentile(result.spark_batch_ms, 99))} ms "
                 f"({len(result.spark_batch_ms)} heartbeat samples)")
    ack_p50 = median_of(acks)
    lines.append(f"filter ack p50 / micro-batch p50: {fmt(ratio(ack_p50, cadence_p50), 1)}; "
                 f"filter 1st new row p50 / micro-batch p50: "
                 f"{fmt(ratio(median_of([c.first_distinct for c in filters]), cadence_p50), 1)}")
    goal = cadence_p50 + GOAL_SLACK

    def verdict(x: float) -> str:
        return "met" if x <= goal else "MISSED"

    lines.append(f"goal: acknowledged within one micro-batch (p50 at the reader) + 50 ms = "
                 f"{fmt(goal * 1000)} ms:")
    for kind in KINDS:
        kind_acks = [c.ack for c in every if c.kind == kind]
        if kind_acks:
            p50, p99 = median_of(kind_acks), percentile(kind_acks, 99)
            lines.append(f"  {kind}: p50 {verdict(p50)} ({fmt(p50 * 1000)} ms), p99 "
                         f"{verdict(p99)} ({fmt(p99 * 1000)} ms); "
                         f"{sum(a <= goal for a in kind_acks)} of {len(kind_acks)} within it")
    lines.append(f"the filter's output follows later: 1st new row p50 "
                 f"{ms([c.first_distinct for c in filters], 50)} ms")
    lines.append(f"rows match the condition in force at their batch: "
                 f"{'yes' if result.rows_consistent else 'NO'}; batches contiguous (none lost, "
                 f"none twice): {'yes' if result.batches_contiguous else 'NO'}; wall time "
                 f"{wall:.0f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=None,
                        help=f"filter changes measured (default {FULL.filters}, "
                             f"--quick {QUICK.filters})")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.filters} filter, {QUICK.rates} rate and {QUICK.endpoints} "
                             "endpoint changes: a smoke check")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    plan = QUICK if args.quick else FULL
    if args.changes is not None and args.changes < 1:
        parser.error("--changes must be at least 1")
    if args.changes is not None:
        plan = Plan(args.changes, plan.rates, plan.endpoints, plan.steady)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    for noisy in ("executor", "scheduler", "elastiq", "pymesos", "tests.e2e"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    began = time.monotonic()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="elastiq-bench-control-") as tmp:
        stack = start_stack(Path(tmp) / "stack", cpus_per_agent=2.5, agents=1)
        try:
            result = run(stack, Path(tmp), plan)
        finally:
            leftovers = stop_stack(stack)
            if leftovers:
                log.warning("SIGKILLed leftover executor processes %s", leftovers)
    print(report(result, plan, time.monotonic() - began))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if result.rows_consistent and result.batches_contiguous and \
        not any(c.refused for c in result.changes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
