"""Kafka in and out of a task query: Spark's Kafka source options and the exactly-once sink.

Owns the options a `kafka-source` gives Spark's own Kafka source (`format("kafka")`, the
connector `scripts/setup.sh --kafka` fetched; its offsets live in the task's Spark checkpoint,
so a restarted task resumes at the batch Spark last planned), the security settings read from a
properties file at open time, and `KafkaSink`, the foreachBatch sink of a `kafka-sink`.

The sink's protocol for exactly once (docs/kafka.md says it in full): one transactional
producer per sink and attempt, its `transactional.id` derived from query, task and operator (the
same for every attempt, so a new attempt's `init_transactions` fences an older one's producer
and aborts its open transaction); each micro-batch b is one transaction holding the batch's
records and, through `send_offsets_to_transaction`, the mark "b written by run R" (the
committed offset b + 1 with metadata R, of group = the transactional id, on partition 0 of the
output topic). The mark commits atomically with the records. Before writing b the sink reads
the mark (once per attempt, after `init_transactions`, then keeps it): a batch at or below a
mark of the same run R (the Spark query id, kept in the checkpoint) was committed before a
crash that came before Spark's own commit, and is skipped. The sink call runs inside the
attempt's fence (`executor.fencing`), so a superseded attempt writes nothing either way.
A transactional call that stalls (librdkafka does not always keep its own timeout when the
broker restarts mid-transaction) is given up after STALL_S and the batch tried again with a
fresh producer, whose `init_transactions` fences the stuck one; only when that stalls too does
the batch fail and the task restart from its checkpoint.
At least once: an idempotent plain producer, flushed before the batch returns.
Under Borealis DPC (`executor.dpc.DpcSink`) a batch's records may carry a mark header and be
preceded by a correction record (`marked_records`), and the batch id the mark records is the
DPC append id (docs/kafka.md, "DPC marks on a Kafka sink").
Does not own record parsing and formatting (`executor.kafka_records`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence, TypeVar

import pyarrow as pa

from common import bounded_call, dpc_view, kafka_partitions
from common.atomic_file import replace_file
from common.kafka_params import (MAX_SECURITY_FILE_CHARS, librdkafka_security, security_properties,
                                 spark_security_options)
from common.kafka_problems import KafkaProblem, advice, problem_of_text
from executor import kafka_handover, kafka_records

log = logging.getLogger(__name__)

MARK_PARTITION = 0
CLIENT_TIMEOUT_S = 60.0
CHECK_TIMEOUT_S = 10.0  # how long a task's start waits for the broker's answer
CHECK_STEP_S = 1.0  # ... asking again each second: a SASL or SSL refusal heard ends it at once
STALL_S = 15.0  # a transactional call not back by then is given up (the broker went away)
FRESH_PRODUCERS = 2  # ... after which a batch is tried again with as many fresh producers
T = TypeVar("T")


@dataclass(frozen=True)
class SourceSettings:
    bootstrap: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    starting_offsets: str
    starting_timestamp_ms: int | None
    max_records: int | None
    security: tuple[tuple[str, str], ...] = ()  # Java's client (Spark's source)
    client_security: tuple[tuple[str, str], ...] = ()  # librdkafka's (the start check)
    share: "Share | None" = None  # an instance's share of the partitions (compiler.kafka_partitions)


@dataclass(frozen=True)
class Share:
    """Instance `share` of `shares` reading its block of the topics' partitions; `pinned` is
    the file in the task's checkpoint folder that keeps the partition list of its first start."""

    share: int
    shares: int
    pinned: str
    handover: str | None = None  # a rescale's handover for it (`executor.kafka_handover`)


def source_options(s: SourceSettings,
                   assigned: Sequence[kafka_partitions.Partition] | None = None) -> dict[str, str]:
    """Spark Kafka source options (pure); with `assigned`, only those partitions (Spark's
    `assign`, per-partition starting offsets cut down to them). failOnDataLoss stays true:
    records Kafka deleted before the task read them fail the task with Spark's message, never
    pass in silence."""
    options = {"kafka.bootstrap.servers": s.bootstrap, "includeHeaders": "false"}
    if assigned is not None:
        options["assign"] = kafka_partitions.assign_option(assigned)
    elif s.topics:
        options["subscribe"] = ",".join(s.topics)
    else:
        options["subscribePattern"] = str(s.topic_pattern)
    if s.starting_timestamp_ms is not None:
        options["startingTimestamp"] = str(s.starting_timestamp_ms)
    elif assigned is not None:
        options["startingOffsets"] = kafka_partitions.starting_offsets_for(s.starting_offsets,
                                                                          assigned)
    else:
        options["startingOffsets"] = s.starting_offsets
    if s.max_records is not None:
        options["maxOffsetsPerTrigger"] = str(s.max_records)
    options.update(spark_security_options(dict(s.security)))
    return options


