"""The scale route `POST /queries/{q}/operators/{op}/scale` (issue 12): its body parsing, pure,
then over real HTTP on 127.0.0.1 with the real event loop and state (no Mesos: launches are
dropped, the query is made running by feeding the loop the offers and status updates Mesos
would send) and the client `elastiq scale` uses; a seeded, bounded fuzz of bodies and paths
never gets a 500 and every refusal is a JSON error with a message."""

from __future__ import annotations

import http.client
import json
import random
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from common.api_client import RequestRejected, SchedulerClient
from scheduler.api import ApiError, ApiServer, scale_parallelism
from common.messages import ControlAck
from scheduler.events import (ControlAcknowledged, ControlRequested, OffersReceived, Registered,
                              StatusUpdated)
from scheduler.config import SchedulerConfig
from scheduler.loop import Reply, SchedulerLoop, new_stimulus_id
from scheduler.testing import offer
from tests.spec_snippets import SINK, SOURCE, dataflow
from testkit.waiting import wait_for

pytestmark = pytest.mark.usefixtures("scheduler_path_roots")

TOKEN = "elastic-token-0123456789"
SPEC = dataflow(
    SOURCE
    + '  <operator name="f" type="filter" parallelism="1" max-parallelism="3">\n'
      '    <input name="raw"/>\n    <param name="condition" value="raw.temp &gt; 20"/>\n'
      '    <output name="hot"/>\n  </operator>\n'
    + '  <operator name="w" type="pattern" parallelism="2">\n    <input name="hot"/>\n'
      '    <param name="time" value="ts"/>\n    <param name="partition-by" value="sensor"/>\n'
      '    <param name="pattern" value="A B+"/>\n    <param name="within" value="10 seconds"/>\n'
      '    <define name="B" value="temp &gt; prev(temp)"/>\n'
      '    <field name="rises" value="count(B)"/>\n    <output name="agg"/>\n  </operator>\n'
    + SINK.format(stream="agg"), name="el")


# --- the body, pure -------------------------------------------------------------------------------

@pytest.mark.parametrize("body, value", [
    (b'{"parallelism": 3}', 3), (b'{"parallelism": 1, "other": "x"}', 1),
    (b' {"parallelism" : 0} ', 0),  # the catalogue checks the bounds, not the body
    (b'{"parallelism": -2}', -2),
])
def test_a_whole_number_is_read_from_the_body(body: bytes, value: int) -> None:
    assert scale_parallelism(body) == value


@pytest.mark.parametrize("body", [
    b'{"parallelism": true}', b'{"parallelism": false}', b'{"parallelism": 2.0}',
    b'{"parallelism": 2.5}', b'{"parallelism": "2"}', b'{"parallelism": null}',
    b'{"parallelism": [2]}', b'{"parallelism": {"n": 2}}', b"{}", b"", b"[2]", b"2",
    b'"parallelism"', b"{", b"not json", b"\xff\xfe", b'{"parallelism": NaN}',
    b'{"parallelism": Infinity}', b'{"parallelism": 1e400}', b'{"Parallelism": 2}',
    b'{"parallelism": ' + b"9" * 5000 + b"}",
], ids=lambda b: repr(b[:30]))
def test_anything_but_a_whole_number_is_a_400_saying_what_to_send(body: bytes) -> None:
    with pytest.raises(ApiError) as refused:
        scale_parallelism(body)
    assert refused.value.status == 400
    assert '{"parallelism": N}' in refused.value.message


# --- over HTTP ------------------------------------------------------------------------------------

class Scheduler(SchedulerLoop):
    """The real loop and state, with the control request the service forwards to it (what
    `SchedulerService.control` does, without leadership fencing, which has its own tests)."""

    def control(self, query_id: str, tuples: list[tuple[str, str, str]],
                timeout: float = 10.0) -> Reply:
        sid = new_stimulus_id("control")
        return self.request(ControlRequested(sid, query_id, tuple(tuples)), timeout)


def request(server: ApiServer, method: str, target: str, body: bytes | None = None,
            token: str | None = TOKEN) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def refusal(status: int, headers: dict[str, str], body: bytes) -> str:
    """A refusal's message, checking it is a 4xx JSON error that says something."""
    assert 400 <= status < 500, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), headers
    reply = json.loads(body)
    assert isinstance(reply["error"], str) and reply["error"].strip(), reply
    assert isinstance(reply["diagnostics"], list)
    return reply["error"]


