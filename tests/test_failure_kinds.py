"""Failures retrying cannot heal, ports taken by another program, and deliberate kills: how the
executor names a failure (`common.failures`, `executor.failure_kinds`) and what the scheduler's
state machine decides from it. Pure: events fed by hand, no Mesos, no sockets."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import zmq

from common.failures import innermost_error, kind_in, kind_of, kind_of_text, tag
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


# ------------------------------------------------ a failure told well, and not retried for ever

FIXTURE = Path(__file__).parent / "fixtures" / "spark-pattern-overflow.txt"
OVERFLOW = ("PatternOverflow: one key would hold more than 1 partial matches, the bound "
            "max-partial-matches=1; raise it, shorten within, or make the pattern's conditions "
            "more selective")


class _Captured(Exception):
    """Stands for pyspark's CapturedException: a message and a JVM stack trace apart."""

    def __init__(self, desc: str, stack: str = "") -> None:
        super().__init__(desc)
        self._stackTrace = stack


def test_the_overflow_is_found_inside_the_python_proxy_py4j_and_worker_wrappers() -> None:
    """The real text of a query that a pattern's overflow ended (captured from an executor):
    its first line is the Python proxy's wrapper, which was all the user was told."""
    from executor.task_runner import failure_reason

    text = FIXTURE.read_text()
    assert text.startswith("An exception was raised by the Python Proxy")
    assert innermost_error(text) == OVERFLOW
    assert failure_reason(_Captured(text)) == OVERFLOW
    assert kind_of_text(failure_reason(_Captured(text))) == "permanent"


@pytest.mark.parametrize("text,expected", [
    # Java's chain: the innermost cause comes last
    ("org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed\n"
     "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(x.scala:1)\n"
     "Caused by: java.lang.IllegalStateException: state store is gone\n\tat a.b(c.java:1)",
     "IllegalStateException: state store is gone"),
    # py4j's way: the Java error appended after ": "
    ("py4j.protocol.Py4JJavaError: An error occurred while calling o93.collect.\n"
     ": java.lang.OutOfMemoryError: Java heap space", "OutOfMemoryError: Java heap space"),
    # a Python traceback ends with the error it raised
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
     "zmq.error.ZMQError: Address already in use", "ZMQError: Address already in use"),
    # what retrying cannot heal wins over a later, vaguer error
    ("executor.runtime.RuntimeSpecError: input file '/in.csv' does not exist\n"
     "java.lang.RuntimeException: stopped",
     "RuntimeSpecError: input file '/in.csv' does not exist"),
    # nothing but wrappers, or no error named: nothing found
    ("pyspark.errors.exceptions.captured.PythonException: \n  see below", None),
    ("[PATH_NOT_FOUND] Path does not exist: file:/x.jsonl", None),
])
def test_the_innermost_user_meaningful_error_is_named(text: str, expected: str | None) -> None:
    assert innermost_error(text) == expected


def test_a_reason_without_a_named_error_is_its_first_informative_line() -> None:
    from executor.task_runner import failure_reason

    assert failure_reason(_Captured("\nnull\n[PATH_NOT_FOUND] Path does not exist: file:/x\n"
                                    "more")) == "[PATH_NOT_FOUND] Path does not exist: file:/x"
    assert failure_reason(None) == "query ended"
    assert len(failure_reason(_Captured("ValueError: " + "x" * 5000))) == 500
    # the JVM stack trace is read too: a Python worker's traceback may be only there
    assert failure_reason(_Captured("An exception was raised by the Python Proxy.",
                                    FIXTURE.read_text())) == OVERFLOW


def test_the_runner_restarts_from_its_checkpoint_only_what_retrying_can_heal() -> None:
    from executor.task_runner import restart_after

    no = restart_after(OVERFLOW, 0, 5, 1.0)
    assert not no.restart and no.reason == "restarting cannot heal it"
    again = restart_after("Py4JNetworkError: Answer from Java side is empty", 0, 5, 1.0)
    assert again.restart and again.delay_seconds == 1.0
    assert not restart_after("ValueError: boom", 5, 5, 1.0).restart  # its budget spent


def test_an_overflow_fails_the_query_once_with_the_limit_named_and_never_relaunches() -> None:
    """From the runner's report to the scheduler's decision: the executor tags the overflow
    "cannot heal", the scheduler fails the query with it, kills the other task and launches
    nothing however many offers and ticks follow (it used to restart it for ever)."""
    from executor.executor_state import Registered as ExecutorRegistered, TaskLaunched
    from executor.task_runner import failure_reason

    executor = ExecutorState(heartbeat_seconds=1.0)
    executor.handle(ExecutorRegistered("r", "e", "a1"))
    executor.handle(TaskLaunched("l", _launch("q.t1.a1")))
    executor.handle(RunnerStatusChanged("p", "q.t1.a1", "running", "", 0))
    reason = f"{failure_reason(_Captured(FIXTURE.read_text()))}; restarting cannot heal it"
    out = executor.handle(RunnerStatusChanged("p", "q.t1.a1", "failed", reason, 0))
    (status,) = [c for c in out if isinstance(c, SendStatus)]
    assert status.state == "TASK_FAILED" and status.message.startswith("[cannot heal] ")

    s = started()
    s.handle(running_update("q.t0.a1"))
    s.handle(running_update("q.t1.a1"))
    out = s.handle(failed("q.t1.a1", status.message))
    query = s.queries["q"]
    assert query.phase == "failed" and "max-partial-matches=1" in query.failure
    assert "retrying cannot heal it" in query.failure and "Python Proxy" not in query.failure
    assert [c.mesos_task_id for c in out if isinstance(c, KillTask)] == ["q.t0.a1"]
    later: list[Command] = []
    for i in range(1, 20):
        later += s.handle(Tick(f"t{i}", float(i)))
        later += s.handle(OffersReceived(f"o{i}", (offer(f"o{i}", "a1"),)))
    assert not [c for c in later if isinstance(c, LaunchTasks)]
    view = snapshot(s)["queries"]["q"]
    t1 = next(t for t in view["tasks"] if t["task_id"] == "q.t1")
    assert t1["attempt"] == 1 and "max-partial-matches=1" in t1["last_failure"]
