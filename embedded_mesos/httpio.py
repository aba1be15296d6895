"""The HTTP plumbing shared by the embedded master and agent (aiohttp on a thread of its own).

Owns one aiohttp server per master or agent, run on its own asyncio event loop in its own
thread so the rest of the (threaded) cluster stays as it is; routing a (method, path) to an async
handler; JSON request bodies read with a size limit and a time limit and parsed with clear 4xx
errors; empty `202` replies that keep connections alive; chunked RecordIO event streams fed from
other threads (`EventQueue`) with detection of a vanished subscriber; the cluster secret that
guards the internal master<->agent routes; connection guarding against idle and slow clients;
and a small JSON client for the internal calls. It does not own any Mesos semantics.

Limits (module constants, documented in docs/architecture.md):
- a request body larger than `MAX_BODY_BYTES` (16 MiB) is refused with 413;
- a body not received within `BODY_TIMEOUT_SECONDS` (10 s) is refused with 408;
- a connection must complete a request's headers within `HEADER_TIMEOUT_SECONDS` (10 s) of
  connecting or of sending the request's first byte (slowloris), else it is closed;
- a keep-alive connection idle between requests is closed after `IDLE_TIMEOUT_SECONDS` (1 h:
  pymesos keeps one connection for all scheduler calls and fails a call sent on a connection the
  server closed, so this must outlast a quiet scheduler);
- beyond `MAX_CONNECTIONS` (512) open connections, the longest-idle one is closed for each new
  one.
Every connection costs the event loop a socket, not a thread: the server's threads are its loop
thread and `SYNC_WORKERS` pool threads, whatever the number of clients. Handlers run the
cluster's locking code through `run_sync` (the pool), never on the loop thread.

The parser is aiohttp's: a request's body belongs to that request whether or not the handler
reads it (a refused body that has fully arrived is discarded, else the connection is closed:
no lingering), so it is never parsed as the next request; a malformed request line or header
gets aiohttp's 400.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import http.client
import json
import logging
import socket
import threading
import time
from typing import Any, Awaitable, Callable, TypeVar
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler as _AiohttpProtocol

from embedded_mesos.recordio import encode_record

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 * 1024 * 1024
BODY_TIMEOUT_SECONDS = 10.0
HEADER_TIMEOUT_SECONDS = 10.0
IDLE_TIMEOUT_SECONDS = 3600.0
MAX_CONNECTIONS = 512
SYNC_WORKERS = 4
SECRET_HEADER = "Elastiq-Cluster-Secret"
SECRET_ENV = "ELASTIQ_EMBEDDED_SECRET"  # the cluster secret, for agents in other processes
AGENT_COMMAND_PATH = "/internal/command"  # the agent's route for master commands (secret-guarded)
STREAM_POLL_SECONDS = 0.2
END_OF_STREAM = object()  # put on an event queue to end the stream that serves it

_CLOSE_AFTER = frozenset({408, 411, 413})  # refusals after which the connection is closed
T = TypeVar("T")
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class HttpError(Exception):
    """A request we refuse; becomes a JSON error reply with `status`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers  # e.g. WWW-Authenticate with a 401


def bad_request(message: str) -> HttpError:
    return HttpError(400, message)


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode("utf-8"),
                        content_type="application/json", headers=headers)


def accepted() -> web.Response:
    """`202 Accepted` with an empty body (Content-Length 0), keeping the connection alive."""
    return web.Response(status=202)


def secret_matches(expected: str, request: web.BaseRequest) -> bool:
    """Whether the request carries the cluster secret (compared in constant time)."""
    given = request.headers.get(SECRET_HEADER, "")
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


def require_secret(expected: str, request: web.BaseRequest) -> None:
    if not secret_matches(expected, request):
        raise HttpError(401, f"internal route: the {SECRET_HEADER} header is missing or wrong")


