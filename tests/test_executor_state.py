"""The executor's pure state machine: events in, commands out (no pymesos, Spark or sockets)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from common.messages import LaunchDataError
from executor.executor_state import (REASON_INVALID, TRANSITIONS, Event, Exit, ExecutorState,
                                     IllegalTransition, LaunchRejected, Registered,
                                     RunnerStartFailed, RunnerStatusChanged, RunnerStopped,
                                     SendHeartbeat, SendStatus, ShutdownRequested, StartRunner,
                                     StopRunner, TaskFigures, TaskKilled, TaskLaunch,
                                     TaskLaunched, TaskRecord, Tick, WriteEndpoints)
from executor.mesos_events import heartbeat_bytes as heartbeat_message
from executor.mesos_events import message_event, read_launch

PROGRAM = "def build(rt):\n    pass\n"


def launch(task_id: str = "q.t0", attempt: int = 1, kind: str = "spark") -> TaskLaunch:
    return TaskLaunch(f"{task_id}.a{attempt}", task_id, "q", kind, PROGRAM,
                      {"q/s": "tcp://127.0.0.1:5000"}, attempt)


def registered_state() -> ExecutorState:
    state = ExecutorState(heartbeat_seconds=1.0)
    assert state.handle(Registered("r", "exec-1", "agent-1")) == []
    return state


def launched(state: ExecutorState, the_launch: TaskLaunch) -> list[Any]:
    return state.handle(TaskLaunched("l", the_launch))


def running(state: ExecutorState, the_launch: TaskLaunch) -> None:
    launched(state, the_launch)
    state.handle(RunnerStatusChanged("p", the_launch.mesos_task_id, "running"))


def statuses(commands: list[Any]) -> list[tuple[str, str]]:
    return [(c.task_id, c.state) for c in commands if isinstance(c, SendStatus)]


# --- launches -------------------------------------------------------------------------------------

def test_launch_sends_starting_then_starts_the_runner() -> None:
    state, the_launch = registered_state(), launch()
    commands = launched(state, the_launch)
    assert commands == [SendStatus("l", "q.t0.a1", "TASK_STARTING"), StartRunner("l", the_launch)]
    assert state.tasks["q.t0.a1"].phase == "launching"


def test_runner_running_sends_task_running_once() -> None:
    state = registered_state()
    launched(state, launch())
    first = state.handle(RunnerStatusChanged("p1", "q.t0.a1", "running"))
    again = state.handle(RunnerStatusChanged("p2", "q.t0.a1", "running"))
    assert first == [SendStatus("p1", "q.t0.a1", "TASK_RUNNING")]
    assert again == []
    assert state.tasks["q.t0.a1"].phase == "running"


def test_plumbing_task_fails_with_a_reason() -> None:
    state = registered_state()
    commands = launched(state, launch(kind="plumbing"))
    assert len(commands) == 1 and commands[0].state == "TASK_FAILED"
    assert commands[0].reason == REASON_INVALID and "plumbing" in commands[0].message


def test_unreadable_launch_fails_with_the_message() -> None:
    state = registered_state()
    commands = state.handle(LaunchRejected("l", "x.a1", "TaskInfo.data is missing"))
    assert commands == [SendStatus("l", "x.a1", "TASK_FAILED", "TaskInfo.data is missing",
                                   REASON_INVALID)]


def test_duplicate_launch_is_ignored() -> None:
    state = registered_state()
    launched(state, launch())
    assert launched(state, launch()) == []


def test_new_attempt_stops_the_old_one_before_starting() -> None:
    state = registered_state()
    running(state, launch(attempt=1))
    second = launch(attempt=2)
    commands = launched(state, second)
    assert commands == [StopRunner("l", "q.t0.a1"), SendStatus("l", "q.t0.a2", "TASK_STARTING"),
                        StartRunner("l", second)]
    stopped = state.handle(RunnerStopped("s", "q.t0.a1"))
    assert statuses(stopped) == [("q.t0.a1", "TASK_KILLED")]
    assert "superseded by attempt 2" in stopped[0].message
    assert state.tasks["q.t0.a2"].phase == "launching"


# --- failures, completion -----------------------------------------------------------------------

@pytest.mark.parametrize("from_running", [False, True])
def test_runner_gave_up_sends_failed_with_the_reason(from_running: bool) -> None:
    state = registered_state()
    (running if from_running else launched)(state, launch())
    reason = "boom; gave up after 5 restarts"
    commands = state.handle(RunnerStatusChanged("p", "q.t0.a1", "failed", reason, 5))
    assert commands == [SendStatus("p", "q.t0.a1", "TASK_FAILED", reason),
                        StopRunner("p", "q.t0.a1")]
    assert state.tasks["q.t0.a1"].phase == "failed"
    assert state.handle(RunnerStopped("s", "q.t0.a1")) == []  # no second terminal update


def test_program_that_does_not_load_fails_the_task() -> None:
    state = registered_state()
    launched(state, launch())
    commands = state.handle(RunnerStartFailed("l", "q.t0.a1", "SyntaxError: bad"))
    assert commands == [SendStatus("l", "q.t0.a1", "TASK_FAILED", "SyntaxError: bad",
                                   REASON_INVALID)]


@pytest.mark.parametrize("from_running", [False, True])
def test_finite_query_completing_sends_finished(from_running: bool) -> None:
    state = registered_state()
    (running if from_running else launched)(state, launch())
    commands = state.handle(RunnerStatusChanged("p", "q.t0.a1", "finished"))
    assert statuses(commands) == [("q.t0.a1", "TASK_FINISHED")]
    assert StopRunner("p", "q.t0.a1", release_outputs=True) in commands  # the query is over


def test_restarting_is_not_a_mesos_state_change_but_shows_in_heartbeats() -> None:
    state = registered_state()
    running(state, launch())
    assert state.handle(RunnerStatusChanged("p", "q.t0.a1", "restarting", "oops", 1)) == []
    beat = state.handle(Tick("t", 10.0))[0]
    assert isinstance(beat, SendHeartbeat)
    assert beat.figures["q.t0.a1"]["state"] == "restarting"
    assert beat.figures["q.t0.a1"]["restarts"] == 1


# --- kills ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("from_running", [False, True])
def test_kill_stops_the_runner_then_sends_killed(from_running: bool) -> None:
    state = registered_state()
    (running if from_running else launched)(state, launch())
    # a kill frees the task's channel ports; a failure (above) keeps its upstream backup for
    # the relaunch, and so does a superseded attempt
    assert state.handle(TaskKilled("k", "q.t0.a1")) == [
        StopRunner("k", "q.t0.a1", release_outputs=True)]
    # reports from the runner while it stops change nothing
    assert state.handle(RunnerStatusChanged("p", "q.t0.a1", "finished", "stopped")) == []
    assert state.handle(RunnerStartFailed("p", "q.t0.a1", "late")) == []
    assert state.handle(TaskKilled("k2", "q.t0.a1")) == []  # a repeated kill
    commands = state.handle(RunnerStopped("s", "q.t0.a1"))
    assert statuses(commands) == [("q.t0.a1", "TASK_KILLED")]
    assert state.tasks["q.t0.a1"].phase == "killed"
    assert state.handle(RunnerStopped("s2", "q.t0.a1")) == []


def test_kill_of_an_unknown_task_answers_killed() -> None:
    state = registered_state()
    assert statuses(state.handle(TaskKilled("k", "nope.a1"))) == [("nope.a1", "TASK_KILLED")]


def test_kill_after_the_task_ended_is_ignored() -> None:
    state = registered_state()
    running(state, launch())
    state.handle(RunnerStatusChanged("p", "q.t0.a1", "failed", "x"))
    assert state.handle(TaskKilled("k", "q.t0.a1")) == []


# --- heartbeats -----------------------------------------------------------------------------------

def test_no_heartbeat_before_registration() -> None:
    state = ExecutorState()
    assert state.handle(Tick("t", 1.0)) == []


def test_heartbeat_every_interval_with_live_tasks_and_figures() -> None:
    state = registered_state()
    running(state, launch("q.t0"))
    launched(state, launch("q.t1"))
    running(state, launch("q.t2"))
    state.handle(TaskKilled("k", "q.t2.a1"))
    figures = {"q.t0.a1": TaskFigures(tuples_in=7, tuples_out=3, batches=2, batch_ms=150,
                                      backlog=4, latency_ms=150, channel_blocked_ms=2500,
                                      channel_readerless_ms=9000, busy_ms=1234,
                                      running_ms=420, watermark_ms=5000, rows_dropped=12,
                                      cpu_ms=800, cpu_batches=2, retained={"q/c#1": 2})}
    first = state.handle(Tick("t1", 100.0, figures))
    assert state.handle(Tick("t2", 100.5, figures)) == []  # not yet a second later
    later = state.handle(Tick("t3", 101.0, figures))
    assert len(first) == 1 and len(later) == 1
    beat = first[0].figures
    assert beat["q.t0.a1"] == {"state": "running", "tuples_in": 7, "tuples_out": 3, "batches": 2,
                               "batch_ms": 150, "backlog": 4, "latency_ms": 150, "busy_ms": 1234,
                               "running_ms": 420, "batches_ended": 0, "restarts": 0,
                               "watermark_ms": 5000, "routed_ms": -1, "rows_dropped": 12,
                               "cpu_ms": 800, "cpu_batches": 2, "retained:q/c#1": 2, "channel_blocked_ms": 2500,
                               "channel_readerless_ms": 9000}
    assert beat["q.t1.a1"]["state"] == "launching" and beat["q.t1.a1"]["tuples_out"] == 0
    assert beat["q.t2.a1"]["state"] == "killing"


def test_heartbeat_leaves_out_ended_tasks() -> None:
    state = registered_state()
    running(state, launch())
    state.handle(RunnerStatusChanged("p", "q.t0.a1", "finished"))
    assert state.handle(Tick("t", 5.0))[0].figures == {}


def test_heartbeat_message_shape() -> None:
    data = json.loads(heartbeat_message("exec-1", {"a.a1": {"state": "running", "tuples_out": 2}}))
    assert data == {"kind": "heartbeat", "executor_id": "exec-1",
                    "tasks": {"a.a1": {"state": "running", "tuples_out": 2}}}


# --- retargets from the scheduler -----------------------------------------------------------------

def message(payload: Any) -> Event:
    """A framework message as pymesos hands it over: base64 text of the scheduler's JSON."""
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return message_event("m", base64.b64encode(raw).decode("ascii"))


