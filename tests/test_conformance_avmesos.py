"""Conformance of the embedded master with a Mesos client we did not write: avmesos (PyPI).

A framework built on avmesos's `MesosClient` (its own SUBSCRIBE, RecordIO parsing of the event
stream, ACCEPT, ACKNOWLEDGE, RECONCILE, KILL and TEARDOWN requests) runs against a real embedded
master and agent: it subscribes as PARTITION_AWARE with HTTP Basic credentials, launches a task
on an offer, sees it RUNNING, reconciles it, kills it, finds it forgotten by reconciliation once
acknowledged (TASK_GONE), and tears down, which ends its executor. avmesos has no operator-API
calls, so the operator API is read with `requests` (the HTTP library avmesos is built on) at each
step and must agree with what the client saw. Skipped when avmesos is not installed (it is a
test extra).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

import pytest

from tests.test_embedded_cluster import (  # noqa: F401 - `cluster` is a fixture
    cluster, pid_alive, task_info,
)
from testkit.waiting import wait_for

avmesos_client = pytest.importorskip("avmesos.client", reason="avmesos is a test extra")
requests = pytest.importorskip("requests")

WAIT = 20.0
log = logging.getLogger("tests.avmesos")


class Framework:
    """An avmesos framework recording what its callbacks saw."""

    def __init__(self, cluster: Any) -> None:
        credential = cluster.framework_credential
        self.client = avmesos_client.MesosClient(mesos_urls=[cluster.master_url],
                                                 frameworkName="avmesos-conformance",
                                                 frameworkUser="", max_reconnect=1)
        self.client.set_credentials(credential.principal, None)  # FrameworkInfo.principal
        # avmesos authenticates through its requests `auth` (it has no HTTP Basic setter)
        self.client.requests_auth = requests.auth.HTTPBasicAuth(credential.principal,
                                                                credential.secret)
        self.client.add_capability("PARTITION_AWARE")
        self.client.set_failover_timeout(60)
        self.driver: Any = None
        self.offers: queue.Queue[Any] = queue.Queue()
        self.updates: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.client.on(avmesos_client.MesosClient.SUBSCRIBED, self._subscribed)
        self.client.on(avmesos_client.MesosClient.OFFERS, self._offers)
        self.client.on(avmesos_client.MesosClient.UPDATE, self._update)
        self.thread = threading.Thread(target=self.client.register, daemon=True,
                                       name="avmesos")

    def _subscribed(self, driver: Any) -> None:
        self.driver = driver

    def _offers(self, offers: list[Any]) -> None:
        for offer in offers:
            self.offers.put(offer)

    def _update(self, update: dict[str, Any]) -> None:
        with self._lock:
            self.updates.append(update["status"])

    def status_of(self, task_id: str, state: str, reason: str | None = None) -> dict | None:
        with self._lock:
            for status in self.updates:
                if status["task_id"]["value"] == task_id and status["state"] == state and \
                        (reason is None or status.get("reason") == reason):
                    return status
        return None


def wait(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """`testkit.waiting.wait_for`, logging how long it took."""
    started = time.monotonic()
    found = wait_for(what, check, timeout, 0.05)
    log.info("%s: %.1f s", what, time.monotonic() - started)
    return found


def operator(cluster: Any, kind: str) -> dict[str, Any]:
    credential = cluster.framework_credential
    reply = requests.post(f"{cluster.master_url}/api/v1", json={"type": kind}, timeout=5,
                          auth=(credential.principal, credential.secret))
    assert reply.status_code == 200, reply.text
    return reply.json()[kind.lower()]


@pytest.mark.cluster
@pytest.mark.timeout(90)
# avmesos splits the RecordIO stream on newlines, so it hands over an event only once the next
# one's length has arrived (as it would from real Mesos): frequent heartbeats keep it prompt
@pytest.mark.parametrize("cluster", [{"heartbeat_interval": 0.5}], indirect=True)
def test_an_avmesos_framework_launches_reconciles_kills_and_tears_down(cluster) -> None:
    fw = Framework(cluster)
    fw.thread.start()
    try:
        wait(lambda: fw.driver, "avmesos to subscribe")
        [framework] = operator(cluster, "GET_FRAMEWORKS")["frameworks"]
        assert framework["framework_info"]["id"]["value"] == fw.driver.frameworkId
        assert {"type": "PARTITION_AWARE"} in framework["framework_info"]["capabilities"]

        offer = fw.offers.get(timeout=WAIT)
        agent_id = offer.get_offer()["agent_id"]
        task = task_info("conf1", offer.get_offer(), "run")
        offer.accept([task], {"filters": {"refuse_seconds": 0}})
        wait(lambda: fw.status_of("conf1", "TASK_RUNNING"), "conf1 RUNNING")
        [seen] = operator(cluster, "GET_TASKS")["tasks"]
        assert (seen["task_id"]["value"], seen["state"]) == ("conf1", "TASK_RUNNING")

        fw.driver.reconcile([{"task_id": {"value": "conf1"}, "agent_id": agent_id}])
        wait(lambda: fw.status_of("conf1", "TASK_RUNNING", "REASON_RECONCILIATION"),
             "the reconciliation answer for conf1")

        fw.driver.kill(agent_id["value"], "conf1")
        wait(lambda: fw.status_of("conf1", "TASK_KILLED"), "conf1 KILLED")
        wait(lambda: [t["task_id"]["value"] for t in
                      operator(cluster, "GET_TASKS")["completed_tasks"]] == ["conf1"],
             "the operator API to list conf1 as completed")
        time.sleep(0.5)  # avmesos acknowledges the update after its callback returns
        fw.driver.reconcile([{"task_id": {"value": "conf1"}, "agent_id": agent_id}])
        gone = wait(lambda: fw.status_of("conf1", "TASK_GONE"),
                    "conf1 forgotten once acknowledged (TASK_GONE)")
        assert gone["reason"] == "REASON_RECONCILIATION"
        pids = list(cluster.agents[0].executor_pids().values())
        assert pids, "the executor runs until the framework goes"

        fw.driver.tearDown()
        wait(lambda: operator(cluster, "GET_FRAMEWORKS")["frameworks"] == [],
             "the framework to be torn down")
        wait(lambda: not any(pid_alive(p) for p in pids), "its executor to end")
        assert operator(cluster, "GET_EXECUTORS")["executors"] == []
    finally:
        fw.client.stop = True
        if fw.driver is not None:
            fw.driver.tearDown()
        fw.thread.join(timeout=WAIT)
