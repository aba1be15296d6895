"""`elastiq run`: one query on an embedded one-machine cluster, its results in the terminal.

Owns the local run: compile the spec, start the embedded Mesos-compatible master and agents, the
framework scheduler and (through the agents) one executor per agent, submit the query, follow its
sinks (file sinks' JSON lines and console sinks' lines in the executors' output), show a live
progress line, and on Ctrl-C (or when the query ends or `--duration` passes) stop everything it
started. It composes the real parts; it decides nothing a long-running deployment would not.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from common.failures import kind_in
from common.paths import PathRoots, local_roots
from compiler.pipeline import compile_spec_file
from compiler.validate import AgentRoom
from elastiq.launch import (LaunchError, check_java, embedded_cluster, executor_spec,
                            executor_token_environment)
from elastiq.progress import AgentCpu, ProgressLine, Summary
from elastiq.sink_watch import Follower, SinkWatch
from elastiq.sizing import ClusterSize, PlanDoesNotFit, size_cluster

log = logging.getLogger("elastiq.run")

TERMINAL = ("finished", "failed", "stopped")


@dataclass(frozen=True)
class RunOptions:
    spec: Path
    agents: int | None = None  # None: as many as the plan's placement needs (at least 1)
    cpus_per_agent: float | None = None  # scheduling units each agent offers; None: from the plan
    mem_per_agent_mb: int | None = None  # None: from the plan (elastiq.sizing)
    state_dir: Path | None = None  # default: a fresh temporary folder, removed afterwards
    duration: float | None = None  # seconds; None: until Ctrl-C or the query ends
    show_progress: bool = True
    api_port: int | None = 8088  # the scheduler API on 127.0.0.1 (busy: any free port); None: off
    path_roots: tuple[str, ...] = ()  # folders file operators may use besides the defaults


class RunError(LaunchError):
    """A problem the user can fix (the plan does not fit, the query refused, ...), in plain
    words; a `LaunchError` (Java missing) is one too."""


@dataclass
class FailureNotes:
    """Says once per failed task attempt why it failed and what the scheduler does about it, so
    a user sees restarts as they happen. A kill or migration the user asked for is no failure
    (the scheduler records none for it)."""

    said: set[tuple[str, int]] = field(default_factory=set)

    def news(self, status: dict[str, Any] | None) -> list[str]:
        notes = []
        for task in (status or {}).get("tasks", []):
            reason = task.get("last_failure")
            key = (task.get("task_id", "?"), int(task.get("last_failure_attempt", 0) or 0))
            if reason and key[1] and key not in self.said:
                self.said.add(key)
                notes.append(f"task {key[0]} failed ({reason}); {_what_next(reason)}")
        return notes


def _what_next(reason: str) -> str:
    """What the scheduler does after a failure with this reason (`common.failures`)."""
    kind = kind_in(reason)
    if kind == "port":
        return "the scheduler relaunches it on another port"
    if kind == "permanent":
        return "retrying cannot heal that, so the query fails"
    return "the scheduler restarts it from its checkpoint"


def run(options: RunOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run a query until it ends, `duration` passes or the user presses Ctrl-C. Returns the
    exit status: 0 when the query finished or was stopped by the user, 1 when it failed."""
    check_java()
    state = options.state_dir or Path(tempfile.mkdtemp(prefix="elastiq-run-"))
    try:
        roots = local_roots(options.spec.resolve().parent, options.path_roots, state)
        compilation = compile_spec_file(options.spec, path_roots=roots, check_inputs=True,
                                        room=agent_room(options))
        for warning in compilation.warnings:
            print(warning.render(), file=err)
        size = cluster_size(compilation.query, options)
        return _run_in(state, compilation, size, options, out, err, roots)
    finally:
        if options.state_dir is None:
            shutil.rmtree(state, ignore_errors=True)


def agent_room(options: RunOptions) -> AgentRoom | None:
    """The most one task may ask for on the agents `--cpus`/`--mem` give (their size less the
    executor's own share), so that an operator's cpus=/mem= over it is refused at its value
    when the spec is checked; None when neither flag is given (the agents are sized from the
    plan). A share that leaves no room is left to the sizing's own message."""
    from scheduler.config import ExecutorSpec

    spec = ExecutorSpec()
    cpus, mem = options.cpus_per_agent, options.mem_per_agent_mb
    if cpus is None and mem is None:
        return None
    room_cpus = cpus - spec.cpus if cpus is not None and cpus > spec.cpus else math.inf
    room_mem = mem - spec.mem_mb if mem is not None and mem > spec.mem_mb else math.inf
    given = " and ".join(f for f in (f"--cpus {cpus:g}" if cpus is not None else "",
                                     f"--mem {mem}" if mem is not None else "") if f)
    return AgentRoom(room_cpus, room_mem, f"{given}, less the executor's own {spec.cpus:g} "
                                          f"cpus and {spec.mem_mb:g} MB")