def tasks_of(loop: SchedulerLoop, query_id: str) -> dict[str, dict[str, Any]]:
    status = loop.query_status(query_id) or {}
    return {t["task_id"]: t for t in status.get("tasks", [])}


@contextmanager
def started(tmp_path: Path, config: SchedulerConfig | None = None
            ) -> Iterator[tuple[Scheduler, ApiServer, SchedulerClient]]:
    """Query `el` submitted over HTTP and running on agents a1..a3 (its filter on one of
    three slots, which run apart)."""
    loop = Scheduler(config, tick_interval=0.05).start()
    server = ApiServer(loop, token=TOKEN).start()
    client = SchedulerClient(server.url, timeout=10, token=TOKEN)
    try:
        spec = tmp_path / "el.xml"
        spec.write_text(SPEC)
        assert client.submit_spec(spec, query_id="el")["query_id"] == "el"
        loop.put(Registered("r", "fw-1", "m:5050"))
        loop.put(OffersReceived("o", tuple(offer(f"o-{a}", a, cpus=16.0, mem_mb=65536.0)
                                           for a in ("a1", "a2", "a3"))))  # slots run apart
        staged = wait_for("the first launch", lambda: [
            (t["mesos_task_id"], t["agent_id"]) for t in tasks_of(loop, "el").values()
            if t["state"] == "staging"], timeout=10)
        for mid, agent in staged:
            loop.put(StatusUpdated("u", mid, "RUNNING", "", "", agent, f"elastiq-exec-{agent}",
                                   "SOURCE_EXECUTOR"))
        wait_for("the query running", lambda: (loop.query_status("el") or {}).get("status")
                 == "running", timeout=10)
        yield loop, server, client
    finally:
        server.stop()
        loop.stop()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Scheduler, ApiServer, SchedulerClient]]:
    with started(tmp_path) as stack:
        yield stack


def slot_states(loop: SchedulerLoop) -> list[str]:
    (view,) = [e for e in (loop.query_status("el") or {})["elastic"] if e["operator"] == "f"]
    return [s["state"] for s in view["slots"]]


def test_scaling_over_http_sends_the_request_and_wakes_the_slots(
        running: tuple[Scheduler, ApiServer, SchedulerClient]) -> None:
    loop, server, client = running
    assert slot_states(loop) == ["running", "dormant", "dormant"]
    reply = client.scale("el", "f", 3)
    assert reply["state"] == "pending" and reply["tuples"] == [["f", "parallelism", "3"]]
    assert reply["request"] and "control" in reply["message"]
    assert slot_states(loop) == ["running", "pending", "pending"]
    with pytest.raises(RequestRejected) as busy:  # one request at a time
        client.scale("el", "f", 2)
    assert busy.value.status == 409 and "still being applied" in busy.value.message
    view = client.control_status("el", reply["request"])
    assert view["state"] == "pending"


@pytest.mark.parametrize("target, body, status, words", [
    ("/queries/el/operators/f/scale", b'{"parallelism": 4}', 400, "4 is outside 1..3"),
    ("/queries/el/operators/f/scale", b'{"parallelism": 0}', 400, "0 is outside 1..3"),
    ("/queries/el/operators/f/scale", b'{"parallelism": "2"}', 400, '{"parallelism": N}'),
    ("/queries/el/operators/f/scale", b"", 400, '{"parallelism": N}'),
    ("/queries/el/operators/w/scale", b'{"parallelism": 1}', 400, "state"),
    ("/queries/el/operators/sink/scale", b'{"parallelism": 1}', 400, "parallelism"),
    ("/queries/el/operators/nope/scale", b'{"parallelism": 1}', 404, "no operator 'nope'"),
    ("/queries/other/operators/f/scale", b'{"parallelism": 1}', 404, "no query other"),
])
def test_a_scale_the_query_cannot_take_is_refused_with_what_to_fix(
        running: tuple[Scheduler, ApiServer, SchedulerClient], target: str, body: bytes,
        status: int, words: str) -> None:
    loop, server, _ = running
    got, headers, reply = request(server, "POST", target, body)
    assert got == status and words in refusal(got, headers, reply), reply
    assert slot_states(loop) == ["running", "dormant", "dormant"]  # nothing changed
    assert (loop.query_control("el") or {})["version"] == 0


