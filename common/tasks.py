"""Compiled queries and their tasks: what crosses from the compiler to the scheduler and the
executors.

Owns the `QueryTask`, `ChannelSpec`, `Placement`, `Resources` and `CompiledQuery` values (serialised
as JSON in Mesos task data), the ids of channels and of a splitter operator, and how many agents
a query's first launch needs. Does not own cutting a graph into tasks (`compiler.tasks`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Sequence

from common.types import Schema

if TYPE_CHECKING:
    from common.control import ControlCatalog

TaskKind = Literal["spark", "plumbing"]
# How the scheduler fails a task over (docs/patterns.md): "standby" and "checkpoint" restart it at
# once on another agent than the one it failed on (its checkpoint folder is on storage every
# agent reaches); "replica" is one of several hot-standby replicas, restarted like any task while
# the stream selector reads the others; None: the default restart policy.
FailoverMode = Literal["standby", "checkpoint", "replica"]


@dataclass(frozen=True)
class Resources:
    """What one task asks of an agent, on top of its executor's own share."""

    cpus: float = 1.0
    mem_mb: int = 512
    ports: int = 0  # one port per output channel the task serves

    def to_json(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "mem_mb": self.mem_mb, "ports": self.ports}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Resources":
        return cls(float(d["cpus"]), int(d["mem_mb"]), int(d["ports"]))


