"""Elastiq's file source vs hand-written PySpark with Spark's native CSV reader, on one input file.

Owns this benchmark only (not a test, nothing here is imported by the project). The query is issue
19's: readings with temp > 30, tumbling 10 s event-time windows per sensor (watermark 2 s),
avg/max/count, appended to a JSON-lines file. The input: one CSV file (header + N rows, default
3M, of the deterministic `sensor` shape at 1,000 rows/s of event time, seed 42), written once.

- Elastiq: the spec with a `file-source` (no rate: as fast as possible), compiled and run as the
  executor runs its task (`bench_util.start_task`: TaskRunner, FileSink).
- Hand-written: `spark.readStream.schema(...).csv(folder of that one file)` (Spark's own reader),
  the same filter/window/aggregation and a foreachBatch appending JSON lines.
Both in ONE SparkSession from `build_session(2, ...)`, one query at a time, the order alternating
per repeat, after one unmeasured warm-up run per side.

Printed per side (medians over repeats): `rows/s` = N over the wall span of the data
micro-batches (first start to last end, StreamingQueryProgress); `start -> results s` = from the
query's start call to the last closed window's line in the sink (5 ms poller); and the ratio.
Honesty: both sinks must hold exactly the closed windows of a plain-Python oracle (the file read
with the `csv` module; avg to 1e-9 relative, max and count exactly, no window twice).
Latency at 2,000 rows/s is measured by `spark_vs_handwritten.py` (a paced generator).

    python benchmarks/file_vs_handwritten.py [--rows N] [--repeats N]
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_util import fmt, format_table, median_of, ratio, start_task, use_repo_on_path

use_repo_on_path()

import pyarrow.csv as pacsv
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from executor import shapes
from executor.spark_session import build_session
from spark_vs_handwritten import (
    SEED,
    SENSOR_COLUMNS,
    START_US,
    TEMP_THRESHOLD,
    WATERMARK_US,
    WINDOW_US,
    JsonLinesAppender,
    ResultRow,
    SinkWatcher,
    data_batches,
    describe_batches,
    iso_to_us,
    rows_equal,
    spec_text,
)

log = logging.getLogger("bench.file_vs_handwritten")

EVENT_RATE = 1000.0  # rows per second of event time in the file
WRITE_CHUNK = 500_000
PROGRESS_RETENTION = 200


# --- the input file and its oracle ---------------------------------------------------------------

def write_input(path: Path, rows: int) -> None:
    """Header + `rows` sensor readings as CSV (pyarrow's writer; instants in UTC)."""
    shape = shapes.shape_named("sensor")
    schema = shapes.arrow_schema(shape.columns)
    with pacsv.CSVWriter(str(path), schema) as writer:
        for lo in range(0, rows, WRITE_CHUNK):
            writer.write_batch(shapes.generate_batch(shape, shape.columns, SEED, START_US,
                                                     EVENT_RATE, lo, min(lo + WRITE_CHUNK, rows)))


def oracle(path: Path) -> dict[tuple[int, str], ResultRow]:
    """The closed windows of the query over the file, in plain Python (`csv` module)."""
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    last_us = 0
    with open(path, newline="", encoding="utf-8") as f:
        for record in csv.DictReader(f):
            ts_us = iso_to_us(record["ts"].replace(" ", "T"))
            last_us = max(last_us, ts_us)
            temp = float(record["temp"])
            if temp > TEMP_THRESHOLD:
                groups[(ts_us - ts_us % WINDOW_US, record["sensor"])].append(temp)
    watermark = (last_us // 1000) * 1000 - WATERMARK_US
    return {key: ResultRow(key[0], key[0] + WINDOW_US, key[1], math.fsum(t) / len(t), max(t),
                           len(t))
            for key, t in groups.items() if key[0] + WINDOW_US <= watermark}


# --- the two sides -------------------------------------------------------------------------------

def file_spec(input_path: Path, sink_path: Path) -> str:
    """`spark_vs_handwritten`'s spec with its generator replaced by a file replay."""
    text = spec_text(_NoWorkload(), sink_path)
    begin, end = text.index('  <operator name="src"'), text.index("  </operator>") + 14
    source = ('  <operator name="src" type="file-source">\n'
              f'    <param name="path" value="{input_path}"/>\n'
              '    <param name="format" value="csv"/>\n'
              '    <output name="raw" type="reading"/>\n  </operator>\n')
    return text[:begin] + source + text[end:]


@dataclass(frozen=True)
class _NoWorkload:
    rate: float = 1.0
    limit: int = 1


def start_elastiq(spark: SparkSession, input_path: Path, run_dir: Path,
                  sink_path: Path) -> tuple[Any, StreamingQuery]:
    runner = start_task(spark, file_spec(input_path, sink_path), run_dir / "b.xml",
                        run_dir.parent, f"bench-{run_dir.name}", run_dir)
    return runner, runner.runtime.query


def start_handwritten(spark: SparkSession, input_dir: Path, run_dir: Path,
                      sink_path: Path) -> StreamingQuery:
    ddl = ", ".join(f"{name} {kind}" for name, kind in SENSOR_COLUMNS)
    readings = spark.readStream.schema(ddl).option("header", "true").csv(str(input_dir))
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


@dataclass(frozen=True)
class Outcome:
    side: str
    rows_per_s: float
    start_to_results_s: float
    results: dict[tuple[int, str], ResultRow]
    duplicates: int
    complete: bool


def data_span_rows_per_s(progress: Sequence[Mapping[str, Any]], rows: int) -> float:
    from spark_vs_handwritten import _batch_span

    batches = data_batches(progress)
    if not batches:
        return math.nan
    return ratio(rows, _batch_span(batches[-1])[1] - _batch_span(batches[0])[0])


def run_side(spark: SparkSession, side: str, input_path: Path, run_dir: Path, rows: int,
             expected: int, timeout: float) -> Outcome:
    """One run of one side until every closed window is in its sink; always stops its query."""
    run_dir.mkdir(parents=True)
    sink_path = run_dir / "out.jsonl"
    runner = None
    with SinkWatcher(f"{side}/{run_dir.name}", sink_path) as watcher:
        started = time.time()
        if side == "elastiq":
            runner, query = start_elastiq(spark, input_path, run_dir, sink_path)
        else:
            query = start_handwritten(spark, input_path.parent, run_dir, sink_path)
        deadline = time.monotonic() + timeout
        try:
            while len(watcher.seen) < expected and time.monotonic() < deadline \
                    and query.isActive:
                time.sleep(0.05)
            progress = tuple(query.recentProgress)
        finally:
            if runner is not None:
                runner.stop()
            elif query.isActive:
                query.stop()
    complete = len(watcher.seen) >= expected
    done = watcher.seen[-1].wall if watcher.seen else math.nan
    log.info("run %s/%s: complete=%s; %s", side, run_dir.name, complete,
             describe_batches(progress))
    results = {s.row.key: s.row for s in watcher.seen}
    return Outcome(side, data_span_rows_per_s(progress, rows), done - started, results,
                   len(watcher.seen) - len(results), complete)


def matches(outcome: Outcome, want: Mapping[tuple[int, str], ResultRow]) -> bool:
    return (outcome.complete and outcome.duplicates == 0 and set(outcome.results) == set(want)
            and all(rows_equal(outcome.results[k], want[k]) for k in want))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000, help="input rows (default 3M)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (default 3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("executor").setLevel(logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="elastiq-bench-file-") as tmp:
        work = Path(tmp)
        input_path = work / "input" / "readings.csv"
        input_path.parent.mkdir()
        write_input(input_path, args.rows)
        want = oracle(input_path)
        log.info("input %s rows, %s bytes; %s closed windows", args.rows,
                 input_path.stat().st_size, len(want))
        spark = build_session(2, "bench-file-vs-handwritten", str(work / "session"))
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(PROGRESS_RETENTION))
        runs: dict[str, list[Outcome]] = {"elastiq": [], "handwritten": []}
        timeout = 120.0 + args.rows / 20_000
        try:
            for side in ("elastiq", "handwritten"):  # warm-up, unmeasured
                run_side(spark, side, input_path, work / f"warm-{side}", args.rows, len(want),
                         timeout)
            for turn in range(args.repeats):
                order = ("elastiq", "handwritten") if turn % 2 == 0 else \
                    ("handwritten", "elastiq")
                for side in order:
                    runs[side].append(run_side(spark, side, input_path,
                                               work / f"{side}-{turn}", args.rows, len(want),
                                               timeout))
        finally:
            for query in spark.streams.active:
                query.stop()
            spark.stop()
    table = []
    med = {side: (median_of([o.rows_per_s for o in outs]),
                  median_of([o.start_to_results_s for o in outs])) for side, outs in runs.items()}
    table.append(("rows/s (data micro-batches)", fmt(med["elastiq"][0]),
                  fmt(med["handwritten"][0]),
                  fmt(ratio(med["elastiq"][0], med["handwritten"][0]), 2)))
    table.append(("start -> results s", fmt(med["elastiq"][1], 1), fmt(med["handwritten"][1], 1),
                  fmt(ratio(med["elastiq"][1], med["handwritten"][1]), 2)))
    print()
    print(f"Elastiq file-source vs hand-written PySpark (native CSV reader): {args.rows:,} rows, "
          f"{len(want)} closed windows; {args.repeats} repeat(s), local[2]")
    print(format_table(("", "elastiq", "handwritten", "elastiq/hand"), table))
    print(f"throughput ratio elastiq/handwritten: "
          f"{fmt(ratio(med['elastiq'][0], med['handwritten'][0]), 2)} (goal >= 1.00)")
    every = [o for outs in runs.values() for o in outs]
    print("results identical to the plain-Python oracle: "
          + ("yes" if all(matches(o, want) for o in every) else "NO"))
    for o in every:
        if not matches(o, want):
            print(f"MISMATCH {o.side}: complete={o.complete} duplicates={o.duplicates} "
                  f"windows={len(o.results)}/{len(want)}")
    print(f"wall time: {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
