"""The executor's decisions: which task runs, what Mesos is told, when a heartbeat goes out.

Owns `ExecutorState`, a pure state object in the manner of a worker state machine: it takes
events (facts: a task was launched or killed, a runner changed state or stopped, time passed, the
agent asked for shutdown, the scheduler sent a framework message) and returns commands
(imperatives: start or stop a runner, rewrite a task's endpoints file, send a status update,
send a heartbeat, exit). Every task moves along the edges of `TRANSITIONS` only; a
missing edge raises `IllegalTransition` with the task's history. Also owns `read_launch`, which
turns a Mesos TaskInfo into a checked `TaskLaunch`, `read_message`/`read_retarget`/
`read_control` for the scheduler's framework messages (`{"kind": "retarget", "task": <mesos task
id>, "endpoints": {channel id: endpoint}}`: a channel the task reads moved; `{"kind": "control",
"task": ..., "version": n, "params": {op: {keyword: value}}, "request": id}`: control tuples to
apply at a batch boundary), and the JSON of the heartbeat and of a control acknowledgement.
Does not own pymesos, Spark, threads, files or the clock (`executor.mesos_executor` runs the
commands and reports what happened as new events).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Union

from common.tasks import QueryTask
from executor.channel_auth import ChannelKeyError, TaskKeys

log = logging.getLogger(__name__)

RunnerState = Literal["starting", "running", "restarting", "failed", "finished"]
TaskPhase = Literal["launching", "running", "killing", "finished", "failed", "killed"]
MesosState = Literal["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED", "TASK_FAILED",
                     "TASK_KILLED"]

TERMINAL_PHASES: frozenset[str] = frozenset({"finished", "failed", "killed"})
REASON_INVALID = "REASON_TASK_INVALID"  # Mesos TaskStatus.Reason for tasks that cannot run
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

# (from, to) -> what triggers the edge. A task starts in "launching" (TaskLaunched).
TRANSITIONS: dict[tuple[str, str], str] = {
    ("launching", "running"): "runner reports its query running (TASK_RUNNING)",
    ("launching", "failed"): "program failed to load or build, or the runner gave up",
    ("launching", "finished"): "the query ended on its own before it was seen running",
    ("launching", "killing"): "TaskKilled, or a newer attempt of the task arrived",
    ("running", "failed"): "runner gave up after spending its restart budget",
    ("running", "finished"): "a finite query completed",
    ("running", "killing"): "TaskKilled, or a newer attempt of the task arrived",
    ("killing", "killed"): "the runner has stopped (TASK_KILLED)",
}


class IllegalTransition(RuntimeError):
    """An edge missing from TRANSITIONS; carries the task's history for the log."""

    def __init__(self, mesos_task_id: str, start: str, finish: str,
                 history: tuple["HistoryEntry", ...]) -> None:
        lines = "; ".join(f"{h.stimulus_id}: {h.start}->{h.finish}" for h in history)
        super().__init__(f"task {mesos_task_id}: no transition {start} -> {finish} "
                         f"(history: {lines or 'none'})")


class LaunchDataError(ValueError):
    """A TaskInfo whose data is not a task this executor can run; the message says why."""


class MessageError(ValueError):
    """A framework message from the scheduler that cannot be read; the message says why."""


# --- values ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TaskLaunch:
    """One task as launched here: the Mesos id of this attempt and the compiled task."""

    mesos_task_id: str  # "<task_id>.a<attempt>", the id Mesos and the scheduler use
    task_id: str  # the query task's id, stable across attempts (names its state folder)
    query_id: str
    kind: str  # "spark" or "plumbing"
    program: str  # generated Python source (compiler.codegen output, never user text)
    endpoints: Mapping[str, str]  # channel id -> "tcp://host:port"
    attempt: int
    outputs: tuple[str, ...] = ()  # channel ids this task serves (its writers live in the hub)
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # set by control tuples
    params_version: int = 0
    keys: TaskKeys | None = None  # this task's channel keys (None: plain-text channels)


@dataclass(frozen=True)
class TaskFigures:
    """What a runner measured, as the I/O shell read it from the query's progress."""

    tuples_in: int = 0
    tuples_out: int = 0
    batches: int = 0
    batch_ms: int = 0
    backlog: int = 0
    latency_ms: int = 0
    channel_blocked_ms: int = 0  # how long its channel sink has waited for backup room
    channel_readerless_ms: int = 0  # ... and how long that channel has had no reader


@dataclass(frozen=True)
class HistoryEntry:
    stimulus_id: str
    start: str
    finish: str


