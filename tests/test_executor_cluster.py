"""End to end: a compiled task on the real executor (`python -m executor`) under the embedded
cluster, driven by a tiny pymesos scheduler written here.

Real sockets on 127.0.0.1, a real executor process with its own SparkSession, a real kill and a
real shutdown. The sink is checked against the input file read in plain Python (x < 42).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from pymesos import MesosSchedulerDriver, Scheduler

from compiler.pipeline import compile_spec_file
from embedded_mesos import EmbeddedCluster
from testkit.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(150)]
ROOT = Path(__file__).resolve().parents[1]
EXECUTOR_ID = "elastiq-exec-e2e"


class OneTaskScheduler(Scheduler):
    """Launches one task on the first offer, declines the rest, records what comes back."""

    def __init__(self, task_id: str, data: str, environment: dict[str, str]) -> None:
        self.task_id, self.data, self.environment = task_id, data, environment
        self.launched = False
        self.updates: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def resourceOffers(self, driver: Any, offers: list[dict[str, Any]]) -> None:  # noqa: N802
        for offer in offers:
            if self.launched:
                driver.declineOffer(offer["id"])
                continue
            self.launched = True
            driver.launchTasks(offer["id"], [self._task_info(offer)])

    def _task_info(self, offer: dict[str, Any]) -> dict[str, Any]:
        env = [{"name": k, "value": v} for k, v in self.environment.items()]
        scalar = lambda n, v: {"name": n, "type": "SCALAR", "scalar": {"value": v}}  # noqa: E731
        return {
            "task_id": {"value": self.task_id}, "name": self.task_id,
            "agent_id": offer["agent_id"],
            "resources": [scalar("cpus", 0.5), scalar("mem", 256.0)],
            "executor": {"executor_id": {"value": EXECUTOR_ID},
                         "command": {"value": f"exec {sys.executable} -m executor",
                                     "shell": True,
                                     "environment": {"variables": env}},
                         "resources": [scalar("cpus", 0.5), scalar("mem", 1024.0)]},
            "data": self.data,
        }

    def statusUpdate(self, driver: Any, status: dict[str, Any]) -> None:  # noqa: N802
        with self._cond:
            self.updates.append(status)
            self._cond.notify_all()

    def frameworkMessage(self, driver: Any, executor_id: Any, agent_id: Any,  # noqa: N802
                         message: str) -> None:
        with self._cond:
            self.messages.append(json.loads(base64.b64decode(message)))
            self._cond.notify_all()

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not check():
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(u["state"], u.get("message")) for u in self.updates]
                    raise AssertionError(f"no {what} within {timeout} s; updates: {seen}")
                self._cond.wait(min(left, 0.5))

    def states(self) -> list[str]:
        return [u["state"] for u in self.updates]


def oracle(input_path: Path) -> Counter:
    """The filter's expected output from the input file, in plain Python."""
    rows = [json.loads(line) for line in input_path.read_text().splitlines() if line.strip()]
    return Counter((r["x"], _instant(r["ts"])) for r in rows if r["x"] < 42)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def sink_rows(path: Path) -> Counter:
    if not path.exists():
        return Counter()
    lines = path.read_text().splitlines()
    return Counter((r["x"], _instant(r["ts"])) for r in map(json.loads, lines))


