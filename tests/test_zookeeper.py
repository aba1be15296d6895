"""Leadership, fencing and the registry against a REAL ZooKeeper (Debian's package) and the
embedded Mesos cluster with real executor processes (tests/fixtures/scheduler_idle_executor.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.zookeeper_server import ZooKeeperServer, free_port, missing

if missing():
    pytest.skip(f"no ZooKeeper server: {missing()}", allow_module_level=True)

from kazoo.client import KazooClient  # noqa: E402  (tests only: forging a session expiry)
from kazoo.exceptions import NoAuthError  # noqa: E402

from embedded_mesos import EmbeddedCluster  # noqa: E402
from scheduler.config import ExecutorSpec, SchedulerConfig  # noqa: E402
from scheduler.coordination import CoordinationError, SchedulerRegistry  # noqa: E402
from scheduler.mesos_adapter import SchedulerService  # noqa: E402
from scheduler.query_source import QuerySource  # noqa: E402
from scheduler.testing import chain_query, spec_query  # noqa: E402
from scheduler.zk import ZkSettings, ZooKeeperCoordination  # noqa: E402
from testkit.waiting import wait_for

# the scheduler compiles clients' specs inside its configured roots: this test's folder
pytestmark = pytest.mark.usefixtures("scheduler_path_roots")

FIXTURE = Path(__file__).parent / "fixtures" / "scheduler_idle_executor.py"
SPECS = Path(__file__).parent / "specs"
ONE_TASK = SPECS / "e2e-filter-project.xml"  # <q>.t0 (the fixture executor runs no program)
MULTI = SPECS / "e2e-multi.xml"  # <q>.t0 -> <q>.t1, <q>.t2 over one channel; one agent
TOKEN = "zookeeper-test-token"
SESSION = 2.0  # seconds; the server's tickTime 200 ms allows 0.4-4 s
RESOURCES = {"cpus": 4, "mem": 4096, "ports": "31100-31199"}


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path_factory.mktemp("zk")) as server:
        yield server


def coordination(zk: ZooKeeperServer, root: str, **kw: Any) -> ZooKeeperCoordination:
    return ZooKeeperCoordination(ZkSettings(zk.hosts, root, SESSION, **kw))


def config() -> SchedulerConfig:
    return SchedulerConfig(
        executor=ExecutorSpec(command=f"{sys.executable} {FIXTURE}", cpus=0.5, mem_mb=256),
        backoff_initial=0.2, offer_hold_seconds=1.0, decline_seconds=0.5)


def service(cluster: EmbeddedCluster, zk: ZooKeeperServer, root: str,
            name: str) -> SchedulerService:
    credential = cluster.framework_credential
    return SchedulerService(cluster.master_address, config(), tick_interval=0.1,
                            coordination=coordination(zk, root), address=name,
                            principal=credential.principal, secret=credential.secret)


def expire_session(zk: ZooKeeperServer, coord: ZooKeeperCoordination) -> None:
    """kazoo's documented test approach: a second client with the same session id and
    password closes the session, so the server expires it for the first client."""
    session_id, password = coord.client.client_id
    other = KazooClient(hosts=zk.hosts, client_id=(session_id, password), timeout=SESSION)
    other.start(timeout=5)
    other.stop()
    other.close()


def running(svc: SchedulerService, query_id: str) -> dict[str, Any] | None:
    view = svc.query_status(query_id)
    return view if view and view["status"] == "running" else None


def test_election_expiry_steps_down_and_stale_epoch_is_refused(zk: ZooKeeperServer,
                                                               tmp_path: Path) -> None:
    with EmbeddedCluster(agents=1, resources=RESOURCES, work_dir=tmp_path) as cluster:
        a = service(cluster, zk, "/t-expiry", "http://a").start()
        b = None
        try:
            assert a.leadership.role == "leader"
            b = service(cluster, zk, "/t-expiry", "http://b").start()
            wait_for("b to learn the leader", lambda: b.leadership.leader == "http://a")
            q, q_source = spec_query(ONE_TASK, "q", tmp_path)
            refused = b.submit(q, source=q_source)
            assert (refused.accepted, refused.status) == (False, 421)
            assert "http://a" in refused.message
            epoch_a = a.leadership.epoch
            assert a.submit(q, epoch=epoch_a, source=q_source).accepted
            wait_for("q running under a", lambda: running(a, "q"))
            framework = wait_for("framework id", lambda: a.framework_id)
            assert a._persister.flush(5)
            term_a = a.leadership.term

            expire_session(zk, a.coordination)
            wait_for("a to step down", lambda: a.leadership.role == "standby")
            wait_for("b to lead", lambda: b.leadership.role == "leader")
            assert b.leadership.epoch > epoch_a
            view = wait_for("q running under b", lambda: running(b, "q")
                            and b.status()["connected"] and running(b, "q"))
            assert b.framework_id == framework
            task = view["tasks"][0]
            assert (task["attempt"], task["launches"], task["state"]) == (1, 1, "running")

            stale = b.submit(chain_query("q2", 1), epoch=epoch_a)
            assert (stale.accepted, stale.status) == (False, 409)
            assert "stale" in stale.message
            assert not a.submit(chain_query("q3", 1)).accepted  # a is a standby now
            with pytest.raises(CoordinationError):  # FencedOut, or the old session is gone
                a.coordination.put("framework_id", b"hijack", term_a)
            assert b.registry.framework_id() == framework
            assert b.submit(chain_query("q2", 1), epoch=b.leadership.epoch).accepted
            assert b.status()["queries"]["q"]["tasks"][0]["state"] == "running"
        finally:
            for svc in (b, a):
                if svc is not None:
                    svc.stop()


def test_registry_survives_a_scheduler_restart(zk: ZooKeeperServer, tmp_path: Path) -> None:
    with EmbeddedCluster(agents=1, resources=RESOURCES, work_dir=tmp_path) as cluster:
        first = service(cluster, zk, "/t-restart", "http://first").start()
        try:
            keep, keep_source = spec_query(MULTI, "keep", tmp_path)
            assert first.submit(keep, source=keep_source).accepted
            before = wait_for("keep running", lambda: running(first, "keep"))
            framework = first.framework_id
            assert first._persister.flush(5)
            producer = next(t for t in before["tasks"] if t["task_id"] == "keep.t0")
            reader = coordination(zk, "/t-restart")
            reader.start()
            try:  # the channel registry: where keep.t0 serves its one output channel
                assert SchedulerRegistry(reader).endpoints("keep") == producer["endpoints"] != {}
                persisted = json.loads(reader.get("queries/keep") or b"{}")
                assert persisted["spec"] == MULTI.read_text()  # the source, no program
                assert "program" not in json.dumps(persisted)
                forge_entries(reader, tmp_path)
            finally:
                reader.close()
        finally:
            first.stop()
        second = service(cluster, zk, "/t-restart", "http://second").start()
        try:
            assert second.leadership.role == "leader"
            after = wait_for("keep running after restart", lambda: second.status()["connected"]
                             and running(second, "keep"))
            assert second.framework_id == framework
            assert [(t["mesos_task_id"], t["launches"]) for t in after["tasks"]] == \
                [(t["mesos_task_id"], t["launches"]) for t in before["tasks"]]
            assert sorted(second.status()["queries"]) == ["keep"]  # forged entries skipped
            assert all(t.program != PROGRAM for r in second.loop.state.queries.values()
                       for t in r.query.tasks)
        finally:
            second.stop()


PROGRAM = "import os\nos.system('touch /tmp/elastiq-pwned')\n"


def forge_entries(coord: ZooKeeperCoordination, tmp_path: Path) -> None:
    """What someone able to write the registry might leave: a compiled query carrying a
    program (the old format), a source that does not compile, and a source filed under
    another query's id. A new leader must restore none of them (and still the rest)."""
    evil = json.loads(chain_query("evil", 1).to_json())
    evil["tasks"][0]["program"] = PROGRAM
    coord.put("queries/evil", json.dumps(evil).encode())
    coord.put("placements/evil", b'{"phase": "active", "tasks": {}}')
    broken = QuerySource.of(b"<dataflow name='broken'><oops/></dataflow>", "broken.xml",
                            "broken", str(tmp_path))
    coord.put("queries/broken", broken.to_json().encode())
    _, misfiled = spec_query(ONE_TASK, "other", tmp_path)
    coord.put("queries/misfiled", misfiled.to_json().encode())


