"""A task's fixed overhead beside its per-row cost measured at saturation (issue 32; pure), and
a sink whose rows are all dropped upstream, checked against plain computations built from the
benchmark's figures (docs/load.md, run 3 of 2026-11-30): heavy instances on agents of 0.4 cpu
that stay throttled whatever their rows (85-91 % of their CFS periods at 50 rows/s per source),
so their cgroup cpu is the agent's quota at any load, and a cpu per row taken over the rows a
plan lets through makes each row look dearer the fewer it keeps (`a`'s ratio 0.50 -> 0.54 ->
0.58 at a constant arrival)."""

from __future__ import annotations

import pytest

from common.control import Adjustable, ControlCatalog, Target
from common.tasks import ChannelSpec, CompiledQuery, QueryTask, Resources
from common.types import Schema
from scheduler.shed_policy import ShedPolicy, decide_shedding
from scheduler.shed_problem import TaskRates, behind_tasks, problem_of, processing_cost
from scheduler.shed_state import ShedState
from scheduler.shedding import agent_loads, sink_quality

SCHEMA = Schema.of(("sensor", "string"), ("value", "double"))
AGENT_CPU = 0.4  # the heavy agent's cpus, all of it used at any load (throttled)
CAPACITY_ROWS = 154.0  # rows/s the heavy instance processes with rows queued at its input
PAID = AGENT_CPU / CAPACITY_ROWS  # cpu per row at saturation: 2.6 ms
ARRIVAL = 465.0  # rows/s arriving at each source
SOURCE_READ = 0.0001  # cpu per row a source task pays to make a row and hash it
HEADROOM = ShedPolicy().headroom


def task(task_id: str, operators: tuple[str, ...], inputs: tuple[str, ...] = (),
         outputs: tuple[str, ...] = ()) -> QueryTask:
    return QueryTask("q", task_id, "spark", operators, inputs, outputs, False,
                     Resources(1.0, 512, len(outputs)), "# program\n")


def drop(name: str, task_id: str) -> Adjustable:
    return Adjustable(name, "drop", "ratio", "float", "0", (Target(task_id, name, "ratio"),))


def pair() -> CompiledQuery:
    """Pipelines a (weight 3) and b (weight 1): a source task with its drop (on S) -> the heavy
    instance and sink (on H, both instances sharing H's cpu)."""
    tasks, channels, drops = [], [], []
    for p in ("a", "b"):
        tasks += [task(f"q.{p}0", (f"src_{p}", f"{p}_drop"), outputs=(f"q/{p}",)),
                  task(f"q.{p}1", (f"heavy_{p}", f"out_{p}"), inputs=(f"q/{p}",))]
        channels.append(ChannelSpec(f"q/{p}", p, SCHEMA, f"q.{p}0", (f"q.{p}1",)))
        drops.append(drop(f"{p}_drop", f"q.{p}0"))
    return CompiledQuery("q", tuple(tasks), tuple(channels), {}, ControlCatalog(tuple(drops)),
                         weights={"out_a": 3.0, "out_b": 1.0})


RUNNING = {"q.a0": "S", "q.b0": "S", "q.a1": "H", "q.b1": "H"}
CAPACITY = {"S": 8.0, "H": AGENT_CPU}


def source(ratio: float) -> TaskRates:
    kept = ARRIVAL * (1.0 - ratio)
    return TaskRates(ARRIVAL, kept, ARRIVAL - kept, 0.5, cpu=ARRIVAL * SOURCE_READ)


def throttled_window(ratios: tuple[float, float], b_overhead: float = 0.0
                     ) -> dict[str, TaskRates]:
    """Both pipelines while `ratios` are shed, on an agent throttled whatever its rows: H's
    0.4 cpu all used. Each instance processes what reaches it, at most its share of
    CAPACITY_ROWS (the rest queues); an instance given rows takes the agent's cpu less
    `b_overhead`, what b's instance spends on empty batches when it is given none."""
    kept = {p: ARRIVAL * (1.0 - r) for p, r in zip("ab", ratios)}
    given = [p for p in "ab" if kept[p] > 0]
    out = {f"q.{p}0": source(r) for p, r in zip("ab", ratios)}
    for p in "ab":
        if kept[p] <= 0:
            out[f"q.{p}1"] = TaskRates(0.0, 0.0, 0.0, 0.2, cpu=b_overhead, throttled=0.99)
            continue
        rows = min(kept[p], CAPACITY_ROWS / len(given))
        cpu = (AGENT_CPU - (b_overhead if len(given) == 1 else 0.0)) / len(given)
        out[f"q.{p}1"] = TaskRates(rows, 0.0, 0.0, 1.0, per_row=0.0002, cpu=cpu,
                                   throttled=0.99)
    return out


def decisions(windows: int, b_overhead: float = 0.0, hold: bool = True
              ) -> list[tuple[float, float]]:
    """The ratios (a, b) after each of `windows` decisions 30 s apart, each fed the window the
    ratios before it give, the state kept as the scheduler keeps it (`_shed_decision`);
    `hold`: the costs the state holds are passed to the problem (without: each window's own)."""
    state, ratios, seen = ShedState(), (0.0, 0.0), []
    for i in range(windows):
        rates = throttled_window(ratios, b_overhead)
        shedding = any(r > 0 for r in ratios)
        state.observe_overhead(rates)
        state.observe_saturation(rates, shedding, behind_tasks(pair(), RUNNING, rates))
        problem = problem_of(pair(), RUNNING, rates, CAPACITY, state.unshed_for(rates),
                             state.last_costs, state.held_for(shedding) if hold else None,
                             state.overhead if hold else None)
        assert not isinstance(problem, str), problem
        state.observe_costs(problem, rates)
        current = {"a_drop.ratio": ratios[0], "b_drop.ratio": ratios[1]}
        decision = decide_shedding(problem, False, current, ShedPolicy(), now=30.0 * i,
                                   last_change=None)
        sent = {op: float(v) for op, p, v in decision.tuples if p == "ratio"}
        ratios = (sent.get("a_drop", ratios[0]), sent.get("b_drop", ratios[1]))
        seen.append(ratios)
    return seen


