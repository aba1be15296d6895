"""Correlation-based load distribution (scheduler/load_distribution.py), pure: the paper's example
(Xing et al., ICDE'05, docs/load.md: the cut plan beats the connect plan), hand-computed scores,
pairing, threshold and cool-down, and the issue's two anti-correlated waves against first-fit
placement."""

from __future__ import annotations

import math
import random

import pytest

from scheduler.load_distribution import (DistributionPolicy, apply_moves, correlation, one_way,
                                         pairs, peak_load, plan_moves, score, two_way)

T = 48
WAVE = [math.sin(2 * math.pi * i / T) for i in range(T)]


def wave(sign: float, base: float = 1.0) -> list[float]:
    return [base + sign * w for w in WAVE]


def test_correlation_by_hand() -> None:
    assert correlation([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert correlation([1, 2, 3, 4], [1, 3, 1, 3]) == pytest.approx(0.4472135955)  # 2/sqrt(20)
    assert correlation([1, 1, 1], [1, 2, 3]) == 0.0  # flat: no evidence
    assert correlation([], []) == 0.0


def test_the_one_way_score_by_hand() -> None:
    """o peaks with its neighbour on A and against B's task: rho 1 - (-1) = 2."""
    loads = {"o": wave(1), "n": wave(1), "b": wave(-1)}
    assert score("o", loads, ["o", "n"], ["b"]) == pytest.approx(2.0)
    assert score("o", loads, ["o"], ["n"]) == pytest.approx(-1.0)  # alone: rho(o, nothing) 0


def test_the_cut_plan_beats_the_connect_plan() -> None:
    """Two chains a->b and c->d with input rates r1, r2 that fluctuate independently. The
    connect plan (each chain on one node) lets each node follow one input; two-way
    re-placement splits every chain across both nodes (the cut plan), whose node loads are both
    r1 + r2: perfectly correlated and balanced at every instant."""
    rng = random.Random(7)
    r1 = [1 + 0.8 * math.sin(i / 3) + rng.uniform(-0.1, 0.1) for i in range(60)]
    r2 = [1 + 0.8 * math.cos(i / 5) + rng.uniform(-0.1, 0.1) for i in range(60)]
    loads = {"a": r1, "b": r1, "c": r2, "d": r2}
    connect = {"N1": ["a", "b"], "N2": ["c", "d"]}
    cut = apply_moves(connect, two_way("N1", "N2", connect, loads))
    assert {frozenset(ts) for ts in cut.values()} in (
        {frozenset("ac"), frozenset("bd")}, {frozenset("ad"), frozenset("bc")})
    node = {n: [sum(loads[t][i] for t in ts) for i in range(60)] for n, ts in cut.items()}
    assert correlation(node["N1"], node["N2"]) == pytest.approx(1.0)
    assert peak_load(cut, loads) < peak_load(connect, loads)


def first_fit(tasks: list[str], loads: dict[str, list[float]], agents: list[str],
              capacity: float) -> dict[str, list[str]]:
    """The placement Elastiq makes today: each task on the first agent whose mean load leaves
    room for it."""
    placed: dict[str, list[str]] = {a: [] for a in agents}
    for t in tasks:
        for a in agents:
            if sum(sum(loads[x]) / T for x in placed[a]) + sum(loads[t]) / T <= capacity + 1e-9:
                placed[a].append(t)
                break
    return placed


def test_two_anti_correlated_waves_lower_the_peak_by_a_quarter() -> None:
    loads = {"w1a": wave(1), "w1b": wave(1), "w2a": wave(-1), "w2b": wave(-1)}
    placed = first_fit(list(loads), loads, ["A", "B"], capacity=3.0)
    assert placed == {"A": ["w1a", "w1b", "w2a"], "B": ["w2b"]}
    moves = plan_moves(placed, loads, DistributionPolicy(threshold=0.5), now=0.0)
    after = apply_moves(placed, moves)
    assert [m.task for m in moves] == ["w1a"]  # one move: the task peaking with A, not with B
    assert peak_load(after, loads) <= 0.75 * peak_load(placed, loads)
    assert peak_load(after, loads) == pytest.approx(2.0)  # both agents flat at 2


def test_one_way_offloads_about_half_the_difference() -> None:
    loads = {f"t{i}": [1.0] * 4 for i in range(6)}
    moves = one_way("A", "B", {"A": [f"t{i}" for i in range(6)], "B": []}, loads)
    assert len(moves) == 3  # 6 vs 0: three tasks make it 3 vs 3


def test_pairs_the_busiest_with_the_least_busy() -> None:
    loads = {"a": [4.0], "b": [3.0], "c": [2.0], "d": [1.0]}
    placed = {"A": ["a"], "B": ["b"], "C": ["c"], "D": ["d"]}
    assert pairs(placed, loads) == [("A", "D", 3.0), ("B", "C", 1.0)]


def test_threshold_and_cool_down() -> None:
    loads = {"a": wave(1, 2), "b": wave(1, 2), "c": wave(-1, 1)}
    placed = {"A": ["a", "b"], "B": ["c"]}
    policy = DistributionPolicy(threshold=1.0, cooldown_seconds=60.0)
    assert plan_moves(placed, loads, policy, now=100.0)  # gap 3 >= 1
    assert not plan_moves(placed, loads, DistributionPolicy(threshold=5.0), now=100.0)
    assert not plan_moves(placed, loads, policy, now=100.0, last_move={"B": 50.0})
    assert plan_moves(placed, loads, policy, now=100.0, last_move={"B": 30.0})


def test_series_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        pairs({"A": ["a"], "B": ["b"]}, {"a": [1.0], "b": [1.0, 2.0]})


@pytest.mark.parametrize("seed", range(20))
def test_a_round_never_widens_a_pair_and_keeps_every_task(seed: int) -> None:
    rng = random.Random(seed)
    agents = [f"N{i}" for i in range(rng.randint(2, 6))]
    loads = {f"t{i}": [rng.uniform(0, 1) + 0.5 * math.sin(i + j / 4) for j in range(T)]
             for i in range(rng.randint(2, 20))}
    placed = {a: [] for a in agents}  # type: dict[str, list[str]]
    for t in loads:
        placed[rng.choice(agents)].append(t)
    for mode in ("one-way", "two-way"):
        moves = plan_moves(placed, loads, DistributionPolicy(threshold=0.1, mode=mode), 0.0)
        after = apply_moves(placed, moves)
        assert sorted(t for ts in after.values() for t in ts) == sorted(loads)
        for busy, idle, gap in pairs(placed, loads):
            mean = {a: sum(sum(loads[t]) for t in after[a]) / T for a in (busy, idle)}
            assert abs(mean[busy] - mean[idle]) <= abs(gap) + 1e-9