def test_acl_keeps_other_clients_out(zk: ZooKeeperServer) -> None:
    owner = coordination(zk, "/t-acl", digest=("elastiq", "s3cret"))
    owner.start()
    stranger = KazooClient(hosts=zk.hosts, timeout=SESSION)
    try:
        owner.put("framework_id", b"F-1")
        assert owner.get("framework_id") == b"F-1"
        stranger.start(timeout=5)
        with pytest.raises(NoAuthError):
            stranger.get("/t-acl/registry/framework_id")
    finally:
        stranger.stop()
        stranger.close()
        owner.close()


def http_json(url: str, token: str | None = None) -> dict[str, Any] | None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


def scheduler_process(zk: ZooKeeperServer, cluster: EmbeddedCluster, port: int, log: Path,
                      state: Path, token_file: Path) -> "subprocess.Popen[bytes]":
    """`elastiq scheduler` against the cluster's master with its framework credential (the
    secret in a 0600 file beside the log, never on the command line)."""
    secret_file = log.with_suffix(".mesos-secret")
    secret_file.touch(mode=0o600)
    secret_file.write_text(cluster.framework_credential.secret, encoding="utf-8")
    out = open(log, "wb")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "elastiq.cli", "scheduler", "--master", cluster.master_address,
             "--mesos-principal", cluster.framework_credential.principal,
             "--mesos-secret-file", str(secret_file),
             "--zk", f"{zk.hosts}/t-kill", "--zk-session-timeout", str(SESSION),
             "--listen", f"127.0.0.1:{port}", "--state-dir", str(state),
             "--executor-command", f"{sys.executable} {FIXTURE}",
             "--token-file", str(token_file)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        out.close()


