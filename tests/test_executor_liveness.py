"""The embedded agent kills an executor that has gone silent with live tasks.

Unit tests of the decision (`should_kill_silent_executor`) and its setting
(`resolve_silence_seconds`), and two cluster tests with an in-process embedded master and agent,
an unmodified pymesos scheduler driver and a real executor process that heartbeats every 0.5 s
(tests/fixtures/heartbeat_executor.py): SIGSTOPped, it is SIGKILLed by the agent once silent for
`executor_silence_after` and its task reaches the scheduler as TASK_FAILED /
REASON_EXECUTOR_TERMINATED naming the silence; left alone, it is not killed over three times that.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pymesos.process
import pytest
from pymesos import MesosSchedulerDriver, decode_data

from embedded_mesos import EmbeddedCluster
from test_embedded_cluster import Recorder
from embedded_mesos.agent import (
    DEFAULT_EXECUTOR_SILENCE_SECONDS,
    SILENCE_ENV,
    resolve_silence_seconds,
    should_kill_silent_executor,
)
from testkit.waiting import wait_for

FIXTURE = Path(__file__).parent / "fixtures" / "heartbeat_executor.py"
RESOURCES = {"cpus": 2, "mem": 1024, "ports": "31000-31999"}
SILENCE = 2.0  # the agent's executor_silence_after in the cluster tests
WAIT = 15.0


# --- the decision (pure) --------------------------------------------------------------------------

class TestShouldKillSilentExecutor:
    def test_kills_a_subscribed_busy_executor_silent_for_the_limit(self) -> None:
        assert should_kill_silent_executor(last_heard=10.0, busy_since=5.0, now=12.0,
                                           silence_after=2.0)
        assert should_kill_silent_executor(10.0, 5.0, 30.0, 2.0)

    def test_not_when_heard_recently(self) -> None:
        assert not should_kill_silent_executor(10.0, 5.0, 11.9, 2.0)

    def test_not_without_live_tasks(self) -> None:
        assert not should_kill_silent_executor(10.0, None, 100.0, 2.0)

    def test_not_before_it_subscribed(self) -> None:
        assert not should_kill_silent_executor(None, 5.0, 100.0, 2.0)

    def test_not_when_off(self) -> None:
        assert not should_kill_silent_executor(10.0, 5.0, 100.0, None)

    def test_an_idle_executor_given_a_task_gets_the_full_time(self) -> None:
        """Silent while it had nothing to do, then given a task at 50: counted from 50."""
        assert not should_kill_silent_executor(10.0, 50.0, 51.9, 2.0)
        assert should_kill_silent_executor(10.0, 50.0, 52.0, 2.0)


class TestResolveSilenceSeconds:
    def test_default_is_off_as_on_a_real_mesos_agent(self) -> None:
        assert resolve_silence_seconds("auto", {}) is None  # the scheduler's detector acts
        on = {SILENCE_ENV: str(DEFAULT_EXECUTOR_SILENCE_SECONDS)}  # how an operator opts in
        assert resolve_silence_seconds("auto", on) == DEFAULT_EXECUTOR_SILENCE_SECONDS == 30.0

    def test_environment_overrides_the_default(self) -> None:
        assert resolve_silence_seconds("auto", {SILENCE_ENV: "off"}) is None
        assert resolve_silence_seconds("auto", {SILENCE_ENV: "0"}) is None
        assert resolve_silence_seconds("auto", {SILENCE_ENV: " 2.5 "}) == 2.5

    def test_explicit_argument_wins(self) -> None:
        assert resolve_silence_seconds(None, {SILENCE_ENV: "3"}) is None
        assert resolve_silence_seconds(4.0, {SILENCE_ENV: "off"}) == 4.0

    def test_bad_values_are_refused_with_the_name(self) -> None:
        with pytest.raises(ValueError, match=SILENCE_ENV):
            resolve_silence_seconds("auto", {SILENCE_ENV: "soon"})
        with pytest.raises(ValueError, match=SILENCE_ENV):
            resolve_silence_seconds("auto", {SILENCE_ENV: "-1"})
        with pytest.raises(ValueError, match="executor_silence_after"):
            resolve_silence_seconds(-1.0, {})


# --- the cluster ----------------------------------------------------------------------------------

def of_kind(recorder: Recorder, kind: str) -> list[Any]:
    with recorder._cond:
        return [payload for k, payload in recorder.events if k == kind]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(resources=RESOURCES, work_dir=tmp_path / "cluster", offer_interval=0.05,
                         ping_interval=0.2, executor_grace_seconds=1.0,
                         executor_silence_after=SILENCE) as running:
        yield running


@pytest.fixture
def scheduler(cluster: EmbeddedCluster) -> Iterator[tuple[Recorder, MesosSchedulerDriver]]:
    recorder = Recorder()
    credential = cluster.framework_credential
    driver = MesosSchedulerDriver(recorder, {"user": "", "name": "liveness-test",
                                             "failover_timeout": 60.0}, cluster.master_address,
                                  principal=credential.principal, secret=credential.secret)
    driver.start()
    try:
        recorder.wait_for("registered")
        yield recorder, driver
    finally:
        driver.stop()
        driver.join()
    assert pymesos.process._exc_info is None, "a pymesos driver thread failed"


def launch_running(recorder: Recorder, driver: MesosSchedulerDriver, task_id: str) -> None:
    offer = recorder.wait_for("offer")
    command = {"value": sys.executable, "shell": False,
               "arguments": [sys.executable, str(FIXTURE)]}
    task = {"task_id": {"value": task_id}, "name": task_id, "agent_id": offer["agent_id"],
            "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.5}},
                          {"name": "mem", "type": "SCALAR", "scalar": {"value": 64}}],
            "executor": {"executor_id": {"value": "beater"}, "command": command}}
    driver.launchTasks([offer["id"]], [task], filters={"refuse_seconds": 0})
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == task_id
                      and s["state"] == "TASK_RUNNING")


def executor_pid(cluster: EmbeddedCluster) -> int:
    (pid,) = cluster.agents[0].executor_pids().values()
    return pid


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def beats_from(recorder: Recorder, pid: int) -> int:
    return sum(1 for _, _, data in of_kind(recorder, "message")
               if decode_data(data).decode().startswith(f"beat:{pid}:"))


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_stopped_executor_is_killed_and_its_task_fails_naming_the_silence(cluster, scheduler):
    recorder, driver = scheduler
    launch_running(recorder, driver, "hung1")
    pid = executor_pid(cluster)
    wait_for("two heartbeats", lambda: beats_from(recorder, pid) >= 2, WAIT, 0.05)  # it does
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        failed = recorder.wait_for("update", lambda s: s["task_id"]["value"] == "hung1"
                                   and s["state"] == "TASK_FAILED", timeout=SILENCE + 8.0)
        took = time.monotonic() - stopped_at
        assert failed["reason"] == "REASON_EXECUTOR_TERMINATED"
        assert failed["source"] == "SOURCE_AGENT"
        assert "silent for" in failed["message"] and "killed by agent" in failed["message"]
        assert took >= SILENCE - 0.6  # its last beat came at most 0.5 s before the stop
        wait_for("the executor to exit", lambda: not pid_alive(pid), 5.0, 0.05)
        lost = recorder.wait_for("executor_lost")
        assert (lost[0], lost[2]) == ("beater", signal.SIGKILL)
        assert cluster.agents[0].silence_kills == 1
        assert cluster.agents[0].executor_pids() == {}
    finally:
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_heartbeating_executor_is_left_alone(cluster, scheduler):
    recorder, driver = scheduler
    launch_running(recorder, driver, "alive1")
    pid = executor_pid(cluster)
    time.sleep(3 * SILENCE)
    assert pid_alive(pid)
    assert executor_pid(cluster) == pid
    assert beats_from(recorder, pid) >= 3 * SILENCE / 0.5 / 2  # it kept beating meanwhile
    assert [s["state"] for s in of_kind(recorder, "update")
            if s["task_id"]["value"] == "alive1"] == ["TASK_RUNNING"]
    assert cluster.agents[0].silence_kills == 0
