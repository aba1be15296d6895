"""The scheduler's HTTP API on 127.0.0.1 (stdlib `ThreadingHTTPServer`).

Owns the routes: `POST /queries` (body: spec XML, compiled with
`compiler.pipeline.compile_spec_text`, or a CompiledQuery as JSON), `GET /queries`,
`GET /queries/{id}`, `DELETE /queries/{id}`, `POST /queries/{id}/tasks/{task}/migrate` (body
`{"to": "<agent id>"}`), `POST /queries/{id}/control` (body `{"tuples": [{"operator", "parameter",
"value"}, ...]}`: 202 with the request's progress, or every problem), `GET /queries/{id}/control`
(the adjustable parameters, their values, the applied history), `GET
/queries/{id}/control/{request}` (one request's acknowledgements), `GET /healthz`, `GET /metrics` (Prometheus text
format, from the service's `metrics` or its loop's `loop.metrics`), and turning every bad input into a
4xx JSON reply carrying every diagnostic, never a crash; running queries are untouched by bad
requests. Does not own the scheduler (any `QueryService`, e.g. `SchedulerService`) nor the client
(`scheduler.client`).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from compiler.tasks import CompiledQuery
from elastiq.diagnostics import Diagnostic, SpecError
from scheduler.loop import Reply
from scheduler.metrics import CONTENT_TYPE

log = logging.getLogger("elastiq.scheduler.api")
MAX_BODY = 4 * 1024 * 1024


class QueryService(Protocol):
    def submit(self, query: CompiledQuery, timeout: float = 10.0) -> Reply: ...
    def stop_query(self, query_id: str, timeout: float = 10.0) -> Reply: ...
    def migrate_task(self, query_id: str, task_id: str, agent_id: str,
                     timeout: float = 10.0) -> Reply: ...
    def control(self, query_id: str, tuples: list[tuple[str, str, str]],
                timeout: float = 10.0) -> Reply: ...
    def query_control(self, query_id: str,
                      request_id: str | None = None) -> dict[str, Any] | None: ...
    def status(self) -> dict[str, Any]: ...
    def query_status(self, query_id: str) -> dict[str, Any] | None: ...


class ApiError(Exception):
    """A request we refuse: HTTP status, a message and the diagnostics behind it."""

    def __init__(self, status: int, message: str, diagnostics: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.status, self.message = status, message
        self.diagnostics = diagnostics or [{"message": message}]


def diagnostic_json(d: Diagnostic) -> dict[str, Any]:
    return {"file": d.position.file, "line": d.position.line, "column": d.position.column,
            "severity": d.severity, "message": d.message, "hint": d.hint, "text": d.render()}


def parse_submission(body: bytes, content_type: str, filename: str, query_id: str | None,
                     base_dir: str | None) -> CompiledQuery:
    """The body of `POST /queries` as a CompiledQuery, or ApiError(400) with diagnostics."""
    if "json" in content_type:
        return _from_json(body.decode("utf-8", errors="replace"))
    return _from_xml(body, filename, query_id, base_dir)


def _from_json(text: str) -> CompiledQuery:
    try:
        return CompiledQuery.from_json(text)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ApiError(400, f"body is not a compiled query: {type(e).__name__}: {e}") from None


def _from_xml(body: bytes, filename: str, query_id: str | None,
              base_dir: str | None) -> CompiledQuery:
    from compiler.paths import configured_roots
    from compiler.pipeline import compile_spec_text  # the compiler is heavy: load on first use

    try:
        # the client's folder (X-Spec-Dir) resolves relative paths only; every path must still
        # lie in the scheduler's own roots ($ELASTIQ_PATH_ROOTS, else its working folder)
        compiled = compile_spec_text(body, filename, base_dir=base_dir, query_id=query_id,
                                     path_roots=configured_roots())
    except SpecError as e:
        diags = [diagnostic_json(d) for d in e.diagnostics]
        raise ApiError(400, f"{len(diags)} problem(s) in {filename}", diags) from None
    return compiled.query


@dataclass(frozen=True)
class MetricsText:
    """A reply body that is not JSON: the Prometheus exposition."""

    data: bytes
    content_type: str


def _metrics_text(service: QueryService) -> MetricsText:
    """The service's metrics: `service.metrics`, else `service.loop.metrics`, else 404."""
    metrics = getattr(service, "metrics", None) or getattr(getattr(service, "loop", None),
                                                          "metrics", None)
    if metrics is None:
        raise ApiError(404, "this scheduler has no metrics")
    return MetricsText(metrics.exposition(), CONTENT_TYPE)


