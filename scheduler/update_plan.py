"""Updating a running query in place: the pure diff of its plan against a new one.

Owns `diff_plans(old, new)`, which classifies every task of two compiled plans of one query
(tasks keep their ids across an update: `compiler.tasks.task_ids`): kept (its operators, their
parameters, inputs, outputs and types, and its channels are unchanged: it keeps running, the
same attempt), added, removed, or changed: live (every difference a parameter its control
catalogue may change: switched by control tuples at a micro-batch boundary, `live_changes`), or
restarted with its new program (stateless, or stateful with its state kept (the same stateful
operators with the same state signature: kind, input types, parameters) or needing a fresh
checkpoint). And `refusals`, every reason
the update may not be applied, each located at file:line:column: state it would drop without
`--drop-state` (a stateful operator changed or moved to another task), a published stream other
queries read whose type changes or which goes away, what this slice cannot change (elastic,
partitioned, replicated or failover-protected tasks; a replaced task whose stream running tasks
go on reading: its new writer numbers batches anew), and the new plan's reads of other queries'
streams (`sharing.submit_problems`). `render` prints a diff for people.
Does not own applying the diff (`scheduler.state`) nor compiling (`compiler.pipeline`).
See docs/queries.md, "Updating a running query".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping

from common.control import ControlCatalog
from common.tasks import CompiledQuery, OperatorPlan
from scheduler import sharing
from scheduler.query_source import QuerySource

Change = Literal["kept", "added", "removed", "changed"]
StateFate = Literal["none", "kept", "fresh"]  # changed tasks: no state / restored / new checkpoint


@dataclass(frozen=True)
class TaskDiff:
    task_id: str
    change: Change
    operators: tuple[str, ...]  # the new plan's (the old one's for a removed task)
    state: StateFate = "none"
    details: tuple[str, ...] = ()  # what differs, for people
    # (channel id, reader task id) of the channels it serves: readers that come and go
    readers_added: tuple[tuple[str, str], ...] = ()
    readers_dropped: tuple[tuple[str, str], ...] = ()
    # a changed task whose every difference is a parameter its running query may change:
    # the control tuples (operator, parameter, value) that switch it at a micro-batch boundary
    live: tuple[tuple[str, str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "change": self.change,
                "operators": list(self.operators), "state": self.state,
                "details": list(self.details), "live": [list(t) for t in self.live],
                "readers_added": [list(r) for r in self.readers_added],
                "readers_dropped": [list(r) for r in self.readers_dropped]}


@dataclass(frozen=True)
class DroppedState:
    """A stateful operator of the running plan whose state the update would lose although
    the new plan still has it: changed, or moved to another task (a new checkpoint)."""

    operator: OperatorPlan  # the new plan's
    why: str


@dataclass(frozen=True)
class PlanDiff:
    query_id: str
    tasks: tuple[TaskDiff, ...]  # the new plan's tasks in order, then the removed ones
    dropped: tuple[DroppedState, ...] = ()

    def of(self, change: Change) -> tuple[TaskDiff, ...]:
        return tuple(t for t in self.tasks if t.change == change)

    @property
    def empty(self) -> bool:
        return all(t.change == "kept" and not t.readers_added and not t.readers_dropped
                   for t in self.tasks)

    def to_json(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "tasks": [t.to_json() for t in self.tasks],
                "dropped_state": [{"operator": d.operator.name, "where": d.operator.where,
                                   "why": d.why} for d in self.dropped],
                "lines": render(self)}


def _ops(query: CompiledQuery, task_id: str) -> dict[str, OperatorPlan]:
    return {o.name: o for o in query.operators if o.task_id == task_id}


def _readers(query: CompiledQuery, task_id: str) -> set[tuple[str, str]]:
    return {(c.channel_id, r) for c in query.channels if c.producer == task_id
            for r in c.consumers}


def diff_plans(old: CompiledQuery, new: CompiledQuery) -> PlanDiff:
    """Every task of `new` as kept, changed or added against `old`, then `old`'s removed ones;
    and the state the update would drop."""
    old_ids = {t.task_id for t in old.tasks}
    new_ids = {t.task_id for t in new.tasks}
    found = [_task_diff(old, new, t.task_id) if t.task_id in old_ids
             else TaskDiff(t.task_id, "added", t.operators)
             for t in new.tasks]
    found += [TaskDiff(t.task_id, "removed", t.operators) for t in old.tasks
              if t.task_id not in new_ids]
    return PlanDiff(new.query_id, tuple(found), _dropped(old, new, found))


def _task_diff(old: CompiledQuery, new: CompiledQuery, task_id: str) -> TaskDiff:
    before, after = old.task(task_id), new.task(task_id)
    was, now = _ops(old, task_id), _ops(new, task_id)
    details = [f"operator {n} ({now[n].kind}) added" for n in now if n not in was]
    details += [f"operator {n} ({was[n].kind}) removed" for n in was if n not in now]
    details += [f"operator {n} ({now[n].kind}) changed" for n in now
                if n in was and was[n].signature != now[n].signature]
    if (before.inputs, before.outputs) != (after.inputs, after.outputs):
        details.append(f"channels read {list(before.inputs)} -> {list(after.inputs)}, served "
                       f"{list(before.outputs)} -> {list(after.outputs)}")
    readers_old, readers_new = _readers(old, task_id), _readers(new, task_id)
    added = tuple(sorted(readers_new - readers_old))
    dropped = tuple(sorted(readers_old - readers_new))
    if not details:
        return TaskDiff(task_id, "kept", after.operators, "none", (), added, dropped)
    state_was = {n: o.state for n, o in was.items() if o.state is not None}
    state_now = {n: o.state for n, o in now.items() if o.state is not None}
    fate: StateFate = "none" if not state_was and not state_now else \
        "kept" if state_was == state_now else "fresh"
    return TaskDiff(task_id, "changed", after.operators, fate, tuple(details), added, dropped,
                    live_changes(old, new, task_id) or ())


def live_changes(old: CompiledQuery, new: CompiledQuery,
                 task_id: str) -> tuple[tuple[str, str, str], ...] | None:
    """The control tuples that turn a task's running program into its new one, when every
    difference is the value of a parameter the running query may change at a micro-batch
    boundary (its control catalogue, docs/control.md: a filter's condition, a source's rate, a
    sink's path...); None when anything else differs."""
    before, after = old.task(task_id), new.task(task_id)
    was, now = _ops(old, task_id), _ops(new, task_id)
    if was.keys() != now.keys() or (before.inputs, before.outputs) != (after.inputs,
                                                                      after.outputs):
        return None
    running, updated = old.controls or ControlCatalog(), new.controls or ControlCatalog()
    tuples = []
    for name, op in now.items():
        a, b = json.loads(was[name].signature), json.loads(op.signature)
        if a == b:
            continue
        if a[:1] + a[2:] != b[:1] + b[2:] or [k for k, _ in a[1]] != [k for k, _ in b[1]]:
            return None
        for (key, value_was), (_, value_now) in zip(a[1], b[1]):
            if value_was == value_now:
                continue
            adjustable, target = running.find(name, key), updated.find(name, key)
            if adjustable is None or target is None:
                return None
            tuples.append((name, key, target.value))
    return tuple(tuples) or None


def _dropped(old: CompiledQuery, new: CompiledQuery,
             tasks: list[TaskDiff]) -> tuple[DroppedState, ...]:
    """The running plan's stateful operators that the new plan has too but whose state would
    not carry over: in a changed task that needs a fresh checkpoint, or in another task now."""
    fresh = {t.task_id for t in tasks if t.state == "fresh"}
    now = {o.name: o for o in new.operators}
    found = []
    for o in old.operators:
        n = now.get(o.name)
        if o.state is None or n is None:
            continue  # stateless, or gone with its state (the diff shows its task or change)
        if n.task_id != o.task_id:
            found.append(DroppedState(n, f"moves from task {o.task_id} to {n.task_id}"))
        elif n.task_id in fresh:
            why = "changes its key, window, watermark, aggregates or input types" \
                if n.state != o.state \
                else "shares its task with a stateful operator that changes"
            found.append(DroppedState(n, why))
    return tuple(found)


def fresh_roots(diff: PlanDiff, new: CompiledQuery) -> set[str]:
    """The root operators of the changed tasks that need a fresh checkpoint: compiled again
    without their pinned ids, they become new tasks (and their old ones are removed)."""
    return {new.task(t.task_id).operators[-1] for t in diff.tasks if t.state == "fresh"}


# ----------------------------------------------------------------------------------------------
# Refusals

def refusals(old: CompiledQuery, new: CompiledQuery, diff: PlanDiff, drop_state: bool,
             queries: Mapping[str, sharing.QueryRecord]) -> list[str]:
    """Every reason the update may not be applied, each starting with file:line:column."""
    problems = [] if drop_state else [
        f"{d.operator.where}: operator {d.operator.name} ({d.operator.kind}) {d.why}: its state "
        "would be dropped; update with --drop-state to drop it" for d in diff.dropped]
    problems += _unchangeable(old, new, diff)
    problems += _renumbered(old, new, diff, queries)
    problems += _published_problems(old, new, queries)
    problems += sharing.submit_problems(new, {q: r for q, r in queries.items()
                                              if q != new.query_id})
    said = {d.operator.task_id for d in diff.dropped}  # refused for its state already
    problems += [f"{task_where(new, t.task_id)}: task {t.task_id} needs a new checkpoint; "
                 "compile the update without its pinned id (the API does)"
                 for t in diff.of("changed") if t.state == "fresh" and t.task_id not in said]
    return problems


def task_where(query: CompiledQuery, task_id: str) -> str:
    """file:line:column of a task's root operator."""
    return _where(query, task_id)[0]


def _where(query: CompiledQuery, task_id: str) -> tuple[str, str]:
    """(file:line:column, name) of a task's root operator."""
    root = query.task(task_id).operators[-1]
    op = next((o for o in query.operators if o.name == root), None)
    return (op.where if op is not None else "?"), root


def _unchangeable(old: CompiledQuery, new: CompiledQuery, diff: PlanDiff) -> list[str]:
    """Tasks this slice cannot add, remove or change: an elastic operator's instances and
    splitters, hot-standby replicas and failover-protected tasks (stop and resubmit)."""
    def special(query: CompiledQuery, task_id: str) -> str | None:
        for e in query.elastic:
            if task_id in e.slots or task_id in {t for t, _ in e.splitters}:
                return f"is part of elastic operator {e.operator}"
        failover = query.task(task_id).failover
        return f"is protected by failover ({failover})" if failover else None

    problems = []
    for t in diff.tasks:
        if t.change == "kept":
            continue
        query = old if t.change == "removed" else new
        why = special(query, t.task_id) or (special(old, t.task_id)
                                           if t.change == "changed" else None)
        if why is not None:
            where, root = _where(query, t.task_id)
            problems.append(f"{where}: task {t.task_id} (root {root}) {why}: an update cannot "
                            f"{'remove' if t.change == 'removed' else 'start or change'} it "
                            "yet; stop the query and submit it again")
    return problems


def _renumbered(old: CompiledQuery, new: CompiledQuery, diff: PlanDiff,
                queries: Mapping[str, sharing.QueryRecord]) -> list[str]:
    """An added task that serves a channel an old task served, to readers that go on from
    where they were (tasks of the query that are not new, or other queries): its writer starts a
    new numbering, which they cannot resume in (not yet; the writer's log stays with the old
    task's checkpoint)."""
    added = {t.task_id for t in diff.of("added")}
    before = {c.channel_id for c in old.channels}
    problems = []
    for c in new.channels:
        if c.producer not in added or c.channel_id not in before:
            continue
        readers = [r for r in c.consumers if r not in added]
        readers += sorted({q.query_id for q, _ in sharing.readers(queries, c.channel_id)
                           if q.query_id != new.query_id})
        if readers:
            where, root = _where(new, c.producer)
            problems.append(f"{where}: task {c.producer} (root {root}) would serve "
                            f"{c.channel_id} anew to {', '.join(readers)}, which go on from "
                            "their place in the old task's numbering: an update cannot replace "
                            "a task whose stream running tasks read yet; stop the query and "
                            "submit it again")
    return problems


def _published_problems(old: CompiledQuery, new: CompiledQuery,
                        queries: Mapping[str, sharing.QueryRecord]) -> list[str]:
    """A published stream other live queries read may neither go away nor change its type; a
    stream they read by automatic sharing may not change what computes it either."""
    problems = _shared_problems(old, new, queries)
    schemas = {c.channel_id: c for c in new.channels}
    for c in (c for c in old.channels if c.channel_id in old.published):
        readers = sorted({q.query_id for q, _ in sharing.readers(queries, c.channel_id)
                          if q.query_id != old.query_id})
        if not readers:
            continue
        now = schemas.get(c.channel_id) if c.channel_id in new.published else None
        if now is None:
            where, _ = _where(old, c.producer)
            problems.append(f"{where}: stream {c.channel_id} is read by {', '.join(readers)}; "
                            "the update stops publishing it (stop those queries first)")
        elif now.schema != c.schema:
            where, _ = _where(new, now.producer)
            problems.append(f"{where}: stream {c.channel_id} is read by {', '.join(readers)} "
                            f"as {_described(c)} but the update makes it {_described(now)}")
    return problems


def _shared_problems(old: CompiledQuery, new: CompiledQuery,
                     queries: Mapping[str, sharing.QueryRecord]) -> list[str]:
    """A channel other live queries read in place of an equal subgraph (automatic sharing) keeps
    its canonical form: the same operators and parameters compute it."""
    problems = []
    before, after = dict(old.shareable), dict(new.shareable)
    for c in (c for c in old.channels if c.channel_id in before):
        readers = sorted({q.query_id for q, i in sharing.readers(queries, c.channel_id)
                          if i.auto and q.query_id != old.query_id})
        if readers and after.get(c.channel_id) != before[c.channel_id]:
            where, _ = _where(old, c.producer)
            problems.append(f"{where}: stream {c.channel_id} is read by {', '.join(readers)} "
                            "in place of an equal subgraph (automatic sharing); the update "
                            "changes what computes it (stop those queries first)")
    return problems


def _described(c: Any) -> str:
    return "(" + ", ".join(f"{f.name} {f.type.value}" for f in c.schema) + ")"


def pins(query: CompiledQuery) -> dict[str, str]:
    """Root operator -> task id of a plan's tasks: what compiling its update keeps."""
    return {t.operators[-1]: t.task_id for t in query.tasks}


def updated_source(source: QuerySource, running: QuerySource | None,
                   old: CompiledQuery, new: CompiledQuery) -> QuerySource:
    """The source an applied update persists: the new spec with its tasks' ids pinned and the
    ids of every task the query ever removed retired (a new leader recompiles it to the same
    tasks)."""
    gone = {t.task_id for t in old.tasks} - {t.task_id for t in new.tasks}
    retired = set(running.retired if running is not None else ()) | set(source.retired) | gone
    return replace(source, task_ids=tuple(sorted(pins(new).items())),
                   retired=tuple(sorted(retired)))


# ----------------------------------------------------------------------------------------------
# For people

_MARK = {"kept": "=", "added": "+", "removed": "-", "changed": "~"}
_STATE = {"none": "stateless: restarted with its new program",
          "kept": "restarted with its new program, its state kept (checkpoint)",
          "fresh": "a new checkpoint: restarted without state"}


def render(diff: PlanDiff) -> list[str]:
    """One line per task (= kept, + added, - removed, ~ changed), the details indented."""
    lines = []
    for t in diff.tasks:
        live = ", ".join(f"{o}.{p}" for o, p, _ in t.live)
        what = {"kept": "kept (keeps running)", "added": "added (started)",
                "removed": "removed (stopped)",
                "changed": f"changed live (keeps running; {live} switched at a micro-batch "
                           "boundary)" if t.live else f"changed ({_STATE[t.state]})"}
        lines.append(f"{_MARK[t.change]} {t.task_id} [{', '.join(t.operators)}]: "
                     f"{what[t.change]}")
        lines += [f"    {d}" for d in t.details]
        lines += [f"    reader {r} of {c} comes" for c, r in t.readers_added]
        lines += [f"    reader {r} of {c} goes" for c, r in t.readers_dropped]
    lines += [f"! {d.operator.where}: state of {d.operator.name} dropped: {d.why}"
              for d in diff.dropped]
    return lines or ["(no tasks)"]
