"""Resource isolation for the embedded agent, as Mesos's `cgroups/cpu` and `cgroups/mem` do it.

Owns, for one executor container: the cgroup values its resources give (`cgroup_values`, pure:
`cpu.shares` = 1024 x cpus, at least 2; a CFS period of 100 ms and a quota of cpus x period, at
least 1 ms; a memory limit of mem, at least 32 MB; on cgroup v2 `cpu.weight`, `cpu.max` and
`memory.max`), finding a writable cgroup hierarchy (`probe`, v2 or v1, under a root that tests
point at a temporary tree), making the container's cgroup (`elastiq-<agent>-<container>` at the
top of each controller's hierarchy, so leftovers are easy to find), the argv that starts a
process inside it (`cgexec_argv`), resizing it (`ContainerCgroup.resize`: as Mesos, the memory
hard limit is only ever raised, lowering it could OOM-kill a running container; the soft limit
follows the resources), reading its usage in Mesos's `ResourceStatistics` terms
(`ContainerCgroup.statistics`), telling whether the kernel OOM-killed in it
(`ContainerCgroup.oom_kills`), and removing it (`ContainerCgroup.destroy`: kill what is left
inside, then rmdir). Usage of an unisolated container comes from /proc (`proc_statistics`), as
Mesos's `posix/cpu` and `posix/mem` isolators report it.

It does not own when these happen (`agent`) nor which resources a container has (the executor's
plus its live tasks', summed by the agent).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "elastiq-"
CPU_SHARES_PER_CPU = 1024
MIN_CPU_SHARES = 2
CFS_PERIOD_US = 100_000
MIN_CFS_QUOTA_US = 1_000
MIN_MEMORY_BYTES = 32 * 1024 * 1024
MB = 1024 * 1024
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CGEXEC_FAILED = 125  # exit code of the wrapper when it cannot enter the cgroup

IsolationMode = Literal["cgroups", "none"]


@dataclass(frozen=True)
class CgroupValues:
    """What the controllers' files get for a container's cpus and mem."""

    cpu_shares: int
    cfs_period_us: int
    cfs_quota_us: int
    memory_bytes: int

    @property
    def cpu_weight(self) -> int:
        """cgroup v2's weight for these shares (the conversion runc and systemd use)."""
        return 1 + ((self.cpu_shares - 2) * 9999) // 262142


def cgroup_values(cpus: float, mem_mb: float) -> CgroupValues:
    """The values Mesos's cgroups isolators give a container of `cpus` and `mem_mb`."""
    return CgroupValues(
        cpu_shares=max(MIN_CPU_SHARES, int(CPU_SHARES_PER_CPU * cpus)),
        cfs_period_us=CFS_PERIOD_US,
        cfs_quota_us=max(MIN_CFS_QUOTA_US, int(cpus * CFS_PERIOD_US)),
        memory_bytes=max(MIN_MEMORY_BYTES, int(mem_mb * MB)))


def v1_files(values: CgroupValues) -> dict[tuple[str, str], str]:
    """(controller, file) -> text for cgroup v1, in the order they must be written."""
    return {("cpu", "cpu.shares"): str(values.cpu_shares),
            ("cpu", "cpu.cfs_period_us"): str(values.cfs_period_us),
            ("cpu", "cpu.cfs_quota_us"): str(values.cfs_quota_us),
            ("memory", "memory.soft_limit_in_bytes"): str(values.memory_bytes)}


def v2_files(values: CgroupValues) -> dict[str, str]:
    """file -> text for cgroup v2 (the memory limit is written apart, see `resize`)."""
    return {"cpu.weight": str(values.cpu_weight),
            "cpu.max": f"{values.cfs_quota_us} {values.cfs_period_us}"}


@dataclass(frozen=True)
class Hierarchy:
    """Where the controllers' cgroups are made: one root for v2, one per controller for v1
    (cpu and cpuacct may be one co-mounted directory)."""

    version: int
    cpu: Path
    cpuacct: Path
    memory: Path

    def describe(self) -> str:
        return f"cgroups v{self.version}"


@dataclass(frozen=True)
class Probe:
    """The result of looking for cgroups: a hierarchy, or None with the reason."""

    hierarchy: Hierarchy | None
    reason: str


