"""Logical and physical dataflow graphs, and how people see them.

Owns `Graph` (operators as `Node`s connected by named, typed `Stream`s; data only, no behaviour
beyond queries over its shape) and its renderings: the paper's notation
(`sink := file_sink(f := filter(src := generator))`), Graphviz DOT and Mermaid. The same type is
used before rewriting (logical) and after (physical: with the plumbing operators the rewrite rules
insert). Does not own checking a spec (`compiler.validate`) or cutting a graph into tasks
(`compiler.tasks`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, TypeVar, Union

from common.types import Schema

T = TypeVar("T")


@dataclass(frozen=True)
class Node:
    """One operator instance of a graph."""

    name: str
    kind: str
    role: str  # source | transform | sink | plumbing
    stateful: bool
    inputs: tuple[str, ...]  # stream names, in port order
    output: str | None  # stream name, None for sinks
    params: tuple[tuple[str, Any], ...] = ()  # resolved, typed parameters
    partition_keys: tuple[str, ...] | None = None  # None: cannot be partitioned; (): by any key
    placement: str | None = None  # placement annotation (@p1 ...) from rewriting
    origin: str | None = None  # the rule that produced this node, if any
    patterns: tuple[tuple[str, Any], ...] = ()  # patterns the spec asks for (ha, parallelism...)
    cpus: float | None = None  # what the spec asks for this operator's task (None: the default)
    mem_mb: int | None = None
    max_delay_ms: int | None = None  # DPC: how long it waits for a cut-off input (None: ever)

    def wants(self, name: str, default: Any = None) -> Any:
        """The value of a pattern request (`ha`, `replicas`, `parallelism`, `partition-by`,
        `partition-keys`, `pipeline`), or `default`."""
        for key, value in self.patterns:
            if key == name:
                return value
        return default

    @property
    def produced(self) -> str:
        """The output stream of a node that has one (every node but a sink); a ValueError
        naming the node otherwise."""
        if self.output is None:
            raise ValueError(f"operator {self.name} ({self.kind}) has no output stream")
        return self.output

    def param(self, name: str, default: Any = None) -> Any:
        for key, value in self.params:
            if key == name:
                return value
        return default

    def with_params(self, **changes: Any) -> "Node":
        merged = dict(self.params)
        merged.update(changes)
        return replace(self, params=tuple(merged.items()))


@dataclass(frozen=True)
class Stream:
    name: str
    schema: Schema
    producer: str  # node name


@dataclass(frozen=True)
class Graph:
    """A directed acyclic dataflow graph. Nodes are kept in topological order."""

    name: str
    nodes: tuple[Node, ...]
    streams: tuple[Stream, ...]
    # streams other queries may read by name (<output publish="true">, docs/queries.md)
    published: tuple[str, ...] = ()
    _index: dict[str, Node] = field(default_factory=dict, compare=False, repr=False)
    # indexes (built once; a graph is frozen) so that walks over large graphs stay linear
    _streams: dict[str, Stream] = field(default_factory=dict, compare=False, repr=False)
    _readers: dict[str, tuple[Node, ...]] = field(default_factory=dict, compare=False,
                                                  repr=False)

    def __post_init__(self) -> None:
        self._index.update({n.name: n for n in self.nodes})
        for s in reversed(self.streams):
            self._streams[s.name] = s
        readers: dict[str, list[Node]] = {}
        for n in self.nodes:
            for name in dict.fromkeys(n.inputs):
                readers.setdefault(name, []).append(n)
        self._readers.update({name: tuple(ns) for name, ns in readers.items()})

    def node(self, name: str) -> Node:
        return self._index[name]

    def stream(self, name: str) -> Stream:
        return self._streams[name]

    def consumers(self, stream: str) -> tuple[Node, ...]:
        return self._readers.get(stream, ())

    def producer(self, stream: str) -> Node:
        return self.node(self.stream(stream).producer)

    def upstream(self, node: Node) -> tuple[Node, ...]:
        return tuple(self.producer(s) for s in node.inputs)

    def sinks(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.output is None)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)


# ----------------------------------------------------------------------------------------------
# The paper's notation

def notation(graph: Graph) -> list[str]:
    """One line per sink (and per shared stream's consumer tree), e.g.
    `sink := file_sink(avg := window_aggregate(hot := filter(src := generator)))`.
    A node that feeds several consumers is written out once and referred to by name after."""
    printed: set[str] = set()

    def expand(node: Node) -> tuple[str, Iterator[Node | str]]:
        printed.add(node.name)
        kind = node.kind.replace("-", "_")
        if node.placement:
            kind = f"{kind}@{node.placement}"
        return f"{node.name} := {kind}", (up.name if up.name in printed else up
                                          for up in graph.upstream(node))

    return [sink.name if sink.name in printed else render_term(sink, expand)
            for sink in graph.sinks()]


Expansion = Callable[[T], tuple[str, Iterator[Union[T, str]]]]


def render_term(root: T, expand: Expansion[T]) -> str:
    """`head(arg, ...)` of a tree written in the paper's notation, without recursion (a chain of
    any length renders). `expand(node)` gives the node's head and its arguments, each a node
    to expand or a text written as it is; the arguments are drawn lazily, left to right, after
    the node was expanded and everything left of them was written (pre-order)."""
    head, args = expand(root)
    stack: list[tuple[str, Iterator[Union[T, str]], list[str]]] = [(head, args, [])]
    while True:
        head, args, written = stack[-1]
        arg = next(args, _DONE)
        if arg is _DONE:
            stack.pop()
            text = f"{head}({', '.join(written)})" if written else head
            if not stack:
                return text
            stack[-1][2].append(text)
        elif isinstance(arg, str):
            written.append(arg)
        else:
            stack.append((*expand(arg), []))


_DONE: Any = object()


# ----------------------------------------------------------------------------------------------
# Pictures

_SHAPES = {"source": "invhouse", "sink": "house", "transform": "box", "plumbing": "diamond"}


def to_dot(graph: Graph, clusters: dict[str, list[str]] | None = None) -> str:
    """Graphviz DOT; `clusters` groups nodes (e.g. by query task) into boxes."""
    lines = [f'digraph "{graph.name}" {{', "  rankdir=LR;",
             '  node [fontname="Helvetica", fontsize=11];']
    grouped = {n for members in (clusters or {}).values() for n in members}
    for i, (label, members) in enumerate((clusters or {}).items()):
        lines.append(f'  subgraph cluster_{i} {{ label="{label}"; style=rounded; color=grey50;')
        lines.extend(f"    {_dot_node(graph.node(m))}" for m in members)
        lines.append("  }")
    lines.extend(f"  {_dot_node(n)}" for n in graph.nodes if n.name not in grouped)
    for n in graph.nodes:
        for s in n.inputs:
            stream = graph.stream(s)
            lines.append(f'  "{stream.producer}" -> "{n.name}" [label="{s}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_node(n: Node) -> str:
    state = "\\nstateful" if n.stateful else ""
    where = f"\\n@{n.placement}" if n.placement else ""
    return (f'"{n.name}" [label="{n.name}\\n{n.kind}{state}{where}", '
            f'shape={_SHAPES.get(n.role, "box")}];')


def to_mermaid(graph: Graph, clusters: dict[str, list[str]] | None = None) -> str:
    """Mermaid flowchart text (renders on GitHub and in most Markdown viewers)."""
    lines = ["flowchart LR"]
    grouped = {n for members in (clusters or {}).values() for n in members}
    for label, members in (clusters or {}).items():
        lines.append(f'  subgraph {re.sub(r"[^A-Za-z0-9_]", "_", label)}["{label}"]')
        lines.extend(f"    {_mermaid_node(graph.node(m))}" for m in members)
        lines.append("  end")
    lines.extend(f"  {_mermaid_node(n)}" for n in graph.nodes if n.name not in grouped)
    for n in graph.nodes:
        for s in n.inputs:
            lines.append(f"  {graph.stream(s).producer} -->|{s}| {n.name}")
    return "\n".join(lines) + "\n"


def _mermaid_node(n: Node) -> str:
    label = f"{n.name}<br/>{n.kind}" + ("<br/>stateful" if n.stateful else "")
    open_, close = {"source": ("[/", "/]"), "sink": ("[\\", "\\]"),
                    "plumbing": ("{{", "}}")}.get(n.role, ("[", "]"))
    return f'{n.name}{open_}"{label}"{close}'
