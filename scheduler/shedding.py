"""Load shedding's decision: the drop ratios that keep every agent under capacity (pure).

Owns the shedding plan of Borealis' distributed load shedder (Tatbul, Cetintemel, Zdonik, "Staying
FIT", VLDB'07, "Distributed Load Shedding as a Linear Optimization Problem"; docs/load.md): given a
query plan's drop points (the idle drop operators `rewrite_rules/shedding.rule` puts at every
source and channel input), its operators' measured cost per row and selectivity and the agent each
runs on, every agent's capacity and every sink's weight, `plan_shedding` chooses the drop ratios
for the whole plan at once by one linear program:

- a variable `z` per (drop point, utility class): the fraction of that class's rows, as they
  left their origin, that are still kept after the drop point (`1` keeps all, `0` drops all);
  a drop point downstream of another keeps at most what its upstream one kept (`z <= z_up`),
  so its own ratio is `1 - z / z_up`; this keeps the program linear where drops sit in series;
- every stream's rate is then linear in the variables (an operator multiplies its inputs' rates
  by its selectivity), so is every agent's load (the sum over its operators of cost x input
  rate, plus their `fixed` load, which no drop changes: a task holding a drop reads every row
  that arrives, also those it drops), and each agent's load must stay at most its capacity;
- a sink's quality is the fraction of its unshed value it still delivers, a row's value being
  the utility of its class (1 unless the spec's `utility` predicate says otherwise); the program
  maximises the weighted sum of the sinks' qualities, so loses the least weighted output.

A drop point whose input mixes rows of several origins (after a union or join of two shed
streams) is left idle: its ratio would multiply a sum of variables, which is not linear; the
plan's `idle` says which and why. An agent or limited operator whose fixed load alone passes its
bound is left out of the program (no drop brings it within; it would only make the program
infeasible, or drop everything for nothing) and named in the plan's `over`. `uniform_ratio` is
the baseline the paper compares with (one ratio at every source, the least that fits). Reads
no clock, does no I/O; solved by SciPy's HiGHS (`scipy.optimize.linprog`). Does not own when
shedding is asked for (the scheduler, only when no capacity can be added), nor how ratios reach
the drop operators (control tuples).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

# The classes of a drop point with no utility predicate: all rows, each worth 1.
ALL_ROWS: tuple["UtilityClass", ...] = ()
EPSILON = 1e-9  # below this a ratio is 0 and a load fits


@dataclass(frozen=True)
class UtilityClass:
    """A share of a drop point's rows and what each of them is worth at the sinks."""

    name: str  # "high" / "low", or "all"
    share: float  # fraction of the drop point's rows, 0..1
    utility: float  # value of one such row, >= 0


@dataclass(frozen=True)
class DropPoint:
    """Where rows may be dropped: a source's output (`input` None, `rate` rows/s arriving) or a
    channel input (`input`: the operator or drop point whose output it reads)."""

    name: str
    rate: float = 0.0
    input: str | None = None
    classes: tuple[UtilityClass, ...] = ALL_ROWS


@dataclass(frozen=True)
class Operator:
    """An operator instance: where it runs, its measured CPU seconds per input row, output rows
    per input row, and the names of the drop points or operators it reads; `fixed`: CPU seconds
    per second it spends whatever its drop points keep (a drop's task reading the rows it then
    drops)."""

    name: str
    agent: str
    cost: float
    selectivity: float
    inputs: tuple[str, ...]
    fixed: float = 0.0


@dataclass(frozen=True)
class Sink:
    name: str
    input: str
    weight: float = 1.0


@dataclass(frozen=True)
class ShedProblem:
    points: tuple[DropPoint, ...]
    operators: tuple[Operator, ...]
    sinks: tuple[Sink, ...]
    capacity: Mapping[str, float]  # agent -> CPU seconds per second it may spend on this plan
    # operator -> the load it alone may carry (a task runs its micro-batches one at a time: at
    # most one busy second per second, whatever its agent has); none: only its agent's bound
    limits: Mapping[str, float] = field(default_factory=dict)
    basis: str = ""  # what the costs were measured from (said in the decision's explanation)


