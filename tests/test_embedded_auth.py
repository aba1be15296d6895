"""Framework and executor authentication of the embedded cluster.

Owns the tests of embedded_mesos/auth.py (pure: HTTP Basic checking against pymesos's own
encoding, executor tokens against an independent HMAC and base64 decoding, the executor's
environment, our executor driver's header) and the attacks over real sockets on a real cluster
with real executor processes (tests/fixtures/echo_executor.py): a scheduler without the
framework credential can neither subscribe nor launch a command; someone who read the framework
and executor ids from the master's open /state can subscribe as an executor, post its updates or
messages neither without its token, nor with another executor's, nor with a forged one, nor with
the token of an earlier launch of the same executor; the real executor keeps its stream (it
answers messages and runs the next task it is given).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from pymesos import MesosSchedulerDriver, decode_data, encode_data

from embedded_mesos import EmbeddedCluster
from embedded_mesos.auth import (
    BASIC_CHALLENGE, BEARER_CHALLENGE, EXECUTOR_TOKEN_ENV, FRAMEWORK_SECRET_ENV, ExecutorClaims,
    ExecutorTokens, FrameworkCredential, authenticated_principal, basic_authorization,
    bearer_token, claims_mismatch,
)
from embedded_mesos.executors import ExecutorEnvironment, executor_env
from embedded_mesos.httpio import SECRET_ENV
from tests.test_embedded_cluster import (  # noqa: F401 - `drivers` is a fixture
    RESOURCES, Recorder, drivers, executor_token, framework_auth, http_call, pid_alive,
    subscribe, task_info,
)
from testkit.waiting import wait_for

pytestmark = [pytest.mark.timeout(120)]
JSON = {"Content-Type": "application/json"}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# --- pure: credentials and tokens -----------------------------------------------------------------

def test_basic_credentials_match_pymesos_and_nothing_else_passes() -> None:
    credential = FrameworkCredential("elastiq", "s3cret-Value")
    pymesos_header = MesosSchedulerDriver(None, {}, "127.0.0.1:1", principal="elastiq",
                                          secret="s3cret-Value")._basic_credential
    assert basic_authorization(credential) == pymesos_header
    assert authenticated_principal(pymesos_header, (credential,)) == "elastiq"
    assert authenticated_principal("basic " + pymesos_header.split()[1],
                                   (credential,)) == "elastiq"  # the scheme is case-insensitive

    def basic(text: str) -> str:
        return "Basic " + base64.b64encode(text.encode()).decode()

    refused = [None, "", "Basic", "Basic ", "Basic !!notbase64", "Bearer x",
               basic("elastiq:s3cret-Valu"), basic("elastiq:s3cret-Value2"),
               basic("other:s3cret-Value"), basic("elastiqs3cret-Value"), basic(":s3cret-Value"),
               basic("elastiq:"), pymesos_header + "AAAA", "Basic " + "A" * 5000]
    for header in refused:
        assert authenticated_principal(header, (credential,)) is None, header
    assert "s3cret-Value" not in repr(credential)
    for principal, secret in (("a:b", "x"), ("", "x"), ("p", ""), ("p", "tab\there"),
                              ("p\u00e9", "x")):
        with pytest.raises(ValueError):
            FrameworkCredential(principal, secret)


def test_executor_tokens_carry_their_claims_and_only_their_key_verifies_them() -> None:
    key = b"k" * 32
    tokens = ExecutorTokens(key)
    claims = ExecutorClaims("fw-1", "exec-1", "container-1")
    token = tokens.mint(claims)
    header, payload, signature = token.split(".")
    # an independent reading: base64url JSON parts and an HMAC-SHA256 over `header.payload`
    assert json.loads(_unb64url(header)) == {"alg": "HS256", "typ": "JWT"}
    assert json.loads(_unb64url(payload)) == {"fid": "fw-1", "eid": "exec-1",
                                              "cid": "container-1"}
    expected = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert _unb64url(signature) == expected
    assert tokens.verify(token) == claims
    assert ExecutorTokens().verify(token) is None  # another agent's key
    other = _b64url(json.dumps({"fid": "fw-1", "eid": "exec-2", "cid": "container-1"}).encode())
    none_alg = _b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    forged = [f"{header}.{other}.{signature}", f"{none_alg}.{payload}.", f"{header}.{payload}.",
              f"{header}.{payload}", f"{header}.{payload}.{signature}.x", "", "a.b.c",
              f"{header}.{payload}.{_b64url(expected[:-1])}"]
    for bad in forged:
        assert tokens.verify(bad) is None, bad
    assert bearer_token(f"Bearer {token}") == token
    assert bearer_token(f"bearer  {token} ") == token
    for header_value in (None, "", "Bearer", "Bearer ", f"Basic {token}", token):
        assert bearer_token(header_value) is None
    assert claims_mismatch(claims, "fw-1", "exec-1") is None
    assert "exec-1" in (claims_mismatch(claims, "fw-1", "exec-2") or "")
    assert claims_mismatch(claims, "fw-2", "exec-1") is not None


def test_the_executor_environment_holds_its_token_and_none_of_the_cluster_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (SECRET_ENV, FRAMEWORK_SECRET_ENV, EXECUTOR_TOKEN_ENV):
        monkeypatch.setenv(name, f"inherited-{name}")
    where = ExecutorEnvironment("127.0.0.1:5051", "a1", "f1", "e1", tmp_path, 3.0, "the-token")
    command = {"value": "true", "environment": {"variables": [
        {"name": EXECUTOR_TOKEN_ENV, "value": "chosen-by-the-framework"},
        {"name": "OWN", "value": "kept"}]}}
    env = executor_env(command, where)
    assert env[EXECUTOR_TOKEN_ENV] == "the-token"
    assert env["OWN"] == "kept"
    assert SECRET_ENV not in env and FRAMEWORK_SECRET_ENV not in env
    without = executor_env(command, ExecutorEnvironment("127.0.0.1:5051", "a1", "f1", "e1",
                                                        tmp_path, 3.0))
    assert EXECUTOR_TOKEN_ENV not in without


def test_our_executor_driver_sends_the_token_and_hides_it_from_children(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from executor.mesos_executor import AuthenticatedExecutorDriver

    for name, value in (("MESOS_AGENT_ENDPOINT", "127.0.0.1:1"), ("MESOS_FRAMEWORK_ID", "f1"),
                        ("MESOS_EXECUTOR_ID", "e1"), (EXECUTOR_TOKEN_ENV, "a.b.c")):
        monkeypatch.setenv(name, value)
    driver = AuthenticatedExecutorDriver(object())
    assert EXECUTOR_TOKEN_ENV not in os.environ
    driver._master = "127.0.0.1:1"  # what pymesos sets once it connects
    head, _, body = driver.gen_request().partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /api/v1/executor HTTP/1.1"
    assert b"Authorization: Bearer a.b.c" in lines[1:]
    assert json.loads(body)["executor_id"] == {"value": "e1"}
    plain = AuthenticatedExecutorDriver(object())
    plain._master = "127.0.0.1:1"
    assert b"Authorization" not in plain.gen_request()


# --- over real sockets ----------------------------------------------------------------------------

@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(resources=RESOURCES, work_dir=tmp_path / "cluster", offer_interval=0.05,
                         ping_interval=0.2, executor_grace_seconds=1.0) as running:
        yield running


def launch(recorder: Recorder, driver: MesosSchedulerDriver, task_id: str, mode: str,
           executor_id: str, state: str = "TASK_RUNNING") -> dict[str, Any]:
    """Launch `task_id` on an offer not used before and wait until it reaches `state`; returns
    the offer."""
    used: set[str] = recorder.__dict__.setdefault("used_offers", set())
    mark = recorder.mark()
    offer = recorder.wait_for("offer", lambda o: o["id"]["value"] not in used)
    used.add(offer["id"]["value"])
    driver.launchTasks([offer["id"]], [task_info(task_id, offer, mode, executor_id)],
                       filters={"refuse_seconds": 0})
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == task_id
                      and s["state"] == state, start=mark)
    return offer


def executor_pid(cluster: EmbeddedCluster, executor_id: str) -> int:
    pids = [pid for (_, eid), pid in cluster.agents[0].executor_pids().items()
            if eid == executor_id]
    assert len(pids) == 1, cluster.agents[0].executor_pids()
    return pids[0]


def ping(recorder: Recorder, driver: MesosSchedulerDriver, offer: dict[str, Any],
         executor_id: str, text: str) -> str:
    """The executor's answer to a framework message (`pong:<text>:<its pid>`)."""
    mark = recorder.mark()
    driver.sendFrameworkMessage({"value": executor_id}, offer["agent_id"],
                                encode_data(f"ping:{text}".encode()))
    _, _, data = recorder.wait_for("message", lambda m: m[0] == executor_id, start=mark)
    return decode_data(data).decode()


