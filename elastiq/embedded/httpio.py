"""The HTTP plumbing shared by the embedded master and agent.

Owns a threaded HTTP/1.1 server that hands each request to an application object, JSON request
parsing with clear 4xx errors, empty `202` replies that keep connections alive, chunked RecordIO
event streams with detection of a vanished subscriber, and a small JSON client for the internal
master<->agent calls. It does not own any Mesos semantics.
"""

from __future__ import annotations

import http.client
import json
import logging
import queue
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from elastiq.embedded.recordio import LAST_CHUNK, encode_record, http_chunk

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 * 1024 * 1024


class HttpError(Exception):
    """A request we refuse; becomes a JSON error reply with `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def bad_request(message: str) -> HttpError:
    return HttpError(400, message)


class Application(Protocol):
    """What a server hands each request to; `name` appears in log lines."""

    name: str

    def handle(self, request: "RequestHandler") -> None: ...


class RequestHandler(BaseHTTPRequestHandler):
    """Routes every request to `server.app.handle`; turns HttpError into a JSON reply."""

    protocol_version = "HTTP/1.1"
    server: "AppServer"

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    @property
    def route(self) -> str:
        return urlsplit(self.path).path

    def _dispatch(self) -> None:
        self.response_started = False
        try:
            self.server.app.handle(self)
        except HttpError as exc:
            logger.info("%s: %s %s refused (%s): %s", self.server.app.name, self.command,
                        self.route, exc.status, exc.message)
            self._reply_error(exc.status, exc.message)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # a bug must not take the server down; the caller gets a 500
            logger.exception("%s: %s %s failed", self.server.app.name, self.command, self.route)
            self._reply_error(500, "internal error in the embedded cluster; see its log")

    def _reply_error(self, status: int, message: str) -> None:
        if self.response_started:
            self.close_connection = True
            return
        self._drain_body()
        self.send_json(status, {"error": message})

    def _drain_body(self) -> None:
        if getattr(self, "_body_read", False):
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if 0 < length <= MAX_BODY_BYTES:
            self.rfile.read(length)
        elif length:
            self.close_connection = True

    def read_json(self) -> dict[str, Any]:
        """The request body as a JSON object, or HttpError(400/413/415)."""
        self._body_read = True
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            self.close_connection = True
            raise HttpError(411, "a Content-Length header is required")
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise bad_request(f"bad Content-Length {raw_length!r}") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            raise HttpError(413, f"body of {length} bytes is not accepted")
        data = self.rfile.read(length)
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise bad_request(f"body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise bad_request("body must be a JSON object")
        return body

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self.response_started = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def send_accepted(self) -> None:
        """`202 Accepted` with an empty body, keeping the connection alive."""
        self.response_started = True
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("%s: " + format, self.server.app.name, *args)


class AppServer(ThreadingHTTPServer):
    """A threaded HTTP server bound to one application; request threads are daemons."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: Application):
        self.app = app
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, RequestHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> int:
        """Cut every open connection (keep-alive ones included), so that no request thread
        of a stopped server answers another request; returns how many were cut."""
        with self._open_lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(sockets)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that vanished mid-request is routine (killed executors, stopped drivers)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, TimeoutError)):
            logger.debug("%s: connection from %s dropped: %s", self.app.name, client_address, exc)
            return
        logger.error("%s: request from %s failed", self.app.name, client_address,
                     exc_info=True)


def serve_in_thread(server: AppServer, name: str) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              name=name, daemon=True)
    thread.start()
    return thread


class EventStream:
    """A chunked RecordIO response held open on a request's thread."""

    def __init__(self, handler: RequestHandler):
        self._handler = handler
        self._sock: socket.socket = handler.connection
        self.open = False

    def start(self, headers: dict[str, str]) -> None:
        handler = self._handler
        handler.response_started = True
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.flush()
        handler.close_connection = True
        self.open = True

    def send(self, record: dict[str, Any]) -> None:
        """Write one record as one chunk; raises OSError when the subscriber is gone."""
        self._handler.wfile.write(http_chunk(encode_record(record)))
        self._handler.wfile.flush()

    def finish(self) -> None:
        """End the stream cleanly (the last chunk); ignores a subscriber already gone."""
        if not self.open:
            return
        self.open = False
        try:
            self._handler.wfile.write(LAST_CHUNK)
            self._handler.wfile.flush()
        except OSError:
            pass

    def subscriber_gone(self) -> bool:
        """True when the subscriber closed its end (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            if not readable:
                return False
            return self._sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


END_OF_STREAM = object()  # put on an event queue to end the stream that serves it
STREAM_POLL_SECONDS = 0.2


def serve_event_queue(stream: EventStream, events: "queue.Queue[Any]", stopping: threading.Event,
                      heartbeat_seconds: float) -> str:
    """Write queued events to `stream`, a HEARTBEAT when idle, until END_OF_STREAM, `stopping`,
    or the subscriber leaves; returns why it ended. Raises OSError when a write fails."""
    last_write = time.monotonic()
    while not stopping.is_set():
        try:
            event = events.get(timeout=STREAM_POLL_SECONDS)
        except queue.Empty:
            event = None
        if event is END_OF_STREAM:
            return "ended"
        now = time.monotonic()
        if event is None and now - last_write >= heartbeat_seconds:
            event = {"type": "HEARTBEAT"}
        if event is not None:
            stream.send(event)
            last_write = now
        elif stream.subscriber_gone():
            return "subscriber gone"
    return "stopping"


class JsonClient:
    """One keep-alive HTTP connection for JSON POSTs to `base_url`; not thread-safe."""

    def __init__(self, base_url: str, timeout: float = 5.0):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self._host, self._port, self._timeout = parts.hostname, parts.port, timeout
        self._conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """POST JSON; returns (status, decoded body or None). Raises OSError on I/O failure."""
        data = json.dumps(body).encode("utf-8")
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("POST", path, body=data,
                             headers={"Content-Type": "application/json"})
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