def retarget(task: str, endpoints: dict[str, str]) -> Event:
    return message({"kind": "retarget", "task": task, "endpoints": endpoints})


def reader_launch() -> TaskLaunch:
    """q.t1 reads q/a and q/b and serves q/out."""
    return TaskLaunch("q.t1.a1", "q.t1", "q", "spark", PROGRAM,
                      {"q/a": "tcp://h1:5000", "q/b": "tcp://h1:5001", "q/out": "tcp://h2:6000"},
                      1, ("q/out",))


def test_retarget_of_a_known_task_rewrites_its_merged_endpoints() -> None:
    state = registered_state()
    running(state, reader_launch())
    commands = state.handle(retarget("q.t1.a1", {"q/a": "tcp://h3:7000"}))
    assert commands == [WriteEndpoints(
        "m", "q.t1.a1", "q.t1",
        {"q/a": "tcp://h3:7000", "q/b": "tcp://h1:5001", "q/out": "tcp://h2:6000"},
        (("q/a", "tcp://h3:7000"),))]
    # the same again changes nothing; a later one merges on top of the first
    assert state.handle(retarget("q.t1.a1", {"q/a": "tcp://h3:7000"})) == []
    (again,) = state.handle(retarget("q.t1.a1", {"q/b": "tcp://h4:1", "q/a": "tcp://h3:7000"}))
    assert again.endpoints["q/a"] == "tcp://h3:7000" and again.changed == (("q/b", "tcp://h4:1"),)


