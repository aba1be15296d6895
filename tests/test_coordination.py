"""Pure leadership decisions, the state machine's leadership gates, persistence round trips and
the in-process coordination (no ZooKeeper, no Mesos)."""

from __future__ import annotations

import json

import pytest

from scheduler.commands import KillTask, LaunchTasks, ReplyToRequest
from scheduler.coordination import FencedOut, InProcessCoordination, InProcessHub, registry_key
from scheduler.events import OffersReceived, QuerySubmitted, StatusUpdated, Tick
from scheduler.leadership import (
    Clock, Deposed, Elected, EnterSafeMode, FencedRequest, LeaderSeen, Leadership,
    LeadershipGained, LeadershipUpdated, LeaveSafeMode, Reconnected, RestoreAndRegister,
    SessionLost, StepDown, Suspended, Term, check_epoch, next_leadership,
)
from scheduler.state import SchedulerState, durable_placements, restore_query
from scheduler.testing import chain_query, offer
from testkit.waiting import wait_for

T1, T2 = Term(1, 1), Term(2, 7)
LEADER = Leadership("leader", T1, "http://a")


def test_election_makes_a_standby_leader_and_restores_before_registering() -> None:
    new, actions = next_leadership(Leadership(), Elected(T1, "http://a"))
    assert (new.role, new.epoch, new.leader) == ("leader", 1, "http://a")
    assert actions == (RestoreAndRegister(T1),)


def test_suspended_leader_enters_safe_mode_and_leaves_it_on_reconnect() -> None:
    safe, actions = next_leadership(LEADER, Suspended(10.0))
    assert safe.role == "safe_mode" and actions == (EnterSafeMode(),)
    back, actions = next_leadership(safe, Reconnected(11.0))
    assert back.role == "leader" and back.epoch == 1 and actions == (LeaveSafeMode(),)


def test_suspended_longer_than_the_session_timeout_steps_down() -> None:
    safe, _ = next_leadership(LEADER, Suspended(10.0))
    same, actions = next_leadership(safe, Clock(11.9), session_timeout=2.0)
    assert same == safe and actions == ()
    down, actions = next_leadership(safe, Clock(12.0), session_timeout=2.0)
    assert down.role == "standby" and isinstance(actions[0], StepDown)


@pytest.mark.parametrize("fact", [SessionLost(1.0), Deposed("resigned")])
def test_lost_session_or_deposition_steps_down(fact: object) -> None:
    down, actions = next_leadership(LEADER, fact)  # type: ignore[arg-type]
    assert down.role == "standby" and down.term is None
    assert len(actions) == 1 and isinstance(actions[0], StepDown)


def test_a_standby_ignores_connection_trouble_and_learns_the_leader() -> None:
    for fact in (Suspended(1.0), Reconnected(2.0), SessionLost(3.0), Deposed("x")):
        assert next_leadership(Leadership(), fact) == (Leadership(), ())
    seen, actions = next_leadership(Leadership(), LeaderSeen("http://b"))
    assert seen.leader == "http://b" and actions == ()


def test_epoch_verdicts() -> None:
    assert check_epoch(LEADER, None).accepted and check_epoch(LEADER, 1).accepted
    stale = check_epoch(Leadership("leader", T2, "http://a"), 1)
    assert (stale.accepted, stale.status) == (False, 409) and "stale" in stale.message
    standby = check_epoch(Leadership("standby", None, "http://b:1"), None)
    assert (standby.status, "http://b:1" in standby.message) == (421, True)
    assert check_epoch(Leadership("safe_mode", T1), 1).status == 503


def leading_state(epoch_term: Term = T1) -> SchedulerState:
    state = SchedulerState()
    state.handle(LeadershipGained("g", Leadership("leader", epoch_term, "a"), "F1", ()))
    return state


def test_state_refuses_a_stale_epoch_and_accepts_the_current_one() -> None:
    state = leading_state(T2)
    refused = state.handle(FencedRequest("s1", 1, QuerySubmitted("s1", chain_query("q", 1))))
    assert [(c.accepted, c.status) for c in refused if isinstance(c, ReplyToRequest)] == \
        [(False, 409)]
    assert state.queries == {}
    ok = state.handle(FencedRequest("s2", 2, QuerySubmitted("s2", chain_query("q", 1))))
    assert [c.accepted for c in ok if isinstance(c, ReplyToRequest)] == [True]
    assert "q" in state.queries


def test_safe_mode_launches_nothing_until_leadership_is_back() -> None:
    state = leading_state()
    state.handle(LeadershipUpdated("u", Leadership("safe_mode", T1, "a")))
    state.handle(QuerySubmitted("s", chain_query("q", 1)))  # unfenced, e.g. restored
    cmds = state.handle(OffersReceived("o", (offer("o1", "ag1"),)))
    assert not [c for c in cmds if isinstance(c, LaunchTasks)]
    state.handle(LeadershipUpdated("u2", Leadership("leader", T1, "a")))
    cmds = state.handle(Tick("t", 0.5))
    assert [c.agent_id for c in cmds if isinstance(c, LaunchTasks)] == ["ag1"]


