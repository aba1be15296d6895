"""The embedded master's operator API, pure: Mesos 1.11's read-only views of a `MasterState`.

Owns the answers of `POST /api/v1` for GET_HEALTH, GET_VERSION, GET_METRICS, GET_AGENTS,
GET_FRAMEWORKS, GET_TASKS, GET_EXECUTORS and GET_STATE (`v1_call`, JSON only, in the v1
`master.Response` form: `{"type": T, "get_x": {...}}`), the v0 `/master/state` (`/state.json`)
document (`master_state_v0`) and `/metrics/snapshot` (`metrics`), so the Mesos CLI, web
UI and Prometheus exporters read the embedded master as a real one. Fields the embedded master
does not track (registration times, pids of libprocess actors, flags) are left out rather than
made up; `OperatorCallError` names an unknown or unsupported call. Does not own HTTP,
authentication or the 415 for protobuf (`embedded_mesos.master`).

The agent's side: `monitor_statistics` (its `GET /monitor/statistics` list) and `agent_v1_call`
(its `POST /api/v1`: GET_HEALTH, GET_VERSION and GET_CONTAINERS) shape the `Container`s an
agent measured (`agent.EmbeddedAgent.containers`) as Mesos 1.11's agent does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from embedded_mesos.master_state import MasterState
from embedded_mesos.protocol import VERSION, is_terminal
from embedded_mesos.resources import Resources


class OperatorCallError(ValueError):
    """An operator call this master does not answer; the message says which are."""


def _id(value: str) -> dict[str, str]:
    return {"value": value}


def _sum(resources: list[Resources]) -> Resources:
    return sum(resources, Resources())


def _task(state: MasterState, task: Any) -> dict[str, Any]:
    info = {"task_id": _id(task.task_id), "name": task.task_id,
            "framework_id": _id(task.framework_id), "executor_id": _id(task.executor_id),
            "agent_id": _id(task.agent_id), "state": task.state,
            "resources": task.resources.to_mesos()}
    if task.last_status is not None:
        info["statuses"] = [task.last_status]
    return info


def _agent_used(state: MasterState, agent_id: str) -> Resources:
    tasks = [t.resources for t in state.tasks.values()
             if t.agent_id == agent_id and not is_terminal(t.state)]
    return _sum(tasks)


def _agent_offered(state: MasterState, agent_id: str) -> Resources:
    return _sum([o.resources for o in state.offers.values() if o.agent_id == agent_id])


def get_agents(state: MasterState) -> dict[str, Any]:
    agents = []
    for agent in state.agents.values():
        agents.append({
            "agent_info": {"id": _id(agent.agent_id), "hostname": agent.hostname,
                           "resources": agent.total.to_mesos()},
            "active": True, "version": VERSION,
            "total_resources": agent.total.to_mesos(),
            "allocated_resources": _agent_used(state, agent.agent_id).to_mesos(),
            "offered_resources": _agent_offered(state, agent.agent_id).to_mesos()})
    return {"agents": agents, "recovered_agents": []}


def get_frameworks(state: MasterState) -> dict[str, Any]:
    frameworks = [{"framework_info": {**f.info, "id": _id(f.framework_id)},
                   "active": f.stream_id is not None and not f.suppressed,
                   "connected": f.stream_id is not None, "recovered": False}
                  for f in state.frameworks.values()]
    return {"frameworks": frameworks, "completed_frameworks": []}


def _completed(task: Any) -> bool:
    """Terminal with every update acknowledged (or none to acknowledge), as Mesos's
    `completed_tasks`; a terminal task with updates still unacknowledged stays in `tasks`."""
    return is_terminal(task.state) and not task.pending and task.in_flight is None


def get_tasks(state: MasterState) -> dict[str, Any]:
    live = [t for t in state.tasks.values() if t.framework_id in state.frameworks]
    return {"tasks": [_task(state, t) for t in live if not _completed(t)
                      and t.state != "TASK_UNREACHABLE"],
            "unreachable_tasks": [_task(state, t) for t in live
                                  if t.state == "TASK_UNREACHABLE"],
            "completed_tasks": [_task(state, t) for t in live if _completed(t)],
            "orphan_tasks": [], "pending_tasks": []}


def get_executors(state: MasterState) -> dict[str, Any]:
    return {"executors": [{"executor_info": {**info, "framework_id": _id(framework_id)},
                           "agent_id": _id(agent_id)}
                          for (framework_id, agent_id, _), info in sorted(
                              state.executors.items(), key=lambda kv: kv[0])],
            "orphan_executors": []}


def metrics(state: MasterState, uptime: float) -> dict[str, float]:
    """`/metrics/snapshot` keys of Mesos's master that this master can count."""
    counts: dict[str, float] = {}
    for task in state.tasks.values():
        name = task.state.removeprefix("TASK_").lower()
        counts[f"master/tasks_{name}"] = counts.get(f"master/tasks_{name}", 0.0) + 1
    total = _sum([a.total for a in state.agents.values()])
    used = _sum([_agent_used(state, a) for a in state.agents])
    out = {"master/uptime_secs": round(uptime, 3), "master/elected": 1.0,
           "master/slaves_active": float(len(state.agents)),
           "master/slaves_connected": float(len(state.agents)),
           "master/frameworks_active": float(sum(1 for f in state.frameworks.values()
                                                 if f.stream_id is not None)),
           "master/outstanding_offers": float(len(state.offers))}
    for kind in ("STAGING", "STARTING", "RUNNING", "FINISHED", "FAILED", "KILLED", "LOST",
                 "ERROR", "UNREACHABLE", "GONE", "DROPPED"):
        key = f"master/tasks_{kind.lower()}"
        out[key] = counts.get(key, 0.0)
    for name in ("cpus", "mem", "disk", "gpus"):
        out[f"master/{name}_total"] = float(total.scalars.get(name, 0.0))
        out[f"master/{name}_used"] = float(used.scalars.get(name, 0.0))
    return out


