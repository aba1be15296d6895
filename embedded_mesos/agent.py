"""The embedded Mesos-compatible agent: runs executors and serves the v1 executor API.

Owns registering with the embedded master and pinging it (internal protocol over HTTP, so an
agent can live in another process), the executor API (`POST /api/v1/executor`: SUBSCRIBE as a
chunked RecordIO stream, UPDATE, MESSAGE), one executor process per (framework, executor id)
reused for later tasks with that executor id, turning master commands (LAUNCH, KILL, MESSAGE,
ACKNOWLEDGED, SHUTDOWN_FRAMEWORK) into executor events, and reporting an executor's death as
TASK_FAILED updates for its unfinished tasks plus an EXECUTOR_EXITED fact. It does not decide
anything about offers or frameworks (the master does) nor how processes are started
(`executors`). Agent->master traffic goes through one ordered outbox thread.

The cluster secret: master commands arrive on `POST /internal/command`, which is refused with 401
(before its body is read) unless it carries the master's secret (`httpio.SECRET_HEADER`,
compared in constant time); the agent sends the same secret with every call to the master. No
route runs a command given in a request: a LAUNCH from the master starts only the executor
command of the framework's ExecutorInfo, as a Mesos agent does. The secret comes from the
constructor or `ELASTIQ_EMBEDDED_SECRET` (never from the command line).

Executor authentication (on by default, as Mesos's `--authenticate_http_executors`): each
executor launch gets a fresh container id and a token signed with this agent's random key
(`auth.ExecutorTokens`) naming its framework, executor and container, in
`MESOS_EXECUTOR_AUTHENTICATION_TOKEN` of its environment only. Every executor API call must
carry it as `Authorization: Bearer` (401 otherwise, before the body is read), and its claims must
name the call's framework and executor and the executor's current launch (403 otherwise), so
nobody else, not even a dead earlier launch of the same executor, can take over its stream and
read its LAUNCH events. `authenticate_executors=False` turns this off (unsafe).

Self-fencing: an agent that has heard nothing from its master for `fence_after` seconds SIGKILLs
the process group of every executor it runs, so that after a network partition the master's
replacement copy of a task (launched once the master declares this agent lost) never runs beside
the old one and two copies never write one checkpoint or sink. `fence_after` must be shorter than
the master's agent timeout (`--agent-timeout`, 5 s by default). It is off by default, as a real
Mesos agent never does it: the task attempts' own fencing (`executor.fencing`) is what keeps a
stale attempt's writes out. The environment variable `ELASTIQ_AGENT_FENCE_SECONDS` turns it on
(seconds, e.g. `DEFAULT_FENCE_SECONDS`; `off`); an explicit constructor argument overrides it. When the link comes
back the master answers the ping with 404 (it removed the agent), and the agent registers again
under a new agent id with no executors. The decision is `should_fence`, a pure function.

Silent executors: an executor run that has subscribed and has live tasks but from which nothing
has come (no UPDATE, MESSAGE or re-SUBSCRIBE) for `executor_silence_after` seconds (off by
default, as on a real Mesos agent, where the scheduler's failure detector `scheduler.liveness` does
this; `ELASTIQ_EXECUTOR_SILENCE_SECONDS`, seconds such as `DEFAULT_EXECUTOR_SILENCE_SECONDS` or
`off`; an explicit constructor argument wins) is hung (SIGSTOPped, wedged, livelocked): the agent SIGKILLs its process group, and its
exit is reported like a crash, TASK_FAILED / REASON_EXECUTOR_TERMINATED with a message naming
the silence, so the scheduler fails its tasks over. The decision is
`should_kill_silent_executor`, a pure function.

Master restart: while the master is unreachable the agent keeps its executors running (unless
it fences) and holds its events in the outbox. A ping answered 404 means the master does not
know this agent: a restarted master, or one that removed it. Either way the agent re-registers
with its id, its resources and its running executors and tasks (`running_report`); if the
master keeps the id, nothing is stopped (a restarted master rebuilds its tables from this);
if it hands out a new id (it removed this agent), the agent ends its executors first. An event
the master refuses with 404 is retried (bounded) until the agent is registered again under the
id the event happened under, and dropped if that id was replaced.

Isolation (`isolation`: `cgroups`, or `none` as a Mesos agent's default posix isolators;
`ELASTIQ_AGENT_ISOLATION`; `elastiq run` asks for cgroups): each executor container gets a
cgroup (`isolation.py`) sized to the executor's resources plus its live tasks', made before the
executor starts (it is born inside), resized as tasks come and go, watched for OOM kills (the
container is then destroyed and its tasks fail with `REASON_CONTAINER_LIMITATION_MEMORY`, source
`SOURCE_AGENT`, as Mesos 1.11), and removed when the container ends. Where no cgroup can be made
the agent logs it once and runs unisolated; its `isolation` says which (`cgroups v1`, `cgroups
v2`, `none`), also in its offers' `isolation` attribute and `/state`. Usage per container is served
at `GET /monitor/statistics` and by `POST /api/v1` GET_CONTAINERS (`operator_api`), read-only and
open as `/state` is.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from aiohttp import web

from embedded_mesos.auth import (
    BEARER_CHALLENGE, ExecutorClaims, ExecutorTokens, bearer_token, claims_mismatch,
)
from embedded_mesos.executors import (
    ExecutorEnvironment, ExecutorLaunchError, end_process_group, kill_group_later,
    kill_group_now, start_executor,
)
from embedded_mesos.httpio import (
    AGENT_COMMAND_PATH, END_OF_STREAM, SECRET_ENV, SECRET_HEADER, AppServer, EventQueue,
    HttpError, JsonClient, Routes, accepted, bad_request, json_response, read_json,
    require_secret, serve_events,
)
from embedded_mesos import operator_api
from embedded_mesos.isolation import (
    CGROUP_ROOT, ContainerCgroup, Hierarchy, IsolationMode, cgroup_name,
    memory_limitation_message, probe, proc_statistics, session_pids,
)
from embedded_mesos.protocol import id_value, is_terminal, make_status, wait_status
from embedded_mesos.resources import ResourceError, Resources, from_mesos, parse_agent_resources

logger = logging.getLogger(__name__)
DEFAULT_RESOURCES: Mapping[str, Any] = {"cpus": 2, "mem": 2048, "ports": "31000-31999"}
REGISTER_TIMEOUT_SECONDS = 10.0
FENCE_ENV = "ELASTIQ_AGENT_FENCE_SECONDS"
DEFAULT_FENCE_SECONDS = 3.0  # a value to opt in with: below the master's agent timeout of 5 s
FenceSetting = float | None | Literal["auto"]
SILENCE_ENV = "ELASTIQ_EXECUTOR_SILENCE_SECONDS"
# A value to opt in with. Our executor heartbeats every second from a thread of its own: a
# generous bound, so a loaded JVM (GC, a busy machine) is never taken for a hung one.
DEFAULT_EXECUTOR_SILENCE_SECONDS = 30.0
SilenceSetting = float | None | Literal["auto"]
ISOLATION_ENV = "ELASTIQ_AGENT_ISOLATION"
IsolationSetting = Literal["auto", "cgroups", "none"]
MEMORY_LIMITATION = "REASON_CONTAINER_LIMITATION_MEMORY"
ISOLATION_ATTRIBUTE = "isolation"  # the agent attribute naming its isolation
OOM_CHECK_SECONDS = 0.25  # how often the agent looks for OOM kills in its containers


def resolve_isolation(explicit: IsolationSetting, environ: Mapping[str, str]) -> IsolationMode:
    """The isolation asked for: an explicit `cgroups` or `none` wins; then
    `ELASTIQ_AGENT_ISOLATION`; then `none`, as a Mesos agent's default (`posix/cpu,posix/mem`)."""
    if explicit != "auto":
        return _isolation_word(explicit, "isolation")
    text = environ.get(ISOLATION_ENV, "").strip().lower()
    return _isolation_word(text, ISOLATION_ENV) if text else "none"


