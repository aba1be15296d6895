"""The load distributor in the scheduler's state machine (docs/load.md, "Load distribution"):
events in (heartbeats with busy time, ticks), commands out. Two agents, four tasks on two
anti-correlated waves, first fit putting three on one agent: once enough history exists the
distributor starts one migration (the protocol `elastiq migrate` uses: a graceful kill, then a
relaunch on the target alone), counts and explains it, then keeps its cool-down; it never moves
a task of a query that did not opt in (distribute="true") or that is mid-rescale or
mid-migration."""

from __future__ import annotations

import math
from dataclasses import replace

from common.messages import Heartbeat
from scheduler.commands import KillTask, LaunchTasks
from scheduler.config import SchedulerConfig
from scheduler.distributor import DistributionSettings
from scheduler.events import (HeartbeatReceived, OffersReceived, QuerySubmitted, Registered,
                              TaskMigrationRequested, Tick)
from scheduler.lifecycle import TaskState
from scheduler.metrics import SchedulerMetrics
from scheduler.state import SchedulerState
from scheduler.testing import chain_query, offer
from scheduler.views import snapshot
from elastiq.service_cli import distribution_lines
from tests.test_migration import three_agents
from tests.test_scheduler_state import launched, of, update

SETTINGS = DistributionSettings(period_seconds=10.0, threshold=0.5, min_slots=8,
                                task_cooldown_seconds=300.0, pair_cooldown_seconds=120.0)
CONFIG = SchedulerConfig(offer_hold_seconds=2.0, distribution=SETTINGS)
PERIOD = 40.0  # seconds of one wave


def start(distribute: bool = True, apart: tuple[tuple[str, ...], ...] = ()
          ) -> tuple[SchedulerState, dict[str, str]]:
    """q.t0..q.t3 (1 cpu each) placed first fit: a1 (3.1 cpus: three tasks and the executor's
    0.1) and a2 (4 cpus: the fourth); every task RUNNING. Task id -> agent."""
    s = SchedulerState(CONFIG)
    s.handle(Registered("r", "fw-1", "m:5050"))
    s.handle(Tick("t", 0.0))
    s.handle(QuerySubmitted("s", replace(chain_query("q", 4, apart=apart),
                                         distribute=distribute)))
    out = s.handle(OffersReceived("o", (offer("o1", "a1", cpus=3.1),
                                        offer("o2", "a2", ports=((32000, 32009),)))))
    placed = {mid: agent for mid, (agent, _) in launched(out).items()}
    for mid, agent in placed.items():
        s.handle(update(mid, "RUNNING", agent))
    return s, {mid.rpartition(".a")[0]: agent for mid, agent in placed.items()}


def waves(where: dict[str, str]) -> dict[str, float]:
    """The sign of each task's wave: on the busy agent two peak together (+1) and one against
    (-1); the lone task on the other agent peaks against them (-1)."""
    busy = sorted(t for t, a in where.items() if a == "a1")
    assert len(busy) == 3, where
    return {busy[0]: 1.0, busy[1]: 1.0, busy[2]: -1.0,
            next(t for t, a in where.items() if a == "a2"): -1.0}


def run(s: SchedulerState, signs: dict[str, float], start_at: float, end_at: float,
        busy: dict[str, float]) -> list:
    """One tick and one heartbeat per agent every second; each task busy 1 + sign x sin s/s."""
    commands: list = []
    t = start_at
    while t < end_at:
        t += 1.0
        commands += s.handle(Tick("t", t))
        by_agent: dict[str, dict[str, dict[str, float]]] = {}
        for task_id, sign in signs.items():
            record = s.queries["q"].tasks[task_id]
            if record.state is not TaskState.RUNNING:
                continue
            busy[task_id] = busy.get(task_id, 0.0) + 1.0 + sign * math.sin(2 * math.pi * t /
                                                                            PERIOD)
            # the figures are per attempt: the busy time of earlier attempts is carried
            own = busy[task_id] - record.carried.get("busy_ms", 0.0) / 1000.0
            by_agent.setdefault(record.agent_id or "", {})[record.mesos_task_id] = {
                "busy_ms": own * 1000.0, "tuples_in": t, "tuples_out": t}
        for agent, tasks in by_agent.items():
            commands += s.handle(HeartbeatReceived("h", agent, f"elastiq-exec-{agent}",
                                                   Heartbeat(tasks, f"elastiq-exec-{agent}")))
    return commands


