"""A saturated task in the shedding problem (issue 32; pure): costed by the cpu it paid per row
processed, not by the cost model's fitted marginal cost, and that cost held while the shed in
force relieves it, checked against a plain computation built from the benchmark's measured
figures (docs/load.md, "Agents that fit the machine", run 2 of 2026-11-30): a heavy instance
on an agent of 0.4 cpu paid 2.6 ms of cpu per row at its capacity, throttled in 99 % of its
CFS periods, while 930 rows/s arrived over two such agents (465 at each)."""

from __future__ import annotations

from typing import Sequence

import pytest

from common.control import Adjustable, ControlCatalog, Target
from common.tasks import ChannelSpec, CompiledQuery, QueryTask, Resources
from common.types import Schema
from scheduler.elastic_policy import Sample
from scheduler.shed_policy import ShedPolicy, decide_shedding
from scheduler.shed_problem import TaskRates, problem_of, processing_cost, rates_of
from scheduler.shed_state import ShedState
from scheduler.shedding import agent_loads

SCHEMA = Schema.of(("sensor", "string"), ("value", "double"))
AGENT_CPU = 0.4  # the heavy agent's cpus (the benchmark's agents that fit the machine)
PAID = 0.0026  # cpu seconds per row a saturated instance paid (run 2: 310 rows/s on 0.8 cpu)
CAPACITY_ROWS = AGENT_CPU / PAID  # rows/s the instance processes saturated: ~154
ARRIVAL = 465.0  # rows/s arriving per heavy agent (930 over two)
FITTED = 0.0002  # the cost model's marginal cpu per row: rows look cheap, as in run 2, where
# the decisions put the busiest agent at 118 % and 102 % while its cpu per row made it 302 %
SOURCE_READ = 0.0001  # cpu per row the source task pays to make a row and hash it


def query() -> CompiledQuery:
    """q.t0 (a generator and its drop, on S) -> q.t1 (the heavy project and sink, on H)."""
    ratio = Adjustable("src_drop", "drop", "ratio", "float", "0",
                       (Target("q.t0", "src_drop", "ratio"),))
    return CompiledQuery(
        "q", (QueryTask("q", "q.t0", "spark", ("src", "src_drop"), (), ("q/s",), False,
                        Resources(1.0, 512, 1), "# program\n"),
              QueryTask("q", "q.t1", "spark", ("heavy", "out"), ("q/s",), (), False,
                        Resources(1.0, 512, 0), "# program\n")),
        (ChannelSpec("q/s", "s", SCHEMA, "q.t0", ("q.t1",)),), {},
        ControlCatalog((ratio,)), weights={"out": 1.0})


RUNNING = {"q.t0": "S", "q.t1": "H"}
CAPACITY = {"S": 8.0, "H": AGENT_CPU}


def heavy_rates(delivered: float, relieved_paid: float = PAID) -> TaskRates:
    """The heavy instance given `delivered` rows/s: saturated at CAPACITY_ROWS (busy 1 s/s,
    its agent throttled in 99 % of its periods, AGENT_CPU used: the rest queue in its
    channel), else it processes them all at `relieved_paid` cpu per row, busy in proportion
    and throttled in 20 % of its periods; its batches fitted at FITTED cpu per row."""
    if delivered >= CAPACITY_ROWS:
        cpu, busy, throttled, rows = AGENT_CPU, 1.0, 0.99, CAPACITY_ROWS
    else:
        rows = delivered
        cpu, busy, throttled = relieved_paid * rows, 0.8 * rows / CAPACITY_ROWS, 0.2
    return TaskRates(rows, 0.0, 0.0, busy, per_row=FITTED * busy / cpu, cpu=cpu,
                     throttled=throttled)


