"""The shedding problem of one running query, built from what the scheduler measures (pure).

Owns `problem_of`: from a compiled query (its tasks, channels, drop operators in the control
catalogue, sink weights), each running task's measured rates over a recent window (`TaskRates`,
from its heartbeats: `rates_of`) and each agent's capacity for this query, the
`scheduler.shedding.ShedProblem` that `plan_shedding` solves. The plan is modelled at the
grain the heartbeats measure, the task:

- a drop point per drop operator, its rate the rows arriving at its task's source: the task's
  rows in (before any drop) plus the change of its source's backlog (rows arrive = rows read +
  rows left waiting: an overloaded query reads less than arrives, one draining its backlog
  more);
- an operator per task, on the agent it runs on, reading its drop points and the tasks that
  produce its input channels. Its cost and selectivity are per row its inputs deliver (so a
  partition of a split stream, which reads a share of its splitter's rows, costs that share):
  cost = CPU seconds per row it processed (the cost model's per-row cost where its batches
  could be fitted, else busy seconds per row, an upper bound: it holds the batches' fixed
  cost), turned into CPU by its CPU seconds per busy second where its agent's cpu was measured
  (`TaskRates.cpu`: the agent's cgroup cpu split between its tasks by busy time,
  `scheduler.load_history`; busy time is wall time of micro-batches, which on a contended
  agent holds the time spent waiting for a CPU: a task busy 1 s/s on 0.3 CPU s/s), busy time
  itself where none was (the problem's `basis` says which), x its share of the rows its
  inputs deliver (a partition of a split stream: its rows processed against all the
  partitions'; else 1: an overloaded task's queued rows are still its own); selectivity =
  rows out per row it processed x that share (a task with no output channel, a sink's: the
  share, which only weighs what reaches its sinks);
- a task that holds drops reads every row that arrives, also the rows it then drops: its cost is
  split (`split_cost`) into a part per row read, a fixed load in the program (rows arriving x
  that cost: no drop changes it), and a part per row kept. One window at one ratio cannot tell
  them apart (busy = read x a + kept x c), so the split takes a second point: the task's cost
  per row read measured while its drops were idle (`unshed`, kept by the scheduler, only while
  it was measured at a rate of rows read comparable to now's: `ShedState.unshed_for`), which
  is a + c. With it, the problem is the same whatever ratio is in force, where the task's cost
  goes per row read (a generator and its drop), per row kept (operators after the drop in the
  same task) or both. Without it, while rows are dropped, all of it counts per row read: the
  plan then cannot run away (costing it all per row kept made each drop look like a dearer
  row, and each plan drop more: 0.54 -> 0.90 -> 0.96 in the benchmark);
- where a task's batches could be fitted, its cost per row is the fitted one and the rest of
  its load, its batches' fixed costs, a fixed load (`TaskRates.batch_load`): the fitted cost
  alone leaves them out, and on the benchmark's agents of 0.4 cpu the heavy instances, costed
  so, looked like 97 % of an agent where they needed ~300 %: the plan kept all of `a`'s rows
  and the backlog grew;
- a task saturated in the window (`TaskRates.saturated`: its executor's cgroup throttled in
  most CFS periods, or busy most of the window, its batches back to back) is costed by the
  CPU it paid per row it processed (`TaskRates.paid`: load / rows processed, at the batch
  sizes it ran), with no fixed load, not by the fitted cost: a marginal cost from batches of
  several sizes, extrapolated from the rows a saturated task processes to the rows that
  arrive, says rows are cheap that it cannot take (the benchmark's busiest agent came out at
  308 %, 118 %, 102 % unshed at a constant arrival that its measured cpu per row put at
  302 %). While rows are shed, a task saturated earlier and not now keeps that cost (`held`,
  `ShedState.held_for`): shedding relieves it, and its fitted cost would then call the rows
  cheap again and the next plan keep more (`processing_cost`);
- a task that processes no row in the window (every row dropped upstream, a ratio of 1.0, or
  a batch that did not end in it) keeps the cost and selectivity it was last measured at
  (`last`, kept by the scheduler: `processing_costs`, `ShedState.observe_costs`; a drop's
  task its cost per row kept and its selectivity, its cost per row read stays the window's),
  as a drop's task keeps its unshed cost: at 0, a drop's task at a ratio of 1.0 passed nothing
  on and the tasks after it cost nothing, so their load vanished from the problem, the unshed
  load fell mid-overload and the policy released the shed (unit test: 167 % -> 67 %);
- a sink per sink operator, reading its task, with the spec's weight;
- a limit of TASK_BUSY_LIMIT per task besides its agent's capacity: a task runs its
  micro-batches one after the other, so it uses about one CPU at most however many its agent
  has (an operator at its max-parallelism is bound by this). With costs in CPU seconds the
  limit bounds a task's CPU, not its wall time: a contended task busy 1 s/s on 0.3 CPU s/s is
  at 30 % of it (bounding it by its busy time made every plan keep 90 % of what the one before
  let through, and the benchmark's ratio ran away: 0.53 -> 0.97).

A drop at a semantic source is modelled as one class of rows worth 1 (heartbeats do not say
which share of rows passes `shed-keep`); its `ratio` and `high-ratio` are then set alike
(`uniform_tuples`). Returns a sentence instead of a problem when it cannot be built soundly
(no drop operator, a task without a measured window). An agent of unknown size is bounded by
its tasks' limits only. Reads no clock, does no I/O. Does not own when shedding is decided
(`scheduler.shed_policy`) nor sending the ratios (`scheduler.state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from common.batch_cost import fit
from common.tasks import CompiledQuery
from scheduler.elastic_policy import THROTTLED_MOST, Sample, spans_of, throttled_in
from scheduler.shedding import DropPoint, Operator, ShedProblem, Sink

DROP_KIND = "drop"
TASK_BUSY_LIMIT = 1.0  # busy seconds per second one task can spend
# below this share of its rows read dropped, a window does not tell a task's cost per row read
# from its cost per row kept (the two differ by less than the measurement's noise)
SPLIT_MIN_SHARE = 0.05
# an agent whose size is not known (no offer seen with nothing of ours on it, e.g. after a new
# leader took over): only its tasks' own limits bound it
UNKNOWN_CAPACITY = 1e9
# busy seconds per second from which a task counts as saturated: its micro-batches run back to
# back (a task with room idles between its trigger's batches)
SATURATED_BUSY = 0.9


@dataclass(frozen=True)
class TaskRates:
    """One task's measured rates over a window: rows in (read, before its drops), rows out,
    rows its drops shed, busy CPU seconds, all per second; the cost model's seconds per row
    when its batches could be fitted (None: not); the change of its sources' backlog per second
    (rows that arrived and were not read; negative while it drains)."""

    rows_in: float
    rows_out: float
    dropped: float
    busy: float
    per_row: float | None = None
    waiting: float = 0.0
    # CPU seconds per second: its agent's measured cpu split by busy time over the same window
    # (`LoadHistory.measured`); None: no cpu measured, costs stay in busy seconds
    cpu: float | None = None
    # the share of its executor's cgroup's CFS periods throttled over the window (0: none
    # reported, `elastic_policy.throttled_in`)
    throttled: float = 0.0

    @property
    def saturated(self) -> bool:
        """It did all it could in the window: its executor's cgroup was throttled in most CFS
        periods (THROTTLED_MOST), or it was busy most of the window (SATURATED_BUSY)."""
        return self.throttled >= THROTTLED_MOST or self.busy >= SATURATED_BUSY

    @property
    def fitted(self) -> bool:
        """Its cost per row is the cost model's: its batches could be fitted and it has room
        (a saturated task is costed by what it paid, `paid`)."""
        return self.per_row is not None and not self.saturated

    @property
    def paid(self) -> float:
        """CPU seconds it paid per processed row, at the batch sizes it ran (0: none)."""
        return self.load / self.processed if self.processed > 0 else 0.0

    @property
    def cpu_per_busy(self) -> float:
        """CPU seconds per busy second (1 where no cpu was measured, or no batch ran)."""
        if self.cpu is None or self.busy <= 0:
            return 1.0
        return self.cpu / self.busy

    @property
    def load(self) -> float:
        """CPU seconds per second: measured where its agent's cpu was, else busy seconds."""
        return self.cpu if self.cpu is not None else self.busy

    @property
    def arriving(self) -> float:
        """Rows per second arriving at its sources: read, and left waiting (or read from the
        backlog: not arriving now)."""
        return max(0.0, self.rows_in + self.waiting)

    @property
    def processed(self) -> float:
        """Rows per second its operators after the drops process."""
        return max(0.0, self.rows_in - self.dropped)

    @property
    def cost(self) -> float:
        """CPU seconds per processed row (0 when none was processed): the fitted one where it
        is `fitted`, else what it paid; a drop's task is costed by `split_cost` instead."""
        if self.fitted and self.per_row is not None:
            return self.per_row * self.cpu_per_busy
        return self.paid

    @property
    def batch_load(self) -> float:
        """CPU seconds per second its batches' fixed costs take, where its cost per row is the
        fitted one: its load less that cost x the rows it processed (the fitted cost leaves
        each batch's fixed cost out; 0 where not fitted: its cost per row holds it)."""
        if not self.fitted:
            return 0.0
        return max(0.0, self.load - self.cost * self.processed)

    @property
    def cost_per_read(self) -> float:
        """CPU seconds per row read, before its drops: the cost model's per-row cost (fitted
        on rows read) where its batches could be fitted, else its load per row read; in CPU
        where its agent's cpu was measured. Saturated or not: a drop's task's split compares
        it with the one measured unshed (`split_cost`), which stays on the same basis."""
        if self.per_row is not None:
            return self.per_row * self.cpu_per_busy
        return self.load / self.rows_in if self.rows_in > 0 else 0.0

    @property
    def dropped_share(self) -> float:
        """The share of its rows read that its drops shed."""
        return min(1.0, self.dropped / self.rows_in) if self.rows_in > 0 else 0.0


