"""The operator catalogue: every operator kind a spec may use, and what it needs.

Owns, for each kind: its role (source, transform, sink, or plumbing inserted by rewriting), how
many inputs and outputs it takes, whether it keeps state, which key it can be partitioned by, and
its parameters with their value kinds and defaults (the columns of a control stream are
`common.operator_schemas`). Also owns parsing parameter values (numbers, durations, column lists,
timestamps, endpoints, API addresses) into typed Python values. The rewrite rules
(`rewrite_rules/`) and the validator read this table; nothing here knows about XML or Spark.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Literal

from common.keyed_aggregates import MAX_WINDOW_ROWS
from common.top_n import MAX_TOP_N

Role = Literal["source", "transform", "sink", "plumbing"]
ValueKind = Literal["int", "float", "string", "duration", "expression", "columns", "column",
                    "choice", "timestamp", "endpoint", "path", "url"]


@dataclass(frozen=True)
class ParamDef:
    name: str
    kind: ValueKind
    required: bool = False
    default: str | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None  # None: the kind's own bound (INT_RANGE, finite floats)
    doc: str = ""


@dataclass(frozen=True)
class OperatorDef:
    kind: str
    role: Role
    inputs: tuple[int, int]  # (min, max)
    outputs: tuple[int, int]
    stateful: bool
    params: tuple[ParamDef, ...] = ()
    children: tuple[str, ...] = ()  # allowed child elements besides input/output/param
    output_type: Literal["declared", "same", "computed", "shape"] = "declared"
    doc: str = ""

    def param(self, name: str) -> ParamDef | None:
        for p in self.params:
            if p.name == name:
                return p
        return None

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


GENERATOR_SHAPES = ("sensor", "stock", "sequence", "person", "auction", "bid")

# Bounds of parameter values (docs/spec-language.md, "Bounds"): whole numbers are 64-bit, as the
# runtime stores them; numbers are finite; a rate is at most a million tuples per second; a
# duration is at most 365 days; a timestamp parameter lies within TIMESTAMP_RANGE (UTC), which
# leaves a generator centuries of event time before Spark's year-9999 limit.
INT_RANGE = (-(2**63), 2**63 - 1)
MIN_RATE, MAX_RATE = 0.001, 1_000_000.0  # tuples per second
MAX_DURATION_MS = 365 * 24 * 3_600_000
TIMESTAMP_RANGE = (datetime(1900, 1, 1, tzinfo=timezone.utc),
                   datetime(9000, 1, 1, tzinfo=timezone.utc))
# At most this many operators of a query ask for a pattern (ha, parallelism, pipeline): one rule
# firing each, and the rewrite engine's bound on firings per phase.
MAX_PATTERN_OPERATORS = 200
# A key's partial matches live in the Spark Python worker beside the executor's JVM (one
# container, 1500 MB by default): 1,000,000 of them took 94 MB there when refused, 10,000,000
# (the old bound) 830 MB, which with the JVM and the state's JSON does not fit.
MAX_PARTIAL_MATCHES = 1_000_000

# Load shedding (docs/load.md): a source that says `shed` gets an idle drop operator after it
# (rewrite_rules/shedding.rule), whose ratio the scheduler sets when no capacity can be added;
# `shed-keep` makes it semantic (rows for which it is true are dropped last), `shed-utility` is
# what a row failing it is worth beside 1. A sink's `weight` is what its results are worth.
SHED_MODES = ("random", "semantic")
MAX_WEIGHT = 1_000_000.0
SHED_SOURCE_PARAMS = (
    ParamDef("shed", "choice", False, None, choices=SHED_MODES,
             doc="rows may be dropped after this source under overload: 'random' (a seeded "
                 "hash of each row), or 'semantic' (rows failing shed-keep first)"),
    ParamDef("shed-keep", "expression", False, None,
             doc="boolean expression over the source's output: the rows worth keeping "
                 "(semantic shedding drops the others first)"),
    ParamDef("shed-utility", "float", False, None, minimum=0.0, maximum=1.0,
             doc="what a row failing shed-keep is worth, 0..1 (a row passing it is worth 1; "
                 "default 0)"),
)
SINK_PARAMS = (
    ParamDef("weight", "float", False, "1", minimum=0.0, maximum=MAX_WEIGHT,
             doc="what this sink's results are worth against the query's other sinks when "
                 "load must be shed (0..1000000, default 1)"),
)


def _shedding(d: OperatorDef) -> OperatorDef:
    """The catalogue entry with the shedding parameters of its role."""
    extra = SHED_SOURCE_PARAMS if d.role == "source" else SINK_PARAMS if d.role == "sink" else ()
    return replace(d, params=d.params + extra)


CATALOGUE: dict[str, OperatorDef] = {d.kind: _shedding(d) for d in (
    OperatorDef("generator", "source", (0, 0), (1, 1), False, (
        ParamDef("shape", "choice", True, choices=GENERATOR_SHAPES,
                 doc="which built-in stream to generate"),
        ParamDef("rate", "float", False, "1000", minimum=MIN_RATE, maximum=MAX_RATE,
                 doc="tuples per second"),
        ParamDef("seed", "int", False, "0", doc="seed of the deterministic generator"),
        ParamDef("limit", "int", False, None, minimum=0, doc="stop after this many tuples"),
        ParamDef("start", "timestamp", False, "2024-01-01T00:00:00Z",
                 doc="event time of the first tuple"),
    ), output_type="shape", doc="deterministic generator of sensor readings, stock ticks, a "
                                "numbered sequence or Nexmark's persons, auctions and bids; "
                                "event time advances 1/rate per event"),
    OperatorDef("file-source", "source", (0, 0), (1, 1), False, (
        ParamDef("path", "path", True, doc="a JSON-lines or CSV file to replay"),
        ParamDef("format", "choice", False, None, choices=("jsonl", "csv"),
                 doc="file format (default: from the file name)"),
        ParamDef("rate", "float", False, None, minimum=MIN_RATE, maximum=MAX_RATE,
                 doc="tuples per second (default: as fast as possible)"),
    ), doc="replays a file, one tuple per line"),
    OperatorDef("network-source", "source", (0, 0), (1, 1), False, (
        ParamDef("endpoint", "endpoint", True, doc="ZeroMQ endpoint of an Elastiq channel writer, "
                                                   "e.g. tcp://127.0.0.1:6000"),
        ParamDef("channel", "string", False, None, doc="channel id served there "
                                                       "(default: the output stream's name)"),
        ParamDef("server-key", "string", False, None,
                 doc="the writer's CURVE public key (hex, as elastiq keygen prints it, or Z85); "
                     "with key-file, read over CURVE"),
        ParamDef("key-file", "path", False, None,
                 doc="this reader's keypair file (0600, made by `elastiq keygen`)"),
        ParamDef("reader", "string", False, None,
                 doc="the reader id the writer declared for this key "
                     "(default: <task>/<operator>)"),
        ParamDef("marks", "choice", False, None, choices=("none", "dpc"),
                 doc="dpc: the writer is a network-sink after a union or join with max-delay "
                     "and sends each row's DPC marks (docs/availability.md); the stream "
                     "may then feed only filters and projections into a file or console "
                     "sink, which write the tentative rows and corrections"),
    ), doc="reads a stream that another query or program serves on a ZeroMQ endpoint"),
    OperatorDef("stream-source", "source", (0, 0), (1, 1), False, (
        ParamDef("stream", "string", True,
                 doc="the published stream to read, QUERY/STREAM (docs/queries.md)"),
        ParamDef("start", "choice", False, "retained", choices=("retained", "now"),
                 doc="where a new reader starts: the oldest batch the writer still retains, "
                     "or its next batch"),
    ), doc="reads a stream another running query publishes; the scheduler wires its channel "
           "and keys"),
    OperatorDef("kafka-source", "source", (0, 0), (1, 1), False, (
        ParamDef("bootstrap", "string", True,
                 doc="the Kafka brokers, HOST:PORT[,HOST:PORT...]"),
        ParamDef("topic", "string", False, None,
                 doc="the topic(s) to read, comma-separated (or topic-pattern)"),
        ParamDef("topic-pattern", "string", False, None,
                 doc="read every topic whose name matches this Java regular expression"),
        ParamDef("starting-offsets", "string", False, "earliest",
                 doc="where a new query starts: earliest, latest, or per partition as JSON "
                     '{"topic": {"0": 42}} (-2 earliest, -1 latest); a restarted task resumes '
                     "from its checkpoint instead"),
        ParamDef("starting-timestamp", "timestamp", False, None,
                 doc="start at each partition's first record at or after this time "
                     "(instead of starting-offsets)"),
        ParamDef("format", "choice", False, "jsonl", choices=("jsonl", "csv"),
                 doc="how a record's value is written: a JSON object or a CSV row in the "
                     "declared type's column order"),
        ParamDef("key-column", "column", False, None,
                 doc="the declared string column that holds the record's key"),
        ParamDef("topic-column", "column", False, None,
                 doc="the declared string column that holds the record's topic"),
        ParamDef("partition-column", "column", False, None,
                 doc="the declared int column that holds the record's partition"),
        ParamDef("offset-column", "column", False, None,
                 doc="the declared int column that holds the record's offset"),
        ParamDef("timestamp-column", "column", False, None,
                 doc="the declared timestamp column that holds the record's Kafka timestamp "
                     "(usable as event time)"),
        ParamDef("dead-letter", "path", False, None,
                 doc="JSON-lines file for records that do not parse, with topic, partition, "
                     "offset and reason (default: dead-letters/<operator>.jsonl in the task's "
                     "state folder)"),
        ParamDef("security-file", "path", False, None,
                 doc="a properties file of the client's security.*, sasl.* and ssl.* "
                     "settings (never written in the spec)"),
        ParamDef("max-records-per-batch", "int", False, None, minimum=1,
                 doc="at most this many records per micro-batch (default: all available)"),
    ), doc="reads records from Kafka topics, one tuple per record; offsets live in the task's "
           "checkpoint"),
    OperatorDef("filter", "transform", (1, 1), (1, 1), False, (
        ParamDef("condition", "expression", True, doc="boolean expression over the input"),
    ), output_type="same", doc="keeps the tuples for which the condition is true"),
    OperatorDef("project", "transform", (1, 1), (1, 1), False, (),
                children=("field",), output_type="computed",
                doc="computes the output columns from <field name value> expressions"),
    OperatorDef("window-aggregate", "transform", (1, 1), (1, 1), True, (
        ParamDef("time", "column", False, None,
                 doc="the event-time column (timestamp); required unless clock is processing"),
        ParamDef("clock", "choice", False, None, choices=("event", "processing"),
                 doc="event (default: windows over the time column) or processing (windows "
                     "over the time each micro-batch is processed; no time, gap or watermark)"),
        ParamDef("size", "duration", False, None,
                 doc="window length, e.g. '10 seconds' (or gap, for session windows)"),
        ParamDef("slide", "duration", False, None, doc="slide of a sliding window "
                                                        "(default: tumbling, slide = size)"),
        ParamDef("gap", "duration", False, None,
                 doc="session windows instead of size: a group's session closes after this "
                     "much event time without a tuple (Spark's session_window)"),
        ParamDef("rows", "int", False, None, minimum=1, maximum=MAX_WINDOW_ROWS,
                 doc="count windows instead of size or gap: for each row, in event-time order, "
                     "the aggregates over its group's last this many rows (1 to 10,000)"),
        ParamDef("watermark", "duration", False, "0 seconds",
                 doc="how late a tuple may arrive; later ones are dropped"),
        ParamDef("group-by", "columns", False, "", doc="comma-separated grouping columns"),
    ), children=("aggregate",), output_type="computed",
        doc="window aggregate over event time (tumbling, sliding, session or count windows) or "
            "processing time (tumbling or sliding); emits each window once, when the watermark "
            "passes its end (a count window: each row's, when the watermark passes the row)"),
    OperatorDef("aggregate", "transform", (1, 1), (1, 1), True, (
        ParamDef("time", "column", True, doc="the event-time column (timestamp)"),
        ParamDef("ttl", "duration", True,
                 doc="a group's state is dropped once the watermark passes its last tuple's "
                     "time plus this; a later tuple starts it anew"),
        ParamDef("watermark", "duration", False, "0 seconds",
                 doc="how late a tuple may arrive; later ones are dropped"),
        ParamDef("group-by", "columns", False, "", doc="comma-separated grouping columns"),
    ), children=("aggregate",), output_type="computed",
        doc="aggregates over the whole stream per group, updated as tuples arrive: one upsert "
            "record per group and micro-batch that brought it tuples (a file sink keeps them "
            "as an upsert log)"),
    OperatorDef("deduplicate", "transform", (1, 1), (1, 1), True, (
        ParamDef("key", "columns", True, doc="comma-separated columns that identify a tuple"),
        ParamDef("time", "column", True, doc="the event-time column (timestamp)"),
        ParamDef("watermark", "duration", True,
                 doc="how late a tuple may arrive; a key's duplicates are dropped while the "
                     "watermark has not passed its first tuple's time plus this"),
    ), output_type="same", doc="passes the first tuple of each key and drops its duplicates "
                               "within the watermark (Spark's dropDuplicatesWithinWatermark)"),
    OperatorDef("top-n", "transform", (1, 1), (1, 1), True, (
        ParamDef("time", "column", True, doc="the event-time column (timestamp)"),
        ParamDef("size", "duration", False, None,
                 doc="window length, e.g. '10 seconds' (or ttl instead, for the updating "
                     "ranking over the whole stream)"),
        ParamDef("slide", "duration", False, None, doc="slide of a sliding window "
                                                        "(default: tumbling, slide = size)"),
        ParamDef("ttl", "duration", False, None,
                 doc="instead of size: rank over the whole stream, updating each group's "
                     "ranking as tuples arrive (upsert records); a group's state is dropped "
                     "once the watermark passes its last tuple's time plus this, and a later "
                     "tuple starts its ranking anew"),
        ParamDef("watermark", "duration", False, "0 seconds",
                 doc="how late a tuple may arrive; later ones are dropped"),
        ParamDef("group-by", "columns", False, "", doc="comma-separated grouping columns"),
        ParamDef("n", "int", True, minimum=1, maximum=MAX_TOP_N,
                 doc="how many rows of each window (or, with ttl, of the stream) and group "
                     "are ranked (1 to 10,000)"),
        ParamDef("order-by", "string", True,
                 doc="the ranking: comma-separated columns, each optionally asc or desc, e.g. "
                     "'price desc, date_time'"),
    ), output_type="computed",
        doc="the first n rows of each event-time window and group in an order (top-N); "
            "emits each window's ranking once, when the watermark passes its end; with ttl "
            "instead of size, an updating ranking over the whole stream (a file sink keeps "
            "its records as an upsert log)"),
    OperatorDef("join", "transform", (2, 2), (1, 1), True, (
        ParamDef("key", "columns", False, None, doc="join columns present on both sides"),
        ParamDef("left-key", "columns", False, None, doc="join columns of the first input"),
        ParamDef("right-key", "columns", False, None, doc="join columns of the second input"),
        ParamDef("time", "column", False, None, doc="event-time column of both sides"),
        ParamDef("left-time", "column", False, None, doc="event-time column of the first input"),
        ParamDef("right-time", "column", False, None,
                 doc="event-time column of the second input"),
        ParamDef("right-end", "column", False, None,
                 doc="a timestamp column of the second input: a left tuple joins a right one "
                     "while right-time <= left-time <= right-end (bounded by within)"),
        ParamDef("within", "duration", True, doc="tuples join when their times differ by at "
                                                 "most this (with right-end: left-time is at "
                                                 "most this after right-time)"),
        ParamDef("watermark", "duration", False, None,
                 doc="how late a tuple may arrive on either side (default: within)"),
    ), output_type="computed", doc="windowed inner equi-join of two streams"),
    OperatorDef("lookup-join", "transform", (1, 1), (1, 1), False, (
        ParamDef("path", "path", True,
                 doc="the side table: a JSON-lines or CSV file of rows of side-type, read "
                     "whole when the task starts (at most 16 MiB)"),
        ParamDef("format", "choice", False, None, choices=("jsonl", "csv"),
                 doc="the side file's format (default: from the file name)"),
        ParamDef("side-type", "string", True, doc="the declared type of the side table's rows"),
        ParamDef("key", "columns", False, None,
                 doc="join columns with the same names in the stream and the side table"),
        ParamDef("left-key", "columns", False, None, doc="join columns of the stream"),
        ParamDef("right-key", "columns", False, None, doc="join columns of the side table"),
    ), output_type="computed",
        doc="stream-table lookup join: each tuple with the side table's rows of equal keys "
            "(an inner join; the table is a bounded file, loaded once per task start)"),
    OperatorDef("pattern", "transform", (1, 1), (1, 1), True, (
        ParamDef("pattern", "string", True, doc="the row pattern over variables, e.g. "
                                                "'A B+ C D+' (concatenation, + * ?, |, ( ))"),
        ParamDef("time", "column", True, doc="the event-time column (timestamp) rows are "
                                             "ordered by"),
        ParamDef("partition-by", "columns", False, "",
                 doc="comma-separated key columns; each key is matched on its own"),
        ParamDef("within", "duration", True, doc="a match spans at most this much event time, "
                                                 "from its first row to its last"),
        ParamDef("watermark", "duration", False, "0 seconds",
                 doc="how late a row may arrive; later ones are dropped"),
        ParamDef("after-match", "choice", False, "skip-past-last-row",
                 choices=("skip-past-last-row", "skip-to-next-row"),
                 doc="where matching resumes after a match: the row after its last, or the "
                     "row after its first (every start row keeps its match)"),
        ParamDef("max-partial-matches", "int", False, "100000", minimum=1,
                 maximum=MAX_PARTIAL_MATCHES, doc="bound on one key's partial matches; beyond "
                                                  "it the query fails with this message"),
    ), children=("define", "field"), output_type="computed",
        doc="row pattern recognition (MATCH_RECOGNIZE): one row per match, the key columns "
            "and the <field> measures; <define name value> gives a variable's condition"),
    OperatorDef("union", "transform", (2, 16), (1, 1), False, (), output_type="same",
                doc="merges streams of the same type"),
    OperatorDef("file-sink", "sink", (1, 1), (0, 0), False, (
        ParamDef("path", "path", True, doc="JSON-lines file the results are appended to (with "
                                           "partition-by: the file in each partition folder)"),
        ParamDef("partition-time", "column", False, None,
                 doc="the timestamp column whose time (UTC) names each row's partition folders"),
        ParamDef("partition-by", "string", False, None,
                 doc="the partition folders below the file's folder, Hive-style, e.g. "
                     "'dt=yyyy-MM-dd/hm=HH:mm' (fields yyyy MM dd HH mm ss, separators - _ : .)"),
    ), doc="writes results to a JSON-lines file, exactly once; with partition-by, one file per "
           "time partition"),
    OperatorDef("console-sink", "sink", (1, 1), (0, 0), False, (),
                doc="prints results on the terminal"),
    OperatorDef("discard-sink", "sink", (1, 1), (0, 0), False, (),
                doc="computes every result and keeps none, counting them: a query's cost "
                    "without its output's (benchmarks, dry runs)"),
    OperatorDef("network-sink", "sink", (1, 1), (0, 0), False, (
        ParamDef("endpoint", "endpoint", True, doc="ZeroMQ endpoint to serve the results on, "
                                                   "e.g. tcp://127.0.0.1:6000"),
        ParamDef("channel", "string", False, None, doc="channel id to serve "
                                                       "(default: the input stream's name)"),
        ParamDef("readers", "string", False, None,
                 doc="the readers served, 'id=PUBLICKEY, ...' (CURVE public keys in hex, as "
                     "elastiq keygen prints them, or Z85); only they are admitted and retained "
                     "for"),
        ParamDef("key-file", "path", False, None,
                 doc="this writer's keypair file (0600, made by `elastiq keygen`); with "
                     "readers, serve over CURVE"),
    ), doc="serves results as an Elastiq channel that other queries or programs can read"),
    OperatorDef("kafka-sink", "sink", (1, 1), (0, 0), False, (
        ParamDef("bootstrap", "string", True,
                 doc="the Kafka brokers, HOST:PORT[,HOST:PORT...]"),
        ParamDef("topic", "string", True, doc="the topic results are written to"),
        ParamDef("key-column", "column", False, None,
                 doc="the input column whose value (as text) is each record's key "
                     "(default: no key)"),
        ParamDef("format", "choice", False, "jsonl", choices=("jsonl", "csv"),
                 doc="how a record's value is written: a JSON object or a CSV row"),
        ParamDef("delivery", "choice", False, "exactly-once",
                 choices=("exactly-once", "at-least-once"),
                 doc="exactly-once: each micro-batch in one Kafka transaction, visible to "
                     "read_committed readers when it commits; at-least-once: plain idempotent "
                     "producer, visible at once, a replayed batch written again"),
        ParamDef("mode", "choice", False, "micro-batch", choices=("micro-batch", "real-time"),
                 doc="real-time: the task runs in Spark's real-time mode (records read, "
                     "filtered and written as they come, milliseconds end to end); only a task "
                     "kafka-source -> filter/project -> this sink with delivery=\"at-least-once\" "
                     "(docs/kafka.md), else refused with the reasons"),
        ParamDef("security-file", "path", False, None,
                 doc="a properties file of the client's security.*, sasl.* and ssl.* "
                     "settings (never written in the spec)"),
    ), doc="writes results to a Kafka topic, one record per tuple; exactly once for "
           "read_committed readers"),
    OperatorDef("control-sink", "sink", (1, 1), (0, 0), False, (
        ParamDef("scheduler", "url", False, None,
                 doc="the scheduler API the control tuples go to, http://HOST:PORT (default: "
                     "the executor's ELASTIQ_SCHEDULER, else http://127.0.0.1:8088)"),
    ), doc="sends each micro-batch's rows, string columns query, operator, parameter, value, "
           "as control tuples to the scheduler: the closed loop"),
)}

# Plumbing operators: inserted by the rewrite rules (rewrite_rules/*.rule), never written in a
# spec. Each carries in its params what the runtime needs; see docs/patterns.md.
PLUMBING: dict[str, OperatorDef] = {d.kind: d for d in (
    OperatorDef("multicast", "plumbing", (1, 1), (1, 1), False, (
        ParamDef("copies", "int", True, minimum=1, doc="how many readers receive every tuple"),
    ), output_type="same", doc="sends every tuple of its input to all its readers"),
    OperatorDef("splitter", "plumbing", (1, 1), (1, 1), False, (
        ParamDef("partitions", "int", True, minimum=1, doc="number of partitions"),
        ParamDef("active", "int", False, None, minimum=0,
                 doc="partitions routed to at the start (none: all); the rest are slots a "
                     "running query can scale out to; 0: only the folded one"),
        ParamDef("key", "column", False, None,
                 doc="hash-partitioning column (none: round robin)"),
        ParamDef("time", "column", False, None,
                 doc="a stateful operator's event-time column: a rescale switches routing at "
                     "an event time of it"),
        ParamDef("window-ms", "int", False, None, minimum=1, doc="its window size"),
        ParamDef("horizon-ms", "int", False, None, minimum=1,
                 doc="event time after a switch during which retiring instances get ticks"),
        ParamDef("slide-ms", "int", False, None, minimum=1,
                 doc="its window slide (a sliding window's rows near a switch go to both sides, "
                     "each copy bounded to the windows of its side)"),
        ParamDef("spread-ms", "int", False, None, minimum=0,
                 doc="a join's right input: a row goes to every instance owning a time within "
                     "this bound of it"),
        ParamDef("planned", "int", False, None, minimum=0,
                 doc="1: a join's splitter, switching at the event time the scheduler plans"),
        ParamDef("folded", "int", False, None, minimum=0,
                 doc="1: the last partition feeds an instance folded into the merger's task, "
                     "routed to alone while `active` is 0 (rewrite_rules/folding.rule)"),
    ), output_type="same", doc="routes each tuple to one of its active partitions, by key hash"),
    OperatorDef("merger", "plumbing", (1, 64), (1, 1), False, (
        ParamDef("partitions", "int", True, minimum=1, doc="number of merged partitions"),
        ParamDef("key", "column", False, None, doc="the partitioning key, for the record"),
    ), output_type="same", doc="recombines the outputs of partitioned instances"),
    OperatorDef("stream-selector", "plumbing", (1, 64), (1, 1), False, (
        ParamDef("protects", "string", True, doc="the replicated operator"),
        ParamDef("replicas", "int", True, minimum=1, doc="number of replicas (inputs)"),
    ), output_type="same", doc="forwards one replica's output; switches on failure without "
                               "gap or duplicate"),
    OperatorDef("failover", "plumbing", (1, 1), (1, 1), False, (
        ParamDef("mode", "choice", True, choices=("standby", "checkpoint")),
        ParamDef("protects", "string", True, doc="the protected operator"),
        ParamDef("standby-placement", "string", True,
                 doc="placement label of the standby (distinct from the primary's)"),
        ParamDef("checkpoint", "choice", False, None, choices=("shared",),
                 doc="checkpoint on storage the standby can reach"),
        ParamDef("replay-from", "string", False, None,
                 doc="the network-writer whose upstream backup replays"),
    ), output_type="same", doc="forwards the active instance's output; the scheduler restarts "
                               "the protected operator on the standby placement"),
    OperatorDef("network-writer", "plumbing", (1, 1), (1, 1), False, (
        ParamDef("backup", "choice", False, None, choices=("upstream",),
                 doc="keep unacknowledged batches for replay"),
    ), output_type="same", doc="sending end of a channel between tasks"),
    OperatorDef("drop", "plumbing", (1, 1), (1, 1), False, (
        ParamDef("ratio", "float", False, "0", minimum=0.0, maximum=1.0,
                 doc="fraction of the rows dropped (semantic: of the rows failing keep), 0..1; "
                     "set at run time by the scheduler's shedding plan"),
        ParamDef("high-ratio", "float", False, "0", minimum=0.0, maximum=1.0,
                 doc="semantic: fraction of the rows passing keep that are dropped"),
        ParamDef("mode", "choice", False, "random", choices=SHED_MODES),
        ParamDef("keep", "string", False, None,
                 doc="semantic: the source's shed-keep condition"),
        ParamDef("seed", "int", False, "0", doc="seed of the row hash that picks the rows"),
    ), output_type="same", doc="drops a live fraction of its rows (load shedding; idle at 0), "
                               "picked by a seeded hash of each row, so a replay drops the same; "
                               "its output is its input plus each row's keep share, `kept` "
                               "(compiler.kept_columns types it)"),
    OperatorDef("network-reader", "plumbing", (1, 1), (1, 1), False, (
        ParamDef("replica", "int", False, None, minimum=1, doc="which replica reads"),
        ParamDef("partition", "int", False, None, minimum=1, doc="which partition it reads"),
        ParamDef("share", "int", False, None, minimum=1,
                 doc="the share of a pattern operator's partial matches its reader matches"),
        ParamDef("shares", "int", False, None, minimum=2,
                 doc="how many instances share a pattern operator's partial matches"),
        ParamDef("stage", "int", False, None, minimum=1,
                 doc="which stage of a pipelined pattern operator reads"),
        ParamDef("stages", "int", False, None, minimum=2,
                 doc="how many stages a pipelined pattern operator runs in"),
        ParamDef("stage-rows", "int", False, None, minimum=1,
                 doc="rows a partial match grows by in each stage before it moves on"),
    ), output_type="same", doc="receiving end of a channel between tasks"),
)}


# ----------------------------------------------------------------------------------------------
# Parameter values

_DURATION = re.compile(r"^\s*(\d{1,12})\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|"
                       r"h|hours?|d|days?)\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "millisecond": 1, "s": 1000, "sec": 1000, "second": 1000, "m": 60_000,
            "min": 60_000, "minute": 60_000, "h": 3_600_000, "hour": 3_600_000,
            "d": 86_400_000, "day": 86_400_000}
_ENDPOINT = re.compile(r"^tcp://(\*|[A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:]+\]):(\d{1,5})$")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_URL = re.compile(r"^http://([A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:]+\])(?::(\d{1,5}))?/?$")


class ParamValueError(ValueError):
    """A parameter value of the wrong form; the message says what form is expected."""


def parse_duration_ms(text: str) -> int:
    m = _DURATION.match(text)
    if not m:
        raise ParamValueError(f"'{text}' is not a duration; write e.g. '500 milliseconds', "
                              "'10 seconds', '5 minutes', '1 hour' or '2 days'")
    unit = m.group(2).lower().rstrip("s") or "s"
    if m.group(2).lower() in ("ms", "s"):
        unit = m.group(2).lower()
    ms = int(m.group(1)) * _UNIT_MS[unit]
    if ms > MAX_DURATION_MS:
        raise ParamValueError(f"'{text}' is longer than the maximum duration, 365 days "
                              "(8760 hours)")
    return ms


def canonical_duration(ms: int) -> str:
    """Spark's interval spelling of a duration, e.g. 10000 -> '10 seconds', 0 -> '0 seconds'."""
    if ms == 0:
        return "0 seconds"
    if ms % 3_600_000 == 0:
        return f"{ms // 3_600_000} hours"
    if ms % 60_000 == 0:
        return f"{ms // 60_000} minutes"
    if ms % 1000 == 0:
        return f"{ms // 1000} seconds"
    return f"{ms} milliseconds"


