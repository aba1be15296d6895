"""The shedding plan (scheduler/shedding.py), pure: the paper's own table ("Staying FIT", VLDB'07,
"Distributed Load Shedding: Load Dependency"; docs/load.md), hand-computed cases, a brute-force
oracle on small plans, and properties (never over capacity, never worse than uniform random
shedding)."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from scheduler.shedding import (DropPoint, Operator, ShedProblem, Sink, UtilityClass,
                                agent_loads, check_problem, plan_shedding, sink_quality,
                                uniform_keep, uniform_ratio, weighted_loss)


def seed_problem(weights: tuple[float, float] = (1.0, 1.0)) -> ShedProblem:
    """The paper's two chains, 1 tuple/s each: chain 1 costs 1 on A then 3 on B; chain 2 costs 2
    on A then 1 on B; every selectivity 1; both nodes' capacity 1."""
    return ShedProblem(
        points=(DropPoint("in1", rate=1.0), DropPoint("in2", rate=1.0)),
        operators=(Operator("a1", "A", 1.0, 1.0, ("in1",)), Operator("a2", "A", 2.0, 1.0, ("in2",)),
                   Operator("b1", "B", 3.0, 1.0, ("a1",)), Operator("b2", "B", 1.0, 1.0, ("a2",))),
        sinks=(Sink("out1", "b1", weights[0]), Sink("out2", "b2", weights[1])),
        capacity={"A": 1.0, "B": 1.0})


@pytest.mark.parametrize("rates, a_load, b_load", [
    ((1, 0), 1, 3),                    # plan 1: optimal for A, B overloaded
    ((0, Fraction(1, 2)), 1, Fraction(1, 2)),   # plan 2: feasible for both
    ((Fraction(1, 5), Fraction(2, 5)), 1, 1),   # plan 3: optimal for both
])
def test_the_seeds_table_of_plans(rates: tuple[Fraction, Fraction], a_load: Fraction,
                                  b_load: Fraction) -> None:
    keep = {("in1", "all"): float(rates[0]), ("in2", "all"): float(rates[1])}
    loads = agent_loads(seed_problem(), keep)
    assert loads["A"] == pytest.approx(float(a_load))
    assert loads["B"] == pytest.approx(float(b_load))


def test_the_lp_finds_the_seeds_optimal_plan() -> None:
    """maximise r1 + r2 with r1 + 2 r2 <= 1 (A) and 3 r1 + r2 <= 1 (B): the vertex (1/5, 2/5),
    throughput 3/5, which beats plan 1 (1/3, B alone) and plan 2 (1/2)."""
    plan = plan_shedding(seed_problem())
    assert plan.ratios["in1"] == pytest.approx(4 / 5)
    assert plan.ratios["in2"] == pytest.approx(3 / 5)
    assert plan.quality == pytest.approx({"out1": 1 / 5, "out2": 2 / 5})
    assert plan.loss == pytest.approx(2 - 3 / 5)
    assert plan.feasible and plan.shedding


def test_weights_move_the_optimum() -> None:
    """out1 worth 5 times out2: the vertex (1/3, 0) gives 5/3 against 5/5 + 2/5 = 7/5."""
    plan = plan_shedding(seed_problem((5.0, 1.0)))
    assert plan.quality == pytest.approx({"out1": 1 / 3, "out2": 0.0}, abs=1e-7)
    assert plan.ratios == pytest.approx({"in1": 2 / 3, "in2": 1.0})


def test_nothing_is_shed_when_everything_fits() -> None:
    problem = seed_problem()
    roomy = ShedProblem(problem.points, problem.operators, problem.sinks, {"A": 3.0, "B": 4.0})
    plan = plan_shedding(roomy)
    assert plan.ratios == {"in1": 0.0, "in2": 0.0}
    assert not plan.shedding and plan.loss == 0.0
    assert uniform_ratio(roomy) == 0.0