@pytest.mark.cluster
def test_a_scheduler_without_the_credential_can_neither_subscribe_nor_launch(
        cluster, drivers, tmp_path: Path) -> None:
    url, proof = cluster.master_url, tmp_path / "pwned"
    recorder, driver = subscribe(cluster, drivers)  # with the credential
    framework_id = recorder.wait_for("registered")
    offer = recorder.wait_for("offer")
    credential = cluster.framework_credential
    subscribe_call = json.dumps({"type": "SUBSCRIBE", "subscribe": {
        "framework_info": {"user": "", "name": "intruder"}}}).encode()
    accept = json.dumps({"type": "ACCEPT", "framework_id": {"value": framework_id}, "accept": {
        "offer_ids": [offer["id"]], "operations": [{"type": "LAUNCH", "launch": {"task_infos": [
            {"task_id": {"value": "evil"}, "name": "evil", "agent_id": offer["agent_id"],
             "resources": [], "executor": {"executor_id": {"value": "evil"}, "command": {
                 "value": f"touch {proof}", "shell": True}}}]}}]}}).encode()
    wrong = [{}, {"Authorization": basic_authorization(
                 FrameworkCredential(credential.principal, credential.secret + "0"))},
             {"Authorization": basic_authorization(
                 FrameworkCredential(credential.principal, credential.secret[:-1]))},
             {"Authorization": basic_authorization(
                 FrameworkCredential("someone", credential.secret))},
             {"Authorization": "Basic"}, {"Authorization": f"Bearer {credential.secret}"}]
    for headers in wrong:
        for body in (subscribe_call, accept):
            status, reply = http_call(url, "POST", "/api/v1/scheduler", body,
                                      {**JSON, "Mesos-Stream-Id": driver.stream_id, **headers})
            assert status == 401, (headers, status, reply)
            assert "authentication" in reply["error"]
    conn_status, conn_headers = _status_and_headers(url, subscribe_call)
    assert conn_status == 401 and conn_headers.get("www-authenticate") == BASIC_CHALLENGE
    # the right secret, but a FrameworkInfo claiming another principal
    status, reply = http_call(url, "POST", "/api/v1/scheduler", json.dumps(
        {"type": "SUBSCRIBE", "subscribe": {"framework_info": {
            "user": "", "name": "x", "principal": "someone-else"}}}).encode(),
        {**JSON, **framework_auth(cluster)})
    assert status == 403 and "someone-else" in reply["error"]
    # nothing registered, nothing launched: the offer the intruder named is still the driver's
    _, state = http_call(url, "GET", "/state", None, framework_auth(cluster))
    assert list(state["frameworks"]) == [framework_id]
    driver.launchTasks([offer["id"]], [task_info("legit", offer, "finish", "echo")])
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == "legit"
                      and s["state"] == "TASK_FINISHED")
    assert not proof.exists()
    _, state = http_call(url, "GET", "/state", None, framework_auth(cluster))
    assert {t["task_id"] for t in state["tasks"]} <= {"legit"}