@dataclass(frozen=True)
class ChannelSpec:
    """A stream that crosses from one task to others; its producer serves it on a port."""

    channel_id: str  # "<query>/<stream>"
    stream: str
    schema: Schema
    producer: str  # task id
    consumers: tuple[str, ...]  # task ids

    def to_json(self) -> dict[str, Any]:
        return {
            "channel_id": self.channel_id,
            "stream": self.stream,
            "schema": self.schema.to_json(),
            "producer": self.producer,
            "consumers": list(self.consumers),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ChannelSpec":
        return cls(
            d["channel_id"], d["stream"], Schema.from_json(d["schema"]), d["producer"],
            tuple(d["consumers"]),
        )


@dataclass(frozen=True)
class Placement:
    """Where a task may go: `group` names a placement annotation (`@p1`); tasks whose groups
    differ and that list each other in `apart_from` must land on distinct agents."""

    group: str | None = None
    apart_from: tuple[str, ...] = ()
    # groups kept apart at the first launch only: a protected task starts away from its
    # neighbours, so one agent's failure takes it alone; its failover may land next to them
    initially_apart_from: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "apart_from": list(self.apart_from),
                "initially_apart_from": list(self.initially_apart_from)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Placement":
        return cls(d.get("group"), tuple(d.get("apart_from", ())),
                   tuple(d.get("initially_apart_from", ())))


@dataclass(frozen=True)
class QueryTask:
    """One schedulable task of a query, with the program the executor runs for it."""

    query_id: str
    task_id: str  # "<query>.t<n>", unique within the query's deployment
    kind: TaskKind
    operators: tuple[str, ...]  # operator names, in dataflow order
    inputs: tuple[str, ...]  # channel ids read from other tasks
    outputs: tuple[str, ...]  # channel ids served to other tasks
    stateful: bool
    resources: Resources
    program: str  # generated Python source (compiler.codegen)
    placement: Placement = field(default_factory=Placement)
    failover: FailoverMode | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id,
            "task_id": self.task_id,
            "kind": self.kind,
            "operators": list(self.operators),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "stateful": self.stateful,
            "resources": self.resources.to_json(),
            "program": self.program,
            "placement": self.placement.to_json(),
            "failover": self.failover,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "QueryTask":
        return cls(
            d["query_id"], d["task_id"], d["kind"], tuple(d["operators"]), tuple(d["inputs"]),
            tuple(d["outputs"]), bool(d["stateful"]), Resources.from_json(d["resources"]),
            d["program"], Placement.from_json(d.get("placement", {})), d.get("failover"),
        )


PLANNED_GRID_MS = 1000  # a join's switch times are whole seconds of event time


@dataclass(frozen=True)
class ElasticOperator:
    """A partitioned operator whose parallelism may change while its query runs: its instance
    tasks by slot (slot i reads partition channel #i of every splitter feeding it), the
    splitters that route to the first `parallelism` slots, and the bounds and mode of its
    run-time parallelism (docs/elasticity.md)."""

    operator: str  # the spec operator
    slots: tuple[str, ...]  # instance task ids, slot 1..max in order
    splitters: tuple[tuple[str, str], ...]  # (task id, program operator id) of each splitter
    initial: int  # instances the query starts with
    minimum: int
    mode: str = "manual"  # manual | auto (the scheduler chooses within minimum..len(slots))
    stateful: bool = False
    # a stateful operator's event-time column: its splitters switch routing at a window
    # boundary of it and the instances a scale-in retires finish the windows before that
    switch_time: str | None = None
    # event time after a switch by which the old instances emitted all they own (ms: a
    # window's size minus its slide, 0 for a tumbling window; a join's bound)
    switch_close_ms: int = 0
    # a join's: each splitter's spread (ms, in `splitters` order); the scheduler plans their
    # common switch time (empty: each splitter picks its own, the next window start)
    planned_spreads: tuple[int, ...] = ()
    # a stateless operator that may run folded (min-parallelism 0): the task that runs its
    # folded instance, which parallelism 0 routes every row to (rewrite_rules/folding.rule)
    folded_into: str | None = None

    @property
    def maximum(self) -> int:
        return len(self.slots)

    def to_json(self) -> dict[str, Any]:
        return {"operator": self.operator, "slots": list(self.slots),
                "splitters": [list(s) for s in self.splitters], "initial": self.initial,
                "minimum": self.minimum, "mode": self.mode, "stateful": self.stateful,
                "switch_time": self.switch_time, "switch_close_ms": self.switch_close_ms,
                "planned_spreads": list(self.planned_spreads), "folded_into": self.folded_into}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ElasticOperator":
        return cls(str(d["operator"]), tuple(d["slots"]),
                   tuple((str(t), str(o)) for t, o in d["splitters"]), int(d["initial"]),
                   int(d["minimum"]), str(d.get("mode", "manual")), bool(d.get("stateful")),
                   d.get("switch_time"), int(d.get("switch_close_ms", 0)),
                   tuple(int(s) for s in d.get("planned_spreads", ())), d.get("folded_into"))


@dataclass(frozen=True)
class StreamImport:
    """A stream another query publishes, read by one task of this query (a `stream-source`):
    the scheduler checks at submit that a query publishes it with this schema, and wires the
    writer's endpoint and keys into the reading task (docs/queries.md)."""

    channel_id: str  # "<writer query>/<stream>"
    task_id: str  # the reading task of this query
    schema: Schema  # what the reader declared
    where: str  # file:line:column of the stream-source's `stream` value, for refusals
    start: str = "retained"  # retained | now
    auto: bool = False  # automatic sharing: an equal running subgraph's stream, not written

    def to_json(self) -> dict[str, Any]:
        return {"channel_id": self.channel_id, "task_id": self.task_id,
                "schema": self.schema.to_json(), "where": self.where, "start": self.start,
                **({"auto": True} if self.auto else {})}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "StreamImport":
        return cls(str(d["channel_id"]), str(d["task_id"]), Schema.from_json(d["schema"]),
                   str(d.get("where", "")), str(d.get("start", "retained")),
                   bool(d.get("auto", False)))

    @property
    def writer(self) -> str:
        """The query id of the writer."""
        return self.channel_id.rpartition("/")[0]


@dataclass(frozen=True)
class OperatorPlan:
    """One operator of the physical plan as an update compares it (`scheduler.update_plan`,
    docs/queries.md "Updating a running query"): two plans' operators of one name are the same
    when their signatures are; a stateful operator's state carries over a change when its state
    signatures are."""

    name: str
    kind: str
    task_id: str  # the task that runs it
    signature: str  # its kind, parameters, inputs with their types, output type, patterns
    state: str | None  # what its state is made of (kind, input types, its parameters: key,
    # window, aggregates, watermark); None: stateless
    where: str  # file:line:column of its declaration (the dataflow's for rule-made operators)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "task_id": self.task_id,
                "signature": self.signature, "state": self.state, "where": self.where}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "OperatorPlan":
        return cls(str(d["name"]), str(d["kind"]), str(d["task_id"]), str(d["signature"]),
                   None if d.get("state") is None else str(d["state"]), str(d.get("where", "")))


