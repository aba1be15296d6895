"""The executor's decisions: which task runs, what Mesos is told, when a heartbeat goes out.

Owns `ExecutorState`, a pure state object in the manner of a worker state machine: it takes
events (facts: a task was launched or killed, a runner changed state or stopped, time passed, the
agent asked for shutdown, the scheduler sent a framework message) and returns commands
(imperatives: start or stop a runner, rewrite a task's endpoints file, send a status update,
send a heartbeat, exit). Every task moves along the edges of `TRANSITIONS` only; a
missing edge raises `IllegalTransition` with the task's history. The scheduler's framework
messages arrive typed (`common.messages.RetargetMessage`: a channel the task reads moved;
`ControlMessage`: a task's parameter set to apply at a batch boundary). `handle` picks the
handler from `_HANDLERS` (event type -> function) through `common.dispatch`.
Does not own pymesos, Spark, threads, files or the clock (`executor.mesos_executor` runs the
commands and reports what happened as new events), nor reading TaskInfos and message bytes
(`executor.mesos_events`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Union

from common.dispatch import handler
from common.failures import kind_of_text, tag
from common.messages import (RETAINED_PREFIX, ControlAck, ControlMessage, ReadersMessage,
                             RetargetMessage)
from executor.channels.auth import TaskKeys

log = logging.getLogger(__name__)

RunnerState = Literal["starting", "running", "restarting", "failed", "finished"]
TaskPhase = Literal["launching", "running", "killing", "finished", "failed", "killed"]
MesosState = Literal["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED", "TASK_FAILED",
                     "TASK_KILLED"]

TERMINAL_PHASES: frozenset[str] = frozenset({"finished", "failed", "killed"})
REASON_INVALID = "REASON_TASK_INVALID"  # Mesos TaskStatus.Reason for tasks that cannot run

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
    epoch: int = 0  # the attempt's fencing token (`executor.fencing`; 0: unfenced)


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
    busy_ms: int = 0  # time spent in micro-batches, cumulative over the runner's runs
    running_ms: int = 0  # how long the micro-batch running now has run (0: none runs)
    batches_ended: int = 0  # micro-batches ended, cumulative over the runner's runs
    watermark_ms: int = -1  # the query's event-time watermark (-1: none)
    routed_ms: int = -1  # a stateful splitter's largest event time routed (-1: none)
    rows_dropped: int = 0  # rows its drop operators shed, cumulative (docs/load.md)
    cpu_ms: int = 0  # the container's cpu time in the measured batches (`executor.cpu_clock`)
    cpu_batches: int = 0  # ... and how many batches were measured, cumulative
    dpc_mode: int = -1  # a DPC union's mode (`common.dpc.MODE_CODES`; -1: none, not reported)
    dpc_mode_ms: int = 0  # ... how long it has held
    dpc_episode: int = 0  # ... its last episode's number
    dpc_reconcile_ms: int = -1  # ... that episode's reconcile time (-1: none yet)
    # channel id -> batches its writer keeps for readers that have not acknowledged them
    retained: Mapping[str, int] = field(default_factory=dict)


def _dpc_figures(m: TaskFigures) -> dict[str, int]:
    """A DPC task's mode figures for its heartbeat (none for a task without DPC)."""
    if m.dpc_mode < 0:
        return {}
    return {"dpc_mode": m.dpc_mode, "dpc_mode_ms": m.dpc_mode_ms,
            "dpc_episode": m.dpc_episode, "dpc_reconcile_ms": m.dpc_reconcile_ms}


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
    """A TaskInfo arrived whose data could not be read (see `executor.mesos_events`)."""

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
class ControlReceived:
    """The scheduler sent a task's new parameter set (`executor.mesos_events.message_event`)."""

    stimulus_id: str
    message: ControlMessage


@dataclass(frozen=True)
class RetargetReceived:
    """The scheduler says channels a task reads moved."""

    stimulus_id: str
    message: RetargetMessage


@dataclass(frozen=True)
class ReadersReceived:
    """The scheduler says other queries' readers of a published channel come or go."""

    stimulus_id: str
    message: ReadersMessage


@dataclass(frozen=True)
class MessageUnreadable:
    """A framework message from the scheduler that could not be read, and why."""

    stimulus_id: str
    why: str


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
    detail: Mapping[str, float] = field(default_factory=dict)  # what a live switch decided


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
              ControlReceived, RetargetReceived, ReadersReceived, MessageUnreadable,
              ParamsApplied, ParamsRefused]


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
class AdmitReaders:
    """Have the hub's writer of `channel` admit (`add`: reader id -> key) and drop readers."""

    stimulus_id: str
    channel: str
    add: Mapping[str, str]
    drop: tuple[str, ...]


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
    """Tell the scheduler how a control request went on one task (the acknowledgement as it is
    sent, `common.messages.ControlAck`)."""

    stimulus_id: str
    ack: ControlAck

    @property
    def mesos_task_id(self) -> str:
        return self.ack.task

    @property
    def applied(self) -> bool:
        return self.ack.applied


@dataclass(frozen=True)
class Exit:
    """Stop whatever is left (runners already asked to stop, the session, the hub); exit."""

    stimulus_id: str
    code: int