def processing_cost(rates: TaskRates, held: float | None) -> tuple[float, float]:
    """A task's (CPU seconds per processed row, fixed load in CPU seconds per second) for the
    problem, not a drop's task (`split_cost`): saturated now, what it paid per row and no fixed
    load; saturated earlier while the shed in force relieves it (`held`: the cost it paid
    then; None: not), that cost, so that the plan's own effect does not make its rows look
    cheap again; else its `cost` and `batch_load` (fitted where it could be)."""
    if rates.saturated:
        return rates.paid, 0.0
    if held is not None:
        return held, 0.0
    return rates.cost, rates.batch_load


def split_cost(rates: TaskRates, unshed: float | None) -> tuple[float, float]:
    """A drop's task's (CPU seconds per row read, per row kept) from its window's rates and
    its cost per row read measured while its drops were idle (`unshed`, None: not known):
    busy per row read is a + c x kept share now, and was a + c unshed. While (almost) nothing
    is dropped, read and kept rows are the same: all per row kept (a plan that drops takes
    it off). Dropping without an unshed figure: all per row read (the conservative split:
    no drop seems to take it off, and no plan runs away)."""
    now, shed = rates.cost_per_read, rates.dropped_share
    if shed < SPLIT_MIN_SHARE:
        return 0.0, now
    if unshed is None or shed >= 1.0:
        return now, 0.0
    kept = min(max((unshed - now) / shed, 0.0), now / (1.0 - shed))
    # at the upper clamp `now - kept x (1 - shed)` is 0 up to rounding (-4.8e-17 on a real
    # run): a negative fixed load fails `check_problem`, and with it the scheduler's tick
    return max(0.0, now - kept * (1.0 - shed)), kept


