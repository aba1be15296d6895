"""End to end on the embedded cluster: specs compiled, placed by the framework scheduler on two
agents, run by real executors (`python -m executor`, one SparkSession each), tuples crossing real
ZeroMQ channels between executors, real SIGKILLs; every sink is checked against an oracle computed
in plain Python from the same deterministic input (`executor.shapes.reference_row`).

One module-scoped stack serves every test: 2 agents of 1.5 cpus; a stateless task asks 0.5, a
stateful one 1.0, and a new executor 0.5 (the embedded master does not account a running
executor's share, so a warm agent offers all 1.5 to tasks). The three-task query (2.0 cpus) must
therefore spread over both agents. Queries run one group at a time and each group stops its
queries to give the room back. Helpers and
oracles live in testkit/e2e_support.py, specs in tests/specs/.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import zmq

from testkit.e2e_support import (SPECS, Row, Stack, compile_spec, generator_rows, java_child,
                                 join_oracle, port_free, read_sink, session_members, sink_path,
                                 source_runner_pids,
                                 session_oracle, spec_params, module_stack, stop_query,
                                 submit, wait_for_sink,
                                 wait_running, wait_until, window_oracle)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]
log = logging.getLogger("tests.e2e")
SECOND = timedelta(seconds=1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from module_stack(tmp_path_factory.mktemp("e2e-stack"), "e2e")


# --- oracles of each spec ------------------------------------------------------------------------

def trades_of(spec: str) -> list[Row]:
    """The `notional` projection of e2e-multi's ticks, in plain Python."""
    return [{"symbol": r["symbol"], "ts": r["ts"], "price": r["price"], "volume": r["volume"],
             "notional": r["price"] * r["volume"]}
            for r in generator_rows(spec_params(spec)["ticks"])]


TRADE_COLUMNS = ("symbol", "ts", "price", "volume", "notional")
MOVING_KEY = ("window_start", "window_end", "symbol", "trades", "volume")


def big_trades_oracle(spec: str) -> Counter:
    return Counter(tuple(t[c] for c in TRADE_COLUMNS) for t in trades_of(spec)
                   if t["notional"] >= 120000)


def moving_oracle(spec: str) -> tuple[Counter, dict[tuple, float]]:
    """Exact parts of each sliding-window row (as a multiset) and each window's average price."""
    windows = window_oracle(trades_of(spec), "ts", ["symbol"], 4 * SECOND, SECOND, SECOND)
    exact, averages = Counter(), {}
    for (start, symbol), rows in windows.items():
        key = (start, start + 4 * SECOND, symbol, len(rows), sum(r["volume"] for r in rows))
        exact[key] += 1
        averages[key] = sum(r["price"] for r in rows) / len(rows)
    return exact, averages


def check_multi_sinks(base: Path, spec: str, timeout: float) -> None:
    """Both sinks of an e2e-multi query equal the oracle: nothing missing, nothing twice."""
    big = sink_path(base, spec, "alerts")
    wait_for_sink(big, big_trades_oracle(spec), lambda r: tuple(r[c] for c in TRADE_COLUMNS),
                  timeout, "the big-trades sink (filter task) to equal the oracle")
    exact, averages = moving_oracle(spec)
    moving = sink_path(base, spec, "moving")
    wait_for_sink(moving, exact, lambda r: tuple(r[c] for c in MOVING_KEY), timeout,
                  "the moving-averages sink (sliding window task) to equal the oracle")
    for row in read_sink(moving):
        key = tuple(row[c] for c in MOVING_KEY)
        assert row["avg_price"] == pytest.approx(averages[key], rel=1e-12), key


def running_query(stack: Stack, spec: str, base: Path, query_id: str | None = None) -> Any:
    query = compile_spec(spec, base, query_id)
    submit(stack, query)
    wait_running(stack, query.query_id)
    return query


# --- 1. operators, each against its oracle -------------------------------------------------------

OPERATOR_SPECS = ("e2e-filter-project.xml", "e2e-union.xml", "e2e-tumbling.xml")


