"""Task programs: one readable Python module per query task, rendered with jinja2.

Owns turning a `TaskPlan` of a graph into the source of the program the executor runs: a
`build(rt)` function that calls the task runtime (`executor.runtime.TaskRuntime`) once per
operator, in dataflow order, ending with the task's one output (a sink or a channel). Plumbing
becomes channel calls: pass-through plumbing an `identity`, a merger a `union`, a splitter root
one `split_channel_sink` over its partition channels, a stream selector one `selector_source`
over its replica channels; a hot-standby replica first asks for deterministic batches. Every value
that came from the user is written as a Python literal by `py_literal` (repr of a str, int, float,
bool, None, or a tuple of those): user text can never become code (DESIGN.md invariant 4).
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
from common.tasks import ChannelSpec
from common.types import Schema
from compiler.graph import Graph, Node, render_term
from compiler.operators import canonical_duration
from compiler.tasks import TaskPlan

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
    plumbing (a network-reader, writer, multicast or splitter in front of it) reads its input
    under the name of the stream the spec's operator read, since its expressions are written
    against that name (`aStream.x < 42`). A name already used in the task is left alone."""
    members = set(plan.nodes)
    used = {channels[c].stream for c in plan.inputs}
    used |= {graph.node(n).output for n in members if graph.node(n).output is not None}
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
    """The stream before any chain of forwarding plumbing that produces `stream`."""
    producer = graph.producer(stream)
    while producer.kind in _FORWARDING:
        stream = producer.inputs[0]
        producer = graph.producer(stream)
    return stream


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


LOCAL_SINKS = ("file-sink", "console-sink")
ROW_BY_ROW = ("filter", "project")  # at most one output row per input row


def writes_aggregate_locally(graph: Graph, plan: TaskPlan) -> bool:
    """Whether the task ends in a file or console sink fed, through filters and projections of
    the task, by a window aggregate of the task (pure): a micro-batch's output then holds the
    windows it closed, however many rows it read, so the task's sources may take large
    micro-batches (`TaskRuntime.large_batches`)."""
    root = graph.node(plan.nodes[-1])
    if root.kind not in LOCAL_SINKS or plan.outputs:
        return False
    node = graph.node(graph.stream(root.inputs[0]).producer)
    while node.kind in ROW_BY_ROW and node.name in plan.nodes:
        node = graph.node(graph.stream(node.inputs[0]).producer)
    return node.kind == "window-aggregate" and node.name in plan.nodes


def _source_calls(graph: Graph, plan: TaskPlan, channels: Mapping[str, ChannelSpec],
                  schema_of: Callable[[str], SchemaRef], name: Callable[[str], str]) -> list[Call]:
    """One `channel_source` per input channel, except the replica channels of a stream selector
    in the task: one `selector_source` reads all of them."""
    selectors = [graph.node(n) for n in plan.nodes if graph.node(n).kind == "stream-selector"]
    selected = {s: sel for sel in selectors for s in sel.inputs}
    calls: list[Call] = []
    for c in plan.inputs:
        stream = channels[c].stream
        selector = selected.get(stream)
        if selector is None:
            ticks = _ticked(graph, stream)
            calls.append(Call(f"{stream} <- channel {c}", "channel_source",
                              (("output", name(stream)), ("schema", schema_of(stream)),
                               ("channel", c), *ticks)))
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
                  ("readers", channels[c].consumers)))
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


