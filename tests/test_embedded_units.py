"""Unit tests of the embedded cluster's pure pieces: RecordIO, resources, master decisions.

No sockets, no processes. Oracles: Python sets for port ranges, json.dumps for records.
"""

from __future__ import annotations

import json
import random

import pytest

from embedded_mesos.httpio import HttpError
from embedded_mesos.master_state import (
    AgentEventReceived, AgentRegistering, CallReceived, FrameworkSubscribing, MasterConfig,
    MasterState, Subscribed, Ticked, ToAgent, ToFramework,
)
from embedded_mesos.recordio import RecordIODecoder, encode_record
from embedded_mesos.resources import (
    ResourceError, Resources, from_mesos, parse_agent_resources, parse_ranges,
)


def test_recordio_records_survive_any_split_points():
    records = [{"type": "HEARTBEAT"}, {"type": "UPDATE", "data": "é" * 50}, {"n": list(range(40))}]
    stream = b"".join(encode_record(r) for r in records)
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(stream)), 6))
        decoder, out = RecordIODecoder(), []
        for begin, end in zip([0] + cuts, cuts + [len(stream)]):
            out += decoder.feed(stream[begin:end])
        assert out == records


def test_recordio_rejects_garbage():
    with pytest.raises(ValueError):
        RecordIODecoder().feed(b"x12\n{}")


def _ports(spans) -> set[int]:
    return {p for begin, end in spans for p in range(begin, end + 1)}


def test_range_subtraction_matches_set_oracle():
    rng = random.Random(3)
    for _ in range(200):
        have = parse_ranges(",".join(f"{b}-{b + rng.randint(0, 20)}"
                                     for b in rng.sample(range(0, 200), 4)))
        take = parse_ranges(",".join(f"{b}-{b + rng.randint(0, 10)}"
                                     for b in rng.sample(range(0, 200), 3)))
        left = (Resources({}, {"ports": have}) - Resources({}, {"ports": take})).ranges["ports"]
        assert _ports(left) == _ports(have) - _ports(take)
        fits = Resources({}, {"ports": have}).contains(Resources({}, {"ports": take}))
        assert fits == (_ports(take) <= _ports(have))


def test_resources_round_trip_through_mesos_json():
    agent = parse_agent_resources({"cpus": 2, "mem": 1024, "ports": "31000-31010,31005-31020"})
    assert agent.ranges["ports"] == ((31000, 31020),)
    back = from_mesos(json.loads(json.dumps(agent.to_mesos())))
    assert back == agent


@pytest.mark.parametrize("bad", [{"cpus": -1}, {"ports": "9-3"}, {"mem": [1]}, {"cpus": True}])
def test_bad_agent_resources_are_refused(bad):
    with pytest.raises(ResourceError):
        parse_agent_resources(bad)


def _subscribed_master(capabilities: tuple[str, ...] = ()) -> tuple[MasterState, str, str, dict]:
    state = MasterState(MasterConfig(default_refuse_seconds=5.0), "m")
    state.handle(AgentRegistering({"url": "http://127.0.0.1:1", "resources": parse_agent_resources(
        {"cpus": 2, "mem": 100}).to_mesos()}, now=0.0, wall=0.0))
    info = {"name": "x", "capabilities": [{"type": c} for c in capabilities]}
    actions = state.handle(FrameworkSubscribing(
        {"type": "SUBSCRIBE", "subscribe": {"framework_info": info}},
        stream_id="stream-1", now=0.0, wall=0.0))
    (sub,) = [a for a in actions if isinstance(a, Subscribed)]
    offers = [a.event for a in actions if isinstance(a, ToFramework)
              and a.event["type"] == "OFFERS"]
    return state, sub.framework_id, sub.stream_id, offers[0]["offers"]["offers"][0]


def _call(state, fid, sid, kind, now=0.0, **body):
    return state.handle(CallReceived({"type": kind, "framework_id": {"value": fid}, **body}, sid,
                                     now=now, wall=now))


def _launch(state, fid, sid, offer, task_id, cpus):
    task = {"task_id": {"value": task_id}, "agent_id": offer["agent_id"],
            "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}}],
            "executor": {"executor_id": {"value": "e"}, "command": {"value": "true"}}}
    return _call(state, fid, sid, "ACCEPT", accept={"offer_ids": [offer["id"]], "operations": [
        {"type": "LAUNCH", "launch": {"task_infos": [task]}}]})


def test_oversized_task_gets_task_error_and_no_launch():
    state, fid, sid, offer = _subscribed_master()
    actions = _launch(state, fid, sid, offer, "big", cpus=3)
    assert not [a for a in actions if isinstance(a, ToAgent)]
    (update,) = [a.event for a in actions if isinstance(a, ToFramework)
                 and a.event["type"] == "UPDATE"]
    assert update["update"]["status"]["state"] == "TASK_ERROR"
    assert "uuid" not in update["update"]["status"]


