"""The executor's I/O shell with a recording driver and stand-in runners (our own logic only),
plus the `python -m executor` entry point run as a real process."""

from __future__ import annotations

import base64
import json
import os
import resource
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pytest

from executor.mesos_executor import (ElastiqExecutor, ExecutorConfig, ExecutorLoop,
                                     NotStartedByAgent, RunnerPool, config_from_env)
from testkit.waiting import poll

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Status:
    state: str
    reason: str = ""
    restarts: int = 0


@dataclass(frozen=True)
class Metrics:
    tuples_in: int = 5
    tuples_out: int = 3
    batches: int = 2
    batch_ms: int = 120
    backlog: int = 0
    latency_ms: int = 120
    busy_ms: int = 240
    running_ms: int = 700


class StandInRunner:
    def __init__(self, program: Path, kwargs: Mapping[str, Any]) -> None:
        self.program, self.kwargs = program, kwargs
        self.state = "starting"
        self.stopped = False
        if "FAIL_TO_LOAD" in program.read_text():
            raise ImportError("program has no build(rt) function")

    def start(self) -> None:
        self.state = "running"

    def status(self) -> Status:
        return Status(self.state)

    def metrics(self) -> Metrics:
        return Metrics()

    def stop(self, timeout: float = 30.0) -> None:
        self.stopped, self.state = True, "finished"


class RecordingDriver:
    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def sendStatusUpdate(self, status: dict[str, Any]) -> None:
        with self.lock:
            self.statuses.append(status)

    def sendFrameworkMessage(self, data: str) -> None:
        with self.lock:
            self.messages.append(json.loads(base64.b64decode(data)))

    def states_of(self, mesos_task_id: str) -> list[str]:
        with self.lock:
            return [s["state"] for s in self.statuses if s["task_id"]["value"] == mesos_task_id]


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.config = ExecutorConfig("exec-1", tmp / "state", 1, heartbeat_seconds=0.2,
                                     poll_seconds=0.05)
        self.driver = RecordingDriver()
        self.runners: list[StandInRunner] = []
        self.sessions: list[object] = []
        self.hub_closed = threading.Event()
        self.loop = ExecutorLoop(self.config, self.driver, self._pool)
        self.callbacks = ElastiqExecutor(self.loop.events.put)
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(self.loop.run()))

    def _pool(self, config: ExecutorConfig, report: Callable[[Any], None]) -> RunnerPool:
        def runner(session: object, program: Path, kwargs: Mapping[str, Any]) -> StandInRunner:
            assert session is self.sessions[0]
            made = StandInRunner(program, kwargs)
            self.runners.append(made)
            return made

        def session(_: ExecutorConfig) -> object:
            fake = type("Session", (), {"stop": lambda self: None})()
            self.sessions.append(fake)
            return fake

        hub = type("Hub", (), {"close": lambda _self: self.hub_closed.set()})
        return RunnerPool(config, report, runner, session, hub)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    h.thread.start()
    h.callbacks.registered(None, {"executor_id": {"value": "exec-1"}}, {},
                           {"id": {"value": "agent-1"}})
    yield h
    if h.thread.is_alive():
        h.callbacks.shutdown(None)
        h.thread.join(10)


def task_info(task_id: str, attempt: int, program: str = "def build(rt):\n    pass\n") -> dict:
    task = {"query_id": "q", "task_id": task_id, "kind": "spark", "operators": ["a"],
            "inputs": [], "outputs": [], "stateful": False,
            "resources": {"cpus": 0.5, "mem_mb": 256, "ports": 0}, "program": program}
    data = {"task": task, "endpoints": {"q/x": "tcp://127.0.0.1:7000"}, "attempt": attempt}
    return {"task_id": {"value": f"{task_id}.a{attempt}"},
            "data": base64.b64encode(json.dumps(data).encode()).decode()}