@pytest.fixture(scope="class")
def operator_queries(stack: Stack, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[dict[str, Path]]:
    """Three single-task queries submitted together (2.0 cpus of tasks: the whole cluster)."""
    bases = {spec: tmp_path_factory.mktemp(spec.removesuffix(".xml")) for spec in OPERATOR_SPECS}
    queries = [compile_spec(spec, base) for spec, base in bases.items()]
    try:
        for query in queries:
            submit(stack, query)
        for query in queries:
            wait_running(stack, query.query_id, timeout=120)
        yield bases
    finally:
        for query in queries:
            stop_query(stack, query.query_id)


@pytest.mark.usefixtures("operator_queries")
class TestOperators:
    @pytest.mark.timeout(240)
    def test_filter_then_projection_with_computed_columns(
            self, operator_queries: dict[str, Path]) -> None:
        spec = "e2e-filter-project.xml"
        rows = generator_rows(spec_params(spec)["src"])
        expected = Counter((r["sensor"], r["ts"], r["temp"] * 1.8 + 32, r["humidity"] - r["temp"])
                           for r in rows if r["temp"] > 25 and r["sensor"] != "s-3")
        assert 0 < sum(expected.values()) < len(rows)  # the filter really drops some rows
        sink = sink_path(operator_queries[spec], spec, "sink")
        wait_for_sink(sink, expected, lambda r: (r["sensor"], r["ts"], r["fahrenheit"],
                                                 r["spread"]), 90, "filter + project output")
        assert list(read_sink(sink)[0]) == ["sensor", "ts", "fahrenheit", "spread"]

    @pytest.mark.timeout(120)
    def test_union_of_two_streams(self, operator_queries: dict[str, Path]) -> None:
        spec = "e2e-union.xml"
        params = spec_params(spec)
        both = generator_rows(params["siteA"]) + generator_rows(params["siteB"])
        expected = Counter((r["sensor"], r["ts"], r["temp"], r["humidity"]) for r in both)
        sink = sink_path(operator_queries[spec], spec, "sink")
        wait_for_sink(sink, expected, lambda r: (r["sensor"], r["ts"], r["temp"], r["humidity"]),
                      90, "union output")

    @pytest.mark.timeout(120)
    def test_tumbling_window_aggregate(self, operator_queries: dict[str, Path]) -> None:
        spec = "e2e-tumbling.xml"
        windows = window_oracle(generator_rows(spec_params(spec)["src"]), "ts", ["sensor"],
                                SECOND, SECOND, timedelta(milliseconds=500))
        assert len({k[0] for k in windows}) >= 3  # several windows closed by the watermark
        expected = Counter((start, start + SECOND, sensor, len(rows))
                           for (start, sensor), rows in windows.items())
        sink = sink_path(operator_queries[spec], spec, "sink")
        key: Callable[[Row], tuple] = lambda r: (r["window_start"], r["window_end"], r["sensor"],
                                                 r["readings"])
        wait_for_sink(sink, expected, key, 90, "tumbling window output")
        for row in read_sink(sink):
            members = windows[(row["window_start"], row["sensor"])]
            temps = [m["temp"] for m in members]
            assert row["total_temp"] == pytest.approx(sum(temps), rel=1e-12)
            assert (row["min_temp"], row["max_temp"]) == (min(temps), max(temps))
            assert row["avg_humidity"] == pytest.approx(
                sum(m["humidity"] for m in members) / len(members), rel=1e-12)


@pytest.mark.timeout(150)
def test_windowed_join(stack: Stack, tmp_path: Path) -> None:
    spec = "e2e-join.xml"
    query = running_query(stack, spec, tmp_path)
    try:
        params = spec_params(spec)
        offsets = [{"sensor": r["sensor"], "ts": r["ts"], "offset": r["temp"] - 20.0}
                   for r in generator_rows(params["calib"])]
        joined = join_oracle(generator_rows(params["readings"]), offsets, "sensor", "ts",
                             timedelta(milliseconds=200), "offset")
        columns = ("sensor", "ts", "temp", "humidity", "offset_sensor", "offset_ts", "offset")
        expected = Counter(tuple(r[c] for c in columns) for r in joined)
        assert sum(expected.values()) > 100
        sink = sink_path(tmp_path, spec, "sink")
        wait_for_sink(sink, expected, lambda r: tuple(r[c] for c in columns), 90, "join output")
        assert tuple(read_sink(sink)[0]) == columns
    finally:
        stop_query(stack, query.query_id)


# --- 1, 2 and 3: three tasks on two agents over a real channel; bad input; a killed consumer ----

def kill_mid_stream(sink: Path, expected_rows: int, victim: int, what: str) -> None:
    """SIGKILL `victim` once `sink` has output but at most three quarters of what it will hold
    (the class's query runs from its fixture on, through the tests before this one, and a
    consumer's first micro-batch takes all its channel has spooled: the first output can be
    half the stream; a quarter still to come is what the restart must produce exactly once)."""
    wait_until(lambda: read_sink(sink), 90, f"first output in {sink.name} before killing {what}")
    have = len(read_sink(sink))
    assert have <= expected_rows * 3 / 4, f"too late to kill {what} mid-stream ({have} rows out)"
    os.kill(victim, signal.SIGKILL)
    log.info("e2e: SIGKILLed %s (pid %s) with %s of %s rows out", what, victim, have,
             expected_rows)


def agents_of(stack: Stack, query_id: str) -> dict[str, str]:
    return {t: v["agent_id"] for t, v in stack.tasks(query_id).items()}


def assert_spread(stack: Stack, query_id: str) -> tuple[str, str, str]:
    """The producer (t0) and at least one consumer run on different agents."""
    agents = agents_of(stack, query_id)
    producer, window, alerts = (agents[f"{query_id}.t{i}"] for i in range(3))
    assert len(set(agents.values())) == 2 and {window, alerts} - {producer}, agents
    return producer, window, alerts


def channel_endpoint(stack: Stack, query_id: str) -> str:
    endpoint = stack.tasks(query_id)[f"{query_id}.t0"]["endpoints"][f"{query_id}/trades"]
    assert endpoint.startswith("tcp://127.0.0.1:"), endpoint
    return endpoint


def expect_refusal(sock: zmq.Socket, what: str) -> None:
    """The writer answers a bad frame with an ERROR frame of code BAD_FRAME."""
    from executor.wire import ErrorCode, Kind, decode_header

    assert sock.poll(5000), f"no answer to {what}"
    reply = decode_header(sock.recv_multipart()[0])
    assert (reply.kind, reply.a) == (Kind.ERROR, ErrorCode.BAD_FRAME), (what, reply)


def reader_auth_of(stack: Stack, query_id: str, reader: str, producer: str) -> Any:
    """The CURVE identity of task `reader` towards `producer`'s writer, as the scheduler issued
    it (the test plays a declared reader gone bad: its frames pass the handshake)."""
    from executor.channels.auth import KeyPair, ReaderAuth

    keys = stack.service.loop.state.queries[query_id].keys
    return ReaderAuth(KeyPair(**keys[reader]), keys[producer]["public"])


def dealer(endpoint: str, auth: Any) -> zmq.Socket:
    """A raw DEALER to `endpoint`, a CURVE client with `auth` (None: plain text)."""
    from executor.channels.auth import connect_curve

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if auth is not None:
        connect_curve(sock, auth)
    sock.connect(endpoint)
    return sock


def send_garbage(endpoint: str, channel_id: str, auth: Any) -> None:
    """Garbage frames and a frame of a kind only writers send, each refused with a reason."""
    from executor.wire import Header, Kind, encode_header

    with dealer(endpoint, auth) as sock:
        bad = {"junk bytes": [b"definitely not a frame"],
               "two junk frames": [b"\x00" * 64, b"\xff" * 10],
               "a writer's DATA frame": [encode_header(Header(Kind.DATA, channel_id, 1, 0, 0, 1))],
               "a SUBSCRIBE with a bad magic": [b"XXXX" + encode_header(
                   Header(Kind.SUBSCRIBE, channel_id, -1, 8, 0, 1, "evil"))[4:]]}
        for what, frames in bad.items():
            sock.send_multipart(frames)
            expect_refusal(sock, what)


def send_oversized(endpoint: str, auth: Any) -> None:
    """One frame above the writer's 64 MiB cap (+ slack): ZeroMQ drops that connection."""
    with dealer(endpoint, auth) as sock:
        sock.send(bytes((64 << 20) + (64 << 10) + 1))
        time.sleep(1.0)


def unauthenticated_peer_gets_nothing(endpoint: str, channel_id: str) -> None:
    """A plain-text peer (no CURVE key) is dropped at the handshake: no frame of it reaches the
    writer, so not even an error comes back."""
    from executor.wire import Header, Kind, encode_header

    with dealer(endpoint, None) as sock:
        sock.send(encode_header(Header(Kind.SUBSCRIBE, channel_id, 1, 8, 0, 1, "intruder")),
                  zmq.NOBLOCK)
        assert not sock.poll(1500), "an unauthenticated peer got an answer"


def subscribe_with_wrong_channel(endpoint: str, query_id: str, reader_id: str,
                                 auth: Any) -> None:
    from common.types import Schema
    from executor.channels import ChannelReader, WrongChannel
    from executor.shapes import arrow_schema

    schema = arrow_schema(Schema.of(("symbol", "string"), ("ts", "timestamp")))
    reader = ChannelReader(f"{query_id}/no-such-stream", reader_id, endpoint, schema, auth=auth)
    try:
        with pytest.raises(WrongChannel, match="serves channel"):
            reader.subscribe(timeout=10)
    finally:
        reader.close()


def submit_invalid_spec(stack: Stack) -> None:
    """POST an invalid spec to the scheduler's HTTP API: 400 with every located diagnostic."""
    from common.api_client import RequestRejected

    path = SPECS / "e2e-invalid.xml"
    lines = path.read_text().splitlines()
    line_of = lambda needle: next(i for i, t in enumerate(lines, 1) if needle in t)  # noqa: E731
    with pytest.raises(RequestRejected) as refused:
        stack.client(timeout=10).submit_spec(path)
    assert refused.value.status == 400
    errors = [d for d in refused.value.diagnostics if d["severity"] == "error"]
    located = {(d["line"], "temperature" in d["message"], "nowhere" in d["message"])
               for d in errors}
    assert (line_of("raw.temperature"), True, False) in located, errors
    assert (line_of('"nowhere"'), False, True) in located, errors
    assert all(d["file"].endswith("e2e-invalid.xml") and d["column"] >= 1 for d in errors)
    assert "e2e-invalid" not in stack.service.status()["queries"]


# --- an attacker's attempts while the query runs (docs/security.md) -----------------------------

def code_through_the_api_is_refused(stack: Stack, query_id: str, marker: Path) -> None:
    """The running query's own compiled JSON with every program replaced by one that would
    write `marker`, POSTed with the token under every content type a client (or a browser,
    cross-site) could send: never compiled, never submitted, never run."""
    import http.client
    import json as json_

    evil = json_.loads(stack.service.loop.state.queries[query_id].query.to_json())
    evil["query_id"] = "evil"
    for task in evil["tasks"]:
        task["program"] = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('pwned')\n"
    body = json_.dumps(evil).encode()
    host, port = stack.api.url.removeprefix("http://").split(":")
    for content_type in ("application/json", "text/plain;format=json", "text/plain",
                         "application/xml", "text/xml; charset=utf-8"):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/queries?query_id=evil", body=body,
                     headers={"Content-Type": content_type,
                              "Authorization": f"Bearer {stack.api.token}"})
        status = conn.getresponse().status
        conn.close()
        assert status in (400, 415), (content_type, status)
    assert "evil" not in stack.service.status()["queries"]
    assert not marker.exists()


