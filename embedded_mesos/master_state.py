"""The embedded master's decisions: frameworks, agents, offers, tasks and status-update streams.

Owns every rule of the master (who gets offered what, what a call does, when a framework or an
agent is gone) as a state object with one entry point, `MasterState.handle(event)`: it takes an
event (a frozen dataclass named as a fact: a call received, an agent pinged, time passed) and
returns actions: events for a framework's stream, commands for an agent, streams to end, and
the answer the HTTP shell gives (`Subscribed`, `AgentAccepted`, `PingAnswered`). Events are
dispatched through one table (`common.dispatch.handler`). It does no I/O, takes no locks and
reads no clock and no random source: the monotonic time (`now`), the wall-clock time that
statuses carry (`wall`) and the id of a new event stream arrive as event fields, minted by
`master.EmbeddedMaster`, which serialises events into it and carries the actions out.

Simplifications against a real Mesos master (documented, deliberate): one role (`*`); an agent's
whole free capacity is offered to one framework at a time; a decline/refuse filter covers the
whole agent; executor resources are not accounted, only task resources; only LAUNCH of tasks
that carry an ExecutorInfo with a CommandInfo is supported.

Master restart (failover to a new master process on the same address): the master keeps no
registry on disk, so the agents are the source of truth. A re-registering agent keeps its id and
reports its running executors and tasks (`AgentReport`); the master rebuilds its task table from
them and recovers each framework it learns of this way (disconnected, with its failover timeout
running, so it is removed and its tasks killed as usual if it never re-subscribes). During the
first `agent_reregister_timeout` seconds after the master starts, explicit reconciliation of a
task on an agent that has not re-registered yet is deferred, not answered TASK_LOST: it is
answered once that agent re-registers, or with TASK_LOST when the window closes, as a real Mesos
master does for agents it recovered from its registry. Not imitated: a new master cannot know
agents a previous master removed (real Mesos keeps them in its replicated registry).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from common.dispatch import handler
from embedded_mesos.httpio import HttpError, bad_request
from embedded_mesos.protocol import (
    KNOWN_STATES, VERSION, id_value, is_terminal, make_status, safe_id,
)
from embedded_mesos.resources import ResourceError, Resources, from_mesos

logger = logging.getLogger(__name__)
TERMINAL_KEEP = 10_000  # finished tasks remembered for reconciliation, per master


@dataclass(frozen=True)
class MasterConfig:
    offer_interval: float = 1.0
    heartbeat_interval: float = 15.0
    agent_timeout: float = 5.0
    offer_timeout: float | None = None
    default_refuse_seconds: float = 5.0
    hostname: str = "127.0.0.1"
    port: int = 0
    agent_reregister_timeout: float | None = None  # None: the agent timeout

    @property
    def reregister_window(self) -> float:
        """Seconds after start during which agents unknown to this master may still return."""
        value = self.agent_reregister_timeout
        return self.agent_timeout if value is None else value


@dataclass(frozen=True)
class ToFramework:
    """Put `event` on the framework's current event stream."""

    framework_id: str
    event: dict[str, Any]


@dataclass(frozen=True)
class ToAgent:
    """Send `command` to the agent over the internal protocol."""

    agent_id: str
    command: dict[str, Any]


@dataclass(frozen=True)
class EndStream:
    """Close the framework's event stream `stream_id` (after events queued before this)."""

    framework_id: str
    stream_id: str
    final_event: dict[str, Any] | None = None


@dataclass(frozen=True)
class ForgetAgent:
    """Stop talking to a removed agent."""

    agent_id: str


@dataclass(frozen=True)
class Subscribed:
    """The SUBSCRIBE was accepted: `framework_id` now streams on `stream_id`."""

    framework_id: str
    stream_id: str


@dataclass(frozen=True)
class AgentAccepted:
    """The (re-)registration was accepted under `agent_id` (kept, or new)."""

    agent_id: str


@dataclass(frozen=True)
class PingAnswered:
    """The answer to an agent's ping: whether the master knows it (else it must register)."""

    agent_id: str
    known: bool


Action = Union[ToFramework, ToAgent, EndStream, ForgetAgent, Subscribed, AgentAccepted,
               PingAnswered]


# ------------------------------------------------------------------ events (facts, with times)
# `now` is the shell's monotonic clock (deadlines, timeouts); `wall` is time.time() at the same
# moment, the timestamp of any TaskStatus the master builds while handling the event.

@dataclass(frozen=True)
class FrameworkSubscribing:
    """A SUBSCRIBE call; `stream_id` names the event stream it opens."""

    body: dict[str, Any]
    stream_id: str
    now: float
    wall: float


@dataclass(frozen=True)
class CallReceived:
    """Any other scheduler call, with the Mesos-Stream-Id header it came with (or None)."""

    body: dict[str, Any]
    stream_id: str | None
    now: float
    wall: float


@dataclass(frozen=True)
class StreamClosed:
    """The framework's event stream `stream_id` ended (it disconnected or was replaced)."""

    framework_id: str
    stream_id: str
    now: float
    wall: float


@dataclass(frozen=True)
class AgentRegistering:
    """An agent's (re-)registration body: url, resources, optional id and what it runs."""

    body: dict[str, Any]
    now: float
    wall: float


@dataclass(frozen=True)
class AgentPinged:
    agent_id: str
    now: float
    wall: float


@dataclass(frozen=True)
class AgentEventReceived:
    """UPDATE, MESSAGE or EXECUTOR_EXITED reported by an agent."""

    agent_id: str
    event: dict[str, Any]
    now: float
    wall: float


@dataclass(frozen=True)
class AgentRemoved:
    """The agent is gone (it unregistered, or the shell decided so), for reason `why`."""

    agent_id: str
    why: str
    now: float
    wall: float


@dataclass(frozen=True)
class Ticked:
    """Time passed."""

    now: float
    wall: float


Event = Union[FrameworkSubscribing, CallReceived, StreamClosed, AgentRegistering, AgentPinged,
              AgentEventReceived, AgentRemoved, Ticked]


@dataclass(frozen=True)
class ReportedTask:
    """A task an agent says it runs, from its (re-)registration."""

    framework_id: str
    executor_id: str
    task_id: str
    state: str
    resources: Resources


