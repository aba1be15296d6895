"""The scheduler API's gate over real HTTP on 127.0.0.1: no route takes code, every route but
/healthz and /metrics needs the token, foreign Host and Origin are refused, a refused request's
body is never read as the next request, idle and slow connections cannot starve the API, and a
seeded fuzz of its inputs never gets a 500. The service is a small recording fake where the
test is about the HTTP layer, the real event loop and state where it is about what reaches
them."""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from common.api_client import SchedulerClient
from common.paths import ENV_VAR as PATH_ROOTS_ENV
from scheduler.api import ApiServer
from scheduler.loop import Reply, SchedulerLoop
from scheduler.testing import chain_query
from testkit.waiting import wait_for

TOKEN = "sec-token-abcdefghijklmnop"
SPECS = Path(__file__).parent / "specs"
PROGRAM = "import os\nos.system('touch /tmp/elastiq-pwned')\n"


@dataclass
class RecordingService:
    """A QueryService that answers yes and records every call (the HTTP layer's tests)."""

    calls: list[tuple[str, Any]] = field(default_factory=list)

    def submit(self, query: Any, timeout: float = 10.0, source: Any = None) -> Reply:
        self.calls.append(("submit", query))
        return Reply(True, 200, "accepted")

    def stop_query(self, query_id: str, timeout: float = 10.0) -> Reply:
        self.calls.append(("stop", query_id))
        return Reply(True, 200, "stopping")

    def migrate_task(self, query_id: str, task_id: str, agent_id: str,
                     timeout: float = 10.0) -> Reply:
        self.calls.append(("migrate", (query_id, task_id, agent_id)))
        return Reply(True, 200, "moving")

    def control(self, query_id: str, tuples: list[tuple[str, str, str]],
                timeout: float = 10.0) -> Reply:
        self.calls.append(("control", tuples))
        return Reply(True, 200, "applied", {"request": "r1"})

    def query_control(self, query_id: str, request_id: str | None = None) -> dict[str, Any]:
        self.calls.append(("query_control", (query_id, request_id)))
        return {"query_id": query_id}

    def share_offers(self) -> dict[str, str]:
        return {}

    def status(self) -> dict[str, Any]:
        self.calls.append(("status", None))
        return {"connected": True, "framework_id": "F", "queries": {}}

    def query_status(self, query_id: str) -> dict[str, Any]:
        self.calls.append(("query_status", query_id))
        return {"query_id": query_id}


