"""The embedded agent isolating real executors in real cgroups (root, cgroup v1 or v2).

Unmodified pymesos drivers, real executor processes (tests/fixtures/limits_executor.py), the
kernel's CFS quota and OOM killer. Oracles: CPU time read from /proc for the executor's whole
session (utime + stime of every process, by this test's own reader), the limits worked out from
the resources the test asked for, and the cgroup directories on disk. Every cgroup an agent of
these tests made is removed at the end even when a test fails (`cgroups_made`)."""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from pymesos import MesosSchedulerDriver, Scheduler

from embedded_mesos import EmbeddedCluster
from embedded_mesos.isolation import (
    CGROUP_PREFIX, ContainerCgroup, Hierarchy, Probe, probe, remove_agent_cgroups,
)
from testkit.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]
LIMITS_EXECUTOR = Path(__file__).parent / "fixtures" / "limits_executor.py"
HZ = os.sysconf("SC_CLK_TCK")
MB = 1024 * 1024


@functools.cache
def _host() -> Probe:
    """This machine's cgroups, probed once (a trial cgroup made and removed) when a test asks."""
    return probe()


def _hierarchy() -> Hierarchy:
    host = _host()
    if host.hierarchy is None:
        pytest.skip(f"no cgroups can be made here: {host.reason}")
    return host.hierarchy


class Recorder(Scheduler):
    """Offers and status updates, as they come."""

    def __init__(self) -> None:
        self.offers: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def resourceOffers(self, driver, offers):  # noqa: N802 - pymesos callback name
        with self._lock:
            self.offers.extend(offers)

    def statusUpdate(self, driver, status):  # noqa: N802
        with self._lock:
            self.updates.append(status)

    def update(self, task_id: str, state: str) -> dict[str, Any] | None:
        with self._lock:
            return next((u for u in self.updates if u["task_id"]["value"] == task_id
                         and u["state"] == state), None)

    def offer(self) -> dict[str, Any] | None:
        """The newest offer (older ones were used or replaced), or None."""
        with self._lock:
            newest = self.offers[-1] if self.offers else None
            self.offers.clear()
            return newest


def _task(task_id: str, agent_id: dict[str, str], cpus: float, mem: float,
          data: dict[str, Any]) -> dict[str, Any]:
    argv = [sys.executable, str(LIMITS_EXECUTOR)]
    scalar = lambda n, v: {"name": n, "type": "SCALAR", "scalar": {"value": v}}  # noqa: E731
    return {"task_id": {"value": task_id}, "name": task_id, "agent_id": agent_id,
            "resources": [scalar("cpus", cpus), scalar("mem", mem)],
            "executor": {"executor_id": {"value": "limits"}, "name": "limits executor",
                         "command": {"value": argv[0], "shell": False, "arguments": argv}},
            "data": base64.b64encode(json.dumps(data).encode()).decode()}


class Framework:
    """A pymesos scheduler driver on the cluster that launches tasks on fresh offers."""

    def __init__(self, cluster: EmbeddedCluster):
        self.recorder = Recorder()
        credential = cluster.framework_credential
        self.driver = MesosSchedulerDriver(
            self.recorder, {"user": "", "name": "isolation-test"}, cluster.master_address,
            principal=credential.principal, secret=credential.secret)
        self.driver.start()

    def launch(self, task_id: str, cpus: float, mem: float,
               data: dict[str, Any]) -> dict[str, Any]:
        """Launch on the next offer; returns that offer once the task runs."""
        offer = wait_for("an offer", self.recorder.offer, timeout=20)
        self.driver.launchTasks([offer["id"]], [_task(task_id, offer["agent_id"], cpus, mem,
                                                      data)], filters={"refuse_seconds": 0})
        wait_for(f"{task_id} running", lambda: self.recorder.update(task_id, "TASK_RUNNING"),
                 timeout=30)
        return offer

    def stop(self) -> None:
        self.driver.stop()
        self.driver.join()


@pytest.fixture
def cgroups_made() -> Iterator[list[str]]:
    """Agent ids whose cgroups this test may have made; every `elastiq-<id>-*` cgroup left
    behind is destroyed at the end (after the cluster stopped), pass or fail."""
    agent_ids: list[str] = []
    yield agent_ids
    for agent_id in agent_ids:
        remove_agent_cgroups(agent_id)


