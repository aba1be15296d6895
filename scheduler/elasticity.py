"""Run-time parallelism of a query's elastic operators at the scheduler (docs/elasticity.md).

Owns the pure steps that keep an elastic operator's instance slots in line with the parallelism
in force (the `parallelism` control value, else the spec's): `reconcile` activates the dormant
slots a scale-out needs, marks the slots a scale-in takes away as retiring, and says which
retiring instances have drained (every batch routed to them committed, every batch they
produced committed downstream) and may be stopped; `Rescale` records each change for the status
view. Does not own checking the new value (`compiler.control`, through the control catalogue),
sending it to the splitters (`scheduler.state`, as a control request) or choosing it
(`scheduler.elastic_policy`, automatic mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from common.control import PARALLELISM
from common.messages import retained_of
from common.tasks import PLANNED_GRID_MS, CompiledQuery, ElasticOperator
from scheduler.control import QueryControl
from scheduler.elastic_policy import (Decision, ElasticPolicy, OperatorView, SampleHistory,
                                      view_of)
from scheduler.lifecycle import TaskRecord, TaskState

# A retiring instance's own figures must arrive this long after its input was seen drained,
# so that they were measured after its last output write (heartbeats come every second).
DRAIN_SETTLE_SECONDS = 3.0
RESCALES_KEPT = 50
DECIDE_EVERY_SECONDS = 1.0  # the automatic policy looks at an operator at most this often
REFUSED_BACKOFF_SECONDS = 10.0  # after the query refused an automatic rescale, look again then


@dataclass
class Rescale:
    """One change of an operator's parallelism, as the status view shows it."""

    operator: str
    before: int
    after: int
    trigger: str  # manual | auto
    request: str
    asked_at: float
    applied_at: float | None = None
    pause_s: float | None = None  # the splitters' longest pause between two micro-batches
    retired_at: float | None = None  # a scale-in: when its last instance was stopped
    state: str = "pending"  # pending | applied | refused
    reason: str = ""  # why (automatic mode: the policy's explanation)
    # a stateful operator's event-time switch (ms since the epoch), from its splitters'
    # acknowledgements; -1: at once (nothing routed yet); None: not known yet
    switch_ms: int | None = None

    def settled_at(self) -> float:
        """When the change last moved: asked, then applied (the splitters switched, the new
        instances run), then retired (a scale-in's last instance stopped). The policy's
        cool-down counts from here, so a slow start of new instances is not measured as load."""
        return max(t for t in (self.asked_at, self.applied_at, self.retired_at) if t is not None)

    def to_json(self) -> dict[str, Any]:
        return {"operator": self.operator, "from": self.before, "to": self.after,
                "trigger": self.trigger, "request": self.request, "asked_at": self.asked_at,
                "applied_at": self.applied_at, "pause_s": self.pause_s,
                "retired_at": self.retired_at, "state": self.state, "reason": self.reason,
                "switch_ms": self.switch_ms}


@dataclass
class ElasticState:
    """A query's elastic bookkeeping: its rescales, newest last; per retiring slot the time its
    input was first seen drained; the automatic policy's decisions (the latest per operator
    for the status view, the recent ones and their count for the metrics) and when it last
    decided on each operator."""

    rescales: list[Rescale] = field(default_factory=list)
    drained_at: dict[str, float] = field(default_factory=dict)
    latest: dict[str, Decision] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    decided: int = 0
    decided_at: dict[str, float] = field(default_factory=dict)
    # scale-outs whose splitters hear of them only once the new instances run (so no row waits
    # for a launch): control request id -> the instance tasks it waits for
    deferred: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # operator -> when the policy may decide again after the query refused its rescale
    backoff_until: dict[str, float] = field(default_factory=dict)
    # a join's rescale: control request id -> the event time (ms) its splitters switch at
    planned: dict[str, int] = field(default_factory=dict)

    def decide(self, decision: Decision, now: float) -> None:
        self.latest[decision.operator_id] = decision
        self.decided_at[decision.operator_id] = now
        self.decisions.append(decision)
        self.decided += 1
        del self.decisions[:-RESCALES_KEPT]

    def record(self, rescale: Rescale) -> None:
        self.rescales.append(rescale)
        del self.rescales[:-RESCALES_KEPT]

    def last(self, operator: str) -> Rescale | None:
        return next((r for r in reversed(self.rescales) if r.operator == operator), None)