def unknown_key_gets_nothing(endpoint: str, channel_id: str, producer_public: str) -> None:
    """A CURVE client whose key no reader of the plan owns fails the handshake (ZAP): nothing
    of it reaches the writer, not even an error."""
    from executor.channels.auth import KeyPair, ReaderAuth
    from executor.wire import Header, Kind, encode_header

    with dealer(endpoint, ReaderAuth(KeyPair.generate(), producer_public)) as sock:
        sock.send(encode_header(Header(Kind.SUBSCRIBE, channel_id, 1, 8, 0, 1, "intruder")),
                  zmq.NOBLOCK)
        assert not sock.poll(1500), "a peer with an unknown key got an answer"


def forged_ack_is_refused(endpoint: str, channel_id: str, auth: Any, victim_reader: str) -> None:
    """A declared reader's key acknowledging everything on behalf of another reader: refused as
    UNAUTHORIZED, so the victim's upstream backup is not trimmed (its sink, checked against the
    oracle at the end of the class, loses nothing)."""
    from executor.wire import ErrorCode, Header, Kind, decode_header, encode_header

    with dealer(endpoint, auth) as sock:
        sock.send(encode_header(Header(Kind.ACK, channel_id, 10**9, 10**9, 0, 1, victim_reader)))
        assert sock.poll(5000), "no answer to a forged ACK"
        reply = decode_header(sock.recv_multipart()[0])
        assert (reply.kind, reply.a) == (Kind.ERROR, ErrorCode.UNAUTHORIZED), reply


