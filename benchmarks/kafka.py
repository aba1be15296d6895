"""Kafka -> filter -> Kafka: Elastiq against the same query written by hand in PySpark.

Owns this benchmark only (not a test). One real broker (`elastiq.kafka_broker`, KRaft, on
127.0.0.1), one SparkSession (`executor.spark_session.build_session`, 2 cores), readings as
JSON records `{"sensor", "temp", "seq", "sent"}` (half above 30).

- Elastiq: a spec (kafka-source -> filter temp > 30 -> kafka-sink) compiled and its one task
  started as an executor starts it (`bench_util.start_task`), with `delivery="exactly-once"`
  (the transactional sink, docs/kafka.md) and `delivery="at-least-once"`.
- Elastiq, real-time: the same spec without the micro-batch bound, with
  `delivery="at-least-once"` and `mode="real-time"` on its kafka-sink: the compiler puts the
  task in Spark's real-time mode and the executor builds it JVM-only
  (`executor.kafka_realtime`, checkpoint interval 10 s). Latency only, as the hand-written
  real-time side.
- Hand-written (the baseline): Spark's own Kafka source and sink, `from_json`, `filter`,
  `to_json` (at least once: Spark's Kafka sink has no transactions).
- Hand-written in real-time mode: the same query under Spark's real-time trigger
  (`Trigger.RealTime`, in the JVM of Spark 4.1.4, called through py4j since pyspark 4.1 has no
  Python spelling for it; its Kafka connector 4.1.3 supports it): long-running tasks read,
  filter and write each record as it comes, with no micro-batch between. Latency only (its
  progress reports come once per 5-minute checkpoint interval, so the throughput runs'
  span is not measured for it).

Measured, medians over repeats (>= 3; --quick: 1 short repeat):
- throughput in and out: N records produced beforehand, read in micro-batches of at most
  `--batch` records (both sides); records read (in) and written (out) per second of wall time
  from the start of the first data batch to the end of the last (Spark's progress reports).
  Honesty: the output records are read back (`read_committed`) and their `seq` multiset must
  equal a plain-Python oracle (every input with temp > 30 exactly once; at least once for the
  at-least-once sides: nothing missing).
- the latency runs' micro-batches: median duration and addBatch ms (after the first).
- end-to-end latency at `--rate` records/s: once the query has passed WARMUP_RECORDS through
  (it runs and has caught up), a paced producer stamps each record's `sent` (wall ms) as it
  hands it to the producer; a consumer reading the output topic as written (`read_committed`
  for exactly once, else `read_uncommitted`) takes `received - sent` per record; p50 and p99
  per repeat, the first 2 s of each run left out. Every output is checked against the oracle
  (nothing missing) as in the throughput runs.

Goals (issue 30) are printed beside the figures. The latency goal is set for real-time mode:
the micro-batch sides are expected to miss it; the "elastiq real-time" side is the one it is
for, and the hand-written real-time side shows what Spark here gives without Elastiq.

    python benchmarks/kafka.py [--quick] [--repeats N] [--records N] [--rate R]
    python benchmarks/kafka.py --kill broker|executor [--records N] [--batch N] [--kills K]
                               [--repeats N]                   (benchmarks/kafka_kill.py)
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench_util import exit_on_sigterm, fmt, format_table, median_of, percentile, ratio, \
    start_task, use_repo_on_path

use_repo_on_path()

from testkit.waiting import poll  # noqa: E402

SPEC = """<dataflow name="kbench">
  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="temp" type="double"/>
    <column name="seq" type="int"/>
    <column name="sent" type="double"/>
  </type>
  <operator name="src" type="kafka-source">
    <param name="bootstrap" value="{bootstrap}"/>
    <param name="topic" value="{source}"/>
    <param name="max-records-per-batch" value="{batch}"/>
    <output name="raw" type="reading"/>
  </operator>
  <operator name="hot" type="filter">
    <input name="raw"/>
    <param name="condition" value="raw.temp &gt; 30"/>
    <output name="hotReadings" type="reading"/>
  </operator>
  <operator name="out" type="kafka-sink">
    <input name="hotReadings"/>
    <param name="bootstrap" value="{bootstrap}"/>
    <param name="topic" value="{out}"/>
    <param name="key-column" value="sensor"/>
    <param name="delivery" value="{delivery}"/>
  </operator>
