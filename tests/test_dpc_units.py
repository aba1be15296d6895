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
from executor.dpc import BatchMark, keep_stable_point, marked, revision_line


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
    assert marked(table, BatchMark()) is table
    assert marked(table, BatchMark(tentative=3)).column("_tentative").to_pylist() == [3, 3]
    assert json.loads(revision_line(3)) == {dpc_view.REVISION: 3}


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
