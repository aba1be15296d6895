"""The embedded Mesos-compatible master: HTTP endpoints, event streams and agent links.

Owns the I/O shell around `master_state.MasterState`: `GET /version`, the v1 scheduler API
(`POST /api/v1/scheduler`, SUBSCRIBE as a chunked RecordIO stream with `Mesos-Stream-Id`), the
internal agent protocol (`/internal/agent/register|ping|event`), one sender thread per agent, and
the ticker that detects lost agents and expired failover timeouts. Every decision is the
state's; this module only serialises calls into it under one lock and carries out the actions.
The lock is never held during network I/O: actions become queue puts, and the threads that own
the sockets do the writing.

Restart: `stop()` ends every stream and cuts every open connection (keep-alive ones too, so no
request thread of a stopped master answers again); `successor()` builds a new master with the
same options on the same port. Agents and frameworks reconnect to it by themselves (see
`master_state` for how it rebuilds its tables from them).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from elastiq.embedded.httpio import (
    AppServer, END_OF_STREAM, EventStream, HttpError, JsonClient, RequestHandler,
    serve_event_queue, serve_in_thread,
)
from elastiq.embedded.master_state import (
    Action, EndStream, ForgetAgent, MasterConfig, MasterState, ToAgent, ToFramework,
)
from elastiq.embedded.protocol import VERSION

logger = logging.getLogger(__name__)
_END = END_OF_STREAM  # queue sentinel: end this stream / stop this link


class AgentLink:
    """Delivers master->agent commands in order on its own thread."""

    def __init__(self, agent_id: str, url: str):
        self.agent_id = agent_id
        self._queue: queue.Queue[Any] = queue.Queue()
        self._client = JsonClient(url)
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
                status, body = self._client.post("/internal/command", command)
                if status >= 300:
                    logger.warning("agent %s refused %s: %s %s", self.agent_id,
                                   command.get("type"), status, body)
            except OSError as exc:
                logger.warning("agent %s unreachable for %s: %s", self.agent_id,
                               command.get("type"), exc)
        self._client.close()


class EmbeddedMaster:
    """A Mesos v1 HTTP API master for one machine; unmodified pymesos drivers talk to it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, offer_interval: float = 1.0,
                 heartbeat_interval: float = 15.0, agent_timeout: float = 5.0,
                 offer_timeout: float | None = None, default_refuse_seconds: float = 5.0,
                 agent_reregister_timeout: float | None = None):
        self._server = AppServer((host, port), self)
        self.config = MasterConfig(offer_interval, heartbeat_interval, agent_timeout,
                                   offer_timeout, default_refuse_seconds, host,
                                   self._server.port, agent_reregister_timeout)
        self.state = MasterState(self.config, started=time.monotonic())
        self.name = f"master {self.state.master_id}"
        self._lock = threading.Lock()
        self._queues: dict[str, queue.Queue[Any]] = {}  # stream id -> events
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
        self._threads.append(serve_in_thread(self._server, f"{self.name} http"))
        ticker = threading.Thread(target=self._tick_loop, name=f"{self.name} ticker",
                                  daemon=True)
        ticker.start()
        self._threads.append(ticker)
        logger.info("%s: serving on %s", self.name, self.url)
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
        self._server.shutdown()
        cut = self._server.close_connections()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=2.0)
        logger.info("%s: stopped (%d open connection(s) cut)", self.name, cut)

    def successor(self) -> "EmbeddedMaster":
        """A new, unstarted master with this one's options on this one's port: what a restarted
        master process is. Call after `stop()`."""
        c = self.config
        return EmbeddedMaster(c.hostname, self.port, c.offer_interval, c.heartbeat_interval,
                              c.agent_timeout, c.offer_timeout, c.default_refuse_seconds,
                              c.agent_reregister_timeout)

    def __enter__(self) -> "EmbeddedMaster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- routing

    def handle(self, request: RequestHandler) -> None:
        route = (request.command, request.route)
        if route == ("GET", "/version"):
            request.send_json(200, {"version": VERSION, "build_user": "elastiq-embedded"})
        elif route in (("GET", "/state"), ("GET", "/master/state")):
            with self._lock:
                snapshot = self.state.snapshot()
            request.send_json(200, snapshot)
        elif route == ("POST", "/api/v1/scheduler"):
            self._scheduler_call(request)
        elif route == ("POST", "/internal/agent/register"):
            self._register_agent(request)
        elif route == ("POST", "/internal/agent/ping"):
            self._agent_ping(request)
        elif route == ("POST", "/internal/agent/unregister"):
            self._agent_unregister(request)
        elif route == ("POST", "/internal/agent/event"):
            self._agent_event(request)
        else:
            raise HttpError(404, f"no such endpoint: {request.command} {request.route}")

    def _scheduler_call(self, request: RequestHandler) -> None:
        body = request.read_json()
        if body.get("type") == "SUBSCRIBE":
            self._subscribe(request, body)
            return
        stream_id = request.headers.get("Mesos-Stream-Id")
        with self._lock:
            self._apply(self.state.call(body, stream_id, time.monotonic()))
        request.send_accepted()

    # ---------------------------------------------------------------- framework streams

    def _subscribe(self, request: RequestHandler, body: dict[str, Any]) -> None:
        events: queue.Queue[Any] = queue.Queue()
        with self._lock:
            sub = self.state.subscribe(body, time.monotonic())
            self._queues[sub.stream_id] = events
            self._current[sub.framework_id] = sub.stream_id
            self._apply(sub.actions)
        stream = EventStream(request)
        try:
            stream.start({"Mesos-Stream-Id": sub.stream_id})
            why = serve_event_queue(stream, events, self._stopping,
                                    self.config.heartbeat_interval)
            logger.info("%s: framework %s stream %s closed (%s)", self.name, sub.framework_id,
                        sub.stream_id, why)
        except OSError:
            logger.info("%s: framework %s stream %s broke", self.name, sub.framework_id,
                        sub.stream_id)
        finally:
            stream.finish()
            with self._lock:
                self._queues.pop(sub.stream_id, None)
                if self._current.get(sub.framework_id) == sub.stream_id:
                    del self._current[sub.framework_id]
                self._apply(self.state.stream_closed(sub.framework_id, sub.stream_id,
                                                     time.monotonic()))

    # ---------------------------------------------------------------- agents

    def _register_agent(self, request: RequestHandler) -> None:
        body = request.read_json()
        with self._lock:
            agent_id, actions = self.state.register_agent(body, time.monotonic())
            old = self._links.pop(agent_id, None)
            if old is not None:
                old.stop()
            self._links[agent_id] = AgentLink(agent_id, self.state.agents[agent_id].url)
            self._apply(actions)
        request.send_json(200, {"agent_id": agent_id, "master_id": self.state.master_id})

    def _agent_ping(self, request: RequestHandler) -> None:
        agent_id = request.read_json().get("agent_id")
        with self._lock:
            known = isinstance(agent_id, str) and self.state.agent_ping(agent_id,
                                                                        time.monotonic())
        if not known:
            raise HttpError(404, f"agent {agent_id!r} is not registered; register again")
        request.send_json(200, {})

    def _agent_unregister(self, request: RequestHandler) -> None:
        agent_id = request.read_json().get("agent_id")
        if not isinstance(agent_id, str):
            raise HttpError(400, "agent_id (string) is required")
        with self._lock:
            self._apply(self.state.remove_agent(agent_id, time.monotonic(), "agent stopped"))
        request.send_accepted()

    def _agent_event(self, request: RequestHandler) -> None:
        body = request.read_json()
        agent_id, event = body.get("agent_id"), body.get("event")
        if not isinstance(agent_id, str) or not isinstance(event, dict):
            raise HttpError(400, "agent_id (string) and event (object) are required")
        with self._lock:
            self._apply(self.state.agent_event(agent_id, event, time.monotonic()))
        request.send_accepted()

    # ---------------------------------------------------------------- actions and time

    def _apply(self, actions: list[Action]) -> None:
        """Carry out actions as queue puts only; the caller holds the lock."""
        for action in actions:
            if isinstance(action, ToFramework):
                stream_id = self._current.get(action.framework_id)
                if stream_id is not None:
                    self._queues[stream_id].put(action.event)
                else:
                    logger.debug("%s: framework %s offline; %s dropped", self.name,
                                 action.framework_id, action.event.get("type"))
            elif isinstance(action, ToAgent):
                link = self._links.get(action.agent_id)
                if link is not None:
                    link.send(action.command)
            elif isinstance(action, EndStream):
                events = self._queues.get(action.stream_id)
                if events is not None:
                    if action.final_event is not None:
                        events.put(action.final_event)
                    events.put(_END)
            elif isinstance(action, ForgetAgent):
                link = self._links.pop(action.agent_id, None)
                if link is not None:
                    link.stop()

    def _tick_loop(self) -> None:
        period = max(0.02, min(self.config.offer_interval, self.config.agent_timeout / 4))
        while not self._stopping.wait(period):
            try:
                with self._lock:
                    self._apply(self.state.tick(time.monotonic()))
            except Exception:  # the ticker must survive a bug in one tick
                logger.exception("%s: tick failed", self.name)
