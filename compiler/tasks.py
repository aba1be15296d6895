"""Query tasks: the unit the scheduler places and the executor runs.

Owns `split_into_tasks`, which cuts a physical graph into tasks (the `QueryTask` and
`ChannelSpec` values it yields, what crosses to the scheduler, are `common.tasks`). By default
tasks are few and large, as the paper says: a task is a tree of operators ending in one output
(a sink or a channel to other tasks), so a simple query costs one Spark query.
A stream becomes a channel between tasks only where it has several consumers or where the plan
asks for a task boundary (the plumbing operators of the patterns and their placement labels); a
splitter's output becomes one channel per partition (the instance a folding splitter's last
partition feeds stays in its merger's task, `folded`). `place_tasks` derives each task's placement
group, the groups it must be kept apart from, and its failover mode from the plan's annotations.
Does not own how a task's program looks (`compiler.codegen`) or where it runs (`scheduler`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Collection, Mapping, Sequence

from common.tasks import (ChannelSpec, FailoverMode, Placement, Resources, channel_id,
                          partition_channel_id)

if TYPE_CHECKING:
    from compiler.graph import Graph, Node


# ----------------------------------------------------------------------------------------------
# Splitting a physical graph into tasks

# Plumbing whose output stream always crosses to other tasks (they serve a channel) ...
CHANNEL_WRITERS = frozenset({"network-writer", "multicast", "splitter"})
# ... and plumbing whose input streams always come from other tasks (they read channels).
CHANNEL_READERS = frozenset({"network-reader", "stream-selector", "merger", "failover"})


@dataclass(frozen=True)
class TaskPlan:
    """The operators of one task before its program is generated."""

    task_id: str
    nodes: tuple[str, ...]  # node names in dataflow order; the last one is the task's root
    inputs: tuple[str, ...]  # channel ids read from other tasks
    outputs: tuple[str, ...]  # channel ids served to other tasks; () when the task ends in a sink
    stateful: bool
    placement: Placement = field(default_factory=Placement)
    failover: FailoverMode | None = None


def cut_streams(graph: "Graph") -> set[str]:
    """Streams that cross a task boundary: published (served to other queries); read by several
    operators; served by a writer, multicast or splitter; read by a reader, selector, merger or
    failover; or joining two operators whose placement labels differ. Unannotated operators
    stay with their neighbour."""
    cuts = set(graph.published)  # a published stream is served to other queries' readers
    for stream in graph.streams:
        consumers = graph.consumers(stream.name)
        producer = graph.node(stream.producer)
        if (len(consumers) > 1 or producer.kind in CHANNEL_WRITERS
                or any(c.kind in CHANNEL_READERS and not folded(graph, producer)
                       for c in consumers)
                or any(_placed_apart(producer, c) for c in consumers)):
            cuts.add(stream.name)
    return cuts


def folded(graph: "Graph", node: "Node") -> bool:
    """Whether `node` is the instance a folding splitter's last partition feeds
    (rewrite_rules/folding.rule): it runs in its merger's task, not in a task of its own."""
    return _folding_splitter(graph, node) is not None


def _folding_splitter(graph: "Graph", node: "Node") -> "Node | None":
    """The folding splitter whose last partition feeds `node`, or None."""
    if node.role == "plumbing" or len(node.inputs) != 1:
        return None
    reader = graph.producer(node.inputs[0])
    if reader.kind != "network-reader" or reader.param("partition") is None:
        return None
    splitter = graph.producer(reader.inputs[0])
    last = bool(splitter.param("folded")) and \
        reader.param("partition") == splitter.param("partitions")
    return splitter if last else None


def _placed_apart(a: "Node", b: "Node") -> bool:
    return a.placement is not None and b.placement is not None and a.placement != b.placement