def _isolation_word(text: str, name: str) -> IsolationMode:
    if text in ("cgroups", "cgroups/cpu,cgroups/mem"):
        return "cgroups"
    if text in ("none", "posix", "posix/cpu,posix/mem", "off"):
        return "none"
    raise ValueError(f"{name}={text!r}: expected 'cgroups' or 'none'")


def container_resources(executor: Any, tasks: list[Any]) -> tuple[float, float]:
    """(cpus, mem MB) of a container, as Mesos counts them: the executor's resources plus
    those of its live tasks (Mesos v1 JSON lists; malformed ones count as nothing)."""
    total = Resources()
    for resources in [executor, *tasks]:
        try:
            total = total + from_mesos(resources or [])
        except ResourceError:
            continue
    return total.scalars.get("cpus", 0.0), total.scalars.get("mem", 0.0)


def resolve_fence_seconds(explicit: FenceSetting, environ: Mapping[str, str], agent_host: str,
                          master_url: str) -> float | None:
    """Seconds of master silence after which the agent fences itself, or None (never).

    An explicit number or None wins; then `ELASTIQ_AGENT_FENCE_SECONDS` (`off`/`0` or seconds);
    then off, as a real Mesos agent (the attempts' own fencing, `executor.fencing`, keeps a
    stale attempt's writes out). `agent_host` and `master_url` are not looked at any more."""
    if explicit != "auto":
        return _positive_or_none(explicit, "fence_after")
    text = environ.get(FENCE_ENV, "").strip().lower()
    if text:
        return _seconds_setting(text, FENCE_ENV)
    return None


def resolve_silence_seconds(explicit: SilenceSetting, environ: Mapping[str, str]) -> float | None:
    """Seconds without a word from a busy executor after which the agent kills it, or None.

    An explicit number or None wins; then `ELASTIQ_EXECUTOR_SILENCE_SECONDS` (`off`/`0` or
    seconds); then off, as a real Mesos agent (the scheduler's failure detector,
    `scheduler.liveness`, handles hung executors)."""
    if explicit != "auto":
        return _positive_or_none(explicit, "executor_silence_after")
    text = environ.get(SILENCE_ENV, "").strip().lower()
    if text:
        return _seconds_setting(text, SILENCE_ENV)
    return None


def _seconds_setting(text: str, name: str) -> float | None:
    """An environment setting: `off` (or no/false/none/0) -> None, else positive seconds."""
    if text in ("off", "no", "false", "none"):
        return None
    try:
        return _positive_or_none(float(text), name)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected seconds or 'off'") from None


def _positive_or_none(value: float | None, what: str) -> float | None:
    if value is None or value == 0:
        return None
    if not value > 0:
        raise ValueError(f"{what}: expected a positive number of seconds, got {value!r}")
    return float(value)


def should_fence(last_contact: float, now: float, fence_after: float | None, fenced: bool,
                 live_executors: int) -> bool:
    """Whether the agent must kill its executors now: fencing is on, it has not fenced since
    the master was last heard, it runs executors, and the master has been silent too long."""
    return (fence_after is not None and not fenced and live_executors > 0
            and now - last_contact >= fence_after)


def should_kill_silent_executor(last_heard: float | None, busy_since: float | None, now: float,
                                silence_after: float | None) -> bool:
    """Whether an executor run must be killed as hung: the check is on, it has subscribed
    (`last_heard` is not None), it has live tasks (`busy_since`, when it last went from none to
    some, is not None), and nothing has come from it for `silence_after` seconds, counted from
    the later of the two (an idle executor that says nothing is not hung, and one just given a
    task gets the full time to answer)."""
    if silence_after is None or last_heard is None or busy_since is None:
        return False
    return now - max(last_heard, busy_since) >= silence_after


