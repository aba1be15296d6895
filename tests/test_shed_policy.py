"""When the scheduler sheds (scheduler/shed_policy.py), pure: only when no capacity can be added,
with the LP's ratios as control tuples, released when the load falls or capacity returns, held
within the cool-down."""

from __future__ import annotations

import pytest

from scheduler.elastic_policy import Decision
from scheduler.shed_policy import ShedPolicy, cannot_add_capacity, decide_shedding
from scheduler.shedding import DropPoint, Operator, ShedProblem, Sink, UtilityClass, agent_loads

POLICY = ShedPolicy(headroom=1.0, release_below=0.7, cooldown_seconds=30.0)


def seed_problem(rate: float = 1.0) -> ShedProblem:
    """The two chains of "Staying FIT"'s load-dependency example (docs/load.md) at `rate` tuples/s
    each."""
    return ShedProblem(
        (DropPoint("in1", rate=rate), DropPoint("in2", rate=rate)),
        (Operator("a1", "A", 1.0, 1.0, ("in1",)), Operator("a2", "A", 2.0, 1.0, ("in2",)),
         Operator("b1", "B", 3.0, 1.0, ("a1",)), Operator("b2", "B", 1.0, 1.0, ("a2",))),
        (Sink("out1", "b1"), Sink("out2", "b2")), {"A": 1.0, "B": 1.0})


def test_nothing_is_shed_while_capacity_can_be_added() -> None:
    d = decide_shedding(seed_problem(), can_add_capacity=True, current={}, policy=POLICY,
                        now=100.0)
    assert d.kind == "hold" and d.reason == "can_scale" and not d.tuples


def test_overload_without_room_sheds_by_the_plan() -> None:
    d = decide_shedding(seed_problem(), can_add_capacity=False, current={}, policy=POLICY,
                        now=100.0)
    assert d.kind == "shed" and d.reason == "overload"
    assert dict(((op, p), float(v)) for op, p, v in d.tuples) == pytest.approx(
        {("in1", "ratio"): 0.8, ("in2", "ratio"): 0.6})
    assert d.quality == pytest.approx({"out1": 0.2, "out2": 0.4})
    assert "B at 400%" in d.explanation  # unshed: 1 x 3 + 1 x 1 on B


def test_headroom_leaves_room_below_capacity() -> None:
    d = decide_shedding(seed_problem(), False, {}, ShedPolicy(headroom=0.5), now=0.0)
    assert d.plan is not None
    keep = {(p, "all"): 1 - r for p, r in d.plan.ratios.items()}
    assert max(agent_loads(seed_problem(), keep).values()) <= 0.5 + 1e-6


def test_released_when_the_load_falls_or_capacity_returns() -> None:
    shed = {"in1.ratio": 0.8, "in2.ratio": 0.6}
    still = decide_shedding(seed_problem(rate=0.2), False, shed, POLICY, now=100.0)
    assert still.kind != "release"  # unshed: B at 0.8 of its capacity, above 0.7
    low = decide_shedding(seed_problem(rate=0.15), False, shed, POLICY, now=100.0)
    assert low.kind == "release" and low.reason == "fits"  # unshed: A 0.45, B 0.6
    assert sorted(low.tuples) == [("in1", "ratio", "0"), ("in2", "ratio", "0")]
    back = decide_shedding(seed_problem(), True, shed, POLICY, now=100.0)
    assert back.kind == "release" and back.reason == "can_scale"
    assert sorted(back.tuples) == [("in1", "ratio", "0"), ("in2", "ratio", "0")]


def test_cool_down_and_unchanged_ratios_hold() -> None:
    shed = {"in1.ratio": 0.8, "in2.ratio": 0.6}
    assert decide_shedding(seed_problem(), False, shed, POLICY, now=100.0,
                           last_change=90.0).reason == "cooldown"
    same = decide_shedding(seed_problem(), False, shed, POLICY, now=100.0, last_change=10.0)
    assert same.kind == "hold" and same.reason == "unchanged"


def test_a_semantic_drop_gets_both_ratios() -> None:
    classes = (UtilityClass("high", 0.5, 1.0), UtilityClass("low", 0.5, 0.2))
    problem = ShedProblem((DropPoint("src_drop", rate=10.0, classes=classes),),
                          (Operator("f", "A", 0.1, 1.0, ("src_drop",)),), (Sink("s", "f"),),
                          {"A": 0.6})
    d = decide_shedding(problem, False, {}, POLICY, now=0.0)
    assert dict(((op, p), float(v)) for op, p, v in d.tuples) == pytest.approx(
        {("src_drop", "ratio"): 0.8})  # low rows: 80 % dropped; high rows kept (ratio 0)


def decision(kind: str, reason: str, current: int, needed: int | None) -> Decision:
    return Decision("q", "op", kind, current, current, reason, "", needed=needed)  # type: ignore[arg-type]


def test_cannot_add_capacity_at_max_parallelism_or_without_room() -> None:
    at_max = decision("hold", "bounds", 4, 6)
    assert cannot_add_capacity([at_max], refused_for_room=False)
    assert not cannot_add_capacity([decision("hold", "bounds", 1, 1)], False)  # at min
    assert not cannot_add_capacity([decision("out", "load", 2, 3)], False)
    assert cannot_add_capacity([], refused_for_room=True)
    # shedding at the bound: the operator's decision sees the shed load and holds `steady`
    steady = decision("hold", "steady", 1, 1)
    assert cannot_add_capacity([steady], False, shedding_at_bound=True)
    assert not cannot_add_capacity([steady], False, shedding_at_bound=False)