def _cgroups_of(hierarchy: Hierarchy, agent_ids: list[str]) -> dict[Path, list[str]]:
    bases = {hierarchy.cpu, hierarchy.cpuacct, hierarchy.memory}
    return {base: sorted(p.name for p in base.iterdir() if p.is_dir() and any(
        p.name.startswith(f"{CGROUP_PREFIX}{a}-") for a in agent_ids)) for base in bases}


def _cluster(tmp_path: Path, cpus: float, mem: int, **options: Any) -> EmbeddedCluster:
    return EmbeddedCluster(resources={"cpus": cpus, "mem": mem, "ports": "31000-31099"},
                           work_dir=tmp_path / "cluster", offer_interval=0.05, ping_interval=0.2,
                           executor_grace_seconds=1.0, **options)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _session_ticks(session: int) -> tuple[int, set[int]]:
    """utime + stime (clock ticks) of every process of `session`, read from /proc here."""
    ticks, pids = 0, set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if int(fields[3]) == session:
            ticks += int(fields[11]) + int(fields[12])
            pids.add(int(entry.name))
    return ticks, pids


def _cpu_seconds(statistics: dict[str, float]) -> float:
    return statistics["cpus_user_time_secs"] + statistics["cpus_system_time_secs"]


def _one_container(url: str) -> dict[str, Any]:
    entries = _get(f"{url}/monitor/statistics")
    assert len(entries) == 1, entries
    return entries[0]


def test_an_agent_of_half_a_cpu_holds_a_cpu_bound_executor_to_it(tmp_path, cgroups_made):
    hierarchy = _hierarchy()
    with _cluster(tmp_path, 0.5, 512, isolation="cgroups") as cluster:
        agent = cluster.agents[0]
        cgroups_made.append(agent.agent_id)
        assert agent.isolation == f"cgroups v{hierarchy.version}"
        framework = Framework(cluster)
        try:
            offer = framework.launch("burn", 0.5, 256, {"mode": "burn", "workers": 3})
            assert offer["attributes"] == [{"name": "isolation", "type": "TEXT",
                                            "text": {"value": agent.isolation}}]
            (executor_pid,) = agent.executor_pids().values()
            wait_for("the three spinning children",
                     lambda: len(_session_ticks(executor_pid)[1]) >= 4, timeout=20)
            (name,) = _cgroups_of(hierarchy, [agent.agent_id])[hierarchy.cpu]
            inside = set(ContainerCgroup(hierarchy, name).pids())
            assert _session_ticks(executor_pid)[1] <= inside  # children were born inside
            ticks0, wall0 = _session_ticks(executor_pid)[0], time.monotonic()
            stats0 = _one_container(agent.url)["statistics"]
            time.sleep(12.0)  # the measurement interval
            ticks1, wall1 = _session_ticks(executor_pid)[0], time.monotonic()
            stats1 = _one_container(agent.url)["statistics"]
            used = (ticks1 - ticks0) / HZ / (wall1 - wall0)
            reported = (_cpu_seconds(stats1) - _cpu_seconds(stats0)) / (
                stats1["timestamp"] - stats0["timestamp"])
            print(f"cpu used (from /proc) {used:.3f}, reported {reported:.3f}")
            assert 0.2 <= used <= 0.55
            assert abs(reported - used) <= 0.05
            assert stats1["cpus_limit"] == 0.5
            assert stats1["mem_limit_bytes"] == 256 * MB
            assert stats1["cpus_nr_throttled"] > stats0["cpus_nr_throttled"]
            containers = _post(f"{agent.url}/api/v1", {"type": "GET_CONTAINERS"})
            (container,) = containers["get_containers"]["containers"]
            assert container["executor_id"] == {"value": "limits"}
            assert container["container_status"]["executor_pid"] == executor_pid
            assert container["resource_statistics"]["cpus_limit"] == 0.5
            framework.driver.killTask({"value": "burn"})
            wait_for("burn killed", lambda: framework.recorder.update("burn", "TASK_KILLED"))
        finally:
            framework.stop()
        wait_for("the executor gone", lambda: not agent.executor_pids(), timeout=20)
        wait_for("its cgroups removed", lambda: not any(
            _cgroups_of(hierarchy, [agent.agent_id]).values()), timeout=10)