@pytest.fixture(autouse=True)
def path_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The scheduler's configured path roots: this test's folder only (a client's X-Spec-Dir
    resolves relative paths and must stay inside them)."""
    monkeypatch.setenv(PATH_ROOTS_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture
def fake() -> Iterator[tuple[RecordingService, ApiServer]]:
    service = RecordingService()
    server = ApiServer(service, token=TOKEN, idle_timeout=1.5).start()
    try:
        yield service, server
    finally:
        server.stop()


def request(server: ApiServer, method: str, target: str, body: bytes | None = None,
            headers: dict[str, str] | None = None, token: str | None = TOKEN,
            ) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    hdrs = dict(headers or {})
    if token is not None:
        hdrs.setdefault("Authorization", f"Bearer {token}")
    try:
        conn.request(method, target, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def json_error(status: int, headers: dict[str, str], body: bytes) -> str:
    """The error message of a refusal, checking it is a JSON error reply."""
    assert 400 <= status < 500, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), headers
    reply = json.loads(body)
    assert isinstance(reply["error"], str) and reply["error"]
    assert isinstance(reply["diagnostics"], list)
    return reply["error"]


ROUTES = [("GET", "/queries", None), ("POST", "/queries", b"<dataflow/>"),
          ("GET", "/queries/q", None), ("DELETE", "/queries/q", None),
          ("POST", "/queries/q/tasks/q.t0/migrate", b'{"to": "a1"}'),
          ("POST", "/queries/q/control",
           b'{"tuples": [{"operator": "f", "parameter": "condition", "value": "1 > 0"}]}'),
          ("GET", "/queries/q/control", None), ("GET", "/queries/q/control/r1", None),
          ("GET", "/nowhere", None), ("PUT", "/queries", b"x")]


# ---- no route takes code ---------------------------------------------------------------------
def test_a_compiled_query_with_a_program_is_refused_under_every_content_type(
        fake: tuple[RecordingService, ApiServer]) -> None:
    service, server = fake
    q = json.loads(chain_query("evil", 1).to_json())
    q["tasks"][0]["program"] = PROGRAM
    evil = json.dumps(q).encode()
    for content_type in ("application/json", "text/plain;format=json", "text/plain",
                         "application/json; charset=utf-8", "APPLICATION/JSON", "json",
                         "application/xml+json", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", "text/xml-json",
                         "application/vnd.elastiq+json", "", "application/xmlx"):
        headers = {"Content-Type": content_type} if content_type else {}
        status, hdrs, body = request(server, "POST", "/queries", evil, headers)
        message = json_error(status, hdrs, body)
        assert status == 415, (content_type, status, message)
        assert "application/xml or text/xml" in message
    # a spec with a JSON content type is refused too: the media type decides, nothing else
    spec = (SPECS / "e2e-filter-project.xml").read_bytes()
    for content_type in ("application/json", "text/plain;format=json"):
        status, hdrs, body = request(server, "POST", "/queries", spec,
                                     {"Content-Type": content_type})
        assert status == 415 and json_error(status, hdrs, body)
    # the program as XML is not a spec
    status, hdrs, body = request(server, "POST", "/queries", evil,
                                 {"Content-Type": "application/xml"})
    assert status == 400 and json_error(status, hdrs, body)
    assert [c for c in service.calls if c[0] == "submit"] == []
    assert not hasattr(SchedulerClient, "submit_compiled")


def test_a_spec_is_accepted_with_either_xml_type_and_parameters(
        fake: tuple[RecordingService, ApiServer], tmp_path: Path) -> None:
    """The refusals above are of the media type, not of everything."""
    service, server = fake
    spec = (SPECS / "e2e-filter-project.xml").read_bytes()
    for i, content_type in enumerate(("application/xml", "text/xml; charset=utf-8",
                                      "Application/XML ; charset=UTF-8")):
        status, _, body = request(server, "POST", f"/queries?query_id=ok{i}", spec,
                                  {"Content-Type": content_type, "X-Spec-Dir": str(tmp_path)})
        assert status == 201, body
    submitted = [c[1] for c in service.calls if c[0] == "submit"]
    assert [q.query_id for q in submitted] == ["ok0", "ok1", "ok2"]
    assert all("os.system" not in t.program for q in submitted for t in q.tasks)


# ---- the token -------------------------------------------------------------------------------
def test_every_route_needs_the_token(fake: tuple[RecordingService, ApiServer]) -> None:
    service, server = fake
    for method, target, body in ROUTES:
        for auth in (None, "", "Bearer", "Bearer ", "Bearer wrong", f"Basic {TOKEN}",
                     f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"{TOKEN}"):
            headers = {"Content-Type": "application/json"}
            if auth is not None:
                headers["Authorization"] = auth
            status, hdrs, reply = request(server, method, target, body, headers, token=None)
            message = json_error(status, hdrs, reply)
            assert status == 401, (method, target, auth, status)
            assert "Authorization: Bearer" in message and "ELASTIQ_TOKEN_FILE" in message
    assert service.calls == []
    for target in ("/healthz", "/metrics"):
        status, _, _ = request(server, "GET", target, token=None)
        assert status in (200, 404)  # the fake has no metrics: 404, but not 401
    status, _, _ = request(server, "POST", "/healthz", b"", token=None)
    assert status == 401  # only GET is open


def test_health_and_metrics_are_open_and_reveal_no_secrets(tmp_path: Path) -> None:
    loop = SchedulerLoop(tick_interval=0.05).start()
    server = ApiServer(loop, token=TOKEN).start()
    try:
        spec = (SPECS / "e2e-filter-project.xml").read_bytes()
        status, _, body = request(server, "POST", "/queries", spec,
                                  {"Content-Type": "application/xml",
                                   "X-Spec-Dir": str(tmp_path)})
        assert status == 201, body
        view = json.loads(request(server, "GET", "/queries/e2e-filter-project")[2])
        secrets_ = [TOKEN, str(tmp_path), "filter-project.jsonl", "raw.temp",
                    "tcp://", "s-3"]
        assert any(s in json.dumps(view) for s in secrets_[1:])  # the view does hold some
        for target in ("/healthz", "/metrics"):
            status, _, text = request(server, "GET", target, token=None)
            assert status == 200
            found = [s for s in secrets_ if s.encode() in text]
            assert found == [], (target, found)
        assert json.loads(request(server, "GET", "/healthz", token=None)[2]) == {
            "ok": True, "connected": False, "framework_id": None}
    finally:
        server.stop()
        loop.stop()


# ---- Host and Origin -------------------------------------------------------------------------
def test_a_foreign_host_or_origin_is_refused(fake: tuple[RecordingService, ApiServer]) -> None:
    service, server = fake
    port = server.port
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}",
                 f"localhost:{port}.evil.example", "127.0.0.1", f"10.0.0.1:{port}", ""):
        for target in ("/queries", "/healthz", "/metrics"):
            status, hdrs, body = request(server, "GET", target, headers={"Host": host})
            assert status == 403 and "Host" in json_error(status, hdrs, body), (host, target)
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null",
                   f"https://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"):
        for method, target, body in ROUTES[:3]:
            status, hdrs, reply = request(server, method, target, body,
                                          {"Origin": origin, "Content-Type": "text/plain"})
            assert status == 403 and "Origin" in json_error(status, hdrs, reply), origin
    assert service.calls == []
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
        assert request(server, "GET", "/queries", headers={"Host": host})[0] == 200
    own = {"Origin": f"http://127.0.0.1:{port}"}
    assert request(server, "GET", "/queries", headers=own)[0] == 200


def test_a_name_given_as_allowed_host_is_accepted() -> None:
    service = RecordingService()
    server = ApiServer(service, token=TOKEN, allowed_hosts=["sched.example",
                                                            "lb.example:8443"]).start()
    try:
        ok = (f"sched.example:{server.port}", "lb.example:8443")
        for host in ok:
            assert request(server, "GET", "/queries", headers={"Host": host})[0] == 200
        for host in ("sched.example:1", f"lb.example:{server.port}"):
            assert request(server, "GET", "/queries", headers={"Host": host})[0] == 403
    finally:
        server.stop()


# ---- connections -----------------------------------------------------------------------------
def read_responses(sock: socket.socket, wait: float) -> bytes:
    """Everything the server sends until it closes or is silent for `wait` seconds."""
    sock.settimeout(wait)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pass
    return data


def test_a_refused_requests_body_is_not_read_as_the_next_request(
        fake: tuple[RecordingService, ApiServer]) -> None:
    service, server = fake
    host = f"127.0.0.1:{server.port}"
    smuggled = (f"DELETE /queries/victim HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\r\n").encode()
    for refused_head in (f"POST /queries HTTP/1.1\r\nHost: {host}\r\n",  # no token
                         f"POST /queries HTTP/1.1\r\nHost: evil.example\r\n"
                         f"Authorization: Bearer {TOKEN}\r\n",  # foreign host
                         f"POST /queries HTTP/1.1\r\nHost: {host}\r\nOrigin: http://x.example\r\n"
                         f"Authorization: Bearer {TOKEN}\r\n"):  # foreign origin
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            head = refused_head + f"Content-Type: application/xml\r\n" \
                                  f"Content-Length: {len(smuggled)}\r\n\r\n"
            sock.sendall(head.encode() + smuggled)
            data = read_responses(sock, 2.0)
        assert data.count(b"HTTP/1.1 ") == 1, data
        assert data.startswith((b"HTTP/1.1 401", b"HTTP/1.1 403")), data
    assert service.calls == []
    # an accepted request's body is consumed: the next request on the connection is served
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        body = b'{"tuples": []}'
        sock.sendall((f"POST /queries HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}"
                      f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                      ).encode() + body + (f"GET /queries/q HTTP/1.1\r\nHost: {host}\r\n"
                                           f"Authorization: Bearer {TOKEN}\r\n\r\n").encode())
        data = wait_for("two replies", lambda: (d := read_responses(sock, 1.0))
                        and d.count(b"HTTP/1.1 ") >= 2 and d, 10)
    assert data.startswith(b"HTTP/1.1 415") and b"HTTP/1.1 200" in data
    assert service.calls == [("query_status", "q")]


def test_an_oversized_body_is_413_and_closes(fake: tuple[RecordingService, ApiServer]) -> None:
    service, server = fake
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall((f"POST /queries HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                      f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/xml\r\n"
                      f"Content-Length: {5 * 1024 * 1024}\r\n\r\n").encode() + b"<" * 1000)
        data = read_responses(sock, 3.0)
    assert data.startswith(b"HTTP/1.1 413") and b'"error"' in data, data[:300]
    assert service.calls == []


def test_malformed_requests_are_400_not_500(fake: tuple[RecordingService, ApiServer]) -> None:
    _, server = fake
    for raw in (b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                b"GET /queries HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
                b"GET /queries HTTP/1.1\r\nHost\r\n\r\n",
                b"POST /queries HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(raw)
            data = read_responses(sock, 2.0)
        assert data.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400", b"HTTP/1.1 403",
                                b"HTTP/1.1 414", b"HTTP/1.1 431")), (raw[:60], data[:200])
    assert request(server, "GET", "/queries")[0] == 200


def test_idle_and_slow_connections_do_not_starve_the_api(
        fake: tuple[RecordingService, ApiServer]) -> None:
    """400 idle connections and a slow-header client: a normal request is still served within
    a second, and the idle ones are closed after the idle timeout (1.5 s here)."""
    _, server = fake
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(400)]
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        slow.sendall(b"GET /queries HTTP/1.1\r\nHost: 127.0")
        idle[0].sendall(b"GET /queries HTTP/1.1\r\nX-Half: ")
        started = time.monotonic()
        status, _, _ = request(server, "GET", "/queries")
        took = time.monotonic() - started
        assert status == 200 and took < 1.0, took
        slow.sendall(b".0.1")  # still dribbling
        started = time.monotonic()

        def closed(sock: socket.socket) -> bool:
            sock.settimeout(0.01)
            try:
                return sock.recv(1) == b""
            except socket.timeout:
                return False
            except OSError:
                return True

        wait_for("idle connections closed", lambda: all(closed(s) for s in idle + [slow]), 15,
                 step=0.25)
        assert time.monotonic() - started < 10
        assert request(server, "GET", "/queries")[0] == 200
    finally:
        for s in idle + [slow]:
            s.close()


# ---- fuzz ------------------------------------------------------------------------------------
def _fuzz_body(rng: random.Random) -> bytes:
    leaf = lambda: rng.choice([None, True, 1, -1.5, "", "x" * rng.randint(0, 50), "\u0000",
                               "f", "condition", "raw.temp > 1", "<a/>", [], {}])  # noqa: E731

    def value(depth: int) -> Any:
        if depth > 2 or rng.random() < 0.4:
            return leaf()
        if rng.random() < 0.5:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        keys = ["tuples", "to", "operator", "parameter", "value", "query_id", "tasks",
                "program", rng.choice(["", "\u00e9", "x" * 10])]
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randint(0, 4))}

    kind = rng.randrange(6)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    if kind == 1:
        return json.dumps({"tuples": [value(1) for _ in range(rng.randint(0, 4))]}).encode()
    if kind == 2:
        return json.dumps({"to": value(1)}).encode()
    if kind == 3:
        spec = (SPECS / "e2e-filter-project.xml").read_bytes()
        cut = rng.randint(0, len(spec))
        return spec[:cut] + bytes(rng.randrange(256) for _ in range(rng.randint(0, 20)))
    if kind == 4:
        return json.dumps(value(0)).encode()
    return b""


def _fuzz_target(rng: random.Random) -> str:
    segments = ["queries", "q", "fz", "tasks", "fz.t0", "migrate", "control", "r1", "healthz",
                "metrics", "%2F", "%00", "..", "%E9", "%", "a%2Fb", "\u00e9".encode().hex(),
                "x" * rng.randint(1, 300)]
    path = "/" + "/".join(rng.choice(segments) for _ in range(rng.randint(0, 6)))
    if rng.random() < 0.2:
        path += "?" + rng.choice(["query_id=fz2", "query_id=", "a=b&a=c", "%zz", "query_id=%00"])
    return path


def test_fuzzed_requests_never_get_a_500(tmp_path: Path) -> None:
    """Seeded and bounded: random methods, paths, headers and bodies (the control and migrate
    JSON bodies among them) against the real loop with a running query; every reply is below
    500 and every refusal is a JSON error."""
    loop = SchedulerLoop(tick_interval=0.05).start()
    server = ApiServer(loop, token=TOKEN).start()
    rng = random.Random(20261124)
    try:
        spec = (SPECS / "e2e-filter-project.xml").read_bytes()
        assert request(server, "POST", "/queries?query_id=fz", spec,
                       {"Content-Type": "application/xml", "X-Spec-Dir": str(tmp_path)})[0] == 201
        statuses: dict[int, int] = {}
        for _ in range(400):
            method = rng.choice(["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "FOO"])
            headers = {"Content-Type": rng.choice(["application/json", "application/xml",
                                                   "text/xml; charset=utf-8", "text/plain",
                                                   "", "a/b;c", "\u00e9"])}
            if rng.random() < 0.2:
                headers["Origin"] = rng.choice(["http://evil.example", "null",
                                                f"http://127.0.0.1:{server.port}"])
            if rng.random() < 0.2:
                headers["X-Spec-Filename"] = rng.choice(["", "../../etc/passwd", "a.xml"])
            token = TOKEN if rng.random() < 0.85 else rng.choice([None, "bad"])
            body = _fuzz_body(rng) if method != "GET" or rng.random() < 0.1 else None
            target = _fuzz_target(rng)
            try:
                headers = {k: v.encode("latin-1", "replace").decode("latin-1")
                           for k, v in headers.items()}
                status, hdrs, reply = request(server, method, target, body, headers, token)
            except http.client.InvalidURL:
                continue
            statuses[status] = statuses.get(status, 0) + 1
            assert status < 500, (method, target, headers, body, reply[:300])
            if status >= 400:
                json_error(status, hdrs, reply)
        assert loop.status()["queries"]["fz"]["phase"] in ("active", "stopping", "stopped")
        assert len(statuses) >= 5, statuses  # the fuzz reached many different answers
        assert request(server, "GET", "/queries/fz")[0] == 200
    finally:
        server.stop()
        loop.stop()


# ---- the gate's pure pieces ------------------------------------------------------------------
def test_media_types_and_own_hosts() -> None:
    from scheduler.api import media_type, own_hosts

    assert media_type(" Text/XML ; charset=utf-8") == "text/xml"
    assert media_type("text/plain;format=json") == "text/plain"
    assert media_type("") == ""
    hosts = own_hosts("0.0.0.0", 8088, ["Sched.Example", "lb.example:443", " "])
    assert hosts == {"0.0.0.0:8088", "localhost:8088", "127.0.0.1:8088", "[::1]:8088",
                     "sched.example:8088", "lb.example:443"}
    assert "localhost" in own_hosts("127.0.0.1", 80) and "localhost" not in hosts


def test_a_slow_body_is_408_and_closed_while_others_are_served() -> None:
    service = RecordingService()
    server = ApiServer(service, token=TOKEN, body_timeout=1.0).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall((f"POST /queries/q/control HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                          f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                          "Content-Length: 100\r\n\r\n{\"tuples\"").encode())
            started = time.monotonic()
            assert request(server, "GET", "/queries/q")[0] == 200  # not held up meanwhile
            data = read_responses(sock, 5.0)
            took = time.monotonic() - started
        assert data.startswith(b"HTTP/1.1 408") and b'"error"' in data, data[:300]
        assert 0.5 < took < 5.0, took
        assert [c[0] for c in service.calls] == ["query_status"]
    finally:
        server.stop()
