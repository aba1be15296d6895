"""Which partitioned operators of a plan may change their parallelism at run time.

Owns `elastic_operators`: from the physical plan and its tasks, each partitioned spec operator's
instance tasks by slot, the splitters that route to them, and its bounds (the `parallelism`,
`max-parallelism`, `min-parallelism` and `elastic` requests the validator resolved). Does not
own the control parameter that changes it (`compiler.control`) nor the rescale itself
(`scheduler.elasticity`, `executor.runtime.TaskRuntime.split_channel_sink`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from common.tasks import ChannelSpec, ElasticOperator, splitter_op_id

if TYPE_CHECKING:
    from compiler.graph import Graph, Node
    from compiler.tasks import TaskPlan


def elastic_operators(logical: "Graph", physical: "Graph", plans: "tuple[TaskPlan, ...]",
                      channels: Mapping[str, ChannelSpec]) -> tuple[ElasticOperator, ...]:
    """One entry per partitioned spec operator (its splitters' partition channels each feed one
    instance task); a fixed `parallelism=k` is elastic within 1..k."""
    from compiler.control import copies_by_name, feeds

    task_of = {node: plan.task_id for plan in plans for node in plan.nodes}
    plan_of = {plan.task_id: plan for plan in plans}
    copies_of = copies_by_name(physical, {n.name for n in logical.nodes})
    found = []
    for node in (n for n in logical.nodes if n.wants("parallelism") is not None):
        copies = {c.name for c in copies_of.get(node.name, ()) if c.kind == node.kind}
        splitters = [s for s in physical.nodes if s.kind == "splitter"
                     and feeds(physical, s, copies) and s.name in task_of]
        entry = _entry(node, [plan_of[task_of[s.name]] for s in splitters], channels,
                       tuple(int(s.param("spread-ms") or 0) for s in splitters
                             if s.param("planned")),
                       any(s.param("folded") for s in splitters))
        if entry is not None:
            found.append(entry)
    return tuple(found)


def _entry(node: "Node", splitter_plans: "list[TaskPlan]", channels: Mapping[str, ChannelSpec],
           spreads: tuple[int, ...], folded: bool) -> ElasticOperator | None:
    """A folding splitter's last channel feeds the instance folded into the merger's task:
    that task is no slot (it always runs), the operator's parallelism 0 routes to it."""
    if not splitter_plans:
        return None
    first = splitter_plans[0]
    readers = [channels[c].consumers[0] for c in first.outputs]
    slots = tuple(readers[:-1] if folded else readers)
    return ElasticOperator(
        node.name, slots, tuple((p.task_id, splitter_op_id(p.outputs)) for p in splitter_plans),
        _wanted(node, "active", len(slots)), _wanted(node, "min-parallelism", 1),
        str(node.wants("elastic") or "manual"), node.stateful, _first(node.wants("switch-time")),
        int(node.wants("switch-close") or 0), spreads, readers[-1] if folded else None)


def _first(time: Any) -> str | None:
    """The switch's event-time column (a join's: its left input's)."""
    return time[0] if isinstance(time, (tuple, list)) else time


def _wanted(node: "Node", request: str, default: int) -> int:
    """A whole-number request, `default` when not asked (0 is an answer: folded)."""
    value = node.wants(request)
    return default if value is None else int(value)