def split_into_tasks(graph: "Graph", query_id: str,
                     pinned: Mapping[str, str] | None = None, retired: Collection[str] = ()
                     ) -> tuple[tuple[TaskPlan, ...], tuple[ChannelSpec, ...]]:
    """Cut the graph at `cut_streams`; each task is the tree of operators feeding one root (a
    sink, or the producer of a cut stream). Tasks are numbered in dataflow order (`task_ids`;
    `pinned`, root operator -> task id, keeps the ids of a running query's tasks across an
    update, and `retired` ids are never given again); channels are ordered by their producer, a splitter's partitions by number; each
    task is placed (`place_tasks`)."""
    cuts = cut_streams(graph)
    order = {n.name: i for i, n in enumerate(graph.nodes)}  # position: linear in large graphs
    roots = [n for n in graph.nodes if n.output is None or n.output in cuts]
    members = {task_id: _collect(graph, root.name, cuts)
               for task_id, root in zip(task_ids(query_id, [r.name for r in roots], pinned,
                                                 retired),
                                        roots)}
    owner = {m: task_id for task_id, names in members.items() for m in names}
    channels = tuple(c for s in sorted(cuts, key=lambda s: order[graph.stream(s).producer])
                     for c in _channels_of(graph, query_id, s, owner))
    reads: dict[str, list[str]] = {}
    serves: dict[str, list[str]] = {}
    for c in channels:
        serves.setdefault(c.producer, []).append(c.channel_id)
        for consumer in c.consumers:
            reads.setdefault(consumer, []).append(c.channel_id)
    for task_id, names in members.items():  # another query's published stream it reads
        reads.setdefault(task_id, []).extend(
            graph.node(n).param("stream") for n in sorted(names, key=order.__getitem__)
            if graph.node(n).kind == "stream-source")
    plans = tuple(
        TaskPlan(task_id, tuple(sorted(names, key=order.__getitem__)),
                 tuple(reads.get(task_id, ())), tuple(serves.get(task_id, ())),
                 any(graph.node(m).stateful for m in names))
        for task_id, names in members.items())
    return place_tasks(graph, plans, channels), channels


def task_ids(query_id: str, roots: Sequence[str], pinned: Mapping[str, str] | None = None,
             retired: Collection[str] = ()) -> list[str]:
    """The id of the task of each root operator: its pinned id (a running query's, kept by an
    update: docs/queries.md), else `<query>.t<n>` with n its position in dataflow order, or,
    when another task holds that id or it is `retired` (a task an update removed: its
    checkpoint folder is its id's), the next number nobody holds. Pins of absent roots hold
    their ids too."""
    pins = dict(pinned or {})
    taken = set(pins.values()) | set(retired)
    ids: list[str] = []
    spare = len(roots)
    for i, root in enumerate(roots):
        if root in pins:
            ids.append(pins[root])
            continue
        candidate = f"{query_id}.t{i}"
        while candidate in taken:
            candidate, spare = f"{query_id}.t{spare}", spare + 1
        taken.add(candidate)
        ids.append(candidate)
    return ids


def _collect(graph: "Graph", root: str, cuts: set[str]) -> set[str]:
    """The operators of the task rooted at `root`: it and everything feeding it by uncut
    streams."""
    members: set[str] = set()
    pending = [root]
    while pending:
        name = pending.pop()
        members.add(name)
        pending += [graph.stream(s).producer for s in graph.node(name).inputs if s not in cuts]
    return members


def _channels_of(graph: "Graph", query_id: str, stream: str,
                 owner: dict[str, str]) -> tuple[ChannelSpec, ...]:
    """The channels of one cut stream: one, or one per partition when a splitter produces it
    (partition i is read by the tasks whose network-reader has `partition: i`)."""
    producer = graph.producer(stream)
    schema = graph.stream(stream).schema
    consumers = graph.consumers(stream)
    if producer.kind != "splitter":
        return (ChannelSpec(channel_id(query_id, stream), stream, schema, owner[producer.name],
                            tuple(sorted({owner[c.name] for c in consumers}))),)
    partitions = int(producer.param("partitions"))
    for c in consumers:
        if c.kind != "network-reader" or c.param("partition") not in range(1, partitions + 1):
            raise ValueError(f"splitter {producer.name!r} feeds {c.name!r}, which is not a "
                             f"network-reader of one of its {partitions} partitions")
    return tuple(
        ChannelSpec(partition_channel_id(query_id, stream, i), stream, schema,
                    owner[producer.name],
                    tuple(sorted({owner[c.name] for c in consumers if c.param("partition") == i})))
        for i in range(1, partitions + 1))


# ----------------------------------------------------------------------------------------------
# Placing tasks: groups, apart_from, initially_apart_from, failover