def test_a_semantic_drop_sheds_the_low_value_rows_first() -> None:
    """Half the rows are worth 0.2 each: dropping 40 % of all rows drops 80 % of those."""
    classes = (UtilityClass("high", 0.5, 1.0), UtilityClass("low", 0.5, 0.2))
    problem = ShedProblem((DropPoint("in", rate=10.0, classes=classes),),
                          (Operator("f", "A", 0.1, 1.0, ("in",)),), (Sink("out", "f"),),
                          {"A": 0.6})
    plan = plan_shedding(problem)
    assert plan.ratios["in"] == pytest.approx(0.4)
    assert plan.class_ratios["in"] == pytest.approx({"high": 0.0, "low": 0.8})
    # value 5 * 1 + 5 * 0.2 = 6 unshed; kept 5 + 1 * 0.2 = 5.2
    assert plan.quality["out"] == pytest.approx(5.2 / 6)


def test_a_channel_drop_point_sheds_one_branch_only() -> None:
    """A source feeds a cheap sink and, through a channel, an expensive branch on B: the plan
    drops at the channel input and leaves the cheap sink whole."""
    problem = ShedProblem(
        (DropPoint("in", rate=10.0), DropPoint("ch", input="f")),
        (Operator("f", "A", 0.01, 1.0, ("in",)), Operator("g", "B", 0.2, 1.0, ("ch",))),
        (Sink("cheap", "f"), Sink("dear", "g")), {"A": 1.0, "B": 1.0})
    plan = plan_shedding(problem)
    assert plan.ratios == pytest.approx({"in": 0.0, "ch": 0.5})
    assert plan.quality == pytest.approx({"cheap": 1.0, "dear": 0.5})
    assert plan.loads["B"] == pytest.approx(1.0)


def test_a_drop_point_after_a_union_of_shed_streams_stays_idle() -> None:
    problem = ShedProblem(
        (DropPoint("i1", rate=1.0), DropPoint("i2", rate=1.0), DropPoint("ch", input="u")),
        (Operator("u", "A", 0.1, 1.0, ("i1", "i2")), Operator("g", "B", 1.0, 1.0, ("ch",))),
        (Sink("out", "g"),), {"A": 1.0, "B": 1.0})
    plan = plan_shedding(problem)
    assert "ch" in plan.idle and plan.ratios["ch"] == 0.0
    assert plan.loads["B"] == pytest.approx(1.0) and plan.feasible


def test_an_agent_that_cannot_fit_is_reported() -> None:
    problem = seed_problem()
    plan = plan_shedding(ShedProblem(problem.points, problem.operators, problem.sinks,
                                     {"A": -1.0, "B": 1.0}))
    assert not plan.feasible


def test_located_problems_all_at_once() -> None:
    problem = ShedProblem((DropPoint("in", rate=float("nan")),),
                          (Operator("f", "X", -1.0, 1.0, ("nope",)),
                           Operator("f", "A", 1.0, 1.0, ("in",))), (Sink("s", "gone", -2),),
                          {"A": 1.0})
    with pytest.raises(ValueError) as raised:
        plan_shedding(problem)
    text = str(raised.value)
    for part in ("drop point in: rate", "operator f: cost", "reads nope", "agent X",
                 "f: named twice",
                 "sink s: reads gone", "sink s: weight"):
        assert part in text


def random_problem(rng: random.Random, sources: int, agents: int) -> ShedProblem:
    points = [DropPoint(f"in{i}", rate=rng.uniform(0.5, 5.0)) for i in range(sources)]
    operators: list[Operator] = []
    sinks: list[Sink] = []
    for i in range(sources):
        upstream = f"in{i}"
        for depth in range(rng.randint(1, 3)):
            name = f"o{i}_{depth}"
            operators.append(Operator(name, f"N{rng.randrange(agents)}", rng.uniform(0.05, 1.0),
                                      rng.uniform(0.2, 1.0), (upstream,)))
            upstream = name
        sinks.append(Sink(f"s{i}", upstream, rng.choice((1.0, 2.0, 5.0))))
    capacity = {f"N{a}": rng.uniform(0.3, 2.0) for a in range(agents)}
    return ShedProblem(tuple(points), tuple(operators), tuple(sinks), capacity)


