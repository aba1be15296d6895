"""The Mesos adapter: the ONLY module importing pymesos.

Owns `MesosCallbacks` (a pymesos `Scheduler` whose callbacks only turn what the master says into
events on the loop's queue and return at once), `DriverRunner` (executes commands with the
driver: launchTasks, declineOffer, killTask, reconcileTasks, reviveOffers, suppressOffers,
sendFrameworkMessage, also for channel retargets; each command by its function in `_RUNS`,
through `common.dispatch`) and `SchedulerService`, the running
scheduler: an event loop owning the state, a `Coordination` electing the leader, and (while
leading) a pymesos driver. The
framework registers as "elastiq" with a long failover timeout, reuses the persisted framework
id, and stops with failover, so running tasks survive a scheduler restart or handover.
Does not own decisions (`scheduler.state`) nor the JSON shapes (`scheduler.mesos_json`).
"""

from __future__ import annotations

import getpass
import logging
import queue
import socket
import threading
import time
from typing import Any, Callable

from pymesos import MesosSchedulerDriver, Scheduler

from common import bounded_call
from common.control import ControlCatalog
from common.dispatch import handler
from common.tasks import CompiledQuery
from scheduler import mesos_json
from scheduler.channel_keys import issue_keys, with_missing_keys
from scheduler.commands import (
    Command, DeclineOffers, KillTask, LaunchTasks, ReconcileTasks, RetargetChannels,
    ReviveOffers, SendFrameworkMessage, ShutdownExecutor, SuppressOffers,
)
from scheduler.config import SchedulerConfig
from scheduler.coordination import (
    Coordination, ConnectionState, CoordinationError, InProcessCoordination, QueryPersister,
    SchedulerRegistry,
)
from scheduler.events import (
    AgentLost, Disconnected, ExecutorLost, OfferRescinded, OffersReceived, Registered,
    Reregistered, new_stimulus_id,
)
from scheduler.events import (
    ControlRequested, QueryStopRequested, QuerySubmitted, QueryUpdateRequested,
    TaskMigrationRequested,
)
from scheduler.leadership import (
    Action, Clock, Deposed, Elected, EnterSafeMode, Fact, FencedRequest, LeaderSeen,
    LeaveSafeMode, Leadership, LeadershipGained, LeadershipUpdated, Reconnected,
    RestoreAndRegister, SessionLost, StepDown, Suspended, next_leadership,
)
from scheduler.control import new_request_id
from scheduler.loop import DroppingRunner, Reply, SchedulerLoop
from scheduler.query_source import Compiled, QuerySource, Restorable, recompile_all
from scheduler.state import SchedulerState, restore_query
from scheduler.views import snapshot

log = logging.getLogger("elastiq.scheduler.mesos")

CREDENTIALS_REFUSED = ("the Mesos master refused the framework's credentials ({status}): check "
                       "--mesos-principal and --mesos-secret-file (the secret the master has "
                       "for that principal)")


def _refused_status(exc: BaseException | None) -> str | None:
    """"HTTP 401"/"HTTP 403" when pymesos gave up because the master refused our credentials."""
    text = str(exc) if exc is not None else ""
    for status in ("HTTP 401", "HTTP 403"):
        if f"Failed with {status}" in text:
            return status
    return None


