"""The load distributor's decision: which running tasks to move now, or why none (pure).

Owns `DistributionSettings` (period, threshold, cool-downs, minimum history, mode),
`DistributionView` (what the scheduler sees: the running tasks on each agent, those that may
move, each task's resources, each agent's free resources, the (task, agent) pairs an apart group
forbids), `DistributionDecision` and `decide_distribution`: Borealis' pairwise distribution
(`scheduler.load_distribution`: the most loaded agent paired with the least, one-way moves chosen
by the correlation score) restricted to tasks that may move, that are not cooling down, that the
target has room for (its free cpus and memory, the same resources a launch needs, counting the
tasks the round already sends there) and that no apart group keeps off the target. A hold says
why, with the numbers. Reads no clock (`now` passed in), does no I/O. Does not own the load
history (`scheduler.load_history`), starting the moves (`scheduler.state`, with the migration
protocol) nor counting them (`scheduler.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Sequence

from scheduler.load_distribution import (Mode, Move, Series, apply_moves, one_way, pairs,
                                         peak_load, two_way)

HoldReason = Literal["agents", "history", "balanced", "cooldown", "no_candidate"]
EPSILON = 1e-9
Check = Callable[[str, Sequence[str], str], bool]  # task, tasks sent there already, target


@dataclass(frozen=True)
class DistributionSettings:
    period_seconds: float = 30.0  # between two rounds
    threshold: float = 0.2  # mean-load difference (CPU s/s) of a pair that makes it move load
    min_slots: int = 12  # load history (slots of `LoadHistory.slot_seconds`) before any move
    task_cooldown_seconds: float = 300.0  # a task that moved stays put this long
    pair_cooldown_seconds: float = 120.0  # two agents that exchanged a task wait this long
    mode: Mode = "one-way"

    def __post_init__(self) -> None:
        if not (self.period_seconds > 0 and self.threshold > 0 and self.min_slots >= 2
                and self.task_cooldown_seconds >= 0 and self.pair_cooldown_seconds >= 0):
            raise ValueError(f"distribution settings need a period and threshold > 0, "
                             f"min_slots >= 2 and cool-downs >= 0, not {self}")


@dataclass(frozen=True)
class DistributionView:
    placed: Mapping[str, Sequence[str]]  # live agent -> the running tasks on it (every query's)
    movable: frozenset[str]  # tasks that may move now (opted in, not mid-rescale or migration)
    demand: Mapping[str, tuple[float, float]]  # task -> (cpus, MB) its launch asks for
    free: Mapping[str, tuple[float, float]]  # agent -> (cpus, MB) not held by our tasks
    forbidden: frozenset[tuple[str, str]] = frozenset()  # (task, agent): an apart group


@dataclass(frozen=True)
class DistributionDecision:
    kind: Literal["move", "hold"]
    reason: HoldReason | Literal["moves"]
    explanation: str
    moves: tuple[Move, ...] = ()
    means: Mapping[str, float] = field(default_factory=dict)  # agent -> mean load (CPU s/s)
    peak_before: float = 0.0
    peak_after: float = 0.0


def fits(view: DistributionView, task: str, target: str, already: Sequence[str]) -> bool:
    """The target has the cpus and memory for `task` besides the tasks already sent there."""
    cpus, mem = view.free.get(target, (0.0, 0.0))
    for t in (*already, task):
        cpus, mem = cpus - view.demand[t][0], mem - view.demand[t][1]
    return cpus >= -EPSILON and mem >= -EPSILON


def _cooling(at: float | None, seconds: float, now: float) -> bool:
    return at is not None and now - at < seconds


def decide_distribution(view: DistributionView, loads: Mapping[str, Series], slots: int,
                        settings: DistributionSettings, now: float,
                        last_task_move: Mapping[str, float] | None = None,
                        last_pair_move: Mapping[frozenset[str], float] | None = None,
                        short: Sequence[str] = ()) -> DistributionDecision:
    """One round: `loads` holds every placed task's series over the same `slots` slots;
    `short` names the tasks whose own history is under the minimum (for the explanation)."""
    task_moved = last_task_move or {}
    pair_moved = last_pair_move or {}
    if len(view.placed) < 2:
        return DistributionDecision("hold", "agents", f"{len(view.placed)} live agent(s): "
                                    "nothing to pair")
    if slots < settings.min_slots:
        few = f" (too few of their own: {', '.join(sorted(short)[:5])}" \
            f"{', ...' if len(short) > 5 else ''})" if short else ""
        return DistributionDecision("hold", "history", f"{slots} slots of load history in "
                                    f"common, {settings.min_slots} wanted before any move{few}")
    found = pairs(view.placed, loads)
    means = _means(view.placed, loads)
    holds: list[tuple[HoldReason, str]] = []
    moves: list[Move] = []
    for busy, idle, gap in found:
        numbers = f"{busy} {means[busy]:.3f} vs {idle} {means[idle]:.3f} CPU s/s"
        if gap < settings.threshold:
            holds.append(("balanced", f"{numbers}: gap {gap:.3f} under the threshold "
                          f"{settings.threshold:.3f}"))
            continue
        if _cooling(pair_moved.get(frozenset({busy, idle})), settings.pair_cooldown_seconds,
                    now):
            holds.append(("cooldown", f"{numbers}: the pair moved a task "
                          f"{now - pair_moved[frozenset({busy, idle})]:.0f} s ago (cool-down "
                          f"{settings.pair_cooldown_seconds:.0f} s)"))
            continue

        def allowed(task: str, already: Sequence[str], target: str = idle) -> bool:
            return task in view.movable and (task, target) not in view.forbidden \
                and not _cooling(task_moved.get(task), settings.task_cooldown_seconds, now) \
                and fits(view, task, target, already)
        chosen = _pair_moves(view, busy, idle, loads, settings.mode, allowed)
        if not chosen:
            holds.append(("no_candidate", f"{numbers}: no task of {busy} may move to {idle} "
                          "and narrow the gap (opted out, cooling down, moving, no room or "
                          "an apart group)"))
        moves += chosen
    before = peak_load(view.placed, loads)
    if not moves:
        reason, why = holds[0] if holds else ("balanced", "no pair")
        return DistributionDecision("hold", reason, why, (), means, before, before)
    after = peak_load(apply_moves(view.placed, moves), loads)
    said = "; ".join(f"{m.task} {m.source} -> {m.target} ({m.why})" for m in moves)
    return DistributionDecision("move", "moves", f"{said}; busiest agent's peak {before:.3f} "
                                f"-> {after:.3f} CPU s/s", tuple(moves), means, before, after)


def _pair_moves(view: DistributionView, busy: str, idle: str, loads: Mapping[str, Series],
                mode: Mode, allowed: Check) -> list[Move]:
    """One-way moves from `busy` to `idle`; in two-way mode the pair's re-placement when every
    move of it is allowed (each checked against its own target), else the one-way moves."""
    if mode == "two-way":
        swapped = two_way(busy, idle, view.placed, loads)
        sent: dict[str, list[str]] = {busy: [], idle: []}
        ok = True
        for m in swapped:
            ok = ok and allowed(m.task, sent[m.target], m.target)
            sent[m.target].append(m.task)
        if swapped and ok:
            return swapped
    return one_way(busy, idle, view.placed, loads,
                   lambda task, already: allowed(task, already, idle))


def _means(placed: Mapping[str, Sequence[str]], loads: Mapping[str, Series]
           ) -> dict[str, float]:
    return {a: float(sum(sum(loads[t]) / max(1, len(loads[t])) for t in ts))
            for a, ts in placed.items()}
