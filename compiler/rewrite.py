"""The rewrite engine: logical graph + rules -> physical graph + a trace of every rule firing.

Owns matching a rule's pattern on a `Graph`, checking its guards, building the replacement the
rule describes (a pure function of the match), splicing it in place of the rule's focus, tagging
what it produced with the rule's name (`Node.origin`, so a rule never fires on its own output),
running the rules phase by phase in the written order (`compiler.rules.PHASES`), and checking
the graph invariants after every firing and every phase: acyclic, one producer per stream, types
agree, placement satisfiable. Does not own the rule language (`compiler.rules`), where rule files
live (`rewrite_rules`) nor cutting the physical graph into tasks (`compiler.tasks`).
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Union

from common import kept
from common.diagnostics import Diagnostic, Position, SpecError
from common.pattern_stages import stage_schema
from common.types import Schema
from compiler.graph import Graph, Node, Stream, render_term
from compiler import kept_columns
from compiler.guards import GUARDS
from compiler.operators import MAX_PATTERN_OPERATORS, PLUMBING
from compiler.rules import (PHASES, Call, Chain, Guard, Loop, PatternTerm, PlacementRef, ReplTerm,
                            Rule, Value)

log = logging.getLogger(__name__)

MAX_FIRINGS_PER_PHASE = MAX_PATTERN_OPERATORS  # validation refuses more requests
Bound = Union[Node, tuple[str, ...]]  # one operator, or (for any*) the streams it stands for


class RewriteError(SpecError):
    """A rule produced a graph that breaks an invariant (or could not be built)."""


@dataclass(frozen=True)
class Firing:
    """One application of a rule, for explain: what matched, and the plan around it before and
    after, in the paper's notation."""

    rule: str
    phase: str
    focus: str  # the operator the rule replaced
    bindings: tuple[tuple[str, str], ...]
    before: str
    after: str
    produced: tuple[str, ...]


@dataclass(frozen=True)
class RewriteResult:
    graph: Graph
    firings: tuple[Firing, ...]


@dataclass(frozen=True)
class Match:
    rule: Rule
    bindings: tuple[tuple[str, Bound], ...]

    def get(self, name: str) -> Bound:
        return dict(self.bindings)[name]

    def node(self, name: str) -> Node:
        bound = self.get(name)
        assert isinstance(bound, Node)
        return bound


# ----------------------------------------------------------------------------------------------
# The driver: phases in order, rules in order, until nothing matches

def rewrite(graph: Graph, rules: tuple[Rule, ...], max_nodes: int | None = None) -> RewriteResult:
    """Apply `rules` phase by phase; raise RewriteError when a firing breaks an invariant.
    `max_nodes` bounds how many distinct nodes one placement group may ask for."""
    firings: list[Firing] = []
    expected: dict[str, tuple[Schema, ...]] = {}
    for phase in PHASES:
        phase_rules = tuple(r for r in rules if r.phase == phase)
        before = graph
        graph, fired = _run_phase(graph, phase_rules, expected, max_nodes)
        firings += fired
        _raise_if_broken(check_invariants(graph, before, expected, max_nodes), phase_rules,
                         f"phase {phase}")
    return RewriteResult(kept_columns.settle(graph), tuple(firings))


def _run_phase(graph: Graph, rules: tuple[Rule, ...], expected: dict[str, tuple[Schema, ...]],
               max_nodes: int | None) -> tuple[Graph, list[Firing]]:
    fired: list[Firing] = []
    for _ in range(MAX_FIRINGS_PER_PHASE + 1):  # the last round finds nothing more to do
        found = next((m for r in rules for m in find_matches(graph, r)), None)
        if found is None:
            return graph, fired
        new_graph, firing, copies = apply(graph, found)
        expected.update(copies)
        _raise_if_broken(check_invariants(new_graph, graph, expected, max_nodes), (found.rule,),
                         f"rule {found.rule.name}")
        log.info("query %s: rule %s fired on %s", graph.name, found.rule.name,
                 found.node(found.rule.focus).name)
        fired.append(firing)
        graph = new_graph
    raise RewriteError([Diagnostic(rules[0].pos, f"rules kept firing more than "
                                                 f"{MAX_FIRINGS_PER_PHASE} times",
                                   "a rule must not match what it produces")])


