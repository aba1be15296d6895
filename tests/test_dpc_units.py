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
from executor.dpc import BatchMark, DpcSink, keep_stable_point, marked_lines, revision_line


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


class _Controller:
    """The two calls DpcSink makes of its controller, with the marks given."""

    def __init__(self, marks: list[BatchMark]) -> None:
        self.marks = marks

    def on_batch(self, batch_id: int) -> BatchMark:
        return self.marks[batch_id]

    def append_id(self, batch_id: int) -> int:
        return batch_id


class _Frame:
    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def toArrow(self) -> pa.Table:  # noqa: N802 - Spark's name
        return self.table


def _upsert_oracle(batches: list[list[tuple[int, int, int]]]) -> list[dict[str, int]]:
    """Plain Python: (group, rank, value) rows applied in order, a negative rank deleting the
    key (group, -rank); the last row of each key, keys in the order they (re)appeared."""
    view: dict[tuple[int, int], dict[str, int]] = {}
    for batch in batches:
        for g, rank, v in batch:
            if rank < 0:
                view.pop((g, -rank), None)
            else:
                view[(g, rank)] = {"g": g, "rank": rank, "v": v}
    return list(view.values())


def test_a_dpc_upsert_log_keeps_its_records_and_each_view_folds_per_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A DPC task's updating aggregate into a file sink: its tentative records and deletions
    carry the episode, the stable view per key is the stable batches' upserts and the current
    view adds the open episode's (it wrote unkeyed lines before)."""
    from elastiq.service_cli import _print_stable, print_current
    from executor import sinks

    stable_before = [(1, 1, 10), (1, 2, 20), (2, 1, 5)]
    tentative = [(1, 1, 11), (1, -2, 0), (3, 1, 7)]  # a deletion among them
    rerun = [(1, 1, 12), (2, 1, 6)]  # the re-run's stable records: (1, 2) kept
    open_episode = [(2, 1, 99), (2, -1, 0)]
    batches = [stable_before, tentative, rerun, open_episode]
    marks = [BatchMark(), BatchMark(tentative=1), BatchMark(revision=1), BatchMark(tentative=2)]
    path = tmp_path / "out.jsonl"
    inner = sinks.FileSink("t", str(path), upsert_key=("g", "rank"), deletes_by="rank")
    sink = DpcSink(inner, _Controller(marks))  # type: ignore[arg-type]
    for batch_id, batch in enumerate(batches):
        g, rank, v = zip(*batch)
        sink(_Frame(pa.table({"g": list(g), "rank": list(rank), "v": list(v)})), batch_id)
    rows = dpc_view.records(path.read_text().splitlines())
    stable = dpc_view.folded(dpc_view.stable_view(rows))
    assert stable == _upsert_oracle([stable_before, rerun])
    assert dpc_view.folded(dpc_view.current_view(rows)) == \
        _upsert_oracle([stable_before, rerun, open_episode])
    assert dpc_view.open_episodes(rows) == [2]
    assert {r.get("_tentative") for r in rows if "@delete" in r} == {1, 2}  # deletions marked
    capsys.readouterr()
    assert print_current(str(path)) == 0  # `elastiq tail --current`
    assert dpc_view.records(capsys.readouterr().out.splitlines()) == \
        _upsert_oracle([stable_before, rerun, open_episode])
    assert _print_stable(path) == 0  # `elastiq tail --stable`
    printed = capsys.readouterr()
    assert dpc_view.records(printed.out.splitlines()) == stable
    assert "episode(s) [2] await" in printed.err


def test_a_reader_sees_the_stable_and_the_current_view() -> None:
    lines = ['{"w":1,"n":5}', '{"w":2,"n":3,"_tentative":1}', '{"w":3,"n":1,"_tentative":1}',
             "", '{"_revision":1}', '{"w":2,"n":4}', '{"w":3,"n":2}',
             '{"w":4,"n":1,"_tentative":2}']
    rows = dpc_view.records(lines)
    assert dpc_view.stable_view(rows) == [{"w": 1, "n": 5}, {"w": 2, "n": 4}, {"w": 3, "n": 2}]
    assert dpc_view.current_view(rows) == [{"w": 1, "n": 5}, {"w": 2, "n": 4}, {"w": 3, "n": 2},
                                           {"w": 4, "n": 1}]
    assert dpc_view.open_episodes(rows) == [2]
    before = dpc_view.records(lines[:4])
    assert dpc_view.current_view(before) == [{"w": 1, "n": 5}, {"w": 2, "n": 3}, {"w": 3, "n": 1}]


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
