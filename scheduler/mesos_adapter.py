"""The Mesos adapter: the ONLY module importing pymesos.

Owns `MesosCallbacks` (a pymesos `Scheduler` whose callbacks only turn what the master says into
events on the loop's queue and return at once), `DriverRunner` (executes commands with the
driver: launchTasks, declineOffer, killTask, reconcileTasks, reviveOffers, suppressOffers,
sendFrameworkMessage) and `SchedulerService`, the running scheduler: an event loop owning the
state plus a pymesos driver. The framework registers as "elastiq" with a long failover timeout
and stops with failover, so running tasks survive a scheduler restart.
Does not own decisions (`scheduler.state`) nor the JSON shapes (`scheduler.mesos_json`).
"""

from __future__ import annotations

import getpass
import logging
from typing import Any

from pymesos import MesosSchedulerDriver, Scheduler

from compiler.tasks import CompiledQuery
from scheduler import mesos_json
from scheduler.commands import (
    Command, DeclineOffers, KillTask, LaunchTasks, ReconcileTasks, ReviveOffers,
    SendFrameworkMessage, SuppressOffers,
)
from scheduler.config import SchedulerConfig
from scheduler.events import (
    AgentLost, Disconnected, ExecutorLost, FrameworkMessageReceived, OfferRescinded,
    OffersReceived, Registered, Reregistered, new_stimulus_id,
)
from scheduler.loop import Reply, SchedulerLoop

log = logging.getLogger("elastiq.scheduler.mesos")


def _master(info: Any) -> str:
    return f"{info.get('hostname', '')}:{info.get('port', '')}"


class MesosCallbacks(Scheduler):
    """pymesos callbacks -> events. Runs on the driver's I/O thread: never blocks."""

    def __init__(self, loop: SchedulerLoop):
        self._loop = loop

    def registered(self, driver: Any, frameworkId: Any, masterInfo: Any) -> None:
        self._loop.put(Registered(new_stimulus_id("registered"), frameworkId["value"],
                                  _master(masterInfo)))

    def reregistered(self, driver: Any, masterInfo: Any) -> None:
        self._loop.put(Reregistered(new_stimulus_id("reregistered"), _master(masterInfo),
                                    str(driver.framework_id or "")))

    def disconnected(self, driver: Any) -> None:
        self._loop.put(Disconnected(new_stimulus_id("disconnected")))

    def resourceOffers(self, driver: Any, offers: list[Any]) -> None:
        parsed = tuple(mesos_json.parse_offer(o) for o in offers)
        self._loop.put(OffersReceived(new_stimulus_id("offers"), parsed))

    def offerRescinded(self, driver: Any, offerId: Any) -> None:
        self._loop.put(OfferRescinded(new_stimulus_id("rescind"), str(offerId.get("value"))))

    def statusUpdate(self, driver: Any, status: Any) -> None:
        self._loop.put(mesos_json.parse_status(new_stimulus_id("status"), status))

    def frameworkMessage(self, driver: Any, executorId: Any, slaveId: Any, message: Any) -> None:
        self._loop.put(FrameworkMessageReceived(
            new_stimulus_id("message"), str(slaveId.get("value")), str(executorId.get("value")),
            mesos_json.decode_message(message)))

    def slaveLost(self, driver: Any, slaveId: Any) -> None:
        self._loop.put(AgentLost(new_stimulus_id("agent-lost"), str(slaveId.get("value"))))

    def executorLost(self, driver: Any, executorId: Any, slaveId: Any, status: Any) -> None:
        self._loop.put(ExecutorLost(new_stimulus_id("executor-lost"), str(slaveId.get("value")),
                                    str(executorId.get("value")), int(status or 0)))

    def error(self, driver: Any, message: str) -> None:
        log.error("[mesos-error] master says: %s", message)


class DriverRunner:
    """Executes commands with a pymesos driver (from the loop thread)."""

    def __init__(self, driver: MesosSchedulerDriver, config: SchedulerConfig):
        self._driver = driver
        self._config = config

    def run(self, command: Command) -> None:
        getattr(self, "_" + type(command).__name__)(command)

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


class SchedulerService:
    """The running scheduler: `start()`, `submit()`, `status()`, `stop_query()`, `stop()`."""

    def __init__(self, master_url: str, config: SchedulerConfig | None = None,
                 tick_interval: float = 0.25, framework_id: str | None = None):
        self.master_url = master_url
        self.config = config or SchedulerConfig()
        self.loop = SchedulerLoop(self.config, tick_interval=tick_interval)
        framework = mesos_json.framework_info(self.config, getpass.getuser(), framework_id)
        self.driver = MesosSchedulerDriver(MesosCallbacks(self.loop), framework,
                                           _driver_uri(master_url), use_addict=False)
        self.loop.runner = DriverRunner(self.driver, self.config)

    def start(self) -> "SchedulerService":
        self.loop.start()
        self.driver.start()
        log.info("[service] scheduler started against %s", self.master_url)
        return self

    def stop(self, failover: bool = True) -> None:
        """Stop; with `failover` (default) the framework and its tasks outlive us."""
        self.driver.stop(failover=failover)
        self.driver.join()
        self.loop.stop()
        log.info("[service] scheduler stopped (failover=%s)", failover)

    def __enter__(self) -> "SchedulerService":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def framework_id(self) -> str | None:
        return self.driver.framework_id

    def submit(self, query: CompiledQuery, timeout: float = 10.0) -> Reply:
        return self.loop.submit(query, timeout)

    def stop_query(self, query_id: str, timeout: float = 10.0) -> Reply:
        return self.loop.stop_query(query_id, timeout)

    def status(self) -> dict[str, Any]:
        return self.loop.status()

    def query_status(self, query_id: str) -> dict[str, Any] | None:
        return self.loop.query_status(query_id)


def _driver_uri(master_url: str) -> str:
    """pymesos wants `host:port` or `zk://...`; accept `http://host:port` too."""
    if master_url.startswith(("http://", "https://")):
        return master_url.split("://", 1)[1].rstrip("/")
    return master_url