def _raise_if_broken(problems: list[str], rules: tuple[Rule, ...], where: str) -> None:
    if not problems:
        return
    pos = rules[0].pos if rules else Position("<rewrite>", 1, 1)
    raise RewriteError([Diagnostic(pos, f"after {where}: {p}",
                                   "the rule's replacement is wrong; fix the rule file")
                        for p in problems])


# ----------------------------------------------------------------------------------------------
# Matching (pure)

def find_matches(graph: Graph, rule: Rule) -> Iterator[Match]:
    """Every match of `rule` on `graph` whose guards hold and whose bound operators the rule did
    not produce itself, in graph order."""
    for node in graph.nodes:
        for bindings in _match(graph, rule.pattern, node, {}):
            m = Match(rule, tuple(bindings.items()))
            if _fresh(rule, bindings) and all(guard_holds(g, m) for g in rule.guards):
                yield m


def _fresh(rule: Rule, bindings: dict[str, Bound]) -> bool:
    root = rule.pattern.binding
    return all(not isinstance(b, Node) or name == root or b.origin != rule.name
               for name, b in bindings.items())


def _match(graph: Graph, term: PatternTerm, node: Node,
           bound: dict[str, Bound]) -> Iterator[dict[str, Bound]]:
    if term.kind != "any" and node.kind != term.kind:
        return
    here = dict(bound)
    if term.binding:
        here[term.binding] = node
    yield from _match_args(graph, term.args, node, here)


def _match_args(graph: Graph, args: tuple[PatternTerm, ...], node: Node,
                bound: dict[str, Bound]) -> Iterator[dict[str, Bound]]:
    if not args:
        yield bound
        return
    if len(args) == 1 and not args[0].star and len(node.inputs) > 1:
        for stream in node.inputs:  # k(p): one of the inputs matches p
            yield from _match(graph, args[0], graph.producer(stream), bound)
        return
    yield from _match_ports(graph, args, node.inputs, bound)


def _match_ports(graph: Graph, args: tuple[PatternTerm, ...], inputs: tuple[str, ...],
                 bound: dict[str, Bound]) -> Iterator[dict[str, Bound]]:
    if not args:
        if not inputs:
            yield bound
        return
    first, rest = args[0], args[1:]
    if first.star:
        if not rest:
            yield {**bound, **({first.binding: inputs} if first.binding else {})}
        return
    if not inputs:
        return
    for b in _match(graph, first, graph.producer(inputs[0]), bound):
        yield from _match_ports(graph, rest, inputs[1:], b)


def guard_holds(guard: Guard, m: Match) -> bool:
    """Whether `guard` holds of its bound operator (the predicates are compiler.guards')."""
    definition = GUARDS.get(guard.name)
    if definition is None:
        raise ValueError(f"unknown guard {guard.name}")  # compiler.rules refuses these
    return definition.holds(m.node(guard.args[0]), *guard.args[1:])


# ----------------------------------------------------------------------------------------------
# Building the replacement (pure) and splicing it

_SHORT = {"failover": "fo", "stream-selector": "sel", "merger": "merge", "network-reader": "rd",
          "network-writer": "wr", "multicast": "mc", "splitter": "split"}


