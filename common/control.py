"""The control catalogue of a compiled query and the values a control check yields.

Owns `ControlCatalog` (for every operator of the spec, its adjustable parameters with their type,
current value and where each lives at run time, and the parameters that are fixed, with the
reason), its JSON form, `Change` (a checked control tuple), `ControlRefused` and the runtime
keyword of each adjustable parameter. Does not own building the catalogue or checking a tuple
(`compiler.control`), sending changes (`scheduler`) or applying them (`executor`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from common.types import Schema

# The runtime keyword a control parameter sets, per operator kind: parameter -> keyword.
ADJUSTABLE: dict[str, dict[str, str]] = {
    "filter": {"condition": "condition"},
    "generator": {"rate": "rate"},
    "file-source": {"rate": "rate"},
    "network-source": {"endpoint": "endpoint"},
    "file-sink": {"path": "path"},
    "network-sink": {"endpoint": "endpoint"},
}
# The paper's name for a network writer's destination.
ALIASES: dict[str, str] = {"target-addr": "endpoint"}
PARTITION_KEY = "partition-key"  # the routing key of a partitioned operator's splitter
PARALLELISM = "parallelism"  # how many instances of a partitioned operator the splitters feed


class ControlRefused(ValueError):
    """Control tuples that may not be applied; `problems` lists each one with what to fix."""

    def __init__(self, problems: list[str], status: int = 400) -> None:
        super().__init__("; ".join(problems))
        self.problems, self.status = problems, status


@dataclass(frozen=True)
class Target:
    """Where one copy of an operator's parameter lives: a task, the operator id its program
    uses, and the keyword of the runtime call it sets."""

    task_id: str
    op: str
    keyword: str

    def to_json(self) -> list[str]:
        return [self.task_id, self.op, self.keyword]

    @classmethod
    def from_json(cls, d: list[str]) -> "Target":
        return cls(d[0], d[1], d[2])


@dataclass(frozen=True)
class Adjustable:
    """One parameter that may change while the query runs."""

    operator: str
    kind: str  # the operator's kind
    parameter: str
    value_kind: str  # expression | float | endpoint | path | columns
    value: str  # the value the query started with, as text
    targets: tuple[Target, ...]
    scope: tuple[tuple[str, Schema], ...] = ()  # input streams, for a condition
    doc: str = ""
    bounds: tuple[int, int] | None = None  # a count's least and greatest value

    def to_json(self) -> dict[str, Any]:
        return {"operator": self.operator, "kind": self.kind, "parameter": self.parameter,
                "value_kind": self.value_kind, "value": self.value,
                "targets": [t.to_json() for t in self.targets],
                "scope": [[name, schema.to_json()] for name, schema in self.scope],
                "doc": self.doc,
                **({"bounds": list(self.bounds)} if self.bounds is not None else {})}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Adjustable":
        return cls(d["operator"], d["kind"], d["parameter"], d["value_kind"], d["value"],
                   tuple(Target.from_json(t) for t in d["targets"]),
                   tuple((name, Schema.from_json(s)) for name, s in d.get("scope", [])),
                   d.get("doc", ""),
                   (int(d["bounds"][0]), int(d["bounds"][1])) if d.get("bounds") else None)


@dataclass(frozen=True)
class Fixed:
    """A parameter that may not change while the query runs, and why."""

    operator: str
    parameter: str
    reason: str

    def to_json(self) -> list[str]:
        return [self.operator, self.parameter, self.reason]


@dataclass(frozen=True)
class ControlCatalog:
    adjustable: tuple[Adjustable, ...] = ()
    fixed: tuple[Fixed, ...] = ()
    operators: tuple[tuple[str, str], ...] = ()  # every spec operator and its kind
    path_roots: tuple[str, ...] = ()  # where a new sink path may lie (the compile's roots)

    def to_json(self) -> dict[str, Any]:
        return {"adjustable": [a.to_json() for a in self.adjustable],
                "fixed": [f.to_json() for f in self.fixed],
                "operators": [list(o) for o in self.operators],
                "path_roots": list(self.path_roots)}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "ControlCatalog":
        if not d:
            return cls()
        return cls(tuple(Adjustable.from_json(a) for a in d.get("adjustable", [])),
                   tuple(Fixed(*f) for f in d.get("fixed", [])),
                   tuple((o[0], o[1]) for o in d.get("operators", [])),
                   tuple(str(r) for r in d.get("path_roots", [])))

    def find(self, operator: str, parameter: str) -> Adjustable | None:
        for a in self.adjustable:
            if a.operator == operator and a.parameter == parameter:
                return a
        return None

    def source_endpoints(self, tuples: Iterable[tuple[str, str, str]]
                         ) -> list[tuple[str, str]]:
        """(operator, value) of each tuple that sets a network source's endpoint (by its name
        or an alias); the other tuples are not about where a source reads."""
        found = []
        for operator, parameter, value in tuples:
            adjustable = self.find(operator, ALIASES.get(parameter, parameter))
            if adjustable is not None and adjustable.kind == "network-source" \
                    and adjustable.parameter == "endpoint":
                found.append((operator, value))
        return found


@dataclass(frozen=True)
class Change:
    """A checked control tuple: the parameter and its new value, as text and as the runtime
    takes it."""

    adjustable: Adjustable
    text: str
    runtime_value: Any = field(compare=False)
