"""Elastiq vs the same query written by hand in PySpark: throughput, window latency, batch times.

Owns this benchmark only (not a test, nothing here is imported by the project). The query is
hot-sensors' shape: readings with temp > 30, tumbling 10 s event-time windows per sensor with a
2 s watermark, avg/max/count, results appended to a JSON-lines file. Both sides read THE SAME
tuples: the project's deterministic generator data source (`elastiq_generator`, shape "sensor",
one seed), in ONE SparkSession from `executor.spark_session.build_session`, one side after the
other (order alternates per repeat).

- Elastiq: a spec compiled by `compiler.pipeline.compile_spec_text`; its single task's generated
  program run by `executor.task_runner.TaskRunner` (TaskRuntime, FileSink) exactly as the
  executor runs it (same kwargs: query_id, task_id, checkpoint_dir; runtime defaults).
- Hand-written: one plain Structured Streaming job (filter, withWatermark, groupBy(window), agg,
  foreachBatch appending JSON lines), the code a competent engineer writes without Elastiq.

Measured, medians over repeats (>= 3; --quick: 1 short repeat):
- throughput: a generator rate above what 2 cores process, a finite `limit`; rows of every
  data micro-batch after the first (warm-up) over their wall span (StreamingQueryProgress).
- latency at 2,000 rows/s: per window result, the wall time its line appeared in the sink file
  (a 5 ms poller) minus the wall time the generator released the first tuple with event time
  >= window_end + watermark (release = pacing anchor + (index + 1) / rate, the anchor read from
  the file the source persists); p50 and p99 pooled over repeats (a run closes only 4 windows).
- micro-batch durations (triggerExecution) p50/p99, first data batch excluded.
- honesty: the window rows of both sinks must be identical (avg to 1e-9 relative), and in the
  latency runs also equal to a plain-Python oracle over `executor.shapes.reference_row`.

    python benchmarks/spark_vs_handwritten.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from bench_util import (
    fmt,
    format_table,
    median_of,
    percentile,
    ratio,
    start_task,
    use_repo_on_path,
)

use_repo_on_path()

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from executor import shapes
from executor.sources import (
    CONFIG_OPTION,
    LARGE_BATCH_BYTES,
    GeneratorConfig,
    GeneratorSource,
    encode_config,
    read_or_create_anchor,
)
from executor.spark_session import build_session
from executor.task_runner import TaskRunner
from testkit.waiting import poll

log = logging.getLogger("bench.spark_vs_handwritten")

# --- the query, fixed ---------------------------------------------------------------------------

SHAPE = "sensor"
SEED = 42
START = "2024-01-01T00:00:00Z"
START_US = shapes.parse_start(START)
TEMP_THRESHOLD = 30
WINDOW_US = 10_000_000
WATERMARK_US = 2_000_000
SENSOR_COLUMNS = (("sensor", "string"), ("ts", "timestamp"), ("temp", "double"),
                  ("humidity", "double"))
SOURCE_PARTITIONS = 2  # TaskRuntime's default, which the executor uses
POLL_SECONDS = 0.005  # sink-file poller
SOURCE_LIMIT_SHARE = 0.85  # throughput above this share of the offered rate may be source-bound
PROGRESS_RETENTION = 2000  # StreamingQuery.recentProgress entries kept (bookkeeping only)


@dataclass(frozen=True)
class Workload:
    """One generator setting: `rate` tuples/s (pacing AND event-time spacing), `limit` tuples."""

    name: str
    rate: float
    limit: int

    @property
    def last_event_us(self) -> int:
        return shapes.event_time_us(START_US, self.rate, self.limit - 1)


@dataclass(frozen=True)
class Plan:
    repeats: int
    throughput: Workload
    latency: Workload
    volume: Workload  # once per side: both sinks compared at scale
    warmup: Workload


# throughput: 1M/s offered (the most a spec's generator may be given; 2 cores process ~1M/s at
#   1M-row batches): the backlog may empty, main() warns when a side came near the offered rate
#   (its figure is then source-bound, a floor).
# latency: 44 s of event time at 2,000/s closes 4 windows (40 result rows per run).
# volume: 12.5 s of event time at 1M/s closes the first window (10 rows of ~1.7M readings).
FULL = Plan(3, Workload("max rate", 1_000_000.0, 36_000_000),
            Workload("2000 rows/s", 2000.0, 88_000),
            Workload("volume", 1_000_000.0, 12_500_000), Workload("warm-up", 200_000.0, 600_000))
QUICK = Plan(1, Workload("max rate", 1_000_000.0, 24_000_000),
             Workload("2000 rows/s", 2000.0, 48_000),
             Workload("volume", 1_000_000.0, 12_500_000), Workload("warm-up", 200_000.0, 600_000))


@dataclass(frozen=True)
class ResultRow:
    """One window result, canonical: instants as epoch microseconds."""

    window_start_us: int
    window_end_us: int
    sensor: str
    avg_temp: float
    max_temp: float
    readings: int

    @property
    def key(self) -> tuple[int, str]:
        return (self.window_start_us, self.sensor)


@dataclass(frozen=True)
class SeenRow:
    wall: float  # time.time() when the poller first saw the line in the sink file
    row: ResultRow


@dataclass(frozen=True)
class RunOutcome:
    side: str  # "elastiq" | "handwritten"
    workload: Workload
    rows: tuple[SeenRow, ...]
    progress: tuple[Mapping[str, Any], ...]
    anchor: float  # the generator's pacing anchor (wall seconds)
    complete: bool
    note: str = ""


# --- pure: spec text, parsing, timing maths ------------------------------------------------------

def spec_text(workload: Workload, sink_path: Path) -> str:
    """The Elastiq spec of the benchmark query (numbers and our own path only, no outside text)."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="bench-hot-sensors">
  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="ts" type="timestamp"/>
    <column name="temp" type="double"/>
    <column name="humidity" type="double"/>
  </type>
  <operator name="src" type="generator">
    <param name="shape" value="{SHAPE}"/>
    <param name="rate" value="{workload.rate:.1f}"/>
    <param name="limit" value="{workload.limit}"/>
    <param name="seed" value="{SEED}"/>
    <param name="start" value="{START}"/>
    <output name="raw" type="reading"/>
  </operator>
  <operator name="hot" type="filter">
    <input name="raw"/>
    <param name="condition" value="raw.temp &gt; {TEMP_THRESHOLD}"/>
    <output name="hotReadings" type="reading"/>
  </operator>
  <operator name="avg" type="window-aggregate">
    <input name="hotReadings"/>
    <param name="time" value="ts"/>
    <param name="size" value="{WINDOW_US // 1_000_000} seconds"/>
    <param name="watermark" value="{WATERMARK_US // 1_000_000} seconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="avg_temp" function="avg" column="temp"/>
    <aggregate name="max_temp" function="max" column="temp"/>
    <aggregate name="readings" function="count"/>
    <output name="averages"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="averages"/>
    <param name="path" value="{sink_path}"/>
  </operator>