def oracle_a_ratio(b_overhead: float = 0.0) -> float:
    """The plain computation: b (weight 1) dropped whole, a (weight 3) keeps what 0.9 of H's
    cpu, less b's overhead, processes at the cpu per row paid at saturation."""
    return 1.0 - (HEADROOM * AGENT_CPU - b_overhead) / PAID / ARRIVAL


def test_a_task_behind_is_costed_at_saturation_and_others_hold_that_cost() -> None:
    """Behind (rows queued: it processed 77 of the 465 rows/s delivered) its cost is its cpu
    beyond its overhead per row; with nothing queued and a held cost, the held cost beside the
    overhead as a fixed load; an instance that processed no row is all overhead."""
    rates = throttled_window((0.0, 0.0))
    assert behind_tasks(pair(), RUNNING, rates) == {"q.a1", "q.b1"}
    assert processing_cost(rates["q.a1"], None, behind=True, overhead=0.05) == \
        pytest.approx(((0.2 - 0.05) / 77.0, 0.05))
    relieved = throttled_window((1.0 - 100.0 / ARRIVAL, 1.0))  # 100 rows/s of a: no queue
    assert behind_tasks(pair(), RUNNING, relieved) == set()
    assert processing_cost(relieved["q.a1"], PAID, behind=False, overhead=0.0) == (PAID, 0.0)
    assert processing_cost(relieved["q.b1"], PAID) == (0.0, relieved["q.b1"].load)


def test_the_ratio_stays_where_the_saturated_cost_puts_it_on_an_agent_throttled_at_any_load(
        ) -> None:
    """The first plan (every instance behind, 2.6 ms per row) drops all of b and 0.70 of a,
    keeping 0.9 x 154 = 139 rows/s of a. Relieved, a's instance processes all 139 but its
    agent stays throttled, its cpu 0.4 whatever its rows: over 139 rows that is 2.9 ms per
    row, and costed so (the old rule: throttled = saturated, cpu per row processed) every
    plan keeps 90 % of what the one before let through: 0.70 -> 0.73 -> 0.76 -> ... With the
    cost held from the window in which rows queued, every later decision keeps 0.70."""
    held = decisions(8)
    assert held == [(pytest.approx(oracle_a_ratio(), abs=0.005), 1.0)] * 8, held
    assert oracle_a_ratio() == pytest.approx(0.70, abs=0.01)
    crept = [a for a, _ in decisions(8, hold=False)]
    kept = [ARRIVAL * (1.0 - a) for a in crept]
    assert all(k1 < 0.92 * k0 for k0, k1 in zip(kept, kept[1:4])), crept  # the creep
    assert crept[3] > oracle_a_ratio() + 0.05, crept


def test_an_instance_given_no_rows_counts_its_overhead_as_a_fixed_load() -> None:
    """b's instance behind a ratio of 1.0 runs empty batches that take 0.04 of H's cpu: a
    fixed load (before, a task processing no rows was costed at 0, its cpu left out, and the
    plan kept more of a than the 0.36 - 0.04 cpu left for it processes). a keeps (0.36 - 0.04)
    / 2.6 ms = 123 rows/s (ratio 0.735), steadily."""
    seen = decisions(6, b_overhead=0.04)
    assert seen[1:] == [(pytest.approx(oracle_a_ratio(0.04), abs=0.005), 1.0)] * 5, seen
    assert oracle_a_ratio(0.04) == pytest.approx(0.735, abs=0.005)


def test_a_sink_whose_rows_are_all_dropped_upstream_keeps_nothing() -> None:
    """b's source at a ratio of 1.0 sends nothing; its instance still drains 50 rows/s queued
    before the ratio. Before, the instance's share of the rows delivered was 0 (nothing
    delivered), so its selectivity was 0, kept as its last one, and b's sink had no unshed
    value: `sink_b keeps 100%` beside b at 1.0 in the benchmark's explanations. Its rows are
    its own (queued), so it keeps its selectivity of 1 and b's sink keeps 0 % of its value
    under the ratio in force, in this window and in the next, when it processes none."""
    state = ShedState()
    before = throttled_window((0.0, 0.0))  # unshed: every task's last cost and selectivity
    problem = problem_of(pair(), RUNNING, before, CAPACITY)
    assert not isinstance(problem, str), problem
    state.observe_costs(problem, before)
    for drained in (50.0, 0.0):
        rates = {"q.a0": source(0.7), "q.b0": source(1.0),
                 "q.a1": TaskRates(139.5, 0.0, 0.0, 1.0, cpu=0.36, throttled=0.99),
                 "q.b1": TaskRates(drained, 0.0, 0.0, 0.2, cpu=0.04, throttled=0.99)}
        problem = problem_of(pair(), RUNNING, rates, CAPACITY, last=state.last_costs)
        assert not isinstance(problem, str), problem
        state.observe_costs(problem, rates)
        keep = {("a_drop", "all"): 0.3, ("b_drop", "all"): 0.0}
        assert sink_quality(problem, keep) == pytest.approx({"out_a": 0.3, "out_b": 0.0})
        assert agent_loads(problem, {})["H"] > 2 * AGENT_CPU  # b's rows cost H if kept

