"""Failures retrying cannot heal, ports taken by another program, and deliberate kills: how the
executor names a failure (`common.failures`, `executor.failure_kinds`) and what the scheduler's
state machine decides from it. Pure: events fed by hand, no Mesos, no sockets."""

from __future__ import annotations

import errno
import json

import zmq

from common.failures import kind_in, kind_of, kind_of_text, tag
from executor.executor_state import ExecutorState, RunnerStatusChanged, SendStatus
from scheduler.commands import Command, KillTask, LaunchTasks
from scheduler.config import SchedulerConfig
from scheduler.events import (
    OffersReceived, QueryStopRequested, QuerySubmitted, Registered, StatusUpdated,
    TaskMigrationRequested, Tick,
)
from scheduler.lifecycle import TaskState
from scheduler.state import SchedulerState
from scheduler.testing import chain_query, offer
from scheduler.views import snapshot

CONFIG = SchedulerConfig(max_attempts=3, backoff_initial=1.0, same_agent_wait=5.0,
                         max_port_clashes=2)


def launches(commands: list[Command]) -> dict[str, tuple[str, tuple[int, ...], dict]]:
    """mesos task id -> (agent, ports, launch data) of every launched task."""
    return {t.mesos_task_id: (c.agent_id, t.ports, json.loads(t.data))
            for c in commands if isinstance(c, LaunchTasks) for t in c.tasks}


def failed(mid: str, message: str, agent: str = "a1") -> StatusUpdated:
    return StatusUpdated("f", mid, "FAILED", "REASON_TASK_INVALID", message, agent,
                         f"elastiq-exec-{agent}", "SOURCE_EXECUTOR")


def running_update(mid: str, agent: str = "a1") -> StatusUpdated:
    return StatusUpdated("r", mid, "RUNNING", "", "", agent, f"elastiq-exec-{agent}",
                         "SOURCE_EXECUTOR")


def started(ports: tuple[tuple[int, int], ...] = ((31000, 31009),)) -> SchedulerState:
    s = SchedulerState(CONFIG)
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    s.handle(QuerySubmitted("s", chain_query("q", 2)))
    out = s.handle(OffersReceived("o", (offer("o1", "a1", ports=ports),)))
    assert launches(out)["q.t0.a1"][1] == (31000,)
    return s


def test_the_kind_travels_in_front_of_the_message_and_is_read_back() -> None:
    for kind in ("port", "permanent"):
        message = tag(kind, "task q.t0 did not start: boom")
        assert kind_of(message) == kind and kind_in(f"TASK_FAILED R {message}") == kind
        assert tag(kind, message) == message  # tagged once
    assert tag("retry", "boom") == "boom" and kind_of("boom") == "retry" == kind_in("boom")
    assert kind_of_text("[PATH_NOT_FOUND] Path does not exist: file:/x.jsonl") == "permanent"
    assert kind_of_text("ChannelError: cannot bind tcp://*:31000: Address already in use") \
        == "port"
    assert kind_of_text("Job aborted due to stage failure: lost executor") == "retry"


def test_the_executor_finds_the_kind_through_an_exceptions_causes() -> None:
    from executor.failure_kinds import failure_kind
    from executor.runtime import RuntimeSpecError, SwitchRefused

    class ChannelError(RuntimeError):
        pass

    try:
        try:
            raise zmq.ZMQError(zmq.EADDRINUSE)
        except zmq.ZMQError as exc:
            raise ChannelError("cannot bind") from exc
    except ChannelError as wrapped:
        assert failure_kind(wrapped) == "port"
    assert failure_kind(OSError(errno.EADDRINUSE, "in use")) == "port"
    missing = RuntimeSpecError("q.t0", "src", "input file '/x' does not exist")
    assert failure_kind(missing) == "permanent"
    refused = SwitchRefused("q.t0", "split", "cannot switch to 3 instances: past it")
    assert failure_kind(refused) == "refused" and kind_of_text(f"{refused!r}") == "refused"
    assert failure_kind(SyntaxError("bad program")) == "permanent"
    assert failure_kind(FileNotFoundError("program.py")) == "permanent"
    assert failure_kind(RuntimeError("the JVM went away")) == "retry"
    assert failure_kind(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) == "retry"


def test_a_failed_runner_reports_its_failure_tagged_with_its_kind() -> None:
    from executor.executor_state import Registered as ExecutorRegistered, TaskLaunched

    state = ExecutorState(heartbeat_seconds=1.0)
    state.handle(ExecutorRegistered("r", "e", "a1"))
    launch = _launch("q.t0.a1")
    state.handle(TaskLaunched("l", launch))
    state.handle(RunnerStatusChanged("p", "q.t0.a1", "running", "", 0))
    out = state.handle(RunnerStatusChanged(
        "p", "q.t0.a1", "failed", "[PATH_NOT_FOUND] Path does not exist: file:/in.csv", 0))
    (status,) = [c for c in out if isinstance(c, SendStatus)]
    assert status.state == "TASK_FAILED" and kind_of(status.message) == "permanent"


