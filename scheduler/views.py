"""Views: JSON-ready snapshots of the scheduler state for the HTTP API and the CLI.

Owns `snapshot(state)` (the whole scheduler) and `query_view(...)` (one query with its tasks,
states, agents, attempts, figures and last failure reasons). Values only: a snapshot shares
nothing mutable with the state it was taken from. Does not own the state (`scheduler.state`).
"""

from __future__ import annotations

from typing import Any

from common.dpc import Mode, mode_of_code
from scheduler import distribution_state, elasticity, sharing, shed_state
from scheduler.control import sinks_in_force
from scheduler.lifecycle import TaskRecord, TaskState
from scheduler.state import QueryRecord, SchedulerState


def snapshot(state: SchedulerState) -> dict[str, Any]:
    return {
        "framework_id": state.framework_id,
        "master": state.master,
        "connected": state.connected,
        "held_offers": len(state.held),
        "queries": {qid: query_view(q, state.unplaced, state.agent_isolation, state.queries)
                    for qid, q in state.queries.items()},
        # the load distributor: moves started and refused, its latest decision, recent moves
        # (None before its first round)
        "distribution": distribution_state.describe(state.distribution),
    }


def query_view(q: QueryRecord, unplaced: dict[str, str],
               isolation: dict[str, str] | None = None,
               queries: dict[str, QueryRecord] | None = None) -> dict[str, Any]:
    """One query; `isolation` (agent id -> its isolation, "" when it does not say) gives the
    `agents` its tasks run on; `queries` (all the scheduler holds) the queries that read each
    stream it publishes (`published`) and why a reader of an absent writer waits."""
    waits = sharing.wait_reasons(queries) if queries is not None else {}
    on = sorted({t.agent_id for t in q.tasks.values() if t.agent_id})
    return {
        "agents": {a: {"isolation": (isolation or {}).get(a) or "unknown"} for a in on},
        "query_id": q.query_id,
        "phase": q.phase,
        "status": query_status(q),
        "failure": q.failure,
        "sinks": sinks_in_force(q.query.sinks, q.control, q.query.controls),
        "kafka_sinks": q.query.kafka_sinks,  # how `elastiq tail --stable` reads a topic
        "tasks": [task_view(t, unplaced.get(t.task_id, ""), waits.get(t.task_id, ""))
                  for t in q.tasks.values()],
        "elastic": elasticity.describe(q.query, q.tasks, q.control, q.elastic),
        "shedding": shed_state.describe(q.query, q.tasks, q.control, q.shed),
        "distribute": q.query.distribute,  # its tasks may be moved by the load distributor
        "published": sharing.shared_tasks(q, queries if queries is not None
                                          else {q.query_id: q}),
        "reads": sorted({i.channel_id for i in q.query.imports}),
        # of those, the ones read in place of an equal subgraph (automatic sharing)
        "shared": sorted({i.channel_id for i in q.query.imports if i.auto}),
    }


def query_status(q: QueryRecord) -> str:
    """One word for people: deploying, running, restarting, stopping, stopped, failed..."""
    if q.phase != "active":
        return q.phase
    states = {t.state for t in q.tasks.values()} - {TaskState.DORMANT}
    if states == {TaskState.RUNNING}:
        return "running"
    if any(t.launches > 1 or t.restart_at is not None for t in q.tasks.values()):
        return "restarting"
    return "deploying"


def task_view(t: TaskRecord, unplaced_reason: str, writer_absent: str = "") -> dict[str, Any]:
    """One task; `writer_absent`: why it waits for another query's published stream, shown in
    whatever state it is (a running reader of a stopped writer receives nothing)."""
    return {
        "task_id": t.task_id,
        "mesos_task_id": t.mesos_task_id,
        "state": t.state.value,
        "attempt": t.attempt,
        "launches": t.launches,
        "agent_id": t.agent_id,
        "hostname": t.hostname,
        "endpoints": dict(t.endpoints),
        "figures": t.totals(),
        "reads_channels": bool(t.task.inputs),  # its input comes from other tasks
        "serves_channels": bool(t.task.outputs),  # its output goes to other tasks
        "last_failure": t.last_failure,
        "last_failure_attempt": t.last_failure_attempt,
        "restart_at": t.restart_at,
        "waiting_for": writer_absent if writer_absent and not t.state.terminal else
        unplaced_reason if t.state is TaskState.PENDING else "",
        "blocked": blocked_reason(t.figures),
        "availability": availability_reason(t.figures),
    }


def availability_reason(figures: dict[str, float]) -> str:
    """A DPC task's mode when it is not stable ("" otherwise, and for a task without DPC):
    docs/availability.md, "Seeing the mode"."""
    mode = mode_of_code(figures.get("dpc_mode", -1.0))
    if mode is None or mode is Mode.STABLE:
        return ""
    held = figures.get("dpc_mode_ms", 0.0) / 1000.0
    episode = int(figures.get("dpc_episode", 0))
    if mode is Mode.DELAYING:
        return f"DPC delaying for {held:.0f} s: an input's writer is unreachable"
    if mode is Mode.TENTATIVE:
        return (f"DPC tentative for {held:.0f} s (episode {episode}): results are marked "
                "tentative until the cut input returns")
    return f"DPC reconciling for {held:.0f} s (episode {episode}): corrections follow"


def blocked_reason(figures: dict[str, float]) -> str:
    """Why a task's channel sink waits ("" when it does not): its upstream backup is full
    because no reader acknowledges (none at all, or one that is not keeping up)."""
    blocked = figures.get("channel_blocked_ms", 0.0) / 1000.0
    if blocked <= 0:
        return ""
    readerless = figures.get("channel_readerless_ms", 0.0) / 1000.0
    if readerless > 0:
        return f"blocked: no reader for {readerless:.0f} s, backup full for {blocked:.0f} s"
    return f"blocked: backup full for {blocked:.0f} s (a reader is not acknowledging)"
