"""The scheduler's event loop: one thread that owns `SchedulerState` and runs its commands.

Owns the event queue (anything may put events; callbacks return at once), the clock (a `Tick`
every `tick_interval` seconds of the monotonic clock), answering requests (`submit`, `stop`)
with the state's `ReplyToRequest`, a thread-safe snapshot of the state for the API, and feeding
`metrics` (`scheduler.metrics.SchedulerMetrics`) after every step (it only reads). Commands
other than replies go to a `CommandRunner` (the Mesos driver in production). Does not own any
decision (`scheduler.state`) nor pymesos (`scheduler.mesos_adapter`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from common.control import ControlCatalog
from common.tasks import CompiledQuery
from scheduler.channel_keys import issue_keys
from scheduler.commands import Command, ReplyToRequest
from scheduler.config import SchedulerConfig
from scheduler.events import (QueryStopRequested, QuerySubmitted, QueryUpdateRequested, Tick,
                              new_stimulus_id)
from scheduler.metrics import SchedulerMetrics
from scheduler import sharing
from scheduler.query_source import QuerySource
from scheduler.state import SchedulerState, Stimulus
from scheduler.views import query_view, snapshot

log = logging.getLogger("elastiq.scheduler.loop")
_STOP = object()


class CommandRunner(Protocol):
    def run(self, command: Command) -> None: ...


class DroppingRunner:
    """A runner for a loop with no Mesos connection (tools, API tests): logs and drops."""

    def run(self, command: Command) -> None:
        log.info("[%s] no Mesos connection; dropping %s", command.stimulus_id,
                 type(command).__name__)


@dataclass(frozen=True)
class Reply:
    """The answer to a request: accepted or not, an HTTP-like status and a message."""

    accepted: bool
    status: int
    message: str
    body: Any = None  # what the API returns besides the message (a control request's view)


class SchedulerLoop:
    def __init__(self, config: SchedulerConfig | None = None, runner: CommandRunner | None = None,
                 tick_interval: float = 0.25, metrics: SchedulerMetrics | None = None):
        # fencing epochs start at the wall clock (ms): larger than any an earlier run issued
        self.state = SchedulerState(config or SchedulerConfig(),
                                    epoch_floor=int(time.time() * 1000))
        self.metrics = metrics or SchedulerMetrics()
        self.runner: CommandRunner = runner or DroppingRunner()
        # called on the loop thread with the lock held after each step; they only read the
        # state (e.g. the coordination's persister) and must not block
        self.after_step: list[Callable[[SchedulerState], None]] = []
        self._tick_interval = tick_interval
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._lock = threading.Lock()
        self._waiters: dict[str, "Future[Reply]"] = {}
        self._thread: threading.Thread | None = None
        self._last_tick = 0.0

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> "SchedulerLoop":
        self._step(Tick(new_stimulus_id("tick"), time.monotonic()))
        self._thread = threading.Thread(target=self._run, name="scheduler-loop", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None
        self.metrics.set_down()

    # ---- inputs --------------------------------------------------------------------------
    def put(self, event: Stimulus) -> None:
        """Queue an event; returns at once (safe from any thread, e.g. driver callbacks)."""
        self._queue.put(event)

    def submit(self, query: CompiledQuery, timeout: float = 10.0,
               source: QuerySource | None = None) -> Reply:
        keys = issue_keys(t.task_id for t in query.tasks)
        return self._request(QuerySubmitted(new_stimulus_id("submit"), query, source, keys),
                             timeout)

    def stop_query(self, query_id: str, timeout: float = 10.0, *, force: bool = False) -> Reply:
        return self._request(QueryStopRequested(new_stimulus_id("stop"), query_id, force),
                             timeout)

    def update(self, query: CompiledQuery, source: QuerySource | None = None, *,
               drop_state: bool = False, dry_run: bool = False,
               timeout: float = 10.0) -> Reply:
        """Update a running query in place (docs/queries.md): keys for every task (the state
        takes those of added tasks)."""
        keys = issue_keys(t.task_id for t in query.tasks)
        return self._request(QueryUpdateRequested(new_stimulus_id("update"), query, source,
                                                  keys, drop_state, dry_run), timeout)

    def running_plan(self, query_id: str) -> tuple[CompiledQuery, QuerySource | None] | None:
        """A query's plan and source as the scheduler runs them (None: no such query)."""
        with self._lock:
            q = self.state.queries.get(query_id)
            return None if q is None else (q.query, q.source)

    def share_offers(self) -> dict[str, str]:
        """form -> channel of the active queries' streams a new query may read in place of an
        equal subgraph (`scheduler.sharing.offers`)."""
        with self._lock:
            return sharing.offers(self.state.queries)

    def request(self, event: Any, timeout: float = 10.0) -> Reply:
        """Put any event the state answers with a `ReplyToRequest` and wait for the reply."""
        return self._request(event, timeout)

    def _request(self, event: QuerySubmitted | QueryStopRequested | QueryUpdateRequested,
                 timeout: float) -> Reply:
        future: "Future[Reply]" = Future()
        with self._lock:
            self._waiters[event.stimulus_id] = future
        self.put(event)
        try:
            return future.result(timeout)
        except TimeoutError:
            return Reply(False, 503, f"scheduler did not answer within {timeout:g} s")
        finally:
            with self._lock:
                self._waiters.pop(event.stimulus_id, None)

    # ---- outputs -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            return snapshot(self.state)

    def query_status(self, query_id: str) -> dict[str, Any] | None:
        with self._lock:
            q = self.state.queries.get(query_id)
            return None if q is None else query_view(q, self.state.unplaced,
                                                     self.state.agent_isolation,
                                                     self.state.queries)

    def query_catalog(self, query_id: str) -> ControlCatalog | None:
        """What may change in a query (None: no such query)."""
        with self._lock:
            q = self.state.queries.get(query_id)
            return None if q is None else (q.query.controls or ControlCatalog())

    def query_control(self, query_id: str, request_id: str | None = None) -> dict[str, Any] | None:
        """What may change in a query and what did (or one control request's progress)."""
        from scheduler.control import catalog_view

        with self._lock:
            q = self.state.queries.get(query_id)
            if q is None:
                return None
            if request_id is not None:
                request = q.control.requests.get(request_id)
                return None if request is None else request.to_json()
            return {"query_id": query_id, "phase": q.phase,
                    **catalog_view(q.query.controls or ControlCatalog(), q.control)}

    # ---- the loop ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                event = self._queue.get(timeout=self._tick_interval)
            except queue.Empty:
                event = None
            if event is _STOP:
                return
            now = time.monotonic()
            if now - self._last_tick >= self._tick_interval:
                self._step(Tick(new_stimulus_id("tick"), now))
            if event is not None:
                self._step(event)

    def _step(self, event: Stimulus) -> None:
        if isinstance(event, Tick):
            self._last_tick = event.now
        try:
            with self._lock:
                commands = self.state.handle(event)
        except Exception as e:  # a bug or an illegal transition must not end the loop
            log.exception("[%s] handling %s failed", event.stimulus_id, type(event).__name__)
            self.metrics.observe_error(event)
            commands = [ReplyToRequest(event.stimulus_id, False, 500, f"internal error: {e}")]
        self._observe(event, commands)
        self._after_step(event)
        for command in commands:
            self._run_command(command)

    def _observe(self, event: Stimulus, commands: list[Command]) -> None:
        """Feed the metrics (reads the state under the lock; never changes it)."""
        try:
            with self._lock:
                self.metrics.observe_step(event, commands, self.state, time.monotonic())
        except Exception:  # metrics must never stop the scheduler
            log.exception("[%s] metrics of %s failed", event.stimulus_id, type(event).__name__)

    def _after_step(self, event: Stimulus) -> None:
        for hook in self.after_step:
            try:
                with self._lock:
                    hook(self.state)
            except Exception:  # an observer must never stop the scheduler
                log.exception("[%s] after-step hook %s failed", event.stimulus_id, hook)

    def _run_command(self, command: Command) -> None:
        if isinstance(command, ReplyToRequest):
            with self._lock:
                future = self._waiters.get(command.stimulus_id)
            if future is not None and not future.done():
                future.set_result(Reply(command.accepted, command.status, command.message,
                                        dict(command.body) if command.body else None))
            return
        try:
            self.runner.run(command)
        except Exception:
            log.exception("[%s] running %s failed", command.stimulus_id, type(command).__name__)