# --- events (facts) -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Registered:
    stimulus_id: str
    executor_id: str
    agent_id: str


@dataclass(frozen=True)
class TaskLaunched:
    stimulus_id: str
    launch: TaskLaunch


@dataclass(frozen=True)
class LaunchRejected:
    """A TaskInfo arrived whose data could not be read (see `read_launch`)."""

    stimulus_id: str
    mesos_task_id: str
    message: str


@dataclass(frozen=True)
class TaskKilled:
    stimulus_id: str
    mesos_task_id: str


@dataclass(frozen=True)
class RunnerStatusChanged:
    stimulus_id: str
    mesos_task_id: str
    state: RunnerState
    reason: str = ""
    restarts: int = 0


@dataclass(frozen=True)
class RunnerStartFailed:
    """The task's program could not be written, loaded or built; nothing was started."""

    stimulus_id: str
    mesos_task_id: str
    message: str


@dataclass(frozen=True)
class RunnerStopped:
    """A StopRunner has completed (also when there was no runner to stop)."""

    stimulus_id: str
    mesos_task_id: str


@dataclass(frozen=True)
class Tick:
    stimulus_id: str
    now: float  # monotonic seconds
    figures: Mapping[str, TaskFigures] = field(default_factory=dict)  # by mesos task id


@dataclass(frozen=True)
class ShutdownRequested:
    stimulus_id: str
    why: str


@dataclass(frozen=True)
class FrameworkMessageReceived:
    """A framework message from the scheduler, as pymesos delivers it (base64 text)."""

    stimulus_id: str
    data: str | bytes


@dataclass(frozen=True)
class ParamsApplied:
    """A runner applied a control request's parameters (switched in its running query, or
    rebuilt it)."""

    stimulus_id: str
    mesos_task_id: str
    request: str
    version: int
    epoch: int  # the first micro-batch with them
    pause_s: float
    at: float = 0.0  # wall-clock seconds when the runner had applied them


@dataclass(frozen=True)
class ParamsRefused:
    """A runner could not apply a control request; its query runs on as before."""

    stimulus_id: str
    mesos_task_id: str
    request: str
    version: int
    message: str


Event = Union[Registered, TaskLaunched, LaunchRejected, TaskKilled, RunnerStatusChanged,
              RunnerStartFailed, RunnerStopped, Tick, ShutdownRequested,
              FrameworkMessageReceived, ParamsApplied, ParamsRefused]


# --- commands (imperatives) -----------------------------------------------------------------------

@dataclass(frozen=True)
class StartRunner:
    stimulus_id: str
    launch: TaskLaunch


@dataclass(frozen=True)
class StopRunner:
    stimulus_id: str
    mesos_task_id: str
    # Close the task's channel writers too (a kill or the query's end). Not when a new attempt
    # supersedes it or when it failed and will be relaunched: the upstream backup must survive.
    release_outputs: bool = False


@dataclass(frozen=True)
class SendStatus:
    stimulus_id: str
    task_id: str  # the Mesos task id
    state: MesosState
    message: str = ""
    reason: str | None = None  # a Mesos TaskStatus.Reason name, when one fits


@dataclass(frozen=True)
class SendHeartbeat:
    stimulus_id: str
    figures: Mapping[str, Mapping[str, Any]]  # mesos task id -> {state, tuples_in, ...}


@dataclass(frozen=True)
class WriteEndpoints:
    """Rewrite the endpoints file of a task (`executor.endpoints_file`) with `endpoints`, all of
    its channels' current endpoints; `changed` are the ones that moved, for the log."""

    stimulus_id: str
    mesos_task_id: str
    task_id: str  # names the task's folder
    endpoints: Mapping[str, str]
    changed: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ApplyParams:
    """Have a task's runner apply `params` (its whole set, version `version`) at a batch
    boundary; the runner reports ParamsApplied or ParamsRefused."""

    stimulus_id: str
    mesos_task_id: str
    request: str
    version: int
    params: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class SendControlAck:
    """Tell the scheduler how a control request went on one task."""

    stimulus_id: str
    mesos_task_id: str
    request: str
    version: int
    applied: bool
    epoch: int = -1
    pause_s: float = 0.0
    message: str = ""
    at: float = 0.0


@dataclass(frozen=True)
class Exit:
    """Stop whatever is left (runners already asked to stop, the session, the hub); exit."""

    stimulus_id: str
    code: int


