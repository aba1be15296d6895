"""The restart policy per failover pattern and the retargeting of consumers, as pure decisions:
`scheduler.destinations` by itself, then the scheduler state machine fed events by hand."""

from __future__ import annotations

import json

import pytest

from scheduler.commands import LaunchTasks, RetargetChannels
from scheduler.config import SchedulerConfig
from scheduler.destinations import Past, apart_groups, destinations_for
from scheduler.events import ExecutorLost, OffersReceived, QuerySubmitted, Registered, Tick
from scheduler.lifecycle import TaskState
from scheduler.metrics import SchedulerMetrics
from scheduler.state import SchedulerState
from scheduler.testing import chain_query, offer
from scheduler.views import snapshot
from tests.test_scheduler_state import launched, of, update

# same_agent_wait is long on purpose: a standby must not wait for the agent it failed on
CONFIG = SchedulerConfig(max_attempts=4, backoff_initial=1.0, same_agent_wait=60.0,
                         failover_wait=10.0, offer_hold_seconds=2.0)


def warm_offer(offer_id: str, agent: str, ports: tuple[int, int] = (31000, 31009)):
    return offer(offer_id, agent, ports=(ports,), executor_ids=(f"elastiq-exec-{agent}",))


# ---- destinations, pure ------------------------------------------------------------------------

def where(failover: str | None, launches: int, previous: str | None, now: float,
          warm: frozenset[str] = frozenset(), gone: frozenset[str] = frozenset()):
    return destinations_for(Past(failover, launches, previous, 100.0), max(1, launches + 1),
                            now, gone, warm, same_agent_wait=60.0, failover_wait=10.0)


@pytest.mark.parametrize("mode", ["standby", "checkpoint"])
def test_protected_restart_goes_anywhere_but_its_old_agent_warm_first(mode: str) -> None:
    d = where(mode, 1, "a1", 100.0, warm=frozenset({"a1", "a3", "a2"}))
    assert (d.allowed, d.excluded, d.preferred) == (None, frozenset({"a1"}), ("a2", "a3"))
    assert d.reason == f"{mode} failover: any agent but a1, warm first (a2, a3)"
    later = where(mode, 1, "a1", 110.0, warm=frozenset({"a1", "a3"}))
    assert (later.allowed, later.excluded, later.preferred) == (None, frozenset(), ("a3", "a1"))
    assert "no other agent within 10 s, any agent including a1" in later.reason


def test_first_launch_and_tasks_without_a_pattern_follow_the_default_policy() -> None:
    assert where("standby", 0, None, 100.0).reason == "first launch: any agent"
    waiting = where(None, 1, "a1", 159.0, warm=frozenset({"a2"}))
    assert (waiting.allowed, waiting.preferred, waiting.excluded) == \
        (frozenset({"a1"}), ("a1",), frozenset())
    assert where(None, 1, "a1", 160.0).allowed is None
    assert where(None, 1, "a1", 101.0, gone=frozenset({"a1"})).allowed is None


def test_a_replica_fails_over_at_once_like_a_standby() -> None:
    moved = where("replica", 1, "a1", 101.0, warm=frozenset({"a1", "a2"}))
    assert (moved.allowed, moved.preferred, moved.excluded) == (None, ("a2",), frozenset({"a1"}))
    assert moved.reason.startswith("replica failover: any agent but a1")


def test_initially_apart_from_counts_at_the_first_launch_only() -> None:
    assert apart_groups(("r2",), ("src", "r2"), 0) == ("r2", "src")
    assert apart_groups(("r2",), ("src",), 1) == ("r2",)


# ---- the state machine ---------------------------------------------------------------------------

def protected_query(mode: str):
    """src (q.t0) -> protected (q.t1, `mode`, kept apart from src and sink at its first launch
    only) -> sink (q.t2)."""
    return chain_query("q", 3, groups=("src", "f", "sink"),
                       initially_apart=((), ("src", "sink"), ()), failover=(None, mode, None))


