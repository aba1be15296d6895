"""The I/O shell of the executor: pymesos callbacks in, runners, status updates and heartbeats out.

Owns `ElastiqExecutor` (the pymesos `Executor`: each callback turns into an event on a queue,
through `executor.mesos_events` for TaskInfos and framework messages, and returns at once),
`RunnerPool` (one worker thread that starts and stops `TaskRunner`s in order, builds the agent's
one SparkSession lazily on the first Spark task, writes each task's program to
`<state>/<task_id>/program.py` and gives it the checkpoint folder `<state>/<task_id>/checkpoint`,
stable across attempts), `ExecutorLoop` (the one thread that owns `ExecutorState`, polls runners,
ticks, and runs commands, each by its function in `_RUNS` through `common.dispatch`; it alone
writes each task's endpoints file, at launch before the runner starts and on every retarget from
the scheduler), `pulse` (the thread that heartbeats without figures and never touches Spark, for
the scheduler's failure detector), `AuthenticatedExecutorDriver` (pymesos's driver sending the agent's executor token,
which pymesos 0.3.15 does not) and `run_executor` (the process: driver, loop, SIGTERM, exit code).
This is the only executor module importing pymesos. Does not own decisions
(`executor.executor_state`), the task runtime (`executor.task_runner`, `executor.runtime`) or the
session settings (`executor.spark_session`).
"""

from __future__ import annotations

import base64
import itertools
import logging
import math
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Final, Literal, Mapping, Protocol

from pymesos import Executor, MesosExecutorDriver

from common.dispatch import handler
from common.failures import tag
from common.safe_open import private_folder
from executor.endpoints_file import endpoints_path, write_endpoints
from executor.executor_state import (AdmitReaders, ApplyParams, Command, Event, Exit, ExecutorState,
                                     ParamsApplied, ParamsRefused, Registered, RunnerStartFailed,
                                     RunnerStatusChanged, RunnerStopped, SendControlAck,
                                     SendHeartbeat, SendStatus, ShutdownRequested, StartRunner,
                                     StopRunner, TaskFigures, TaskKilled, TaskLaunch, Tick,
                                     WriteEndpoints)
from executor.fencing import Fence
from executor.mesos_events import ack_bytes, heartbeat_bytes, launch_event, message_event
from executor.usage import own_usage

log = logging.getLogger(__name__)

_ids = itertools.count(1)
EXECUTOR_TOKEN_ENV = "MESOS_EXECUTOR_AUTHENTICATION_TOKEN"


def stimulus(kind: str) -> str:
    """A short id naming what caused an event, carried into its commands and log lines."""
    return f"{kind}-{next(_ids)}"


# --- configuration ------------------------------------------------------------------------------

class NotStartedByAgent(ValueError):
    """The MESOS_* environment an agent gives its executors is missing."""


REQUIRED_ENV = ("MESOS_AGENT_ENDPOINT", "MESOS_FRAMEWORK_ID", "MESOS_EXECUTOR_ID")


@dataclass(frozen=True)
class ExecutorConfig:
    executor_id: str
    state_dir: Path  # per-agent folder for task programs and checkpoints; survives restarts
    spark_cores: int = 2
    heartbeat_seconds: float = 1.0
    poll_seconds: float = 0.25
    stop_timeout_seconds: float = 20.0  # per runner, on kill and on shutdown
    prewarm: bool = False  # build the SparkSession at start ($ELASTIQ_PREWARM=1), not at 1st task
    min_batch_seconds: float = 0.0  # a task's micro-batches start at most this often (0: any time)


def config_from_env(env: Mapping[str, str]) -> ExecutorConfig:
    """Read the executor's settings; NotStartedByAgent or ValueError with a clear message."""
    missing = [name for name in REQUIRED_ENV if not env.get(name)]
    if missing:
        raise NotStartedByAgent(f"missing environment {', '.join(missing)}")
    state = env.get("ELASTIQ_STATE_DIR")
    if not state:
        sandbox = env.get("MESOS_SANDBOX") or env.get("MESOS_DIRECTORY")
        if not sandbox:
            raise ValueError("set ELASTIQ_STATE_DIR, or MESOS_SANDBOX / MESOS_DIRECTORY")
        state = os.path.join(sandbox, "state")
    cores_text = env.get("ELASTIQ_SPARK_CORES", "2")
    if not cores_text.isdigit() or int(cores_text) < 1:
        raise ValueError(f"ELASTIQ_SPARK_CORES must be a positive integer, got {cores_text!r}")
    return ExecutorConfig(env["MESOS_EXECUTOR_ID"], Path(state).resolve(), int(cores_text),
                          prewarm=env.get(PREWARM_ENV) == "1",
                          min_batch_seconds=min_batch_seconds(env.get(MIN_BATCH_ENV, "0")))