@pytest.mark.parametrize("seed", range(40))
def test_never_over_capacity_and_no_worse_than_uniform(seed: int) -> None:
    rng = random.Random(seed)
    problem = random_problem(rng, rng.randint(1, 5), rng.randint(1, 4))
    plan = plan_shedding(problem)
    assert plan.feasible
    for agent, load in plan.loads.items():
        assert load <= problem.capacity[agent] + 1e-6
    uniform = uniform_keep(problem, uniform_ratio(problem))
    assert all(agent_loads(problem, uniform)[a] <= problem.capacity[a] + 1e-6
               for a in problem.capacity)
    assert plan.loss <= weighted_loss(problem, uniform) + 1e-7


@pytest.mark.parametrize("seed", range(15))
def test_no_better_plan_on_a_grid(seed: int) -> None:
    """Brute force: on plans of at most three sources, no keep vector on a 1/20 grid (1/10 for three) that fits
    loses less than the LP's plan."""
    rng = random.Random(1000 + seed)
    problem = random_problem(rng, rng.randint(1, 3), rng.randint(1, 3))
    plan = plan_shedding(problem)
    names = [p.name for p in problem.points]
    steps = 20 if len(names) < 3 else 10
    grid = [i / steps for i in range(steps + 1)]
    best = float("inf")
    for values in itertools.product(grid, repeat=len(names)):
        keep = {(name, "all"): v for name, v in zip(names, values)}
        loads = agent_loads(problem, keep)
        if all(loads[a] <= problem.capacity[a] + 1e-12 for a in loads):
            best = min(best, weighted_loss(problem, keep))
    assert plan.loss <= best + 1e-7
    assert sink_quality(problem, {(n, "all"): 1 - plan.ratios[n] for n in names}) \
        == pytest.approx(plan.quality)


def test_an_operators_own_limit_binds_beside_its_agents_capacity() -> None:
    """Two sources of 100 rows/s, each read by one operator (0.01 s a row) on one agent of 10
    CPUs; the first operator may carry 0.5 s/s alone: only its source sheds, by half."""
    problem = ShedProblem(
        (DropPoint("d1", 100.0), DropPoint("d2", 100.0)),
        (Operator("o1", "A", 0.01, 1.0, ("d1",)), Operator("o2", "A", 0.01, 1.0, ("d2",))),
        (Sink("s1", "o1"), Sink("s2", "o2")), {"A": 10.0}, {"o1": 0.5})
    plan = plan_shedding(problem)
    assert plan.ratios == pytest.approx({"d1": 0.5, "d2": 0.0}) and plan.feasible
    assert plan.loss == pytest.approx(0.5)
    assert "limit of o9: not an operator" in check_problem(
        ShedProblem(problem.points, problem.operators, problem.sinks, {"A": 1.0}, {"o9": 1.0}))


def test_a_fixed_load_takes_its_share_of_the_bound_and_one_over_it_is_left_out() -> None:
    """src (a drop's task) reads 100 rows/s at 0.004 s each whatever it keeps (0.4 CPU s/s,
    fixed) and spends 0.002 s per row kept; heavy spends 0.01 s per row kept; both on A."""
    points = (DropPoint("d", 100.0),)
    ops = (Operator("src", "A", 0.002, 1.0, ("d",), fixed=0.4),
           Operator("heavy", "A", 0.01, 1.0, ("src",)))
    sinks = (Sink("s", "heavy"),)
    plan = plan_shedding(ShedProblem(points, ops, sinks, {"A": 1.3}, {"src": 1.0, "heavy": 1.0}))
    # A: 0.4 + 0.2 k + 1.0 k <= 1.3: k = 0.75
    assert plan.ratios["d"] == pytest.approx(0.25) and plan.feasible and plan.over == ()
    assert plan.loads["A"] == pytest.approx(1.3)
    assert uniform_ratio(ShedProblem(points, ops, sinks, {"A": 1.3})) == pytest.approx(0.25)
    # src's reading alone passes its limit (1.2 > 1): no drop relieves it; heavy still decides
    reading = (Operator("src", "A", 0.0, 1.0, ("d",), fixed=1.2), ops[1])
    plan = plan_shedding(ShedProblem(points, reading, sinks, {"A": 5.0},
                                     {"src": 1.0, "heavy": 0.5}))
    assert plan.over == ("src",) and plan.feasible
    assert plan.ratios["d"] == pytest.approx(0.5)
