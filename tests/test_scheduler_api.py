"""The scheduler's HTTP API over real HTTP on 127.0.0.1, with a real event loop and state (no
Mesos connection: launch commands are dropped), and the client the CLI uses."""

from __future__ import annotations

import json
import socket
from typing import Iterator

import pytest

from scheduler.api import ApiServer
from scheduler.client import RequestRejected, SchedulerClient, SchedulerUnavailable
from scheduler.loop import SchedulerLoop
from scheduler.testing import chain_query


@pytest.fixture
def api() -> Iterator[tuple[SchedulerLoop, SchedulerClient]]:
    loop = SchedulerLoop(tick_interval=0.05).start()
    server = ApiServer(loop).start()
    try:
        yield loop, SchedulerClient(server.url, timeout=10)
    finally:
        server.stop()
        loop.stop()


def test_healthz(api: tuple[SchedulerLoop, SchedulerClient]) -> None:
    _, client = api
    assert client.healthy()
    assert client._call("GET", "/healthz") == {"ok": True, "connected": False,
                                               "framework_id": None}


def test_bad_json_body_is_400_with_diagnostics(api: tuple[SchedulerLoop, SchedulerClient]) -> None:
    _, client = api
    with pytest.raises(RequestRejected) as e:
        client.submit_compiled('{"query_id": "q", "tasks": [')
    assert e.value.status == 400
    assert "body is not a compiled query" in e.value.diagnostics[0]["message"]


def test_structurally_bad_query_is_400_with_every_problem(
        api: tuple[SchedulerLoop, SchedulerClient]) -> None:
    _, client = api
    d = json.loads(chain_query("q", 2).to_json())
    d["channels"] = []
    d["tasks"][1]["task_id"] = "q.t0"
    with pytest.raises(RequestRejected) as e:
        client.submit_compiled(json.dumps(d))
    messages = [x["message"] for x in e.value.diagnostics]
    assert e.value.status == 400
    assert "task id q.t0 appears 2 times" in messages
    assert "task q.t0 uses unknown channel q/s0" in messages


def test_bad_xml_is_400_with_positions(api: tuple[SchedulerLoop, SchedulerClient],
                                       tmp_path) -> None:
    _, client = api
    spec = tmp_path / "broken.xml"
    spec.write_text('<dataflow name="x">\n  <operator name="a" type="no-such-op"/>\n'
                    '  <operator name="b" type="filter">\n</dataflow>\n')
    with pytest.raises(RequestRejected) as e:
        client.submit_spec(spec)
    assert e.value.status == 400 and e.value.diagnostics
    assert all(d["file"] == str(spec) and d["line"] >= 1 for d in e.value.diagnostics)


def test_unknown_query_is_404(api: tuple[SchedulerLoop, SchedulerClient]) -> None:
    _, client = api
    for call in (lambda: client.status("nope"), lambda: client.stop("nope")):
        with pytest.raises(RequestRejected) as e:
            call()
        assert e.value.status == 404 and "no query nope" in e.value.message
    with pytest.raises(RequestRejected) as e:
        client._call("GET", "/nowhere")
    assert e.value.status == 404


def test_submit_status_stop_and_bad_input_leaves_queries_alone(
        api: tuple[SchedulerLoop, SchedulerClient]) -> None:
    loop, client = api
    assert client.submit_compiled(chain_query("good", 2).to_json())["query_id"] == "good"
    with pytest.raises(RequestRejected) as e:
        client.submit_compiled(chain_query("good", 2).to_json())
    assert e.value.status == 409
    with pytest.raises(RequestRejected):
        client.submit_compiled("{not json")
    view = client.status("good")
    assert view["phase"] == "active" and [t["state"] for t in view["tasks"]] == ["pending"] * 2
    assert [q["query_id"] for q in client.status()["queries"]] == ["good"]
    assert client.stop("good")["query_id"] == "good"
    assert client.status("good")["phase"] == "stopped"
    assert loop.status()["queries"]["good"]["phase"] == "stopped"


def test_client_says_clearly_when_no_scheduler_listens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SchedulerClient(f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(SchedulerUnavailable) as e:
        client.status()
    assert f"no scheduler at http://127.0.0.1:{port}" in str(e.value)
    assert not client.healthy()


def test_an_illegal_transition_is_logged_and_the_loop_keeps_serving(
        api: tuple[SchedulerLoop, SchedulerClient]) -> None:
    from scheduler.events import StatusUpdated

    loop, client = api
    client.submit_compiled(chain_query("q", 1).to_json())
    loop.put(StatusUpdated("odd", "q.t0.a1", "RUNNING", agent_id="a1"))  # never launched
    client.stop("q")  # answered after the odd event: the loop is still alive
    assert client.status("q")["phase"] == "stopped"


def test_a_token_guards_submit_and_stop_but_not_reads() -> None:
    loop = SchedulerLoop(tick_interval=0.05).start()
    server = ApiServer(loop, token="s3cret-token").start()
    try:
        anonymous = SchedulerClient(server.url, timeout=10)
        wrong = SchedulerClient(server.url, timeout=10, token="guess")
        right = SchedulerClient(server.url, timeout=10, token="s3cret-token")
        for client in (anonymous, wrong):
            with pytest.raises(RequestRejected) as refused:
                client.submit_compiled(chain_query("q", 1).to_json())
            assert refused.value.status == 401 and "Authorization: Bearer" in refused.value.message
        assert anonymous.status() == {"queries": []}  # reads stay open
        assert right.submit_compiled(chain_query("q", 1).to_json())["query_id"] == "q"
        with pytest.raises(RequestRejected) as refused:
            wrong.stop("q")
        assert refused.value.status == 401
        assert right.stop("q")["query_id"] == "q"
    finally:
        server.stop()
        loop.stop()


def test_token_check() -> None:
    from scheduler.api import token_allows

    assert token_allows(None, "")
    assert token_allows("t", "Bearer t") and token_allows("t", "bearer  t ")
    assert not token_allows("t", "") and not token_allows("t", "Bearer u")
    assert not token_allows("t", "Basic t")