@dataclass(frozen=True)
class Steps:
    """What `reconcile` decided: slots to launch again, and retiring instances to stop."""

    activate: tuple[TaskRecord, ...] = ()
    stop: tuple[TaskRecord, ...] = ()
    notes: tuple[str, ...] = ()
    deactivate: tuple[TaskRecord, ...] = ()  # activated slots not launched yet, wanted no more


def parallelism(e: ElasticOperator, control: QueryControl) -> int:
    """The parallelism in force: the last applied (or pending) control value, else the spec's."""
    value = control.values.get(e.operator, {}).get(PARALLELISM)
    return int(value) if value is not None else e.initial


def changing(control: QueryControl, operator: str) -> bool:
    """Whether a control request that sets the operator's parallelism is still in flight."""
    return any(r.state == "pending" and any(t[0] == operator and t[1] == PARALLELISM
                                            for t in r.tuples)
               for r in control.requests.values())


def growing(query: CompiledQuery, before: dict[str, int],
            control: QueryControl) -> tuple[str, ...]:
    """The instance tasks a scale-out (from the parallelism `before` to the one now in force)
    starts, in slot order."""
    return tuple(t for e in query.elastic
                 for t in e.slots[before[e.operator]:parallelism(e, control)])


def ready(deferred: tuple[str, ...], tasks: dict[str, TaskRecord]) -> bool:
    """Every instance a deferred scale-out waits for runs."""
    return all(tasks[t].state is TaskState.RUNNING for t in deferred)


def dormant_at_start(query: CompiledQuery) -> set[str]:
    """The instance tasks a query's first launch leaves out (slots beyond the initial
    parallelism)."""
    return {t for e in query.elastic for t in e.slots[e.initial:]}


def reconcile(query: CompiledQuery, tasks: dict[str, TaskRecord], control: QueryControl,
              state: ElasticState, now: float) -> Steps:
    """Bring every elastic operator's slots in line with its parallelism in force (pure but
    for the records' `retiring` flags and `state.drained_at`): slots below it that are dormant
    are activated; launched slots at or above it retire, and are stopped once drained."""
    activate: list[TaskRecord] = []
    stop: list[TaskRecord] = []
    notes: list[str] = []
    deactivate: list[TaskRecord] = []
    for e in query.elastic:
        n = parallelism(e, control)
        settled = not changing(control, e.operator)
        for index, task_id in enumerate(e.slots):
            task = tasks[task_id]
            if index < n:
                if task.state is TaskState.DORMANT:
                    activate.append(task)
                elif task.retiring and not task.kill_requested:
                    task.retiring = False
                    state.drained_at.pop(task_id, None)
                    notes.append(f"{task_id} stays: {e.operator} runs {n} instances again")
                continue
            if task.state is TaskState.PENDING and not task.retiring:
                deactivate.append(task)  # activated, then scaled in again before it launched
                continue
            if task.state.launched and not task.retiring:
                task.retiring = True
                notes.append(f"{task_id} retires once drained ({e.operator} scales in to {n})")
            if task.retiring and settled and not task.kill_requested and \
                    task.state is TaskState.RUNNING and _drained(e, index, task, tasks, state,
                                                                  now):
                stop.append(task)
    return Steps(tuple(activate), tuple(stop), tuple(notes), tuple(deactivate))


def unplaced_channels(query: CompiledQuery,
                      tasks: Mapping[str, TaskRecord]) -> dict[str, tuple[str, ...]]:
    """The channels each consumer task must learn are no longer placed (pure): the outputs of
    the dormant instance slots (retired by a scale-in once drained, or put back to sleep after a
    refused scale-out) whose consumer was given an endpoint for them. A merger reading such a
    channel no longer waits for it (`common.dpc.waited_for`); a scale-out that launches the
    slot again retargets it to its new endpoint."""
    dormant = {t for e in query.elastic for t in e.slots
               if t in tasks and tasks[t].state is TaskState.DORMANT}
    found: dict[str, list[str]] = {}
    for channel in query.channels:
        if channel.producer not in dormant:
            continue
        for consumer_id in channel.consumers:
            consumer = tasks.get(consumer_id)
            if consumer is not None and consumer.endpoints.get(channel.channel_id):
                found.setdefault(consumer_id, []).append(channel.channel_id)
    return {c: tuple(sorted(ids)) for c, ids in sorted(found.items())}