def idle_and_slow_connections_do_not_starve(stack: Stack, query_id: str) -> None:
    """300 idle connections and 10 slowloris ones to the API and to the master each: both still
    answer while they are open (bounded wait, no threads per connection)."""
    import http.client
    import socket

    opened: list[socket.socket] = []
    targets = [stack.api.url, stack.cluster.master_url]
    try:
        for url in targets:
            host, port = url.removeprefix("http://").split(":")
            for i in range(310):
                s = socket.create_connection((host, int(port)), timeout=5)
                if i >= 300:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                opened.append(s)
        assert stack.client(timeout=20).status(query_id)["query_id"] == query_id
        host, port = stack.cluster.master_url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=20)
        conn.request("GET", "/version")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        for s in opened:
            s.close()


def internal_routes_are_closed(stack: Stack, marker: Path) -> None:
    """The embedded agent's internal command route without the cluster secret: 401, nothing
    runs."""
    import http.client
    import json as json_

    agent = stack.cluster.agents[0]
    host, port = agent.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/internal/command", body=json_.dumps(
        {"type": "LAUNCH", "command": f"touch {marker}"}).encode(),
        headers={"Content-Type": "application/json"})
    assert conn.getresponse().status == 401
    conn.close()
    assert not marker.exists()


MULTI = "e2e-multi.xml"