@dataclass
class _Build:
    """The new operators of one firing, as they are built."""

    graph: Graph
    match: Match
    focus: Node
    nodes: list[Node] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)
    named: dict[str, list[str]] = field(default_factory=dict)  # term name -> its output streams
    named_nodes: dict[str, str] = field(default_factory=dict)
    expected: dict[str, tuple[Schema, ...]] = field(default_factory=dict)
    stage: tuple[int, int] | None = None  # (i, k) while building copy i of a k-long chain

    @property
    def rule(self) -> Rule:
        return self.match.rule

    def taken(self) -> set[str]:
        return ({n.name for n in self.graph.nodes if n.name != self.focus.name}
                | {n.name for n in self.nodes} | {s.name for s in self.graph.streams}
                | {s.name for s in self.streams})

    def fresh(self, base: str) -> str:
        """`base`, or `base_2`, `base_3`...: a name no operator or stream has, even in another
        case (Spark resolves names regardless of case; validation refuses such names too)."""
        taken = {t.casefold() for t in self.taken()}
        name, n = base, 2
        while name.casefold() in taken:
            name, n = f"{base}_{n}", n + 1
        return name

    def schema(self, stream: str) -> Schema:
        for s in self.streams:
            if s.name == stream:
                return s.schema
        return self.graph.stream(stream).schema

    def label(self, p: PlacementRef | None, env: dict[str, int]) -> str | None:
        if p is None:
            return None
        number = str(env[p.label]) if p.is_var else p.label
        return f"{self.focus.name}.p{number}"


def apply(graph: Graph, m: Match) -> tuple[Graph, Firing, dict[str, tuple[Schema, ...]]]:
    """Splice the replacement of match `m` into `graph` (pure): the focus operator is removed,
    the replacement's outermost new operator produces the focus's output stream."""
    focus = m.node(m.rule.focus)
    b = _Build(graph, m, focus)
    top = m.rule.replacement.args[0]
    assert isinstance(top, (ReplTerm, Chain))
    if isinstance(top, Chain):
        _chain(b, top, {}, out=focus.output)
    else:
        _eval(b, top, {}, out=focus.output)
    if focus.output is not None and not any(n.output == focus.output for n in b.nodes):
        raise RewriteError([Diagnostic(top.pos, f"rule {m.rule.name}: the replacement must end "
                                                "in a new operator that takes the focus's place",
                                       "start the replacement with a plumbing operator or f")])
    new = _splice(graph, focus, b)
    old_names = {n.name for n in graph.nodes if n.name != focus.name}
    after = local_notation(new, new.producer(focus.output), old_names) if focus.output else ""
    firing = Firing(m.rule.name, m.rule.phase, focus.name, _shown(m),
                    local_notation(graph, focus, old_names), after, tuple(n.name for n in b.nodes))
    return new, firing, b.expected


def _shown(m: Match) -> tuple[tuple[str, str], ...]:
    return tuple((name, b.name if isinstance(b, Node) else ", ".join(b))
                 for name, b in m.bindings)


def _eval(b: _Build, t: ReplTerm, env: dict[str, int], out: str | None = None) -> list[str]:
    """The output streams of replacement term `t` (building its operators on the way)."""
    bound = dict(b.match.bindings)
    if t.head in b.named and not t.has_args:
        return list(b.named[t.head])
    if t.binding and t.binding in b.named:
        return list(b.named[t.binding])
    found = bound.get(t.head)
    if isinstance(found, tuple):
        return list(found)
    if found is not None and not t.has_args and t.index is None:
        return [found.produced]
    inputs = [s for a in t.args for s in _eval_arg(b, a, env)]
    if found is not None:
        streams = [_copy(b, t, found, inputs, env, out)]
    elif t.head in PLUMBING:
        streams = _plumbing(b, t, inputs, env, out)
    else:
        raise RewriteError([Diagnostic(t.pos, f"'{t.head}' is used before it is defined",
                                       "name a term (x := ...) before referring to it")])
    if t.binding:
        b.named[t.binding] = streams
    return streams


def _eval_arg(b: _Build, a: Union[ReplTerm, Loop, Chain], env: dict[str, int]) -> list[str]:
    if isinstance(a, ReplTerm):
        return _eval(b, a, env)
    if isinstance(a, Chain):
        return _chain(b, a, env)
    stop = _stop(b, a, env)
    return [s for i in range(a.start, stop + 1) for s in _eval(b, a.body, {**env, a.var: i})]


def _stop(b: _Build, a: Union[Loop, Chain], env: dict[str, int]) -> int:
    stop = _value(b, a.stop, env, 0)
    if not isinstance(stop, int) or stop < a.start:
        raise RewriteError([Diagnostic(a.pos, f"rule {b.rule.name}: the loop bound is {stop!r}, "
                                              "not a number of copies", "")])
    return stop


