"""Borealis DPC on a stream-stream join, in the Spark layer with real ZeroMQ channels
(docs/availability.md, "A join"): tasks "dpc" (max-delay) and "plain" (none) each join a1's rows
(live) with a2's (behind a TCP proxy the test cuts and heals: `testkit.dpc_support`) on the
sensor within 8 s (`testkit.dpc_join_support`). With max-delay, pairs keep coming during the cut,
marked tentative: the live rows met only the a2 rows the join held, so they are a subset of the
exact result; after the heal the sink's stable view equals a plain-Python join over all input.
Without it nothing is marked and, Spark's watermark being the minimum of the join's inputs,
nothing is lost either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common import dpc_view
from executor.spool_receiver import PROBE_SECONDS, PROBE_TIMEOUT
from testkit.dpc_join_support import check_join_cut, join_pairs, oracle_pairs, pairs
from testkit.dpc_support import cut_run

pytestmark = pytest.mark.spark

RATE, LIMIT, MAX_DELAY = 25.0, 600, 2.0  # 24 s of input per upstream task, ~20,000 pairs
CUT_SECONDS = 5.0


def test_a_join_with_a_cut_input_goes_tentative_and_is_corrected_with_max_delay(
        spark: Any, tmp_path: Path) -> None:
    run, plain = cut_run(spark, tmp_path, rate=RATE, limit=LIMIT, cut_seconds=CUT_SECONDS,
                         max_delay=f"{int(MAX_DELAY)} seconds", build=join_pairs)
    expected = oracle_pairs(RATE, LIMIT)
    assert run.first_tentative is not None and run.reconcile is not None
    print(f"join: first tentative pair {run.first_tentative:.2f} s after the cut (goal: "
          f"max-delay {MAX_DELAY} s + probe {PROBE_SECONDS + PROBE_TIMEOUT} s + a micro-batch); "
          f"reconciled in {run.reconcile:.2f} s after a {CUT_SECONDS} s cut; "
          f"{len(run.tentative)} tentative pairs replaced; {sum(expected.values())} pairs")
    check_join_cut(run, expected, MAX_DELAY + PROBE_SECONDS + PROBE_TIMEOUT + 5.0)

    assert not any(dpc_view.TENTATIVE in r or dpc_view.REVISION in r for r in plain.rows)
    got = pairs(plain.rows)
    assert got == expected, (f"without max-delay: {sum((got - expected).values())} pairs too "
                             f"many, {sum((expected - got).values())} missing")