def rates_of(samples: Sequence[Sample], window: float, now: float,
             cpu: float | None = None) -> TaskRates | None:
    """A task's rates between its oldest sample inside the last `window` seconds and its
    newest, counting only the samples after the last fall of a counter (a new attempt counts
    from 0); None with fewer than two such samples. `cpu`: its CPU seconds per second over the
    same window (`LoadHistory.measured`; None: not measured); its executor's throttled share
    of CFS periods over the same samples."""
    recent = [s for s in samples if s.at >= now - window]
    for i in range(len(recent) - 1, 0, -1):
        if _fell(recent[i - 1], recent[i]):
            recent = recent[i:]
            break
    if len(recent) < 2 or recent[-1].at <= recent[0].at:
        return None
    a, b = recent[0], recent[-1]
    span = b.at - a.at
    cost = fit(spans_of(recent))
    return TaskRates((b.tuples_in - a.tuples_in) / span, (b.tuples_out - a.tuples_out) / span,
                     (b.dropped - a.dropped) / span, (b.busy_ms - a.busy_ms) / 1000.0 / span,
                     None if isinstance(cost, str) else cost.per_unit,
                     (b.backlog - a.backlog) / span, cpu, throttled_in(recent))


def _fell(a: Sample, b: Sample) -> bool:
    return b.tuples_in < a.tuples_in or b.tuples_out < a.tuples_out or \
        b.busy_ms < a.busy_ms or b.dropped < a.dropped


