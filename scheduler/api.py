"""The scheduler's HTTP API (aiohttp, on its own event loop in a thread).

Owns the routes: `POST /queries` (body: spec XML, `Content-Type: application/xml` or `text/xml`,
compiled here with `compiler.pipeline` through `scheduler.query_source`; no route takes a
compiled query or program text; compiled with the running streams it may read by automatic
sharing), `GET /shares` (those streams: canonical form -> channel, docs/queries.md), `GET
/queries`, `GET /queries/{id}`, `DELETE /queries/{id}`,
`POST /queries/{id}/update` (body: the new spec XML; `?dry_run=true`, `?drop_state=true`: a
running query updated in place, `scheduler.update_plan`), `POST
/queries/{id}/tasks/{task}/migrate` (body `{"to": "<agent id>"}`), `POST
/queries/{id}/operators/{operator}/scale` (body `{"parallelism": N}`: the control tuple
`<id, operator, parallelism, N>`, answered like the control route), `POST
/queries/{id}/control` (body `{"tuples": [{"operator", "parameter", "value"}, ...]}`: 202 with
the request's progress, or every problem), `GET /queries/{id}/control` (the adjustable
parameters, their values, the applied history), `GET /queries/{id}/control/{request}` (one
request's acknowledgements), `GET /healthz` and `GET /metrics` (Prometheus text format, from
the service's `metrics` or its loop's `loop.metrics`).

And the gate in front of them (`refusal`, pure): a `Host` that is not this API's own (its bound
address, `localhost:PORT`, `127.0.0.1:PORT`, `[::1]:PORT`, names given as `allowed_hosts`) or an
`Origin` that is not this API's own is refused with 403 (DNS rebinding, cross-site requests);
every route but `/healthz` and `/metrics` needs `Authorization: Bearer <token>` (constant-time
compare), else 401. Every bad input becomes a 4xx JSON reply `{"error", "diagnostics"}`, never
a crash; a refused request's unread body closes the connection (after draining it for at
most `LINGER` seconds, so the client can read the refusal). Bodies are at most 4 MiB (413);
a connection is closed when no complete request arrived within `IDLE_TIMEOUT` seconds of its
start or of its last reply, and a body must arrive within `BODY_TIMEOUT` seconds. Service calls
(which wait on the scheduler's loop) run in a thread pool, never on the event loop; a submitted
spec is compiled in a worker process with a time and a memory limit (`scheduler.compile_worker`,
`scheduler.config.CompileLimits`: over either, 413; every worker busy, 503), never in this
interpreter, so no body holds it. Does not own the scheduler (any `QueryService`, e.g. `SchedulerService`), the token's file
(`scheduler.api_token`) nor the client (`common.api_client`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence
from urllib.parse import parse_qs, unquote, urlsplit

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from common.api_token import default_token_file, read_token, where_to_look
from common.control import PARALLELISM
from common.diagnostics import Diagnostic, SpecError
from common.paths import configured_roots
from common.tasks import CompiledQuery
from scheduler.api_token import (ExitCleanup, new_token, remove_stale_token_files,
                                 remove_token_file, write_token_file)
from scheduler.compile_worker import CompileRefused, CompileWorkers
from scheduler.config import CompileLimits
from scheduler.loop import Reply
from scheduler.metrics import CONTENT_TYPE
from scheduler import update_plan
from scheduler.query_source import QuerySource, compile_source

log = logging.getLogger("elastiq.scheduler.api")
MAX_BODY = 4 * 1024 * 1024
IDLE_TIMEOUT = 10.0  # seconds a connection may stay without a complete request
BODY_TIMEOUT = 30.0  # seconds a request's body may take to arrive
LINGER = 2.0  # seconds a refused request's unread body is drained before the connection closes
SPEC_MEDIA_TYPES = ("application/xml", "text/xml")
OPEN_ROUTES = (("GET", ("healthz",)), ("GET", ("metrics",)))
# What one control request may ask: each value is checked on the scheduler's loop (a condition
# is parsed and type-checked, up to ~0.1 s for one of the grammar's 4,096 characters here), so
# a request's total is bounded to keep that loop, and the heartbeats it handles, on time.
MAX_CONTROL_TUPLES = 1024  # one per (operator, parameter): cheap each unless a condition
MAX_CONTROL_CHARS = 32 * 1024  # the values of one request together


class QueryService(Protocol):
    def submit(self, query: CompiledQuery, timeout: float = 10.0,
               source: QuerySource | None = None) -> Reply: ...
    def stop_query(self, query_id: str, timeout: float = 10.0, *,
                   force: bool = False) -> Reply: ...
    def migrate_task(self, query_id: str, task_id: str, agent_id: str,
                     timeout: float = 10.0) -> Reply: ...
    def update(self, query: CompiledQuery, source: QuerySource | None = None, *,
               drop_state: bool = False, dry_run: bool = False,
               timeout: float = 10.0) -> Reply: ...
    def running_plan(self, query_id: str
                     ) -> tuple[CompiledQuery, QuerySource | None] | None: ...
    def share_offers(self) -> dict[str, str]: ...
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
        self.extra: dict[str, Any] = {}  # more of the reply (an update's refused diff)

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "diagnostics": self.diagnostics, **self.extra}


def diagnostic_json(d: Diagnostic) -> dict[str, Any]:
    return {"file": d.position.file, "line": d.position.line, "column": d.position.column,
            "severity": d.severity, "message": d.message, "hint": d.hint, "text": d.render()}


# ---- the gate (pure) -------------------------------------------------------------------------
def media_type(content_type: str) -> str:
    """The media type of a Content-Type value, lower case, without its parameters."""
    return content_type.split(";", 1)[0].strip().lower()


def own_hosts(host: str, port: int, extra: Sequence[str] = ()) -> frozenset[str]:
    """The `Host` values naming this API: its bound address, loopback names, and `extra` names
    (`name` means `name:port`; `name:port` is taken as given); lower case, with the port."""
    names = {host, "localhost", "127.0.0.1", "[::1]"}
    out = {f"{n.lower()}:{port}" for n in names if n}
    for name in extra:
        name = name.strip().lower()
        if name:
            out.add(name if _has_port(name) else f"{name}:{port}")
    if port == 80:  # a Host without a port means 80
        out |= {h.rsplit(":", 1)[0] for h in list(out)}
    return frozenset(out)


def _has_port(name: str) -> bool:
    tail = name.rsplit("]", 1)[-1]
    return ":" in tail and tail.rsplit(":", 1)[1].isdigit()


def token_allows(token: str, authorization: str) -> bool:
    """Whether `authorization` is `Bearer <token>` (compared in constant time)."""
    if not token:
        return False
    scheme, _, given = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode("utf-8", "surrogateescape"), token.encode("utf-8"))


def refusal(method: str, parts: Sequence[str], headers: Mapping[str, str],
            hosts: frozenset[str], token: str) -> ApiError | None:
    """Why a request may not reach a route (403 foreign Host or Origin, 401 no or wrong
    token), or None."""
    host = headers.get("Host", "").strip().lower()
    if host not in hosts:
        return ApiError(403, f"Host {host or '(none)'!r} is not this API's; a scheduler reached "
                             "under another name needs that name in --api-allowed-host")
    origin = headers.get("Origin")
    if origin is not None and origin.strip().lower() not in {f"http://{h}" for h in hosts}:
        return ApiError(403, f"Origin {origin!r} is not this API's own; cross-site requests "
                             "are refused")
    if (method, tuple(parts)) in OPEN_ROUTES:
        return None
    if not token_allows(token, headers.get("Authorization", "")):
        return ApiError(401, "this scheduler requires 'Authorization: Bearer <token>' on "
                             f"every route but /healthz and /metrics; {where_to_look()}")
    return None


def path_parts(raw_path: str) -> list[str]:
    """The decoded segments of a request target's path (an escaped '/' stays in its part)."""
    return [unquote(p) for p in urlsplit(raw_path).path.strip("/").split("/") if p]