</dataflow>
"""


def iso_to_us(text: str) -> int:
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return (parsed - shapes.EPOCH) // shapes.timedelta(microseconds=1)


def parse_result_line(line: str) -> ResultRow:
    """A sink line of either side (same keys; ISO-8601 instants) -> ResultRow."""
    data = json.loads(line)
    return ResultRow(iso_to_us(data["window_start"]), iso_to_us(data["window_end"]),
                     str(data["sensor"]), float(data["avg_temp"]), float(data["max_temp"]),
                     int(data["readings"]))


def first_index_at(event_us: int, rate: float) -> int:
    """The first tuple index whose event time (START + floor(i * 1e6 / rate) us) >= event_us."""
    i = max(0, math.ceil((event_us - START_US) * rate / 1e6) - 1)
    while shapes.event_time_us(START_US, rate, i) < event_us:
        i += 1
    return i


def release_wall_time(anchor: float, rate: float, index: int) -> float:
    """When the paced generator makes tuple `index` available: floor((now - anchor) * rate) must
    exceed `index` (executor.sources.paced_offset)."""
    return anchor + (index + 1) / rate


def window_close_latencies(outcome: RunOutcome) -> list[float]:
    """Seconds from the release of the tuple that lets each window close to its line in the sink."""
    rate = outcome.workload.rate
    out = []
    for seen in outcome.rows:
        closer = first_index_at(seen.row.window_end_us + WATERMARK_US, rate)
        out.append(seen.wall - release_wall_time(outcome.anchor, rate, closer))
    return out


def _end_index(progress: Mapping[str, Any]) -> int | None:
    sources = progress.get("sources") or []
    if not sources:
        return None
    end = sources[0].get("endOffset")  # {"index": n} as a dict, JSON or a Python repr
    if isinstance(end, Mapping):
        return int(end["index"]) if "index" in end else None
    numbers = re.findall(r"-?\d+", str(end))
    return int(numbers[0]) if len(numbers) == 1 else None


def _batch_span(progress: Mapping[str, Any]) -> tuple[float, float]:
    start = datetime.fromisoformat(str(progress["timestamp"])).timestamp()
    return start, start + progress["durationMs"]["triggerExecution"] / 1000.0


def data_batches(progress: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Progress of batches that read rows, in batch order (no-data batches dropped)."""
    rows = [p for p in progress if int(p.get("numInputRows", 0)) > 0]
    return sorted(rows, key=lambda p: int(p["batchId"]))


