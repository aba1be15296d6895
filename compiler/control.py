"""What a running query lets people change, and whether a control tuple may change it.

Owns building the control catalogue of a compiled query (`common.control.ControlCatalog`: for
every operator of the spec, its adjustable parameters with their type, current value and where
each lives at run time - the task and the program's operator id of every physical copy - and the
parameters that are fixed, with the reason) with `catalog_for` from the logical and physical
graphs and the task cut,
and the pure check of a control tuple `<query, operator, parameter, value>` against it
(`check_tuple`, `check_tuples`: every problem of a request at once, nothing applied unless all
pass). A filter condition is parsed and type-checked here, with the expression language the spec
uses, before anything reaches a task; every value is checked against its range (a rate finite
and within the spec's own bounds, `compiler.operators.MIN_RATE..MAX_RATE`; a condition at most
MAX_CONDITION_CHARS long; a sink path inside the path roots the query was compiled with,
`common.paths`). Does not own sending changes
(`scheduler`) or applying them at a batch boundary (`executor.task_runner`, `executor.runtime`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, cast

from common.control import (ADJUSTABLE, ALIASES, PARALLELISM, PARTITION_KEY, Adjustable, Change, ControlCatalog,
                            ControlRefused, Fixed, Target)
from common.paths import PathRefused, PathRoots, confine
from common.tasks import ElasticOperator, splitter_op_id
from compiler import expr
from compiler.operators import CATALOGUE, PLUMBING, ParamDef, ParamValueError, parse_value

if TYPE_CHECKING:
    from compiler.graph import Graph, Node
    from compiler.tasks import TaskPlan


_STATE_REASON = {
    "window-aggregate": "its windows hold per-group state built with this value; changing it "
                        "on a running aggregate would corrupt that state (stop the query and "
                        "resubmit the spec instead)",
    "join": "its buffered tuples were matched and kept with this value; changing it on a "
            "running join would corrupt that state (stop the query and resubmit the spec)",
    "pattern": "its partial matches per key were built with this value; changing it on a "
               "running pattern would corrupt them (stop the query and resubmit the spec)",
    "top-n": "its windows (with ttl: its rankings) hold each group's rows, to be ranked, with "
             "this value; changing it on a running top-n would corrupt that state (stop the "
             "query and resubmit the spec)",
    "aggregate": "its groups' running totals were built with this value; changing it on a "
                 "running aggregate would corrupt them (stop the query and resubmit the spec)",
    "deduplicate": "the keys it has seen were kept with this value; changing it on a running "
                   "deduplication would pass duplicates or drop new keys (resubmit the spec)",
}
_FIXED_REASON = {
    "shape": "the generated stream's columns are fixed by its shape",
    "seed": "the generated stream is a function of its seed; a new one would replay other data",
    "start": "event time already emitted cannot move",
    "limit": "fixed at start: stop the query instead",
    "format": "the file is read in one format",
    "channel": "readers address the channel by this id",
}
_CHILD_REASON = {
    "window-aggregate": (("aggregate", _STATE_REASON["window-aggregate"]),),
    "aggregate": (("aggregate", _STATE_REASON["aggregate"]),),
    "pattern": (("define", _STATE_REASON["pattern"]),
                ("field", "the measures are the schema the operators downstream were compiled "
                          "against; resubmit the spec to change them")),
    "project": (("field", "the output columns are the schema the operators downstream were "
                          "compiled against; resubmit the spec to change them"),),
}
_MULTICAST_REASON = ("every hot-standby replica must receive every tuple so the replicas stay "
                     "identical; another distribution would make them diverge")
_REPLICA_REASON = ("its hot-standby replicas must stay identical, and a change cannot reach them "
                   "at the same batch; resubmit the spec to change it")
_SIMPLE_NAME = re.compile(r"^(?P<base>.+)_(?P<n>\d+)$")
# What a control tuple's value may be (docs/control.md): a rate in tuples per second, and the
# length of a condition's text (its nesting is bounded by the expression parser).
MAX_CONDITION_CHARS = 10_000


# --- building the catalogue (pure) --------------------------------------------------------------

def catalog_for(logical: "Graph", physical: "Graph", plans: "tuple[TaskPlan, ...]",
                resolve: Callable[[str], str] = lambda path: path,
                roots: PathRoots = PathRoots(()),
                elastic: tuple[ElasticOperator, ...] = ()) -> ControlCatalog:
    """The control catalogue of a compiled query; `resolve` makes a spec's relative paths
    absolute, as the tasks see them; a new sink path must lie inside `roots`; the parallelism
    of each `elastic` operator is adjustable (stateless) or fixed (stateful)."""
    task_of = {node: plan.task_id for plan in plans for node in plan.nodes}
    copies_of = copies_by_name(physical, {n.name for n in logical.nodes})
    splitters = tuple(n for n in physical.nodes if n.kind == "splitter")  # once, not per node
    adjustable: list[Adjustable] = []
    fixed: list[Fixed] = []
    for node in logical.nodes:
        copies = [p for p in copies_of.get(node.name, ()) if p.kind == node.kind]
        if node.wants("ha") == "hot-standby" and len(copies) > 1:
            fixed += [Fixed(node.name, parameter, _REPLICA_REASON)
                      for parameter in ADJUSTABLE.get(node.kind, {})]
        else:
            adjustable += _adjustables(logical, node, copies, task_of, resolve)
        fixed += _fixed(node)
        routing = _routing(node, physical, splitters, copies, task_of, plans)
        if isinstance(routing, Adjustable):
            adjustable.append(routing)
        elif routing is not None:
            fixed.append(routing)
    drops = tuple(n for n in physical.nodes if n.kind == "drop" and n.name in task_of)
    adjustable += [_drop_ratio(n, task_of[n.name], parameter) for n in drops
                   for parameter in DROP_RATIOS if parameter == "ratio"
                   or n.param("mode") == "semantic"]
    for e in elastic:
        found = _parallelism(e, {n.name: n.kind for n in logical.nodes})
        if isinstance(found, Adjustable):
            adjustable.append(found)
        else:
            fixed.append(found)
    return ControlCatalog(tuple(adjustable), tuple(fixed),
                          tuple((n.name, n.kind) for n in (*logical.nodes, *drops)), roots.roots)


# A drop operator's ratios (rewrite_rules/shedding.rule): parameter -> runtime keyword.
DROP_RATIOS = {"ratio": "ratio", "high-ratio": "high_ratio"}


def _drop_ratio(node: "Node", task_id: str, parameter: str) -> Adjustable:
    """A drop operator's ratio, set by the scheduler's shedding plan (or by hand)."""
    definition = PLUMBING["drop"].param(parameter)
    assert definition is not None
    return Adjustable(node.name, "drop", parameter, "float", _as_text(node.param(parameter, 0)),
                      (Target(task_id, node.name, DROP_RATIOS[parameter]),), (),
                      definition.doc)


def _parallelism(e: ElasticOperator, kinds: dict[str, str]) -> Adjustable | Fixed:
    """The number of instances an elastic operator's splitters route to: adjustable within
    its bounds for a stateless operator; fixed for a stateful one (each instance holds its
    keys' state, which does not move between instances yet)."""
    if e.stateful and e.switch_time is None:
        return Fixed(e.operator, PARALLELISM,
                     "each instance holds the state of the keys routed to it; only window "
                     "aggregates and joins hand their state over at run time for now")
    return Adjustable(e.operator, kinds[e.operator], PARALLELISM, "count", str(e.initial),
                      tuple(Target(task, op, "active") for task, op in e.splitters), (),
                      f"instances the operator runs on, {e.minimum} to {e.maximum} "
                      "(`elastiq scale`)", (e.minimum, e.maximum))


def copies_by_name(physical: "Graph", logical_names: set[str]) -> dict[str, list["Node"]]:
    """Spec operator name -> its physical instances, in physical order: itself, or its numbered
    copies (partitions, hot-standby replicas) that the rewrite rules named `<name>_<i>` (a name
    that is itself a spec operator's is that operator's only). One pass over the plan, so the
    catalogue is linear in its size."""
    found: dict[str, list["Node"]] = {}
    for p in physical.nodes:
        found.setdefault(p.name, []).append(p)
        m = _SIMPLE_NAME.match(p.name)
        if m and p.name not in logical_names:
            found.setdefault(m.group("base"), []).append(p)
    return found


def _adjustables(logical: "Graph", node: "Node", copies: list["Node"],
                 task_of: dict[str, str], resolve: Callable[[str], str]) -> list[Adjustable]:
    out = []
    definition = CATALOGUE.get(node.kind)
    for parameter, keyword in ADJUSTABLE.get(node.kind, {}).items():
        pdef = definition.param(parameter) if definition else None
        targets = tuple(Target(task_of[c.name], c.name, keyword) for c in copies
                        if c.name in task_of)
        if pdef is None or not targets:
            continue
        scope = tuple((s, logical.stream(s).schema) for s in node.inputs) \
            if pdef.kind == "expression" else ()
        value = _as_text(node.param(parameter))
        if pdef.kind == "path":
            value = resolve(value)
        out.append(Adjustable(node.name, node.kind, parameter, pdef.kind, value, targets, scope,
                              pdef.doc))
    return out


def _fixed(node: "Node") -> list[Fixed]:
    definition = CATALOGUE.get(node.kind)
    if definition is None:
        return []
    movable = ADJUSTABLE.get(node.kind, {})
    reasons = []
    for pdef in definition.params:
        if pdef.name in movable:
            continue
        reason = _STATE_REASON.get(node.kind) or _FIXED_REASON.get(pdef.name) or \
            "fixed while the query runs"
        reasons.append(Fixed(node.name, pdef.name, reason))
    for child in _CHILD_REASON.get(node.kind, ()):
        reasons.append(Fixed(node.name, *child))
    if node.wants("replicas") is not None or node.wants("ha") == "hot-standby":
        reasons.append(Fixed(node.name, "distribution", _MULTICAST_REASON))
    return reasons


def _routing(node: "Node", physical: "Graph", splitters: "tuple[Node, ...]", copies: list["Node"],
             task_of: dict[str, str], plans: "tuple[TaskPlan, ...]") -> Adjustable | Fixed | None:
    """The key routing of a partitioned operator's splitter (one of `splitters`, the physical
    graph's): adjustable for a stateless operator, fixed for a stateful one (each partition
    holds its keys' state)."""
    copy_names = {c.name for c in copies}
    for splitter in splitters:
        if not feeds(physical, splitter, copy_names):
            continue
        if node.stateful:
            return Fixed(node.name, PARTITION_KEY,
                         "each partition holds the state of the keys routed to it; routing a key "
                         "elsewhere would split its state")
        task_id = task_of.get(splitter.name)
        plan = next((p for p in plans if p.task_id == task_id), None)
        if plan is None:
            return None
        op = splitter_op_id(plan.outputs)
        key = splitter.param("key")
        return Adjustable(node.name, node.kind, PARTITION_KEY, "columns",
                          key if isinstance(key, str) else ",".join(key or ()),
                          (Target(plan.task_id, op, "key"),),
                          tuple((s, physical.stream(s).schema) for s in splitter.inputs),
                          "columns whose hash routes a tuple to a partition "
                          "(empty: all columns)")
    return None


def feeds(physical: "Graph", splitter: "Node", copies: set[str]) -> bool:
    """Whether the splitter's partitions reach the copies through network readers only."""
    assert splitter.output is not None
    for reader in physical.consumers(splitter.output):
        if reader.output is not None and any(c.name in copies
                                             for c in physical.consumers(reader.output)):
            return True
    return False


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# --- checking control tuples (pure) -------------------------------------------------------------

def check_tuple(catalog: ControlCatalog, query_id: str, operator: str, parameter: str,
                value: str) -> Change:
    """A control tuple -> the change it makes; ControlRefused (one problem) when it may not be
    applied: an unknown operator or parameter, a fixed parameter (with the reason), a value of
    the wrong form or an expression that does not parse or type-check."""
    parameter = ALIASES.get(parameter, parameter)
    kinds = dict(catalog.operators)
    if operator not in kinds:
        raise ControlRefused([f"query {query_id} has no operator {operator!r} (operators: "
                              f"{', '.join(sorted(kinds)) or 'none'})"], 404)
    adjustable = catalog.find(operator, parameter)
    if adjustable is None:
        raise ControlRefused([_not_adjustable(catalog, operator, kinds[operator], parameter)])
    if not isinstance(value, str):
        raise ControlRefused([f"{operator}.{parameter}: the value must be text"])
    try:
        runtime_value = _runtime_value(adjustable, value, PathRoots(catalog.path_roots))
    except (ParamValueError, PathRefused, expr.ExpressionError) as exc:
        raise ControlRefused([f"{operator}.{parameter} = {_shown(value)}: {exc}"]) from None
    return Change(adjustable, value.strip(), runtime_value)


def check_tuples(catalog: ControlCatalog, query_id: str,
                 tuples: list[tuple[str, str, str]]) -> list[Change]:
    """Every tuple checked; ControlRefused with every problem when any fails. Two tuples
    setting the same parameter are refused too (which one would win is not obvious)."""
    changes: list[Change] = []
    problems: list[str] = []
    statuses: set[int] = set()
    seen: set[tuple[str, str]] = set()
    for operator, parameter, value in tuples:
        try:
            change = check_tuple(catalog, query_id, operator, parameter, value)
        except ControlRefused as exc:
            problems += exc.problems
            statuses.add(exc.status)
            continue
        key = (operator, change.adjustable.parameter)
        if key in seen:
            problems.append(f"{operator}.{change.adjustable.parameter} is set twice in one "
                            "request")
        seen.add(key)
        changes.append(change)
    if not tuples:
        problems.append("no control tuples given")
    if problems:
        raise ControlRefused(problems, statuses.pop() if len(statuses) == 1 else 400)
    return changes


def _not_adjustable(catalog: ControlCatalog, operator: str, kind: str, parameter: str) -> str:
    for f in catalog.fixed:
        if f.operator == operator and f.parameter == parameter:
            return f"{operator}.{parameter} cannot change while the query runs: {f.reason}"
    names = sorted(a.parameter for a in catalog.adjustable if a.operator == operator)
    offer = f"adjustable: {', '.join(names)}" if names else "it has no adjustable parameters"
    found = f"{operator} ({kind}) has no parameter {parameter!r} ({offer})"
    if parameter == PARALLELISM and kind in PARTITIONABLE_KINDS:
        return f"{found}: {_slots_needed(operator, kind)}"
    return found


PARTITIONABLE_KINDS = ("filter", "project", "union", "window-aggregate", "join")


def _slots_needed(operator: str, kind: str) -> str:
    """What to write so that `operator` can be rescaled (item 5 of issue 31 measured that
    default dormant slots are not free: docs/elasticity.md, "Asking for it")."""
    keyed = {"window-aggregate": " (keyed: with group-by)", "join": " (keyed: with key)"}
    return (f"it was compiled without instance slots; add max-parallelism=\"4\" (2 to 64) to "
            f"<operator name=\"{operator}\"> in the spec{keyed.get(kind, '')} and submit it "
            f"again. There is no default: slots make the operator a splitter, instances and a "
            f"merger, two more tasks and two more channel hops even at parallelism 1")


def _runtime_value(adjustable: Adjustable, text: str, roots: PathRoots) -> Any:
    if adjustable.value_kind == "expression":
        if len(text) > MAX_CONDITION_CHARS:
            raise ParamValueError(f"the condition has {len(text)} characters; at most "
                                  f"{MAX_CONDITION_CHARS} are taken")
        scope = expr.Scope(dict(adjustable.scope))
        expr.compile_condition(text, scope)
        return text.strip()
    if adjustable.value_kind == "count":
        return _count(text, adjustable.bounds or (1, 1))
    if adjustable.value_kind == "columns":
        columns = cast("list[str]", parse_value(ParamDef(adjustable.parameter, "columns"),
                                                text))  # a list of names for kind "columns"
        known = {n for _, schema in adjustable.scope for n in schema.names}
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise ParamValueError(f"no column {', '.join(unknown)} in the input "
                                  f"(columns: {', '.join(sorted(known))})")
        return tuple(columns)
    definition = (CATALOGUE.get(adjustable.kind) or PLUMBING[adjustable.kind]).param(
        adjustable.parameter)
    assert definition is not None
    if adjustable.value_kind == "path":
        return _sink_path(text, roots)
    value = parse_value(definition, text)  # a rate: finite, within MIN_RATE..MAX_RATE
    if adjustable.value_kind == "endpoint" and str(value).startswith("tcp://*"):
        raise ParamValueError("name the host readers reach, e.g. tcp://127.0.0.1:7000")
    return value


def _count(text: str, bounds: tuple[int, int]) -> int:
    low, high = bounds
    try:
        value = int(text.strip())
    except ValueError:
        raise ParamValueError(f"{_shown(text)} is not a whole number; write one from {low} "
                              f"to {high}") from None
    if not low <= value <= high:
        fold = "; 0 folds it into the task after it, which min-parallelism=\"0\" on a " \
               "stateless operator allows" if value == 0 else ""
        raise ParamValueError(f"{value} is outside {low}..{high} (the operator's "
                              f"min-parallelism and its instance slots, max-parallelism){fold}")
    return value


def _shown(value: str, limit: int = 120) -> str:
    """A refused value as a refusal quotes it: its repr, shortened past `limit` characters."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} chars)"


def _sink_path(text: str, roots: PathRoots) -> str:
    """A sink's new path: absolute (the task opens it, wherever it runs), no control
    characters, a file name (not a folder), and, `..` and symbolic links resolved, inside the
    roots the query was compiled with (a catalogue without roots confines nothing here: the
    task re-checks against its own when it opens the file)."""
    value = text.strip()
    if not value.startswith("/"):
        raise ParamValueError("a sink's new path must be absolute (it is opened by the task, "
                              "wherever it runs)")
    if not roots.roots:
        confine(value, "/", PathRoots(("/",)))
        return value
    return confine(value, "/", roots)
