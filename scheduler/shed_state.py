"""A query's load-shedding bookkeeping at the scheduler, and its status view (docs/load.md).

Owns `ShedState` (the shedding policy's decisions, the latest for the status view, the recent
ones and their count for the metrics; when ratios last changed; when a scale-out was last
refused for lack of room; the expected quality per sink of the plan in force; each drop's task's
cost per row read while its drops were idle and the rate it was measured at, which
`shed_problem.split_cost` needs while rows read now are at a comparable rate; every task's
cost and selectivity from the latest window in which it processed rows, for the windows
it processes none; every task's cpu per row processed from the latest window in which it was
saturated, held while rows are shed),
`ratios_in_force` (the drop ratios the query's control values hold) and `describe` (what
`elastiq status` shows: per drop operator its ratios and the rows its task shed, per sink its
weight and expected quality, and the latest decision with its numbers). Pure. Does not own the
decision (`scheduler.shed_policy`), building its problem (`scheduler.shed_problem`) or sending
the ratios (`scheduler.state`, as a control request of trigger `shed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from common.tasks import CompiledQuery
from scheduler.control import QueryControl
from scheduler.lifecycle import TaskRecord
from scheduler.shed_policy import ShedDecision
from scheduler.shed_problem import TaskRates, drop_operators, processing_costs
from scheduler.shedding import ShedProblem

DECISIONS_KEPT = 50
ROOM_REFUSAL_SECONDS = 60.0  # a scale-out refused for lack of room counts this long
RATES_WINDOW_SECONDS = 10.0  # the window the problem's rates are measured over
UNSHED_RATE_SPREAD = 2.0  # an unshed cost counts while rows read now are within this factor


def comparable(then: float, now: float) -> bool:
    """Two rates of rows read within UNSHED_RATE_SPREAD of each other."""
    return then > 0 and now > 0 and max(then, now) <= UNSHED_RATE_SPREAD * min(then, now)


@dataclass
class ShedState:
    latest: ShedDecision | None = None
    decided_at: float | None = None
    decisions: list[ShedDecision] = field(default_factory=list)
    decided: int = 0
    last_change: float | None = None  # when ratios were last sent (the cool-down counts)
    refused_for_room_at: float | None = None
    quality: dict[str, float] = field(default_factory=dict)  # expected, per sink, in force
    changes: int = 0  # control requests sent by the shedding policy
    # a drop's task -> (its cost per row read over the latest window in which it dropped
    # nothing, its rows read per second then)
    unshed_cost: dict[str, tuple[float, float]] = field(default_factory=dict)
    # a task -> its (cost, selectivity) per row delivered in the latest window in which it
    # processed rows (`shed_problem.processing_costs`), for the windows it processes none (every
    # row dropped, by its own drop or upstream)
    last_costs: dict[str, tuple[float, float]] = field(default_factory=dict)
    # a task -> the cpu it paid per processed row in the latest window in which it was
    # saturated (`TaskRates.paid`), kept while rows are shed (`held_for`)
    saturated_cost: dict[str, float] = field(default_factory=dict)

    def decide(self, decision: ShedDecision, now: float) -> None:
        self.latest, self.decided_at = decision, now
        self.decisions.append(decision)
        self.decided += 1
        del self.decisions[:-DECISIONS_KEPT]

    def observe_unshed(self, drop_tasks: Iterable[str], rates: Mapping[str, TaskRates]) -> None:
        """Keep the cost per row read of every drop's task that read rows and dropped none."""
        for task in drop_tasks:
            r = rates.get(task)
            if r is not None and r.rows_in > 0 and r.dropped <= 0:
                self.unshed_cost[task] = (r.cost_per_read, r.rows_in)

    def observe_costs(self, problem: ShedProblem, rates: Mapping[str, TaskRates]) -> None:
        """Keep the cost and selectivity of every task that processed rows."""
        self.last_costs.update(processing_costs(problem, rates))

    def observe_saturation(self, rates: Mapping[str, TaskRates], shedding: bool) -> None:
        """Keep what every saturated task that processed rows paid per row; while nothing is
        shed, only this window's (a shed starts from the saturation that asks for it)."""
        now = {t: r.paid for t, r in rates.items() if r.saturated and r.processed > 0}
        if not shedding:
            self.saturated_cost.clear()
        self.saturated_cost.update(now)

    def held_for(self, shedding: bool) -> dict[str, float]:
        """The costs `problem_of` holds for the tasks saturated earlier and not now: while rows
        are shed (the shed relieves them: their fitted cost would call their rows cheap
        again, the next plan keep more, and the overload come back), none otherwise."""
        return dict(self.saturated_cost) if shedding else {}

    def unshed_for(self, rates: Mapping[str, TaskRates]) -> dict[str, float]:
        """The unshed cost per row read of every drop's task that reads now at a rate within
        UNSHED_RATE_SPREAD of the one it was measured at. A cost per row read depends on the
        rate (each batch's fixed cost is spread over its rows): one measured at 75 rows/s
        before an overload of 1,700 looked 7x dearer than now's, put the drop's task's whole
        cost on the rows it kept, and each plan then dropped more. Without a comparable one
        the split costs every row read (`split_cost`: no plan runs away)."""
        return {task: cost for task, (cost, then) in self.unshed_cost.items()
                if (r := rates.get(task)) is not None and comparable(then, r.rows_in)}

    def refused_for_room(self, now: float) -> bool:
        return self.refused_for_room_at is not None and \
            now - self.refused_for_room_at < ROOM_REFUSAL_SECONDS


def ratios_in_force(query: CompiledQuery, control: QueryControl) -> dict[str, float]:
    """"<drop>.<parameter>" -> the ratio in force, for every drop operator's ratios."""
    out: dict[str, float] = {}
    for a in (query.controls.adjustable if query.controls is not None else ()):
        if a.kind == "drop":
            text = control.values.get(a.operator, {}).get(a.parameter, a.value)
            try:
                out[f"{a.operator}.{a.parameter}"] = float(text)
            except ValueError:
                out[f"{a.operator}.{a.parameter}"] = 0.0
    return out


def describe(query: CompiledQuery, tasks: Mapping[str, TaskRecord], control: QueryControl,
             state: ShedState) -> dict[str, Any] | None:
    """The status view of a query's shedding; None for a query with no drop operator."""
    drops = drop_operators(query)
    if not drops:
        return None
    ratios = ratios_in_force(query, control)
    latest = state.latest
    return {
        "drops": [{"operator": name, "task": task, "semantic": semantic,
                   "ratio": ratios.get(f"{name}.ratio", 0.0),
                   **({"high_ratio": ratios.get(f"{name}.high-ratio", 0.0)} if semantic else {}),
                   "rows_dropped": _dropped(tasks.get(task))}
                  for name, (task, semantic) in sorted(drops.items())],
        "sinks": [{"sink": name, "weight": weight,
                   "expected_quality": state.quality.get(name, 1.0),
                   "expected_loss": 1.0 - state.quality.get(name, 1.0)}
                  for name, weight in sorted(query.weights.items())],
        "changes": state.changes,
        "decision": None if latest is None else {
            "kind": latest.kind, "reason": latest.reason, "explanation": latest.explanation,
            "at": state.decided_at, "tuples": [list(t) for t in latest.tuples]},
    }


def _dropped(task: TaskRecord | None) -> float:
    """Rows the task's drops shed, over its attempts (its drop operator's: one per task)."""
    return float(task.totals().get("rows_dropped", 0)) if task is not None else 0.0