def _call(graph: Graph, node: Node, base_dir: Path, schema_of: Callable[[str], SchemaRef],
          name: Callable[[str], str]) -> Call:
    """The runtime call of one operator; `name` gives each stream's name in the program."""
    p = node.param
    io: tuple[tuple[str, Any], ...]
    if len(node.inputs) == 1:
        io = (("input", name(node.inputs[0])),)
    else:
        io = ()
    out = (("output", name(node.output)),) if node.output else ()
    head = (("op", node.name),)
    kind = node.kind
    comment = _comment(graph, node)
    if node.output and name(node.output) != node.output:
        comment += f"  (its output is read as {name(node.output)}, the spec's name)"
    if kind == "generator":
        args = out + (("schema", schema_of(node.output)), ("shape", p("shape")),
                      ("seed", p("seed")), ("rate", float(p("rate"))), ("limit", p("limit")),
                      ("start", _iso(p("start"))))
    elif kind == "file-source":
        path = resolve_path(base_dir, p("path"))
        fmt = p("format") or ("csv" if path.endswith(".csv") else "jsonl")
        rate = p("rate")
        args = out + (("schema", schema_of(node.output)), ("path", path), ("format", fmt),
                      ("rate", None if rate is None else float(rate)))
    elif kind == "network-source":
        args = out + (("schema", schema_of(node.output)), ("endpoint", p("endpoint")),
                      ("channel", p("channel") or node.output)) + _given(
            ("reader", p("reader")), ("server_key", p("server-key")),
            ("key_file", p("key-file") and resolve_path(base_dir, p("key-file"))))
    elif kind == "kafka-source":
        args = out + (("schema", schema_of(node.output)),) + _kafka_source_args(node, base_dir)
    elif kind == "filter":
        args = io + out + (("condition", p("condition")),)
    elif kind == "project":
        args = io + out + (("fields", p("fields")),)
    elif kind == "window-aggregate":
        args = io + out + (("time", p("time")), ("window", _duration(p("size"))),
                           ("slide", _duration(p("slide"))),
                           ("watermark", _duration(p("watermark"))),
                           ("group_by", tuple(p("group-by", ()))),
                           ("aggregates", p("aggregates")))
    elif kind == "pattern":
        args = io + out + (("time", p("time")), ("partition_by", tuple(p("partition-by", ()))),
                           ("pattern", p("pattern")), ("within", _duration(p("within"))),
                           ("watermark", _duration(p("watermark"))),
                           ("defines", p("defines")), ("measures", p("measures")),
                           ("max_partial", p("max-partial-matches")),
                           ("after_match", p("after-match"))) + _share(graph, node) \
            + _stage(graph, node, schema_of)
    elif kind == "join":
        args = (("left", name(node.inputs[0])), ("right", name(node.inputs[1]))) + out + (
            ("left_keys", p("left-key")), ("right_keys", p("right-key")),
            ("left_time", p("left-time")), ("right_time", p("right-time")),
            ("within", _duration(p("within"))), ("watermark", _duration(p("watermark"))))
    elif kind in ("union", "merger"):  # a merger recombines partitions: a union of them
        return Call(comment, "union", head + (("inputs", tuple(map(name, node.inputs))),) + out)
    elif kind in _PASS_THROUGH:
        return Call(comment, "identity", head + io + out)
    elif kind == "file-sink":
        args = io + (("path", resolve_path(base_dir, p("path"))),)
    elif kind == "console-sink":
        args = io
    elif kind == "network-sink":
        args = io + (("endpoint", p("endpoint")), ("channel", p("channel") or node.inputs[0])) \
            + _given(("readers", p("readers")),
                     ("key_file", p("key-file") and resolve_path(base_dir, p("key-file"))))
    elif kind == "kafka-sink":
        args = io + (("bootstrap", parse_bootstrap(p("bootstrap"))), ("topic", p("topic")),
                     ("format", p("format")), ("delivery", p("delivery"))) + _given(
            ("key_column", p("key-column")),
            ("security_file", p("security-file") and resolve_path(base_dir, p("security-file"))))
    elif kind == "control-sink":  # None: the executor's ELASTIQ_SCHEDULER, else the default
        args = io + (("scheduler", p("scheduler")),)
    else:
        raise ValueError(f"no code generator for operator kind {kind!r}")
    return Call(comment, kind.replace("-", "_"), head + args)


def _kafka_source_args(node: Node, base_dir: Path) -> tuple[tuple[str, Any], ...]:
    """A kafka-source's runtime arguments: its topics or pattern, canonical starting offsets
    (or a starting timestamp), which record field fills which declared column, and its files
    resolved against the spec's folder."""
    p = node.param
    topics = parse_topics(p("topic")) if p("topic") is not None else ()
    start = p("starting-timestamp")
    metadata = tuple((METADATA_COLUMNS[name][0], p(name)) for name in METADATA_COLUMNS
                     if p(name) is not None)
    return (("bootstrap", parse_bootstrap(p("bootstrap"))),) + _given(
        ("topics", topics or None), ("topic_pattern", p("topic-pattern"))) + (
        ("starting_offsets", parse_starting_offsets(p("starting-offsets"), topics)),) + _given(
        ("starting_timestamp", start and _iso(start))) + (
        ("format", p("format")), ("metadata", metadata)) + _given(
        ("dead_letter", p("dead-letter") and resolve_path(base_dir, p("dead-letter"))),
        ("security_file", p("security-file") and resolve_path(base_dir, p("security-file"))),
        ("max_records", p("max-records-per-batch")))


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
    return (("stage", stage), ("row_schema", schema_of(first.output)))


def _given(*args: tuple[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The keyword arguments whose value the spec gave (optional key parameters)."""
    return tuple((k, v) for k, v in args if v is not None)


def _comment(graph: Graph, node: Node) -> str:
    ups = ", ".join(graph.stream(s).producer for s in node.inputs)
    kind = node.kind.replace("-", "_")
    return f"{node.name} := {kind}({ups})" if ups else f"{node.name} := {kind}"