def cluster_size(query: Any, options: RunOptions) -> ClusterSize:
    """The embedded agents for the plan (`elastiq.sizing`), or a RunError at once saying what
    is missing and which flag gives it."""
    from scheduler.config import ExecutorSpec
    from scheduler.placement import Share

    spec = ExecutorSpec()
    try:
        return size_cluster(query.tasks, Share(spec.cpus, spec.mem_mb), options.agents,
                            options.cpus_per_agent, options.mem_per_agent_mb)
    except PlanDoesNotFit as exc:
        raise RunError(str(exc)) from None


def _run_in(state: Path, compilation: Any, size: ClusterSize, options: RunOptions, out: TextIO,
            err: TextIO, roots: PathRoots) -> int:
    from scheduler.config import SchedulerConfig
    from scheduler.mesos_adapter import SchedulerService

    query = compilation.query
    api_port = api_port_for(options.api_port)  # the executors' token file names this port
    resources = {"cpus": size.cpus, "mem": size.mem_mb}  # ports: a claimed band per agent
    executor = executor_spec(state, roots, executor_token_environment(None, api_port or 0),
                             extra_env=(("ELASTIQ_SPARK_CORES", str(spark_cores(size.cpus))),
                                        ("PYTHONPATH", _pythonpath())))
    config = SchedulerConfig(executor=executor)
    print(f"elastiq: running {query.query_id} ({len(query.tasks)} task(s)) on "
          f"{size.agents} embedded agent(s) of {size.cpus:g} cpus and {size.mem_mb} MB; Ctrl-C "
          "stops it", file=err)
    with embedded_cluster(size.agents, resources, state / "cluster",
                          isolation=run_isolation(os.environ)) as cluster:
        print(f"elastiq: agents' isolation: {cluster.agents[0].isolation}"
              + ("" if cluster.agents[0].isolation != "none" else
                 " (--cpus and --mem are not enforced; see docs/deploy.md)"), file=err)
        credential = cluster.framework_credential  # the embedded master authenticates us
        service = SchedulerService(cluster.master_address, config, principal=credential.principal,
                                   secret=credential.secret).start()
        api = _serve_api(service, api_port, query.query_id, err)
        try:
            reply = service.submit(query, source=_source(options.spec, query.query_id))
            if not reply.accepted:
                raise RunError(f"the scheduler refused the query: {reply.message}")
            return _follow(service, query, state / "cluster", options, out, err,
                           lambda: agents_cpu(cluster.agents))
        finally:
            if api is not None:
                api.stop()
            service.stop_query(query.query_id)
            _wait_until_ended(service, query.query_id, timeout=20.0)
            service.stop(failover=False)


def run_isolation(environ: Any) -> Any:
    """The embedded agents' isolation for `elastiq run`: cgroups (each executor container held
    to its cpus and mem, as Mesos's cgroups isolators), unless ELASTIQ_AGENT_ISOLATION says
    `none`; an agent where no cgroup can be made runs unisolated and says so."""
    from embedded_mesos.agent import ISOLATION_ENV, resolve_isolation

    return resolve_isolation("auto", {ISOLATION_ENV: "cgroups", **environ})


def api_port_for(wanted: int | None) -> int | None:
    """The port the run's API will serve on: `wanted` when it is free, else one the kernel
    picks (None: no API). Chosen before the executors are configured, whose token file names
    the port."""
    if wanted is None:
        return None
    from embedded_mesos.ports import port_bindable

    if wanted and port_bindable(wanted):
        return wanted
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve_api(service: Any, port: int | None, query_id: str, err: TextIO) -> Any:
    """The scheduler's API on 127.0.0.1 (`port`, or any free one when it is taken), so `elastiq
    status`, `control` and `migrate` reach the running query; None when `port` is None. Its
    token is new and written (mode 0600) where the CLI looks for the port's token
    (`common.api_token`); it is removed when the API stops."""
    if port is None:
        return None
    from scheduler.api import ApiServer

    try:
        api = ApiServer.serving(service, host="127.0.0.1", port=port)
    except OSError:  # taken since `api_port_for` chose it
        api = ApiServer.serving(service, host="127.0.0.1", port=0)
        print(f"elastiq: port {port} was taken meanwhile; this run's control sinks cannot "
              "reach its API", file=err)
    hint = "" if api.url.endswith(":8088") else f" --scheduler {api.url}"
    print(f"elastiq: API at {api.url}; try `elastiq control --list {query_id}{hint}`", file=err)
    return api


