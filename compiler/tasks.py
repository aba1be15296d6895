"""Query tasks: the unit the scheduler places and the executor runs.

Owns the `QueryTask` and `ChannelSpec` values (what crosses from the compiler to the scheduler,
serialised as JSON in Mesos task data) and `split_into_tasks`, which cuts a physical graph into
tasks. By default tasks are few and large, as the paper says: a task is a tree of operators ending
in one output (a sink or a channel to other tasks), so a simple query costs one Spark query.
A stream becomes a channel between tasks only where it has several consumers or where the plan
asks for a task boundary (`pipeline="split"` and the rewrite rules of the patterns).
Does not own how a task's program looks (`compiler.codegen`) or where it runs (`scheduler`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from compiler.types import Schema

if TYPE_CHECKING:
    from compiler.graph import Graph

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


@dataclass(frozen=True)
class CompiledQuery:
    """Everything the scheduler needs to deploy one query."""

    query_id: str
    tasks: tuple[QueryTask, ...]
    channels: tuple[ChannelSpec, ...]
    sinks: dict[str, str] = field(default_factory=dict)  # sink operator -> output path, if a file

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
        })

    @classmethod
    def from_json(cls, text: str) -> "CompiledQuery":
        d = json.loads(text)
        return cls(
            d["query_id"], tuple(QueryTask.from_json(t) for t in d["tasks"]),
            tuple(ChannelSpec.from_json(c) for c in d["channels"]), dict(d.get("sinks", {})),
        )


# ----------------------------------------------------------------------------------------------
# Splitting a physical graph into tasks

@dataclass(frozen=True)
class TaskPlan:
    """The operators of one task before its program is generated."""

    task_id: str
    nodes: tuple[str, ...]  # node names in dataflow order
    inputs: tuple[str, ...]  # streams read from other tasks' channels
    output: str | None  # stream served to other tasks, None when the task ends in a sink
    stateful: bool


def channel_id(query_id: str, stream: str) -> str:
    return f"{query_id}/{stream}"


def partition_channel_id(query_id: str, stream: str, partition: int) -> str:
    """The channel carrying partition `partition` (1-based) of a splitter's output stream."""
    return f"{query_id}/{stream}#{partition}"


def cut_streams(graph: "Graph") -> set[str]:
    """Streams that cross a task boundary: read by several operators, or joining operators the
    plan places apart (different placement annotations)."""
    cuts = set()
    for stream in graph.streams:
        consumers = graph.consumers(stream.name)
        producer = graph.node(stream.producer)
        if len(consumers) > 1 or any(c.placement != producer.placement for c in consumers):
            cuts.add(stream.name)
    return cuts


def split_into_tasks(graph: "Graph", query_id: str) -> tuple[tuple[TaskPlan, ...],
                                                            tuple[ChannelSpec, ...]]:
    """Cut the graph at `cut_streams`; each task is the tree of operators feeding one root (a
    sink, or the producer of a cut stream). Tasks are numbered in dataflow order."""
    cuts = cut_streams(graph)
    roots = [n for n in graph.nodes if n.output is None or n.output in cuts]
    owner: dict[str, str] = {}
    plans = []
    for i, root in enumerate(roots):
        task_id = f"{query_id}.t{i}"
        members, inputs = _collect(graph, root.name, cuts)
        owner.update({m: task_id for m in members})
        ordered = tuple(n.name for n in graph.nodes if n.name in members)
        plans.append(TaskPlan(task_id, ordered, tuple(inputs),
                              root.output if root.output in cuts else None,
                              any(graph.node(m).stateful for m in members)))
    channels = tuple(
        ChannelSpec(channel_id(query_id, s), s, graph.stream(s).schema,
                    owner[graph.stream(s).producer],
                    tuple(sorted({owner[c.name] for c in graph.consumers(s)})))
        for s in sorted(cuts, key=lambda s: [n.name for n in graph.nodes].index(
            graph.stream(s).producer))
    )
    return tuple(plans), channels


def _collect(graph: "Graph", root: str, cuts: set[str]) -> tuple[set[str], list[str]]:
    members: set[str] = set()
    inputs: list[str] = []
    pending = [root]
    while pending:
        name = pending.pop()
        members.add(name)
        for stream in graph.node(name).inputs:
            if stream in cuts:
                if stream not in inputs:
                    inputs.append(stream)
            else:
                pending.append(graph.stream(stream).producer)
    order = [n.name for n in graph.nodes]
    inputs.sort(key=lambda s: order.index(graph.stream(s).producer))
    return members, inputs


def task_resources(plan: TaskPlan) -> Resources:
    """What a task asks for: a Spark query costs about half a core; state wants memory."""
    cpus = 1.0 if plan.stateful else 0.5
    mem = 512 if plan.stateful else 256
    return Resources(cpus=cpus, mem_mb=mem, ports=1 if plan.output else 0)
