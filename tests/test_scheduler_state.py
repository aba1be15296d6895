"""The scheduler state machine, fed events by hand: no Mesos, no sockets, no clock."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scheduler.commands import (
    Command, DeclineOffers, KillTask, LaunchTasks, ReconcileTasks, ReplyToRequest, ReviveOffers,
    SuppressOffers,
)
from scheduler.config import SchedulerConfig
from scheduler.events import (
    AgentLost, Disconnected, ExecutorLost, OffersReceived, QueryStopRequested, QuerySubmitted, Registered,
    StatusUpdated, Tick,
)
from scheduler.lifecycle import IllegalTransition, TaskState
from scheduler.mesos_json import message_event
from scheduler.state import SchedulerState
from scheduler.testing import chain_query, offer
from scheduler.views import snapshot

CONFIG = SchedulerConfig(max_attempts=3, backoff_initial=1.0, backoff_factor=2.0,
                         same_agent_wait=5.0, offer_hold_seconds=2.0)


def of(kind: type, commands: list[Command]) -> list:
    return [c for c in commands if isinstance(c, kind)]


def launched(commands: list[Command]) -> dict[str, tuple[str, dict]]:
    """mesos task id -> (agent id, launch data) for every task in LaunchTasks commands."""
    return {t.mesos_task_id: (c.agent_id, json.loads(t.data))
            for c in of(LaunchTasks, commands) for t in c.tasks}


def update(mid: str, state: str, agent: str = "a1", sid: str = "u") -> StatusUpdated:
    return StatusUpdated(sid, mid, state, "REASON_X", f"{state.lower()} says executor", agent,
                         f"elastiq-exec-{agent}", "SOURCE_EXECUTOR")


def task_state(s: SchedulerState, task_id: str) -> TaskState:
    return s.queries[task_id.rpartition(".t")[0]].tasks[task_id].state


@pytest.fixture
def running() -> SchedulerState:
    """A registered scheduler with query q (q.t0 -> q.t1) running on agent a1."""
    s = SchedulerState(CONFIG)
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    s.handle(QuerySubmitted("s", chain_query("q", 2)))
    out = s.handle(OffersReceived("o", (offer("o1", "a1"),)))
    assert set(launched(out)) == {"q.t0.a1", "q.t1.a1"}
    for mid in ("q.t0.a1", "q.t1.a1"):
        s.handle(update(mid, "RUNNING"))
    return s


def test_submit_then_offer_launches_the_gang_with_ports_and_launch_data() -> None:
    s = SchedulerState(CONFIG)
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    out = s.handle(QuerySubmitted("sub-1", chain_query("q", 2)))
    assert of(ReplyToRequest, out) == [ReplyToRequest("sub-1", True, 200, "query q accepted")]
    assert of(ReviveOffers, out) == [ReviveOffers("sub-1")]
    out = s.handle(OffersReceived("off-1", (offer("o1", "a1", ports=((31000, 31000),)),)))
    (cmd,) = of(LaunchTasks, out)
    assert (cmd.stimulus_id, cmd.offer_ids, cmd.agent_id, cmd.executor_id) == \
        ("off-1", ("o1",), "a1", "elastiq-exec-a1")
    tasks = {t.mesos_task_id: t for t in cmd.tasks}
    assert set(tasks) == {"q.t0.a1", "q.t1.a1"}
    assert tasks["q.t0.a1"].ports == (31000,) and tasks["q.t1.a1"].ports == ()
    data0, data1 = (json.loads(tasks[m].data) for m in ("q.t0.a1", "q.t1.a1"))
    assert data0["endpoints"] == {"q/s0": "tcp://host-a1:31000"} == data1["endpoints"]
    assert data0["attempt"] == 1 and data0["task"]["task_id"] == "q.t0"
    assert data0["query"]["query_id"] == "q"
    assert [c["channel_id"] for c in data1["query"]["channels"]] == ["q/s0"]
    assert task_state(s, "q.t0") is TaskState.STAGING


def test_status_updates_walk_the_lifecycle(running: SchedulerState) -> None:
    assert snapshot(running)["queries"]["q"]["status"] == "running"
    hist = running.queries["q"].tasks["q.t0"].history
    assert [(h.start.value, h.finish.value) for h in hist] == \
        [("pending", "staging"), ("staging", "running")]


def test_not_enough_resources_holds_then_declines_with_reason() -> None:
    s = SchedulerState(CONFIG)
    s.handle(Tick("t0", 100.0))
    s.handle(QuerySubmitted("s", chain_query("q", 1, cpus=2.0)))
    out = s.handle(OffersReceived("o", (offer("o1", "a1", cpus=1.5),)))
    assert out == []  # held: another offer may arrive while some demand waits
    view = snapshot(s)["queries"]["q"]["tasks"][0]
    assert "needs 2.1 cpus, offer has 1.5 on agent a1" in view["waiting_for"]
    out = s.handle(Tick("t1", 102.5))
    (d,) = of(DeclineOffers, out)
    assert d.offer_ids == ("o1",) and d.stimulus_id == "t1"
    assert "q.t0" in d.reason and "needs 2.1 cpus" in d.reason  # 2 + the executor's 0.1
    assert s.held == {}


def test_offers_nothing_needs_are_declined_at_once_and_offers_suppressed() -> None:
    s = SchedulerState(CONFIG)
    out = s.handle(OffersReceived("o", (offer("o1", "a1"),)))
    assert of(DeclineOffers, out)[0].reason == "no pending task needs it"
    assert of(SuppressOffers, out) == [SuppressOffers("o")]


def test_a_query_submitted_before_registration_revives_offers_once_registered() -> None:
    """A REVIVE needs the framework id, which only registration brings (pymesos asserts it):
    before that, submitting asks for nothing, and registering revives because tasks wait."""
    s = SchedulerState(CONFIG)
    out = s.handle(QuerySubmitted("sub-1", chain_query("q", 2)))
    assert of(ReplyToRequest, out)[0].accepted and of(ReviveOffers, out) == []
    out = s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    assert of(ReviveOffers, out) == [ReviveOffers("r")]
    s.handle(Disconnected("d"))
    assert of(ReviveOffers, s.handle(QuerySubmitted("sub-2", chain_query("q2", 1)))) == []


def test_failed_task_restarts_on_the_same_agent_with_next_attempt(running: SchedulerState
                                                                 ) -> None:
    s = running
    s.handle(Tick("t", 10.0))
    assert s.handle(update("q.t0.a1", "FAILED", sid="fail")) == []
    assert task_state(s, "q.t0") is TaskState.FAILED
    assert s.handle(Tick("t1", 10.5)) == []  # backoff: 1 s
    out = s.handle(Tick("t2", 11.0))
    assert of(ReviveOffers, out) and task_state(s, "q.t0") is TaskState.PENDING
    # a2 comes first, but the restart waits for a1 (its checkpoint and warm session are there)
    out = s.handle(OffersReceived("o2", (offer("o2", "a2"),)))
    assert launched(out) == {}
    out = s.handle(OffersReceived("o3", (offer("o3", "a1", executor_ids=("elastiq-exec-a1",)),)))
    (mid,) = launched(out)
    agent, data = launched(out)[mid]
    assert (mid, agent, data["attempt"]) == ("q.t0.a2", "a1", 2)
    assert data["endpoints"] == running.queries["q"].tasks["q.t1"].endpoints  # same port kept
    assert [d.offer_ids for d in of(DeclineOffers, out)] == [("o2",)]


def test_restart_takes_another_agent_after_waiting_for_its_own(running: SchedulerState) -> None:
    s = running
    s.handle(update("q.t1.a1", "FAILED"))
    s.handle(Tick("t", 1.0))
    s.handle(OffersReceived("o2", (offer("o2", "a2"),)))
    out = s.handle(Tick("t", 1.0 + CONFIG.same_agent_wait))
    assert {m: a for m, (a, _) in launched(out).items()} == {"q.t1.a2": "a2"}


def test_restart_budget_exhausted_fails_query_with_reason(running: SchedulerState) -> None:
    s, now = running, 0.0
    for attempt in (1, 2):
        s.handle(update(f"q.t0.a{attempt}", "FAILED"))
        now += 100
        s.handle(Tick("t", now))
        s.handle(OffersReceived("o", (offer(f"o{attempt}", "a1"),)))
        s.handle(update(f"q.t0.a{attempt + 1}", "RUNNING"))
    out = s.handle(update("q.t0.a3", "FAILED", sid="last"))
    q = snapshot(s)["queries"]["q"]
    assert q["phase"] == "failed"
    assert "q.t0 failed 3 times (max 3)" in q["failure"] and "failed says executor" in q["failure"]
    assert of(KillTask, out) == [KillTask("last", "q.t1.a1", "a1")]
    s.handle(Tick("t", now + 1000))
    assert task_state(s, "q.t0") is TaskState.FAILED  # no restart after the query failed


def test_losing_the_executor_is_no_failure_of_the_task(running: SchedulerState) -> None:
    """The budget counts the task's own failures: a task whose executor dies again and again
    (what the failover patterns exist to survive) keeps being relaunched."""
    s, now = running, 0.0
    for attempt in range(1, 6):
        s.handle(update(f"q.t0.a{attempt}", "LOST"))
        now += 100
        s.handle(Tick("t", now))
        s.handle(OffersReceived("o", (offer(f"o{attempt}", "a1"),)))
        s.handle(update(f"q.t0.a{attempt + 1}", "RUNNING"))
    q = snapshot(s)["queries"]["q"]
    assert q["phase"] == "active", q["failure"]
    assert task_state(s, "q.t0") is TaskState.RUNNING
    s.handle(update("q.t0.a6", "FAILED"))  # its own failures still count, from zero
    assert snapshot(s)["queries"]["q"]["phase"] == "active"


def test_an_executor_terminated_under_the_task_is_no_failure_of_it(running: SchedulerState
                                                                   ) -> None:
    """What an agent reports when the executor process dies: TASK_FAILED with the reason
    REASON_EXECUTOR_TERMINATED."""
    s, now = running, 0.0
    for attempt in range(1, 6):
        s.handle(StatusUpdated("u", f"q.t0.a{attempt}", "FAILED", "REASON_EXECUTOR_TERMINATED",
                               "executor exited with code -9", "a1", "elastiq-exec-a1",
                               "SOURCE_AGENT"))
        now += 100
        s.handle(Tick("t", now))
        s.handle(OffersReceived("o", (offer(f"o{attempt}", "a1"),)))
        s.handle(update(f"q.t0.a{attempt + 1}", "RUNNING"))
    assert snapshot(s)["queries"]["q"]["phase"] == "active"
    assert task_state(s, "q.t0") is TaskState.RUNNING


def test_agent_lost_makes_its_tasks_pending_again_elsewhere(running: SchedulerState) -> None:
    s = running
    s.handle(Tick("t", 5.0))
    out = s.handle(AgentLost("lost", "a1"))
    assert out == [] and task_state(s, "q.t0") is TaskState.LOST
    s.handle(Tick("t", 6.0))
    assert {task_state(s, t) for t in ("q.t0", "q.t1")} == {TaskState.PENDING}
    out = s.handle(OffersReceived("o", (offer("o9", "a2"),)))  # no wait for a gone agent
    assert {m: a for m, (a, _) in launched(out).items()} == {"q.t0.a2": "a2", "q.t1.a2": "a2"}
    # the late TASK_LOST of the old attempt changes nothing
    assert s.handle(update("q.t0.a1", "LOST")) == [] and task_state(s, "q.t0") is TaskState.STAGING


def test_executor_lost_loses_only_tasks_of_our_executor_there(running: SchedulerState) -> None:
    s = running
    s.handle(ExecutorLost("x", "a1", "someone-else", 9))
    assert task_state(s, "q.t0") is TaskState.RUNNING
    s.handle(ExecutorLost("x", "a1", "elastiq-exec-a1", 9))
    assert task_state(s, "q.t0") is TaskState.LOST
    assert "exec-a1 lost (status 9)" in snapshot(s)["queries"]["q"]["tasks"][0]["last_failure"]


def test_stop_query_kills_its_tasks_and_ends_stopped(running: SchedulerState) -> None:
    s = running
    out = s.handle(QueryStopRequested("stop", "q"))
    assert of(ReplyToRequest, out)[0].accepted
    assert sorted(k.mesos_task_id for k in of(KillTask, out)) == ["q.t0.a1", "q.t1.a1"]
    assert snapshot(s)["queries"]["q"]["phase"] == "stopping"
    s.handle(update("q.t0.a1", "KILLED"))
    assert snapshot(s)["queries"]["q"]["phase"] == "stopping"
    out = s.handle(update("q.t1.a1", "KILLED"))
    assert snapshot(s)["queries"]["q"]["phase"] == "stopped"
    assert of(SuppressOffers, out)
    s.handle(Tick("t", 1000.0))
    assert task_state(s, "q.t0") is TaskState.KILLED  # a stopped query never restarts


def test_stop_before_launch_cancels_pending_tasks() -> None:
    s = SchedulerState(CONFIG)
    s.handle(QuerySubmitted("s", chain_query("q", 2)))
    out = s.handle(QueryStopRequested("stop", "q"))
    assert of(KillTask, out) == []
    assert snapshot(s)["queries"]["q"]["phase"] == "stopped"


def test_task_killed_without_our_asking_is_restarted(running: SchedulerState) -> None:
    s = running
    s.handle(update("q.t1.a1", "KILLED"))
    s.handle(Tick("t", 50.0))
    assert task_state(s, "q.t1") is TaskState.PENDING
    assert s.queries["q"].tasks["q.t1"].attempt == 2


def test_illegal_transition_raises_with_history(running: SchedulerState) -> None:
    with pytest.raises(IllegalTransition) as e:
        running.handle(update("q.t0.a1", "STAGING", sid="odd"))
    text = str(e.value)
    assert "q.t0: illegal transition running -> staging" in text
    assert "[o] a1 pending -> staging" in text and "[u] a1 staging -> running" in text


def test_stale_updates_of_an_old_attempt_are_ignored(running: SchedulerState) -> None:
    s = running
    s.handle(update("q.t0.a1", "FAILED"))
    s.handle(Tick("t", 100.0))
    s.handle(OffersReceived("o", (offer("o2", "a1"),)))
    s.handle(update("q.t0.a2", "RUNNING"))
    assert s.handle(update("q.t0.a1", "FAILED")) == []
    assert task_state(s, "q.t0") is TaskState.RUNNING
    # a zombie of the old attempt that claims to run is killed, the current one untouched
    out = s.handle(update("q.t0.a1", "RUNNING", sid="zombie"))
    assert out == [KillTask("zombie", "q.t0.a1", "a1")]
    assert task_state(s, "q.t0") is TaskState.RUNNING


def test_unknown_running_task_is_killed_and_unknown_finished_one_ignored() -> None:
    s = SchedulerState(CONFIG)
    assert s.handle(update("other.t0.a1", "RUNNING", sid="u1")) == \
        [KillTask("u1", "other.t0.a1", "a1")]
    assert s.handle(update("not-ours", "FINISHED")) == []


def test_registration_reconciles_explicitly_then_implicitly(running: SchedulerState) -> None:
    out = running.handle(Registered("re", "fw-1", "127.0.0.1:5050"))
    explicit, implicit = of(ReconcileTasks, out)
    assert sorted(explicit.tasks) == [("q.t0.a1", "a1"), ("q.t1.a1", "a1")]
    assert implicit.tasks == ()


def test_heartbeat_figures_are_kept_per_current_attempt(running: SchedulerState) -> None:
    beat = {"kind": "heartbeat", "tasks": {"q.t0.a1": {"rows_per_s": 120.5, "batch": 7},
                                           "q.t1.a9": {"rows_per_s": 1}}}
    running.handle(message_event("hb", "a1", "elastiq-exec-a1",
                                 json.dumps(beat).encode()))
    tasks = {t["task_id"]: t for t in snapshot(running)["queries"]["q"]["tasks"]}
    assert tasks["q.t0"]["figures"] == {"rows_per_s": 120.5, "batch": 7.0}
    assert tasks["q.t1"]["figures"] == {}
    assert running.handle(message_event("hb", "a1", "e", b"\xff not json")) == []


def test_bad_duplicate_and_unknown_requests_get_replies() -> None:
    s = SchedulerState(CONFIG)
    bad = replace(chain_query("q", 2), channels=())
    (reply,) = of(ReplyToRequest, s.handle(QuerySubmitted("b", bad)))
    assert (reply.accepted, reply.status) == (False, 400)
    assert "unknown channel q/s0" in reply.message
    assert s.queries == {}
    s.handle(QuerySubmitted("s", chain_query("q", 2)))
    (dup,) = of(ReplyToRequest, s.handle(QuerySubmitted("d", chain_query("q", 2))))
    assert (dup.accepted, dup.status) == (False, 409)
    (unknown,) = of(ReplyToRequest, s.handle(QueryStopRequested("x", "nope")))
    assert (unknown.accepted, unknown.status) == (False, 404)


def test_resubmitted_query_uses_fresh_mesos_task_ids(running: SchedulerState) -> None:
    s = running
    s.handle(QueryStopRequested("stop", "q"))
    s.handle(update("q.t0.a1", "KILLED"))
    s.handle(update("q.t1.a1", "KILLED"))
    s.handle(QuerySubmitted("again", chain_query("q", 2)))
    out = s.handle(OffersReceived("o", (offer("o5", "a1"),)))
    assert set(launched(out)) == {"q.t0.a2", "q.t1.a2"}


def test_registration_without_tasks_reconciles_implicitly_only() -> None:
    s = SchedulerState(CONFIG)
    out = s.handle(Registered("r", "fw-1", "m:5050"))
    assert of(ReconcileTasks, out) == [ReconcileTasks("r", ())]
    assert of(SuppressOffers, out) == [SuppressOffers("r")]  # nothing to place yet
    assert (s.framework_id, s.connected) == ("fw-1", True)


def test_unknown_tasks_are_left_alone_when_configured() -> None:
    s = SchedulerState(replace(CONFIG, kill_unknown_tasks=False))
    assert s.handle(update("other.t0.a1", "RUNNING")) == []


def test_every_launch_gets_a_larger_fencing_epoch_and_a_resubmission_too(
        running: SchedulerState) -> None:
    s = running
    first = {t.task_id: t.epoch for t in s.queries["q"].tasks.values()}
    assert sorted(first.values()) == [1, 2]  # one per launch, from the floor 0 of this state
    s.handle(Tick("t", 10.0))
    s.handle(update("q.t0.a1", "FAILED"))
    s.handle(Tick("t2", 11.0))
    out = s.handle(OffersReceived("o3", (offer("o3", "a1", executor_ids=("elastiq-exec-a1",)),)))
    assert launched(out)["q.t0.a2"][1]["epoch"] == 3  # the relaunch outranks every earlier one
    s.handle(QueryStopRequested("stop", "q"))
    for mid in ("q.t0.a2", "q.t1.a1"):
        s.handle(update(mid, "KILLED"))
    s.handle(QuerySubmitted("again", chain_query("q", 2)))
    out = s.handle(OffersReceived("o", (offer("o5", "a1"),)))
    assert sorted(d["epoch"] for _, d in launched(out).values()) == [4, 5]


def test_a_state_started_at_a_floor_issues_epochs_above_it() -> None:
    s = SchedulerState(CONFIG, epoch_floor=1_700_000_000_000)
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    s.handle(QuerySubmitted("s", chain_query("q", 1)))
    out = s.handle(OffersReceived("o", (offer("o1", "a1"),)))
    assert [d["epoch"] for _, d in launched(out).values()] == [1_700_000_000_001]
