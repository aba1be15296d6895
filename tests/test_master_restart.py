"""Reconciliation after an embedded master restart (issue 6): agents re-register with their ids
and running tasks, the framework re-subscribes with its id, and nothing is killed or relaunched.

Two layers. Pure: `MasterState` fed re-registrations, subscriptions, reconciliations and ticks.
Cluster: the real scheduler (`SchedulerService`, unmodified pymesos driver) against the embedded
cluster with real executor processes (tests/fixtures/scheduler_idle_executor.py); the master is
stopped and a new one started on the same port. Expected values come from what the test set up
or observed independently before the restart (executor pids from the agents, launch files the
executors wrote), never from the code under test's own earlier output.
"""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from embedded_mesos import EmbeddedCluster
from embedded_mesos.httpio import HttpError
from embedded_mesos.master_state import (
    Action,
    AgentAccepted,
    AgentRegistering,
    CallReceived,
    FrameworkSubscribing,
    MasterConfig,
    MasterState,
    Subscribed,
    Ticked,
    ToAgent,
    ToFramework,
)
from embedded_mesos.resources import parse_agent_resources
from testkit.waiting import wait_for

CPU1 = [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 1.0}}]
AGENT_TOTAL = parse_agent_resources({"cpus": 2, "mem": 100}).to_mesos()
INFO = {"user": "", "name": "fw", "failover_timeout": 30.0}


# ------------------------------------------------------------------ pure master state

def _fresh_master(window: float = 5.0) -> MasterState:
    """A master that has just (re)started at time 0 with a re-registration window."""
    return MasterState(MasterConfig(agent_timeout=5.0, agent_reregister_timeout=window),
                       "m2", started=0.0)