@dataclass(frozen=True)
class MultiRun:
    """The class's query, its folder, and each task's (attempt, restarts) once both sinks wrote:
    a launch that found its channel port taken (a shared machine: the other test stream binds
    ports too) is relaunched before that, and is no effect of what the tests do later."""
    query: Any
    base: Path
    started: dict[str, tuple[int, int]]


def attempts_and_restarts(stack: Stack, qid: str) -> dict[str, tuple[int, int]]:
    return {task_id: (t["attempt"], t["figures"].get("restarts", 0))
            for task_id, t in stack.tasks(qid).items()}


@pytest.fixture(scope="class")
def multi(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiRun]:
    """One run of the three-task query shared by the tests of the class, in order: placement,
    bad input while it runs, a killed consumer, and finally its sinks against the oracle."""
    base = tmp_path_factory.mktemp("e2e-multi")
    query = compile_spec(MULTI, base)
    submit(stack, query)
    try:
        wait_running(stack, query.query_id, timeout=120)
        sinks = [sink_path(base, MULTI, op) for op in ("alerts", "moving")]
        wait_until(lambda: all(read_sink(sink) for sink in sinks), 120, "both sinks to write")
        yield MultiRun(query, base, attempts_and_restarts(stack, query.query_id))
    finally:
        stop_query(stack, query.query_id)