def start(query, *offers) -> tuple[SchedulerState, dict[str, str]]:
    """Submit `query`, place it on `offers`, report every task RUNNING; task id -> agent."""
    s = SchedulerState(CONFIG)
    s.handle(Registered("r", "fw-1", "m:5050"))
    s.handle(Tick("t", 100.0))
    s.handle(QuerySubmitted("s", query))
    out = s.handle(OffersReceived("o", tuple(offers)))
    placed = {mid: agent for mid, (agent, _) in launched(out).items()}
    assert len(placed) == len(query.tasks), snapshot(s)
    for mid, agent in placed.items():
        s.handle(update(mid, "RUNNING", agent))
    return s, {mid.rpartition(".a")[0]: agent for mid, agent in placed.items()}


def record(s: SchedulerState, task_id: str):
    return s.queries["q"].tasks[task_id]


@pytest.mark.parametrize("mode", ["standby", "checkpoint"])
def test_protected_task_fails_over_at_once_next_to_its_neighbours_and_retargets(mode: str
                                                                                ) -> None:
    s, where_ = start(protected_query(mode), warm_offer("o1", "a1"),
                      warm_offer("o2", "a2", (32000, 32009)))
    assert where_ == {"q.t0": "a1", "q.t1": "a2", "q.t2": "a1"}  # apart from src and sink
    old_endpoint = record(s, "q.t2").endpoints["q/s1"]
    assert old_endpoint == "tcp://host-a2:32000"
    s.handle(Tick("t", 101.0))
    out = s.handle(ExecutorLost("x", "a2", "elastiq-exec-a2", 9))
    assert record(s, "q.t1").state is TaskState.PENDING  # no backoff
    assert record(s, "q.t1").attempt == 2 and launched(out) == {}
    # a2 still offers (and first); the failover skips it and lands next to src and sink on a1,
    # without waiting for a2 although same_agent_wait is 60 s
    out = s.handle(OffersReceived("o", (warm_offer("o3", "a2", (32000, 32009)),
                                        warm_offer("o4", "a1"))))
    ((mid, (agent, data)),) = launched(out).items()
    assert (mid, agent, data["attempt"]) == ("q.t1.a2", "a1", 2)
    new_endpoint = data["endpoints"]["q/s1"]
    assert new_endpoint.startswith("tcp://host-a1:") and new_endpoint != old_endpoint
    assert data["endpoints"]["q/s0"] == record(s, "q.t0").endpoints["q/s0"]
    assert of(RetargetChannels, out) == [RetargetChannels(
        "o", "a1", "elastiq-exec-a1", "q", "q.t2.a1", (("q/s1", new_endpoint),))]
    assert json.loads(of(RetargetChannels, out)[0].data) == {
        "kind": "retarget", "task": "q.t2.a1", "endpoints": {"q/s1": new_endpoint}}
    assert record(s, "q.t2").endpoints["q/s1"] == new_endpoint  # its own relaunch gets it
    note = record(s, "q.t1").history[-1].note
    assert note == f"placed on agent a1: {mode} failover: any agent but a2, warm first (a1)"
    assert f"{mode} failover after: executor elastiq-exec-a2 lost" in \
        record(s, "q.t1").history[-2].note


def test_retarget_and_failover_metrics_by_pattern() -> None:
    s, _ = start(protected_query("standby"), warm_offer("o1", "a1"),
                 warm_offer("o2", "a2", (32000, 32009)))
    metrics = SchedulerMetrics()
    metrics.observe_state(s, 100.0)
    event = ExecutorLost("x", "a2", "elastiq-exec-a2", 9)
    metrics.observe_step(event, s.handle(event), s, 101.0)
    event = OffersReceived("o", (warm_offer("o4", "a1"),))
    metrics.observe_step(event, s.handle(event), s, 101.5)
    event = update("q.t1.a2", "RUNNING", "a1")
    metrics.observe_step(event, s.handle(event), s, 103.0)
    value = metrics.registry.get_sample_value
    assert value("elastiq_channel_retargets_total", {"query": "q"}) == 1
    assert value("elastiq_failovers_total", {"query": "q", "pattern": "standby"}) == 1
    assert value("elastiq_failovers_total", {"query": "q", "pattern": "restart"}) is None
    assert value("elastiq_failover_gap_seconds_sum", {"pattern": "standby"}) == 2.0