@dataclass(frozen=True)
class ShedPlan:
    """The program's answer: a drop ratio per drop point (of all its rows) and, for a drop point
    with utility classes, the ratio dropped of each class; the expected quality of each sink
    (kept fraction of its value), the weighted loss, each agent's load, and why points were left
    idle. `feasible` is False when even dropping everything sheddable leaves an agent over;
    `over`: the agents and limited operators whose fixed load alone passes their bound (left out
    of the program: no drop relieves them)."""

    ratios: Mapping[str, float]
    class_ratios: Mapping[str, Mapping[str, float]]
    quality: Mapping[str, float]
    loss: float
    loads: Mapping[str, float]
    feasible: bool
    idle: Mapping[str, str] = field(default_factory=dict)
    over: tuple[str, ...] = ()

    @property
    def shedding(self) -> bool:
        return any(r > EPSILON for r in self.ratios.values())


Var = tuple[str, str]  # (drop point, class)
Linear = dict[Var, float]  # a rate as a linear function of the keep variables


def classes_of(point: DropPoint) -> tuple[UtilityClass, ...]:
    return point.classes or (UtilityClass("all", 1.0, 1.0),)


def check_problem(problem: ShedProblem) -> list[str]:
    """Every problem of a shedding problem at once (names, numbers, order); empty if sound."""
    problems: list[str] = []
    counts = Counter([p.name for p in problem.points] + [o.name for o in problem.operators])
    names = set(counts)
    problems += [f"{name}: named twice" for name, n in sorted(counts.items()) if n > 1]
    for p in problem.points:
        if p.input is None and not (p.rate >= 0 and np.isfinite(p.rate)):
            problems.append(f"drop point {p.name}: rate {p.rate} is not a finite rate >= 0")
        if p.input is not None and p.input not in names:
            problems.append(f"drop point {p.name}: reads {p.input}, unknown")
        if p.classes and abs(sum(c.share for c in p.classes) - 1.0) > 1e-6:
            problems.append(f"drop point {p.name}: class shares do not sum to 1")
    for o in problem.operators:
        if not (o.cost >= 0 and np.isfinite(o.cost)):
            problems.append(f"operator {o.name}: cost {o.cost} is not a finite cost >= 0")
        if not (o.selectivity >= 0 and np.isfinite(o.selectivity)):
            problems.append(f"operator {o.name}: selectivity {o.selectivity} is not >= 0")
        if not (o.fixed >= 0 and np.isfinite(o.fixed)):
            problems.append(f"operator {o.name}: fixed load {o.fixed} is not >= 0")
        problems += [f"operator {o.name}: reads {i}, unknown" for i in o.inputs if i not in names]
        if o.agent not in problem.capacity:
            problems.append(f"operator {o.name}: agent {o.agent} has no capacity")
    ops = {o.name for o in problem.operators}
    problems += [f"limit of {name}: not an operator" for name in problem.limits if name not in ops]
    for s in problem.sinks:
        if s.input not in names:
            problems.append(f"sink {s.name}: reads {s.input}, unknown")
        if not (s.weight >= 0 and np.isfinite(s.weight)):
            problems.append(f"sink {s.name}: weight {s.weight} is not >= 0")
    return problems


def _rates(problem: ShedProblem) -> tuple[dict[str, Linear], dict[Var, Var | None],
                                          dict[str, str]]:
    """The rate of every node's output as a linear function of the keep variables, each
    variable's upstream variable (None at a source), and the drop points left idle."""
    rate: dict[str, Linear] = {}
    upstream: dict[Var, Var | None] = {}
    idle: dict[str, str] = {}
    for node in _in_order([*problem.points, *problem.operators]):
        if isinstance(node, DropPoint):
            rate[node.name] = _point_rate(node, rate, upstream, idle)
        else:
            rate[node.name] = _scaled(_summed([rate[i] for i in node.inputs]), node.selectivity)
    return rate, upstream, idle