def min_batch_seconds(text: str) -> float:
    """$ELASTIQ_MIN_BATCH_INTERVAL: seconds, 0 (back to back, the default) to
    MAX_MIN_BATCH_SECONDS; ValueError naming the variable otherwise (pure)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0.0 <= seconds <= MAX_MIN_BATCH_SECONDS:
        raise ValueError(f"{MIN_BATCH_ENV} must be a number of seconds from 0 to "
                         f"{MAX_MIN_BATCH_SECONDS:g}, got {text!r}")
    return seconds


# --- runners --------------------------------------------------------------------------------------

class Runner(Protocol):
    """What the pool needs of a `executor.task_runner.TaskRunner`."""

    def start(self) -> None: ...
    def status(self) -> Any: ...  # .state, .reason, .restarts
    def metrics(self) -> Any: ...  # TaskMetrics | None
    def stop(self, timeout: float = ...) -> None: ...
    def reconfigure(self, version: int, params: Mapping[str, Mapping[str, Any]]) -> Any: ...


RunnerFactory = Callable[[Any, Path, Mapping[str, Any]], Runner]  # (session, program, kwargs)
SessionFactory = Callable[[ExecutorConfig], Any]


def default_session_factory(config: ExecutorConfig) -> Any:
    from executor.spark_session import build_session

    return build_session(config.spark_cores, f"elastiq-{config.executor_id}",
                         str(config.state_dir / f"session-{config.executor_id}"))


def default_runner_factory(spark: Any, program: Path, kwargs: Mapping[str, Any]) -> Runner:
    from executor.task_runner import TaskRunner

    return TaskRunner(spark, program, kwargs)


def default_hub_factory() -> Any:
    from executor.runtime import ChannelHub

    return ChannelHub()


def figures_of(metrics: Any, blocked: tuple[float, float] = (0.0, 0.0),
               retained: Mapping[str, int] | None = None) -> TaskFigures:
    """TaskMetrics (or None before the first batch), the hub's `blocked` figures of the
    task's channel sink (seconds) and its writers' `retained` batches -> TaskFigures."""
    waits: dict[str, Any] = {"channel_blocked_ms": int(blocked[0] * 1000),
                             "channel_readerless_ms": int(blocked[1] * 1000),
                             "retained": dict(retained or {})}
    if metrics is None:
        return TaskFigures(**waits)
    return TaskFigures(int(metrics.tuples_in), int(metrics.tuples_out), int(metrics.batches),
                       int(metrics.batch_ms), int(metrics.backlog), int(metrics.latency_ms),
                       busy_ms=int(metrics.busy_ms),
                       running_ms=int(metrics.running_ms),
                       batches_ended=int(getattr(metrics, "batches_ended", 0)),
                       watermark_ms=int(getattr(metrics, "watermark_ms", -1)),
                       routed_ms=int(getattr(metrics, "routed_ms", -1)),
                       rows_dropped=int(getattr(metrics, "rows_dropped", 0)),
                       cpu_ms=int(getattr(metrics, "cpu_ms", 0)),
                       cpu_batches=int(getattr(metrics, "cpu_batches", 0)),
                       dpc_mode=int(getattr(metrics, "dpc_mode", -1)),
                       dpc_mode_ms=int(getattr(metrics, "dpc_mode_ms", 0)),
                       dpc_episode=int(getattr(metrics, "dpc_episode", 0)),
                       dpc_reconcile_ms=int(getattr(metrics, "dpc_reconcile_ms", -1)), **waits)


def checkpoint_dir(config: ExecutorConfig, task_id: str) -> Path:
    """`<state>/<task_id>/checkpoint`: the task's checkpoint folder, stable across attempts."""
    return config.state_dir / task_id / "checkpoint"


