"""DPC marks across a channel in the Spark layer with real ZeroMQ channels
(docs/availability.md, "Marks across channels"): task u unions two channels with max-delay and
serves the union on a marked channel; task f filters and projects it into a file sink; a2's
link to u goes through a TCP proxy the test cuts and heals (`testkit.dpc_marks_support`).
During the cut f writes rows marked tentative (each one a row the exact result has, derived
from u's tentative rows); after the heal u's revision reaches f, whose stable view then equals
the plain-Python filter over all input and has no open episode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common import dpc_view
from executor.spool_receiver import PROBE_SECONDS, PROBE_TIMEOUT
from testkit.dpc_marks_support import THRESHOLD, keys, marked_cut_run, oracle

pytestmark = pytest.mark.spark

RATE, LIMIT, MAX_DELAY = 100.0, 1700, 2.0  # 17 s of input per upstream task
CUT_SECONDS = 4.0


def test_a_downstream_filter_propagates_the_tentative_mark_and_the_correction(
        spark: Any, tmp_path: Path) -> None:
    run = marked_cut_run(spark, tmp_path, rate=RATE, limit=LIMIT, cut_seconds=CUT_SECONDS,
                         max_delay=f"{int(MAX_DELAY)} seconds")
    expected = oracle(RATE, LIMIT)
    tentative = [r for r in run.at_heal if dpc_view.TENTATIVE in r]
    print(f"f's first tentative row {run.first_tentative:.2f} s after the cut (goal: max-delay "
          f"{MAX_DELAY} s + probe {PROBE_SECONDS + PROBE_TIMEOUT} s + two micro-batches); u "
          f"reconciled in {run.reconcile:.2f} s after a {CUT_SECONDS} s cut; {len(tentative)} "
          f"tentative rows in f replaced; stable view {len(expected)} rows")
    assert tentative, "f wrote no tentative row during the cut"
    assert {r[dpc_view.TENTATIVE] for r in tentative} == {1}
    assert all(r["temp"] > THRESHOLD for r in tentative)
    assert set(keys(tentative)) <= set(expected), "a tentative row the exact result lacks"
    assert run.first_tentative <= MAX_DELAY + PROBE_SECONDS + PROBE_TIMEOUT + 6.0
    assert keys(dpc_view.stable_view(run.rows)) == expected
    assert dpc_view.open_episodes(run.rows) == []
    assert [r[dpc_view.REVISION] for r in run.rows if dpc_view.REVISION in r] == [1]
    assert keys(dpc_view.current_view(run.rows)) == expected  # every episode revised
