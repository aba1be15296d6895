"""Every shed is counted (docs/load.md), pure: a drop's observed metrics in Spark's progress
reports -> the runner's cumulative rows dropped -> the heartbeat's figures -> the scheduler's
`elastiq_task_rows_dropped_total` counter, each step against sums worked out by hand."""

from __future__ import annotations

import json

from executor.mesos_executor import figures_of
from executor.task_runner import InputCounter, TaskMetrics, shed_rows
from scheduler.config import SchedulerConfig
from scheduler.events import Event, OffersReceived, QuerySubmitted, Registered, StatusUpdated, Tick
from scheduler.lifecycle import TaskRecord
from scheduler.mesos_json import message_event
from scheduler.metrics import SchedulerMetrics
from scheduler.state import SchedulerState
from scheduler.testing import chain_query, offer


def report(batch: int, rows: int, dropped: dict[str, int], run: str = "r1") -> dict:
    return {"runId": run, "batchId": batch, "numInputRows": rows,
            "durationMs": {"addBatch": 5, "triggerExecution": 10},
            "observedMetrics": {f"shed:{op}": {"rows": rows, "dropped": n}
                                for op, n in dropped.items()} | {"other": {"dropped": 99}}}


def test_shed_rows_sums_only_the_drop_observations() -> None:
    assert shed_rows(report(0, 100, {"a_drop": 30, "b_drop": 5})) == 35
    assert shed_rows({"observedMetrics": {}}) == 0 and shed_rows({}) == 0


def test_the_runner_counts_each_batch_once_across_runs() -> None:
    counter = InputCounter()
    counter.add([report(0, 100, {"d": 30}), report(1, 100, {"d": 40})])
    counter.add([report(1, 100, {"d": 40}), report(2, 50, {"d": 10})])  # batch 1 again
    counter.add([report(0, 20, {"d": 2}, run="r2")])  # a new run of the query
    assert counter.dropped == 30 + 40 + 10 + 2


def test_the_heartbeat_carries_rows_dropped() -> None:
    metrics = TaskMetrics(3, 3, 250, 120, 10.0, 10.0, 5, 0, 5, rows_dropped=80)
    assert figures_of(metrics).rows_dropped == 80
    assert figures_of(None).rows_dropped == 0


def test_the_scheduler_counts_rows_dropped_per_task() -> None:
    state, metrics = SchedulerState(SchedulerConfig()), SchedulerMetrics()
    steps: list[tuple[Event, float]] = [(Tick("t0", 100.0), 100.0), (Registered("r", "fw-1", "127.0.0.1:5050"), 100.0),
             (QuerySubmitted("s", chain_query("q", 1)), 100.0),
             (OffersReceived("o", (offer("o1", "a1"),)), 101.5),
             (StatusUpdated("u", "q.t0.a1", "RUNNING", agent_id="a1"), 102.0)]
    for n in (0, 120, 300, 40):  # the last one: the runner restarted from 0
        data = json.dumps({"kind": "heartbeat",
                           "tasks": {"q.t0.a1": {"tuples_in": 1000, "rows_dropped": n}}})
        steps.append((message_event("hb", "a1", "elastiq-exec-a1", data.encode()), 103.0))
    for event, now in steps:
        metrics.observe_step(event, state.handle(event), state, now)
    assert metrics.registry.get_sample_value("elastiq_task_rows_dropped_total",
                                             {"query": "q", "task": "q.t0"}) == 120 + 180 + 40


def test_status_totals_keep_rows_dropped_over_attempts() -> None:
    task = TaskRecord(chain_query("q", 1).tasks[0])
    task.figures = {"rows_dropped": 70, "tuples_in": 100}
    task.carry()  # a new attempt starts from 0
    task.figures = {"rows_dropped": 5, "tuples_in": 10}
    assert task.totals()["rows_dropped"] == 75