def _source(spec: Path, query_id: str) -> Any:
    """The spec the query was compiled from, as the scheduler keeps it (`compile_spec_file`
    resolved relative paths against the spec's folder)."""
    from scheduler.query_source import QuerySource

    return QuerySource.of(spec.read_bytes(), str(spec), query_id, str(spec.resolve().parent))


def spark_cores(offered_cpus: float) -> int:
    """Cores for an embedded agent's SparkSession: what it offers, at most what the machine has."""
    return max(1, min(int(offered_cpus), os.cpu_count() or 1))


def _pythonpath() -> str:
    here = str(Path(__file__).resolve().parent.parent)
    existing = os.environ.get("PYTHONPATH")
    return f"{here}:{existing}" if existing else here


def agents_cpu(agents: list[Any]) -> tuple[dict[str, float], dict[str, float]]:
    """Each embedded agent's executors' cpu seconds so far (from its containers' statistics,
    as its `/monitor/statistics`) and the cpus it offers."""
    used = {a.agent_id: sum(c.statistics.get("cpus_user_time_secs", 0.0)
                            + c.statistics.get("cpus_system_time_secs", 0.0)
                            for c in a.containers()) for a in agents}
    return used, {a.agent_id: a.resources.scalars.get("cpus", 0.0) for a in agents}


def _follow(service: Any, query: Any, cluster_dir: Path, options: RunOptions, out: TextIO,
            err: TextIO, measure: Any = None) -> int:
    follower = Follower()
    watch = SinkWatch()
    for _, path in watch.update(query.sinks):  # show this run's results, not an earlier run's
        follower.skip_existing(path)
    progress = ProgressLine(err, enabled=options.show_progress)
    summary = Summary()
    cpu = AgentCpu()
    limits: dict[str, float] = {}
    failures = FailureNotes()
    console = re.compile(r"^\[" + re.escape(query.query_id) + r"\.t\d+ #\d+\] ")
    deadline = None if options.duration is None else time.monotonic() + options.duration
    interrupted = _install_sigint()
    status: dict[str, Any] | None = None
    while not interrupted() and (deadline is None or time.monotonic() < deadline):
        for sink, path in watch.files():
            for line in follower.lines(path):
                progress.clear()
                print(f"{sink}: {line}", file=out, flush=True)
        for stdout in sorted(cluster_dir.rglob("stdout")):
            for line in follower.lines(stdout):
                if console.match(line):
                    progress.clear()
                    print(line, file=out, flush=True)
        status = service.query_status(query.query_id)
        for sink, path in watch.update((status or {}).get("sinks", {})):
            progress.clear()
            print(f"elastiq: sink {sink} now writes to {path}", file=err, flush=True)
        for note in failures.news(status):
            progress.clear()
            print(f"elastiq: {note}", file=err, flush=True)
        if measure is not None and options.show_progress and cpu.due(time.monotonic()):
            used, limits = measure()
            cpu.update(used, time.monotonic())
        progress.show(" | ".join(p for p in (summary(status), cpu.line(limits)) if p))
        if status and status.get("phase") in TERMINAL:
            break
        time.sleep(0.25)
    progress.clear()
    final = (status or {}).get("phase", "unknown")
    print(f"elastiq: {query.query_id} {final if final in TERMINAL else 'stopped'}", file=err)
    if final == "failed":
        print(f"elastiq: {(status or {}).get('failure') or 'no reason given'}", file=err)
        return 1
    return 0


def _install_sigint() -> Any:
    """Ctrl-C ends the follow loop; the caller then stops everything cleanly."""
    flag = {"hit": False}

    def handler(signum: int, frame: Any) -> None:
        flag["hit"] = True

    signal.signal(signal.SIGINT, handler)
    return lambda: flag["hit"]


def _wait_until_ended(service: Any, query_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = service.query_status(query_id) or {}
        tasks = status.get("tasks", [])
        if all(t.get("state") not in ("staging", "starting", "running") for t in tasks):
            return
        time.sleep(0.2)