class TestThreeTasksOnTwoAgents:
    @pytest.mark.timeout(150)
    def test_producer_and_a_consumer_run_on_different_agents(self, stack: Stack,
                                                             multi: MultiRun) -> None:
        query = multi.query
        qid = query.query_id
        assert [t.task_id for t in query.tasks] == [f"{qid}.t0", f"{qid}.t1", f"{qid}.t2"]
        assert [(c.producer, c.consumers) for c in query.channels] == [
            (f"{qid}.t0", (f"{qid}.t1", f"{qid}.t2"))]
        assert_spread(stack, qid)
        channel_endpoint(stack, qid)

    @pytest.mark.timeout(60)
    def test_bad_input_is_refused_and_the_query_carries_on(self, stack: Stack,
                                                           multi: MultiRun) -> None:
        qid = multi.query.query_id
        endpoint = channel_endpoint(stack, qid)
        from executor.runtime import channel_reader_id

        auth = reader_auth_of(stack, qid, f"{qid}.t1", f"{qid}.t0")
        unauthenticated_peer_gets_nothing(endpoint, f"{qid}/trades")
        send_garbage(endpoint, f"{qid}/trades", auth)
        send_oversized(endpoint, auth)
        send_garbage(endpoint, f"{qid}/trades", auth)  # the writer still answers after the drop
        subscribe_with_wrong_channel(endpoint, qid, channel_reader_id(f"{qid}.t1", f"{qid}/trades"),
                                     auth)
        submit_invalid_spec(stack)
        assert stack.status(qid)["status"] == "running"
        assert {t["state"] for t in stack.tasks(qid).values()} == {"running"}
        assert attempts_and_restarts(stack, qid) == multi.started  # nothing restarted
        logs = stack.executor_logs()
        assert "refused frame" in logs and f"not {qid}/no-such-stream" in logs

    @pytest.mark.timeout(120)
    def test_an_attackers_attempts_are_refused_and_the_query_carries_on(
            self, stack: Stack, multi: MultiRun, tmp_path: Path) -> None:
        """Code through the API, an unauthenticated and an unknown-key subscriber, a forged
        ACK, an idle/slow connection flood, the agent's internal route: each refused while the
        query keeps running (its sinks equal the oracle in the last test of the class)."""
        qid = multi.query.query_id
        channel = f"{qid}/trades"
        endpoint = channel_endpoint(stack, qid)
        from executor.runtime import channel_reader_id

        keys = stack.service.loop.state.queries[qid].keys
        code_through_the_api_is_refused(stack, qid, tmp_path / "pwned-by-api")
        unauthenticated_peer_gets_nothing(endpoint, channel)
        unknown_key_gets_nothing(endpoint, channel, keys[f"{qid}.t0"]["public"])
        t1_key = reader_auth_of(stack, qid, f"{qid}.t1", f"{qid}.t0")
        forged_ack_is_refused(endpoint, channel, t1_key, channel_reader_id(f"{qid}.t2", channel))
        idle_and_slow_connections_do_not_starve(stack, qid)
        internal_routes_are_closed(stack, tmp_path / "pwned-by-agent")
        assert {t["state"] for t in stack.tasks(qid).values()} == {"running"}
        assert attempts_and_restarts(stack, qid) == multi.started  # nothing restarted

    @pytest.mark.timeout(120)
    def test_killed_source_runner_of_a_consumer_restarts_from_its_checkpoint(
            self, stack: Stack, multi: MultiRun) -> None:
        """The consumer on the other agent than the producer reads the channel over TCP between
        executors; its source runner is SIGKILLed mid-stream and its query resumes from its
        checkpointed channel offset in the same session (the same Mesos attempt)."""
        query, base = multi.query, multi.base
        qid = query.query_id
        agents = agents_of(stack, qid)
        remote = [t for t in (f"{qid}.t1", f"{qid}.t2") if agents[t] != agents[f"{qid}.t0"]]
        assert remote, agents
        victim_task, agent = remote[0], agents[remote[0]]
        executor = stack.executor_pid(agent)
        jvm = java_child(executor) if executor else None
        assert jvm is not None, f"no Spark JVM under the executor {executor} of {agent}"
        runners = wait_until(lambda: source_runner_pids(jvm), 30, "the consumer's source runner")
        assert len(runners) == [a for a in agents.values()].count(agent) == 1, (runners, agents)
        sink_op = "moving" if victim_task.endswith(".t1") else "alerts"
        expected = moving_oracle(MULTI)[0] if sink_op == "moving" else big_trades_oracle(MULTI)
        kill_mid_stream(sink_path(base, MULTI, sink_op), sum(expected.values()), runners[0],
                        f"the source runner of {victim_task}")
        restarts_before = multi.started[victim_task][1]
        wait_until(lambda: stack.tasks(qid)[victim_task]["figures"].get("restarts", 0)
                   > restarts_before, 60,
                   "the executor to report the restart",
                   lambda: str(stack.tasks(qid)[victim_task]))
        assert f"task {victim_task}: query failed" in stack.executor_logs()
        view = stack.tasks(qid)[victim_task]
        assert (view["state"], view["attempt"], view["agent_id"]) == (
            "running", multi.started[victim_task][0], agent)  # the same Mesos attempt
        assert runners[0] not in source_runner_pids(jvm)

    @pytest.mark.timeout(150)
    def test_both_sinks_equal_the_oracle(self, stack: Stack, multi: MultiRun) -> None:
        """After the bad input and the restart above (or without them, when run alone)."""
        check_multi_sinks(multi.base, MULTI, timeout=120)
        tasks = stack.tasks(multi.query.query_id)
        assert all(t["state"] == "running" and t["attempt"] == multi.started[task_id][0]
                   for task_id, t in tasks.items())  # no relaunch since both sinks wrote


