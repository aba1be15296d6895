"""Semantic checks of a spec, and the logical graph they produce.

Owns everything about a spec's meaning that the XML Schema cannot see: unknown or duplicate
names, operator kinds and their parameters, streams with no producer or two, cycles, types that
do not agree, expressions that do not parse or type-check, windows without a time column, a
control sink fed anything but a control stream. All problems are collected with their positions
and reported together; a spec with none becomes a logical `Graph` whose every stream has a known
schema.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Union

from common import kafka_params as kp
from common import kept, keyed_aggregates, side_table, time_partitions, top_n
from common.diagnostics import (MAX_SHOWN, Diagnostic, Position, Severity, SpecError,
                                 cap_diagnostics, suggest)
from common.operator_schemas import (AGGREGATE_FUNCTIONS, BY_FUNCTIONS, aggregate_type,
                                     control_schema_problems, join_output_names)
from common.paths import PathRefused, PathRoots, confine
from common.safe_open import kind_of
from common.tasks import PLANNED_GRID_MS
from common.types import ColumnType, Field, Schema
from compiler import expr as ex
from compiler import realtime
from compiler.expr import pattern as ex_pattern
from compiler.graph import Graph, Node, Stream
from compiler.guards import GUARDS
from compiler.operators import (CATALOGUE, MAX_PATTERN_OPERATORS, PLUMBING, SHAPE_COLUMNS,
                                OperatorDef, ParamValueError, canonical_duration, parse_duration_ms,
                                parse_value, updates)
from compiler.spec import AggregateDecl, OperatorDecl, ParamDecl, PatternAttr, Spec

WINDOW_COLUMNS = ("window_start", "window_end")

# A hint, or how to make it: a suggestion over every name of a large spec costs time in the
# number of names, so it is only made for a diagnostic that will be shown.
Hint = Union[str, Callable[[], str]]


@dataclass
class _Checker:
    """Collects diagnostics while resolving a spec; one instance per run. Past MAX_SHOWN errors
    (or warnings) it only counts them, so checking stays linear in the size of the spec."""

    spec: Spec
    problems: list[Diagnostic] = field(default_factory=list)
    types: dict[str, Schema] = field(default_factory=dict)
    producers: dict[str, OperatorDecl] = field(default_factory=dict)
    readers: dict[str, list[str]] = field(default_factory=dict)  # stream -> operators reading it
    schemas: dict[str, Schema] = field(default_factory=dict)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    # stream -> its event-time columns, for streams downstream of a window or join (whose
    # watermark they carry); a stream not in it has no event time yet (docs/spec-language.md)
    event_times: dict[str, frozenset[str]] = field(default_factory=dict)
    patterns: dict[str, tuple[tuple[str, Any], ...]] = field(default_factory=dict)
    # operator -> (cpus, mem MB) its spec asks for (None: the task's default)
    resources: dict[str, tuple[float | None, int | None]] = field(default_factory=dict)
    # operator -> its DPC max-delay in ms (docs/availability.md)
    max_delays: dict[str, int] = field(default_factory=dict)
    # the largest task an agent can ever hold (cpus, MB), when the cluster is known here
    room: AgentRoom | None = None
    counted: dict[str, int] = field(default_factory=lambda: {"error": 0, "warning": 0})
    unshown: list[Diagnostic] = field(default_factory=list)  # past the cap, without hints

    def error(self, pos: Position, message: str, hint: Hint = "") -> None:
        self._add(pos, message, hint, "error")

    def warn(self, pos: Position, message: str, hint: Hint = "") -> None:
        self._add(pos, message, hint, "warning")

    def _add(self, pos: Position, message: str, hint: Hint, severity: Severity) -> None:
        self.counted[severity] += 1
        if self.counted[severity] > MAX_SHOWN:
            self.unshown.append(Diagnostic(pos, message, "", severity))
            return
        text = hint() if callable(hint) else hint
        self.problems.append(Diagnostic(pos, message, text, severity))


def check(spec: Spec, capped: bool = True,
          room: AgentRoom | None = None) -> tuple[Graph | None, list[Diagnostic]]:
    """Check a spec; return its logical graph (None if there were errors) and every diagnostic
    (errors and warnings): at most MAX_SHOWN of each and a last one saying how many more, unless
    not `capped` (a caller that adds its own diagnostics caps them all). `room`: the most one
    task may ask on the cluster it will run on, when that is known (`elastiq run`), so that a
    `cpus=`/`mem=` no agent can hold is refused here."""
    c = _Checker(spec, room=room)
    _check_types(c)
    kinds = _check_operators(c)
    for op in spec.operators:
        _check_resources(c, op)
    order = _check_streams(c, kinds)
    if order is not None:
        for op in order:
            _resolve(c, op, kinds[op.name])
        _check_clocks(c, order)
        _updating_readers(c, order)
        for op in order:
            _check_patterns(c, op, kinds[op.name])
        _check_pattern_count(c, order)
        _check_max_delays(c, order)
    if not any(d.role == "sink" for d in kinds.values()) and not any(
            o.publish for op in spec.operators for o in op.outputs):
        c.error(spec.pos, "the dataflow has no sink, so its results would go nowhere",
                "add a file-sink, console-sink, network-sink, kafka-sink, control-sink or "
                "discard-sink operator, or "
                'publish a stream (<output name="..." publish="true"/>)')
    graph = None
    if not c.counted["error"] and order is not None:
        graph = _graph(c, _live(c, order, kinds), kinds)
        _check_marked_sources(c, graph)
    problems = c.problems + c.unshown
    problems = cap_diagnostics(problems) if capped else problems
    if c.counted["error"] or graph is None:
        return None, problems
    return graph, problems


def check_or_raise(spec: Spec) -> Graph:
    graph, problems = check(spec)
    if graph is None:
        raise SpecError(problems)
    return graph


# ----------------------------------------------------------------------------------------------
# Names: types, operators, parameters

def _check_types(c: _Checker) -> None:
    seen: dict[str, Position] = {}
    for t in c.spec.types:
        if t.name in seen:
            c.error(t.pos, f"type '{t.name}' is declared twice (first at {seen[t.name]})",
                    "rename or remove one of them")
            continue
        seen[t.name] = t.pos
        if not t.columns:
            c.error(t.pos, f"type '{t.name}' has no columns",
                    'add <column name="..." type="..."/> to it, or remove it')
            continue
        fields: list[Field] = []
        names: set[str] = set()
        folded: dict[str, str] = {}
        for col in t.columns:
            if col.name in names:
                c.error(col.pos, f"column '{col.name}' appears twice in type '{t.name}'",
                        "column names must be unique within a type")
                continue
            if _folded(col.name) in folded:
                _case_clash(c, col.pos, "column", col.name, folded[_folded(col.name)])
                continue
            names.add(col.name)
            folded[_folded(col.name)] = col.name
            if col.type_name not in ColumnType.names():
                c.error(col.type_pos, f"unknown column type '{col.type_name}'",
                        suggest(col.type_name, ColumnType.names(), "column types"))
                continue
            fields.append(Field(col.name, ColumnType(col.type_name)))
        if len(fields) == len(t.columns):
            c.types[t.name] = Schema(tuple(fields))


def _check_operators(c: _Checker) -> dict[str, OperatorDef]:
    kinds: dict[str, OperatorDef] = {}
    seen: dict[str, Position] = {}
    folded: dict[str, str] = {}
    for op in c.spec.operators:
        if op.name in seen:
            c.error(op.pos, f"operator '{op.name}' is declared twice (first at {seen[op.name]})",
                    "operator names must be unique")
            continue
        if _folded(op.name) in folded:
            _case_clash(c, op.pos, "operator", op.name, folded[_folded(op.name)])
            continue
        seen[op.name] = op.pos
        folded[_folded(op.name)] = op.name
        definition = CATALOGUE.get(op.kind)
        if op.kind in PLUMBING:
            c.error(op.kind_pos, f"'{op.kind}' is a plumbing operator that the rewrite rules "
                                 "insert; it cannot be written in a spec",
                    "ask for a pattern instead, e.g. ha=\"hot-standby\" (docs/patterns.md)")
            continue
        if definition is None:
            c.error(op.kind_pos, f"unknown operator type '{op.kind}'",
                    suggest(op.kind, CATALOGUE, "operator types"))
            continue
        kinds[op.name] = definition
        _check_arity(c, op, definition)
        _check_children(c, op, definition)
        c.params[op.name] = _check_params(c, op, definition)
    return kinds


def _check_arity(c: _Checker, op: OperatorDecl, d: OperatorDef) -> None:
    for ports, (lo, hi), what in ((op.inputs, d.inputs, "input"), (op.outputs, d.outputs, "output")):
        n = len(ports)
        if lo <= n <= hi:
            continue
        want = f"exactly {lo}" if lo == hi else f"{lo} to {hi}"
        plural = "s" if hi != 1 else ""
        hint = (f"remove the <{what}> elements" if hi == 0 else
                f'add <{what} name="..."/>' if n < lo else f"remove {n - hi} <{what}> element(s)")
        c.error(op.pos, f"{op.kind} operator '{op.name}' has {n} {what}{'s' if n != 1 else ''}; "
                        f"it takes {want} {what}{plural}", hint)


def _check_children(c: _Checker, op: OperatorDecl, d: OperatorDef) -> None:
    owners = {"field": "project and pattern", "aggregate": "window-aggregate",
              "define": "pattern"}
    for tag, items in (("field", op.fields), ("aggregate", op.aggregates),
                       ("define", op.defines)):
        if items and tag not in d.children:
            c.error(items[0].pos, f"<{tag}> is not used by a {op.kind} operator",
                    f"remove it; <{tag}> belongs to {owners[tag]} operators")


def _check_params(c: _Checker, op: OperatorDecl, d: OperatorDef) -> dict[str, Any]:
    values: dict[str, Any] = {}
    seen: set[str] = set()
    for p in op.params:
        definition = d.param(p.name)
        if definition is None:
            c.error(p.pos, f"{op.kind} operator '{op.name}' has no parameter '{p.name}'",
                    suggest(p.name, d.param_names, "its parameters") if d.params
                    else f"{op.kind} takes no parameters")
            continue
        if p.name in seen:
            c.error(p.pos, f"parameter '{p.name}' is given twice", "keep one of them")
            continue
        seen.add(p.name)
        try:
            values[p.name] = parse_value(definition, p.value)
        except ParamValueError as e:
            c.error(p.value_pos(), f"parameter '{p.name}' of '{op.name}': {e}", definition.doc)
    for definition in d.params:
        if definition.name in seen:
            continue
        if definition.required:
            c.error(op.pos, f"{op.kind} operator '{op.name}' needs the parameter "
                            f"'{definition.name}' ({definition.doc})",
                    f'add <param name="{definition.name}" value="..."/>')
        elif definition.default is not None:
            values[definition.name] = parse_value(definition, definition.default)
    if op.kind == "window-aggregate" and "time" not in seen and \
            values.get("clock") != "processing":
        c.error(op.pos, f"window-aggregate operator '{op.name}' needs the parameter 'time' "
                        "(the event-time column)", '<param name="time" value="..."/>, or '
                        '<param name="clock" value="processing"/> for processing time')
    return values


# ----------------------------------------------------------------------------------------------
# Streams: one producer each, known consumers, no cycles

def _check_streams(c: _Checker, kinds: dict[str, OperatorDef]) -> list[OperatorDecl] | None:
    ops = [op for op in c.spec.operators if op.name in kinds]
    folded: dict[str, str] = {}
    for op in ops:
        for out in op.outputs:
            first = c.producers.get(out.name)
            if first is not None:
                c.error(out.pos, f"stream '{out.name}' is produced by both '{first.name}' and "
                                 f"'{op.name}'", "give each output its own stream name")
            else:
                if _folded(out.name) in folded:  # refused, but kept so its readers resolve
                    _case_clash(c, out.pos, "stream", out.name, folded[_folded(out.name)])
                c.producers[out.name] = op
                folded.setdefault(_folded(out.name), out.name)
    consumed: set[str] = set()
    for op in ops:
        for port in op.inputs:
            consumed.add(port.name)
            c.readers.setdefault(port.name, []).append(op.name)
            if port.name not in c.producers:
                c.error(port.pos, f"operator '{op.name}' reads stream '{port.name}', which no "
                                  "operator produces",
                        partial(suggest, port.name, c.producers, "streams produced"))
    for name, op in c.producers.items():
        out = next(o for o in op.outputs if o.name == name)
        if name not in consumed and kinds[op.name].role != "sink" and not out.publish:
            c.warn(out.pos, f"stream '{name}' of '{op.name}' is never read, so '{op.name}' is "
                            "left out of the plan (with any operator that only feeds it)",
                   "connect it to an operator or a sink, or remove it")
    return _topological(c, ops)


def _folded(name: str) -> str:
    return name.casefold()


def _case_clash(c: _Checker, pos: Position, what: str, name: str, other: str) -> None:
    """Names that differ only in case would meet in Spark (which resolves names regardless of
    case), in the generated programs and on case-insensitive file systems."""
    c.error(pos, f"{what} '{name}' differs from {what} '{other}' only in case",
            f"{what} names must differ in more than case; rename one of them")


def _topological(c: _Checker, ops: list[OperatorDecl]) -> list[OperatorDecl] | None:
    """The operators, each after those it reads (depth-first, without recursion, so a chain of
    any length is fine); None after reporting each cycle found."""
    by_name = {op.name: op for op in ops}
    upstream = {op.name: [c.producers[p.name].name for p in op.inputs if p.name in c.producers]
                for op in ops}
    order: list[OperatorDecl] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    ok = True
    for op in ops:
        ok = _visit(c, op.name, upstream, by_name, state, order) and ok
    return order if ok else None


def _visit(c: _Checker, start: str, upstream: dict[str, list[str]],
           by_name: dict[str, OperatorDecl], state: dict[str, int],
           order: list[OperatorDecl]) -> bool:
    """Post-order from `start` with an explicit stack. On a cycle, report it and finish every
    operator on the current path without visiting the rest of its inputs."""
    if state.get(start) == 2:
        return True
    path: list[str] = [start]
    pending = [iter(upstream[start])]
    state[start] = 1
    while path:
        up = next(pending[-1], None)
        if up is None:
            state[path[-1]] = 2
            order.append(by_name[path.pop()])
            pending.pop()
        elif state.get(up) == 1:
            cycle = path[path.index(up):] + [up]
            c.error(by_name[up].pos, "the dataflow has a cycle: " + " -> ".join(cycle),
                    "dataflows must be acyclic; break the loop (a query can feed another "
                    "query through a network-sink and network-source)")
            for name in reversed(path):
                state[name] = 2
                order.append(by_name[name])
            return False
        elif state.get(up) != 2:
            state[up] = 1
            path.append(up)
            pending.append(iter(upstream[up]))
    return True


# ----------------------------------------------------------------------------------------------
# Schemas and parameters per operator kind

def _resolve(c: _Checker, op: OperatorDecl, d: OperatorDef) -> None:
    inputs = [c.schemas.get(p.name) for p in op.inputs]
    if any(s is None for s in inputs):
        return  # an upstream problem was already reported
    if not (d.inputs[0] <= len(inputs) <= d.inputs[1] and len(op.outputs) <= d.outputs[1]):
        return  # the arity problem was already reported
    if not _carries_kept(c, op, d, [s for s in inputs if s is not None]):
        return
    resolver = _RESOLVERS.get(op.kind)
    computed = resolver(c, op, [s for s in inputs if s is not None]) if resolver else None
    if not op.outputs:
        return
    out = op.outputs[0]
    declared = None
    if out.type_name is not None:
        declared = c.types.get(out.type_name)
        if declared is None:
            if out.type_name not in {t.name for t in c.spec.types}:
                c.error(out.pos, f"unknown stream type '{out.type_name}'",
                        partial(suggest, out.type_name, c.types, "declared types"))
            return
    if computed is None and declared is None:
        if d.output_type == "declared":
            c.error(out.pos, f"the output of {op.kind} '{op.name}' needs a type",
                    f'write <output name="{out.name}" type="..."/> with a declared <type>')
        return
    if computed is not None and declared is not None and kept.carries(computed) \
            and not kept.clashes(declared.names) and kept.without_kept(computed) == declared:
        declared = computed  # a declared type reads as itself with the shed columns (kept)
    if computed is not None and declared is not None and computed != declared:
        c.error(out.pos, f"output '{out.name}' is declared as type '{out.type_name}' "
                         f"({_describe(declared)}) but {op.kind} '{op.name}' produces "
                         f"({_describe(computed)})",
                "change the declared type or leave out type= to use what the operator produces")
        return
    schema = declared if declared is not None else computed
    assert schema is not None  # both None returned above
    c.schemas[out.name] = schema
    _check_shed(c, op, out.name, schema)
    if op.param("shed") is not None:
        c.schemas[out.name] = _shed_output(c, op, schema)
    times = _event_times_out(c, op)
    if times is not None:
        c.event_times[out.name] = times


def _check_shed(c: _Checker, op: OperatorDecl, stream: str, schema: Schema) -> None:
    """A source's shedding request (docs/load.md): `shed-keep`, a boolean expression over the
    source's output, is needed by `shed="semantic"` and only makes sense with it, as does
    `shed-utility`."""
    mode, keep, utility = op.param("shed"), op.param("shed-keep"), op.param("shed-utility")
    if keep is not None:
        try:
            ex.compile_condition(keep.value, ex.Scope({stream: schema}))
        except ex.NotBoolean as e:
            c.error(keep.value_pos(), f"shed-keep of '{op.name}' is of type {e.type.value}, "
                                      "not boolean", f"write a comparison such as {stream}.x > 0")
        except ex.ExpressionError as e:
            _report(c, op, keep, "shed-keep", e)
    semantic = mode is not None and mode.value.strip() == "semantic"
    if semantic and keep is None:
        c.error(mode.value_pos() if mode else op.pos,
                f"shed=\"semantic\" of '{op.name}' needs shed-keep, the rows worth keeping",
                '<param name="shed-keep" value="..."/>, or shed="random"')
    for extra in (keep, utility):
        if extra is not None and not semantic:
            c.error(extra.pos, f"{extra.name} of '{op.name}' applies to semantic shedding only",
                    '<param name="shed" value="semantic"/>, or remove it')


def _shed_output(c: _Checker, op: OperatorDecl, schema: Schema) -> Schema:
    """A shed source's stream as its readers see it: the drop the shedding rule puts after it
    adds `kept`, each row's keep share (common/kept.py); a source whose own rows have a column
    of that name (or `lost_input`) is refused."""
    clash = kept.clashes(schema.names)
    if clash:
        shed = op.param("shed")
        assert shed is not None
        c.error(shed.pos, f"'{op.name}' is shed but its output has column(s) {clash}, reserved "
                          "for the share of input a shed stream's rows reflect",
                "rename the column (docs/load.md, \"What a sink's rows say about shedding\")")
        return schema
    return kept.with_kept(schema)


# Operators that cannot carry a shed stream's `kept` to their output (docs/load.md): a row of
# theirs is made of several input rows whose shares no rule combines here yet.
_NOT_CARRYING_KEPT = {"join": "a join", "pattern": "a pattern", "top-n": "a top-n",
                      "aggregate": "an updating aggregate", "control-sink": "a control-sink"}


def _carries_kept(c: _Checker, op: OperatorDecl, d: OperatorDef, inputs: list[Schema]) -> bool:
    """False (with a located error) when `op` reads a shed stream (one with `kept`) but cannot
    carry its share to its output: rather refused than dropped silently. A union needs every
    input shed or none, so that each of its rows has a share."""
    shed = [port for port, schema in zip(op.inputs, inputs) if kept.carries(schema)]
    if not shed:
        return True
    what = _NOT_CARRYING_KEPT.get(op.kind)
    if what is None and op.kind == "window-aggregate" and op.param("rows") is not None:
        what = "a count window"
    if what is not None:
        c.error(shed[0].pos, f"{op.kind} '{op.name}' reads stream '{shed[0].name}', which is "
                             f"shed, but {what} cannot carry the share of input its rows "
                             f"reflect (column {kept.KEPT}): not built",
                "shed a source that does not feed it, or read the stream before shedding "
                "(docs/load.md, \"What a sink's rows say about shedding\")")
        return False
    if len(shed) != len(inputs):
        plain = next(port for port, schema in zip(op.inputs, inputs) if not kept.carries(schema))
        c.error(plain.pos, f"{op.kind} '{op.name}' reads shed stream '{shed[0].name}' and "
                           f"unshed stream '{plain.name}': its rows would not all have a share "
                           f"of input (column {kept.KEPT})",
                "shed every source that feeds it, or none")
        return False
    return True


def _describe(schema: Schema) -> str:
    return ", ".join(f"{f.name} {f.type.value}" for f in schema)


def _scope(op: OperatorDecl, inputs: list[Schema]) -> ex.Scope:
    return ex.Scope({port.name: schema for port, schema in zip(op.inputs, inputs)})


def _expression(c: _Checker, op: OperatorDecl, p: ParamDecl, scope: ex.Scope,
                what: str) -> ex.TypedExpr | None:
    try:
        return ex.compile_expression(p.value, scope)
    except ex.ExpressionError as e:
        _report(c, op, p, what, e)
        return None


def _report(c: _Checker, op: OperatorDecl, p: ParamDecl, what: str,
            e: ex.ExpressionError) -> None:
    for problem in e.problems:
        c.error(p.value_pos(problem.offset), f"{what} of '{op.name}': {problem.message}",
                problem.hint)


def _generator(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    shape = c.params[op.name].get("shape")
    return Schema.of(*SHAPE_COLUMNS[shape]) if shape in SHAPE_COLUMNS else None


def _filter(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    p = op.param("condition")
    if p is not None:
        try:
            ex.compile_condition(p.value, _scope(op, inputs))
        except ex.NotBoolean as e:
            c.error(p.value_pos(), f"the condition of '{op.name}' is of type {e.type.value}, "
                                   "not boolean", "write a comparison such as raw.temp > 30")
        except ex.ExpressionError as e:
            _report(c, op, p, "condition", e)
    return inputs[0]


def _project(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    if not op.fields:
        c.error(op.pos, f"project operator '{op.name}' has no <field>",
                'add <field name="out" value="expression"/> for each output column')
        return None
    fields: list[Field] = []
    seen: set[str] = set()
    folded: dict[str, str] = {}
    ok = True
    for f in op.fields:
        if f.name in seen:
            c.error(f.pos, f"field '{f.name}' appears twice in '{op.name}'",
                    "output column names must be unique")
            ok = False
            continue
        if _folded(f.name) in folded:
            _case_clash(c, f.pos, "column", f.name, folded[_folded(f.name)])
            ok = False
            continue
        seen.add(f.name)
        folded[_folded(f.name)] = f.name
        if kept.carries(inputs[0]) and kept.clashes([f.name]):
            c.error(f.pos, f"field '{f.name}' of '{op.name}': the name is reserved for the "
                           f"share of input its rows reflect, which it carries (its input is "
                           "shed)", "choose another name")
            ok = False
            continue
        typed = _expression(c, op, f, _scope(op, inputs), f"field '{f.name}'")
        if typed is None:
            ok = False
        else:
            fields.append(Field(f.name, typed.type))
    if ok and kept.carries(inputs[0]):  # a shed row's share follows it (common/kept.py)
        fields.append(Field(kept.KEPT, ColumnType.DOUBLE))
    return Schema(tuple(fields)) if ok else None


def _written(op: OperatorDecl, name: str) -> ParamDecl:
    """The parameter `name` of `op`, which the caller knows was written (its value was read)."""
    found = op.param(name)
    assert found is not None, f"'{op.name}' has no parameter '{name}'"
    return found


def _column_of(c: _Checker, op: OperatorDecl, schema: Schema, param: str, stream: str,
               want: ColumnType | None = None) -> Field | None:
    p = op.param(param)
    name = c.params[op.name].get(param)
    if p is None or name is None:
        return None
    found = schema.get(name)
    if found is None:
        c.error(p.value_pos(), f"parameter '{param}' of '{op.name}' names column '{name}', "
                               f"which stream '{stream}' does not have",
                lambda: suggest(name, schema.names, "its columns"))
        return None
    if want is not None and found.type is not want:
        c.error(p.value_pos(), f"column '{name}' of stream '{stream}' is {found.type.value}, "
                               f"but '{param}' needs a {want.value} column",
                "name an event-time column of type timestamp")
        return None
    return found


def _window(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    schema, stream, values = inputs[0], op.inputs[0].name, c.params[op.name]
    if op.param("rows") is not None:
        return _count_window(c, op, schema, stream)
    size, slide = values.get("size"), values.get("slide")
    if values.get("clock") == "processing":
        ok = _processing_window(c, op, stream)
    else:
        time = _column_of(c, op, schema, "time", stream, ColumnType.TIMESTAMP)
        ok = time is not None and _is_event_time(c, op, stream, time.name, "time")
    ok = _window_kind(c, op, values) and ok
    ok = _size_and_slide(c, op, size, slide) and ok
    groups = _group_columns(c, op, schema, stream)
    shed = kept.carries(schema)
    taken = {_folded(n) for n in (*WINDOW_COLUMNS, *(kept.RESERVED if shed else ()))} \
        | {_folded(g.name) for g in groups or ()}
    aggregates = _aggregates(c, op, schema, stream, groups, taken=taken)
    if not ok or groups is None or aggregates is None:
        return None
    if any(g.name in kept.RESERVED for g in groups):
        c.error(_written(op, "group-by").value_pos(), f"'{op.name}' groups by a shed stream's "
                f"{kept.KEPT}: its results carry the share of input they reflect instead",
                "group by the stream's own columns")
        return None
    return Schema(tuple([Field(n, ColumnType.TIMESTAMP) for n in WINDOW_COLUMNS] + groups
                        + aggregates + list(kept.aggregate_fields() if shed else ())))


def _count_window(c: _Checker, op: OperatorDecl, schema: Schema, stream: str) -> Schema | None:
    """A count window (`rows`): an event-time column, no size, slide, gap or clock, an input
    without event time yet, aggregates among `keyed_aggregates.ROW_FUNCTIONS`; its output is a
    window's (window_start, window_end, groups, aggregates)."""
    ok = True
    for name in ("size", "slide", "gap", "clock"):
        written = op.param(name)
        if written is not None:
            c.error(written.value_pos(), f"a count window (rows) has no {name}",
                    f"remove {name}, or remove rows for a window of time")
            ok = False
    time = _column_of(c, op, schema, "time", stream, ColumnType.TIMESTAMP)
    ok = _keyed_input(c, op, stream) and time is not None and ok
    groups = _group_columns(c, op, schema, stream)
    aggregates = _aggregates(c, op, schema, stream, groups, keyed_aggregates.ROW_FUNCTIONS)
    if not ok or groups is None or aggregates is None:
        return None
    return Schema(tuple([Field(n, ColumnType.TIMESTAMP) for n in WINDOW_COLUMNS] + groups
                        + aggregates))


