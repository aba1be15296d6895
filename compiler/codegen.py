"""Task programs: one readable Python module per query task, rendered with jinja2.

Owns turning a `TaskPlan` of a graph into the source of the program the executor runs: a
`build(rt)` function that calls the task runtime (`executor.runtime.TaskRuntime`) once per
operator, in dataflow order, ending with the task's one output (a sink or a channel). Every value
that came from the user is written as a Python literal by `py_literal` (repr of a str, int, float,
bool, None, or a tuple of those): user text can never become code (DESIGN.md invariant 4).
Expressions stay text; the runtime parses them with `compiler.expressions`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import jinja2

from compiler.graph import Graph, Node
from compiler.operators import canonical_duration
from compiler.tasks import TaskPlan, channel_id
from compiler.types import Schema

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("compiler", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def py_literal(value: Any) -> str:
    """A Python literal for a plain value; raises TypeError for anything else."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TypeError(f"no literal for {value!r}")
        return repr(value)
    if isinstance(value, (tuple, list)):
        items = ", ".join(py_literal(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    raise TypeError(f"no literal for a {type(value).__name__}")


@dataclass(frozen=True)
class Call:
    """One runtime call of a generated program."""

    comment: str
    method: str
    args: tuple[tuple[str, Any], ...]

    @property
    def rendered(self) -> str:
        """`rt.method(k=v, ...)`, one argument per line when it would not fit in 96 columns."""
        args = [f"{k}={v.const if isinstance(v, SchemaRef) else py_literal(v)}"
                for k, v in self.args]
        one_line = f"rt.{self.method}({', '.join(args)})"
        if len(one_line) <= 96:
            return one_line
        inner = "".join(f"\n        {a}," for a in args)
        return f"rt.{self.method}({inner}\n    )"


@dataclass(frozen=True)
class SchemaRef:
    """A module-level schema constant of the generated program."""

    const: str
    schema: Schema

    @property
    def rendered(self) -> str:
        """`NAME = Schema.of(...)`, one column per line when it would not fit in 96 columns."""
        pairs = [py_literal((f.name, f.type.value)) for f in self.schema]
        one_line = f"{self.const} = Schema.of({', '.join(pairs)})"
        if len(one_line) <= 96:
            return one_line
        inner = "".join(f"\n    {p}," for p in pairs)
        return f"{self.const} = Schema.of({inner}\n)"


def render_task(graph: Graph, plan: TaskPlan, query_id: str, base_dir: Path,
                readers: tuple[str, ...] = ()) -> str:
    """The Python source of one task's program; `readers` are the tasks that read its output
    channel (its writer keeps every batch until each of them has acknowledged it)."""
    schemas: dict[str, SchemaRef] = {}

    def schema_of(stream: str) -> SchemaRef:
        if stream not in schemas:
            schemas[stream] = SchemaRef(f"SCHEMA_{stream.upper()}", graph.stream(stream).schema)
        return schemas[stream]

    calls = [Call(f"{s} <- channel {channel_id(query_id, s)}", "channel_source",
                  (("output", s), ("schema", schema_of(s)), ("channel", channel_id(query_id, s))))
             for s in plan.inputs]
    for name in plan.nodes:
        node = graph.node(name)
        calls.append(_call(graph, node, base_dir, schema_of))
    if plan.output:
        calls.append(Call(f"{plan.output} -> channel {channel_id(query_id, plan.output)}",
                          "channel_sink",
                          (("input", plan.output), ("channel", channel_id(query_id, plan.output)),
                           ("readers", readers))))
    source = _ENV.get_template("task.py.j2").render(
        query_id=query_id, task=plan, calls=calls, schemas=list(schemas.values()),
        plan=_task_notation(graph, plan),
        reads=", ".join(channel_id(query_id, s) for s in plan.inputs) or "no channels",
        writes=channel_id(query_id, plan.output) if plan.output else "its sink",
    )
    ast.parse(source)  # a template bug must never reach an executor
    return source


def _task_notation(graph: Graph, plan: TaskPlan) -> str:
    """The task's tree in the paper's notation; inputs from other tasks show as channels."""
    return _term_without_cuts(graph, graph.node(plan.nodes[-1]), set(plan.nodes))


def _term_without_cuts(graph: Graph, node: Node, members: set[str]) -> str:
    args = ", ".join(_term_without_cuts(graph, graph.producer(s), members)
                     if graph.stream(s).producer in members else f"channel {s}"
                     for s in node.inputs)
    kind = node.kind.replace("-", "_")
    return f"{node.name} := {kind}({args})" if args else f"{node.name} := {kind}"


def resolve_path(base_dir: Path, value: str) -> str:
    path = Path(value)
    return str(path if path.is_absolute() else (base_dir / path))


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _duration(ms: int | None) -> str | None:
    return None if ms is None else canonical_duration(ms)


def _call(graph: Graph, node: Node, base_dir: Path,
          schema_of: Callable[[str], SchemaRef]) -> Call:
    p = node.param
    io: tuple[tuple[str, Any], ...]
    if len(node.inputs) == 1:
        io = (("input", node.inputs[0]),)
    else:
        io = ()
    out = (("output", node.output),) if node.output else ()
    head = (("op", node.name),)
    kind = node.kind
    if kind == "generator":
        args = out + (("schema", schema_of(node.output)), ("shape", p("shape")),
                      ("seed", p("seed")), ("rate", float(p("rate"))), ("limit", p("limit")),
                      ("start", _iso(p("start"))))
    elif kind == "file-source":
        path = resolve_path(base_dir, p("path"))
        fmt = p("format") or ("csv" if path.endswith(".csv") else "jsonl")
        rate = p("rate")
        args = out + (("schema", schema_of(node.output)), ("path", path), ("format", fmt),
                      ("rate", None if rate is None else float(rate)))
    elif kind == "network-source":
        args = out + (("schema", schema_of(node.output)), ("endpoint", p("endpoint")),
                      ("channel", p("channel") or node.output))
    elif kind == "filter":
        args = io + out + (("condition", p("condition")),)
    elif kind == "project":
        args = io + out + (("fields", p("fields")),)
    elif kind == "window-aggregate":
        args = io + out + (("time", p("time")), ("window", _duration(p("size"))),
                           ("slide", _duration(p("slide"))),
                           ("watermark", _duration(p("watermark"))),
                           ("group_by", tuple(p("group-by", ()))),
                           ("aggregates", p("aggregates")))
    elif kind == "join":
        args = (("left", node.inputs[0]), ("right", node.inputs[1])) + out + (
            ("left_keys", p("left-key")), ("right_keys", p("right-key")),
            ("left_time", p("left-time")), ("right_time", p("right-time")),
            ("within", _duration(p("within"))), ("watermark", _duration(p("watermark"))))
    elif kind == "union":
        args = (("inputs", node.inputs),) + out
    elif kind == "file-sink":
        args = io + (("path", resolve_path(base_dir, p("path"))),)
    elif kind == "console-sink":
        args = io
    elif kind == "network-sink":
        args = io + (("endpoint", p("endpoint")), ("channel", p("channel") or node.inputs[0]))
    else:
        raise ValueError(f"no code generator for operator kind {kind!r}")
    return Call(_comment(graph, node), kind.replace("-", "_"), head + args)


def _comment(graph: Graph, node: Node) -> str:
    ups = ", ".join(graph.stream(s).producer for s in node.inputs)
    kind = node.kind.replace("-", "_")
    return f"{node.name} := {kind}({ups})" if ups else f"{node.name} := {kind}"