def _status_and_headers(url: str, body: bytes) -> tuple[int, dict[str, str]]:
    import http.client

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("POST", "/api/v1/scheduler", body=body, headers=JSON)
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


@pytest.mark.cluster
def test_knowing_the_ids_is_not_enough_to_take_over_an_executor(cluster, drivers) -> None:
    recorder, driver = subscribe(cluster, drivers)
    offer = launch(recorder, driver, "victim", "run", "victim-exec")
    launch(recorder, driver, "bystander", "run", "other-exec")
    victim_pid, other_pid = executor_pid(cluster, "victim-exec"), executor_pid(cluster,
                                                                              "other-exec")
    # /state asks the framework credential, as Mesos's operator endpoints do...
    assert http_call(cluster.master_url, "GET", "/state", None)[0] == 401
    # ... but say an attacker learned the ids (from a log, or a leaked credential)
    _, state = http_call(cluster.master_url, "GET", "/state", None, framework_auth(cluster))
    victim = next(t for t in state["tasks"] if t["task_id"] == "victim")
    framework_id, executor_id = victim["framework_id"], victim["executor_id"]
    assert executor_id == "victim-exec"
    ids = {"framework_id": {"value": framework_id}, "executor_id": {"value": executor_id}}
    calls = {
        "SUBSCRIBE": {"type": "SUBSCRIBE", **ids, "subscribe": {
            "unacknowledged_tasks": [], "unacknowledged_updates": []}},
        "UPDATE": {"type": "UPDATE", **ids, "update": {"status": {
            "task_id": {"value": "victim"}, "state": "TASK_FINISHED",
            "uuid": base64.b64encode(os.urandom(16)).decode()}}},
        "MESSAGE": {"type": "MESSAGE", **ids, "message": {"data": encode_data(b"forged")}},
    }
    victim_token = executor_token(victim_pid)
    header, payload, _ = victim_token.split(".")
    assert json.loads(_unb64url(payload))["eid"] == "victim-exec"
    forged = ExecutorTokens().mint(ExecutorClaims(framework_id, executor_id,
                                                  json.loads(_unb64url(payload))["cid"]))
    unauthenticated = [{}, {"Authorization": "Bearer "}, {"Authorization": "Bearer x.y.z"},
                       {"Authorization": f"Bearer {forged}"},
                       {"Authorization": f"Bearer {header}.{payload}."},
                       framework_auth(cluster)]
    agent = cluster.agents[0].url
    for kind, call in calls.items():
        body = json.dumps(call).encode()
        for headers in unauthenticated:
            status, reply = http_call(agent, "POST", "/api/v1/executor", body,
                                      {**JSON, **headers})
            assert status == 401, (kind, headers, status, reply)
        status, reply = http_call(agent, "POST", "/api/v1/executor", body, {
            **JSON, "Authorization": f"Bearer {executor_token(other_pid)}"})
        assert status == 403 and "other-exec" in reply["error"], (kind, status, reply)
    challenge = _executor_challenge(agent, json.dumps(calls["SUBSCRIBE"]).encode())
    assert challenge == BEARER_CHALLENGE
    # the real executor still has its stream: it answers, and runs the next task it is given
    assert ping(recorder, driver, offer, "victim-exec", "still-me") == f"pong:still-me:{victim_pid}"
    launch(recorder, driver, "victim-next", "finish", "victim-exec", state="TASK_FINISHED")
    assert executor_pid(cluster, "victim-exec") == victim_pid
    assert [s["state"] for s in recorder.updates_of("victim")] == ["TASK_RUNNING"]
    mark = recorder.mark()
    driver.killTask({"value": "victim"})
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == "victim"
                      and s["state"] == "TASK_KILLED", start=mark)


