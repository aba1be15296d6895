"""Agents as separate hosts in network namespaces: one is cut off the network for longer than the
master's agent timeout while it runs a stateful query.

Unit tests of the agent's self-fencing decision (`should_fence`, `resolve_fence_seconds`), and one
cluster test: the embedded master and the framework scheduler run in the test's own namespace
(host end of a private veth), agents A and B each in their own namespace on a bridge that lives in
a namespace of its own (testkit/netns.py). A finite windowed count (tests/specs/
e2e-stateful-count.xml) runs on A with its checkpoint under ELASTIQ_STATE_DIR on the shared file
system. A's bridge port goes down: A fences itself (SIGKILLs its executor) before the master's
agent timeout, the master declares A lost, the scheduler relaunches the task on B, which resumes
from the shared checkpoint. The link comes back: A registers again under a new agent id with no
executor, and the sink equals the plain-Python oracle (nothing missing, nothing twice). A second
cluster test does the same with A's self-fencing off, as on real Mesos: the old attempt keeps
running on A beside the new one on B, and only the attempts' fencing (`executor.fencing`) keeps
its writes out of the shared checkpoint and sink. Skipped with the reason when namespaces cannot
be created here (not root, no iproute2, kernel forbids).
"""

from __future__ import annotations

import json
import logging
import sys
import time
import urllib.request
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from testkit.e2e_support import (
            Row,
            compile_spec,
            generator_rows,
            pythonpath,
            read_sink,
            sink_path,
            spec_params,
            wait_for_sink,
            wait_until,
            window_oracle,
        )
from netns_support import NetnsAgent, group_alive
from testkit.netns import NetnsNetwork, netns_unavailable

from embedded_mesos.auth import basic_authorization
from embedded_mesos.agent import (
    DEFAULT_FENCE_SECONDS,
    FENCE_ENV,
    resolve_fence_seconds,
    should_fence,
)

log = logging.getLogger("tests.netns")
SPEC = "e2e-stateful-count.xml"
FENCED_SPEC = "e2e-fenced-count.xml"  # the same query with a minute of data
AGENT_TIMEOUT = 6.0  # the master's; agents fence after DEFAULT_FENCE_SECONDS (3 s)
SECOND = timedelta(seconds=1)


# --- the fencing decision (pure) ------------------------------------------------------------------

class TestShouldFence:
    def test_fences_once_silence_reaches_the_limit(self) -> None:
        assert should_fence(10.0, 13.0, 3.0, fenced=False, live_executors=1)
        assert not should_fence(10.0, 12.9, 3.0, fenced=False, live_executors=1)

    def test_never_when_off_already_fenced_or_nothing_runs(self) -> None:
        assert not should_fence(0.0, 100.0, None, fenced=False, live_executors=2)
        assert not should_fence(0.0, 100.0, 3.0, fenced=True, live_executors=2)
        assert not should_fence(0.0, 100.0, 3.0, fenced=False, live_executors=0)


class TestResolveFenceSeconds:
    MASTER = "http://10.0.0.1:5050"

    def test_default_off_on_any_host_as_a_real_mesos_agent(self) -> None:
        assert resolve_fence_seconds("auto", {}, "10.0.0.2", self.MASTER) is None
        assert resolve_fence_seconds("auto", {}, "10.0.0.1", self.MASTER) is None
        assert resolve_fence_seconds("auto", {}, "127.0.0.1", "http://127.0.0.1:5050") is None

    def test_environment_overrides_the_default(self) -> None:
        assert resolve_fence_seconds("auto", {FENCE_ENV: "off"}, "10.0.0.2", self.MASTER) is None
        assert resolve_fence_seconds("auto", {FENCE_ENV: "0"}, "10.0.0.2", self.MASTER) is None
        assert resolve_fence_seconds("auto", {FENCE_ENV: "1.5"}, "127.0.0.1",
                                     "http://127.0.0.1:1") == 1.5

    def test_explicit_argument_wins(self) -> None:
        assert resolve_fence_seconds(None, {FENCE_ENV: "2"}, "10.0.0.2", self.MASTER) is None
        assert resolve_fence_seconds(4.0, {FENCE_ENV: "off"}, "10.0.0.1", self.MASTER) == 4.0

    def test_bad_values_are_refused_with_the_name(self) -> None:
        with pytest.raises(ValueError, match=FENCE_ENV):
            resolve_fence_seconds("auto", {FENCE_ENV: "soon"}, "10.0.0.2", self.MASTER)
        with pytest.raises(ValueError, match="fence_after"):
            resolve_fence_seconds(-1.0, {}, "10.0.0.2", self.MASTER)


