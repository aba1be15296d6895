"""End-to-end tests of the embedded Mesos-compatible cluster with unmodified pymesos drivers.

Real sockets on 127.0.0.1, real executor subprocesses (tests/fixtures/echo_executor.py), real
SIGKILL. Expected values come from what the test configured (the agents' resources, the pids the
agent started), never from earlier output.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import pymesos.process
from pymesos import MesosSchedulerDriver, Scheduler, decode_data, encode_data

from embedded_mesos import EmbeddedCluster
from embedded_mesos.auth import EXECUTOR_TOKEN_ENV, basic_authorization
from testkit.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]
ECHO_EXECUTOR = Path(__file__).parent / "fixtures" / "echo_executor.py"
RESOURCES = {"cpus": 2, "mem": 1024, "ports": "31000-31999"}
WAIT = 15.0


class Recorder(Scheduler):
    """Records every scheduler callback as (kind, payload); callbacks return at once."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self._cond = threading.Condition()

    def _add(self, kind: str, payload: Any) -> None:
        with self._cond:
            self.events.append((kind, payload))
            self._cond.notify_all()

    def registered(self, driver, framework_id, master_info):  # noqa: N802
        self._add("registered", framework_id["value"])

    def reregistered(self, driver, master_info):  # noqa: N802
        self._add("reregistered", master_info)

    def resourceOffers(self, driver, offers):  # noqa: N802
        for offer in offers:
            self._add("offer", offer)

    def offerRescinded(self, driver, offer_id):  # noqa: N802
        self._add("rescinded", offer_id["value"])

    def statusUpdate(self, driver, status):  # noqa: N802
        self._add("update", status)

    def frameworkMessage(self, driver, executor_id, agent_id, message):  # noqa: N802
        self._add("message", (executor_id["value"], agent_id["value"], message))

    def slaveLost(self, driver, agent_id):  # noqa: N802
        self._add("agent_lost", agent_id["value"])

    def executorLost(self, driver, executor_id, agent_id, status):  # noqa: N802
        self._add("executor_lost", (executor_id["value"], agent_id["value"], status))

    def error(self, driver, message):
        self._add("error", message)

    def wait_for(self, kind: str, match: Callable[[Any], bool] = lambda _: True,
                 timeout: float = WAIT, start: int = 0) -> Any:
        """The first recorded payload of `kind` from index `start` on that `match`es."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event_kind, payload in self.events[start:]:
                    if event_kind == kind and match(payload):
                        return payload
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {kind} within {timeout}s; saw {self.kinds()}")
                self._cond.wait(left)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def updates_of(self, task_id: str) -> list[dict[str, Any]]:
        with self._cond:
            return [p for k, p in self.events if k == "update"
                    and p["task_id"]["value"] == task_id]

    def mark(self) -> int:
        with self._cond:
            return len(self.events)


def scalar(offer: dict[str, Any], name: str) -> float:
    return next(r["scalar"]["value"] for r in offer["resources"] if r["name"] == name)


def ranges(offer: dict[str, Any], name: str) -> list[tuple[int, int]]:
    item = next(r for r in offer["resources"] if r["name"] == name)
    return [(r["begin"], r["end"]) for r in item["ranges"]["range"]]


def task_info(task_id: str, offer: dict[str, Any], mode: str = "finish",
              executor_id: str = "echo", cpus: float = 0.5, mem: float = 64) -> dict[str, Any]:
    command = {"value": sys.executable, "shell": False,
               "arguments": [sys.executable, str(ECHO_EXECUTOR)]}
    return {
        "task_id": {"value": task_id}, "name": task_id, "agent_id": offer["agent_id"],
        "resources": [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}},
        ],
        "executor": {"executor_id": {"value": executor_id}, "command": command},
        "data": encode_data(json.dumps({"mode": mode}).encode()),
    }


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def http_call(url: str, method: str, path: str, body: bytes | None,
              headers: dict[str, str] | None = None) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    options = {"agents": 1, "agent_timeout": 5.0}
    options.update(getattr(request, "param", {}))
    with EmbeddedCluster(resources=RESOURCES, work_dir=tmp_path / "cluster", offer_interval=0.05,
                         ping_interval=0.2, executor_grace_seconds=1.0, **options) as running:
        yield running


@pytest.fixture
def drivers() -> Iterator[list[MesosSchedulerDriver]]:
    """Drivers started by a test; stopped (TEARDOWN unless already stopped) at its end."""
    started: list[MesosSchedulerDriver] = []
    yield started
    for driver in started:
        driver.stop()
        driver.join()
    assert pymesos.process._exc_info is None, "a pymesos driver thread failed"


def subscribe(cluster: EmbeddedCluster, drivers: list[MesosSchedulerDriver],
              framework: dict[str, Any] | None = None) -> tuple[Recorder, MesosSchedulerDriver]:
    recorder = Recorder()
    info = {"user": "", "name": "embedded-test", "failover_timeout": 60.0, **(framework or {})}
    credential = cluster.framework_credential
    driver = MesosSchedulerDriver(recorder, info, cluster.master_address,
                                  principal=credential.principal, secret=credential.secret)
    drivers.append(driver)
    driver.start()
    recorder.wait_for("registered" if "id" not in info else "reregistered")
    return recorder, driver


def framework_auth(cluster: EmbeddedCluster) -> dict[str, str]:
    """The Authorization header of the cluster's framework credential (for raw calls)."""
    return {"Authorization": basic_authorization(cluster.framework_credential)}