@dataclass(frozen=True)
class AgentReport:
    """What a (re-)registering agent runs: its tasks and the FrameworkInfo of each framework."""

    tasks: tuple[ReportedTask, ...] = ()
    frameworks: tuple[tuple[str, dict[str, Any]], ...] = ()  # (framework id, FrameworkInfo)


@dataclass(frozen=True)
class DeferredReconcile:
    """An explicit reconciliation waiting for its agent to re-register."""

    framework_id: str
    task_id: str
    agent_id: str


@dataclass
class Framework:
    framework_id: str
    info: dict[str, Any]
    stream_id: str | None = None
    failover_deadline: float | None = None
    suppressed: bool = False
    refused_until: dict[str, float] = field(default_factory=dict)  # agent id -> time

    @property
    def partition_aware(self) -> bool:
        """Opted into PARTITION_AWARE: told TASK_UNREACHABLE / GONE / UNKNOWN, not TASK_LOST."""
        caps = self.info.get("capabilities")
        return isinstance(caps, list) and any(
            isinstance(c, dict) and c.get("type") == "PARTITION_AWARE" for c in caps)

    @property
    def failover_timeout(self) -> float:
        value = self.info.get("failover_timeout", 0.0)
        return float(value) if isinstance(value, (int, float)) else 0.0


def text_attributes(value: Any) -> list[dict[str, Any]]:
    """The TEXT `Attribute`s of an agent's registration (as a Mesos agent's `--attributes`);
    anything else is left out."""
    if not isinstance(value, list):
        return []
    return [{"name": a["name"], "type": "TEXT", "text": {"value": a["text"]["value"]}}
            for a in value if isinstance(a, dict) and isinstance(a.get("name"), str)
            and isinstance(a.get("text"), dict) and isinstance(a["text"].get("value"), str)]


@dataclass
class Agent:
    agent_id: str
    hostname: str
    url: str
    total: Resources
    last_seen: float
    attributes: list[dict[str, Any]] = field(default_factory=list)  # Mesos `Attribute`s


@dataclass
class Task:
    task_id: str
    framework_id: str
    agent_id: str
    executor_id: str
    resources: Resources
    state: str = "TASK_STAGING"
    last_status: dict[str, Any] | None = None
    pending: deque = field(default_factory=deque)  # status updates not yet acknowledged
    in_flight: str | None = None  # uuid sent and awaiting its acknowledgement
    acknowledged: set[str] = field(default_factory=set)

    @property
    def forgotten(self) -> bool:
        """Terminal with its last update acknowledged: a real master has moved it to its
        completed tasks, which reconciliation does not look at."""
        return is_terminal(self.state) and not self.pending and self.in_flight is None \
            and bool(self.acknowledged)


@dataclass
class Offer:
    offer_id: str
    framework_id: str
    agent_id: str
    resources: Resources
    created: float