</dataflow>
"""

REALTIME = "hand-written real-time"
ELASTIQ_REALTIME = "elastiq real-time"
SIDES = ("elastiq exactly-once", "elastiq at-least-once", ELASTIQ_REALTIME, REALTIME,
         "hand-written (Spark's sink)")
LATENCY_ONLY = (ELASTIQ_REALTIME, REALTIME)  # progress only once per checkpoint interval
THROUGHPUT_SIDES = ("elastiq exactly-once", "elastiq at-least-once")  # against the last side
WARMUP_RECORDS = range(10**9, 10**9 + 200)  # before a latency run, seqs apart from its own
LATENCY_GOAL = "p50 <= 50 ms, p99 <= 200 ms (real-time mode)"
THROUGHPUT_GOAL = 0.9  # of the hand-written side


def reading(seq: int) -> dict[str, Any]:
    return {"sensor": f"s{seq % 7}", "temp": float((seq * 37) % 60), "seq": seq,
            "sent": time.time() * 1000.0}


def oracle(seqs: range) -> Counter:
    """Every input `seq` whose temperature is above 30, once (plain Python)."""
    return Counter(s for s in seqs if (s * 37) % 60 > 30)


def new_topic(bootstrap: str, prefix: str, partitions: int = 2) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def produce(bootstrap: str, topic: str, seqs: range, rate: float | None = None) -> None:
    """Records `seqs` into `topic`, as fast as possible or paced at `rate` per second."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1 if rate else 20,
                         "enable.idempotence": True})
    start = time.monotonic()
    for i, seq in enumerate(seqs):
        if rate:
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        for _ in range(1000):
            try:
                producer.produce(topic, json.dumps(reading(seq)).encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0, "records left unsent"


class OutputReader:
    """Reads an output topic as written, in a thread: each record's seq and its latency."""

    def __init__(self, bootstrap: str, topic: str, committed: bool) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "fetch.wait.max.ms": 5})
        self.consumer.subscribe([topic])
        self.seqs: Counter = Counter()
        self.latencies: list[tuple[float, float]] = []  # (sent ms, latency ms)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self.consumer.consume(1000, 0.05):
                now = time.time() * 1000.0
                value = message.value()
                if message.error() or value is None:
                    continue
                row = json.loads(value)
                self.seqs[row["seq"]] += 1
                self.latencies.append((row["sent"], now - row["sent"]))

    def wait_for(self, count: int, timeout: float) -> bool:
        """Whether `count` records arrived within `timeout` s (`testkit.waiting.poll`)."""
        return bool(poll(lambda: sum(self.seqs.values()) >= count, timeout, 0.1))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def hand_written(spark: Any, bootstrap: str, source: str, out: str, batch: int,
                 checkpoint: Path, realtime: bool = False) -> Any:
    """The same query without Elastiq: Spark's own Kafka source and sink (`realtime`: under
    Spark's real-time trigger, through py4j; no batch bound, which that mode refuses)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    schema = StructType([StructField("sensor", StringType()), StructField("temp", DoubleType()),
                         StructField("seq", LongType()), StructField("sent", DoubleType())])
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest"))
    raw = (reader if realtime else reader.option("maxOffsetsPerTrigger", str(batch))).load()
    rows = raw.select(F.from_json(F.col("value").cast("string"), schema).alias("r")).select("r.*")
    hot = rows.filter(F.col("temp") > 30)
    records = hot.select(F.col("sensor").alias("key"),
                         F.to_json(F.struct(*schema.fieldNames())).alias("value"))
    writer = (records.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", out).option("checkpointLocation", str(checkpoint)))
    if realtime:
        writer = writer.outputMode("update")
        trigger = spark._jvm.org.apache.spark.sql.streaming.Trigger.RealTime("5 minutes")
        writer._jwrite = writer._jwrite.trigger(trigger)
    return writer.start()


@dataclass
class Run:
    """One side's query and how to stop it."""

    query: Any
    stop: Callable[[], None]


