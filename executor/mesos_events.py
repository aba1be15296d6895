"""The executor's pure edge to Mesos: what pymesos hands over -> events; messages -> bytes.

Owns reading a Mesos TaskInfo into a checked `TaskLaunch` (`read_launch`, `launch_event`: base64
of the `common.messages.LaunchData` JSON, plus the channel keys, checked here because that needs
zmq), reading the scheduler's framework messages (base64 of a `ControlMessage` or
`RetargetMessage`) into events (`message_event`), and the JSON bytes of the messages the
executor sends (`ack_bytes`, `heartbeat_bytes`; pymesos' base64 is done by the caller). Pure
functions without pymesos. Does not own deciding anything (`executor.executor_state`) nor
calling the driver (`executor.mesos_executor`).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Mapping

from common import messages
from common.messages import (ControlMessage, Heartbeat, LaunchData, LaunchDataError,
                             MessageError, ReadersMessage, RetargetMessage)
from executor.channels.auth import ChannelKeyError, TaskKeys
from executor.executor_state import (ControlReceived, LaunchRejected, MessageUnreadable,
                                     ReadersReceived, RetargetReceived, SendControlAck,
                                     TaskLaunch, TaskLaunched)


def mesos_task_id_of(task_info: Mapping[str, Any]) -> str:
    """`{"task_id": {"value": "x"}}` -> "x"; LaunchDataError when absent."""
    inner = task_info.get("task_id")
    value = inner.get("value") if isinstance(inner, Mapping) else None
    if not isinstance(value, str) or not value:
        raise LaunchDataError("TaskInfo.task_id.value is missing")
    return value


def _decode_data(raw: Any) -> Any:
    if not isinstance(raw, str) or not raw:
        raise LaunchDataError("TaskInfo.data is missing")
    try:
        return json.loads(base64.b64decode(raw, validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise LaunchDataError(f"TaskInfo.data is not base64 of JSON: {exc}") from None


def _keys(raw: Any) -> TaskKeys | None:
    """The launch's channel keys; LaunchDataError (never quoting a key) when malformed."""
    if raw is None:
        return None
    try:
        return TaskKeys.from_json(raw)
    except ChannelKeyError as exc:
        raise LaunchDataError(f"keys: {exc}") from None


def read_launch(task_info: Mapping[str, Any]) -> TaskLaunch:
    """A Mesos TaskInfo -> TaskLaunch; raises LaunchDataError naming what is wrong."""
    mesos_task_id = mesos_task_id_of(task_info)
    data = LaunchData.from_json(_decode_data(task_info.get("data")))
    task = data.task
    return TaskLaunch(mesos_task_id, task.task_id, task.query_id, task.kind, task.program,
                      data.endpoints, data.attempt, task.outputs, data.control.params,
                      data.control.version, _keys(data.keys), data.epoch)


def launch_event(stimulus_id: str, task_info: Mapping[str, Any]
                 ) -> TaskLaunched | LaunchRejected | None:
    """A TaskInfo -> the launch, or its rejection; None when it has no task id to answer to."""
    try:
        return TaskLaunched(stimulus_id, read_launch(task_info))
    except LaunchDataError as exc:
        try:
            return LaunchRejected(stimulus_id, mesos_task_id_of(task_info), str(exc))
        except LaunchDataError:
            return None


def message_event(stimulus_id: str, raw: str | bytes
                  ) -> ControlReceived | RetargetReceived | ReadersReceived | MessageUnreadable:
    """A scheduler's framework message as pymesos delivers it (base64 text) -> an event."""
    try:
        text = raw.encode("ascii") if isinstance(raw, str) else raw
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, UnicodeError, ValueError) as exc:
        return MessageUnreadable(stimulus_id, f"not base64 of JSON: {exc}")
    try:
        message = messages.decode(data, messages.TO_EXECUTOR)
    except MessageError as exc:
        return MessageUnreadable(stimulus_id, str(exc))
    if isinstance(message, RetargetMessage):
        return RetargetReceived(stimulus_id, message)
    if isinstance(message, ReadersMessage):
        return ReadersReceived(stimulus_id, message)
    if isinstance(message, ControlMessage):
        return ControlReceived(stimulus_id, message)
    return MessageUnreadable(stimulus_id, f"unknown kind {type(message).__name__!r}")


def ack_bytes(ack: SendControlAck) -> bytes:
    """The framework message a control acknowledgement is sent as (JSON, before base64)."""
    return messages.encode(ack.ack)


def heartbeat_bytes(executor_id: str, figures: Mapping[str, Mapping[str, Any]],
                    usage: Mapping[str, float] | None = None) -> bytes:
    """The framework message a heartbeat is sent as (JSON, before Mesos' base64), with the
    executor's own resource usage (`executor.usage`)."""
    return messages.encode(Heartbeat(figures, executor_id, dict(usage or {})))