@dataclass(frozen=True)
class CompiledQuery:
    """Everything the scheduler needs to deploy one query."""

    query_id: str
    tasks: tuple[QueryTask, ...]
    channels: tuple[ChannelSpec, ...]
    sinks: dict[str, str] = field(default_factory=dict)  # sink operator -> output path, if a file
    controls: "ControlCatalog | None" = None  # what may change while it runs (common.control)
    elastic: tuple[ElasticOperator, ...] = ()  # operators whose parallelism may change
    # every sink operator -> its `weight` (what its results are worth when load is shed,
    # docs/load.md); the scheduler's shedding plan reads it
    weights: dict[str, float] = field(default_factory=dict)
    # channel ids of the streams this query publishes (their ChannelSpec is in `channels`)
    published: tuple[str, ...] = ()
    imports: tuple[StreamImport, ...] = ()  # other queries' published streams it reads
    operators: tuple[OperatorPlan, ...] = ()  # the physical plan's operators, for updates
    # (channel id, canonical form) of the channels it serves that other queries may read
    # instead of computing an equal stream (automatic sharing, `compiler.autoshare`)
    shareable: tuple[tuple[str, str], ...] = ()
    # `distribute="true"` on <dataflow>: the scheduler's load distributor may move its running
    # tasks between agents (docs/load.md); off by default, a move pauses a task
    distribute: bool = False
    # kafka-sink operator -> how a reader reaches its topic: bootstrap, topic, format and, if
    # given, security_file (`elastiq tail QUERY SINK --stable`, docs/kafka.md)
    kafka_sinks: dict[str, dict[str, str]] = field(default_factory=dict)

    def elastic_operator(self, operator: str) -> ElasticOperator | None:
        return next((e for e in self.elastic if e.operator == operator), None)

    def task(self, task_id: str) -> QueryTask:
        for t in self.tasks:
            if t.task_id == task_id:
                return t
        raise KeyError(task_id)

    def to_json(self) -> str:
        return json.dumps({
            "query_id": self.query_id,
            "tasks": [t.to_json() for t in self.tasks],
            "channels": [c.to_json() for c in self.channels],
            "sinks": self.sinks,
            "controls": self.controls.to_json() if self.controls is not None else None,
            "elastic": [e.to_json() for e in self.elastic],
            "weights": self.weights,
            "published": list(self.published),
            "imports": [i.to_json() for i in self.imports],
            "operators": [o.to_json() for o in self.operators],
            "shareable": [list(p) for p in self.shareable],
            "distribute": self.distribute,
            "kafka_sinks": self.kafka_sinks,
        })

    @classmethod
    def from_json(cls, text: str) -> "CompiledQuery":
        from common.control import ControlCatalog

        d = json.loads(text)
        return cls(
            d["query_id"], tuple(QueryTask.from_json(t) for t in d["tasks"]),
            tuple(ChannelSpec.from_json(c) for c in d["channels"]), dict(d.get("sinks", {})),
            ControlCatalog.from_json(d.get("controls")),
            tuple(ElasticOperator.from_json(e) for e in d.get("elastic", [])),
            {str(k): float(v) for k, v in d.get("weights", {}).items()},
            tuple(str(c) for c in d.get("published", ())),
            tuple(StreamImport.from_json(i) for i in d.get("imports", ())),
            tuple(OperatorPlan.from_json(o) for o in d.get("operators", ())),
            tuple((str(c), str(f)) for c, f in d.get("shareable", ())),
            bool(d.get("distribute", False)),
            {str(k): {str(a): str(b) for a, b in v.items()}
             for k, v in d.get("kafka_sinks", {}).items()},
        )


def channel_id(query_id: str, stream: str) -> str:
    return f"{query_id}/{stream}"


def partition_channel_id(query_id: str, stream: str, partition: int) -> str:
    """The channel carrying partition `partition` (1-based) of a splitter's output stream."""
    return f"{query_id}/{stream}#{partition}"


def agents_needed(tasks: "Sequence[QueryTask]") -> int:
    """How many agents a query's first launch needs so that every task is apart from the groups
    its placement names (`apart_from` and `initially_apart_from`, either way round): a greedy
    colouring in task order, which for the patterns' constraints (a star around a protected
    task, a clique of replicas or partitions) is exact."""
    groups = {t.task_id: t.placement.group or t.task_id for t in tasks}
    apart = {t.task_id: set(t.placement.apart_from) | set(t.placement.initially_apart_from)
             for t in tasks}
    colour: dict[str, int] = {}
    for t in tasks:
        clash = {colour[o.task_id] for o in tasks if o.task_id in colour
                 and groups[o.task_id] != groups[t.task_id]
                 and (groups[o.task_id] in apart[t.task_id]
                      or groups[t.task_id] in apart[o.task_id])}
        colour[t.task_id] = next(c for c in range(len(tasks) + 1) if c not in clash)
    return max(colour.values(), default=0) + 1


def splitter_op_id(channels: "Sequence[str]") -> str:
    """The program's operator id of the splitter that serves `channels` (compiler and runtime)."""
    return "split:" + "+".join(channels)