def test_one_unacknowledged_update_in_flight_and_uuid_must_match():
    state, fid, sid, offer = _subscribed_master()
    assert any(isinstance(a, ToAgent) for a in _launch(state, fid, sid, offer, "t", 1))
    agent_id = offer["agent_id"]["value"]
    sent = []
    for state_name, uuid in (("TASK_RUNNING", "u1"), ("TASK_FINISHED", "u2")):
        status = {"task_id": {"value": "t"}, "state": state_name, "uuid": uuid}
        sent += state.handle(AgentEventReceived(agent_id, {"type": "UPDATE", "framework_id": fid,
                                                           "status": status}, now=1.0, wall=1.0))
    delivered = [a.event["update"]["status"]["uuid"] for a in sent
                 if isinstance(a, ToFramework) and a.event["type"] == "UPDATE"]
    assert delivered == ["u1"]
    with pytest.raises(HttpError) as refused:
        _call(state, fid, sid, "ACKNOWLEDGE",
              acknowledge={"agent_id": offer["agent_id"], "task_id": {"value": "t"},
                           "uuid": "u2"})
    assert refused.value.status == 400
    after = _call(state, fid, sid, "ACKNOWLEDGE", acknowledge={
        "agent_id": offer["agent_id"], "task_id": {"value": "t"}, "uuid": "u1"})
    assert [a.event["update"]["status"]["uuid"] for a in after
            if isinstance(a, ToFramework) and a.event["type"] == "UPDATE"] == ["u2"]
    assert [a.command["type"] for a in after if isinstance(a, ToAgent)] == ["ACKNOWLEDGED"]


def test_call_with_another_stream_id_is_refused():
    state, fid, _, _ = _subscribed_master()
    with pytest.raises(HttpError) as refused:
        _call(state, fid, "not-the-stream", "REVIVE")
    assert refused.value.status == 400


def test_silent_agent_is_removed_with_task_lost_and_failure():
    state, fid, sid, offer = _subscribed_master()
    _launch(state, fid, sid, offer, "t", 1)
    now = state.config.agent_timeout + 1.0
    actions = state.handle(Ticked(now=now, wall=now))
    events = [a.event for a in actions if isinstance(a, ToFramework)]
    lost = [e["update"]["status"] for e in events if e["type"] == "UPDATE"]
    assert [(s["task_id"]["value"], s["state"]) for s in lost] == [("t", "TASK_LOST")]
    assert {"agent_id": offer["agent_id"]} in [e.get("failure") for e in events]


def test_cluster_secret_comes_from_the_environment_else_a_private_file(tmp_path, monkeypatch):
    import os
    import stat

    from embedded_mesos.__main__ import _secret
    from embedded_mesos.agent import EmbeddedAgent
    from embedded_mesos.httpio import SECRET_ENV

    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "secret"
    made = _secret(str(path), create=True)
    assert made and len(made) >= 40
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert _secret(str(path), create=False) == made  # an agent reads what the master wrote
    assert _secret(None, create=False) is None
    with pytest.raises(SystemExit, match="secret-file"):
        _secret(str(tmp_path / "missing"), create=False)
    monkeypatch.setenv(SECRET_ENV, "from-env")
    assert _secret(str(path), create=True) == "from-env"
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(ValueError, match="cluster secret"):
        EmbeddedAgent("http://127.0.0.1:1", work_dir=tmp_path / "agent")


def test_the_secret_check_is_exact():
    from aiohttp.test_utils import make_mocked_request

    from embedded_mesos.httpio import SECRET_HEADER, require_secret, secret_matches

    def req(headers):
        return make_mocked_request("POST", "/internal/command", headers=headers)

    assert secret_matches("s3cret", req({SECRET_HEADER: "s3cret"}))
    for wrong in ({}, {SECRET_HEADER: ""}, {SECRET_HEADER: "s3cre"}, {SECRET_HEADER: "s3cret "},
                  {SECRET_HEADER: "S3CRET"}, {SECRET_HEADER: "é"}):
        assert not secret_matches("s3cret", req(wrong))
        with pytest.raises(HttpError) as refused:
            require_secret("s3cret", req(wrong))
        assert refused.value.status == 401


def _updates(actions) -> list[tuple[str, str]]:
    return [(a.event["update"]["status"]["task_id"]["value"], a.event["update"]["status"]["state"])
            for a in actions if isinstance(a, ToFramework) and a.event["type"] == "UPDATE"]


