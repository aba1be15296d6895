"""Helpers the load-shedding cluster test (tests/test_shedding_cluster.py) and the overload
benchmark (benchmarks/shedding.py) share: their query, its plain-Python oracle, the shedding
figures of the query's status, and the check of a sink that lost rows to shedding.

The query: `src := generator(sequence shape, shed="random")`, its drop operator `src_drop`
(rewrite_rules/shedding.rule) -> `heavy := project` of every input column and FIELDS CPU-heavy
fields (testkit/heavy_fields.py: upper-casing non-ASCII text takes Spark's slow path),
automatic (`elastic="auto"`) with `max-parallelism` 2, so on one agent it is held at one
instance (the policy's bound is min(max-parallelism, agents)), or on as many instances as its
min and max -> file sink. The project keeps every row, so
the rows missing from the sink are exactly the rows the drop shed, and each row's fields are
exact integers that Python's own `str.upper` computes.

Does not own any product behaviour and never compares with the system's own earlier output.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from testkit.e2e_support import Row, generator_rows
from testkit.heavy_fields import heavy_field, literal

SOURCE = "src"
DROP = "src_drop"  # the drop operator the shedding rule puts after SOURCE
HEAVY = "heavy"
SINK = "sink"
COLUMNS = ("id", "ts", "key", "value")  # the sequence shape's


def spec(name: str, source: Mapping[str, str], fields: int, path: str, shed: bool = True,
         cpus: float | None = None, instances: int = 1) -> str:
    """The query's spec: the generator with `source`'s params (and `shed="random"` if `shed`),
    the heavy project (automatic; `instances` > 1: that many, also its min and max, else
    starting on one with max-parallelism 2) and the file sink at `path`; `cpus`: what every
    operator asks (None: the compiler's default)."""
    params = "".join(f'<param name="{k}" value="{v}"/>' for k, v in source.items())
    if shed:
        params += '<param name="shed" value="random"/>'
    asks = f' cpus="{cpus:g}"' if cpus is not None else ""
    bounds = (f'parallelism="{instances}" min-parallelism="{instances}" '
              f'max-parallelism="{instances}"' if instances > 1 else 'max-parallelism="2"')
    plain = "\n".join(f'    <field name="{c}" value="{c}"/>' for c in COLUMNS)
    heavy = "\n".join(f'    <field name="h{i}" value="{heavy_field("key", i)}"/>'
                      for i in range(fields))
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="{name}">
  <operator name="{SOURCE}" type="generator"{asks}>
    {params}
    <output name="nums"/>
  </operator>
  <operator name="{HEAVY}" type="project" {bounds} elastic="auto"{asks}>
    <input name="nums"/>
{plain}
{heavy}
    <output name="scored"/>
  </operator>
  <operator name="{SINK}" type="file-sink"{asks}>
    <input name="scored"/>
    <param name="path" value="{path}"/>
  </operator>
</dataflow>
"""


def oracle(source: Mapping[str, str], fields: int) -> dict[int, tuple]:
    """Generator row id -> the sink row it must give, in plain Python: the reference
    generator's row, each heavy field the length of Python's upper-casing."""
    uppers = [len(literal(i).upper()) for i in range(fields)]  # upper-casing is per character
    return {r["id"]: (r["id"], r["ts"], r["key"], r["value"],
                      *(len(r["key"].upper()) + u for u in uppers))
            for r in generator_rows(source)}


def sink_key(row: Row, fields: int) -> tuple:
    return (row["id"], row["ts"], row["key"], row["value"],
            *(row[f"h{i}"] for i in range(fields)))


@dataclass(frozen=True)
class SinkCheck:
    """A shed sink against the oracle: rows that are no correct result of any input row,
    ids emitted more than once, and the ids of the input rows with no result (shed)."""

    wrong: tuple[tuple, ...]
    twice: tuple[int, ...]
    missing: frozenset[int]

    @property
    def sound(self) -> bool:
        return not self.wrong and not self.twice

    def describe(self, show: int = 5) -> str:
        return (f"{len(self.wrong)} wrong rows (first: {list(self.wrong[:show])}), "
                f"{len(self.twice)} ids twice (first: {list(self.twice[:show])}), "
                f"{len(self.missing)} ids missing")


def check_sink(keys: Sequence[tuple], expected: Mapping[int, tuple]) -> SinkCheck:
    """Every emitted row must equal the oracle's row of its id, each id at most once."""
    counts = Counter(k[0] for k in keys)
    wrong = tuple(k for k in keys if expected.get(k[0]) != k)
    twice = tuple(sorted(i for i, n in counts.items() if n > 1))
    return SinkCheck(wrong, twice, frozenset(set(expected) - set(counts)))


def ratio_changes(history: Sequence[Mapping[str, Any]], task: str) -> list[tuple[int, float]]:
    """(epoch, ratio) of every applied change of the drop's ratio, in order: from micro-batch
    `epoch` of `task` on, the drop shed `ratio` (the control status's applied history)."""
    return [(int(h["epochs"][task]), float(h["value"])) for h in history
            if h["operator"] == DROP and h["parameter"] == "ratio" and
            h.get("epochs", {}).get(task) is not None]


def shedding_view(status: Mapping[str, Any]) -> dict[str, Any]:
    """The status's shedding section (empty when the query has none)."""
    return status.get("shedding") or {}


def ratio_of(status: Mapping[str, Any]) -> float:
    drops = shedding_view(status).get("drops") or [{}]
    return float(drops[0].get("ratio", 0.0))


def dropped_of(status: Mapping[str, Any]) -> float:
    drops = shedding_view(status).get("drops") or [{}]
    return float(drops[0].get("rows_dropped", 0.0))


def heavy_figures(status: Mapping[str, Any], tasks: Sequence[str]) -> tuple[float, float]:
    """(rows read, busy seconds) summed over `tasks` (the heavy project's running instances),
    from the status' task figures (counters summed over attempts)."""
    figures = [t.get("figures") or {} for t in status.get("tasks", []) if t["task_id"] in tasks]
    return (sum(float(f.get("tuples_in") or 0.0) for f in figures),
            sum(float(f.get("busy_ms") or 0.0) for f in figures) / 1000.0)


def rows_per_busy_second(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Rows read per busy second between two `heavy_figures` readings (0: no busy time): a
    lower bound on what the instances can process, since every micro-batch's fixed cost
    (scheduling, commit) counts as busy time however few rows it holds."""
    rows, busy = after[0] - before[0], after[1] - before[1]
    return rows / busy if busy > 0 else 0.0


def overload_of(measured: float, factor: float, floor: float, cap: float) -> float:
    """The overload rate: `factor` x the measured rate, within [floor, cap] (a measurement
    that saw next to no busy time must not make an overload that overloads nothing, nor one
    that queues without bound)."""
    return min(cap, max(floor, factor * measured))


@dataclass(frozen=True)
class Pipeline:
    """One of the pipelines of `pair_spec`: `src_<name>` (a generator with `source`'s params)
    -> `heavy_<name>` (the heavy project of `fields` fields, automatic, held at its bound:
    parallelism = min = max = `instances`) -> `sink_<name>` (a file sink at `path` with
    `weight`)."""

    name: str
    source: Mapping[str, str]
    fields: int
    weight: float
    path: str
    instances: int = 2

    @property
    def src(self) -> str:
        return f"{SOURCE}_{self.name}"

    @property
    def drop(self) -> str:
        return f"{self.src}_drop"

    @property
    def heavy(self) -> str:
        return f"{HEAVY}_{self.name}"

    @property
    def sink(self) -> str:
        return f"{SINK}_{self.name}"


def pair_spec(name: str, pipelines: Sequence[Pipeline], shed: bool = True,
              cpus: Mapping[str, float] | None = None) -> str:
    """A query of independent pipelines (`Pipeline`): every source first, then every heavy
    project, then every sink (the order of the compiled tasks, which first-fit placement
    follows), each source `shed="random"` if `shed`; `cpus`: what each kind of operator asks
    ("source", "heavy", "sink"; one missing: the compiler's default)."""
    def asks(kind: str) -> str:
        return f' cpus="{(cpus or {})[kind]:g}"' if kind in (cpus or {}) else ""

    plain = "\n".join(f'    <field name="{c}" value="{c}"/>' for c in COLUMNS)
    parts = []
    for p in pipelines:
        params = "".join(f'<param name="{k}" value="{v}"/>' for k, v in p.source.items())
        params += '<param name="shed" value="random"/>' if shed else ""
        parts.append(f"""  <operator name="{p.src}" type="generator"{asks("source")}>
    {params}
    <output name="{p.name}_nums"/>
  </operator>""")
    for p in pipelines:
        heavy = "\n".join(f'    <field name="h{i}" value="{heavy_field("key", i)}"/>'
                          for i in range(p.fields))
        n = p.instances
        parts.append(f"""  <operator name="{p.heavy}" type="project" parallelism="{n}" \
min-parallelism="{n}" max-parallelism="{n}" elastic="auto"{asks("heavy")}>
    <input name="{p.name}_nums"/>
{plain}
{heavy}
    <output name="{p.name}_scored"/>
  </operator>""")
    for p in pipelines:
        parts.append(f"""  <operator name="{p.sink}" type="file-sink"{asks("sink")}>
    <input name="{p.name}_scored"/>
    <param name="path" value="{p.path}"/>
    <param name="weight" value="{p.weight:g}"/>
  </operator>""")
    body = "\n".join(parts)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="{name}">
{body}
</dataflow>
"""
