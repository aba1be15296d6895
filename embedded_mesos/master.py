"""The embedded Mesos-compatible master: HTTP endpoints, event streams and agent links.

Owns the I/O shell around `master_state.MasterState`: `GET /version`, the operator API
(`POST /api/v1` read-only calls, `/master/state` = `/state.json`, `/metrics/snapshot`, `/health`,
`/redirect`; answers from `operator_api`, JSON only: a protobuf body is 415), the debugging view
`GET /state` (its own schema), the v1 scheduler API
(`POST /api/v1/scheduler`, SUBSCRIBE as a chunked RecordIO stream with `Mesos-Stream-Id`), the
internal agent protocol (`/internal/agent/register|ping|unregister|event`, refused with 401
without the cluster secret), one sender thread per agent (its commands carry the secret), and
the ticker that detects lost agents and expired failover timeouts.

Framework authentication (on by default, as Mesos's `--authenticate_http_frameworks`): every
scheduler call must carry HTTP Basic credentials of the master's framework credential
(`framework_credential`: given, else made at construction, kept across `successor()`), checked
in constant time before the body is read; otherwise 401 with `WWW-Authenticate: Basic
realm="mesos"`. A SUBSCRIBE whose FrameworkInfo names another principal gets 403. The operator
endpoints but `/health`, `/version` and `/redirect` ask the same credential when it is on (as
Mesos with `--authenticate_http_readonly`). Without it,
anyone who reaches the port could launch any executor command, which an agent runs as its user;
`authenticate_frameworks=False` (for a test that needs an open master) is unsafe and logged.

Every decision is the state's; this module only turns requests and time into events
(`master_state.handle`), under one lock, and carries out the actions. It is where the clocks are
read and the ids minted: each event gets `time.monotonic()` and `time.time()` of the same
moment, a SUBSCRIBE its new stream id, the state its master id.
HTTP is served by `httpio.AppServer` on its own event loop thread; the handlers take the lock
only on its worker pool (`run_sync`), never on the loop thread. The lock is never held during
network I/O: actions become queue puts (`EventQueue.put` hands an event to the loop), and the
loop or the link threads do the writing.

Restart: `stop()` ends every stream and cuts every open connection (keep-alive ones too, so no
request thread of a stopped master answers again); `successor()` builds a new master with the
same options on the same port. Agents and frameworks reconnect to it by themselves (see
`master_state` for how it rebuilds its tables from them).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
import uuid
from typing import Any, Callable, TypeVar

from aiohttp import web

from embedded_mesos.auth import (
    BASIC_CHALLENGE, FrameworkCredential, authenticated_principal, new_framework_credential,
)
from embedded_mesos import operator_api
from embedded_mesos.httpio import (
    AGENT_COMMAND_PATH, END_OF_STREAM, SECRET_ENV, SECRET_HEADER, AppServer, EventQueue, Handler,
    HttpError, JsonClient, Routes, accepted, bad_request, json_response, read_json,
    require_secret, serve_events,
)
from common.dispatch import handler
from embedded_mesos.master_state import (
    Action, AgentAccepted, AgentEventReceived, AgentPinged, AgentRegistering, AgentRemoved,
    CallReceived, EndStream, ForgetAgent, FrameworkSubscribing, MasterConfig, MasterState,
    PingAnswered, StreamClosed, Subscribed, Ticked, ToAgent, ToFramework,
)
from embedded_mesos.protocol import VERSION

logger = logging.getLogger(__name__)
_END = END_OF_STREAM  # queue sentinel: end this stream / stop this link
A = TypeVar("A")


class AgentLink:
    """Delivers master->agent commands in order on its own thread, with the cluster secret."""

    def __init__(self, agent_id: str, url: str, secret: str):
        self.agent_id = agent_id
        self._queue: queue.Queue[Any] = queue.Queue()
        self._client = JsonClient(url, headers={SECRET_HEADER: secret})
        self._thread = threading.Thread(target=self._run, name=f"agent-link-{agent_id}",
                                        daemon=True)
        self._thread.start()

    def send(self, command: dict[str, Any]) -> None:
        self._queue.put(command)

    def stop(self) -> None:
        self._queue.put(_END)

    def _run(self) -> None:
        while (command := self._queue.get()) is not _END:
            try:
                status, body = self._client.post(AGENT_COMMAND_PATH, command)
                if status >= 300:
                    logger.warning("agent %s refused %s: %s %s", self.agent_id,
                                   command.get("type"), status, body)
            except OSError as exc:
                logger.warning("agent %s unreachable for %s: %s", self.agent_id,
                               command.get("type"), exc)
        self._client.close()


def new_secret() -> str:
    """A fresh cluster secret (256 random bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


class EmbeddedMaster:
    """A Mesos v1 HTTP API master for one machine; unmodified pymesos drivers talk to it.

    `secret` guards the internal agent routes (agents must send it in the `SECRET_HEADER`
    header; the master sends it to agents with every command); without one, `SECRET_ENV` is
    read, else a fresh one is made. Hand it to agents in memory, through `SECRET_ENV`, or a
    0600 file, never on a command line. `framework_credential` (fresh unless given) is what
    schedulers must present (HTTP Basic) unless `authenticate_frameworks` is False (unsafe)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, offer_interval: float = 1.0,
                 heartbeat_interval: float = 15.0, agent_timeout: float = 5.0,
                 offer_timeout: float | None = None, default_refuse_seconds: float = 5.0,
                 agent_reregister_timeout: float | None = None, secret: str | None = None,
                 framework_credential: FrameworkCredential | None = None,
                 authenticate_frameworks: bool = True):
        self.secret = secret or os.environ.get(SECRET_ENV) or new_secret()
        self.framework_credential = framework_credential or new_framework_credential()
        self.authenticate_frameworks = authenticate_frameworks
        self._server = AppServer(host, port, "master", self._routes())
        self.config = MasterConfig(offer_interval, heartbeat_interval, agent_timeout,
                                   offer_timeout, default_refuse_seconds, host,
                                   self._server.port, agent_reregister_timeout)
        self.state = MasterState(self.config, uuid.uuid4().hex[:12], started=time.monotonic())
        self._started = (time.monotonic(), time.time())  # for uptime and start_time
        self.name = f"master {self.state.master_id}"
        self._server.name = self.name
        self._lock = threading.Lock()
        self._queues: dict[str, EventQueue] = {}  # stream id -> events
        self._current: dict[str, str] = {}  # framework id -> stream id
        self._links: dict[str, AgentLink] = {}
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def address(self) -> str:
        """`host:port`, the form pymesos's MesosSchedulerDriver takes as master_uri."""
        return f"{self.config.hostname}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> "EmbeddedMaster":
        self._server.start()
        ticker = threading.Thread(target=self._tick_loop, name=f"{self.name} ticker",
                                  daemon=True)
        ticker.start()
        self._threads.append(ticker)
        logger.info("%s: serving on %s", self.name, self.url)
        if not self.authenticate_frameworks:
            logger.warning("%s: framework authentication is OFF: whoever reaches %s can launch "
                           "any command on its agents", self.name, self.url)
        return self

    def stop(self) -> None:
        """End every stream and link, then stop serving; idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            for events in self._queues.values():
                events.put(_END)
            for link in self._links.values():
                link.stop()
            self._links.clear()
        cut = self._server.stop()
        for thread in self._threads:
            thread.join(timeout=2.0)
        logger.info("%s: stopped (%d open connection(s) cut)", self.name, cut)

    def successor(self) -> "EmbeddedMaster":
        """A new, unstarted master with this one's options, port and secret: what a restarted
        master process is. Call after `stop()`."""
        c = self.config
        return EmbeddedMaster(c.hostname, self.port, c.offer_interval, c.heartbeat_interval,
                              c.agent_timeout, c.offer_timeout, c.default_refuse_seconds,
                              c.agent_reregister_timeout, self.secret, self.framework_credential,
                              self.authenticate_frameworks)

    def __enter__(self) -> "EmbeddedMaster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- routing

    def _routes(self) -> Routes:
        return {("GET", "/version"): self._version,
                ("GET", "/state"): self._state,
                ("GET", "/master/state"): self._state_v0, ("GET", "/state.json"): self._state_v0,
                ("GET", "/master/state.json"): self._state_v0,
                ("GET", "/metrics/snapshot"): self._metrics,
                ("GET", "/health"): self._health, ("GET", "/master/health"): self._health,
                ("GET", "/redirect"): self._redirect, ("GET", "/master/redirect"): self._redirect,
                ("POST", "/api/v1"): self._operator_call,
                ("POST", "/api/v1/scheduler"): self._scheduler_call,
                ("POST", "/internal/agent/register"): self._internal(self._register_agent),
                ("POST", "/internal/agent/ping"): self._internal(self._agent_ping),
                ("POST", "/internal/agent/unregister"): self._internal(self._agent_unregister),
                ("POST", "/internal/agent/event"): self._internal(self._agent_event)}

    def _internal(self, handler: Callable[[dict[str, Any]], web.StreamResponse]) -> Handler:
        """An internal route: the secret is checked before the body is read; the handler runs
        off the loop thread (it takes the lock)."""
        async def route(request: web.BaseRequest) -> web.StreamResponse:
            require_secret(self.secret, request)
            body = await read_json(request)
            return await self._server.run_sync(handler, body)
        return route

    async def _version(self, request: web.BaseRequest) -> web.StreamResponse:
        return json_response(200, {"version": VERSION, "build_user": "elastiq-embedded"})

    async def _state(self, request: web.BaseRequest) -> web.StreamResponse:
        self._authenticate(request)  # an operator endpoint: as Mesos's, when auth is on
        return json_response(200, await self._server.run_sync(self._snapshot))

    def _snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self.state.snapshot()

    # ---------------------------------------------------------------- operator API

    def _uptime(self) -> float:
        return time.monotonic() - self._started[0]

    def _read(self, view: Callable[[], Any]) -> Any:
        with self._lock:
            return view()

    async def _state_v0(self, request: web.BaseRequest) -> web.StreamResponse:
        self._authenticate(request)
        port = self.port
        return json_response(200, await self._server.run_sync(self._read, lambda: (
            operator_api.master_state_v0(self.state, self.config.hostname, port,
                                         self._uptime(), self._started[1]))))

    async def _metrics(self, request: web.BaseRequest) -> web.StreamResponse:
        self._authenticate(request)
        return json_response(200, await self._server.run_sync(self._read, lambda: (
            operator_api.metrics(self.state, self._uptime()))))

    async def _health(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=200)  # open, as Mesos's /health

    async def _redirect(self, request: web.BaseRequest) -> web.StreamResponse:
        """To the leading master: this one (there is one embedded master)."""
        return web.Response(status=307, headers={"Location": f"//{self.address}"})

    async def _operator_call(self, request: web.BaseRequest) -> web.StreamResponse:
        """`POST /api/v1`: the read-only operator calls, JSON in and out."""
        self._authenticate(request)
        _json_only(request, "operator API")
        body = await read_json(request)
        try:
            answer = await self._server.run_sync(self._read, lambda: operator_api.v1_call(
                self.state, body, self._uptime()))
        except operator_api.OperatorCallError as exc:
            raise bad_request(str(exc)) from None
        return json_response(200, answer)

    async def _scheduler_call(self, request: web.BaseRequest) -> web.StreamResponse:
        principal = self._authenticate(request)
        _json_only(request, "scheduler API")
        body = await read_json(request)
        if body.get("type") == "SUBSCRIBE":
            _check_principal(body, principal)
            return await self._subscribe(request, body)
        stream_id = request.headers.get("Mesos-Stream-Id")
        await self._server.run_sync(self._call, body, stream_id, principal)
        return accepted()

    def _authenticate(self, request: web.BaseRequest) -> str | None:
        """The caller's principal (None when authentication is off); HttpError(401) unless
        the request carries the framework credential."""
        if not self.authenticate_frameworks:
            return None
        principal = authenticated_principal(request.headers.get("Authorization"),
                                            (self.framework_credential,))
        if principal is None:
            raise HttpError(401, "framework authentication failed: send HTTP Basic credentials "
                                 "of the master's framework principal",
                            {"WWW-Authenticate": BASIC_CHALLENGE})
        return principal

    def _call(self, body: dict[str, Any], stream_id: str | None,
              principal: str | None = None) -> None:
        with self._lock:
            framework_id = body.get("framework_id")
            value = framework_id.get("value") if isinstance(framework_id, dict) else None
            framework = self.state.frameworks.get(value) if isinstance(value, str) else None
            if framework is not None:  # every call, not only SUBSCRIBE, as its own principal
                _check_principal({"subscribe": {"framework_info": framework.info}}, principal)
            self._apply(self.state.handle(CallReceived(body, stream_id, time.monotonic(),
                                                       time.time())))

    # ---------------------------------------------------------------- framework streams

    async def _subscribe(self, request: web.BaseRequest,
                         body: dict[str, Any]) -> web.StreamResponse:
        events = self._server.events()
        sub = await self._server.run_sync(self._open_stream, body, events)
        why = "broke"
        try:
            response, why = await serve_events(request, {"Mesos-Stream-Id": sub.stream_id},
                                               events, self._stopping,
                                               self.config.heartbeat_interval)
        finally:
            logger.info("%s: framework %s stream %s closed (%s)", self.name, sub.framework_id,
                        sub.stream_id, why)
            self._server.submit(self._close_stream, sub.framework_id, sub.stream_id)
        return response

    def _open_stream(self, body: dict[str, Any], events: EventQueue) -> Subscribed:
        stream_id = str(uuid.uuid4())
        with self._lock:
            actions = self.state.handle(FrameworkSubscribing(body, stream_id, time.monotonic(),
                                                             time.time()))
            sub = _answer(actions, Subscribed)
            self._queues[sub.stream_id] = events
            self._current[sub.framework_id] = sub.stream_id
            self._apply(actions)
        return sub

    def _close_stream(self, framework_id: str, stream_id: str) -> None:
        with self._lock:
            self._queues.pop(stream_id, None)
            if self._current.get(framework_id) == stream_id:
                del self._current[framework_id]
            self._apply(self.state.handle(StreamClosed(framework_id, stream_id,
                                                       time.monotonic(), time.time())))

    # ---------------------------------------------------------------- agents

    def _register_agent(self, body: dict[str, Any]) -> web.StreamResponse:
        with self._lock:
            actions = self.state.handle(AgentRegistering(body, time.monotonic(), time.time()))
            agent_id = _answer(actions, AgentAccepted).agent_id
            old = self._links.pop(agent_id, None)
            if old is not None:
                old.stop()
            self._links[agent_id] = AgentLink(agent_id, self.state.agents[agent_id].url,
                                              self.secret)
            self._apply(actions)
        return json_response(200, {"agent_id": agent_id, "master_id": self.state.master_id})

    def _agent_ping(self, body: dict[str, Any]) -> web.StreamResponse:
        agent_id = body.get("agent_id")
        with self._lock:
            known = isinstance(agent_id, str) and _answer(self.state.handle(AgentPinged(
                agent_id, time.monotonic(), time.time())), PingAnswered).known
        if not known:
            raise HttpError(404, f"agent {agent_id!r} is not registered; register again")
        return json_response(200, {})

    def _agent_unregister(self, body: dict[str, Any]) -> web.StreamResponse:
        agent_id = body.get("agent_id")
        if not isinstance(agent_id, str):
            raise HttpError(400, "agent_id (string) is required")
        with self._lock:
            self._apply(self.state.handle(AgentRemoved(agent_id, "agent stopped",
                                                       time.monotonic(), time.time())))
        return accepted()

    def _agent_event(self, body: dict[str, Any]) -> web.StreamResponse:
        agent_id, event = body.get("agent_id"), body.get("event")
        if not isinstance(agent_id, str) or not isinstance(event, dict):
            raise HttpError(400, "agent_id (string) and event (object) are required")
        with self._lock:
            self._apply(self.state.handle(AgentEventReceived(agent_id, event, time.monotonic(),
                                                             time.time())))
        return accepted()

    # ---------------------------------------------------------------- actions and time

    def _apply(self, actions: list[Action]) -> None:
        """Carry out actions as queue puts only; the caller holds the lock."""
        for action in actions:
            handler(_ACTIONS, action, "EmbeddedMaster")(self, action)

    def _to_framework(self, action: ToFramework) -> None:
        stream_id = self._current.get(action.framework_id)
        if stream_id is not None:
            self._queues[stream_id].put(action.event)
        else:
            logger.debug("%s: framework %s offline; %s dropped", self.name,
                         action.framework_id, action.event.get("type"))

    def _to_agent(self, action: ToAgent) -> None:
        link = self._links.get(action.agent_id)
        if link is not None:
            link.send(action.command)

    def _end_stream(self, action: EndStream) -> None:
        events = self._queues.get(action.stream_id)
        if events is not None:
            if action.final_event is not None:
                events.put(action.final_event)
            events.put(_END)

    def _forget_agent(self, action: ForgetAgent) -> None:
        link = self._links.pop(action.agent_id, None)
        if link is not None:
            link.stop()

    def _answered(self, action: Subscribed | AgentAccepted | PingAnswered) -> None:
        """An answer to the request being handled: its handler reads it (`_answer`)."""

    def _tick_loop(self) -> None:
        period = max(0.02, min(self.config.offer_interval, self.config.agent_timeout / 4))
        while not self._stopping.wait(period):
            try:
                with self._lock:
                    self._apply(self.state.handle(Ticked(time.monotonic(), time.time())))
            except Exception:  # the ticker must survive a bug in one tick
                logger.exception("%s: tick failed", self.name)


_ACTIONS: dict[type, Callable[[EmbeddedMaster, Any], None]] = {
    ToFramework: EmbeddedMaster._to_framework,
    ToAgent: EmbeddedMaster._to_agent,
    EndStream: EmbeddedMaster._end_stream,
    ForgetAgent: EmbeddedMaster._forget_agent,
    Subscribed: EmbeddedMaster._answered,
    AgentAccepted: EmbeddedMaster._answered,
    PingAnswered: EmbeddedMaster._answered,
}


def _answer(actions: list[Action], kind: type[A]) -> A:
    """The one answer of type `kind` among the actions of a handled request."""
    (answer,) = [a for a in actions if isinstance(a, kind)]
    return answer


def _json_only(request: web.BaseRequest, api: str) -> None:
    """415 for a protobuf body, 406 for a protobuf-only Accept: this master speaks JSON."""
    for header, status in (("Content-Type", 415), ("Accept", 406)):
        value = request.headers.get(header, "application/json")
        if "protobuf" in value and "json" not in value:
            raise HttpError(status, f"{header} {value}: the embedded master speaks the {api} "
                                    "in JSON only (application/json)")


def _check_principal(body: dict[str, Any], principal: str | None) -> None:
    """A SUBSCRIBE may name only the principal it authenticated as, and a later call must come
    from the principal its framework subscribed with (HttpError 403)."""
    subscribe = body.get("subscribe")
    info = subscribe.get("framework_info") if isinstance(subscribe, dict) else None
    claimed = info.get("principal") if isinstance(info, dict) else None
    if principal is not None and claimed is not None and claimed != principal:
        raise HttpError(403, f"authenticated as principal {principal!r}, but the FrameworkInfo "
                             f"names principal {claimed!r}")
