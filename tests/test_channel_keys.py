"""Channel keys from issue to use: the scheduler issues a keypair per task and keeps it with the
placements, launch data gives each task its own secret and its peers' public keys only, the
executor reads them without ever showing a secret, the runtime derives each writer's admitted
readers, and a channel sink blocked on a full backup shows in the figures, status and metrics
(the hub's figure measured on a real writer)."""

from __future__ import annotations

import base64
import json
import re
import time

import pyarrow as pa
import pytest

from common.messages import LaunchDataError
from executor.channels.auth import (ChannelKeyError, KeyPair, TaskKeys, check_key, key_hex,
                                   read_key_file)
from executor.mesos_events import read_launch
from executor.runtime import ChannelHub, blocked_of, channel_reader_id
from scheduler.channel_keys import issue_keys, with_missing_keys
from scheduler.config import SchedulerConfig
from scheduler.events import OffersReceived, QuerySubmitted, Registered
from scheduler.metrics import SchedulerMetrics
from scheduler.state import SchedulerState, durable_placements, restore_query, task_keys
from scheduler.testing import chain_query, offer
from scheduler.views import blocked_reason, snapshot


def submitted(n_tasks: int = 3) -> tuple[SchedulerState, dict[str, dict]]:
    """Scheduler with query q (q.t0 -> q.t1 -> q.t2) launched; mesos id -> launch data."""
    s = SchedulerState(SchedulerConfig())
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    query = chain_query("q", n_tasks)
    s.handle(QuerySubmitted("s", query, keys=issue_keys(t.task_id for t in query.tasks)))
    out = s.handle(OffersReceived("o", (offer("o1", "a1"),)))
    data = {t.mesos_task_id: json.loads(t.data) for c in out if hasattr(c, "tasks")
            for t in c.tasks}
    return s, data


def test_each_task_gets_its_own_secret_and_only_its_peers_public_keys() -> None:
    s, data = submitted()
    issued = s.queries["q"].keys
    assert set(issued) == {"q.t0", "q.t1", "q.t2"}
    assert len({k["secret"] for k in issued.values()}) == 3
    middle = data["q.t1.a1"]["keys"]
    assert middle["own"] == issued["q.t1"]
    assert middle["servers"] == {"q/s0": issued["q.t0"]["public"]}
    assert middle["readers"] == {"q/s1": {"q.t2": issued["q.t2"]["public"]}}
    text = json.dumps(data["q.t1.a1"])
    assert issued["q.t0"]["secret"] not in text and issued["q.t2"]["secret"] not in text
    assert TaskKeys.from_json(middle).own == KeyPair(**issued["q.t1"])


def test_keys_survive_a_new_leader_and_never_show_in_status_or_reprs() -> None:
    s, data = submitted()
    record = s.queries["q"]
    placements = json.loads(json.dumps(durable_placements(record)))
    restored = restore_query(record.query, None, placements, 0.0)
    assert restored.keys == record.keys
    shown = json.dumps(snapshot(s)) + repr(s.queries["q"].tasks)
    for key in record.keys.values():
        assert key["secret"] not in shown
    launch = read_launch({"task_id": {"value": "q.t1.a1"},
                          "data": base64.b64encode(json.dumps(data["q.t1.a1"]).encode()).decode()})
    assert launch.keys is not None and launch.keys.own.secret == record.keys["q.t1"]["secret"]
    assert record.keys["q.t1"]["secret"] not in repr(launch)


def test_task_keys_are_none_without_issued_keys_and_the_shell_issues_missing_ones() -> None:
    query = chain_query("q", 2)
    assert task_keys(query, "q.t0", {}) is None
    assert restore_query(query, None, {"tasks": {}}, 0.0).keys == {}  # the core makes none
    kept = issue_keys(["q.t0"])
    placements = with_missing_keys(query, {"tasks": {}, "keys": kept})
    restored = restore_query(query, None, placements, 0.0)
    assert set(restored.keys) == {"q.t0", "q.t1"} and restored.keys["q.t0"] == kept["q.t0"]
    assert restored.keys["q.t1"]["secret"] != kept["q.t0"]["secret"]


def test_a_submit_whose_keys_miss_a_task_is_refused() -> None:
    s = SchedulerState(SchedulerConfig())
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    (reply,) = s.handle(QuerySubmitted("s", chain_query("q", 3), keys=issue_keys(["q.t0"])))
    assert (reply.accepted, reply.status) == (False, 400)
    assert reply.message == "channel keys missing for tasks q.t1, q.t2" and "q" not in s.queries


