"""Placement by load correlation: which agents a task should try first (pure; docs/load.md).

Borealis places operators where their load does not peak with the load already there (Xing,
Zdonik, Hwang, ICDE'05, "correlation-based initial placement"); the load distributor's moves
(`scheduler.distributor`) then only correct what placement got wrong. Owns the ordering the
scheduler gives a pending task of a query that says `distribute="true"` when its load history
is known:
- `predicted_load`: the task's own series (a task placed again, after its agent failed or its
  query was updated), else the mean of its elastic operator's running instances' series (a
  scale-out's new instance will carry a share of the same input, so its load has their shape);
- `ranked_agents`: the agents whose mean load is at most the cluster's mean first (balance first,
  as the paper does), each group ordered by Pearson's coefficient between the predicted series
  and the agent's (least first: an empty or flat agent scores 0, one whose load falls when the
  task's rises scores below 0), ties by mean load then name; with the reason, the numbers named.
The order is a preference only: placement (`scheduler.placement`) still takes the first agent of
it with room, and gang placement, apart groups and ports are checked as always. Reads no clock,
does no I/O; does not own the load history (`scheduler.load_history`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from scheduler.load_distribution import correlation

Series = Sequence[float]


@dataclass(frozen=True)
class Ranking:
    agents: tuple[str, ...]  # the order to try, best first
    reason: str  # why, with each agent's coefficient and mean load


def predicted_load(own: Series, siblings: Sequence[Series]) -> list[float]:
    """The load series a task is expected to carry: its own when it has one, else the mean of
    its siblings' (series of the same length; none: an empty series)."""
    if own:
        return list(own)
    if not siblings or not all(len(s) == len(siblings[0]) for s in siblings):
        return []
    return [sum(values) / len(siblings) for values in zip(*siblings)]


def ranked_agents(predicted: Series, agents: Mapping[str, Series]) -> Ranking | None:
    """`agents` (agent -> its load series, the same length as `predicted`) in the order a task of
    load `predicted` should try them, or None without evidence (no agents, series of another
    length, or a flat prediction: nothing to correlate)."""
    n = len(predicted)
    if not agents or n < 2 or any(len(s) != n for s in agents.values()) \
            or max(predicted) - min(predicted) <= 1e-12:
        return None
    means = {a: sum(s) / n for a, s in agents.items()}
    overall = sum(means.values()) / len(means)
    rho = {a: correlation(predicted, s) for a, s in agents.items()}
    order = sorted(agents, key=lambda a: (means[a] > overall + 1e-9, rho[a], means[a], a))
    figures = ", ".join(f"{a} (rho {rho[a]:+.2f}, mean {means[a]:.2f})" for a in order)
    return Ranking(tuple(order), f"agents by load correlation over {n} slots: {figures}")
