"""What `elastiq run` shows while a query runs: the progress line, rates, failure notes, and
following sink files as they grow; what `elastiq migrate` says a moving task waits for."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from elastiq.progress import RateMeter, Timeline, migration_phase, summarize
from elastiq.run import FailureNotes
from elastiq.sink_watch import Follower


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


def test_a_failed_query_says_why_in_its_summary_and_its_failure_note() -> None:
    """`elastiq status` and `run`'s line show the scheduler's reason, and `run`'s note says the
    query fails rather than that it restarts."""
    reason = ("task q.t0 cannot run, and retrying cannot heal it: TASK_FAILED [cannot heal] "
              "PatternOverflow: one key would hold more than 1 partial matches, the bound "
              "max-partial-matches=1")
    status = {**_status(5, failure=reason.split(": ", 1)[1]), "status": "failed",
              "failure": reason}
    assert summarize(status).startswith("failed | ")
    assert summarize(status).endswith(f" | why: {reason}")
    assert FailureNotes().news(status)[0].endswith(
        "max-partial-matches=1); retrying cannot heal that, so the query fails")


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


# --- elastiq migrate: what a moving task waits for ----------------------------------------------

class ScriptedScheduler:
    """A stand-in for the scheduler's API: `migrate` accepts; each `status` returns the next
    view of task q.t1 from a script (the last one repeats)."""

    def __init__(self, views: list[tuple[int, str, str]]) -> None:
        self.views = views  # (attempt, state, agent)

    def migrate(self, query: str, task: str, to: str) -> dict[str, Any]:
        return {"message": f"moving {task} to {to}"}

    def status(self, query: str) -> dict[str, Any]:
        attempt, state, agent = self.views.pop(0) if len(self.views) > 1 else self.views[0]
        return {"tasks": [{"task_id": "q.t1", "attempt": attempt, "state": state,
                           "agent_id": agent}]}


def test_migrate_says_what_the_task_waits_for_in_each_phase(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from elastiq import service_cli
    from elastiq.cli import main

    script = ScriptedScheduler([(1, "running", "a1"), (1, "running", "a1"), (2, "pending", ""),
                                (2, "staging", "a2"), (2, "starting", "a2"),
                                (2, "starting", "a2"), (2, "running", "a2")])
    monkeypatch.setattr(service_cli, "_client", lambda args: script)
    assert main(["migrate", "q", "q.t1", "--to", "a2"]) == 0
    out = capsys.readouterr().out
    phases = [line.split(": ")[1] for line in out.splitlines() if line.startswith("  +")]
    assert phases == ["stopping", "pending", "staging", "starting"], out
    assert "waiting for the executor's SparkSession (a new JVM" in out
    last = out.splitlines()[-1]
    assert last.startswith("task q.t1 runs on agent a2 (attempt 2): paused "), last
    assert re.search(r"\(stopping \d+\.\d s, pending \d+\.\d s, staging \d+\.\d s, "
                     r"starting \d+\.\d s\)$", last), last


def test_migrate_that_never_lands_says_where_it_stopped(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from elastiq import service_cli
    from elastiq.cli import main

    script = ScriptedScheduler([(1, "running", "a1"), (2, "staging", "a2")])
    monkeypatch.setattr(service_cli, "_client", lambda args: script)
    assert main(["migrate", "q", "q.t1", "--to", "a2", "--timeout", "1"]) == 1
    said = capsys.readouterr()
    assert "staging: waiting for the target agent's executor" in said.out
    assert "is not running on agent a2 after 1 s" in said.err


def test_a_timeline_measures_each_phase_until_the_next() -> None:
    t = Timeline(100.0)
    assert t.observe("stopping", 100.0) and not t.observe("stopping", 100.2)
    assert t.observe("starting", 100.5) and t.observe("running", 111.0)
    assert t.durations(111.5) == [("stopping", 0.5), ("starting", 10.5), ("running", 0.5)]
    assert t.summary(111.5) == "stopping 0.5 s, starting 10.5 s"
    assert migration_phase({"attempt": 3, "state": "running"}, 3) == "stopping"
    assert migration_phase({"attempt": 4, "state": "staging"}, 3) == "staging"