PREWARM: Final = "prewarm"  # a runner-pool job: build the session before any task needs it
# A micro-batch costs ~0.1 s of cpu however few its rows (docs/deploy.md): back to back, a task
# at a low rate spends most of its cpu on that. The cluster's operator can bound how often.
MIN_BATCH_ENV = "ELASTIQ_MIN_BATCH_INTERVAL"
MAX_MIN_BATCH_SECONDS = 10.0
PREWARM_ENV = "ELASTIQ_PREWARM"  # "1": prewarm (`elastiq run` and `elastiq scheduler` set it)


class RunnerPool:
    """Starts and stops runners on one worker thread, in the order asked; reports events."""

    def __init__(self, config: ExecutorConfig, report: Callable[[Event], None],
                 runner_factory: RunnerFactory = default_runner_factory,
                 session_factory: SessionFactory = default_session_factory,
                 hub_factory: Callable[[], Any] = default_hub_factory) -> None:
        self.config, self.report = config, report
        self.runner_factory, self.session_factory = runner_factory, session_factory
        self.hub = hub_factory()
        self.session: Any = None
        self._runners: dict[str, Runner] = {}
        self._outputs: dict[str, tuple[str, ...]] = {}  # mesos task id -> channels it serves
        self._lock = threading.Lock()
        self._jobs: queue.Queue[StartRunner | StopRunner | Literal["prewarm"] | None] = \
            queue.Queue()
        self._thread = threading.Thread(target=self._work, name="runner-pool", daemon=True)
        self._thread.start()

    def submit(self, command: StartRunner | StopRunner) -> None:
        self._jobs.put(command)

    def prewarm(self) -> None:
        """Build the SparkSession (JVM start included) now, on the worker thread, instead of
        when the first task starts: the executor process starts before its first task arrives
        (registration, the launch), so that time overlaps with the session's start."""
        self._jobs.put(PREWARM)

    def runners(self) -> dict[str, Runner]:
        with self._lock:
            return dict(self._runners)

    def close(self, timeout: float) -> None:
        """Finish the queued jobs, then stop the session and close the channel hub."""
        self._jobs.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("executor %s: runner pool still busy after %.0f s", self.config.executor_id,
                      timeout)
        for mesos_task_id in list(self.runners()):
            self._stop(StopRunner("close", mesos_task_id))
        if self.session is not None:
            log.info("executor %s: stopping the SparkSession", self.config.executor_id)
            self._quietly("stop the SparkSession", self.session.stop)
            self.session = None
        self._quietly("close the channel hub", self.hub.close)

    def _quietly(self, what: str, action: Callable[[], None]) -> None:
        """Run a shutdown step; its failure (e.g. a JVM already gone on SIGTERM) is logged."""
        try:
            action()
        except Exception as exc:
            log.warning("executor %s: could not %s: %s", self.config.executor_id, what, exc)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job == PREWARM:
                self._prewarm()
            elif isinstance(job, StartRunner):
                self._start(job)
            else:
                self._stop(job)

    def _start(self, job: StartRunner) -> None:
        launch = job.launch
        try:
            runner = self._make_runner(launch)
            runner.start()
        except Exception as exc:  # any failure to load/build is this task's, not the executor's
            from executor.failure_kinds import failure_kind

            log.warning("[%s] task %s: start failed", job.stimulus_id, launch.mesos_task_id,
                        exc_info=True)
            self.report(RunnerStartFailed(job.stimulus_id, launch.mesos_task_id,
                                          tag(failure_kind(exc),
                                              f"task {launch.task_id} did not start: "
                                              f"{type(exc).__name__}: {exc}")))
            return
        with self._lock:
            self._runners[launch.mesos_task_id] = runner
            self._outputs[launch.mesos_task_id] = launch.outputs
        log.info("[%s] task %s: runner started", job.stimulus_id, launch.mesos_task_id)

    def _prewarm(self) -> None:
        if self.session is not None:
            return
        began = time.monotonic()
        log.info("executor %s: prewarming the SparkSession (local[%s])", self.config.executor_id,
                 self.config.spark_cores)
        try:
            self.session = self.session_factory(self.config)
        except Exception as exc:  # the first task builds it again and reports what fails
            log.warning("executor %s: prewarming the SparkSession failed: %s",
                        self.config.executor_id, exc)
            return
        log.info("executor %s: SparkSession ready after %.1f s", self.config.executor_id,
                 time.monotonic() - began)

    def _make_runner(self, launch: TaskLaunch) -> Runner:
        task_dir = self.config.state_dir / launch.task_id
        task_dir.mkdir(parents=True, exist_ok=True)
        fence = Fence(str(checkpoint_dir(self.config, launch.task_id)), launch.epoch,
                      launch.mesos_task_id)
        fence.raise_()  # Fenced (a start failure) when a newer attempt already owns the task
        program = task_dir / "program.py"
        program.write_text(launch.program, encoding="utf-8")
        if self.session is None:
            log.info("task %s: building the executor's SparkSession (local[%s])",
                     launch.mesos_task_id, self.config.spark_cores)
            self.session = self.session_factory(self.config)
        kwargs = {"query_id": launch.query_id, "task_id": launch.task_id,
                  "checkpoint_dir": str(checkpoint_dir(self.config, launch.task_id)),
                  "endpoints": dict(launch.endpoints), "channels": self.hub,
                  "params": dict(launch.params), "params_version": launch.params_version,
                  "keys": launch.keys, "fence": fence,
                  "trigger_seconds": self.config.min_batch_seconds}
        return self.runner_factory(self.session, program, kwargs)

    def _stop(self, job: StopRunner) -> None:
        with self._lock:
            runner = self._runners.pop(job.mesos_task_id, None)
            outputs = self._outputs.pop(job.mesos_task_id, ())
        if runner is not None:
            try:
                runner.stop(timeout=self.config.stop_timeout_seconds)
            except Exception:
                log.warning("[%s] task %s: error while stopping", job.stimulus_id,
                            job.mesos_task_id, exc_info=True)
            log.info("[%s] task %s: runner stopped", job.stimulus_id, job.mesos_task_id)
        if job.release_outputs:
            for channel in outputs:
                self.hub.release(channel)
                log.info("[%s] task %s: channel %s released", job.stimulus_id,
                         job.mesos_task_id, channel)
        self.report(RunnerStopped(job.stimulus_id, job.mesos_task_id))


