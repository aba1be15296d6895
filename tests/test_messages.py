"""The scheduler <-> executor wire protocol (common.messages) and the one dispatch idiom
(common.dispatch): pure, no Mesos, Spark or sockets. The paths that carry these messages between
real processes are tests/test_executor_cluster.py, test_control_cluster.py and
test_retarget_cluster.py."""

from __future__ import annotations

import base64
import json

import pytest

from common import messages
from common.control import Adjustable, ControlCatalog
from common.dispatch import handler
from common.messages import (ControlAck, ControlMessage, Heartbeat, LaunchData, LaunchDataError,
                             LaunchQuery, MessageError, ParamSet, RetargetMessage)
from common.tasks import QueryTask, Resources
from executor import executor_state as ex
from executor.mesos_events import message_event
from scheduler import events as sev
from scheduler.mesos_json import message_event as scheduler_message_event

SECRET = "S" * 40
TASK = QueryTask("q", "q.t0", "spark", ("a",), (), ("q/out",), False, Resources(0.5, 256, 1),
                 "def build(rt):\n    pass\n")


@pytest.mark.parametrize("message", [
    ControlMessage("q.t0.a1", "r1", 2, {"hot": {"condition": "raw.temp > 1"}}),
    RetargetMessage("q.t1.a1", (("q/a", "tcp://h:1"), ("q/b", "tcp://h:2"))),
    RetargetMessage("q.t4.a1", (("q/f_2_out", messages.UNPLACED),)),  # a retired instance
    ControlAck("q.t0.a1", "r1", 2, True, 9, 0.25, "", 5.5),
    ControlAck("q.t0.a1", "r1", 2, False, message="cannot open"),
    Heartbeat({"q.t0.a1": {"state": "running", "tuples_out": 3}}, "exec-1"),
    Heartbeat({}),
])
def test_every_message_survives_its_wire_form(message: messages.Message) -> None:
    assert messages.decode(messages.encode(message)) == message


def test_the_wire_form_is_the_documented_json() -> None:
    sent = json.loads(messages.encode(ControlMessage("q.t0.a1", "r1", 1, {"op": {"k": 1}})))
    assert sent == {"kind": "control", "task": "q.t0.a1", "request": "r1", "version": 1,
                    "params": {"op": {"k": 1}}}
    ack = json.loads(messages.encode(ControlAck("t", "r", 1, True, 3, 0.123456)))
    assert ack["pause_s"] == 0.1235 and ack["kind"] == "control-ack"
    beat = json.loads(messages.encode(Heartbeat({"t": {"n": 1}})))
    assert beat == {"kind": "heartbeat", "tasks": {"t": {"n": 1}}}  # no executor id: none sent


def test_launch_data_keeps_its_field_order_and_hides_its_keys() -> None:
    keys = {"own": {"public": "P" * 40, "secret": SECRET}, "servers": {}, "readers": {}}
    data = LaunchData(TASK, {"q/in": "tcp://h:1"}, 2, ParamSet(1, {"a": {"k": "v"}}),
                      LaunchQuery("q", (), {"a": "/tmp/x"}), keys, epoch=7)
    text = messages.encode(data).decode()
    assert list(json.loads(text)) == ["keys", "task", "endpoints", "attempt", "control", "query",
                                      "epoch"]
    assert json.loads(text)["epoch"] == 7
    assert LaunchData.from_json(json.loads(text)) == data
    assert SECRET not in repr(data) and SECRET in text


@pytest.mark.parametrize("payload, problem", [
    ({"task": TASK.to_json(), "query": {"channels": []}}, "'query' is not"),
    ({"task": TASK.to_json(), "control": {"version": -1}}, "control version must be"),
    ({"task": TASK.to_json(), "control": {"params": {"a": 1}}}, "control params must map"),
])
def test_bad_launch_data_is_refused_with_what_is_wrong(payload: dict, problem: str) -> None:
    with pytest.raises(LaunchDataError, match=problem):
        LaunchData.from_json(payload)


@pytest.mark.parametrize("data, problem", [
    (b"\xff", "not JSON"),
    (b"[1]", "not a JSON object"),
    (b'{"kind": "eval"}', "unknown kind 'eval'"),
    (b'{"kind": "control", "task": "t", "request": "r", "version": 0}', "version must be >= 1"),
    (b'{"kind": "control-ack", "epoch": "x"}', "invalid literal"),
    (b'{"kind": "heartbeat", "tasks": [1]}', "must map mesos task ids"),
    (b'{"kind": "retarget", "task": "t", "endpoints": {"c": "ipc:///x"}}', "tcp://host:port"),
    (b'{"kind": "retarget", "task": "t", "endpoints": {"c": " "}}', "tcp://host:port"),
])
def test_unreadable_messages_say_why(data: bytes, problem: str) -> None:
    with pytest.raises(MessageError, match=problem):
        messages.decode(data)