class _CredentialsRefused(logging.Filter):
    """pymesos logs the abort of its I/O thread with a traceback; a refused credential is a
    usage error, said in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = _refused_status(record.exc_info[1] if record.exc_info else None)
        if status is not None:
            record.msg, record.args = CREDENTIALS_REFUSED.format(status=status), ()
            record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("pymesos.process").addFilter(_CredentialsRefused())


def driver_failure() -> str | None:
    """Why pymesos's I/O thread gave up, once it has (it then interrupts the main thread), or
    None: a refused credential in words, anything else as its error."""
    import pymesos.process

    info = getattr(pymesos.process, "_exc_info", None)
    return explain_driver_error(info[1]) if info else None


def explain_driver_error(exc: BaseException) -> str:
    """A pymesos driver error as a user reads it (a refused credential says what to check)."""
    status = _refused_status(exc)
    return CREDENTIALS_REFUSED.format(status=status) if status else f"Mesos driver: {exc}"


def credentials_refused(exc: BaseException) -> bool:
    return _refused_status(exc) is not None


def _master(info: Any) -> str:
    return f"{info.get('hostname', '')}:{info.get('port', '')}"


class MesosCallbacks(Scheduler):
    """pymesos callbacks -> events. Runs on the driver's I/O thread: never blocks."""

    def __init__(self, loop: SchedulerLoop):
        self._loop = loop
        self.active = True  # False once this driver is stopped: late callbacks are dropped

    def _put(self, event: Any) -> None:
        if self.active:
            self._loop.put(event)

    def registered(self, driver: Any, frameworkId: Any, masterInfo: Any) -> None:
        self._put(Registered(new_stimulus_id("registered"), frameworkId["value"],
                                  _master(masterInfo)))

    def reregistered(self, driver: Any, masterInfo: Any) -> None:
        self._put(Reregistered(new_stimulus_id("reregistered"), _master(masterInfo),
                                    str(driver.framework_id or "")))

    def disconnected(self, driver: Any) -> None:
        self._put(Disconnected(new_stimulus_id("disconnected")))

    def resourceOffers(self, driver: Any, offers: list[Any]) -> None:
        parsed = tuple(mesos_json.parse_offer(o) for o in offers)
        self._put(OffersReceived(new_stimulus_id("offers"), parsed))

    def offerRescinded(self, driver: Any, offerId: Any) -> None:
        self._put(OfferRescinded(new_stimulus_id("rescind"), str(offerId.get("value"))))

    def statusUpdate(self, driver: Any, status: Any) -> None:
        self._put(mesos_json.parse_status(new_stimulus_id("status"), status))

    def frameworkMessage(self, driver: Any, executorId: Any, slaveId: Any, message: Any) -> None:
        self._put(mesos_json.message_event(
            new_stimulus_id("message"), str(slaveId.get("value")), str(executorId.get("value")),
            message))

    def slaveLost(self, driver: Any, slaveId: Any) -> None:
        self._put(AgentLost(new_stimulus_id("agent-lost"), str(slaveId.get("value"))))

    def executorLost(self, driver: Any, executorId: Any, slaveId: Any, status: Any) -> None:
        self._put(ExecutorLost(new_stimulus_id("executor-lost"), str(slaveId.get("value")),
                                    str(executorId.get("value")), int(status or 0)))

    def error(self, driver: Any, message: str) -> None:
        log.error("[mesos-error] master says: %s", message)


CALL_TIMEOUT_S = 20.0  # the longest one scheduler call to the master may take
STOP_TIMEOUT_S = CALL_TIMEOUT_S + 10.0  # the longest stopping the driver may take


class BoundedDriver(MesosSchedulerDriver):
    """pymesos's driver with every call to the master bounded by CALL_TIMEOUT_S. pymesos
    0.3.15 opens its call connection with its subscription's timeout (a day), and holds its
    driver lock while a call waits; a master that stops reading (a network partition, a master
    that failed the framework over) then froze the loop and every `stop` behind that lock (a
    scheduler's stop hung in the ZooKeeper expiry test). A call that times out fails like any
    refused call: logged, and the next reconciliation repeats what it lost."""

    def _get_conn(self) -> Any:
        conn = super()._get_conn()
        if conn is not None:
            conn.timeout = CALL_TIMEOUT_S  # read when the connection opens, on its first call
        return conn


