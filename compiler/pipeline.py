"""The compiler's front door: spec text in, a `CompiledQuery` (or every diagnostic) out.

Owns the order of the compiler's steps, as docs/architecture.md draws them: parse + structure check
(`spec`), semantic check into a logical graph (`validate`; file paths against the path roots the
caller gives, `paths`), rewrite into a physical graph (`rewrite`, with the shipped rules of
`rewrite_rules/` plus an optional user rule folder; the identity when the spec asks for no
pattern; then `kafka_partitions`: each instance of a partitioned stateless operator reads its
own Kafka partitions), split into tasks (`tasks`), and generate each task's program
(`codegen`). The CLI and the scheduler's API both call `compile_spec_text`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Collection, Mapping

from common.diagnostics import Diagnostic, Position, SpecError, cap_diagnostics
from common.paths import PathRoots, local_roots
from common.tasks import (ChannelSpec, CompiledQuery, OperatorPlan, QueryTask, StreamImport,
                          channel_id)
from compiler import autoshare, codegen, kafka_partitions, realtime, spec as spec_mod, validate
from compiler.control import catalog_for
from compiler.elastic import elastic_operators
from compiler.graph import Graph
from compiler.guards import GUARDS
from compiler.rewrite import Firing, rewrite
from compiler.rules import Rule, load_rules
from compiler.tasks import TaskPlan, split_into_tasks, task_resources
from rewrite_rules import rule_files


@dataclass(frozen=True)
class Compilation:
    """Every intermediate product of one compilation, for `explain` and the tests."""

    spec: spec_mod.Spec
    logical: Graph
    physical: Graph
    plans: tuple[TaskPlan, ...]
    query: CompiledQuery
    warnings: tuple[Diagnostic, ...]
    firings: tuple[Firing, ...] = ()  # every rule that fired, in order
    # errors that stop `compile` after rewriting (a plan the runtime cannot run); only a
    # plan_only compilation (explain) comes back with them, its tasks shown all the same
    refused: tuple[Diagnostic, ...] = ()
    # automatic sharing (docs/queries.md): the streams read from running queries instead of
    # computed, and the logical plan as written (`logical` is the plan with them read)
    shares: tuple[autoshare.Share, ...] = ()
    written: Graph | None = None


def check_spec_text(text: str | bytes, filename: str, base_dir: str | Path | None = None,
                    path_roots: PathRoots | None = None,
                    check_inputs: bool = False, room: validate.AgentRoom | None = None
                    ) -> tuple[Graph | None, list[Diagnostic]]:
    """What `elastiq validate` checks: structure and meaning of a spec, its file paths against
    `path_roots` (see `compile_spec_text`), and that its plan, rewritten with the shipped rules,
    is one `compile` takes (`_unrunnable`), so a spec this accepts compiles; with `room`, that
    no operator asks for more than a task may have there. Its logical graph (None on errors)
    and all diagnostics."""
    base = _base(filename, base_dir)
    try:
        parsed, graph, everything = _checked(text, filename, base, _roots(base, path_roots),
                                             check_inputs, room)
        refused = () if graph is None else _unrunnable(parsed, rewrite(graph, rules_for()).graph)
    except SpecError as e:
        return None, list(e.diagnostics)
    if refused:
        return None, cap_diagnostics(everything + list(refused))
    return graph, everything


def logical_graph_text(text: str | bytes, filename: str, base_dir: str | Path | None = None,
                       path_roots: PathRoots | None = None) -> tuple[Graph | None,
                                                                     list[Diagnostic]]:
    """Structure and meaning only: the logical graph (None on errors) and all diagnostics,
    whether or not the rewritten plan is deployable (for tools and tests of the rewriting)."""
    base = _base(filename, base_dir)
    try:
        _, graph, everything = _checked(text, filename, base, _roots(base, path_roots))
    except SpecError as e:
        return None, list(e.diagnostics)
    return graph, everything


def _checked(text: str | bytes, filename: str, base: Path, roots: PathRoots,
             check_inputs: bool = False, room: validate.AgentRoom | None = None
             ) -> tuple[spec_mod.Spec, Graph | None, list[Diagnostic]]:
    """The parsed spec, its logical graph (None when any diagnostic is an error) and every
    diagnostic; SpecError when the text is not even well-formed XML. `check_inputs`: input
    files must exist (a compile on the machine whose files the query reads); `room`: the most
    a task may ask for on the cluster (`validate.check`)."""
    parsed, problems = spec_mod.read_spec(text, filename)
    graph, semantic = validate.check(parsed, capped=False, room=room)
    everything = cap_diagnostics(problems + semantic
                                 + validate.check_paths(parsed, str(base), roots,
                                                        check_inputs))
    if any(d.severity == "error" for d in everything):
        return parsed, None, everything
    return parsed, graph, everything


def _base(filename: str, base_dir: str | Path | None) -> Path:
    """The folder a spec's relative paths are taken from: `base_dir`, else the spec's own."""
    return Path(base_dir) if base_dir is not None else Path(filename).resolve().parent


def _roots(base: Path, path_roots: PathRoots | None) -> PathRoots:
    """The roots file paths must lie in: `path_roots` as given (a service compiling for remote
    clients passes its configured ones, so a client's folder only resolves relative paths),
    else those of a local compile, whose spec folder `base` is one (`paths.local_roots`)."""
    return path_roots if path_roots is not None else local_roots(base)


def compile_spec_text(text: str | bytes, filename: str, base_dir: str | Path | None = None,
                      query_id: str | None = None, rules_dir: str | Path | None = None,
                      plan_only: bool = False,
                      path_roots: PathRoots | None = None,
                      check_inputs: bool = False,
                      room: validate.AgentRoom | None = None,
                      task_ids: Mapping[str, str] | None = None,
                      retired: Collection[str] = (),
                      offers: Mapping[str, str] | None = None) -> Compilation:
    """Compile a spec; raise SpecError with every error (and warning) found.
    Relative file paths in the spec are taken relative to `base_dir` (default: the spec file's
    folder), and every file path must then lie inside `path_roots` (default: the local roots,
    `paths.local_roots(base)`; the scheduler's API passes its configured roots, so the folder a
    remote client names serves to resolve paths and widens nothing). `rules_dir` adds a folder
    of user rule files. A rewritten plan the runtime cannot run (hot standby of an operator
    with several inputs) raises a located SpecError, unless `plan_only` (explain), which
    returns it with those diagnostics in `refused`. `check_inputs` (the CLI's validate,
    explain, compile and run): every input file must exist. `room` (`elastiq run`, which knows
    its agents): an operator's cpus=/mem= over it is refused at its value. `task_ids` (root
    operator -> task id) and `retired`: the task ids a running query keeps and those it held
    (an update: `compiler.tasks.task_ids`). `offers` (canonical form -> channel of a running
    query serving an equal stream, `scheduler.sharing.offers`): the largest part of the plan
    they cover is read from those channels instead of computed (`compiler.autoshare`), unless
    the dataflow says share="false"."""
    base = _base(filename, base_dir)
    roots = _roots(base, path_roots)
    parsed, graph, everything = _checked(text, filename, base, roots, check_inputs, room)
    if graph is None:
        raise SpecError(everything)
    return _finish(parsed, graph, query_id or parsed.name, base, tuple(everything),
                   rules_for(rules_dir), plan_only, roots, task_ids, retired, offers)


def compile_spec_file(path: str | Path, base_dir: str | Path | None = None,
                      rules_dir: str | Path | None = None, plan_only: bool = False,
                      path_roots: PathRoots | None = None,
                      check_inputs: bool = False,
                      room: validate.AgentRoom | None = None,
                      offers: Mapping[str, str] | None = None) -> Compilation:
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise SpecError([_unreadable(path, e)]) from None
    return compile_spec_text(text, str(path), base_dir, rules_dir=rules_dir, plan_only=plan_only,
                             path_roots=path_roots, check_inputs=check_inputs, room=room,
                             offers=offers)


def rules_for(rules_dir: str | Path | None = None) -> tuple[Rule, ...]:
    """The shipped rules plus those of `rules_dir`; SpecError (file:line:column) on a bad file."""
    return _shipped_rules() if rules_dir is None else _load_rules(str(rules_dir))


@lru_cache(maxsize=1)
def _shipped_rules() -> tuple[Rule, ...]:
    return _load_rules(None)


def _load_rules(rules_dir: str | None) -> tuple[Rule, ...]:
    try:
        files = rule_files(rules_dir)
    except FileNotFoundError as e:
        raise SpecError([Diagnostic(Position(str(rules_dir), 1, 1), str(e),
                                    "pass an existing folder of *.rule files")]) from None
    return load_rules(files)


def _unreadable(path: Path, e: OSError) -> Diagnostic:
    return Diagnostic(Position(str(path), 1, 1), f"cannot read the spec: {e.strerror}",
                      "check the path")


def _finish(parsed: spec_mod.Spec, logical: Graph, query_id: str, base: Path,
            warnings: tuple[Diagnostic, ...], rules: tuple[Rule, ...],
            plan_only: bool, roots: PathRoots, task_ids: Mapping[str, str] | None = None,
            retired: Collection[str] = (), offers: Mapping[str, str] | None = None
            ) -> Compilation:
    def resolve(path: str) -> str:
        return str(codegen.resolve_path(base, path))

    written = logical
    shares = autoshare.choose(logical, offers, resolve) if offers and parsed.share else ()
    logical = autoshare.apply(logical, shares)
    rewritten = rewrite(logical, rules)
    physical, kafka_firings = kafka_partitions.read_in_instances(rewritten.graph)
    refused = _unrunnable(parsed, physical)
    if refused and not plan_only:
        raise SpecError(list(refused))
    plans, channels = split_into_tasks(physical, query_id, task_ids, retired)
    by_id = {c.channel_id: c for c in channels}
    tasks = tuple(_task(physical, plan, query_id, base, by_id) for plan in plans)
    sinks = {n.name: str(codegen.resolve_path(base, n.param("path")))
             for n in physical.sinks() if n.kind == "file-sink"}
    elastic = elastic_operators(logical, physical, plans, by_id)
    query = CompiledQuery(query_id, tasks, channels, sinks,
                          catalog_for(logical, physical, plans,
                                      lambda path: str(codegen.resolve_path(base, path)),
                                      roots, elastic), elastic,
                          {n.name: float(n.param("weight", 1)) for n in physical.sinks()},
                          tuple(channel_id(query_id, s) for s in physical.published),
                          _imports(parsed, physical, plans, {s.operator for s in shares}),
                          operator_plans(parsed, physical, plans, resolve),
                          shareable(query_id, written, physical, channels, resolve),
                          parsed.distribute,
                          {n.name: codegen.kafka_sink_ref(n, base)
                           for n in physical.sinks() if n.kind == "kafka-sink"})
    return Compilation(parsed, logical, physical, plans, query, warnings,
                       rewritten.firings + kafka_firings, refused, shares,
                       written if shares else None)


def shareable(query_id: str, written: Graph, physical: Graph, channels: tuple[ChannelSpec, ...],
              resolve: Callable[[str], str]) -> tuple[tuple[str, str], ...]:
    """(channel id, canonical form) of each channel the query serves that another query may
    read instead of computing an equal stream (`compiler.autoshare`): a whole stream of the
    written plan, served as it is computed there (its producer is the same operator, not a
    rule's merger or failover), or through the network-writer a pattern put after it (the
    same rows: pipelining, checkpointing)."""
    found = autoshare.forms(written, resolve)
    shown = []
    for c in channels:
        stream = c.stream
        if physical.producer(stream).kind == "network-writer":  # a pattern's cut: the same rows
            stream = physical.producer(stream).inputs[0]
        producer = physical.producer(stream)
        if stream in found and c.channel_id == channel_id(query_id, c.stream) \
                and producer.name == written.producer(stream).name \
                and producer.role != "plumbing":
            shown.append((c.channel_id, found[stream]))
    return tuple(shown)


def _imports(parsed: spec_mod.Spec, physical: Graph, plans: tuple[TaskPlan, ...],
             auto: Collection[str] = ()) -> tuple[StreamImport, ...]:
    """Each stream-source's published stream, with its task, declared schema and where its
    `stream` value is written (the scheduler's refusals name it); a stream-source of automatic
    sharing (its name in `auto`) is located at the operator it took the place of."""
    owner = {n: p.task_id for p in plans for n in p.nodes}
    decls = {op.name: op for op in parsed.operators}
    found = []
    for node in physical.nodes:
        if node.kind != "stream-source":
            continue
        decl = decls.get(node.name)
        written = decl.param("stream") if decl is not None else None
        where = written.value_pos() if written is not None else \
            decl.pos if decl is not None else parsed.pos
        found.append(StreamImport(node.param("stream"), owner[node.name],
                                  physical.stream(node.produced).schema, str(where),
                                  node.param("start", "retained"), node.name in auto))
    return tuple(found)


# parameters that leave an operator's state as it is when they change (the state signature
# leaves them out): none yet; the control catalogue holds even a window's watermark fixed
STATE_FREE_PARAMS: frozenset[str] = frozenset()


def operator_plans(parsed: spec_mod.Spec, physical: Graph, plans: tuple[TaskPlan, ...],
                   resolve: Callable[[str], str] = str) -> tuple[OperatorPlan, ...]:
    """Each physical operator with its task, signature, state signature and declaration
    (`common.tasks.OperatorPlan`): what `scheduler.update_plan` compares. A `path` parameter
    is compared as `resolve` makes it absolute (a spec sent from another folder writes
    elsewhere)."""
    owner = {n: p.task_id for p in plans for n in p.nodes}
    where = {op.name: str(op.pos) for op in parsed.operators}
    found = []
    for node in physical.nodes:
        inputs = [[s, physical.stream(s).schema.to_json()] for s in node.inputs]
        output = physical.stream(node.output).schema.to_json() if node.output else None
        params = [[k, repr(resolve(v) if k == "path" and isinstance(v, str) else v)]
                  for k, v in sorted(node.params)]
        signature = json.dumps([node.kind, params, inputs, node.output, output,
                                repr(node.patterns), node.placement, node.cpus, node.mem_mb]
                               # (only when set: the signatures of queries without it stay)
                               + ([node.max_delay_ms] if node.max_delay_ms is not None else []))
        state = json.dumps([node.kind, [s for _, s in inputs],
                            [p for p in params if p[0] not in STATE_FREE_PARAMS]]) \
            if node.stateful else None
        found.append(OperatorPlan(node.name, node.kind, owner[node.name], signature, state,
                                  where.get(node.name, str(parsed.pos))))
    return tuple(found)


def _unrunnable(parsed: spec_mod.Spec, physical: Graph) -> tuple[Diagnostic, ...]:
    """One diagnostic per operator whose hot-standby replicas would read several channels (a
    join, a union): the runtime cannot keep such replicas in step. Located at the operator's
    `ha` attribute, or at the query's when the operator inherits it. Then one per kafka-sink
    asking for real-time mode in a task that cannot run it (`compiler.realtime.refusals`)."""
    found: list[Diagnostic] = list(_real_time_refusals(parsed, physical))
    for selector in (n for n in physical.nodes if n.kind == "stream-selector"):
        protected = selector.param("protects")
        replicas = [physical.producer(s) for s in selector.inputs]
        if all(GUARDS["single-input"].holds(r) for r in replicas):
            continue
        where = _pattern_position(parsed, protected, "ha")
        d = Diagnostic(where, "hot standby needs an operator with one input",
                       'use ha="checkpoint" for a join or union')
        if d not in found:
            found.append(d)
    return tuple(found)


def _real_time_refusals(parsed: spec_mod.Spec, physical: Graph) -> tuple[Diagnostic, ...]:
    if not any(n.param("mode") == realtime.REAL_TIME for n in physical.sinks()):
        return ()
    plans, _ = split_into_tasks(physical, parsed.name)
    return realtime.refusals(parsed, physical, plans)


def _pattern_position(parsed: spec_mod.Spec, operator: str, attr: str) -> Position:
    """Where the spec asks `operator` for the pattern attribute `attr`: on the operator, else on
    the dataflow (a query-wide default), else the dataflow element."""
    for op in parsed.operators:
        if op.name == operator:
            for pattern in op.patterns:
                if pattern.name == attr:
                    return pattern.pos
    for pattern in parsed.patterns:
        if pattern.name == attr:
            return pattern.pos
    return parsed.pos


def _task(graph: Graph, plan: TaskPlan, query_id: str, base: Path,
          channels: dict[str, ChannelSpec]) -> QueryTask:
    program = codegen.render_task(graph, plan, query_id, base, channels)
    return QueryTask(
        query_id=query_id, task_id=plan.task_id, kind="spark", operators=plan.nodes,
        inputs=plan.inputs, outputs=plan.outputs, stateful=plan.stateful,
        resources=task_resources(plan, graph), program=program, placement=plan.placement,
        failover=plan.failover,
    )