Command = Union[StartRunner, StopRunner, WriteEndpoints, AdmitReaders, ApplyParams,
                SendControlAck, SendStatus, SendHeartbeat, Exit]


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
        return handler(_HANDLERS, event, "ExecutorState")(self, event)

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
            reason = ev.reason or "the query failed"
            return [SendStatus(sid, mid, "TASK_FAILED", tag(kind_of_text(reason), reason)),
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

    def _on_MessageUnreadable(self, ev: MessageUnreadable) -> list[Command]:
        log.warning("[%s] executor %s: framework message ignored: %s", ev.stimulus_id,
                    self.executor_id, ev.why)
        return []

    def _on_RetargetReceived(self, ev: RetargetReceived) -> list[Command]:
        return self._retarget(ev.stimulus_id, ev.message.task, dict(ev.message.endpoints))

    def _on_ReadersReceived(self, ev: ReadersReceived) -> list[Command]:
        """Readers of a channel a task here serves come or go; the hub applies it (or keeps
        it for the writer it has not opened yet)."""
        m = ev.message
        task = self.tasks.get(m.task)
        if task is None or m.channel not in task.launch.outputs:
            log.warning("[%s] task %s: readers of %s ignored (%s)", ev.stimulus_id, m.task,
                        m.channel, "not on this executor" if task is None
                        else "the task does not serve it")
            return []
        return [AdmitReaders(ev.stimulus_id, m.channel, dict(m.add), m.drop)]

    def _on_ControlReceived(self, ev: ControlReceived) -> list[Command]:
        """Control tuples for a task: applied by its runner if it runs; refused (nothing
        touched) if it is not here or not running; an old version is acknowledged as is."""
        sid, m = ev.stimulus_id, ev.message
        mesos_task_id, request, version, params = m.task, m.request, m.version, m.params
        task = self.tasks.get(mesos_task_id)
        if task is None or task.phase != "running":
            why = f"task is {task.phase}" if task else "task is not on this executor"
            log.warning("[%s] task %s: control %s refused (%s)", sid, mesos_task_id, request, why)
            return [SendControlAck(sid, ControlAck(mesos_task_id, request, version, False,
                                                   message=why))]
        if not m.param_set.newer_than(task.params_version):
            log.info("[%s] task %s: control %s (version %s) already asked", sid, mesos_task_id,
                     request, version)
            return []
        task.params_version = version
        return [ApplyParams(sid, mesos_task_id, request, version, params)]

    def _on_ParamsApplied(self, ev: ParamsApplied) -> list[Command]:
        log.info("[%s] task %s: control %s applied from batch %s", ev.stimulus_id,
                 ev.mesos_task_id, ev.request, ev.epoch)
        return [SendControlAck(ev.stimulus_id, ControlAck(ev.mesos_task_id, ev.request, ev.version,
                                                          True, ev.epoch, ev.pause_s, at=ev.at,
                                                          detail=dict(ev.detail)))]

    def _on_ParamsRefused(self, ev: ParamsRefused) -> list[Command]:
        log.warning("[%s] task %s: control %s refused: %s", ev.stimulus_id, ev.mesos_task_id,
                    ev.request, ev.message)
        return [SendControlAck(ev.stimulus_id, ControlAck(ev.mesos_task_id, ev.request, ev.version,
                                                          False, message=ev.message))]

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
                "latency_ms": m.latency_ms, "busy_ms": m.busy_ms, "running_ms": m.running_ms,
                "batches_ended": m.batches_ended,
                "restarts": task.restarts,
                "watermark_ms": m.watermark_ms, "routed_ms": m.routed_ms,
                "rows_dropped": m.rows_dropped,
                "cpu_ms": m.cpu_ms, "cpu_batches": m.cpu_batches,
                "channel_blocked_ms": m.channel_blocked_ms,
                "channel_readerless_ms": m.channel_readerless_ms,
                **_dpc_figures(m),
                **{f"{RETAINED_PREFIX}{c}": n for c, n in sorted(m.retained.items())}}

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


_HANDLERS: dict[type, Callable[[ExecutorState, Any], list[Command]]] = {
    Registered: ExecutorState._on_Registered,
    TaskLaunched: ExecutorState._on_TaskLaunched,
    LaunchRejected: ExecutorState._on_LaunchRejected,
    TaskKilled: ExecutorState._on_TaskKilled,
    RunnerStatusChanged: ExecutorState._on_RunnerStatusChanged,
    RunnerStartFailed: ExecutorState._on_RunnerStartFailed,
    RunnerStopped: ExecutorState._on_RunnerStopped,
    ControlReceived: ExecutorState._on_ControlReceived,
    RetargetReceived: ExecutorState._on_RetargetReceived,
    ReadersReceived: ExecutorState._on_ReadersReceived,
    MessageUnreadable: ExecutorState._on_MessageUnreadable,
    ParamsApplied: ExecutorState._on_ParamsApplied,
    ParamsRefused: ExecutorState._on_ParamsRefused,
    Tick: ExecutorState._on_Tick,
    ShutdownRequested: ExecutorState._on_ShutdownRequested,
}