# ---- request bodies (pure) -------------------------------------------------------------------
Compile = Callable[[QuerySource], CompiledQuery]


def parse_submission(body: bytes, content_type: str, filename: str, query_id: str | None,
                     base_dir: str | None, compile: Compile = compile_source,
                     ) -> tuple[CompiledQuery, QuerySource]:
    """The body of `POST /queries` (spec XML) compiled by `compile` (the server's: in a worker
    process with a time and memory limit), with the source it came from; ApiError(415) for any
    other media type, ApiError(400) with every diagnostic, the worker's refusal (413, 503)."""
    kind = media_type(content_type)
    if kind not in SPEC_MEDIA_TYPES:
        raise ApiError(415, f"POST /queries takes a spec as {' or '.join(SPEC_MEDIA_TYPES)}, "
                            f"not {kind or 'a body without Content-Type'}; compiled queries "
                            "and programs are never accepted")
    try:
        query = compile(QuerySource.of(body, filename, query_id or "", base_dir))
    except CompileRefused as e:
        raise ApiError(e.status, e.message) from None
    except SpecError as e:
        diags = [diagnostic_json(d) for d in e.diagnostics]
        raise ApiError(400, f"{len(diags)} problem(s) in {filename}", diags) from None
    return query, QuerySource.of(body, filename, query.query_id, base_dir)


