"""Which tasks run in Spark's real-time mode, and why the others do not (pure).

Owns the decision of docs/kafka.md ("Real-time mode"): a task runs in real-time mode when its
`kafka-sink` asks for it (`mode="real-time"`) and its whole plan allows it: one `kafka-source`
(JSON values) -> `filter` / `project` only (their expressions lower to Spark Column
expressions, never Python) -> that `kafka-sink` with `delivery="at-least-once"`, no channel
in or out, no timestamp column, no dead-letter file and no micro-batch bound. A sink that asks
for it in a plan that does not allow it is refused at its `mode` value with every reason
(`refusals`); `explain` prints each Kafka task's mode and reasons (`describe`). Nothing here
knows about Spark; the runtime side is `executor.kafka_realtime`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from common.diagnostics import Diagnostic
from common.types import ColumnType

if TYPE_CHECKING:
    from compiler import spec as spec_mod
    from compiler.graph import Graph, Node
    from compiler.tasks import TaskPlan

REAL_TIME = "real-time"
MICRO_BATCH = "micro-batch"
ROW_BY_ROW = ("filter", "project")  # operators whose expressions are Spark Column expressions
KAFKA_KINDS = ("kafka-source", "kafka-sink")


@dataclass(frozen=True)
class TaskMode:
    """One task's mode, whether its sink asked for real-time mode, and what keeps it from it."""

    task_id: str
    real_time: bool
    asked: bool
    blockers: tuple[str, ...]

    @property
    def eligible(self) -> bool:
        return not self.blockers


def blockers(graph: "Graph", plan: "TaskPlan") -> tuple[str, ...]:
    """Every reason the task cannot run in real-time mode (pure); () when it can."""
    nodes = [graph.node(n) for n in plan.nodes]
    found: list[str] = []
    if plan.inputs:
        found.append(f"it reads channel(s) {', '.join(plan.inputs)} from other tasks "
                     "(channels between tasks stay micro-batch)")
    if plan.outputs:
        found.append(f"it serves channel(s) {', '.join(plan.outputs)} to other tasks")
    sources = [n for n in nodes if n.role == "source"]
    for node in nodes:
        found += _node_blockers(graph, node)
    found += _timestamps(graph, [n.output for n in nodes if n.output is not None])
    if not any(n.kind == "kafka-source" for n in sources):
        found.append("it has no kafka-source (real-time mode reads Kafka only)")
    if len(sources) > 1:
        found.append(f"it has {len(sources)} sources; real-time mode takes one kafka-source")
    root = nodes[-1]
    if root.kind != "kafka-sink" and not plan.outputs:
        found.append(f"it ends in {root.kind} '{root.name}', not a kafka-sink")
    return tuple(found)


def _node_blockers(graph: "Graph", node: "Node") -> list[str]:
    if node.kind == "kafka-source":
        return _source_blockers(graph, node)
    if node.kind == "kafka-sink":
        return _sink_blockers(graph, node)
    if node.role == "source":
        return [f"source '{node.name}' is a {node.kind} (real-time mode reads Kafka only)"]
    if node.kind not in ROW_BY_ROW:
        return [f"operator '{node.name}' ({node.kind}) is not a filter or project "
                "(real-time mode runs Spark expressions only, no Python and no state)"]
    return []


def _source_blockers(graph: "Graph", node: "Node") -> list[str]:
    found = []
    if node.param("format", "jsonl") != "jsonl":
        found.append(f"kafka-source '{node.name}' reads format=\"{node.param('format')}\"; "
                     "real-time mode parses JSON values only")
    if node.param("dead-letter") is not None:
        found.append(f"kafka-source '{node.name}' has a dead-letter file, written from Python; "
                     "in real-time mode bad records are dropped and counted (drop dead-letter=)")
    if node.param("max-records-per-batch") is not None:
        found.append(f"kafka-source '{node.name}' bounds its micro-batches "
                     "(max-records-per-batch); real-time mode has none")
    return found


def _sink_blockers(graph: "Graph", node: "Node") -> list[str]:
    found = []
    if node.param("delivery", "exactly-once") != "at-least-once":
        found.append(f"kafka-sink '{node.name}' has delivery=\"exactly-once\", which needs "
                     "micro-batch transactions (choose delivery=\"at-least-once\")")
    if node.param("format", "jsonl") != "jsonl":
        found.append(f"kafka-sink '{node.name}' writes format=\"{node.param('format')}\"; "
                     "real-time mode writes JSON values only")
    return found


def _timestamps(graph: "Graph", streams: Sequence[str]) -> list[str]:
    """A timestamp column's JSON text is Elastiq's own (ISO-8601 UTC) in micro-batch mode;
    in real-time mode Spark would read and write it by its own rules: refused (not built)."""
    names = sorted({f.name for s in streams for f in graph.stream(s).schema
                    if f.type is ColumnType.TIMESTAMP})
    if not names:
        return []
    return [f"its streams have timestamp column(s) {', '.join(names)}; real-time mode reads "
            "and writes int, double, string and boolean values only"]


def asked(graph: "Graph", plan: "TaskPlan") -> "Node | None":
    """The task's kafka-sink that asks for real-time mode, if any."""
    root = graph.node(plan.nodes[-1])
    return root if root.kind == "kafka-sink" and root.param("mode") == REAL_TIME else None


def task_mode(graph: "Graph", plan: "TaskPlan") -> TaskMode:
    found = blockers(graph, plan)
    wants = asked(graph, plan) is not None
    return TaskMode(plan.task_id, wants and not found, wants, found)


def uses_kafka(graph: "Graph") -> bool:
    return any(n.kind in KAFKA_KINDS for n in graph.nodes)


def describe(mode: TaskMode) -> list[str]:
    """`explain`'s lines for one task: its mode and why."""
    if mode.real_time:
        return ["mode   real-time (Spark's real-time trigger; at least once)"]
    if mode.eligible:
        return ["mode   micro-batch (real-time mode possible: mode=\"real-time\" on its "
                "kafka-sink asks for it)"]
    return ["mode   micro-batch; not real-time because:"] + \
        [f"         - {reason}" for reason in mode.blockers]


def refusals(parsed: "spec_mod.Spec", graph: "Graph", plans: Sequence["TaskPlan"]
             ) -> tuple[Diagnostic, ...]:
    """One diagnostic per kafka-sink whose `mode="real-time"` its task's plan does not allow,
    at the `mode` value, with every reason."""
    decls = {op.name: op for op in parsed.operators}
    found = []
    for plan in plans:
        sink = asked(graph, plan)
        if sink is None:
            continue
        mode = task_mode(graph, plan)
        if mode.real_time:
            continue
        decl = decls.get(sink.name)
        written = decl.param("mode") if decl is not None else None
        where = written.value_pos() if written is not None else \
            decl.pos if decl is not None else parsed.pos
        found.append(Diagnostic(where, f"kafka-sink '{sink.name}' asks for mode=\"real-time\", "
                                       f"which task {plan.task_id} cannot run: "
                                       + "; ".join(mode.blockers),
                                "remove mode=\"real-time\" (micro-batch) or change the plan"))
    return tuple(found)