class DriverRunner:
    """Executes commands with a pymesos driver (from the loop thread)."""

    def __init__(self, driver: MesosSchedulerDriver, config: SchedulerConfig):
        self._driver = driver
        self._config = config

    def run(self, command: Command) -> None:
        handler(_RUNS, command, "DriverRunner")(self, command)

    def _LaunchTasks(self, c: LaunchTasks) -> None:
        executor = mesos_json.executor_info(self._config.executor, c.agent_id,
                                            self._driver.framework_id or "")
        infos = [mesos_json.task_info(t, c.agent_id, executor) for t in c.tasks]
        log.info("[%s] LAUNCH %s on %s", c.stimulus_id, [t.mesos_task_id for t in c.tasks],
                 c.agent_id)
        self._driver.launchTasks([{"value": o} for o in c.offer_ids], infos)

    def _DeclineOffers(self, c: DeclineOffers) -> None:
        log.info("[%s] DECLINE %s: %s", c.stimulus_id, list(c.offer_ids), c.reason)
        self._driver.declineOffer([{"value": o} for o in c.offer_ids],
                                  mesos_json.refuse_filter(c.refuse_seconds))

    def _KillTask(self, c: KillTask) -> None:
        log.info("[%s] KILL %s", c.stimulus_id, c.mesos_task_id)
        self._driver.killTask({"value": c.mesos_task_id})

    def _ShutdownExecutor(self, c: ShutdownExecutor) -> None:
        """Mesos's SHUTDOWN call, which pymesos 0.3.15 has no method for: sent on its
        connection (`_send`) as its own calls are."""
        log.warning("[%s] SHUTDOWN executor %s on %s: %s", c.stimulus_id, c.executor_id,
                    c.agent_id, c.reason)
        framework_id = self._driver.framework_id
        if not framework_id or not self._driver.connected:
            return  # the next periodic reconciliation and the detector try again
        self._driver._send({"type": "SHUTDOWN", "framework_id": {"value": framework_id},
                            "shutdown": {"executor_id": {"value": c.executor_id},
                                         "agent_id": {"value": c.agent_id}}})

    def _ReconcileTasks(self, c: ReconcileTasks) -> None:
        log.info("[%s] RECONCILE %s", c.stimulus_id, [t for t, _ in c.tasks] or "all")
        self._driver.reconcileTasks([{"task_id": {"value": t}, "agent_id": {"value": a}}
                                     for t, a in c.tasks])

    def _ReviveOffers(self, c: ReviveOffers) -> None:
        self._driver.reviveOffers()

    def _SuppressOffers(self, c: SuppressOffers) -> None:
        self._driver.suppressOffers()

    def _SendFrameworkMessage(self, c: SendFrameworkMessage) -> None:
        self._driver.sendFrameworkMessage({"value": c.executor_id}, {"value": c.agent_id},
                                          mesos_json.encode_bytes(c.data))

    def _RetargetChannels(self, c: RetargetChannels) -> None:
        """A framework message to the consumer's executor (base64 of JSON, as Mesos wants)."""
        log.info("[%s] RETARGET %s on %s: %s", c.stimulus_id, c.mesos_task_id, c.agent_id,
                 dict(c.endpoints))
        self._driver.sendFrameworkMessage({"value": c.executor_id}, {"value": c.agent_id},
                                          mesos_json.encode_bytes(c.data))


_RUNS: dict[type, Callable[[DriverRunner, Any], None]] = {
    LaunchTasks: DriverRunner._LaunchTasks,
    DeclineOffers: DriverRunner._DeclineOffers,
    KillTask: DriverRunner._KillTask,
    ShutdownExecutor: DriverRunner._ShutdownExecutor,
    ReconcileTasks: DriverRunner._ReconcileTasks,
    ReviveOffers: DriverRunner._ReviveOffers,
    SuppressOffers: DriverRunner._SuppressOffers,
    SendFrameworkMessage: DriverRunner._SendFrameworkMessage,
    RetargetChannels: DriverRunner._RetargetChannels,
}


def unreachable_endpoints(catalog: ControlCatalog | None, tuples: list[tuple[str, str, str]],
                          timeout: float = 1.0) -> list[str]:
    """The network-source endpoints among `tuples` nobody listens on (a TCP connect within
    `timeout` fails), as problems; other tuples are left to the state machine's checks."""
    problems = []
    for operator, value in (catalog or ControlCatalog()).source_endpoints(tuples):
        host, _, port = value.strip().removeprefix("tcp://").rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except (OSError, ValueError) as exc:
            problems.append(f"{operator}.endpoint = {value!r}: nobody listens there ({exc}); "
                            "start the writer first")
    return problems