@dataclass
class ExecutorRun:
    """One executor process and the tasks it was given."""

    framework_id: str
    executor_id: str
    executor_info: dict[str, Any]
    framework_info: dict[str, Any]
    sandbox: Path
    process: subprocess.Popen
    container_id: str = ""  # this launch of the executor (its token names it)
    events: EventQueue | None = None  # the executor's subscribed stream, if any
    stream_id: str | None = None
    waiting: list[dict[str, Any]] = field(default_factory=list)  # launches not yet delivered
    tasks: dict[str, str] = field(default_factory=dict)  # task id -> last state
    task_resources: dict[str, Any] = field(default_factory=dict)  # task id -> Mesos resources
    shutting_down: bool = False
    watcher: threading.Thread | None = None
    last_heard: float | None = None  # monotonic time of its last call; None until it subscribes
    busy_since: float | None = None  # when it last went from no live task to some; None if idle
    killed_for: str | None = None  # why the agent killed it, for the status of its tasks
    limitation: str | None = None  # the Mesos reason when a resource limit ended it
    cgroup: ContainerCgroup | None = None  # its container's cgroup; None when not isolated

    @property
    def key(self) -> tuple[str, str]:
        return (self.framework_id, self.executor_id)

    def live_tasks(self) -> list[str]:
        return [task_id for task_id, state in self.tasks.items() if not is_terminal(state)]

    def resources(self) -> tuple[float, float]:
        """The container's (cpus, mem MB): the executor's and its live tasks'."""
        return container_resources(self.executor_info.get("resources"),
                                   [self.task_resources.get(t) for t in self.live_tasks()])

    def tasks_changed(self, now: float) -> None:
        """Keep `busy_since` in step with the task states (caller holds the agent's lock)."""
        if not self.live_tasks():
            self.busy_since = None
        elif self.busy_since is None:
            self.busy_since = now