class _Handler(BaseHTTPRequestHandler):
    server: "ApiServer"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        try:
            status, body = self._route(method)
        except ApiError as e:
            status, body = e.status, {"error": e.message, "diagnostics": e.diagnostics}
        except Exception as e:  # never let one request take the API down
            log.exception("[api] %s %s failed", method, self.path)
            status, body = 500, {"error": f"internal error: {e}", "diagnostics": []}
        self._reply(status, body)

    def _route(self, method: str) -> tuple[int, Any]:
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/") if p]
        service = self.server.service
        if method != "GET" and not token_allows(self.server.token,
                                                self.headers.get("Authorization", "")):
            raise ApiError(401, "this scheduler requires a token for submit, stop and migrate: send "
                                "'Authorization: Bearer <token>' (elastiq --token-file FILE)")
        if parts == ["metrics"] and method == "GET":
            return 200, _metrics_text(service)
        if parts == ["healthz"] and method == "GET":
            s = service.status()
            health = {"ok": True, "connected": s.get("connected"),
                      "framework_id": s.get("framework_id")}
            if "leadership" in s:  # role, epoch and leader address, with ZooKeeper
                health["leadership"] = s["leadership"]
            return 200, health
        if parts == ["queries"] and method == "GET":
            return 200, {"queries": list(service.status()["queries"].values())}
        if parts == ["queries"] and method == "POST":
            return self._submit(service)
        if len(parts) == 2 and parts[0] == "queries" and method in ("GET", "DELETE"):
            return self._one_query(service, method, parts[1])
        if len(parts) == 5 and (parts[0], parts[2], parts[4]) == ("queries", "tasks", "migrate") \
                and method == "POST":
            return self._migrate(service, parts[1], parts[3])
        if len(parts) in (3, 4) and (parts[0], parts[2]) == ("queries", "control"):
            return self._control(service, method, parts[1], parts[3] if len(parts) == 4 else None)
        raise ApiError(404 if method == "GET" else 405, f"no route {method} {self.path}")

    def _submit(self, service: QueryService) -> tuple[int, Any]:
        body = self._body()
        params = parse_qs(urlsplit(self.path).query)
        query = parse_submission(
            body, self.headers.get("Content-Type", ""),
            self.headers.get("X-Spec-Filename") or "spec.xml",
            (params.get("query_id") or [None])[0], self.headers.get("X-Spec-Dir") or os.getcwd())
        reply = service.submit(query)
        if not reply.accepted:
            raise ApiError(reply.status, reply.message,
                           [{"message": m} for m in reply.message.split("; ")])
        return 201, {"query_id": query.query_id, "message": reply.message}

    def _one_query(self, service: QueryService, method: str, query_id: str) -> tuple[int, Any]:
        if method == "GET":
            view = service.query_status(query_id)
            if view is None:
                raise ApiError(404, f"no query {query_id}")
            return 200, view
        reply = service.stop_query(query_id)
        if not reply.accepted:
            raise ApiError(reply.status, reply.message)
        return 202, {"query_id": query_id, "message": reply.message}

    def _migrate(self, service: QueryService, query_id: str, task_id: str) -> tuple[int, Any]:
        try:
            target = json.loads(self._body() or b"{}").get("to")
        except (ValueError, AttributeError):
            target = None
        if not isinstance(target, str) or not target:
            raise ApiError(400, 'the body must be JSON {"to": "<agent id>"}')
        reply = service.migrate_task(query_id, task_id, target)
        if not reply.accepted:
            raise ApiError(reply.status, reply.message)
        return 202, {"query_id": query_id, "task_id": task_id, "to": target,
                     "message": reply.message}

    def _control(self, service: QueryService, method: str, query_id: str,
                 request_id: str | None) -> tuple[int, Any]:
        if method == "GET":
            view = service.query_control(query_id, request_id)
            if view is None:
                raise ApiError(404, f"no control request {request_id} of query {query_id}"
                               if request_id else f"no query {query_id}")
            return 200, view
        if method != "POST" or request_id is not None:
            raise ApiError(405, f"no route {method} {self.path}")
        reply = service.control(query_id, control_tuples(self._body()))
        if not reply.accepted:
            problems = (reply.body or {}).get("problems") or [reply.message]
            raise ApiError(reply.status, reply.message, [{"message": m} for m in problems])
        return 202, {"query_id": query_id, "message": reply.message, **(reply.body or {})}

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise ApiError(411, "a Content-Length header is required")
        if int(length) > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"body of {length} bytes is over {MAX_BODY}")
        return self.rfile.read(int(length))

    def _reply(self, status: int, body: Any) -> None:
        if isinstance(body, MetricsText):
            data, content_type = body.data, body.content_type
        else:
            data, content_type = json.dumps(body).encode("utf-8"), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("[api] " + format, *args)


def control_tuples(body: bytes) -> list[tuple[str, str, str]]:
    """`{"tuples": [{"operator": .., "parameter": .., "value": ..}, ...]}` -> (operator,
    parameter, value) triples; ApiError(400) naming what is malformed."""
    try:
        raw = json.loads(body or b"{}").get("tuples")
    except (ValueError, AttributeError):
        raw = None
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, 'the body must be JSON {"tuples": [{"operator": ..., "parameter": '
                            '..., "value": ...}]}')
    out, problems = [], []
    for i, t in enumerate(raw, 1):
        fields = [t.get(k) for k in ("operator", "parameter", "value")] \
            if isinstance(t, dict) else []
        if len(fields) != 3 or not all(isinstance(f, str) for f in fields):
            problems.append(f"tuple {i}: needs text operator, parameter and value")
            continue
        out.append((fields[0], fields[1], fields[2]))
    if problems:
        raise ApiError(400, "; ".join(problems), [{"message": p} for p in problems])
    return out


def token_allows(token: str | None, authorization: str) -> bool:
    """Whether a request may change state: always when no token is configured, else only with
    `Authorization: Bearer <token>` (compared in constant time)."""
    if not token:
        return True
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


class ApiServer(ThreadingHTTPServer):
    """`ApiServer(service).start()`; `.url` is where it listens; `.stop()` ends it."""

    daemon_threads = True

    def __init__(self, service: QueryService, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None):
        super().__init__((host, port), _Handler)
        self.service = service
        self.token = token  # when set, POST and DELETE need `Authorization: Bearer <token>`
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "ApiServer":
        self._thread = threading.Thread(target=self.serve_forever, name="scheduler-api",
                                        daemon=True)
        self._thread.start()
        log.info("[api] listening on %s", self.url)
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(5)