def parse_timestamp(text: str) -> datetime:
    """An ISO 8601 instant (no zone means UTC) within TIMESTAMP_RANGE, as an aware UTC value."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        value = (value if value.tzinfo else value.replace(tzinfo=timezone.utc))
        value = value.astimezone(timezone.utc)
    except ValueError:
        raise ParamValueError(f"'{text}' is not a timestamp; write ISO 8601 such as "
                              "'2024-01-01T00:00:00Z'") from None
    except OverflowError:  # in range in its own zone, out of range once moved to UTC
        value = None
    low, high = TIMESTAMP_RANGE
    if value is None or not low <= value <= high:
        raise ParamValueError(f"'{text}' is outside the allowed range, from "
                              f"{low:%Y-%m-%d} to {high:%Y-%m-%d} (UTC)")
    return value


def parse_columns(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        if not _COLUMN.match(n):
            raise ParamValueError(f"'{n}' is not a column name")
    return names


def parse_endpoint(text: str) -> str:
    m = _ENDPOINT.match(text.strip())
    if not m or not 0 < int(m.group(2)) < 65536:
        raise ParamValueError(f"'{text}' is not a ZeroMQ TCP endpoint; write "
                              "tcp://HOST:PORT, e.g. tcp://127.0.0.1:6000")
    return text.strip()


def parse_url(text: str) -> str:
    """An HTTP API address, http://HOST[:PORT] (no path, no credentials, no https)."""
    m = _URL.match(text.strip())
    if not m or (m.group(2) is not None and not 0 < int(m.group(2)) < 65536):
        raise ParamValueError(f"'{text}' is not an API address; write http://HOST:PORT, "
                              "e.g. http://127.0.0.1:8088")
    return text.strip().rstrip("/")