def probe(root: Path = CGROUP_ROOT, try_mkdir: bool = True) -> Probe:
    """A writable cgroup hierarchy with cpu and memory controllers under `root`: v2 when
    `root/cgroup.controllers` lists cpu and memory, else v1's `root/cpu`, `root/cpuacct` and
    `root/memory` (or co-mounted `cpu,cpuacct`); with `try_mkdir`, a trial cgroup is made and
    removed in each, so a read-only or foreign tree is found out now, not at a launch."""
    hierarchy, reason = _find_hierarchy(root)
    if hierarchy is None:
        return Probe(None, reason)
    if try_mkdir:
        failure = _trial_cgroup(hierarchy)
        if failure:
            return Probe(None, failure)
    return Probe(hierarchy, f"{hierarchy.describe()} under {root}")


def _find_hierarchy(root: Path) -> tuple[Hierarchy | None, str]:
    controllers = root / "cgroup.controllers"
    if controllers.is_file():
        try:
            names = set(controllers.read_text().split())
        except OSError as exc:
            return None, f"cannot read {controllers}: {exc}"
        missing = {"cpu", "memory"} - names
        if missing:
            return None, f"cgroup v2 at {root} lacks the {', '.join(sorted(missing))} controller"
        return Hierarchy(2, root, root, root), ""
    found: dict[str, Path] = {}
    for controller, marker in (("cpu", "cpu.cfs_quota_us"), ("cpuacct", "cpuacct.stat"),
                               ("memory", "memory.limit_in_bytes")):
        directory = _v1_directory(root, controller, marker)
        if directory is None:
            return None, f"no cgroup v1 {controller} controller (with {marker}) under {root}"
        found[controller] = directory
    return Hierarchy(1, found["cpu"], found["cpuacct"], found["memory"]), ""


def _v1_directory(root: Path, controller: str, marker: str) -> Path | None:
    for name in (controller, "cpu,cpuacct", "cpuacct,cpu"):
        directory = root / name
        if (directory / marker).is_file() and (directory / "cgroup.procs").is_file():
            return directory
    return None


def _trial_cgroup(hierarchy: Hierarchy) -> str:
    """'' when a cgroup can be made and removed in every controller, else why not."""
    name = f"{CGROUP_PREFIX}probe-{os.getpid()}-{time.monotonic_ns()}"
    for base in _unique((hierarchy.cpu, hierarchy.cpuacct, hierarchy.memory)):
        trial = base / name
        try:
            trial.mkdir()
        except OSError as exc:
            return f"cannot make a cgroup in {base}: {exc.strerror or exc}"
        try:
            trial.rmdir()
        except OSError as exc:
            return f"cannot remove the trial cgroup {trial}: {exc.strerror or exc}"
    return ""