def test_each_side_reads_only_the_kinds_sent_to_it() -> None:
    beat = base64.b64encode(messages.encode(Heartbeat({}))).decode()
    unread = message_event("m", beat)
    assert isinstance(unread, ex.MessageUnreadable) and "unknown kind 'heartbeat'" in unread.why
    control = messages.encode(ControlMessage("t.a1", "r", 1))
    got = scheduler_message_event("m", "a1", "e1", control)
    assert isinstance(got, sev.MessageUnreadable) and "unknown kind 'control'" in got.why
    ack = scheduler_message_event("m", "a1", "e1", base64.b64encode(
        messages.encode(ControlAck("t.a1", "r", 1, True))))
    assert isinstance(ack, sev.ControlAcknowledged) and ack.ack.request == "r"


def test_a_param_set_is_newer_only_with_a_higher_version() -> None:
    assert ParamSet(3).newer_than(2) and not ParamSet(2).newer_than(2)
    assert not ParamSet(1).newer_than(2)


def test_dispatch_finds_the_handler_by_exact_type_or_names_the_owner() -> None:
    table = {int: lambda x: x + 1}
    assert handler(table, 1, "T")(1) == 2
    with pytest.raises(TypeError, match=r"^T: unknown event 'x'$"):
        handler(table, "x", "T")
    with pytest.raises(TypeError, match="unknown event True"):  # a subclass is not its base
        handler(table, True, "T")


def test_the_catalogue_names_the_tuples_that_move_a_network_source() -> None:
    source = Adjustable("in", "network-source", "endpoint", "endpoint", "tcp://h:1", ())
    other = Adjustable("f", "filter", "condition", "expression", "x > 1", ())
    catalog = ControlCatalog((source, other))
    tuples = [("in", "target-addr", "tcp://h:2"), ("in", "endpoint", "tcp://h:3"),
              ("f", "condition", "x > 2"), ("nope", "endpoint", "tcp://h:4")]
    assert catalog.source_endpoints(tuples) == [("in", "tcp://h:2"), ("in", "tcp://h:3")]


def test_a_control_request_carries_the_id_its_edge_minted() -> None:
    given = sev.ControlRequested("c", "q", (), "q-c1-1")
    assert given.request_id == "q-c1-1"
    minted = sev.ControlRequested("c", "q", ())
    other = sev.ControlRequested("c", "q", ())
    assert minted.request_id.startswith("q-c") and minted.request_id != other.request_id


@pytest.mark.parametrize("epoch", [-1, 1.5, "3", True, None, [2]])
def test_a_bad_fencing_epoch_is_refused_with_its_name(epoch: object) -> None:
    payload = LaunchData(TASK, epoch=3).to_json()
    assert LaunchData.from_json(payload).epoch == 3
    with pytest.raises(LaunchDataError, match="epoch must be a whole number"):
        LaunchData.from_json({**payload, "epoch": epoch})


def test_a_retarget_s_endpoints_are_a_tcp_address_or_none_under_a_seeded_fuzz() -> None:
    """A retarget's endpoint is "tcp://..." or "" (`messages.UNPLACED`: a dormant instance
    slot, which its merger does not wait for); anything else, or a value not a string, is
    refused with why, never taken (seed 34; 500 cases)."""
    import random
    import string

    rng = random.Random(34)
    alphabet = string.printable + "\u00e9\u2028"
    for _ in range(500):
        value: object = rng.choice([
            "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))),
            "tcp://" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))),
            rng.randrange(-5, 5), None, [], {"": ""}, ""])
        raw = json.dumps({"kind": "retarget", "task": "q.t4.a1", "endpoints": {"q/c": value}})
        taken = isinstance(value, str) and (value == messages.UNPLACED
                                            or value.startswith("tcp://"))
        if taken:
            message = messages.decode(raw.encode())
            assert isinstance(message, RetargetMessage)
            assert message.endpoints == (("q/c", value),)
        else:
            with pytest.raises(MessageError, match="tcp://host:port"):
                messages.decode(raw.encode())