async def read_json(request: web.BaseRequest) -> dict[str, Any]:
    """The request body as a JSON object, or HttpError(400/408/411/413)."""
    if request.content_length is None and "chunked" not in \
            request.headers.get("Transfer-Encoding", "").lower():
        raise HttpError(411, "a Content-Length header is required")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise HttpError(413, f"body of {request.content_length} bytes is over the limit of "
                             f"{MAX_BODY_BYTES}")
    try:
        data = await asyncio.wait_for(_read_limited(request), BODY_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        raise HttpError(408, f"body not received within {BODY_TIMEOUT_SECONDS:g}s") from None
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("body must be a JSON object")
    return body


async def _read_limited(request: web.BaseRequest) -> bytes:
    parts: list[bytes] = []
    size = 0
    while chunk := await request.content.read(65536):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HttpError(413, f"body is over the limit of {MAX_BODY_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


class EventQueue:
    """Events for one stream: `put` from any thread, `get` on the server's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server stopped, the stream is gone
            pass

    async def get(self, timeout: float) -> Any:
        """The next item, or None after `timeout` seconds."""
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None


async def serve_events(request: web.BaseRequest, headers: dict[str, str], events: EventQueue,
                       stopping: threading.Event, heartbeat_seconds: float,
                       ) -> tuple[web.StreamResponse, str]:
    """Answer with a chunked RecordIO stream (one record per chunk) of the queued events, a
    HEARTBEAT when idle, until END_OF_STREAM, `stopping`, or the subscriber leaves; returns the
    response (for the handler to return) and why it ended. The connection closes with it."""
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       **headers})
    response.enable_chunked_encoding()
    response.force_close()
    await response.prepare(request)
    last_write = time.monotonic()
    why = "stopping"
    try:
        while not stopping.is_set():
            if request.transport is None or request.transport.is_closing():
                why = "subscriber gone"
                break
            event = await events.get(STREAM_POLL_SECONDS)
            if event is END_OF_STREAM:
                why = "ended"
                break
            now = time.monotonic()
            if event is None and now - last_write >= heartbeat_seconds:
                event = {"type": "HEARTBEAT"}
            if event is not None:
                await response.write(encode_record(event))
                last_write = now
        if why != "subscriber gone":
            await response.write_eof()
    except (ConnectionError, RuntimeError) as exc:  # aiohttp: a write to a closed transport
        why = f"subscriber gone ({exc.__class__.__name__})"
    return response, why


class _ProtocolLog:
    """aiohttp's per-connection logger: a request it cannot parse is the client's fault, logged
    on one INFO line, not as an ERROR with a traceback."""

    def __init__(self, name: str):
        self._name = name

    def exception(self, message: str, *args: Any, exc_info: Any = None, **_: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            logger.info("%s: unparsable request refused: %s", self._name,
                        " ".join(str(exc_info).split())[:200])
        else:
            logger.error("%s: " + message, self._name, *args, exc_info=exc_info or True)

    def debug(self, *args: Any, **kwargs: Any) -> None:
        logger.debug(*args, **kwargs)

    def warning(self, *args: Any, **kwargs: Any) -> None:
        logger.warning(*args, **kwargs)

    def error(self, *args: Any, **kwargs: Any) -> None:
        logger.error(*args, **kwargs)

    def info(self, *args: Any, **kwargs: Any) -> None:
        logger.info(*args, **kwargs)


class _GuardedProtocol(_AiohttpProtocol):
    """aiohttp's connection handler plus the header timeout (see the module docstring)."""

    __slots__ = ("_guard", "_header_timer", "_in_request", "_idle_since")

    def __init__(self, guard: "_ConnectionGuard", *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_request = False
        self._idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()
        self._guard.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_timer()
        self._guard.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._in_request:
            self._arm_header_timer()  # the first byte of a request starts its header clock
        super().data_received(data)

    def request_began(self) -> None:
        self._in_request = True
        self._disarm_header_timer()

    def request_ended(self) -> None:
        self._in_request = False
        self._idle_since = time.monotonic()

    def idle_for(self) -> float | None:
        """Seconds idle between requests, or None while a request is being served."""
        return None if self._in_request else time.monotonic() - self._idle_since

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = asyncio.get_running_loop().call_later(
                HEADER_TIMEOUT_SECONDS, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self._in_request:
            logger.info("%s: closing a connection that sent no complete request headers in "
                        "%gs", self._guard.name, HEADER_TIMEOUT_SECONDS)
            self.force_close()


class _ConnectionGuard(web.Server):
    """aiohttp's low-level server making `_GuardedProtocol`s, capping open connections."""

    def __init__(self, name: str, handler: Handler, **kwargs: Any):
        super().__init__(handler, **kwargs)
        self.name = name
        self.open: set[_GuardedProtocol] = set()

    def __call__(self) -> _GuardedProtocol:
        return _GuardedProtocol(self, self, loop=self._loop, **self._kwargs)

    def opened(self, protocol: _GuardedProtocol) -> None:
        self.open.add(protocol)
        if len(self.open) > MAX_CONNECTIONS:
            idle = [(p.idle_for(), id(p), p) for p in self.open
                    if p is not protocol and p.idle_for() is not None]
            if idle:
                victim = max(idle, key=lambda item: item[0] or 0.0)[2]
                logger.info("%s: over %d connections; closing the longest-idle one",
                            self.name, MAX_CONNECTIONS)
                self.open.discard(victim)  # its connection_lost comes later
                victim.force_close()

    def closed(self, protocol: _GuardedProtocol) -> None:
        self.open.discard(protocol)

    def cut_all(self) -> int:
        protocols = list(self.open)
        for protocol in protocols:
            protocol.force_close()
        return len(protocols)


Routes = dict[tuple[str, str], Handler]


class AppServer:
    """An aiohttp server on `host:port` (bound at construction, so `port` is known at once),
    served on its own event loop thread between `start()` and `stop()`."""

    def __init__(self, host: str, port: int, name: str, routes: Routes):
        self.name = name
        self._routes = routes
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.port = int(self._sock.getsockname()[1])
        self.loop = asyncio.new_event_loop()
        self._pool = concurrent.futures.ThreadPoolExecutor(1)  # replaced by start()
        self._guard: _ConnectionGuard | None = None
        self._listener: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve on a new loop thread; blocking work goes to a pool of `SYNC_WORKERS` threads
        (named `<name> http` and `<name> sync_<n>`)."""
        self._pool = concurrent.futures.ThreadPoolExecutor(SYNC_WORKERS,
                                                           thread_name_prefix=f"{self.name} sync")
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=f"{self.name} http",
                                        daemon=True)
        self._thread.start()
        if not ready.wait(10.0):
            raise RuntimeError(f"{self.name}: HTTP server did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._listen())
        ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    async def _listen(self) -> None:
        self._guard = _ConnectionGuard(self.name, self._dispatch, access_log=None,
                                       logger=_ProtocolLog(self.name),
                                       keepalive_timeout=IDLE_TIMEOUT_SECONDS,
                                       lingering_time=0)
        self._listener = await self.loop.create_server(self._guard, sock=self._sock)

    def stop(self) -> int:
        """Stop listening, cut every open connection (keep-alive ones too, so nothing answers
        for a stopped server), stop the loop; returns how many connections were cut."""
        if self._thread is None:
            self._sock.close()
            return 0
        try:
            cut = asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10.0)
        except (concurrent.futures.TimeoutError, RuntimeError):
            logger.warning("%s: HTTP server did not close cleanly", self.name)
            cut = 0
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        return cut

    async def _close(self) -> int:
        assert self._listener is not None and self._guard is not None
        self._listener.close()
        cut = self._guard.cut_all()
        await asyncio.sleep(0)  # let cancelled handlers run their cleanup
        return cut

    def run_sync(self, fn: Callable[..., T], *args: Any) -> "asyncio.Future[T]":
        """Run blocking code (anything taking the cluster's locks) off the loop thread."""
        return self.loop.run_in_executor(self._pool, fn, *args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run blocking cleanup off the loop thread without waiting for it."""
        try:
            self._pool.submit(fn, *args)
        except RuntimeError:  # pool shut down: the server is stopping; run it here
            fn(*args)

    def events(self) -> EventQueue:
        return EventQueue(self.loop)

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        if isinstance(protocol, _GuardedProtocol):
            protocol.request_began()
        try:
            handler = self._routes.get((request.method, request.path))
            if handler is None:
                methods = sorted(m for m, p in self._routes if p == request.path)
                if methods:
                    raise HttpError(405, f"{request.method} {request.path}: use "
                                         f"{', '.join(methods)}")
                raise HttpError(404, f"no such endpoint: {request.method} {request.path}")
            return await handler(request)
        except HttpError as exc:
            logger.info("%s: %s %s refused (%s): %s", self.name, request.method, request.path,
                        exc.status, exc.message)
            response = json_response(exc.status, {"error": exc.message}, exc.headers)
            if exc.status in _CLOSE_AFTER:
                response.force_close()  # the rest of the body is not worth draining
            return response
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:  # a bug must not take the server down; the caller gets a 500
            logger.exception("%s: %s %s failed", self.name, request.method, request.path)
            return json_response(500, {"error": "internal error in the embedded cluster; "
                                                "see its log"})
        finally:
            if isinstance(protocol, _GuardedProtocol):
                protocol.request_ended()


class JsonClient:
    """One keep-alive HTTP connection for JSON POSTs to `base_url`; not thread-safe. `headers`
    go with every request (the cluster secret)."""

    def __init__(self, base_url: str, timeout: float = 5.0,
                 headers: dict[str, str] | None = None):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self._host, self._port, self._timeout = parts.hostname, parts.port, timeout
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """POST JSON; returns (status, decoded body or None). Raises OSError on I/O failure."""
        data = json.dumps(body).encode("utf-8")
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("POST", path, body=data, headers=self._headers)
                response = conn.getresponse()
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port,
                                                    timeout=self._timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now on `host` (for tests and CLIs that must name a port up front)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