@dataclass(frozen=True)
class ClientSecurity:
    """One security file's settings for each client: Java's (Spark's Kafka source and
    real-time sink, as the file says them) and librdkafka's (the sink and the start check,
    translated by `common.kafka_params.librdkafka_security`)."""

    java: tuple[tuple[str, str], ...] = ()
    librdkafka: tuple[tuple[str, str], ...] = ()


def read_security_file(path: str | None) -> ClientSecurity:
    """The settings of the file given as security-file= (KafkaParamError with file and line
    for what either client cannot take; a file too large to be a few settings is refused
    before it is read whole)."""
    if not path:
        return ClientSecurity()
    with open(path, encoding="utf-8") as f:
        text = f.read(MAX_SECURITY_FILE_CHARS + 1)
    properties = security_properties(text, path)
    return ClientSecurity(tuple(sorted((p.key, p.value) for p in properties)),
                          tuple(sorted(librdkafka_security(properties, path).items())))


# --- the sink -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mark:
    """The last batch a sink committed to Kafka, and which run of the query (Spark query id)."""

    batch_id: int
    run: str


def mark_of(offset: int, metadata: str | None) -> Mark | None:
    """The mark a committed offset encodes (offset = batch id + 1); None when none was
    committed (librdkafka's invalid offset, < 0)."""
    if offset is None or offset <= 0:
        return None
    return Mark(offset - 1, metadata or "")


def already_written(mark: Mark | None, run: str, batch_id: int) -> bool:
    """Whether batch `batch_id` of run `run` is already in Kafka (pure): only a mark of the same
    run says so; another run's batch ids (an earlier checkpoint) say nothing."""
    return mark is not None and mark.run == run and batch_id <= mark.batch_id


def transient(code: int, retriable: bool) -> bool:
    """Whether reading the mark is tried again after this error (pure): what a fresh broker
    answers while its group coordinator is still loading, and an unstable offset (the mark of
    a transaction the coordinator is still completing, e.g. the one the new attempt's
    `init_transactions` just finished): that is "not yet known", never "no mark"."""
    from confluent_kafka import KafkaError

    return retriable or code in (
        KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError._TIMED_OUT)


def _transient(error: Any) -> bool:
    return transient(error.code(), bool(error.retriable()))


def query_run_id(spark_checkpoint: str) -> str:
    """The Spark query id of a checkpoint (its `metadata` file), the same across restarts."""
    with open(os.path.join(spark_checkpoint, "metadata"), encoding="utf-8") as f:
        return str(json.loads(f.readline())["id"])


def bounded(call: Callable[[], T], what: str, timeout: float = STALL_S) -> T:
    """`call()`'s result (or its exception); KafkaStalled when it has not returned within
    `timeout` s. librdkafka's own timeouts do not bound every transactional call: with the
    broker SIGKILLed and restarted mid-transaction, `send_offsets_to_transaction(..., 60)` was
    still waiting after 3 min (confluent-kafka 2.16). The call is left behind in its thread
    with its producer, which the next producer of the same transactional id (the sink's fresh
    one, or the next attempt's) fences in `init_transactions`. Measured: fenced, the stuck call
    returned within a second in 4 of 5 runs (its thread and producer then go); in 1 it was
    still waiting 60 s later, so a producer may linger per stall."""
    try:
        return bounded_call.within(call, timeout, f"kafka {what}")
    except bounded_call.CallTimedOut:
        stalled = f"the Kafka broker did not complete {what} within {timeout:.0f} s"
        raise KafkaStalled(stalled, f"{stalled} (is it running? elastiq kafka status); the task "
                           "is retried from its checkpoint, and a batch Kafka already committed "
                           "is not written again") from None


Headers = list[tuple[str, bytes]]
Record = tuple[bytes | None, bytes, Headers | None]  # key, value, headers