# --- the loop -------------------------------------------------------------------------------------

class ExecutorLoop:
    """The one thread that owns ExecutorState: events in, commands run, runners polled."""

    def __init__(self, config: ExecutorConfig, driver: Any, pool_factory: Callable[..., RunnerPool]
                 = RunnerPool, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.driver, self.clock = config, driver, clock
        self.events: queue.Queue[Event] = queue.Queue()
        self.state = ExecutorState(config.heartbeat_seconds)
        self.pool = pool_factory(config, self.events.put)
        self.exit_code: int | None = None
        self._seen: dict[str, tuple[str, str, int]] = {}  # last runner status reported per task

    def run(self) -> int:
        """Run until an Exit command; returns the exit code."""
        next_poll = self.clock()
        while self.exit_code is None:
            try:
                event: Event | None = self.events.get(
                    timeout=max(0.0, next_poll - self.clock()))
            except queue.Empty:
                event = None
            if event is not None:
                self._handle(event)
            if self.exit_code is None and self.clock() >= next_poll:
                self._poll()
                next_poll = self.clock() + self.config.poll_seconds
        return self.exit_code

    def _handle(self, event: Event) -> None:
        try:
            commands = self.state.handle(event)
        except Exception:
            log.exception("[%s] executor %s: event %s not handled", event.stimulus_id,
                          self.config.executor_id, type(event).__name__)
            return
        for command in commands:
            self._run(command)

    def _poll(self) -> None:
        figures: dict[str, TaskFigures] = {}
        runners = self.pool.runners()
        for gone in set(self._seen) - set(runners):
            del self._seen[gone]
        for mesos_task_id, runner in runners.items():
            status = runner.status()
            seen = (status.state, status.reason, status.restarts)
            if self._seen.get(mesos_task_id) != seen:
                self._seen[mesos_task_id] = seen
                self._handle(RunnerStatusChanged(stimulus("poll"), mesos_task_id, status.state,
                                                 status.reason, status.restarts))
            try:
                blocked, retained = self._channel_figures(runner)
                figures[mesos_task_id] = figures_of(runner.metrics(), blocked, retained)
            except Exception as exc:  # a query between runs has no progress to read
                log.debug("task %s: no metrics (%s)", mesos_task_id, exc)
        self._handle(Tick(stimulus("tick"), self.clock(), figures))

    def _channel_figures(self, runner: Runner) -> tuple[tuple[float, float], dict[str, int]]:
        """The hub's figures of the runner's task, from one read of its writers
        (`ChannelHub.stats`): its blocked sink (`blocked_of`) and the batches its writers retain
        (`retained_of_stats`)."""
        from executor.runtime import blocked_of, retained_of_stats

        task_id = getattr(runner, "task_id", None)
        read = getattr(self.pool.hub, "stats", None)
        if task_id is None or read is None:
            return (0.0, 0.0), {}
        stats = read(task_id)  # one read of the writers for both figures
        return blocked_of(stats), retained_of_stats(stats)

    def _run(self, command: Command) -> None:
        handler(_RUNS, command, "ExecutorLoop")(self, command)

    def _stop(self, command: StopRunner) -> None:
        self.pool.submit(command)

    def _start(self, command: StartRunner) -> None:
        """Write the task's endpoints file, then have the pool start its runner. The file is
        written on this thread only, so a retarget is never overwritten by a later launch write."""
        launch = command.launch
        path = endpoints_path(str(checkpoint_dir(self.config, launch.task_id)))
        try:
            write_endpoints(path, launch.endpoints)
        except OSError as exc:
            log.warning("[%s] task %s: cannot write %s: %s", command.stimulus_id,
                        launch.mesos_task_id, path, exc)
            self._handle(RunnerStartFailed(command.stimulus_id, launch.mesos_task_id,
                                           f"task {launch.task_id} did not start: cannot write "
                                           f"its endpoints file: {exc}"))
            return
        self.pool.submit(command)

    def _write_endpoints(self, command: WriteEndpoints) -> None:
        path = endpoints_path(str(checkpoint_dir(self.config, command.task_id)))
        try:
            write_endpoints(path, command.endpoints)
        except OSError as exc:
            log.error("[%s] task %s: retarget not applied, cannot write %s: %s",
                      command.stimulus_id, command.mesos_task_id, path, exc)
            return
        for channel, endpoint in command.changed:
            log.info("[%s] task %s: channel %s retargeted to %s", command.stimulus_id,
                     command.mesos_task_id, channel, endpoint)

    def _admit_readers(self, command: AdmitReaders) -> None:
        """Other queries' readers of a published channel come or go (`ChannelHub.admit`)."""
        self.pool.hub.admit(command.channel, command.add, command.drop)
        log.info("[%s] channel %s: readers %s admitted, %s dropped", command.stimulus_id,
                 command.channel, sorted(command.add), list(command.drop))

    def _apply_params(self, command: ApplyParams) -> None:
        """Apply the new parameters to the task's query on a thread of its own (it waits for a
        batch boundary; heartbeats and other tasks go on meanwhile)."""
        runner = self.pool.runners().get(command.mesos_task_id)
        if runner is None:
            self._handle(ParamsRefused(command.stimulus_id, command.mesos_task_id,
                                       command.request, command.version,
                                       "the task has no runner on this executor"))
            return

        def apply() -> None:
            try:
                done = runner.reconfigure(command.version, command.params)
            except Exception as exc:  # ReconfigureFailed, or the query died meanwhile
                self.events.put(ParamsRefused(stimulus("control"), command.mesos_task_id,
                                              command.request, command.version,
                                              f"{type(exc).__name__}: {exc}"))
                return
            self.events.put(ParamsApplied(stimulus("control"), command.mesos_task_id,
                                          command.request, done.version, done.epoch,
                                          done.pause_s, time.time(), dict(done.detail)))

        threading.Thread(target=apply, name=f"control-{command.mesos_task_id}",
                         daemon=True).start()

    def _send_control_ack(self, command: SendControlAck) -> None:
        data = ack_bytes(command)
        try:
            self.driver.sendFrameworkMessage(base64.b64encode(data).decode("ascii"))
        except Exception as exc:
            log.warning("[%s] task %s: control acknowledgement not sent: %s",
                        command.stimulus_id, command.mesos_task_id, exc)

    def _send_status(self, command: SendStatus) -> None:
        status: dict[str, Any] = {"task_id": {"value": command.task_id}, "state": command.state,
                                  "message": command.message,
                                  "executor_id": {"value": self.config.executor_id}}
        if command.reason:
            status["reason"] = command.reason
        if self.state.agent_id:
            status["agent_id"] = {"value": self.state.agent_id}
        try:
            self.driver.sendStatusUpdate(status)
            log.info("[%s] task %s: sent %s %s", command.stimulus_id, command.task_id,
                     command.state, command.message)
        except Exception as exc:
            log.error("[%s] task %s: cannot send %s: %s", command.stimulus_id, command.task_id,
                      command.state, exc)

    def _send_heartbeat(self, command: SendHeartbeat) -> None:
        data = heartbeat_bytes(self.config.executor_id, command.figures, own_usage())
        try:
            self.driver.sendFrameworkMessage(base64.b64encode(data).decode("ascii"))
        except Exception as exc:
            log.warning("[%s] executor %s: heartbeat not sent: %s", command.stimulus_id,
                        self.config.executor_id, exc)

    def _exit(self, command: Exit) -> None:
        log.info("[%s] executor %s: stopping runners, session and channels", command.stimulus_id,
                 self.config.executor_id)
        self.pool.close(timeout=self.config.stop_timeout_seconds * 2)
        self.exit_code = command.code


_RUNS: dict[type, Callable[["ExecutorLoop", Any], None]] = {
    StartRunner: ExecutorLoop._start,
    StopRunner: ExecutorLoop._stop,
    WriteEndpoints: ExecutorLoop._write_endpoints,
    AdmitReaders: ExecutorLoop._admit_readers,
    ApplyParams: ExecutorLoop._apply_params,
    SendControlAck: ExecutorLoop._send_control_ack,
    SendStatus: ExecutorLoop._send_status,
    SendHeartbeat: ExecutorLoop._send_heartbeat,
    Exit: ExecutorLoop._exit,
}


# --- pymesos callbacks ----------------------------------------------------------------------------

class ElastiqExecutor(Executor):
    """pymesos callbacks: each one turns into an event on the loop's queue and returns."""

    def __init__(self, put: Callable[[Event], None], executor_id: str = "") -> None:
        self.put, self.executor_id = put, executor_id
        self._connection_lost = False  # pymesos calls shutdown() right after a lost stream

    def registered(self, driver: Any, executorInfo: Any, frameworkInfo: Any,
                   agentInfo: Any) -> None:
        executor_id = str((executorInfo.get("executor_id") or {}).get("value", ""))
        agent_id = str((agentInfo.get("id") or {}).get("value", ""))
        self.put(Registered(stimulus("registered"), executor_id, agent_id))

    def reregistered(self, driver: Any, agentInfo: Any) -> None:
        self._connection_lost = False
        log.info("executor %s: re-registered with agent %s", self.executor_id,
                 (agentInfo.get("id") or {}).get("value"))

    def disconnected(self, driver: Any) -> None:
        self._connection_lost = True
        log.warning("executor %s: disconnected from its agent", self.executor_id)

    def launchTask(self, driver: Any, task: Any) -> None:
        sid = stimulus("launch")
        event = launch_event(sid, task)
        if event is None:
            log.error("[%s] executor %s: a TaskInfo without a task id was dropped: %s", sid,
                      self.executor_id, "TaskInfo.task_id.value is missing")
            return
        self.put(event)

    def killTask(self, driver: Any, taskId: Any) -> None:
        self.put(TaskKilled(stimulus("kill"), str(taskId.get("value", ""))))

    def frameworkMessage(self, driver: Any, message: Any) -> None:
        """`message` is the base64 text of the scheduler's data (pymesos passes it on as is)."""
        self.put(message_event(stimulus("message"), message or ""))

    def shutdown(self, driver: Any) -> None:
        why = ("the stream to the agent closed" if self._connection_lost
               else "the agent asked to shut down")
        self.put(ShutdownRequested(stimulus("shutdown"), why))

    def error(self, driver: Any, message: str) -> None:
        log.error("executor %s: error from the agent: %s", self.executor_id, message)


# --- the driver -----------------------------------------------------------------------------------

class AuthenticatedExecutorDriver(MesosExecutorDriver):
    """pymesos's executor driver plus executor authentication: when the agent put a token in
    `MESOS_EXECUTOR_AUTHENTICATION_TOKEN`, the SUBSCRIBE and every call carry it as
    `Authorization: Bearer <token>` (as Mesos's own executor library does). The variable is
    removed from this process's environment, so nothing it starts (Spark's JVM and Python
    workers, task code's subprocesses) inherits the token."""

    def __init__(self, executor: Any, **kwargs: Any):
        super().__init__(executor, **kwargs)
        token = os.environ.pop(EXECUTOR_TOKEN_ENV, "")
        if not (token.isascii() and token.isprintable()):
            raise ValueError(f"{EXECUTOR_TOKEN_ENV} must be printable ASCII")
        self._authorization = f"Bearer {token}" if token else None

    def gen_request(self) -> bytes:
        """The SUBSCRIBE request, with the Authorization header after the request line."""
        request = super().gen_request()
        if self._authorization is None:
            return request
        line, sep, rest = request.partition(b"\r\n")
        return line + sep + f"Authorization: {self._authorization}\r\n".encode("ascii") + rest

    def _send(self, body: Any, path: str = "/api/v1/executor", method: str = "POST",
              headers: dict[str, str] | None = None) -> Any:
        headers = dict(headers or {})  # never pymesos's shared default dict
        if self._authorization is not None:
            headers["Authorization"] = self._authorization
        return super()._send(body, path, method, headers)


# --- the process ----------------------------------------------------------------------------------

def run_executor(config: ExecutorConfig,
                 pool_factory: Callable[..., RunnerPool] = RunnerPool) -> int:
    """Subscribe to the agent, run until shutdown (agent SHUTDOWN or SIGTERM), return 0.
    `pool_factory` makes the runner pool (tests give one whose runners need no Spark)."""
    private_folder(config.state_dir)  # task programs, checkpoints, state stores, spools: 0700
    holder: dict[str, ExecutorLoop] = {}
    executor = ElastiqExecutor(lambda event: holder["loop"].events.put(event), config.executor_id)
    driver = AuthenticatedExecutorDriver(executor)
    loop = ExecutorLoop(config, driver, pool_factory)
    holder["loop"] = loop
    signal.signal(signal.SIGTERM, lambda *_: loop.events.put(
        ShutdownRequested(stimulus("sigterm"), "SIGTERM")))
    log.info("executor %s: state in %s, Spark cores %s", config.executor_id, config.state_dir,
             config.spark_cores)
    prewarm = getattr(loop.pool, "prewarm", None)
    if config.prewarm and prewarm is not None:
        prewarm()  # the JVM and SparkSession start while the driver subscribes
    driver.start()
    stop_pulse = threading.Event()
    threading.Thread(target=pulse, args=(driver, config.executor_id, config.heartbeat_seconds,
                                         stop_pulse), name="executor-pulse", daemon=True).start()
    code = _run_loop_thread(loop, config.executor_id)
    stop_pulse.set()
    try:
        driver.stop()
    except Exception as exc:
        log.debug("executor %s: driver stop: %s", config.executor_id, exc)
    log.info("executor %s: exit %s", config.executor_id, code)
    return code


def pulse(driver: Any, executor_id: str, every: float, stop: threading.Event) -> None:
    """Send a heartbeat with no figures every `every` s, from a thread of its own that never
    touches Spark: the scheduler's failure detector hears a busy executor (a long py4j call,
    a loaded JVM) as alive, and a hung one (SIGSTOPped, wedged interpreter) as silent."""
    data = base64.b64encode(heartbeat_bytes(executor_id, {})).decode("ascii")
    while not stop.wait(every):
        if not getattr(driver, "connected", True):
            continue
        try:
            driver.sendFrameworkMessage(data)
        except Exception as exc:  # not subscribed yet, or the agent is restarting
            log.debug("executor %s: pulse not sent: %s", executor_id, exc)


def _run_loop_thread(loop: ExecutorLoop, executor_id: str) -> int:
    """Run the loop on its own thread; the main thread stays free for signals and for the
    errors pymesos re-raises there from its I/O thread (each one becomes a shutdown)."""
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(loop.run()), name="executor-loop")
    thread.start()
    while thread.is_alive():
        try:
            thread.join(0.5)
        except BaseException as exc:
            log.error("executor %s: %r; shutting down", executor_id, exc)
            loop.events.put(ShutdownRequested(stimulus("error"), f"driver error: {exc!r}"))
    return result[0] if result else 1