def _limit(hierarchy: Hierarchy, name: str, file: str, controller: str = "memory") -> int:
    base = hierarchy.memory if controller == "memory" else hierarchy.cpu
    return int((base / name / file).read_text().split()[0])


def test_containers_resize_with_their_tasks_and_die_over_their_memory_limit(tmp_path,
                                                                             cgroups_made):
    hierarchy = _hierarchy()
    if hierarchy.version != 1:
        pytest.skip("the file checks below are cgroup v1's")
    with _cluster(tmp_path, 1.0, 1024, isolation="cgroups") as cluster:
        agent = cluster.agents[0]
        cgroups_made.append(agent.agent_id)
        framework = Framework(cluster)
        try:
            framework.launch("idle", 0.25, 128, {"mode": "idle"})
            (name,) = _cgroups_of(hierarchy, [agent.agent_id])[hierarchy.cpu]
            quota = lambda: _limit(hierarchy, name, "cpu.cfs_quota_us", "cpu")  # noqa: E731
            hard = lambda: _limit(hierarchy, name, "memory.limit_in_bytes")  # noqa: E731
            assert (quota(), hard()) == (25_000, 128 * MB)
            framework.launch("second", 0.25, 64, {"mode": "idle"})
            assert (quota(), hard()) == (50_000, 192 * MB)
            framework.driver.killTask({"value": "second"})
            wait_for("second killed", lambda: framework.recorder.update("second", "TASK_KILLED"))
            wait_for("the quota back to one task's", lambda: quota() == 25_000, timeout=10)
            assert hard() == 192 * MB  # as Mesos: a hard limit is never lowered under a container
            assert _limit(hierarchy, name, "memory.soft_limit_in_bytes") == 128 * MB
            framework.launch("hog", 0.25, 32, {"mode": "allocate", "step_mb": 8})
            assert hard() == 192 * MB  # 128 + 32 < 192: unchanged
            failed = {t: wait_for(f"{t} failed", lambda t=t: framework.recorder.update(
                t, "TASK_FAILED"), timeout=60) for t in ("idle", "hog")}
        finally:
            framework.stop()
        for status in failed.values():
            assert status["reason"] == "REASON_CONTAINER_LIMITATION_MEMORY"
            assert status["source"] == "SOURCE_AGENT"
            assert status["message"].startswith("Memory limit exceeded: Requested: 192MB")
        wait_for("its cgroups removed", lambda: not any(
            _cgroups_of(hierarchy, [agent.agent_id]).values()), timeout=10)


def test_without_cgroups_everything_runs_and_says_isolation_none(tmp_path, cgroups_made,
                                                                 caplog):
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    caplog.set_level(logging.WARNING, logger="embedded_mesos.agent")
    with _cluster(tmp_path, 1.0, 512, isolation="cgroups", cgroup_root=empty) as cluster:
        agent = cluster.agents[0]
        cgroups_made.append(agent.agent_id)
        assert agent.isolation == "none"
        assert _get(f"{agent.url}/state")["isolation"] == "none"
        notes = [r.getMessage() for r in caplog.records if "isolation none" in r.getMessage()]
        assert len(notes) == 1 and str(empty) in notes[0]
        framework = Framework(cluster)
        try:
            offer = framework.launch("plain", 0.5, 256, {"mode": "idle"})
            assert offer["attributes"][0]["text"] == {"value": "none"}
            statistics = _one_container(agent.url)["statistics"]
        finally:
            framework.stop()
        assert statistics["cpus_limit"] == 0.5 and statistics["mem_limit_bytes"] == 256 * MB
        assert statistics["mem_rss_bytes"] > 10 * MB  # a Python process's resident memory
        assert list(empty.iterdir()) == []
        if _host().hierarchy is not None:
            assert not any(_cgroups_of(_host().hierarchy, [agent.agent_id]).values())
