"""A whole embedded cluster on one machine: a master and N agents, in-process or not.

Owns starting and stopping them together (`EmbeddedCluster` is a context manager), restarting
the master on the same port (`restart_master`, same cluster secret and framework credential), and starting an agent as a
separate OS process (`AgentProcess`, handed the secret in its environment) for fault tests that
SIGKILL it. It does not own master or agent behaviour.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from embedded_mesos.agent import EmbeddedAgent, IsolationSetting, SilenceSetting
from embedded_mesos.auth import FrameworkCredential
from embedded_mesos.executors import kill_recorded_executors
from embedded_mesos.httpio import SECRET_ENV
from embedded_mesos.isolation import CGROUP_ROOT, remove_agent_cgroups
from embedded_mesos.master import EmbeddedMaster

logger = logging.getLogger(__name__)
READY_PREFIX = "ELASTIQ_EMBEDDED_READY "


class AgentProcess:
    """An agent running as `python -m embedded_mesos agent` in its own session."""

    def __init__(self, master_url: str, work_dir: Path, resources: Mapping[str, Any],
                 ping_interval: float = 0.5, executor_grace_seconds: float = 3.0,
                 ready_timeout: float = 20.0, executor_silence_after: SilenceSetting = "auto",
                 secret: str = "", isolation: IsolationSetting = "auto"):
        """`secret` is the master's; it reaches the process in its environment, not argv."""
        self.work_dir = work_dir
        argv = [sys.executable, "-m", "embedded_mesos", "agent", "--master", master_url,
                "--work-dir", str(work_dir), "--resources", json.dumps(dict(resources)),
                "--ping-interval", str(ping_interval),
                "--executor-grace", str(executor_grace_seconds)]
        if executor_silence_after != "auto":
            argv += ["--executor-silence", str(executor_silence_after or "off")]
        if isolation != "auto":
            argv += ["--isolation", isolation]
        work_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(work_dir / "agent.log", "ab")
        env = {**os.environ, SECRET_ENV: secret} if secret else None
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        env=env)
        ready = _read_ready_line(self.process, ready_timeout)
        self.agent_id: str = ready["agent_id"]
        self.url: str = ready["url"]

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the agent process only (its executors live in their own sessions)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def stop(self, grace_seconds: float = 5.0) -> None:
        """SIGTERM the agent (which ends its executors), SIGKILL after the grace, then SIGKILL
        any executor it left behind (e.g. after it was itself SIGKILLed)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5.0)
        else:
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        kill_recorded_executors(self.work_dir)
        remove_agent_cgroups(self.agent_id)  # what a SIGKILLed agent could not remove


def _read_ready_line(process: subprocess.Popen, timeout: float) -> dict[str, Any]:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        readable, _, _ = select.select([process.stdout], [], [], 0.1)
        if readable:
            chunk = os.read(process.stdout.fileno(), 4096)
            buffer += chunk
            for line in buffer.decode("utf-8", "replace").splitlines():
                if line.startswith(READY_PREFIX):
                    return json.loads(line[len(READY_PREFIX):])
    process.kill()
    process.wait()
    raise RuntimeError(f"agent process did not become ready within {timeout}s "
                       f"(exit code {process.returncode}); see its agent.log")


def agent_resources(resources: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Agent `index`'s share of one host: the same cpus and memory, and the `index`-th band of
    ports as wide as the configured range ("31000-31999" -> agent 1 gets "32000-32999"), so two
    agents never hand out the same port on 127.0.0.1."""
    low, _, high = str(resources.get("ports", "31000-31999")).partition("-")
    width = int(high) - int(low) + 1
    first = int(low) + index * width
    if first + width - 1 > 65535:
        raise ValueError(f"no port band for agent {index}: {width} ports from {low} run past 65535")
    return {**resources, "ports": f"{first}-{first + width - 1}"}


