"""The scheduler <-> executor wire protocol: one typed value per message, and its JSON.

Owns the messages both sides exchange, each a frozen dataclass with `to_json()` and a checking
`from_json()` (MessageError naming what is wrong):
- `LaunchData`: what a task's executor receives in TaskInfo.data (the task, its channel
  endpoints, its attempt and the attempt's fencing epoch, its `ParamSet`, what it needs of its query, its channel CURVE keys);
  `LaunchDataError` when it cannot be read;
- `ControlMessage` (kind "control"): a task's whole parameter set, to apply at a batch boundary;
- `RetargetMessage` (kind "retarget"): channels a task reads moved;
- `ReadersMessage` (kind "readers"): other queries' readers of a published channel come or go;
- `ControlAck` (kind "control-ack"): how a control request went on one task;
- `Heartbeat` (kind "heartbeat"): an executor's figures per task.
Also `ParamSet` (a version and the parameters control tuples set, with `newer_than`), and
`encode`/`decode`, JSON bytes chosen by "kind". Does not own base64 or Mesos (the adapters:
`scheduler.mesos_json`, `executor.mesos_events`), nor checking channel keys (they need zmq:
`executor.channels.auth`); the launch data's keys hold a secret, so they never show in a repr.
"""

from __future__ import annotations

import math
import json
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Union

from common.tasks import ChannelSpec, QueryTask

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

Params = Mapping[str, Mapping[str, Any]]  # operator id -> keyword -> value


class MessageError(ValueError):
    """A message that cannot be read; the message says why."""


class LaunchDataError(MessageError):
    """A TaskInfo whose data is not a task this executor can run; the message says why."""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The endpoint of a channel whose producer is not placed: a dormant instance slot of a
# partitioned operator, never launched or retired by a scale-in (its merger does not wait for it)
UNPLACED = ""


def _endpoints(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and (v == UNPLACED or v.startswith("tcp://"))
            for k, v in raw.items()):
        raise LaunchDataError("endpoints must map channel ids to 'tcp://host:port' strings "
                              "(or \"\": not placed)")
    return dict(raw)


@dataclass(frozen=True)
class ParamSet:
    """A task's whole parameter set as control tuples made it, and its version (0: none)."""

    version: int = 0
    params: Params = field(default_factory=dict)

    def newer_than(self, version: int) -> bool:
        """Whether this set supersedes the one of `version` (an older or equal one does not)."""
        return self.version > version

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "params": self.params}

    @classmethod
    def from_json(cls, raw: Any) -> "ParamSet":
        """`{"version": n, "params": {op: {keyword: value}}}`; LaunchDataError."""
        if not isinstance(raw, Mapping):
            raise LaunchDataError("control must be a JSON object")
        version, params = raw.get("version", 0), raw.get("params", {})
        if not _whole(version) or version < 0:
            raise LaunchDataError(f"control version must be a whole number >= 0, got {version!r}")
        if not isinstance(params, Mapping) or not all(
                isinstance(op, str) and isinstance(values, Mapping)
                and all(isinstance(k, str) for k in values) for op, values in params.items()):
            raise LaunchDataError("control params must map operator ids to {keyword: value}")
        return cls(version, {op: dict(values) for op, values in params.items()})