def test_launch_run_heartbeat_kill(harness: Harness) -> None:
    harness.callbacks.launchTask(None, task_info("q.t0", 1))
    assert poll(lambda: "TASK_RUNNING" in harness.driver.states_of("q.t0.a1"), 5.0, 0.02)
    runner = harness.runners[0]
    task_dir = harness.config.state_dir / "q.t0"
    assert runner.program == task_dir / "program.py" and runner.program.is_file()
    assert runner.kwargs["checkpoint_dir"] == str(task_dir / "checkpoint")
    assert runner.kwargs["endpoints"] == {"q/x": "tcp://127.0.0.1:7000"}
    assert (runner.kwargs["query_id"], runner.kwargs["task_id"]) == ("q", "q.t0")
    assert runner.kwargs["trigger_seconds"] == 0.0  # the executor's ELASTIQ_MIN_BATCH_INTERVAL
    # a heartbeat that carries the runner's figures: one sent while the task was still
    # starting carries zeros (seen under CI's load), so wait for the first with rows in it
    assert poll(lambda: any(m["tasks"].get("q.t0.a1", {}).get("tuples_out")
                            for m in harness.driver.messages), 30.0, 0.02)
    beat = [m for m in harness.driver.messages
            if m["tasks"].get("q.t0.a1", {}).get("tuples_out")][0]
    assert beat["kind"] == "heartbeat" and beat["executor_id"] == "exec-1"
    assert beat["tasks"]["q.t0.a1"]["tuples_out"] == 3
    assert beat["tasks"]["q.t0.a1"]["busy_ms"] == 240
    assert beat["tasks"]["q.t0.a1"]["running_ms"] == 700
    assert beat["tasks"]["q.t0.a1"]["state"] == "running"
    harness.callbacks.killTask(None, {"value": "q.t0.a1"})
    assert poll(lambda: "TASK_KILLED" in harness.driver.states_of("q.t0.a1"), 5.0, 0.02)
    assert runner.stopped
    assert harness.driver.states_of("q.t0.a1") == ["TASK_STARTING", "TASK_RUNNING", "TASK_KILLED"]
    status = harness.driver.statuses[0]
    assert status["executor_id"] == {"value": "exec-1"} and status["agent_id"] == {
        "value": "agent-1"}


def test_second_attempt_reuses_the_checkpoint_folder_and_one_session(harness: Harness) -> None:
    harness.callbacks.launchTask(None, task_info("q.t0", 1))
    harness.callbacks.launchTask(None, task_info("q.t0", 2))
    assert poll(lambda: "TASK_RUNNING" in harness.driver.states_of("q.t0.a2"), 5.0, 0.02)
    assert harness.driver.states_of("q.t0.a1")[-1] == "TASK_KILLED"
    first, second = harness.runners
    assert first.stopped and not second.stopped
    assert first.kwargs["checkpoint_dir"] == second.kwargs["checkpoint_dir"]
    assert len(harness.sessions) == 1


def test_program_that_fails_to_load_gives_task_failed(harness: Harness) -> None:
    harness.callbacks.launchTask(None, task_info("q.t1", 1, program="FAIL_TO_LOAD = 1\n"))
    assert poll(lambda: "TASK_FAILED" in harness.driver.states_of("q.t1.a1"), 5.0, 0.02)
    failed = [s for s in harness.driver.statuses if s["state"] == "TASK_FAILED"][0]
    assert "no build(rt) function" in failed["message"]
    assert failed["reason"] == "REASON_TASK_INVALID"
    harness.callbacks.launchTask(None, task_info("q.t2", 1))  # the executor carries on
    assert poll(lambda: "TASK_RUNNING" in harness.driver.states_of("q.t2.a1"), 5.0, 0.02)


def test_garbage_task_data_gives_task_failed(harness: Harness) -> None:
    harness.callbacks.launchTask(None, {"task_id": {"value": "bad.a1"}, "data": "!!"})
    assert poll(lambda: "TASK_FAILED" in harness.driver.states_of("bad.a1"), 5.0, 0.02)
    assert harness.runners == []


def test_shutdown_stops_runners_session_and_hub_and_exits_zero(harness: Harness) -> None:
    harness.callbacks.launchTask(None, task_info("q.t0", 1))
    assert poll(lambda: "TASK_RUNNING" in harness.driver.states_of("q.t0.a1"), 5.0, 0.02)
    harness.callbacks.shutdown(None)
    harness.thread.join(10)
    assert harness.result == [0]
    assert harness.runners[0].stopped and harness.hub_closed.is_set()


# --- configuration and the entry point --------------------------------------------------------

AGENT_ENV = {"MESOS_AGENT_ENDPOINT": "127.0.0.1:1", "MESOS_FRAMEWORK_ID": "f",
             "MESOS_EXECUTOR_ID": "e"}