def marked_records(records: list[Record], tentative: Sequence[int | None],
                   revisions: Sequence[int]) -> list[Record]:
    """A batch's records under DPC (docs/kafka.md, "DPC marks on a Kafka sink"), pure: record
    i with the header TENTATIVE_HEADER = `tentative[i]` (ASCII digits; None: none), after one
    correction record per episode of `revisions` (no key, the header REVISION_HEADER, the file
    sink's revision line as its value)."""
    if len(tentative) != len(records):
        raise ValueError(f"{len(tentative)} tentative marks for {len(records)} records")
    marked = [(key, value, headers) if episode is None else
              (key, value, [*(headers or []),
                            (dpc_view.TENTATIVE_HEADER, dpc_view.header_value(episode))])
              for (key, value, headers), episode in zip(records, tentative)]
    corrections: list[Record] = [
        (None, dpc_view.revision_text(e).encode("ascii"),
         [(dpc_view.REVISION_HEADER, dpc_view.header_value(e))]) for e in revisions]
    return [*corrections, *marked]


class KafkaSink:
    """foreachBatch sink: each micro-batch's rows as records of `topic`."""

    def __init__(self, task_id: str, *, bootstrap: str, topic: str, fmt: str,
                 key_column: str | None, exactly_once: bool, transactional_id: str,
                 run_id: Callable[[], str], security: Mapping[str, str] = {},
                 stall_s: float = STALL_S, client_timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.task_id = task_id
        self.topic, self.fmt, self.key_column = topic, fmt, key_column
        self.exactly_once = exactly_once
        self.transactional_id = transactional_id
        self.run_id = run_id
        self.config = {"bootstrap.servers": bootstrap, **security}
        self.rows_out = 0
        self.skipped_batches = 0
        self.fresh_producers = 0  # batches tried again after a stalled transactional call
        self.stall_s = stall_s
        self.client_timeout_s = client_timeout_s  # a client call's own bound (init, flush)
        self._producer: Any = None
        self._mark: Mark | None = None
        self._run: str | None = None
        self._group: Any = None  # the mark's consumer group metadata (`_group_metadata`)

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write(df.toArrow(), batch_id)

    def write(self, table: pa.Table, batch_id: int, tentative: Sequence[int | None] = (),
              revisions: Sequence[int] = ()) -> bool:
        """Write `table` as batch `batch_id` (exactly once: the id its mark records); whether
        anything was written. Under DPC (`executor.dpc.write_marked`, docs/kafka.md): row i's
        record with the header TENTATIVE_HEADER = `tentative[i]` (not given: none), and a
        correction record per episode of `revisions` (header REVISION_HEADER, value
        `{"_revision": N}`, no key) first, in the same transaction as the rows. A batch
        without rows or corrections writes nothing (a replay of it neither)."""
        if table.num_rows == 0 and not revisions:
            return False
        marks = list(tentative) or [None] * table.num_rows
        records = marked_records(self._records(table), marks, revisions)
        if self.exactly_once:
            self._transaction(records, batch_id)
        else:
            self._plain(records)
        self.rows_out += table.num_rows
        return True

    def _records(self, table: pa.Table) -> list[Record]:
        keys = kafka_records.record_keys(table, self.key_column)
        return [(key, value, None)
                for key, value in zip(keys, kafka_records.record_values(table, self.fmt))]

    def _plain(self, records: list[Record]) -> None:
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({**self.config, "enable.idempotence": True,
                                       "linger.ms": 5})
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        for key, value, headers in records:
            self._produce(key, value, headers, on_delivery=delivered)
        left = self._producer.flush(self.client_timeout_s)
        if left or failures:
            raise RuntimeError(f"kafka-sink {self.topic}: {left} records unsent, "
                               f"{len(failures)} failed ({failures[:1]})")

    def _produce(self, key: bytes | None, value: bytes, headers: Headers | None = None,
                 **kwargs: Any) -> None:
        if headers:
            kwargs["headers"] = headers
        for _ in range(1000):  # bounded: a full local queue drains as the broker takes records
            try:
                self._producer.produce(self.topic, value, key=key, **kwargs)
                return
            except BufferError:
                self._producer.poll(0.05)
        raise RuntimeError(f"kafka-sink {self.topic}: the producer queue stays full")

    def _transaction(self, records: list[Record], batch_id: int) -> None:
        """Batch `batch_id` as one transaction. A stalled call (KafkaStalled from `bounded`)
        leaves its producer behind and the batch is tried again with a fresh one: its
        `init_transactions` fences the stuck producer, and aborts its transaction or, where
        Kafka got as far as committing it, completes it, which the mark read next then shows
        (the batch is skipped). Measured: after a broker SIGKILL and restart, the stuck
        producer's `send_offsets_to_transaction` never returned, a fresh one committed at once.
        A fresh producer that cannot start (the broker still away) fails the batch with both
        reasons."""
        from confluent_kafka import KafkaException

        stalled: KafkaStalled | None = None
        for fresh in range(FRESH_PRODUCERS + 1):
            try:
                self._start_transactions()
            except (KafkaException, KafkaStalled) as exc:
                if stalled is None:
                    raise
                raise KafkaUnavailable(
                    f"{stalled.stalled}, and a fresh producer could not start ({exc}) (is the "
                    "broker running? elastiq kafka status); the task is retried from its "
                    "checkpoint, and a batch Kafka already committed is not written again"
                ) from None
            run = self._run
            assert run is not None
            if already_written(self._mark, run, batch_id):
                self.skipped_batches += 1
                log.info("task %s: kafka-sink %s: batch %s was committed to Kafka before a "
                         "restart; not written again", self.task_id, self.topic, batch_id)
                return
            try:
                self._write(records, batch_id, run)
                return
            except KafkaStalled as exc:
                self._producer = None  # stuck: left to be fenced by the next producer
                if fresh == FRESH_PRODUCERS:
                    raise
                stalled = exc
                self.fresh_producers += 1
                log.warning("task %s: kafka-sink %s: %s; trying batch %s again with a fresh "
                            "producer", self.task_id, self.topic, exc.stalled, batch_id)

    def _write(self, records: list[Record], batch_id: int, run: str) -> None:
        from confluent_kafka import TopicPartition

        producer = self._producer
        producer.begin_transaction()
        try:
            for key, value, headers in records:
                self._produce(key, value, headers)
            mark = [TopicPartition(self.topic, MARK_PARTITION, batch_id + 1, run)]
            group = self._group
            client = self.client_timeout_s
            bounded(lambda: producer.send_offsets_to_transaction(mark, group, client),
                    f"the mark of batch {batch_id}", self.stall_s)
            bounded(lambda: producer.commit_transaction(self.client_timeout_s),
                    f"the commit of batch {batch_id}", self.stall_s)
        except KafkaStalled:
            raise
        except BaseException:
            self._abort()
            raise
        self._mark = Mark(batch_id, run)

    def _start_transactions(self) -> None:
        """Once per attempt: the transactional producer (fencing older attempts, finishing
        their open transaction) and then the mark as Kafka holds it."""
        if self._producer is not None:
            return
        from confluent_kafka import Producer

        producer = Producer({**self.config, "transactional.id": self.transactional_id,
                             "transaction.timeout.ms": 60000, "linger.ms": 5})
        bounded(lambda: producer.init_transactions(self.client_timeout_s), "init_transactions",
                self.client_timeout_s + 5.0)
        self._run = self.run_id()
        self._mark = self._read_mark()
        self._group = self._group_metadata()  # the same for every batch: the mark's group alone
        self._producer = producer
        log.info("task %s: kafka-sink %s: transactional id %s, run %s, last committed batch %s",
                 self.task_id, self.topic, self.transactional_id, self._run,
                 None if self._mark is None else (self._mark.batch_id, self._mark.run))

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer({**self.config, "group.id": self.transactional_id,
                         "enable.auto.commit": False, "isolation.level": "read_committed"})

    def _group_metadata(self) -> Any:
        consumer = self._consumer()
        try:
            return consumer.consumer_group_metadata()
        finally:
            consumer.close()

    def _read_mark(self) -> Mark | None:
        """The committed mark; retried while the group coordinator is still loading."""
        from confluent_kafka import KafkaException, TopicPartition

        consumer = self._consumer()
        deadline = time.monotonic() + self.client_timeout_s
        try:
            for _ in range(600):
                try:
                    found = consumer.committed([TopicPartition(self.topic, MARK_PARTITION)],
                                               timeout=10)[0]
                    if found.error is not None:  # the partition's own error is not "no mark"
                        raise KafkaException(found.error)
                    return mark_of(found.offset, found.metadata)
                except KafkaException as exc:
                    if time.monotonic() > deadline or not _transient(exc.args[0]):
                        raise
                    time.sleep(0.2)
            raise RuntimeError(f"kafka-sink {self.topic}: the mark could not be read")
        finally:
            consumer.close()

    def _abort(self) -> None:
        producer = self._producer
        try:
            bounded(lambda: producer.abort_transaction(self.client_timeout_s), "an abort",
                    self.stall_s)
        except Exception as exc:  # fenced or fatal: a new producer starts with the next batch
            log.warning("task %s: kafka-sink %s: abort failed (%s); starting afresh",
                        self.task_id, self.topic, exc)
            self._producer = None

    def close(self) -> None:
        if self._producer is not None and not self.exactly_once:
            self._producer.flush(10)
        self._producer = None


# --- building the source frame and the sink for the task runtime ---------------------------

class KafkaSetupError(ValueError):
    """A Kafka operator that cannot start here; the message says what to do."""


class KafkaUnavailable(RuntimeError):
    """The broker or a topic a Kafka operator needs cannot be used now (unreachable, missing,
    refusing the security settings); the message says what to do. Not a broken program: the
    task is retried from its checkpoint like any failure."""


class KafkaStalled(KafkaUnavailable):
    """A call to the broker that did not return within its bound; `stalled` says which."""

    def __init__(self, stalled: str, message: str) -> None:
        super().__init__(message)
        self.stalled = stalled


def missing_topics(listed: Mapping[str, Any], wanted: tuple[str, ...]) -> list[str]:
    """The topics of `wanted` that the broker's metadata `listed` (name -> topic metadata
    with `.error`) does not hold, or holds with an error (pure)."""
    return [t for t in wanted if t not in listed or listed[t].error is not None]


def start_problem(said: str, secured: bool, listening: bool) -> KafkaProblem:
    """Why a broker did not answer a task's start (pure): what the client said, if it names the
    problem; else, with security settings given and something listening at the address, the
    listener refused them (librdkafka reports an SSL or SASL mismatch as a transport failure);
    else the broker cannot be reached."""
    named = problem_of_text(said)
    if named is not None and named != "unreachable":
        return named
    return "refused" if secured and listening else "unreachable"


def listening(bootstrap: str, timeout: float = 2.0) -> bool:
    """Whether the first bootstrap address accepts a TCP connection."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def check_broker(bootstrap: str, topics: tuple[str, ...], security: Mapping[str, str],
                 timeout: float | None = None,
                 quiet: bool = False) -> list[kafka_partitions.Partition]:
    """At a task's start: that the broker answers with these security settings (librdkafka's,
    `ClientSecurity.librdkafka`) and holds `topics`, else `KafkaUnavailable` with the reason
    (`common.kafka_problems`), within `timeout` seconds (default CHECK_TIMEOUT_S, read at the
    call): without it Spark's own client waits
    minutes and then fails with a Java stack. A refusal the client reports on its own (a SASL
    authentication or SSL handshake failure) ends the wait at once. Returns the (topic,
    partition) pairs of `topics`, as the broker's metadata lists them. `quiet`: librdkafka
    logs nothing to standard error (the command line prints the reason alone)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    heard: list[str] = []  # what the client reports on its own (an SSL or SASL failure)
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, **security,
                              "error_cb": lambda error: heard.append(str(error)),
                              **({"log_level": 0} if quiet else {})}
    try:
        admin = AdminClient(config)
    except (KafkaException, ValueError, TypeError) as exc:
        raise KafkaUnavailable(f"{advice('bad-setting')} ({exc})") from None
    bound = CHECK_TIMEOUT_S if timeout is None else timeout
    deadline = time.monotonic() + bound
    try:  # the client is dropped here: a kept traceback of a refusal holds no client,
        # whose threads would go on reconnecting to the broker
        for _ in range(int(bound / CHECK_STEP_S) + 2):
            try:
                listed = admin.list_topics(timeout=CHECK_STEP_S).topics
                break
            except KafkaException as exc:
                admin.poll(0)  # serves the error callback
                said = "; ".join([str(exc.args[0].str()), *heard[-2:]])
                refused = any(problem_of_text(h) in ("refused", "bad-setting") for h in heard)
                if time.monotonic() < deadline and not refused:
                    continue  # a refusal is final at once; anything else may still pass
                problem = start_problem(said, bool(security), listening(bootstrap))
                raise KafkaUnavailable(f"{advice(problem, 'at ' + bootstrap)} ({said[:300]})") \
                    from None
        else:
            raise KafkaUnavailable(f"{advice('unreachable', 'at ' + bootstrap)}")
    finally:
        del admin
    missing = missing_topics(listed, topics)
    if missing:
        raise KafkaUnavailable(advice("no-topic", f"at {bootstrap} ({', '.join(missing)})"))
    return [(t, int(p)) for t in topics for p in listed[t].partitions]