def real_time_spec(bootstrap: str, source: str, out: str) -> str:
    """SPEC in real-time mode: no micro-batch bound, at least once, mode="real-time"."""
    spec = SPEC.format(bootstrap=bootstrap, source=source, out=out, batch=1,
                       delivery="at-least-once")
    spec = spec.replace('    <param name="max-records-per-batch" value="1"/>\n', "")
    return spec.replace('    <param name="delivery" value="at-least-once"/>\n',
                        '    <param name="delivery" value="at-least-once"/>\n'
                        '    <param name="mode" value="real-time"/>\n')


def start_side(spark: Any, side: str, bootstrap: str, source: str, out: str, batch: int,
               run_dir: Path) -> Run:
    if side.startswith("hand-written"):
        query = hand_written(spark, bootstrap, source, out, batch, run_dir / "checkpoint",
                             realtime=side == REALTIME)
        return Run(query, query.stop)
    if side == ELASTIQ_REALTIME:
        spec = real_time_spec(bootstrap, source, out)
    else:
        spec = SPEC.format(bootstrap=bootstrap, source=source, out=out, batch=batch,
                           delivery=side.split()[-1])
    runner = start_task(spark, spec, run_dir / "kbench.xml", run_dir, "kbench", run_dir)
    return Run(runner.runtime.query, runner.stop)


def data_span_s(progress: list[dict[str, Any]]) -> tuple[int, float]:
    """Records read and the wall seconds from the first data batch's start to the last's end."""
    from datetime import datetime

    data = [p for p in progress if p.get("numInputRows", 0) > 0]
    if not data:
        return 0, float("nan")

    def at(p: dict[str, Any]) -> float:
        return datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()

    end = at(data[-1]) + data[-1]["durationMs"].get("triggerExecution", 0) / 1000.0
    return sum(p["numInputRows"] for p in data), end - at(data[0])


def throughput(spark: Any, side: str, bootstrap: str, source: str, records: int, batch: int,
               base: Path) -> tuple[float, float, str]:
    """(records in per s, records out per s, honesty verdict) of one side over `source`."""
    out = new_topic(bootstrap, "tout")
    reader = OutputReader(bootstrap, out, committed=True)
    run = start_side(spark, side, bootstrap, source, out, batch,
                     Path(tempfile.mkdtemp(dir=base)))
    expected = oracle(range(records))
    try:
        reader.wait_for(sum(expected.values()), timeout=600)
        for _ in range(600):  # the last batch's progress report follows its sink call
            read, _span = data_span_s(run.query.recentProgress)
            if read >= records:
                break
            time.sleep(0.1)
        read, span = data_span_s(run.query.recentProgress)
        time.sleep(1.0)  # extra records (duplicates) would show
    finally:
        run.stop()
        reader.close()
    got = reader.seqs
    exact = got == expected
    verdict = "exact" if exact else (
        "at least once" if not (expected - got) else f"{sum((expected - got).values())} missing")
    return ratio(read, span), ratio(sum(got.values()), span), verdict


def batch_phases(progress: list[dict[str, Any]]) -> tuple[float, float]:
    """Median ms of the data micro-batches (after the first): the whole batch, and addBatch
    (reading, parsing, filtering and the sink's call)."""
    data = [p["durationMs"] for p in progress if p.get("numInputRows", 0) > 0][1:]
    return (median_of([float(d.get("triggerExecution", 0)) for d in data]),
            median_of([float(d.get("addBatch", 0)) for d in data]))