@pytest.mark.parametrize("method, status", [("GET", 404), ("PUT", 405), ("DELETE", 405)])
def test_the_scale_route_takes_post_only(running: tuple[Scheduler, ApiServer, SchedulerClient],
                                         method: str, status: int) -> None:
    _, server, _ = running
    got, headers, reply = request(server, method, "/queries/el/operators/f/scale",
                                  b'{"parallelism": 2}')
    assert got == status and "no route" in refusal(got, headers, reply)
    got, headers, reply = request(server, "POST", "/queries/el/operators/f/scale",
                                  b'{"parallelism": 2}', token=None)
    assert got == 401


class ScaleCommand(threading.Thread):
    """`elastiq scale el f 3` run in a thread against the test's API; `code` once it ends."""

    def __init__(self, url: str, token: Path, timeout: int) -> None:
        super().__init__()
        self.args = ["scale", "el", "f", "3", "--timeout", str(timeout), "--scheduler", url,
                     "--token-file", str(token)]
        self.code: int | None = None

    def run(self) -> None:
        from elastiq.cli import main

        self.code = main(self.args)


def scale_in_background(server: ApiServer, tmp_path: Path, timeout: int) -> ScaleCommand:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    command = ScaleCommand(server.url, token, timeout)
    command.start()
    return command


def pending_rescale(loop: Scheduler) -> str:
    """The id of the rescale request the scheduler holds pending for el."""
    return wait_for("the scale request", lambda: next(
        (r["request"] for e in (loop.query_status("el") or {})["elastic"]
         for r in e["rescales"] if r["state"] == "pending"), None), timeout=10)


def test_elastiq_scale_prints_the_switch_the_slots_and_the_pause(
        running: tuple[Scheduler, ApiServer, SchedulerClient], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`elastiq scale el f 3` against the real API: it waits until the splitter acknowledged
    and the new instances run, fed here with the offers, status updates and acknowledgement
    Mesos and the executor would send, then prints each slot and the splitters' pause."""
    loop, server, _ = running
    cli = scale_in_background(server, tmp_path, 30)
    try:
        request = pending_rescale(loop)
        loop.put(OffersReceived("o2", tuple(offer(f"o2-{a}", a, cpus=16.0, mem_mb=65536.0)
                                            for a in ("a2", "a3"))))
        staged = wait_for("the new instances", lambda: [
            (t["mesos_task_id"], t["agent_id"]) for t in tasks_of(loop, "el").values()
            if t["state"] == "staging"], timeout=10)
        for mid, agent in staged:
            loop.put(StatusUpdated("u", mid, "RUNNING", "", "", agent, f"elastiq-exec-{agent}",
                                   "SOURCE_EXECUTOR"))
        splitter = tasks_of(loop, "el")["el.t0"]
        loop.put(ControlAcknowledged("a", splitter["agent_id"], "elastiq-exec-a1", ControlAck(
            splitter["mesos_task_id"], request, 1, True, 4, 0.25, "", 1.0)))
    finally:
        cli.join(40)
    assert cli.code == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert f"scale el.f to 3 instances (control {request})" in out
    assert "from micro-batch 4 (query paused 0.25 s)" in out
    for slot in (1, 2, 3):
        assert f"slot {slot}: el.t{slot} running" in out
    assert "f runs 3 instances, splitters paused 0.25 s" in out


# --- fuzz -----------------------------------------------------------------------------------------

def fuzz_body(rng: random.Random) -> bytes:
    value = rng.choice([None, True, False, 0, 1, 2, 3, 4, -1, 2.0, 1.5, 10 ** 30, "2", "",
                        "x" * rng.randint(0, 40), [], {}, [2], {"n": 2}, "\u0000"])
    kind = rng.randrange(6)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 120)))
    if kind == 1:
        return json.dumps({"parallelism": value}).encode()
    if kind == 2:
        return json.dumps({rng.choice(["parallelism", "Parallelism", "", "to"]): value,
                           rng.choice(["x", "tuples"]): value}).encode()
    if kind == 3:
        text = json.dumps({"parallelism": value}).encode()
        return text[:rng.randint(0, len(text))]
    if kind == 4:
        return json.dumps(value).encode()
    return b""


