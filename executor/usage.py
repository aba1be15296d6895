"""An executor's own resource usage, as Mesos's `ResourceStatistics` names it, for its heartbeats:
the scheduler then never depends on the agent for it (a real cluster's agent serves the same
figures at `/monitor/statistics`; the embedded one too, `embedded_mesos.isolation`).

Owns reading, from /proc and the cgroup files, the cpu time (user, system) and resident memory
of the executor's process tree (the executor, its Spark JVM and Python workers; children that
ended and were waited for count through their parent's `cutime`/`cstime`), and, when the
executor is in a cgroup other than the root that it can read, that cgroup's CFS figures
(`cpus_nr_periods`, `cpus_nr_throttled`, `cpus_throttled_time_secs`) and cpu times (which then
replace the process tree's: they count every process of the container). Parsing is pure
(`parse_*`); `own_usage` does the reading and never raises (a figure it cannot read is left out).
Does not own limits or isolation (the agent's), nor what the scheduler makes of the figures
(`scheduler.elastic_policy`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# --- parsing (pure) -----------------------------------------------------------------------------

def parse_stat(text: str) -> tuple[int, int, int, int] | None:
    """(ppid, user ticks, system ticks, rss pages) from /proc/PID/stat text (the command name
    may hold spaces and parentheses); user and system include the children it waited for
    (`cutime`, `cstime`). None when unreadable."""
    closing = text.rfind(")")
    fields = text[closing + 2:].split() if closing >= 0 else []
    try:
        # after "(comm)": state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14) rss(21)
        return (int(fields[1]), int(fields[11]) + int(fields[13]),
                int(fields[12]) + int(fields[14]), int(fields[21]))
    except (ValueError, IndexError):
        return None


def descendants(root: int, parents: Mapping[int, int]) -> list[int]:
    """`root` and every process below it, from pid -> ppid (pure, bounded by the map)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = [root]
    while todo and len(found) <= len(parents):
        pid = todo.pop()
        found.append(pid)
        todo.extend(c for c in children.get(pid, ()) if c != pid)
    return sorted(set(found))


def parse_cgroup_paths(text: str) -> dict[str, str]:
    """Controller -> path in its hierarchy, from /proc/self/cgroup ("2" names cgroup v2's
    unified hierarchy, whose line is `0::/path`)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            paths["2"] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def parse_keyed(text: str) -> dict[str, int]:
    """`key value` lines (cpu.stat, cpuacct.stat) -> {key: value}, skipping what is not."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            found[parts[0]] = int(parts[1])
    return found


def cgroup_cpu_figures(version: int, cpu_stat: Mapping[str, int],
                       cpuacct_stat: Mapping[str, int]) -> dict[str, float]:
    """Mesos's cpu figures from a cgroup's cpu.stat (and, v1, cpuacct.stat)."""
    if version == 2:
        figures = {"cpus_user_time_secs": cpu_stat.get("user_usec", 0) / 1e6,
                   "cpus_system_time_secs": cpu_stat.get("system_usec", 0) / 1e6,
                   "cpus_throttled_time_secs": cpu_stat.get("throttled_usec", 0) / 1e6}
    else:
        figures = {"cpus_throttled_time_secs": cpu_stat.get("throttled_time", 0) / 1e9}
        if cpuacct_stat:
            figures.update(cpus_user_time_secs=cpuacct_stat.get("user", 0) / USER_HZ,
                           cpus_system_time_secs=cpuacct_stat.get("system", 0) / USER_HZ)
    figures.update(cpus_nr_periods=float(cpu_stat.get("nr_periods", 0)),
                   cpus_nr_throttled=float(cpu_stat.get("nr_throttled", 0)))
    return figures


# --- reading ------------------------------------------------------------------------------------

def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def process_tree_usage(root: int, proc: Path = PROC) -> dict[str, float]:
    """cpu user/system seconds and resident bytes of `root`'s process tree, from /proc."""
    stats: dict[int, tuple[int, int, int, int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            parsed = parse_stat(_read(entry / "stat"))
            if parsed is not None:
                stats[int(entry.name)] = parsed
    tree = [stats[pid] for pid in descendants(root, {p: s[0] for p, s in stats.items()})
            if pid in stats]
    user, system, rss = (sum(s[i] for s in tree) for i in (1, 2, 3))
    rss *= PAGE
    return {"cpus_user_time_secs": user / USER_HZ, "cpus_system_time_secs": system / USER_HZ,
            "mem_rss_bytes": float(rss)}


def cgroup_usage(proc_self_cgroup: str, root: Path = CGROUP_ROOT) -> dict[str, float]:
    """The cpu figures of the cgroup the executor is in ({} in the root cgroup, or when its
    cpu.stat cannot be read or has no CFS figures)."""
    paths = parse_cgroup_paths(proc_self_cgroup)
    if "cpu" in paths:
        version, path = 1, paths["cpu"]
        cpu_dir, acct_dir = root / "cpu" / path.lstrip("/"), \
            root / "cpuacct" / paths.get("cpuacct", path).lstrip("/")
    elif "2" in paths:
        version, path = 2, paths["2"]
        cpu_dir = acct_dir = root / path.lstrip("/")
    else:
        return {}
    if path in ("", "/"):
        return {}
    cpu_stat = parse_keyed(_read(cpu_dir / "cpu.stat"))
    if "nr_periods" not in cpu_stat:
        return {}
    acct = parse_keyed(_read(acct_dir / "cpuacct.stat")) if version == 1 else {}
    return cgroup_cpu_figures(version, cpu_stat, acct)


def own_usage(pid: int | None = None, proc: Path = PROC,
              cgroup_root: Path = CGROUP_ROOT) -> dict[str, float]:
    """This executor's usage now: its process tree's, with its cgroup's figures over them when
    it is in one it can read. Never raises; {} when nothing can be read."""
    pid = os.getpid() if pid is None else pid
    try:
        usage = process_tree_usage(pid, proc)
    except OSError:
        usage = {}
    try:
        usage.update(cgroup_usage(_read(proc / str(pid) / "cgroup"), cgroup_root))
    except OSError:
        pass
    return usage


__all__ = ["own_usage", "process_tree_usage", "cgroup_usage", "parse_stat", "descendants",
           "parse_cgroup_paths", "parse_keyed", "cgroup_cpu_figures"]