def _executor_challenge(agent_url: str, body: bytes) -> str | None:
    import http.client

    host, port = agent_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("POST", "/api/v1/executor", body=body, headers=JSON)
        response = conn.getresponse()
        response.read()
        assert response.status == 401
        return response.getheader("WWW-Authenticate")
    finally:
        conn.close()


@pytest.mark.cluster
def test_the_token_of_an_earlier_launch_cannot_subscribe_the_next(cluster, drivers) -> None:
    recorder, driver = subscribe(cluster, drivers)
    launch(recorder, driver, "first", "run", "phoenix")
    first_pid = executor_pid(cluster, "phoenix")
    old_token = executor_token(first_pid)
    assert old_token.encode() not in Path(f"/proc/{first_pid}/cmdline").read_bytes()
    assert EXECUTOR_TOKEN_ENV not in os.environ  # the agent's own environment
    mark = recorder.mark()
    os.kill(first_pid, signal.SIGKILL)
    recorder.wait_for("update", lambda s: s["task_id"]["value"] == "first"
                      and s["state"] == "TASK_FAILED", start=mark)
    wait_for("the first executor to end", lambda: not pid_alive(first_pid) and
             not cluster.agents[0].executor_pids(), 15.0, 0.05)
    offer = launch(recorder, driver, "second", "run", "phoenix")
    second_pid = executor_pid(cluster, "phoenix")
    assert second_pid != first_pid and executor_token(second_pid) != old_token
    body = json.dumps({"type": "SUBSCRIBE", "framework_id": {"value": driver.framework_id},
                       "executor_id": {"value": "phoenix"},
                       "subscribe": {"unacknowledged_tasks": [],
                                     "unacknowledged_updates": []}}).encode()
    status, reply = http_call(cluster.agents[0].url, "POST", "/api/v1/executor", body,
                              {**JSON, "Authorization": f"Bearer {old_token}"})
    assert status == 403 and "earlier launch" in reply["error"], (status, reply)
    assert ping(recorder, driver, offer, "phoenix", "new") == f"pong:new:{second_pid}"