def _json_field(body: bytes, name: str) -> Any:
    """Field `name` of the JSON object `body` (empty: {}), None when the body is no such object
    (too deeply nested included)."""
    try:
        value = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        return None
    return value.get(name) if isinstance(value, dict) else None


def migrate_target(body: bytes) -> str:
    target = _json_field(body, "to")
    if not isinstance(target, str) or not target:
        raise ApiError(400, 'the body must be JSON {"to": "<agent id>"}')
    return target


def scale_parallelism(body: bytes) -> int:
    """`{"parallelism": N}` -> N, a whole number (the catalogue checks its bounds);
    ApiError(400) otherwise."""
    value = _json_field(body, "parallelism")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, 'the body must be JSON {"parallelism": N}, N a whole number')
    return value


def control_tuples(body: bytes) -> list[tuple[str, str, str]]:
    """`{"tuples": [{"operator": .., "parameter": .., "value": ..}, ...]}` -> (operator,
    parameter, value) triples; ApiError(400) naming what is malformed, ApiError(413) for more
    than MAX_CONTROL_TUPLES tuples or MAX_CONTROL_CHARS characters of values."""
    raw = _json_field(body, "tuples")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, 'the body must be JSON {"tuples": [{"operator": ..., "parameter": '
                            '..., "value": ...}]}')
    if len(raw) > MAX_CONTROL_TUPLES:
        raise ApiError(413, f"{len(raw)} control tuples in one request; at most "
                            f"{MAX_CONTROL_TUPLES} are taken (send several requests)")
    out: list[tuple[str, str, str]] = []
    problems: list[str] = []
    for i, t in enumerate(raw, 1):
        fields: list[Any] = [t.get(k) for k in ("operator", "parameter", "value")] \
            if isinstance(t, dict) else []
        if len(fields) != 3 or not all(isinstance(f, str) for f in fields):
            problems.append(f"tuple {i}: needs text operator, parameter and value")
            continue
        out.append((fields[0], fields[1], fields[2]))
    if problems:
        raise ApiError(400, "; ".join(problems), [{"message": p} for p in problems])
    chars = sum(len(value) for _, _, value in out)
    if chars > MAX_CONTROL_CHARS:
        raise ApiError(413, f"the values of one control request have {chars} characters; at "
                            f"most {MAX_CONTROL_CHARS} are taken (send several requests)")
    return out