# --- the cluster ----------------------------------------------------------------------------------

@pytest.fixture
def net() -> Iterator[NetnsNetwork]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    network = NetnsNetwork(("a", "b")).create()
    try:
        yield network
    finally:
        network.close()
        assert not network.leftovers(), f"namespaces left behind: {network.leftovers()}"


MASTER_AUTH: dict[str, dict[str, str]] = {}  # master url -> its operator credential header


def master_state(url: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/state", headers=MASTER_AUTH.get(url, {}))
    with urllib.request.urlopen(request, timeout=5.0) as reply:
        return json.loads(reply.read())


def scheduler_config(work: Path) -> Any:
    from scheduler.config import ExecutorSpec, SchedulerConfig

    executor = ExecutorSpec(command=f"exec {sys.executable} -m executor", environment=(
        ("ELASTIQ_STATE_DIR", str(work / "state")), ("ELASTIQ_SPARK_CORES", "1"),
        ("PYTHONPATH", pythonpath())))
    return SchedulerConfig(executor=executor, backoff_initial=0.5, same_agent_wait=2.0,
                           offer_hold_seconds=1.0, decline_seconds=0.5)


def expected_windows(spec: str = SPEC) -> tuple[dict[tuple, list[Row]], Counter]:
    windows = window_oracle(generator_rows(spec_params(spec)["src"]), "ts", ["sensor"],
                            2 * SECOND, 2 * SECOND, timedelta(milliseconds=500))
    expected = Counter((start, start + 2 * SECOND, sensor, len(rows))
                       for (start, sensor), rows in windows.items())
    return windows, expected


def task_view(service: Any, query_id: str) -> dict[str, Any]:
    tasks = (service.query_status(query_id) or {}).get("tasks", [])
    return tasks[0] if tasks else {}


class Timeline:
    """When A's executor died and when the master dropped A, both seen by one poll loop."""

    def __init__(self) -> None:
        self.cut = time.monotonic()
        self.fenced: float | None = None
        self.lost: float | None = None

    def poll(self, agent: NetnsAgent, executor: int, master_url: str) -> bool:
        now = time.monotonic()
        if self.fenced is None and not group_alive(executor):
            self.fenced = now
        if self.lost is None and agent.agent_id not in master_state(master_url)["agents"]:
            self.lost = now
        return self.fenced is not None and self.lost is not None

    def report(self) -> str:
        return " ".join(f"{k}={v - self.cut:.1f}s" if v else f"{k}=never"
                        for k, v in (("fenced", self.fenced), ("lost", self.lost)))


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(240)
def test_cut_off_agent_fences_its_task_fails_over_and_the_sink_is_exact(
        net: NetnsNetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from embedded_mesos.httpio import SECRET_ENV
    from embedded_mesos.master import EmbeddedMaster, new_secret
    from scheduler.mesos_adapter import SchedulerService

    monkeypatch.setenv(SECRET_ENV, new_secret())  # the master's and the agent processes'
    master = EmbeddedMaster(host=net.host_address, port=0, offer_interval=0.2,
                            agent_timeout=AGENT_TIMEOUT).start()
    MASTER_AUTH[master.url] = {"Authorization": basic_authorization(master.framework_credential)}
    agents: list[NetnsAgent] = []
    service = None
    resources = {"cpus": 1.5, "mem": 8192, "ports": "31000-31015"}
    try:
        agents.append(NetnsAgent(net, "a", master.url, tmp_path / "agent-a", resources,
                                 env={FENCE_ENV: str(DEFAULT_FENCE_SECONDS)},  # opted in
                                 executor_grace_seconds=5.0))
        service = SchedulerService(master.address, scheduler_config(tmp_path),
                                   tick_interval=0.1,
                                   principal=master.framework_credential.principal,
                                   secret=master.framework_credential.secret).start()
        wait_until(lambda: service.status()["connected"], 20, "the scheduler to register")
        run_scenario(net, master.url, service, agents, tmp_path, resources)
    finally:
        if service is not None:
            service.stop(failover=False)
        for agent in agents:
            agent.stop()
        master.stop()
        for agent in agents:
            assert not agent.live_executor_groups(), f"executors left on {agent.host}"


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(300)
def test_without_self_fencing_the_stale_attempt_runs_on_and_its_writes_are_refused(
        net: NetnsNetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from embedded_mesos.httpio import SECRET_ENV
    from embedded_mesos.master import EmbeddedMaster, new_secret
    from scheduler.mesos_adapter import SchedulerService

    monkeypatch.setenv(SECRET_ENV, new_secret())
    master = EmbeddedMaster(host=net.host_address, port=0, offer_interval=0.2,
                            agent_timeout=AGENT_TIMEOUT).start()
    MASTER_AUTH[master.url] = {"Authorization": basic_authorization(master.framework_credential)}
    agents: list[NetnsAgent] = []
    service = None
    resources = {"cpus": 1.5, "mem": 8192, "ports": "31000-31015"}
    try:
        agents.append(NetnsAgent(net, "a", master.url, tmp_path / "agent-a", resources,
                                 env={FENCE_ENV: "off"}, executor_grace_seconds=5.0))
        service = SchedulerService(master.address, scheduler_config(tmp_path),
                                   tick_interval=0.1,
                                   principal=master.framework_credential.principal,
                                   secret=master.framework_credential.secret).start()
        wait_until(lambda: service.status()["connected"], 20, "the scheduler to register")
        run_fenced_scenario(net, master.url, service, agents, tmp_path, resources)
    finally:
        if service is not None:
            service.stop(failover=False)
        for agent in agents:
            agent.stop()
        master.stop()
        for agent in agents:
            assert not agent.live_executor_groups(), f"executors left on {agent.host}"


def run_fenced_scenario(net: NetnsNetwork, master_url: str, service: Any,
                        agents: list[NetnsAgent], work: Path, resources: dict[str, Any]) -> None:
    a = agents[0]
    query = compile_spec(FENCED_SPEC, work)
    qid = query.query_id
    assert service.submit(query).accepted
    wait_until(lambda: (t := task_view(service, qid)).get("state") == "running"
               and t["agent_id"] == a.agent_id, 90, "the task running on agent A",
               lambda: str(task_view(service, qid)))
    agents.append(NetnsAgent(net, "b", master_url, work / "agent-b", resources,
                             executor_grace_seconds=5.0))
    b = agents[1]
    windows, expected = expected_windows(FENCED_SPEC)
    sink = sink_path(work, FENCED_SPEC, "sink")
    wait_until(lambda: read_sink(sink), 90, "first windows from agent A", step=0.1)
    assert len(read_sink(sink)) < sum(expected.values()) * 0.6, "too late to cut A"
    [executor] = a.live_executor_groups()

    net.cut("a")
    wait_until(lambda: (t := task_view(service, qid)).get("state") == "running"
               and t["agent_id"] == b.agent_id, AGENT_TIMEOUT + 120,
               "the task running again on agent B", lambda: str(task_view(service, qid)))
    assert group_alive(executor), "A's executor died: this test needs it to run on (no fencing)"
    a_log = lambda: "\n".join(p.read_text(errors="replace")  # noqa: E731
                               for p in a.work_dir.rglob("stderr"))
    wait_until(lambda: "refused: a newer attempt" in a_log(), 60,
               "the stale attempt on A to have a write refused", lambda: a_log()[-2000:])
    assert group_alive(executor), "A's executor must run on beside B's (no self-fencing)"
    reply = service.control(qid, [("src", "rate", "20000")])  # seen: the rest of the input now
    assert reply.accepted, reply
    key: Callable[[Row], tuple] = lambda r: (r["window_start"], r["window_end"], r["sensor"],
                                             r["readings"])
    wait_for_sink(sink, expected, key, 120, "the windows after the failover", settle=3.0)
    for row in read_sink(sink):
        temps = [m["temp"] for m in windows[(row["window_start"], row["sensor"])]]
        assert row["total_temp"] == pytest.approx(sum(temps), rel=1e-12)
    net.restore("a")
    wait_until(lambda: rejoined_id(master_url, a), 30, "A to register again",
               lambda: json.dumps(master_state(master_url)["agents"]))
    service.stop_query(qid)


def run_scenario(net: NetnsNetwork, master_url: str, service: Any, agents: list[NetnsAgent],
                 work: Path, resources: dict[str, Any]) -> None:
    a = agents[0]
    query = compile_spec(SPEC, work)
    qid = query.query_id
    assert service.submit(query).accepted
    wait_until(lambda: (t := task_view(service, qid)).get("state") == "running"
               and t["agent_id"] == a.agent_id, 90, "the task running on agent A",
               lambda: str(task_view(service, qid)))
    agents.append(NetnsAgent(net, "b", master_url, work / "agent-b", resources,
                             executor_grace_seconds=5.0))
    b = agents[1]
    windows, expected = expected_windows()
    sink = sink_path(work, SPEC, "sink")
    wait_until(lambda: read_sink(sink), 90, "first windows from agent A", step=0.1)
    out_before, total = len(read_sink(sink)), sum(expected.values())
    # a loaded machine starts the query slowly and its first windows come in one large batch
    # (90 of 110 in one CI run): enough is left for B while a tenth of the windows is
    assert out_before <= 0.9 * total, (
        f"too late to cut A ({out_before} of {total} windows out; a tenth must be left for B)")
    [executor] = a.live_executor_groups()

    timeline = Timeline()
    net.cut("a")
    wait_until(lambda: timeline.poll(a, executor, master_url), AGENT_TIMEOUT + 10,
               "A to fence itself and the master to declare A lost", timeline.report, step=0.1)
    log.info("netns: after the cut: %s", timeline.report())
    assert timeline.fenced < timeline.lost, f"A's executor outlived its agent: {timeline.report()}"
    relaunched = wait_until(
        lambda: (t := task_view(service, qid)).get("state") == "running"
        and t["agent_id"] == b.agent_id and t, 120, "the task running again on agent B",
        lambda: str(task_view(service, qid)))
    gap = time.monotonic() - timeline.cut
    assert relaunched["attempt"] == 2 and a.agent_id in relaunched["last_failure"]

    net.restore("a")
    rejoined = wait_until(lambda: rejoined_id(master_url, a), 30,
                          "A to register again after the link came back",
                          lambda: json.dumps(master_state(master_url)["agents"]))
    assert rejoined != a.agent_id
    key: Callable[[Row], tuple] = lambda r: (r["window_start"], r["window_end"], r["sensor"],
                                             r["readings"])
    wait_for_sink(sink, expected, key, 120, "the windows after the failover", settle=3.0)
    for row in read_sink(sink):
        temps = [m["temp"] for m in windows[(row["window_start"], row["sensor"])]]
        assert row["total_temp"] == pytest.approx(sum(temps), rel=1e-12)
    assert not a.live_executor_groups(), "an executor runs on A after it came back"
    assert task_view(service, qid)["agent_id"] == b.agent_id
    log.info("netns: cut to RUNNING on B %.1fs; %s", gap, timeline.report())
    service.stop_query(qid)


def rejoined_id(master_url: str, agent: NetnsAgent) -> str | None:
    """A's new agent id once it registered again from its address, else None."""
    for agent_id, view in master_state(master_url)["agents"].items():
        if view["url"] == agent.url and agent_id != agent.agent_id:
            return agent_id
    return None