@dataclass(frozen=True)
class LaunchQuery:
    """What a task needs of its query: its id, the channels the task touches, the sinks."""

    query_id: str
    channels: tuple[ChannelSpec, ...] = ()
    sinks: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "channels": [c.to_json() for c in self.channels],
                "sinks": dict(self.sinks)}

    @classmethod
    def from_json(cls, raw: Any) -> "LaunchQuery":
        try:
            return cls(str(raw["query_id"]), tuple(ChannelSpec.from_json(c)
                                                   for c in raw.get("channels", ())),
                       {str(k): str(v) for k, v in (raw.get("sinks") or {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LaunchDataError(f"'query' is not a query's launch part: missing or bad "
                                  f"{exc}") from None


@dataclass(frozen=True)
class LaunchData:
    """TaskInfo.data of one task attempt. `keys` is the task's channel keys as JSON (its own
    keypair, its producers' and readers' public keys; None: plain-text channels); it holds the
    task's secret key, so it is never in a repr."""

    task: QueryTask
    endpoints: Mapping[str, str] = field(default_factory=dict)  # channel id -> tcp://host:port
    attempt: int = 1
    control: ParamSet = field(default_factory=ParamSet)
    query: LaunchQuery | None = None
    keys: Mapping[str, Any] | None = field(default=None, repr=False)
    # the attempt's fencing token: larger for every later attempt of the task (0: unfenced)
    epoch: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            **({"keys": self.keys} if self.keys is not None else {}),
            "task": self.task.to_json(),
            "endpoints": dict(self.endpoints),
            "attempt": self.attempt,
            "control": self.control.to_json(),
            **({"query": self.query.to_json()} if self.query is not None else {}),
            "epoch": self.epoch,
        }

    @classmethod
    def from_json(cls, payload: Any) -> "LaunchData":
        """Launch data as JSON -> LaunchData; LaunchDataError naming what is wrong. The keys
        are taken as they are (the executor checks them)."""
        if not isinstance(payload, dict):
            raise LaunchDataError("TaskInfo.data must be a JSON object")
        task = _query_task(payload.get("task"))
        attempt = payload.get("attempt", 1)
        if not _whole(attempt) or attempt < 1:
            raise LaunchDataError(f"attempt must be a positive integer, got {attempt!r}")
        epoch = payload.get("epoch", 0)
        if not _whole(epoch) or epoch < 0:
            raise LaunchDataError(f"epoch must be a whole number >= 0, got {epoch!r}")
        control = ParamSet.from_json(payload.get("control") or {"version": 0, "params": {}})
        endpoints = _endpoints(payload.get("endpoints"))
        query = LaunchQuery.from_json(payload["query"]) if "query" in payload else None
        return cls(task, endpoints, attempt, control, query, payload.get("keys"), epoch)


def _query_task(raw: Any) -> QueryTask:
    if not isinstance(raw, dict):
        raise LaunchDataError("'task' must be a QueryTask JSON object")
    try:
        task = QueryTask.from_json(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise LaunchDataError(f"'task' is not a QueryTask: missing or bad {exc}") from None
    if not _SAFE_ID.match(task.task_id) or ".." in task.task_id:
        raise LaunchDataError(f"task id {task.task_id!r} is not a safe name "
                              "(letters, digits, '.', '_', '-')")
    if not isinstance(task.program, str) or not task.program.strip():
        raise LaunchDataError(f"task {task.task_id} has no program")
    return task


# --- framework messages ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ControlMessage:
    """Scheduler -> executor: apply `params` (the task's whole set, `version`) for `request`."""

    task: str  # the mesos task id of the attempt
    request: str
    version: int
    params: Params = field(default_factory=dict)

    @property
    def param_set(self) -> ParamSet:
        return ParamSet(self.version, self.params)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "control", "task": self.task, "request": self.request,
                "version": self.version, "params": self.params}

    @classmethod
    def from_json(cls, message: Mapping[str, Any]) -> "ControlMessage":
        task, request = message.get("task"), message.get("request")
        if not isinstance(task, str) or not task:
            raise MessageError("control without a 'task' (mesos task id)")
        if not isinstance(request, str) or not request:
            raise MessageError(f"control of {task} without a 'request' id")
        try:
            params = ParamSet.from_json(message)
        except LaunchDataError as exc:
            raise MessageError(f"control of {task}: {exc}") from None
        if params.version < 1:
            raise MessageError(f"control of {task}: version must be >= 1")
        return cls(task, request, params.version, params.params)


@dataclass(frozen=True)
class RetargetMessage:
    """Scheduler -> executor: channels `task` reads are now served at these endpoints."""

    task: str  # the mesos task id of the consumer's attempt
    endpoints: tuple[tuple[str, str], ...]  # (channel id, "tcp://host:port" or UNPLACED)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "retarget", "task": self.task, "endpoints": dict(self.endpoints)}

    @classmethod
    def from_json(cls, message: Mapping[str, Any]) -> "RetargetMessage":
        task = message.get("task")
        if not isinstance(task, str) or not task:
            raise MessageError("retarget without a 'task' (mesos task id)")
        try:
            endpoints = _endpoints(message.get("endpoints"))
        except LaunchDataError as exc:
            raise MessageError(f"retarget of {task}: {exc}") from None
        if not endpoints:
            raise MessageError(f"retarget of {task} names no endpoints")
        return cls(task, tuple(endpoints.items()))


@dataclass(frozen=True)
class ReadersMessage:
    """Scheduler -> executor: other queries' reader tasks of a published channel `task` serves
    come (`add`: reader id -> CURVE public key, "" on a plain-text writer) or go (`drop`)."""

    task: str  # the mesos task id of the writer's attempt
    channel: str
    add: tuple[tuple[str, str], ...] = ()
    drop: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": "readers", "task": self.task, "channel": self.channel,
                "add": dict(self.add), "drop": list(self.drop)}

    @classmethod
    def from_json(cls, message: Mapping[str, Any]) -> "ReadersMessage":
        task, channel = message.get("task"), message.get("channel")
        if not isinstance(task, str) or not task or not isinstance(channel, str) or not channel:
            raise MessageError("readers without a 'task' (mesos task id) or a 'channel'")
        add, drop = message.get("add", {}), message.get("drop", [])
        if not isinstance(add, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in add.items()):
            raise MessageError(f"readers of {task}: 'add' must map reader ids to keys")
        if not isinstance(drop, list) or not all(isinstance(r, str) for r in drop):
            raise MessageError(f"readers of {task}: 'drop' must list reader ids")
        if not add and not drop:
            raise MessageError(f"readers of {task} adds and drops nothing")
        return cls(task, channel, tuple(sorted(add.items())), tuple(drop))


@dataclass(frozen=True)
class ControlAck:
    """Executor -> scheduler: how control `request` went on `task`: applied from micro-batch
    `epoch` after a pause of `pause_s` (at wall-clock `at`), or refused with `message`."""

    task: str
    request: str
    version: int
    applied: bool
    epoch: int = -1
    pause_s: float = 0.0
    message: str = ""
    at: float = 0.0
    detail: Mapping[str, float] = field(default_factory=dict)  # e.g. a splitter's switch_ms

    def to_json(self) -> dict[str, Any]:
        return {"kind": "control-ack", "task": self.task, "request": self.request,
                "version": self.version, "applied": self.applied, "epoch": self.epoch,
                "pause_s": round(self.pause_s, 4), "message": self.message, "at": self.at,
                **({"detail": dict(self.detail)} if self.detail else {})}

    @classmethod
    def from_json(cls, message: Mapping[str, Any]) -> "ControlAck":
        try:
            return cls(str(message.get("task", "")), str(message.get("request", "")),
                       int(message.get("version", 0)), bool(message.get("applied")),
                       int(message.get("epoch", -1)), float(message.get("pause_s", 0.0)),
                       str(message.get("message", "")), float(message.get("at", 0.0)),
                       _numbers(message.get("detail")))
        except (TypeError, ValueError) as exc:
            raise MessageError(str(exc)) from None


def _numbers(value: Any) -> dict[str, float]:
    """A mapping of names to finite numbers (an acknowledgement's detail); ValueError else."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > 16:
        raise ValueError("an acknowledgement's detail must map at most 16 names to numbers")
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"detail {str(k)[:40]!r} is not a finite number")
        out[str(k)[:64]] = float(v)
    return out


# A heartbeat figure `retained:<channel id>`: the batches a task's writer of that channel keeps
# for readers that have not acknowledged them (0: every reader committed everything sent).
RETAINED_PREFIX = "retained:"


def retained_of(figures: Mapping[str, float]) -> dict[str, int]:
    """The `retained:<channel>` figures of one task, by channel id."""
    return {k[len(RETAINED_PREFIX):]: int(v) for k, v in figures.items()
            if k.startswith(RETAINED_PREFIX)}


@dataclass(frozen=True)
class Heartbeat:
    """Executor -> scheduler: what each live task measured (figures and words, by mesos task
    id), and the executor's own resource usage (`usage`, Mesos's `ResourceStatistics` names:
    cpus_user_time_secs, cpus_nr_throttled, mem_rss_bytes, ...; empty when not measured). An
    executor names itself; a bare sender (a test fixture) may not."""

    tasks: Mapping[str, Mapping[str, Any]]
    executor_id: str | None = None
    usage: Mapping[str, float] = field(default_factory=dict)

    def figures(self) -> dict[str, dict[str, float]]:
        """The numbers of each task's figures (the executor also reports words, such as its
        runner's state, which the task's own lifecycle already tracks), with the executor's
        usage beside them: its tasks share its container, so each is seen with its figures."""
        usage = _figures_of(self.usage)
        return {mid: {**usage, **_figures_of(f)} for mid, f in self.tasks.items()}

    def to_json(self) -> dict[str, Any]:
        return {"kind": "heartbeat",
                **({"executor_id": self.executor_id} if self.executor_id is not None else {}),
                "tasks": {k: dict(v) for k, v in self.tasks.items()},
                **({"usage": dict(self.usage)} if self.usage else {})}

    @classmethod
    def from_json(cls, message: Mapping[str, Any]) -> "Heartbeat":
        tasks = message.get("tasks")
        if not isinstance(tasks, Mapping) or not all(
                isinstance(f, Mapping) for f in tasks.values()):
            raise MessageError("heartbeat 'tasks' must map mesos task ids to figures")
        executor_id = message.get("executor_id")
        usage = message.get("usage", {})
        if not isinstance(usage, Mapping):
            raise MessageError("heartbeat 'usage' must map figure names to numbers")
        return cls({str(m): dict(f) for m, f in tasks.items()},
                   None if executor_id is None else str(executor_id), _figures_of(usage))


def _figures_of(figures: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers among `figures` (words, booleans, NaN and infinities left out)."""
    return {str(k): float(v) for k, v in figures.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


Message = Union[ControlMessage, RetargetMessage, ReadersMessage, ControlAck, Heartbeat]

_KINDS: dict[str, type[ControlMessage | RetargetMessage | ReadersMessage | ControlAck |
                        Heartbeat]] = {
    "control": ControlMessage, "retarget": RetargetMessage, "readers": ReadersMessage,
    "control-ack": ControlAck, "heartbeat": Heartbeat}
TO_EXECUTOR: frozenset[str] = frozenset({"control", "retarget", "readers"})
TO_SCHEDULER: frozenset[str] = frozenset({"control-ack", "heartbeat"})


def encode(message: Message | LaunchData) -> bytes:
    """A message as UTF-8 JSON (sorted keys); launch data keeps its field order."""
    if isinstance(message, LaunchData):
        return json.dumps(message.to_json()).encode("utf-8")
    return json.dumps(message.to_json(), sort_keys=True).encode("utf-8")


def decode(data: bytes, kinds: Collection[str] = frozenset(_KINDS)) -> Message:
    """UTF-8 JSON of one of `kinds` -> its message; MessageError naming what is wrong."""
    try:
        message = json.loads(data.decode("utf-8"))
    except (UnicodeError, ValueError) as exc:
        raise MessageError(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise MessageError("not a JSON object")
    kind = message.get("kind")
    if kind not in kinds or kind not in _KINDS:
        raise MessageError(f"unknown kind {kind!r}")
    parsed: Message = _KINDS[kind].from_json(message)
    return parsed