def test_the_scheduler_command_reads_the_mesos_secret_from_a_file_and_checks_its_flags(
        tmp_path: Path) -> None:
    from elastiq.cli import _parser
    from elastiq.service_cli import _secret

    secret_file = tmp_path / "mesos-secret"
    secret_file.write_text("the-secret\n", encoding="utf-8")

    def parse(*argv: str) -> Any:
        return _parser().parse_args(["scheduler", *argv])

    assert _secret(parse("--master", "m:5050", "--mesos-principal", "p",
                         "--mesos-secret-file", str(secret_file))) == "the-secret"
    assert _secret(parse("--master", "m:5050", "--mesos-principal", "p")) is None
    refused = [("--master", "m:5050", "--mesos-secret-file", str(secret_file)),  # no principal
               ("--mesos-principal", "p", "--mesos-secret-file", str(secret_file)),  # embedded
               ("--embedded-agents", "1", "--mesos-principal", "p")]
    for argv in refused:
        with pytest.raises(ValueError, match="--mesos-"):
            _secret(parse(*argv))
    secret_file.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        _secret(parse("--master", "m:5050", "--mesos-principal", "p",
                      "--mesos-secret-file", str(secret_file)))


def test_a_standalone_master_takes_the_framework_secret_from_its_env_or_a_0600_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from embedded_mesos.__main__ import _framework_options, _parser

    monkeypatch.delenv(FRAMEWORK_SECRET_ENV, raising=False)
    path = tmp_path / "framework-secret"
    args = _parser().parse_args(["master", "--framework-secret-file", str(path)])
    options = _framework_options(args)
    assert path.stat().st_mode & 0o777 == 0o600
    assert options["framework_credential"] == FrameworkCredential(
        "elastiq", path.read_text().strip())
    assert options["authenticate_frameworks"] is True
    assert _framework_options(args)["framework_credential"].secret == path.read_text().strip()
    monkeypatch.setenv(FRAMEWORK_SECRET_ENV, "from-the-environment")
    other = _parser().parse_args(["master", "--framework-principal", "ops",
                                  "--no-authenticate-http-frameworks"])
    options = _framework_options(other)
    assert options["framework_credential"] == FrameworkCredential("ops", "from-the-environment")
    assert options["authenticate_frameworks"] is False


@pytest.mark.cluster
@pytest.mark.timeout(90)
def test_a_wrong_mesos_secret_ends_the_scheduler_command_with_one_clear_line(
        tmp_path: Path) -> None:
    from embedded_mesos.master import EmbeddedMaster

    master = EmbeddedMaster(port=0).start()
    try:
        secret_file = tmp_path / "mesos-secret"
        secret_file.touch(mode=0o600)
        secret_file.write_text("not-the-secret\n", encoding="utf-8")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "elastiq.cli", "scheduler", "--master", master.address,
             "--mesos-principal", master.framework_credential.principal,
             "--mesos-secret-file", str(secret_file), "--listen", f"127.0.0.1:{port}",
             "--state-dir", str(tmp_path / "state")],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        master.stop()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "refused the framework's credentials (HTTP 401)" in done.stderr
    assert "--mesos-secret-file" in done.stderr.splitlines()[-1]
