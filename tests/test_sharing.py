"""Published streams read by other queries (docs/queries.md): the compiler's part (publish,
stream-source, refusals at file:line:column) and the scheduler's pure decisions (refusals at
submit, stop refused while readers depend, the wiring of endpoints and CURVE keys across
queries, admission and release of readers, why a reader waits). No Spark, no sockets."""

from __future__ import annotations

import json

import pytest
import zmq

from common.diagnostics import SpecError
from common.messages import ReadersMessage, decode
from common.tasks import CompiledQuery
from compiler.pipeline import compile_spec_text
from executor.runtime import channel_reader_id
from scheduler import sharing
from scheduler.commands import LaunchTasks, ReplyToRequest, RetargetChannels, SendFrameworkMessage
from scheduler.config import SchedulerConfig
from scheduler.events import OffersReceived, QueryStopRequested, QuerySubmitted, Registered, \
    StatusUpdated, Tick
from scheduler.state import SchedulerState
from scheduler.testing import offer
from scheduler.views import snapshot
from tests.spec_snippets import READING_TYPE, locate

WRITER = f"""<dataflow name="sensors">
{READING_TYPE}  <operator name="src" type="generator">
    <param name="shape" value="sensor"/>
    <output name="raw" type="reading"/>
  </operator>
  <operator name="hot" type="filter">
    <input name="raw"/>
    <param name="condition" value="raw.temp &gt; 30"/>
    <output name="hotReadings" publish="true"/>
  </operator>
</dataflow>
"""

VALUE = len("value=\"")  # a value's position is its first character

OTHER_TYPE = """  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="temp" type="double"/>
  </type>
"""


def reader_spec(name: str = "alerts", stream: str = "sensors/hotReadings",
                types: str = READING_TYPE, extra: str = "") -> str:
    return f"""<dataflow name="{name}">
{types}  <operator name="hot" type="stream-source">
    <param name="stream" value="{stream}"/>
    <output name="hot" type="reading"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="hot"/>
    <param name="path" value="out.jsonl"/>
  </operator>
{extra}</dataflow>
"""


def compiled(text: str, filename: str = "spec.xml") -> CompiledQuery:
    return compile_spec_text(text, filename, base_dir="/tmp").query


# --- the compiler ---------------------------------------------------------------------------------

def test_a_published_stream_is_served_on_its_channel_with_no_sink_and_no_warning() -> None:
    result = compile_spec_text(WRITER, "w.xml", base_dir="/tmp")
    q = result.query
    assert q.published == ("sensors/hotReadings",)
    (task,) = q.tasks
    assert task.outputs == ("sensors/hotReadings",) and task.inputs == ()
    (channel,) = q.channels
    assert (channel.channel_id, channel.producer, channel.consumers) == \
        ("sensors/hotReadings", "sensors.t0", ())
    assert "published=True" in task.program
    assert not [w for w in result.warnings if "never read" in w.message]


def test_a_stream_source_reads_by_name_and_records_where_it_is_written() -> None:
    text = reader_spec(extra="")
    q = compiled(text, "r.xml")
    (task,) = q.tasks
    assert task.inputs == ("sensors/hotReadings",) and q.channels == ()
    (imp,) = q.imports
    line, column = locate(text, 'value="sensors/hotReadings"')
    assert imp.where == f"r.xml:{line}:{column + VALUE}"
    assert (imp.channel_id, imp.task_id, imp.start, imp.writer) == \
        ("sensors/hotReadings", "alerts.t0", "retained", "sensors")
    assert imp.schema.names == ("sensor", "ts", "temp", "humidity")
    assert "rt.stream_source(" in task.program and "stream='sensors/hotReadings'" in task.program


@pytest.mark.parametrize("stream, message", [
    ("hotReadings", "not QUERY/STREAM"),
    ("sensors/hot/x", "not QUERY/STREAM"),
    ("alerts/hot", "a stream of this query itself"),
])
def test_a_bad_stream_name_is_refused_at_its_value(stream: str, message: str) -> None:
    text = reader_spec(stream=stream)
    with pytest.raises(SpecError) as refused:
        compiled(text, "r.xml")
    line, column = locate(text, f'value="{stream}"')
    found = [d for d in refused.value.diagnostics if message in d.message]
    assert found and (found[0].position.line, found[0].position.column) == (line, column + VALUE)