@pytest.mark.timeout(60)
def test_stopping_a_query_releases_its_channel_port(stack: Stack) -> None:
    """Runs after TestThreeTasksOnTwoAgents has stopped its query."""
    view = stack.status("e2e-multi")
    assert view.get("phase") == "stopped", view.get("phase")
    endpoint = next(iter(view["tasks"][0]["endpoints"].values()))
    port = int(endpoint.rsplit(":", 1)[1])
    wait_until(lambda: port_free(port), 10, f"port {port} of the stopped query's channel to be "
               "released", lambda: f"{endpoint} is still bound")


# --- 2. a SIGKILLed executor: the scheduler relaunches its task on the same agent -----------------

def kill_and_await_relaunch(stack: Stack, qid: str, task_id: str, sink: Path,
                            expected_rows: int) -> None:
    """SIGKILL the whole executor of the query's one task mid-stream, then wait until its
    processes are gone and the scheduler has relaunched the task on the same agent."""
    agent = stack.tasks(qid)[task_id]["agent_id"]
    executor = stack.executor_pid(agent)
    assert executor is not None
    old_session = session_members(executor)
    kill_mid_stream(sink, expected_rows, executor, "the whole executor")
    wait_until(lambda: not session_members(executor), 30,
               "the killed executor's processes (its Spark JVM) to end",
               lambda: f"still alive: {session_members(executor)} of {old_session}")
    relaunched = wait_until(
        lambda: (v := stack.tasks(qid)[task_id])["attempt"] >= 2 and
        v["state"] == "running" and v, 120, "the task relaunched by the scheduler",
        lambda: str(stack.tasks(qid)[task_id]))
    assert relaunched["agent_id"] == agent and relaunched["attempt"] == 2
    assert "lost" in relaunched["last_failure"] or "exited" in relaunched["last_failure"]
    assert stack.executor_pid(agent) not in (None, executor)