def _chain(b: _Build, c: Chain, env: dict[str, int], out: str | None = None) -> list[str]:
    """The copies of a chain's body in a row, each reading the previous one's output; the last
    writes `out`. A copy of the focus inside the chain is one stage of it (`_stage_types`)."""
    stop = _stop(b, c, env)
    streams = _eval(b, c.source, env)
    for i in range(c.start, stop + 1):
        b.named[c.prev] = streams
        b.stage = (i - c.start + 1, stop - c.start + 1)
        streams = _eval(b, c.body, {**env, c.var: i}, out=out if i == stop else None)
    b.stage = None
    del b.named[c.prev]
    return streams


def _copy(b: _Build, t: ReplTerm, original: Node, inputs: list[str], env: dict[str, int],
          out: str | None) -> str:
    """The bound operator rebuilt (`f(...)`) or copied (`f[i](...)`) onto new inputs."""
    base = f"{original.name}_{env[t.index]}" if t.index else original.name
    name = base if not t.index and original.name == b.focus.name else b.fresh(base)
    output = out or b.fresh(f"{name}_out")
    reads = tuple(b.graph.stream(s).schema for s in original.inputs)
    writes = b.graph.stream(original.produced).schema
    if b.stage is not None and original.name == b.focus.name:
        reads, writes = _stage_types(b, t, original, reads, writes)
    b.expected[name] = reads
    b.nodes.append(replace(original, name=name, inputs=tuple(inputs), output=output,
                           placement=b.label(t.placement, env), origin=b.rule.name,
                           patterns=_unconsumed(b.rule, t.head, original),
                           max_delay_ms=None if t.index else original.max_delay_ms))
    b.streams.append(Stream(output, writes, name))
    return output


def _stage_types(b: _Build, t: ReplTerm, original: Node, reads: tuple[Schema, ...],
                 writes: Schema) -> tuple[tuple[Schema, ...], Schema]:
    """What stage i of k of a chained pattern operator reads and writes: the first reads the
    operator's input, the last writes its output, and the streams between stages are of
    `common.pattern_stages.stage_schema` (the partial matches they hand on)."""
    if original.kind != "pattern" or len(reads) != 1:
        raise RewriteError([Diagnostic(t.pos, f"rule {b.rule.name}: only a pattern operator "
                                              f"runs in stages; '{original.name}' is a "
                                              f"{original.kind}", "")])
    assert b.stage is not None
    i, k = b.stage
    keys = [reads[0].get(name) for name in original.param("partition-by") or ()]
    between = stage_schema([f for f in keys if f is not None])
    return (reads if i == 1 else (between,)), (writes if i == k else between)


def _unconsumed(rule: Rule, binding: str, node: Node) -> tuple[tuple[str, Any], ...]:
    """The node's pattern requests minus those the rule's `wants` guards consumed, so that no
    rule (this one or another) acts twice on one request."""
    consumed = {g.args[1] for g in rule.guards if g.name == "wants" and g.args[0] == binding}
    return tuple((k, v) for k, v in node.patterns if k not in consumed)


def _plumbing(b: _Build, t: ReplTerm, inputs: list[str], env: dict[str, int],
              out: str | None) -> list[str]:
    definition = PLUMBING[t.head]
    lifted = definition.inputs[1] == 1 and len(inputs) > 1
    groups = [[s] for s in inputs] if lifted else [inputs]
    if lifted and out is not None:
        raise RewriteError([Diagnostic(t.pos, f"rule {b.rule.name}: {t.head} takes one stream, "
                                              "and the focus's place needs one operator", "")])
    streams = []
    for port, group in enumerate(groups):
        shared = "" if t.binding else "".join(f"_{env[v]}" for v in env)  # named: built once
        suffix = shared + (f"_in{port + 1}" if lifted else "")
        name = b.fresh(f"{b.focus.name}_{t.binding or _SHORT.get(t.head, t.head)}{suffix}")
        streams.append(_plumbing_node(b, t, name, group, {**env}, port, out))
        if t.binding:
            b.named_nodes.setdefault(t.binding, name)
    return streams