def test_publish_must_be_true_or_false() -> None:
    text = WRITER.replace('publish="true"', 'publish="yes"')
    with pytest.raises(SpecError) as refused:
        compiled(text, "w.xml")
    (bad,) = [d for d in refused.value.diagnostics if "publish=" in d.message]
    line, column = locate(text, 'publish="yes"')
    assert bad.message == "<output> publish='yes' is not allowed" and \
        (bad.position.line, bad.position.column) == (line, column)


def test_the_scheduler_and_the_executor_agree_on_reader_ids() -> None:
    assert sharing.reader_id("alerts.t0", "sensors/hot") == \
        channel_reader_id("alerts.t0", "sensors/hot")


def test_a_readers_message_round_trips_and_bad_ones_are_refused() -> None:
    m = ReadersMessage("sensors.t0.a1", "sensors/hot", (("alerts.t0/read:sensors/hot", "K"),))
    assert decode(json.dumps(m.to_json()).encode()) == m
    for bad in ({"kind": "readers", "task": "t", "channel": "c"},
                {"kind": "readers", "task": "t", "channel": "c", "add": {"r": 1}}):
        with pytest.raises(ValueError):
            decode(json.dumps(bad).encode())


# --- the scheduler's pure core --------------------------------------------------------------------

def keys_for(query: CompiledQuery) -> dict[str, dict[str, str]]:
    keys = {}
    for t in query.tasks:
        public, secret = zmq.curve_keypair()
        keys[t.task_id] = {"public": public.decode(), "secret": secret.decode()}
    return keys


def submit(s: SchedulerState, query: CompiledQuery, sid: str = "s") -> ReplyToRequest:
    out = s.handle(QuerySubmitted(sid, query, None, keys_for(query)))
    (reply,) = [c for c in out if isinstance(c, ReplyToRequest)]
    return reply


def launches(out: list) -> dict[str, dict]:  # type: ignore[type-arg]
    return {t.task_id: json.loads(t.data) for c in out if isinstance(c, LaunchTasks)
            for t in c.tasks}


@pytest.fixture
def state() -> SchedulerState:
    s = SchedulerState(SchedulerConfig())
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    return s


def running_writer(s: SchedulerState) -> dict:  # type: ignore[type-arg]
    assert submit(s, compiled(WRITER, "w.xml")).accepted
    out = s.handle(OffersReceived("o1", (offer("o1", "a1"),)))
    data = launches(out)["sensors.t0"]
    s.handle(StatusUpdated("u", "sensors.t0.a1", "RUNNING", "", "", "a1", "elastiq-exec-a1",
                           "SOURCE_EXECUTOR"))
    return data


def test_a_reader_of_an_unknown_stream_is_refused_at_its_position(state: SchedulerState) -> None:
    reply = submit(state, compiled(reader_spec(), "r.xml"))
    assert (reply.accepted, reply.status) == (False, 400)
    assert reply.message.startswith("r.xml:") and "no query publishes stream " \
        "sensors/hotReadings (published: none)" in reply.message
    assert "alerts" not in state.queries


def test_a_type_mismatch_on_a_shared_stream_is_refused_at_its_position(
        state: SchedulerState) -> None:
    running_writer(state)
    text = reader_spec(types=OTHER_TYPE)
    reply = submit(state, compiled(text, "r.xml"))
    line, column = locate(text, 'value="sensors/hotReadings"')
    assert (reply.accepted, reply.status) == (False, 400)
    assert reply.message.startswith(f"r.xml:{line}:{column + VALUE}: stream "
                                    "sensors/hotReadings is published as (sensor string, ts "
                                    "timestamp, temp double, humidity double) but is read as "
                                    "(sensor string, temp double)")


