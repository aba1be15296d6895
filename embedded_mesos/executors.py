"""Starting and ending executor processes for the embedded agent.

Owns turning an ExecutorInfo's CommandInfo into a subprocess in its own session with the MESOS_*
environment pymesos's executor driver needs (with the executor's authentication token, when the
agent made one; never the cluster's own secrets), its sandbox directory with stdout/stderr files and a
pid file, starting it inside its container's cgroup when the agent isolates, and ending
process groups (SIGTERM, then SIGKILL after a grace; or SIGKILL at once).
It does not own which tasks an executor runs (that is `agent`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from embedded_mesos.auth import EXECUTOR_TOKEN_ENV, FRAMEWORK_SECRET_ENV
from embedded_mesos.httpio import SECRET_ENV
from embedded_mesos.isolation import cgexec_argv

logger = logging.getLogger(__name__)
# Inherited variables pymesos would misread: it takes bool(str), so "0" means true.
_SCRUBBED = ("MESOS_CHECKPOINT", "MESOS_LOCAL", "MESOS_RECOVERY_TIMEOUT",
             "MESOS_SUBSCRIPTION_BACKOFF_MAX")
# The agent's and master's secrets, which an executor (framework code) must not inherit.
_PRIVATE = (SECRET_ENV, FRAMEWORK_SECRET_ENV, EXECUTOR_TOKEN_ENV)


class ExecutorLaunchError(Exception):
    """The executor command cannot be started; the message says why."""


@dataclass(frozen=True)
class ExecutorEnvironment:
    """What an executor needs to find its agent."""

    agent_endpoint: str  # host:port, no scheme (pymesos splits on ':')
    agent_id: str
    framework_id: str
    executor_id: str
    sandbox: Path
    shutdown_grace_seconds: float
    auth_token: str | None = None  # for MESOS_EXECUTOR_AUTHENTICATION_TOKEN; None: no auth


def command_argv(command: Mapping[str, Any]) -> list[str]:
    """CommandInfo -> argv: `sh -c value` when shell (the default), else arguments or [value]."""
    value = command.get("value")
    if not isinstance(value, str) or not value:
        raise ExecutorLaunchError("executor.command.value is missing")
    if command.get("shell", True):
        return ["/bin/sh", "-c", value]
    arguments = command.get("arguments") or [value]
    if not all(isinstance(a, str) for a in arguments):
        raise ExecutorLaunchError("executor.command.arguments must be strings")
    return list(arguments)


def executor_env(command: Mapping[str, Any], where: ExecutorEnvironment) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED + _PRIVATE}
    variables = (command.get("environment") or {}).get("variables") or []
    for variable in variables:
        if isinstance(variable, dict) and isinstance(variable.get("name"), str):
            env[variable["name"]] = str(variable.get("value", ""))
    env.update({
        "MESOS_AGENT_ENDPOINT": where.agent_endpoint,
        "MESOS_AGENT_ID": where.agent_id,
        "MESOS_SLAVE_ID": where.agent_id,
        "MESOS_FRAMEWORK_ID": where.framework_id,
        "MESOS_EXECUTOR_ID": where.executor_id,
        "MESOS_DIRECTORY": str(where.sandbox),
        "MESOS_SANDBOX": str(where.sandbox),
        "MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD": f"{where.shutdown_grace_seconds:g}secs",
    })
    for name in _SCRUBBED + _PRIVATE:
        env.pop(name, None)
    if where.auth_token is not None:
        env[EXECUTOR_TOKEN_ENV] = where.auth_token
    return env


def start_executor(command: Mapping[str, Any], where: ExecutorEnvironment,
                   cgroup_procs: Sequence[Path] = ()) -> subprocess.Popen:
    """Start the executor in a new session; its output goes to files in its sandbox. With
    `cgroup_procs` (the `cgroup.procs` files of its container's cgroup), it starts inside that
    cgroup through `isolation.cgexec_argv`, so nothing it forks is ever outside."""
    argv = command_argv(command)
    if cgroup_procs:
        argv = cgexec_argv(list(cgroup_procs), argv)
    where.sandbox.mkdir(parents=True, exist_ok=True)
    env = executor_env(command, where)
    with open(where.sandbox / "stdout", "ab") as out, open(where.sandbox / "stderr", "ab") as err:
        try:
            process = subprocess.Popen(argv, cwd=where.sandbox, env=env, stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=err, start_new_session=True)
        except OSError as exc:
            raise ExecutorLaunchError(f"cannot start {argv[0]!r}: {exc}") from None
    (where.sandbox / "executor.pid").write_text(f"{process.pid}\n")
    logger.info("executor %s of framework %s started as pid %s in %s", where.executor_id,
                where.framework_id, process.pid, where.sandbox)
    return process


def end_process_group(process: subprocess.Popen, grace_seconds: float) -> None:
    """SIGTERM the process's group, SIGKILL it after `grace_seconds`; waits for the leader."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(process.pid, signal.SIGKILL)
    try:
        process.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        logger.error("executor pid %s survived SIGKILL", process.pid)


def kill_group_now(process: subprocess.Popen) -> None:
    """SIGKILL the process's group at once (a stopped process dies too); nothing if the leader
    was already reaped (its pid may be reused)."""
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGKILL)


def kill_group_later(process: subprocess.Popen, delay: float) -> None:
    """SIGKILL the group after `delay` unless the leader has exited (executor SHUTDOWN grace)."""
    def _kill() -> None:
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            time.sleep(0.05)
        _signal_group(process.pid, signal.SIGKILL)

    threading.Thread(target=_kill, name=f"kill-later-{process.pid}", daemon=True).start()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_recorded_executors(work_dir: Path) -> int:
    """SIGKILL every executor group whose pid file lies under `work_dir` (for an agent that was
    itself killed); returns how many groups were signalled."""
    count = 0
    for pid_file in work_dir.rglob("executor.pid"):
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if _group_alive(pid):
            _signal_group(pid, signal.SIGKILL)
            count += 1
    return count


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
