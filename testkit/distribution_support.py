"""The query of the load distribution cluster test and benchmark (issue 32; docs/load.md).

Four chains g<i> -> heavy<i> -> keep<i> -> sink<i>, each one task, in one query that opts in
to load distribution (`distribute="true"`); its plain-Python oracle per chain and a way to set
the generators' rates through the API. Used by tests/test_distribution_cluster.py and
benchmarks/distribution.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from testkit.heavy_fields import heavy_field, literal

CHAINS = 4
SEED = 11
HUMIDITY_BELOW = 26.0  # the filter keeps ~10 % (humidity is uniform in 20..80): small sinks


# --- the query ----------------------------------------------------------------------------------


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
        heavy = "\n".join(f'    <field name="h{i}" value="{heavy_field("sensor", i)}"/>'
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

    return str(wait_until(sent, timeout, f"{query}: rates {dict(rates)} accepted", step=0.5))
