"""A query's control stream at the scheduler: what was asked, what each task acknowledged.

Owns `QueryControl` (per query: the version of its parameters, the current value of every
changed parameter, the parameters each task runs with - sent again with every launch, so a task
that restarts or fails over comes back with them - the requests in flight and the history of
applied tuples with the epoch each took effect at) and the pure steps on it: `begin` a checked
request, `acknowledge` one task's answer, `undo` a request a task refused. Also the JSON views
(`catalog_view`, `request_view`) and the persisted form. Does not own checking tuples
(`compiler.control`) or sending messages (`scheduler.state` turns these steps into commands).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from common.control import Change, ControlCatalog, ControlRefused
from common.messages import ParamSet
from compiler.control import check_tuple
from compiler.operators import MAX_RATE, MIN_RATE

RequestState = Literal["pending", "applied", "refused"]
HISTORY_KEPT = 200
SETTLED_KEPT = 100  # settled requests kept for `GET .../control/{request}`
_ids = itertools.count(1)


def new_request_id(query_id: str) -> str:
    """A fresh control request id (wall clock and a counter): minted at the edge, carried by
    `ControlRequested.request_id`, never inside the state machine."""
    return f"{query_id}-c{int(time.time() * 1000) % 10**9}-{next(_ids)}"


@dataclass
class TaskAnswer:
    """One task's acknowledgement: applied from micro-batch `epoch`, or refused."""

    applied: bool
    epoch: int = -1
    pause_s: float = 0.0
    message: str = ""
    at: float = 0.0  # wall-clock seconds
    detail: dict[str, float] = field(default_factory=dict)  # what a live switch decided

    def to_json(self) -> dict[str, Any]:
        return {"applied": self.applied, "epoch": self.epoch, "pause_s": self.pause_s,
                "message": self.message, "at": self.at, "detail": dict(self.detail)}


@dataclass
class ControlRequest:
    request_id: str
    version: int
    tuples: list[tuple[str, str, str]]  # (operator, parameter, value)
    asked_at: float
    tasks: dict[str, TaskAnswer | None]  # task id -> answer, None while pending
    undo: dict[str, dict[str, str]]  # operator -> parameter -> value before the request
    undo_params: dict[str, dict[str, dict[str, Any]]]  # task id -> its params before
    state: RequestState = "pending"
    reason: str = ""
    settled_at: float | None = None  # scheduler clock, when the last answer came

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request_id, "version": self.version, "state": self.state,
                "reason": self.reason, "asked_at": self.asked_at,
                "tuples": [list(t) for t in self.tuples],
                "tasks": {t: (a.to_json() if a else None) for t, a in self.tasks.items()}}


@dataclass
class QueryControl:
    version: int = 0
    values: dict[str, dict[str, str]] = field(default_factory=dict)  # changed ones only
    task_params: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    requests: dict[str, ControlRequest] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def param_set(self, task_id: str) -> ParamSet:
        """What a launch of `task_id` (and a control message to it) carries: the version and
        its parameters."""
        return ParamSet(self.version, self.task_params.get(task_id, {}))

    def params_of(self, task_id: str) -> dict[str, Any]:
        """`param_set` as JSON."""
        return self.param_set(task_id).to_json()

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "values": self.values, "task_params": self.task_params,
                "history": self.history[-HISTORY_KEPT:]}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "QueryControl":
        if not d:
            return cls()
        return cls(int(d.get("version", 0)), dict(d.get("values", {})),
                   dict(d.get("task_params", {})), {}, list(d.get("history", [])))


def sinks_in_force(sinks: Mapping[str, str], control: QueryControl,
                   catalog: ControlCatalog | None) -> dict[str, str]:
    """Each file sink's path as its task has it now: the compiled one, or the one a control
    tuple set (its runtime value, absolute), so whatever shows a sink follows it (pure)."""
    found = dict(sinks)
    for name in sinks:
        adjustable = catalog.find(name, "path") if catalog is not None else None
        for target in adjustable.targets if adjustable else ():
            value = control.task_params.get(target.task_id, {}).get(target.op, {}).get(
                target.keyword)
            if isinstance(value, str) and value:
                found[name] = value
                break
    return found