def _version() -> dict[str, Any]:
    return {"version_info": {"version": VERSION, "build_user": "elastiq-embedded"}}


def v1_call(state: MasterState, body: Any, uptime: float) -> dict[str, Any]:
    """A v1 operator call (JSON) -> its response; OperatorCallError for what is not served."""
    kind = body.get("type") if isinstance(body, dict) else None
    answer = _CALLS.get(kind) if isinstance(kind, str) else None
    if answer is None or not isinstance(kind, str):  # answer is None unless kind is a str
        raise OperatorCallError(f"operator call {kind!r} is not served by the embedded master "
                                f"(it answers {', '.join(sorted(_CALLS))})")
    key = kind.lower()
    return {"type": kind, key: answer(state, uptime)}


_CALLS: dict[str, Callable[[MasterState, float], dict[str, Any]]] = {
    "GET_HEALTH": lambda s, u: {"healthy": True},
    "GET_VERSION": lambda s, u: _version(),
    "GET_METRICS": lambda s, u: {"metrics": [{"name": k, "value": v}
                                             for k, v in sorted(metrics(s, u).items())]},
    "GET_AGENTS": lambda s, u: get_agents(s),
    "GET_FRAMEWORKS": lambda s, u: get_frameworks(s),
    "GET_TASKS": lambda s, u: get_tasks(s),
    "GET_EXECUTORS": lambda s, u: get_executors(s),
    "GET_STATE": lambda s, u: {"get_tasks": get_tasks(s), "get_executors": get_executors(s),
                               "get_frameworks": get_frameworks(s), "get_agents": get_agents(s)},
}


def _v0_resources(resources: Resources) -> dict[str, Any]:
    out: dict[str, Any] = {name: value for name, value in resources.scalars.items()}
    for name, spans in resources.ranges.items():
        out[name] = "[" + ", ".join(f"{b}-{e}" for b, e in spans) + "]"
    return out