def latency(spark: Any, side: str, bootstrap: str, rate: float, seconds: float, base: Path,
            warmup_s: float = 2.0) -> tuple[float, float, float, float, str]:
    """(p50, p99) ms from a record's produce time to its output being readable, the median
    batch and addBatch ms of the run, and its output's verdict against the oracle."""
    source, out = new_topic(bootstrap, "lin"), new_topic(bootstrap, "lout")
    reader = OutputReader(bootstrap, out, committed=side.endswith("exactly-once"))
    run = start_side(spark, side, bootstrap, source, out, 100_000,
                     Path(tempfile.mkdtemp(dir=base)))
    n = int(rate * seconds)
    expected = oracle(WARMUP_RECORDS) + oracle(range(n))
    try:
        produce(bootstrap, source, WARMUP_RECORDS)
        reader.wait_for(sum(oracle(WARMUP_RECORDS).values()), timeout=300)
        started = time.time() * 1000.0
        produce(bootstrap, source, range(n), rate=rate)
        reader.wait_for(sum(expected.values()), timeout=120)
        batch, add = batch_phases(run.query.recentProgress)
    finally:
        run.stop()
        reader.close()
    late = [lat for sent, lat in reader.latencies if sent >= started + warmup_s * 1000.0]
    missing = sum((expected - reader.seqs).values())
    verdict = "exact" if reader.seqs == expected else (
        "at least once" if not missing else f"{missing} missing")
    return percentile(late, 50), percentile(late, 99), batch, add, verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000,
                        help="records of the throughput runs")
    parser.add_argument("--batch", type=int, default=20_000, help="records per micro-batch")
    parser.add_argument("--rate", type=float, default=2000.0, help="records/s of latency runs")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of a latency run")
    parser.add_argument("--kill", choices=("broker", "executor"),
                        help="instead: SIGKILL the broker, or the task's process, during an "
                             "exactly-once run of --records (default here 1M) and check the "
                             "output (benchmarks/kafka_kill.py)")
    parser.add_argument("--kills", type=int, default=3, help="--kill executor: how many")
    args = parser.parse_args()
    exit_on_sigterm()
    if args.kill:
        kill_scenario(args.kill, args.records if args.records != 200_000 else 1_000_000,
                      args.batch, args.kills, 1 if args.quick else args.repeats)
        return
    repeats, records, seconds = args.repeats, args.records, args.seconds
    if args.quick:
        repeats, records, seconds = 1, 40_000, 6.0

    base = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    try:
        figures, verdicts = measure(base, args.batch, args.rate, repeats, records, seconds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_report(figures, verdicts, records, args.batch, args.rate, repeats)


def kill_scenario(kind: str, records: int, batch: int, kills: int, repeats: int) -> None:
    """`--kill broker|executor`, `repeats` times on the same input: the exactly-once task over
    `records` records, the broker SIGKILLed mid-run and started again, or the task's process
    SIGKILLed `kills` times (`kafka_kill`); each run into a topic of its own."""
    from elastiq.kafka_broker import KafkaBroker
    from kafka_kill import kill_broker_run, kill_executor_run

    base = Path(tempfile.mkdtemp(prefix="kafka-kill-bench-"))
    try:
        with KafkaBroker(base / "kafka") as broker:
            source = new_topic(broker.bootstrap, "kin")
            produce(broker.bootstrap, source, range(records))

            def spec_of(source: str, out: str, batch: int) -> str:
                return SPEC.format(bootstrap=broker.bootstrap, source=source, out=out,
                                   batch=batch, delivery="exactly-once")

            def reader_of(out: str) -> OutputReader:
                return OutputReader(broker.bootstrap, out, committed=True)

            expected = oracle(range(records))
            for repeat in range(repeats):
                print(f"run {repeat + 1} of {repeats}:", flush=True)
                if kind == "executor":
                    out = new_topic(broker.bootstrap, "kout")
                    kill_executor_run(spec_of(source, out, batch), reader_of(out), expected,
                                      batch, kills, base, seed=7 + repeat)
                    continue
                from executor.spark_session import build_session

                spark = build_session(2, "kafka-kill-bench", str(base / "state"))
                kill_broker_run(spark, broker, spec_of, new_topic, reader_of, expected, source,
                                batch, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def measure(base: Path, batch: int, rate: float, repeats: int, records: int, seconds: float
            ) -> tuple[dict[str, dict[str, list[float]]], dict[str, set[str]]]:
    """Every side's figures per repeat, and its outputs' verdicts against the oracle."""
    from elastiq.kafka_broker import KafkaBroker
    from executor.spark_session import build_session

    spark = build_session(2, "kafka-bench", str(base / "state"))
    with KafkaBroker(base / "kafka") as broker:
        bootstrap = broker.bootstrap
        source = new_topic(bootstrap, "tin")
        produce(bootstrap, source, range(records))
        figures: dict[str, dict[str, list[float]]] = {
            side: {"in": [], "out": [], "p50": [], "p99": [], "batch": [], "add": []}
            for side in SIDES}
        verdicts: dict[str, set[str]] = {side: set() for side in SIDES}
        for repeat in range(repeats):
            order = SIDES if repeat % 2 == 0 else tuple(reversed(SIDES))
            for side in order:
                rin = rout = float("nan")
                if side not in LATENCY_ONLY:
                    rin, rout, verdict = throughput(spark, side, bootstrap, source, records,
                                                    batch, base)
                    verdicts[side].add(verdict)
                p50, p99, mb, add, verdict = latency(spark, side, bootstrap, rate, seconds, base)
                for key, value in (("in", rin), ("out", rout), ("p50", p50), ("p99", p99),
                                   ("batch", mb), ("add", add)):
                    figures[side][key].append(value)
                verdicts[side].add(verdict)
                print(f"repeat {repeat + 1} {side}: in {fmt(rin)}/s out {fmt(rout)}/s "
                      f"p50 {fmt(p50)} ms p99 {fmt(p99)} ms batch {fmt(mb)} ms addBatch {fmt(add)} "
                      f"ms ({verdict})", flush=True)
    return figures, verdicts


def print_report(figures: dict[str, dict[str, list[float]]], verdicts: dict[str, set[str]],
                 records: int, batch: int, rate: float, repeats: int) -> None:
    med = {side: {k: median_of(v) for k, v in f.items()} for side, f in figures.items()}
    base_in = med[SIDES[-1]]["in"]
    rows = [[side, fmt(m["in"]), fmt(m["out"]), fmt(ratio(m["in"], base_in), 2),
             fmt(m["p50"]), fmt(m["p99"]), fmt(m["batch"]), fmt(m["add"]),
             ", ".join(sorted(verdicts[side]))]
            for side, m in med.items()]
    print()
    print(f"Kafka -> filter -> Kafka, medians of {repeats}; throughput over {records:,} records "
          f"in batches of <= {batch:,}; latency at {rate:,.0f} records/s")
    print(format_table(["side", "in rec/s", "out rec/s", "x hand", "p50 ms", "p99 ms",
                        "batch ms", "addBatch ms", "output vs oracle"], rows))
    print()
    print(f"goal throughput: >= {THROUGHPUT_GOAL}x hand-written")
    for side in THROUGHPUT_SIDES:
        x = ratio(med[side]["in"], base_in)
        # three decimals: at two, 0.897 printed as "0.90x -> MISSED"
        print(f"  {side}: {fmt(x, 3)}x -> {'met' if x >= THROUGHPUT_GOAL else 'MISSED'}")
    print(f"goal latency: {LATENCY_GOAL}")
    for side in SIDES:
        met = med[side]["p50"] <= 50 and med[side]["p99"] <= 200
        print(f"  {side}: p50 {fmt(med[side]['p50'])} ms, p99 {fmt(med[side]['p99'])} ms -> "
              f"{'met' if met else 'MISSED'}")
    print(f"  (every side but {', '.join(map(repr, LATENCY_ONLY))} is micro-batch; exactly once "
          "adds a transaction commit per batch and shows results only at the commit)")


if __name__ == "__main__":
    main()