# ---- the routes (blocking: run in the pool) --------------------------------------------------
@dataclass(frozen=True)
class MetricsText:
    """A reply body that is not JSON: the Prometheus exposition."""

    data: bytes
    content_type: str


@dataclass(frozen=True)
class Call:
    """One request that passed the gate, as the routes see it."""

    method: str
    target: str  # the raw request target, for messages
    parts: tuple[str, ...]
    params: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes


def _metrics_text(service: QueryService) -> MetricsText:
    """The service's metrics: `service.metrics`, else `service.loop.metrics`, else 404."""
    metrics = getattr(service, "metrics", None) or getattr(getattr(service, "loop", None),
                                                          "metrics", None)
    if metrics is None:
        raise ApiError(404, "this scheduler has no metrics")
    return MetricsText(metrics.exposition(), CONTENT_TYPE)


def _health(service: QueryService) -> dict[str, Any]:
    """Open to anyone: whether it runs and leads, nothing about queries or addresses."""
    s = service.status()
    health = {"ok": True, "connected": s.get("connected"), "framework_id": s.get("framework_id")}
    if "leadership" in s:  # role and epoch, with ZooKeeper (not the leader's address)
        health["leadership"] = {k: s["leadership"].get(k) for k in ("role", "epoch")}
    return health


def route(service: QueryService, call: Call, compile: Compile = compile_source
          ) -> tuple[int, Any]:
    """The reply to `call`: (status, JSON value or MetricsText); ApiError for refusals.
    `compile` compiles a submitted spec."""
    method, parts = call.method, call.parts
    if parts == ("metrics",) and method == "GET":
        return 200, _metrics_text(service)
    if parts == ("healthz",) and method == "GET":
        return 200, _health(service)
    if parts == ("queries",) and method == "GET":
        status = service.status()
        return 200, {"queries": list(status["queries"].values()),
                     **({"distribution": status["distribution"]}
                        if status.get("distribution") else {})}
    if parts == ("queries",) and method == "POST":
        return _submit(service, call, compile)
    if parts == ("shares",) and method == "GET":  # what a submit may read (`elastiq explain`)
        return 200, {"offers": service.share_offers()}
    if len(parts) == 2 and parts[0] == "queries" and method in ("GET", "DELETE"):
        return _one_query(service, method, parts[1],
                          call.params.get("force", [""])[-1] in ("1", "true"))
    if len(parts) == 3 and (parts[0], parts[2]) == ("queries", "update") and method == "POST":
        return _update(service, call, parts[1], compile)
    if len(parts) == 5 and (parts[0], parts[2], parts[4]) == ("queries", "tasks", "migrate") \
            and method == "POST":
        return _migrate(service, parts[1], parts[3], call.body)
    if len(parts) in (3, 4) and (parts[0], parts[2]) == ("queries", "control") \
            and (method, len(parts)) in (("GET", 3), ("GET", 4), ("POST", 3)):
        return _control(service, method, parts[1], parts[3] if len(parts) == 4 else None,
                        call.body)
    if len(parts) == 5 and (parts[0], parts[2], parts[4]) == ("queries", "operators", "scale") \
            and method == "POST":
        tuples = [(parts[3], PARALLELISM, str(scale_parallelism(call.body)))]
        return _control(service, method, parts[1], None, b"", tuples)
    raise ApiError(404 if method == "GET" else 405, f"no route {method} {call.target[:200]}")


