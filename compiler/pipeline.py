"""The compiler's front door: spec text in, a `CompiledQuery` (or every diagnostic) out.

Owns the order of the compiler's steps, as DESIGN.md draws them: parse + structure check
(`spec`), semantic check into a logical graph (`validate`), rewrite into a physical graph
(`rewrite`, with the shipped rules of `rewrite_rules/` plus an optional user rule folder; the
identity when the spec asks for no pattern), split into tasks (`tasks`), and generate each task's
program (`codegen`). The CLI and the scheduler's API both call `compile_spec_text`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from compiler import codegen, spec as spec_mod, validate
from compiler.graph import Graph
from compiler.rewrite import Firing, rewrite
from compiler.rules import Rule, load_rules
from compiler.tasks import (CompiledQuery, QueryTask, TaskPlan, channel_id, split_into_tasks,
                            task_resources)
from elastiq.diagnostics import Diagnostic, Position, SpecError
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
    not_deployable: Diagnostic | None = None  # set when the plan needs plumbing tasks (plan_only)


def check_spec_text(text: str | bytes, filename: str) -> tuple[Graph | None, list[Diagnostic]]:
    """Structure and meaning of a spec: its logical graph (None on errors) and all diagnostics."""
    try:
        _, graph, everything = _checked(text, filename)
    except SpecError as e:
        return None, list(e.diagnostics)
    return graph, everything


def _checked(text: str | bytes, filename: str) -> tuple[spec_mod.Spec, Graph | None,
                                                        list[Diagnostic]]:
    """The parsed spec, its logical graph (None when any diagnostic is an error) and every
    diagnostic; SpecError when the text is not even well-formed XML."""
    parsed, problems = spec_mod.read_spec(text, filename)
    graph, semantic = validate.check(parsed)
    everything = problems + semantic
    if any(d.severity == "error" for d in everything):
        return parsed, None, everything
    return parsed, graph, everything


def compile_spec_text(text: str | bytes, filename: str, base_dir: str | Path | None = None,
                      query_id: str | None = None, rules_dir: str | Path | None = None,
                      plan_only: bool = False) -> Compilation:
    """Compile a spec; raise SpecError with every error (and warning) found.
    Relative file paths in the spec are taken relative to `base_dir` (default: the spec file's
    folder). `rules_dir` adds a folder of user rule files. A plan that needs plumbing tasks
    cannot be deployed yet: that raises one located SpecError, unless `plan_only` (explain), which
    returns the plans without tasks and the diagnostic in `not_deployable`."""
    parsed, graph, everything = _checked(text, filename)
    if graph is None:
        raise SpecError(everything)
    base = Path(base_dir) if base_dir is not None else Path(filename).resolve().parent
    return _finish(parsed, graph, query_id or parsed.name, base, tuple(everything),
                   rules_for(rules_dir), plan_only)


def compile_spec_file(path: str | Path, base_dir: str | Path | None = None,
                      rules_dir: str | Path | None = None, plan_only: bool = False) -> Compilation:
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise SpecError([_unreadable(path, e)]) from None
    return compile_spec_text(text, str(path), base_dir, rules_dir=rules_dir, plan_only=plan_only)


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
            plan_only: bool) -> Compilation:
    rewritten = rewrite(logical, rules)
    physical = rewritten.graph
    blocked = _not_deployable(parsed, physical, rewritten.firings)
    if blocked is not None:
        if not plan_only:
            raise SpecError([blocked])
        return Compilation(parsed, logical, physical, (), CompiledQuery(query_id, (), ()),
                           warnings, rewritten.firings, blocked)
    plans, channels = split_into_tasks(physical, query_id)
    readers = {c.producer: c.consumers for c in channels}
    tasks = tuple(_task(physical, plan, query_id, base, readers.get(plan.task_id, ()))
                  for plan in plans)
    sinks = {n.name: str(codegen.resolve_path(base, n.param("path")))
             for n in physical.sinks() if n.kind == "file-sink"}
    query = CompiledQuery(query_id, tasks, channels, sinks)
    return Compilation(parsed, logical, physical, plans, query, warnings, rewritten.firings)


def _not_deployable(parsed: spec_mod.Spec, physical: Graph,
                    firings: tuple[Firing, ...]) -> Diagnostic | None:
    """One diagnostic, at the attribute that asked for the first pattern, when the physical plan
    holds plumbing operators (compiler.tasks and codegen cannot deploy them yet)."""
    if not firings or not any(n.role == "plumbing" for n in physical.nodes):
        return None
    first = firings[0]
    where = next((op.patterns[0].pos for op in parsed.operators
                  if op.name == first.focus and op.patterns), None)
    where = where or (parsed.patterns[0].pos if parsed.patterns else parsed.pos)
    return Diagnostic(where, f"pattern {first.rule}: plumbing tasks are not deployable yet",
                      "`elastiq explain` shows the rewritten plan; running it needs the plumbing "
                      "operators in the executor")


def _task(graph: Graph, plan: TaskPlan, query_id: str, base: Path,
          readers: tuple[str, ...]) -> QueryTask:
    program = codegen.render_task(graph, plan, query_id, base, readers)
    return QueryTask(
        query_id=query_id, task_id=plan.task_id, kind="spark", operators=plan.nodes,
        inputs=tuple(channel_id(query_id, s) for s in plan.inputs),
        outputs=(channel_id(query_id, plan.output),) if plan.output else (),
        stateful=plan.stateful, resources=task_resources(plan), program=program,
    )