def drop_refused(control: QueryControl, catalog: ControlCatalog, query_id: str) -> list[str]:
    """Check the persisted values again (a value stored before today's checks, e.g. a rate of
    inf, would make every relaunch of its tasks fail): a value the catalogue refuses now is
    dropped, its operator back at the spec's value on every task; returns what was dropped and
    why (pure)."""
    dropped: list[str] = []
    for operator, values in list(control.values.items()):
        for parameter, value in list(values.items()):
            try:
                check_tuple(catalog, query_id, operator, parameter, value)
                continue
            except ControlRefused as exc:
                dropped.append(f"persisted {operator}.{parameter} dropped: {exc}")
            _drop_value(control, catalog, operator, parameter)
    return dropped


def drop_respecified(control: QueryControl, running: ControlCatalog,
                     updated: ControlCatalog) -> list[str]:
    """After an update (docs/queries.md): a value set by control for a parameter the new spec
    gives another value than the running one is dropped, the new spec's value in force on
    every task's next launch; returns what was dropped (pure). A value equal to the new spec's
    stays (the update's own live switch set it; its message holds these very parameters)."""
    dropped = []
    for operator, values in list(control.values.items()):
        for parameter, value in list(values.items()):
            was, now = running.find(operator, parameter), updated.find(operator, parameter)
            if was is not None and now is not None and was.value != now.value \
                    and value != now.value:
                dropped.append(f"{operator}.{parameter} set by control dropped: the update "
                               f"gives it {now.value!r}")
                _drop_value(control, updated, operator, parameter)
    return dropped


def _drop_value(control: QueryControl, catalog: ControlCatalog, operator: str,
                parameter: str) -> None:
    """The operator's parameter back at the spec's value on every task."""
    values = control.values.get(operator, {})
    values.pop(parameter, None)
    adjustable = catalog.find(operator, parameter)
    for target in adjustable.targets if adjustable else ():
        ops = control.task_params.get(target.task_id, {})
        ops.get(target.op, {}).pop(target.keyword, None)
        if not ops.get(target.op, True):
            del ops[target.op]
    if not values:
        control.values.pop(operator, None)


def in_force(control: QueryControl, change: Change) -> bool:
    """Whether `change` sets the value already in force (same runtime value), so applying it
    would only rebuild the tasks for nothing."""
    a = change.adjustable
    ops = control.task_params.get(a.targets[0].task_id, {}) if a.targets else {}
    current = ops.get(a.targets[0].op, {}).get(a.targets[0].keyword) if a.targets else None
    if current is None:
        return change.text == a.value or _same(change, a.value)
    return _jsonable(change.runtime_value) == current


def _same(change: Change, text: str) -> bool:
    """`text` (the value the query started with) means what the change's value means."""
    if change.adjustable.value_kind == "float":
        try:
            return float(text) == float(change.runtime_value)
        except ValueError:
            return False
    if change.adjustable.value_kind == "columns":
        return [c.strip() for c in text.split(",") if c.strip()] == list(change.runtime_value)
    return False


def settled_at_once(control: QueryControl, request_id: str, changes: list[Change],
                    now: float) -> ControlRequest:
    """A request whose every value is already in force: applied, with nothing to send."""
    request = ControlRequest(request_id, control.version,
                             [(c.adjustable.operator, c.adjustable.parameter, c.text)
                              for c in changes], now, {}, {}, {}, "applied",
                             "every value is already in force", now)
    control.requests[request_id] = request
    return request


