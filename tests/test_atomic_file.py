"""common/atomic_file.py: a file replaced in one rename (the old or the new text, never half),
secrets created 0600 from the start, and a failed write leaves the target and no temporary
file behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from common.atomic_file import replace_file


def test_a_file_is_replaced_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    replace_file(target, '{"a": 1}')
    replace_file(str(target), '{"a": 2}', fsync=True)
    assert target.read_text(encoding="utf-8") == '{"a": 2}'
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_secret_is_never_readable_by_others(tmp_path: Path) -> None:
    target = tmp_path / "key.json"
    target.write_text("old")
    os.chmod(target, 0o644)
    replace_file(target, "secret\n", mode=0o600)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert target.read_text() == "secret\n"


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "marks.json"
    target.write_text("before")
    with pytest.raises(UnicodeEncodeError):
        replace_file(target, "\udcff half")  # a lone surrogate cannot be written as UTF-8
    assert target.read_text() == "before"
    assert os.listdir(tmp_path) == ["marks.json"]
    with pytest.raises(FileNotFoundError):
        replace_file(tmp_path / "missing" / "x.json", "text")  # no folder: nothing written


def test_repeated_writes_leave_only_the_target_and_touch_no_neighbour(tmp_path: Path) -> None:
    neighbour = tmp_path / "neighbour"
    neighbour.write_text("untouched")
    target = tmp_path / "t.json"
    for n in range(20):
        replace_file(target, str(n))
    assert neighbour.read_text() == "untouched" and target.read_text() == "19"
    assert sorted(os.listdir(tmp_path)) == ["neighbour", "t.json"]