def place_tasks(graph: "Graph", plans: tuple[TaskPlan, ...],
                channels: tuple[ChannelSpec, ...]) -> tuple[TaskPlan, ...]:
    """Each plan with its `Placement` and failover mode (docs/patterns.md, "Tasks"):
    group = the one placement label of its operators, else its task id; apart_from = the other
    labels of the same placement group that are groups of other tasks; a protected task (the
    one holding what a failover protects, or a hot-standby replica) starts apart from the tasks
    it exchanges channels with (initially_apart_from) and carries its failover mode."""
    groups = {p.task_id: _task_label(graph, p) or p.task_id for p in plans}
    modes = _failover_modes(graph, plans, channels)
    labelled: dict[str, set[str]] = {}  # placement group -> its labels that are task groups
    for g in set(groups.values()):
        if (label := _label_group(g)) is not None:
            labelled.setdefault(label, set()).add(g)
    placed = []
    for plan in plans:
        group = groups[plan.task_id]
        label = _label_group(group)
        same = labelled.get(label, set()) if label else set()
        apart = tuple(sorted((same - {group}) | _folded_apart(graph, plan)))
        first_apart: tuple[str, ...] = ()
        if plan.task_id in modes:
            first_apart = tuple(sorted({groups[t] for t in _neighbours(plan, channels)} - {group}))
        placed.append(replace(plan, placement=Placement(group, apart, first_apart),
                              failover=modes.get(plan.task_id)))
    return tuple(placed)


def _folded_apart(graph: "Graph", plan: TaskPlan) -> set[str]:
    """The placement label of the first own instance of an operator folded into this task:
    split, it runs on another agent than the task it was folded into. The other instances are
    only kept apart from each other, so M agents still hold M of them."""
    labels: set[str] = set()
    for node in (graph.node(n) for n in plan.nodes):
        splitter = _folding_splitter(graph, node)
        if splitter is not None:
            labels |= {c.placement for c in graph.consumers(splitter.produced)
                       if c.placement is not None and c.param("partition") == 1}
    return labels


def _label_group(label: str) -> str | None:
    """"matched" for the label "matched.p2"; None for a task id or an any-node label (p*)."""
    group, sep, number = label.rpartition(".p")
    return group if sep and number.isdigit() else None


def _task_label(graph: "Graph", plan: TaskPlan) -> str | None:
    """The placement label of the task's operators when they carry exactly one."""
    labels = {label for n in plan.nodes
              if (label := graph.node(n).placement) and _label_group(label) is not None}
    return labels.pop() if len(labels) == 1 else None


def _failover_modes(graph: "Graph", plans: tuple[TaskPlan, ...],
                    channels: tuple[ChannelSpec, ...]) -> dict[str, FailoverMode]:
    """task id -> failover mode of the protected tasks: the failover node's mode for the task
    holding the operator it protects; "replica" for a task whose output a stream selector
    reads."""
    owner = {n: p.task_id for p in plans for n in p.nodes}
    modes: dict[str, FailoverMode] = {}
    for node in graph.nodes:
        if node.kind == "failover" and node.param("protects") in owner:
            modes[owner[node.param("protects")]] = node.param("mode")
        if node.kind == "stream-selector":
            for c in channels:
                if c.stream in node.inputs:
                    modes[c.producer] = "replica"
    return modes


def _neighbours(plan: TaskPlan, channels: tuple[ChannelSpec, ...]) -> set[str]:
    """The tasks producing the plan's input channels and consuming its output channels."""
    return ({c.producer for c in channels if c.channel_id in plan.inputs}
            | {t for c in channels if c.channel_id in plan.outputs for t in c.consumers})


def task_resources(plan: TaskPlan, graph: "Graph | None" = None) -> Resources:
    """What a task asks for: the largest `cpus=` and `mem=` among its operators (`graph`'s
    nodes), each where one asks for it; otherwise a Spark query costs about half a core
    (one with state) and state wants memory: 0.5 (1) cpus and 256 (512) MB. One port per
    channel it serves."""
    nodes = [graph.node(name) for name in plan.nodes] if graph is not None else []
    cpus = [n.cpus for n in nodes if n.cpus is not None]
    mem = [n.mem_mb for n in nodes if n.mem_mb is not None]
    return Resources(cpus=max(cpus) if cpus else 1.0 if plan.stateful else 0.5,
                     mem_mb=max(mem) if mem else 512 if plan.stateful else 256,
                     ports=len(plan.outputs))