def _submit(service: QueryService, call: Call, compile: Compile) -> tuple[int, Any]:
    """`POST /queries`: the spec compiled with the running streams it may read in place of
    equal subgraphs (`QueryService.share_offers`, docs/queries.md "Automatic sharing"); its
    source keeps those it reads."""
    offered = tuple(sorted(service.share_offers().items()))
    query, source = parse_submission(
        call.body, call.headers.get("Content-Type", ""),
        call.headers.get("X-Spec-Filename") or "spec.xml",
        next(iter(call.params.get("query_id") or ()), None),
        call.headers.get("X-Spec-Dir") or os.getcwd(),
        lambda source: compile(replace(source, shared=offered)))
    source = replace(source, shared=shared_in(query, offered))
    reply = service.submit(query, source=source)
    if not reply.accepted:
        raise ApiError(reply.status, reply.message,
                       [{"message": m} for m in reply.message.split("; ")])
    shared = [f"{i.channel_id} (in place of its operator {i.where})" for i in query.imports
              if i.auto]
    message = reply.message + (f"; reads {', '.join(shared)} by automatic sharing"
                               if shared else "")
    return 201, {"query_id": query.query_id, "message": message,
                 "shared": [i.channel_id for i in query.imports if i.auto]}


def shared_in(query: CompiledQuery, offered: tuple[tuple[str, str], ...]
              ) -> tuple[tuple[str, str], ...]:
    """The offers (form, channel) a compiled query reads by automatic sharing."""
    read = {i.channel_id for i in query.imports if i.auto}
    return tuple(p for p in offered if p[1] in read)


def _flag(call: Call, name: str) -> bool:
    return call.params.get(name, [""])[-1] in ("1", "true")


def _update(service: QueryService, call: Call, query_id: str,
            compile: Compile) -> tuple[int, Any]:
    """`POST /queries/{id}/update` (body: the new spec; `?dry_run=true`, `?drop_state=true`):
    the new spec compiled with the running tasks' ids pinned (`update_plan.pins`), again
    without the pins of tasks that need a fresh checkpoint when their state may go, then
    diffed, checked and applied all or nothing by the scheduler. 200 with the diff; 404 for an
    unknown query; 409 with every located refusal and the diff."""
    running = service.running_plan(query_id)
    if running is None:
        raise ApiError(404, f"no query {query_id}")
    old, old_source = running
    retired = old_source.retired if old_source is not None else ()
    shared = old_source.shared if old_source is not None else ()  # it reads them still
    drop_state, dry_run = _flag(call, "drop_state"), _flag(call, "dry_run")

    def compiled(pins: dict[str, str], retired: tuple[str, ...]
                 ) -> tuple[CompiledQuery, QuerySource]:
        query, source = parse_submission(
            call.body, call.headers.get("Content-Type", ""),
            call.headers.get("X-Spec-Filename") or "spec.xml", query_id,
            call.headers.get("X-Spec-Dir") or os.getcwd(),
            lambda source: compile(replace(source, task_ids=tuple(sorted(pins.items())),
                                           retired=retired, shared=shared)))
        return query, replace(source, retired=retired, shared=shared_in(query, shared))

    pins = update_plan.pins(old)
    new, source = compiled(pins, retired)
    first = update_plan.diff_plans(old, new)
    fresh = update_plan.fresh_roots(first, new)
    if fresh and (drop_state or not first.dropped):  # their old ids (checkpoints) retire
        new, source = compiled({r: t for r, t in pins.items() if r not in fresh},
                               tuple(sorted({*retired, *(pins[r] for r in fresh)})))
    reply = service.update(new, source, drop_state=drop_state, dry_run=dry_run)
    body = dict(reply.body or {})
    if not reply.accepted:
        problems = body.get("problems") or [reply.message]
        error = ApiError(reply.status, reply.message, [{"message": m} for m in problems])
        error.extra = {"diff": body.get("diff")}
        raise error
    return 200, {"query_id": query_id, "message": reply.message, **body}


def _one_query(service: QueryService, method: str, query_id: str,
               force: bool = False) -> tuple[int, Any]:
    """GET: its status; DELETE: stop it (`?force=true`: even while other queries read a stream
    it publishes, docs/queries.md)."""
    if method == "GET":
        view = service.query_status(query_id)
        if view is None:
            raise ApiError(404, f"no query {query_id}")
        return 200, view
    reply = service.stop_query(query_id, force=True) if force else service.stop_query(query_id)
    if not reply.accepted:
        raise ApiError(reply.status, reply.message)
    return 202, {"query_id": query_id, "message": reply.message}