def never_launched_beyond(query: CompiledQuery, tasks: dict[str, TaskRecord],
                          control: QueryControl) -> list[TaskRecord]:
    """Slots at or beyond their operator's parallelism in force that a scale-out woke and that
    have not launched since (pending, the last edge dormant -> pending): after a refused
    scale-out nothing was routed to them, so they may sleep again (pure)."""
    found = []
    for e in query.elastic:
        for task_id in e.slots[parallelism(e, control):]:
            task = tasks[task_id]
            if task.state is TaskState.PENDING and task.history and \
                    task.history[-1].start is TaskState.DORMANT:
                found.append(task)
    return found


# Event time a join's planned switch lies ahead of what its splitters reported routing (ms):
# room for the rows routed between their last heartbeat and the switch reaching them; or what
# they route in PLAN_AHEAD_SECONDS at their pace, when that is more (a backlog being caught up)
PLAN_AHEAD_MS = 10_000
PLAN_AHEAD_SECONDS = 5.0


def routed_pace(before: float | None, before_at: float, after: float | None, now: float,
                last: float) -> float:
    """Event-time ms routed per second between two heartbeats' `routed_ms` (`before` at
    `before_at`, `after` now); `last` when the two do not tell (a first heartbeat, a new
    attempt, nothing routed yet, or time not moving forward)."""
    if before is None or after is None or before < 0 or after < before or now <= before_at:
        return last
    return (after - before) / (now - before_at)


