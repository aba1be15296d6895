"""What `elastiq run` shows while a query runs: the progress line, rates, failure notes, and
following sink files as they grow."""

from __future__ import annotations

from pathlib import Path

from elastiq.progress import RateMeter, summarize
from elastiq.run import FailureNotes, Follower


def _status(tuples_in: int, state: str = "running", failure: str = "") -> dict:
    return {"query_id": "q", "phase": "active", "status": "running", "tasks": [
        {"task_id": "q.t0", "state": state, "attempt": 1, "last_failure": failure,
         "last_failure_attempt": 1 if failure else 0,
         "figures": {"tuples_in": tuples_in, "tuples_out": 7, "batch_ms": 250.0,
                     "latency_ms": 1500.0}},
        {"task_id": "q.t1", "state": "pending", "attempt": 1, "last_failure": "",
         "waiting_for": "needs 1 cpus, best offer has 0.5", "figures": {}}]}


def test_summary_names_tasks_figures_and_what_a_task_waits_for() -> None:
    line = summarize(_status(12345))
    assert line == ("running | tasks 1/2 running | 12,345 tuples in | 7 out | batch 250 ms | "
                    "latency 1.5 s | waiting: needs 1 cpus, best offer has 0.5")
    assert summarize(None) == "waiting for the scheduler"


def test_rate_is_averaged_over_a_few_seconds_of_cumulative_counts() -> None:
    meter = RateMeter()
    assert meter.update(1000, now=10.0) == 0.0
    assert meter.update(3000, now=11.0) == 0.0  # too soon to say
    assert meter.update(7000, now=13.0) == 2000.0
    assert meter.update(7000, now=14.0) == 2000.0  # keeps the last rate between samples


def test_failure_notes_say_each_failed_attempt_once() -> None:
    notes = FailureNotes()
    assert notes.news(_status(1)) == []
    failed = _status(1, failure="TASK_FAILED boom")
    assert notes.news(failed) == ["task q.t0 failed (TASK_FAILED boom); the scheduler restarts "
                                  "it from its checkpoint"]
    assert notes.news(failed) == []
    port = _status(1, failure="TASK_FAILED R [port in use] task q.t0 did not start")
    port["tasks"][0]["last_failure_attempt"] = 2
    assert notes.news(port) == ["task q.t0 failed (TASK_FAILED R [port in use] task q.t0 did "
                                "not start); the scheduler relaunches it on another port"]


def test_a_relaunch_after_a_kill_or_migration_is_no_new_failure() -> None:
    notes = FailureNotes()
    failed = _status(1, failure="TASK_FAILED boom")
    assert len(notes.news(failed)) == 1
    failed["tasks"][0]["attempt"] = 2  # moved on purpose: the last failure is still attempt 1's
    assert notes.news(failed) == []


def test_follower_yields_each_complete_line_once(tmp_path: Path) -> None:
    path = tmp_path / "sink.jsonl"
    follower = Follower()
    assert list(follower.lines(path)) == []  # not there yet
    path.write_text('{"a":1}\n{"a":')
    assert list(follower.lines(path)) == ['{"a":1}']
    with open(path, "a") as f:
        f.write('2}\n')
    assert list(follower.lines(path)) == ['{"a":2}']
    assert list(follower.lines(path)) == []


def test_a_query_without_results_says_what_it_waits_for() -> None:
    starting = {"status": "deploying", "tasks": [{"task_id": "q.t0", "state": "starting",
                                                  "figures": {}}]}
    assert summarize(starting).endswith("waiting: executor start (JVM, SparkSession) and the "
                                        "task's query")
    first = {"status": "running", "tasks": [{"task_id": "q.t0", "state": "running",
                                             "figures": {}}]}
    assert summarize(first).endswith("waiting: the first micro-batch")
    first["tasks"][0]["figures"] = {"tuples_in": 500, "batch_ms": 300}
    assert summarize(first).endswith("waiting: the first result (a window emits once the "
                                     "watermark passes its end)")
    first["tasks"][0]["figures"]["tuples_out"] = 3
    assert "waiting" not in summarize(first)