def warm_throughput(progress: Sequence[Mapping[str, Any]]) -> tuple[float, int, int]:
    """(rows/s, rows, batches) over the data batches after the first: their rows over the wall
    span from the start of the second to the end of the last. NaN with fewer than 2 batches."""
    batches = data_batches(progress)[1:]
    if not batches:
        return math.nan, 0, 0
    rows = sum(int(p["numInputRows"]) for p in batches)
    begin, end = _batch_span(batches[0])[0], _batch_span(batches[-1])[1]
    return ratio(rows, end - begin), rows, len(batches)


def warm_batch_ms(progress: Sequence[Mapping[str, Any]]) -> list[float]:
    """triggerExecution of every batch after the first data batch (no-data batches included:
    they are the ones that close windows)."""
    ordered = sorted(progress, key=lambda p: int(p["batchId"]))
    firsts = data_batches(ordered)
    if not firsts:
        return []
    first_id = int(firsts[0]["batchId"])
    return [float(p["durationMs"]["triggerExecution"]) for p in ordered
            if int(p["batchId"]) > first_id]


def describe_batches(progress: Sequence[Mapping[str, Any]]) -> str:
    """For the log: data-batch sizes and the median of each durationMs phase after the first."""
    sizes = [int(p["numInputRows"]) for p in data_batches(progress)]
    ordered = sorted(progress, key=lambda p: int(p["batchId"]))[1:]
    phases = sorted({k for p in ordered for k in p["durationMs"]})
    medians = {k: median_of([float(p["durationMs"].get(k, 0)) for p in ordered]) for k in phases}
    shown = sizes if len(sizes) <= 8 else [*sizes[:4], "...", *sizes[-3:]]
    return (f"{len(progress)} batches, data batch rows {shown}; median ms "
            + " ".join(f"{k}={v:.0f}" for k, v in medians.items()))


