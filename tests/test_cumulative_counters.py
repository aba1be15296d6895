"""Counters a user watches never go back: the scheduler sums each task's tuples in and out over
its attempts (a restart, a migration), the executor's runner over its runs (a control rebuild),
and the progress line counts what the sources read and the sinks wrote, not channel hops. Pure:
events fed by hand."""

from __future__ import annotations

from common.messages import Heartbeat
from elastiq.progress import summarize
from scheduler.events import (
    HeartbeatReceived, OffersReceived, StatusUpdated, TaskMigrationRequested, Tick,
)
from scheduler.views import snapshot
from scheduler.testing import offer
from tests.test_failure_kinds import running_update, started


def beat(mid: str, tuples_in: int, tuples_out: int, agent: str = "a1") -> HeartbeatReceived:
    return HeartbeatReceived("h", agent, f"elastiq-exec-{agent}", Heartbeat(
        {mid: {"tuples_in": tuples_in, "tuples_out": tuples_out, "batch_ms": 100}}))


def figures(s, task_id: str) -> dict:
    return next(t for t in snapshot(s)["queries"]["q"]["tasks"]
                if t["task_id"] == task_id)["figures"]


def test_counters_add_up_over_a_restart_and_a_migration() -> None:
    s = started()
    s.handle(OffersReceived("o2", (offer("o2", "a2"),)))
    for mid in ("q.t0.a1", "q.t1.a1"):
        s.handle(running_update(mid))
    s.handle(beat("q.t1.a1", 1000, 40))
    assert figures(s, "q.t1")["tuples_in"] == 1000
    s.handle(Tick("t", 1.0))
    s.handle(StatusUpdated("f", "q.t1.a1", "FAILED", "", "boom", "a1", "elastiq-exec-a1",
                           "SOURCE_EXECUTOR"))
    assert figures(s, "q.t1")["tuples_in"] == 1000  # the failed attempt's count stays
    s.handle(Tick("t2", 3.0))  # its backoff over: attempt 2 launches
    s.handle(OffersReceived("o3", (offer("o3", "a1"),)))
    s.handle(running_update("q.t1.a2"))
    s.handle(beat("q.t1.a2", 300, 10))
    assert (figures(s, "q.t1")["tuples_in"], figures(s, "q.t1")["tuples_out"]) == (1300, 50)
    s.handle(TaskMigrationRequested("m", "q", "q.t1", "a2"))
    s.handle(StatusUpdated("k", "q.t1.a2", "KILLED", "", "killed by the scheduler", "a1",
                           "elastiq-exec-a1", "SOURCE_EXECUTOR"))
    s.handle(OffersReceived("o4", (offer("o4", "a2"),)))
    s.handle(running_update("q.t1.a3", "a2"))
    assert figures(s, "q.t1")["tuples_in"] == 1300  # nothing lost while it moved
    s.handle(beat("q.t1.a3", 5, 1, "a2"))
    assert (figures(s, "q.t1")["tuples_in"], figures(s, "q.t1")["tuples_out"]) == (1305, 51)


def test_progress_counts_source_reads_and_sink_writes_not_channel_hops() -> None:
    s = started()
    for mid in ("q.t0.a1", "q.t1.a1"):
        s.handle(running_update(mid))
    s.handle(beat("q.t0.a1", 5000, 5000))  # the producer: reads a source, writes a channel
    s.handle(beat("q.t1.a1", 5000, 12))  # the consumer: reads the channel, writes the sink
    line = summarize(snapshot(s)["queries"]["q"])
    assert "5,000 tuples in" in line and "| 12 out |" in line


def test_the_runner_adds_the_rows_of_earlier_runs_to_its_sink_count() -> None:
    from types import SimpleNamespace

    from executor.task_runner import TaskRunner

    runner = TaskRunner.__new__(TaskRunner)  # its bookkeeping only: no Spark session
    runner._out_before = 0
    runner.runtime = SimpleNamespace(sink=SimpleNamespace(rows_out=70))
    built = SimpleNamespace(sink=SimpleNamespace(rows_out=0), query=object(), notices=[])
    runner._replace_runtime(built)
    built.sink.rows_out = 5
    assert runner._out_before + built.sink.rows_out == 75