def test_the_distributor_moves_the_task_peaking_with_its_neighbours_once_and_cools_down(
        ) -> None:
    s, where = start()
    signs = waves(where)
    busy: dict[str, float] = {}
    early = run(s, signs, 0.0, 30.0, busy)
    assert not of(KillTask, early)  # under 8 slots of history: holds
    assert s.distribution.latest is not None and s.distribution.latest.reason == "history"
    assert "too few of their own: q.t0, q.t1, q.t2, q.t3" in s.distribution.latest.explanation
    out = run(s, signs, 30.0, 100.0, busy)
    kills = of(KillTask, out)
    first = sorted(t for t, sign in signs.items() if sign > 0)[0]
    assert [k.mesos_task_id for k in kills] == [f"{first}.a1"]  # the graceful kill: quiesce
    assert s.queries["q"].tasks[first].migrate_to == "a2"
    assert s.distribution.moved == 1 and s.distribution.moves[-1].target == "a2"
    decision = next(d for d in s.distribution.decisions if d.kind == "move")
    assert decision.means["a1"] > decision.means["a2"] + SETTINGS.threshold
    assert decision.peak_after < 0.75 * decision.peak_before
    view = snapshot(s)["distribution"]
    assert view["moves"] == 1 and view["recent"][0]["task"] == first
    lines = distribution_lines(view)  # what `elastiq status` prints
    assert lines[0].startswith("load distribution: 1 moves (0 refused); last round: ")
    assert f"moved {first} (q) a1 -> a2" in lines[-1] and lines[-1].endswith("started")
    metrics = SchedulerMetrics()
    metrics.observe_state(s, now=0.0)
    metrics.observe_state(s, now=1.0)  # counted once
    value = metrics.registry.get_sample_value
    assert value("elastiq_distribution_moves_total", {"query": "q", "outcome": "started"}) == 1
    assert value("elastiq_distribution_decisions_total", {"outcome": "move"}) == 1
    assert value("elastiq_distribution_decisions_total", {"outcome": "hold_history"}) >= 1
    # the executor says it stopped: relaunched at once on the target alone
    s.handle(update(f"{first}.a1", "KILLED", "a1"))
    out = s.handle(OffersReceived("o", (offer("o3", "a1", executor_ids=("elastiq-exec-a1",)),
                                        offer("o4", "a2", ports=((32000, 32009),),
                                              executor_ids=("elastiq-exec-a2",)))))
    ((mid, (agent, _)),) = launched(out).items()
    assert (mid, agent) == (f"{first}.a2", "a2")
    s.handle(update(mid, "RUNNING", "a2"))
    # balanced now, and the pair cools down: no second move for the next two minutes
    later = run(s, signs, s.now, s.now + 120.0, busy)
    assert not of(KillTask, later) and s.distribution.moved == 1
    assert {d.reason for d in s.distribution.decisions[-5:]} <= {"balanced", "cooldown",
                                                                  "history"}


def test_a_query_that_did_not_opt_in_is_never_looked_at() -> None:
    s, where = start(distribute=False)
    out = run(s, waves(where), 0.0, 100.0, {})
    assert not of(KillTask, out) and s.distribution.decided == 0


def test_nothing_moves_mid_rescale_or_mid_migration() -> None:
    s, where = start()
    signs = waves(where)
    busy: dict[str, float] = {}
    run(s, signs, 0.0, 40.0, busy)
    s.queries["q"].elastic.deferred["q-auto1"] = ("q.t3",)  # a scale-out waiting for its slot
    out = run(s, signs, 40.0, 100.0, busy)
    assert not of(KillTask, out)
    assert s.distribution.latest is not None and s.distribution.latest.reason == "no_candidate"
    del s.queries["q"].elastic.deferred["q-auto1"]
    lone = next(t for t, a in where.items() if a == "a2")
    manual = s.handle(TaskMigrationRequested("m", "q", lone, "a1"))  # elastiq migrate
    assert [k.mesos_task_id for k in of(KillTask, manual)] == [f"{lone}.a1"]
    out = run(s, signs, 100.0, 130.0, busy)
    assert not of(KillTask, out) and not of(LaunchTasks, out) and s.distribution.moved == 0


def test_an_apart_group_sends_the_next_best_task() -> None:
    """q.t0 must stay apart from q.t3 (on a2): its wave twin q.t1 moves instead."""
    s, where = start(apart=(("q.t3",),))
    assert where == {"q.t0": "a1", "q.t1": "a1", "q.t2": "a1", "q.t3": "a2"}
    out = run(s, waves(where), 0.0, 100.0, {})
    assert [k.mesos_task_id for k in of(KillTask, out)] == ["q.t1.a1"]
    assert s.queries["q"].tasks["q.t1"].migrate_to == "a2"


def test_the_apart_pairs_are_those_elastiq_migrate_refuses() -> None:
    """`_apart_forbidden` (every agent at once) says what `_apart_clash` says per agent."""
    s, where = three_agents()
    q = s.queries["q"]
    slow = {(t, a) for t in q.tasks for a in ("a1", "a2", "a3")
            if a != where[t] and s._apart_clash(q, q.tasks[t], a)}
    assert s._apart_forbidden(set(q.tasks)) == slow == {("q.t1", where["q.t2"]),
                                                        ("q.t2", where["q.t1"])}
