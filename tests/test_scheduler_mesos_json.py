"""Mesos v1 JSON in and out, without a master: offers, statuses, TaskInfo, FrameworkInfo."""

from __future__ import annotations

import base64
import json

from scheduler.commands import TaskLaunch
from scheduler.config import ExecutorSpec, SchedulerConfig
from scheduler.mesos_json import (
    decode_message, executor_info, framework_info, parse_offer, parse_status, task_info,
)

OFFER = {
    "id": {"value": "O1"}, "framework_id": {"value": "F1"}, "agent_id": {"value": "S1"},
    "hostname": "node-1",
    "resources": [
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 3.5}, "role": "*"},
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.5}, "role": "elastiq"},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": 2048.0}},
        {"name": "disk", "type": "SCALAR", "scalar": {"value": 9999.0}},
        {"name": "ports", "type": "RANGES",
         "ranges": {"range": [{"begin": 31000, "end": 31004}, {"begin": 32000, "end": 32000}]}},
    ],
    "executor_ids": [{"value": "elastiq-exec-S1"}],
}


def test_offer_resources_are_summed_and_ports_kept() -> None:
    o = parse_offer(OFFER)
    assert (o.offer_id, o.agent_id, o.hostname, o.cpus, o.mem_mb) == \
        ("O1", "S1", "node-1", 4.0, 2048.0)
    assert o.ports == ((31000, 31004), (32000, 32000))
    assert o.executor_ids == ("elastiq-exec-S1",)


def test_status_loses_the_task_prefix_and_keeps_context() -> None:
    ev = parse_status("s-1", {"task_id": {"value": "q.t0.a2"}, "state": "TASK_FAILED",
                              "reason": "REASON_COMMAND_EXECUTOR_FAILED", "message": "boom",
                              "agent_id": {"value": "S1"}, "executor_id": {"value": "E"},
                              "source": "SOURCE_EXECUTOR", "uuid": "AAAA"})
    assert (ev.stimulus_id, ev.mesos_task_id, ev.state, ev.reason, ev.message, ev.agent_id,
            ev.executor_id) == ("s-1", "q.t0.a2", "FAILED", "REASON_COMMAND_EXECUTOR_FAILED",
                                "boom", "S1", "E")
    assert parse_status("s-2", {"task_id": {"value": "x"}, "state": "TASK_RUNNING"}).agent_id == ""


def test_task_info_carries_resources_ports_executor_and_base64_data() -> None:
    spec = ExecutorSpec(command="python -m executor", cpus=0.5, mem_mb=1500,
                        environment=(("SPARK_LOCAL_IP", "127.0.0.1"),))
    ex = executor_info(spec, "S1", "F1")
    launch = TaskLaunch("q.t0.a1", "q.t0", "q.t0", 1.0, 512.0, (31002, 31000, 31001, 31009),
                        json.dumps({"attempt": 1}))
    info = task_info(launch, "S1", ex)
    assert info["task_id"] == {"value": "q.t0.a1"} and info["agent_id"] == {"value": "S1"}
    assert json.loads(base64.b64decode(info["data"])) == {"attempt": 1}
    by_name = {r["name"]: r for r in info["resources"]}
    assert by_name["cpus"]["scalar"]["value"] == 1.0 and by_name["mem"]["scalar"]["value"] == 512
    assert by_name["ports"]["ranges"]["range"] == [{"begin": 31000, "end": 31002},
                                                   {"begin": 31009, "end": 31009}]
    assert info["executor"]["executor_id"] == {"value": "elastiq-exec-S1"}
    assert info["executor"]["command"]["value"] == "python -m executor"
    assert info["executor"]["command"]["environment"]["variables"] == \
        [{"name": "SPARK_LOCAL_IP", "value": "127.0.0.1"}]
    assert {r["name"]: r["scalar"]["value"] for r in info["executor"]["resources"]} == \
        {"cpus": 0.5, "mem": 1500.0}
    assert "ports" not in {r["name"] for r in task_info(
        TaskLaunch("q.t1.a1", "q.t1", "q.t1", 1.0, 1.0, (), "{}"), "S1", ex)["resources"]}


def test_framework_info_asks_for_a_long_failover_timeout() -> None:
    info = framework_info(SchedulerConfig(), "alice")
    assert info["name"] == "elastiq" and info["user"] == "alice"
    assert info["failover_timeout"] == 7 * 24 * 3600
    assert "id" not in info
    assert framework_info(SchedulerConfig(), "alice", "F9")["id"] == {"value": "F9"}


def test_framework_messages_are_base64_decoded() -> None:
    assert decode_message(base64.b64encode(b'{"kind": "heartbeat"}').decode()) == \
        b'{"kind": "heartbeat"}'