def executor_pids(work_dir: Path) -> set[int]:
    """Our fixture executors whose sandbox is under `work_dir`."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if str(FIXTURE).encode() in cmd and cwd.startswith(str(work_dir)):
                found.add(int(entry))
    return found


@pytest.mark.cluster
def test_sigkill_of_the_leader_process_hands_over_without_killing_tasks(
        zk: ZooKeeperServer, tmp_path: Path) -> None:
    with EmbeddedCluster(agents=1, resources=RESOURCES, work_dir=tmp_path / "c") as cluster:
        ports = (free_port(), free_port())
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        token_file = tmp_path / "token"  # both schedulers serve the API with one token
        token_file.write_text(TOKEN + "\n")
        procs: list[subprocess.Popen[bytes]] = []
        try:
            procs.append(scheduler_process(zk, cluster, ports[0],
                                           tmp_path / "a.log", tmp_path / "a", token_file))
            health = wait_for("leader a", lambda: (h := http_json(urls[0] + "/healthz"))
                              and h.get("connected") and h, 60)
            procs.append(scheduler_process(zk, cluster, ports[1],
                                           tmp_path / "b.log", tmp_path / "b", token_file))
            wait_for("standby b", lambda: http_json(urls[1] + "/healthz"), 60)
            req = urllib.request.Request(urls[0] + "/queries?query_id=ha", ONE_TASK.read_bytes(),
                                         method="POST", headers={
                                             "Content-Type": "application/xml",
                                             "X-Spec-Dir": str(tmp_path),
                                             "Authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 201
            wait_for("ha running", lambda: (q := http_json(urls[0] + "/queries/ha", TOKEN))
                     and q["status"] == "running", 30)
            executors = wait_for("executor process", lambda: executor_pids(tmp_path / "c"))
            time.sleep(0.5)  # let the leader's registry writer settle

            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(5)
            killed_at = time.monotonic()
            took_over = wait_for("b to take over", lambda: (h := http_json(
                urls[1] + "/healthz")) and h.get("connected") and h, 4 * SESSION)
            elapsed = time.monotonic() - killed_at
            assert elapsed <= 2 * SESSION, f"takeover took {elapsed:.2f} s"
            assert took_over["framework_id"] == health["framework_id"]
            assert health["leadership"]["role"] == "leader"
            assert took_over["leadership"]["role"] == "leader"
            assert took_over["leadership"]["epoch"] > health["leadership"]["epoch"]
            view = wait_for("ha running under b", lambda: (q := http_json(
                urls[1] + "/queries/ha", TOKEN)) and q["status"] == "running" and q, 10)
            task = view["tasks"][0]
            assert (task["attempt"], task["launches"], task["state"]) == (1, 1, "running")
            time.sleep(1.0)  # anything wrongly killed would have reported by now
            assert executor_pids(tmp_path / "c") == executors
            assert http_json(urls[1] + "/queries/ha", TOKEN)["tasks"][0]["state"] == "running"
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait(5)
