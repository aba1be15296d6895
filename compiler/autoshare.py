"""Automatic sharing: a submitted query reads an equal running subgraph's stream instead of
computing it again (docs/queries.md, "Automatic sharing").

Owns three pure steps over a logical `Graph`:
- `forms`: the canonical form of each stream, a digest of the subgraph that computes it:
  every operator's kind and parameters (file paths resolved, expressions with the names of
  their input streams replaced by their port, `$0.temp`), its inputs' forms in port order and
  its output type; operator and stream names, placement, resources and patterns are left out
  (they change where a stream is computed, not what it holds). A stream whose subgraph holds
  an operator whose output depends on when it runs (a source other than a generator or a file,
  a stream-source, a processing-time window, a shedding source) has no form: it is never
  shared.
- `choose`: given offers (form -> the channel of a running query that serves an equal stream),
  the largest shared part: walking back from the sinks, the first offered stream on every path
  is read from the running query, and what only it needed is left out.
- `apply`: each chosen stream's producer becomes a `stream-source` on the running query's
  channel (named as the operator it replaces), the operators no one needs any more go.
In the paper's notation (the rule `sharing` of docs/queries.md; not a rule file: the rule
language's guards see one operator, not a subgraph of another query, and its replacement
rebuilds the focus where this one drops a whole subgraph):

    a2(f := any(a1 := any*))  when  running(q, c) = form(f)
      =>  a2(f := stream_source{stream: q/c, start: retained})

Does not own which running streams are offered (`scheduler.sharing.offers`) nor wiring the
reader to its writer (the scheduler, as for a published stream).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from compiler.expr.lexer import tokenize
from compiler.graph import Graph, Node
from compiler.operators import CATALOGUE

# sources whose stream is fixed by their parameters (a generator is seeded, a file is replayed)
SHAREABLE_SOURCES = frozenset({"generator", "file-source"})
START = "retained"  # where an automatic reader starts (docs/queries.md says why)


@dataclass(frozen=True)
class Share:
    """One stream of the new query read from a running query instead of computed."""

    stream: str  # the new query's stream
    channel: str  # the running query's channel serving an equal stream
    operator: str  # the new query's operator that computed it (its stream-source's name)
    replaced: tuple[str, ...]  # the new query's operators it makes unneeded, dataflow order


def forms(graph: Graph, resolve: Callable[[str], str] = str) -> dict[str, str]:
    """stream name -> canonical form, for every stream that may be shared (see the module)."""
    found: dict[str, str] = {}
    for node in graph.nodes:
        if node.output is None or not _deterministic(node):
            continue
        inputs = [found.get(s) for s in node.inputs]
        if any(i is None for i in inputs):
            continue
        text = json.dumps([node.kind, _params(node, resolve), inputs,
                           graph.stream(node.output).schema.to_json()],
                          sort_keys=True, default=repr)
        found[node.output] = hashlib.sha256(text.encode()).hexdigest()
    return found


def _deterministic(node: Node) -> bool:
    if node.role == "source" and node.kind not in SHAREABLE_SOURCES:
        return False
    if node.role == "plumbing" or node.param("shed") is not None:
        return False
    return node.param("clock", "event") != "processing"


def _params(node: Node, resolve: Callable[[str], str]) -> list[list[Any]]:
    """The parameters as compared: paths resolved, expressions written by port."""
    kinds = {p.name: p.kind for p in CATALOGUE[node.kind].params} \
        if node.kind in CATALOGUE else {}
    shown = []
    for name, value in sorted(node.params):
        if kinds.get(name) == "path" and isinstance(value, str):
            value = resolve(value)
        elif kinds.get(name) == "expression" and isinstance(value, str):
            value = by_port(value, node.inputs)
        elif name in ("fields", "defines") and isinstance(value, tuple):
            value = [[k, by_port(v, node.inputs) if isinstance(v, str) else repr(v)]
                     for k, v in value]
        shown.append([name, value if isinstance(value, (str, list)) else repr(value)])
    return shown


def by_port(expression: str, inputs: tuple[str, ...]) -> str:
    """`expression` with each input stream's name before a `.` written as its port (`$0`), its
    tokens joined by a space; unchanged (but marked) when it does not tokenize."""
    tokens, problems = tokenize(expression)
    if problems:
        return "raw:" + expression
    port = {name.casefold(): i for i, name in enumerate(inputs)}
    out = []
    for i, t in enumerate(tokens):
        follows = i + 1 < len(tokens) and tokens[i + 1].kind == "."
        if t.kind == "name" and follows and t.text.casefold() in port:
            out.append(f"${port[t.text.casefold()]}")
        else:
            out.append(f"{t.kind}:{t.text}")
    return " ".join(out)


def choose(graph: Graph, offers: Mapping[str, str],
           resolve: Callable[[str], str] = str) -> tuple[Share, ...]:
    """The streams of `graph` to read from running queries (`offers`: form -> channel), the
    largest part: an offered stream is chosen when an operator that stays reads it; the
    operators only chosen streams needed are left out. A stream the query publishes itself is
    never chosen (it serves it)."""
    offered = {s: offers[f] for s, f in forms(graph, resolve).items() if f in offers}
    kept: set[str] = set()
    chosen: list[str] = []
    for node in reversed(graph.nodes):
        readers = graph.consumers(node.output) if node.output else ()
        needed = node.output is None or node.output in graph.published or \
            any(c.name in kept for c in readers)
        if not needed:
            continue
        if node.output in offered and node.output not in graph.published:
            chosen.append(node.name)
        else:
            kept.add(node.name)
    shares = []
    for name in reversed(chosen):
        stream = graph.node(name).produced
        shares.append(Share(stream, offered[stream], name,
                            tuple(n.name for n in graph.nodes
                                  if n.name not in kept and _feeds(graph, n.name, name))))
    return tuple(shares)


def _feeds(graph: Graph, upstream: str, node: str) -> bool:
    """Whether `upstream` is `node` or computes part of its input."""
    pending, seen = [node], set()
    while pending:
        at = pending.pop()
        if at == upstream:
            return True
        if at not in seen:
            seen.add(at)
            pending += [graph.stream(s).producer for s in graph.node(at).inputs]
    return False


def apply(graph: Graph, shares: tuple[Share, ...]) -> Graph:
    """`graph` with each share's operator a stream-source on its channel and the operators only
    the shares needed removed (names and the other operators as they were)."""
    if not shares:
        return graph
    by_op = {s.operator: s for s in shares}
    gone = {n for s in shares for n in s.replaced} - set(by_op)
    nodes = []
    for node in graph.nodes:
        if node.name in gone:
            continue
        share = by_op.get(node.name)
        nodes.append(node if share is None else reader(node, share.channel))
    streams = tuple(s for s in graph.streams if s.producer not in gone)
    return replace(graph, nodes=tuple(nodes), streams=streams, _index={}, _streams={},
                   _readers={})


def reader(node: Node, channel: str) -> Node:
    """The stream-source that takes `node`'s place, reading `channel`."""
    return Node(node.name, "stream-source", "source", False, (), node.output,
                (("start", START), ("stream", channel)))