def begin(control: QueryControl, request_id: str, changes: list[Change], now: float) -> ControlRequest:
    """Record a checked request: a new version, the new values, each target task's new
    parameters (its whole set); returns the request, pending on every target task."""
    undo = {c.adjustable.operator: dict(control.values.get(c.adjustable.operator, {}))
            for c in changes}
    tasks = sorted({t.task_id for c in changes for t in c.adjustable.targets})
    undo_params = {t: _copy(control.task_params.get(t, {})) for t in tasks}
    control.version += 1
    for change in changes:
        a = change.adjustable
        control.values.setdefault(a.operator, {})[a.parameter] = change.text
        for target in a.targets:
            ops = control.task_params.setdefault(target.task_id, {})
            ops.setdefault(target.op, {})[target.keyword] = _jsonable(change.runtime_value)
    request = ControlRequest(request_id, control.version,
                             [(c.adjustable.operator, c.adjustable.parameter, c.text)
                              for c in changes], now, {t: None for t in tasks}, undo, undo_params)
    control.requests[request_id] = request
    settled = [r for r in control.requests.values() if r.state != "pending"]
    for old in settled[:-SETTLED_KEPT]:
        del control.requests[old.request_id]
    return request


def refuse(request: ControlRequest, reason: str, now: float) -> None:
    """Settle a pending request as refused, saying why (the caller undoes it)."""
    request.state, request.reason, request.settled_at = "refused", reason, now


def acknowledge(control: QueryControl, request_id: str, task_id: str, answer: TaskAnswer,
                now: float = 0.0) -> ControlRequest | None:
    """Record one task's answer; the request, or None if it is unknown or already settled
    for that task. A refusal settles the request as refused (the caller undoes it); the last
    acknowledgement settles it as applied and enters its tuples in the history."""
    request = control.requests.get(request_id)
    if request is None or task_id not in request.tasks or request.tasks[task_id] is not None:
        return None
    request.tasks[task_id] = answer
    if request.state != "pending":
        return request
    if not answer.applied:
        refuse(request, f"task {task_id}: {answer.message}", now)
    elif all(a is not None and a.applied for a in request.tasks.values()):
        request.state, request.settled_at = "applied", now
        epochs = {t: a.epoch for t, a in request.tasks.items() if a is not None}
        for operator, parameter, value in request.tuples:
            control.history.append({"request": request_id, "version": request.version,
                                    "operator": operator, "parameter": parameter,
                                    "value": value, "asked_at": request.asked_at,
                                    "applied_at": answer.at, "epochs": epochs})
        del control.history[:-HISTORY_KEPT]
    return request


def undo(control: QueryControl, request: ControlRequest) -> list[str]:
    """Put back what `request` changed, as a new version; the tasks to send it to (those
    that may have applied it)."""
    control.version += 1
    for operator, values in request.undo.items():
        if values:
            control.values[operator] = dict(values)
        else:
            control.values.pop(operator, None)
    for task_id, params in request.undo_params.items():
        control.task_params[task_id] = _copy(params)
    return [t for t, a in request.tasks.items() if a is None or a.applied]


def catalog_view(catalog: ControlCatalog, control: QueryControl) -> dict[str, Any]:
    """Every adjustable parameter with its type and current value, the fixed ones with the
    reason, and the applied history: what `elastiq control --list` prints."""
    adjustable = []
    for a in catalog.adjustable:
        current = control.values.get(a.operator, {}).get(a.parameter, a.value)
        adjustable.append({"operator": a.operator, "kind": a.kind, "parameter": a.parameter,
                           "type": _type_name(a), "value": current, "initial": a.value,
                           "tasks": sorted({t.task_id for t in a.targets}), "doc": a.doc})
    return {"version": control.version, "adjustable": adjustable,
            "fixed": [{"operator": f.operator, "parameter": f.parameter, "reason": f.reason}
                      for f in catalog.fixed],
            "history": control.history[-50:]}


def _type_name(a: Any) -> str:
    if a.value_kind == "expression":
        streams = ", ".join(name for name, _ in a.scope)
        return f"boolean expression over {streams}"
    return {"float": f"number {MIN_RATE:g}..{MAX_RATE:.0f}", "endpoint": "tcp://host:port",
            "path": "absolute path in the roots", "columns": "column list"}.get(a.value_kind,
                                                                                a.value_kind)


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _copy(params: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {op: dict(values) for op, values in params.items()}