def fuzz_target(rng: random.Random) -> str:
    words = ["queries", "el", "other", "operators", "f", "w", "sink", "src", "nope", "scale",
             "control", "%2F", "%00", "..", "%E9", "%", "f%2Fscale", "x" * rng.randint(1, 200)]
    shape = rng.randrange(3)
    if shape == 0:  # the route's shape, with random words in its places
        parts = ["queries", rng.choice(words), "operators", rng.choice(words), "scale"]
        parts = [p if rng.random() < 0.8 else rng.choice(words) for p in parts]
    elif shape == 1:  # the route itself, a word too many or too few
        parts = ["queries", "el", "operators", "f", "scale", "x"][:rng.randint(3, 6)]
    else:
        parts = [rng.choice(words) for _ in range(rng.randint(0, 7))]
    return "/" + "/".join(parts) + ("?" + rng.choice(["a=b", "parallelism=2", "%zz"])
                                    if rng.random() < 0.1 else "")


def test_fuzzed_scale_requests_never_get_a_500_and_every_refusal_says_why(
        running: tuple[Scheduler, ApiServer, SchedulerClient]) -> None:
    """Seeded and bounded: random methods, paths shaped like the scale route and bodies; every
    answer is below 500, every refusal a JSON error with a message; the query keeps running
    and the scheduler keeps answering."""
    loop, server, _ = running
    rng = random.Random(20261124)
    statuses: dict[int, int] = {}
    for _ in range(300):
        method = rng.choice(["POST"] * 6 + ["GET", "PUT", "DELETE", "PATCH"])
        target = fuzz_target(rng)
        body = fuzz_body(rng)
        try:
            status, headers, reply = request(server, method, target, body)
        except http.client.InvalidURL:
            continue
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, (method, target, body, reply[:300])
        if status >= 400:
            refusal(status, headers, reply)
    assert {400, 404, 405} <= set(statuses), statuses  # the fuzz reached many answers
    assert (loop.query_status("el") or {})["phase"] == "active"
    assert slot_states(loop)[0] == "running"
    assert request(server, "GET", "/queries/el")[0] == 200


def test_elastiq_scale_says_what_a_slot_still_waits_for_when_it_gives_up(
        running: tuple[Scheduler, ApiServer, SchedulerClient], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Only offers too small for the new instances come: the command ends after its timeout,
    and each pending slot's line says what the scheduler waits for."""
    loop, server, _ = running
    cli = scale_in_background(server, tmp_path, 3)
    try:
        pending_rescale(loop)
        loop.put(OffersReceived("tiny", tuple(offer(f"tiny-{a}", a, cpus=0.01, mem_mb=8.0)
                                              for a in ("a2", "a3"))))
    finally:
        cli.join(40)
    code = cli.code
    captured = capsys.readouterr()
    assert code == 1 and "not acknowledged after 3 s" in captured.err  # the splitters wait
    pending = [line for line in captured.out.splitlines() if "pending" in line]
    assert len(pending) == 2 and all("(waiting for " in line for line in pending), captured.out


def test_the_scale_command_says_where_a_stateful_rescale_handed_over() -> None:
    from elastiq.control_cli import switch_line

    assert switch_line(None) is None and switch_line({"switch_ms": None}) is None
    assert switch_line({"switch_ms": -1.0}) is None  # stateless: at a micro-batch
    line = switch_line({"switch_ms": 1_704_067_212_000.0})
    assert line is not None and "event time 2024-01-01T00:00:12.000+00:00" in line


def test_a_scale_out_with_no_room_is_undone_after_the_wait_and_says_why(tmp_path: Path
                                                                        ) -> None:
    """With `scale_out_wait` at 2 s and only offers too small for the new instances, the
    scale-out is refused after the wait with what each new slot waited for, the parallelism is
    back at 1 with both slots asleep, and the query takes a rescale again."""
    with started(tmp_path, SchedulerConfig(scale_out_wait=2.0)) as (loop, server, client):
        assert client.scale("el", "f", 3)["request"]
        pending_rescale(loop)
        loop.put(OffersReceived("tiny", tuple(offer(f"tiny-{a}", a, cpus=0.01, mem_mb=8.0)
                                              for a in ("a2", "a3"))))

        def elastic() -> dict[str, Any]:
            (e,) = [e for e in (loop.query_status("el") or {})["elastic"]
                    if e["operator"] == "f"]
            return e
        undone = wait_for("the scale-out refused", lambda: next(
            (r for r in elastic()["rescales"] if r["state"] == "refused"), None), timeout=30)
        assert "did not run within 2 s" in undone["reason"], undone
        assert undone["reason"].count(" waits for ") == 2, undone
        assert elastic()["parallelism"] == 1, elastic()
        assert slot_states(loop) == ["running", "dormant", "dormant"]
        assert client.scale("el", "f", 2)["request"]