class EmbeddedCluster:
    """A master and `agents` in-process agents on 127.0.0.1; use as a context manager."""

    def __init__(self, agents: int = 1, resources: Mapping[str, Any] | None = None,
                 work_dir: str | Path | None = None, offer_interval: float = 0.2,
                 agent_timeout: float = 5.0, heartbeat_interval: float = 15.0,
                 ping_interval: float = 0.5, executor_grace_seconds: float = 3.0,
                 executor_silence_after: SilenceSetting = "auto",
                 isolation: IsolationSetting = "auto", cgroup_root: str | Path | None = None,
                 **master_options: Any):
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="elastiq-cluster-")).resolve()
        self.resources = dict(resources or {"cpus": 2, "mem": 2048, "ports": "31000-31999"})
        self.agent_count = agents
        self.ping_interval = ping_interval
        self.executor_grace_seconds = executor_grace_seconds
        self.heartbeat_interval = heartbeat_interval
        self.executor_silence_after = executor_silence_after  # each agent's; see EmbeddedAgent
        self.isolation = isolation  # each agent's: cgroups, none, or auto (see EmbeddedAgent)
        self.cgroup_root = cgroup_root  # None: /sys/fs/cgroup
        self.master = EmbeddedMaster(offer_interval=offer_interval, agent_timeout=agent_timeout,
                                     heartbeat_interval=heartbeat_interval, **master_options)
        self.agents: list[EmbeddedAgent] = []
        self.agent_processes: list[AgentProcess] = []

    @property
    def master_url(self) -> str:
        return self.master.url

    @property
    def framework_credential(self) -> FrameworkCredential:
        """What a scheduler must present to the master (HTTP Basic): pass its `principal` and
        `secret` to pymesos's MesosSchedulerDriver or to SchedulerService."""
        return self.master.framework_credential

    @property
    def master_address(self) -> str:
        """`127.0.0.1:PORT`, what pymesos's MesosSchedulerDriver takes as its master."""
        return self.master.address

    def start(self) -> "EmbeddedCluster":
        self.master.start()
        try:
            for _ in range(self.agent_count):
                self.add_agent()
        except BaseException:
            self.stop()
            raise
        return self

    def add_agent(self, resources: Mapping[str, Any] | None = None) -> EmbeddedAgent:
        """Start one more in-process agent on its own port; without `resources` it offers the
        cluster's resources with a port band of its own (agents share this host's ports)."""
        index = len(self.agents) + len(self.agent_processes)
        agent = EmbeddedAgent(self.master_url, resources or agent_resources(self.resources, index),
                              self.work_dir / f"agent-{index}",
                              ping_interval=self.ping_interval,
                              executor_grace_seconds=self.executor_grace_seconds,
                              heartbeat_interval=self.heartbeat_interval,
                              executor_silence_after=self.executor_silence_after,
                              secret=self.master.secret, isolation=self.isolation,
                              cgroup_root=self.cgroup_root or CGROUP_ROOT)
        self.agents.append(agent)
        agent.start()
        return agent

    def restart_master(self, downtime: float = 0.0) -> EmbeddedMaster:
        """Stop the master, wait `downtime` seconds, and start a new master on the same port;
        the agents (keeping their executors) and frameworks re-register with it by themselves.
        Returns the new master (also `self.master`)."""
        old = self.master
        old.stop()
        if downtime > 0:
            time.sleep(downtime)
        self.master = old.successor().start()
        logger.info("cluster: master %s restarted as %s on %s", old.state.master_id,
                    self.master.state.master_id, self.master.url)
        return self.master

    def start_agent_process(self, resources: Mapping[str, Any] | None = None) -> AgentProcess:
        """Start an agent as a separate process (to SIGKILL it in fault tests)."""
        index = len(self.agents) + len(self.agent_processes)
        handle = AgentProcess(self.master_url, self.work_dir / f"agent-{index}",
                              resources or self.resources, self.ping_interval,
                              self.executor_grace_seconds,
                              executor_silence_after=self.executor_silence_after,
                              secret=self.master.secret, isolation=self.isolation)
        self.agent_processes.append(handle)
        return handle

    def stop(self) -> None:
        """Stop every agent (ending every executor it started), then the master."""
        for handle in self.agent_processes:
            handle.stop()
        for agent in self.agents:
            agent.stop()
        self.master.stop()
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