def _unique(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path not in out:
            out.append(path)
    return out


def cgroup_name(agent_id: str, container_id: str) -> str:
    """The container's cgroup name: findable by prefix, one path component."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{agent_id}-{container_id}")
    return f"{CGROUP_PREFIX}{safe}"


def cgexec_argv(procs_files: list[Path], argv: list[str]) -> list[str]:
    """`argv` started by a shell that first writes its own pid into each `cgroup.procs` file and
    then execs `argv` (same pid), so the executor and everything it forks are born inside the
    cgroup. Paths and argv are positional parameters, never script text; if a write fails the
    shell exits with `CGEXEC_FAILED` and the error on stderr, and `argv` never runs."""
    script = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit '
              f'{CGEXEC_FAILED}; shift; n=$((n - 1)); done; exec "$@"')
    return ["/bin/sh", "-c", script, "elastiq-cgexec", str(len(procs_files)),
            *[str(p) for p in procs_files], *argv]


class ContainerCgroup:
    """One container's cgroup in every controller of `hierarchy`."""

    def __init__(self, hierarchy: Hierarchy, name: str):
        self.hierarchy = hierarchy
        self.name = name
        self.cpus = 0.0
        self.memory_limit = 0  # the hard limit in force, in bytes

    def _dir(self, controller: str) -> Path:
        base = {"cpu": self.hierarchy.cpu, "cpuacct": self.hierarchy.cpuacct,
                "memory": self.hierarchy.memory}[controller]
        return base / self.name

    def directories(self) -> list[Path]:
        return _unique(self._dir(c) for c in ("cpu", "cpuacct", "memory"))

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.directories()]

    def create(self, cpus: float, mem_mb: float) -> None:
        """Make the cgroup and set its limits; OSError (after undoing) when it cannot."""
        if self.hierarchy.version == 2:
            _enable_v2_controllers(self.hierarchy.cpu)
        made: list[Path] = []
        try:
            for directory in self.directories():
                directory.mkdir()
                made.append(directory)
            self.resize(cpus, mem_mb)
        except OSError:
            for directory in reversed(made):
                _rmdir_quietly(directory)
            raise

    def resize(self, cpus: float, mem_mb: float) -> None:
        """Set the limits for `cpus` and `mem_mb`; the memory hard limit only grows."""
        values = cgroup_values(cpus, mem_mb)
        if self.hierarchy.version == 2:
            for file, text in v2_files(values).items():
                _write(self._dir("cpu") / file, text)
        else:
            for (controller, file), text in v1_files(values).items():
                _write(self._dir(controller) / file, text)
        if values.memory_bytes > self.memory_limit:
            limit_file = ("memory.max" if self.hierarchy.version == 2
                          else "memory.limit_in_bytes")
            _write(self._dir("memory") / limit_file, str(values.memory_bytes))
            self.memory_limit = values.memory_bytes
        self.cpus = cpus

    def pids(self) -> list[int]:
        """Every process in the container (any controller's view)."""
        pids: set[int] = set()
        for procs in self.procs_files():
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except (OSError, ValueError):
                continue
        return sorted(pids)

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer killed in the container."""
        name = "memory.events" if self.hierarchy.version == 2 else "memory.oom_control"
        fields = _keyed(_read(self._dir("memory") / name))
        return int(fields.get("oom_kill", 0))

    def max_memory_used(self) -> int:
        """The peak memory use (v1 max_usage_in_bytes; v2 memory.peak, else current)."""
        memory = self._dir("memory")
        if self.hierarchy.version == 1:
            return _int(_read(memory / "memory.max_usage_in_bytes"))
        return _int(_read(memory / "memory.peak")) or _int(_read(memory / "memory.current"))

    def statistics(self, timestamp: float) -> dict[str, float]:
        """Mesos's `ResourceStatistics` of the container from its cgroup files."""
        stats: dict[str, float] = {"timestamp": timestamp, "cpus_limit": self.cpus,
                                   "mem_limit_bytes": float(self.memory_limit)}
        if self.hierarchy.version == 2:
            cpu = _keyed(_read(self._dir("cpu") / "cpu.stat"))
            stats.update(
                cpus_user_time_secs=cpu.get("user_usec", 0) / 1e6,
                cpus_system_time_secs=cpu.get("system_usec", 0) / 1e6,
                cpus_nr_periods=float(cpu.get("nr_periods", 0)),
                cpus_nr_throttled=float(cpu.get("nr_throttled", 0)),
                cpus_throttled_time_secs=cpu.get("throttled_usec", 0) / 1e6)
            memory = _keyed(_read(self._dir("memory") / "memory.stat"))
            stats.update(mem_rss_bytes=float(memory.get("anon", 0)),
                         mem_total_bytes=float(_int(_read(self._dir("memory")
                                                          / "memory.current"))))
            return stats
        acct = _keyed(_read(self._dir("cpuacct") / "cpuacct.stat"))
        cpu = _keyed(_read(self._dir("cpu") / "cpu.stat"))
        memory = _keyed(_read(self._dir("memory") / "memory.stat"))
        stats.update(
            cpus_user_time_secs=acct.get("user", 0) / USER_HZ,
            cpus_system_time_secs=acct.get("system", 0) / USER_HZ,
            cpus_nr_periods=float(cpu.get("nr_periods", 0)),
            cpus_nr_throttled=float(cpu.get("nr_throttled", 0)),
            cpus_throttled_time_secs=cpu.get("throttled_time", 0) / 1e9,
            mem_rss_bytes=float(memory.get("total_rss", memory.get("rss", 0))),
            mem_total_bytes=float(_int(_read(self._dir("memory") / "memory.usage_in_bytes"))))
        return stats

    def destroy(self, timeout: float = 5.0) -> bool:
        """SIGKILL whatever still runs inside, then remove the cgroup; True when it is gone.
        Bounded: a cgroup still busy after `timeout` is logged and left (its name says whose)."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.pids():
                _kill(pid)
            left = [d for d in self.directories() if d.exists() and not _rmdir_quietly(d)]
            if not left:
                return True
            if time.monotonic() > deadline:
                logger.warning("cgroup %s could not be removed (still busy): %s", self.name,
                               [str(d) for d in left])
                return False
            time.sleep(0.05)


def _enable_v2_controllers(root: Path) -> None:
    control = root / "cgroup.subtree_control"
    enabled = set(_read(control).split())
    wanted = [c for c in ("cpu", "memory") if c not in enabled]
    if wanted:
        _write(control, " ".join(f"+{c}" for c in wanted))


def _write(path: Path, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return 0


def _keyed(text: str) -> dict[str, int]:
    """`name value` lines -> {name: value} (lines that are not so are skipped)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def _rmdir_quietly(directory: Path) -> bool:
    """True when `directory` is gone (removed now or before)."""
    try:
        directory.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
            logger.warning("cannot remove cgroup %s: %s", directory, exc)
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- unisolated usage (/proc)

