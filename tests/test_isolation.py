"""Pure tests of the embedded agent's isolation: cgroup values from (cpus, mem), the probe on
fake /sys trees (temporary folders), the container cgroup's files, usage read from cgroup and
/proc files, the wrapper that starts an executor inside its cgroup, and the agent's operator
answers. Expected values are worked out by hand from Mesos's rules (shares 1024 x cpus at least
2; CFS period 100 ms, quota cpus x period at least 1 ms; memory at least 32 MB)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from embedded_mesos import operator_api
from embedded_mesos.agent import container_resources, resolve_isolation
from embedded_mesos.isolation import (
    CGEXEC_FAILED, ContainerCgroup, Hierarchy, cgexec_argv, cgroup_name, cgroup_values,
    memory_limitation_message, probe, proc_statistics, session_pids,
)

MB = 1024 * 1024
HZ = os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("cpus, mem, shares, quota, memory", [
    (0.5, 256, 512, 50_000, 256 * MB),
    (1.5, 1756, 1536, 150_000, 1756 * MB),
    (0.0, 0, 2, 1_000, 32 * MB),  # the floors
    (0.001, 16, 2, 1_000, 32 * MB),
    (0.35, 40, 358, 35_000, 40 * MB),
])
def test_cgroup_values_follow_mesos_rules(cpus, mem, shares, quota, memory):
    values = cgroup_values(cpus, mem)
    assert (values.cpu_shares, values.cfs_period_us, values.cfs_quota_us,
            values.memory_bytes) == (shares, 100_000, quota, memory)


def test_v2_weight_uses_the_runc_conversion():
    assert cgroup_values(1.0, 64).cpu_weight == 39  # 1 + (1022 * 9999) // 262142
    assert cgroup_values(0.0, 64).cpu_weight == 1
    assert cgroup_values(256.0, 64).cpu_weight == 10000


def _v1_tree(root: Path, comounted: bool = False) -> Path:
    cpu = root / ("cpu,cpuacct" if comounted else "cpu")
    for directory, marker in ((cpu, "cpu.cfs_quota_us"),
                              (cpu if comounted else root / "cpuacct", "cpuacct.stat"),
                              (root / "memory", "memory.limit_in_bytes")):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / marker).write_text("0\n")
        (directory / "cgroup.procs").write_text("")
    return root


def test_probe_of_an_empty_folder_finds_nothing_and_says_why(tmp_path):
    found = probe(tmp_path)
    assert found.hierarchy is None
    assert "cpu" in found.reason and str(tmp_path) in found.reason


def test_probe_finds_v1_controllers(tmp_path):
    found = probe(_v1_tree(tmp_path))
    assert found.hierarchy == Hierarchy(1, tmp_path / "cpu", tmp_path / "cpuacct",
                                        tmp_path / "memory")
    assert not list(tmp_path.glob("*/elastiq-probe-*"))  # the trial cgroup is removed


def test_probe_finds_comounted_cpu_and_cpuacct(tmp_path):
    found = probe(_v1_tree(tmp_path, comounted=True))
    assert found.hierarchy is not None
    assert found.hierarchy.cpu == found.hierarchy.cpuacct == tmp_path / "cpu,cpuacct"


def test_probe_of_v1_without_memory_says_so(tmp_path):
    _v1_tree(tmp_path)
    (tmp_path / "memory" / "memory.limit_in_bytes").unlink()
    found = probe(tmp_path)
    assert found.hierarchy is None and "memory" in found.reason


def test_probe_finds_v2_with_cpu_and_memory(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    found = probe(tmp_path)
    assert found.hierarchy == Hierarchy(2, tmp_path, tmp_path, tmp_path)


def test_probe_of_v2_without_memory_controller_says_so(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    found = probe(tmp_path)
    assert found.hierarchy is None and "memory" in found.reason


def test_probe_of_a_tree_where_no_cgroup_can_be_made(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write a read-only folder")
    _v1_tree(tmp_path)
    (tmp_path / "memory").chmod(0o500)
    try:
        found = probe(tmp_path)
    finally:
        (tmp_path / "memory").chmod(0o700)
    assert found.hierarchy is None and "cannot make a cgroup" in found.reason


def test_v1_container_files_and_a_resize_that_never_lowers_the_memory_limit(tmp_path):
    hierarchy = probe(_v1_tree(tmp_path)).hierarchy
    assert hierarchy is not None
    cgroup = ContainerCgroup(hierarchy, cgroup_name("agent-1", "c-2"))
    cgroup.create(1.5, 512)
    cpu, memory = tmp_path / "cpu" / "elastiq-agent-1-c-2", tmp_path / "memory" / "elastiq-agent-1-c-2"
    assert (cpu / "cpu.shares").read_text() == "1536"
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "150000"
    assert (memory / "memory.limit_in_bytes").read_text() == str(512 * MB)
    assert (tmp_path / "cpuacct" / "elastiq-agent-1-c-2").is_dir()
    cgroup.resize(0.5, 256)  # a task left: cpu shrinks, the memory hard limit stays
    assert (cpu / "cpu.cfs_quota_us").read_text() == "50000"
    assert (memory / "memory.limit_in_bytes").read_text() == str(512 * MB)
    assert (memory / "memory.soft_limit_in_bytes").read_text() == str(256 * MB)
    cgroup.resize(1.0, 1024)  # a task came: both grow
    assert (memory / "memory.limit_in_bytes").read_text() == str(1024 * MB)
    assert cgroup.procs_files() == [cpu / "cgroup.procs", tmp_path / "cpuacct"
                                    / "elastiq-agent-1-c-2" / "cgroup.procs",
                                    memory / "cgroup.procs"]


def test_v2_container_files(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    hierarchy = probe(tmp_path).hierarchy
    assert hierarchy is not None
    ContainerCgroup(hierarchy, "elastiq-a-c").create(0.25, 100)
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu +memory"
    container = tmp_path / "elastiq-a-c"
    assert (container / "cpu.max").read_text() == "25000 100000"
    assert (container / "cpu.weight").read_text() == str(1 + (256 - 2) * 9999 // 262142)
    assert (container / "memory.max").read_text() == str(100 * MB)


def test_v1_statistics_and_oom_kills_from_the_cgroup_files(tmp_path):
    hierarchy = probe(_v1_tree(tmp_path)).hierarchy
    assert hierarchy is not None
    cgroup = ContainerCgroup(hierarchy, "elastiq-a-c")
    cgroup.create(0.5, 64)
    (tmp_path / "cpuacct" / "elastiq-a-c" / "cpuacct.stat").write_text(
        f"user {3 * HZ}\nsystem {HZ // 2}\n")
    (tmp_path / "cpu" / "elastiq-a-c" / "cpu.stat").write_text(
        "nr_periods 40\nnr_throttled 30\nthrottled_time 2500000000\n")
    memory = tmp_path / "memory" / "elastiq-a-c"
    (memory / "memory.stat").write_text("cache 4096\nrss 999\ntotal_rss 8192\n")
    (memory / "memory.usage_in_bytes").write_text("12288\n")
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    stats = cgroup.statistics(123.0)
    assert stats == {"timestamp": 123.0, "cpus_limit": 0.5, "mem_limit_bytes": 64.0 * MB,
                     "cpus_user_time_secs": 3.0, "cpus_system_time_secs": (HZ // 2) / HZ,
                     "cpus_nr_periods": 40.0, "cpus_nr_throttled": 30.0,
                     "cpus_throttled_time_secs": 2.5, "mem_rss_bytes": 8192.0,
                     "mem_total_bytes": 12288.0}
    assert cgroup.oom_kills() == 0
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cgroup.oom_kills() == 2


def test_v2_statistics_and_oom_kills(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    cgroup = ContainerCgroup(Hierarchy(2, tmp_path, tmp_path, tmp_path), "elastiq-a-c")
    cgroup.create(2.0, 64)
    container = tmp_path / "elastiq-a-c"
    (container / "cpu.stat").write_text("usage_usec 5000000\nuser_usec 4000000\n"
                                        "system_usec 1000000\nnr_periods 7\nnr_throttled 1\n"
                                        "throttled_usec 250000\n")
    (container / "memory.stat").write_text("anon 4096\nfile 100\n")
    (container / "memory.current").write_text("8192\n")
    (container / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    stats = cgroup.statistics(1.0)
    assert (stats["cpus_user_time_secs"], stats["cpus_system_time_secs"],
            stats["cpus_throttled_time_secs"], stats["mem_rss_bytes"]) == (4.0, 1.0, 0.25, 4096.0)
    assert cgroup.oom_kills() == 1


def test_cgexec_wrapper_puts_the_process_in_before_it_runs(tmp_path):
    procs = [tmp_path / "a" / "cgroup.procs", tmp_path / "b" / "cgroup.procs"]
    for path in procs:
        path.parent.mkdir()
        path.write_text("")
    argv = cgexec_argv(procs, [sys.executable, "-c", "import os; print(os.getpid())"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()
    assert [p.read_text().strip() for p in procs] == [pid, pid]  # exec kept the pid


def test_cgexec_wrapper_refuses_to_run_outside_its_cgroup(tmp_path):
    marker = tmp_path / "ran"
    argv = cgexec_argv([tmp_path / "missing" / "cgroup.procs"],
                       [sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == CGEXEC_FAILED and not marker.exists()


def test_cgexec_wrapper_takes_text_as_data_not_script(tmp_path):
    odd = tmp_path / "$(touch pwned)" / "cgroup.procs"
    odd.parent.mkdir()
    odd.write_text("")
    done = subprocess.run(cgexec_argv([odd], ["/bin/echo", "; touch pwned2"]), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert done.stdout == "; touch pwned2\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_container_resources_are_the_executors_plus_its_live_tasks():
    cpus = lambda v: {"name": "cpus", "type": "SCALAR", "scalar": {"value": v}}  # noqa: E731
    mem = lambda v: {"name": "mem", "type": "SCALAR", "scalar": {"value": v}}  # noqa: E731
    assert container_resources([cpus(0.5), mem(1500)], [[cpus(1), mem(512)],
                                                         [cpus(0.25), mem(256)]]) == (1.75, 2268)
    assert container_resources(None, [[cpus(0.5)], None]) == (0.5, 0.0)
    assert container_resources("junk", [[{"name": "cpus"}]]) == (0.0, 0.0)


@pytest.mark.parametrize("explicit, env, expected", [
    ("auto", {}, "none"),  # Mesos's default: posix isolators
    ("auto", {"ELASTIQ_AGENT_ISOLATION": "cgroups"}, "cgroups"),
    ("none", {"ELASTIQ_AGENT_ISOLATION": "cgroups"}, "none"),
    ("cgroups", {}, "cgroups"),
    ("auto", {"ELASTIQ_AGENT_ISOLATION": "cgroups/cpu,cgroups/mem"}, "cgroups"),
])
def test_resolve_isolation(explicit, env, expected):
    assert resolve_isolation(explicit, env) == expected


def test_resolve_isolation_refuses_an_unknown_word():
    with pytest.raises(ValueError, match="ELASTIQ_AGENT_ISOLATION"):
        resolve_isolation("auto", {"ELASTIQ_AGENT_ISOLATION": "docker"})


def test_cgroup_name_is_one_findable_path_component():
    assert cgroup_name("a/../b", "c d") == "elastiq-a_.._b-c_d"


def test_proc_statistics_of_this_process():
    pids = session_pids(os.getsid(0))
    assert os.getpid() in pids
    stats = proc_statistics([os.getpid()], 5.0, 0.5, 64)
    times = os.times()
    assert stats["cpus_user_time_secs"] == pytest.approx(times.user, abs=0.05)
    assert stats["cpus_system_time_secs"] == pytest.approx(times.system, abs=0.05)
    rss_kb = int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0])
    assert stats["mem_rss_bytes"] == pytest.approx(rss_kb * 1024, rel=0.1)
    assert (stats["cpus_limit"], stats["mem_limit_bytes"]) == (0.5, 64.0 * MB)


def test_memory_limitation_message_is_mesos_s():
    assert memory_limitation_message(64 * MB, 64 * MB + 5) == \
        "Memory limit exceeded: Requested: 64MB Maximum Used: 64MB"


def _container() -> operator_api.Container:
    return operator_api.Container("fw", "ex", "the executor", "c-1", 42, "src",
                                  {"timestamp": 1.0, "cpus_limit": 0.5})


def test_monitor_statistics_and_get_containers_shapes():
    assert operator_api.monitor_statistics([_container()]) == [
        {"executor_id": "ex", "executor_name": "the executor", "framework_id": "fw",
         "source": "src", "statistics": {"timestamp": 1.0, "cpus_limit": 0.5}}]
    answer = operator_api.agent_v1_call({"type": "GET_CONTAINERS"}, lambda: [_container()])
    assert answer == {"type": "GET_CONTAINERS", "get_containers": {"containers": [
        {"framework_id": {"value": "fw"}, "executor_id": {"value": "ex"},
         "executor_name": "the executor", "container_id": {"value": "c-1"},
         "container_status": {"container_id": {"value": "c-1"}, "executor_pid": 42},
         "resource_statistics": {"timestamp": 1.0, "cpus_limit": 0.5}}]}}


def test_agent_operator_call_unknown_is_refused_without_measuring():
    def measure() -> list[operator_api.Container]:
        raise AssertionError("measured for a call that needs no containers")

    assert operator_api.agent_v1_call({"type": "GET_HEALTH"}, measure)["get_health"] == \
        {"healthy": True}
    with pytest.raises(operator_api.OperatorCallError, match="GET_CONTAINERS"):
        operator_api.agent_v1_call({"type": "GET_TASKS"}, measure)


def test_agents_isolation_travels_in_offers_to_status_lines():
    from embedded_mesos.master_state import text_attributes
    from elastiq.service_cli import agent_lines
    from scheduler.mesos_json import parse_offer

    registered = [{"name": "isolation", "type": "TEXT", "text": {"value": "cgroups v1"}},
                  {"name": "rack", "type": "SCALAR", "scalar": {"value": 1}}, "junk"]
    attributes = text_attributes(registered)
    assert attributes == [registered[0]]
    offer = parse_offer({"id": {"value": "o"}, "agent_id": {"value": "S1"}, "hostname": "h",
                         "resources": [], "attributes": attributes})
    assert offer.attributes == (("isolation", "cgroups v1"),)
    assert agent_lines({"S2": {"isolation": "none"}, "S1": {"isolation": "cgroups v1"}}) == [
        "  agent S1: isolation: cgroups v1", "  agent S2: isolation: none"]


def test_progress_shows_each_agents_cpu_use_against_its_cpus():
    from elastiq.progress import AgentCpu

    cpu = AgentCpu(every=3.0)
    assert cpu.due(0.0)
    cpu.update({"S1": 10.0, "S2": 1.0}, 100.0)
    assert cpu.line({"S1": 0.5, "S2": 1.5}) == ""  # one measurement is no rate
    assert not cpu.due(102.0) and cpu.due(103.0)
    cpu.update({"S1": 11.5, "S2": 0.2}, 104.0)  # S2's executor restarted: no negative rate
    assert cpu.line({"S1": 0.5, "S2": 1.5}) == "cpu 0.38/0.5 0.00/1.5"


def test_agent_cgroups_are_found_by_agent_id_only(tmp_path):
    from embedded_mesos.isolation import agent_cgroups

    hierarchy = probe(_v1_tree(tmp_path)).hierarchy
    assert hierarchy is not None
    for agent, container in (("S1", "c1"), ("S1", "c2"), ("S11", "c3")):
        (hierarchy.memory / cgroup_name(agent, container)).mkdir()
    assert agent_cgroups(hierarchy, "S1") == ["elastiq-S1-c1", "elastiq-S1-c2"]


@pytest.mark.usefixtures("scheduler_path_roots")
def test_status_prints_the_isolation_each_agent_offers_with(tmp_path, capsys):
    from elastiq.service_cli import _print_status
    from scheduler.events import OffersReceived
    from scheduler.placement import Offer
    from scheduler.views import snapshot
    from tests.test_control import running

    s = running(tmp_path)  # one task on agent a1, whose offers said nothing of isolation
    _print_status(snapshot(s)["queries"]["q"])
    assert "  agent a1: isolation: unknown" in capsys.readouterr().out
    s.handle(OffersReceived("o", (Offer("o2", "a1", "host-a1", 1.0, 512.0,
                                        attributes=(("isolation", "cgroups v1"),)),)))
    _print_status(snapshot(s)["queries"]["q"])
    assert "  agent a1: isolation: cgroups v1" in capsys.readouterr().out
