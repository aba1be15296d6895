"""Running one task: load its generated program, build the query, keep it running.

Owns `TaskRunner`: loading the codegen output (a Python file the executor wrote; never user text)
with importlib, calling its `build(rt)` on a fresh `TaskRuntime`, supervising the query in a
thread (a failed query is restarted from its checkpoint in the same session, with bounded
restarts and exponential backoff), status (starting/running/failed/finished with a reason) and
metrics from its recent progress reports (`executor.progress_reports`); and `reconfigure`, which applies control tuples at a batch boundary:
parameters the running query takes (a sink's destination or routing, `TaskRuntime.live`) are
switched between two sink calls; any other change closes the batch gate, stops the query and
rebuilds it with the new parameters from the same checkpoint (on a build failure, the old one).
The restart decision (`restart_after`, `decide_restart`), the reason a failed query gives
(`failure_reason`) and which changes can be switched live (`live_changes`) are pure functions.
Does not own the session (`executor.spark_session`) or how operators are
built (`executor.runtime`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Literal, Mapping, Sequence

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from common import kafka_problems
from common.failures import MAX_REASON, innermost_error, kind_of_text
from common.messages import ParamSet
from executor.batch_gate import await_commit, next_batch_id
from executor.cpu_clock import shared_sampler
from executor.progress_reports import RecentProgress
from executor.runtime import TaskRuntime

log = logging.getLogger(__name__)
INITIALIZING_SOURCES = "Initializing sources"  # a streaming query's status while it starts them
SOURCES_UP_SECONDS = 30.0  # how long a task start waits for them before the next task starts

TaskState = Literal["starting", "running", "restarting", "failed", "finished"]


@dataclass(frozen=True)
class TaskStatus:
    state: TaskState
    reason: str = ""
    restarts: int = 0
    query_id: str | None = None  # Spark's id of the current query run


@dataclass(frozen=True)
class TaskMetrics:
    batch_id: int
    batches: int  # progress reports seen in the current run
    tuples_in: int  # input rows since the runner started (all runs of the query)
    tuples_out: int  # rows the sink has written since the runner started (all runs)
    input_rate: float
    process_rate: float
    batch_ms: int  # last batch's trigger execution time
    backlog: int  # sum over sources of latest - end offset (sequence numbers)
    latency_ms: int  # last batch's end-to-end processing time (= batch_ms at present)
    busy_ms: int = 0  # time spent in micro-batches since the runner started (all runs)
    watermark_ms: int = -1  # the query's event-time watermark (ms since the epoch; -1: none)
    routed_ms: int = -1  # a stateful splitter's largest event time routed (ms; -1: none)
    running_ms: int = 0  # how long the micro-batch with data running now has run (0: none)
    batches_ended: int = 0  # executed micro-batches since the runner started (all runs)
    rows_dropped: int = 0  # rows its drop operators shed since the runner started (docs/load.md)
    cpu_ms: int = 0  # the container's cpu time in the batches below (`executor.cpu_clock`)
    cpu_batches: int = 0  # executed batches whose cpu time was measured (all runs)
    # a DPC union's mode (`common.dpc.MODE_CODES`; -1: the task has none), how long it has held,
    # its last episode and that episode's reconcile time (-1: none yet; docs/availability.md)
    dpc_mode: int = -1
    dpc_mode_ms: int = 0
    dpc_episode: int = 0
    dpc_reconcile_ms: int = -1


@dataclass(frozen=True)
class Reconfigured:
    """Parameters applied: from micro-batch `epoch` on, after a pause of `pause_s`; `detail`:
    what a live switch decided (a splitter's event-time switch, `switch_ms`)."""

    version: int
    epoch: int
    pause_s: float
    detail: Mapping[str, float] = field(default_factory=dict)


class ReconfigureFailed(RuntimeError):
    """The query did not build with the new parameters; it runs on with the old ones."""


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    delay_seconds: float
    reason: str


def decide_restart(restarts: int, max_restarts: int, backoff_seconds: float,
                   max_backoff_seconds: float = 30.0) -> RestartDecision:
    """After a failure with `restarts` restarts already done: restart after an exponential
    backoff, or give up once `max_restarts` is reached (pure)."""
    if restarts >= max_restarts:
        return RestartDecision(False, 0.0, f"gave up after {restarts} restarts")
    delay = min(max_backoff_seconds, backoff_seconds * (2 ** restarts))
    return RestartDecision(True, delay, f"restart {restarts + 1}/{max_restarts} in {delay:.1f} s")


Params = Mapping[str, Mapping[str, Any]]  # operator id -> runtime keyword -> value


def restart_after(failure: str, restarts: int, max_restarts: int,
                  backoff_seconds: float) -> RestartDecision:
    """After the query failed with the reason `failure`: no restart for what retrying cannot
    heal (`common.failures`: a limit of the user's data, such as a pattern's overflow, which
    the same rows hit again from the checkpoint; a missing input), so the task fails within
    a poll and says why; else `decide_restart` (pure)."""
    if kind_of_text(failure) == "permanent":
        return RestartDecision(False, 0.0, "restarting cannot heal it")
    return decide_restart(restarts, max_restarts, backoff_seconds)


def live_changes(old: Params, new: Params,
                 live: Mapping[tuple[str, str], Any]) -> dict[tuple[str, str], Any] | None:
    """What moving from parameter set `old` to `new` (a task's whole sets; a keyword left out
    has the program's value, `live[(op, keyword)]`) changes, as (op, keyword) -> value; None
    when a change touches a parameter the running query cannot take (pure)."""
    changes: dict[tuple[str, str], Any] = {}
    keys = {(op, k) for params in (old, new) for op, values in params.items() for k in values}
    for op, keyword in sorted(keys):
        if (op, keyword) not in live:
            if old.get(op, {}).get(keyword) != new.get(op, {}).get(keyword):
                return None
            continue
        program = live[(op, keyword)]
        before = old.get(op, {}).get(keyword, program)
        after = new.get(op, {}).get(keyword, program)
        if after != before:
            changes[(op, keyword)] = after
    return changes


def _offset_number(offset: Any) -> int | None:
    """Our offsets hold one sequence number ({"index": n}, {"seq": n}, ...); Spark's progress
    shows them as JSON text, a dict, or a Python dict repr, so take the one integer."""
    if offset is None:
        return None
    numbers = re.findall(r"-?\d+", str(offset))
    return int(numbers[0]) if len(numbers) == 1 else None


def backlog_of(progress: Mapping[str, Any]) -> int:
    total = 0
    for source in progress.get("sources", []):
        latest, end = _offset_number(source.get("latestOffset")), _offset_number(source.get("endOffset"))
        if latest is not None and end is not None:
            total += max(0, latest - end)
    return total


def executed(report: Mapping[str, Any]) -> bool:
    """Whether a progress report is of a micro-batch that ran. A query with no new data reports
    an idle trigger now and then (every 10 s) under the id of the batch it has *not yet* run,
    with no rows and no `addBatch` duration; counting it would claim that id before the batch
    itself comes (pure)."""
    return bool(int(report.get("numInputRows", 0) or 0)) or \
        "addBatch" in (report.get("durationMs") or {})


@dataclass
class InputCounter:
    """Input rows and busy time summed over progress reports, each executed batch of each run
    counted once (`executed`); Spark keeps only its recent reports, so this is fed every time
    metrics are read. Busy time is each batch's `durationMs.triggerExecution`: the time the
    query spent in micro-batches, not waiting for data (DS2's "useful time"); `batches`: how
    many were counted, so the scheduler can fit a batch's fixed cost apart from its cost per
    row (`common.batch_cost`); `cpu_ms` and `cpu_batches`: the container's cpu time in the
    batches `cpu_of` could measure (`executor.cpu_clock`), and how many those were."""

    total: int = 0
    busy_ms: int = 0
    batches: int = 0
    dropped: int = 0  # rows shed by drop operators (their observed metrics, `shed:<op>`)
    last_batch: dict[str, int] = field(default_factory=dict)  # run id -> last counted batch
    cpu_of: Callable[[Mapping[str, Any]], float | None] | None = None
    cpu_ms: int = 0
    cpu_batches: int = 0

    def add(self, reports: Sequence[Mapping[str, Any]]) -> int:
        """Count the reports not counted yet; the input rows so far."""
        for report in reports:
            run, batch = str(report.get("runId", "")), int(report.get("batchId", -1))
            if batch > self.last_batch.get(run, -1) and executed(report):
                self.last_batch[run] = batch
                self.total += int(report.get("numInputRows", 0) or 0)
                self.batches += 1
                self.busy_ms += int((report.get("durationMs") or {}).get("triggerExecution", 0)
                                    or 0)
                self.dropped += shed_rows(report)
                self._count_cpu(report)
        return self.total

    def _count_cpu(self, report: Mapping[str, Any]) -> None:
        cpu = self.cpu_of(report) if self.cpu_of is not None else None
        if cpu is not None:
            self.cpu_ms += int(round(cpu * 1000))
            self.cpu_batches += 1


def shed_rows(report: Mapping[str, Any]) -> int:
    """Rows the drop operators of one progress report's batch dropped: the `dropped` of every
    observation named `shed:<op>` (`executor.runtime.TaskRuntime.drop`; pure)."""
    observed = report.get("observedMetrics") or {}
    return sum(int(_observed(values, "dropped") or 0) for name, values in observed.items()
               if str(name).startswith("shed:"))


def _observed(values: Any, name: str) -> Any:
    """One value of an observation: a dict in JSON progress, a Row in PySpark's objects."""
    try:
        return values[name]
    except (KeyError, ValueError, TypeError, IndexError):
        return None


PROCESSING = "Processing new data"  # StreamingQuery.status message while a batch with data runs


def processing(status: Mapping[str, Any]) -> bool:
    """Whether a `StreamingQuery.status` says a micro-batch with data is running (pure)."""
    return bool(status.get("isTriggerActive")) and status.get("message") == PROCESSING


@dataclass
class RunningClock:
    """How long the micro-batch running now has been seen running: from the first read that
    saw it to `now`. Busy time (`InputCounter.busy_ms`) counts a batch only when it ends, so an
    instance reading a backlog in one long batch would look idle until then; this figure lets
    the policy see it busy, while its true rate stays over finished batches. A lower bound: a
    batch is seen at most one read after it starts."""

    counted: int = -1  # the executed batches' busy ms when the running batch was first seen
    since: float = 0.0  # when it was first seen (monotonic seconds)

    def running_ms(self, counted: int, running: bool, now: float) -> int:
        """`counted`: executed batches' busy ms so far; `running`: a batch with data runs now.
        A change of `counted` means a batch ended since, so one running now is another."""
        if not running:
            self.counted = -1
            return 0
        if counted != self.counted:
            self.counted, self.since = counted, now
        return int(max(0.0, now - self.since) * 1000)


def watermark_of(progress: Mapping[str, Any]) -> int:
    """The watermark a progress report shows (`eventTime.watermark`, ISO-8601), in ms since
    the epoch; -1 when it has none (a query without event time, or before its first rows)."""
    text = (progress.get("eventTime") or {}).get("watermark")
    if not isinstance(text, str):
        return -1
    try:
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return -1
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=timezone.utc)
    return int(instant.timestamp() * 1000)