def test_a_cycle_between_queries_is_refused(state: SchedulerState) -> None:
    """a publishes x and reads b/y; b publishes y and reads a/x: b's submit closes the cycle."""
    def spec(me: str, other: str, out: str, read: str) -> str:
        return f"""<dataflow name="{me}">
{READING_TYPE}  <operator name="src" type="generator">
    <param name="shape" value="sensor"/>
    <output name="{out}" type="reading" publish="true"/>
  </operator>
  <operator name="in" type="stream-source">
    <param name="stream" value="{other}/{read}"/>
    <output name="got" type="reading"/>
  </operator>
  <operator name="sink" type="console-sink"><input name="got"/></operator>
</dataflow>
"""
    plain = spec("a", "b", "x", "y")
    writer_b = f"""<dataflow name="b">
{READING_TYPE}  <operator name="src" type="generator">
    <param name="shape" value="sensor"/>
    <output name="y" type="reading" publish="true"/>
  </operator>
</dataflow>
"""
    assert submit(state, compiled(writer_b, "b0.xml")).accepted
    assert submit(state, compiled(plain, "a.xml")).accepted  # a reads b/y
    assert state.handle(QueryStopRequested("st", "b", force=True))[0].accepted
    reply = submit(state, compiled(spec("b", "a", "y", "x"), "b.xml"))
    assert (reply.accepted, reply.status) == (False, 400), reply.message
    assert "b.xml:" in reply.message and \
        "makes a cycle between queries: b -> a -> b" in reply.message


def test_reader_and_writer_are_wired_with_endpoint_and_keys(state: SchedulerState) -> None:
    writer_data = running_writer(state)
    endpoint = writer_data["endpoints"]["sensors/hotReadings"]
    assert writer_data["keys"]["readers"] == {"sensors/hotReadings": {}}
    out = state.handle(QuerySubmitted("s2", compiled(reader_spec(), "r.xml"), None,
                                      keys := keys_for(compiled(reader_spec(), "r.xml"))))
    assert [c for c in out if isinstance(c, ReplyToRequest)][0].accepted
    (admit,) = [c for c in out if isinstance(c, SendFrameworkMessage)]
    assert admit.agent_id == "a1" and admit.message == ReadersMessage(
        "sensors.t0.a1", "sensors/hotReadings",
        (("alerts.t0/read:sensors/hotReadings", keys["alerts.t0"]["public"]),))
    out = state.handle(OffersReceived("o2", (offer("o2", "a2"),)))
    reader = launches(out)["alerts.t0"]
    writer_key = state.queries["sensors"].keys["sensors.t0"]["public"]
    assert reader["endpoints"] == {"sensors/hotReadings": endpoint}
    assert reader["keys"]["servers"] == {"sensors/hotReadings": writer_key}
    assert reader["keys"]["own"] == keys["alerts.t0"]


def test_a_writer_that_starts_running_is_told_its_readers_again(state: SchedulerState) -> None:
    """A reader submitted while its writer is launched but not yet running: the readers message
    then sent may reach the writer's agent before the executor subscribed, which drops it (seen
    under load: the reader waited forever); once the writer runs it is sent again."""
    assert submit(state, compiled(WRITER, "w.xml")).accepted
    state.handle(OffersReceived("o1", (offer("o1", "a1"),)))
    reader_q = compiled(reader_spec(), "r.xml")
    out = state.handle(QuerySubmitted("s2", reader_q, None, keys := keys_for(reader_q)))
    admitted = (("alerts.t0/read:sensors/hotReadings", keys["alerts.t0"]["public"]),)
    (first,) = [c for c in out if isinstance(c, SendFrameworkMessage)]
    assert first.message == ReadersMessage("sensors.t0.a1", "sensors/hotReadings", admitted)
    out = state.handle(StatusUpdated("u", "sensors.t0.a1", "RUNNING", "", "", "a1",
                                     "elastiq-exec-a1", "SOURCE_EXECUTOR"))
    (again,) = [c for c in out if isinstance(c, SendFrameworkMessage)]
    assert (again.agent_id, again.executor_id) == ("a1", first.executor_id)
    assert again.message == first.message
    out = state.handle(StatusUpdated("u2", "sensors.t0.a1", "RUNNING", "", "", "a1",
                                     "elastiq-exec-a1", "SOURCE_EXECUTOR"))
    assert not [c for c in out if isinstance(c, SendFrameworkMessage)]  # no change, no message


