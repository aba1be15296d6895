"""The file sink's upsert log (pure): records naming their key, the current view (the last
record of each key) and `elastiq tail --current`'s printing of it; bad lines refused with
their number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.upsert_log import (UpsertLogError, current_view, keyed_line, read_current,
                               record_prefix)
from elastiq.service_cli import print_current


def test_a_record_names_its_key_columns_before_the_rows_members() -> None:
    line = keyed_line(record_prefix(("category",)), '{"category":10,"avg":1.5}')
    assert json.loads(line) == {"@key": ["category"], "category": 10, "avg": 1.5}
    with pytest.raises(ValueError):
        keyed_line(record_prefix(("a",)), "{}")


def test_the_view_is_the_last_record_of_each_key_in_first_seen_order() -> None:
    prefix = record_prefix(("k", "j"))
    lines = [keyed_line(prefix, json.dumps(r)) for r in (
        {"k": 1, "j": "a", "v": 1}, {"k": 2, "j": "a", "v": 2}, {"k": 1, "j": "b", "v": 3},
        {"k": 1, "j": "a", "v": 4}, {"k": None, "j": "a", "v": 5}, {"k": None, "j": "a", "v": 6})]
    assert current_view(lines + [""]) == [{"k": 1, "j": "a", "v": 4}, {"k": 2, "j": "a", "v": 2},
                                          {"k": 1, "j": "b", "v": 3},
                                          {"k": None, "j": "a", "v": 6}]


@pytest.mark.parametrize("line,fragment", [
    ("not json", "line 2: not JSON"), ('{"k": 1}', "line 2: not an upsert record"),
    ('{"@key": ["x"], "k": 1}', "not an upsert record"), ('[1]', "not an upsert record"),
    ('{"@key": "k", "k": 1}', "not an upsert record")])
def test_a_line_that_is_not_a_record_is_refused_with_its_number(line: str,
                                                                fragment: str) -> None:
    good = keyed_line(record_prefix(("k",)), '{"k":1}')
    with pytest.raises(UpsertLogError, match=fragment):
        current_view([good, line])


def test_tail_current_prints_the_view_and_leaves_out_a_torn_last_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = record_prefix(("k",))
    log = tmp_path / "out.jsonl"
    log.write_text(keyed_line(prefix, '{"k":1,"v":1}') + "\n" + keyed_line(prefix, '{"k":1,"v":2}')
                   + "\n" + keyed_line(prefix, '{"k":1,"v":3}'), encoding="utf-8")
    assert read_current(str(log)) == [{"k": 1, "v": 2}]
    assert print_current(str(log)) == 0
    assert capsys.readouterr().out == '{"k":1,"v":2}\n'
    assert print_current(str(tmp_path / "missing.jsonl")) == 1
    assert "missing.jsonl" in capsys.readouterr().err