def metrics_from(progress: Mapping[str, Any], batches: int, tuples_out: int,
                 tuples_in: int, busy_ms: int = 0) -> TaskMetrics:
    """TaskMetrics from one StreamingQueryProgress dict (pure)."""
    batch_ms = int(progress.get("durationMs", {}).get("triggerExecution", 0))
    return TaskMetrics(
        batch_id=int(progress.get("batchId", -1)), batches=batches,
        tuples_in=tuples_in, tuples_out=tuples_out,
        input_rate=float(progress.get("inputRowsPerSecond", 0.0) or 0.0),
        process_rate=float(progress.get("processedRowsPerSecond", 0.0) or 0.0),
        batch_ms=batch_ms, backlog=backlog_of(progress), latency_ms=batch_ms, busy_ms=busy_ms,
        watermark_ms=watermark_of(progress))


def failure_reason(exc: Any) -> str:
    """A one-line reason from a StreamingQueryException: the innermost error its wrappers hold
    (`common.failures.innermost_error`: a pattern's overflow inside the Python proxy's, py4j's
    and the Python worker's tracebacks), after what to do when it is a Kafka problem
    (`common.kafka_problems.explain`), else its first informative line."""
    if exc is None:
        return "query ended"
    text = failure_text(exc)
    inner = innermost_error(text)
    kafka = kafka_problems.explain(text, inner)
    if kafka is not None:  # what a user hits with Kafka, with what to do
        return kafka
    if inner is not None:
        return inner
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() not in ("", "null")]
    return lines[0][:MAX_REASON] if lines else type(exc).__name__