def test_step_down_forgets_queries_and_kills_nothing() -> None:
    state = leading_state()
    state.handle(QuerySubmitted("s", chain_query("q", 1)))
    state.handle(LeadershipUpdated("d", Leadership("standby")))
    assert state.queries == {} and state.framework_id is None
    assert state.handle(StatusUpdated("u", "q.t0.a1", "RUNNING", agent_id="ag1")) == []


def test_restored_query_keeps_its_running_attempt_and_unknown_tasks_are_killed() -> None:
    old = leading_state()
    old.handle(QuerySubmitted("s", chain_query("q", 2)))
    old.handle(OffersReceived("o", (offer("o1", "ag1"),)))
    for tid in ("q.t0.a1", "q.t1.a1"):
        old.handle(StatusUpdated("u", tid, "RUNNING", agent_id="ag1"))
    saved = [(r.query, None, json.loads(json.dumps(durable_placements(r))))
             for r in old.queries.values()]  # placements as the registry keeps them
    assert saved[0][2]["tasks"]["q.t0"]["state"] == "running"  # oracle: what we launched

    new = SchedulerState()
    new.handle(LeadershipGained("g", Leadership("leader", T2, "b"), "F1", tuple(saved)))
    assert new.framework_id == "F1"
    t0 = new.queries["q"].tasks["q.t0"]
    assert (t0.state.value, t0.attempt, t0.launches, t0.agent_id) == ("running", 1, 1, "ag1")
    assert new.handle(StatusUpdated("r", "q.t0.a1", "RUNNING", agent_id="ag1")) == []
    unknown = new.handle(StatusUpdated("r2", "other.t0.a1", "RUNNING", agent_id="ag1"))
    assert [type(c) for c in unknown] == [KillTask]


def test_restore_of_a_task_waiting_for_restart_restarts_it() -> None:
    q = chain_query("q", 1)
    placed = {"phase": "active", "failure": "", "tasks": {"q.t0": {
        "attempt": 2, "launches": 2, "state": "failed", "restarting": True, "agent_id": "ag1",
        "hostname": "h", "ports": [], "endpoints": {}, "kill_requested": False,
        "last_failure": "boom"}}}
    record = restore_query(q, None, placed, now=5.0)
    assert record.tasks["q.t0"].restart_at == 5.0 and record.tasks["q.t0"].attempt == 2


def test_in_process_election_epochs_fencing_and_expiry() -> None:
    hub = InProcessHub()
    a, b = InProcessCoordination(hub), InProcessCoordination(hub)
    events: list[tuple[str, object]] = []
    try:
        a.campaign("a", lambda t: events.append(("a", t)), lambda r: events.append(("a-", r)))
        wait_for("a leading in term 1", lambda: ("a", Term(1, 1)) in events, 5.0, 0.02)
        b.campaign("b", lambda t: events.append(("b", t)), lambda r: events.append(("b-", r)))
        a.put("k", b"v1", Term(1, 1))
        assert b.leader().address == "a" and b.get("k") == b"v1"  # type: ignore[union-attr]
        a.expire()
        wait_for("b leading in term 2", lambda: ("b", Term(2, 2)) in events, 5.0, 0.02)
        wait_for("a told it lost", lambda: ("a-", "leadership lost") in events, 5.0, 0.02)
        with pytest.raises(FencedOut):
            a.put("k", b"stale", Term(1, 1))
        b.put("k", b"v2", Term(2, 2))
        assert a.get("k") == b"v2" and hub.leader.address == "b"  # type: ignore[union-attr]
    finally:
        a.close()
        b.close()


def test_registry_keys_escape_free_text() -> None:
    assert registry_key("channels", "q/s0") == "channels/q%2Fs0"
    assert registry_key("queries", "..") == "queries/%2E%2E"
    with pytest.raises(ValueError):
        registry_key("queries", "")


def test_a_new_leader_issues_epochs_above_the_persisted_ones() -> None:
    old = leading_state()
    old.epoch_floor = 5_000
    old.handle(QuerySubmitted("s", chain_query("q", 2)))
    old.handle(OffersReceived("o", (offer("o1", "ag1"),)))
    saved = [(r.query, None, json.loads(json.dumps(durable_placements(r))))
             for r in old.queries.values()]
    assert {t["epoch"] for t in saved[0][2]["tasks"].values()} == {5_001, 5_002}
    new = SchedulerState()  # a leader whose clock is behind: the persisted epochs still win
    new.handle(LeadershipGained("g", Leadership("leader", T2, "b"), "F1", tuple(saved)))
    assert new.queries["q"].tasks["q.t0"].epoch in (5_001, 5_002)
    new.handle(StatusUpdated("f", "q.t0.a1", "FAILED", agent_id="ag1"))
    new.handle(Tick("t", 100.0))
    out = new.handle(OffersReceived("o2", (offer("o2", "ag1", executor_ids=("x",)),)))
    epochs = [json.loads(t.data)["epoch"] for c in out if isinstance(c, LaunchTasks)
              for t in c.tasks]
    assert epochs == [5_003]
