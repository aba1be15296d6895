"""Task programs: one readable Python module per query task, rendered with jinja2.

Owns turning a `TaskPlan` of a graph into the source of the program the executor runs: a
`build(rt)` function that calls the task runtime (`executor.runtime.TaskRuntime`) once per
operator, in dataflow order, ending with the task's one output (a sink or a channel). Plumbing
becomes channel calls: pass-through plumbing an `identity`, a merger a `union`, a splitter root one
`split_channel_sink` over its partition channels, a stream selector one `selector_source` over its
replica channels; a hot-standby replica first asks for deterministic batches. Every value that came
from the user is written as a Python literal by `py_literal` (repr of a str, int, float, bool,
None, or a tuple of those): user text can never become code (docs/architecture.md, invariant 4).
Expressions stay text; the runtime parses them with `compiler.expr`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import jinja2

from common.kafka_params import (METADATA_COLUMNS, parse_bootstrap, parse_starting_offsets,
                                 parse_topics)
from common.kafka_partitions import SPEC_STREAM
from common.side_table import format_of
from common import time_partitions
from common.tasks import ChannelSpec
from common.top_n import RANK_COLUMN
from common.types import Schema
from compiler.graph import Graph, Node, render_term
from compiler import realtime
from compiler.operators import canonical_duration, updates
from compiler.tasks import TaskPlan, cut_streams

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("compiler", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)

# Plumbing that forwards its one input unchanged inside a task (`rt.identity`); of these, all but
# the failover stand in front of the operator they serve (`program_names`).
_PASS_THROUGH = ("network-writer", "network-reader", "multicast", "failover")
_FORWARDING = ("network-writer", "network-reader", "multicast", "splitter")


# Seconds between the micro-batches of a task that multicasts to hot-standby replicas. A replica
# cuts its micro-batches at input batch boundaries (an input batch, then an empty flush step, so
# every replica's output is numbered alike); its catch-up speed after a restart is this interval
# over the time of those two micro-batches (~0.3-0.8 s here), so 1 s barely kept pace on a loaded
# machine and 2 s leaves room to catch up, at ~1 s more latency.
REPLICA_INPUT_INTERVAL = 2.0


def py_literal(value: Any) -> str:
    """A Python literal for a plain value; raises TypeError for anything else."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TypeError(f"no literal for {value!r}")
        return repr(value)
    if isinstance(value, (tuple, list)):
        items = ", ".join(py_literal(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    raise TypeError(f"no literal for a {type(value).__name__}")


@dataclass(frozen=True)
class Call:
    """One runtime call of a generated program."""

    comment: str
    method: str
    args: tuple[tuple[str, Any], ...]

    @property
    def rendered(self) -> str:
        """`rt.method(k=v, ...)`, one argument per line when it would not fit in 96 columns."""
        args = [f"{k}={v.const if isinstance(v, SchemaRef) else py_literal(v)}"
                for k, v in self.args]
        one_line = f"rt.{self.method}({', '.join(args)})"
        if len(one_line) <= 96:
            return one_line
        inner = "".join(f"\n        {a}," for a in args)
        return f"rt.{self.method}({inner}\n    )"


@dataclass(frozen=True)
class SchemaRef:
    """A module-level schema constant of the generated program."""

    const: str
    schema: Schema

    @property
    def rendered(self) -> str:
        """`NAME = Schema.of(...)`, one column per line when it would not fit in 96 columns."""
        pairs = [py_literal((f.name, f.type.value)) for f in self.schema]
        one_line = f"{self.const} = Schema.of({', '.join(pairs)})"
        if len(one_line) <= 96:
            return one_line
        inner = "".join(f"\n    {p}," for p in pairs)
        return f"{self.const} = Schema.of({inner}\n)"


def render_task(graph: Graph, plan: TaskPlan, query_id: str, base_dir: Path,
                channels: Mapping[str, ChannelSpec]) -> str:
    """The Python source of one task's program. `channels` (channel id -> spec) holds at least
    the task's input and output channels: their streams, and the tasks reading each output (its
    writer keeps every batch until each of them has acknowledged it)."""
    schemas: dict[str, SchemaRef] = {}

    def schema_of(stream: str) -> SchemaRef:
        if stream not in schemas:
            const = _unique(f"SCHEMA_{stream.upper()}", {s.const for s in schemas.values()})
            schemas[stream] = SchemaRef(const, graph.stream(stream).schema)
        return schemas[stream]

    names = program_names(graph, plan, channels)

    def name(stream: str) -> str:
        return names.get(stream, stream)

    calls: list[Call] = []
    if any(_feeds_replicas(graph, graph.node(n)) for n in plan.nodes):
        calls.append(Call("feeds hot-standby replicas (one input batch per micro-batch each)",
                          "paced_batches", (("seconds", REPLICA_INPUT_INTERVAL),)))
    if plan.failover == "replica":
        calls.append(Call(f"{plan.nodes[-1]} is a hot-standby replica: micro-batches cut by "
                          "input numbers, identical in every replica", "deterministic_batches", ()))
    if realtime.task_mode(graph, plan).real_time:
        calls.append(Call(f"{plan.nodes[-1]} asks for Spark's real-time mode (docs/kafka.md): "
                          "the query is built in the JVM only", "real_time_mode", ()))
    if writes_aggregate_locally(graph, plan):
        calls.append(Call("writes an aggregate's results to a local sink: a backlog comes in "
                          "large micro-batches", "large_batches", ()))
    calls += _source_calls(graph, plan, channels, schema_of, name)
    for node in (graph.node(n) for n in plan.nodes):
        if node.kind not in ("stream-selector", "splitter"):  # their channel calls stand for them
            calls.append(_call(graph, node, base_dir, schema_of, name))
    calls += _sink_calls(graph, plan, channels, name)
    source = _ENV.get_template("task.py.j2").render(
        query_id=query_id, task=plan, calls=calls, schemas=list(schemas.values()),
        plan=_task_notation(graph, plan),
        reads=", ".join(plan.inputs) or "no channels",
        writes=", ".join(plan.outputs) or "its sink",
        placed=_placement_notes(plan),
    )
    ast.parse(source)  # a template bug must never reach an executor
    return source


def _feeds_replicas(graph: Graph, node: Node) -> bool:
    """A multicast read by hot-standby replicas (readers with `replica`), whose producer paces
    its micro-batches; the instances of a partitioned pattern read theirs at their own pace."""
    return node.kind == "multicast" and node.output is not None and any(
        c.param("replica") is not None for c in graph.consumers(node.output))


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or `name_2`, `name_3`... if taken (streams whose names differ only in case)."""
    n, candidate = 1, name
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    return candidate


def program_names(graph: Graph, plan: TaskPlan,
                  channels: Mapping[str, ChannelSpec]) -> dict[str, str]:
    """Streams the program names differently from the graph: an operator behind inserted
    plumbing (a network-reader, writer, multicast or splitter in front of it, or an instance's
    own copy of a kafka-source in place of its network-reader) reads its input
    under the name of the stream the spec's operator read, since its expressions are written
    against that name (`aStream.x < 42`). A name already used in the task is left alone."""
    members = set(plan.nodes)
    used = {channels[c].stream for c in plan.inputs if c in channels}  # not another query's
    used |= {graph.node(n).produced for n in members if graph.node(n).output is not None}
    names: dict[str, str] = {}
    for node in (graph.node(n) for n in plan.nodes):
        if node.role == "plumbing":
            continue
        for stream in node.inputs:
            written = _behind_forwarding(graph, stream)
            if written != stream and written not in used and written not in names.values():
                names[stream] = written
    return names


def _behind_forwarding(graph: Graph, stream: str) -> str:
    """The stream before any chain of forwarding plumbing that produces `stream`; for an
    instance's copy of a kafka-source (`compiler.kafka_partitions`), the stream the spec's
    source wrote."""
    producer = graph.producer(stream)
    while producer.kind in _FORWARDING:
        stream = producer.inputs[0]
        producer = graph.producer(stream)
    return str(producer.param(SPEC_STREAM) or stream)


def _switch_of(splitter: Node) -> tuple[Any, ...]:
    """A stateful splitter's switch: time column, window size, tick horizon, slide (ms); and
    for a join's, its spread (ms) and 1 (the scheduler plans its switches)."""
    window = int(splitter.param("window-ms"))
    switch = (str(splitter.param("time")), window, int(splitter.param("horizon-ms")),
              int(splitter.param("slide-ms") or window))
    if splitter.param("planned"):
        return switch + (int(splitter.param("spread-ms") or 0), 1)
    return switch


def _ticked(graph: Graph, stream: str) -> tuple[tuple[str, bool], ...]:
    """The reading side's marks of `stream`: none; or, a partition of a splitter with an
    event-time switch, the tick mark, and for a sliding window also the window-start bounds."""
    producer = graph.node(graph.stream(stream).producer)
    if producer.kind != "splitter" or producer.param("time") is None:
        return ()
    window, slide = _switch_of(producer)[1:4:2]
    return (("ticks", True),) + ((("bounded", True),) if slide < window else ())


LOCAL_SINKS = ("file-sink", "console-sink", "discard-sink")
ROW_BY_ROW = ("filter", "project")  # at most one output row per input row


def carries_marks(graph: Graph, stream: str) -> bool:
    """Whether the channel of `stream` carries DPC marks (docs/availability.md, "Marks across
    channels"): its task holds a union or join with max-delay over a channel input, and every
    task reading it propagates them, through filters and projections of its own into a file
    or console sink that is no upsert log, a network sink (served marked) or a Kafka sink not
    in real-time mode, or into a window or updating aggregate straight into its sink
    (`_redoes`: checkpoint/redo); never a published stream (other queries read it unmarked)
    (pure)."""
    if stream in graph.published:
        return False
    cut = cut_streams(graph)
    return _dpc_before(graph, stream, cut) and all(
        _propagates(graph, c, cut) for c in graph.consumers(stream))


# what the runtime reads as a channel input of a DPC union or join, inside the task
CHANNEL_READERS_IN_TASK = ("network-source", "stream-source", "stream-selector")


def _dpc_before(graph: Graph, stream: str, cut: set[str]) -> bool:
    """Whether `stream`'s task holds, before it, a union or join with max-delay over a channel
    input: a stream crossing a task boundary, or one a network- or stream-source or a
    hot-standby selector of the task reads (the runtime's DPC controller watches each of them,
    `TaskRuntime._dpc`)."""
    todo, seen = [graph.producer(stream)], set()
    while todo:
        node = todo.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        if node.max_delay_ms is not None and any(
                i in cut or graph.producer(i).kind in CHANNEL_READERS_IN_TASK
                for i in node.inputs):
            return True
        todo += [graph.producer(i) for i in node.inputs if i not in cut]
    return False


def network_sink_marks(graph: Graph, sink: Node) -> bool:
    """Whether a network sink serves its rows with DPC marks (docs/availability.md, "What a
    reader of each sink sees"): its task holds a union or join with max-delay over a channel
    input, or its input comes through filters and projections of its task from a marked
    channel or network-source, so its results may be tentative; its readers (other queries,
    other programs) are told by the marked schema (pure)."""
    cut = cut_streams(graph)
    return _dpc_before(graph, sink.inputs[0], cut) or _marked_input(graph, sink.inputs[0], cut)


def _marked_input(graph: Graph, stream: str, cut: set[str]) -> bool:
    """Whether `stream` comes, through filters and projections of its task, from a marked
    input: a channel that carries marks, or a network-source with marks="dpc"."""
    while stream not in cut:
        node = graph.producer(stream)
        if node.kind == "network-source":
            return node.param("marks") == "dpc"
        if node.kind not in ROW_BY_ROW:
            return False
        stream = node.inputs[0]
    return carries_marks(graph, stream)


STATEFUL_REDO = ("window-aggregate", "aggregate")  # redone from a stable point downstream


def _redoes(graph: Graph, node: Node, cut: set[str]) -> bool:
    """Whether `node` is a stateful operator whose task keeps its output's stable view exact by
    checkpoint/redo (docs/availability.md, "A stateful downstream task"): an event-time window
    aggregate (no count or processing-time window) or an updating aggregate of the task, whose
    output goes straight to its file sink (not partitioned by time), console sink or Kafka
    sink (not in real-time mode), which write each batch tentative or stable as a whole."""
    if node.kind not in STATEFUL_REDO or node.output is None or node.output in cut:
        return False
    if node.kind == "window-aggregate" and (node.param("clock") == "processing"
                                            or node.param("rows") is not None):
        return False
    consumers = graph.consumers(node.output)
    return bool(consumers) and all(
        c.kind in ("file-sink", "console-sink") and not c.param("partition-by")
        or c.kind == "kafka-sink" and c.param("mode") != realtime.REAL_TIME
        for c in consumers)


def _propagates(graph: Graph, node: Node, cut: set[str]) -> bool:
    if _redoes(graph, node, cut):
        return True
    if node.kind in ("file-sink", "console-sink"):
        producer = _producer_through_plumbing(graph, node)
        return not updates(producer.kind, producer.param)  # (an upsert log keeps no marks)
    if node.kind in ("network-sink", "kafka-sink"):
        return node.param("mode") != realtime.REAL_TIME
    if node.kind not in ROW_BY_ROW or node.output is None or node.output in cut:
        return False
    return all(_propagates(graph, c, cut) for c in graph.consumers(node.output))


def writes_aggregate_locally(graph: Graph, plan: TaskPlan) -> bool:
    """Whether the task ends in a file or console sink fed, through filters and projections of
    the task, by a window aggregate of the task (pure): a micro-batch's output then holds the
    windows it closed, however many rows it read, so the task's sources may take large
    micro-batches (`TaskRuntime.large_batches`)."""
    root = graph.node(plan.nodes[-1])
    if root.kind not in LOCAL_SINKS or plan.outputs:
        return False
    members = set(plan.nodes)  # a set: a long chain is walked in linear time
    node = graph.node(graph.stream(root.inputs[0]).producer)
    while node.kind in ROW_BY_ROW and node.name in members:
        node = graph.node(graph.stream(node.inputs[0]).producer)
    return node.kind == "window-aggregate" and node.name in members


def _source_calls(graph: Graph, plan: TaskPlan, channels: Mapping[str, ChannelSpec],
                  schema_of: Callable[[str], SchemaRef], name: Callable[[str], str]) -> list[Call]:
    """One `channel_source` per input channel, except the replica channels of a stream selector
    in the task: one `selector_source` reads all of them."""
    selectors = [graph.node(n) for n in plan.nodes if graph.node(n).kind == "stream-selector"]
    selected = {s: sel for sel in selectors for s in sel.inputs}
    calls: list[Call] = []
    for c in plan.inputs:
        if c not in channels:
            continue  # another query's published stream: its stream-source's call reads it
        stream = channels[c].stream
        selector = selected.get(stream)
        if selector is None:
            ticks = _ticked(graph, stream)
            marks = (("marks", True),) if not ticks and carries_marks(graph, stream) else ()
            calls.append(Call(f"{stream} <- channel {c}", "channel_source",
                              (("output", name(stream)), ("schema", schema_of(stream)),
                               ("channel", c), *ticks, *marks)))
        elif stream == selector.inputs[0]:
            replicas = tuple(next(i for i in plan.inputs if channels[i].stream == s)
                             for s in selector.inputs)
            out = selector.output or ""
            calls.append(Call(_comment(graph, selector), "selector_source",
                              (("output", name(out)), ("schema", schema_of(out)),
                               ("channels", replicas))))
    return calls


def _sink_calls(graph: Graph, plan: TaskPlan, channels: Mapping[str, ChannelSpec],
                name: Callable[[str], str]) -> list[Call]:
    """The task's channel output: a splitter root partitions its input over its channels; any
    other root serves its output stream on its one channel. None when the task ends in a sink."""
    root = graph.node(plan.nodes[-1])
    if root.kind == "splitter":
        key = root.param("key")
        keys = () if key is None else ((key,) if isinstance(key, str) else tuple(key))
        active, time = root.param("active"), root.param("time")
        return [Call(f"{_comment(graph, root)} -> {len(plan.outputs)} partition channels",
                     "split_channel_sink",
                     (("input", name(root.inputs[0])), ("channels", plan.outputs), ("key", keys),
                      ("readers", tuple(channels[c].consumers for c in plan.outputs)),
                      *((("active", int(active)),)
                        if active is not None and int(active) != len(plan.outputs) else ()),
                      *((("switch", _switch_of(root)),) if time else ()),
                      *((("folded", True),) if root.param("folded") else ())))]
    if len(plan.outputs) > 1:
        raise ValueError(f"task {plan.task_id} serves {len(plan.outputs)} channels; only a "
                         "splitter serves several")
    return [Call(f"{channels[c].stream} -> channel {c}", "channel_sink",
                 (("input", name(channels[c].stream)), ("channel", c),
                  ("readers", channels[c].consumers),
                  *((("published", True),) if channels[c].stream in graph.published else ()),
                  *((("marks", True),) if carries_marks(graph, channels[c].stream) else ())))
            for c in plan.outputs]


def _placement_notes(plan: TaskPlan) -> str:
    """What the scheduler honours for the task, when it is more than "anywhere"."""
    p = plan.placement
    notes = [f"group {p.group}"] if p.group != plan.task_id else []
    notes += [f"apart from {', '.join(p.apart_from)}"] if p.apart_from else []
    notes += ([f"first launched apart from {', '.join(p.initially_apart_from)}"]
              if p.initially_apart_from else [])
    notes += [f"failover {plan.failover}"] if plan.failover else []
    return "; ".join(notes)


def _task_notation(graph: Graph, plan: TaskPlan) -> str:
    """The task's tree in the paper's notation; inputs from other tasks show as channels."""
    members = set(plan.nodes)

    def expand(node: Node) -> tuple[str, Iterator[Node | str]]:
        args = (graph.producer(s) if graph.stream(s).producer in members else f"channel {s}"
                for s in node.inputs)
        return f"{node.name} := {node.kind.replace('-', '_')}", args

    return render_term(graph.node(plan.nodes[-1]), expand)


def resolve_path(base_dir: Path, value: str) -> str:
    path = Path(value)
    return str(path if path.is_absolute() else (base_dir / path))


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _duration(ms: int | None) -> str | None:
    return None if ms is None else canonical_duration(ms)


@dataclass(frozen=True)
class CallSite:
    """What building one operator's call needs: the node, the plan's graph, the spec's folder,
    each stream's schema constant and its name in the program; `io`/`out` are the keyword
    arguments of the single input and the output (empty when there is none)."""

    graph: Graph
    node: Node
    base_dir: Path
    schema_of: Callable[[str], SchemaRef]
    name: Callable[[str], str]

    def p(self, key: str, default: Any = None) -> Any:
        return self.node.param(key, default)

    @property
    def io(self) -> tuple[tuple[str, Any], ...]:
        return (("input", self.name(self.node.inputs[0])),) if len(self.node.inputs) == 1 else ()

    @property
    def out(self) -> tuple[tuple[str, Any], ...]:
        return (("output", self.name(self.node.output)),) if self.node.output else ()

    def path(self, key: str) -> str | None:
        """A path parameter resolved against the spec's folder (None when not given)."""
        value = self.p(key)
        return value and resolve_path(self.base_dir, value)


Args = tuple[tuple[str, Any], ...]


def _generator(c: CallSite) -> Args:
    return c.out + (("schema", c.schema_of(c.node.produced)), ("shape", c.p("shape")),
                    ("seed", c.p("seed")), ("rate", float(c.p("rate"))), ("limit", c.p("limit")),
                    ("start", _iso(c.p("start"))))


def _file_source(c: CallSite) -> Args:
    path = resolve_path(c.base_dir, c.p("path"))
    fmt = c.p("format") or ("csv" if path.endswith(".csv") else "jsonl")
    rate = c.p("rate")
    return c.out + (("schema", c.schema_of(c.node.produced)), ("path", path), ("format", fmt),
                    ("rate", None if rate is None else float(rate)))


def _network_source(c: CallSite) -> Args:
    return c.out + (("schema", c.schema_of(c.node.produced)), ("endpoint", c.p("endpoint")),
                    ("channel", c.p("channel") or c.node.output)) + _given(
        ("reader", c.p("reader")), ("server_key", c.p("server-key")),
        ("key_file", c.path("key-file"))) + (
        (("marks", True),) if c.p("marks") == "dpc" else ())


def _stream_source(c: CallSite) -> Args:
    """Another query's published stream: the scheduler gives the endpoint and keys."""
    return c.out + (("schema", c.schema_of(c.node.produced)), ("stream", c.p("stream")),
                    ("start", c.p("start")))


def _kafka_source(c: CallSite) -> Args:
    """Its topics or pattern, canonical starting offsets (or a starting timestamp), which record
    field fills which declared column, its files resolved against the spec's folder, and for an
    instance's copy (`compiler.kafka_partitions`) its share of the partitions."""
    topics = parse_topics(c.p("topic")) if c.p("topic") is not None else ()
    start = c.p("starting-timestamp")
    metadata = tuple((METADATA_COLUMNS[name][0], c.p(name)) for name in METADATA_COLUMNS
                     if c.p(name) is not None)
    return c.out + (("schema", c.schema_of(c.node.produced)),
                    ("bootstrap", parse_bootstrap(c.p("bootstrap")))) + _given(
        ("topics", topics or None), ("topic_pattern", c.p("topic-pattern"))) + (
        ("starting_offsets", parse_starting_offsets(c.p("starting-offsets"), topics)),) + _given(
        ("starting_timestamp", start and _iso(start))) + (
        ("format", c.p("format")), ("metadata", metadata)) + _given(
        ("dead_letter", c.path("dead-letter")), ("security_file", c.path("security-file")),
        ("max_records", c.p("max-records-per-batch")),
        # an instance's copy of the source (compiler.kafka_partitions): its share of partitions
        ("share", c.p("share")), ("shares", c.p("shares")))


def _filter(c: CallSite) -> Args:
    return c.io + c.out + (("condition", c.p("condition")),)


def _project(c: CallSite) -> Args:
    return c.io + c.out + (("fields", c.p("fields")),)


def _window_aggregate(c: CallSite) -> Args:
    return c.io + c.out + (("time", c.p("time")), ("window", _duration(c.p("size"))),
                           ("slide", _duration(c.p("slide"))),
                           ("watermark", _duration(c.p("watermark"))),
                           ("group_by", tuple(c.p("group-by", ()))),
                           ("aggregates", c.p("aggregates"))) + _given(
        ("gap", _duration(c.p("gap"))), ("clock", c.p("clock")), ("rows", c.p("rows")))


def _updating_aggregate(c: CallSite) -> Args:
    return c.io + c.out + (("time", c.p("time")), ("ttl", _duration(c.p("ttl"))),
                           ("watermark", _duration(c.p("watermark"))),
                           ("group_by", tuple(c.p("group-by", ()))),
                           ("aggregates", c.p("aggregates")))


def _top_n(c: CallSite) -> Args:
    return c.io + c.out + (("time", c.p("time")), ("window", _duration(c.p("size"))),
                           ("slide", _duration(c.p("slide"))),
                           ("watermark", _duration(c.p("watermark"))),
                           ("group_by", tuple(c.p("group-by", ()))), ("n", c.p("n")),
                           ("order_by", c.p("order-by"))) + _given(
        ("ttl", _duration(c.p("ttl"))))


def _deduplicate(c: CallSite) -> Args:
    return c.io + c.out + (("keys", tuple(c.p("key"))), ("time", c.p("time")),
                           ("watermark", _duration(c.p("watermark"))))


def _pattern(c: CallSite) -> Args:
    return c.io + c.out + (("time", c.p("time")),
                           ("partition_by", tuple(c.p("partition-by", ()))),
                           ("pattern", c.p("pattern")), ("within", _duration(c.p("within"))),
                           ("watermark", _duration(c.p("watermark"))),
                           ("defines", c.p("defines")), ("measures", c.p("measures")),
                           ("max_partial", c.p("max-partial-matches")),
                           ("after_match", c.p("after-match"))) + _share(c.graph, c.node) \
        + _stage(c.graph, c.node, c.schema_of)


def _join(c: CallSite) -> Args:
    return (("left", c.name(c.node.inputs[0])), ("right", c.name(c.node.inputs[1]))) + c.out + (
        ("left_keys", c.p("left-key")), ("right_keys", c.p("right-key")),
        ("left_time", c.p("left-time")), ("right_time", c.p("right-time")),
        ("within", _duration(c.p("within"))), ("watermark", _duration(c.p("watermark")))
    ) + _given(("right_end", c.p("right-end")), ("max_delay", _duration(c.node.max_delay_ms)))


def _lookup_join(c: CallSite) -> Args:
    """Its side file resolved against the spec's folder, with its format and the declared
    type's columns (the task reads and checks the file when it starts)."""
    path = resolve_path(c.base_dir, c.p("path"))
    return c.io + c.out + (("path", path), ("format", format_of(path, c.p("format"))),
                           ("side", c.p("side-type")), ("side_columns", c.p("side-columns")),
                           ("left_keys", c.p("left-key")), ("right_keys", c.p("right-key")))


def _drop(c: CallSite) -> Args:
    return c.io + c.out + (("ratio", float(c.p("ratio", 0.0))),
                           ("high_ratio", float(c.p("high-ratio", 0.0))),
                           ("mode", c.p("mode") or "random"), ("seed", int(c.p("seed", 0)))) \
        + _given(("keep", c.p("keep")))


def _union(c: CallSite) -> Args:
    return (("inputs", tuple(map(c.name, c.node.inputs))),) + c.out + \
        _given(("max_delay", _duration(c.node.max_delay_ms)))


def _merger(c: CallSite) -> Args:
    """A union of a partitioned operator's instances that waits for a cut active one, never for
    a dormant or retired one (`TaskRuntime.union`'s `merger`, `common.dpc.waited_for`)."""
    return _union(c) + (("merger", True),)


def _identity(c: CallSite) -> Args:
    return c.io + c.out


def _file_sink(c: CallSite) -> Args:
    """Its file; behind an updating aggregate or top-n (through forwarding plumbing), their
    records' key (`_upsert_key`), which makes the file an upsert log; partitioned by time, its
    time column and its folders' pattern (canonical text, which the executor parses again)."""
    by = c.p("partition-by")
    levels = None if by is None else time_partitions.canonical(time_partitions.parse(by)[0])
    producer = _producer_through_plumbing(c.graph, c.node)
    key, deletes = _upsert_key(producer)
    return c.io + (("path", c.path("path")),) + _given(
        ("upsert_key", key), ("partition_time", c.p("partition-time")),
        ("partition_by", levels), ("upsert_deletes_by", deletes))


def _producer_through_plumbing(graph: Graph, sink: Node) -> Node:
    """The operator whose results a sink writes, through any forwarding plumbing."""
    producer = graph.producer(sink.inputs[0])
    while producer.kind in _PASS_THROUGH + ("splitter", "merger"):
        producer = graph.producer(producer.inputs[0])
    return producer


def _upsert_key(producer: Node) -> tuple[tuple[str, ...] | None, str | None]:
    """The key of an updating producer's records (an aggregate's group columns; an updating
    top-n's and its rank, whose negative values are deletions) and that deleting column."""
    if not updates(producer.kind, producer.param):
        return None, None
    groups = tuple(producer.param("group-by", ()))
    if producer.kind == "top-n":
        return (*groups, RANK_COLUMN), RANK_COLUMN
    return groups, None


def _io_only(c: CallSite) -> Args:
    return c.io


def _network_sink(c: CallSite) -> Args:
    marks = (("marks", True),) if network_sink_marks(c.graph, c.node) else ()
    return c.io + (("endpoint", c.p("endpoint")), ("channel", c.p("channel") or c.node.inputs[0])) \
        + _given(("readers", c.p("readers")), ("key_file", c.path("key-file"))) + marks


def _kafka_sink(c: CallSite) -> Args:
    return c.io + (("bootstrap", parse_bootstrap(c.p("bootstrap"))), ("topic", c.p("topic")),
                   ("format", c.p("format")), ("delivery", c.p("delivery"))) + _given(
        ("key_column", c.p("key-column")), ("security_file", c.path("security-file")))


def kafka_sink_ref(node: Node, base_dir: Path) -> dict[str, str]:
    """How a reader reaches a kafka-sink's topic (`CompiledQuery.kafka_sinks`): its bootstrap,
    topic and format, and its security file resolved as the task's is."""
    ref = {"bootstrap": parse_bootstrap(node.param("bootstrap")), "topic": node.param("topic"),
           "format": node.param("format") or "jsonl"}
    security = node.param("security-file")
    return {**ref, "security_file": str(resolve_path(base_dir, security))} if security else ref


def _control_sink(c: CallSite) -> Args:
    return c.io + (("scheduler", c.p("scheduler")),)  # None: $ELASTIQ_SCHEDULER, else the default


# Each operator kind's runtime method and the keyword arguments of its call (after `op=`), beside
# `compiler.validate._RESOLVERS` (its output type): a new kind adds one entry in each. A merger
# recombines partitions, a union of them; plumbing that only forwards is the identity. A
# stream selector and a splitter have none: their channel calls stand for them.
_CALLS: dict[str, tuple[str, Callable[[CallSite], Args]]] = {
    "generator": ("generator", _generator),
    "file-source": ("file_source", _file_source),
    "network-source": ("network_source", _network_source),
    "stream-source": ("stream_source", _stream_source),
    "kafka-source": ("kafka_source", _kafka_source),
    "filter": ("filter", _filter),
    "project": ("project", _project),
    "window-aggregate": ("window_aggregate", _window_aggregate),
    "aggregate": ("updating_aggregate", _updating_aggregate),
    "deduplicate": ("deduplicate", _deduplicate),
    "top-n": ("top_n", _top_n),
    "pattern": ("pattern", _pattern),
    "join": ("join", _join),
    "lookup-join": ("lookup_join", _lookup_join),
    "union": ("union", _union),
    "drop": ("drop", _drop),
    "merger": ("union", _merger),
    **{kind: ("identity", _identity) for kind in _PASS_THROUGH},
    "file-sink": ("file_sink", _file_sink),
    "console-sink": ("console_sink", _io_only),
    "discard-sink": ("discard_sink", _io_only),
    "network-sink": ("network_sink", _network_sink),
    "kafka-sink": ("kafka_sink", _kafka_sink),
    "control-sink": ("control_sink", _control_sink),
}


def _call(graph: Graph, node: Node, base_dir: Path, schema_of: Callable[[str], SchemaRef],
          name: Callable[[str], str]) -> Call:
    """The runtime call of one operator (`_CALLS`); `name` gives each stream's name in the
    program."""
    if node.kind not in _CALLS:
        raise ValueError(f"no code generator for operator kind {node.kind!r}")
    method, build = _CALLS[node.kind]
    comment = _comment(graph, node)
    if node.output and name(node.output) != node.output:
        comment += f"  (its output is read as {name(node.output)}, the spec's name)"
    args = build(CallSite(graph, node, base_dir, schema_of, name))
    return Call(comment, method, (("op", node.name),) + args)


def _share(graph: Graph, node: Node) -> tuple[tuple[str, Any], ...]:
    """`share=(i, k)` for a pattern instance whose reader carries its share of the partial
    matches (rewrite_rules/pattern-partitioning.rule); nothing for any other pattern."""
    producer = graph.producer(node.inputs[0])
    share = producer.param("share") if producer.kind == "network-reader" else None
    return () if share is None else (("share", (share, producer.param("shares"))),)


def _stage(graph: Graph, node: Node, schema_of: Callable[[str], SchemaRef]
           ) -> tuple[tuple[str, Any], ...]:
    """`stage=(i, k, rows)` for stage i of a pipelined pattern operator, whose reader carries it
    (rewrite_rules/pattern-pipelining.rule), and for a stage after the first, `row_schema`: the
    type of the rows the first stage reads, which its partial matches hold; nothing for any
    other pattern."""
    reader = graph.producer(node.inputs[0])
    if reader.kind != "network-reader" or reader.param("stage") is None:
        return ()
    stage = (reader.param("stage"), reader.param("stages"), reader.param("stage-rows"))
    if stage[0] == 1:
        return (("stage", stage),)
    first = reader
    while first.param("stage") != 1:  # reader <- writer <- stage i-1 <- its reader ...
        first = graph.producer(graph.producer(graph.producer(first.inputs[0]).inputs[0]).inputs[0])
    return (("stage", stage), ("row_schema", schema_of(first.produced)))


def _given(*args: tuple[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The keyword arguments whose value the spec gave (optional key parameters)."""
    return tuple((k, v) for k, v in args if v is not None)


def _comment(graph: Graph, node: Node) -> str:
    ups = ", ".join(graph.stream(s).producer for s in node.inputs)
    kind = node.kind.replace("-", "_")
    return f"{node.name} := {kind}({ups})" if ups else f"{node.name} := {kind}"