class MasterState:
    """All master state; `handle(event)` is the only way to change it."""

    def __init__(self, config: MasterConfig, master_id: str, started: float = 0.0):
        self.config = config
        self.master_id = master_id
        self.recovery_until = started + config.reregister_window
        self.deferred: list[DeferredReconcile] = []
        self.frameworks: dict[str, Framework] = {}
        self.removed_frameworks: set[str] = set()
        self.agents: dict[str, Agent] = {}
        self.removed_agents: set[str] = set()
        self.tasks: dict[tuple[str, str], Task] = {}
        # executors launched here: (framework, agent, executor id) -> ExecutorInfo; their own
        # resources are charged on the agent until it reports them exited (as Mesos does)
        self.executors: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.offers: dict[str, Offer] = {}
        self._ids = itertools.count(1)

    def handle(self, event: Event) -> list[Action]:
        """The actions `event` leads to, in order; HttpError for a call or report refused."""
        return handler(_HANDLERS, event, "MasterState")(self, event)

    def _next_id(self, kind: str) -> str:
        return f"{self.master_id}-{kind}{next(self._ids):04d}"

    # ---------------------------------------------------------------- frameworks

    def master_info(self) -> dict[str, Any]:
        host, port = self.config.hostname, self.config.port
        return {"id": self.master_id, "ip": 0, "port": port, "hostname": host,
                "version": VERSION, "address": {"hostname": host, "ip": host, "port": port}}

    def _subscribe(self, ev: FrameworkSubscribing) -> list[Action]:
        """A SUBSCRIBE call: a new framework, or a known one failing over to a new stream."""
        body = ev.body
        subscribe = _section(body, "subscribe")
        info = subscribe.get("framework_info")
        if not isinstance(info, dict):
            raise bad_request("subscribe.framework_info is missing or not an object")
        _check_framework_info(info)
        framework_id = _requested_framework_id(body, info)
        if framework_id is not None and framework_id in self.removed_frameworks:
            raise HttpError(403, f"framework {framework_id} has been removed; "
                                 "subscribe without a framework id")
        actions: list[Action] = []
        framework = self.frameworks.get(framework_id) if framework_id else None
        if framework is None:
            framework_id = framework_id or self._next_id("F")
            framework = Framework(framework_id, info)
            self.frameworks[framework_id] = framework
            logger.info("master %s: framework %s (%s) subscribed", self.master_id,
                        framework_id, info.get("name"))
        else:
            actions += self._replace_stream(framework)
            framework.info = info
            logger.info("master %s: framework %s re-subscribed", self.master_id, framework_id)
        framework_id = framework.framework_id  # the id it was found by, or the new one
        framework.info = {**info, "id": {"value": framework_id}}
        framework.stream_id = ev.stream_id
        framework.failover_deadline = None
        actions.append(Subscribed(framework_id, ev.stream_id))
        actions.append(ToFramework(framework_id, {"type": "SUBSCRIBED", "subscribed": {
            "framework_id": {"value": framework_id},
            "heartbeat_interval_seconds": self.config.heartbeat_interval,
            "master_info": self.master_info()}}))
        actions += self._resend_pending(framework_id)
        return actions + self._make_offers(ev.now)

    def _replace_stream(self, framework: Framework) -> list[Action]:
        if framework.stream_id is None:
            return []
        old = framework.stream_id
        framework.stream_id = None
        error = {"type": "ERROR", "error": {"message": "Framework failed over"}}
        return [EndStream(framework.framework_id, old, error)] + self._drop_offers_of(framework)

    def _resend_pending(self, framework_id: str) -> list[Action]:
        actions: list[Action] = []
        for task in self._tasks_of(framework_id):
            task.in_flight = None
            actions += self._pump(task)
        return actions

    def _stream_closed(self, ev: StreamClosed) -> list[Action]:
        """The framework's event stream ended (it disconnected or was replaced)."""
        framework = self.frameworks.get(ev.framework_id)
        if framework is None or framework.stream_id != ev.stream_id:
            return []
        framework.stream_id = None
        framework.failover_deadline = ev.now + framework.failover_timeout
        logger.info("master %s: framework %s disconnected; failover timeout %.1fs",
                    self.master_id, ev.framework_id, framework.failover_timeout)
        return self._drop_offers_of(framework)

    def _drop_offers_of(self, framework: Framework) -> list[Action]:
        for offer in [o for o in self.offers.values()
                      if o.framework_id == framework.framework_id]:
            del self.offers[offer.offer_id]
        return []

    def _remove_framework(self, framework_id: str, why: str) -> list[Action]:
        """TEARDOWN or failover timeout: kill its tasks everywhere and forget it."""
        framework = self.frameworks.pop(framework_id, None)
        if framework is None:
            return []
        self.removed_frameworks.add(framework_id)
        self.executors = {k: v for k, v in self.executors.items() if k[0] != framework_id}
        logger.info("master %s: framework %s removed (%s)", self.master_id, framework_id, why)
        self._drop_offers_of(framework)
        for task in self._tasks_of(framework_id):
            if not is_terminal(task.state):
                task.state = "TASK_KILLED"
            task.pending.clear()
        actions: list[Action] = [
            ToAgent(agent_id, {"type": "SHUTDOWN_FRAMEWORK", "framework_id": framework_id})
            for agent_id in self.agents]
        if framework.stream_id is not None:
            actions.append(EndStream(framework_id, framework.stream_id))
        return actions

    # ---------------------------------------------------------------- calls

    def _call(self, ev: CallReceived) -> list[Action]:
        """Any scheduler call but SUBSCRIBE, from the framework's current stream."""
        body, stream_id = ev.body, ev.stream_id
        kind = body.get("type")
        call = _CALLS.get(kind) if isinstance(kind, str) else None
        if call is None:
            raise bad_request(f"unknown or unsupported call type {kind!r}")
        framework_id = id_value(body, "framework_id", "call")
        framework = self.frameworks.get(framework_id)
        if framework is None:
            raise HttpError(404 if framework_id not in self.removed_frameworks else 403,
                            f"framework {framework_id} is not subscribed")
        if framework.stream_id is None:
            raise HttpError(403, f"framework {framework_id} is not subscribed")
        if stream_id is None:
            raise bad_request("the Mesos-Stream-Id header is required")
        if stream_id != framework.stream_id:
            raise bad_request(f"Mesos-Stream-Id {stream_id} is not the stream of "
                              f"framework {framework_id}")
        return call(self, framework, body, ev.now, ev.wall)

    def _teardown(self, framework: Framework, body: dict[str, Any], now: float,
                  wall: float) -> list[Action]:
        return self._remove_framework(framework.framework_id, "TEARDOWN")

    def _accept(self, framework: Framework, body: dict[str, Any], now: float,
                wall: float) -> list[Action]:
        accept = _section(body, "accept")
        offer_ids = _id_list(accept, "offer_ids", "accept")
        operations = accept.get("operations", [])
        if not isinstance(operations, list) or not all(isinstance(o, dict) for o in operations):
            raise bad_request("accept.operations must be a list of objects")
        task_infos = _launch_task_infos(operations)
        refuse = _refuse_seconds(accept, self.config.default_refuse_seconds)
        offers, problem = self._take_offers(framework, offer_ids)
        if problem:
            return [self._reject(framework, t, "TASK_LOST", "REASON_INVALID_OFFERS", problem,
                                 wall) for t in task_infos] + self._make_offers(now)
        agent = self.agents[offers[0].agent_id]
        pool = sum((o.resources for o in offers), Resources())
        actions: list[Action] = []
        for task_info in task_infos:
            launched, pool = self._launch(framework, agent, task_info, pool, wall)
            actions += launched
        framework.refused_until[agent.agent_id] = now + refuse
        return actions + self._make_offers(now)

    def _take_offers(self, framework: Framework,
                     offer_ids: list[str]) -> tuple[list[Offer], str | None]:
        offers = [self.offers.get(oid) for oid in offer_ids]
        if not offer_ids:
            return [], "no offer ids"
        for oid, offer in zip(offer_ids, offers):
            if offer is None or offer.framework_id != framework.framework_id:
                for o in offers:  # Mesos recovers valid offers of an invalid accept
                    if o is not None and o.framework_id == framework.framework_id:
                        self.offers.pop(o.offer_id, None)
                return [], f"offer {oid} is no longer valid"
        valid = [o for o in offers if o is not None]  # all of them: checked above
        if len({o.agent_id for o in valid}) != 1:
            for o in valid:
                self.offers.pop(o.offer_id, None)
            return [], "offers from more than one agent"
        for o in valid:
            del self.offers[o.offer_id]
        return valid, None

    def _launch(self, framework: Framework, agent: Agent, task_info: Any,
                pool: Resources, wall: float) -> tuple[list[Action], Resources]:
        problem, task = self._validate_task(framework, agent, task_info)
        if problem:
            return [self._reject(framework, task_info, "TASK_ERROR",
                                 "REASON_TASK_INVALID", problem, wall)], pool
        assert task is not None
        key = (framework.framework_id, agent.agent_id, task.executor_id)
        executor_info = _executor_identity(task_info["executor"])
        running = self.executors.get(key)
        if running is not None and running != executor_info:
            return [self._reject(framework, task_info, "TASK_ERROR", "REASON_TASK_INVALID",
                                 f"ExecutorInfo of executor {task.executor_id} differs from the "
                                 "one it runs with on this agent", wall)], pool
        try:
            executor_share = Resources() if running is not None else from_mesos(
                task_info["executor"].get("resources", []))
        except ResourceError as exc:
            return [self._reject(framework, task_info, "TASK_ERROR", "REASON_TASK_INVALID",
                                 f"executor resources: {exc}", wall)], pool
        if not pool.contains(task.resources + executor_share):
            what = "task resources" if executor_share.is_empty() else \
                "task and executor resources"
            return [self._reject(framework, task_info, "TASK_ERROR", "REASON_TASK_INVALID",
                                 f"{what} exceed the offered resources", wall)], pool
        if running is None:
            self.executors[key] = executor_info
            pool = pool - executor_share
        self.tasks[(framework.framework_id, task.task_id)] = task
        logger.info("master %s: launching task %s of framework %s on agent %s",
                    self.master_id, task.task_id, framework.framework_id, agent.agent_id)
        command = {"type": "LAUNCH", "framework_id": framework.framework_id,
                   "framework_info": framework.info,
                   "task": {**task_info, "agent_id": {"value": agent.agent_id}}}
        return [ToAgent(agent.agent_id, command)], pool - task.resources

    def _validate_task(self, framework: Framework, agent: Agent,
                       task_info: Any) -> tuple[str | None, Task | None]:
        if not isinstance(task_info, dict):
            return "a task_info is not an object", None
        try:
            task_id = id_value(task_info, "task_id", "task_info")
            executor = task_info.get("executor")
            if not isinstance(executor, dict):
                return "only tasks with an ExecutorInfo are supported", None
            executor_id = id_value(executor, "executor_id", "task_info.executor")
            command = executor.get("command")
            if not isinstance(command, dict) or not isinstance(command.get("value"), str):
                return "task_info.executor.command.value is missing", None
            resources = from_mesos(task_info.get("resources", []))
        except HttpError as exc:
            return exc.message, None
        except ResourceError as exc:
            return str(exc), None
        if not safe_id(task_id) or not safe_id(executor_id):
            return "task and executor ids must be plain names ([A-Za-z0-9._-])", None
        existing = self.tasks.get((framework.framework_id, task_id))
        if existing is not None and not is_terminal(existing.state):
            return f"task {task_id} is already active", None
        return None, Task(task_id, framework.framework_id, agent.agent_id, executor_id,
                          resources)

    def _reject(self, framework: Framework, task_info: Any, state: str, reason: str,
                message: str, wall: float) -> ToFramework:
        task_id = "?"
        if isinstance(task_info, dict) and isinstance(task_info.get("task_id"), dict):
            task_id = str(task_info["task_id"].get("value", "?"))
        logger.info("master %s: task %s of framework %s: %s (%s)", self.master_id, task_id,
                    framework.framework_id, state, message)
        return ToFramework(framework.framework_id, _update(make_status(
            task_id, state, reason=reason, message=message, timestamp=wall)))

    def _decline(self, framework: Framework, body: dict[str, Any], now: float,
                 wall: float) -> list[Action]:
        decline = _section(body, "decline")
        refuse = _refuse_seconds(decline, self.config.default_refuse_seconds)
        for offer_id in _id_list(decline, "offer_ids", "decline"):
            offer = self.offers.get(offer_id)
            if offer is not None and offer.framework_id == framework.framework_id:
                del self.offers[offer_id]
                framework.refused_until[offer.agent_id] = now + refuse
        return self._make_offers(now)

    def _revive(self, framework: Framework, body: dict[str, Any], now: float,
                wall: float) -> list[Action]:
        framework.suppressed = False
        framework.refused_until.clear()
        return self._make_offers(now)

    def _suppress(self, framework: Framework, body: dict[str, Any], now: float,
                  wall: float) -> list[Action]:
        framework.suppressed = True
        return []

    def _kill(self, framework: Framework, body: dict[str, Any], now: float,
              wall: float) -> list[Action]:
        task_id = id_value(_section(body, "kill"), "task_id", "kill")
        task = self.tasks.get((framework.framework_id, task_id))
        if task is None:
            return [ToFramework(framework.framework_id, _update(make_status(
                task_id, "TASK_LOST", reason="REASON_RECONCILIATION",
                message="task is unknown to the master", timestamp=wall)))]
        if is_terminal(task.state) or task.agent_id not in self.agents:
            return []
        return [ToAgent(task.agent_id, {"type": "KILL", "framework_id": framework.framework_id,
                                        "task_id": task_id})]

    def _shutdown(self, framework: Framework, body: dict[str, Any], now: float,
                  wall: float) -> list[Action]:
        """SHUTDOWN: the agent ends one of the framework's executors (its tasks end with it)."""
        shutdown = _section(body, "shutdown")
        executor_id = id_value(shutdown, "executor_id", "shutdown")
        agent_id = id_value(shutdown, "agent_id", "shutdown")
        if agent_id not in self.agents:
            logger.warning("master %s: SHUTDOWN of executor %s on unknown agent %s dropped",
                           self.master_id, executor_id, agent_id)
            return []
        return [ToAgent(agent_id, {"type": "SHUTDOWN_EXECUTOR",
                                   "framework_id": framework.framework_id,
                                   "executor_id": executor_id})]

    def _acknowledge(self, framework: Framework, body: dict[str, Any], now: float,
                     wall: float) -> list[Action]:
        ack = _section(body, "acknowledge")
        task_id = id_value(ack, "task_id", "acknowledge")
        ack_uuid = ack.get("uuid")
        if not isinstance(ack_uuid, str) or not ack_uuid:
            raise bad_request("acknowledge.uuid is missing")
        task = self.tasks.get((framework.framework_id, task_id))
        if task is None or ack_uuid in task.acknowledged:
            return []  # late or repeated acknowledgement: harmless
        if task.in_flight != ack_uuid:
            raise bad_request(f"acknowledge.uuid does not match the pending update of "
                              f"task {task_id}")
        task.pending.popleft()
        task.in_flight = None
        task.acknowledged.add(ack_uuid)
        actions: list[Action] = []
        if task.agent_id in self.agents:
            actions.append(ToAgent(task.agent_id, {
                "type": "ACKNOWLEDGED", "framework_id": framework.framework_id,
                "task_id": task_id, "uuid": ack_uuid}))
        return actions + self._pump(task)

    def _reconcile(self, framework: Framework, body: dict[str, Any], now: float,
                   wall: float) -> list[Action]:
        reconcile = body.get("reconcile", {})
        if not isinstance(reconcile, dict) or not isinstance(reconcile.get("tasks", []), list):
            raise bad_request("reconcile.tasks must be a list")
        if not all(isinstance(t, dict) for t in reconcile.get("tasks", [])):
            raise bad_request("reconcile.tasks[] must be objects")
        wanted = [(id_value(t, "task_id", "reconcile.tasks[]"), _optional_id(t, "agent_id"))
                  for t in reconcile.get("tasks", [])]
        if not wanted:  # implicit: every task the master still tracks for this framework
            wanted = [(t.task_id, None) for t in self._tasks_of(framework.framework_id)
                      if not is_terminal(t.state) or t.pending]
        actions: list[Action] = []
        for task_id, agent_id in wanted:
            if (framework.framework_id, task_id) not in self.tasks and agent_id is not None \
                    and self._awaiting_agent(agent_id, now):
                self.deferred.append(DeferredReconcile(framework.framework_id, task_id, agent_id))
                logger.info("master %s: reconciliation of task %s of framework %s waits for "
                            "agent %s to re-register", self.master_id, task_id,
                            framework.framework_id, agent_id)
                continue
            actions.append(self._reconcile_update(framework.framework_id, task_id, wall,
                                                  agent_id))
        return actions

    def _reconcile_update(self, framework_id: str, task_id: str, wall: float,
                          agent_id: str | None = None) -> ToFramework:
        return ToFramework(framework_id, _update(
            self._reconcile_status(framework_id, task_id, wall, agent_id)))

    def _awaiting_agent(self, agent_id: str, now: float) -> bool:
        """An agent this master does not know yet but may still re-register (recovery window)."""
        return (agent_id not in self.agents and agent_id not in self.removed_agents
                and now < self.recovery_until)

    def _answer_settled_reconciles(self, now: float, wall: float) -> list[Action]:
        """Answer deferred reconciliations whose agent came back or can no longer come back."""
        settled = [d for d in self.deferred if not self._awaiting_agent(d.agent_id, now)]
        if not settled:
            return []
        self.deferred = [d for d in self.deferred if d not in settled]
        return [self._reconcile_update(d.framework_id, d.task_id, wall, d.agent_id)
                for d in settled]

    def _reconcile_status(self, framework_id: str, task_id: str, wall: float,
                          agent_id: str | None = None) -> dict[str, Any]:
        task = self.tasks.get((framework_id, task_id))
        if task is None or task.forgotten:
            state, why = self._unknown_task_state(framework_id, agent_id)
            return make_status(task_id, state, agent_id=agent_id,
                               reason="REASON_RECONCILIATION", message=why, timestamp=wall)
        return make_status(task_id, task.state, agent_id=task.agent_id,
                           executor_id=task.executor_id, reason="REASON_RECONCILIATION",
                           timestamp=wall)

    def _unknown_task_state(self, framework_id: str, agent_id: str | None) -> tuple[str, str]:
        """What Mesos answers for a task it does not know (or has forgotten, being terminal and
        acknowledged): TASK_LOST, or to a PARTITION_AWARE framework TASK_UNREACHABLE (its agent
        was removed), TASK_GONE (its agent is here without it) or TASK_UNKNOWN."""
        framework = self.frameworks.get(framework_id)
        if framework is None or not framework.partition_aware:
            return "TASK_LOST", "task is unknown to the master"
        if agent_id is not None and agent_id in self.removed_agents:
            return "TASK_UNREACHABLE", f"agent {agent_id} is unreachable"
        if agent_id is not None and agent_id in self.agents:
            return "TASK_GONE", f"agent {agent_id} does not run the task"
        return "TASK_UNKNOWN", "task is unknown to the master"

    def _message(self, framework: Framework, body: dict[str, Any], now: float,
                 wall: float) -> list[Action]:
        message = _section(body, "message")
        agent_id = id_value(message, "agent_id", "message")
        executor_id = id_value(message, "executor_id", "message")
        data = message.get("data", "")
        if not isinstance(data, str):
            raise bad_request("message.data must be a base64 string")
        if agent_id not in self.agents:
            logger.warning("master %s: message from framework %s to unknown agent %s dropped",
                           self.master_id, framework.framework_id, agent_id)
            return []
        return [ToAgent(agent_id, {"type": "MESSAGE", "framework_id": framework.framework_id,
                                   "executor_id": executor_id, "data": data})]

    def _ignore(self, framework: Framework, body: dict[str, Any], now: float,
                wall: float) -> list[Action]:
        logger.info("master %s: %s from framework %s accepted and ignored", self.master_id,
                    body.get("type"), framework.framework_id)
        return []

    # ---------------------------------------------------------------- status updates

    def _pump(self, task: Task) -> list[Action]:
        """Send queued updates of `task` until one needs an acknowledgement."""
        framework = self.frameworks.get(task.framework_id)
        if framework is None or framework.stream_id is None:
            return []
        actions: list[Action] = []
        while task.pending and task.in_flight is None:
            status = task.pending[0]
            actions.append(ToFramework(task.framework_id, _update(status)))
            if "uuid" in status:
                task.in_flight = status["uuid"]
            else:
                task.pending.popleft()
        return actions

    def _record_status(self, task: Task, status: dict[str, Any], now: float) -> list[Action]:
        was_terminal = is_terminal(task.state)
        if not was_terminal:
            task.state = str(status["state"])
            task.last_status = status
        task.pending.append(status)
        actions = self._pump(task)
        if is_terminal(task.state) and not was_terminal:
            actions += self._make_offers(now)  # its resources are free again
        return actions

    # ---------------------------------------------------------------- agents

    def _register_agent(self, ev: AgentRegistering) -> list[Action]:
        """An agent registers, or re-registers with its id and what it runs.

        A removed agent's id is refused (it gets a new one and must end its executors); any
        other requested id is kept and the agent's report rebuilds its part of the task table."""
        body, now = ev.body, ev.now
        url = field_str(body, "url")
        try:
            total = from_mesos(body.get("resources"))
        except ResourceError as exc:
            raise bad_request(f"agent resources: {exc}") from None
        report = parse_agent_report(body.get("executors", []))
        requested = body.get("agent_id")
        agent_id = requested
        if not isinstance(agent_id, str) or not safe_id(agent_id) \
                or agent_id in self.removed_agents:
            agent_id = self._next_id("S")
        given_host = body.get("hostname")
        hostname = given_host if isinstance(given_host, str) else "127.0.0.1"
        self.agents[agent_id] = Agent(agent_id, hostname, url, total, now,
                                      text_attributes(body.get("attributes")))
        logger.info("master %s: agent %s registered at %s with %s, running %d task(s)",
                    self.master_id, agent_id, url, total.to_mesos(), len(report.tasks))
        actions: list[Action] = [AgentAccepted(agent_id)]
        if agent_id == requested:
            actions += self._recover_agent(agent_id, report, now, ev.wall)
        actions += self._answer_settled_reconciles(now, ev.wall)
        return actions + self._make_offers(now)

    def _recover_agent(self, agent_id: str, report: AgentReport, now: float,
                       wall: float) -> list[Action]:
        """Rebuild this agent's tasks from its report (the agent is the source of truth)."""
        actions: list[Action] = []
        for framework_id, info in report.frameworks:
            if framework_id in self.removed_frameworks:
                actions.append(ToAgent(agent_id, {"type": "SHUTDOWN_FRAMEWORK",
                                                  "framework_id": framework_id}))
            elif framework_id not in self.frameworks:
                self._recover_framework(framework_id, info, now)
        reported: set[tuple[str, str]] = set()
        for task in report.tasks:
            if task.framework_id in self.frameworks:
                reported.add((task.framework_id, task.task_id))
                self._adopt_task(agent_id, task)
        return actions + self._lose_unreported(agent_id, reported, now, wall)

    def _recover_framework(self, framework_id: str, info: dict[str, Any], now: float) -> None:
        framework = Framework(framework_id, {**info, "id": {"value": framework_id}})
        framework.failover_deadline = now + framework.failover_timeout
        self.frameworks[framework_id] = framework
        logger.info("master %s: framework %s recovered from an agent; it has %.1fs to "
                    "re-subscribe", self.master_id, framework_id, framework.failover_timeout)

    def _adopt_task(self, agent_id: str, reported: ReportedTask) -> None:
        key = (reported.framework_id, reported.task_id)
        known = self.tasks.get(key)
        if known is not None and known.agent_id != agent_id and not is_terminal(known.state):
            logger.warning("master %s: agent %s reports task %s of framework %s, which runs on "
                           "agent %s; kept the latter", self.master_id, agent_id,
                           reported.task_id, reported.framework_id, known.agent_id)
            return
        if known is not None and known.agent_id == agent_id:
            known.state = reported.state
            return
        self.tasks[key] = Task(reported.task_id, reported.framework_id, agent_id,
                               reported.executor_id, reported.resources, reported.state)

    def _lose_unreported(self, agent_id: str, reported: set[tuple[str, str]], now: float,
                         wall: float) -> list[Action]:
        """Tasks the master placed on this agent that the agent no longer knows are lost."""
        actions: list[Action] = []
        for key, task in list(self.tasks.items()):
            if task.agent_id == agent_id and key not in reported and not is_terminal(task.state):
                actions += self._record_status(task, make_status(
                    task.task_id, "TASK_LOST", agent_id=agent_id, executor_id=task.executor_id,
                    reason="REASON_AGENT_RESTARTED",
                    message=f"agent {agent_id} re-registered without this task",
                    timestamp=wall), now)
        return actions

    def _agent_pinged(self, ev: AgentPinged) -> list[Action]:
        agent = self.agents.get(ev.agent_id)
        if agent is not None:
            agent.last_seen = ev.now
        return [PingAnswered(ev.agent_id, agent is not None)]

    def _agent_event(self, ev: AgentEventReceived) -> list[Action]:
        """UPDATE, MESSAGE or EXECUTOR_EXITED reported by an agent."""
        agent_id, event, now = ev.agent_id, ev.event, ev.now
        if agent_id not in self.agents:
            raise HttpError(404, f"agent {agent_id} is not registered")
        self.agents[agent_id].last_seen = now
        kind = event.get("type")
        framework_id = field_str(event, "framework_id")
        if framework_id not in self.frameworks:
            return []  # a removed framework: nothing to tell
        if kind == "UPDATE":
            return self._agent_update(agent_id, framework_id, event, now)
        if kind == "MESSAGE":
            return [ToFramework(framework_id, {"type": "MESSAGE", "message": {
                "agent_id": {"value": agent_id},
                "executor_id": {"value": field_str(event, "executor_id")},
                "data": event.get("data", "")}})]
        if kind == "EXECUTOR_EXITED":
            self.executors.pop((framework_id, agent_id, field_str(event, "executor_id")), None)
            return [ToFramework(framework_id, {"type": "FAILURE", "failure": {
                "agent_id": {"value": agent_id},
                "executor_id": {"value": field_str(event, "executor_id")},
                "status": int(event.get("status", 0))}})]
        raise bad_request(f"unknown agent event type {kind!r}")

    def _agent_update(self, agent_id: str, framework_id: str, event: dict[str, Any],
                      now: float) -> list[Action]:
        status = event.get("status")
        if not isinstance(status, dict) or not isinstance(status.get("state"), str):
            raise bad_request("update.status with a state is required")
        task_id = id_value(status, "task_id", "update.status")
        task = self.tasks.get((framework_id, task_id))
        if task is None or task.agent_id != agent_id:
            logger.warning("master %s: update %s for unknown task %s of framework %s dropped",
                           self.master_id, status["state"], task_id, framework_id)
            return []
        return self._record_status(task, {**status, "agent_id": {"value": agent_id}}, now)

    def _agent_removed(self, ev: AgentRemoved) -> list[Action]:
        return self._remove_agent(ev.agent_id, ev.now, ev.wall, ev.why)

    def _remove_agent(self, agent_id: str, now: float, wall: float, why: str) -> list[Action]:
        """The agent is gone: rescind its offers, lose its tasks, tell every framework."""
        agent = self.agents.pop(agent_id, None)
        if agent is None:
            return []
        self.removed_agents.add(agent_id)
        self.executors = {k: v for k, v in self.executors.items() if k[1] != agent_id}
        logger.warning("master %s: agent %s removed (%s)", self.master_id, agent_id, why)
        actions: list[Action] = [ForgetAgent(agent_id)]
        for offer in [o for o in self.offers.values() if o.agent_id == agent_id]:
            del self.offers[offer.offer_id]
            actions.append(ToFramework(offer.framework_id, {
                "type": "RESCIND", "rescind": {"offer_id": {"value": offer.offer_id}}}))
        for task in [t for t in self.tasks.values() if t.agent_id == agent_id]:
            if not is_terminal(task.state):
                framework = self.frameworks.get(task.framework_id)
                state = ("TASK_UNREACHABLE" if framework is not None and framework.partition_aware
                         else "TASK_LOST")
                actions += self._record_status(task, make_status(
                    task.task_id, state, agent_id=agent_id, executor_id=task.executor_id,
                    reason="REASON_AGENT_REMOVED", message=f"agent {agent_id} lost: {why}",
                    timestamp=wall), now)
        for framework_id in self.frameworks:
            actions.append(ToFramework(framework_id, {
                "type": "FAILURE", "failure": {"agent_id": {"value": agent_id}}}))
        return actions

    # ---------------------------------------------------------------- time

    def _ticked(self, ev: Ticked) -> list[Action]:
        """Time passed: lost agents, expired failover timeouts and offers, new offers."""
        now = ev.now
        actions: list[Action] = []
        for agent in list(self.agents.values()):
            if now - agent.last_seen > self.config.agent_timeout:
                actions += self._remove_agent(agent.agent_id, now, ev.wall,
                                              f"silent for {now - agent.last_seen:.1f}s")
        for framework in list(self.frameworks.values()):
            deadline = framework.failover_deadline
            if framework.stream_id is None and deadline is not None and now >= deadline:
                actions += self._remove_framework(framework.framework_id,
                                                 "failover timeout expired")
        actions += self._expire_offers(now)
        actions += self._answer_settled_reconciles(now, ev.wall)
        self._prune_terminal()
        return actions + self._make_offers(now)

    def _expire_offers(self, now: float) -> list[Action]:
        timeout = self.config.offer_timeout
        if timeout is None:
            return []
        actions: list[Action] = []
        for offer in [o for o in self.offers.values() if now - o.created >= timeout]:
            del self.offers[offer.offer_id]
            actions.append(ToFramework(offer.framework_id, {
                "type": "RESCIND", "rescind": {"offer_id": {"value": offer.offer_id}}}))
        return actions

    def _prune_terminal(self) -> None:
        done = [key for key, t in self.tasks.items() if is_terminal(t.state) and not t.pending]
        for key in done[:max(0, len(done) - TERMINAL_KEEP)]:
            del self.tasks[key]

    def _make_offers(self, now: float) -> list[Action]:
        """Offer each agent's free capacity to one eligible framework, fewest tasks first."""
        batches: dict[str, list[dict[str, Any]]] = {}
        for agent in self.agents.values():
            free = self._free(agent)
            if free.is_empty():
                continue
            framework = self._pick_framework(agent.agent_id, now)
            if framework is None:
                continue
            offer = Offer(self._next_id("O"), framework.framework_id, agent.agent_id, free, now)
            self.offers[offer.offer_id] = offer
            batches.setdefault(framework.framework_id, []).append(self._offer_json(offer, agent))
        return [ToFramework(fid, {"type": "OFFERS", "offers": {"offers": offers}})
                for fid, offers in batches.items()]

    def _free(self, agent: Agent) -> Resources:
        used = sum((t.resources for t in self.tasks.values()
                    if t.agent_id == agent.agent_id and not is_terminal(t.state)), Resources())
        used = used + sum((_executor_resources(info) for (_, a, _), info
                           in self.executors.items() if a == agent.agent_id), Resources())
        offered = sum((o.resources for o in self.offers.values()
                       if o.agent_id == agent.agent_id), Resources())
        return agent.total - used - offered

    def _pick_framework(self, agent_id: str, now: float) -> Framework | None:
        eligible = [f for f in self.frameworks.values()
                    if f.stream_id is not None and not f.suppressed
                    and f.refused_until.get(agent_id, 0.0) <= now]
        if not eligible:
            return None
        return min(eligible, key=lambda f: sum(
            1 for t in self._tasks_of(f.framework_id) if not is_terminal(t.state)))

    def _offer_json(self, offer: Offer, agent: Agent) -> dict[str, Any]:
        return {"id": {"value": offer.offer_id},
                "framework_id": {"value": offer.framework_id},
                "agent_id": {"value": agent.agent_id}, "hostname": agent.hostname,
                "resources": offer.resources.to_mesos(), "attributes": list(agent.attributes),
                "executor_ids": [{"value": e} for (f, a, e) in sorted(self.executors)
                                 if f == offer.framework_id and a == agent.agent_id],
                "allocation_info": {"role": "*"}}

    def _tasks_of(self, framework_id: str) -> list[Task]:
        return [t for t in self.tasks.values() if t.framework_id == framework_id]

    def snapshot(self) -> dict[str, Any]:
        """A JSON view for `GET /state` (debugging and tests)."""
        return {
            "master_id": self.master_id,
            "frameworks": {fid: {"connected": f.stream_id is not None,
                                 "suppressed": f.suppressed}
                           for fid, f in self.frameworks.items()},
            "agents": {aid: {"url": a.url, "resources": a.total.to_mesos()}
                       for aid, a in self.agents.items()},
            "tasks": [{"framework_id": t.framework_id, "task_id": t.task_id,
                       "agent_id": t.agent_id, "executor_id": t.executor_id, "state": t.state}
                      for t in self.tasks.values()],
            "offers": len(self.offers),
            "deferred_reconciliations": len(self.deferred),
        }


