"""The scheduler alone fails over a hung executor; a loaded one is left alone.

An embedded master and agent (the agent's silence kill and self-fencing off, their defaults, as on
real Mesos), the real scheduler service, and an executor process that heartbeats with the real
executor's pulse thread (tests/fixtures/pulse_executor.py; no Spark, so the test is lean). A
SIGSTOPped executor is taken for dead by the scheduler's phi-accrual detector: its task runs again
as attempt 2 and the old process is shut down through Mesos (SHUTDOWN, SIGKILL after the grace).
Beside three CPU hogs, with a hog thread inside the executor too, the detector at its default
settings suspects nobody.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from testkit.e2e_support import compile_spec, pythonpath, wait_until

from embedded_mesos import EmbeddedCluster
from scheduler.config import ExecutorSpec, SchedulerConfig
from scheduler.liveness import DetectorSettings

FIXTURE = Path(__file__).parent / "fixtures" / "pulse_executor.py"
SPEC = "e2e-stateful-count.xml"  # one task; the fixture executor never runs it
RESOURCES = {"cpus": 4, "mem": 8192, "ports": "31000-31015"}


def config(hog: bool, detector: DetectorSettings) -> SchedulerConfig:
    executor = ExecutorSpec(command=f"exec {sys.executable} {FIXTURE}", cpus=0.1, mem_mb=64,
                            environment=(("PYTHONPATH", pythonpath()),
                                         ("PULSE_HOG", "1" if hog else "0")))
    return SchedulerConfig(executor=executor, backoff_initial=0.2, same_agent_wait=30.0,
                           offer_hold_seconds=1.0, decline_seconds=0.5, detector=detector)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(resources=RESOURCES, work_dir=tmp_path / "cluster", offer_interval=0.1,
                         ping_interval=0.2, executor_grace_seconds=1.0) as running:
        assert running.agents[0].executor_silence_after is None  # the scheduler alone acts
        yield running


def start(cluster: EmbeddedCluster, cfg: SchedulerConfig, work: Path) -> tuple[Any, str]:
    from scheduler.mesos_adapter import SchedulerService

    credential = cluster.framework_credential
    service = SchedulerService(cluster.master_address, cfg, tick_interval=0.1,
                               principal=credential.principal, secret=credential.secret).start()
    wait_until(lambda: service.status()["connected"], 20, "the scheduler to register")
    query = compile_spec(SPEC, work)
    assert service.submit(query).accepted
    return service, query.query_id


def task_view(service: Any, query_id: str) -> dict[str, Any]:
    tasks = (service.query_status(query_id) or {}).get("tasks", [])
    return tasks[0] if tasks else {}


def executor_pid(cluster: EmbeddedCluster) -> int:
    (pid,) = cluster.agents[0].executor_pids().values()
    return pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def heard(service: Any, times: int) -> bool:
    state = service.loop.state
    return any(len(a.intervals) >= times for a in state.arrivals.values())


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_hung_executor_is_failed_over_by_the_scheduler_alone(cluster: EmbeddedCluster,
                                                                tmp_path: Path) -> None:
    detector = DetectorSettings(threshold=8.0, acceptable_pause=1.0, min_std=0.2)
    service, qid = start(cluster, config(False, detector), tmp_path)
    pid = None
    try:
        wait_until(lambda: task_view(service, qid).get("state") == "running", 30,
                   "the task running", lambda: str(task_view(service, qid)))
        pid = executor_pid(cluster)
        wait_until(lambda: heard(service, 4), 20, "four heartbeats of the executor")
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_until(lambda: (t := task_view(service, qid)).get("state") == "running"
                   and t["attempt"] == 2, 40, "the task running again as attempt 2",
                   lambda: str(task_view(service, qid)))
        took = time.monotonic() - stopped
        assert "silent for" in task_view(service, qid)["last_failure"]
        wait_until(lambda: not alive(pid), 10, "the hung executor to be shut down")
        assert executor_pid(cluster) != pid  # a fresh executor runs attempt 2
        assert service.loop.state.suspicions == 1
        assert cluster.agents[0].silence_kills == 0  # the agent did nothing of its own
        assert took >= detector.acceptable_pause  # not before the pause it was allowed
    finally:
        if pid is not None and alive(pid):
            os.killpg(pid, signal.SIGKILL)
        service.stop(failover=False)


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_loaded_executor_is_not_taken_for_dead(cluster: EmbeddedCluster,
                                                 tmp_path: Path) -> None:
    detector = SchedulerConfig().detector  # the defaults
    service, qid = start(cluster, config(True, detector), tmp_path)
    hogs: list[subprocess.Popen] = []
    try:
        wait_until(lambda: task_view(service, qid).get("state") == "running", 30,
                   "the task running", lambda: str(task_view(service, qid)))
        pid = executor_pid(cluster)
        wait_until(lambda: heard(service, 4), 20, "four heartbeats of the executor")
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(3)]
        before = max(len(a.intervals) for a in service.loop.state.arrivals.values())
        time.sleep(15.0)  # a load window, not a wait for a condition: nothing must happen
        state = service.loop.state
        assert state.suspicions == 0 and state.false_suspicions == 0
        assert alive(pid) and executor_pid(cluster) == pid
        view = task_view(service, qid)
        assert (view["state"], view["attempt"]) == ("running", 1)
        heard_during = max(len(a.intervals) for a in state.arrivals.values()) - before
        assert heard_during >= 5, f"only {heard_during} heartbeats in 15 s of load"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(5)
        service.stop(failover=False)

