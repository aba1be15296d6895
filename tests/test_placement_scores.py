"""Placement by load correlation (scheduler/placement_scores.py, docs/load.md "Placement by the
same scores"): the pure ordering, by hand, and in the scheduler's state machine a task placed
again after its agent was lost going where its load does not peak with the agent's, where first
fit would have put it beside a task peaking with it."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.events import AgentLost, OffersReceived, QuerySubmitted, Registered, Tick
from scheduler.placement_scores import predicted_load, ranked_agents
from scheduler.state import SchedulerState
from scheduler.testing import chain_query, offer
from tests.test_distribution_state import CONFIG, run
from tests.test_scheduler_state import launched, update

UP, DOWN = [1.0, 2.0, 1.0, 2.0], [2.0, 1.0, 2.0, 1.0]


def test_predicted_load_is_the_tasks_own_else_its_siblings_mean() -> None:
    assert predicted_load([1.0, 3.0], [[9.0, 9.0]]) == [1.0, 3.0]
    assert predicted_load([], [[1.0, 3.0], [3.0, 5.0]]) == [2.0, 4.0]
    assert predicted_load([], []) == []
    assert predicted_load([], [[1.0, 2.0], [1.0]]) == []  # no common length: no prediction


def test_an_agent_peaking_against_the_task_comes_first_at_equal_mean_load() -> None:
    ranking = ranked_agents(UP, {"a": UP, "b": DOWN, "c": [1.5] * 4})
    assert ranking is not None
    assert ranking.agents == ("b", "c", "a")  # rho -1, 0 (flat: no evidence), +1
    assert ranking.reason.startswith("agents by load correlation over 4 slots: b (rho -1.00")


def test_balance_comes_before_correlation() -> None:
    # b peaks against the task but carries more than the mean: the lighter agents first
    ranking = ranked_agents(UP, {"a": UP, "b": [x + 5.0 for x in DOWN], "c": [0.0] * 4})
    assert ranking is not None and ranking.agents == ("c", "a", "b")


@pytest.mark.parametrize("predicted, agents", [
    ([1.0, 2.0], {}),  # no agent
    ([2.0, 2.0, 2.0], {"a": [1.0, 2.0, 3.0]}),  # a flat prediction: nothing to correlate
    ([1.0], {"a": [1.0]}),  # one slot
    ([1.0, 2.0], {"a": [1.0, 2.0, 3.0]}),  # lengths differ
])
def test_no_ranking_without_evidence(predicted: list[float], agents: dict) -> None:
    assert ranked_agents(predicted, agents) is None


def test_a_seeded_ranking_is_a_permutation_with_the_light_agents_first() -> None:
    rng = random.Random(32)
    for _ in range(200):
        n = rng.randint(2, 12)
        agents = {f"a{i}": [rng.uniform(0, 3) for _ in range(n)] for i in range(rng.randint(1, 8))}
        predicted = [rng.uniform(0, 1) for _ in range(n)]
        ranking = ranked_agents(predicted, agents)
        assert ranking is not None
        assert sorted(ranking.agents) == sorted(agents)
        means = [sum(agents[a]) / n for a in ranking.agents]
        overall = sum(means) / len(means)
        heavy = [m > overall + 1e-9 for m in means]
        assert heavy == sorted(heavy)  # no agent above the mean before one at or below it


# --- in the state machine -------------------------------------------------------------------

def three_running(distribute: bool) -> tuple[SchedulerState, dict[str, str]]:
    """q.t0, q.t1, q.t2 (1 cpu each) on a1, a2, a3, one each (1.1 cpus: a task and the
    executor's 0.1); every task RUNNING. Task id -> agent."""
    s = SchedulerState(CONFIG)
    s.handle(Registered("r", "fw-1", "m:5050"))
    s.handle(Tick("t", 0.0))
    s.handle(QuerySubmitted("s", replace(chain_query("q", 3), distribute=distribute)))
    out = s.handle(OffersReceived("o", tuple(
        offer(f"o{i}", f"a{i}", cpus=1.1, ports=((31000 + 1000 * i, 31009 + 1000 * i),))
        for i in (1, 2, 3))))
    placed = {mid: agent for mid, (agent, _) in launched(out).items()}
    assert sorted(placed.values()) == ["a1", "a2", "a3"]
    for mid, agent in placed.items():
        s.handle(update(mid, "RUNNING", agent))
    return s, {mid.rpartition(".a")[0]: agent for mid, agent in placed.items()}


def relaunch_after_losing_a1(distribute: bool) -> tuple[str, str, str]:
    """The task on a1 peaks with the one on a3 and against the one on a2; a1 is lost once the
    history is long enough; a3 and a2 then offer room for one task, a3 first. -> (the task,
    the agent it is launched on, the reason in its history)."""
    s, where = three_running(distribute)
    by_agent = {a: t for t, a in where.items()}
    signs = {by_agent["a1"]: 1.0, by_agent["a2"]: -1.0, by_agent["a3"]: 1.0}
    run(s, signs, 0.0, 60.0, {})  # 12 slots of 5 s (CONFIG asks 8), every agent balanced
    s.handle(AgentLost("lost", "a1"))
    s.handle(Tick("t", 61.0))
    out = s.handle(OffersReceived("o", (
        offer("o7", "a3", cpus=1.0, ports=((33000, 33009),), executor_ids=("elastiq-exec-a3",)),
        offer("o8", "a2", cpus=1.0, ports=((32000, 32009),), executor_ids=("elastiq-exec-a2",)))))
    ((mid, (agent, _)),) = launched(out).items()
    task = s.queries["q"].tasks[by_agent["a1"]]
    return mid.rpartition(".a")[0], agent, task.history[-1].note if task.history else ""


def test_a_task_placed_again_goes_where_its_load_does_not_peak() -> None:
    task, agent, reason = relaunch_after_losing_a1(distribute=True)
    assert agent == "a2", reason  # first fit would take a3, offered first
    assert "agents by load correlation over" in reason and "a2 (rho -1.00" in reason


def test_a_query_that_did_not_opt_in_is_placed_first_fit() -> None:
    _, agent, reason = relaunch_after_losing_a1(distribute=False)
    assert agent == "a3" and "correlation" not in reason
