"""What `elastiq explain` shows: the plans in the paper's notation, the rewrite rules that fired,
where tasks must be placed apart, the tasks, and pictures.

Owns the text and picture files of a compilation; it only reads a `Compilation`.
"""

from __future__ import annotations

from pathlib import Path

from common.kafka_params import parse_topics
from common.kafka_partitions import describe as describe_share
from common.tasks import QueryTask
from compiler import kept_columns, realtime
from compiler.graph import Graph, notation, to_dot, to_mermaid
from compiler.pipeline import Compilation
from compiler.rewrite import local_notation, placement_groups


def explain(c: Compilation) -> str:
    q = c.query
    lines = [f"query {q.query_id}", ""]
    if c.written is not None:
        lines += ["logical plan as written:"] + [f"  {line}" for line in notation(c.written)]
        lines += sharing_section(c) + ["", "logical plan (shared streams read):"]
    else:
        lines += ["logical plan:"]
    lines += [f"  {line}" for line in notation(c.logical)]
    same = c.physical == c.logical
    lines += ["", "physical plan:" + ("  (no patterns asked for: same as the logical plan)"
                                      if same else "")]
    lines += [f"  {line}" for line in notation(c.physical)]
    if c.firings:
        lines += rewrite_section(c)
    lines += _tasks(c)
    shed = kept_columns.sink_lines(c.physical)
    if shed:
        lines += ["", "shed columns on sink rows (docs/load.md):"] + shed
    if c.refused:
        lines += ["", "not deployable (`compile` and `run` refuse this plan):"]
        lines += [f"  {d.render()}" for d in c.refused]
    lines += ["", "streams:"]
    for s in c.physical.streams:
        cols = ", ".join(f"{f.name} {f.type.value}" for f in s.schema)
        lines.append(f"  {s.name} ({cols})")
    return "\n".join(lines)


def sharing_section(c: Compilation) -> list[str]:
    """What automatic sharing reads from running queries instead of computing (docs/queries.md):
    each shared subgraph in the paper's notation, the stream-source that took its place."""
    if c.written is None:
        return []
    lines = ["", f"shared with running queries ({len(c.shares)}; share=\"false\" on the "
                 "dataflow opts out):"]
    for s in c.shares:
        before = local_notation(c.written, c.written.node(s.operator), set())
        lines += [f"  {s.stream}: {before}",
                  f"      read from {s.channel} (start: retained) instead of computed: "
                  f"{s.operator} := stream_source; {len(s.replaced)} operator(s) not run"]
    return lines


def rewrite_section(c: Compilation) -> list[str]:
    """Each rule firing (bindings, before, after) and the placement constraints of the plan."""
    lines = ["", f"rewrite rules fired ({len(c.firings)}):"]
    for i, f in enumerate(c.firings, 1):
        bound = ", ".join(f"{name}={value}" for name, value in f.bindings)
        lines += [f"  {i}. {f.rule} [{f.phase}] on {f.focus}  ({bound})",
                  f"       before: {f.before}", f"       after:  {f.after}"]
    plumbing = [n for n in c.physical.nodes if n.role == "plumbing"]
    if plumbing:
        lines += ["", "plumbing operators (parameters the runtime reads):"]
        lines += [f"  {n.name}: {n.kind} {_params(n.params)}" for n in plumbing]
    groups = placement_groups(c.physical)
    if groups:
        lines += ["", "placement (each label of a group on a distinct node):"]
        for group, labels in groups.items():
            shown = "; ".join(f"{label}: {', '.join(what)}" for label, what in labels.items())
            lines.append(f"  {group}: {shown}")
    return lines


def _params(params: tuple[tuple[str, object], ...]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in params) + "}"


def _tasks(c: Compilation) -> list[str]:
    q = c.query
    lines = ["", f"tasks ({len(q.tasks)}):"]
    kafka = realtime.uses_kafka(c.physical)  # each Kafka query's task says its mode and why
    modes = {p.task_id: realtime.task_mode(c.physical, p) for p in c.plans}
    for task in q.tasks:
        state = "stateful" if task.stateful else "stateless"
        r = task.resources
        lines.append(f"  {task.task_id}: {', '.join(task.operators)}  [{state}; "
                     f"{r.cpus:g} cpus, {r.mem_mb} MB, {r.ports} port(s)]")
        for ch in task.inputs:
            lines.append(f"      reads  {ch}")
        for ch in task.outputs:
            lines.append(f"      writes {ch}")
        lines += [f"      {note}" for note in _placement(task)]
        lines += [f"      {note}" for note in _kafka_shares(c, task)]
        if kafka:
            lines += [f"      {line}" for line in realtime.describe(modes[task.task_id])]
    if q.channels:
        lines += ["", "channels:"]
        for spec in q.channels:
            lines.append(f"  {spec.channel_id}: {spec.producer} -> {', '.join(spec.consumers)}")
    return lines


def _kafka_shares(c: Compilation, task: QueryTask) -> list[str]:
    """Which Kafka partitions each instance's copy of a kafka-source in `task` reads
    (`compiler.kafka_partitions`; the count is the topic's, read at the task's first start)."""
    notes = []
    for name in task.operators:
        node = c.physical.node(name)
        if node.kind == "kafka-source" and node.param("shares") is not None:
            topics = parse_topics(str(node.param("topic")))
            share = describe_share(topics, node.param("share"), node.param("shares"))
            notes.append(f"kafka  {name} {share}")
    return notes


def _placement(task: QueryTask) -> list[str]:
    """The task's placement and failover, when they say more than "anywhere, default restart"."""
    p = task.placement
    notes = [f"group  {p.group}"] if p.group != task.task_id else []
    notes += [f"apart from {', '.join(p.apart_from)}"] if p.apart_from else []
    notes += ([f"first apart from {', '.join(p.initially_apart_from)}"]
              if p.initially_apart_from else [])
    notes += [f"failover {task.failover}"] if task.failover else []
    return notes


def task_clusters(c: Compilation) -> dict[str, list[str]]:
    return {plan.task_id: list(plan.nodes) for plan in c.plans}


def write_pictures(c: Compilation, out: Path) -> list[Path]:
    """logical.dot/.mmd and physical.dot/.mmd (the physical ones boxed by task)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, graph, clusters in (("logical", c.logical, None),
                                  ("physical", c.physical, task_clusters(c))):
        written += _write(out, name, graph, clusters)
    return written


def _write(out: Path, name: str, graph: Graph, clusters: dict[str, list[str]] | None) -> list[Path]:
    dot, mmd = out / f"{name}.dot", out / f"{name}.mmd"
    dot.write_text(to_dot(graph, clusters))
    mmd.write_text(to_mermaid(graph, clusters))
    return [dot, mmd]
