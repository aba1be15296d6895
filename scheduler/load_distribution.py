"""Dynamic load distribution's decision: which tasks move between which agents (pure).

Owns Borealis' correlation-based load distribution (Xing, Zdonik, Hwang, "Dynamic Load Distribution
in the Borealis Stream Processor", ICDE'05, "Dynamic Load Distribution Algorithms"; docs/load.md):
every task has a load time series (CPU s/s per sampling period, from heartbeats and the isolation
figures), an agent's series is the sum of its tasks'. Periodically `plan_moves` orders the agents
by mean load, pairs the i-th with the (n-i+1)-th, and, for a
pair whose mean loads differ by at least a threshold and which is not cooling down, moves tasks:
- `one_way`: the busier agent offloads half the difference, the task with the largest score
  first, where score(o) = rho(o, the other tasks on A) - rho(o, the tasks on B): a task whose
  load peaks with its neighbours' and not with the other agent's;
- `two_way`: both agents' tasks are re-placed from scratch, each time the highest-scoring task
  going to the less loaded agent (a better placement, more moves).
`correlation` is Pearson's coefficient (0 where a series is flat). Every move carries its score
and a reason with the numbers. Reads no clock (`now` and the last move times are passed in) and
does no I/O. Does not own the load history's collection, nor running a move (the migration
protocol), nor counting moves (`scheduler.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

Series = Sequence[float] | np.ndarray
Mode = Literal["one-way", "two-way"]
# may this task go to the target, given the tasks this round already sends there (None: any)
Allowed = Callable[[str, Sequence[str]], bool]


@dataclass(frozen=True)
class DistributionPolicy:
    threshold: float = 0.2  # mean-load difference (CPU s/s) that makes a pair move load
    cooldown_seconds: float = 120.0  # an agent that took part in a move waits this long
    mode: Mode = "one-way"


@dataclass(frozen=True)
class Move:
    task: str
    source: str
    target: str
    score: float
    why: str


def correlation(x: Series, y: Series) -> float:
    """Pearson's correlation coefficient of two load series of the same length (0 when either
    is flat or empty: no evidence that they move together)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.size == 0 or a.size != b.size:
        return 0.0
    a, b = a - a.mean(), b - b.mean()
    scale = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / scale) if scale > 1e-12 else 0.0


def total(series: Sequence[Series], length: int) -> np.ndarray:
    out = np.zeros(length)
    for s in series:
        out += np.asarray(s, dtype=float)
    return out


def mean_load(series: Sequence[Series], length: int) -> float:
    return float(total(series, length).mean()) if length else 0.0


def score(task: str, loads: Mapping[str, Series], here: Sequence[str],
          there: Sequence[str]) -> float:
    """The one-way score of moving `task` from the agent holding `here` to the one holding
    `there`: rho(task, the rest of here) - rho(task, there)."""
    length = len(loads[task])
    rest = total([loads[t] for t in here if t != task], length)
    other = total([loads[t] for t in there], length)
    return correlation(loads[task], rest) - correlation(loads[task], other)


def one_way(source: str, target: str, placed: Mapping[str, Sequence[str]],
            loads: Mapping[str, Series], allowed: Allowed | None = None) -> list[Move]:
    """`source` (the busier) offloads about half the mean-load difference to `target`, the
    highest-scoring task first, scores recomputed after each move; a task moves only while
    moving it narrows the difference, and only if `allowed` (task, the tasks moved to `target`
    so far) says it may (the scheduler's room, apart groups, opt-outs, cool-downs)."""
    here, there = list(placed[source]), list(placed[target])
    length = _length(loads, here + there)
    here_sum = total([loads[t] for t in here], length)
    there_sum = total([loads[t] for t in there], length)
    moves: list[Move] = []
    for _ in range(len(here)):
        gap = float(here_sum.mean() - there_sum.mean()) if length else 0.0
        scored = sorted((-(correlation(loads[t], here_sum - np.asarray(loads[t], dtype=float))
                           - correlation(loads[t], there_sum)), -_mean(loads[t]), t)
                        for t in here if abs(gap - 2 * _mean(loads[t])) < abs(gap)
                        and (allowed is None or allowed(t, [m.task for m in moves])))
        if not scored or gap <= 0:
            break
        negated, _, task = scored[0]  # the highest score; ties: the larger load, then the name
        best = -negated
        here.remove(task)
        there.append(task)
        here_sum = here_sum - np.asarray(loads[task], dtype=float)
        there_sum = there_sum + np.asarray(loads[task], dtype=float)
        moves.append(Move(task, source, target, best,
                          f"{source} {gap:+.3f} CPU s/s over {target}; score {best:+.3f}"))
    return moves


