"""The embedded master's operator API (`embedded_mesos/operator_api.py`) over real HTTP.

A pymesos framework runs one task on a real embedded agent; the operator endpoints are then read
with plain HTTP and checked against what the test itself launched (its framework id, its task,
the agent's resources it configured): POST /api/v1 calls in Mesos's JSON form, /master/state and
/state.json in the v0 schema, /metrics/snapshot, /health, /redirect; a protobuf body gets 415,
no credential 401, an unknown call 400 naming the served ones; a seeded fuzz of call bodies gets
only 2xx/4xx answers and the master keeps serving.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.test_embedded_cluster import (  # noqa: F401 - `cluster`, `drivers` are fixtures
    RESOURCES, cluster, drivers, framework_auth, http_call, launch_running, subscribe,
)

JSON = {"Content-Type": "application/json", "Accept": "application/json"}


def call(cluster: Any, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http_call(cluster.master_url, "POST", "/api/v1", raw,
                     {**JSON, **framework_auth(cluster), **(headers or {})})


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_operator_calls_and_v0_state_describe_what_runs(cluster, drivers) -> None:
    recorder, driver = subscribe(cluster, drivers)
    launch_running(recorder, driver, "op1")
    framework_id = driver.framework_id
    agent_id = cluster.agents[0].agent_id

    status, health = call(cluster, {"type": "GET_HEALTH"})
    assert status == 200 and health == {"type": "GET_HEALTH", "get_health": {"healthy": True}}
    _, version = call(cluster, {"type": "GET_VERSION"})
    assert version["get_version"]["version_info"]["version"] == "1.11.0"

    _, tasks = call(cluster, {"type": "GET_TASKS"})
    [task] = tasks["get_tasks"]["tasks"]
    assert (task["task_id"], task["framework_id"], task["agent_id"], task["state"]) == (
        {"value": "op1"}, {"value": framework_id}, {"value": agent_id}, "TASK_RUNNING")
    _, agents = call(cluster, {"type": "GET_AGENTS"})
    [agent] = agents["get_agents"]["agents"]
    total = {r["name"]: r.get("scalar", {}).get("value") for r in agent["total_resources"]}
    assert agent["agent_info"]["id"] == {"value": agent_id}
    assert (total["cpus"], total["mem"]) == (RESOURCES["cpus"], RESOURCES["mem"])
    _, frameworks = call(cluster, {"type": "GET_FRAMEWORKS"})
    [fw] = frameworks["get_frameworks"]["frameworks"]
    assert fw["framework_info"]["id"] == {"value": framework_id} and fw["connected"]
    _, state = call(cluster, {"type": "GET_STATE"})
    assert state["get_state"]["get_tasks"]["tasks"] == tasks["get_tasks"]["tasks"]
    assert [e["executor_info"]["executor_id"] for e in
            state["get_state"]["get_executors"]["executors"]] == [{"value": "echo"}]
    _, metrics = call(cluster, {"type": "GET_METRICS"})
    values = {m["name"]: m["value"] for m in metrics["get_metrics"]["metrics"]}
    assert values["master/tasks_running"] == 1 and values["master/slaves_active"] == 1

    for path in ("/master/state", "/state.json"):
        status, v0 = http_call(cluster.master_url, "GET", path, None, framework_auth(cluster))
        assert status == 200 and v0["version"] == "1.11.0"
        [v0_fw] = v0["frameworks"]
        assert v0_fw["id"] == framework_id
        assert [(t["id"], t["slave_id"], t["state"]) for t in v0_fw["tasks"]] == [
            ("op1", agent_id, "TASK_RUNNING")]
        assert [s["id"] for s in v0["slaves"]] == [agent_id]
        assert v0["slaves"][0]["resources"]["cpus"] == RESOURCES["cpus"]
    status, snapshot = http_call(cluster.master_url, "GET", "/metrics/snapshot", None,
                                 framework_auth(cluster))
    assert status == 200 and snapshot["master/tasks_running"] == 1


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_operator_endpoints_refuse_what_they_do_not_speak_and_survive_fuzz(cluster) -> None:
    url = cluster.master_url
    assert http_call(url, "GET", "/health", None)[0] == 200  # open, as in Mesos
    assert http_call(url, "GET", "/redirect", None)[0] == 307
    for path in ("/master/state", "/state.json", "/metrics/snapshot", "/state"):
        assert http_call(url, "GET", path, None)[0] == 401, path
    assert http_call(url, "POST", "/api/v1", b'{"type": "GET_HEALTH"}', JSON)[0] == 401
    status, reply = call(cluster, b"\x08\x01", {"Content-Type": "application/x-protobuf"})
    assert status == 415 and "JSON only" in reply["error"]
    status, reply = call(cluster, {"type": "GET_HEALTH"}, {"Accept": "application/x-protobuf"})
    assert status == 406
    status, reply = http_call(url, "POST", "/api/v1/scheduler", b"\x08\x01", {
        "Content-Type": "application/x-protobuf", **framework_auth(cluster)})
    assert status == 415 and "scheduler API in JSON only" in reply["error"]
    status, reply = call(cluster, {"type": "SET_LOGGING_LEVEL"})
    assert status == 400 and "GET_STATE" in reply["error"]

    rng = random.Random(1411)
    kinds = ["GET_HEALTH", "GET_STATE", "GET_TASKS", "NOPE", "", None, 7, ["GET_STATE"]]
    for _ in range(150):
        choice = rng.randrange(4)
        if choice == 0:
            body: Any = {"type": rng.choice(kinds)}
        elif choice == 1:
            body = rng.choice([[], "x", 3, None, {"get_state": {}}])
        elif choice == 2:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        else:
            body = {"type": rng.choice(kinds), "extra": {"deep": [rng.random()] * 3}}
        status, reply = call(cluster, body)
        assert status in (200, 400), (body, status, reply)
        if status == 400:
            assert reply["error"], body
    assert call(cluster, {"type": "GET_HEALTH"})[0] == 200  # still serving
