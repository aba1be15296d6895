"""The compiler's front door: spec text in, a `CompiledQuery` (or every diagnostic) out.

Owns the order of the compiler's steps, as DESIGN.md draws them: parse + structure check
(`spec`), semantic check into a logical graph (`validate`), rewrite into a physical graph
(`rewrite`, identity until patterns are asked for), split into tasks (`tasks`), and generate each
task's program (`codegen`). The CLI and the scheduler's API both call `compile_spec_text`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compiler import codegen, spec as spec_mod, validate
from compiler.graph import Graph
from compiler.tasks import (ChannelSpec, CompiledQuery, QueryTask, TaskPlan, split_into_tasks,
                            task_resources)
from elastiq.diagnostics import Diagnostic, SpecError


@dataclass(frozen=True)
class Compilation:
    """Every intermediate product of one compilation, for `explain` and the tests."""

    spec: spec_mod.Spec
    logical: Graph
    physical: Graph
    plans: tuple[TaskPlan, ...]
    query: CompiledQuery
    warnings: tuple[Diagnostic, ...]


def check_spec_text(text: str | bytes, filename: str) -> tuple[Graph | None, list[Diagnostic]]:
    """Structure and meaning of a spec: its logical graph (None on errors) and all diagnostics."""
    try:
        parsed, problems = spec_mod.read_spec(text, filename)
    except SpecError as e:
        return None, list(e.diagnostics)
    graph, semantic = validate.check(parsed)
    everything = problems + semantic
    if any(d.severity == "error" for d in everything):
        return None, everything
    return graph, everything


def compile_spec_text(text: str | bytes, filename: str, base_dir: str | Path | None = None,
                      query_id: str | None = None) -> Compilation:
    """Compile a spec; raise SpecError with every error (and warning) found.
    Relative file paths in the spec are taken relative to `base_dir` (default: the spec file's
    folder)."""
    try:
        parsed, problems = spec_mod.read_spec(text, filename)
    except SpecError:
        raise
    graph, semantic = validate.check(parsed)
    everything = problems + semantic
    if graph is None or any(d.severity == "error" for d in everything):
        raise SpecError(everything)
    base = Path(base_dir) if base_dir is not None else Path(filename).resolve().parent
    return _finish(parsed, graph, query_id or parsed.name, base, tuple(everything))


def compile_spec_file(path: str | Path, base_dir: str | Path | None = None) -> Compilation:
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise SpecError([_unreadable(path, e)]) from None
    return compile_spec_text(text, str(path), base_dir)


def _unreadable(path: Path, e: OSError) -> Diagnostic:
    from elastiq.diagnostics import Position
    return Diagnostic(Position(str(path), 1, 1), f"cannot read the spec: {e.strerror}",
                      "check the path")


def _finish(parsed: spec_mod.Spec, logical: Graph, query_id: str, base: Path,
            warnings: tuple[Diagnostic, ...]) -> Compilation:
    physical = logical  # the rewrite engine maps logical -> physical once patterns are asked for
    plans, channels = split_into_tasks(physical, query_id)
    readers = {c.producer: c.consumers for c in channels}
    tasks = tuple(_task(physical, plan, query_id, base, readers.get(plan.task_id, ()))
                  for plan in plans)
    sinks = {n.name: str(codegen.resolve_path(base, n.param("path")))
             for n in physical.sinks() if n.kind == "file-sink"}
    query = CompiledQuery(query_id, tasks, channels, sinks)
    return Compilation(parsed, logical, physical, plans, query, warnings)


def _task(graph: Graph, plan: TaskPlan, query_id: str, base: Path,
          readers: tuple[str, ...]) -> QueryTask:
    program = codegen.render_task(graph, plan, query_id, base, readers)
    channel = lambda s: f"{query_id}/{s}"  # noqa: E731
    return QueryTask(
        query_id=query_id, task_id=plan.task_id, kind="spark", operators=plan.nodes,
        inputs=tuple(channel(s) for s in plan.inputs),
        outputs=(channel(plan.output),) if plan.output else (),
        stateful=plan.stateful, resources=task_resources(plan), program=program,
    )


def channels_of(query: CompiledQuery) -> dict[str, ChannelSpec]:
    return {c.channel_id: c for c in query.channels}