def parse_value(definition: ParamDef, text: str) -> object:
    """The typed value of a parameter (expressions stay text: the validator checks them)."""
    kind = definition.kind
    if kind == "int":
        value = _number(text, int, "a whole number")
    elif kind == "float":
        value = _number(text, float, "a number")
    elif kind == "duration":
        return parse_duration_ms(text)
    elif kind == "timestamp":
        return parse_timestamp(text)
    elif kind == "columns":
        return parse_columns(text)
    elif kind == "column":
        cols = parse_columns(text)
        if len(cols) != 1:
            raise ParamValueError(f"'{text}' should name exactly one column")
        return cols[0]
    elif kind == "choice":
        if text not in definition.choices:
            raise ParamValueError(f"'{text}' is not one of {', '.join(definition.choices)}")
        return text
    elif kind == "endpoint":
        return parse_endpoint(text)
    elif kind == "url":
        return parse_url(text)
    elif kind == "path":
        if not text.strip() or "\x00" in text:
            raise ParamValueError("a path must not be empty")
        return text.strip()
    else:
        return text
    return _in_bounds(definition, text.strip(), value)


_INT_TEXT = re.compile(r"[+-]?[0-9]{1,30}\Z")
_LONG_INT_TEXT = re.compile(r"[+-]?[0-9]{31,}\Z")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def _number(text: str, kind: type, label: str) -> int | float:
    """A whole number (ASCII digits, 64-bit) or a finite number; no inf, nan, 1_000 or hex."""
    stripped = text.strip()
    if kind is int and _LONG_INT_TEXT.match(stripped):
        raise ParamValueError(f"'{stripped[:24]}...' ({len(stripped)} characters) is out of "
                              "range; whole numbers are 64-bit")
    pattern = _INT_TEXT if kind is int else _FLOAT_TEXT
    if not pattern.match(stripped):
        raise ParamValueError(f"'{text}' is not {label}")
    value = kind(stripped)
    if kind is float and not math.isfinite(value):
        raise ParamValueError(f"'{text}' is too large; write a finite number")
    return value