def _in_order(nodes: Sequence[DropPoint | Operator]) -> list[DropPoint | Operator]:
    """The nodes with every node after the nodes it reads (Kahn's algorithm)."""
    inputs = {n.name: ([n.input] if n.input else []) if isinstance(n, DropPoint)
              else list(n.inputs) for n in nodes}
    readers: dict[str, list[str]] = {}
    for name, ins in inputs.items():
        for i in ins:
            readers.setdefault(i, []).append(name)
    waiting = {name: len(ins) for name, ins in inputs.items()}
    ready = [name for name, count in waiting.items() if count == 0]
    by_name = {n.name: n for n in nodes}
    order: list[DropPoint | Operator] = []
    while ready:
        name = ready.pop()
        order.append(by_name[name])
        for reader in readers.get(name, ()):
            waiting[reader] -= 1
            if waiting[reader] == 0:
                ready.append(reader)
    if len(order) != len(nodes):
        raise ValueError("the plan has a cycle through " + ", ".join(
            sorted(name for name, count in waiting.items() if count)))
    return order


def _point_rate(point: DropPoint, rate: dict[str, Linear], upstream: dict[Var, Var | None],
                idle: dict[str, str]) -> Linear:
    if point.input is None:
        out: Linear = {}
        for c in classes_of(point):
            var = (point.name, c.name)
            upstream[var] = None
            out[var] = point.rate * c.share
        return out
    before = rate[point.input]
    if len(before) != 1:
        idle[point.name] = ("its input mixes rows of several drop points; a ratio here would "
                            "multiply their sum" if before else "no shed rows reach it")
        return dict(before)
    (up, coef), = before.items()
    var = (point.name, up[1])
    upstream[var] = up
    return {var: coef}


def _summed(parts: Sequence[Linear]) -> Linear:
    out: Linear = {}
    for part in parts:
        for var, coef in part.items():
            out[var] = out.get(var, 0.0) + coef
    return out


def _scaled(part: Linear, factor: float) -> Linear:
    return {var: coef * factor for var, coef in part.items()}


def agent_loads(problem: ShedProblem, keep: Mapping[Var, float]) -> dict[str, float]:
    """Each agent's load (CPU s/s) when each variable keeps `keep[var]` (missing: 1)."""
    rate, _, _ = _rates(problem)
    loads = {agent: 0.0 for agent in problem.capacity}
    for o in problem.operators:
        arriving = _summed([rate[i] for i in o.inputs])
        loads[o.agent] += o.fixed + o.cost * sum(c * keep.get(v, 1.0)
                                                 for v, c in arriving.items())
    return loads


def operator_loads(problem: ShedProblem, keep: Mapping[Var, float]) -> dict[str, float]:
    """Each operator's own load (CPU s/s) when each variable keeps `keep[var]` (missing: 1)."""
    rate, _, _ = _rates(problem)
    return {o.name: o.fixed + o.cost * sum(c * keep.get(v, 1.0)
                                           for v, c in _summed([rate[i] for i in o.inputs]).items())
            for o in problem.operators}


def fixed_loads(problem: ShedProblem) -> dict[str, float]:
    """Each agent's and limited operator's load that no drop changes (its operators' `fixed`)."""
    fixed = {agent: 0.0 for agent in problem.capacity}
    for o in problem.operators:
        fixed[o.agent] += o.fixed
    fixed.update({o.name: o.fixed for o in problem.operators if o.name in problem.limits})
    return fixed


def bounds_of(problem: ShedProblem) -> dict[str, float]:
    """Each agent's capacity and limited operator's limit, by name."""
    return {**problem.capacity, **problem.limits}


