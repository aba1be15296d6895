"""A task query in Spark's real-time mode: Kafka -> Spark expressions -> Kafka, JVM only.

Owns building the JVM-only parts of a real-time task (`compiler.realtime` decides which tasks
are; docs/kafka.md, "Real-time mode"): the source frame (Spark's Kafka source, each value parsed
by `from_json` with the declared type and a corrupt-record column, records that do not parse
dropped and counted by an `observe` metric, `BAD_METRIC`), and the query (`to_json` of the
rows, Spark's own Kafka sink, at least once, output mode update, `Trigger.RealTime` reached
through py4j since pyspark 4.1 has no Python spelling for it). Also owns counting the dropped
records from the query's progress (`BadRecords`) and `FenceWatch`, which stops the query when a
newer attempt raises the task's fence: a real-time query has no sink call in Python to fence,
so the driver watches instead. No Python UDF, foreachBatch or Python source takes part: user
text only reaches Spark as Column expressions (`executor.expression_lowering`) and options.
Does not own the micro-batch path's parsing or sink (`executor.kafka_io`, `kafka_records`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from common.kafka_params import spark_security_options
from common.types import Schema

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL = "10 seconds"  # a real-time batch's length: checkpoint and progress
BAD_METRIC = "elastiq_bad_records"  # the observe() name of the dropped-record count
UNPARSED = "_elastiq_unparsed"  # from_json's corrupt-record column (a name no spec declares)
FENCE_POLL_S = 0.25


def unparsed_column(schema: Schema) -> str:
    """The corrupt-record column's name: one the declared type does not use (pure)."""
    name = UNPARSED
    while schema.get(name) is not None:
        name += "_"
    return name


def parse_options(corrupt: str) -> dict[str, str]:
    """from_json's options: a value that does not parse leaves its text in `corrupt` (pure)."""
    return {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}


def source_frame(raw: Any, value_schema: Schema, metadata: Iterable[tuple[str, str]],
                 declared: Schema, metric: str = BAD_METRIC) -> Any:
    """The declared rows of Spark's Kafka source frame `raw`: values parsed by `from_json`,
    metadata columns (record field, declared column) from the record; a record whose value is
    absent, not a JSON object, or has a value of another type is dropped and counted in the
    observed metric `metric` (`bad`, `records`)."""
    from pyspark.sql import functions as F

    corrupt = unparsed_column(value_schema)
    ddl = ", ".join(filter(None, (value_schema.ddl(), f"`{corrupt}` string")))
    parsed = raw.select(
        F.from_json(F.col("value").cast("string"), ddl, parse_options(corrupt)).alias("r"),
        *(_metadata(F.col(f"`{field}`"), field).alias(column) for field, column in metadata))
    bad = F.col("r").isNull() | F.col(f"r.`{corrupt}`").isNotNull()
    observed = parsed.observe(metric, F.sum(F.when(bad, 1).otherwise(0)).cast("bigint")
                              .alias("bad"), F.count(F.lit(1)).alias("records"))
    taken = {column for _, column in metadata}
    return observed.filter(~bad).select(*(
        F.col(f"`{f.name}`") if f.name in taken else F.col(f"r.`{f.name}`").alias(f.name)
        for f in declared))


def _metadata(column: Any, field: str) -> Any:
    if field in ("partition", "offset"):
        return column.cast("bigint")
    if field == "timestamp":
        return column  # Spark's Kafka source gives it as a timestamp already
    return column.cast("string")  # key (bytes as text), topic


@dataclass(frozen=True)
class SinkSettings:
    bootstrap: str
    topic: str
    key_column: str | None
    security: tuple[tuple[str, str], ...] = ()


def records(df: Any, schema: Schema, key_column: str | None) -> Any:
    """Each row as a record: value = a JSON object of the columns in order (nulls written),
    key = the key column as text."""
    from pyspark.sql import functions as F

    value = F.to_json(F.struct(*(F.col(f"`{n}`") for n in schema.names)),
                      {"ignoreNullFields": "false"}).alias("value")
    if key_column is None:
        return df.select(value)
    return df.select(F.col(f"`{key_column}`").cast("string").alias("key"), value)


def start_query(spark: Any, df: Any, schema: Schema, sink: SinkSettings, *, name: str,
                checkpoint: str, interval: str = CHECKPOINT_INTERVAL) -> Any:
    """Start the query under Spark's real-time trigger (through py4j), output mode update."""
    writer = (records(df, schema, sink.key_column).writeStream.format("kafka")
              .option("kafka.bootstrap.servers", sink.bootstrap).option("topic", sink.topic)
              .options(**spark_security_options(dict(sink.security)))
              .option("checkpointLocation", checkpoint).queryName(name).outputMode("update"))
    trigger = spark._jvm.org.apache.spark.sql.streaming.Trigger.RealTime(interval)
    writer._jwrite = writer._jwrite.trigger(trigger)
    return writer.start()


@dataclass
class BadRecords:
    """The records a real-time query dropped, summed over its progress reports (each batch
    once, by batch id; `recentProgress` keeps only the last reports, so call `add` often)."""

    metric: str = BAD_METRIC
    bad: int = 0
    records: int = 0
    _seen: set[tuple[str, int]] = field(default_factory=set)

    def add(self, progress: Iterable[Mapping[str, Any]]) -> int:
        for p in progress:
            key = (str(p.get("runId")), int(p.get("batchId", -1)))
            observed = (p.get("observedMetrics") or {}).get(self.metric)
            if observed is None or key in self._seen:
                continue
            self._seen.add(key)
            values = observed.asDict() if hasattr(observed, "asDict") else dict(observed)
            self.bad += int(values.get("bad") or 0)  # (a Row from Spark's progress)
            self.records += int(values.get("records") or 0)
        return self.bad


class FenceWatch:
    """Stops the query once `superseded()` says a newer attempt raised the task's fence."""

    def __init__(self, superseded: Callable[[], bool], stop: Callable[[], None],
                 poll_s: float = FENCE_POLL_S) -> None:
        self.superseded, self.stop_query, self.poll_s = superseded, stop, poll_s
        self.fenced = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="real-time-fence", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.poll_s):
            if self.superseded():
                self.fenced = True
                log.warning("a newer attempt raised the fence: stopping the real-time query")
                self.stop_query()
                return

    def close(self) -> None:
        self._done.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