def _finish_and_acknowledge(state, fid, sid, offer, task_id: str) -> None:
    _launch(state, fid, sid, offer, task_id, 1)
    status = {"task_id": {"value": task_id}, "state": "TASK_FINISHED", "uuid": "u-" + task_id}
    state.handle(AgentEventReceived(offer["agent_id"]["value"], {
        "type": "UPDATE", "framework_id": fid, "status": status}, now=1.0, wall=1.0))
    _call(state, fid, sid, "ACKNOWLEDGE", acknowledge={
        "agent_id": offer["agent_id"], "task_id": {"value": task_id}, "uuid": "u-" + task_id})


@pytest.mark.parametrize("aware, answer", [(False, "TASK_LOST"), (True, "TASK_GONE")])
def test_reconciling_an_acknowledged_finished_task_finds_it_forgotten(aware, answer):
    state, fid, sid, offer = _subscribed_master(("PARTITION_AWARE",) if aware else ())
    _finish_and_acknowledge(state, fid, sid, offer, "done")
    asked = _call(state, fid, sid, "RECONCILE", reconcile={"tasks": [
        {"task_id": {"value": "done"}, "agent_id": offer["agent_id"]}]})
    assert _updates(asked) == [("done", answer)]  # its agent is here without it
    unknown = _call(state, fid, sid, "RECONCILE", reconcile={"tasks": [
        {"task_id": {"value": "never"}}]})
    assert _updates(unknown) == [("never", "TASK_UNKNOWN" if aware else "TASK_LOST")]


def test_a_partition_aware_framework_is_told_unreachable_then_reconciles_unreachable():
    state, fid, sid, offer = _subscribed_master(("PARTITION_AWARE",))
    _launch(state, fid, sid, offer, "t", 1)
    now = state.config.agent_timeout + 1.0
    assert _updates(state.handle(Ticked(now=now, wall=now))) == [("t", "TASK_UNREACHABLE")]
    asked = _call(state, fid, sid, "RECONCILE", now=now, reconcile={"tasks": [
        {"task_id": {"value": "t"}, "agent_id": offer["agent_id"]}]})
    assert _updates(asked) == [("t", "TASK_UNREACHABLE")]  # it may still run there


def _with_executor(task_id: str, offer, cpus: float, executor_cpus: float, command: str = "true"):
    return {"task_id": {"value": task_id}, "agent_id": offer["agent_id"],
            "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}}],
            "executor": {"executor_id": {"value": "e"}, "command": {"value": command},
                         "resources": [{"name": "cpus", "type": "SCALAR",
                                        "scalar": {"value": executor_cpus}}]}}


def _accept(state, fid, sid, offer, *tasks):
    return _call(state, fid, sid, "ACCEPT", accept={
        "offer_ids": [offer["id"]], "filters": {"refuse_seconds": 0}, "operations": [
            {"type": "LAUNCH", "launch": {"task_infos": list(tasks)}}]})


def _next_offer(actions):
    return [o for a in actions if isinstance(a, ToFramework) and a.event["type"] == "OFFERS"
            for o in a.event["offers"]["offers"]][0]


def test_task_and_executor_must_fit_and_the_executor_is_charged_once_and_offered_by_id():
    state, fid, sid, offer = _subscribed_master()  # 2 cpus
    refused = _accept(state, fid, sid, offer, _with_executor("big", offer, 1.8, 0.5))
    assert _updates(refused) == [("big", "TASK_ERROR")]
    out = _accept(state, fid, sid, _next_offer(refused), _with_executor("t1", offer, 1.0, 0.5))
    assert [a.command["type"] for a in out if isinstance(a, ToAgent)] == ["LAUNCH"]
    offer2 = _next_offer(out)  # 2 - 1.0 - 0.5 left, and the executor named
    cpus = [r["scalar"]["value"] for r in offer2["resources"] if r["name"] == "cpus"]
    assert cpus == [0.5] and offer2["executor_ids"] == [{"value": "e"}]
    out = _accept(state, fid, sid, offer2, _with_executor("t2", offer2, 0.5, 0.5))
    assert [a.command["type"] for a in out if isinstance(a, ToAgent)] == ["LAUNCH"]  # once


def test_a_changed_executor_info_is_a_task_error_as_in_mesos():
    state, fid, sid, offer = _subscribed_master()
    out = _accept(state, fid, sid, offer, _with_executor("t1", offer, 0.5, 0.1))
    changed = _accept(state, fid, sid, _next_offer(out),
                      _with_executor("t2", offer, 0.5, 0.1, command="other"))
    assert _updates(changed) == [("t2", "TASK_ERROR")]
    assert not [a for a in changed if isinstance(a, ToAgent)]