class EmbeddedAgent:
    """An agent for one machine; executors started by it talk to it as to a Mesos agent."""

    def __init__(self, master_url: str, resources: Mapping[str, Any] | None = None,
                 work_dir: str | Path | None = None, agent_id: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, ping_interval: float = 0.5,
                 executor_grace_seconds: float = 3.0, heartbeat_interval: float = 15.0,
                 fence_after: FenceSetting = "auto",
                 executor_silence_after: SilenceSetting = "auto", secret: str | None = None,
                 authenticate_executors: bool = True, isolation: IsolationSetting = "auto",
                 cgroup_root: str | Path = CGROUP_ROOT):
        self.secret = secret or os.environ.get(SECRET_ENV, "")
        if not self.secret:
            raise ValueError(f"the agent needs the cluster secret (the master's `secret`, "
                             f"or {SECRET_ENV} in its environment)")
        self._auth = {SECRET_HEADER: self.secret}
        self.authenticate_executors = authenticate_executors
        self._tokens = ExecutorTokens()  # a key of this agent's alone, never written anywhere
        self.master_url = master_url.rstrip("/")
        self.resources: Resources = parse_agent_resources(resources or DEFAULT_RESOURCES)
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="elastiq-agent-")).resolve()
        self.agent_id = agent_id or ""
        self.host = host
        self.ping_interval = ping_interval
        self.executor_grace_seconds = executor_grace_seconds
        self.heartbeat_interval = heartbeat_interval
        self._server = AppServer(host, port, "agent", self._routes())
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], ExecutorRun] = {}
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._stopping = threading.Event()
        self._workers: list[threading.Thread] = []  # outbox sender and pinger
        self._run_counter = 0
        self.fence_after = resolve_fence_seconds(fence_after, os.environ, host, self.master_url)
        self._last_contact = time.monotonic()  # when the master last answered
        self._fenced = False  # executors were killed since the master was last heard
        self.fence_count = 0
        self.executor_silence_after = resolve_silence_seconds(executor_silence_after, os.environ)
        self.silence_kills = 0
        self.isolation_wanted = resolve_isolation(isolation, os.environ)
        self.cgroup_root = Path(cgroup_root)
        self._hierarchy: Hierarchy | None = None  # found at start when isolating
        self.isolation_note = "not asked for (as Mesos's posix isolators)"

    @property
    def name(self) -> str:
        return f"agent {self.agent_id or '(unregistered)'}"

    @property
    def isolation(self) -> str:
        """What isolates this agent's containers: `cgroups v1`, `cgroups v2` or `none`."""
        return self._hierarchy.describe() if self._hierarchy is not None else "none"

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def address(self) -> str:
        """`host:port`, the form pymesos executors take as MESOS_AGENT_ENDPOINT."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> "EmbeddedAgent":
        """Serve, register with the master (retrying up to 10 s), then ping and send events."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._find_isolation()
        self._server.start()
        self.agent_id = self._register(REGISTER_TIMEOUT_SECONDS)
        logger.info("%s: registered with %s, serving executors on %s", self.name,
                    self.master_url, self.url)
        self._heard_from_master()
        loops = [(self._send_loop, "outbox"), (self._ping_loop, "pinger")]
        if self.fence_after is not None:
            loops.append((self._fence_loop, "fencer"))
            logger.info("%s: fences itself after %.1fs without its master", self.name,
                        self.fence_after)
        if self.executor_silence_after is not None:
            loops.append((self._silence_loop, "silence watch"))
            logger.info("%s: kills an executor with live tasks silent for %.1fs", self.name,
                        self.executor_silence_after)
        if self._hierarchy is not None:
            loops.append((self._oom_loop, "oom watch"))
        for target, name in loops:
            thread = threading.Thread(target=target, name=f"{self.name} {name}", daemon=True)
            thread.start()
            self._workers.append(thread)
        return self

    def _find_isolation(self) -> None:
        """Probe for cgroups when isolation is asked for; where none can be made, say so once
        and run unisolated, as Mesos's posix isolators."""
        if self.isolation_wanted != "cgroups":
            return
        found = probe(self.cgroup_root)
        self._hierarchy = found.hierarchy
        if found.hierarchy is None:
            self.isolation_note = f"no cgroup can be made: {found.reason}"
            logger.warning("agent: isolation none: %s; executors run unisolated (as Mesos's "
                           "posix isolators), --cpus and --mem are not enforced", found.reason)
        else:
            self.isolation_note = found.reason
            logger.info("agent: isolating executors with %s (cpu shares, CFS quota, memory "
                        "limit per container)", found.reason)

    def stop(self) -> None:
        """End every executor process group (SIGTERM, SIGKILL after the grace), report what
        that did to the master, unregister, and stop serving; idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        watchers = self._end_all_executors(self.executor_grace_seconds)
        for watcher in watchers:
            watcher.join(timeout=2.0)
        self._outbox.put(END_OF_STREAM)
        for worker in self._workers:
            worker.join(timeout=3.0)
        self._unregister()
        self._server.stop()
        logger.info("%s: stopped", self.name)

    def _unregister(self) -> None:
        client = JsonClient(self.master_url, timeout=2.0, headers=self._auth)
        try:
            client.post("/internal/agent/unregister", {"agent_id": self.agent_id})
        except OSError as exc:
            logger.info("%s: could not unregister (master gone?): %s", self.name, exc)
        finally:
            client.close()

    def __enter__(self) -> "EmbeddedAgent":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def executor_pids(self) -> dict[tuple[str, str], int]:
        """(framework id, executor id) -> pid of each live executor process."""
        with self._lock:
            return {key: run.process.pid for key, run in self._runs.items()
                    if run.process.poll() is None}

    def _end_all_executors(self, grace: float) -> list[threading.Thread]:
        """End every executor; returns their exit watchers (which report to the master)."""
        with self._lock:
            runs = list(self._runs.values())
            for run in runs:
                run.shutting_down = True
        enders = [threading.Thread(target=end_process_group, args=(run.process, grace),
                                   daemon=True) for run in runs]
        for ender in enders:
            ender.start()
        for ender in enders:
            ender.join(timeout=grace + 6.0)
        return [run.watcher for run in runs if run.watcher is not None]

    # ---------------------------------------------------------------- master link

    def _register(self, timeout: float) -> str:
        """Register (with the current id, if any, and what runs here); returns the id the
        master gave. Raises RuntimeError when the master refuses or stays unreachable."""
        client = JsonClient(self.master_url, headers=self._auth)
        body = {"agent_id": self.agent_id or None, "url": self.url, "hostname": self.host,
                "resources": self.resources.to_mesos(), "attributes": self._attributes(),
                "executors": self.running_report()}
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    status, reply = client.post("/internal/agent/register", body)
                    if status == 200 and isinstance(reply, dict):
                        break
                    raise RuntimeError(f"master refused registration: {status} {reply}")
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"master {self.master_url} unreachable: {exc}") \
                            from None
                    time.sleep(0.1)
        finally:
            client.close()
        return str(reply["agent_id"])

    def running_report(self) -> list[dict[str, Any]]:
        """Live executors and their unfinished tasks, as a (re-)registration reports them."""
        with self._lock:
            runs = [r for r in self._runs.values()
                    if r.process.poll() is None and not r.shutting_down]
            return [{"framework_id": r.framework_id, "executor_id": r.executor_id,
                     "framework_info": r.framework_info,
                     "tasks": [{"task_id": t, "state": state,
                                "resources": r.task_resources.get(t, [])}
                               for t, state in r.tasks.items() if not is_terminal(state)]}
                    for r in runs]

    def _rejoin(self) -> None:
        """The master does not know this agent: re-register with our id and what runs here;
        end every executor only if the master will not let us keep the id."""
        old = self.agent_id
        try:
            new = self._register(REGISTER_TIMEOUT_SECONDS)
        except RuntimeError as exc:
            logger.warning("%s: re-registration failed (next ping retries): %s", self.name, exc)
            return
        if new != old:
            logger.warning("%s: the master removed this agent (new id %s); ending its "
                           "executors", self.name, new)
            self._end_all_executors(0.5)
        self.agent_id = new
        logger.info("%s: re-registered with %s keeping %s executor(s)", self.name,
                    self.master_url, len(self.executor_pids()) if new == old else 0)

    def _ping_loop(self) -> None:
        client = JsonClient(self.master_url, timeout=max(1.0, self.ping_interval * 4),
                            headers=self._auth)
        while not self._stopping.wait(self.ping_interval):
            try:
                status, _ = client.post("/internal/agent/ping", {"agent_id": self.agent_id})
            except OSError as exc:
                logger.warning("%s: master unreachable: %s", self.name, exc)
                continue
            self._heard_from_master()
            if status == 404 and not self._stopping.is_set():
                logger.warning("%s: the master does not know this agent (restarted, or it "
                               "removed us); registering again", self.name)
                self._rejoin()
        client.close()

    def _heard_from_master(self) -> None:
        self._last_contact = time.monotonic()
        self._fenced = False

    def _fence_loop(self) -> None:
        """Check master silence often enough to fence well before the master's agent timeout,
        independently of a ping that may hang on a dead link."""
        assert self.fence_after is not None
        period = max(0.05, min(self.ping_interval, self.fence_after / 5))
        while not self._stopping.wait(period):
            live = len(self.executor_pids())
            if should_fence(self._last_contact, time.monotonic(), self.fence_after,
                            self._fenced, live):
                self._fence()

    def _fence(self) -> None:
        """SIGKILL every executor's process group: the master may already run their tasks
        elsewhere. Their watchers report the deaths once the master is reachable again."""
        self._fenced = True
        self.fence_count += 1
        silent = time.monotonic() - self._last_contact
        with self._lock:
            runs = [run for run in self._runs.values() if run.process.poll() is None]
        for run in runs:
            try:
                os.killpg(run.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        logger.warning("%s: fenced: no word from master %s for %.1fs; SIGKILLed executor(s) %s",
                       self.name, self.master_url, silent,
                       [f"{run.executor_id} (pid {run.process.pid})" for run in runs])

    def _silence_loop(self) -> None:
        """Kill executor runs whose silence `should_kill_silent_executor` judges too long."""
        assert self.executor_silence_after is not None
        period = max(0.05, min(0.5, self.executor_silence_after / 5))
        while not self._stopping.wait(period):
            for run, silent in self._silent_runs(time.monotonic()):
                self._kill_silent(run, silent)

    def _silent_runs(self, now: float) -> list[tuple[ExecutorRun, float]]:
        """Runs to kill for silence, each marked with why (so it is killed once); with the
        seconds each has been silent."""
        chosen = []
        with self._lock:
            for run in self._runs.values():
                if run.shutting_down or run.killed_for is not None \
                        or run.process.poll() is not None:
                    continue
                if should_kill_silent_executor(run.last_heard, run.busy_since, now,
                                               self.executor_silence_after):
                    assert run.last_heard is not None and run.busy_since is not None
                    silent = now - max(run.last_heard, run.busy_since)
                    run.killed_for = (f"executor killed by {self.name}: silent for {silent:.1f}s "
                                      f"(no update, message or subscribe) with live tasks")
                    chosen.append((run, silent))
        return chosen

    def _kill_silent(self, run: ExecutorRun, silent: float) -> None:
        """SIGKILL a silent run's process group (a SIGSTOPped one too: it never resumes beside
        its tasks' replacements); its watcher reports the tasks as failed."""
        with self._lock:
            tasks = run.live_tasks()
        kill_group_now(run.process)
        self.silence_kills += 1
        logger.warning("%s: executor %s silent for %.1fs with tasks %s; killed (pid %s, "
                       "framework %s)", self.name, run.executor_id, silent, tasks,
                       run.process.pid, run.framework_id)

    def _send_loop(self) -> None:
        """Deliver agent->master events in order; retry while the master is unreachable
        (once stopping, one attempt each)."""
        client = JsonClient(self.master_url, headers=self._auth)
        while (item := self._outbox.get()) is not END_OF_STREAM:
            agent_id, event = item  # the id the event happened under, not the current one
            self._deliver(client, agent_id, event)
        client.close()

    def _deliver(self, client: JsonClient, agent_id: str, event: dict[str, Any]) -> None:
        """Post one event; retry while the master is unreachable (once stopping, one attempt)
        and, bounded, while it does not know `agent_id` yet (re-registration pending)."""
        unknown_deadline = time.monotonic() + REGISTER_TIMEOUT_SECONDS
        while True:
            try:
                status, reply = client.post("/internal/agent/event",
                                            {"agent_id": agent_id, "event": event})
            except OSError as exc:
                logger.warning("%s: cannot reach master for %s: %s", self.name,
                               event.get("type"), exc)
                if self._stopping.wait(0.5):
                    return
                continue
            if status == 404 and agent_id == self.agent_id \
                    and time.monotonic() < unknown_deadline and not self._stopping.wait(0.1):
                continue  # the master does not know us yet; the pinger re-registers
            if status >= 300:
                logger.warning("%s: master refused %s: %s %s", self.name,
                               event.get("type"), status, reply)
            return

    def _to_master(self, event: dict[str, Any]) -> None:
        self._outbox.put((self.agent_id, event))

    # ---------------------------------------------------------------- routing

    def _routes(self) -> Routes:
        return {("POST", "/api/v1/executor"): self._executor_call,
                ("POST", AGENT_COMMAND_PATH): self._master_command_route,
                ("GET", "/state"): self._state,
                ("GET", "/monitor/statistics"): self._statistics_route,
                ("GET", "/monitor/statistics.json"): self._statistics_route,
                ("POST", "/api/v1"): self._operator_call}

    async def _master_command_route(self, request: web.BaseRequest) -> web.StreamResponse:
        """A command from the master: refused with 401 (body unread) without the secret."""
        require_secret(self.secret, request)
        await self._server.run_sync(self._master_command, await read_json(request))
        return accepted()

    async def _state(self, request: web.BaseRequest) -> web.StreamResponse:
        return json_response(200, await self._server.run_sync(self._view))

    async def _statistics_route(self, request: web.BaseRequest) -> web.StreamResponse:
        """`GET /monitor/statistics`: Mesos 1.11's per-executor usage list (read-only and open,
        as this agent's `/state`)."""
        containers = await self._server.run_sync(self.containers)
        return json_response(200, operator_api.monitor_statistics(containers))

    async def _operator_call(self, request: web.BaseRequest) -> web.StreamResponse:
        """`POST /api/v1`: the agent's read-only operator calls (GET_CONTAINERS, GET_HEALTH)."""
        body = await read_json(request)
        try:
            answer = await self._server.run_sync(operator_api.agent_v1_call, body,
                                                 self.containers)
        except operator_api.OperatorCallError as exc:
            raise bad_request(str(exc)) from None
        return json_response(200, answer)

    def containers(self) -> list[operator_api.Container]:
        """Every live executor container with its usage now (cgroup files, or /proc when not
        isolated)."""
        with self._lock:
            runs = [r for r in self._runs.values() if r.process.poll() is None]
            sizes = [r.resources() for r in runs]
        now = time.time()
        out = []
        for run, (cpus, mem) in zip(runs, sizes):
            if run.cgroup is not None:
                stats = run.cgroup.statistics(now)
            else:
                stats = proc_statistics(session_pids(run.process.pid), now, cpus, mem)
            out.append(operator_api.Container(
                run.framework_id, run.executor_id, str(run.executor_info.get("name", "")),
                run.container_id, run.process.pid, str(run.executor_info.get("source", "")),
                stats))
        return out

    def _view(self) -> dict[str, Any]:
        with self._lock:
            return {"agent_id": self.agent_id, "isolation": self.isolation,
                    "isolation_note": self.isolation_note, "executors": [
                {"framework_id": r.framework_id, "executor_id": r.executor_id,
                 "pid": r.process.pid, "tasks": dict(r.tasks)} for r in self._runs.values()]}

    # ---------------------------------------------------------------- executor API

    async def _executor_call(self, request: web.BaseRequest) -> web.StreamResponse:
        claims = self._executor_claims(request)
        body = await read_json(request)
        kind = body.get("type")
        key = (id_value(body, "framework_id", "call"), id_value(body, "executor_id", "call"))
        container = None
        if claims is not None:
            why = claims_mismatch(claims, *key)
            if why is not None:
                raise HttpError(403, f"executor authentication: {why}")
            container = claims.container_id
        if kind == "SUBSCRIBE":
            return await self._executor_subscribe(request, key, container)
        if kind == "UPDATE":
            await self._server.run_sync(self._executor_update, key, container, body)
        elif kind == "MESSAGE":
            await self._server.run_sync(self._executor_message, key, container, body)
        else:
            raise bad_request(f"unknown or unsupported executor call type {kind!r}")
        return accepted()

    def _executor_claims(self, request: web.BaseRequest) -> ExecutorClaims | None:
        """The claims of the call's executor token (None when authentication is off);
        HttpError(401) when it has no token this agent signed."""
        if not self.authenticate_executors:
            return None
        token = bearer_token(request.headers.get("Authorization"))
        claims = self._tokens.verify(token) if token is not None else None
        if claims is None:
            raise HttpError(401, "executor authentication failed: send the token of "
                                 "MESOS_EXECUTOR_AUTHENTICATION_TOKEN as a Bearer token",
                            {"WWW-Authenticate": BEARER_CHALLENGE})
        return claims

    def _run_of(self, key: tuple[str, str], container: str | None) -> ExecutorRun:
        """The running executor `key` (caller holds the lock); HttpError 404 if none, 403 if
        the caller's token is for another launch of it (`container`, None: not checked)."""
        run = self._runs.get(key)
        if run is None:
            raise HttpError(404, f"executor {key[1]} of framework {key[0]} is not running here")
        if container is not None and container != run.container_id:
            raise HttpError(403, f"executor authentication: the token is for an earlier launch "
                                 f"of executor {key[1]}")
        return run

    async def _executor_subscribe(self, request: web.BaseRequest, key: tuple[str, str],
                                  container: str | None) -> web.StreamResponse:
        events = self._server.events()
        stream_id = str(uuid.uuid4())
        run = await self._server.run_sync(self._open_stream, key, container, events, stream_id)
        logger.info("%s: executor %s of framework %s subscribed", self.name, key[1], key[0])
        try:
            response, _ = await serve_events(request, {"Mesos-Stream-Id": stream_id}, events,
                                             self._stopping, self.heartbeat_interval)
        finally:
            self._server.submit(self._close_stream, run, stream_id)
        return response

    def _open_stream(self, key: tuple[str, str], container: str | None, events: EventQueue,
                     stream_id: str) -> ExecutorRun:
        with self._lock:
            run = self._run_of(key, container)
            if run.events is not None:
                run.events.put(END_OF_STREAM)
            run.events, run.stream_id = events, stream_id
            run.last_heard = time.monotonic()
            events.put({"type": "SUBSCRIBED", "subscribed": {
                "executor_info": run.executor_info, "framework_info": run.framework_info,
                "agent_info": self._agent_info(),
                "container_id": {"value": run.container_id}}})
            for task in run.waiting:
                events.put({"type": "LAUNCH", "launch": {"task": task}})
            run.waiting.clear()
        return run

    def _close_stream(self, run: ExecutorRun, stream_id: str) -> None:
        with self._lock:
            if run.stream_id == stream_id:
                run.events, run.stream_id = None, None

    def _executor_update(self, key: tuple[str, str], container: str | None,
                         body: dict[str, Any]) -> None:
        update = body.get("update")
        status = update.get("status") if isinstance(update, dict) else None
        if not isinstance(status, dict) or not isinstance(status.get("state"), str):
            raise bad_request("update.status with a state is required")
        task_id = id_value(status, "task_id", "update.status")
        with self._lock:
            run = self._run_of(key, container)
            run.last_heard = time.monotonic()
            if task_id not in run.tasks:
                raise bad_request(f"task {task_id} was not launched on executor {key[1]}")
            run.tasks[task_id] = status["state"]
            run.tasks_changed(run.last_heard)
            if is_terminal(status["state"]):
                self._resize(run)
        self._to_master({"type": "UPDATE", "framework_id": key[0], "status": {
            **status, "agent_id": {"value": self.agent_id},
            "executor_id": {"value": key[1]}}})

    def _executor_message(self, key: tuple[str, str], container: str | None,
                          body: dict[str, Any]) -> None:
        message = body.get("message")
        data = message.get("data") if isinstance(message, dict) else None
        if not isinstance(data, str):
            raise bad_request("message.data (a base64 string) is required")
        with self._lock:
            self._run_of(key, container).last_heard = time.monotonic()
        self._to_master({"type": "MESSAGE", "framework_id": key[0], "executor_id": key[1],
                         "data": data})

    def _agent_info(self) -> dict[str, Any]:
        return {"id": {"value": self.agent_id}, "hostname": self.host, "port": self.port,
                "resources": self.resources.to_mesos(), "attributes": self._attributes()}

    def _attributes(self) -> list[dict[str, Any]]:
        """The agent's attributes, as an operator sets a Mesos agent's `--attributes`: its
        isolation (`cgroups v1`, `cgroups v2`, `none`), so offers tell frameworks what holds
        their executors (a real agent says so only if its operator wrote it)."""
        return [{"name": ISOLATION_ATTRIBUTE, "type": "TEXT", "text": {"value": self.isolation}}]

    # ---------------------------------------------------------------- master commands

    def _master_command(self, command: dict[str, Any]) -> None:
        kind = command.get("type")
        handler = {"LAUNCH": self._launch, "KILL": self._kill, "MESSAGE": self._message,
                   "ACKNOWLEDGED": self._acknowledged,
                   "SHUTDOWN_FRAMEWORK": self._shutdown_framework,
                   "SHUTDOWN_EXECUTOR": self._shutdown_executor}.get(str(kind))
        if handler is None or not isinstance(command.get("framework_id"), str):
            raise bad_request(f"unknown master command {kind!r} or no framework_id")
        handler(command)

    def _launch(self, command: dict[str, Any]) -> None:
        task = command.get("task")
        if not isinstance(task, dict) or not isinstance(task.get("executor"), dict):
            raise bad_request("LAUNCH needs a task with an executor")
        framework_id = command["framework_id"]
        task_id = id_value(task, "task_id", "task")
        executor_id = id_value(task["executor"], "executor_id", "task.executor")
        with self._lock:
            run = self._runs.get((framework_id, executor_id))
            if run is not None and task_id in run.tasks and not is_terminal(run.tasks[task_id]):
                return  # a repeated command
            if run is None:
                try:
                    run = self._start_run(framework_id, task["executor"],
                                          command.get("framework_info") or {},
                                          task.get("resources"))
                except ExecutorLaunchError as exc:
                    self._to_master(self._agent_update(
                        framework_id, task_id, executor_id, "TASK_FAILED",
                        "REASON_EXECUTOR_TERMINATED", str(exc)))
                    return
            run.tasks[task_id] = "TASK_STAGING"
            run.tasks_changed(time.monotonic())
            run.task_resources[task_id] = task.get("resources", [])
            self._resize(run)
            if run.events is not None:
                run.events.put({"type": "LAUNCH", "launch": {"task": task}})
            else:
                run.waiting.append(task)

    def _start_run(self, framework_id: str, executor_info: dict[str, Any],
                   framework_info: dict[str, Any], task_resources: Any) -> ExecutorRun:
        """Start an executor process (caller holds the lock) in its container's cgroup, sized
        for the executor and its first task, and watch for its exit."""
        executor_id = executor_info["executor_id"]["value"]
        self._run_counter += 1
        sandbox = (self.work_dir / "frameworks" / framework_id / "executors" / executor_id
                   / "runs" / str(self._run_counter))
        container_id = str(uuid.uuid4())
        token = (self._tokens.mint(ExecutorClaims(framework_id, executor_id, container_id))
                 if self.authenticate_executors else None)
        where = ExecutorEnvironment(self.address, self.agent_id, framework_id, executor_id,
                                    sandbox, self.executor_grace_seconds, token)
        cgroup = self._make_cgroup(container_id, container_resources(
            executor_info.get("resources"), [task_resources]))
        try:
            process = start_executor(executor_info.get("command") or {}, where,
                                     cgroup.procs_files() if cgroup is not None else ())
        except ExecutorLaunchError:
            if cgroup is not None:
                cgroup.destroy()
            raise
        executor_info = {**executor_info, "framework_id": {"value": framework_id}}
        run = ExecutorRun(framework_id, executor_id, executor_info, framework_info, sandbox,
                          process, container_id, cgroup=cgroup)
        self._runs[run.key] = run
        run.watcher = threading.Thread(target=self._watch, args=(run,), daemon=True,
                                       name=f"watch-executor-{executor_id}")
        run.watcher.start()
        return run

    def _make_cgroup(self, container_id: str,
                     resources: tuple[float, float]) -> ContainerCgroup | None:
        """The new container's cgroup with its limits, or None when not isolating (or when it
        cannot be made: the container then runs unisolated, and the log says why)."""
        if self._hierarchy is None:
            return None
        cgroup = ContainerCgroup(self._hierarchy, cgroup_name(self.agent_id, container_id))
        try:
            cgroup.create(*resources)
        except OSError as exc:
            logger.warning("%s: cannot make cgroup %s (%s); container %s runs unisolated",
                           self.name, cgroup.name, exc, container_id)
            return None
        return cgroup

    def _resize(self, run: ExecutorRun) -> None:
        """Size a run's cgroup to the executor's and its live tasks' resources, as Mesos does
        when a task is added to or leaves a running executor (caller holds the lock)."""
        if run.cgroup is None or run.process.poll() is not None:
            return
        try:
            run.cgroup.resize(*run.resources())
        except OSError as exc:
            logger.warning("%s: cannot resize cgroup %s of executor %s: %s", self.name,
                           run.cgroup.name, run.executor_id, exc)

    def _oom_loop(self) -> None:
        """Look for OOM kills in the containers; a container over its memory limit is
        destroyed and its tasks fail with Mesos's memory reason (`_limit_memory`)."""
        while not self._stopping.wait(OOM_CHECK_SECONDS):
            with self._lock:
                runs = [r for r in self._runs.values()
                        if r.cgroup is not None and r.limitation is None]
            for run in runs:
                if run.cgroup is not None and run.cgroup.oom_kills() > 0:
                    self._limit_memory(run)

    def _limit_memory(self, run: ExecutorRun) -> None:
        """Mark a run as ended by its memory limit and kill everything in its container."""
        assert run.cgroup is not None
        with self._lock:
            if run.limitation is not None:
                return
            run.limitation = MEMORY_LIMITATION
            run.killed_for = memory_limitation_message(run.cgroup.memory_limit,
                                                       run.cgroup.max_memory_used())
        logger.warning("%s: executor %s of framework %s over its memory limit: %s; destroying "
                       "its container", self.name, run.executor_id, run.framework_id,
                       run.killed_for)
        kill_group_now(run.process)
        for pid in run.cgroup.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _watch(self, run: ExecutorRun) -> None:
        returncode = run.process.wait()
        if run.cgroup is not None:
            if run.limitation is None and run.cgroup.oom_kills() > 0:
                self._limit_memory(run)
            run.cgroup.destroy()  # kills what the executor left running inside, then rmdir
        with self._lock:
            if self._runs.get(run.key) is run:
                del self._runs[run.key]
            if run.events is not None:
                run.events.put(END_OF_STREAM)
            # queued tasks are in run.tasks too (STAGING): each is reported once
            unfinished = [t for t, s in run.tasks.items() if not is_terminal(s)]
            unfinished += [t["task_id"]["value"] for t in run.waiting
                           if t["task_id"]["value"] not in run.tasks]
            for task_id in unfinished:
                run.tasks[task_id] = "TASK_FAILED"
            run.tasks_changed(time.monotonic())
        logger.warning("%s: executor %s of framework %s (pid %s) exited with %s; "
                       "unfinished tasks: %s", self.name, run.executor_id, run.framework_id,
                       run.process.pid, returncode, unfinished)
        state = "TASK_KILLED" if run.shutting_down and run.limitation is None else "TASK_FAILED"
        cause = run.killed_for or f"executor exited with code {returncode}"
        message = f"{cause}; see {run.sandbox}/stderr"
        reason = run.limitation or "REASON_EXECUTOR_TERMINATED"
        for task_id in unfinished:
            self._to_master(self._agent_update(run.framework_id, task_id, run.executor_id,
                                               state, reason, message))
        self._to_master({"type": "EXECUTOR_EXITED", "framework_id": run.framework_id,
                         "executor_id": run.executor_id, "status": wait_status(returncode)})

    def _agent_update(self, framework_id: str, task_id: str, executor_id: str, state: str,
                      reason: str, message: str) -> dict[str, Any]:
        status = make_status(task_id, state, agent_id=self.agent_id, executor_id=executor_id,
                             reason=reason, message=message, source="SOURCE_AGENT",
                             reliable=True, timestamp=time.time())
        return {"type": "UPDATE", "framework_id": framework_id, "status": status}

    def _find_task(self, framework_id: str, task_id: str) -> ExecutorRun | None:
        for run in self._runs.values():
            if run.framework_id == framework_id and task_id in run.tasks:
                return run
        return None

    def _kill(self, command: dict[str, Any]) -> None:
        framework_id, task_id = command["framework_id"], str(command.get("task_id"))
        with self._lock:
            run = self._find_task(framework_id, task_id)
            if run is None:
                logger.warning("%s: KILL for unknown task %s ignored", self.name, task_id)
                return
            waiting = [t for t in run.waiting if t["task_id"]["value"] == task_id]
            if waiting:
                run.waiting.remove(waiting[0])
                run.tasks[task_id] = "TASK_KILLED"
                run.tasks_changed(time.monotonic())
                self._resize(run)
                self._to_master(self._agent_update(
                    framework_id, task_id, run.executor_id, "TASK_KILLED",
                    "REASON_TASK_KILLED_DURING_LAUNCH", "killed before the executor subscribed"))
            elif run.events is not None:
                run.events.put({"type": "KILL", "kill": {"task_id": {"value": task_id}}})

    def _message(self, command: dict[str, Any]) -> None:
        key = (command["framework_id"], str(command.get("executor_id")))
        with self._lock:
            run = self._runs.get(key)
            if run is None or run.events is None:
                logger.warning("%s: message for executor %s dropped: not subscribed",
                               self.name, key[1])
                return
            run.events.put({"type": "MESSAGE", "message": {"data": command.get("data", "")}})

    def _shutdown_executor(self, command: dict[str, Any]) -> None:
        """The framework's SHUTDOWN of one executor: SHUTDOWN event, SIGKILL after the grace
        (a SIGSTOPped one never reads the event)."""
        key = (command["framework_id"], str(command.get("executor_id")))
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                logger.warning("%s: SHUTDOWN of unknown executor %s ignored", self.name, key[1])
                return
            run.killed_for = run.killed_for or "executor shut down by its framework"
            self._end_run(run)
        logger.warning("%s: shutting down executor %s of framework %s at its request",
                       self.name, key[1], key[0])

    def _end_run(self, run: ExecutorRun) -> None:
        """Ask a run to shut down and kill it after the grace (caller holds the lock)."""
        run.shutting_down = True
        if run.events is not None:
            run.events.put({"type": "SHUTDOWN"})
            kill_group_later(run.process, self.executor_grace_seconds + 1.0)
        else:
            kill_group_later(run.process, 0.0)

    def _acknowledged(self, command: dict[str, Any]) -> None:
        with self._lock:
            run = self._find_task(command["framework_id"], str(command.get("task_id")))
            if run is not None and run.events is not None:
                run.events.put({"type": "ACKNOWLEDGED", "acknowledged": {
                    "task_id": {"value": command.get("task_id")},
                    "uuid": command.get("uuid")}})

    def _shutdown_framework(self, command: dict[str, Any]) -> None:
        with self._lock:
            runs = [r for r in self._runs.values() if r.framework_id == command["framework_id"]]
            for run in runs:
                self._end_run(run)
        if runs:
            logger.info("%s: shutting down %d executor(s) of framework %s", self.name,
                        len(runs), command["framework_id"])