@pytest.mark.timeout(240)
def test_sigkilled_executor_is_relaunched_on_its_agent_and_resumes_from_the_checkpoint(
        stack: Stack, tmp_path: Path) -> None:
    spec = "e2e-stateful-count.xml"
    query = running_query(stack, spec, tmp_path)
    qid, task_id = query.query_id, query.tasks[0].task_id
    try:
        windows = window_oracle(generator_rows(spec_params(spec)["src"]), "ts", ["sensor"],
                                2 * SECOND, 2 * SECOND, timedelta(milliseconds=500))
        expected = Counter((start, start + 2 * SECOND, sensor, len(rows))
                           for (start, sensor), rows in windows.items())
        sink = sink_path(tmp_path, spec, "sink")
        kill_and_await_relaunch(stack, qid, task_id, sink, sum(expected.values()))
        key: Callable[[Row], tuple] = lambda r: (r["window_start"], r["window_end"],
                                                 r["sensor"], r["readings"])
        wait_for_sink(sink, expected, key, 150, "the windows of the relaunched task")
        for row in read_sink(sink):
            temps = [m["temp"] for m in windows[(row["window_start"], row["sensor"])]]
            assert row["total_temp"] == pytest.approx(sum(temps), rel=1e-12)
    finally:
        stop_query(stack, qid)


@pytest.mark.timeout(240)
def test_session_windows_are_exact_across_a_sigkilled_executor(stack: Stack,
                                                               tmp_path: Path) -> None:
    """Per-sensor sessions (60 ms gap) over 18 s of event time, the executor SIGKILLed mid-stream:
    sessions open at the kill continue from the checkpoint; every session the oracle closes
    comes out once, with its rows' count and sum."""
    spec = "e2e-session-count.xml"
    query = running_query(stack, spec, tmp_path)
    qid, task_id = query.query_id, query.tasks[0].task_id
    try:
        sessions = session_oracle(generator_rows(spec_params(spec)["src"]), "sensor", "ts",
                                  timedelta(milliseconds=60), timedelta(milliseconds=500))
        expected = Counter((*k, len(rows)) for k, rows in sessions.items())
        sink = sink_path(tmp_path, spec, "sink")
        kill_and_await_relaunch(stack, qid, task_id, sink, sum(expected.values()))
        key: Callable[[Row], tuple] = lambda r: (r["sensor"], r["window_start"],
                                                 r["window_end"], r["readings"])
        wait_for_sink(sink, expected, key, 150, "the sessions of the relaunched task")
        for row in read_sink(sink):
            members = sessions[(row["sensor"], row["window_start"], row["window_end"])]
            assert row["total_temp"] == pytest.approx(sum(m["temp"] for m in members),
                                                      rel=1e-12)
    finally:
        stop_query(stack, qid)


@pytest.mark.timeout(240)
def test_a_join_bounded_by_a_column_is_exact_across_a_sigkilled_executor(
        stack: Stack, tmp_path: Path) -> None:
    """Nexmark q9's join (a bid with its auction while the bid's date_time lies between the
    auction's date_time and its `expires` column) over 18 s of event time, the executor
    SIGKILLed mid-stream: the join's state continues from the checkpoint; every pair the oracle
    finds comes out once, and no bid before its auction's start or after its expiry (both
    present in the input) joins."""
    spec = "e2e-bounded-join.xml"
    query = running_query(stack, spec, tmp_path)
    qid, task_id = query.query_id, query.tasks[0].task_id
    try:
        params = spec_params(spec)
        auctions = {a["id"]: a for a in generator_rows(params["auctions"])}
        bids = generator_rows(params["bids"])
        joined = [(b, auctions[b["auction"]]) for b in bids if b["auction"] in auctions]
        expected = Counter((b["auction"], b["bidder"], b["price"], b["date_time"])
                           for b, a in joined if a["date_time"] <= b["date_time"] <= a["expires"])
        assert len(expected) < len(joined) - 1000, "the oracle must leave bids out at both ends"
        sink = sink_path(tmp_path, spec, "sink")
        kill_and_await_relaunch(stack, qid, task_id, sink, sum(expected.values()))
        key: Callable[[Row], tuple] = lambda r: (r["id"], r["bidder"], r["price"],
                                                 r["date_time"])
        wait_for_sink(sink, expected, key, 150, "the bounded join's pairs after the relaunch")
        for row in read_sink(sink):
            auction = auctions[row["id"]]
            assert (row["auction"], row["expires"], row["auction_date_time"]) == (
                auction["id"], auction["expires"], auction["date_time"])
    finally:
        stop_query(stack, qid)