def unrelieved(problem: ShedProblem) -> tuple[str, ...]:
    """The agents and limited operators whose fixed load (> 0) alone passes their bound: no drop
    can bring them within it. (A bound under 0 with no fixed load stays in the program, which it
    makes infeasible: other queries' load, not this one's reading.)"""
    fixed, bounds = fixed_loads(problem), bounds_of(problem)
    return tuple(sorted(name for name, bound in bounds.items()
                        if fixed[name] > EPSILON and fixed[name] > bound + EPSILON))


def _utilities(problem: ShedProblem) -> dict[Var, float]:
    utility: dict[Var, float] = {}
    for p in problem.points:
        for c in classes_of(p):
            utility[(p.name, c.name)] = c.utility
    return utility


def sink_quality(problem: ShedProblem, keep: Mapping[Var, float]) -> dict[str, float]:
    """The fraction of each sink's unshed value it delivers when `keep` is kept."""
    rate, upstream, _ = _rates(problem)
    utility = _utilities(problem)
    quality = {}
    for s in problem.sinks:
        value = {v: c * utility[_origin(v, upstream)] for v, c in rate[s.input].items()}
        base = sum(value.values())
        kept = sum(c * keep.get(v, 1.0) for v, c in value.items())
        quality[s.name] = kept / base if base > 0 else 1.0
    return quality


def _origin(var: Var, upstream: Mapping[Var, Var | None]) -> Var:
    for _ in range(len(upstream) + 1):
        up = upstream[var]
        if up is None:
            return var
        var = up
    raise ValueError("drop points in a cycle")


def plan_shedding(problem: ShedProblem) -> ShedPlan:
    """The drop ratios that keep every agent within capacity and lose the least weighted sink
    quality (one LP for the whole plan); all ratios 0 when everything already fits."""
    problems = check_problem(problem)
    if problems:
        raise ValueError("; ".join(problems))
    rate, upstream, idle = _rates(problem)
    variables = list(upstream)
    index = {v: i for i, v in enumerate(variables)}
    utility = _utilities(problem)
    objective = np.zeros(len(variables))
    for s in problem.sinks:
        value = {v: c * utility[_origin(v, upstream)] for v, c in rate[s.input].items()}
        base = sum(value.values())
        for v, c in value.items():
            if base > 0:
                objective[index[v]] -= s.weight * c / base  # linprog minimises
    if not variables:
        return _plan(problem, {}, upstream, idle)
    rows, cols, data, bound = _constraints(problem, rate, upstream, index)
    agents = list(problem.capacity)
    matrix = coo_matrix((data, (rows, cols)), shape=(len(agents) + len(problem.limits)
                                                     + _chained(upstream),
                                                     len(variables))).tocsr()
    result = linprog(objective, A_ub=matrix, b_ub=np.array(bound),
                     bounds=[(0.0, 1.0)] * len(variables), method="highs")
    if result.status != 0 or result.x is None:
        return _plan(problem, {v: 0.0 for v in variables}, upstream, idle)
    keep = {v: float(min(1.0, max(0.0, result.x[i]))) for v, i in index.items()}
    return _plan(problem, keep, upstream, idle)


def _chained(upstream: Mapping[Var, Var | None]) -> int:
    return sum(1 for up in upstream.values() if up is not None)


