"""Embedded agents as separate hosts in network namespaces, for tests that cut a host off.

Owns `NetnsAgent`, an embedded agent process started with `ip netns exec` inside a host of a
`testkit.netns.NetnsNetwork` (the namespaces, the bridge and the cut live there, shared with the
DPC test and benchmark), and the helpers that watch its executors (`group_alive`) and read its
ready line. It owns no product behaviour.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from embedded_mesos.executors import kill_recorded_executors
from testkit.netns import NetnsNetwork

log = logging.getLogger("tests.netns")
READY_PREFIX = "ELASTIQ_EMBEDDED_READY "


class NetnsAgent:
    """`python -m embedded_mesos agent` inside a host's namespace, in its own session."""

    def __init__(self, net: NetnsNetwork, host: str, master_url: str, work_dir: Path,
                 resources: Mapping[str, Any], env: Mapping[str, str] | None = None,
                 executor_grace_seconds: float = 3.0, ready_timeout: float = 20.0):
        self.work_dir = work_dir
        self.host = host
        argv = [sys.executable, "-m", "embedded_mesos", "agent", "--master", master_url,
                "--host", net.address(host), "--work-dir", str(work_dir),
                "--resources", json.dumps(dict(resources)),
                "--executor-grace", str(executor_grace_seconds)]
        work_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(work_dir / "agent.log", "ab")
        self.process = subprocess.Popen(
            net.exec_argv(host, argv), stdout=subprocess.PIPE, stderr=self._log,
            stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **(env or {})})
        ready = read_ready_line(self.process, ready_timeout)
        self.agent_id: str = ready["agent_id"]
        self.url: str = ready["url"]

    def log_text(self) -> str:
        return (self.work_dir / "agent.log").read_text(errors="replace")

    def executor_pids(self) -> list[int]:
        """Pids recorded by every executor this agent started (alive or not)."""
        pids = []
        for pid_file in self.work_dir.rglob("executor.pid"):
            try:
                pids.append(int(pid_file.read_text().strip()))
            except (OSError, ValueError):
                continue
        return pids

    def live_executor_groups(self) -> list[int]:
        return [pid for pid in self.executor_pids() if group_alive(pid)]

    def stop(self, grace_seconds: float = 5.0) -> None:
        """SIGTERM the agent, SIGKILL after the grace, then SIGKILL executor groups it left."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5.0)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        kill_recorded_executors(self.work_dir)


def group_alive(pgid: int) -> bool:
    """Whether process group `pgid` has a live, non-zombie member."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def read_ready_line(process: subprocess.Popen, timeout: float) -> dict[str, Any]:
    """The JSON of the process's `ELASTIQ_EMBEDDED_READY` line, waited for at most `timeout`."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    while time.monotonic() < deadline and process.poll() is None:
        readable, _, _ = select.select([process.stdout], [], [], 0.1)
        if readable:
            buffer += os.read(process.stdout.fileno(), 4096)
            for line in buffer.decode("utf-8", "replace").splitlines():
                if line.startswith(READY_PREFIX):
                    return json.loads(line[len(READY_PREFIX):])
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=5.0)
    raise RuntimeError(f"agent did not become ready within {timeout}s "
                       f"(exit code {process.returncode}); see its agent.log")