def test_standby_with_only_its_failed_agent_offering_waits_failover_wait_then_goes_back(
        ) -> None:
    s, where_ = start(protected_query("standby"), warm_offer("o1", "a1"),
                      warm_offer("o2", "a2", (32000, 32009)))
    s.handle(Tick("t", 200.0))
    s.handle(update("q.t1.a1", "FAILED", "a2"))  # its executor on a2 lives on
    assert record(s, "q.t1").state is TaskState.PENDING
    a2 = lambda oid: warm_offer(oid, "a2", (32000, 32009))  # noqa: E731
    assert launched(s.handle(OffersReceived("o", (a2("o3"),)))) == {}
    assert snapshot(s)["queries"]["q"]["tasks"][1]["waiting_for"] == \
        "no offer from an agent it may use (the offered agents but a2)"
    s.handle(Tick("t", 209.9))
    assert launched(s.handle(OffersReceived("o", (a2("o5"),)))) == {}
    out = s.handle(Tick("t", 210.0))  # the offer o5, held, is taken now
    assert {m: a for m, (a, _) in launched(out).items()} == {"q.t1.a2": "a2"}
    assert "no other agent within 10 s, any agent including a2" in \
        record(s, "q.t1").history[-1].note
    assert of(RetargetChannels, out) == []  # same agent, same port: nothing moved


def replica_query():
    """Two hot-standby replicas (q.t0, q.t1) kept apart always; q.t0 also starts away from the
    sink (q.t2)."""
    return chain_query("q", 3, groups=("r1", "r2", "sink"), apart=(("r2",), ("r1",), ()),
                       initially_apart=(("sink",), (), ()), failover=("replica", "replica"))


def test_a_replica_fails_over_at_once_apart_from_the_other_replica(
        ) -> None:
    small_a2 = offer("o2", "a2", cpus=1.0, executor_ids=("elastiq-exec-a2",))  # one task
    s, where_ = start(replica_query(), warm_offer("o1", "a1"), small_a2, warm_offer("o3", "a3"))
    assert where_ == {"q.t0": "a1", "q.t1": "a2", "q.t2": "a3"}
    s.handle(Tick("t", 200.0))
    s.handle(ExecutorLost("x", "a1", "elastiq-exec-a1", 9))
    assert record(s, "q.t0").state is TaskState.PENDING  # no backoff: a replica fails over
    # never back on a1 while failover_wait runs, and never next to the other replica (a2)
    assert launched(s.handle(OffersReceived("o", (warm_offer("o4", "a1"),)))) == {}
    out = s.handle(OffersReceived("o", (warm_offer("o5", "a2"),)))
    assert launched(out) == {}
    assert "ruled out by apart_from: a2 holds r2" in \
        snapshot(s)["queries"]["q"]["tasks"][0]["waiting_for"]
    # the sink's agent no longer blocks it: initially_apart_from held at the first launch only
    out = s.handle(OffersReceived("o", (warm_offer("o6", "a3", (33000, 33009)),)))
    assert {m: a for m, (a, _) in launched(out).items()} == {"q.t0.a2": "a3"}
    (retarget,) = of(RetargetChannels, out)  # the consumer q.t1 reads q/s0
    assert (retarget.mesos_task_id, retarget.agent_id) == ("q.t1.a1", "a2")
    assert dict(retarget.endpoints) == {"q/s0": "tcp://host-a3:33000"}


def test_a_default_restart_that_moves_retargets_its_consumer() -> None:
    s, where_ = start(chain_query("q", 2, groups=("a", "b"), apart=(("b",), ())),
                      warm_offer("o1", "a1"), warm_offer("o2", "a2"))
    assert where_ == {"q.t0": "a1", "q.t1": "a2"}
    s.handle(update("q.t0.a1", "FAILED", "a1"))
    s.handle(Tick("t", 101.0))  # backoff over: pending, waits for a1 until 161
    s.handle(Tick("t", 161.0))
    out = s.handle(OffersReceived("o", (warm_offer("o3", "a3", (34000, 34009)),)))
    assert {m: a for m, (a, _) in launched(out).items()} == {"q.t0.a2": "a3"}
    assert of(RetargetChannels, out) == [RetargetChannels(
        "o", "a2", "elastiq-exec-a2", "q", "q.t1.a1", (("q/s0", "tcp://host-a3:34000"),))]
    assert of(LaunchTasks, out)[0].stimulus_id == "o"