def _constraints(problem: ShedProblem, rate: Mapping[str, Linear],
                 upstream: Mapping[Var, Var | None], index: Mapping[Var, int]
                 ) -> tuple[list[int], list[int], list[float], list[float]]:
    """Sparse rows of `A z <= b`: one per agent (its load within capacity), one per chained
    drop point (it keeps at most what its upstream kept), one per operator with a limit. A
    bound's fixed load is taken off it; an unrelieved one is an empty row (0 <= 0)."""
    rows: list[int] = []
    cols: list[int] = []
    data: list[float] = []
    bound: list[float] = []
    fixed, over = fixed_loads(problem), set(unrelieved(problem))
    agent_row = {agent: i for i, agent in enumerate(problem.capacity)}
    for agent in problem.capacity:
        bound.append(0.0 if agent in over else problem.capacity[agent] - fixed[agent])
    for o in problem.operators:
        for i in o.inputs if o.agent not in over else ():
            for v, c in rate[i].items():
                rows.append(agent_row[o.agent])
                cols.append(index[v])
                data.append(o.cost * c)
    for o in problem.operators:
        if o.name in problem.limits:
            row = len(bound)
            bound.append(0.0 if o.name in over else problem.limits[o.name] - o.fixed)
            for v, c in _summed([rate[i] for i in o.inputs if o.name not in over]).items():
                rows.append(row)
                cols.append(index[v])
                data.append(o.cost * c)
    row = len(bound)
    for v, up in upstream.items():
        if up is not None:
            rows += [row, row]
            cols += [index[v], index[up]]
            data += [1.0, -1.0]
            bound.append(0.0)
            row += 1
    return rows, cols, data, bound


def _plan(problem: ShedProblem, keep: Mapping[Var, float], upstream: Mapping[Var, Var | None],
          idle: Mapping[str, str]) -> ShedPlan:
    loads = agent_loads(problem, keep)
    quality = sink_quality(problem, keep)
    over = unrelieved(problem)
    feasible = all(loads[a] <= problem.capacity[a] + 1e-6 for a in loads if a not in over) and \
        all(load <= problem.limits[o] + 1e-6 for o, load in operator_loads(problem, keep).items()
            if o in problem.limits and o not in over)
    ratios: dict[str, float] = {}
    class_ratios: dict[str, dict[str, float]] = {}
    for p in problem.points:
        if p.name in idle:
            ratios[p.name] = 0.0
            continue
        kept = 0.0
        for c in classes_of(p):
            var = (p.name, c.name)
            up = upstream.get(var)
            before = keep.get(up, 1.0) if up is not None else 1.0
            local = keep.get(var, 1.0) / before if before > EPSILON else 1.0
            class_ratios.setdefault(p.name, {})[c.name] = _clean(1.0 - local)
            kept += c.share * local
        ratios[p.name] = _clean(1.0 - kept)
    loss = sum(s.weight * (1.0 - quality[s.name]) for s in problem.sinks)
    return ShedPlan(ratios, class_ratios, quality, max(0.0, loss), loads, feasible, dict(idle),
                    over)


def _clean(x: float) -> float:
    return 0.0 if abs(x) < EPSILON else min(1.0, x)


def uniform_ratio(problem: ShedProblem) -> float:
    """The baseline: the least single drop ratio which, applied at every source drop point
    (channel drop points idle), keeps every agent within capacity (1.0 if none does)."""
    full, fixed, over = agent_loads(problem, {}), fixed_loads(problem), unrelieved(problem)
    ratio = 0.0
    for agent, load in full.items():
        shed = load - fixed[agent]  # what dropping every row would take off
        if load > problem.capacity[agent] + EPSILON and agent not in over:
            ratio = max(ratio, 1.0 - max(problem.capacity[agent] - fixed[agent], 0.0) / shed
                        if shed > EPSILON else 1.0)
    return ratio


def uniform_keep(problem: ShedProblem, ratio: float) -> dict[Var, float]:
    """The keep variables of dropping `ratio` of every source's rows, downstream points idle."""
    _, upstream, _ = _rates(problem)
    keep: dict[Var, float] = {}
    for var in upstream:
        keep[var] = 1.0 - ratio  # a chained point keeps what its source kept: ratio 0 there
    return keep


def weighted_loss(problem: ShedProblem, keep: Mapping[Var, float]) -> float:
    quality = sink_quality(problem, keep)
    return sum(s.weight * (1.0 - quality[s.name]) for s in problem.sinks)
