"""Load distribution on the embedded cluster (issue 32, Xing-Zdonik-Hwang): two isolated agents,
four tasks whose loads follow two anti-correlated waves, first fit against the distributor.

Owns this benchmark only (not a test; tests/test_distribution_bench.py checks its pure parts:
the spec, the oracle, the waves, the figures and the mean-only balancer; the cluster test
tests/test_distribution_cluster.py runs the same query shape with steady rates). It runs one
query it writes itself, `distribute="true"`, of four chains, each one task:

    g<i> := generator(sensor shape, paced) -> heavy<i> := project with FIELDS heavy columns
      -> keep<i> := filter(humidity < 26) -> file sink out/c<i>.jsonl

on the stack of testkit/e2e_support.py: two embedded agents isolated with cgroups (each
executor container held to its executor's and tasks' cpus), the framework scheduler with the
load distributor on (its `DistributionSettings`: rounds every 30 s, 12 slots of 5 s of history),
one real executor and SparkSession per agent. Every task asks for 0.3 cpus and each agent has
1.0 (the executor's 0.1 and three tasks), so gang first fit puts three tasks on one agent (A)
and the fourth on the other (B). The benchmark then drives the generators' rates through control
tuples (what `elastiq control` sends) in two anti-correlated square waves of WAVE_SECONDS: two
tasks of A on wave 1, the third task of A and B's task on wave 2, so A's two wave-1 tasks peak
together (the issue's example; `tests/test_distributor.py` has it in pure form).

Each agent's load is its executor container's cpu seconds per second (cgroup cpuacct, the
agent's `GET /monitor/statistics`), sampled once a second and averaged over 5 s slots.
Figures: the busiest agent's peak slot under first fit (from the first full wave until the
distributor's first move) and after it (from one wave after the moved task runs again, for
MEASURE_WAVES waves); the distributor's moves; the moves a balancer of mean load only would have
made over the same per-task loads (`mean_only_moves`: offline, pure, every round over the last
round's slots as a balancer of current load does; and the one it makes over the distributor's
whole window, with the peak its choice leaves); and whether every sink equals a plain-Python
oracle (moves lose nothing). Goals (issue 32): the peak of the busiest agent drops by >= 25 %
against first fit; fewer moves than a placement balancing mean load only; results exact.

    python benchmarks/distribution.py [--fields 3] [--high 900] [--low 90] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository: `benchmarks.*` (as the tests import it), `common`
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_util import (exit_on_sigterm, format_table, median_of,  # noqa: E402
                                   use_repo_on_path)

use_repo_on_path()

log = logging.getLogger("bench.distribution")

QUERY = "bench-distribute"
CHAINS = 4
SEED = 11
GREEK = "".join(chr(c) for c in range(0x3B1, 0x3CA) if c != 0x3C2)  # alpha..omega, no final sigma
LITERAL_CHARS = 3900  # + the rest of the expression stays under the language's 4,096
HUMIDITY_BELOW = 26.0  # the filter keeps ~10 % (humidity is uniform in 20..80): small sinks
SLOT_SECONDS = 5.0  # the scheduler's load history slots (scheduler.load_history)


# --- the query ----------------------------------------------------------------------------------

def literal(i: int) -> str:
    """The i-th heavy field's Greek text (rotated, so no two fields share a subexpression)."""
    text = GREEK * (LITERAL_CHARS // len(GREEK) + 2)
    return text[i % len(GREEK):i % len(GREEK) + LITERAL_CHARS]


def heavy_field(i: int) -> str:
    """Upper-casing non-ASCII text takes Spark's slow path: ~70 us per field and row here."""
    return f"length(upper(concat(sensor, '{literal(i)}')))"


def source(rate: float, limit: int, chain: int) -> dict[str, str]:
    return {"shape": "sensor", "rate": f"{rate:g}", "seed": str(SEED + chain),
            "limit": str(limit)}


def spec(query: str, rate: float, limit: int, fields: int, cpus: float | None = None) -> str:
    """Four chains g<i> -> heavy<i> -> keep<i> -> sink<i>, each one task; the query opts in to
    load distribution. `cpus`: what each operator (so each task) asks for."""
    asks = f' cpus="{cpus:g}"' if cpus is not None else ""
    chains = []
    for c in range(CHAINS):
        params = "".join(f'<param name="{k}" value="{v}"/>'
                         for k, v in source(rate, limit, c).items())
        heavy = "\n".join(f'    <field name="h{i}" value="{heavy_field(i)}"/>'
                          for i in range(fields))
        chains.append(f"""  <operator name="g{c}" type="generator"{asks}>
    {params}
    <output name="raw{c}"/>
  </operator>
  <operator name="heavy{c}" type="project"{asks}>
    <input name="raw{c}"/>
    <field name="sensor" value="sensor"/>
    <field name="ts" value="ts"/>
    <field name="temp" value="temp"/>
    <field name="humidity" value="humidity"/>
{heavy}
    <output name="scored{c}"/>
  </operator>
  <operator name="keep{c}" type="filter"{asks}>
    <input name="scored{c}"/>
    <param name="condition" value="humidity &lt; {HUMIDITY_BELOW:g}"/>
    <output name="kept{c}"/>
  </operator>
  <operator name="sink{c}" type="file-sink"{asks}>
    <input name="kept{c}"/>
    <param name="path" value="out/c{c}.jsonl"/>
  </operator>""")
    body = "\n".join(chains)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="{query}" distribute="true">
{body}
</dataflow>
"""


def oracle(rate: float, limit: int, fields: int, chain: int) -> Counter:
    """Chain `chain`'s sink computed in plain Python: the reference generator's rows, the heavy
    fields' lengths by Python's own upper-casing, the filter by a plain comparison."""
    from testkit.e2e_support import generator_rows

    uppers = [len(literal(i).upper()) for i in range(fields)]
    return Counter((r["sensor"], r["ts"], r["temp"], r["humidity"],
                    *(len(r["sensor"]) + u for u in uppers))
                   for r in generator_rows(source(rate, limit, chain))
                   if r["humidity"] < HUMIDITY_BELOW)


def sink_key(row: Mapping[str, Any], fields: int) -> tuple:
    return (row["sensor"], row["ts"], row["temp"], row["humidity"],
            *(row[f"h{i}"] for i in range(fields)))


def sink_paths(base: Path) -> list[Path]:
    return [base / "out" / f"c{c}.jsonl" for c in range(CHAINS)]


# --- driving the generators ---------------------------------------------------------------------

def set_rates(stack: Any, query: str, rates: Mapping[str, float], timeout: float = 180.0
              ) -> str:
    """One control request setting each generator's rate; sent again while the query refuses
    it for now (409: a task starting, e.g. a moved one, or a request still being applied).
    Returns the request's id once accepted (not waited for)."""
    from common.api_client import RequestRejected
    from testkit.e2e_support import wait_until

    client = stack.client()

    def sent() -> str | None:
        try:
            return str(client.control(query, [(g, "rate", f"{r:g}")
                                              for g, r in sorted(rates.items())])["request"])
        except RequestRejected as refused:
            if refused.status != 409:
                raise
            return None

    return wait_until(sent, timeout, f"{query}: rates {dict(rates)} accepted", step=0.5)
