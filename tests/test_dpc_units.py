"""DPC's own pieces without Spark: the stable point copied aside, the spool's control file and
what a reader of a DPC file sink sees (`common.dpc_view`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from common import dpc_view
from executor import spool
from executor.dpc import keep_stable_point, marked_lines, revision_line


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_the_stable_point_holds_what_was_before_the_first_tentative_batch(tmp_path: Path) -> None:
    spark = tmp_path / "spark"
    names = ["metadata", "offsets/4", "offsets/.4.crc", "offsets/5", "offsets/6",
             "commits/4", "commits/5", "sources/0/0", "state/0/0/5.changelog",
             "state/0/0/.5.changelog.crc", "state/0/0/6.changelog", "state/0/0/4.zip",
             "state/0/0/7.zip", "state/0/0/SSTs/000012-ab.sst", "state/0/_metadata/schema"]
    for name in names:
        (spark / name).parent.mkdir(parents=True, exist_ok=True)
        (spark / name).write_text(name)
    keep_stable_point(str(spark), str(tmp_path / "stable"), first_tentative=5)
    assert _files(tmp_path / "stable") == {
        "metadata", "offsets/4", "offsets/.4.crc", "commits/4", "sources/0/0",
        "state/0/0/5.changelog", "state/0/0/.5.changelog.crc", "state/0/0/4.zip",
        "state/0/0/SSTs/000012-ab.sst", "state/0/_metadata/schema"}
    assert (tmp_path / "stable" / "offsets" / "4").read_text() == "offsets/4"


def test_the_spool_control_round_trips_and_refuses_damage(tmp_path: Path) -> None:
    folder = str(tmp_path / "spool")
    assert spool.read_control(folder) == spool.Control()
    spool.write_control(folder, spool.Control(hold=True, keep=True, upto=7))
    assert spool.read_control(folder) == spool.Control(True, True, 7)
    with open(os.path.join(folder, spool.DPC), "w", encoding="utf-8") as f:
        f.write("{")
    with pytest.raises(spool.SpoolError, match="unreadable dpc control"):
        spool.read_control(folder)


def test_tentative_rows_carry_their_episode_and_a_revision_names_it() -> None:
    table = pa.table({"n": [1, 2]})
    assert marked_lines(table, [None, None]) == ['{"n":1}', '{"n":2}']
    assert [json.loads(line) for line in marked_lines(table, [3, None])] == [
        {"n": 1, "_tentative": 3}, {"n": 2}]  # in row order
    assert marked_lines(pa.table({"n": [1]}).drop_columns(["n"]), [2]) == ['{"_tentative":2}']
    assert json.loads(revision_line(3)) == {dpc_view.REVISION: 3}


# --- seeing the mode: the heartbeat's figures, status and Prometheus ------------------------------

def test_the_controller_reports_its_mode_how_long_it_held_and_its_last_reconcile(
        tmp_path: Path) -> None:
    from common.dpc import MODE_CODES, Mode, State
    from executor.dpc import DpcController

    controller = DpcController("q.t1", str(tmp_path), (), 5.0, lambda: None, lambda: None)
    controller.state = State(since=100.0)
    assert controller.figures(100.25) == {"dpc_mode": 0, "dpc_mode_ms": 250, "dpc_episode": 0,
                                          "dpc_reconcile_ms": -1}
    controller.state = State(mode=Mode.TENTATIVE, since=200.0, cut=("a2",), tentative_since=200.0)
    controller.episode = 3
    controller.reconcile_seconds.append(1.5)
    assert controller.figures(212.0) == {"dpc_mode": MODE_CODES[Mode.TENTATIVE],
                                         "dpc_mode_ms": 12_000, "dpc_episode": 3,
                                         "dpc_reconcile_ms": 1_500}


def test_a_heartbeat_carries_dpc_figures_only_for_a_dpc_task() -> None:
    from executor.executor_state import TaskFigures, _dpc_figures

    assert _dpc_figures(TaskFigures()) == {}
    assert _dpc_figures(TaskFigures(dpc_mode=2, dpc_mode_ms=12_000, dpc_episode=3)) == {
        "dpc_mode": 2, "dpc_mode_ms": 12_000, "dpc_episode": 3, "dpc_reconcile_ms": -1}


def test_status_words_name_every_mode_but_stable_and_a_task_without_dpc() -> None:
    from common.dpc import MODE_CODES, Mode, mode_of_code
    from scheduler.views import availability_reason

    assert all(mode_of_code(code) is mode for mode, code in MODE_CODES.items())
    assert mode_of_code(-1) is None and mode_of_code(9) is None
    assert availability_reason({}) == ""
    assert availability_reason({"dpc_mode": 0, "dpc_mode_ms": 5000}) == ""
    assert availability_reason({"dpc_mode": 1, "dpc_mode_ms": 2400}) == \
        "DPC delaying for 2 s: an input's writer is unreachable"
    assert availability_reason({"dpc_mode": 2, "dpc_mode_ms": 12_000, "dpc_episode": 3}) == \
        ("DPC tentative for 12 s (episode 3): results are marked tentative until the cut "
         "input returns")
    assert availability_reason({"dpc_mode": 3, "dpc_mode_ms": 900, "dpc_episode": 3}) == \
        "DPC reconciling for 1 s (episode 3): corrections follow"
