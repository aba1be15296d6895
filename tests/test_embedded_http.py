"""The embedded master's and agent's HTTP input paths, attacked over real sockets.

Owns the regression tests of the aiohttp servers (embedded_mesos/httpio.py): a refused body is
never parsed as the next request on a keep-alive connection, malformed requests get 4xx with a
message, the body limit, the header timeout against idle and slowloris connections (400 idle
connections do not delay a call; the thread count does not grow), the cluster secret on every
/internal route (an unauthenticated LAUNCH carrying a shell command never runs it), and a seeded,
bounded fuzz of both servers after which a real pymesos driver still runs a task. Requests that
test body handling carry the framework credential or an executor token, so they get past
authentication (tests/test_embedded_auth.py tests that).
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from embedded_mesos import EmbeddedCluster, httpio
from tests.test_embedded_cluster import (  # noqa: F401 - `drivers` is a fixture
    RESOURCES, drivers, executor_token, framework_auth, launch_running, subscribe, task_info,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]
SMUGGLED = b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(resources=RESOURCES, work_dir=tmp_path / "cluster", offer_interval=0.05,
                         ping_interval=0.2, executor_grace_seconds=1.0) as running:
        yield running


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def connect(url: str, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(host_port(url), timeout=timeout)
    return sock


def read_until_quiet(sock: socket.socket, quiet: float = 0.7, limit: float = 8.0) -> bytes:
    """Everything the server sends until it closes or stays quiet for `quiet` seconds."""
    data = b""
    deadline = time.monotonic() + limit
    sock.settimeout(quiet)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def statuses(raw: bytes) -> list[int]:
    """Status codes of the responses in `raw` (each starts a line with `HTTP/1.x `)."""
    found = []
    for line in raw.split(b"\r\n"):
        if line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")):
            found.append(int(line.split()[1]))
    return found


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
            content_length: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def first_status(url: str, raw: bytes, timeout: float = 5.0) -> tuple[int | None, bytes]:
    """Send `raw` on a fresh connection; the first response's status (None if the server
    closed without one) and what came with it."""
    with connect(url, timeout) as sock:
        sock.sendall(raw)
        data = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in data and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            data += chunk
    found = statuses(data)
    return (found[0] if found else None), data


def test_a_refused_body_is_never_parsed_as_the_next_request(cluster):
    master, agent = cluster.master_url, cluster.agents[0].url
    refusals = [
        (master, request("POST", "/api/v1/scheduler", SMUGGLED), 401),
        (agent, request("POST", "/api/v1/executor", SMUGGLED), 401),
        (master, request("POST", "/nowhere", SMUGGLED), 404),
        (master, request("PUT", "/api/v1/scheduler", SMUGGLED), 405),
        (master, request("POST", "/internal/agent/register", SMUGGLED), 401),
        (agent, request("POST", "/internal/command", SMUGGLED), 401),
        (agent, request("GET", "/api/v1/executor", SMUGGLED), 405),
        (master, request("POST", "/api/v1/scheduler", SMUGGLED, framework_auth(cluster),
                         content_length=httpio.MAX_BODY_BYTES + 1), 413),
    ]
    for url, refused, expected in refusals:
        with connect(url) as sock:
            sock.sendall(refused)
            sock.sendall(request("GET", "/marker-after-refusal"))
            seen = statuses(read_until_quiet(sock))
        assert seen and seen[0] == expected, (refused[:40], seen)
        assert 200 not in seen, f"the refused body was served as a request: {seen}"
        # either the marker is answered (the body was drained) or the connection was closed
        assert seen[1:] in ([], [404]), seen


def test_malformed_requests_get_a_4xx_with_a_message(cluster, drivers):
    master, agent = cluster.master_url, cluster.agents[0].url
    recorder, driver = subscribe(cluster, drivers)
    launch_running(recorder, driver, "holder", "run")  # an executor whose token we can use
    (pid,) = cluster.agents[0].executor_pids().values()
    auth = framework_auth(cluster)
    json_type = {"Content-Type": "application/json", **auth}
    token = {"Authorization": f"Bearer {executor_token(pid)}"}
    cases = [
        (master, b"GARBAGE\r\n\r\n"),
        (master, b"GET /version HTTP/9.9\r\nHost: x\r\n\r\n"),
        (master, b"GET /version HTTP/1.1\r\nBad Header Line\r\n\r\n"),
        (master, b"POST /api/v1/scheduler HTTP/1.1\r\nContent-Length: -5\r\n\r\n"),
        (master, b"POST /api/v1/scheduler HTTP/1.1\r\nContent-Length: abc\r\n\r\n"),
        (master, b"POST /api/v1/scheduler HTTP/1.1\r\nHost: x\r\n\r\n"),  # no length: 411
        (master, request("POST", "/api/v1/scheduler", b"{not json", json_type)),
        (master, request("POST", "/api/v1/scheduler", b"\xff\xfe", json_type)),
        (master, request("POST", "/api/v1/scheduler", b'"a string"', json_type)),
        (master, request("POST", "/api/v1/scheduler", json.dumps({"type": 5}).encode(), auth)),
        (master, request("POST", "/api/v1/scheduler",
                         json.dumps({"type": "SUBSCRIBE", "subscribe": []}).encode(), auth)),
        (master, request("POST", "/api/v1/scheduler", json.dumps(
            {"type": "SUBSCRIBE", "subscribe": {"framework_info": {"name": 7}}}).encode(),
            auth)),
        (master, request("POST", "/api/v1/scheduler", json.dumps(
            {"type": "SUBSCRIBE", "subscribe": {"framework_info": {
                "name": "x", "failover_timeout": "soon"}}}).encode(), auth)),
        (master, request("POST", "/api/v1/scheduler", json.dumps(
            {"type": "ACCEPT", "framework_id": {"value": 3}}).encode(), auth)),
        (agent, request("POST", "/api/v1/executor", b"[]", token)),
        (agent, request("POST", "/api/v1/executor", json.dumps(
            {"type": "UPDATE", "framework_id": {"value": 1}}).encode(), token)),
        (agent, request("POST", "/api/v1/executor", json.dumps(
            {"type": "SUBSCRIBE", "framework_id": {"value": "f"},
             "executor_id": {"value": "none"}}).encode(), token)),
        (agent, request("POST", "/api/v1/executor", json.dumps(
            {"type": "SUBSCRIBE", "framework_id": {"value": "f"},
             "executor_id": {"value": "none"}}).encode())),
        (agent, b"\x00\x01\x02 binary noise\r\n\r\n"),
    ]
    for url, raw in cases:
        status, data = first_status(url, raw)
        assert status is not None and 400 <= status < 500, (raw[:60], status, data[:200])
        body = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
        assert body.strip(), f"no message with {status} for {raw[:60]!r}"
    assert first_status(master, request("GET", "/version"))[0] == 200


def test_body_limit_refuses_an_oversized_chunked_body(cluster):
    head = (b"POST /api/v1/scheduler HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\nAuthorization: "
            + framework_auth(cluster)["Authorization"].encode() + b"\r\n\r\n")
    piece = b" " * 65536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    with connect(cluster.master_url, timeout=10) as sock:
        sock.sendall(head)
        sent = 0
        try:
            while sent <= httpio.MAX_BODY_BYTES + len(piece):
                sock.sendall(chunk)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed before we finished: what we want
        seen = statuses(read_until_quiet(sock))
    assert seen == [413], seen


def server_threads(name: str) -> list[str]:
    """Names of the HTTP server threads of the master or agent called `name`."""
    return [t.name for t in threading.enumerate()
            if t.name == f"{name} http" or t.name.startswith(f"{name} sync")]


def test_idle_and_slow_connections_time_out_and_do_not_starve_a_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drivers):
    monkeypatch.setattr(httpio, "HEADER_TIMEOUT_SECONDS", 1.5)
    with EmbeddedCluster(resources=RESOURCES, work_dir=tmp_path / "c", offer_interval=0.05,
                         ping_interval=0.2, executor_grace_seconds=1.0) as cluster:
        master = cluster.master.name
        before = threading.active_count()
        idle = [connect(cluster.master_url) for _ in range(400)]
        slow = [connect(cluster.master_url) for _ in range(20)]
        try:
            for sock in slow:
                sock.sendall(b"POST /api/v1/scheduler HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            status, data = first_status(cluster.master_url, request("GET", "/version"))
            assert status == 200 and b'"version"' in data
            assert time.monotonic() - started < 1.0
            recorder, driver = subscribe(cluster, drivers)
            assert recorder.wait_for("offer")["agent_id"]["value"] == cluster.agents[0].agent_id
            assert 1 <= len(server_threads(master)) <= 1 + httpio.SYNC_WORKERS, \
                server_threads(master)
            assert threading.active_count() < before + 20, "threads grew with connections"
            for _ in range(3):  # slowloris: a header byte now and then does not keep it open
                time.sleep(0.5)
                for sock in slow:
                    try:
                        sock.sendall(b"X")
                    except OSError:
                        pass
            deadline = time.monotonic() + 10.0
            for sock in idle + slow:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    assert sock.recv(1024) == b"", "an idle connection got data"
                except ConnectionResetError:
                    pass  # closed: fine
        finally:
            for sock in idle + slow:
                sock.close()
        launch_running(recorder, driver, "after-idle", "finish")


def test_a_slow_body_gets_408_and_the_connection_is_closed(cluster, monkeypatch):
    monkeypatch.setattr(httpio, "BODY_TIMEOUT_SECONDS", 1.0)
    with connect(cluster.master_url) as sock:
        started = time.monotonic()
        sock.sendall(request("POST", "/api/v1/scheduler", b'{"type": ', framework_auth(cluster),
                             content_length=100))
        seen = statuses(read_until_quiet(sock, quiet=3.0))
        assert seen == [408], seen
        assert time.monotonic() - started < 3.0
        sock.settimeout(2.0)
        assert sock.recv(100) == b"", "the connection stayed open after the 408"


def test_past_the_connection_cap_the_longest_idle_connections_are_closed(
        cluster, monkeypatch):
    monkeypatch.setattr(httpio, "MAX_CONNECTIONS", 40)
    first = [connect(cluster.master_url) for _ in range(20)]
    time.sleep(0.2)  # these are now the longest idle
    later = [connect(cluster.master_url) for _ in range(30)]
    try:
        assert first_status(cluster.master_url, request("GET", "/version"))[0] == 200
        closed = 0
        for sock in first:
            sock.settimeout(0.5)  # far below the 10 s header timeout
            try:
                closed += sock.recv(10) == b""
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                pass  # still open: not among the longest idle
        # 20 + 30 + the probe (+ the agent's ping connection) exceed 40 by at least 11
        assert closed >= 10, closed
    finally:
        for sock in first + later:
            sock.close()


def test_internal_routes_refuse_callers_without_the_secret(cluster, tmp_path: Path):
    proof = tmp_path / "pwned"
    launch = {"type": "LAUNCH", "framework_id": "f1", "framework_info": {},
              "task": {"task_id": {"value": "t1"}, "executor": {
                  "executor_id": {"value": "e1"},
                  "command": {"value": f"touch {proof}", "shell": True}}}}
    agent, master = cluster.agents[0].url, cluster.master_url
    register = {"agent_id": None, "url": agent, "hostname": "127.0.0.1",
                "resources": [], "executors": []}
    attempts = [
        (agent, "/internal/command", launch),
        (master, "/internal/agent/register", register),
        (master, "/internal/agent/ping", {"agent_id": cluster.agents[0].agent_id}),
        (master, "/internal/agent/unregister", {"agent_id": cluster.agents[0].agent_id}),
        (master, "/internal/agent/event", {"agent_id": cluster.agents[0].agent_id,
                                           "event": {"type": "EXECUTOR_EXITED"}}),
    ]
    for url, path, body in attempts:
        for headers in ({}, {httpio.SECRET_HEADER: "wrong"},
                        {httpio.SECRET_HEADER: cluster.master.secret[:-1]}):
            status, data = first_status(url, request("POST", path, json.dumps(body).encode(),
                                                     {"Content-Type": "application/json",
                                                      **headers}))
            assert status == 401, (path, headers, status, data[:200])
    # the agent is still registered (the unauthenticated unregister did nothing)
    operator = framework_auth(cluster)
    state = json.loads(first_status(master, request("GET", "/state", headers=operator))[1]
                       .split(b"\r\n\r\n")[1])
    assert cluster.agents[0].agent_id in json.dumps(state)
    # with the secret the route answers on its merits (here: an unknown agent is 404)
    status, _ = first_status(master, request(
        "POST", "/internal/agent/ping", json.dumps({"agent_id": "nobody"}).encode(),
        {httpio.SECRET_HEADER: cluster.master.secret}))
    assert status == 404
    time.sleep(1.0)  # a started shell would have touched the file by now
    assert not proof.exists()


def test_agent_process_gets_the_secret_outside_its_command_line(cluster):
    handle = cluster.start_agent_process()
    cmdline = Path(f"/proc/{handle.pid}/cmdline").read_bytes()
    assert cluster.master.secret.encode() not in cmdline
    assert handle.agent_id  # it registered, so it had the secret


def _mutate(value: Any, rng: random.Random, depth: int = 0) -> Any:
    """`value` with random keys dropped or values replaced by values of other types."""
    odd = [None, 0, -1, 1e308, "", "x" * 300, [], {}, [1, "a"], {"value": 5}, True]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            roll = rng.random()
            if roll < 0.15:
                continue
            out[key] = rng.choice(odd) if roll < 0.3 else _mutate(item, rng, depth + 1)
        return out
    if isinstance(value, list):
        return [_mutate(item, rng, depth + 1) for item in value if rng.random() > 0.2]
    return rng.choice(odd) if rng.random() < 0.3 else value


def _valid_calls(framework_id: str, agent_id: str, executor_id: str,
                 task_id: str) -> list[dict[str, Any]]:
    fid, eid, tid = {"value": framework_id}, {"value": executor_id}, {"value": task_id}
    return [
        {"type": "SUBSCRIBE", "subscribe": {"framework_info": {"user": "", "name": "fz"}}},
        {"type": "ACCEPT", "framework_id": fid, "accept": {
            "offer_ids": [{"value": "o1"}], "operations": [{"type": "LAUNCH", "launch": {
                "task_infos": [{"task_id": tid, "agent_id": {"value": agent_id},
                                "name": "t", "resources": [], "executor": {
                                    "executor_id": eid, "command": {"value": "true"}}}]}}]}},
        {"type": "DECLINE", "framework_id": fid, "decline": {"offer_ids": [{"value": "o"}]}},
        {"type": "KILL", "framework_id": fid, "kill": {"task_id": tid}},
        {"type": "RECONCILE", "framework_id": fid, "reconcile": {"tasks": [
            {"task_id": tid, "agent_id": {"value": agent_id}}]}},
        {"type": "ACKNOWLEDGE", "framework_id": fid, "acknowledge": {
            "agent_id": {"value": agent_id}, "task_id": tid, "uuid": "AAAA"}},
        {"type": "MESSAGE", "framework_id": fid, "message": {
            "agent_id": {"value": agent_id}, "executor_id": eid, "data": "aGk="}},
        {"type": "UPDATE", "framework_id": fid, "executor_id": eid, "update": {
            "status": {"task_id": tid, "state": "TASK_RUNNING", "uuid": "AAAA"}}},
        {"type": "MESSAGE", "framework_id": fid, "executor_id": eid,
         "message": {"data": "aGk="}},
        {"type": "TEARDOWN", "framework_id": {"value": "not-this-one"}},
    ]


def _fuzz_request(rng: random.Random, calls: list[dict[str, Any]], secret: str,
                  api_path: str, stream_id: str, authorization: str) -> bytes:
    """A random request; most are POSTs of mutated valid calls to `api_path`, most of them
    with the valid `authorization` for it."""
    if rng.random() < 0.6:
        method, path = "POST", api_path
    else:
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS",
                             "BREW"])
        path = rng.choice(["/version", "/state", "/master/state", "/api/v1/scheduler",
                           "/api/v1/executor", "/internal/command", "/internal/agent/register",
                           "/internal/agent/event", "/%00", "/" + "a" * rng.randint(1, 50),
                           "/api/v1/scheduler?x=1", "//..//etc/passwd", "/api/v1",
                           "/state.json", "/metrics/snapshot", "/health", "/redirect"])
    roll = rng.random()
    if roll < 0.25:
        body = json.dumps(rng.choice(calls)).encode()
    elif roll < 0.7:
        body = json.dumps(_mutate(rng.choice(calls), rng)).encode()
    elif roll < 0.8:
        body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    elif roll < 0.9:
        body = json.dumps(rng.choice(calls)).encode()[: rng.randint(0, 80)]
    else:
        body = b""
    headers = {}
    if rng.random() < 0.5:
        headers["Content-Type"] = rng.choice(["application/json", "text/plain", "\x7f"])
    if rng.random() < 0.6:
        headers["Mesos-Stream-Id"] = rng.choice(["", "x", "0" * 40, stream_id, stream_id])
    if rng.random() < 0.3:
        headers[httpio.SECRET_HEADER] = rng.choice(["", "guess", secret[:5]])
    if rng.random() < 0.9:
        headers["Authorization"] = authorization if rng.random() < 0.85 else rng.choice([
            "", "Basic", "Basic Og==", "Bearer", "Bearer a.b.c", authorization[:-2],
            authorization + "x", "Negotiate " + authorization])
    length = None if rng.random() < 0.9 else rng.choice([0, max(0, len(body) - 3)])
    if rng.random() < 0.05:  # a raw, broken request
        return bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 60))) + b"\r\n\r\n"
    return request(method, path, body, headers, length)


@pytest.mark.timeout(300)
def test_fuzzing_both_servers_gives_no_500_and_a_driver_still_works(cluster, drivers):
    rng = random.Random(20261124)
    master_url, agent_url = cluster.master_url, cluster.agents[0].url
    recorder, driver = subscribe(cluster, drivers)
    launch_running(recorder, driver, "victim", "run", executor_id="victim-executor")
    framework_id = recorder.wait_for("registered")
    calls = _valid_calls(framework_id, cluster.agents[0].agent_id, "victim-executor", "victim")
    (pid,) = cluster.agents[0].executor_pids().values()
    authorizations = {master_url: framework_auth(cluster)["Authorization"],
                      agent_url: f"Bearer {executor_token(pid)}"}
    seen: dict[int | None, int] = {}
    for index in range(600):
        url, api = ((master_url, "/api/v1/scheduler") if index % 2 == 0
                    else (agent_url, "/api/v1/executor"))
        raw = _fuzz_request(rng, calls, cluster.master.secret, api, driver.stream_id,
                            authorizations[url])
        status, data = first_status(url, raw, timeout=5.0)
        assert status is None or status < 500, (raw[:300], status, data[:300])
        seen[status] = seen.get(status, 0) + 1
    assert sum(n for s, n in seen.items() if s is not None) >= 570, seen
    assert seen.get(400, 0) >= 100 and seen.get(202, 0) + seen.get(200, 0) >= 10, seen
    assert first_status(master_url, request("GET", "/version"))[0] == 200
    assert first_status(agent_url, request("GET", "/state"))[0] == 200
    mark = recorder.mark()
    offers = [payload for kind, payload in recorder.events if kind == "offer"]
    offer = offers[-1]  # the latest outstanding offer (the recorder declines none)
    driver.launchTasks([offer["id"]], [task_info("after-fuzz", offer, "finish", "fresh")],
                       filters={"refuse_seconds": 0})
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == "after-fuzz"
                      and s["state"] == "TASK_FINISHED", start=mark)
    assert os.path.isdir(cluster.work_dir)