def _plumbing_node(b: _Build, t: ReplTerm, name: str, inputs: list[str], env: dict[str, int],
                   port: int, out: str | None) -> str:
    params = tuple((p.name, v) for p in t.params
                   if (v := _value(b, p.value, env, port)) is not None)
    output = out or name
    schema = b.schema(inputs[0]) if inputs else b.graph.stream(b.focus.produced).schema
    # a partitioned operator's max-delay is its merger's; its instances (`f[i]`) take none
    max_delay = b.focus.max_delay_ms if t.head == "merger" else None
    b.nodes.append(Node(name, t.head, "plumbing", False, tuple(inputs), output, params,
                        None, b.label(t.placement, env), b.rule.name, max_delay_ms=max_delay))
    b.streams.append(Stream(output, schema, name))
    return output


def _value(b: _Build, v: Value, env: dict[str, int], port: int) -> Any:
    bound = dict(b.match.bindings)
    if isinstance(v, int):
        return v
    if isinstance(v, PlacementRef):
        return b.label(v, env)
    if isinstance(v, Call):
        node = bound[v.args[0]]
        assert isinstance(node, Node)
        if v.name == "request":
            return node.wants(v.args[1])
        if v.name == "param":  # a parameter the spec gave the operator (None: left out)
            return node.param(v.args[1])
        if v.name == "input-request":  # one value per input port, or one for all
            wanted = node.wants(v.args[1])
            if isinstance(wanted, (tuple, list)):
                return wanted[port] if port < len(wanted) else None
            return wanted
        keys = node.wants("partition-keys") or ()
        return keys[port] if port < len(keys) else None
    if v in env:
        return env[v]
    if isinstance(bound_node := bound.get(v), Node):
        return bound_node.name
    return b.named_nodes.get(v, v)


def _splice(graph: Graph, focus: Node, b: _Build) -> Graph:
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    at = position[focus.name]
    nodes = [n for n in graph.nodes if n.name != focus.name] + b.nodes
    streams = [s for s in graph.streams if s.name != focus.output] + b.streams
    ordered = _topological(nodes, {s.name: s.producer for s in streams},
                           lambda n: position.get(n.name, at) if n not in b.nodes else at)
    return Graph(graph.name, tuple(ordered or nodes), tuple(streams), graph.published)


def _topological(nodes: list[Node], producers: dict[str, str], key: Any) -> list[Node] | None:
    """Stable topological order (None if there is a cycle or a missing producer)."""
    names = {n.name for n in nodes}
    found = {n.name: {producers.get(s) for s in n.inputs} for n in nodes}
    if any(None in deps or not deps <= names for deps in found.values()):
        return None
    waiting = {name: {d for d in deps if d is not None} for name, deps in found.items()}
    left = sorted(nodes, key=key)
    rank = {n.name: i for i, n in enumerate(left)}
    if len(rank) != len(left):
        return None  # two operators of one name (check_invariants says so)
    missing = {name: len(deps) for name, deps in waiting.items()}
    readers: dict[str, list[str]] = {}
    for name, deps in waiting.items():
        for d in deps:
            readers.setdefault(d, []).append(name)
    ready = [rank[name] for name, count in missing.items() if count == 0]
    heapq.heapify(ready)
    done: list[Node] = []
    while ready:  # always the first ready operator in `key` order: stable, and linear-ish
        node = left[heapq.heappop(ready)]
        done.append(node)
        for name in readers.get(node.name, ()):
            missing[name] -= 1
            if missing[name] == 0:
                heapq.heappush(ready, rank[name])
    return done if len(done) == len(left) else None


# ----------------------------------------------------------------------------------------------
# Invariants (pure): checked after every firing and every phase

def check_invariants(graph: Graph, before: Graph, expected: dict[str, tuple[Schema, ...]],
                     max_nodes: int | None = None) -> list[str]:
    """What is wrong with `graph` (rewritten from `before`), as sentences; [] when it is fine."""
    problems = _producers(graph)
    if problems:
        return problems
    if _topological(list(graph.nodes), {s.name: s.producer for s in graph.streams},
                    lambda n: 0) is None:
        return ["the graph has a cycle"]
    return _types(graph, before, expected) + _placement(graph, max_nodes)