def planned_switch(e: ElasticOperator, tasks: dict[str, TaskRecord],
                   after: int | None = None) -> int:
    """The event time (ms) every splitter of a join switches at: past each splitter's largest
    routed time (its heartbeat's `routed_ms`) plus its spread, so no row routed under the old
    routing could meet a row the new routing sends elsewhere, with PLAN_AHEAD_MS to spare (or
    PLAN_AHEAD_SECONDS at the fastest splitter's pace, when that is more), on a whole second; and
    a whole second past `after`, the operator's last switch, so a rescale
    asked before the heartbeats moved does not land on it and undo it (the instances it added
    would get no row, nor the ticks that retire them). A splitter still past it when the switch
    arrives refuses the rescale."""
    reach = [int(tasks[t].figures.get("routed_ms", -1)) + spread
             for (t, _), spread in zip(e.splitters, e.planned_spreads)
             if int(tasks[t].figures.get("routed_ms", -1)) >= 0]
    pace = max((tasks[t].routed_pace for t, _ in e.splitters), default=0.0)
    ahead = max(reach, default=0) + max(PLAN_AHEAD_MS, int(pace * PLAN_AHEAD_SECONDS))
    planned = -(-ahead // PLANNED_GRID_MS) * PLANNED_GRID_MS
    if after is not None and planned <= after:
        planned = (after // PLANNED_GRID_MS + 1) * PLANNED_GRID_MS
    return planned


def last_switch(state: ElasticState, operator: str) -> int | None:
    """The event time of the operator's last applied switch (None: it never switched)."""
    return next((r.switch_ms for r in reversed(state.rescales) if r.operator == operator
                 and r.state == "applied" and r.switch_ms is not None), None)


def planned_params(e: ElasticOperator, task_id: str, params: Mapping[str, Mapping[str, Any]],
                   at: int) -> dict[str, Mapping[str, Any]]:
    """A join splitter's parameters with its `active` as [n, at]: the switch time planned."""
    ops = {op for t, op in e.splitters if t == task_id}
    return {op: ({**kw, "active": [kw["active"], at]} if op in ops and "active" in kw else kw)
            for op, kw in params.items()}


def _switch_of(state: ElasticState, operator: str) -> int | None:
    last = state.last(operator)
    return last.switch_ms if last is not None and last.state == "applied" else None


def _drained(e: ElasticOperator, index: int, task: TaskRecord, tasks: dict[str, TaskRecord],
             state: ElasticState, now: float) -> bool:
    """Slot `index` has drained: its input is done (stateless: every splitter reports no batch
    of its partition channel unacknowledged, so the instance committed all it was sent;
    stateful: its watermark passed the switch plus `switch_close_ms`, the end of the last
    window starting before it or a join's bound, so it emitted all it owns; its splitters'
    ticks carried it there; an instance a refused scale-out started owns nothing, since no
    switch to it happened), and then, in figures measured afterwards, the instance reports none
    of its own outputs unacknowledged."""
    if e.switch_time is not None:
        last = state.last(e.operator)
        if last is not None and last.state == "refused" and index >= last.before:
            return _outputs_done(task, state, now)  # a slot the refused scale-out started
        switch = _switch_of(state, e.operator)
        if switch is None or task.figures.get("watermark_ms", -1) < switch + e.switch_close_ms:
            state.drained_at.pop(task.task_id, None)
            return False
        return _outputs_done(task, state, now)
    for splitter_task, _ in e.splitters:
        splitter = tasks[splitter_task]
        channel = _partition_channel(splitter.task.outputs, index)
        if channel is None or retained_of(splitter.figures).get(channel, 1) != 0:
            state.drained_at.pop(task.task_id, None)
            return False
    return _outputs_done(task, state, now)


def _outputs_done(task: TaskRecord, state: ElasticState, now: float) -> bool:
    since = state.drained_at.setdefault(task.task_id, now)
    if task.figures_at < since + DRAIN_SETTLE_SECONDS:
        return False
    outputs = retained_of(task.figures)
    return all(outputs.get(c, 1) == 0 for c in task.task.outputs)


def _partition_channel(outputs: Iterable[str], index: int) -> str | None:
    """The splitter's channel of partition `index` (0-based): the one ending in `#index+1`."""
    suffix = f"#{index + 1}"
    return next((c for c in outputs if c.endswith(suffix)), None)


def auto_view(e: ElasticOperator, tasks: dict[str, TaskRecord], control: QueryControl,
              state: ElasticState, history: SampleHistory, query_id: str,
              now: float) -> OperatorView | None:
    """What the policy sees of an automatic operator now (with the capacity its latest decision
    learnt), or None while it must not decide: a rescale in flight (its request pending, an
    instance starting or draining), within DECIDE_EVERY_SECONDS of its last decision, or
    backing off after the query refused its rescale."""
    if e.mode != "auto" or changing(control, e.operator) or \
            now - state.decided_at.get(e.operator, -DECIDE_EVERY_SECONDS) < DECIDE_EVERY_SECONDS \
            or now < state.backoff_until.get(e.operator, now):
        return None
    n = parallelism(e, control)
    moving = [t for i, t in enumerate(e.slots) if tasks[t].retiring or
              (i < n and tasks[t].state is not TaskState.RUNNING)]
    if moving:
        return None
    last = state.last(e.operator)
    latest = state.latest.get(e.operator)
    return view_of(history, query_id, e.operator, n, e.slots[:n],
                   sorted({task for task, _ in e.splitters}),
                   last.settled_at() if last is not None else None,
                   latest.capacity if latest is not None else None)


def policy_of(e: ElasticOperator, agents: int) -> ElasticPolicy:
    """The operator's bounds for the policy: at most as many instances as there are agents
    (they run apart), never below its minimum."""
    return ElasticPolicy(min_parallelism=e.minimum,
                         max_parallelism=max(e.minimum, min(e.maximum, agents)))


def describe(query: CompiledQuery, tasks: dict[str, TaskRecord], control: QueryControl,
             state: ElasticState) -> list[dict[str, Any]]:
    """The status view of each elastic operator: its parallelism, bounds, mode, instances by
    state and its last rescales."""
    views = []
    for e in query.elastic:
        slots = [{"slot": i + 1, "task": t, "state": tasks[t].state.value,
                  "retiring": tasks[t].retiring} for i, t in enumerate(e.slots)]
        views.append({"operator": e.operator, "parallelism": parallelism(e, control),
                      "min": e.minimum, "max": e.maximum, "mode": e.mode,
                      "stateful": e.stateful, "slots": slots, "folded_into": e.folded_into,
                      "rescales": [r.to_json() for r in state.rescales
                                   if r.operator == e.operator][-5:],
                      "decision": (state.latest[e.operator].to_json()
                                   if e.operator in state.latest else None)})
    return views


