"""Benchmark: the pattern operator's matcher on the paper's tick-shaped pattern AB+CD+.

Measures rows/s and matches/s of `executor.cep.match.KeyMatcher` (the generic automaton with the
checked conditions interpreted per row) over the `stock` generator's rows (plain-Python
reference rows, per symbol, all fed at once and then in micro-batches of 500 rows through the
state store's JSON round trip), against a tick matcher written by hand for this one pattern in
plain Python (the same semantics: greedy, SKIP PAST LAST ROW, the time bound) in the same run;
both must find the same matches. Then the partitioned repetition (rewrite_rules/
pattern-partitioning.rule, after-match skip-to-next-row): one instance against k=2 instances
each holding its share of the partial matches (each reads every row; measured one after the
other, the pair's time on two cores is the slower one's); the two together must find exactly
the one instance's matches; on the tick pattern and on a workload whose partial matches live
long (--long-rows rows of `A B+ C`, B nearly every row, C rare, within 1 s). Then the pipeline
P+ = P v (P P+) over k stages (rewrite_rules/pattern-pipelining.rule): each stage timed on its
own over what the stage before wrote (every item through its text; on k cores the pipeline
takes the slowest stage's time), on both workloads; the last stage must find exactly the one
instance's matches. Medians over repeats. Not run by pytest.

    python benchmarks/cep.py [--rows 40000] [--long-rows 6000] [--repeats 3]
                             [--spark [--spark-rows 60000]]

With --spark, also the operator on Spark (its runtime: generator -> pattern -> exactly-once file
sink, state in the state store) against the same pattern written by hand as one PySpark job
(generator source -> withWatermark -> groupBy(symbol).applyInPandasWithState with a tick
function written for this pattern -> foreachBatch JSON lines), one query at a time in one local[2]
session: rows/s from start to drained, and the two must emit the same number of matches; and
the operator with skip-to-next-row as one query against k=2 instances as two concurrent queries
(start to both drained), which must emit the same number of matches together; and the pipelines
of PIPELINES, their stages as queries one after the other (each reading the file the stage
before wrote, standing for the channel), each start to drained, which must emit the one
instance's number of matches.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

from bench_util import fmt, format_table, median_of, ratio, use_repo_on_path  # noqa: E402

use_repo_on_path()

from executor import shapes  # noqa: E402
from executor.cep.match import KeyMatcher, build_program, measures  # noqa: E402
from executor.cep.stage import Item, Stage, StageMatcher  # noqa: E402

SPARK_RATE = 200_000.0  # the generator's pace (tuples/s): far above what either side processes

WITHIN_US = 30_000_000
DEFINES = (("B", "price < prev(price)"),
           ("C", "price > prev(price) and price < first(A.price)"),
           ("D", "price > prev(price) and price > first(A.price)"))
MEASURES = (("start", "first(A.ts)"), ("bottom", "min(B.price)"), ("top", "max(D.price)"),
            ("falls", "count(B)"))
SCHEMA = shapes.shape_named("stock").columns


def stock_rows(count: int) -> dict[str, list[dict[str, Any]]]:
    shape = shapes.shape_named("stock")
    start = shapes.parse_start("2024-01-01T00:00:00Z")
    by_symbol: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i in range(count):
        row = shapes.reference_row(shape, 7, start, 1000.0, i)
        ts = row["ts"] - shapes.EPOCH
        by_symbol[row["symbol"]].append({**row, "ts": (ts.days * 86_400 + ts.seconds)
                                         * 1_000_000 + ts.microseconds})
    return by_symbol


# A workload whose partial matches live long (what makes the repetition critical, the paper
# says): B takes almost every row and C is rare, so a key holds a partial match per row of the
# last second.
LONG = ("A B+ C", (("B", "price > 60"), ("C", "volume > 990 and price > first(A.price)")),
        1_000_000)


def generic(rows: dict[str, list[dict]], batch: int | None, after: str = "skip-past-last-row",
            share: tuple[int, int] | None = None,
            workload: tuple[str, tuple, int] = ("A B+ C D+", DEFINES, WITHIN_US)) -> list[tuple]:
    pattern, defines, within = workload
    program, _ = build_program("stock", SCHEMA, "ts", pattern, defines, MEASURES[:1], within,
                               after_match=after, share=share) if workload[0] != "A B+ C D+" \
        else build_program("stock", SCHEMA, "ts", pattern, defines, MEASURES, within,
                           after_match=after, share=share)
    out = []
    for symbol, own in rows.items():
        matcher = KeyMatcher(program)
        step = batch or len(own)
        for i in range(0, len(own), step):
            part = own[i:i + step]
            found = matcher.feed(part, part[-1]["ts"])
            out += [(symbol,) + measures(program, m) for m in found]
            if batch:
                matcher = KeyMatcher.from_json(program, matcher.to_json())
    return out


def by_hand(rows: dict[str, list[dict]], batch: int | None) -> list[tuple]:
    """AB+CD+ written for this pattern: B+ and D+ are maximal runs (a shorter B+ leaves a
    falling row where C needs a rise), so each start row needs one forward scan."""
    out = []
    for symbol, own in rows.items():
        i, n = 0, len(own)
        while i < n:
            end = _tick_at(own, i)
            if end is None:
                i += 1
                continue
            a, match = own[i], own[i:end + 1]
            falls = [r for r in match[1:] if r is not match[-1]]
            b_rows = falls[:_run_length(match)]
            d_rows = match[len(b_rows) + 2:]
            out.append((symbol, a["ts"], min(r["price"] for r in b_rows),
                        max(r["price"] for r in d_rows), len(b_rows)))
            i = end + 1
    return out


def _run_length(match: list[dict]) -> int:
    k = 1
    while match[k + 1]["price"] < match[k]["price"]:
        k += 1
    return k


def _tick_at(rows: list[dict], i: int) -> int | None:
    a = rows[i]
    n = len(rows)

    def ok(j: int) -> bool:
        return j < n and rows[j]["ts"] - a["ts"] <= WITHIN_US

    j = i + 1
    while ok(j) and rows[j]["price"] < rows[j - 1]["price"]:
        j += 1
    if j == i + 1 or not ok(j) or not (rows[j - 1]["price"] < rows[j]["price"] < a["price"]):
        return None
    k = j + 1
    while ok(k) and rows[k - 1]["price"] < rows[k]["price"] and rows[k]["price"] > a["price"]:
        k += 1
    return k - 1 if k > j + 1 else None


# --- Spark: the operator against a hand-written applyInPandasWithState job --------------------


def _hand_tick_state(rows: list[list[float]], watermark_us: int
                     ) -> tuple[list[tuple[int, float, float, float, int]], list[list[float]]]:
    """The hand-written streaming tick matcher of one key: `rows` ([ts, price], time order, all
    at or before the watermark, from the first undecided start) -> matches and the rows to keep.
    A start whose scan reaches the end of the rows while its time bound is still open waits."""
    out, i, n = [], 0, len(rows)
    while i < n:
        a_ts, a_price = rows[i]
        open_bound = a_ts + WITHIN_US > watermark_us

        def ok(j: int) -> bool:
            return j < n and rows[j][0] - a_ts <= WITHIN_US

        j = i + 1
        while ok(j) and rows[j][1] < rows[j - 1][1]:
            j += 1
        if j >= n and open_bound:
            break
        if j == i + 1 or not ok(j) or not rows[j - 1][1] < rows[j][1] < a_price:
            i += 1
            continue
        k = j + 1
        while ok(k) and rows[k - 1][1] < rows[k][1] and rows[k][1] > a_price:
            k += 1
        if k >= n and open_bound:
            break
        if k == j + 1:
            i += 1
            continue
        falls = j - i - 1
        out.append((int(a_ts), min(r[1] for r in rows[i + 1:j]),
                    max(r[1] for r in rows[j + 1:k]), float(falls), k - 1))
        i = k
    return out, rows[i:]


def start_handwritten(spark: Any, run_dir: Path, limit: int) -> Any:
    import json

    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from executor.sources import CONFIG_OPTION, GeneratorConfig, GeneratorSource, encode_config

    spark.dataSource.register(GeneratorSource)
    columns = tuple((f.name, f.type.value) for f in SCHEMA)
    config = GeneratorConfig("hand", "src", "stock", columns, 7, SPARK_RATE, limit,
                             shapes.parse_start("2024-01-01T00:00:00Z"),
                             str(run_dir / "anchor"), 2)
    ticks = (spark.readStream.format(GeneratorSource.name())
             .option(CONFIG_OPTION, encode_config(config)).load()
             .select("symbol", "ts", F.unix_micros("ts").alias("t"), "price")
             .withWatermark("ts", "0 seconds"))  # the pace sets event time: 0.2 s per 40k rows

    def tick(key: tuple, frames: Any, state: Any) -> Any:
        kept = json.loads(state.get[0]) if state.exists else {"rows": [], "done": 0}
        wm = state.getCurrentWatermarkMs() * 1000
        new = [[int(t), float(p)] for f in frames for t, p in zip(f["t"], f["price"])
               if t > kept["done"]]
        rows = sorted(kept["rows"] + new)
        ready = [r for r in rows if r[0] <= wm]
        found, rest = _hand_tick_state(ready, wm)
        kept = {"rows": rest + [r for r in rows if r[0] > wm], "done": max(kept["done"], wm)}
        if kept["rows"]:
            state.update((json.dumps(kept),))
            state.setTimeoutTimestamp(max(wm // 1000, -(-kept["rows"][0][0] // 1000), 1))
        else:
            state.remove()
        yield pd.DataFrame([(key[0], m[0], m[1], m[2], int(m[3])) for m in found],
                           columns=["symbol", "start", "bottom", "top", "falls"])

    out = ticks.groupBy("symbol").applyInPandasWithState(
        tick, "symbol string, start long, bottom double, top double, falls long",
        "rows string", "append", GroupStateTimeout.EventTimeTimeout)
    sink = run_dir / "hand.jsonl"

    def append(batch: Any, batch_id: int) -> None:
        rows = batch.collect()
        if rows:
            with open(sink, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r.asDict()) + "\n" for r in rows))

    return [((out.writeStream.foreachBatch(append)
              .option("checkpointLocation", str(run_dir / "ck")).start()), sink)]


def _elastiq_query(spark: Any, run_dir: Path, limit: int, after: str,
                   share: tuple[int, int] | None) -> tuple[Any, Path]:
    from executor.runtime import TaskRuntime

    name = "" if share is None else f"-{share[0]}"
    rt = TaskRuntime(spark, query_id="bench", task_id=f"cep-{run_dir.name}{name}",
                     checkpoint_dir=str(run_dir / f"ck{name}"))
    rt.generator(op="ticks", output="stock", schema=SCHEMA, shape="stock", seed=7,
                 rate=SPARK_RATE, limit=limit, start="2024-01-01T00:00:00Z")
    rt.pattern(op="tick", input="stock", output="shapes", time="ts", partition_by=("symbol",),
               pattern="A B+ C D+", within="30 seconds", watermark="0 seconds",
               defines=DEFINES, measures=MEASURES, max_partial=100_000, after_match=after,
               share=share)
    sink = run_dir / f"elastiq{name}.jsonl"
    rt.file_sink(op="sink", input="shapes", path=str(sink))
    return rt.query, sink


def start_elastiq(spark: Any, run_dir: Path, limit: int) -> list[tuple[Any, Path]]:
    return [_elastiq_query(spark, run_dir, limit, "skip-past-last-row", None)]


def start_next_row(spark: Any, run_dir: Path, limit: int) -> list[tuple[Any, Path]]:
    return [_elastiq_query(spark, run_dir, limit, "skip-to-next-row", None)]


def start_two_shares(spark: Any, run_dir: Path, limit: int) -> list[tuple[Any, Path]]:
    """The two instances of the partitioned plan, as two concurrent queries (as two tasks)."""
    return [_elastiq_query(spark, run_dir, limit, "skip-to-next-row", (i, 2)) for i in (1, 2)]


def _drained(query: Any, limit: int) -> bool:
    progress = query.lastProgress
    if not progress or progress["numInputRows"] != 0:
        return False
    return str(limit) in str(progress["sources"][0]["endOffset"]) and \
        not query.status["isDataAvailable"]


def spark_side(spark: Any, start: Callable[..., Any], run_dir: Path, limit: int
               ) -> tuple[float, int]:
    run_dir.mkdir(parents=True)
    began = time.perf_counter()
    queries = start(spark, run_dir, limit)
    try:
        deadline = began + 900
        while not all(_drained(q, limit) for q, _ in queries) and \
                time.perf_counter() < deadline:
            for query, _ in queries:
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
            time.sleep(0.2)
        took = time.perf_counter() - began
    finally:
        for query, _ in queries:
            query.stop()
    matches = sum(len(sink.read_text(encoding="utf-8").splitlines())
                  for _, sink in queries if sink.exists())
    return took, matches


def _stage_query(spark: Any, run_dir: Path, limit: int, stage: Stage, fed: Path | None
                 ) -> tuple[Any, Path, int]:
    """Stage `stage` of the pipelined tick pattern as its own query: the first over the
    generator, a later one over the file the stage before wrote (standing for the channel);
    returns the query, its output file and how many input rows drain it."""
    from common.pattern_stages import stage_schema
    from executor.runtime import TaskRuntime

    rt = TaskRuntime(spark, query_id="bench", task_id=f"cep-{run_dir.name}-s{stage.index}",
                     checkpoint_dir=str(run_dir / f"ck-s{stage.index}"))
    if fed is None:
        rt.generator(op="ticks", output="in", schema=SCHEMA, shape="stock", seed=7,
                     rate=SPARK_RATE, limit=limit, start="2024-01-01T00:00:00Z")
        rows = limit
    else:
        rt.file_source(op="items", output="in", schema=stage_schema([SCHEMA.get("symbol")]),
                       path=str(fed), format="jsonl", rate=None)
        rows = len(fed.read_text(encoding="utf-8").splitlines())
    rt.pattern(op="tick", input="in", output="out", time="ts", partition_by=("symbol",),
               pattern="A B+ C D+", within="30 seconds", watermark="0 seconds",
               defines=DEFINES, measures=MEASURES, max_partial=100_000,
               after_match="skip-to-next-row", stage=(stage.index, stage.count, stage.rows),
               row_schema=SCHEMA)
    sink = run_dir / f"stage-{stage.index}.jsonl"
    rt.file_sink(op="sink", input="out", path=str(sink))
    return rt.query, sink, rows


def spark_pipeline(spark: Any, run_dir: Path, limit: int, stages: int, stage_rows: int
                   ) -> tuple[list[float], int]:
    """The k stages one after the other in the session, each start to drained: their times
    (on k agents the pipeline would take the slowest one's) and the last stage's matches."""
    run_dir.mkdir(parents=True)
    times: list[float] = []
    fed: Path | None = None
    for i in range(1, stages + 1):
        began = time.perf_counter()
        query, sink, rows = _stage_query(spark, run_dir, limit, Stage(i, stages, stage_rows),
                                         fed)
        try:
            deadline = began + 900
            while not _drained(query, rows) and time.perf_counter() < deadline:
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
                time.sleep(0.2)
            times.append(time.perf_counter() - began)
        finally:
            query.stop()
        fed = sink
    assert fed is not None
    return times, len(fed.read_text(encoding="utf-8").splitlines()) if fed.exists() else 0


def spark_comparison(limit: int, repeats: int) -> int:
    import tempfile

    from executor.spark_session import build_session

    work = Path(tempfile.mkdtemp(prefix="bench-cep-"))
    spark = build_session(2, "bench-cep", str(work / "state"))
    seconds: dict[str, list[float]] = defaultdict(list)
    found: dict[str, set[int]] = defaultdict(set)
    try:
        spark_side(spark, start_elastiq, work / "warm-e", 2000)  # JVM and workers warm
        spark_side(spark, start_handwritten, work / "warm-h", 2000)
        for turn in range(repeats):
            order = [("elastiq", start_elastiq), ("hand-written", start_handwritten),
                     (NEXT_ONE, start_next_row), (NEXT_TWO, start_two_shares)]
            for name, start in (order if turn % 2 == 0 else order[::-1]):
                took, matches = spark_side(spark, start, work / f"{name}-{turn}", limit)
                seconds[name].append(took)
                found[name].add(matches)
            for stages, stage_rows in PIPELINES:
                times, matches = spark_pipeline(spark, work / f"pipe{stages}-{turn}", limit,
                                                stages, stage_rows)
                for i, took in enumerate(times, 1):
                    seconds[f"{_piped(stages, stage_rows)}, stage {i}"].append(took)
                seconds[f"{_piped(stages, stage_rows)} on {stages} agents (slowest stage)"
                        ].append(max(times))
                seconds[f"{_piped(stages, stage_rows)} on one core (sum)"].append(sum(times))
                for name in [n for n in seconds if n.startswith(_piped(stages, stage_rows))]:
                    found[name].add(matches)
    finally:
        spark.stop()
    if found["elastiq"] != found["hand-written"] or len(found["elastiq"]) != 1 or \
            found["elastiq"] == {0} or found[NEXT_ONE] != found[NEXT_TWO] or \
            len(found[NEXT_ONE]) != 1 or any(
                found[n] != found[NEXT_ONE] for n in found if n.startswith("elastiq pipeline")):
        print(f"MISMATCH: matches per run {dict(found)}")
        return 1
    base = median_of(seconds["hand-written"])
    one = median_of(seconds[NEXT_ONE])
    table = [(name, fmt(limit / median_of(s)), next(iter(found[name])),
              fmt(next(iter(found[name])) / median_of(s)),
              f"{ratio(median_of(s), base):.2f}x", f"{ratio(median_of(s), one):.2f}x")
             for name, s in seconds.items()]
    print(f"Spark, tick pattern over {limit} rows, medians of {repeats} (start to drained, the "
          f"queries' own start included)")
    print(format_table(("side", "rows/s", "matches", "matches/s", "time vs hand-written",
                        "time vs one instance (next row)"), table))
    return 0


NEXT_ONE = "elastiq, skip-to-next-row, one instance"
PIPELINES = ((2, 2), (3, 2))  # (stages, stage-rows) of the tick pattern's pipelines on Spark


def _piped(stages: int, stage_rows: int) -> str:
    return f"elastiq pipeline k={stages} (stage-rows {stage_rows})"
NEXT_TWO = "elastiq, skip-to-next-row, k=2 instances (two queries)"


def partitioned(rows: dict[str, list[dict]], repeats: int, label: str,
                workload: tuple[str, tuple, int]) -> int:
    """One instance with skip-to-next-row against its two shares, each timed on its own."""
    sides = {"one instance": lambda: generic(rows, 500, "skip-to-next-row", None, workload),
             "k=2, instance 1": lambda: generic(rows, 500, "skip-to-next-row", (1, 2), workload),
             "k=2, instance 2": lambda: generic(rows, 500, "skip-to-next-row", (2, 2), workload)}
    seconds: dict[str, list[float]] = defaultdict(list)
    results: dict[str, list[tuple]] = {}
    for _ in range(repeats):
        for name, fn in sides.items():
            took, results[name] = timed(fn)
            seconds[name].append(took)
    together = results["k=2, instance 1"] + results["k=2, instance 2"]
    if sorted(together) != sorted(results["one instance"]):
        print(f"MISMATCH: the two instances found {len(together)} matches, one instance "
              f"{len(results['one instance'])}")
        return 1
    count = sum(len(own) for own in rows.values())
    one = median_of(seconds["one instance"])
    slower = max(median_of(seconds["k=2, instance 1"]), median_of(seconds["k=2, instance 2"]))
    table = [(name, fmt(count / median_of(s)), len(results[name]),
              fmt(len(results[name]) / median_of(s)), f"{ratio(median_of(s), one):.2f}x")
             for name, s in seconds.items()]
    table.append(("k=2 on two cores (the slower instance)", fmt(count / slower),
                  len(together), fmt(len(together) / slower), f"{ratio(slower, one):.2f}x"))
    print(f"partitioned repetition, {label} over {count} rows, skip-to-next-row, batches of "
          f"500 + state JSON, medians of {repeats}")
    print(format_table(("matcher", "rows/s", "matches", "matches/s", "time vs one instance"),
                       table))
    return 0


# --- the pipeline P+ = P v (P P+) over k stages (rewrite_rules/pattern-pipelining.rule) --------

def _tick_program(workload: tuple[str, tuple, int]) -> Any:
    pattern, defines, within = workload
    chosen = MEASURES if pattern == "A B+ C D+" else MEASURES[:1]
    return build_program("stock", SCHEMA, "ts", pattern, defines, chosen, within,
                         after_match="skip-to-next-row")[0]


def stage_calls(rows: dict[str, list[dict]], program: Any, stage: Stage,
                fed: dict[str, list[list[Item]]] | None) -> dict[str, list[list[Item]]]:
    """One stage over every symbol, its state through JSON between calls: the first over
    batches of 500 rows (watermark: the batch's last time, as `generic` feeds one instance, so
    both leave the same attempts open at the end), a later one over the calls of the
    stage before, each call's items through their text as a channel carries them. Returns each
    symbol's calls."""
    out: dict[str, list[list[Item]]] = {}
    for symbol, own in rows.items():
        matcher, calls = StageMatcher(program, stage), []
        if fed is None:
            for i in range(0, len(own), 500):
                part = own[i:i + 500]
                calls.append(matcher.feed_rows(part, part[-1]["ts"]))
                matcher = StageMatcher.from_json(program, stage, matcher.to_json())
        else:
            for call in fed[symbol]:
                items = [Item.decode(item.encode(), item.time, program) for item in call]
                calls.append(matcher.feed_items(items, None))
                matcher = StageMatcher.from_json(program, stage, matcher.to_json())
        out[symbol] = calls
    return out


def pipelined(rows: dict[str, list[dict]], repeats: int, label: str,
              workload: tuple[str, tuple, int], stages: int, stage_rows: int) -> int:
    """One instance with skip-to-next-row against the k stages of its pipeline, each stage
    timed on its own over what the stage before wrote (on k cores the pipeline takes the
    slowest stage's time); the last stage's matches must be exactly the one instance's."""
    program = _tick_program(workload)
    seconds: dict[str, list[float]] = defaultdict(list)
    one: list[tuple] = []
    found: list[tuple] = []
    handed = 0
    for _ in range(repeats):
        took, one = timed(lambda: generic(rows, 500, "skip-to-next-row", None, workload))
        seconds["one instance"].append(took)
        fed = None
        for i in range(1, stages + 1):
            began = time.perf_counter()
            fed = stage_calls(rows, program, Stage(i, stages, stage_rows), fed)
            seconds[f"stage {i} of {stages}"].append(time.perf_counter() - began)
            handed = max(handed, sum(1 for calls in fed.values() for call in calls
                                     for item in call if item.kind == "attempt"))
        assert fed is not None
        found = [(symbol,) + tuple(item.body) for symbol, calls in fed.items()
                 for call in calls for item in call]
    if sorted(found) != sorted(one):
        print(f"MISMATCH: the pipeline found {len(found)} matches, one instance {len(one)}")
        return 1
    count = sum(len(own) for own in rows.values())
    base = median_of(seconds["one instance"])
    slowest = max(median_of(s) for name, s in seconds.items() if name.startswith("stage"))
    total = sum(median_of(s) for name, s in seconds.items() if name.startswith("stage"))
    table = [(name, fmt(count / median_of(s)), f"{ratio(median_of(s), base):.2f}x")
             for name, s in seconds.items()]
    table.append((f"k={stages} on {stages} cores (the slowest stage)", fmt(count / slowest),
                  f"{ratio(slowest, base):.2f}x"))
    table.append((f"k={stages} on one core (the stages' sum)", fmt(count / total),
                  f"{ratio(total, base):.2f}x"))
    print(f"pipelined repetition, {label} over {count} rows, {stages} stages of {stage_rows} "
          f"rows, skip-to-next-row, {len(one)} matches, {handed} partial matches handed on, "
          f"medians of {repeats}")
    print(format_table(("matcher", "rows/s", "time vs one instance"), table))
    return 0


def timed(fn: Callable[[], list[tuple]]) -> tuple[float, list[tuple]]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spark", action="store_true")
    parser.add_argument("--spark-rows", type=int, default=60_000)
    parser.add_argument("--long-rows", type=int, default=6_000)
    args = parser.parse_args(argv)
    rows = stock_rows(args.rows)
    sides = {"generic, one batch": lambda: generic(rows, None),
             "generic, batches of 500 + state JSON": lambda: generic(rows, 500),
             "hand-written tick matcher": lambda: by_hand(rows, None)}
    seconds: dict[str, list[float]] = defaultdict(list)
    results: dict[str, list[tuple]] = {}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            took, results[name] = timed(fn)
            seconds[name].append(took)
    reference = sorted(results["hand-written tick matcher"])
    for name, found in results.items():
        if sorted(found) != reference:
            print(f"MISMATCH: {name} found {len(found)} matches, the hand-written matcher "
                  f"{len(reference)}")
            return 1
    base = median_of(seconds["hand-written tick matcher"])
    table = [(name, fmt(args.rows / median_of(s)), fmt(len(reference) / median_of(s)),
              f"{ratio(median_of(s), base):.1f}x") for name, s in seconds.items()]
    print(f"tick pattern AB+CD+ over {args.rows} stock rows (8 symbols), {len(reference)} "
          f"matches, medians of {args.repeats}")
    print(format_table(("matcher", "rows/s", "matches/s", "time vs hand-written"), table))
    if partitioned(rows, args.repeats, "tick AB+CD+", ("A B+ C D+", DEFINES, WITHIN_US)):
        return 1
    if partitioned(stock_rows(args.long_rows), args.repeats, "long partial matches "
                   "A B+ C within 1 s", LONG):
        return 1
    for stages, stage_rows in ((2, 2), (3, 2)):
        if pipelined(rows, args.repeats, "tick AB+CD+", ("A B+ C D+", DEFINES, WITHIN_US),
                     stages, stage_rows):
            return 1
    for stages, stage_rows in ((2, 30), (3, 20)):
        if pipelined(stock_rows(args.long_rows), args.repeats, "long partial matches A B+ C "
                     "within 1 s", LONG, stages, stage_rows):
            return 1
    return spark_comparison(args.spark_rows, args.repeats) if args.spark else 0


if __name__ == "__main__":
    raise SystemExit(main())
