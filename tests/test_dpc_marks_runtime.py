"""DPC marks across a channel in the Spark layer with real ZeroMQ channels
(docs/availability.md, "Marks across channels"): task u unions two channels with max-delay and
serves the union on a marked channel; task f filters and projects it into a file sink; a2's
link to u goes through a TCP proxy the test cuts and heals (`testkit.dpc_marks_support`).
During the cut f writes rows marked tentative (each one a row the exact result has, derived
from u's tentative rows); after the heal u's revision reaches f, whose stable view then equals
the plain-Python filter over all input and has no open episode. The same cut with two
stateful downstream tasks (a window and an updating aggregate) instead: checkpoint/redo keeps
their stable views exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common import dpc_view
from executor.spool_receiver import PROBE_SECONDS, PROBE_TIMEOUT
from testkit.dpc_marks_support import (THRESHOLD, keys, marked_cut_run, oracle,
                                       stateful_cut_run, totals_oracle, window_oracle,
                                       written_totals, written_windows)

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


REDO_CUT_SECONDS = 6.0


def test_a_stateful_downstream_task_redoes_from_its_stable_point_so_its_stable_view_is_exact(
        spark: Any, tmp_path: Path) -> None:
    """docs/availability.md, "A stateful downstream task": u's marked channel feeds "w" (1 s
    windows per sensor into a file sink) and "t" (running totals per sensor into an upsert
    log). During the cut each keeps its stable point and writes tentatively; u's revision
    makes each re-run from it without u's tentative rows, after which w's stable view equals
    the plain-Python windows over all input and t's folded stable view the plain-Python totals
    (before checkpoint/redo both tasks were refused at their start)."""
    redo = stateful_cut_run(spark, tmp_path, rate=RATE, limit=LIMIT,
                            cut_seconds=REDO_CUT_SECONDS, max_delay=f"{int(MAX_DELAY)} seconds")
    run = redo.run
    windows, totals = window_oracle(RATE, LIMIT), totals_oracle(RATE, LIMIT)
    t_tentative = [r for r in run.rows if dpc_view.TENTATIVE in r]
    w_tentative = [r for r in redo.windows if dpc_view.TENTATIVE in r]
    print(f"t's first tentative record {run.first_tentative:.2f} s after the cut; u reconciled "
          f"in {run.reconcile:.2f} s; w re-ran in {redo.w_reconcile} s, t in "
          f"{redo.t_reconcile} s; {len(w_tentative)} tentative windows and {len(t_tentative)} "
          f"tentative records replaced; {len(windows)} windows, {len(totals)} sensors")
    assert t_tentative and {r[dpc_view.TENTATIVE] for r in t_tentative} == {1}
    assert {r[dpc_view.TENTATIVE] for r in w_tentative} <= {1}
    assert len(redo.w_reconcile) == 1 and len(redo.t_reconcile) == 1
    for rows in (redo.windows, run.rows):
        assert [r[dpc_view.REVISION] for r in rows if dpc_view.REVISION in r] == [1]
        assert dpc_view.open_episodes(rows) == []
    assert written_totals(dpc_view.stable_view(run.rows)).keys() == totals.keys()
    for sensor, (n, total) in written_totals(dpc_view.stable_view(run.rows)).items():
        assert n == totals[sensor][0] and total == pytest.approx(totals[sensor][1]), sensor
    stable = written_windows(dpc_view.stable_view(redo.windows))
    assert stable.keys() == windows.keys(), sorted(stable.keys() ^ windows.keys())[:4]
    for key, (n, total) in stable.items():
        assert n == windows[key][0] and total == pytest.approx(windows[key][1]), key
