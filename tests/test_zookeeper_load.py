"""SIGKILL of the leading scheduler process while a real Spark query streams (issue 6).

Owns one cluster test: a real ZooKeeper (tests/zookeeper_server.py), the embedded cluster with
one in-process agent, two `python -m elastiq.cli scheduler --zk ...` processes (a leader and a
standby), and the finite stateful query tests/specs/e2e-stateful-count.xml running on a real
executor with its SparkSession. Mid-stream the leader process is SIGKILLed; the standby must
lead within 2 x the session timeout with the same framework id, the executor, its Spark JVM and
the task's query must live on untouched (same pids, attempt 1, one launch), and the file sink
must finally equal the plain-Python window oracle exactly. Does not own the idle-executor version
of this test (tests/test_zookeeper.py) nor any product behaviour.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.zookeeper_server import ZooKeeperServer, free_port, missing

if missing():
    pytest.skip(f"no ZooKeeper server: {missing()}", allow_module_level=True)

from common.api_client import RequestRejected, SchedulerClient, SchedulerUnavailable
from embedded_mesos import EmbeddedCluster
from testkit.e2e_support import (
      ROOT,
      SPECS,
      Row,
      free_port_range,
      generator_rows,
      java_child,
      kill_session,
      read_sink,
      session_members,
      source_runner_pids,
      spec_params,
      wait_for_sink,
      wait_until,
      window_oracle,
  )

pytestmark = [pytest.mark.cluster, pytest.mark.spark]
log = logging.getLogger("tests.zookeeper_load")

SPEC = "e2e-stateful-count.xml"
SESSION = 2.0  # seconds; the test server's tickTime 200 ms allows 0.4-4 s
SECOND = timedelta(seconds=1)
WINDOW = 2 * SECOND  # the spec's tumbling window
WATERMARK = timedelta(milliseconds=500)
ZK_ROOT = "/t-load"
Key = tuple[datetime, datetime, str, int]


# --- the oracle -----------------------------------------------------------------------------------

def oracle() -> tuple[Counter, dict[tuple, list[Row]]]:
    """The spec's windows computed in plain Python: a multiset of (start, end, sensor, readings)
    and the input rows of each (window start, sensor)."""
    windows = window_oracle(generator_rows(spec_params(SPEC)["src"]), "ts", ["sensor"],
                            WINDOW, WINDOW, WATERMARK)
    expected = Counter((start, start + WINDOW, sensor, len(rows))
                       for (start, sensor), rows in windows.items())
    return expected, windows


def sink_key(row: Row) -> Key:
    return (row["window_start"], row["window_end"], row["sensor"], row["readings"])


# --- processes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SchedulerProcess:
    """One `elastiq scheduler` process and where it answers."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    token: str  # the API's token, shared by every scheduler of the test

    def client(self) -> SchedulerClient:
        return SchedulerClient(self.url, timeout=3.0, token=self.token)

    def health(self) -> dict[str, Any] | None:
        """GET /healthz: {"ok", "connected", "framework_id"}, or None when nothing answers."""
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as reply:
                return json.loads(reply.read())
        except (OSError, ValueError):
            return None

    def query(self, query_id: str) -> dict[str, Any] | None:
        try:
            return self.client().status(query_id)
        except (SchedulerUnavailable, RequestRejected):  # e.g. 404 before a standby loaded it
            return None

    def log_tail(self, chars: int = 3000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- {self.name} log (tail) ---\n{text[-chars:]}"


def executor_command() -> str:
    """How the agent starts our executor: PYTHONPATH and the Spark cores go through `env`, as
    the CLI passes only ELASTIQ_STATE_DIR (from --state-dir) in the executor's environment."""
    return f"exec env PYTHONPATH={ROOT} ELASTIQ_SPARK_CORES=2 {sys.executable} -m executor"


def start_scheduler(name: str, zk: ZooKeeperServer, cluster: EmbeddedCluster,
                    work: Path) -> SchedulerProcess:
    """`elastiq scheduler` against the cluster's master, authenticating with its framework
    credential (the secret in a 0600 file, never on the command line)."""
    port = free_port()
    log_path = work / f"{name}.log"
    credential = cluster.framework_credential
    secret_file = work / f"{name}.mesos-secret"
    secret_file.touch(mode=0o600)
    secret_file.write_text(credential.secret, encoding="utf-8")
    token_file = work / "api-token"  # one token for leader and standby, as an operator sets it
    if not token_file.exists():
        token_file.write_text("zookeeper-load-test-token\n")
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "elastiq.cli", "scheduler", "--master", cluster.master_address,
             "--mesos-principal", credential.principal, "--mesos-secret-file", str(secret_file),
             "--zk", f"{zk.hosts}{ZK_ROOT}", "--zk-session-timeout", str(SESSION),
             "--listen", f"127.0.0.1:{port}", "--state-dir", str(work / name),
             "--path-root", str(work), "--executor-command", executor_command(),
             "--token-file", str(token_file)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return SchedulerProcess(name, process, f"http://127.0.0.1:{port}", log_path,
                            token_file.read_text().strip())


def end_scheduler(s: SchedulerProcess) -> None:
    """SIGTERM (the CLI stops with failover=True: the framework stays), SIGKILL after 10 s."""
    if s.process.poll() is not None:
        return
    s.process.send_signal(signal.SIGTERM)
    try:
        s.process.wait(10)
    except subprocess.TimeoutExpired:
        s.process.kill()
        s.process.wait(5)


@pytest.fixture
def zk(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path / "zk") as server:
        yield server


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    """One in-process agent with room for the executor (0.5) and the stateful task (1.0).
    Teardown stops the agent (SIGTERM to each executor's group, SIGKILL after the grace), then
    SIGKILLs any live process left in an executor session recorded under the cluster's folder
    (zombies re-parented to this container's PID 1 are not counted: nothing reaps them)."""
    low, high = free_port_range(16)
    resources = {"cpus": 2, "mem": 8192, "ports": f"{low}-{high}"}
    c = EmbeddedCluster(agents=1, resources=resources, work_dir=tmp_path / "cluster",
                        executor_grace_seconds=15.0)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        leftovers = [pid for sid in recorded_executors(c.work_dir) for pid in kill_session(sid)]
        if leftovers:
            log.warning("zk-load teardown: SIGKILLed leftover executor processes %s", leftovers)


def recorded_executors(work_dir: Path) -> set[int]:
    """Pids (= session ids) of the executors the agent recorded in its sandboxes."""
    return {int(f.read_text().strip()) for f in work_dir.rglob("executor.pid")
            if f.read_text().strip().isdigit()}


@pytest.fixture
def schedulers(zk: ZooKeeperServer, cluster: EmbeddedCluster,
               tmp_path: Path) -> Iterator[list[SchedulerProcess]]:
    """Scheduler `a` (leader, connected to the master) and then `b` (standby)."""
    started: list[SchedulerProcess] = []
    try:
        a = start_scheduler("a", zk, cluster, tmp_path)
        started.append(a)
        wait_until(lambda: (h := a.health()) and h.get("connected"), 60,
                   "scheduler a to lead and register", a.log_tail)
        b = start_scheduler("b", zk, cluster, tmp_path)
        started.append(b)
        wait_until(b.health, 60, "scheduler b to answer", b.log_tail)
        yield started
    finally:
        for s in reversed(started):
            end_scheduler(s)


# --- the pieces of the test -----------------------------------------------------------------------

def submit_copy(leader: SchedulerProcess, work: Path) -> tuple[str, Path]:
    """Copy the spec into `work` and submit it to the leader; its relative sink path resolves
    against `work`. Returns the query id and the sink's path."""
    spec = work / SPEC
    shutil.copyfile(SPECS / SPEC, spec)
    reply = leader.client().submit_spec(spec)
    return reply["query_id"], work / spec_params(SPEC)["sink"]["path"]


def wait_running(s: SchedulerProcess, query_id: str, timeout: float) -> dict[str, Any]:
    return wait_until(lambda: (q := s.query(query_id)) and q.get("status") == "running" and q,
                      timeout, f"{query_id} running under {s.name}",
                      lambda: f"{s.query(query_id)}\n{s.log_tail()}")


@dataclass(frozen=True)
class SparkProcesses:
    """The executor, its Spark JVM and the Python source runner of each of its queries."""

    executor: int
    jvm: int
    runners: tuple[int, ...]


def spark_processes(cluster: EmbeddedCluster) -> SparkProcesses | None:
    pids = list(cluster.agents[0].executor_pids().values())
    if len(pids) != 1:
        return None
    jvm = java_child(pids[0])
    runners = tuple(sorted(source_runner_pids(jvm))) if jvm else ()
    return SparkProcesses(pids[0], jvm, runners) if jvm and runners else None


def kill_leader_mid_stream(leader: SchedulerProcess, sink: Path, expected_rows: int) -> int:
    """SIGKILL the leader once the sink has windows but fewer than all of them; returns how
    many rows were out then."""
    wait_until(lambda: read_sink(sink), 120, f"first windows in {sink.name}", leader.log_tail)
    have = len(read_sink(sink))
    assert have < expected_rows, f"too late: the stream had ended ({have} rows out)"
    leader.process.send_signal(signal.SIGKILL)
    leader.process.wait(5)
    return have


def wait_takeover(standby: SchedulerProcess) -> tuple[dict[str, Any], float]:
    """The standby's /healthz once it is connected (it leads and has registered), and how long
    that took from now."""
    killed_at = time.monotonic()
    health = wait_until(lambda: (h := standby.health()) and h.get("connected") and h,
                        6 * SESSION, "the standby to take over", standby.log_tail, step=0.05)
    return health, time.monotonic() - killed_at


def assert_untouched(view: dict[str, Any]) -> None:
    for task in view["tasks"]:
        assert (task["attempt"], task["launches"], task["state"]) == (1, 1, "running"), task


def assert_totals(sink: Path, windows: dict[tuple, list[Row]]) -> None:
    for row in read_sink(sink):
        temps = [r["temp"] for r in windows[(row["window_start"], row["sensor"])]]
        assert row["total_temp"] == pytest.approx(sum(temps), rel=1e-12), row


# --- the test -------------------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_sigkill_of_the_leader_under_spark_load_keeps_the_query_and_the_sink_exact(
        cluster: EmbeddedCluster, schedulers: list[SchedulerProcess], tmp_path: Path) -> None:
    leader, standby = schedulers
    expected, windows = oracle()
    framework_id = leader.health()["framework_id"]
    assert framework_id, leader.log_tail()
    assert not standby.health().get("connected"), "the standby must not talk to the master"

    query_id, sink = submit_copy(leader, tmp_path)
    before = wait_running(leader, query_id, 90)
    assert before["sinks"] == {"sink": str(sink)}
    assert_untouched(before)
    spark = wait_until(lambda: spark_processes(cluster), 90,
                       "the executor's Spark JVM and the query's source runner")

    out_at_kill = kill_leader_mid_stream(leader, sink, sum(expected.values()))
    health, handover = wait_takeover(standby)
    log.info("zk-load %s: %s of %s rows out at the kill; %s took over in %.2f s", query_id,
             out_at_kill, sum(expected.values()), standby.name, handover)
    assert handover <= 2 * SESSION, f"takeover took {handover:.2f} s\n{standby.log_tail()}"
    assert health["framework_id"] == framework_id

    assert_untouched(wait_running(standby, query_id, 10))
    wait_for_sink(sink, expected, sink_key, 120, "the windows after the handover")
    assert_totals(sink, windows)
    assert spark_processes(cluster) == spark, "the executor or its Spark query was restarted"
    assert_untouched(wait_running(standby, query_id, 5))
    assert session_members(spark.executor), "the executor's session is gone"