def failure_text(exc: Any) -> str:
    """Everything a query's exception says: its message and, for one captured from the JVM, its
    JVM stack trace with the causes (which hold a Python worker's traceback)."""
    return "\n".join(str(part) for part in (exc, getattr(exc, "_stackTrace", None)) if part)


def load_program(program: str | Path, task_id: str, scratch_dir: str) -> ModuleType:
    """Import a generated task program from its file; a program given as source text is first
    written to `scratch_dir` (it is codegen output, not user text)."""
    path = Path(program) if isinstance(program, Path) or str(program).endswith(".py") else None
    if path is None:
        os.makedirs(scratch_dir, exist_ok=True)
        path = Path(scratch_dir) / "program.py"
        path.write_text(str(program), encoding="utf-8")
    if not path.is_file():
        raise FileNotFoundError(f"task {task_id}: program file {path} does not exist")
    name = "elastiq_task_" + "".join(c if c.isalnum() else "_" for c in task_id)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"task {task_id}: cannot load program {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "build", None)):
        raise ImportError(f"task {task_id}: program {path} has no build(rt) function")
    return module


class TaskRunner:
    """Runs and supervises one task's streaming query in a shared session.

    `runtime_kwargs` are TaskRuntime's keyword arguments (query_id, task_id, checkpoint_dir, ...).
    """

    def __init__(self, spark: SparkSession, program: str | Path, runtime_kwargs: Mapping[str, Any],
                 *, max_restarts: int = 5, backoff_seconds: float = 1.0,
                 poll_seconds: float = 0.25) -> None:
        self.spark = spark
        self.kwargs = dict(runtime_kwargs)
        self.task_id: str = self.kwargs["task_id"]
        self.max_restarts, self.backoff_seconds = max_restarts, backoff_seconds
        self.poll_seconds = poll_seconds
        self.module = load_program(program, self.task_id,
                                   os.path.join(self.kwargs["checkpoint_dir"], "program"))
        self.runtime: TaskRuntime | None = None
        self._status = TaskStatus("starting")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        sampler = shared_sampler()
        self._counted = InputCounter(cpu_of=sampler.batch_cpu_seconds if sampler else None)
        self._progress = RecentProgress()
        self._running = RunningClock()
        self._out_before = 0  # rows the sinks of earlier runs (restarts, rebuilds) wrote
        self._rebuild = threading.Lock()  # held while the query is replaced (restart, control)
        self.params_version = int(self.kwargs.pop("params_version", 0))

    # --- public --------------------------------------------------------------------------------

    def start(self) -> None:
        """Build and start the query, wait until its sources are up, then supervise it in a
        background thread. Raises what build() raised (e.g. RuntimeSpecError) without starting
        anything."""
        self._launch()
        self._await_sources()
        self._thread = threading.Thread(target=self._supervise, name=f"task-{self.task_id}",
                                        daemon=True)
        self._thread.start()

    def status(self) -> TaskStatus:
        with self._lock:
            return self._status

    def metrics(self) -> TaskMetrics | None:
        """What the query measured; None before its first micro-batch ends, unless that batch
        is running (its `running_ms` shows a starting instance at work)."""
        rt = self.runtime
        if rt is None or rt.query is None:
            return None
        query = rt.query
        # the status before the progress: a batch that ends between the two reads is then
        # counted, and the one running after it starts a new clock; read the other way round,
        # the next batch's first moments were added to the ended batch's running time (CI saw
        # 239 ms running of a batch of 213)
        running_now, seen_at = processing(query.status), time.monotonic()
        recent = self._progress.read(query)
        progress = recent[-1] if recent else None
        tuples_in = self._counted.add(recent)
        running = self._running.running_ms(self._counted.busy_ms, running_now, seen_at)
        if not progress and not running:
            return None
        out = self._out_before + (rt.sink.rows_out if rt.sink else 0)
        metrics = replace(metrics_from(progress or {}, len(recent), out, tuples_in,
                                       self._counted.busy_ms), running_ms=running,
                          batches_ended=self._counted.batches,
                          rows_dropped=self._counted.dropped, cpu_ms=self._counted.cpu_ms,
                          cpu_batches=self._counted.cpu_batches)
        controller = getattr(rt, "dpc", None)
        if controller is not None:
            metrics = replace(metrics, **controller.figures(time.monotonic()))
        lag = rt.backlog()
        routed = getattr(getattr(rt.sink, "schedule", None), "max_seen", None)
        if routed is not None:
            metrics = replace(metrics, routed_ms=int(routed))
        return metrics if lag is None else replace(metrics, backlog=lag)

    def reconfigure(self, version: int, params: Params,
                    timeout: float = 30.0, drain_seconds: float = 5.0) -> Reconfigured:
        """Apply `params` (operator id -> keyword -> value, the task's whole set) at a batch
        boundary and return the first micro-batch that has them. Parameters the running query
        takes are switched between two sink calls. Otherwise the micro-batch in flight finishes
        (up to `drain_seconds`; a longer one is interrupted and runs again with the new
        parameters), later ones wait for the rebuilt query, which resumes from the checkpoint
        with the new parameters. ReconfigureFailed (the old parameters in force) if it fails."""
        with self._rebuild:
            began = time.monotonic()
            rt = self.runtime
            if rt is None or rt.query is None:
                raise ReconfigureFailed(f"task {self.task_id} has no running query")
            if self._stop.is_set():
                raise ReconfigureFailed(f"task {self.task_id} is stopping")
            if not ParamSet(version, params).newer_than(self.params_version):
                return Reconfigured(self.params_version, -1, 0.0)
            changes = live_changes(self.kwargs.get("params", {}), params,
                                   {key: p.program_value for key, p in rt.live.items()})
            if changes is not None and rt.query.isActive:  # a dead query is rebuilt instead
                return self._switch_live(rt, version, params, changes, began, timeout)
            query = rt.query
            rt.gate.drain(lambda: query.isActive and bool(query.status["isTriggerActive"]),
                          drain_seconds)
            rt.gate.close(timeout)
            self._await_commit(rt.gate.last_written, timeout=5.0)
            if rt.query.isActive:
                rt.query.stop()
            epoch = next_batch_id(self._spark_dir, rt.gate.last_written)
            old = self.kwargs.get("params", {})
            self.kwargs["params"] = params
            try:
                self._launch()
            except Exception as exc:
                log.warning("task %s: parameters %s refused (%s); rebuilding the old query",
                            self.task_id, version, exc)
                self.kwargs["params"] = old
                self._launch()
                raise ReconfigureFailed(str(exc)) from None
            self.params_version = version
            pause = time.monotonic() - began
            log.info("task %s: parameters %s apply from batch %s (paused %.3f s)", self.task_id,
                     version, epoch, pause)
            return Reconfigured(version, epoch, pause)

    def _switch_live(self, rt: TaskRuntime, version: int, params: Params,
                     changes: Mapping[tuple[str, str], Any], began: float,
                     timeout: float) -> Reconfigured:
        """Switch `changes` in the running query between two sink calls, all or none."""
        def apply() -> None:
            undos: list[Any] = []
            try:
                for key, value in changes.items():
                    undos.append(rt.live[key].switch(value))
            except Exception:
                for undo in reversed(undos):
                    undo()
                raise

        query = rt.query
        assert query is not None
        rt.switch_detail.clear()
        try:
            _, epoch = rt.gate.switch(apply, self._spark_dir, timeout,
                                      alive=lambda: query.isActive)
        except Exception as exc:
            log.warning("task %s: parameters %s refused (%s); the old ones stay", self.task_id,
                        version, exc)
            raise ReconfigureFailed(f"{type(exc).__name__}: {exc}") from None
        self.kwargs["params"] = params
        self.params_version = version
        pause = time.monotonic() - began
        log.info("task %s: parameters %s switched live from batch %s (%.3f s)", self.task_id,
                 version, epoch, pause)
        return Reconfigured(version, epoch, pause, dict(rt.switch_detail))

    def _await_commit(self, written: int | None, timeout: float) -> None:
        """Wait until Spark has committed the last batch the sink wrote: stopped before that,
        the rebuilt query would run it again, and a sink with a new destination (another file)
        would write it a second time there."""
        if not await_commit(self._spark_dir, written, time.monotonic() + timeout):
            log.warning("task %s: batch %s written but not committed after %.0f s; it may "
                        "be written again", self.task_id, written, timeout)

    @property
    def _spark_dir(self) -> str:
        """The task's Spark checkpoint (offset and commit logs)."""
        return os.path.join(self.kwargs["checkpoint_dir"], "spark")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the query for good; a rebuild in progress finishes first (and its new query
        is the one stopped), none starts after."""
        self._stop.set()
        locked = self._rebuild.acquire(timeout=timeout)
        try:
            if self.runtime is not None:
                self.runtime.stop()
        finally:
            if locked:
                self._rebuild.release()
        if self._thread is not None:
            self._thread.join(timeout)
        self._set(state="finished", reason="stopped")
        log.info("task %s: stopped", self.task_id)

    # --- internals -----------------------------------------------------------------------------

    def _set(self, **changes: Any) -> None:
        with self._lock:
            self._status = replace(self._status, **changes)

    def _launch(self) -> None:
        """Build and start a new query; the previous one (stopped or dead) lets go of its channel
        inputs first, and a build that fails lets go of what it had started."""
        if self.runtime is not None:
            self.runtime.close_receivers()
        rt = TaskRuntime(self.spark, **self.kwargs)
        try:
            self.module.build(rt)
            if rt.query is None:
                raise RuntimeError(f"task {self.task_id}: build() ended without a sink")
        except BaseException:
            rt.stop()
            raise
        self._replace_runtime(rt)
        # running, and saying so when it replaced persisted state it could not read
        self._set(state="running", reason="; ".join(rt.notices), query_id=str(rt.query.id))

    def _await_sources(self) -> None:
        """Return once the new query has initialised its sources (Spark has started each
        Python source's runner process), it ended, or SOURCES_UP_SECONDS passed. The executor
        starts its tasks one after another (one runner-pool thread), so this keeps their runner
        processes from starting all at once: Spark gives each 10 s to connect back, which a
        burst of them on a loaded machine misses ("Python worker failed to connect back")."""
        query = self._started_query()
        deadline = time.monotonic() + SOURCES_UP_SECONDS
        while query.isActive and time.monotonic() < deadline and not self._stop.is_set():
            if query.status.get("message") != INITIALIZING_SOURCES:
                return
            self._stop.wait(self.poll_seconds)
        if query.isActive and not self._stop.is_set():
            log.info("task %s: sources still initialising after %.0f s; going on",
                     self.task_id, SOURCES_UP_SECONDS)

    def _started_query(self) -> StreamingQuery:
        """The current run's query, which its callers run after it was started."""
        rt = self.runtime
        assert rt is not None and rt.query is not None, f"task {self.task_id}: no query started"
        return rt.query

    def _replace_runtime(self, rt: TaskRuntime) -> None:
        """Make `rt` the current run, keeping the rows the previous run's sink wrote."""
        old = self.runtime
        self._out_before += old.sink.rows_out if old is not None and old.sink else 0
        self.runtime = rt

    def _wait_for_failure(self) -> str | None:
        """Block until the query dies or stop() is called; the failure text, or None. A query
        stopped to be rebuilt by `reconfigure` is not a failure: the new one is watched."""
        while not self._stop.is_set():
            query = self._started_query()
            if not query.isActive:
                with self._rebuild:
                    current = self.runtime
                    assert current is not None  # replaced, never cleared, once started
                    # a DPC re-run (a union's or join's, or a stateful downstream task's
                    # redo); a stand-in runtime has neither controller
                    replacing = any(getattr(getattr(current, name, None), "replacing", False)
                                    for name in ("dpc", "redo"))
                    if current.query is not query or replacing:  # (a DPC re-run starting)
                        continue
                exc = query.exception()
                if exc is not None:
                    log.info("task %s: the query's exception: %.4000s", self.task_id,
                             failure_text(exc))
                return failure_reason(exc)
            self._stop.wait(self.poll_seconds)
        return None

    def _supervise(self) -> None:
        while not self._stop.is_set():
            failure = self._wait_for_failure()
            if failure is None or self._stop.is_set():
                return
            fence = self.kwargs.get("fence")
            if fence is not None and fence.current() > fence.epoch:  # restarting is pointless
                self._set(state="failed", reason=f"{failure}; superseded: a newer attempt of "
                          f"the task owns its checkpoint (epoch {fence.current()} > "
                          f"{fence.epoch})")
                return
            restarts = self.status().restarts
            decision = restart_after(failure, restarts, self.max_restarts, self.backoff_seconds)
            log.warning("task %s: query failed (%s); %s", self.task_id, failure, decision.reason)
            if not decision.restart:
                self._set(state="failed", reason=f"{failure}; {decision.reason}")
                return
            self._set(state="restarting", reason=failure, restarts=restarts + 1)
            if self._stop.wait(decision.delay_seconds):
                return
            try:
                with self._rebuild:
                    if self._stop.is_set():
                        return
                    self._launch()
            except Exception as exc:  # a program that no longer builds will not heal by retrying
                log.warning("task %s: restart failed: %s", self.task_id, exc)
                self._set(state="failed",
                          reason=f"restart failed: {type(exc).__name__}: {exc}")
                return
