"""A small client of the scheduler's HTTP API, for the CLI: submit (a spec), status, stop,
migrate, control.

Owns turning calls into HTTP requests and replies into values or `SchedulerUnavailable` /
`RequestRejected` errors with messages a user can act on. Does not own the API (`scheduler.api`).
"""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote, urlsplit

DEFAULT_URL = "http://127.0.0.1:8088"


class SchedulerUnavailable(Exception):
    """No scheduler answers at the URL."""


class RequestRejected(Exception):
    """The scheduler answered with an error; carries its status and diagnostics."""

    def __init__(self, status: int, message: str, diagnostics: list[dict[str, Any]],
                 body: dict[str, Any] | None = None):
        lines = [d.get("text") or d.get("message", "") for d in diagnostics]
        super().__init__("\n".join([message] + [f"  {x}" for x in lines if x and x != message]))
        self.status, self.message, self.diagnostics = status, message, diagnostics
        self.body = body or {}  # the whole reply (a refused update's diff)


class SchedulerClient:
    def __init__(self, url: str = DEFAULT_URL, timeout: float = 30.0, token: str | None = None):
        """`token`: the API's bearer token (`common.api_token.read_client_token` finds it)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"scheduler URL must look like http://host:port, not {url!r}")
        self.url, self._host, self._port = url, parts.hostname, parts.port or 80
        self._timeout = timeout
        self._token = token  # sent as `Authorization: Bearer <token>`

    def submit_spec(self, path: str | Path, query_id: str | None = None) -> dict[str, Any]:
        """Submit a spec file (compiled by the scheduler); returns {"query_id", "message"}."""
        p = Path(path).resolve()
        headers = {"Content-Type": "application/xml", "X-Spec-Filename": str(p),
                   "X-Spec-Dir": str(p.parent)}
        target = "/queries" + (f"?query_id={quote(query_id)}" if query_id else "")
        return self._call("POST", target, p.read_bytes(), headers)

    def update_spec(self, query_id: str, path: str | Path, *, drop_state: bool = False,
                    dry_run: bool = False) -> dict[str, Any]:
        """Update a running query in place from a spec file (docs/queries.md); returns
        {"query_id", "message", "diff", ...}; a refusal's RequestRejected.body has the diff."""
        p = Path(path).resolve()
        headers = {"Content-Type": "application/xml", "X-Spec-Filename": str(p),
                   "X-Spec-Dir": str(p.parent)}
        flags = [f for f, on in (("drop_state=true", drop_state), ("dry_run=true", dry_run))
                 if on]
        target = f"/queries/{quote(query_id, safe='')}/update" + \
            (f"?{'&'.join(flags)}" if flags else "")
        return self._call("POST", target, p.read_bytes(), headers)

    def status(self, query_id: str | None = None) -> dict[str, Any]:
        return self._call("GET", f"/queries/{quote(query_id, safe='')}" if query_id else "/queries")

    def share_offers(self) -> dict[str, str]:
        """What a submit may read by automatic sharing: canonical form -> channel of a running
        query (docs/queries.md)."""
        return {str(f): str(c) for f, c in self._call("GET", "/shares").get("offers", {}).items()}

    def stop(self, query_id: str, force: bool = False) -> dict[str, Any]:
        """Stop a query; `force`: even while other queries read a stream it publishes."""
        return self._call("DELETE", f"/queries/{quote(query_id, safe='')}"
                                    + ("?force=true" if force else ""))

    def migrate(self, query_id: str, task_id: str, agent_id: str) -> dict[str, Any]:
        target = f"/queries/{quote(query_id, safe='')}/tasks/{quote(task_id, safe='')}/migrate"
        return self._call("POST", target, json.dumps({"to": agent_id}).encode("utf-8"),
                          {"Content-Type": "application/json"})

    def control(self, query_id: str, tuples: list[tuple[str, str, str]]) -> dict[str, Any]:
        """Send control tuples (operator, parameter, value); returns the request's progress
        (`request`, `version`, `tasks`: task id -> answer or None while pending)."""
        body = {"tuples": [{"operator": o, "parameter": p, "value": v} for o, p, v in tuples]}
        return self._call("POST", f"/queries/{quote(query_id, safe='')}/control",
                          json.dumps(body).encode("utf-8"), {"Content-Type": "application/json"})

    def scale(self, query_id: str, operator: str, parallelism: int) -> dict[str, Any]:
        """Rescale a partitioned operator to `parallelism` instances (a control request on its
        splitters; the scheduler starts or retires instances); returns the request's progress."""
        target = (f"/queries/{quote(query_id, safe='')}/operators/"
                  f"{quote(operator, safe='')}/scale")
        return self._call("POST", target, json.dumps({"parallelism": parallelism}).encode(),
                          {"Content-Type": "application/json"})

    def control_status(self, query_id: str, request_id: str | None = None) -> dict[str, Any]:
        """One request's progress, or (no request) the query's adjustable parameters."""
        target = f"/queries/{quote(query_id, safe='')}/control"
        if request_id is not None:
            target += f"/{quote(request_id, safe='')}"
        return self._call("GET", target)

    def healthy(self) -> bool:
        try:
            return bool(self._call("GET", "/healthz").get("ok"))
        except SchedulerUnavailable:
            return False

    def _call(self, method: str, target: str, body: bytes | None = None,
              headers: dict[str, str] | None = None) -> dict[str, Any]:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        headers = dict(headers or {})
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            status, data = resp.status, resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise SchedulerUnavailable(unavailable_hint(self.url, e)) from None
        finally:
            conn.close()
        return _decode(status, data)


def _decode(status: int, data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data.decode("utf-8")) if data else {}
    except ValueError:
        body = {"error": data[:200].decode("utf-8", errors="replace")}
    if status >= 400:
        raise RequestRejected(status, str(body.get("error", f"HTTP {status}")),
                              list(body.get("diagnostics", [])), body)
    return body


def unavailable_hint(url: str, error: Exception, environ: Mapping[str, str] = os.environ) -> str:
    """Why no scheduler answered and what to do: start one, or name the running one with
    --scheduler URL (or $ELASTIQ_SCHEDULER, shown when it is set) (pure)."""
    where = environ.get("ELASTIQ_SCHEDULER")
    told = f"; $ELASTIQ_SCHEDULER is {where!r}" if where else ""
    return (f"no scheduler at {url} ({error}){told}; start one with `elastiq scheduler` (or "
            "`elastiq run SPEC`), or name the running one with --scheduler URL or "
            "$ELASTIQ_SCHEDULER")
