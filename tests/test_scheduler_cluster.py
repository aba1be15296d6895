"""The scheduler end to end through the real pymesos driver against the embedded cluster:
submit -> launch (with ports and endpoints) -> RUNNING, a failed first attempt restarted on the
same agent, heartbeats, and kill on stop. Executors are real processes
(tests/fixtures/scheduler_idle_executor.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import embedded_mesos as embedded  # noqa: E402

from scheduler.config import ExecutorSpec, SchedulerConfig  # noqa: E402
from scheduler.mesos_adapter import SchedulerService  # noqa: E402
from scheduler.testing import chain_query  # noqa: E402
from testkit.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.cluster
FIXTURE = Path(__file__).parent / "fixtures" / "scheduler_idle_executor.py"
PORTS = (31000, 31099)


def config() -> SchedulerConfig:
    return SchedulerConfig(
        executor=ExecutorSpec(command=f"{sys.executable} {FIXTURE}", cpus=0.5, mem_mb=256),
        backoff_initial=0.2, same_agent_wait=10.0, offer_hold_seconds=1.0,
        decline_seconds=0.5)


def scheduler_service(cluster: embedded.EmbeddedCluster) -> SchedulerService:
    """A started scheduler, authenticated to the cluster's master with its credential."""
    credential = cluster.framework_credential
    return SchedulerService(cluster.master_address, config(), tick_interval=0.1,
                            principal=credential.principal, secret=credential.secret).start()


def test_submit_runs_restarts_on_same_agent_and_stop_kills(tmp_path: Path) -> None:
    query = chain_query("it", 2)
    t0 = replace(query.tasks[0], program="# fail-first-attempt\n")
    query = replace(query, tasks=(t0, query.tasks[1]))
    resources = {"cpus": 4, "mem": 4096, "ports": f"{PORTS[0]}-{PORTS[1]}"}
    with embedded.EmbeddedCluster(agents=2, resources=resources, work_dir=tmp_path) as cluster:
        service = scheduler_service(cluster)
        try:
            wait_for("registration", lambda: service.status()["connected"])
            reply = service.submit(query)
            assert reply.accepted, reply.message

            def all_running() -> dict[str, Any] | None:
                view = service.query_status("it")
                return view if view and view["status"] == "running" else None

            view = wait_for("both tasks RUNNING", all_running)
            tasks = {t["task_id"]: t for t in view["tasks"]}
            t0v, t1v = tasks["it.t0"], tasks["it.t1"]
            # attempt 1 of it.t0 failed on purpose; attempt 2 runs on the same agent
            assert (t0v["attempt"], t0v["launches"], t1v["attempt"]) == (2, 2, 1)
            assert "failing attempt 1 on purpose" in t0v["last_failure"]
            assert t0v["agent_id"] == t1v["agent_id"]  # first fit: one agent has room for both
            check_launch_data(tmp_path, t0v, t1v)
            wait_for("heartbeat figures", lambda: service.query_status("it")["tasks"][0]
                     ["figures"].get("beats", 0) > 0)
            assert service.query_status("it")["tasks"][0]["figures"]["attempt"] == 2.0

            assert service.stop_query("it").accepted
            view = wait_for("query stopped", lambda: (v := service.query_status("it"))
                            and v["phase"] == "stopped" and v)
            assert [t["state"] for t in view["tasks"]] == ["killed", "killed"]
        finally:
            service.stop(failover=False)


def check_launch_data(work_dir: Path, t0v: dict[str, Any], t1v: dict[str, Any]) -> None:
    """What the executors received: our task JSON, its attempt, and matching endpoints."""
    files = {p.name: json.loads(p.read_text()) for p in work_dir.rglob("launched-*.json")}
    assert set(files) == {"launched-it.t0.a1.json", "launched-it.t0.a2.json",
                          "launched-it.t1.a1.json"}
    d0, d1 = files["launched-it.t0.a2.json"], files["launched-it.t1.a1.json"]
    assert d0["attempt"] == 2 and d0["task"]["task_id"] == "it.t0"
    endpoint = d0["endpoints"]["it/s0"]
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    assert PORTS[0] <= int(port) <= PORTS[1]
    assert d1["endpoints"] == {"it/s0": endpoint} == t1v["endpoints"]
    assert t0v["endpoints"] == {"it/s0": endpoint}


def test_tasks_of_a_sigkilled_agent_restart_on_another_agent(tmp_path: Path) -> None:
    resources = {"cpus": 4, "mem": 4096, "ports": f"{PORTS[0]}-{PORTS[1]}"}
    with embedded.EmbeddedCluster(agents=0, resources=resources, work_dir=tmp_path,
                                  agent_timeout=1.5) as cluster:
        doomed = cluster.start_agent_process()
        service = scheduler_service(cluster)
        try:
            assert service.submit(chain_query("fk", 2)).accepted

            def running_on(agent: str) -> bool:
                view = service.query_status("fk")
                return bool(view) and view["status"] == "running" and all(
                    t["agent_id"] == agent for t in view["tasks"])

            wait_for("tasks RUNNING on the agent process", lambda: running_on(doomed.agent_id))
            survivor = cluster.add_agent()
            doomed.kill()  # SIGKILL
            view = wait_for("tasks RUNNING again on the other agent",
                            lambda: running_on(survivor.agent_id) and service.query_status("fk"))
            assert [t["attempt"] for t in view["tasks"]] == [2, 2]
            assert all(f"agent {doomed.agent_id} lost" in t["last_failure"]
                       for t in view["tasks"])
        finally:
            service.stop(failover=False)
