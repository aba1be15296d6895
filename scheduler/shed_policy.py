"""When to shed and when to stop: the scheduler's shedding decision for one query (pure).

Owns `decide_shedding`: from the query's shedding problem (`scheduler.shedding.ShedProblem`,
built from measured costs and selectivities), whether capacity can still be added (the elastic
policy holds at max-parallelism, or a scale-out was refused for lack of room:
`cannot_add_capacity`), the drop ratios in force and the time of the last change, it returns a
`ShedDecision`: shed (the LP's ratios, against capacities scaled by the policy's headroom),
release (every ratio back to 0: the unshed load fits again under `release_below`, or capacity
can be added again, which scaling does better than dropping), or hold, with a bounded reason, an
explanation with the numbers and the control tuples `(operator, parameter, value)` that apply
it. Shedding is the last resort: nothing is dropped while capacity can be added. Reads no clock
(`now` passed in), does no I/O. Does not own sending the tuples (the scheduler's control path)
or counting (`scheduler.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, Mapping, Sequence

from scheduler.elastic_policy import Decision
from scheduler.shedding import (EPSILON, ShedPlan, ShedProblem, agent_loads, operator_loads,
                                plan_shedding, unrelieved)

ShedKind = Literal["shed", "release", "hold"]
ShedReason = Literal["overload", "fits", "can_scale", "cooldown", "unchanged", "idle",
                     "infeasible", "no_data", "manual", "error"]
# no_data: no problem could be built; manual: the query has no automatic operator; error: the
# decision raised (the caller logs it and holds, so the tick's other decisions still run)
RATIO_STEP = 0.01  # a ratio that moves less than this is not worth a control tuple


@dataclass(frozen=True)
class ShedPolicy:
    """The shedding policy's settings (`SchedulerConfig.shedding`)."""

    headroom: float = 0.9  # plan each agent to at most this share of its capacity
    release_below: float = 0.7  # stop shedding when the unshed load is under this share
    cooldown_seconds: float = 30.0  # between two changes of the ratios
    every_seconds: float = 5.0  # the policy looks at a query at most this often


@dataclass(frozen=True)
class ShedDecision:
    kind: ShedKind
    reason: ShedReason
    explanation: str
    tuples: tuple[tuple[str, str, str], ...] = ()
    plan: ShedPlan | None = None
    quality: Mapping[str, float] = field(default_factory=dict)  # expected, per sink


def cannot_add_capacity(decisions: Sequence[Decision], refused_for_room: bool,
                        shedding_at_bound: bool = False) -> bool:
    """No capacity can be added: an operator the policy would scale out holds at its
    max-parallelism, or the last scale-out was refused because no agent had room, or rows are
    being shed while an automatic operator runs at its bound (`shedding_at_bound`): its
    decisions then see the load the drops leave, which fits, and no longer say it needs more
    (on real executors they said `draining` or `steady` a few seconds after the first ratio,
    and the ratios were released and sent again in turn); only a bound that moves (an agent
    more) lets capacity be added again."""
    return refused_for_room or shedding_at_bound or any(d.kind == "hold" and d.reason == "bounds"
                                   and d.needed is not None and d.needed > d.current
                                   for d in decisions)


def _utilisation(problem: ShedProblem) -> tuple[float, str]:
    """The unshed load of the most loaded agent or limited operator against its bound, of those
    a drop can relieve (not `unrelieved`: their fixed load alone passes the bound)."""
    loads = agent_loads(problem, {})
    bounds = dict(problem.capacity)
    own = operator_loads(problem, {})
    for name, limit in problem.limits.items():
        loads[name], bounds[name] = own[name], limit
    for name in unrelieved(problem):
        del loads[name]
    worst = max(loads, key=lambda a: loads[a] / bounds[a] if bounds[a] > 0 else
                (float("inf") if loads[a] > 0 else 0.0), default="")
    if not worst:
        return 0.0, ""
    cap = bounds[worst]
    return (loads[worst] / cap if cap > 0 else (float("inf") if loads[worst] > 0 else 0.0)), worst


def _tuples(ratios: Mapping[str, float], current: Mapping[str, float],
            high: Mapping[str, Mapping[str, float]]) -> tuple[tuple[str, str, str], ...]:
    out: list[tuple[str, str, str]] = []
    for point, ratio in sorted(ratios.items()):
        classes = high.get(point, {})
        if "low" in classes and "high" in classes:
            wanted = {"ratio": classes["low"], "high-ratio": classes["high"]}
        else:
            wanted = {"ratio": ratio}
        for parameter, value in wanted.items():
            if abs(value - current.get(f"{point}.{parameter}", 0.0)) >= RATIO_STEP:
                out.append((point, parameter, f"{value:.4f}"))
    return tuple(out)


def decide_shedding(problem: ShedProblem, can_add_capacity: bool,
                    current: Mapping[str, float], policy: ShedPolicy, now: float,
                    last_change: float | None = None) -> ShedDecision:
    """Shed, release or hold for one query; `current` maps "<drop>.<parameter>" to the ratio
    in force (missing: 0)."""
    shedding = any(v > EPSILON for v in current.values())
    utilisation, agent = _utilisation(problem)
    release = tuple((key.rsplit(".", 1)[0], key.rsplit(".", 1)[1], "0")
                    for key, v in sorted(current.items()) if v > EPSILON)
    if shedding and utilisation <= policy.release_below:
        return ShedDecision("release", "fits", _said(
            f"unshed load {utilisation:.0%} of {agent}'s capacity is under "
            f"{policy.release_below:.0%}", problem), release)
    if can_add_capacity:
        if shedding:
            return ShedDecision("release", "can_scale", "capacity can be added again; scaling "
                                "out instead of dropping rows", release)
        return ShedDecision("hold", "can_scale", "capacity can still be added: no shedding")
    if not shedding and utilisation <= policy.headroom:
        return ShedDecision("hold", "idle", _said(
            f"busiest agent {agent} at {utilisation:.0%} of its capacity, within "
            f"{policy.headroom:.0%}", problem))
    if last_change is not None and now - last_change < policy.cooldown_seconds:
        return ShedDecision("hold", "cooldown", f"ratios changed {now - last_change:.0f} s ago "
                            f"(cool-down {policy.cooldown_seconds:.0f} s)")
    scaled = replace(problem,
                     capacity={a: c * policy.headroom for a, c in problem.capacity.items()},
                     limits={o: c * policy.headroom for o, c in problem.limits.items()})
    plan = plan_shedding(scaled)
    if not plan.feasible:
        return ShedDecision("hold", "infeasible", "even dropping every shed row leaves an agent "
                            "over capacity: the load comes from operators after no drop point",
                            plan=plan, quality=plan.quality)
    tuples = _tuples(plan.ratios, current, plan.class_ratios)
    losses = ", ".join(f"{s} keeps {q:.0%}" for s, q in sorted(plan.quality.items()))
    beyond = (f" ({', '.join(plan.over)} over it by load no drop changes: rows its drops "
              f"read)" if plan.over else "")
    why = (f"{agent} at {utilisation:.0%} of its capacity and no capacity can be added; "
           f"the plan keeps every agent and task within {policy.headroom:.0%} of its "
           f"capacity{beyond}: {losses}")
    why = _said(why, problem)
    if not tuples:
        return ShedDecision("hold", "unchanged", why, plan=plan, quality=plan.quality)
    return ShedDecision("shed", "overload", why, tuples, plan, plan.quality)


def _said(explanation: str, problem: ShedProblem) -> str:
    """An explanation with what the problem's costs were measured from, where it says."""
    return f"{explanation}; {problem.basis}" if problem.basis else explanation