def _migrate(service: QueryService, query_id: str, task_id: str,
             body: bytes) -> tuple[int, Any]:
    target = migrate_target(body)
    reply = service.migrate_task(query_id, task_id, target)
    if not reply.accepted:
        raise ApiError(reply.status, reply.message)
    return 202, {"query_id": query_id, "task_id": task_id, "to": target,
                 "message": reply.message}


def _control(service: QueryService, method: str, query_id: str, request_id: str | None,
             body: bytes, tuples: list[tuple[str, str, str]] | None = None) -> tuple[int, Any]:
    if method == "GET":
        view = service.query_control(query_id, request_id)
        if view is None:
            raise ApiError(404, f"no control request {request_id} of query {query_id}"
                           if request_id else f"no query {query_id}")
        return 200, view
    reply = service.control(query_id, tuples if tuples is not None else control_tuples(body))
    if not reply.accepted:
        problems = (reply.body or {}).get("problems") or [reply.message]
        raise ApiError(reply.status, reply.message, [{"message": m} for m in problems])
    return 202, {"query_id": query_id, "message": reply.message, **(reply.body or {})}


def answer(service: QueryService, call: Call, compile: Compile = compile_source
           ) -> tuple[int, Any]:
    """`route`, with every refusal and failure as (status, JSON error)."""
    try:
        return route(service, call, compile)
    except ApiError as e:
        return e.status, e.body()
    except Exception as e:  # never let one request take the API down
        log.exception("[api] %s %s failed", call.method, call.target[:200])
        return 500, {"error": f"internal error: {type(e).__name__}", "diagnostics": []}


# ---- the server ------------------------------------------------------------------------------
def _response(status: int, body: Any) -> web.Response:
    if isinstance(body, MetricsText):
        return web.Response(status=status, body=body.data,
                            headers={"Content-Type": body.content_type})
    return web.Response(status=status, body=json.dumps(body).encode("utf-8"),
                        content_type="application/json")


class _JsonErrors(RequestHandler):
    """aiohttp's connection handler, answering what its own HTTP parser refuses (malformed
    request lines and headers) with our JSON error instead of plain text; it still logs and
    closes the connection as aiohttp does."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, message)
        what = "malformed request" if plain.status < 500 else "internal error"
        detail = (message or "").splitlines()[0][:200] if plain.status < 500 else ""
        response = _response(plain.status, ApiError(
            plain.status, f"{what}: {detail}" if detail else what).body())
        response.force_close()
        return response


class _Server(web.Server):
    """aiohttp's low-level server with `_JsonErrors` connections."""

    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=self._loop, **self._kwargs)


def _refused(error: ApiError, request: web.BaseRequest) -> web.Response:
    """A refusal; the connection closes when the request's body was not read."""
    response = _response(error.status, error.body())
    if request.body_exists and not request.content.is_eof():
        response.force_close()
    return response