def window(ratio: float, arrival: float = ARRIVAL, relieved_paid: float = PAID
           ) -> dict[str, TaskRates]:
    """Both tasks' rates while `ratio` of the source's rows is dropped."""
    kept = arrival * (1.0 - ratio)
    return {"q.t0": TaskRates(arrival, kept, arrival - kept, arrival * SOURCE_READ / 0.5,
                              cpu=arrival * SOURCE_READ),
            "q.t1": heavy_rates(kept, relieved_paid)}


def oracle_ratio(arrival: float = ARRIVAL) -> float:
    """The plain computation: keep what 0.9 of the agent's cpu processes at the cpu per row a
    saturated instance paid, drop the rest."""
    return max(0.0, 1.0 - 0.9 * AGENT_CPU / PAID / arrival)


def test_a_saturated_task_is_costed_by_the_cpu_it_paid_per_row() -> None:
    """The instance saturated (154 of the 465 rows/s it is delivered, 0.4 cpu, throttled in
    99 % of its periods) costs 0.4 / 154 = 2.6 ms per row with no fixed load: the agent's
    unshed load is 465 x 2.6 ms = 1.21 cpu, 302 % of 0.4, and the plan keeps 0.9 x 154 rows/s
    (ratio 0.70). Before, the fitted 0.2 ms per row left 0.37 cpu of fixed load: 116 % unshed
    (the run's decisions said 118 % and 102 %), a fixed load over 0.9 of the agent that no
    drop relieves, and nothing was shed while the backlog grew."""
    rates = window(0.0)
    assert rates["q.t1"].saturated and not rates["q.t0"].saturated
    assert processing_cost(rates["q.t1"], None) == pytest.approx((PAID, 0.0))
    problem = problem_of(query(), RUNNING, rates, CAPACITY)
    assert not isinstance(problem, str), problem
    assert agent_loads(problem, {})["H"] / AGENT_CPU == pytest.approx(ARRIVAL * PAID / AGENT_CPU)
    assert agent_loads(problem, {})["H"] / AGENT_CPU == pytest.approx(3.02, abs=0.01)
    decision = decide_shedding(problem, False, {}, ShedPolicy(), now=0.0)
    assert decision.kind == "shed", decision.explanation
    assert decision.plan is not None
    assert decision.plan.ratios["src_drop"] == pytest.approx(oracle_ratio(), abs=0.005)
    assert oracle_ratio() == pytest.approx(0.70, abs=0.01)
    assert "saturated, costed by cpu per row processed: q.t1 (throttled in 99% of cpu " \
        "periods)" in decision.explanation


def test_saturation_is_throttling_or_batches_back_to_back() -> None:
    """Saturated: throttled in at least half of the periods, or busy 0.9 s/s or more; a task
    with room (busy 0.5 s/s, throttled in 20 %) keeps its fitted cost and batch load."""
    base = dict(rows_in=100.0, rows_out=100.0, dropped=0.0, per_row=0.002, cpu=0.1)
    assert TaskRates(busy=0.5, throttled=0.5, **base).saturated
    assert TaskRates(busy=0.9, throttled=0.0, **base).saturated
    roomy = TaskRates(busy=0.5, throttled=0.2, **base)
    assert not roomy.saturated
    # fitted: 0.002 busy s x 0.2 cpu per busy s; the rest of its 0.1 cpu is its batches'
    assert processing_cost(roomy, None) == pytest.approx((0.0004, 0.06))
    assert processing_cost(roomy, 0.003) == (0.003, 0.0)  # saturated earlier, while shed