def _keyed_input(c: _Checker, op: OperatorDecl, stream: str) -> bool:
    """A count window, updating aggregate or updating top-n reads a stream without event time
    yet: Spark runs no such operator (applyInPandasWithState) after an aggregation, and a
    second watermark on a window's or join's output would hold the query's one watermark
    back."""
    if c.event_times.get(stream) is None:
        return True
    c.error(op.inputs[0].pos, f"{op.kind} '{op.name}' cannot read stream '{stream}', which "
                              "comes after a window, top-n, join or deduplicate of this dataflow",
            "publish the stream and read it with a stream-source in another dataflow "
            "(Spark keeps per-key Python state only before any aggregation of a query)")
    return False


def _updating(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    """An updating aggregate: an event-time column, a ttl above zero, an input without event
    time yet, aggregates among `keyed_aggregates.ROW_FUNCTIONS`; its output is the group
    columns and the aggregates, read only by a file or console sink (`_updating_readers`)."""
    schema, stream, values = inputs[0], op.inputs[0].name, c.params[op.name]
    time = _column_of(c, op, schema, "time", stream, ColumnType.TIMESTAMP)
    ok = _keyed_input(c, op, stream) and time is not None
    if values.get("ttl", 1) <= 0:
        c.error(_written(op, "ttl").value_pos(), "a ttl must be above zero",
                "how long a group's state outlives its last tuple, e.g. 1 hour")
        ok = False
    groups = _group_columns(c, op, schema, stream)
    taken = {_folded(g.name) for g in groups or ()}
    aggregates = _aggregates(c, op, schema, stream, groups, keyed_aggregates.ROW_FUNCTIONS, taken)
    if not ok or groups is None or aggregates is None:
        return None
    return Schema(tuple(groups + aggregates))


UPSERT_READERS = ("file-sink", "console-sink", "discard-sink")


def _updating_readers(c: _Checker, order: list[OperatorDecl]) -> None:
    """An updating aggregate's or top-n's results are upsert records: only a file sink (which
    keeps them as an upsert log), a console or a discard sink may read them; any other reader
    is refused at its <input>, and so is a published output."""
    for op in order:
        for p in op.inputs:
            producer = c.producers.get(p.name)
            if producer is not None and updates(producer.kind, producer.param) \
                    and op.kind not in UPSERT_READERS:
                c.error(p.pos, f"{op.kind} '{op.name}' cannot read '{p.name}', the updating "
                               f"results of {producer.kind} '{producer.name}'",
                        f"an updating {producer.kind}'s results go to a file-sink (an upsert "
                        "log), a console-sink or a discard-sink")
        if updates(op.kind, op.param):
            for out in op.outputs:
                if out.publish:
                    c.error(out.pos, f"{op.kind} '{op.name}' cannot publish '{out.name}': its "
                                     "results are updates, which a reader would take as rows",
                            "write them to a file-sink, an upsert log")


def _processing_window(c: _Checker, op: OperatorDecl, stream: str) -> bool:
    """A processing-time window takes its time from the clock (each micro-batch's timestamp):
    it names no `time` column and has no `watermark` (nothing arrives late by its own clock),
    no `gap`, and its input has no event time yet (a second watermark on another clock would
    hold Spark's one watermark of the query, the least, back); each problem at its value."""
    ok = True
    for name, why in (("time", "it takes the time each micro-batch is processed"),
                      ("watermark", "nothing is late by the clock it reads"),
                      ("gap", "session windows are over event time only")):
        written = op.param(name)
        if written is not None:
            c.error(written.value_pos(), f"a processing-time window has no {name}: {why}",
                    f'remove {name}, or leave out clock="processing" for event time')
            ok = False
    times = c.event_times.get(stream)
    if times is not None:
        c.error(_written(op, "clock").value_pos(),
                f"a processing-time window cannot read stream '{stream}', which has event time "
                "(it comes after a window or join): a query has one watermark",
                "window over its event time (window_end), or put the processing-time window "
                "before the event-time operators")
        ok = False
    return ok


# The operators that put a watermark on their input's event time when it has none yet.
_WATERMARKING = ("window-aggregate", "top-n", "deduplicate", "join", "pattern", "aggregate")


def _check_clocks(c: _Checker, order: list[OperatorDecl]) -> None:
    """A processing-time window and an operator that puts a watermark on event time cannot
    share a dataflow: Spark keeps one watermark per query, the least of its operators', and
    processing time (now) and event time (a generator's 2024) are different clocks, so one
    side's windows would never close (or the other's rows would all be late)."""
    processing = [op for op in order if op.kind == "window-aggregate"
                  and c.params.get(op.name, {}).get("clock") == "processing"]
    event = [op for op in order if op.kind in _WATERMARKING and op not in processing
             and all(c.event_times.get(p.name) is None for p in op.inputs)]
    if processing and event:
        op = processing[0]
        c.error(_written(op, "clock").value_pos(),
                f"processing-time window '{op.name}' cannot share a dataflow with event-time "
                f"{event[0].kind} '{event[0].name}': a query has one watermark, the least of "
                "its operators', and the two clocks differ",
                "put them in separate dataflows (one may publish its stream for the other)")


def _size_and_slide(c: _Checker, op: OperatorDecl, size: int | None, slide: int | None) -> bool:
    """A window's size is above zero and its slide within (0, size], with at most
    MAX_WINDOWS_PER_ROW windows per row; each problem at its value."""
    ok = True
    if size is not None and size <= 0:
        c.error(_written(op, "size").value_pos(), "a window size must be above zero",
                "e.g. 10 seconds")
        ok = False
    if slide is not None and size is not None and not 0 < slide <= size:
        c.error(_written(op, "slide").value_pos(),
                f"the slide ({canonical_duration(slide)}) must be above zero and at most the "
                f"window size ({canonical_duration(size)})", "leave out slide for a tumbling window")
        ok = False
    elif slide is not None and size is not None and \
            windows_per_row(size, slide) > MAX_WINDOWS_PER_ROW:
        _too_many_windows(c, op, size, slide)
        ok = False
    return ok


def _top_n(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    """The first n rows per window and group in `order-by`'s order: a window's checks (or,
    with `ttl` instead of a window, the updating ranking's, `_ranking_bound`), the order's
    columns (orderable ones of the input), and no input column named like an output column of
    its own (window_start, window_end, rank; only rank for the updating ranking)."""
    schema, stream, values = inputs[0], op.inputs[0].name, c.params[op.name]
    updating = op.param("ttl") is not None
    time = _column_of(c, op, schema, "time", stream, ColumnType.TIMESTAMP)
    ok = time is not None and _is_event_time(c, op, stream, time.name, "time")
    if updating:
        ok = _ranking_bound(c, op, stream, values) and ok
    else:
        ok = _top_n_window(c, op, values) and ok
    groups = _group_columns(c, op, schema, stream)
    ok = _order_by(c, op, schema, stream) and ok
    own = "rank" if updating else "window_start, window_end and rank"
    for name in top_n.reserved_clashes(schema, updating):
        c.error(op.inputs[0].pos, f"top-n '{op.name}' would produce column '{name}' twice: "
                                  f"its output has {own} of its own",
                "rename that column with a project operator before the top-n")
        ok = False
    if not ok or groups is None:
        return None
    return top_n.output_schema(schema, tuple(g.name for g in groups), updating)


def _top_n_window(c: _Checker, op: OperatorDecl, values: dict[str, Any]) -> bool:
    """A windowed top-n has a size (or, instead, a ttl: the updating ranking)."""
    if op.param("size") is None:
        c.error(op.pos, f"top-n '{op.name}' needs a size (a ranking per window) or a ttl (an "
                        "updating ranking over the whole stream)",
                '<param name="size" value="10 seconds"/> or <param name="ttl" value="1 hours"/>')
        return False
    return _size_and_slide(c, op, values.get("size"), values.get("slide"))


def _ranking_bound(c: _Checker, op: OperatorDecl, stream: str, values: dict[str, Any]) -> bool:
    """The updating ranking (`ttl`): no size or slide, a ttl above zero, an input without
    event time yet (`_keyed_input`, as the updating aggregate's)."""
    ok = True
    for name in ("size", "slide"):
        written = op.param(name)
        if written is not None:
            c.error(written.value_pos(), f"an updating top-n (ttl) has no {name}",
                    f"remove {name} to rank over the whole stream, or ttl to rank per window")
            ok = False
    if values.get("ttl", 1) <= 0:
        c.error(_written(op, "ttl").value_pos(), "a ttl must be above zero",
                "how long a group's state outlives its last tuple, e.g. 1 hour")
        ok = False
    return _keyed_input(c, op, stream) and ok


def _order_by(c: _Checker, op: OperatorDecl, schema: Schema, stream: str) -> bool:
    text = c.params[op.name].get("order-by")
    if text is None:
        return False  # missing: reported as a required parameter
    where = _written(op, "order-by").value_pos()
    keys, problems = top_n.parse_order(str(text))
    for problem in problems:
        c.error(where, f"order-by of '{op.name}': {problem}",
                "e.g. 'price desc, date_time' (asc is the default)")
    for key in keys:
        found = schema.get(key.column)
        if found is None:
            c.error(where, f"order-by of '{op.name}' names column '{key.column}', which stream "
                           f"'{stream}' does not have",
                    partial(suggest, key.column, schema.names, "its columns"))
            problems.append(key.column)
        elif not found.type.is_orderable:
            c.error(where, f"order-by of '{op.name}': column '{key.column}' is "
                           f"{found.type.value}, which has no order",
                    "order by a number, string or timestamp column")
            problems.append(key.column)
    return not problems


def _window_kind(c: _Checker, op: OperatorDecl, values: dict[str, Any]) -> bool:
    """A window has a `size` (tumbling, or sliding with `slide`) or a `gap` (sessions), not
    both, and a session has no slide; each problem reported at the value that is wrong."""
    if op.param("gap") is None:
        if op.param("size") is not None:
            return True
        c.error(op.pos, f"window-aggregate '{op.name}' needs a size or a gap",
                '<param name="size" value="10 seconds"/> for tumbling or sliding windows, '
                '<param name="gap" value="30 seconds"/> for session windows')
        return False
    ok = True
    if op.param("size") is not None:
        c.error(_written(op, "gap").value_pos(), "a window has a size or a gap, not both",
                "gap makes session windows, size tumbling or sliding ones: remove one")
        ok = False
    if op.param("slide") is not None:
        c.error(_written(op, "slide").value_pos(), "a session window (gap) has no slide",
                "remove slide, or use size for a sliding window")
        ok = False
    if values.get("gap", 1) <= 0:
        c.error(_written(op, "gap").value_pos(), "a session gap must be above zero",
                "e.g. 30 seconds")
        ok = False
    return ok


# A sliding window puts each row in ceil(size / slide) windows: Spark's window() expands every
# row into that many rows (one projection each in the generated plan) before aggregating, and a
# partitioned window's splitter sends a row to each instance owning one of them. The cost is
# linear in it (measured on Spark 4.1, local[1], a shared machine: 2,000 rows took 0.8 s at 1
# window per row, 5 s at 100, 27 s at 1,000 with a 5.3 MiB task binary, 54 s at 3,000 with
# 11 MiB), so 1,000 still runs, slowly, while 3e10 (8760 hours sliding by 1 ms) never started.
MAX_WINDOWS_PER_ROW = 1_000


def windows_per_row(size_ms: int, slide_ms: int) -> int:
    """How many windows of `size_ms` sliding by `slide_ms` each row falls in (pure)."""
    return -(-size_ms // slide_ms)


def _too_many_windows(c: _Checker, op: OperatorDecl, size: int, slide: int) -> None:
    least = -(-size // MAX_WINDOWS_PER_ROW)
    c.error(_written(op, "slide").value_pos(),
            f"a {canonical_duration(size)} window sliding by {canonical_duration(slide)} puts "
            f"each row in {windows_per_row(size, slide):,} windows, more than the "
            f"{MAX_WINDOWS_PER_ROW:,} a window may (Spark copies each row once per window)",
            f"slide by at least {canonical_duration(least)}, or make the window shorter")


def _is_event_time(c: _Checker, op: OperatorDecl, stream: str, column: str | None,
                   param: str) -> bool:
    """A stream downstream of a window or join has event time already: the time column of an
    operator reading it must be one of its event-time columns (a window's `window_end`), which
    carry the upstream watermark; another column would need a second watermark, which Spark's
    min policy would hold at zero, so nothing would ever come out."""
    times = c.event_times.get(stream)
    if column is None or times is None or column in times:
        return True
    where = op.param(param)
    have = ", ".join(sorted(times)) or ("none (a project dropped them, or it comes from a "
                                        "count window or updating aggregate, whose rows come "
                                        "behind the watermark)")
    c.error(where.value_pos() if where is not None else op.pos,
            f"'{column}' is not an event-time column of stream '{stream}', which comes after a "
            f"window or join: its event-time columns are {have}",
            "a window's results carry event time window_end: use time=\"window_end\"")
    return False


def _event_times_out(c: _Checker, op: OperatorDecl) -> frozenset[str] | None:
    """The event-time columns of `op`'s output, or None while no window or join is upstream."""
    ins = [c.event_times.get(p.name) for p in op.inputs]
    values = c.params.get(op.name, {})
    if updates(op.kind, op.param) or op.kind == "window-aggregate" and "rows" in values:
        return frozenset()  # rows emitted behind the watermark: no event time to carry
    if op.kind in ("window-aggregate", "top-n"):
        return frozenset({"window_end"})
    if op.kind == "deduplicate" and not [t for t in ins if t is not None]:
        time = values.get("time")
        return frozenset({str(time)}) if time else frozenset()
    if op.kind == "join":
        out = c.schemas[op.outputs[0].name].names
        left_in, right_in = (c.schemas[p.name].names for p in op.inputs)
        left, right = values.get("left-time"), values.get("right-time")
        if left not in left_in or right not in right_in or len(out) != len(left_in) + len(right_in):
            return frozenset()
        return frozenset({left, out[len(left_in) + right_in.index(right)]})
    known = [t for t in ins if t is not None]
    if not known:
        return None
    if op.kind == "project":
        return frozenset(f.name for f in op.fields
                         if any(_names_column(f.value, t) for t in known[0]))
    return known[0]


def _names_column(text: str, column: str) -> bool:
    """Whether an expression is just the column (`window_end` or `stream.window_end`)."""
    bare = text.strip()
    return bare == column or bare.endswith("." + column) and bare.count(".") == 1


def _group_columns(c: _Checker, op: OperatorDecl, schema: Schema, stream: str,
                   param: str = "group-by") -> list[Field] | None:
    result, ok = [], True
    for name in c.params[op.name].get(param, ()):
        found = schema.get(name)
        if found is None:
            c.error(_written(op, param).value_pos(),
                    f"{param} column '{name}' is not in stream '{stream}'",
                    partial(suggest, name, schema.names, "its columns"))
            ok = False
        else:
            result.append(found)
    return result if ok else None


def _aggregates(c: _Checker, op: OperatorDecl, schema: Schema, stream: str,
                groups: list[Field] | None,
                functions: tuple[str, ...] = AGGREGATE_FUNCTIONS,
                taken: set[str] | None = None) -> list[Field] | None:
    """The output columns of the <aggregate> children, each with a function among
    `functions` and, for the windows of time (all functions), an optional `where` condition;
    `taken`: the output's other column names (default: a window's and the groups)."""
    if not op.aggregates:
        c.error(op.pos, f"{op.kind} '{op.name}' has no <aggregate>",
                'add e.g. <aggregate name="n" function="count"/>')
        return None
    if taken is None:
        taken = {_folded(n) for n in WINDOW_COLUMNS} | {_folded(g.name) for g in groups or ()}
    result, ok = [], True
    for a in op.aggregates:
        if a.function in AGGREGATE_FUNCTIONS and a.function not in functions:
            c.error(a.function_pos, f"aggregate '{a.name}': {op.kind} '{op.name}' computes "
                                    f"{', '.join(functions)}, not {a.function}",
                    "these keep each group's values in Python state: the others are for "
                    "windows of time")
            ok = False
            continue
        fits = _aggregate_where(c, op, a, schema, stream, functions == AGGREGATE_FUNCTIONS)
        field_ = _aggregate(c, a, schema, stream, taken)
        if field_ is None or not fits:
            ok = False
        else:
            taken.add(_folded(a.name))
            result.append(field_)
    return result if ok else None


def _aggregate_where(c: _Checker, op: OperatorDecl, a: AggregateDecl, schema: Schema,
                     stream: str, allowed: bool) -> bool:
    """Whether an aggregate's `where` (SQL's FILTER (WHERE ...): the rows it reads) fits: not
    written, or a boolean expression over the input stream, on a window of time (count windows
    and the updating aggregate keep per-key Python state whose folds take every row)."""
    if a.where is None:
        return True
    if not allowed:
        c.error(a.where_pos(), f"aggregate '{a.name}': {op.kind} '{op.name}' takes no where",
                "where belongs to the windows of time (size or gap); filter the rows before, "
                "or compute the column with a case in a project")
        return False
    try:
        ex.compile_condition(a.where, ex.Scope({stream: schema}))
    except ex.NotBoolean as e:
        c.error(a.where_pos(), f"where of aggregate '{a.name}' is of type {e.type.value}, "
                               "not boolean", f"write a comparison such as {stream}.price < 10000")
        return False
    except ex.ExpressionError as e:
        for problem in e.problems:
            c.error(a.where_pos(problem.offset), f"where of aggregate '{a.name}': "
                                                 f"{problem.message}", problem.hint)
        return False
    return True


def _aggregate(c: _Checker, a: Any, schema: Schema, stream: str, taken: set[str]) -> Field | None:
    if _folded(a.name) in taken:
        c.error(a.pos, f"aggregate name '{a.name}' is already an output column",
                "choose another name (output column names must differ in more than case)")
        return None
    if a.function not in AGGREGATE_FUNCTIONS:
        c.error(a.function_pos, f"unknown aggregate function '{a.function}'",
                suggest(a.function, AGGREGATE_FUNCTIONS, "functions"))
        return None
    if a.column is None:
        if a.function != "count":
            c.error(a.pos, f"aggregate '{a.name}' ({a.function}) needs a column",
                    f'add column="..." naming a column of stream \'{stream}\'')
            return None
        return Field(a.name, ColumnType.INT)
    col = schema.get(a.column)
    if col is None:
        c.error(a.column_pos, f"aggregate '{a.name}' reads column '{a.column}', which stream "
                              f"'{stream}' does not have", suggest(a.column, schema.names, "its columns"))
        return None
    fits, by = _aggregate_by(c, a, schema, stream)
    return _aggregate_type(c, a, col, by) if fits else None


def _aggregate_by(c: _Checker, a: Any, schema: Schema, stream: str) -> tuple[bool, Field | None]:
    """Whether the `by` column of an aggregate fits, and the column (None when not written): a
    `by` on a function other than max_by/min_by, or naming no column of the stream, is an
    error."""
    if a.by is None:
        return True, None
    if a.function not in BY_FUNCTIONS:
        c.error(a.by_pos, f"aggregate '{a.name}' ({a.function}) takes no by column",
                f"by belongs to {' and '.join(BY_FUNCTIONS)}")
        return False, None
    found = schema.get(a.by)
    if found is None:
        c.error(a.by_pos, f"aggregate '{a.name}' orders by column '{a.by}', which stream "
                          f"'{stream}' does not have", suggest(a.by, schema.names, "its columns"))
    return found is not None, found


def _aggregate_type(c: _Checker, a: Any, col: Field, by: Field | None) -> Field | None:
    try:
        return Field(a.name, aggregate_type(a.function, col, by))
    except ValueError as e:
        if a.function not in BY_FUNCTIONS:
            c.error(a.column_pos, str(e), "use count, or a column of a fitting type")
        else:
            c.error(a.pos if by is None else a.by_pos, str(e),
                    'add by="..." naming an orderable column of the stream')
        return None


def _join(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    (left, right), (ln, rn) = inputs, (op.inputs[0].name, op.inputs[1].name)
    values = c.params[op.name]
    keys = _join_keys(c, op, left, right, ln, rn)
    times = [_join_time(c, op, schema, stream, side)
             for schema, stream, side in ((left, ln, "left"), (right, rn, "right"))]
    if "watermark" not in values and "within" in values:
        values["watermark"] = values["within"]
    end_ok = "right-end" not in values or \
        _column_of(c, op, right, "right-end", rn, ColumnType.TIMESTAMP) is not None
    if keys is None or None in times or not end_ok:
        return None
    fits = [_is_event_time(c, op, stream, t, f"{side}-time" if f"{side}-time" in values else "time")
            for stream, t, side in ((ln, times[0], "left"), (rn, times[1], "right"))]
    if not all(fits):
        return None
    values["left-key"], values["right-key"] = keys
    values["left-time"], values["right-time"] = times
    return _join_schema(c, op, left, right, rn)


def _join_keys(c: _Checker, op: OperatorDecl, left: Schema, right: Schema, ln: str,
               rn: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    values = c.params[op.name]
    lk = values.get("left-key", values.get("key"))
    rk = values.get("right-key", values.get("key"))
    if not lk or not rk:
        c.error(op.pos, f"join '{op.name}' needs its key columns",
                'add <param name="key" value="..."/> (same names on both sides) or left-key '
                "and right-key")
        return None
    if len(lk) != len(rk):
        c.error(op.pos, f"join '{op.name}' has {len(lk)} left key(s) but {len(rk)} right key(s)",
                "give both sides the same number of key columns")
        return None
    ok = True
    for l_name, r_name in zip(lk, rk):
        lf, rf = left.get(l_name), right.get(r_name)
        for found, name, stream, schema in ((lf, l_name, ln, left), (rf, r_name, rn, right)):
            if found is None:
                c.error(op.pos, f"join key '{name}' is not a column of stream '{stream}'",
                        suggest(name, schema.names, "its columns"))
                ok = False
        if lf and rf and lf.type is not rf.type:
            c.error(op.pos, f"join keys {ln}.{l_name} ({lf.type.value}) and {rn}.{r_name} "
                            f"({rf.type.value}) have different types", "join columns of one type")
            ok = False
    return (lk, rk) if ok else None


def _join_time(c: _Checker, op: OperatorDecl, schema: Schema, stream: str, side: str) -> str | None:
    values = c.params[op.name]
    param = f"{side}-time" if f"{side}-time" in values else "time"
    name = values.get(param)
    if name is None:
        c.error(op.pos, f"join '{op.name}' needs the event-time column of its {side} input",
                'add <param name="time" value="ts"/> (or left-time and right-time)')
        return None
    found = _column_of(c, op, schema, param, stream, ColumnType.TIMESTAMP)
    return found.name if found else None


def _join_schema(c: _Checker, op: OperatorDecl, left: Schema, right: Schema,
                 right_name: str) -> Schema | None:
    names = join_output_names(left, right, right_name)
    folded = [_folded(n) for n in left.names + tuple(names)]
    seen: set[str] = set()
    clash = None
    for n, f in zip(left.names + tuple(names), folded):
        if f in seen:
            clash = n
            break
        seen.add(f)
    if clash is not None:
        c.error(op.pos, f"join '{op.name}' would produce column '{clash}' twice",
                "rename columns with a project operator before the join")
        return None
    return Schema(left.fields + tuple(Field(n, f.type) for n, f in zip(names, right)))


def _lookup_join(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    """A stream-table lookup join: `side-type` names a declared type (the side file's rows),
    the keys are columns of the stream and of that type with equal types; its output is the
    stream's columns, then the side's (a clash renamed `<side-type>_<column>`)."""
    values, stream, schema = c.params[op.name], op.inputs[0].name, inputs[0]
    written = op.param("side-type")
    side = None if written is None else c.types.get(written.value.strip())
    if written is not None and side is None:
        if written.value.strip() not in {t.name for t in c.spec.types}:
            c.error(written.value_pos(), f"lookup-join '{op.name}': side-type "
                                         f"'{written.value.strip()}' is not a declared type",
                    suggest(written.value.strip(), c.types, "declared types"))
        return None
    if side is None:
        return None  # side-type missing: reported as a required parameter
    side_name = written.value.strip() if written is not None else ""
    keys = _join_keys(c, op, schema, side, stream, side_name)
    if keys is None:
        return None
    values["left-key"], values["right-key"] = keys
    values["side-type"] = side_name
    values["side-columns"] = tuple((f.name, f.type.value) for f in side)
    return _join_schema(c, op, schema, side, side_name)


def _control_sink(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    problems = control_schema_problems(inputs[0])
    if problems:
        port = op.inputs[0]
        c.error(port.pos, f"control-sink '{op.name}' reads stream '{port.name}' "
                          f"({_describe(inputs[0])}), which is not a control stream: "
                          f"{'; '.join(problems)}",
                "a control stream has exactly the string columns query, operator, parameter "
                "and value; build them with a project, e.g. <field name=\"value\" "
                "value=\"concat('raw.temp > ', to_string(t))\"/>")
    return None


def _union(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    first = inputs[0]
    for port, schema in zip(op.inputs[1:], inputs[1:]):
        if schema != first:
            c.error(port.pos, f"union '{op.name}': stream '{port.name}' ({_describe(schema)}) "
                              f"differs from '{op.inputs[0].name}' ({_describe(first)})",
                    "union streams of the same type; align them with a project operator")
            return None
    return first


def _pattern(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    """The pattern operator: its pattern, variables' conditions and measures, all checked
    (compiler.expr.pattern); its output is the key columns, then the measures."""
    schema, stream, values = inputs[0], op.inputs[0].name, c.params[op.name]
    time = _column_of(c, op, schema, "time", stream, ColumnType.TIMESTAMP)
    keys = _group_columns(c, op, schema, stream, "partition-by")
    tree = _pattern_tree(c, op)
    ok = time is not None and keys is not None and tree is not None
    within = op.param("within")
    if values.get("within") == 0 and within is not None:
        c.error(within.value_pos(), "a pattern's time bound must be above zero", "e.g. 1 minute")
        ok = False
    if tree is None:
        return None
    if stream in ex_pattern.variables(tree):
        c.error(_written(op, "pattern").value_pos(),
                f"pattern variable '{stream}' has the name of the input stream",
                "rename the variable: stream.col names the current row")
        return None
    scope = ex_pattern.PatternScope(stream, schema, ex_pattern.variables(tree))
    ok = _defines(c, op, scope) and ok
    measures = _measures(c, op, scope, keys or [])
    return Schema(tuple(keys) + tuple(measures)) \
        if ok and keys is not None and measures is not None else None


def _pattern_tree(c: _Checker, op: OperatorDecl) -> ex_pattern.Node | None:
    p = op.param("pattern")
    if p is None:
        return None
    try:
        return ex_pattern.parse_pattern(p.value)
    except ex.ExpressionError as e:
        _report(c, op, p, "pattern", e)
        return None


def _defines(c: _Checker, op: OperatorDecl, scope: ex_pattern.PatternScope) -> bool:
    ok, seen = True, set()
    for d in op.defines:
        if d.name not in scope.variables:
            c.error(d.pos, f"<define> names '{d.name}', which the pattern of '{op.name}' does "
                           "not use", partial(suggest, d.name, scope.variables, "its variables"))
            ok = False
        elif d.name in seen:
            c.error(d.pos, f"variable '{d.name}' is defined twice", "keep one <define>")
            ok = False
        seen.add(d.name)
        try:
            ex_pattern.compile_define(d.value, scope)
        except ex.NotBoolean as e:
            c.error(d.value_pos(), f"the condition of '{d.name}' in '{op.name}' is "
                                   f"{e.type.value}, not boolean", "write a comparison such as "
                                                                  "price < prev(price)")
            ok = False
        except ex.ExpressionError as e:
            _report(c, op, d, f"the condition of '{d.name}'", e)
            ok = False
    return ok


def _measures(c: _Checker, op: OperatorDecl, scope: ex_pattern.PatternScope,
              keys: list[Field]) -> list[Field] | None:
    if not op.fields:
        c.error(op.pos, f"pattern operator '{op.name}' has no <field>",
                'add a measure, e.g. <field name="start" value="first(A.ts)"/>')
        return None
    taken = {_folded(k.name) for k in keys}
    fields, ok = [], True
    for f in op.fields:
        if _folded(f.name) in taken:
            c.error(f.pos, f"measure '{f.name}' of '{op.name}' is already an output column",
                    "the key columns come first; give the measure another name")
            ok = False
            continue
        taken.add(_folded(f.name))
        try:
            fields.append(Field(f.name, ex_pattern.compile_measure(f.value, scope).type))
        except ex.ExpressionError as e:
            _report(c, op, f, f"measure '{f.name}'", e)
            ok = False
    return fields if ok else None


def _kafka_param(c: _Checker, op: OperatorDecl, name: str,
                 parse: Callable[[str], Any]) -> Any:
    """`parse` of parameter `name`'s text, or None (absent, or a located error reported)."""
    p = op.param(name)
    if p is None:
        return None
    try:
        return parse(p.value)
    except kp.KafkaParamError as e:
        c.error(p.value_pos(), f"parameter '{name}' of '{op.name}': {e}")
        return None


def _kafka_source(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    """bootstrap, one of topic and topic-pattern, starting offsets that name only its topics (or
    a starting timestamp instead), and metadata columns that are declared with their type."""
    _kafka_param(c, op, "bootstrap", kp.parse_bootstrap)
    topic, pattern = op.param("topic"), op.param("topic-pattern")
    if (topic is None) == (pattern is None):
        c.error(op.pos, f"kafka-source '{op.name}' needs exactly one of topic and topic-pattern",
                '<param name="topic" value="readings"/> or <param name="topic-pattern" '
                'value="readings-.*"/>')
    topics = _kafka_param(c, op, "topic", kp.parse_topics) or ()
    if pattern is not None and not pattern.value.strip():
        c.error(pattern.value_pos(), f"parameter 'topic-pattern' of '{op.name}' is empty")
    timestamp = op.param("starting-timestamp")
    if op.param("starting-offsets") is not None and timestamp is not None:
        c.error(timestamp.pos,
                f"kafka-source '{op.name}' has both starting-offsets and starting-timestamp",
                "keep one of them")
    _kafka_param(c, op, "starting-offsets", lambda t: kp.parse_starting_offsets(t, topics))
    declared = c.types.get(op.outputs[0].type_name or "") if op.outputs else None
    if declared is not None:
        _kafka_metadata_columns(c, op, declared)
    return None


def _kafka_metadata_columns(c: _Checker, op: OperatorDecl, declared: Schema) -> None:
    taken: dict[str, str] = {}
    for name in kp.METADATA_COLUMNS:
        p, column = op.param(name), c.params[op.name].get(name)
        if p is None or column is None:
            continue
        f = declared.get(column)
        if f is None:
            c.error(p.value_pos(), f"parameter '{name}' of '{op.name}' names column '{column}', "
                                   f"which its output type does not declare",
                    lambda: suggest(column, declared.names, "the declared columns"))
        elif kp.metadata_type_problem(name, f.type):
            c.error(p.value_pos(), f"parameter '{name}' of '{op.name}': "
                                   f"{kp.metadata_type_problem(name, f.type)}",
                    "declare the column with that type")
        elif column in taken:
            c.error(p.value_pos(), f"column '{column}' is named by both '{taken[column]}' and "
                                   f"'{name}' of '{op.name}'", "name another column")
        taken[column] = name


def _kafka_sink(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    _kafka_param(c, op, "bootstrap", kp.parse_bootstrap)
    _kafka_param(c, op, "topic", kp.check_topic)
    key, column = op.param("key-column"), c.params[op.name].get("key-column")
    if key is not None and column is not None and inputs[0].get(column) is None:
        c.error(key.value_pos(), f"parameter 'key-column' of '{op.name}' names column "
                                 f"'{column}', which stream '{op.inputs[0].name}' does not have",
                lambda: suggest(column, inputs[0].names, "its columns"))
    return None


def _deduplicate(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    """The input's type; its key columns and event-time column must be the stream's."""
    schema, stream = inputs[0], op.inputs[0].name
    time = _column_of(c, op, schema, "time", stream, ColumnType.TIMESTAMP)
    keys = _group_columns(c, op, schema, stream, "key")
    if time is None or keys is None or not _is_event_time(c, op, stream, time.name, "time"):
        return None
    return schema


def _file_sink(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    """A file sink partitioned by time (`common.time_partitions`): `partition-time`, a
    timestamp column of its input, and `partition-by`, its folders, come together; every
    problem of the pattern at its character; not behind an updating aggregate (an upsert log
    is one file, its current view the last record of each key in it)."""
    by, time = op.param("partition-by"), op.param("partition-time")
    if by is None and time is None:
        return None
    stream = op.inputs[0].name
    if by is None and time is not None:
        c.error(time.pos, f"partition-time of '{op.name}' needs partition-by, the folders",
                '<param name="partition-by" value="dt=yyyy-MM-dd/hm=HH:mm"/>')
    if time is None and by is not None:
        c.error(by.pos, f"partition-by of '{op.name}' needs partition-time, the timestamp "
                        "column whose time names the folders",
                '<param name="partition-time" value="date_time"/>')
    if time is not None:
        _column_of(c, op, inputs[0], "partition-time", stream, ColumnType.TIMESTAMP)
    if by is None:
        return None
    _, problems = time_partitions.parse(by.value)
    for problem in problems:
        c.error(by.value_pos(problem.offset), f"partition-by of '{op.name}': {problem.message}",
                "levels NAME=PATTERN separated by '/', e.g. 'dt=yyyy-MM-dd/hm=HH:mm'")
    producer = c.producers.get(stream)
    if producer is not None and updates(producer.kind, producer.param):
        c.error(by.pos, f"file-sink '{op.name}' cannot partition the upsert log of "
                        f"{producer.kind} '{producer.name}'",
                "an upsert log is one file: leave out partition-by and partition-time")
    return None


_PUBLISHED_NAME = re.compile(r"^(?P<query>[A-Za-z][A-Za-z0-9_-]{0,63})/"
                             r"(?P<stream>[A-Za-z_][A-Za-z0-9_]{0,63})$")


def _stream_source(c: _Checker, op: OperatorDecl, inputs: list[Schema]) -> Schema | None:
    """`stream` names another query's published stream as QUERY/STREAM; a query reads its own
    streams directly. Whether the stream exists and its type agree is the scheduler's check at
    submit (it knows the running queries; docs/queries.md)."""
    p = op.param("stream")
    if p is None:
        return None
    m = _PUBLISHED_NAME.match(p.value)
    if m is None:
        c.error(p.value_pos(), f"parameter 'stream' of '{op.name}' is '{p.value}', not "
                               "QUERY/STREAM",
                'name a published stream, e.g. <param name="stream" value="sensors/hot"/>')
    elif m.group("query") == c.spec.name:
        c.error(p.value_pos(), f"stream-source '{op.name}' reads '{p.value}', a stream of "
                               "this query itself",
                f"read the stream '{m.group('stream')}' directly with <input name=\""
                f"{m.group('stream')}\"/>")
    return None


_RESOLVERS: dict[str, Callable[[_Checker, OperatorDecl, list[Schema]], Schema | None]] = {
    "deduplicate": _deduplicate, "top-n": _top_n,
    "generator": _generator, "filter": _filter, "project": _project, "pattern": _pattern,
    "window-aggregate": _window, "aggregate": _updating, "join": _join, "union": _union,
    "lookup-join": _lookup_join, "control-sink": _control_sink, "file-sink": _file_sink,
    "kafka-source": _kafka_source, "kafka-sink": _kafka_sink, "stream-source": _stream_source,
}


# ----------------------------------------------------------------------------------------------
# The logical graph

def _live(c: _Checker, order: list[OperatorDecl],
          kinds: dict[str, OperatorDef]) -> list[OperatorDecl]:
    """The operators whose output reaches a sink, in `order`: one whose stream nobody reads (a
    warning) computes nothing anyone sees, and neither does what only feeds it."""
    live: set[str] = set()
    for op in reversed(order):
        if kinds[op.name].role == "sink" or any(o.publish for o in op.outputs) or any(
                consumer in live for o in op.outputs for consumer in c.readers.get(o.name, ())):
            live.add(op.name)
    return [op for op in order if op.name in live]


def _graph(c: _Checker, order: list[OperatorDecl], kinds: dict[str, OperatorDef]) -> Graph:
    nodes = tuple(_node(c, op, kinds[op.name]) for op in order)
    streams = tuple(Stream(o.name, c.schemas[o.name], op.name) for op in order for o in op.outputs)
    published = tuple(o.name for op in order for o in op.outputs if o.publish)
    return Graph(c.spec.name, nodes, streams, published=published)


def _node(c: _Checker, op: OperatorDecl, d: OperatorDef) -> Node:
    params = dict(c.params[op.name])
    if op.kind == "project":
        params["fields"] = tuple((f.name, f.value) for f in op.fields)
    if op.kind in ("window-aggregate", "aggregate"):
        params["aggregates"] = tuple(_aggregate_call(a) for a in op.aggregates)
    if op.kind == "pattern":
        params["measures"] = tuple((f.name, f.value) for f in op.fields)
        params["defines"] = tuple((d.name, d.value) for d in op.defines)
    if op.kind == "filter":
        params["condition"] = _written(op, "condition").value
    return Node(
        name=op.name, kind=op.kind, role=d.role, stateful=d.stateful,
        inputs=tuple(p.name for p in op.inputs),
        output=op.outputs[0].name if op.outputs else None,
        params=tuple(sorted(params.items())),
        partition_keys=_partition_keys(op.kind, params),
        patterns=c.patterns.get(op.name, ()),
        cpus=c.resources.get(op.name, (None, None))[0],
        mem_mb=c.resources.get(op.name, (None, None))[1],
        max_delay_ms=c.max_delays.get(op.name),
    )


def _aggregate_call(a: AggregateDecl) -> tuple[str | None, ...]:
    """An aggregate as the runtime takes it: (name, function, column), then max_by's and
    min_by's by column, then the where condition (by None when only where is written)."""
    call: tuple[str | None, ...] = (a.name, a.function, a.column)
    if a.where is not None:
        return call + (a.by, a.where)
    return call + ((a.by,) if a.by else ())


def _partition_keys(kind: str, params: dict[str, Any]) -> tuple[str, ...] | None:
    if kind in ("filter", "project", "union"):
        return ()  # stateless: any partitioning is correct
    if kind == "window-aggregate" and "rows" in params:
        return None  # count windows: not partitioned (yet)
    if kind == "top-n" and "ttl" in params:
        return None  # the updating ranking: not partitioned (yet), as the updating aggregate
    if kind in ("window-aggregate", "top-n"):
        return tuple(params.get("group-by", ())) or None
    if kind == "pattern":
        return tuple(params.get("partition-by", ())) or None
    if kind == "deduplicate":
        return tuple(params.get("key", ())) or None
    if kind == "join":  # its resolved keys; `key` where its inputs did not resolve
        return tuple(params.get("left-key") or params.get("key") or ()) or None
    return None


# ----------------------------------------------------------------------------------------------
# Pattern requests (ha, replicas, parallelism, partition-by, pipeline, match-instances):
# Resources (docs/spec-language.md, "Resources")

MAX_CPUS = 64.0  # cpus= above this is a typo, not a request
MIN_MEM_MB, MAX_MEM_MB = 32, 1 << 20  # Mesos's smallest container; 1 TB


@dataclass(frozen=True)
class AgentRoom:
    """The most one task may ask on a known cluster: the largest agent's cpus and memory less
    what an executor asks for itself (`what` names where the figures come from)."""

    cpus: float
    mem_mb: float
    what: str


def _check_resources(c: _Checker, op: OperatorDecl) -> None:
    """cpus= (a decimal number of cpus, > 0) and mem= (whole MB), each reported at its value;
    a request over `c.room` is one no agent can ever hold."""
    attrs = {a.name: a for a in op.resources}
    cpus = mem = None
    if "cpus" in attrs:
        cpus = _amount(c, attrs["cpus"], "cpus", 0.0, MAX_CPUS, whole=False)
    if "mem" in attrs:
        found = _amount(c, attrs["mem"], "MB", MIN_MEM_MB, MAX_MEM_MB, whole=True)
        mem = int(found) if found is not None else None
    room = c.room
    if room is not None and cpus is not None and cpus > room.cpus + 1e-9:
        c.error(attrs["cpus"].pos, f"cpus={cpus:g} is more than any agent can give a task "
                                   f"({room.cpus:g} cpus: {room.what})",
                f'ask for cpus="{room.cpus:g}" or less, or run on larger agents')
    if room is not None and mem is not None and mem > room.mem_mb:
        c.error(attrs["mem"].pos, f"mem={mem} is more than any agent can give a task "
                                  f"({room.mem_mb:g} MB: {room.what})",
                f'ask for mem="{int(room.mem_mb)}" or less, or run on larger agents')
    if cpus is not None or mem is not None:
        c.resources[op.name] = (cpus, mem)


def _amount(c: _Checker, attr: PatternAttr, unit: str, low: float, high: float,
            whole: bool) -> float | None:
    """The number `attr` holds, in (low, high] for cpus or [low, high] for whole MB; None after
    reporting what is wrong at the value."""
    text = attr.value.strip()
    ok = text.isdigit() if whole else bool(re.fullmatch(r"[0-9]+(\.[0-9]+)?|\.[0-9]+", text))
    if not ok:
        c.error(attr.pos, f"{attr.name}='{attr.value}' is not " +
                ("a whole number of MB" if whole else "a number of cpus"),
                f'write e.g. {attr.name}="' + ("512" if whole else "0.5") + '"')
        return None
    value = float(text)
    inside = low <= value <= high if whole else low < value <= high
    if not inside:
        span = f"{int(low)} to {int(high)}" if whole else \
            f"more than {low:g} and at most {high:g}"
        c.error(attr.pos, f"{attr.name}={text} is out of range", f"write {span} {unit}")
        return None
    return value


# docs/availability.md: Borealis DPC

MAX_DELAY_MS = 24 * 3_600_000
DPC_KINDS = ("union", "join")  # operators that go on without a cut-off input


# pattern requests that recombine an operator's instances in a merger, which then waits
# (docs/availability.md, "A partitioned operator's merger"); any other pattern has no merger
MERGED_PATTERNS = ("parallelism", "match-instances")


def _merged(c: _Checker, op: OperatorDecl) -> bool:
    """Whether `op` runs as instances recombined by a merger (partitioned, elastic, folded,
    or a pattern matched by several instances), and asks for no other pattern."""
    asked = dict(c.patterns.get(op.name, ()))
    return any(name in asked for name in MERGED_PATTERNS) and "ha" not in asked and \
        "pipeline" not in asked and "pipeline-stages" not in asked


def _check_max_delays(c: _Checker, order: list[OperatorDecl]) -> None:
    """max-delay= on an operator, else the dataflow's for each union and join and each
    partitioned operator's merger; every misuse reported at the attribute."""
    query = c.spec.max_delay
    query_ms = _max_delay_ms(c, query) if query is not None else None
    for op in order:
        if op.max_delay is not None:
            ms = _max_delay_ms(c, op.max_delay)
            if _dpc_operator(c, op, op.max_delay, "") and ms is not None:
                c.max_delays[op.name] = ms
        elif query is not None and query_ms is not None and \
                (op.kind in DPC_KINDS or _merged(c, op)) and \
                _dpc_operator(c, op, query, f" (query-wide max-delay, for '{op.name}')"):
            c.max_delays[op.name] = query_ms
    if query is not None and not any(op.kind in DPC_KINDS or _merged(c, op) for op in order):
        c.error(query.pos, "max-delay='" + query.value + "' applies to unions, joins and the "
                "mergers of partitioned operators, and the dataflow has none", "remove it, or "
                "put the inputs to wait for in a union or a join")


MARK_PROPAGATORS = ("filter", "project")  # one output row per input row at most
MARK_WRITERS = ("file-sink", "console-sink", "network-sink", "kafka-sink")


def _check_marked_sources(c: _Checker, graph: Graph) -> None:
    """A network-source with marks="dpc" reads another query's DPC results, tentative rows
    and corrections (docs/availability.md, "What a reader of each sink sees"): its stream may
    feed only filters and projections, one reader each, into a file, console, network or
    Kafka sink, which write the marks; anything else would take a tentative row for a stable
    one (refused at the parameter)."""
    for op in c.spec.operators:
        marks = next((p for p in op.params if p.name == "marks"), None)
        if op.kind != "network-source" or marks is None or marks.value != "dpc":
            continue
        blocked = _mark_blocker(graph, op.outputs[0].name) if op.outputs else None
        if blocked is not None:
            c.error(marks.pos, f"the marked stream of '{op.name}' reaches {blocked}, which "
                    "cannot carry DPC marks (tentative rows and their corrections)",
                    "read it with filters and projections into one file-, console-, network- or "
                    "kafka-sink "
                    "(docs/availability.md), or drop marks=\"dpc\" if the writer sends none")


def _mark_blocker(graph: Graph, stream: str) -> str | None:
    """The first operator on `stream`'s way that does not propagate DPC marks, as words (None:
    every way ends in a file, console, network or Kafka sink through filters and
    projections)."""
    consumers = graph.consumers(stream)
    if stream in graph.published:
        return f"other queries (the stream '{stream}' is published)"
    if len(consumers) != 1:
        return (f"{len(consumers)} readers of '{stream}' (a channel between tasks)"
                if consumers else f"no reader of '{stream}'")
    node = consumers[0]
    if node.kind in MARK_WRITERS:
        if node.kind == "file-sink" and node.param("partition-by"):
            return f"'{node.name}' (a file-sink partitioned by time)"
        if node.kind == "kafka-sink" and node.param("mode") == realtime.REAL_TIME:
            return f"'{node.name}' (a kafka-sink in real-time mode)"
        return None
    if node.kind not in MARK_PROPAGATORS or node.output is None:
        return f"'{node.name}' (a {node.kind})"
    return _mark_blocker(graph, node.output)


def _max_delay_ms(c: _Checker, attr: PatternAttr) -> int | None:
    try:
        ms = parse_duration_ms(attr.value)
    except ParamValueError as exc:
        c.error(attr.pos, f"max-delay: {exc}", "write e.g. max-delay=\"3 seconds\"")
        return None
    if not 0 < ms <= MAX_DELAY_MS:
        c.error(attr.pos, f"max-delay='{attr.value}' is out of range",
                "write more than 0 and at most 24 hours")
        return None
    return ms


def _dpc_operator(c: _Checker, op: OperatorDecl, attr: PatternAttr, where: str) -> bool:
    """Whether `op` may go on without a cut-off input (a union or join, or a partitioned
    operator's merger, whose max-delay it is: its instances take none); reports why not at
    `attr`."""
    if _merged(c, op):
        return True
    if op.kind not in DPC_KINDS:
        inputs = f"{len(op.inputs)} input" + ("s" if len(op.inputs) != 1 else "")
        c.error(attr.pos, f"max-delay applies to a union or a join of several inputs, or to "
                          f"the merger of a partitioned operator (parallelism=); "
                          f"'{op.name}' is a {op.kind} with {inputs}{where}",
                "move it to the union or join whose inputs may be cut off")
        return False
    if c.patterns.get(op.name):
        asked = ", ".join(name for name, _ in c.patterns[op.name])
        c.error(attr.pos, f"max-delay with a pattern ({asked}) on '{op.name}' is not built "
                          f"yet{where}", "drop one of them (docs/availability.md)")
        return False
    return True


# docs/patterns.md

HA_MODES = ("standby", "checkpoint", "hot-standby")
MAX_REPLICAS = 16
MAX_PARALLELISM = 64
MAX_MATCH_INSTANCES = 16
MAX_PIPELINE_STAGES = 16
MAX_STAGE_ROWS = 10_000
DEFAULT_STAGE_ROWS = 2
PATTERN_ONLY = ("match-instances", "pipeline-stages", "stage-rows")  # query-wide: patterns only


def _check_patterns(c: _Checker, op: OperatorDecl, d: OperatorDef) -> None:
    """Resolve an operator's own pattern attributes, or else the query-wide defaults, into the
    requests its Node carries; report every misuse at the attribute that is wrong."""
    attrs = {a.name: a for a in op.patterns}
    if attrs and d.role != "transform":
        first = op.patterns[0]
        c.error(first.pos, f"{first.name}= applies to transform operators; '{op.name}' is a "
                           f"{d.role}", "move the attribute to the operator it should protect "
                                        "or scale")
        return
    if not attrs and d.role == "transform":
        attrs = {a.name: a for a in c.spec.patterns
                 if a.name not in PATTERN_ONLY or op.kind == "pattern"}
    if not attrs:
        return
    requests: dict[str, Any] = {}
    _check_families(c, op, attrs)
    _check_ha(c, op, d, attrs, requests)
    _check_parallelism(c, op, d, attrs, requests)
    _check_pipeline(c, op, attrs, requests)
    _check_match_instances(c, op, d, attrs, requests)
    _check_pipeline_stages(c, op, d, attrs, requests)
    if requests:
        c.patterns[op.name] = tuple(requests.items())


def _check_pattern_count(c: _Checker, order: list[OperatorDecl]) -> None:
    """At most MAX_PATTERN_OPERATORS operators ask for a pattern: the rewrite engine fires one
    rule per request, and bounds its firings per phase by the same number."""
    asking = [op for op in order if op.name in c.patterns]
    if len(asking) <= MAX_PATTERN_OPERATORS:
        return
    first = asking[MAX_PATTERN_OPERATORS]
    where = (first.patterns or c.spec.patterns or (None,))[0]
    c.error(where.pos if where else first.pos,
            f"{len(asking)} operators ask for a pattern (ha, parallelism, pipeline or "
            f"match-instances), more "
            f"than the {MAX_PATTERN_OPERATORS} a query may have; '{first.name}' is the first "
            "past the limit", "ask for patterns on fewer operators, or split the dataflow "
                              "into several queries")


def _where(attr: PatternAttr, op: OperatorDecl) -> str:
    return "" if attr in op.patterns else f" (query-wide default, for '{op.name}')"


def _check_families(c: _Checker, op: OperatorDecl, attrs: dict[str, PatternAttr]) -> None:
    asked = [name for name in ("ha", "parallelism", "pipeline", "match-instances",
                               "pipeline-stages")
             if name in attrs or (name == "parallelism" and "max-parallelism" in attrs)]
    if len(asked) > 1:
        second = attrs.get(asked[1]) or attrs["max-parallelism"]  # elastic: max- alone asks
        c.error(second.pos, f"'{op.name}' asks for {' and '.join(asked)}; one pattern per "
                            "operator for now", "keep one of the attributes")


def _check_ha(c: _Checker, op: OperatorDecl, d: OperatorDef, attrs: dict[str, PatternAttr],
              requests: dict[str, Any]) -> None:
    ha, replicas = attrs.get("ha"), attrs.get("replicas")
    if ha is None:
        if replicas is not None:
            c.error(replicas.pos, "replicas= needs ha=\"hot-standby\"",
                    'add ha="hot-standby" or remove replicas=')
        return
    if ha.value not in HA_MODES:
        c.error(ha.pos, f"ha='{ha.value}' is not a fault-tolerance pattern",
                suggest(ha.value, HA_MODES, "patterns"))
        return
    mode = ha.value
    stateless = GUARDS["stateless"].holds(_subject(op, d))
    if mode == "standby" and not stateless:
        c.error(ha.pos, f"'{op.name}' is a stateful {op.kind}: a simple standby would lose its "
                        f"state{_where(ha, op)}",
                'use ha="checkpoint" (restart from a checkpoint) or ha="hot-standby" (replicas)')
        return
    if mode == "checkpoint" and stateless:
        c.warn(ha.pos, f"'{op.name}' is stateless, so there is no state to checkpoint; a simple "
                       f"standby protects it{_where(ha, op)}", 'write ha="standby"')
        mode = "standby"
    requests["ha"] = mode
    if mode == "hot-standby":
        requests["replicas"] = _count(c, replicas, 2, 2, MAX_REPLICAS) if replicas else 2
    elif replicas is not None:
        c.error(replicas.pos, f"replicas= needs ha=\"hot-standby\", not ha=\"{ha.value}\"",
                "remove replicas= or switch to hot standby")


def _count(c: _Checker, attr: PatternAttr, default: int, lo: int, hi: int) -> int:
    try:
        value = int(attr.value)
    except ValueError:
        c.error(attr.pos, f"{attr.name}='{attr.value}' is not a whole number",
                f"write a number from {lo} to {hi}")
        return default
    if not lo <= value <= hi:
        c.error(attr.pos, f"{attr.name}={value} is out of range", f"write a number from {lo} "
                                                                   f"to {hi}")
        return default
    return value


def _check_parallelism(c: _Checker, op: OperatorDecl, d: OperatorDef,
                       attrs: dict[str, PatternAttr], requests: dict[str, Any]) -> None:
    par, by, most = attrs.get("parallelism"), attrs.get("partition-by"), \
        attrs.get("max-parallelism")
    if par is None and most is None:
        for name in ("partition-by", "min-parallelism", "elastic"):
            if name in attrs:
                c.error(attrs[name].pos, f"{name}= needs parallelism= or max-parallelism=",
                        'add e.g. parallelism="4", or max-parallelism="4" to rescale at run time')
        return
    k = _count(c, par, 1, 0 if _zero(attrs.get("min-parallelism")) else 1, MAX_PARALLELISM) \
        if par is not None else 1
    keys = _partition_keys(op.kind, c.params[op.name])
    wanted = by.value if by is not None else (keys[0] if keys else None)
    if not GUARDS["partitionable"].holds(_subject(op, d, keys, (("partition-by", wanted),))):
        given = par or most
        assert given is not None  # both None returned above
        _not_partitionable(c, op, keys, given, by)
        return
    assert keys is not None  # partitionable
    column = _partition_column(c, op, keys, by)
    slots = _elastic_bounds(c, op, d, attrs, k)
    if slots is None or (slots[1] < 2 and slots[0] > 0) or (by is not None and column is None):
        return
    low, high, mode = slots
    requests.update({"parallelism": high, "partition-by": column,
                     "partition-keys": _keys_per_input(c, op, column)})
    if k != high or low == 0:  # it starts on fewer instances than it has slots for
        requests["active"] = k
    if low == 0:  # the splitter's last partition feeds the instance folded downstream
        requests["folded-partitions"] = high + 1
    if d.stateful and _switchable(op, c.params[op.name]):
        requests.update(switch_requests(op, c.params[op.name]))
    if (low, mode) != (1, "manual") or "max-parallelism" in attrs:  # asked to rescale: the
        # splitter stays even after a kafka-source (compiler.kafka_partitions)
        requests.update({"min-parallelism": low, "elastic": mode})


ELASTIC_MODES = ("manual", "auto")


def _zero(attr: PatternAttr | None) -> bool:
    """Whether the attribute is written as the number 0 (min-parallelism: it may fold)."""
    return attr is not None and attr.value.isdigit() and int(attr.value) == 0


def _elastic_bounds(c: _Checker, op: OperatorDecl, d: OperatorDef,
                    attrs: dict[str, PatternAttr], k: int) -> tuple[int, int, str] | None:
    """(min, max, mode) of a partitioned operator's parallelism at run time: `parallelism=k`
    alone fixes the instance slots at k (a running query may scale it within 1..k); with
    `max-parallelism=M` it starts with k (default 1) of M slots; `elastic="auto"` lets the
    scheduler choose within min..max. None after an error (reported at its attribute)."""
    most, least, elastic = (attrs.get(n) for n in ("max-parallelism", "min-parallelism",
                                                   "elastic"))
    high = _count(c, most, k, 1, MAX_PARALLELISM) if most is not None else k
    low = _count(c, least, 1, 0, MAX_PARALLELISM) if least is not None else 1
    mode = elastic.value if elastic is not None else "manual"
    ok = True
    if elastic is not None and mode not in ELASTIC_MODES:  # "manual" when not written
        c.error(elastic.pos, f"elastic='{mode}' is not an elasticity mode",
                suggest(mode, ELASTIC_MODES, "modes"))
        ok = False
    if most is not None and k > high:
        c.error(most.pos, f"max-parallelism={high} is below parallelism={k}",
                f"write max-parallelism=\"{k}\" or more, or a smaller parallelism=")
        ok = False
    if least is not None and not low <= min(k, high):
        c.error(least.pos, f"min-parallelism={low} is above the starting parallelism "
                           f"{min(k, high)}", "the query starts with parallelism= instances "
                                              "(default 1): keep min-parallelism at or below it")
        ok = False
    if least is not None and low == 0 and not _foldable(c, op, d, least, mode):  # 1 if unwritten
        ok = False
    if high == 0:
        c.error(attrs["parallelism"].pos,  # only parallelism="0" alone gives no slots
                "parallelism=0 without max-parallelism= leaves no instance to split onto",
                'add max-parallelism="1" or more')
        ok = False
    if d.stateful and (high > k or mode == "auto") and not _switchable(op, c.params[op.name]):
        where = most if most is not None and high > k else elastic
        assert where is not None  # high > k needs max-parallelism=, mode "auto" needs elastic=
        c.error(where.pos, f"'{op.name}' is a stateful {op.kind}: only window-aggregates "
                           "with a size over event time (not sessions) and joins hand their "
                           "keyed state over at run time for now",
                f"write parallelism=\"{high}\" alone (a fixed partitioning)")
        ok = False
    return (low, high, mode) if ok else None


def _foldable(c: _Checker, op: OperatorDecl, d: OperatorDef, least: PatternAttr,
              mode: str) -> bool:
    """Whether `min-parallelism="0"` (the operator may run folded into its downstream task,
    rewrite_rules/folding.rule) is sound: a stateless operator that reads one stream (nothing to
    hand over when its rows move between the folded instance and its own), by hand only (the
    automatic policy sizes instances of their own)."""
    subject = _subject(op, d)
    if not GUARDS["stateless"].holds(subject) or not GUARDS["single-input"].holds(subject):
        c.error(least.pos, f"min-parallelism=0 folds '{op.name}' into the task after it, which "
                           f"only a stateless operator with one input can do ({op.kind})"
                           f"{_where(least, op)}",
                'write min-parallelism="1" or more')
        return False
    if mode == "auto":
        c.error(least.pos, "min-parallelism=0 is for splitting and merging by hand; "
                           'elastic="auto" keeps at least one instance of its own'
                           f"{_where(least, op)}",
                'write min-parallelism="1", or elastic="manual"')
        return False
    return True


# Event time a splitter keeps sending "ticks" to an instance a scale-in retires, after the
# switch, on top of the window and its watermark: enough for the instance's watermark to pass
# the switch so it emits its last windows (docs/elasticity.md).
SWITCH_MARGIN_MS = 30_000


def _switchable(op: OperatorDecl, params: dict[str, Any]) -> bool:
    """Whether a stateful operator can change its parallelism at run time: a window aggregate,
    tumbling or sliding over event time, not a session window (a session has no end known at a
    switch) nor a processing-time one (a switch is an event time). An event-time switch moves no
    state: the old instances finish the windows that start before it, the new ones take those
    from it on; a sliding window's rows near the switch go to both, each copy bounded to its
    side's windows. Or a join (a pair belongs to the owner at its left row's time; right rows
    near the switch go to both)."""
    return op.kind == "join" or op.kind == "window-aggregate" and "gap" not in params \
        and "rows" not in params and params.get("clock") != "processing"


def switch_requests(op: OperatorDecl, params: dict[str, Any]) -> dict[str, Any]:
    """What the splitters of a switchable stateful operator need: the time column (per input
    for a join), window size and slide (a join: the grid of its switch times), how long after
    a switch they keep ticking retiring instances, a join's spreads (per input: 0 on the left,
    the bound on the right) and that the scheduler plans its switches; and for the scheduler,
    how long after a switch a retiring instance may still emit (`switch-close`; ms)."""
    delay = int(params.get("watermark") or 0)
    if op.kind == "join":
        within = int(params.get("within") or 0)
        return {"switch-time": (params.get("left-time"), params.get("right-time")),
                "switch-window": PLANNED_GRID_MS, "switch-slide": PLANNED_GRID_MS,
                "switch-spread": (0, within), "switch-planned": 1, "switch-close": within,
                "switch-horizon": within + delay + SWITCH_MARGIN_MS}
    size = int(params.get("size") or 0)
    slide = int(params.get("slide") or size)
    return {"switch-time": params.get("time"), "switch-window": size, "switch-slide": slide,
            "switch-close": size - slide, "switch-horizon": size + delay + SWITCH_MARGIN_MS}


def _subject(op: OperatorDecl, d: OperatorDef, keys: tuple[str, ...] | None = None,
             patterns: tuple[tuple[str, Any], ...] = ()) -> Node:
    """The declared operator as the guards see it (compiler.guards.Subject), before any graph
    exists: its kind, state, inputs, partition keys and the pattern requests given."""
    return Node(name=op.name, kind=op.kind, role=d.role, stateful=d.stateful,
                inputs=tuple(p.name for p in op.inputs),
                output=op.outputs[0].name if op.outputs else None,
                partition_keys=keys, patterns=patterns)


def _not_partitionable(c: _Checker, op: OperatorDecl, keys: tuple[str, ...] | None,
                       par: PatternAttr, by: PatternAttr | None) -> None:
    """Why `partitionable` does not hold: no partition keys at all, or `by` is not one."""
    if keys is None:
        c.error(par.pos, f"'{op.name}' ({op.kind}) cannot be partitioned{_where(par, op)}",
                "only filter, project, union, joins, window aggregates of time with group-by "
                "and patterns with partition-by can; a window-aggregate needs group-by "
                "columns (count windows, rows, are not partitioned yet), a pattern "
                "partition-by columns")
        return
    assert by is not None  # with no partition-by, the first key is taken, and it is a key
    c.error(by.pos, f"'{op.name}' cannot be partitioned by '{by.value}'{_where(by, op)}",
            suggest(by.value, keys, "its partition keys"))


def _partition_column(c: _Checker, op: OperatorDecl, keys: tuple[str, ...],
                      by: PatternAttr | None) -> str | None:
    if by is None:
        return keys[0] if keys else None  # stateless without a key: round robin
    if not keys:
        missing = [p.name for p in op.inputs
                   if c.schemas.get(p.name) is not None and c.schemas[p.name].get(by.value) is None]
        if missing:
            c.error(by.pos, f"partition-by column '{by.value}' is not in stream "
                            f"'{missing[0]}'{_where(by, op)}",
                    suggest(by.value, c.schemas[missing[0]].names, "its columns"))
            return None
    return by.value


def _keys_per_input(c: _Checker, op: OperatorDecl, column: str | None) -> tuple[str | None, ...]:
    """The partitioning column on each input port (a join's right side uses its own key)."""
    values = c.params[op.name]
    if op.kind == "join" and column is not None:
        left = tuple(values.get("left-key") or values.get("key") or ())
        right = tuple(values.get("right-key") or values.get("key") or ())
        return (column, right[left.index(column)])
    return tuple(column for _ in op.inputs)


def _check_pipeline(c: _Checker, op: OperatorDecl, attrs: dict[str, PatternAttr],
                    requests: dict[str, Any]) -> None:
    pipe = attrs.get("pipeline")
    if pipe is None:
        return
    if pipe.value != "split":
        c.error(pipe.pos, f"pipeline='{pipe.value}' is not a pipelining pattern",
                'write pipeline="split" to run this operator as its own task')
        return
    requests["pipeline"] = "split"


def _check_match_instances(c: _Checker, op: OperatorDecl, d: OperatorDef,
                           attrs: dict[str, PatternAttr], requests: dict[str, Any]) -> None:
    """match-instances="k": a pattern operator's partial matches split over k instances
    (rewrite_rules/pattern-partitioning.rule); its start rows must keep their own matches."""
    asked = attrs.get("match-instances")
    if asked is None:
        return
    if op.kind != "pattern":
        c.error(asked.pos, f"match-instances= applies to pattern operators; '{op.name}' is a "
                           f"{op.kind}", 'use parallelism="k" to partition it by a key')
        return
    k = _count(c, asked, 2, 2, MAX_MATCH_INSTANCES)
    if not _independent(c, op, d, asked, "its partial matches cannot be split over instances"):
        return
    requests["match-instances"] = k


def _independent(c: _Checker, op: OperatorDecl, d: OperatorDef, asked: PatternAttr,
                 why: str) -> bool:
    """Whether the pattern operator's matches are independent of each other (after-match
    skip-to-next-row, the guard `independent-matches`), as splitting its partial matches
    needs; says at `asked` why not."""
    subject = replace(_subject(op, d), params=tuple(c.params.get(op.name, {}).items()))
    if GUARDS["independent-matches"].holds(subject):
        return True
    c.error(asked.pos, f"'{op.name}' resumes matching after each match's last row (after-match "
                       f"skip-past-last-row): each match decides where the next may start, so "
                       f"{why}{_where(asked, op)}",
            'add <param name="after-match" value="skip-to-next-row"/> (every start row keeps '
            f'its own match), or remove {asked.name}=')
    return False


def _check_pipeline_stages(c: _Checker, op: OperatorDecl, d: OperatorDef,
                           attrs: dict[str, PatternAttr], requests: dict[str, Any]) -> None:
    """pipeline-stages="k" (and stage-rows="n"): a pattern operator's partial matches pass down
    a chain of k stages as they grow (rewrite_rules/pattern-pipelining.rule)."""
    asked, rows = attrs.get("pipeline-stages"), attrs.get("stage-rows")
    if asked is None:
        if rows is not None:
            c.error(rows.pos, "stage-rows= needs pipeline-stages=",
                    'add e.g. pipeline-stages="2", or remove stage-rows=')
        return
    if op.kind != "pattern":
        c.error(asked.pos, f"pipeline-stages= applies to pattern operators; '{op.name}' is a "
                           f"{op.kind}", 'use pipeline="split" to run it as its own task')
        return
    k = _count(c, asked, 2, 2, MAX_PIPELINE_STAGES)
    n = DEFAULT_STAGE_ROWS if rows is None else _count(c, rows, DEFAULT_STAGE_ROWS, 1,
                                                       MAX_STAGE_ROWS)
    if not _independent(c, op, d, asked, "its stages could not decide their partial matches "
                                         "apart"):
        return
    requests["pipeline-stages"] = k
    requests["stage-rows"] = n


# ----------------------------------------------------------------------------------------------
# File paths: inside the operator's roots (common.paths); kept apart from the checks above

# path parameters naming a file to read
INPUT_PATHS = frozenset({("file-source", "path"), ("kafka-source", "security-file"),
                         ("kafka-sink", "security-file"), ("lookup-join", "path")})


def check_paths(spec: Spec, base: str, roots: PathRoots,
                inputs_must_exist: bool = True) -> list[Diagnostic]:
    """One located error per path parameter (a file source's or sink's `path`) that names a
    place file operators may not use: control characters, a folder, or, relative parts taken
    against `base` and `..` and symbolic links resolved, outside `roots`; and, when
    `inputs_must_exist` (a compile on the machine that runs the query), an input file that is
    not there, with the near names in its folder."""
    found: list[Diagnostic] = []
    for op in spec.operators:
        definition = CATALOGUE.get(op.kind)
        if definition is None:
            continue
        for p in op.params:
            pdef = definition.param(p.name)
            if pdef is None or pdef.kind != "path":
                continue
            try:
                path = confine(p.value.strip(), base, roots)
            except PathRefused as e:
                found.append(Diagnostic(p.value_pos(),
                                        f"parameter '{p.name}' of '{op.name}': {e}",
                                        "see docs/spec-language.md, 'Files'"))
                continue
            if not inputs_must_exist:
                continue
            kind = existing_kind(path)
            if kind is not None:
                found.append(Diagnostic(p.value_pos(),
                                        f"parameter '{p.name}' of '{op.name}': "
                                        f"{p.value.strip()} is {kind}, not a regular file",
                                        "file operators read and write regular files only"))
            elif (op.kind, p.name) in INPUT_PATHS and not os.path.isfile(path):
                found.append(Diagnostic(p.value_pos(),
                                        f"parameter '{p.name}' of '{op.name}': input file "
                                        f"{p.value.strip()} does not exist",
                                        missing_input_hint(path)))
            elif op.kind == "lookup-join":
                found += check_side_table(spec, op, p, path)
    return found


def check_side_table(spec: Spec, op: OperatorDecl, p: ParamDecl, path: str) -> list[Diagnostic]:
    """A lookup join's side file read as its task will read it (`common.side_table`): every
    problem (its line in the side file) at the `path` value. The type's own problems are
    `_lookup_join`'s to report."""
    written = op.param("side-type")
    declared = next((t for t in spec.types if written is not None
                     and t.name == written.value.strip()), None)
    if declared is None or any(col.type_name not in ColumnType.names()
                               for col in declared.columns):
        return []
    schema = Schema.of(*((col.name, col.type_name) for col in declared.columns))
    given = op.param("format")
    fmt = side_table.format_of(path, given.value.strip() if given is not None else None)
    if fmt not in side_table.FORMATS:
        return []  # reported at the format value
    try:
        with open(path, "rb") as f:
            side_table.parse(f.read(side_table.MAX_SIDE_BYTES + 1), fmt, schema)
    except OSError as e:
        return [Diagnostic(p.value_pos(), f"side table of '{op.name}': {p.value.strip()} "
                                          f"cannot be read: {e.strerror}", "")]
    except side_table.SideTableError as e:
        return [Diagnostic(p.value_pos(), f"side table of '{op.name}' ({p.value.strip()}, "
                                          f"{fmt}, rows of type '{declared.name}'): {e}",
                           "fix the file, or the type's columns (docs/spec-language.md, "
                           "'lookup-join')")]
    return []


def existing_kind(path: str) -> str | None:
    """What the file at `path` is when it exists and is not a regular file (a FIFO, a
    folder, a device...); None when it is regular or missing."""
    try:
        return kind_of(os.stat(path).st_mode)
    except OSError:
        return None


def missing_input_hint(path: str) -> str:
    """What to do about a missing input file: the near names in its folder, if any."""
    folder, name = os.path.split(path)
    try:
        names = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)))
    except OSError:
        return f"the folder {folder} does not exist either; name an existing file"
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if near:
        return "did you mean " + " or ".join(repr(n) for n in near) + "?"
    return f"name an existing file in {folder} (or create {name} first)"