@pytest.mark.parametrize("bad", [
    "nope", {"own": {"public": "x", "secret": "y"}},
    {"own": "KEYPAIR", "servers": {}, "readers": {}},
    {"own": None, "servers": {"c": "short"}},
])
def test_malformed_launch_keys_are_refused_without_quoting_them(bad) -> None:
    payload = {"task": {"query_id": "q", "task_id": "q.t0", "kind": "spark", "operators": ["a"],
                        "inputs": [], "outputs": [], "stateful": False,
                        "resources": {"cpus": 0.5, "mem_mb": 256, "ports": 0},
                        "program": "x = 1\n"}, "keys": bad}
    raw = base64.b64encode(json.dumps(payload).encode()).decode()
    with pytest.raises(LaunchDataError, match="^keys: ") as info:
        read_launch({"task_id": {"value": "q.t0.a1"}, "data": raw})
    assert "y" not in str(info.value).split("keys: ", 1)[1].split()


def test_writer_auth_admits_the_declared_reader_tasks_under_their_reader_ids() -> None:
    own, reader = KeyPair.generate(), KeyPair.generate()
    keys = TaskKeys(own, {"q/in": KeyPair.generate().public}, {"q/out": {"q.t2": reader.public}})
    auth = keys.writer_auth("q/out", {"q.t2": channel_reader_id("q.t2", "q/out")})
    assert auth.keys == own and auth.readers == {"q.t2/read:q/out": reader.public}
    with pytest.raises(ChannelKeyError, match="no key for readers"):
        keys.writer_auth("q/out", {"q.t9": "q.t9/read:q/out"})
    with pytest.raises(ChannelKeyError, match="no producer key"):
        keys.server_key("q/other")


def test_blocked_reason_words() -> None:
    assert blocked_reason({}) == "" and blocked_reason({"channel_blocked_ms": 0}) == ""
    assert blocked_reason({"channel_blocked_ms": 12000, "channel_readerless_ms": 30000}) == \
        "blocked: no reader for 30 s, backup full for 12 s"
    assert "not acknowledging" in blocked_reason({"channel_blocked_ms": 5000})


def test_a_sink_with_no_reader_reports_blocked_through_figures_status_and_metrics() -> None:
    """A real writer whose declared reader never comes: once its backup is full the hub's
    figures say how long, the scheduler's view says why and the gauge carries it."""
    schema = pa.schema([("id", pa.int64())])
    hub = ChannelHub()
    writer = hub.writer("q/out", schema, expected_readers=["q.t2/read:q/out"], owner="q.t1")
    writer._max_batches = 2  # a small backup (the bound itself is tested in test_channels)
    try:
        for tag in (1, 2):
            writer.send(pa.table({"id": [tag]}, schema=schema), tag=tag)
        assert blocked_of(hub.stats("q.t1")) == (0.0, 0.0)
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(writer.send, pa.table({"id": [3]}, schema=schema), 3, 3.0)
            deadline = time.monotonic() + 5
            while blocked_of(hub.stats("q.t1"))[0] < 0.3 and time.monotonic() < deadline:
                time.sleep(0.02)
            blocked, readerless = blocked_of(hub.stats("q.t1"))
            assert blocked >= 0.3 and readerless >= blocked
            assert blocked_of(hub.stats("q.t0")) == (0.0, 0.0)
            with pytest.raises(Exception, match="retention full"):
                waiting.result(timeout=10)
    finally:
        hub.close()
    s, _data = submitted(2)
    task = s.queries["q"].tasks["q.t0"]
    task.figures = {"channel_blocked_ms": blocked * 1000, "channel_readerless_ms": readerless * 1000}
    view = snapshot(s)["queries"]["q"]["tasks"]
    assert [t["blocked"] for t in view if t["task_id"] == "q.t0"][0].startswith(
        "blocked: no reader for")
    metrics = SchedulerMetrics()
    metrics.observe_state(s)
    assert metrics.registry.get_sample_value(
        "elastiq_channel_blocked_seconds", {"query": "q", "task": "q.t0"}) == pytest.approx(blocked)


def test_keygen_writes_an_owner_only_key_file_and_prints_only_the_public_key(
        tmp_path, capsys) -> None:
    from elastiq.cli import main

    path = tmp_path / "sink.key"
    assert main(["keygen", str(path)]) == 0
    printed = capsys.readouterr().out.strip()
    pair = read_key_file(str(path))
    assert check_key(printed, "printed") == pair.public and pair.secret not in printed
    assert re.fullmatch("[0-9a-f]{64}", printed)  # safe in an XML attribute as it is
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert main(["keygen", str(path)]) == 1  # never overwrites a key
    assert "cannot create" in capsys.readouterr().err
    assert read_key_file(str(path)) == pair


def test_a_key_is_taken_in_hexadecimal_or_z85_and_refused_otherwise() -> None:
    """A Z85 key may hold `<` and `&`, which break a spec's XML: a spec may give the same key as
    the 64 hexadecimal digits `elastiq keygen` prints; both name the same key."""
    for _ in range(50):
        pair = KeyPair.generate()
        assert check_key(key_hex(pair.public), "k") == check_key(pair.public, "k") == pair.public
    for bad in ("", "g" * 64, "0" * 63, "~" * 40, " " * 40, "0" * 41):
        with pytest.raises(ChannelKeyError):
            check_key(bad, "k")
