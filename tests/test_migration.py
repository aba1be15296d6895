"""Task migration in the scheduler's state machine (the paper's section 4.2; docs/control.md):
quiesce the task (a graceful kill), replicate its state (its checkpoint and channel logs are on
storage every agent reaches), redirect its inputs and outputs (relaunch on the target, retarget its
consumers), unquiesce. Pure: events in, commands out. The run with real processes is in
tests/test_patterns_failover_cluster.py."""

from __future__ import annotations

import pytest

from scheduler.commands import KillTask, ReplyToRequest, RetargetChannels
from scheduler.events import OffersReceived, TaskMigrationRequested, Tick
from scheduler.lifecycle import TaskState
from scheduler.state import SchedulerState
from scheduler.testing import chain_query
from tests.test_failover_policy import record, start, warm_offer
from tests.test_scheduler_state import launched, of, update


def three_agents() -> tuple[SchedulerState, dict[str, str]]:
    """src (q.t0) -> mid (q.t1) -> sink (q.t2); mid stays apart from group "far"."""
    query = chain_query("q", 3, groups=("src", "mid", "far"), apart=((), ("far",), ()))
    return start(query, warm_offer("o1", "a1"), warm_offer("o2", "a2", (32000, 32009)),
                 warm_offer("o3", "a3", (33000, 33009)))


def migrate(s: SchedulerState, task: str, agent: str, query: str = "q") -> list:
    return s.handle(TaskMigrationRequested("m", query, task, agent))


def test_a_running_task_is_quiesced_then_relaunched_on_the_target_and_its_reader_follows(
        ) -> None:
    s, where = three_agents()
    target = next(a for a in ("a1", "a2", "a3") if a not in (where["q.t1"], where["q.t2"]))
    out = migrate(s, "q.t1", target)
    (reply,) = of(ReplyToRequest, out)
    assert (reply.accepted, reply.status) == (True, 202)
    assert of(KillTask, out) == [KillTask("m", "q.t1.a1", where["q.t1"])]  # quiesce
    assert record(s, "q.t1").state is TaskState.RUNNING  # until its executor says it stopped
    s.handle(Tick("t", 101.0))
    out = s.handle(update("q.t1.a1", "KILLED", where["q.t1"]))
    assert record(s, "q.t1").state is TaskState.PENDING and record(s, "q.t1").failures == 0
    # offers from everywhere: it goes to the target alone, at once
    offers = (warm_offer("o4", "a1"), warm_offer("o5", "a2", (32000, 32009)),
              warm_offer("o6", "a3", (33000, 33009)))
    out = s.handle(OffersReceived("o", offers))
    ((mid, (agent, data)),) = launched(out).items()
    assert (mid, agent, data["attempt"]) == ("q.t1.a2", target, 2)
    new_endpoint = data["endpoints"]["q/s1"]
    assert of(RetargetChannels, out)[0].endpoints == (("q/s1", new_endpoint),)
    assert record(s, "q.t1").migrate_to is None
    assert f"migration from {where['q.t1']} to {target}" in record(s, "q.t1").history[-1].note


@pytest.mark.parametrize("query, task, agent, status, words", [
    ("nope", "q.t1", "a3", 404, "no query nope"),
    ("q", "q.t9", "a3", 404, "has no task q.t9 (its tasks: q.t0, q.t1, q.t2)"),
    ("q", "q.t1", "a9", 404, "no agent a9 (agents: a1, a2, a3)"),
])
def test_unknown_query_task_or_agent_is_refused_and_nothing_moves(
        query: str, task: str, agent: str, status: int, words: str) -> None:
    s, where = three_agents()
    out = migrate(s, task, agent, query)
    assert [(c.accepted, c.status) for c in of(ReplyToRequest, out)] == [(False, status)]
    assert words in of(ReplyToRequest, out)[0].message
    assert not of(KillTask, out)
    assert all(t.state is TaskState.RUNNING and t.migrate_to is None
               for t in s.queries["q"].tasks.values())


def test_the_same_agent_an_apart_group_or_a_task_not_running_is_refused() -> None:
    s, where = three_agents()
    here = migrate(s, "q.t1", where["q.t1"])
    assert of(ReplyToRequest, here)[0].status == 400 and not of(KillTask, here)
    apart = migrate(s, "q.t1", where["q.t2"])  # q.t2's group "far" must stay away from q.t1
    assert of(ReplyToRequest, apart)[0].status == 409
    assert "kept apart from q.t2" in of(ReplyToRequest, apart)[0].message
    target = next(a for a in ("a1", "a2", "a3") if a not in (where["q.t1"], where["q.t2"]))
    assert of(ReplyToRequest, migrate(s, "q.t1", target))[0].accepted
    again = migrate(s, "q.t1", target)  # already on its way
    assert of(ReplyToRequest, again)[0].status == 409 and not of(KillTask, again)