class SchedulerService:
    """The running scheduler: `start()`, `submit()`, `status()`, `stop_query()`, `stop()`.

    Leadership comes from a `Coordination` (in-process by default: this service leads alone).
    Only the leader runs a Mesos driver: when elected it restores the persisted queries into
    the state, THEN registers with the persisted framework id (so reconciliation finds its
    running tasks known); in safe mode it launches nothing; stepping down stops the driver with
    failover (tasks keep running) and never tears the framework down. Leadership facts are
    handled on one worker thread, never on a coordination callback's thread.
    """

    def __init__(self, master_url: str, config: SchedulerConfig | None = None,
                 tick_interval: float = 0.25, framework_id: str | None = None,
                 coordination: Coordination | None = None, address: str = "",
                 principal: str | None = None, secret: str | None = None):
        self.master_url = master_url
        self.config = config or SchedulerConfig()
        self.loop = SchedulerLoop(self.config, tick_interval=tick_interval)
        self.coordination = coordination or InProcessCoordination()
        self.registry = SchedulerRegistry(self.coordination)
        self.address = address or "in-process"
        self.leadership = Leadership()
        self.driver: MesosSchedulerDriver | None = None
        self._callbacks: MesosCallbacks | None = None
        self._first_framework_id = framework_id
        self._principal, self._secret = principal, secret
        self._persister = QueryPersister(self.registry)
        self._compiled: Compiled = {}  # persisted sources already recompiled, and failures
        self.loop.after_step.append(self._persister.observe)
        self._facts: "queue.Queue[Any]" = queue.Queue()
        self._worker: threading.Thread | None = None
        self._changed = threading.Condition()
        self._set_metrics()

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self, wait_for_leadership: float = 5.0) -> "SchedulerService":
        """Start; wait (bounded) until this service leads or knows another leader."""
        self.loop.start()
        self.loop.put(LeadershipUpdated(new_stimulus_id("leadership"), self.leadership))
        self.coordination.start()
        self.coordination.add_connection_listener(self._on_connection)
        self._worker = threading.Thread(target=self._work, name="leadership", daemon=True)
        self._worker.start()
        self.coordination.campaign(self.address, lambda term: self._facts.put(
            Elected(term, self.address)), lambda why: self._facts.put(Deposed(why)))
        with self._changed:
            self._changed.wait_for(lambda: self._state_leads() or self.leadership.leader not in
                                   ("", self.address), wait_for_leadership)
        log.info("[service] scheduler started against %s as %s", self.master_url,
                 self.leadership.role)
        return self

    def _state_leads(self) -> bool:
        held = self.loop.state.leadership
        return held is not None and held.role == "leader"

    def stop(self, failover: bool = True) -> None:
        """Stop; with `failover` (default) the framework and its tasks outlive us."""
        if self._worker is not None:
            self._facts.put(_STOP)
            self._worker.join(10)
            self._worker = None
        if self.leadership.role != "standby":
            self._persister.flush(2.0)
        self._stop_driver(failover)
        self._persister.close()
        self.coordination.close()
        self.loop.stop()
        log.info("[service] scheduler stopped (failover=%s)", failover)

    def __enter__(self) -> "SchedulerService":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- leadership (facts in, actions out; one thread) ----------------------------------
    def _on_connection(self, state: ConnectionState) -> None:
        """Called on the coordination's connection thread: only queue a fact."""
        now = time.monotonic()
        self._facts.put({"suspended": Suspended, "connected": Reconnected,
                         "lost": SessionLost}[state](now))

    def _work(self) -> None:
        last_look = 0.0
        while True:
            try:
                fact = self._facts.get(timeout=0.25)
            except queue.Empty:
                fact = Clock(time.monotonic())
            if fact is _STOP:
                return
            if isinstance(fact, Clock) and fact.now - last_look >= 0.5:
                last_look = fact.now
                self._apply(LeaderSeen(self._leader_address()))
            self._apply(fact)

    def _leader_address(self) -> str:
        try:
            info = self.coordination.leader()
        except CoordinationError:
            return ""
        return info.address if info else ""

    def _apply(self, fact: Fact) -> None:
        new, actions = next_leadership(self.leadership, fact,
                                       self.coordination.session_timeout)
        if new != self.leadership:
            with self._changed:
                self.leadership = new
                self._changed.notify_all()
            self._set_metrics()
            if not actions:  # e.g. a standby learning the leader's address for its refusals
                self.loop.put(LeadershipUpdated(new_stimulus_id("leadership"), new))
        for action in actions:
            log.info("[leadership] %s -> %s", type(fact).__name__, action)
            try:
                self._run_action(action)
            except Exception:  # never let one failed action end the leadership thread
                log.exception("[leadership] %s failed; resigning", action)
                self.coordination.resign()
        if actions:
            with self._changed:
                self._changed.notify_all()

    def _run_action(self, action: Action) -> None:
        handler(_ACTIONS, action, "SchedulerService")(self, new_stimulus_id("leadership"), action)

    def _step_down(self, sid: str, action: StepDown) -> None:
        self._persister.end()
        self._stop_driver(failover=True)
        self.loop.request(LeadershipUpdated(sid, self.leadership))

    def _announce(self, sid: str, action: EnterSafeMode | LeaveSafeMode) -> None:
        self.loop.put(LeadershipUpdated(sid, self.leadership))

    def _restore_and_register(self, sid: str, action: RestoreAndRegister) -> None:
        framework_id = self.registry.framework_id() or self._first_framework_id
        queries = tuple((r.query, r.source, with_missing_keys(r.query, r.placements))
                        for r in self._recompiled())
        self._persister.begin(action.term)
        reply = self.loop.request(LeadershipGained(sid, self.leadership, framework_id, queries))
        if not reply.accepted:
            raise RuntimeError(f"restoring the persisted queries failed: {reply.message}")
        log.info("[%s] epoch %s: %s; registering as framework %s", sid, action.term.epoch,
                 reply.message, framework_id or "(new)")
        self._start_driver(framework_id)

    def _recompiled(self) -> list[Restorable]:
        """The persisted queries recompiled from their sources by our compiler (never a
        persisted program); an entry that does not compile is logged and left out."""
        entries = self.registry.load_queries()
        present = {(e.query_id, e.source) for e in entries}
        for gone in [k for k in self._compiled if k not in present]:
            del self._compiled[gone]
        restored, skipped = recompile_all(entries, self._compiled)
        for problem in skipped:
            log.error("[registry] not restoring %s", problem)
        return restored

    def _set_metrics(self) -> None:
        setter = getattr(getattr(self.loop, "metrics", None), "set_leadership", None)
        if setter is not None:
            role = self.leadership.role
            setter(role != "standby", self.leadership.epoch, role == "safe_mode")

    # ---- the Mesos driver (leader only) --------------------------------------------------
    def _start_driver(self, framework_id: str | None) -> None:
        framework = mesos_json.framework_info(self.config, getpass.getuser(), framework_id)
        if self._principal:
            framework["principal"] = self._principal
        self._callbacks = MesosCallbacks(self.loop)
        self.driver = BoundedDriver(self._callbacks, framework, _driver_uri(self.master_url),
                                    use_addict=False, principal=self._principal,
                                    secret=self._secret)
        self.loop.runner = DriverRunner(self.driver, self.config)
        self.driver.start()

    def _stop_driver(self, failover: bool) -> None:
        driver, self.driver = self.driver, None
        if self._callbacks is not None:
            self._callbacks.active = False
        self.loop.runner = DroppingRunner()
        if driver is None:
            return

        def stop() -> None:
            driver.stop(failover=failover)
            driver.join()
        try:
            bounded_call.within(stop, STOP_TIMEOUT_S, "stop the Mesos driver")
        except bounded_call.CallTimedOut:  # its threads are daemons: left behind, never waited on
            log.warning("[service] the Mesos driver did not stop within %.0f s (a call to the "
                        "master hangs); going on without it", STOP_TIMEOUT_S)

    # ---- requests and views --------------------------------------------------------------
    @property
    def framework_id(self) -> str | None:
        return self.driver.framework_id if self.driver else self.loop.state.framework_id

    def submit(self, query: CompiledQuery, timeout: float = 10.0,
               epoch: int | None = None, source: QuerySource | None = None) -> Reply:
        """Submit a compiled query; only one with its `source` (the spec it was compiled
        from) is persisted for a new leader to recompile."""
        sid = new_stimulus_id("submit")
        keys = issue_keys(t.task_id for t in query.tasks)
        return self.loop.request(
            FencedRequest(sid, epoch, QuerySubmitted(sid, query, source, keys)), timeout)

    def stop_query(self, query_id: str, timeout: float = 10.0,
                   epoch: int | None = None, *, force: bool = False) -> Reply:
        """Stop a query; `force`: even while other queries read a stream it publishes."""
        sid = new_stimulus_id("stop")
        return self.loop.request(
            FencedRequest(sid, epoch, QueryStopRequested(sid, query_id, force)), timeout)

    def update(self, query: CompiledQuery, source: QuerySource | None = None, *,
               drop_state: bool = False, dry_run: bool = False, timeout: float = 10.0,
               epoch: int | None = None) -> Reply:
        """Update a running query in place from its new compiled plan (docs/queries.md)."""
        sid = new_stimulus_id("update")
        keys = issue_keys(t.task_id for t in query.tasks)
        return self.loop.request(FencedRequest(sid, epoch, QueryUpdateRequested(
            sid, query, source, keys, drop_state, dry_run)), timeout)

    def running_plan(self, query_id: str) -> tuple[CompiledQuery, QuerySource | None] | None:
        """Only the leader runs queries; a standby knows none to update."""
        return self.loop.running_plan(query_id) if self.leadership.role != "standby" else None

    def share_offers(self) -> dict[str, str]:
        """A standby runs no queries: it offers none."""
        return self.loop.share_offers() if self.leadership.role != "standby" else {}

    def migrate_task(self, query_id: str, task_id: str, agent_id: str, timeout: float = 10.0,
                     epoch: int | None = None) -> Reply:
        sid = new_stimulus_id("migrate")
        return self.loop.request(
            FencedRequest(sid, epoch, TaskMigrationRequested(sid, query_id, task_id, agent_id)),
            timeout)

    def control(self, query_id: str, tuples: list[tuple[str, str, str]], timeout: float = 10.0,
                epoch: int | None = None) -> Reply:
        """Control tuples for a query. A network source's new endpoint must have a writer
        listening there (probed first: the state machine does no I/O); the rest is checked and
        applied by the state machine."""
        deaf = unreachable_endpoints(self.loop.query_catalog(query_id), tuples)
        if deaf:
            return Reply(False, 400, "; ".join(deaf), {"problems": deaf})
        sid = new_stimulus_id("control")
        return self.loop.request(FencedRequest(sid, epoch, ControlRequested(
            sid, query_id, tuple(tuples), new_request_id(query_id))), timeout)

    def query_control(self, query_id: str, request_id: str | None = None) -> dict[str, Any] | None:
        """Only the leader knows the control stream's progress; a standby knows no query."""
        return self.loop.query_control(query_id, request_id)

    def status(self) -> dict[str, Any]:
        """The leader's live state; a standby answers from the registry."""
        view = self.loop.status() if self.leadership.role != "standby" else \
            self._registry_status()
        view["leadership"] = self.leadership.to_json()
        return view

    def query_status(self, query_id: str) -> dict[str, Any] | None:
        if self.leadership.role != "standby":
            return self.loop.query_status(query_id)
        return self._registry_status()["queries"].get(query_id)

    def _registry_status(self) -> dict[str, Any]:
        scratch = SchedulerState(self.config)
        try:
            scratch.framework_id = self.registry.framework_id()
            for r in self._recompiled():
                record = restore_query(r.query, r.source, r.placements, 0.0)
                scratch.queries[record.query_id] = record
        except CoordinationError as e:
            log.warning("[service] standby cannot read the registry: %s", e)
        return snapshot(scratch)


_ACTIONS: dict[type, Callable[[SchedulerService, str, Any], None]] = {
    RestoreAndRegister: SchedulerService._restore_and_register,
    StepDown: SchedulerService._step_down,
    EnterSafeMode: SchedulerService._announce,
    LeaveSafeMode: SchedulerService._announce,
}
_STOP = object()


def _driver_uri(master_url: str) -> str:
    """pymesos wants `host:port` or `zk://...`; accept `http://host:port` too."""
    if master_url.startswith(("http://", "https://")):
        return master_url.split("://", 1)[1].rstrip("/")
    return master_url