def test_config_defaults_to_the_sandbox(tmp_path: Path) -> None:
    config = config_from_env({**AGENT_ENV, "MESOS_SANDBOX": str(tmp_path)})
    assert config.state_dir == tmp_path / "state" and config.spark_cores == 2
    config = config_from_env({**AGENT_ENV, "ELASTIQ_STATE_DIR": str(tmp_path / "s"),
                              "ELASTIQ_SPARK_CORES": "3"})
    assert config.state_dir == tmp_path / "s" and config.spark_cores == 3
    assert not config.prewarm  # only when asked: `elastiq run` and `elastiq scheduler` ask
    assert config_from_env({**AGENT_ENV, "MESOS_SANDBOX": str(tmp_path),
                            "ELASTIQ_PREWARM": "1"}).prewarm
    assert config.min_batch_seconds == 0.0  # back to back unless the operator bounds it
    assert config_from_env({**AGENT_ENV, "MESOS_SANDBOX": str(tmp_path),
                            "ELASTIQ_MIN_BATCH_INTERVAL": "0.25"}).min_batch_seconds == 0.25


@pytest.mark.parametrize("env, message", [
    ({}, "missing environment"),
    ({**AGENT_ENV, "MESOS_SANDBOX": "/x", "ELASTIQ_SPARK_CORES": "two"}, "positive integer"),
    ({**AGENT_ENV}, "ELASTIQ_STATE_DIR"),
    *[({**AGENT_ENV, "MESOS_SANDBOX": "/x", "ELASTIQ_MIN_BATCH_INTERVAL": bad},
       "ELASTIQ_MIN_BATCH_INTERVAL must be a number of seconds from 0 to 10")
      for bad in ("fast", "-1", "11", "nan", "inf", "")],
])
def test_config_errors_are_clear(env: dict[str, str], message: str) -> None:
    with pytest.raises((NotStartedByAgent, ValueError), match=message):
        config_from_env(env)


def run_module(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MESOS_", "ELASTIQ_"))}
    return subprocess.run([sys.executable, "-m", "executor"], env={**clean, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_started_by_hand_says_so() -> None:
    done = run_module({})
    assert done.returncode == 2
    assert "this is a Mesos executor; it is started by an agent, not by hand" in done.stderr


def test_bad_cores_setting_exits_2_with_the_setting_named(tmp_path: Path) -> None:
    done = run_module({**AGENT_ENV, "ELASTIQ_STATE_DIR": str(tmp_path),
                       "ELASTIQ_SPARK_CORES": "0"})
    assert done.returncode == 2 and "ELASTIQ_SPARK_CORES" in done.stderr


@pytest.mark.parametrize("soft, hard, target", [
    (1024, 4096, 4096), (1024, 1024, 1024), (4096, 1024, 4096),
    (1024, resource.RLIM_INFINITY, 1 << 20), (1 << 21, resource.RLIM_INFINITY, 1 << 21),
    (resource.RLIM_INFINITY, resource.RLIM_INFINITY, resource.RLIM_INFINITY),
])
def test_the_executor_lifts_its_open_files_limit_to_the_hard_limit(soft: int, hard: int,
                                                                    target: int) -> None:
    """30 task queries hold ~640 descriptors in the JVM: a soft limit of 1024 would stop a
    machine at ~45 tasks, so the executor asks for what the hard limit allows."""
    from executor.__main__ import open_files_target

    assert open_files_target(soft, hard) == target


def test_the_executor_process_runs_with_the_raised_limit_in_its_children(tmp_path: Path) -> None:
    """A real child of a process that lowered its soft limit gets the hard one back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard open-files limit ({hard}) leaves nothing to raise")
    code = ("import resource, subprocess, sys; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit("
            "resource.RLIMIT_NOFILE)[1])); "
            "from executor.__main__ import _raise_open_files_limit; _raise_open_files_limit(); "
            "print(subprocess.run(['sh', '-c', 'ulimit -n'], capture_output=True, "
            "text=True).stdout.strip())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    from executor.__main__ import open_files_target

    expected = open_files_target(256, hard)
    assert out.stdout.strip() == ("unlimited" if expected == resource.RLIM_INFINITY
                                  else str(expected))


def test_a_prewarmed_session_is_built_before_any_task_and_used_by_the_first(
        harness: Harness) -> None:
    harness.loop.pool.prewarm()
    assert poll(lambda: len(harness.sessions) == 1, 5.0, 0.02)  # no task launched yet
    assert harness.runners == []
    harness.callbacks.launchTask(None, task_info("q.t0", 1))
    assert poll(lambda: len(harness.runners) == 1, 5.0, 0.02)
    assert len(harness.sessions) == 1  # the runner asserts it got this very session
    harness.loop.pool.prewarm()  # a second prewarm builds nothing
    harness.callbacks.launchTask(None, task_info("q.t1", 1))
    assert poll(lambda: len(harness.runners) == 2, 5.0, 0.02)
    assert len(harness.sessions) == 1