def test_retarget_while_launching_applies_and_own_outputs_are_refused() -> None:
    state = registered_state()
    launched(state, reader_launch())
    assert state.handle(retarget("q.t1.a1", {"q/out": "tcp://h9:1"})) == []
    (cmd,) = state.handle(retarget("q.t1.a1", {"q/out": "tcp://h9:1", "q/c": "tcp://h5:2"}))
    assert cmd.changed == (("q/c", "tcp://h5:2"),) and cmd.endpoints["q/out"] == "tcp://h2:6000"


@pytest.mark.parametrize("event", [
    retarget("q.t9.a1", {"q/a": "tcp://h3:7000"}),  # not on this executor
    retarget("q.t1.a0", {"q/a": "tcp://h3:7000"}),  # another attempt
    message_event("m", "%%% not base64"),
    message(b"{not json"),
    message(b"\xff\xfe"),
    message([1, 2]),
    message({"kind": "reboot", "task": "q.t1.a1"}),
    message({"kind": "retarget", "endpoints": {"q/a": "tcp://h3:7000"}}),
    message({"kind": "retarget", "task": "q.t1.a1", "endpoints": {"q/a": "ipc:///x"}}),
    message({"kind": "retarget", "task": "q.t1.a1", "endpoints": ["q/a"]}),
    message({"kind": "retarget", "task": "q.t1.a1", "endpoints": {}}),
    message_event("m", b""),
])
def test_unknown_or_malformed_messages_are_ignored(event: Event) -> None:
    state = registered_state()
    running(state, reader_launch())
    assert state.handle(event) == []
    assert state.tasks["q.t1.a1"].endpoints == dict(reader_launch().endpoints)