def _in_bounds(definition: ParamDef, text: str, value: int | float) -> int | float:
    """`value` if it lies within the parameter's minimum and maximum (an int within INT_RANGE)."""
    low = definition.minimum
    high = definition.maximum
    if definition.kind == "int":
        low = INT_RANGE[0] if low is None else low
        high = INT_RANGE[1] if high is None else high
    if low is not None and value < low:
        raise ParamValueError(f"{text} is below the minimum {_bound(low)}")
    if high is not None and value > high:
        raise ParamValueError(f"{text} is above the maximum {_bound(high)}")
    return value


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# The columns each generator shape produces (executor/shapes.py generates the rows).
SHAPE_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "sensor": (("sensor", "string"), ("ts", "timestamp"), ("temp", "double"),
               ("humidity", "double")),
    "stock": (("symbol", "string"), ("ts", "timestamp"), ("price", "double"), ("volume", "int")),
    "sequence": (("id", "int"), ("ts", "timestamp"), ("key", "string"), ("value", "double")),
    # Nexmark's three event kinds, in its proportions 1:3:46 of one stream of `rate` events/s
    "person": (("id", "int"), ("name", "string"), ("email_address", "string"),
               ("credit_card", "string"), ("city", "string"), ("state", "string"),
               ("date_time", "timestamp")),
    "auction": (("id", "int"), ("item_name", "string"), ("description", "string"),
                ("initial_bid", "int"), ("reserve", "int"), ("date_time", "timestamp"),
                ("expires", "timestamp"), ("seller", "int"), ("category", "int")),
    "bid": (("auction", "int"), ("bidder", "int"), ("price", "int"), ("channel", "string"),
            ("url", "string"), ("date_time", "timestamp")),
}


def updates(kind: str, param: Callable[[str], object]) -> bool:
    """Whether an operator's results are updates (upsert records), not rows: an `aggregate`,
    or a `top-n` with `ttl` (the updating ranking). `param` gives a parameter (None when not
    written): a spec's operator's or a graph node's."""
    return kind == "aggregate" or kind == "top-n" and param("ttl") is not None
