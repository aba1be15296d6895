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
