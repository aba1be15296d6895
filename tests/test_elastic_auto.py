"""Automatic elasticity through the scheduler's state machine (issue 12), on a simulated clock:
heartbeats carry the figures a real executor reports (cumulative tuples in and out, busy time,
the source's backlog) for a filter whose instances each process at most RATE rows per busy
second; Ticks let the scheduler ask the policy. A x4 load step must give ONE control request of
trigger auto, to the parallelism a plain computation of the load needs, nothing while it is in
flight, nothing more once the instances keep up, and one scale-in when the load falls back; the
decisions show in the status view. The policy's own arithmetic has tests/test_elastic_policy.py.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from common.control import PARALLELISM
from scheduler.commands import Command, SendFrameworkMessage
from scheduler.elastic_policy import ElasticPolicy, Sample, growing
from scheduler.events import TaskMigrationRequested
from scheduler.lifecycle import TaskState
from tests.test_elasticity import Driver, compiled

RATE = 500.0  # rows one instance processes per busy second (its true rate)
BASE = 250.0  # rows per second before the step
STEP = 4  # the load step
SPLIT = "split:q/f_s#1+q/f_s#2+q/f_s#3+q/f_s#4"
POLICY = ElasticPolicy(min_parallelism=1, max_parallelism=4)  # what the scheduler uses


def need(load: float, utilisation: float) -> int:
    """The oracle: instances that carry `load`, each busy at most `utilisation`."""
    return min(4, max(1, math.ceil(load / (RATE * utilisation))))


@dataclass
class Cluster:
    """What the executors would measure: the source's task q.t0 reads what the instances the
    splitter routes to can take (the rest waits in the source's backlog); every instance
    processes its share at RATE rows per busy second."""

    d: Driver
    routed: int = 1  # instances the splitter routes to (changes when it acknowledges)
    backlog: float = 0.0
    totals: dict[str, dict[str, float]] = field(default_factory=dict)
    sent: list[SendFrameworkMessage] = field(default_factory=list)

    def count(self, task: str, rows_in: float, rows_out: float, busy_ms: float) -> None:
        t = self.totals.setdefault(task, {"tuples_in": 0.0, "tuples_out": 0.0, "busy_ms": 0.0})
        t["tuples_in"] += rows_in
        t["tuples_out"] += rows_out
        t["busy_ms"] += busy_ms

    def second(self, load: float) -> list[Command]:
        """One simulated second at `load` rows per second: a Tick, then every executor's
        heartbeat; the commands the scheduler answered with."""
        out = self.d.tick(1.0)
        slots = self.d.query.elastic[0].slots
        taken = min(load + self.backlog, RATE * self.routed)
        self.backlog += load - taken
        self.count("q.t0", taken, taken, 50.0)
        self.totals["q.t0"]["backlog"] = self.backlog
        for index, slot in enumerate(slots):
            if self.d.state(slot) is TaskState.RUNNING:
                share = taken / self.routed if index < self.routed else 0.0
                self.count(slot, share, share, share / RATE * 1000.0)
        merger = next(t.task_id for t in self.d.query.tasks if "sink" in t.operators)
        self.count(merger, taken, taken, 10.0)
        running = [t for t in self.totals if self.d.state(t) is TaskState.RUNNING]
        out += self.d.beat({t: dict(self.totals[t]) for t in running})
        self.sent += [c for c in out if isinstance(c, SendFrameworkMessage)]
        return out

    def run(self, load: float, seconds: int) -> None:
        for _ in range(seconds):
            self.second(load)

    def decided(self) -> int:
        return self.d.s.queries["q"].elastic.decided


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    d = Driver(compiled('parallelism="1" max-parallelism="4" elastic="auto"', tmp_path))
    assert set(d.run(d.offer("a1"))) == {"q.t0", "q.t1", "q.t5"}
    d.offer("a2", "a3", "a4")  # the cluster's other agents: automatic mode asks at most for
    return Cluster(d)          # as many instances as there are agents (they run apart)


def test_a_load_step_gives_one_automatic_rescale_to_the_needed_parallelism(cluster: Cluster
                                                                           ) -> None:
    c, d = cluster, cluster.d
    target = need(BASE * STEP, POLICY.target_utilisation)
    assert need(BASE, POLICY.target_utilisation) == 1 and target == 3  # the test's premise
    c.run(BASE, 30)
    assert c.sent == [] and c.decided() > 0
    decision = d.view()["decision"]
    assert (decision["kind"], decision["target"]) == ("hold", 1)
    # the step: the one instance saturates, the source's backlog grows
    step_at = d.now
    for _ in range(30):
        c.second(BASE * STEP)
        if d.view()["rescales"]:
            break
    detected = d.now - step_at
    assert detected <= POLICY.window_seconds + 2, detected
    assert c.sent == []  # the splitter switches once the new instances run
    (rescale,) = d.view()["rescales"]
    assert (rescale["trigger"], rescale["from"], rescale["to"], rescale["state"]) == \
        ("auto", 1, target, "pending")
    decision = d.view()["decision"]
    assert (decision["kind"], decision["target"], decision["reason"]) == ("out", target, "load")
    assert rescale["reason"] == decision["explanation"] and f"-> {target}" in rescale["reason"]
    assert decision["rates"]["backlog_growing"] and decision["rates"]["true_rate"] == \
        pytest.approx(RATE)
    # in flight: the new instances wait for offers, the splitter has not answered
    decided = c.decided()
    c.run(BASE * STEP, 5)
    placed = d.run(d.offer("a2", "a3"))
    assert set(placed) == {"q.t2", "q.t3"}
    c.run(BASE * STEP, 5)
    (message,) = c.sent
    assert message.message.params == {SPLIT: {"active": target}}
    assert c.decided() == decided  # the policy is not even asked
    d.ack(message.message.request)
    c.routed = target
    peak = c.backlog
    # the instances keep up: the backlog drains, nothing more is asked
    c.run(BASE * STEP, 60)
    assert len(c.sent) == 1 and c.decided() > decided
    assert c.backlog == 0.0 and peak > 0
    outcomes = {dec.outcome for dec in d.s.queries["q"].elastic.decisions[-40:]}
    assert outcomes <= {"hold_cooldown", "hold_steady", "hold_draining"}, outcomes
    assert d.view()["parallelism"] == target
    # the load falls back: one scale-in, to what it needs with the scale-in margin
    c.run(BASE, 40)
    assert len(c.sent) == 2
    back = need(BASE, POLICY.target_utilisation * (1 - POLICY.scale_in_margin))
    assert c.sent[1].message.params == {SPLIT: {"active": back}}
    last = d.view()["rescales"][-1]
    assert (last["trigger"], last["from"], last["to"]) == ("auto", target, back)
    assert d.view()["decision"]["kind"] == "in"


def test_manual_operators_are_never_rescaled_automatically(tmp_path: Path) -> None:
    d = Driver(compiled('parallelism="1" max-parallelism="4"', tmp_path))
    d.run(d.offer("a1"))
    c = Cluster(d)
    c.run(BASE, 15)
    c.run(BASE * STEP, 30)
    assert c.sent == [] and c.decided() == 0 and d.view()["decision"] is None
    assert c.backlog > 0  # it did fall behind


def test_an_automatic_operator_at_its_maximum_holds_with_the_reason(tmp_path: Path) -> None:
    d = Driver(compiled('parallelism="1" max-parallelism="2" elastic="auto"', tmp_path))
    d.run(d.offer("a1"))
    d.offer("a3")  # another agent: room for the second instance
    c = Cluster(d)
    c.run(BASE * STEP, 15)
    assert c.sent == [] and d.view()["rescales"]  # decided; switches once the instance runs
    d.run(d.offer("a2"))
    c.run(BASE * STEP, 1)
    (message,) = c.sent
    assert message.message.params == {"split:q/f_s#1+q/f_s#2": {"active": 2}}
    d.ack(message.message.request)
    c.routed = 2
    c.run(BASE * STEP, 40)
    assert len(c.sent) == 1
    decision = d.view()["decision"]
    assert (decision["kind"], decision["reason"]) == ("hold", "bounds")
    assert "max-parallelism 2" in decision["explanation"]


def test_an_automatic_rescale_the_query_cannot_take_now_is_refused_logged_and_harmless(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """The policy decides to scale out while the splitter's task is being migrated: the control
    request is refused (its target does not run here any more), nothing is sent, the slots stay
    dormant, the parallelism stays, and the log says why; the policy keeps deciding."""
    c, d = cluster, cluster.d
    d.offer("a2")  # the scheduler knows agent a2
    c.run(BASE * STEP, 3)
    d.s.handle(TaskMigrationRequested("m", "q", "q.t0", "a2"))
    assert d.record("q.t0").migrate_to == "a2"
    with caplog.at_level(logging.WARNING, logger="elastiq.scheduler"):
        c.run(BASE * STEP, 15)
    assert c.sent == []
    assert d.view()["decision"]["kind"] == "out"  # it wanted to
    refusals = [r for r in caplog.records if "automatic rescale of f refused" in r.getMessage()]
    assert 1 <= len(refusals) <= 2, [r.getMessage() for r in refusals]  # backs off 10 s
    assert [d.state(t) for t in ("q.t2", "q.t3", "q.t4")] == [TaskState.DORMANT] * 3
    assert d.s.queries["q"].control.values.get("f", {}).get(PARALLELISM) is None
    assert d.view()["parallelism"] == 1 and d.view()["rescales"] == []


def samples(backlogs: list[float]) -> list[Sample]:
    return [Sample(float(t), 0.0, 0.0, 0.0, b) for t, b in enumerate(backlogs)]


@pytest.mark.parametrize("backlogs, grew", [
    ([0.0] * 9 + [500.0], False),  # sat still, jumped at the end: the load just changed
    ([0.0] * 5 + [500.0, 1000.0, 1500.0, 2000.0, 2500.0], False),  # growing for half of it
    ([10.0 * i for i in range(10)], True),
    ([0.0, 0.0, 5.0, 5.0, 9.0, 9.0, 12.0, 12.0, 20.0], True),  # rose in each half
    ([10.0 * i for i in range(9)] + [0.0], False),  # fell at the end
    ([3.0, 4.0], True), ([4.0, 4.0], False), ([4.0], False),
])
def test_a_backlog_grows_all_window_only_when_it_rose_in_each_half(backlogs: list[float],
                                                                   grew: bool) -> None:
    assert growing(samples(backlogs)) is grew


def test_every_decision_and_the_rescale_are_counted_once_in_the_metrics(cluster: Cluster
                                                                        ) -> None:
    """The scheduler's metrics read the state after every step: each policy decision counts
    once by outcome, the automatic rescale once when applied, and the parallelism gauge follows
    it (observed every simulated second, as the loop does after each step)."""
    from scheduler.metrics import SchedulerMetrics

    c, d = cluster, cluster.d
    m = SchedulerMetrics()

    def value(name: str, **labels: str) -> float:
        return m.registry.get_sample_value(name, labels) or 0.0

    def run(load: float, seconds: int) -> None:
        for _ in range(seconds):
            c.second(load)
            m.observe_state(d.s, d.now)

    run(BASE, 15)
    assert value("elastiq_operator_parallelism", query="q", operator="f") == 1
    run(BASE * STEP, 20)
    assert c.sent == [] and d.view()["rescales"]  # decided; switches once the instances run
    d.run(d.offer("a2", "a3"))
    run(BASE * STEP, 1)
    (message,) = c.sent
    m.observe_state(d.s, d.now)
    assert value("elastiq_rescales_total", query="q", operator="f", direction="out",
                 trigger="auto") == 0  # not applied yet
    d.ack(message.message.request, pause=0.7)
    c.routed = 3
    run(BASE * STEP, 10)
    assert value("elastiq_rescales_total", query="q", operator="f", direction="out",
                 trigger="auto") == 1
    assert value("elastiq_rescale_pause_seconds_sum", state="stateless") == pytest.approx(0.7)
    assert value("elastiq_operator_parallelism", query="q", operator="f") == 3
    decisions = d.s.queries["q"].elastic
    counted = {o: value("elastiq_elastic_decisions_total", outcome=o)
               for o in ("out", "in", "hold_steady", "hold_settling", "hold_no_data",
                         "hold_cooldown", "hold_draining", "hold_bounds", "hold_backlog",
                         "hold_catching_up", "hold_load")}
    assert sum(counted.values()) == decisions.decided > 0
    assert counted["out"] == 1 and counted["in"] == 0
    capacity = decisions.latest["f"].capacity  # what the policy learnt, and the gauge shows
    assert capacity is not None and capacity.measured and capacity.rate > 0
    assert value("elastiq_operator_capacity_rows_per_second", query="q", operator="f",
                 kind="measured") == pytest.approx(capacity.rate)