def _launch(mid: str):
    from executor.executor_state import TaskLaunch

    return TaskLaunch(mesos_task_id=mid, task_id="q.t0", query_id="q", kind="spark",
                      program="def build(rt):\n    pass\n", endpoints={}, attempt=1)


def test_a_failure_retrying_cannot_heal_fails_the_query_at_once_with_its_reason() -> None:
    s = started()
    s.handle(running_update("q.t0.a1"))
    s.handle(running_update("q.t1.a1"))
    out = s.handle(failed("q.t1.a1", tag("permanent", "task q.t1 did not start: "
                                                      "RuntimeSpecError: input file missing")))
    query = s.queries["q"]
    assert query.phase == "failed" and "retrying cannot heal it" in query.failure
    assert "input file missing" in query.failure
    assert [c.mesos_task_id for c in out if isinstance(c, KillTask)] == ["q.t0.a1"]
    assert s.queries["q"].tasks["q.t1"].restart_at is None  # no relaunch is planned


def test_an_untagged_failure_is_still_retried_with_backoff() -> None:
    s = started()
    s.handle(failed("q.t1.a1", "the JVM went away"))
    assert s.queries["q"].phase == "active"
    assert s.queries["q"].tasks["q.t1"].restart_at == 1.0


def test_a_port_taken_by_another_program_relaunches_at_once_on_another_port() -> None:
    s = started()
    out = s.handle(failed("q.t0.a1", tag("port", "task q.t0 did not start: ChannelError: "
                                                 "cannot bind tcp://*:31000: Address in use")))
    task = s.queries["q"].tasks["q.t0"]
    assert task.failures == 0 and task.port_clashes == 1 and task.state is TaskState.PENDING
    out = s.handle(OffersReceived("o2", (offer("o2", "a1", ports=((31000, 31009),)),)))
    agent, ports, data = launches(out)["q.t0.a2"]
    assert ports != (31000,) and ports[0] in range(31001, 31010)
    assert data["endpoints"]["q/s0"].endswith(f":{ports[0]}")
    # its consumer learns the new endpoint (q.t1 still stages with the old one)
    assert s.queries["q"].tasks["q.t1"].endpoints["q/s0"].endswith(f":{ports[0]}")


def test_a_task_whose_ports_keep_being_taken_fails_the_query_after_a_bound() -> None:
    s = started()
    for attempt in (1, 2, 3):
        s.handle(failed(f"q.t0.a{attempt}", tag("port", f"clash {attempt}")))
        if attempt < 3:
            s.handle(OffersReceived(f"o{attempt}", (offer(f"o{attempt}x", "a1"),)))
    query = s.queries["q"]
    assert query.phase == "failed" and "port taken 3 times" in query.failure


def test_the_only_port_left_is_used_even_if_it_was_taken_before() -> None:
    s = started(ports=((31000, 31000),))
    s.handle(failed("q.t0.a1", tag("port", "clash")))
    out = s.handle(OffersReceived("o2", (offer("o2", "a1", ports=((31000, 31000),)),)))
    assert launches(out)["q.t0.a2"][1] == (31000,)  # a last resort, bounded by max_port_clashes


def test_a_stop_or_a_migration_is_no_failure_of_the_task() -> None:
    s = started()
    s.handle(OffersReceived("o2", (offer("o2", "a2"),)))
    for mid in ("q.t0.a1", "q.t1.a1"):
        s.handle(running_update(mid))
    s.handle(TaskMigrationRequested("m", "q", "q.t1", "a2"))
    s.handle(StatusUpdated("k", "q.t1.a1", "KILLED", "", "killed by the scheduler", "a1",
                           "elastiq-exec-a1", "SOURCE_EXECUTOR"))
    t1 = s.queries["q"].tasks["q.t1"]
    assert t1.last_failure == "" and t1.last_failure_attempt == 0 and t1.failures == 0
    s.handle(Tick("t", 1.0))
    s.handle(QueryStopRequested("stop", "q"))
    s.handle(StatusUpdated("k2", "q.t0.a1", "KILLED", "", "killed by the scheduler", "a1",
                           "elastiq-exec-a1", "SOURCE_EXECUTOR"))
    view = snapshot(s)["queries"]["q"]
    assert all(t["last_failure"] == "" for t in view["tasks"]), view["tasks"]