_HANDLERS: dict[type, Callable[[MasterState, Any], list[Action]]] = {
    FrameworkSubscribing: MasterState._subscribe,
    CallReceived: MasterState._call,
    StreamClosed: MasterState._stream_closed,
    AgentRegistering: MasterState._register_agent,
    AgentPinged: MasterState._agent_pinged,
    AgentEventReceived: MasterState._agent_event,
    AgentRemoved: MasterState._agent_removed,
    Ticked: MasterState._ticked,
}

# The second level for CallReceived: one handler per call type.
_CALLS = {
    "TEARDOWN": MasterState._teardown,
    "ACCEPT": MasterState._accept,
    "DECLINE": MasterState._decline,
    "REVIVE": MasterState._revive,
    "SUPPRESS": MasterState._suppress,
    "KILL": MasterState._kill,
    "SHUTDOWN": MasterState._shutdown,
    "ACKNOWLEDGE": MasterState._acknowledge,
    "RECONCILE": MasterState._reconcile,
    "MESSAGE": MasterState._message,
    "REQUEST": MasterState._ignore,
}


def _executor_identity(executor: dict[str, Any]) -> dict[str, Any]:
    """An ExecutorInfo as launches compare it (the agent-filled framework_id left out)."""
    return {k: v for k, v in executor.items() if k != "framework_id"}