def _report(*tasks: tuple[str, str], framework_id: str = "F1",
            info: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """An agent's `executors` list: one executor `e` of `framework_id` running `tasks`
    given as (task id, state), each using one cpu."""
    return [{"framework_id": framework_id, "executor_id": "e",
             "framework_info": info or INFO,
             "tasks": [{"task_id": t, "state": s, "resources": CPU1} for t, s in tasks]}]


_STREAM_IDS = (f"stream-{n}" for n in itertools.count(1))


@dataclass(frozen=True)
class _Subscription:
    framework_id: str
    stream_id: str
    actions: list[Action]


def _reregister(state: MasterState, agent_id: str, executors: list[dict[str, Any]],
                now: float) -> tuple[str, list[Action]]:
    actions = state.handle(AgentRegistering({"agent_id": agent_id, "url": "http://127.0.0.1:1",
                                             "resources": AGENT_TOTAL, "executors": executors},
                                            now=now, wall=now))
    (accepted,) = [a for a in actions if isinstance(a, AgentAccepted)]
    return accepted.agent_id, [a for a in actions if a is not accepted]


def _resubscribe(state: MasterState, framework_id: str, now: float) -> _Subscription:
    actions = state.handle(FrameworkSubscribing(
        {"type": "SUBSCRIBE", "framework_id": {"value": framework_id},
         "subscribe": {"framework_info": {**INFO, "id": {"value": framework_id}}}},
        stream_id=next(_STREAM_IDS), now=now, wall=now))
    (sub,) = [a for a in actions if isinstance(a, Subscribed)]
    return _Subscription(sub.framework_id, sub.stream_id,
                         [a for a in actions if a is not sub])


def _call(state: MasterState, body: dict[str, Any], stream_id: str, now: float) -> list[Action]:
    return state.handle(CallReceived(body, stream_id, now=now, wall=now))


def _tick(state: MasterState, now: float) -> list[Action]:
    return state.handle(Ticked(now=now, wall=now))


def _reconcile(state: MasterState, framework_id: str, stream_id: str, now: float,
               *tasks: tuple[str, str | None]) -> list[Action]:
    listed = [{"task_id": {"value": t}, **({"agent_id": {"value": a}} if a else {})}
              for t, a in tasks]
    return _call(state, {"type": "RECONCILE", "framework_id": {"value": framework_id},
                         "reconcile": {"tasks": listed}}, stream_id, now)


def _updates(actions: list[Action]) -> list[tuple[str, str, str]]:
    """(task id, state, reason) of every UPDATE the actions send to a framework."""
    return [(e["update"]["status"]["task_id"]["value"], e["update"]["status"]["state"],
             e["update"]["status"].get("reason", ""))
            for e in (a.event for a in actions if isinstance(a, ToFramework))
            if e["type"] == "UPDATE"]


def _offered_cpus(actions: list[Action]) -> list[float]:
    return [r["scalar"]["value"] for a in actions if isinstance(a, ToFramework)
            and a.event["type"] == "OFFERS" for o in a.event["offers"]["offers"]
            for r in o["resources"] if r["name"] == "cpus"]


def test_reregistered_agent_keeps_its_id_and_rebuilds_tasks_and_framework():
    state = _fresh_master()
    agent_id, actions = _reregister(state, "S7", _report(("t1", "TASK_RUNNING")), now=1.0)
    assert agent_id == "S7"
    assert not [a for a in actions if isinstance(a, ToAgent)]  # nothing killed
    task = state.tasks[("F1", "t1")]
    assert (task.agent_id, task.executor_id, task.state) == ("S7", "e", "TASK_RUNNING")
    framework = state.frameworks["F1"]
    assert framework.stream_id is None and framework.failover_deadline == 1.0 + 30.0

    sub = _resubscribe(state, "F1", now=2.0)
    assert sub.framework_id == "F1" and state.frameworks["F1"].failover_deadline is None
    assert _offered_cpus(sub.actions) == [2.0 - 1.0]  # the reported task's cpus are in use
    answer = _reconcile(state, "F1", sub.stream_id, 2.5, ("t1", "S7"), ("ghost", "S7"))
    assert _updates(answer) == [("t1", "TASK_RUNNING", "REASON_RECONCILIATION"),
                                ("ghost", "TASK_LOST", "REASON_RECONCILIATION")]


def test_reconciliation_before_the_agent_returns_waits_for_it():
    state = _fresh_master(window=5.0)
    sub = _resubscribe(state, "F1", now=0.5)  # the framework is back before its agent
    assert _reconcile(state, "F1", sub.stream_id, 0.6, ("t1", "S7")) == []
    assert not _updates(_tick(state, 1.0))
    _, actions = _reregister(state, "S7", _report(("t1", "TASK_RUNNING")), now=1.5)
    assert _updates(actions) == [("t1", "TASK_RUNNING", "REASON_RECONCILIATION")]
    assert state.deferred == []


def test_deferred_reconciliation_is_answered_lost_when_the_window_closes():
    state = _fresh_master(window=2.0)
    sub = _resubscribe(state, "F1", now=0.0)
    answered = _reconcile(state, "F1", sub.stream_id, 0.1, ("t1", "S9"), ("t2", None))
    assert _updates(answered) == [("t2", "TASK_LOST", "REASON_RECONCILIATION")]  # no agent named
    assert not _updates(_tick(state, 1.9))
    assert _updates(_tick(state, 2.0)) == [("t1", "TASK_LOST", "REASON_RECONCILIATION")]
    # after the window an unknown agent's task is answered at once
    assert _updates(_reconcile(state, "F1", sub.stream_id, 2.1, ("t3", "S9"))) == \
        [("t3", "TASK_LOST", "REASON_RECONCILIATION")]


def test_recovered_framework_that_never_returns_is_removed_and_its_tasks_killed():
    state = _fresh_master()
    _reregister(state, "S7", _report(("t1", "TASK_RUNNING"),
                                     info={**INFO, "failover_timeout": 3.0}), now=1.0)
    assert not [a for a in _tick(state, 3.9) if isinstance(a, ToAgent)]
    actions = _tick(state, 4.0)
    assert [(a.agent_id, a.command) for a in actions if isinstance(a, ToAgent)] == \
        [("S7", {"type": "SHUTDOWN_FRAMEWORK", "framework_id": "F1"})]
    assert state.tasks[("F1", "t1")].state == "TASK_KILLED" and "F1" not in state.frameworks


def test_removed_agent_gets_a_new_id_and_its_report_is_ignored():
    state = _fresh_master()
    _reregister(state, "S7", _report(("t1", "TASK_RUNNING")), now=0.0)
    _tick(state, 10.0)  # silent past the agent timeout: removed, t1 lost
    assert state.tasks[("F1", "t1")].state == "TASK_LOST"
    agent_id, _ = _reregister(state, "S7", _report(("t1", "TASK_RUNNING")), now=11.0)
    assert agent_id != "S7" and agent_id in state.agents
    assert state.tasks[("F1", "t1")].state == "TASK_LOST"  # not resurrected


def test_report_of_a_removed_framework_shuts_it_down_on_the_agent():
    state = _fresh_master()
    sub = _resubscribe(state, "F1", now=0.0)
    _call(state, {"type": "TEARDOWN", "framework_id": {"value": "F1"}}, sub.stream_id, 0.1)
    _, actions = _reregister(state, "S7", _report(("t1", "TASK_RUNNING")), now=0.2)
    assert [a.command for a in actions if isinstance(a, ToAgent)] == \
        [{"type": "SHUTDOWN_FRAMEWORK", "framework_id": "F1"}]
    assert ("F1", "t1") not in state.tasks


def test_known_agent_reregistering_without_a_task_loses_it():
    state = _fresh_master()
    _reregister(state, "S7", _report(("t1", "TASK_RUNNING"), ("t2", "TASK_RUNNING")),
                now=0.0)
    _resubscribe(state, "F1", now=0.1)
    _, actions = _reregister(state, "S7", _report(("t2", "TASK_RUNNING")), now=0.2)
    assert [(t, s) for t, s, _ in _updates(actions)] == [("t1", "TASK_LOST")]
    assert state.tasks[("F1", "t2")].state == "TASK_RUNNING"


@pytest.mark.parametrize("executors, word", [
    ("nope", "executors must be a list"),
    ([{"framework_id": "F1", "executor_id": "e", "tasks": [{"task_id": "t"}]}], "state"),
    ([{"framework_id": "F1", "executor_id": "e", "tasks": [
        {"task_id": "t", "state": "TASK_DANCING"}]}], "TASK_DANCING"),
    ([{"framework_id": "../x", "executor_id": "e", "tasks": []}], "plain"),
    ([{"framework_id": "F1", "executor_id": "e", "tasks": [
        {"task_id": "t", "state": "TASK_RUNNING", "resources": [{"name": 3}]}]}], "resources"),
])
def test_malformed_report_is_refused_and_changes_nothing(executors, word):
    state = _fresh_master()
    with pytest.raises(HttpError) as refused:
        _reregister(state, "S7", executors, now=0.0)
    assert refused.value.status == 400 and word in refused.value.message
    assert state.agents == {} and state.tasks == {} and state.frameworks == {}


# ------------------------------------------------------------------ the cluster, end to end

FIXTURE = Path(__file__).parent / "fixtures" / "scheduler_idle_executor.py"
PORTS = "31200-31299"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _service(cluster: EmbeddedCluster, failover_timeout: float = 3600.0):
    from scheduler.config import ExecutorSpec, SchedulerConfig
    from scheduler.mesos_adapter import SchedulerService
    config = SchedulerConfig(
        executor=ExecutorSpec(command=f"{sys.executable} {FIXTURE}", cpus=0.5, mem_mb=256),
        backoff_initial=0.2, same_agent_wait=10.0, offer_hold_seconds=1.0,
        decline_seconds=0.5, failover_timeout=failover_timeout)
    credential = cluster.framework_credential
    return SchedulerService(cluster.master_address, config, tick_interval=0.1,
                            principal=credential.principal, secret=credential.secret).start()


def _running(service: Any, query_id: str) -> dict[str, Any] | None:
    view = service.query_status(query_id)
    return view if view and view["status"] == "running" else None


def _spy_events(service: Any) -> list[Any]:
    """Record every event the driver callbacks hand the scheduler loop (passed on unchanged)."""
    seen: list[Any] = []
    forward = service.loop.put

    def put(event: Any) -> None:
        seen.append(event)
        forward(event)

    service.loop.put = put
    return seen


def _all_pids(cluster: EmbeddedCluster) -> dict[tuple[str, str, str], int]:
    return {(agent.agent_id, *key): pid for agent in cluster.agents
            for key, pid in agent.executor_pids().items()}


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_master_restart_keeps_tasks_running_and_reconciles(tmp_path: Path) -> None:
    from scheduler.testing import chain_query
    resources = {"cpus": 4, "mem": 4096, "ports": PORTS}
    with EmbeddedCluster(agents=2, resources=resources, work_dir=tmp_path, ping_interval=0.2,
                         executor_grace_seconds=1.0) as cluster:
        service = _service(cluster)
        try:
            seen = _spy_events(service)
            wait_for("registration", lambda: service.status()["connected"])
            framework_id = service.framework_id
            assert service.submit(chain_query("mr", 2)).accepted
            before = {t["task_id"]: t for t in wait_for("tasks RUNNING",
                                                        lambda: _running(service, "mr"))["tasks"]}
            pids = _all_pids(cluster)
            assert len(pids) >= 1 and all(_pid_alive(p) for p in pids.values())
            old_master, port = cluster.master, cluster.master.port
            mark = len(seen)

            master = cluster.restart_master(downtime=0.5)

            assert master is not old_master and master.port == port
            assert master.state.master_id != old_master.state.master_id
            mesos_ids = {t["mesos_task_id"] for t in before.values()}

            def reconciled_running() -> set[str]:
                got = {ev.mesos_task_id for ev in seen[mark:]
                       if type(ev).__name__ == "StatusUpdated"
                       and ev.reason == "REASON_RECONCILIATION" and ev.state == "RUNNING"}
                return got if got >= mesos_ids else set()

            wait_for("reconciliation answering RUNNING for every task", reconciled_running)
            kinds = [type(ev).__name__ for ev in seen[mark:]]
            assert "Reregistered" in kinds and "Registered" not in kinds
            assert not [ev for ev in seen[mark:] if type(ev).__name__ == "StatusUpdated"
                        and ev.state != "RUNNING"]  # nothing lost, failed or killed
            assert service.framework_id == framework_id
            state = master.state.snapshot()
            assert state["frameworks"] == {framework_id: {"connected": True,
                                                          "suppressed": state["frameworks"]
                                                          [framework_id]["suppressed"]}}
            assert {(t["task_id"], t["agent_id"], t["state"]) for t in state["tasks"]} == \
                {(t["mesos_task_id"], t["agent_id"], "TASK_RUNNING") for t in before.values()}

            after = {t["task_id"]: t for t in service.query_status("mr")["tasks"]}
            for task_id, was in before.items():
                now = after[task_id]
                assert (now["state"], now["attempt"], now["launches"], now["agent_id"]) == \
                    ("running", 1, 1, was["agent_id"])
            assert _all_pids(cluster) == pids and all(_pid_alive(p) for p in pids.values())
            launched = sorted(p.name for p in tmp_path.rglob("launched-*.json"))
            assert launched == sorted(f"launched-{m}.json" for m in mesos_ids)  # no relaunch

            assert service.stop_query("mr").accepted
            view = wait_for("query stopped", lambda: (v := service.query_status("mr"))
                            and v["phase"] == "stopped" and v)
            assert [t["state"] for t in view["tasks"]] == ["killed", "killed"]
            wait_for("the new master sees the tasks killed", lambda: {
                t["state"] for t in master.state.snapshot()["tasks"]} == {"TASK_KILLED"})
        finally:
            service.stop(failover=False)


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_framework_absent_after_master_restart_is_removed_after_its_failover_timeout(
        tmp_path: Path) -> None:
    from scheduler.testing import chain_query
    resources = {"cpus": 4, "mem": 4096, "ports": PORTS}
    with EmbeddedCluster(agents=1, resources=resources, work_dir=tmp_path, ping_interval=0.2,
                         executor_grace_seconds=1.0) as cluster:
        service = _service(cluster, failover_timeout=3.0)
        try:
            wait_for("registration", lambda: service.status()["connected"])
            framework_id = service.framework_id
            assert service.submit(chain_query("gone", 1)).accepted
            wait_for("task RUNNING", lambda: _running(service, "gone"))
            pids = _all_pids(cluster)
            assert len(pids) == 1
        finally:
            service.stop(failover=True)  # the framework leaves; its task keeps running

        master = cluster.restart_master()
        recovered = wait_for("agent re-registered with the running task", lambda: (
            s := master.state.snapshot())["tasks"] and s)
        assert recovered["frameworks"] == {framework_id: {"connected": False,
                                                          "suppressed": False}}
        assert [t["state"] for t in recovered["tasks"]] == ["TASK_RUNNING"]
        assert all(_pid_alive(p) for p in pids.values())  # kept through the restart
        wait_for("executor ended after the failover timeout",
                 lambda: not cluster.agents[0].executor_pids(), timeout=20.0)
        assert not any(_pid_alive(p) for p in pids.values())
        state = master.state.snapshot()
        assert state["frameworks"] == {} and \
            [t["state"] for t in state["tasks"]] == ["TASK_KILLED"]