def closed_window_starts(workload: Workload) -> list[int]:
    """Windows the final watermark (last event time in ms - watermark) has closed."""
    watermark_us = (workload.last_event_us // 1000) * 1000 - WATERMARK_US
    first = START_US - START_US % WINDOW_US
    return [w for w in range(first, watermark_us, WINDOW_US) if w + WINDOW_US <= watermark_us]


# --- pure: the oracle and the comparison ---------------------------------------------------------

def oracle_rows(workload: Workload) -> dict[tuple[int, str], ResultRow]:
    """The expected sink rows in plain Python over `shapes.reference_row` (no numpy, no Spark)."""
    shape = shapes.shape_named(SHAPE)
    closed = set(closed_window_starts(workload))
    acc: dict[tuple[int, str], list[float]] = {}
    for i in range(workload.limit):
        row = shape.scalar(SEED, i)
        if not row["temp"] > TEMP_THRESHOLD:
            continue
        ts = shapes.event_time_us(START_US, workload.rate, i)
        start = ts - ts % WINDOW_US
        if start not in closed:
            continue
        a = acc.setdefault((start, row["sensor"]), [0.0, -math.inf, 0])
        a[0] += row["temp"]
        a[1] = max(a[1], row["temp"])
        a[2] += 1
    return {k: ResultRow(k[0], k[0] + WINDOW_US, k[1], s / n, m, int(n))
            for k, (s, m, n) in acc.items()}


def rows_equal(a: ResultRow, b: ResultRow) -> bool:
    return (a.key == b.key and a.window_end_us == b.window_end_us and a.max_temp == b.max_temp
            and a.readings == b.readings
            and math.isclose(a.avg_temp, b.avg_temp, rel_tol=1e-9, abs_tol=0.0))


def same_results(a: Mapping[tuple[int, str], ResultRow],
                 b: Mapping[tuple[int, str], ResultRow]) -> bool:
    return a.keys() == b.keys() and all(rows_equal(a[k], b[k]) for k in a)


def keyed(outcome: RunOutcome) -> dict[tuple[int, str], ResultRow]:
    """Sink rows by (window, sensor)."""
    return {seen.row.key: seen.row for seen in outcome.rows}


def duplicates(outcome: RunOutcome) -> int:
    """Sink rows whose (window, sensor) was already written: each is an error."""
    return len(outcome.rows) - len(keyed(outcome))


# --- I/O: watching a sink file -------------------------------------------------------------------

class SinkWatcher:
    """Polls a JSON-lines file every POLL_SECONDS; stamps each complete new line with the wall
    time it was first seen."""

    def __init__(self, run_id: str, path: Path) -> None:
        self.run_id, self.path = run_id, path
        self.seen: list[SeenRow] = []
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"sink-{run_id}", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._poll()

    def _poll(self) -> None:
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            return
        if size <= self._offset:
            return
        now = time.time()
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode("utf-8").splitlines():
            if line.strip():
                self.seen.append(SeenRow(now, parse_result_line(line)))

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._poll()


# --- I/O: the two sides --------------------------------------------------------------------------

class JsonLinesAppender:
    """The hand-written side's foreachBatch: collect the (few) result rows, append JSON lines."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        if not rows:
            return
        lines = []
        for r in rows:
            lines.append(json.dumps({
                "window_start": r.window_start.astimezone(UTC).isoformat(),
                "window_end": r.window_end.astimezone(UTC).isoformat(),
                "sensor": r.sensor, "avg_temp": r.avg_temp, "max_temp": r.max_temp,
                "readings": r.readings}))
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def start_handwritten(spark: SparkSession, workload: Workload, run_dir: Path,
                      sink_path: Path) -> StreamingQuery:
    """The same query as a plain PySpark job over the same generator source."""
    spark.dataSource.register(GeneratorSource)
    # the micro-batch cap Elastiq's task has (it writes a window's results to a file sink)
    config = GeneratorConfig("handwritten", "src", SHAPE, SENSOR_COLUMNS, SEED, workload.rate,
                             workload.limit, START_US, str(run_dir / "anchor"), SOURCE_PARTITIONS,
                             batch_bytes=LARGE_BATCH_BYTES)
    readings = (spark.readStream.format(GeneratorSource.name())
                .option(CONFIG_OPTION, encode_config(config)).load())
    results = (readings.filter(F.col("temp") > TEMP_THRESHOLD)
               .withWatermark("ts", f"{WATERMARK_US // 1_000_000} seconds")
               .groupBy(F.window("ts", f"{WINDOW_US // 1_000_000} seconds"), "sensor")
               .agg(F.avg("temp").alias("avg_temp"), F.max("temp").alias("max_temp"),
                    F.count(F.lit(1)).alias("readings"))
               .select(F.col("window.start").alias("window_start"),
                       F.col("window.end").alias("window_end"),
                       "sensor", "avg_temp", "max_temp", "readings"))
    return (results.writeStream.foreachBatch(JsonLinesAppender(sink_path))
            .queryName(f"handwritten-{run_dir.name}")
            .option("checkpointLocation", str(run_dir / "checkpoint")).start())


def start_elastiq(spark: SparkSession, workload: Workload, run_dir: Path,
                  sink_path: Path) -> tuple[TaskRunner, StreamingQuery]:
    """Compile the spec and run its single task the way the executor does."""
    runner = start_task(spark, spec_text(workload, sink_path), run_dir / "bench.xml", run_dir,
                        f"bench-{run_dir.name}", run_dir)
    return runner, runner.runtime.query


def wait_until_done(run_id: str, query: StreamingQuery, watcher: SinkWatcher, workload: Workload,
                    expected_rows: int, timeout: float) -> tuple[bool, str]:
    """Until every tuple is processed and the sink holds `expected_rows`; bounded in time."""
    def outcome() -> str:
        if not query.isActive:
            return f"query ended: {query.exception()}"
        progress = query.lastProgress
        ended = progress is not None and _end_index(progress) == workload.limit
        return "done" if ended and len(watcher.seen) >= expected_rows else ""

    found = poll(outcome, timeout, 0.1)
    if found:
        return found == "done", "" if found == "done" else found
    log.warning("run %s: not done after %.0f s (%s sink rows of %s)", run_id, timeout,
                len(watcher.seen), expected_rows)
    return False, f"timed out with {len(watcher.seen)}/{expected_rows} sink rows"


def read_anchor(path: Path) -> float:
    """The pacing anchor the generator persisted (its JSON state, `executor.sources`)."""
    return read_or_create_anchor(str(path), math.nan)


def run_side(spark: SparkSession, side: str, workload: Workload, run_dir: Path,
             expected_rows: int) -> RunOutcome:
    """One measured run of one side; always stops its query."""
    run_dir.mkdir(parents=True)
    sink_path = run_dir / "out.jsonl"
    run_id = f"{side}/{run_dir.name}"
    timeout = workload.limit / workload.rate + 90.0
    log.info("run %s: %s rows at %s rows/s", run_id, workload.limit, workload.rate)
    runner: TaskRunner | None = None
    with SinkWatcher(run_id, sink_path) as watcher:
        if side == "elastiq":
            runner, query = start_elastiq(spark, workload, run_dir, sink_path)
            anchor_path = run_dir / "checkpoint" / "pacing" / "src.anchor"
        else:
            query = start_handwritten(spark, workload, run_dir, sink_path)
            anchor_path = run_dir / "anchor"
        try:
            complete, note = wait_until_done(run_id, query, watcher, workload, expected_rows,
                                             timeout)
            progress = tuple(query.recentProgress)
        finally:
            if runner is not None:
                runner.stop()
            elif query.isActive:
                query.stop()
    log.info("run %s: done (complete=%s, %s sink rows); %s", run_id, complete,
             len(watcher.seen), describe_batches(progress))
    return RunOutcome(side, workload, tuple(watcher.seen), progress, read_anchor(anchor_path),
                      complete, note)


# --- figures -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SideFigures:
    rows_per_s: float  # median over repeats
    warm_batches_tp: float  # median over repeats
    warm_batch_rows_tp: float  # median rows of a warm data batch, over all repeats
    batch_p50_ms_tp_run: float  # medians over repeats of each run's percentile
    batch_p99_ms_tp_run: float
    latency_p50_ms: float  # pooled over repeats (each run closes only a few windows)
    latency_p99_ms: float
    window_closes: int  # independent samples: (run, window) pairs seen in the sinks
    batch_p50_ms_latency_run: float  # medians over repeats of each run's percentile
    batch_p99_ms_latency_run: float


def side_figures(tp_runs: Sequence[RunOutcome], lat_runs: Sequence[RunOutcome]) -> SideFigures:
    tps = [warm_throughput(r.progress) for r in tp_runs]
    warm_rows = [float(p["numInputRows"]) for r in tp_runs for p in data_batches(r.progress)[1:]]
    pooled = [x * 1000.0 for r in lat_runs for x in window_close_latencies(r)]
    closes = sum(len({s.row.window_end_us for s in r.rows}) for r in lat_runs)
    bl = [warm_batch_ms(r.progress) for r in lat_runs]
    bt = [warm_batch_ms(r.progress) for r in tp_runs]
    return SideFigures(
        rows_per_s=median_of([t[0] for t in tps]),
        warm_batches_tp=median_of([float(t[2]) for t in tps]),
        warm_batch_rows_tp=median_of(warm_rows),
        batch_p50_ms_tp_run=median_of([percentile(v, 50) for v in bt]),
        batch_p99_ms_tp_run=median_of([percentile(v, 99) for v in bt]),
        latency_p50_ms=percentile(pooled, 50), latency_p99_ms=percentile(pooled, 99),
        window_closes=closes,
        batch_p50_ms_latency_run=median_of([percentile(v, 50) for v in bl]),
        batch_p99_ms_latency_run=median_of([percentile(v, 99) for v in bl]))


def _compare(label: str, e: float, h: float, digits: int = 0) -> tuple[str, str, str, str]:
    return (label, fmt(e, digits), fmt(h, digits), fmt(ratio(e, h), 2))


def figures_table(e: SideFigures, h: SideFigures, plan: Plan) -> str:
    tp, lat = plan.throughput, plan.latency
    rows = [
        _compare(f"throughput rows/s ({tp.rate / 1e6:g}M/s offered, {tp.limit / 1e6:g}M rows)",
                 e.rows_per_s, h.rows_per_s),
        ("  warm data batches per run", fmt(e.warm_batches_tp), fmt(h.warm_batches_tp), ""),
        _compare("  rows per warm batch", e.warm_batch_rows_tp, h.warm_batch_rows_tp),
        _compare("  micro-batch ms p50", e.batch_p50_ms_tp_run, h.batch_p50_ms_tp_run),
        _compare("  micro-batch ms p99", e.batch_p99_ms_tp_run, h.batch_p99_ms_tp_run),
        _compare(f"window latency ms p50 ({lat.rate:,.0f} rows/s, pooled)", e.latency_p50_ms,
                 h.latency_p50_ms),
        _compare("window latency ms p99 (pooled)", e.latency_p99_ms, h.latency_p99_ms),
        ("  window closes measured", str(e.window_closes), str(h.window_closes), ""),
        _compare("  micro-batch ms p50", e.batch_p50_ms_latency_run, h.batch_p50_ms_latency_run),
        _compare("  micro-batch ms p99", e.batch_p99_ms_latency_run, h.batch_p99_ms_latency_run),
    ]
    return format_table(("figure (median over repeats unless pooled)", "elastiq", "handwritten",
                         "elastiq/hand"), rows)


# --- the run -------------------------------------------------------------------------------------

def order_for(turn: int) -> tuple[str, str]:
    """Which side runs first; alternated per repeat and per phase so neither side always
    follows the same run (a query's stop leaves the JVM busy for a moment)."""
    return ("elastiq", "handwritten") if turn % 2 == 0 else ("handwritten", "elastiq")


def run_pairs(spark: SparkSession, work: Path, workload: Workload, repeats: int,
              expected_rows: int, tag: str, phase: int) -> dict[str, list[RunOutcome]]:
    runs: dict[str, list[RunOutcome]] = {"elastiq": [], "handwritten": []}
    for r in range(repeats):
        for side in order_for(r + phase):
            runs[side].append(run_side(spark, side, workload, work / f"{tag}-{side}-{r}",
                                       expected_rows))
    return runs


def honesty_lines(lat: Mapping[str, list[RunOutcome]], volume: Mapping[str, RunOutcome],
                  oracle: Mapping[tuple[int, str], ResultRow], volume_expected: int,
                  every: Sequence[RunOutcome]) -> list[str]:
    """Latency runs against the plain-Python oracle; the volume runs against each other."""
    incomplete = [f"{o.side}/{o.workload.name}: {o.note}" for o in every if not o.complete]
    incomplete += [f"{o.side}/{o.workload.name}: {duplicates(o)} duplicate window rows"
                   for o in every if duplicates(o)]
    oracle_ok = all(same_results(keyed(o), oracle) for o in lat["elastiq"] + lat["handwritten"])
    vol_e, vol_h = keyed(volume["elastiq"]), keyed(volume["handwritten"])
    volume_ok = same_results(vol_e, vol_h) and len(vol_e) == volume_expected
    identical = oracle_ok and volume_ok and not incomplete
    lines = [f"results identical: {'yes' if identical else 'no'}",
             (f"  {2 * len(lat['elastiq'])} latency runs, each side vs a plain-Python oracle "
             f"({len(oracle)} window rows): {'yes' if oracle_ok else 'no'}"),
             (f"  volume run ({volume['elastiq'].workload.limit:,} rows), elastiq vs handwritten "
             f"({len(vol_e)}/{len(vol_h)} window rows, {volume_expected} expected): "
             f"{'yes' if volume_ok else 'no'}")]
    lines += [f"  INCOMPLETE {x}" for x in incomplete]
    return lines


def warm_up(spark: SparkSession, work: Path, workload: Workload) -> None:
    """One short unmeasured run per side: starts the Python workers and JIT-compiles the paths."""
    for side in ("elastiq", "handwritten"):
        run_side(spark, side, workload, work / f"warmup-{side}",
                 expected_rows=len(closed_window_starts(workload)) * len(shapes.SENSORS))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 short repeat (~3 minutes)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (default 3)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    repeats = args.repeats or plan.repeats
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("executor").setLevel(logging.WARNING)
    # py4j logs every exception of a foreachBatch call, including the InterruptedException of a
    # batch cut short by stop(); a failure during a run ends the query and is reported from there
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    began = time.monotonic()
    oracle = oracle_rows(plan.latency)
    volume_expected = len(closed_window_starts(plan.volume)) * len(shapes.SENSORS)
    with tempfile.TemporaryDirectory(prefix="elastiq-bench-") as tmp:
        work = Path(tmp)
        spark = build_session(2, "bench-spark-vs-handwritten", str(work / "session"))
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(PROGRESS_RETENTION))
        try:
            warm_up(spark, work, plan.warmup)
            tp = run_pairs(spark, work, plan.throughput, repeats, 0, "tp", 0)
            lat = run_pairs(spark, work, plan.latency, repeats, len(oracle), "lat", 1)
            vol = {side: runs[0] for side, runs in
                   run_pairs(spark, work, plan.volume, 1, volume_expected, "vol", 0).items()}
        finally:
            for query in spark.streams.active:
                query.stop()
            spark.stop()
    e = side_figures(tp["elastiq"], lat["elastiq"])
    h = side_figures(tp["handwritten"], lat["handwritten"])
    print()
    print(f"Elastiq vs hand-written PySpark: filter temp > {TEMP_THRESHOLD}, 10 s tumbling "
          f"windows by sensor, watermark 2 s; {repeats} repeat(s), local[2]")
    print(figures_table(e, h, plan))
    print(f"throughput ratio elastiq/handwritten: {fmt(ratio(e.rows_per_s, h.rows_per_s), 2)} "
          "(goal >= 0.90)")
    print(f"latency p50 ratio elastiq/handwritten: "
          f"{fmt(ratio(e.latency_p50_ms, h.latency_p50_ms), 2)} (goal <= 1.20); micro-batch p50 "
          f"ratio at that rate: "
          f"{fmt(ratio(e.batch_p50_ms_latency_run, h.batch_p50_ms_latency_run), 2)}")
    for name, figures in (("elastiq", e), ("handwritten", h)):
        if figures.rows_per_s > SOURCE_LIMIT_SHARE * plan.throughput.rate:
            print(f"WARNING: {name} processed {figures.rows_per_s:,.0f} rows/s, near the "
                  f"{plan.throughput.rate:,.0f} offered: the source may have limited it")
    every = [*tp["elastiq"], *tp["handwritten"], *lat["elastiq"], *lat["handwritten"],
             *vol.values()]
    for line in honesty_lines(lat, vol, oracle, volume_expected, every):
        print(line)
    print(f"wall time: {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