def timestamp_ms(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def source_frame(spark: Any, settings: SourceSettings, layout: kafka_records.RecordLayout,
                 dead_letter: str) -> Any:
    """The stream of declared rows: Spark's Kafka source, its records parsed in Arrow batches
    by `kafka_records.RecordParser` (bad ones to `dead_letter`)."""
    raw = raw_frame(spark, settings)
    return raw.select(*kafka_records.RECORD_COLUMNS).mapInArrow(
        kafka_records.RecordParser(layout, dead_letter), layout.schema.ddl())


def raw_frame(spark: Any, settings: SourceSettings) -> Any:
    """Spark's Kafka source frame of `settings` (its records as Spark gives them), once the
    broker answered (`check_broker`); with a share, only the instance's partitions
    (`assigned_partitions`). KafkaSetupError without the connector, or for a share that cannot
    be read."""
    from common.kafka_jars import FETCH_HINT, connector_available

    if not connector_available():
        raise KafkaSetupError(f"Spark's Kafka connector is not installed: {FETCH_HINT}")
    listed = check_broker(settings.bootstrap, settings.topics, dict(settings.client_security))
    assigned = None if settings.share is None else assigned_partitions(settings.share, listed)
    if settings.share is not None and settings.share.handover and assigned is not None:
        settings = _handed_over(settings, settings.share, assigned)
    try:
        raw = spark.readStream.format("kafka").options(
            **source_options(settings, assigned)).load()
    except Exception as exc:  # the session started without the connector on its classpath
        if "kafka" in str(exc).lower() and "find" in str(exc).lower():
            raise KafkaSetupError("this executor's Spark session has no Kafka connector (it "
                                  "started before the connector was fetched): restart the "
                                  "executor") from None
        raise
    return raw


def _handed_over(settings: SourceSettings, share: Share,
                 assigned: Sequence[kafka_partitions.Partition]) -> SourceSettings:
    """`settings` starting where a rescale's handover says (a new generation's first start;
    a restart of it resumes from its own checkpoint, where Spark ignores starting offsets)."""
    try:
        handed = kafka_handover.handed_over(str(share.handover), share.share, share.shares,
                                            assigned)
    except kafka_handover.HandoverRefused as exc:
        raise KafkaSetupError(str(exc)) from None
    if handed is None:
        return settings
    log.info("kafka-source instance %s of %s starts at its handover %s", share.share,
             share.shares, handed)
    return replace(settings, starting_offsets=handed, starting_timestamp_ms=None)


def assigned_partitions(share: Share, listed: Sequence[kafka_partitions.Partition]
                        ) -> tuple[kafka_partitions.Partition, ...]:
    """The partitions instance `share.share` of `share.shares` reads: its block of the
    partition list of the task's first start, kept in `share.pinned` (a restart reads the same
    block, and its checkpoint's offsets are for those partitions). A topic whose partitions
    changed since then is refused (KafkaSetupError): a new block would move partitions between
    instances without their offsets (read twice or skipped), so the query is resubmitted."""
    where = f"instance {share.share} of {share.shares}"
    pinned = _pinned(share.pinned)
    current = sorted(set(listed))
    if pinned is not None and pinned != current:
        raise KafkaSetupError(
            f"{where}: the topic's partitions changed since the instance first started "
            f"({len(pinned)} then, {len(current)} now); partitions are assigned to instances "
            "once, at the first start, so that each keeps its offsets: resubmit the query "
            "(elastiq cancel, then submit) to read the new partitions")
    try:
        assigned = kafka_partitions.assign(current, share.share, share.shares, where)
    except kafka_partitions.KafkaShareError as exc:
        raise KafkaSetupError(str(exc)) from None
    if pinned is None:
        os.makedirs(os.path.dirname(share.pinned) or ".", exist_ok=True)
        replace_file(share.pinned, json.dumps([list(p) for p in current]) + "\n")
    log.info("kafka-source %s reads %s", where, kafka_partitions.assign_option(assigned))
    return assigned


def _pinned(path: str) -> list[kafka_partitions.Partition] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return sorted((str(t), int(p)) for t, p in json.loads(f.read(1 << 22)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise KafkaSetupError(f"{path} does not hold a partition list ({exc}): it is the "
                              "instance's assignment of its first start; resubmit the query") \
            from None