def two_way(first: str, second: str, placed: Mapping[str, Sequence[str]],
            loads: Mapping[str, Series]) -> list[Move]:
    """Both agents' tasks placed again from empty: each time the task with the highest score
    for the less loaded agent (rho with the other agent minus rho with it; ties: the larger
    mean load, then the name) goes there. The moves are the tasks that changed agent; none if
    the new placement would leave the pair's mean loads further apart than they are."""
    tasks = sorted([*placed[first], *placed[second]])
    length = _length(loads, tasks)
    now = {first: [], second: []}  # type: dict[str, list[str]]
    scores: dict[str, float] = {}
    while tasks:
        a, b = (first, second) if mean_load([loads[t] for t in now[first]], length) <= \
            mean_load([loads[t] for t in now[second]], length) else (second, first)
        a_sum, b_sum = total([loads[t] for t in now[a]], length), \
            total([loads[t] for t in now[b]], length)
        best = max(tasks, key=lambda t: (correlation(loads[t], b_sum)
                                         - correlation(loads[t], a_sum), _mean(loads[t]), t))
        scores[best] = correlation(loads[best], b_sum) - correlation(loads[best], a_sum)
        tasks.remove(best)
        now[a].append(best)
    origin = {t: agent for agent in (first, second) for t in placed[agent]}
    if _gap(now, loads, length, first, second) > _gap(placed, loads, length, first, second):
        return []
    return [Move(t, origin[t], agent, scores[t], f"two-way re-placement of {first} and "
                 f"{second}; score {scores[t]:+.3f}")
            for agent in (first, second) for t in now[agent] if origin[t] != agent]


def _gap(placed: Mapping[str, Sequence[str]], loads: Mapping[str, Series], length: int,
         first: str, second: str) -> float:
    return abs(mean_load([loads[t] for t in placed[first]], length)
               - mean_load([loads[t] for t in placed[second]], length))


def pairs(placed: Mapping[str, Sequence[str]], loads: Mapping[str, Series]
          ) -> list[tuple[str, str, float]]:
    """The agents ordered by mean load, the i-th busiest paired with the i-th least busy:
    (busier, less busy, difference of mean loads)."""
    length = _length(loads, [t for ts in placed.values() for t in ts])
    means = {a: mean_load([loads[t] for t in ts], length) for a, ts in placed.items()}
    order = sorted(means, key=lambda a: (-means[a], a))
    return [(order[i], order[-1 - i], means[order[i]] - means[order[-1 - i]])
            for i in range(len(order) // 2)]


def plan_moves(placed: Mapping[str, Sequence[str]], loads: Mapping[str, Series],
               policy: DistributionPolicy, now: float,
               last_move: Mapping[str, float] | None = None) -> list[Move]:
    """One round of pairwise distribution: the moves for every pair whose mean loads differ by
    at least the threshold and neither of whose agents moved within the cool-down."""
    last_move = last_move or {}
    moves: list[Move] = []
    for busy, idle, gap in pairs(placed, loads):
        if gap < policy.threshold:
            continue
        if any(now - last_move.get(a, -np.inf) < policy.cooldown_seconds for a in (busy, idle)):
            continue
        found = one_way(busy, idle, placed, loads) if policy.mode == "one-way" \
            else two_way(busy, idle, placed, loads)
        moves += found
    return moves


def apply_moves(placed: Mapping[str, Sequence[str]], moves: Sequence[Move]
                ) -> dict[str, list[str]]:
    out = {a: list(ts) for a, ts in placed.items()}
    for m in moves:
        out[m.source].remove(m.task)
        out[m.target].append(m.task)
    return out


def peak_load(placed: Mapping[str, Sequence[str]], loads: Mapping[str, Series]) -> float:
    """The highest load any agent carries at any time of the series."""
    length = _length(loads, [t for ts in placed.values() for t in ts])
    return max((float(total([loads[t] for t in ts], length).max()) if length else 0.0
                for ts in placed.values()), default=0.0)


def _mean(series: Series) -> float:
    return float(np.mean(series)) if len(series) else 0.0


def _length(loads: Mapping[str, Series], tasks: Sequence[str]) -> int:
    lengths = {len(loads[t]) for t in tasks}
    if len(lengths) > 1:
        raise ValueError(f"load series of different lengths: {sorted(lengths)}")
    return lengths.pop() if lengths else 0