def executor_token(pid: int) -> str:
    """The executor authentication token the agent gave the executor process `pid`, read from
    its initial environment (as any process of the same user could)."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name.decode() == EXECUTOR_TOKEN_ENV:
            return value.decode()
    raise AssertionError(f"no {EXECUTOR_TOKEN_ENV} in the environment of pid {pid}")


def launch_running(recorder: Recorder, driver: MesosSchedulerDriver, task_id: str,
                   mode: str = "run", executor_id: str = "echo") -> dict[str, Any]:
    """Launch `task_id` on the next offer and wait for TASK_RUNNING; returns the offer."""
    offer = recorder.wait_for("offer", start=0)
    driver.launchTasks([offer["id"]], [task_info(task_id, offer, mode, executor_id)],
                       filters={"refuse_seconds": 0})
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == task_id
                      and s["state"] == "TASK_RUNNING")
    return offer


def test_offer_carries_agent_resources_and_task_runs_then_finishes(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    offer = recorder.wait_for("offer")
    assert offer["agent_id"]["value"] == cluster.agents[0].agent_id
    assert scalar(offer, "cpus") == RESOURCES["cpus"]
    assert scalar(offer, "mem") == RESOURCES["mem"]
    assert ranges(offer, "ports") == [(31000, 31999)]
    driver.launchTasks([offer["id"]], [task_info("t1", offer, "finish")])
    recorder.wait_for("update", lambda s: s["state"] == "TASK_FINISHED")
    states = [s["state"] for s in recorder.updates_of("t1")]
    assert states == ["TASK_RUNNING", "TASK_FINISHED"]
    assert all(s["agent_id"]["value"] == offer["agent_id"]["value"]
               for s in recorder.updates_of("t1"))


def test_launched_resources_are_withheld_and_executor_is_reused(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    first = launch_running(recorder, driver, "a", "run")
    second = recorder.wait_for("offer", lambda o: o["id"] != first["id"])
    assert scalar(second, "cpus") == pytest.approx(RESOURCES["cpus"] - 0.5)
    assert scalar(second, "mem") == pytest.approx(RESOURCES["mem"] - 64)
    driver.launchTasks([second["id"]], [task_info("b", second, "run")],
                       filters={"refuse_seconds": 0})
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == "b"
                      and s["state"] == "TASK_RUNNING")
    pids = cluster.agents[0].executor_pids()
    assert list(pids) == [(recorder.wait_for("registered"), "echo")]


def test_decline_with_refuse_seconds_withholds_the_offer(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    offer = recorder.wait_for("offer")
    declined_at = time.monotonic()
    driver.declineOffer([offer["id"]], filters={"refuse_seconds": 1.0})
    mark = recorder.mark()
    recorder.wait_for("offer", start=mark, timeout=5.0)
    assert time.monotonic() - declined_at >= 1.0


def test_revive_lifts_a_decline_filter(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    driver.declineOffer([recorder.wait_for("offer")["id"]], filters={"refuse_seconds": 300})
    mark = recorder.mark()
    time.sleep(0.3)
    assert "offer" not in recorder.kinds()[mark:]
    driver.reviveOffers()
    recorder.wait_for("offer", start=mark, timeout=5.0)


def test_kill_running_task(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    launch_running(recorder, driver, "k1")
    driver.killTask({"value": "k1"})
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == "k1"
                      and s["state"] == "TASK_KILLED")
    assert [s["state"] for s in recorder.updates_of("k1")] == ["TASK_RUNNING", "TASK_KILLED"]


def test_framework_message_round_trip(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    offer = launch_running(recorder, driver, "m1")
    driver.sendFrameworkMessage({"value": "echo"}, offer["agent_id"],
                                encode_data(b"ping:hello"))
    executor_id, agent_id, data = recorder.wait_for("message")
    (pid,) = cluster.agents[0].executor_pids().values()
    assert (executor_id, agent_id) == ("echo", offer["agent_id"]["value"])
    assert decode_data(data).decode() == f"pong:hello:{pid}"


def test_explicit_and_implicit_reconciliation(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    launch_running(recorder, driver, "r1")
    reconciled = lambda task_id: lambda s: (s["task_id"]["value"] == task_id  # noqa: E731
                                            and s.get("reason") == "REASON_RECONCILIATION")
    mark = recorder.mark()
    driver.reconcileTasks([{"task_id": {"value": "r1"}}, {"task_id": {"value": "ghost"}}])
    assert recorder.wait_for("update", reconciled("r1"), start=mark)["state"] == "TASK_RUNNING"
    assert recorder.wait_for("update", reconciled("ghost"), start=mark)["state"] == "TASK_LOST"
    mark = recorder.mark()
    driver.reconcileTasks([])
    status = recorder.wait_for("update", reconciled("r1"), start=mark)
    assert status["state"] == "TASK_RUNNING" and "uuid" not in status


def test_failover_resubscribe_keeps_the_task_running(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    launch_running(recorder, driver, "f1")
    framework_id = recorder.wait_for("registered")
    (pid,) = cluster.agents[0].executor_pids().values()
    driver.stop(failover=True)
    driver.join()
    time.sleep(0.3)
    assert pid_alive(pid)
    recorder2, driver2 = subscribe(cluster, drivers, {"id": {"value": framework_id}})
    mark = recorder2.mark()
    driver2.reconcileTasks([{"task_id": {"value": "f1"}}])
    assert recorder2.wait_for("update", start=mark)["state"] == "TASK_RUNNING"
    assert cluster.agents[0].executor_pids() == {(framework_id, "echo"): pid}
    driver2.killTask({"value": "f1"})
    recorder2.wait_for("update", lambda s: s["state"] == "TASK_KILLED")


def test_framework_gone_past_failover_timeout_has_its_tasks_killed(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers, {"failover_timeout": 0.3})
    launch_running(recorder, driver, "g1")
    (pid,) = cluster.agents[0].executor_pids().values()
    driver.stop(failover=True)
    driver.join()
    wait_for("no executor left", lambda: not cluster.agents[0].executor_pids(), WAIT, 0.05)
    wait_for("the executor to exit", lambda: not pid_alive(pid), WAIT, 0.05)
    status, state = http_call(cluster.master_url, "GET", "/state", None, framework_auth(cluster))
    assert status == 200 and state["frameworks"] == {}


def test_sigkill_of_executor_yields_task_failed_and_failure(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    offer = launch_running(recorder, driver, "s1")
    (pid,) = cluster.agents[0].executor_pids().values()
    os.kill(pid, signal.SIGKILL)
    failed = recorder.wait_for("update", lambda s: s["state"] == "TASK_FAILED")
    assert failed["task_id"]["value"] == "s1"
    assert failed["reason"] == "REASON_EXECUTOR_TERMINATED"
    lost = recorder.wait_for("executor_lost")
    assert lost == ("echo", offer["agent_id"]["value"], signal.SIGKILL)


@pytest.mark.parametrize("cluster", [{"agents": 2}], indirect=True)
def test_two_agents_offer_with_distinct_agent_ids(cluster, drivers):
    recorder, _ = subscribe(cluster, drivers)
    recorder.wait_for("offer")
    wait_for("offers from both agents", lambda: len({p["agent_id"]["value"] for k, p in
                                                     recorder.events if k == "offer"}) == 2,
             WAIT, 0.05)
    offered = {p["agent_id"]["value"] for k, p in recorder.events if k == "offer"}
    assert offered == {agent.agent_id for agent in cluster.agents}


def test_teardown_kills_tasks(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    launch_running(recorder, driver, "d1")
    (pid,) = cluster.agents[0].executor_pids().values()
    driver.stop()  # no failover: TEARDOWN
    driver.join()
    wait_for("the executor to exit", lambda: not pid_alive(pid), WAIT, 0.05)
    _, state = http_call(cluster.master_url, "GET", "/state", None, framework_auth(cluster))
    assert state["frameworks"] == {}


def test_malformed_requests_get_4xx_and_the_master_keeps_serving(cluster, drivers):
    url = cluster.master_url
    json_type = {"Content-Type": "application/json", **framework_auth(cluster)}
    cases = [
        (b"not json", 400),
        (b"[1, 2]", 400),
        (json.dumps({"type": "SUBSCRIBE"}).encode(), 400),
        (json.dumps({"type": "WHATEVER", "framework_id": {"value": "x"}}).encode(), 400),
        (json.dumps({"type": "KILL", "framework_id": {"value": "nope"}}).encode(), 404),
    ]
    for body, expected in cases:
        status, reply = http_call(url, "POST", "/api/v1/scheduler", body, json_type)
        assert status == expected, body
        assert isinstance(reply["error"], str) and reply["error"]
    assert http_call(url, "GET", "/nowhere", None)[0] == 404
    assert http_call(url, "GET", "/version", None)[1]["version"]
    recorder, driver = subscribe(cluster, drivers)
    framework_id = recorder.wait_for("registered")
    status, reply = http_call(url, "POST", "/api/v1/scheduler", json.dumps(
        {"type": "REVIVE", "framework_id": {"value": framework_id}}).encode(),
        {**json_type, "Mesos-Stream-Id": "wrong"})
    assert status == 400 and "Mesos-Stream-Id" in reply["error"]
    launch_running(recorder, driver, "ok1", "finish")
    (pid,) = cluster.agents[0].executor_pids().values()
    token = {"Authorization": f"Bearer {executor_token(pid)}"}  # past authentication: the body
    status, reply = http_call(cluster.agents[0].url, "POST", "/api/v1/executor", b"{",
                              {**json_type, **token})
    assert status == 400 and reply["error"]


@pytest.mark.parametrize("cluster", [{"agents": 0, "agent_timeout": 1.0}], indirect=True)
def test_killed_agent_process_is_detected_as_lost(cluster, drivers):
    agent = cluster.start_agent_process()
    recorder, driver = subscribe(cluster, drivers)
    offer = launch_running(recorder, driver, "l1")
    assert offer["agent_id"]["value"] == agent.agent_id
    killed_at = time.monotonic()
    agent.kill(signal.SIGKILL)
    lost = recorder.wait_for("update", lambda s: s["state"] == "TASK_LOST")
    assert lost["task_id"]["value"] == "l1" and lost["reason"] == "REASON_AGENT_REMOVED"
    assert recorder.wait_for("agent_lost") == agent.agent_id
    assert time.monotonic() - killed_at < 1.0 + 3.0


def test_executor_that_cannot_start_fails_its_task(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    offer = recorder.wait_for("offer")
    task = task_info("bad1", offer)
    task["executor"]["command"] = {"value": "/nonexistent/executor", "shell": False}
    driver.launchTasks([offer["id"]], [task])
    failed = recorder.wait_for("update", lambda s: s["task_id"]["value"] == "bad1")
    assert failed["state"] == "TASK_FAILED" and "/nonexistent/executor" in failed["message"]


def test_an_executor_dying_before_it_takes_its_queued_tasks_reports_each_once(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    offer = recorder.wait_for("offer")
    tasks = [task_info(t, offer, cpus=0.2, executor_id="shortlived") for t in ("q1", "q2")]
    for task in tasks:  # it exits before it subscribes: both tasks wait in the agent's queue
        task["executor"]["command"] = {"value": "sleep 0.3; exit 3", "shell": True}
    driver.launchTasks([offer["id"]], tasks)
    for task_id in ("q1", "q2"):
        recorder.wait_for("update", lambda s, t=task_id: s["task_id"]["value"] == t
                          and s["state"] == "TASK_FAILED")
    recorder.wait_for("executor_lost")
    time.sleep(0.5)  # a duplicate would follow the first report at once
    failed = [s["task_id"]["value"] for k, s in list(recorder.events)
              if k == "update" and s["state"] == "TASK_FAILED"]
    assert sorted(failed) == ["q1", "q2"], failed


def test_clean_agent_stop_ends_its_executors_and_is_reported(cluster, drivers):
    recorder, driver = subscribe(cluster, drivers)
    launch_running(recorder, driver, "c1")
    agent = cluster.agents[0]
    (pid,) = agent.executor_pids().values()
    agent.stop()
    assert not pid_alive(pid)
    ended = recorder.wait_for("update", lambda s: s["task_id"]["value"] == "c1"
                              and s["state"] != "TASK_RUNNING")
    assert ended["state"] == "TASK_KILLED"
    assert recorder.wait_for("agent_lost") == agent.agent_id
