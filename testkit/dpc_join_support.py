"""The DPC scenario of `testkit.dpc_support` with a stream-stream join in place of (or beside) the
union (docs/availability.md, "A join"): task r1 (a1's rows, live) joined with r2 (a2's rows,
behind the cut link) on the sensor within `WITHIN` (or the `within` given), written as pairs;
`oracle_pairs` is the plain-Python join over all input, `pairs` a sink's rows in the same form,
and `check_join_cut` a DPC join's run against the oracle."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any, Callable

from testkit.dpc_support import CutRun, input_rows

WITHIN = timedelta(seconds=8)  # wider than the cut + max-delay: live rows meet held ones
JOIN_WATERMARK = "2 seconds"

Pair = tuple[str, Any, Any, float, float]  # sensor, left ts, right ts, left temp, right temp


def joined_within(within: timedelta) -> Callable[[Any, "str | None"], str]:
    """The `dpc_support.Build` of a task whose r1 is joined with r2 on the sensor, times at most
    `within` apart (with the task's max-delay)."""

    def build(b: Any, max_delay: str | None) -> str:
        b.join(op="j", left="r1", right="r2", output="pairs", left_keys=("sensor",),
               right_keys=("sensor",), left_time="ts", right_time="ts",
               within=f"{int(within.total_seconds() * 1000)} milliseconds",
               watermark=JOIN_WATERMARK, max_delay=max_delay)
        return "pairs"

    return build


join_pairs = joined_within(WITHIN)  # r1 joined with r2 within WITHIN


def _pair(sensor: str, lts: Any, rts: Any, ltemp: float, rtemp: float) -> Pair:
    return sensor, lts, rts, round(ltemp, 6), round(rtemp, 6)


def oracle_pairs(rate: float, limit: int, within: timedelta = WITHIN) -> Counter[Pair]:
    """Every (left, right) pair of a1's and a2's input rows with one sensor and times at most
    `within` apart (inclusive), as the join writes it."""
    right: dict[str, list[dict[str, Any]]] = {}
    for r in input_rows(2, rate, limit):
        right.setdefault(r["sensor"], []).append(r)
    out: Counter[Pair] = Counter()
    for left in input_rows(1, rate, limit):
        for r in right.get(left["sensor"], []):
            if abs(left["ts"] - r["ts"]) <= within:
                out[_pair(left["sensor"], left["ts"], r["ts"], left["temp"], r["temp"])] += 1
    return out


def pairs(rows: list[dict[str, Any]]) -> Counter[Pair]:
    """A sink's join rows (the right side's clashing columns are named r2_...)."""
    return Counter(_pair(r["sensor"], r["ts"], r["r2_ts"], r["temp"], r["r2_temp"])
                   for r in rows)


def check_join_cut(run: CutRun, expected: Counter[Pair], first_bound: float) -> None:
    """A join's DPC run against the oracle (raises AssertionError): tentative pairs within
    `first_bound` of the cut, each one the exact join also has, one episode corrected by one
    revision, the stable view equal to the oracle."""
    from common import dpc_view

    assert run.tentative, "no tentative pair was written during the cut"
    assert {r[dpc_view.TENTATIVE] for r in run.tentative} == {1}
    assert run.first_tentative is not None and run.first_tentative <= first_bound
    assert not pairs(run.tentative) - expected, "a tentative pair the exact join lacks"
    stable = pairs(dpc_view.stable_view(run.rows))
    assert stable == expected, (f"stable view: {sum((stable - expected).values())} pairs too "
                                f"many, {sum((expected - stable).values())} missing")
    assert dpc_view.open_episodes(run.rows) == []
    assert [r[dpc_view.REVISION] for r in run.rows if dpc_view.REVISION in r] == [1]
