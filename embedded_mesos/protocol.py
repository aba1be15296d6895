"""Small pieces of the Mesos v1 JSON protocol shared by the embedded master and agent.

Owns task states, id validation, building TaskStatus dicts and pulling typed fields out of
untrusted JSON with clear errors. It does not own any state or I/O.
"""

from __future__ import annotations

import base64
import re
import uuid
from typing import Any

from embedded_mesos.httpio import bad_request

TERMINAL_STATES = frozenset({
    "TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_LOST", "TASK_ERROR",
    "TASK_DROPPED", "TASK_GONE",
})
KNOWN_STATES = TERMINAL_STATES | {
    "TASK_STAGING", "TASK_STARTING", "TASK_RUNNING", "TASK_KILLING", "TASK_UNREACHABLE",
    "TASK_GONE_BY_OPERATOR", "TASK_UNKNOWN",
}
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
VERSION = "1.11.0"


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES


def safe_id(value: str) -> bool:
    """Ids that become path parts of a sandbox must be plain names."""
    return _SAFE_ID.fullmatch(value) is not None and value not in (".", "..")


def new_uuid() -> str:
    """A status-update uuid as pymesos encodes it: base64 of 16 random bytes."""
    return base64.b64encode(uuid.uuid4().bytes).decode("ascii")


def make_status(task_id: str, state: str, *, timestamp: float, agent_id: str | None = None,
                executor_id: str | None = None, reason: str | None = None,
                message: str | None = None, source: str = "SOURCE_MASTER",
                reliable: bool = False) -> dict[str, Any]:
    """A TaskStatus stamped `timestamp` (wall-clock seconds, given by the caller); `reliable`
    ones carry a uuid and wait for an acknowledgement."""
    status: dict[str, Any] = {
        "task_id": {"value": task_id}, "state": state, "source": source,
        "timestamp": timestamp,
    }
    if agent_id:
        status["agent_id"] = {"value": agent_id}
    if executor_id:
        status["executor_id"] = {"value": executor_id}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if reliable:
        status["uuid"] = new_uuid()
    return status


def typed_field(body: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """body[key] checked to be of `kind`, or a 400 naming the field."""
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise bad_request(f"{where}.{key} is missing or not a {kind.__name__}")
    return value


def id_value(body: dict[str, Any], key: str, where: str) -> str:
    """The string inside `{"value": "..."}` at body[key], or a 400."""
    holder = typed_field(body, key, dict, where)
    value = holder.get("value")
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}.{key}.value is missing or not a non-empty string")
    return value


def wait_status(returncode: int) -> int:
    """A Popen return code as the raw wait(2) status Mesos reports in FAILURE events."""
    return -returncode if returncode < 0 else (returncode & 0xFF) << 8
