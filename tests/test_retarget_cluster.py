"""Failover and retargeting end to end on the embedded cluster: the real scheduler service
(pymesos driver) and real executor processes (`tests/fixtures/sparkless_executor.py`: the
production executor with runners that need no Spark).

A standby task starts away from its neighbours; its executor is SIGKILLed; the scheduler
relaunches it at once on the other agent (next to its neighbours) and tells the consumer's
executor, by a framework message, where the channel now is; that executor rewrites the
consumer's endpoints file on disk.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import embedded_mesos as embedded
from executor.endpoints_file import endpoints_path, read_endpoints
from scheduler.config import ExecutorSpec, SchedulerConfig
from scheduler.mesos_adapter import SchedulerService
from scheduler.testing import chain_query
from testkit.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "sparkless_executor.py"


def config(state_dir: Path) -> SchedulerConfig:
    env = (("ELASTIQ_STATE_DIR", str(state_dir)), ("PYTHONPATH", str(ROOT)))
    return SchedulerConfig(
        executor=ExecutorSpec(command=f"exec {sys.executable} {FIXTURE}", cpus=0.5, mem_mb=256,
                              environment=env),
        backoff_initial=0.2, same_agent_wait=60.0, failover_wait=30.0, offer_hold_seconds=1.0,
        decline_seconds=0.5)


def endpoints_file(state_dir: Path, task_id: str) -> Path:
    return Path(endpoints_path(str(state_dir / task_id / "checkpoint")))


def test_standby_fails_over_and_its_consumer_is_retargeted_on_disk(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    query = chain_query("rt", 3, groups=("src", "f", "sink"),
                        initially_apart=((), ("src", "sink"), ()),
                        failover=(None, "standby", None))
    with embedded.EmbeddedCluster(agents=0, work_dir=tmp_path / "cluster") as cluster:
        for ports in ("31000-31049", "32000-32049"):  # distinct ports: the endpoint must move
            cluster.add_agent({"cpus": 4, "mem": 4096, "ports": ports})
        agents = {a.agent_id: a for a in cluster.agents}
        credential = cluster.framework_credential
        service = SchedulerService(cluster.master_address, config(state_dir),
                                   tick_interval=0.1, principal=credential.principal,
                                   secret=credential.secret).start()
        try:
            assert service.submit(query).accepted

            def tasks_running(attempts: dict[str, int]) -> dict[str, Any] | None:
                view = service.query_status("rt")
                if not view or view["status"] != "running":
                    return None
                tasks = {t["task_id"]: t for t in view["tasks"]}
                ok = all(tasks[t]["attempt"] == a and tasks[t]["state"] == "running"
                         for t, a in attempts.items())
                return tasks if ok else None

            first = wait_for("all three tasks running",
                             lambda: tasks_running({"rt.t0": 1, "rt.t1": 1, "rt.t2": 1}))
            standby_agent, home = first["rt.t1"]["agent_id"], first["rt.t2"]["agent_id"]
            assert standby_agent != home == first["rt.t0"]["agent_id"]
            old = first["rt.t1"]["endpoints"]["rt/s1"]
            consumer_file = endpoints_file(state_dir, "rt.t2")
            assert read_endpoints(str(consumer_file))["rt/s1"] == old  # written at launch

            (pid,) = agents[standby_agent].executor_pids().values()
            os.kill(pid, signal.SIGKILL)

            after = wait_for("the standby running again",
                             lambda: tasks_running({"rt.t1": 2, "rt.t2": 1}), timeout=20)
            assert after["rt.t1"]["agent_id"] == home  # next to its neighbours, not back
            new = after["rt.t1"]["endpoints"]["rt/s1"]
            assert new != old and new.rsplit(":", 1)[1].startswith("310")
            wait_for("the consumer's endpoints file rewritten",
                     lambda: read_endpoints(str(consumer_file)).get("rt/s1") == new, timeout=10)
            assert after["rt.t2"]["endpoints"]["rt/s1"] == new  # the scheduler's record too
            stderr = next((tmp_path / "cluster" / agents[home].work_dir.name).rglob("stderr"))
            assert f"task rt.t2.a1: channel rt/s1 retargeted to {new}" in stderr.read_text()
            metrics = service.loop.metrics.registry.get_sample_value
            assert metrics("elastiq_channel_retargets_total", {"query": "rt"}) == 1
        finally:
            service.stop(failover=False)