def master_state_v0(state: MasterState, hostname: str, port: int, uptime: float,
                    started_wall: float) -> dict[str, Any]:
    """The `/master/state` (`/state.json`) document as Mesos 1.11 shapes it."""
    pid = f"master@{hostname}:{port}"
    frameworks = []
    for f in state.frameworks.values():
        tasks = [t for t in state.tasks.values() if t.framework_id == f.framework_id]
        frameworks.append({
            "id": f.framework_id, "name": f.info.get("name", ""),
            "user": f.info.get("user", ""), "hostname": f.info.get("hostname", ""),
            "role": (f.info.get("roles") or ["*"])[0], "capabilities": [
                c.get("type") for c in f.info.get("capabilities", []) if isinstance(c, dict)],
            "failover_timeout": f.failover_timeout,
            "checkpoint": bool(f.info.get("checkpoint", False)),
            "active": f.stream_id is not None and not f.suppressed,
            "connected": f.stream_id is not None, "recovered": False,
            "used_resources": _v0_resources(_sum([t.resources for t in tasks
                                                  if not is_terminal(t.state)])),
            "offered_resources": _v0_resources(_sum([o.resources for o in state.offers.values()
                                                     if o.framework_id == f.framework_id])),
            "tasks": [_v0_task(t) for t in tasks if not is_terminal(t.state)],
            "completed_tasks": [_v0_task(t) for t in tasks if is_terminal(t.state)],
            "offers": [{"id": o.offer_id, "framework_id": o.framework_id,
                        "slave_id": o.agent_id, "resources": _v0_resources(o.resources)}
                       for o in state.offers.values() if o.framework_id == f.framework_id],
            "executors": [{"executor_id": e, "slave_id": a} for (fid, a, e) in state.executors
                          if fid == f.framework_id]})
    slaves = [{"id": a.agent_id, "hostname": a.hostname,
               "pid": f"slave(1)@{a.url.removeprefix('http://')}",
               "resources": _v0_resources(a.total),
               "used_resources": _v0_resources(_agent_used(state, a.agent_id)),
               "offered_resources": _v0_resources(_agent_offered(state, a.agent_id)),
               "reserved_resources": {}, "unreserved_resources": _v0_resources(a.total),
               "attributes": {}, "active": True, "version": VERSION}
              for a in state.agents.values()]
    return {"version": VERSION, "build_user": "elastiq-embedded", "id": state.master_id,
            "pid": pid, "hostname": hostname, "leader": pid, "start_time": started_wall,
            "elected_time": started_wall,
            "leader_info": {"id": state.master_id, "hostname": hostname, "port": port,
                            "version": VERSION},
            "activated_slaves": len(slaves), "deactivated_slaves": 0,
            "unreachable_slaves": len(state.removed_agents), "slaves": slaves,
            "frameworks": frameworks, "completed_frameworks": [], "orphan_tasks": [],
            "unregistered_frameworks": [], "flags": {}}


def _v0_task(task: Any) -> dict[str, Any]:
    return {"id": task.task_id, "name": task.task_id, "framework_id": task.framework_id,
            "executor_id": task.executor_id, "slave_id": task.agent_id, "state": task.state,
            "resources": _v0_resources(task.resources),
            "statuses": [{"state": task.last_status.get("state", task.state),
                          "timestamp": task.last_status.get("timestamp", 0.0)}]
            if task.last_status else []}


# ---------------------------------------------------------------- the agent's operator API

@dataclass(frozen=True)
class Container:
    """One executor container on an agent and its `ResourceStatistics` at one moment."""

    framework_id: str
    executor_id: str
    executor_name: str
    container_id: str
    executor_pid: int
    source: str
    statistics: Mapping[str, float]


def monitor_statistics(containers: list[Container]) -> list[dict[str, Any]]:
    """The agent's `GET /monitor/statistics` document (Mesos 1.11)."""
    return [{"executor_id": c.executor_id, "executor_name": c.executor_name,
             "framework_id": c.framework_id, "source": c.source,
             "statistics": dict(c.statistics)} for c in containers]


def get_containers(containers: list[Container]) -> dict[str, Any]:
    """The agent's GET_CONTAINERS answer body (`Response.GetContainers`)."""
    return {"containers": [
        {"framework_id": _id(c.framework_id), "executor_id": _id(c.executor_id),
         "executor_name": c.executor_name, "container_id": _id(c.container_id),
         "container_status": {"container_id": _id(c.container_id),
                              "executor_pid": c.executor_pid},
         "resource_statistics": dict(c.statistics)} for c in containers]}


_AGENT_CALLS: dict[str, Callable[[Callable[[], list[Container]]], dict[str, Any]]] = {
    "GET_HEALTH": lambda measure: {"healthy": True},
    "GET_VERSION": lambda measure: _version(),
    "GET_CONTAINERS": lambda measure: get_containers(measure()),
}


def agent_v1_call(body: Any, measure: Callable[[], list[Container]]) -> dict[str, Any]:
    """An agent v1 operator call (JSON) -> its response; `measure` gives the containers only
    when the call needs them. OperatorCallError for what is not served."""
    kind = body.get("type") if isinstance(body, dict) else None
    answer = _AGENT_CALLS.get(kind) if isinstance(kind, str) else None
    if answer is None:
        raise OperatorCallError(f"operator call {kind!r} is not served by the embedded agent "
                                f"(it answers {', '.join(sorted(_AGENT_CALLS))})")
    return {"type": kind, str(kind).lower(): answer(measure)}