def test_retarget_of_a_task_that_ended_or_is_stopping_is_ignored() -> None:
    state = registered_state()
    running(state, reader_launch())
    state.handle(TaskKilled("k", "q.t1.a1"))
    assert state.handle(retarget("q.t1.a1", {"q/a": "tcp://h3:7000"})) == []
    state.handle(RunnerStopped("s", "q.t1.a1"))
    assert state.handle(retarget("q.t1.a1", {"q/a": "tcp://h3:7000"})) == []


# --- shutdown -------------------------------------------------------------------------------------

def test_shutdown_stops_every_live_runner_then_exits() -> None:
    state = registered_state()
    running(state, launch("q.t0"))
    launched(state, launch("q.t1"))
    running(state, launch("q.t2"))
    state.handle(RunnerStatusChanged("p", "q.t2.a1", "failed", "x"))
    commands = state.handle(ShutdownRequested("s", "agent"))
    assert commands == [StopRunner("s", "q.t0.a1"), StopRunner("s", "q.t1.a1"), Exit("s", 0)]
    assert state.handle(RunnerStopped("x", "q.t0.a1")) == []  # the driver is gone
    assert state.handle(Tick("t", 50.0)) == []
    assert launched(state, launch("q.t9")) == []
    assert state.handle(ShutdownRequested("s2", "again")) == []


# --- the transition table -------------------------------------------------------------------------

def test_missing_edge_raises_with_history() -> None:
    record = TaskRecord(launch())
    record.move("running", "e1")
    record.move("killing", "e2")
    with pytest.raises(IllegalTransition, match=r"killing -> running.*e1: launching->running"):
        record.move("running", "e3")


def test_every_edge_is_reachable_from_events() -> None:
    """Each edge of TRANSITIONS is taken by some event sequence above (checked here directly)."""
    taken: set[tuple[str, str]] = set()
    for script in (["running", "kill", "stopped"], ["kill", "stopped"], ["failed"],
                   ["running", "failed"], ["finished"], ["running", "finished"]):
        state = registered_state()
        launched(state, launch())
        for step in script:
            event = {"running": RunnerStatusChanged("e", "q.t0.a1", "running"),
                     "failed": RunnerStatusChanged("e", "q.t0.a1", "failed", "x"),
                     "finished": RunnerStatusChanged("e", "q.t0.a1", "finished"),
                     "kill": TaskKilled("e", "q.t0.a1"),
                     "stopped": RunnerStopped("e", "q.t0.a1")}[step]
            state.handle(event)
        taken |= {(h.start, h.finish) for h in state.tasks["q.t0.a1"].history}
    assert taken == set(TRANSITIONS)


# --- reading TaskInfos ----------------------------------------------------------------------------

def task_info(payload: Any, task_id: str = "q.t0.a2") -> dict[str, Any]:
    raw = payload if isinstance(payload, str) else base64.b64encode(
        json.dumps(payload).encode()).decode()
    return {"task_id": {"value": task_id}, "data": raw}


def query_task_json(task_id: str = "q.t0") -> dict[str, Any]:
    return {"query_id": "q", "task_id": task_id, "kind": "spark", "operators": ["a"],
            "inputs": [], "outputs": [], "stateful": False,
            "resources": {"cpus": 0.5, "mem_mb": 256, "ports": 0}, "program": PROGRAM}


def test_read_launch_takes_task_endpoints_and_attempt() -> None:
    got = read_launch(task_info({"task": query_task_json(), "attempt": 2,
                                 "endpoints": {"q/s": "tcp://127.0.0.1:6000"}}))
    assert got == TaskLaunch("q.t0.a2", "q.t0", "q", "spark", PROGRAM,
                             {"q/s": "tcp://127.0.0.1:6000"}, 2)


@pytest.mark.parametrize("payload, message", [
    ("%%%not base64", "not base64 of JSON"),
    ([1, 2], "must be a JSON object"),
    ({"attempt": 1}, "'task' must be a QueryTask"),
    ({"task": {"task_id": "x"}}, "is not a QueryTask"),
    ({"task": query_task_json("../../etc")}, "not a safe name"),
    ({"task": query_task_json(), "attempt": 0}, "attempt must be a positive integer"),
    ({"task": query_task_json(), "endpoints": {"q/s": "ipc:///x"}}, "endpoints must map"),
    ({"task": {**query_task_json(), "program": " "}}, "has no program"),
])
def test_read_launch_rejects_bad_data_clearly(payload: Any, message: str) -> None:
    with pytest.raises(LaunchDataError, match=message):
        read_launch(task_info(payload))


def test_read_launch_needs_a_task_id() -> None:
    with pytest.raises(LaunchDataError, match="task_id"):
        read_launch({"data": "e30="})
