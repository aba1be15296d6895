"""Scheduler metrics, fed events and commands by hand (no Mesos, no Spark), then the same metrics
served on GET /metrics by a real API server, and `elastiq status --watch` as a real process.
Expected values are worked out in plain Python from the inputs the test feeds."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from scheduler.api import ApiServer
from scheduler.commands import Command
from scheduler.config import SchedulerConfig
from scheduler.elastic_policy import ElasticPolicy, OperatorView, Sample, decide
from scheduler.events import (
    Event, OffersReceived, QueryStopRequested, QuerySubmitted, Registered, StatusUpdated, Tick,
)
from scheduler.loop import SchedulerLoop
from scheduler.mesos_json import message_event
from scheduler.metrics import (
    CumulativeCounter, SchedulerMetrics, decline_class, format_watch, watch_rows,
)
from scheduler.state import SchedulerState
from scheduler.testing import chain_query, offer

ROOT = Path(__file__).resolve().parent.parent
CONFIG = SchedulerConfig(max_attempts=3, backoff_initial=1.0, same_agent_wait=5.0,
                         offer_hold_seconds=2.0)


class Fed:
    """A bare state machine whose every step is shown to a SchedulerMetrics."""

    def __init__(self) -> None:
        self.state = SchedulerState(CONFIG)
        self.metrics = SchedulerMetrics()

    def step(self, event: Event, now: float) -> list[Command]:
        commands = self.state.handle(event)
        self.metrics.observe_step(event, commands, self.state, now)
        return commands

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


def beat(figures: dict[str, dict[str, float]]) -> Event:
    data = json.dumps({"kind": "heartbeat", "tasks": figures}).encode()
    return message_event("hb", "a1", "elastiq-exec-a1", data)


def running_query(fed: Fed, tasks: int = 2) -> None:
    fed.step(Tick("t0", 100.0), 100.0)
    fed.step(Registered("r", "fw-1", "127.0.0.1:5050"), 100.0)
    fed.step(QuerySubmitted("s", chain_query("q", tasks)), 100.0)
    fed.step(OffersReceived("o", (offer("o1", "a1"),)), 101.5)
    for i in range(tasks):
        fed.step(StatusUpdated("u", f"q.t{i}.a1", "RUNNING", agent_id="a1"), 102.0)


def test_offers_received_used_and_declined_by_reason_class_without_offer_ids() -> None:
    fed = Fed()
    fed.step(OffersReceived("o0", (offer("idle-1", "a1"), offer("idle-2", "a2"))), 1.0)
    running_query(fed)
    fed.step(OffersReceived("o9", (offer("late-1", "a2"),)), 103.0)
    assert fed.value("elastiq_offers_received_total") == 4
    assert fed.value("elastiq_offers_used_total") == 1
    assert fed.value("elastiq_offers_declined_total", reason="no_demand") == 3
    exposed = fed.metrics.exposition().decode()
    assert not any(oid in exposed for oid in ("idle-1", "idle-2", "o1", "late-1"))
    assert fed.value("elastiq_scheduler_connected_to_master") == 1
    assert 'framework_id="fw-1"' in exposed


def test_the_open_exposition_shows_no_endpoint() -> None:
    """/metrics needs no token: it showed the master's address (issue 36). Oracle: no label
    value of the exposition looks like host:port, an IP address or a URL."""
    fed = Fed()
    fed.step(Registered("r", "fw-1", "master.example:5050"), 100.0)
    running_query(fed)
    exposed = fed.metrics.exposition().decode()
    values = re.findall(r'="([^"]*)"', exposed)
    assert 'framework_id="fw-1"' in exposed and values
    endpoints = [v for v in values if re.search(r":\d+$|\d+\.\d+\.\d+\.\d+|://", v)]
    assert endpoints == [] and "master.example" not in exposed


def test_decline_reasons_fall_into_a_small_fixed_set_of_classes() -> None:
    assert decline_class("no pending task needs it") == "no_demand"
    assert decline_class("does not fit task q.t0: needs 2.5 cpus, offer has 1.5 on agent a1") \
        == "cpus"
    assert decline_class("does not fit task q.t0: needs 900 MB memory, offer has 10") == "mem"
    assert decline_class("something new") == "other"


def test_tasks_by_state_launches_and_placement_time() -> None:
    fed = Fed()
    running_query(fed, tasks=2)
    assert fed.value("elastiq_tasks", query="q", state="running") == 2
    assert fed.value("elastiq_tasks", query="q", state="pending") == 0
    assert fed.value("elastiq_task_launches_total", query="q") == 2
    assert fed.value("elastiq_task_restarts_total", query="q") is None
    # both tasks were pending since the state's clock read 100.0 and launched at 101.5
    assert fed.value("elastiq_placement_seconds_count", query="q") == 2
    assert fed.value("elastiq_placement_seconds_sum", query="q") == 2 * 1.5
    assert fed.value("elastiq_placement_seconds_bucket", query="q", le="1.0") == 0
    assert fed.value("elastiq_placement_seconds_bucket", query="q", le="2.5") == 2
    assert fed.value("elastiq_task_running", query="q", task="q.t0") == 1
    assert fed.value("elastiq_queries", phase="active") == 1


def test_cumulative_heartbeat_figures_become_monotonic_counters() -> None:
    fed = Fed()
    running_query(fed, tasks=1)
    readings = [100, 250, 250, 30]  # the last one: the runner restarted from 0
    for n in readings:
        fed.step(beat({"q.t0.a1": {"tuples_in": n, "tuples_out": n // 2, "backlog": 7,
                                   "batch_ms": 250, "latency_ms": 900}}), 103.0)
    expected_in = 100 + 150 + 0 + 30
    assert fed.value("elastiq_task_tuples_in_total", query="q", task="q.t0") == expected_in
    assert fed.value("elastiq_task_tuples_out_total", query="q", task="q.t0") == \
        50 + 75 + 0 + 15
    assert fed.value("elastiq_task_backlog", query="q", task="q.t0") == 7
    assert fed.value("elastiq_task_batch_duration_seconds", query="q", task="q.t0") == 0.25
    assert fed.value("elastiq_task_latency_seconds", query="q", task="q.t0") == 0.9


def test_a_dpc_tasks_mode_and_last_reconcile_are_gauges_and_its_status_says_tentative(
        capsys: pytest.CaptureFixture[str]) -> None:
    from elastiq.service_cli import _print_status
    from scheduler.views import snapshot

    fed = Fed()
    running_query(fed, tasks=2)
    fed.step(beat({"q.t0.a1": {"tuples_in": 5},
                   "q.t1.a1": {"dpc_mode": 2, "dpc_mode_ms": 12_000, "dpc_episode": 3,
                               "dpc_reconcile_ms": -1}}), 103.0)
    assert fed.value("elastiq_task_dpc_mode", query="q", task="q.t1") == 2
    assert fed.value("elastiq_task_dpc_mode", query="q", task="q.t0") is None  # no DPC there
    assert fed.value("elastiq_task_dpc_reconcile_seconds", query="q", task="q.t1") is None
    view = snapshot(fed.state)["queries"]["q"]
    tasks = {t["task_id"]: t for t in view["tasks"]}
    assert tasks["q.t1"]["availability"].startswith("DPC tentative for 12 s (episode 3)")
    assert tasks["q.t0"]["availability"] == ""
    _print_status(view)
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith("  q.t")}
    assert lines["q.t1"].endswith("[DPC tentative for 12 s (episode 3): results are marked "
                                  "tentative until the cut input returns]"), lines
    assert "DPC" not in lines["q.t0"], lines
    fed.step(beat({"q.t1.a1": {"dpc_mode": 0, "dpc_mode_ms": 100, "dpc_episode": 3,
                               "dpc_reconcile_ms": 4_250}}), 104.0)
    assert fed.value("elastiq_task_dpc_mode", query="q", task="q.t1") == 0
    assert fed.value("elastiq_task_dpc_reconcile_seconds", query="q", task="q.t1") == 4.25
    tasks = {t["task_id"]: t for t in snapshot(fed.state)["queries"]["q"]["tasks"]}
    assert tasks["q.t1"]["availability"] == ""


def test_a_failed_task_counts_an_end_a_restart_and_a_fresh_attempt_counter() -> None:
    fed = Fed()
    running_query(fed, tasks=1)
    fed.step(beat({"q.t0.a1": {"tuples_in": 500}}), 103.0)
    fed.step(StatusUpdated("f", "q.t0.a1", "FAILED", agent_id="a1"), 104.0)
    assert fed.value("elastiq_task_ends_total", query="q", state="failed") == 1
    assert fed.value("elastiq_task_running", query="q", task="q.t0") == 0
    fed.step(Tick("t", 105.0), 105.0)  # backoff of 1 s over: pending again, attempt 2
    fed.step(OffersReceived("o", (offer("o2", "a1", executor_ids=("elastiq-exec-a1",)),)),
             105.5)
    assert fed.value("elastiq_task_restarts_total", query="q") == 1
    assert fed.value("elastiq_task_launches_total", query="q") == 2
    assert fed.value("elastiq_task_attempt", query="q", task="q.t0") == 2
    assert fed.value("elastiq_failovers_total", query="q", pattern="restart") is None
    fed.step(StatusUpdated("u", "q.t0.a2", "RUNNING", agent_id="a1"), 106.0)
    # failed at 104, running again at 106: one failover of pattern "restart" with a 2 s gap
    assert fed.value("elastiq_failovers_total", query="q", pattern="restart") == 1
    assert fed.value("elastiq_failover_gap_seconds_sum", pattern="restart") == 2.0
    fed.step(beat({"q.t0.a2": {"tuples_in": 40}}), 107.0)  # the new attempt counts from 0
    assert fed.value("elastiq_failovers_total", query="q", pattern="restart") == 1
    assert fed.value("elastiq_task_tuples_in_total", query="q", task="q.t0") == 540
    assert fed.value("elastiq_tasks", query="q", state="running") == 1


def test_reported_facts_failovers_rewrites_control_and_leadership() -> None:
    m = SchedulerMetrics(leader=False)

    def value(name: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, labels)

    m.record_failover("q", "hot-standby", 0.4)
    m.record_failover("q", "hot-standby", 3.0)
    m.record_failover("q", "Robert'); DROP", 1.0)
    assert value("elastiq_failovers_total", query="q", pattern="hot-standby") == 2
    assert value("elastiq_failovers_total", query="q", pattern="other") == 1
    assert value("elastiq_failover_gap_seconds_sum", pattern="hot-standby") == 3.4
    assert value("elastiq_failover_gap_seconds_bucket", pattern="hot-standby", le="0.5") == 1
    m.record_rewrite("hot-standby", 2)
    assert value("elastiq_rewrites_applied_total", rule="hot-standby") == 2
    m.record_control_applied("q")
    m.record_control_refused("q", "stale-epoch")
    m.record_control_refused("q", "x" * 300)
    assert value("elastiq_control_tuples_applied_total", query="q") == 1
    assert value("elastiq_control_tuples_refused_total", query="q", reason="stale-epoch") == 1
    assert value("elastiq_control_tuples_refused_total", query="q", reason="other") == 1
    assert value("elastiq_scheduler_is_leader") == 0
    m.set_leadership(True, epoch=7, safe_mode=True)
    assert (value("elastiq_scheduler_is_leader"), value("elastiq_scheduler_leader_epoch"),
            value("elastiq_scheduler_safe_mode")) == (1, 7, 1)
    m.set_leadership(True, epoch=7)
    m.set_leadership(False)
    assert value("elastiq_scheduler_leadership_changes_total") == 2
    assert value("elastiq_scheduler_safe_mode") == 0


def test_rescales_pauses_and_parallelism_are_recorded_by_direction_and_trigger() -> None:
    m = SchedulerMetrics()

    def value(name: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, labels)

    m.set_parallelism("q", "f", 1)
    assert value("elastiq_operator_parallelism", query="q", operator="f") == 1
    m.record_rescale("q", "f", 1, 3, "auto", 0.4, stateful=False)
    m.record_rescale("q", "f", 3, 2, "manual", 3.5, stateful=True)
    m.record_rescale("q", "f", 2, 1, "cron'; DROP", 1.5, stateful=True)
    assert value("elastiq_rescales_total", query="q", operator="f", direction="out",
                 trigger="auto") == 1
    assert value("elastiq_rescales_total", query="q", operator="f", direction="in",
                 trigger="manual") == 1
    assert value("elastiq_rescales_total", query="q", operator="f", direction="in",
                 trigger="other") == 1
    assert value("elastiq_operator_parallelism", query="q", operator="f") == 1
    assert value("elastiq_rescale_pause_seconds_sum", state="stateful") == 5.0
    assert value("elastiq_rescale_pause_seconds_bucket", state="stateful", le="2.0") == 1
    assert value("elastiq_rescale_pause_seconds_count", state="stateless") == 1


def test_elastic_decisions_are_counted_by_outcome() -> None:
    m = SchedulerMetrics()
    up = [Sample(float(t), 3000.0 * t, 3000.0 * t, 100.0 * t, backlog=2000.0 * t)
          for t in range(11)]  # rows wait longer all window: the instance fell behind
    busy = {"q.f1": [Sample(float(t), 1000.0 * (t + 9), 1000.0 * (t + 9), 1000.0 * (t + 9))
                     for t in range(11)]}  # (t + 9): running before the window
    view = OperatorView("q", "f", 1, busy, {"q.up": up})
    policy = ElasticPolicy(max_parallelism=8)
    for d in (decide(view, policy, 10.0), decide(view, policy, 30.0),
              decide(OperatorView("q", "f", 4, busy, {"q.up": up}, 5.0), policy, 10.0)):
        m.record_elastic_decision(d)
    value = m.registry.get_sample_value
    assert value("elastiq_elastic_decisions_total", {"outcome": "out"}) == 1
    assert value("elastiq_elastic_decisions_total", {"outcome": "hold_no_data"}) == 1
    assert value("elastiq_elastic_decisions_total", {"outcome": "hold_cooldown"}) == 1


def test_an_operators_parallelism_series_goes_with_its_query() -> None:
    fed = Fed()
    running_query(fed)
    fed.metrics.set_parallelism("q", "f", 2)
    fed.step(Tick("t1", 103.0), 103.0)
    assert fed.value("elastiq_operator_parallelism", query="q", operator="f") == 2
    fed.step(QueryStopRequested("stop", "q"), 104.0)
    for i in range(2):
        fed.step(StatusUpdated("k", f"q.t{i}.a1", "KILLED", agent_id="a1"), 105.0)
    assert fed.state.queries["q"].phase == "stopped"
    assert fed.value("elastiq_operator_parallelism", query="q", operator="f") is None


def test_each_scheduler_has_its_own_registry_and_the_global_one_is_untouched() -> None:
    a, b = SchedulerMetrics(), SchedulerMetrics()
    a.record_control_applied("q")
    assert a.registry.get_sample_value("elastiq_control_tuples_applied_total",
                                       {"query": "q"}) == 1
    assert b.registry.get_sample_value("elastiq_control_tuples_applied_total",
                                       {"query": "q"}) is None
    assert REGISTRY.get_sample_value("elastiq_control_tuples_applied_total",
                                     {"query": "q"}) is None


def test_cumulative_counter_counts_a_drop_as_a_restart_from_zero() -> None:
    c = CumulativeCounter()
    increments = [c.increment("k", v) for v in (5, 9, 9, 2, 4)]
    assert increments == [5, 4, 0, 2, 2]
    c.keep_only(set())
    assert c.increment("k", 3) == 3


def test_watch_rows_take_rates_only_between_readings_of_one_attempt() -> None:
    def reply(n: int, mid: str = "q.t0.a1") -> dict:
        return {"queries": [{"query_id": "q", "tasks": [{
            "task_id": "q.t0", "mesos_task_id": mid, "state": "running", "hostname": "h1",
            "attempt": int(mid[-1]), "figures": {"tuples_in": n, "backlog": 3, "batch_ms": 120,
                                                 "latency_ms": 800}}]}]}

    rows, readings = watch_rows(reply(100), {}, now=10.0)
    assert rows[0].tuples_per_second is None and rows[0].backlog == 3
    rows, readings = watch_rows(reply(400), readings, now=12.0)
    assert rows[0].tuples_per_second == (400 - 100) / 2.0
    rows, _ = watch_rows(reply(50, "q.t0.a2"), readings, now=13.0)
    assert rows[0].tuples_per_second is None and rows[0].attempt == 2
    table = format_watch(rows).splitlines()
    assert table[0].split()[:3] == ["QUERY", "TASK", "STATE"]
    assert table[1].split() == ["q", "q.t0", "running", "h1", "2", "-", "3", "120", "800"]


def _http_get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()


def test_get_metrics_serves_the_loops_registry_over_http() -> None:
    loop = SchedulerLoop(CONFIG, tick_interval=0.05).start()
    api = ApiServer(loop, token="metrics-test-token").start()  # /metrics needs none
    try:
        loop.put(OffersReceived("o", (offer("o1", "a1"), offer("o2", "a2"))))
        deadline = time.monotonic() + 10
        body = ""
        while time.monotonic() < deadline and "elastiq_offers_received_total 2.0" not in body:
            status, ctype, body = _http_get(api.url + "/metrics")
            time.sleep(0.05)
        assert status == 200 and ctype.startswith("text/plain")
        assert "elastiq_offers_received_total 2.0" in body
        assert 'elastiq_offers_declined_total{reason="no_demand"} 2.0' in body
        assert "elastiq_scheduler_up 1.0" in body
    finally:
        api.stop()
        loop.stop()
    assert loop.metrics.registry.get_sample_value("elastiq_scheduler_up") == 0


@pytest.mark.timeout(60)
def test_status_watch_redraws_a_table_until_ctrl_c(tmp_path: Path) -> None:
    loop = SchedulerLoop(CONFIG, tick_interval=0.05).start()
    token_file = tmp_path / "token"
    token_file.write_text("watch-test-token\n")
    api = ApiServer.serving(loop, token_file=str(token_file))
    proc = subprocess.Popen([sys.executable, "-m", "elastiq.cli", "status", "--watch",
                             "--scheduler", api.url, "--token-file", str(token_file)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert loop.submit(chain_query("wq", 1)).accepted
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum("STATE" in x for x in lines) < 2:
            lines.append(proc.stdout.readline())  # type: ignore[union-attr]
        assert sum("STATE" in x for x in lines) >= 2, lines  # at least two frames
        assert any(x.split()[:3] == ["wq", "wq.t0", "pending"] for x in lines), lines
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
        api.stop()
        loop.stop()
    assert code == 0
