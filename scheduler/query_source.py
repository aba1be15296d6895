"""Where a query came from: its spec text and how it was compiled, the only form a query is
persisted in.

Owns `QuerySource` (spec text, file name, query id, base dir, rules dir), its JSON form (checked
field by field when read back), and `compile_source`, which runs the compiler inside the scheduler
on it. Task programs are never stored or read back: a new leader recompiles every persisted source
(docs/architecture.md, invariant 7), so whoever can write the registry can at most submit a spec,
never code. Does not own the compiler (`compiler.pipeline`) nor the registry
(`scheduler.coordination`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable

from common.tasks import CompiledQuery

if TYPE_CHECKING:
    from common.paths import PathRoots

SOURCE_FORMAT = "elastiq-query-source/1"


class BadSource(ValueError):
    """A persisted entry that is not a query source (e.g. an old compiled query)."""


@dataclass(frozen=True)
class QuerySource:
    spec: str  # the spec's bytes as text (undecodable bytes kept as surrogate escapes)
    filename: str  # as diagnostics name it
    query_id: str  # the id the query was compiled with
    base_dir: str | None = None  # relative paths in the spec resolve here
    rules_dir: str | None = None  # a folder of user rule files, when one was used
    # after an update (docs/queries.md): root operator -> task id of the tasks it kept, and the
    # ids its removed tasks held (never given again: a task's checkpoint folder is its id's)
    task_ids: tuple[tuple[str, str], ...] = ()
    retired: tuple[str, ...] = ()
    # automatic sharing (docs/queries.md): (canonical form, channel) of the running streams it
    # reads in place of equal subgraphs, so a recompile reads the same ones
    shared: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(body: bytes, filename: str, query_id: str, base_dir: str | None = None,
           rules_dir: str | None = None) -> "QuerySource":
        return QuerySource(body.decode("utf-8", "surrogateescape"), filename, query_id,
                           base_dir, rules_dir)

    def spec_bytes(self) -> bytes:
        return self.spec.encode("utf-8", "surrogateescape")

    def to_json(self) -> str:
        raw = asdict(self)
        for k in ("task_ids", "retired", "shared"):  # only some sources have them
            if not raw[k]:
                del raw[k]
        return json.dumps({"format": SOURCE_FORMAT, **raw}, sort_keys=True)

    @staticmethod
    def from_json(text: str | bytes) -> "QuerySource":
        """The source persisted as `text`; BadSource naming what is wrong."""
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise BadSource(f"not JSON: {e}") from None
        if not isinstance(raw, dict) or raw.get("format") != SOURCE_FORMAT:
            raise BadSource(f"not a query source (expected format {SOURCE_FORMAT!r}; an entry "
                            "holding a compiled query is refused: programs are never restored)")
        problems = [f"{k} must be text" for k in ("spec", "filename", "query_id")
                    if not isinstance(raw.get(k), str) or not raw.get(k)]
        problems += [f"{k} must be text or null" for k in ("base_dir", "rules_dir")
                     if raw.get(k) is not None and not isinstance(raw.get(k), str)]
        problems += _pin_problems(raw)
        unknown = sorted(set(raw) - {"format", "spec", "filename", "query_id", "base_dir",
                                     "rules_dir", "task_ids", "retired", "shared"})
        problems += [f"unknown field {k}" for k in unknown]
        if problems:
            raise BadSource("; ".join(problems))
        return QuerySource(raw["spec"], raw["filename"], raw["query_id"], raw.get("base_dir"),
                           raw.get("rules_dir"),
                           tuple((r, t) for r, t in raw.get("task_ids", ())),
                           tuple(raw.get("retired", ())),
                           tuple((f, c) for f, c in raw.get("shared", ())))


def _pin_problems(raw: dict[str, Any]) -> list[str]:
    pins, retired = raw.get("task_ids", []), raw.get("retired", [])
    problems = []
    if not isinstance(pins, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in pins):
        problems.append("task_ids must be a list of [operator, task id] pairs of text")
    if not isinstance(retired, list) or not all(isinstance(r, str) for r in retired):
        problems.append("retired must be a list of task ids")
    shared = raw.get("shared", [])
    if not isinstance(shared, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in shared):
        problems.append("shared must be a list of [form, channel] pairs of text")
    return problems


def compile_source(source: QuerySource, path_roots: "PathRoots | None" = None) -> CompiledQuery:
    """Compile `source` with the scheduler's compiler; SpecError with every problem. File paths
    must lie in `path_roots`, by default the scheduler's own (`configured_roots`; a worker
    process is given its parent's): the client's folder
    (`base_dir`, from X-Spec-Dir) only resolves relative paths and never widens them. Input
    files are not required to exist here (a restored query must recompile while one is being
    replaced); a task that finds its input missing fails its query at once."""
    from common.paths import configured_roots
    from compiler.pipeline import compile_spec_text  # the compiler is heavy: load on first use

    return compile_spec_text(source.spec_bytes(), source.filename,
                             base_dir=source.base_dir, query_id=source.query_id,
                             rules_dir=source.rules_dir,
                             task_ids=dict(source.task_ids), retired=source.retired,
                             offers=dict(source.shared),
                             path_roots=path_roots if path_roots is not None
                             else configured_roots(),
                             check_inputs=False).query


def describe_failure(error: Exception) -> str:
    """One line for a log or a reply: a SpecError's rendered diagnostics, else the error."""
    diagnostics = getattr(error, "diagnostics", None)
    if diagnostics:
        return "; ".join(d.render().replace("\n", " ") for d in diagnostics)
    return f"{type(error).__name__}: {error}"



@dataclass(frozen=True)
class Restorable:
    """A persisted query recompiled: what `state.restore_query` takes."""

    query: CompiledQuery
    source: QuerySource
    placements: dict[str, Any] | None


def recompile(query_id: str, raw: bytes) -> tuple[CompiledQuery, QuerySource]:
    """The persisted source `raw` of `query_id`, checked and compiled; BadSource or SpecError
    (or another compiler error) when it is not a spec of that query."""
    source = QuerySource.from_json(raw)
    if source.query_id != query_id:
        raise BadSource(f"the entry of {query_id!r} holds the source of {source.query_id!r}")
    query = compile_source(source)
    if query.query_id != query_id:
        raise BadSource(f"the source compiles to query {query.query_id!r}, not {query_id!r}")
    return query, source


Compiled = dict[tuple[str, bytes], "tuple[CompiledQuery, QuerySource] | str"]


def recompile_all(entries: Iterable[Any], cache: Compiled | None = None,
                  ) -> tuple[list[Restorable], list[str]]:
    """Each persisted entry (`query_id`, `source`, `placements`) recompiled; those that do not
    compile are left out and described (one line each, only the first time with a `cache` of
    earlier outcomes by (query id, source))."""
    restored, skipped = [], []
    cache = {} if cache is None else cache
    for entry in entries:
        key = (entry.query_id, bytes(entry.source))
        known = key in cache
        if not known:
            try:
                cache[key] = recompile(entry.query_id, entry.source)
            except Exception as e:  # a bad entry must not stop the others restoring
                cache[key] = f"query {entry.query_id}: {describe_failure(e)}"
        outcome = cache[key]
        if isinstance(outcome, str):
            if not known:
                skipped.append(outcome)
            continue
        restored.append(Restorable(outcome[0], outcome[1], entry.placements))
    return restored, skipped