Command = Union[StartRunner, StopRunner, WriteEndpoints, ApplyParams, SendControlAck, SendStatus,
                SendHeartbeat, Exit]


# --- reading a launch (pure) ----------------------------------------------------------------------

def _decode_data(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, str) or not raw:
        raise LaunchDataError("TaskInfo.data is missing")
    try:
        payload = json.loads(base64.b64decode(raw, validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise LaunchDataError(f"TaskInfo.data is not base64 of JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise LaunchDataError("TaskInfo.data must be a JSON object")
    return payload


def _endpoints(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.startswith("tcp://")
            for k, v in raw.items()):
        raise LaunchDataError("endpoints must map channel ids to 'tcp://host:port' strings")
    return dict(raw)


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


def read_launch(task_info: Mapping[str, Any]) -> TaskLaunch:
    """A Mesos TaskInfo -> TaskLaunch; raises LaunchDataError naming what is wrong."""
    mesos_task_id = mesos_task_id_of(task_info)
    payload = _decode_data(task_info.get("data"))
    task = _query_task(payload.get("task"))
    attempt = payload.get("attempt", 1)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise LaunchDataError(f"attempt must be a positive integer, got {attempt!r}")
    version, params = _control(payload.get("control") or {"version": 0, "params": {}})
    return TaskLaunch(mesos_task_id, task.task_id, task.query_id, task.kind, task.program,
                      _endpoints(payload.get("endpoints")), attempt, task.outputs, params,
                      version, _keys(payload.get("keys")))


def _keys(raw: Any) -> TaskKeys | None:
    """The launch's channel keys; LaunchDataError (never quoting a key) when malformed."""
    if raw is None:
        return None
    try:
        return TaskKeys.from_json(raw)
    except ChannelKeyError as exc:
        raise LaunchDataError(f"keys: {exc}") from None


def _control(raw: Any) -> tuple[int, dict[str, dict[str, Any]]]:
    """`{"version": n, "params": {op: {keyword: value}}}` -> (n, params); LaunchDataError."""
    if not isinstance(raw, Mapping):
        raise LaunchDataError("control must be a JSON object")
    version, params = raw.get("version", 0), raw.get("params", {})
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise LaunchDataError(f"control version must be a whole number >= 0, got {version!r}")
    if not isinstance(params, Mapping) or not all(
            isinstance(op, str) and isinstance(values, Mapping)
            and all(isinstance(k, str) for k in values) for op, values in params.items()):
        raise LaunchDataError("control params must map operator ids to {keyword: value}")
    return version, {op: dict(values) for op, values in params.items()}


def mesos_task_id_of(task_info: Mapping[str, Any]) -> str:
    """`{"task_id": {"value": "x"}}` -> "x"; LaunchDataError when absent."""
    inner = task_info.get("task_id")
    value = inner.get("value") if isinstance(inner, Mapping) else None
    if not isinstance(value, str) or not value:
        raise LaunchDataError("TaskInfo.task_id.value is missing")
    return value


def read_message(raw: str | bytes) -> dict[str, Any]:
    """A scheduler's framework message (base64 of a JSON object) -> the object; MessageError."""
    try:
        text = raw.encode("ascii") if isinstance(raw, str) else raw
        message = json.loads(base64.b64decode(text, validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise MessageError(f"not base64 of JSON: {exc}") from None
    if not isinstance(message, dict):
        raise MessageError("not a JSON object")
    return message


def read_retarget(message: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """A retarget message -> (mesos task id, {channel id: endpoint}); MessageError."""
    task = message.get("task")
    if not isinstance(task, str) or not task:
        raise MessageError("retarget without a 'task' (mesos task id)")
    try:
        endpoints = _endpoints(message.get("endpoints"))
    except LaunchDataError as exc:
        raise MessageError(f"retarget of {task}: {exc}") from None
    if not endpoints:
        raise MessageError(f"retarget of {task} names no endpoints")
    return task, endpoints


def read_control(message: Mapping[str, Any]) -> tuple[str, str, int, dict[str, dict[str, Any]]]:
    """A control message -> (mesos task id, request id, version, params); MessageError."""
    task, request = message.get("task"), message.get("request")
    if not isinstance(task, str) or not task:
        raise MessageError("control without a 'task' (mesos task id)")
    if not isinstance(request, str) or not request:
        raise MessageError(f"control of {task} without a 'request' id")
    try:
        version, params = _control(message)
    except LaunchDataError as exc:
        raise MessageError(f"control of {task}: {exc}") from None
    if version < 1:
        raise MessageError(f"control of {task}: version must be >= 1")
    return task, request, version, params


def control_ack_message(ack: SendControlAck) -> bytes:
    """The framework message a control acknowledgement is sent as (JSON, before base64)."""
    return json.dumps({"kind": "control-ack", "task": ack.mesos_task_id, "request": ack.request,
                       "version": ack.version, "applied": ack.applied, "epoch": ack.epoch,
                       "pause_s": round(ack.pause_s, 4), "message": ack.message,
                       "at": ack.at},
                      sort_keys=True).encode("utf-8")


def heartbeat_message(executor_id: str, figures: Mapping[str, Mapping[str, Any]]) -> bytes:
    """The framework message a heartbeat is sent as (JSON, before Mesos' base64)."""
    return json.dumps({"kind": "heartbeat", "executor_id": executor_id,
                       "tasks": {k: dict(v) for k, v in figures.items()}},
                      sort_keys=True).encode("utf-8")


# --- the state machine ----------------------------------------------------------------------------

@dataclass
class TaskRecord:
    """What the executor knows about one task attempt."""

    launch: TaskLaunch
    phase: TaskPhase = "launching"
    runner_state: RunnerState = "starting"
    restarts: int = 0
    endpoints: dict[str, str] = field(default_factory=dict)  # current, retargets included
    params_version: int = 0  # the newest control version asked of this attempt
    kill_note: str = ""  # why it is being stopped ("killed by the scheduler", "superseded")
    history: list[HistoryEntry] = field(default_factory=list)

    def move(self, finish: TaskPhase, stimulus_id: str) -> None:
        if (self.phase, finish) not in TRANSITIONS:
            raise IllegalTransition(self.launch.mesos_task_id, self.phase, finish,
                                    tuple(self.history))
        self.history.append(HistoryEntry(stimulus_id, self.phase, finish))
        self.phase = finish

    @property
    def live(self) -> bool:
        return self.phase not in TERMINAL_PHASES


class ExecutorState:
    """Pure decisions of one executor; `handle(event) -> commands` is the only mutator."""

    def __init__(self, heartbeat_seconds: float = 1.0) -> None:
        self.heartbeat_seconds = heartbeat_seconds
        self.executor_id: str | None = None
        self.agent_id: str | None = None
        self.tasks: dict[str, TaskRecord] = {}  # by mesos task id
        self.last_heartbeat: float | None = None
        self.shutting_down = False

    def handle(self, event: Event) -> list[Command]:
        handler = getattr(self, f"_on_{type(event).__name__}", None)
        if handler is None:
            raise TypeError(f"ExecutorState: unknown event {event!r}")
        return handler(event)

    def live_tasks(self) -> list[TaskRecord]:
        return [t for t in self.tasks.values() if t.live]

    # --- registration and launches ----------------------------------------------------------

    def _on_Registered(self, ev: Registered) -> list[Command]:
        self.executor_id, self.agent_id = ev.executor_id, ev.agent_id
        log.info("[%s] executor %s registered on agent %s", ev.stimulus_id, ev.executor_id,
                 ev.agent_id)
        return []

    def _on_TaskLaunched(self, ev: TaskLaunched) -> list[Command]:
        launch, sid = ev.launch, ev.stimulus_id
        if self.shutting_down:
            log.warning("[%s] task %s: launch during shutdown ignored", sid, launch.mesos_task_id)
            return []
        if launch.mesos_task_id in self.tasks:
            log.warning("[%s] task %s: launched twice; second launch ignored", sid,
                        launch.mesos_task_id)
            return []
        if launch.kind != "spark":
            message = (f"task {launch.task_id}: {launch.kind!r} tasks are not run by this "
                       "executor (only 'spark')")
            log.warning("[%s] %s", sid, message)
            return [SendStatus(sid, launch.mesos_task_id, "TASK_FAILED", message, REASON_INVALID)]
        commands: list[Command] = []
        for old in self._same_task(launch):
            commands += self._begin_stop(old, sid, f"superseded by attempt {launch.attempt}")
        self.tasks[launch.mesos_task_id] = TaskRecord(launch, endpoints=dict(launch.endpoints),
                                                      params_version=launch.params_version)
        log.info("[%s] task %s: launching (task %s, attempt %s)", sid, launch.mesos_task_id,
                 launch.task_id, launch.attempt)
        return commands + [SendStatus(sid, launch.mesos_task_id, "TASK_STARTING"),
                           StartRunner(sid, launch)]

    def _same_task(self, launch: TaskLaunch) -> list[TaskRecord]:
        """Live older attempts of the same query task: they share its checkpoint folder."""
        return [t for t in self.tasks.values()
                if t.live and t.phase != "killing" and t.launch.task_id == launch.task_id]

    def _on_LaunchRejected(self, ev: LaunchRejected) -> list[Command]:
        log.warning("[%s] task %s: rejected: %s", ev.stimulus_id, ev.mesos_task_id, ev.message)
        return [SendStatus(ev.stimulus_id, ev.mesos_task_id, "TASK_FAILED", ev.message,
                           REASON_INVALID)]

    # --- kills and runner reports -----------------------------------------------------------

    def _begin_stop(self, task: TaskRecord, sid: str, note: str,
                    release_outputs: bool = False) -> list[Command]:
        task.move("killing", sid)
        task.kill_note = note
        log.info("[%s] task %s: stopping (%s)", sid, task.launch.mesos_task_id, note)
        return [StopRunner(sid, task.launch.mesos_task_id, release_outputs)]

    def _on_TaskKilled(self, ev: TaskKilled) -> list[Command]:
        task = self.tasks.get(ev.mesos_task_id)
        if task is None:
            log.info("[%s] task %s: kill for a task not on this executor", ev.stimulus_id,
                     ev.mesos_task_id)
            return [SendStatus(ev.stimulus_id, ev.mesos_task_id, "TASK_KILLED",
                               "the task is not running on this executor")]
        if not task.live or task.phase == "killing":
            log.info("[%s] task %s: kill ignored, task is %s", ev.stimulus_id, ev.mesos_task_id,
                     task.phase)
            return []
        return self._begin_stop(task, ev.stimulus_id, "killed by the scheduler",
                                release_outputs=True)

    def _on_RunnerStatusChanged(self, ev: RunnerStatusChanged) -> list[Command]:
        task = self.tasks.get(ev.mesos_task_id)
        if task is None or task.phase not in ("launching", "running"):
            return []  # a late report for a task that is stopping or over
        task.runner_state, task.restarts = ev.state, ev.restarts
        sid, mid = ev.stimulus_id, ev.mesos_task_id
        if ev.state == "running" and task.phase == "launching":
            task.move("running", sid)
            return [SendStatus(sid, mid, "TASK_RUNNING", ev.reason)]  # e.g. state replaced
        if ev.state == "failed":
            task.move("failed", sid)
            return [SendStatus(sid, mid, "TASK_FAILED", ev.reason or "the query failed"),
                    StopRunner(sid, mid)]
        if ev.state == "finished":
            task.move("finished", sid)
            return [SendStatus(sid, mid, "TASK_FINISHED", ev.reason or "the query completed"),
                    StopRunner(sid, mid, release_outputs=True)]
        return []  # starting / restarting / running again: visible in heartbeats only

    def _on_RunnerStartFailed(self, ev: RunnerStartFailed) -> list[Command]:
        task = self.tasks.get(ev.mesos_task_id)
        if task is None or task.phase != "launching":
            return []  # being killed already: RunnerStopped will report it
        task.move("failed", ev.stimulus_id)
        log.warning("[%s] task %s: start failed: %s", ev.stimulus_id, ev.mesos_task_id,
                    ev.message)
        return [SendStatus(ev.stimulus_id, ev.mesos_task_id, "TASK_FAILED", ev.message,
                           REASON_INVALID)]

    def _on_RunnerStopped(self, ev: RunnerStopped) -> list[Command]:
        task = self.tasks.get(ev.mesos_task_id)
        if task is None or task.phase != "killing":
            return []
        task.move("killed", ev.stimulus_id)
        if self.shutting_down:
            return []  # the driver has gone; the agent reports the executor's tasks itself
        return [SendStatus(ev.stimulus_id, ev.mesos_task_id, "TASK_KILLED", task.kill_note)]

    # --- messages from the scheduler ---------------------------------------------------------

    def _on_FrameworkMessageReceived(self, ev: FrameworkMessageReceived) -> list[Command]:
        sid = ev.stimulus_id
        try:
            message = read_message(ev.data)
            kind = message.get("kind")
            if kind == "control":
                return self._control(sid, *read_control(message))
            if kind != "retarget":
                raise MessageError(f"unknown kind {kind!r}")
            mesos_task_id, endpoints = read_retarget(message)
        except MessageError as exc:
            log.warning("[%s] executor %s: framework message ignored: %s", sid, self.executor_id,
                        exc)
            return []
        return self._retarget(sid, mesos_task_id, endpoints)

    def _control(self, sid: str, mesos_task_id: str, request: str, version: int,
                 params: dict[str, dict[str, Any]]) -> list[Command]:
        """Control tuples for a task: applied by its runner if it runs; refused (nothing
        touched) if it is not here or not running; an old version is acknowledged as is."""
        task = self.tasks.get(mesos_task_id)
        if task is None or task.phase != "running":
            why = f"task is {task.phase}" if task else "task is not on this executor"
            log.warning("[%s] task %s: control %s refused (%s)", sid, mesos_task_id, request, why)
            return [SendControlAck(sid, mesos_task_id, request, version, False, message=why)]
        if version <= task.params_version:
            log.info("[%s] task %s: control %s (version %s) already asked", sid, mesos_task_id,
                     request, version)
            return []
        task.params_version = version
        return [ApplyParams(sid, mesos_task_id, request, version, params)]

    def _on_ParamsApplied(self, ev: ParamsApplied) -> list[Command]:
        log.info("[%s] task %s: control %s applied from batch %s", ev.stimulus_id,
                 ev.mesos_task_id, ev.request, ev.epoch)
        return [SendControlAck(ev.stimulus_id, ev.mesos_task_id, ev.request, ev.version, True,
                               ev.epoch, ev.pause_s, at=ev.at)]

    def _on_ParamsRefused(self, ev: ParamsRefused) -> list[Command]:
        log.warning("[%s] task %s: control %s refused: %s", ev.stimulus_id, ev.mesos_task_id,
                    ev.request, ev.message)
        return [SendControlAck(ev.stimulus_id, ev.mesos_task_id, ev.request, ev.version, False,
                               message=ev.message)]

    def _retarget(self, sid: str, mesos_task_id: str,
                  endpoints: Mapping[str, str]) -> list[Command]:
        """Channels a live task reads moved: merge, and have its endpoints file rewritten."""
        task = self.tasks.get(mesos_task_id)
        if task is None or task.phase not in ("launching", "running"):
            log.warning("[%s] task %s: retarget ignored (%s)", sid, mesos_task_id,
                        f"task is {task.phase}" if task else "not on this executor")
            return []
        own = sorted(c for c in endpoints if c in task.launch.outputs)
        if own:
            log.warning("[%s] task %s: retarget of its own output channels %s ignored", sid,
                        mesos_task_id, ", ".join(own))
        changed = {c: e for c, e in endpoints.items()
                   if c not in own and task.endpoints.get(c) != e}
        if not changed:
            log.info("[%s] task %s: retarget changes nothing", sid, mesos_task_id)
            return []
        task.endpoints.update(changed)
        return [WriteEndpoints(sid, mesos_task_id, task.launch.task_id, dict(task.endpoints),
                               tuple(sorted(changed.items())))]

    # --- time and shutdown ------------------------------------------------------------------

    def _on_Tick(self, ev: Tick) -> list[Command]:
        if self.shutting_down or self.executor_id is None:
            return []
        due = self.last_heartbeat is None or ev.now - self.last_heartbeat >= self.heartbeat_seconds
        if not due:
            return []
        self.last_heartbeat = ev.now
        return [SendHeartbeat(ev.stimulus_id, {
            t.launch.mesos_task_id: self._figures(t, ev.figures.get(t.launch.mesos_task_id))
            for t in self.live_tasks()})]

    @staticmethod
    def _figures(task: TaskRecord, measured: TaskFigures | None) -> dict[str, Any]:
        m = measured or TaskFigures()
        state = task.runner_state if task.phase == "running" else task.phase
        return {"state": state, "tuples_in": m.tuples_in, "tuples_out": m.tuples_out,
                "batches": m.batches, "batch_ms": m.batch_ms, "backlog": m.backlog,
                "latency_ms": m.latency_ms, "restarts": task.restarts,
                "channel_blocked_ms": m.channel_blocked_ms,
                "channel_readerless_ms": m.channel_readerless_ms}

    def _on_ShutdownRequested(self, ev: ShutdownRequested) -> list[Command]:
        if self.shutting_down:
            return []
        log.info("[%s] executor %s: shutting down (%s)", ev.stimulus_id, self.executor_id, ev.why)
        commands: list[Command] = []
        for task in self.live_tasks():
            if task.phase != "killing":
                commands += self._begin_stop(task, ev.stimulus_id, f"executor shutdown: {ev.why}")
        self.shutting_down = True
        return commands + [Exit(ev.stimulus_id, 0)]