class ApiServer:
    """`ApiServer(service, host, port, token=...).start()`; `.url` is where it listens;
    `.stop()` ends it. The socket is bound at construction (OSError when it cannot be)."""

    def __init__(self, service: QueryService, host: str = "127.0.0.1", port: int = 0, *,
                 token: str, allowed_hosts: Sequence[str] = (), workers: int = 8,
                 idle_timeout: float = IDLE_TIMEOUT, body_timeout: float = BODY_TIMEOUT,
                 compile_limits: CompileLimits = CompileLimits()):
        if not isinstance(token, str) or not token.strip() or token != token.strip():
            raise ValueError("the API needs a token (non-empty, no surrounding whitespace)")
        self.service, self.token, self.idle_timeout = service, token, idle_timeout
        self.body_timeout = body_timeout
        self._sock = socket.create_server((host, port), family=_family(host), backlog=1024)
        self.host, self.port = host, self._sock.getsockname()[1]
        self.hosts = own_hosts(host if ":" not in host else f"[{host}]", self.port,
                               allowed_hosts)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scheduler-api")
        self.compilers = CompileWorkers(compile_limits)
        self.token_file: Path | None = None  # where clients find the token, when known
        self._wrote_token_file = False
        self._exit_cleanup: ExitCleanup | None = None  # removes the file at any exit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.ServerRunner | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def serving(cls, service: QueryService, host: str = "127.0.0.1", port: int = 0,
                token_file: str | Path | None = None, allowed_hosts: Sequence[str] = (),
                compile_limits: CompileLimits = CompileLimits()) -> "ApiServer":
        """A started API whose token is read from `token_file`, or (None) made fresh and
        written (mode 0600) to the per-user default file for the bound port, which `stop()`,
        any exit of the process that runs code, or the next start after one that runs none
        removes again (`scheduler.api_token`)."""
        token = read_token(token_file) if token_file is not None else new_token()
        api = cls(service, host, port, token=token, allowed_hosts=allowed_hosts,
                  compile_limits=compile_limits)
        try:
            if token_file is None:
                api.token_file = default_token_file(api.port)
                remove_stale_token_files(api.token_file.parent)
                api._exit_cleanup = ExitCleanup(api._remove_token_file).install()
                write_token_file(api.token_file, token, owned=True)
                api._wrote_token_file = True
            else:
                api.token_file = Path(token_file)
            return api.start()
        except BaseException:
            api.stop()
            raise

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "ApiServer":
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._open())
            except BaseException as e:  # e.g. the socket was closed meanwhile
                failure.append(e)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=serve, name="scheduler-api", daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            raise failure[0]
        log.info("[api] listening on %s", self.url)
        self._pool.submit(self.compilers.warm)
        return self

    async def _open(self) -> None:
        server = _Server(self._handle, keepalive_timeout=self.idle_timeout, access_log=None,
                         max_line_size=8190, max_field_size=8190, lingering_time=LINGER)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._exit_cleanup is not None:
            self._exit_cleanup.uninstall()
            self._exit_cleanup = None
        self._remove_token_file()

    def _remove_token_file(self) -> None:
        if self._wrote_token_file and self.token_file is not None:
            remove_token_file(self.token_file, self.token)
            self._wrote_token_file = False

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            parts = path_parts(request.raw_path)
            refused = refusal(request.method, parts, request.headers, self.hosts, self.token)
            if refused is not None:
                return _refused(refused, request)
            body = await self._body(request)
            call = Call(request.method, request.raw_path, tuple(parts),
                        parse_qs(urlsplit(request.raw_path).query), dict(request.headers), body)
            status, reply = await self._in_pool(answer, self.service, call, self._compile)
            return _response(status, reply)
        except ApiError as e:
            return _refused(e, request)

    async def _body(self, request: web.BaseRequest) -> bytes:
        """The whole body, at most MAX_BODY bytes (413), within `body_timeout` seconds (408)."""
        if not request.body_exists:
            return b""
        length = request.content_length
        if length is not None and length > MAX_BODY:
            raise ApiError(413, f"body of {length} bytes is over {MAX_BODY}")
        try:
            return await asyncio.wait_for(_read_at_most(request, MAX_BODY), self.body_timeout)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the body did not arrive within {self.body_timeout:g} s") \
                from None
        except (ConnectionError, ValueError) as e:  # e.g. a bad chunked encoding
            raise ApiError(400, f"unreadable body: {type(e).__name__}") from None

    def _compile(self, source: QuerySource) -> CompiledQuery:
        """A submitted spec, compiled in a worker process within the compile limits, with the
        roots this process compiles with."""
        return self.compilers.compile(source, configured_roots())

    async def _in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


async def _read_at_most(request: web.BaseRequest, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body is over {limit} bytes")
        chunks.append(chunk)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