def drop_operators(query: CompiledQuery) -> dict[str, tuple[str, bool]]:
    """Each drop operator of the query -> (its task, whether it is semantic: it has a
    `high-ratio`), from the control catalogue."""
    found: dict[str, tuple[str, bool]] = {}
    for a in (query.controls.adjustable if query.controls is not None else ()):
        if a.kind == DROP_KIND and a.targets:
            task, semantic = found.get(a.operator, (a.targets[0].task_id, False))
            found[a.operator] = (task, semantic or a.parameter == "high-ratio")
    return found


def problem_of(query: CompiledQuery, running: Mapping[str, str],
               rates: Mapping[str, TaskRates], capacity: Mapping[str, float],
               unshed: Mapping[str, float] | None = None,
               last: Mapping[str, tuple[float, float]] | None = None,
               held: Mapping[str, float] | None = None) -> ShedProblem | str:
    """The shedding problem of `query`: `running` maps each running task to its agent, `rates`
    each task to its measured rates, `capacity` each agent to the CPU seconds per second this
    query may use there (one missing: UNKNOWN_CAPACITY), `unshed` a drop's task to its cost
    per row read measured while its drops were idle (`split_cost`), `last` a task to its
    (cost, selectivity) per row delivered from the latest window in which it processed rows
    (`processing_costs`), used while it processes none, `held` a task to the CPU it paid per
    processed row when last saturated while rows are shed (`processing_cost`). A sentence
    saying why not when it cannot be built."""
    drops = drop_operators(query)
    if not drops:
        return "the query has no drop operator (no source says shed)"
    missing = sorted(t for t in running if t not in rates)
    if missing:
        return f"no measured window yet for {', '.join(missing)}"
    producer = {c.channel_id: c.producer for c in query.channels}
    drops_in: dict[str, list[str]] = {}
    for name, (task, _) in sorted(drops.items()):
        drops_in.setdefault(task, []).append(name)
    points = [DropPoint(name, rates[task].arriving / len(drops_in[task]))
              for task, names in drops_in.items() if task in running for name in names]
    operators = []
    for t in query.tasks:
        if t.task_id not in running:
            continue
        inputs = tuple(drops_in.get(t.task_id, ())) + tuple(
            p for p in dict.fromkeys(producer.get(c, "") for c in t.inputs) if p in running)
        delivered = _delivered(t.task_id, drops_in, inputs, rates)
        own = rates[t.task_id]
        share = _share(t.task_id, query, running, rates, delivered)
        out = own.rows_out if t.outputs else own.processed
        per_row = out / own.processed if own.processed > 0 else 0.0
        if t.task_id in drops_in:
            read, kept = split_cost(own, (unshed or {}).get(t.task_id))
            batch = 0.0
        else:
            read = 0.0
            kept, batch = processing_cost(own, (held or {}).get(t.task_id))
        cost, selectivity = kept * share, per_row * share
        if own.processed <= 0 and t.task_id in (last or {}):
            cost, selectivity = (last or {})[t.task_id]
        fixed = read * own.arriving + batch
        operators.append(Operator(t.task_id, running[t.task_id], cost, selectivity, inputs,
                                  fixed))
    sinks = [Sink(name, t.task_id, weight) for name, weight in sorted(query.weights.items())
             for t in query.tasks if name in t.operators and t.task_id in running]
    return ShedProblem(tuple(points), tuple(operators), tuple(sinks),
                       {a: max(0.0, capacity.get(a, UNKNOWN_CAPACITY))
                        for a in sorted(set(running.values()))},
                       {o.name: TASK_BUSY_LIMIT for o in operators},
                       basis_of({t: rates[t] for t in running},
                                sorted(set(held or {}) & set(running) - set(drops_in)),
                                set(drops_in)))