def test_a_relaunched_writer_carries_its_readers_and_they_follow_it(
        state: SchedulerState) -> None:
    running_writer(state)
    reader_q = compiled(reader_spec(), "r.xml")
    assert submit(state, reader_q, "s2").accepted
    state.handle(OffersReceived("o2", (offer("o2", "a2"),)))
    state.handle(StatusUpdated("u2", "alerts.t0.a1", "RUNNING", "", "", "a2", "elastiq-exec-a2",
                               "SOURCE_EXECUTOR"))
    state.handle(StatusUpdated("u3", "sensors.t0.a1", "FAILED", "REASON_X", "boom", "a1",
                               "elastiq-exec-a1", "SOURCE_EXECUTOR"))
    state.handle(Tick("t", 1000.0))  # past the backoff and the wait for its old agent
    out = state.handle(OffersReceived("o3", (offer("o3", "a1", ports=((32000, 32000),)),)))
    writer = launches(out)["sensors.t0"]
    reader_key = state.queries["alerts"].keys["alerts.t0"]["public"]
    assert writer["keys"]["readers"] == {"sensors/hotReadings": {"alerts.t0": reader_key}}
    (moved,) = [c for c in out if isinstance(c, RetargetChannels)]
    assert (moved.query_id, moved.endpoints) == \
        ("alerts", (("sensors/hotReadings", "tcp://host-a1:32000"),))


def test_stopping_a_writer_is_refused_while_read_unless_forced_and_the_reader_says_why(
        state: SchedulerState) -> None:
    running_writer(state)
    assert submit(state, compiled(reader_spec(), "r.xml"), "s2").accepted
    (reply,) = state.handle(QueryStopRequested("st", "sensors"))
    assert (reply.accepted, reply.status) == (False, 409)
    assert "sensors/hotReadings is read by alerts" in reply.message and "--force" in \
        reply.message
    assert state.queries["sensors"].phase == "active"
    view = snapshot(state)["queries"]
    assert view["sensors"]["published"] == [
        {"channel": "sensors/hotReadings", "task": "sensors.t0", "readers": ["alerts"]}]
    out = state.handle(QueryStopRequested("st2", "sensors", force=True))
    assert out[0].accepted
    (task,) = snapshot(state)["queries"]["alerts"]["tasks"]
    assert task["waiting_for"] == "waits for stream sensors/hotReadings: its query sensors is " \
                                  "stopping"
    assert sharing.wait_reasons(state.queries) == {"alerts.t0": task["waiting_for"]}


def test_stopping_a_reader_releases_it_at_the_writer_and_leaves_the_writer_alone(
        state: SchedulerState) -> None:
    running_writer(state)
    assert submit(state, compiled(reader_spec(), "r.xml"), "s2").accepted
    out = state.handle(QueryStopRequested("st", "alerts"))
    assert out[0].accepted
    (release,) = [c for c in out if isinstance(c, SendFrameworkMessage)]
    assert release.message == ReadersMessage("sensors.t0.a1", "sensors/hotReadings", (),
                                             ("alerts.t0/read:sensors/hotReadings",))
    assert state.queries["sensors"].phase == "active"
    assert state.queries["sensors"].tasks["sensors.t0"].state.value == "running"
    assert state.handle(QueryStopRequested("st2", "sensors"))[0].accepted


def test_status_names_a_published_task_once_with_its_readers() -> None:
    from elastiq.service_cli import shared_lines

    view = {"published": [{"channel": "sensors/hot", "task": "sensors.t0",
                           "readers": ["alerts", "dash"]}], "reads": []}
    assert shared_lines(view) == ["  publishes sensors/hot (task sensors.t0), read by alerts, "
                                  "dash"]
    assert shared_lines({"published": [], "reads": ["sensors/hot"]}) == ["  reads sensors/hot"]


def test_the_api_stops_with_force_only_when_asked() -> None:
    from scheduler.api import ApiError, Call, route
    from scheduler.loop import Reply

    class Service:
        def __init__(self) -> None:
            self.forced: list[bool] = []

        def stop_query(self, query_id: str, timeout: float = 10.0, *,
                       force: bool = False) -> Reply:
            self.forced.append(force)
            return Reply(True, 200, "stopping") if force else Reply(False, 409, "read by b")

    service = Service()
    with pytest.raises(ApiError) as refused:
        route(service, Call("DELETE", "/queries/a", ("queries", "a"), {}, {}, b""))  # type: ignore[arg-type]
    assert refused.value.status == 409
    status, _ = route(service, Call("DELETE", "/queries/a?force=true", ("queries", "a"),  # type: ignore[arg-type]
                                    {"force": ["true"]}, {}, b""))
    assert status == 202 and service.forced == [False, True]