def decisions(arrivals: Sequence[float], hold: bool, relieved_paid: float = PAID
              ) -> list[tuple[str, float]]:
    """(the decision's kind, the ratio after it) for one decision per arrival, 30 s apart (the
    cool-down), each fed the window the ratio before it gives, the state kept as the
    scheduler keeps it (`SchedulerState._shed_decision`); `hold`: the saturated cost held
    while shed (`ShedState.held_for`), or not."""
    state, ratio, seen = ShedState(), 0.0, []
    for i, arrival in enumerate(arrivals):
        rates = window(ratio, arrival, relieved_paid)
        shedding = ratio > 0
        state.observe_unshed(["q.t0"], rates)
        state.observe_saturation(rates, shedding)
        problem = problem_of(query(), RUNNING, rates, CAPACITY, state.unshed_for(rates),
                             state.last_costs, state.held_for(shedding) if hold else None)
        assert not isinstance(problem, str), problem
        state.observe_costs(problem, rates)
        decision = decide_shedding(problem, False, {"src_drop.ratio": ratio}, ShedPolicy(),
                                   now=30.0 * i, last_change=None)
        ratio = next((float(v) for _, p, v in decision.tuples if p == "ratio"), ratio)
        seen.append((decision.kind, ratio))
    return seen


def test_the_ratio_settles_across_the_plans_own_effect() -> None:
    """Overload, shed, steady, then the arrival falls. The first plan (saturated) drops 0.70;
    the instance, relieved, processes the 140 rows/s kept and is no longer saturated; its
    fitted cost would say rows are cheap again, but the cost it paid saturated is held while
    shed, so every later decision keeps 0.70 (`unchanged`). When the arrival falls to 100
    rows/s (65 % of the agent at 2.6 ms per row, under the 70 % that releases) every ratio goes
    back to 0, and the held cost is forgotten."""
    arrivals = [ARRIVAL] * 8 + [100.0] * 2
    seen = decisions(arrivals, hold=True)
    assert [r for _, r in seen[:8]] == [pytest.approx(oracle_ratio(), abs=0.005)] * 8, seen
    assert [k for k, _ in seen[:8]] == ["shed"] + ["hold"] * 7, seen
    assert seen[8] == ("release", 0.0), seen
    assert seen[9] == ("hold", 0.0), seen


def test_a_relieved_instance_a_little_cheaper_per_row_does_not_make_the_ratio_swing() -> None:
    """Relieved, the instance pays 2.5 ms per row instead of 2.6 (the benchmark's cpu per row
    differed by 10 % between two runs: 2.9 and 2.6 ms). Without the hold, its fitted marginal
    cost (0.2 ms) turns the 0.014 cpu it saves into 70 rows/s more that look cheap: the next
    plan keeps 207 rows/s, more than the 154 it can process, it saturates again, and the ratio
    swings 0.70 -> 0.55 -> 0.70 -> ... with rows queueing at every other plan. With the hold
    it stays at 0.70."""
    held = decisions([ARRIVAL] * 8, hold=True, relieved_paid=0.0025)
    assert [r for _, r in held] == [pytest.approx(oracle_ratio(), abs=0.005)] * 8, held
    swung = decisions([ARRIVAL] * 8, hold=False, relieved_paid=0.0025)
    ratios = [r for _, r in swung]
    assert ratios[0::2] == [pytest.approx(oracle_ratio(), abs=0.005)] * 4, swung
    assert all(r < oracle_ratio() - 0.1 for r in ratios[1::2]), swung
    assert all(ARRIVAL * (1 - r) > CAPACITY_ROWS for r in ratios[1::2])  # more than it can do


def test_rates_carry_the_executors_throttled_share() -> None:
    """`rates_of` reads the share of CFS periods throttled from the samples' cumulative
    counters: 99 of 100 periods over the window."""
    samples = [Sample(0.0, 0.0, 0.0, 0.0, nr_periods=1000.0, nr_throttled=500.0),
               Sample(5.0, 500.0, 0.0, 5000.0, nr_periods=1050.0, nr_throttled=549.0),
               Sample(10.0, 1000.0, 0.0, 10000.0, nr_periods=1100.0, nr_throttled=599.0)]
    rates = rates_of(samples, 10.0, 10.0, cpu=0.4)
    assert rates is not None
    assert rates.throttled == pytest.approx(0.99)
    assert rates.saturated and rates.paid == pytest.approx(0.4 / 100.0)