def processing_costs(problem: ShedProblem, rates: Mapping[str, TaskRates]
                     ) -> dict[str, tuple[float, float]]:
    """(cost, selectivity) per row delivered (a drop's task: per row kept, its cost per row
    read is `fixed`) of every operator of `problem` whose task processed rows in the window
    (`rates`): what `problem_of` keeps for it (`last`) while it processes none."""
    return {o.name: (o.cost, o.selectivity) for o in problem.operators
            if (r := rates.get(o.name)) is not None and r.processed > 0}


def basis_of(rates: Mapping[str, TaskRates], held: Sequence[str] = (),
             drop_tasks: Collection[str] = ()) -> str:
    """What the tasks' costs per row were measured from, for the decision's explanation: cgroup
    cpu or busy time, and which tasks (not drops' tasks: `split_cost`) were costed by what they
    paid per row because they are saturated, or were while the shed in force relieves them
    (`held`)."""
    busy = sorted(t for t, r in rates.items() if r.cpu is None)
    if not busy:
        said = "costs from cgroup cpu (each agent's, split by busy time)"
    elif len(busy) == len(rates):
        said = "costs from busy time (no cgroup cpu measured)"
    else:
        said = (f"costs from cgroup cpu (each agent's, split by busy time), from busy time for "
                f"{', '.join(busy)} (no cpu measured)")
    return said + _saturated_said(
        {t: r for t, r in rates.items() if t not in drop_tasks}, held)


def _saturated_said(rates: Mapping[str, TaskRates], held: Sequence[str]) -> str:
    """Which tasks were costed by their cpu per row processed: saturated now (with the figure
    that says so) or held from a saturated window while rows are shed."""
    now = [f"{t} ({_why_saturated(r)})" for t, r in sorted(rates.items())
           if r.saturated and r.processed > 0]
    kept = [t for t in held if t in rates and not rates[t].saturated]
    parts = ([f"saturated, costed by cpu per row processed: {', '.join(now)}"] if now else []) + (
        [f"cpu per row processed held from saturation while shed: {', '.join(kept)}"]
        if kept else [])
    return "".join(f"; {p}" for p in parts)


def _why_saturated(rates: TaskRates) -> str:
    if rates.throttled >= THROTTLED_MOST:
        return f"throttled in {rates.throttled:.0%} of cpu periods"
    return f"busy {rates.busy:.2f} s/s"


def _share(task_id: str, query: CompiledQuery, running: Mapping[str, str],
           rates: Mapping[str, TaskRates], delivered: float) -> float:
    """The share of the rows its inputs deliver that reach the task: for a partition of a
    split stream (the producer sends the stream down several channels, one per instance), its
    rows processed against those of every running partition; else all of them. Not rows
    processed against rows delivered: an overloaded task processes fewer rows than reach it
    (the rest queue in its channel), and that ratio would hide its overload (a task busy 1 s/s
    processing 770 of 2,300 rows/s came out at 100 % of its capacity, not 300 %)."""
    if delivered <= 0:
        return 0.0
    mine = [c for c in query.channels if task_id in c.consumers]
    siblings = {t for m in mine for c in query.channels
                if c.producer == m.producer and c.stream == m.stream
                and c.channel_id != m.channel_id
                for t in c.consumers if t in running and t in rates}
    if not siblings:
        return 1.0
    together = rates[task_id].processed + sum(rates[t].processed for t in siblings)
    return rates[task_id].processed / together if together > 0 else 1.0 / (len(siblings) + 1)


def _delivered(task_id: str, drops_in: Mapping[str, list[str]], inputs: Sequence[str],
               rates: Mapping[str, TaskRates]) -> float:
    """Rows per second a task's inputs deliver to it now: its sources' rows its drops kept,
    and every producer's rows out."""
    kept = rates[task_id].processed if drops_in.get(task_id) else 0.0
    return kept + sum(rates[i].rows_out for i in inputs if i in rates)


def uniform_tuples(tuples: Sequence[tuple[str, str, str]],
                   semantic: Mapping[str, bool]) -> tuple[tuple[str, str, str], ...]:
    """The control tuples of a plan, a semantic drop's `high-ratio` set with its `ratio` (it is
    modelled as one class of rows)."""
    out: list[tuple[str, str, str]] = []
    for op, parameter, value in tuples:
        out.append((op, parameter, value))
        if parameter == "ratio" and semantic.get(op):
            out.append((op, "high-ratio", value))
    return tuple(out)
