"""When a pattern applies to an operator: the closed table of guards, decided here once.

Owns `GUARDS`, guard name -> `GuardDef` (its arity, the text that documents it, and `holds`, the
predicate), and `Subject`, what a predicate looks at. The rewrite rules name guards after
`when` (`stateless(f)`, `partitionable(f)`: compiler.rules checks the names and arities,
compiler.rewrite evaluates them on a match); the validator asks the same predicates before any
rule runs (a simple standby needs `stateless`, parallelism needs `partitionable`,
match-instances needs `independent-matches`), and the pipeline asks `single-input` of hot-standby replicas after rewriting. `graph.Node` is a Subject;
the validator builds one from an operator declaration. Does not own the diagnostics: each
caller keeps its own message and position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol


class Subject(Protocol):
    """The facts about one operator that guards read."""

    @property
    def kind(self) -> str: ...

    @property
    def stateful(self) -> bool: ...

    @property
    def inputs(self) -> tuple[str, ...]: ...

    @property
    def partition_keys(self) -> tuple[str, ...] | None: ...

    def wants(self, name: str, default: Any = None) -> Any: ...

    def param(self, name: str, default: Any = None) -> Any: ...


@dataclass(frozen=True)
class GuardDef:
    """One guard: `name(f, arg...)` with min_args..max_args arguments, the first a bound
    operator and the rest words of the rule; `holds(subject, *words)`."""

    name: str
    min_args: int
    max_args: int
    doc: str
    holds: Callable[..., bool]


def stateless(s: Subject) -> bool:
    return not s.stateful


def stateful(s: Subject) -> bool:
    return s.stateful


def partitionable(s: Subject) -> bool:
    """It can be split by its requested `partition-by` key: a stateless operator by any key,
    a stateful one only by one of its partition keys."""
    keys, by = s.partition_keys, s.wants("partition-by")
    return keys is not None and (keys == () or by in keys)


def wants(s: Subject, request: str, value: str | None = None) -> bool:
    found = s.wants(request)
    return found is not None and (value is None or str(found) == value)


def lacks(s: Subject, request: str) -> bool:
    """The spec does not ask f for this request (the negation of `wants` without a value)."""
    return s.wants(request) is None


def of_kind(s: Subject, kind: str) -> bool:
    return s.kind == kind


def has_param(s: Subject, name: str) -> bool:
    """The spec gives f this parameter (e.g. a source's `shed`)."""
    return s.param(name) is not None


def independent_matches(s: Subject) -> bool:
    """It is a pattern operator whose start rows keep their own matches (after-match
    skip-to-next-row): no match decides where another may start, so its partial matches can be
    split over instances that never hear of each other's matches."""
    return s.kind == "pattern" and s.param("after-match") == "skip-to-next-row"


def single_input(s: Subject) -> bool:
    """It reads at most one stream (hot-standby replicas can be kept in step only then)."""
    return len(s.inputs) <= 1


GUARDS: dict[str, GuardDef] = {g.name: g for g in (
    GuardDef("stateless", 1, 1, "f: a bound operator keeps no state", stateless),
    GuardDef("stateful", 1, 1, "f: a bound operator keeps state", stateful),
    GuardDef("partitionable", 1, 1, "f: a bound operator can be split by its requested key",
             partitionable),
    GuardDef("wants", 2, 3, "f, request[, value]: the spec asks f for a pattern", wants),
    GuardDef("lacks", 2, 2, "f, request: the spec does not ask f for this request", lacks),
    GuardDef("kind", 2, 2, "f, kind: a bound operator is of this kind", of_kind),
    GuardDef("has-param", 2, 2, "f, name: the spec gives a bound operator this parameter",
             has_param),
    GuardDef("single-input", 1, 1, "f: a bound operator reads one stream", single_input),
    GuardDef("independent-matches", 1, 1, "f: a pattern operator whose start rows keep their "
             "own matches (after-match skip-to-next-row)", independent_matches),
)}