def session_members(sid: int) -> set[int]:
    """Pids whose session id is `sid` (the executor runs in its own session)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:  # fields after "comm": state ppid pgrp sid
            found.add(int(entry))
    return found


def encode(payload: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(payload).encode()).decode()


def environment(workspace: Path) -> dict[str, str]:
    return {"ELASTIQ_STATE_DIR": str(workspace / "state"), "ELASTIQ_SPARK_CORES": "2",
            "PYTHONPATH": str(ROOT)}


def start_driver(scheduler: Scheduler, cluster: EmbeddedCluster) -> MesosSchedulerDriver:
    credential = cluster.framework_credential
    driver = MesosSchedulerDriver(scheduler, {"user": "", "name": "executor-e2e"},
                                  cluster.master_address, use_addict=False,
                                  principal=credential.principal, secret=credential.secret)
    driver.start()
    return driver


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "examples" / "data" / "numbers.jsonl", tmp_path / "data" / "numbers.jsonl")
    return tmp_path


@pytest.fixture
def cluster(workspace: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(agents=1, work_dir=workspace / "cluster",
                         resources={"cpus": 2, "mem": 4096, "ports": "31000-31999"},
                         executor_grace_seconds=20.0) as running:
        yield running


def test_compiled_task_runs_reports_and_is_killed(workspace: Path,
                                                  cluster: EmbeddedCluster) -> None:
    compiled = compile_spec_file(ROOT / "examples" / "paper-filter.xml", base_dir=workspace)
    (task,) = compiled.query.tasks
    sink = Path(next(iter(compiled.query.sinks.values())))
    expected = oracle(workspace / "data" / "numbers.jsonl")
    assert sink.is_relative_to(workspace) and 0 < sum(expected.values()) < 2000
    mesos_task_id = f"{task.task_id}.a1"
    scheduler = OneTaskScheduler(
        mesos_task_id, encode({"task": task.to_json(), "endpoints": {}, "attempt": 1}),
        environment(workspace))
    driver = start_driver(scheduler, cluster)
    try:
        scheduler.wait("TASK_RUNNING", lambda: "TASK_RUNNING" in scheduler.states(), 60)
        assert scheduler.states()[:2] == ["TASK_STARTING", "TASK_RUNNING"]
        assert (workspace / "state" / task.task_id / "program.py").read_text() == task.program
        (pid,) = cluster.agents[0].executor_pids().values()
        wait_for("the sink's rows", lambda: sink_rows(sink) == expected, 60, 0.2, lambda: (
            f"sink has {sum(sink_rows(sink).values())} rows, expected {sum(expected.values())}"))
        scheduler.wait("a heartbeat with output", lambda: any(
            m["tasks"].get(mesos_task_id, {}).get("tuples_out", 0) > 0
            for m in scheduler.messages), 10)
        beat = next(m for m in scheduler.messages if m["tasks"].get(mesos_task_id))
        assert beat["kind"] == "heartbeat" and beat["executor_id"] == EXECUTOR_ID
        assert (workspace / "state" / task.task_id / "checkpoint" / "spark").is_dir()

        driver.killTask({"value": mesos_task_id})
        scheduler.wait("TASK_KILLED", lambda: "TASK_KILLED" in scheduler.states(), 30)
        assert scheduler.states()[-1] == "TASK_KILLED"
        members = session_members(pid)
        assert pid in members and len(members) > 1  # the executor and its JVM at least
    finally:
        driver.stop()  # TEARDOWN -> the agent sends SHUTDOWN to the executor
        driver.join()
    wait_for("the executor's session to end", lambda: not session_members(pid), 15, 0.2,
             lambda: f"processes left in the executor's session: {session_members(pid)}")
    stderr = next((workspace / "cluster").rglob("stderr")).read_text()
    assert "shutting down (the agent asked to shut down)" in stderr
    assert f"executor {EXECUTOR_ID}: exit 0" in stderr
    assert sink_rows(sink) == expected  # nothing written twice on the way out


@pytest.mark.timeout(60)
def test_bad_task_fails_clearly_and_sigterm_ends_the_executor(workspace: Path,
                                                              cluster: EmbeddedCluster) -> None:
    """No Spark needed: garbage task data gives TASK_FAILED naming the problem, the executor
    keeps heartbeating, and SIGTERM makes it exit 0 on its own."""
    scheduler = OneTaskScheduler("bad.t0.a1", base64.b64encode(b"not json").decode(),
                                 environment(workspace))
    driver = start_driver(scheduler, cluster)
    try:
        scheduler.wait("TASK_FAILED", lambda: "TASK_FAILED" in scheduler.states(), 30)
        failed = scheduler.updates[-1]
        assert "not base64 of JSON" in failed["message"]
        assert failed.get("reason") == "REASON_TASK_INVALID"
        scheduler.wait("a heartbeat", lambda: bool(scheduler.messages), 10)
        assert scheduler.messages[-1]["tasks"] == {}
        (pid,) = cluster.agents[0].executor_pids().values()
        os.kill(pid, signal.SIGTERM)
        wait_for("the executor's session to end", lambda: not session_members(pid), 15, 0.2)
    finally:
        driver.stop()
        driver.join()
    stderr = next((workspace / "cluster").rglob("stderr")).read_text()
    assert "shutting down (SIGTERM)" in stderr
    assert f"executor {EXECUTOR_ID}: exit 0" in stderr
    assert "Traceback" not in stderr
