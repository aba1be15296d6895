"""The DPC scenario of `testkit.dpc_support` with a stream-stream join in place of the union
(docs/availability.md, "A join"): task r1 (a1's rows, live) joined with r2 (a2's rows, behind
the cut link) on the sensor within `WITHIN`, written as pairs; `oracle_pairs` is the
plain-Python join over all input, `pairs` a sink's rows in the same form."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from testkit.dpc_support import input_rows

WITHIN = timedelta(seconds=8)  # wider than the cut + max-delay: live rows meet held ones
JOIN_WATERMARK = "2 seconds"

Pair = tuple[str, Any, Any, float, float]  # sensor, left ts, right ts, left temp, right temp


def join_pairs(b: Any, max_delay: str | None) -> str:
    """Task `b`'s operators after its channel sources: r1 joined with r2 (with `max_delay`);
    the stream its sink writes."""
    b.join(op="j", left="r1", right="r2", output="pairs", left_keys=("sensor",),
           right_keys=("sensor",), left_time="ts", right_time="ts",
           within=f"{int(WITHIN.total_seconds())} seconds", watermark=JOIN_WATERMARK,
           max_delay=max_delay)
    return "pairs"


def _pair(sensor: str, lts: Any, rts: Any, ltemp: float, rtemp: float) -> Pair:
    return sensor, lts, rts, round(ltemp, 6), round(rtemp, 6)


def oracle_pairs(rate: float, limit: int) -> Counter[Pair]:
    """Every (left, right) pair of a1's and a2's input rows with one sensor and times at most
    WITHIN apart (inclusive), as the join writes it."""
    right: dict[str, list[dict[str, Any]]] = {}
    for r in input_rows(2, rate, limit):
        right.setdefault(r["sensor"], []).append(r)
    out: Counter[Pair] = Counter()
    for left in input_rows(1, rate, limit):
        for r in right.get(left["sensor"], []):
            if abs(left["ts"] - r["ts"]) <= WITHIN:
                out[_pair(left["sensor"], left["ts"], r["ts"], left["temp"], r["temp"])] += 1
    return out


def pairs(rows: list[dict[str, Any]]) -> Counter[Pair]:
    """A sink's join rows (the right side's clashing columns are named r2_...)."""
    return Counter(_pair(r["sensor"], r["ts"], r["r2_ts"], r["temp"], r["r2_temp"])
                   for r in rows)
