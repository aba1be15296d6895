"""The scheduler's HTTP API over real HTTP on 127.0.0.1, with a real event loop and state (no
Mesos connection: launch commands are dropped), and the client the CLI uses. Queries are
submitted as specs (the only way the API takes one); the security gate has its own tests in
tests/test_api_security.py."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

from common.api_client import RequestRejected, SchedulerClient, SchedulerUnavailable
from scheduler.api import ApiServer
from scheduler.loop import SchedulerLoop
from scheduler.testing import chain_query
from spec_snippets import dataflow

# the scheduler compiles clients' specs inside its configured roots: this test's folder
pytestmark = pytest.mark.usefixtures("scheduler_path_roots")

TOKEN = "test-token-0123456789"


SPECS = Path(__file__).parent / "specs"


def spec_file(tmp_path: Path, name: str) -> Path:
    """A valid one-task spec: a generator, a filter and a file sink."""
    path = tmp_path / f"{name}.xml"
    path.write_text(dataflow(
        '  <operator name="src" type="generator">\n    <param name="shape" value="sensor"/>\n'
        '    <output name="raw" type="reading"/>\n  </operator>\n'
        '  <operator name="warm" type="filter">\n    <input name="raw"/>\n'
        '    <param name="condition" value="raw.temp &gt; 25"/>\n'
        '    <output name="hot"/>\n  </operator>\n'
        '  <operator name="sink" type="file-sink">\n    <input name="hot"/>\n'
        '    <param name="path" value="out.jsonl"/>\n  </operator>\n', name=name))
    return path


@pytest.fixture
def api() -> Iterator[tuple[SchedulerLoop, SchedulerClient]]:
    loop = SchedulerLoop(tick_interval=0.05).start()
    server = ApiServer(loop, token=TOKEN).start()
    try:
        yield loop, SchedulerClient(server.url, timeout=10, token=TOKEN)
    finally:
        server.stop()
        loop.stop()


def test_healthz(api: tuple[SchedulerLoop, SchedulerClient]) -> None:
    _, client = api
    assert client.healthy()
    assert client._call("GET", "/healthz") == {"ok": True, "connected": False,
                                               "framework_id": None}


def test_a_query_the_admission_check_refuses_is_400_with_every_problem() -> None:
    """The service's own check (a compiled query the compiler would never make): every
    problem in the reply."""
    loop = SchedulerLoop(tick_interval=0.05).start()
    try:
        q = chain_query("q", 2)
        bad = type(q)(q.query_id, (q.tasks[0], q.tasks[0]), (), q.sinks)
        reply = loop.submit(bad)
        assert not reply.accepted and reply.status == 400
        messages = reply.message.split("; ")
        assert "task id q.t0 appears 2 times" in messages
        assert "task q.t0 uses unknown channel q/s0" in messages
        assert loop.status()["queries"] == {}
    finally:
        loop.stop()


def test_bad_xml_is_400_with_positions(api: tuple[SchedulerLoop, SchedulerClient],
                                       tmp_path) -> None:
    loop, client = api
    spec = tmp_path / "broken.xml"
    spec.write_text('<dataflow name="x">\n  <operator name="a" type="no-such-op"/>\n'
                    '  <operator name="b" type="filter">\n</dataflow>\n')
    with pytest.raises(RequestRejected) as e:
        client.submit_spec(spec)
    assert e.value.status == 400 and e.value.diagnostics
    assert all(d["file"] == str(spec) and d["line"] >= 1 for d in e.value.diagnostics)
    assert loop.status()["queries"] == {}


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
        api: tuple[SchedulerLoop, SchedulerClient], tmp_path: Path) -> None:
    loop, client = api
    spec = SPECS / "e2e-pipelined.xml"  # two tasks
    assert client.submit_spec(spec, query_id="good")["query_id"] == "good"
    with pytest.raises(RequestRejected) as e:
        client.submit_spec(spec, query_id="good")
    assert e.value.status == 409
    with pytest.raises(RequestRejected) as e:
        client._call("POST", "/queries", b"<dataflow", {"Content-Type": "application/xml"})
    assert e.value.status == 400
    view = client.status("good")
    assert view["phase"] == "active" and len(view["tasks"]) == 2
    assert {t["state"] for t in view["tasks"]} == {"pending"}
    assert [q["query_id"] for q in client.status()["queries"]] == ["good"]
    assert client.stop("good")["query_id"] == "good"
    assert client.status("good")["phase"] == "stopped"
    assert loop.status()["queries"]["good"]["phase"] == "stopped"


def test_submit_keeps_the_source_it_was_compiled_from(
        api: tuple[SchedulerLoop, SchedulerClient], tmp_path: Path) -> None:
    """What a leader persists is the spec and how it was compiled, never the programs."""
    from scheduler.query_source import compile_source

    loop, client = api
    spec = spec_file(tmp_path, "kept")
    assert client.submit_spec(spec, query_id="kept-1")["query_id"] == "kept-1"
    record = loop.state.queries["kept-1"]
    assert record.source is not None
    assert record.source.spec_bytes() == spec.read_bytes()
    assert (record.source.filename, record.source.query_id, record.source.base_dir) == \
        (str(spec), "kept-1", str(tmp_path))
    assert compile_source(record.source).to_json() == record.query.to_json()


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
        api: tuple[SchedulerLoop, SchedulerClient], tmp_path: Path) -> None:
    from scheduler.events import StatusUpdated

    loop, client = api
    client.submit_spec(spec_file(tmp_path, "q"))
    task = client.status("q")["tasks"][0]["task_id"]
    loop.put(StatusUpdated("odd", f"{task}.a1", "RUNNING", agent_id="a1"))  # never launched
    client.stop("q")  # answered after the odd event: the loop is still alive
    assert client.status("q")["phase"] == "stopped"


def test_a_token_guards_every_route_but_health_and_metrics(tmp_path: Path) -> None:
    loop = SchedulerLoop(tick_interval=0.05).start()
    server = ApiServer(loop, token="s3cret-token").start()
    try:
        anonymous = SchedulerClient(server.url, timeout=10)
        wrong = SchedulerClient(server.url, timeout=10, token="guess")
        right = SchedulerClient(server.url, timeout=10, token="s3cret-token")
        spec = spec_file(tmp_path, "q")
        for client in (anonymous, wrong):
            for call in (lambda: client.submit_spec(spec), client.status,
                         lambda: client.status("q"), lambda: client.stop("q")):
                with pytest.raises(RequestRejected) as refused:
                    call()
                assert refused.value.status == 401
                assert "Authorization: Bearer" in refused.value.message
                assert "ELASTIQ_TOKEN_FILE" in refused.value.message
        assert anonymous.healthy()
        assert loop.status()["queries"] == {}
        assert right.submit_spec(spec)["query_id"] == "q"
        assert [q["query_id"] for q in right.status()["queries"]] == ["q"]
        assert right.stop("q")["query_id"] == "q"
    finally:
        server.stop()
        loop.stop()


def test_token_check() -> None:
    from scheduler.api import token_allows

    assert not token_allows("", "") and not token_allows("", "Bearer ")
    assert token_allows("t", "Bearer t") and token_allows("t", "bearer  t ")
    assert not token_allows("t", "") and not token_allows("t", "Bearer u")
    assert not token_allows("t", "Basic t") and not token_allows("t", "Bearer t2")


def test_the_api_cannot_be_made_without_a_token() -> None:
    loop = SchedulerLoop()
    with pytest.raises(TypeError):
        ApiServer(loop)  # type: ignore[call-arg]
    for token in ("", "  ", " padded "):
        with pytest.raises(ValueError):
            ApiServer(loop, token=token)
