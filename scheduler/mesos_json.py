"""Mesos v1 JSON <-> our values: offers and statuses in, TaskInfos and filters out.

Owns reading the dicts pymesos hands to callbacks (offers, task statuses, framework messages:
`message_event`, through `common.messages`) into `scheduler.placement.Offer` and
`scheduler.events` values, and building the TaskInfo,
ExecutorInfo and FrameworkInfo dicts the driver sends. Pure functions without pymesos, so they
are tested without a master. Does not own deciding anything (`scheduler.state`) nor calling the
driver (`scheduler.mesos_adapter`).
"""

from __future__ import annotations

import base64
from typing import Any, Mapping

from common import messages
from common.messages import ControlAck, MessageError
from scheduler.commands import TaskLaunch
from scheduler.config import ExecutorSpec, SchedulerConfig
from scheduler.events import (
    ControlAcknowledged, HeartbeatReceived, MessageUnreadable, StatusUpdated,
)
from scheduler.placement import Offer, PortRange

Json = Mapping[str, Any]


def value(d: Json | None, key: str) -> str:
    """`{"key": {"value": "x"}}` -> "x"; "" when missing."""
    inner = (d or {}).get(key) or {}
    return str(inner.get("value", "")) if isinstance(inner, Mapping) else str(inner)


def parse_offer(d: Json) -> Offer:
    """One Mesos Offer dict as our `Offer` (scalars summed over roles, port ranges kept)."""
    cpus, mem, ports = 0.0, 0.0, []
    for r in d.get("resources", ()):
        name = r.get("name")
        if name in ("cpus", "mem"):
            amount = float((r.get("scalar") or {}).get("value", 0.0))
            cpus, mem = (cpus + amount, mem) if name == "cpus" else (cpus, mem + amount)
        elif name == "ports":
            ports += [(int(x["begin"]), int(x["end"]))
                      for x in (r.get("ranges") or {}).get("range", ())]
    executors = tuple(str(e.get("value", "")) for e in d.get("executor_ids", ()))
    attributes = tuple((str(a.get("name", "")), str((a.get("text") or {}).get("value", "")))
                       for a in d.get("attributes", ()) if a.get("type") == "TEXT")
    return Offer(value(d, "id"), value(d, "agent_id"), str(d.get("hostname", "")), cpus, mem,
                 tuple(ports), executors, attributes)


def parse_status(stimulus_id: str, d: Json) -> StatusUpdated:
    state = str(d.get("state", "TASK_UNKNOWN"))
    return StatusUpdated(
        stimulus_id, value(d, "task_id"),
        state.removeprefix("TASK_"),  # type: ignore[arg-type]  # any state name Mesos sends
        str(d.get("reason", "")), str(d.get("message", "")), value(d, "agent_id"),
        value(d, "executor_id"), str(d.get("source", "")))


def decode_message(data: str | bytes) -> bytes:
    """Framework message data arrives base64-encoded in the v1 JSON API."""
    raw = data.encode("ascii") if isinstance(data, str) else data
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return raw


def message_event(stimulus_id: str, agent_id: str, executor_id: str, raw: str | bytes
                  ) -> HeartbeatReceived | ControlAcknowledged | MessageUnreadable:
    """An executor's framework message (base64 or raw JSON of a `common.messages.Heartbeat` or
    `ControlAck`) as the event it is."""
    try:
        message = messages.decode(decode_message(raw), messages.TO_SCHEDULER)
    except MessageError as exc:
        return MessageUnreadable(stimulus_id, agent_id, executor_id, str(exc))
    if isinstance(message, ControlAck):
        return ControlAcknowledged(stimulus_id, agent_id, executor_id, message)
    if isinstance(message, messages.Heartbeat):
        return HeartbeatReceived(stimulus_id, agent_id, executor_id, message)
    return MessageUnreadable(stimulus_id, agent_id, executor_id,
                             f"unknown kind {type(message).__name__!r}")


def encode_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def scalar(name: str, amount: float) -> dict[str, Any]:
    return {"name": name, "type": "SCALAR", "scalar": {"value": float(amount)}}


def port_ranges(ports: tuple[int, ...]) -> dict[str, Any]:
    return {"name": "ports", "type": "RANGES",
            "ranges": {"range": [{"begin": b, "end": e} for b, e in _ranges(ports)]}}


def _ranges(ports: tuple[int, ...]) -> list[PortRange]:
    out: list[PortRange] = []
    for p in sorted(ports):
        if out and out[-1][1] == p - 1:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return out


def executor_info(spec: ExecutorSpec, agent_id: str, framework_id: str) -> dict[str, Any]:
    """The one executor every task on `agent_id` shares (same dict for each launch there)."""
    env = [{"name": k, "value": v} for k, v in spec.environment]
    return {
        "executor_id": {"value": spec.executor_id(agent_id)},
        "framework_id": {"value": framework_id},
        "name": f"elastiq executor on {agent_id}",
        "command": {"value": spec.command, "shell": True,
                    "environment": {"variables": env}},
        "resources": [scalar("cpus", spec.cpus), scalar("mem", spec.mem_mb)],
    }


def task_info(launch: TaskLaunch, agent_id: str, executor: dict[str, Any]) -> dict[str, Any]:
    resources = [scalar("cpus", launch.cpus), scalar("mem", launch.mem_mb)]
    if launch.ports:
        resources.append(port_ranges(launch.ports))
    return {
        "name": launch.name,
        "task_id": {"value": launch.mesos_task_id},
        "agent_id": {"value": agent_id},
        "resources": resources,
        "executor": executor,
        "data": encode_bytes(launch.data.encode("utf-8")),
    }


def framework_info(config: SchedulerConfig, user: str,
                   framework_id: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "user": user,
        "name": config.framework_name,
        "roles": [config.role],
        "failover_timeout": config.failover_timeout,
        "checkpoint": True,
        # PARTITION_AWARE: an agent cut off gives TASK_UNREACHABLE (the task may still run: its
        # attempt is superseded and fenced, `executor.fencing`), TASK_GONE / _UNKNOWN / DROPPED
        # for tasks known not to run or not known; all of them fail the attempt over
        "capabilities": [{"type": "MULTI_ROLE"}, {"type": "PARTITION_AWARE"}],
    }
    if framework_id:
        info["id"] = {"value": framework_id}
    return info


def refuse_filter(seconds: float) -> dict[str, Any]:
    return {"refuse_seconds": float(seconds)}