def session_pids(session: int, proc: Path = Path("/proc")) -> list[int]:
    """Processes of session `session` (an executor's, started with `start_new_session`)."""
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(proc / entry.name / "stat")
        if fields and int(fields[3]) == session:  # fields after "(comm)": state ppid pgrp session
            pids.append(int(entry.name))
    return sorted(pids)


def _stat_fields(path: Path) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces)."""
    text = _read(path)
    closing = text.rfind(")")
    return text[closing + 2:].split() if closing >= 0 else []


def proc_statistics(pids: Iterable[int], timestamp: float, cpus: float, mem_mb: float,
                    proc: Path = Path("/proc")) -> dict[str, float]:
    """`ResourceStatistics` of an unisolated container from /proc, as Mesos's posix isolators:
    user and system time and resident memory of its processes; limits are its resources."""
    user = system = rss = 0
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    for pid in pids:
        fields = _stat_fields(proc / str(pid) / "stat")
        if len(fields) > 21:
            user += int(fields[11])  # utime (field 14 of stat)
            system += int(fields[12])  # stime (15)
            rss += int(fields[21]) * page  # rss in pages (24)
    return {"timestamp": timestamp, "cpus_limit": cpus,
            "cpus_user_time_secs": user / USER_HZ, "cpus_system_time_secs": system / USER_HZ,
            "mem_limit_bytes": float(int(mem_mb * MB)), "mem_rss_bytes": float(rss)}


def memory_limitation_message(limit_bytes: int, peak_bytes: int) -> str:
    """Mesos 1.11's message for a container killed over its memory limit."""
    return (f"Memory limit exceeded: Requested: {limit_bytes // MB}MB "
            f"Maximum Used: {peak_bytes // MB}MB")


def agent_cgroups(hierarchy: Hierarchy, agent_id: str) -> list[str]:
    """Names of the container cgroups of agent `agent_id` (any controller) that exist now."""
    prefix = cgroup_name(agent_id, "")
    names: set[str] = set()
    for base in _unique((hierarchy.cpu, hierarchy.cpuacct, hierarchy.memory)):
        names.update(p.name for p in base.glob(f"{prefix}*") if p.is_dir())
    return sorted(names)


def remove_agent_cgroups(agent_id: str, root: Path = CGROUP_ROOT) -> int:
    """Destroy the cgroups an agent left (one SIGKILLed before its containers ended); returns
    how many there were."""
    hierarchy = probe(root, try_mkdir=False).hierarchy
    if hierarchy is None or not agent_id:
        return 0
    names = agent_cgroups(hierarchy, agent_id)
    for name in names:
        ContainerCgroup(hierarchy, name).destroy()
    return len(names)
