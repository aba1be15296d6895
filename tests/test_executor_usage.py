"""An executor's own usage for its heartbeats (`executor.usage`) and the heartbeat that carries
it (`common.messages.Heartbeat.usage`) into the elastic policy's samples.

Pure parsing against hand-written /proc and cgroup texts; one real reading of a child process
tree (oracle: the cpu time the child measured itself); one real cgroup with a CFS quota when
this machine lets a cgroup be made (oracle: the embedded agent's own reader of the same cgroup,
`ContainerCgroup.statistics`, and the quota's arithmetic)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import messages
from common.messages import Heartbeat
from executor.usage import (
    cgroup_cpu_figures, cgroup_usage, descendants, own_usage, parse_cgroup_paths, parse_keyed,
    parse_stat,
)
from scheduler.elastic_policy import sample_of
from testkit.waiting import wait_for

STAT = ("4242 (java (spark) x) S 4000 4242 4242 0 -1 4194560 100 0 0 0 "
        "70 30 5 2 20 0 40 0 123 999999 2500 18446744073709551615")


def test_a_stat_line_with_spaces_and_parentheses_in_its_name_parses() -> None:
    # after "(...)": state ppid ... utime=70 stime=30 cutime=5 cstime=2 ... rss=2500
    assert parse_stat(STAT) == (4000, 75, 32, 2500)
    assert parse_stat("1 (x) S 0") is None and parse_stat("") is None


def test_descendants_follow_parents_and_stop_on_a_loop() -> None:
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 30: 30}
    assert descendants(10, parents) == [10, 11, 12, 13]
    assert descendants(30, parents) == [30]


def test_cgroup_paths_of_v1_and_v2() -> None:
    v1 = "4:memory:/m\n2:cpu,cpuacct:/elastiq-a\n0::/\n"
    assert parse_cgroup_paths(v1) == {"memory": "/m", "cpu": "/elastiq-a",
                                      "cpuacct": "/elastiq-a", "2": "/"}
    assert parse_cgroup_paths("0::/elastiq-b\n") == {"2": "/elastiq-b"}


def test_cgroup_cpu_figures_in_mesos_names() -> None:
    v2 = parse_keyed("usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n"
                     "nr_periods 50\nnr_throttled 40\nthrottled_usec 1500000\n")
    assert cgroup_cpu_figures(2, v2, {}) == {
        "cpus_user_time_secs": 2.0, "cpus_system_time_secs": 1.0,
        "cpus_throttled_time_secs": 1.5, "cpus_nr_periods": 50.0, "cpus_nr_throttled": 40.0}
    v1 = cgroup_cpu_figures(1, {"nr_periods": 8, "nr_throttled": 2, "throttled_time": 5 * 10**8},
                            {"user": 300, "system": 100})
    hz = os.sysconf("SC_CLK_TCK")
    assert v1 == {"cpus_throttled_time_secs": 0.5, "cpus_user_time_secs": 300 / hz,
                  "cpus_system_time_secs": 100 / hz, "cpus_nr_periods": 8.0,
                  "cpus_nr_throttled": 2.0}


def test_the_root_cgroup_or_an_unreadable_one_gives_no_cgroup_figures(tmp_path: Path) -> None:
    assert cgroup_usage("2:cpu,cpuacct:/\n", tmp_path) == {}
    assert cgroup_usage("2:cpu,cpuacct:/gone\n", tmp_path) == {}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "cpu.stat").write_text("nr_periods 10\nnr_throttled 7\nuser_usec 5\n")
    assert cgroup_usage("0::/x\n", tmp_path)["cpus_nr_throttled"] == 7.0


def test_a_heartbeat_carries_usage_beside_every_task_and_into_samples() -> None:
    beat = Heartbeat({"q.f1.a1": {"state": "running", "tuples_in": 5, "tuples_out": 5,
                                  "busy_ms": 100, "batches_ended": 2}},
                     "e1", {"cpus_nr_periods": 10.0, "cpus_nr_throttled": 9.0,
                            "mem_rss_bytes": 1e6})
    back = messages.decode(messages.encode(beat))
    assert isinstance(back, Heartbeat) and back.usage == beat.usage
    figures = back.figures()["q.f1.a1"]
    assert figures["cpus_nr_throttled"] == 9.0 and figures["tuples_in"] == 5.0
    sample = sample_of(1.0, figures)
    assert sample is not None and (sample.batches, sample.nr_throttled) == (2.0, 9.0)
    with pytest.raises(messages.MessageError, match="usage"):
        messages.decode(b'{"kind": "heartbeat", "tasks": {}, "usage": [1]}')
    words = messages.decode(b'{"kind": "heartbeat", "tasks": {}, "usage": {"a": "x", "b": 1}}')
    assert isinstance(words, Heartbeat) and words.usage == {"b": 1.0}


BURN = ("import sys, time\n"
        "end = time.process_time() + 0.4\n"
        "while time.process_time() < end: pass\n"
        "print(time.process_time(), flush=True)\n"
        "sys.stdin.read()\n")


def test_the_process_tree_counts_a_live_childs_cpu() -> None:
    before = own_usage()
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        burnt = float(child.stdout.readline())  # the child's own measure of its cpu time
        after = own_usage()
        spent = (after["cpus_user_time_secs"] + after["cpus_system_time_secs"]) - \
            (before["cpus_user_time_secs"] + before["cpus_system_time_secs"])
        assert spent >= burnt - 0.05  # ticks are 10 ms; our own work only adds
        assert after["mem_rss_bytes"] > before["mem_rss_bytes"]  # the child's pages count
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def test_an_executor_in_a_cgroup_reads_its_throttling_as_the_agent_does() -> None:
    from embedded_mesos.isolation import ContainerCgroup, cgexec_argv, probe

    found = probe()
    if found.hierarchy is None:
        pytest.skip(f"no cgroups can be made here: {found.reason}")
    cgroup = ContainerCgroup(found.hierarchy, f"elastiq-test-usage-{os.getpid()}")
    cgroup.create(0.1, 64)
    child = None
    try:
        spin = "import sys\nwhile True: pass\n"
        child = subprocess.Popen(cgexec_argv(cgroup.procs_files(), [sys.executable, "-c", spin]))
        wait_for("the spinning child throttled in 5 CFS periods",
                 lambda: own_usage(child.pid).get("cpus_nr_throttled", 0) >= 5, timeout=30)
        first = own_usage(child.pid)
        wait_for("20 more CFS periods", lambda: own_usage(child.pid)["cpus_nr_periods"]
                 >= first["cpus_nr_periods"] + 20, timeout=30)
        mine = own_usage(child.pid)
        agents = cgroup.statistics(time.time())
        assert mine["cpus_nr_throttled"] <= agents["cpus_nr_throttled"]  # read first
        assert mine["cpus_nr_periods"] <= agents["cpus_nr_periods"]
        # the same counters, read a moment apart (a period is 0.1 s)
        assert agents["cpus_nr_periods"] - mine["cpus_nr_periods"] <= 5
        assert agents["cpus_nr_throttled"] - mine["cpus_nr_throttled"] <= 5
        for name in ("cpus_user_time_secs", "cpus_system_time_secs"):
            assert 0 <= agents[name] - mine[name] <= 0.1, name
        # 0.1 cpu against a spinning process: throttled (how often depends on what else runs)
        assert mine["cpus_nr_throttled"] > first["cpus_nr_throttled"] >= 5
    finally:
        if child is not None:
            child.kill()
            child.wait(timeout=30)
        assert cgroup.destroy()