def _producers(graph: Graph) -> list[str]:
    problems = []
    counts = Counter(s.name for s in graph.streams)
    names = set(counts)
    for name in sorted(n for n, k in counts.items() if k > 1):
        problems.append(f"stream '{name}' has more than one producer")
    nodes = {n.name: n for n in graph.nodes}
    if len(nodes) != len(graph.nodes):
        problems.append("two operators have the same name")
    for s in graph.streams:
        if s.producer not in nodes or nodes[s.producer].output != s.name:
            problems.append(f"stream '{s.name}' has no producer")
    for n in graph.nodes:
        if n.output is not None and n.output not in names:
            problems.append(f"operator '{n.name}' writes stream '{n.output}', which is not in "
                            "the graph")
        problems += [f"operator '{n.name}' reads stream '{s}', which no operator produces"
                     for s in n.inputs if s not in names]
    return problems


def _types(graph: Graph, before: Graph, expected: dict[str, tuple[Schema, ...]]) -> list[str]:
    problems = []
    old = {s.name: s.schema for s in before.streams}
    for s in graph.streams:
        if s.name in old and s.schema != old[s.name]:
            problems.append(f"stream '{s.name}' changed type: {_cols(old[s.name])} became "
                            f"{_cols(s.schema)}")
    for n in graph.nodes:
        ins = tuple(graph.stream(s).schema for s in n.inputs)
        if n.role == "plumbing":
            out = graph.stream(n.output).schema if n.output else None
            made = kept.with_kept(ins[0]) if ins and n.kind == "drop" else None  # adds `kept`
            if any(i != ins[0] for i in ins) or (ins and out not in (ins[0], made)):
                problems.append(f"{n.kind} '{n.name}' mixes stream types: "
                                + "; ".join(_cols(i) for i in ins))
        elif n.name in expected and ins != expected[n.name]:
            problems.append(f"operator '{n.name}' reads ({'; '.join(_cols(i) for i in ins)}) but "
                            f"its operator needs ({'; '.join(_cols(i) for i in expected[n.name])})")
    return problems


def _cols(schema: Schema) -> str:
    return ", ".join(f"{f.name} {f.type.value}" for f in schema)


def placement_groups(graph: Graph) -> dict[str, dict[str, list[str]]]:
    """group -> numbered label -> what must be placed there (operators, or a standby)."""
    groups: dict[str, dict[str, list[str]]] = {}
    for n in graph.nodes:
        labels = [(n.placement, n.name)] if n.placement else []
        labels += [(v, f"standby of {n.param('protects')}") for k, v in n.params
                   if k.endswith("-placement") and isinstance(v, str)]
        for label, what in labels:
            group, _, number = label.rpartition(".p")
            if number != "*":
                groups.setdefault(group, {}).setdefault(f"p{number}", []).append(what)
    return groups


def _placement(graph: Graph, max_nodes: int | None) -> list[str]:
    if max_nodes is None:
        return []
    return [f"placement group '{g}' needs {len(labels)} distinct nodes, the plan allows "
            f"{max_nodes}" for g, labels in placement_groups(graph).items()
            if len(labels) > max_nodes]


# ----------------------------------------------------------------------------------------------
# The paper's notation, around one firing

def local_notation(graph: Graph, top: Node, stop: set[str],
                   printed: set[str] | None = None) -> str:
    """`top` written out in the paper's notation down to the operators in `stop` (by name); an
    operator feeding several others is written out once and named after."""
    printed = set() if printed is None else printed

    def expand(node: Node) -> tuple[str, Iterator[Union[Node, str]]]:
        printed.add(node.name)
        kind = node.kind.replace("-", "_") + (f"@{node.placement}" if node.placement else "")
        return f"{node.name} := {kind}", (p.name if p.name in stop or p.name in printed else p
                                          for p in graph.upstream(node))

    return render_term(top, expand)