def _executor_resources(info: dict[str, Any]) -> Resources:
    try:
        return from_mesos(info.get("resources", []))
    except ResourceError:
        return Resources()


def _update(status: dict[str, Any]) -> dict[str, Any]:
    return {"type": "UPDATE", "update": {"status": status}}


def _section(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    if not isinstance(value, dict):
        raise bad_request(f"call.{key} is missing or not an object")
    return value


def field_str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{key} is missing or not a non-empty string")
    return value


def _id_list(body: dict[str, Any], key: str, where: str) -> list[str]:
    items = body.get(key)
    if not isinstance(items, list):
        raise bad_request(f"{where}.{key} must be a list")
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("value"), str):
            raise bad_request(f"{where}.{key}[] must be {{\"value\": \"...\"}} objects")
        out.append(item["value"])
    return out


def _refuse_seconds(body: dict[str, Any], default: float) -> float:
    filters = body.get("filters")
    if filters is None:
        return default
    if not isinstance(filters, dict):
        raise bad_request("filters must be an object")
    value = filters.get("refuse_seconds", default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise bad_request("filters.refuse_seconds must be a non-negative number")
    return float(value)


def _optional_id(body: dict[str, Any], key: str) -> str | None:
    holder = body.get(key)
    if holder is None:
        return None
    if not isinstance(holder, dict) or not isinstance(holder.get("value"), str) \
            or not holder["value"]:
        raise bad_request(f"{key} must be {{\"value\": \"...\"}}")
    return holder["value"]


def parse_agent_report(executors: Any) -> AgentReport:
    """The `executors` list of an agent's (re-)registration, or a 400 naming the bad field:
    `[{"framework_id", "executor_id", "framework_info", "tasks": [{"task_id", "state",
    "resources"}]}]`."""
    if not isinstance(executors, list) or not all(isinstance(e, dict) for e in executors):
        raise bad_request("executors must be a list of objects")
    tasks: list[ReportedTask] = []
    frameworks: dict[str, dict[str, Any]] = {}
    for executor in executors:
        framework_id = field_str(executor, "framework_id")
        executor_id = field_str(executor, "executor_id")
        info = executor.get("framework_info") or {}
        if not isinstance(info, dict) or not safe_id(framework_id) or not safe_id(executor_id):
            raise bad_request("executors[]: plain framework and executor ids and a "
                              "framework_info object are required")
        frameworks.setdefault(framework_id, info)
        reported = executor.get("tasks", [])
        if not isinstance(reported, list) or not all(isinstance(t, dict) for t in reported):
            raise bad_request("executors[].tasks must be a list of objects")
        tasks += [_reported_task(framework_id, executor_id, t) for t in reported]
    return AgentReport(tuple(tasks), tuple(frameworks.items()))


def _reported_task(framework_id: str, executor_id: str, body: dict[str, Any]) -> ReportedTask:
    task_id, state = field_str(body, "task_id"), field_str(body, "state")
    if state not in KNOWN_STATES:
        raise bad_request(f"executors[].tasks[].state {state!r} is not a task state")
    try:
        resources = from_mesos(body.get("resources", []))
    except ResourceError as exc:
        raise bad_request(f"executors[].tasks[].resources: {exc}") from None
    return ReportedTask(framework_id, executor_id, task_id, state, resources)


_FRAMEWORK_TEXT_FIELDS = ("user", "name", "principal", "role", "hostname", "webui_url")


def _check_framework_info(info: dict[str, Any]) -> None:
    """FrameworkInfo fields of the wrong type are refused (400), not stored."""
    for key in _FRAMEWORK_TEXT_FIELDS:
        if key in info and not isinstance(info[key], str):
            raise bad_request(f"subscribe.framework_info.{key} must be a string")
    timeout = info.get("failover_timeout", 0.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise bad_request("subscribe.framework_info.failover_timeout must be a non-negative "
                          "number of seconds")
    if "checkpoint" in info and not isinstance(info["checkpoint"], bool):
        raise bad_request("subscribe.framework_info.checkpoint must be a boolean")


def _requested_framework_id(body: dict[str, Any], info: dict[str, Any]) -> str | None:
    for holder in (body.get("framework_id"), info.get("id")):
        if isinstance(holder, dict) and isinstance(holder.get("value"), str) and holder["value"]:
            return holder["value"]
    return None


def _launch_task_infos(operations: list[dict[str, Any]]) -> list[Any]:
    tasks: list[Any] = []
    for operation in operations:
        kind = operation.get("type")
        if kind == "LAUNCH":
            launch = operation.get("launch")
            if not isinstance(launch, dict) or not isinstance(launch.get("task_infos"), list):
                raise bad_request("a LAUNCH operation needs launch.task_infos (a list)")
            tasks += launch["task_infos"]
        else:
            raise bad_request(f"operation {kind!r} is not supported by the embedded master "
                              "(only LAUNCH)")
    return tasks
