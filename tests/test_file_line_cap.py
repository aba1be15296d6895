"""The file source's line cap (`executor.sources.MAX_LINE_BYTES`): a line over it is skipped
with a located error and the lines after it are read; a last line without a line feed that
keeps growing is read once (its new bytes only), never again per trigger. Oracle: the rows a
plain-Python parse of the file gives without the long lines, and the bytes a refresh reads.
No Spark."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from common.types import Schema
from executor import sources

IDS = Schema.of(("id", "int"))
CAP = 1000


@pytest.fixture(autouse=True)
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", CAP, raising=False)


def record(i: int, pad: int = 0) -> bytes:
    return json.dumps({"id": i, "pad": "x" * pad}).encode() + b"\n"


def read_all(path: Path, tmp_path: Path) -> list[int]:
    reader = sources.FileReader(sources.FileConfig(
        "t", "src", str(path), "jsonl", sources.schema_pairs(IDS), None,
        str(tmp_path / "pacing" / "src.anchor"), 2))
    end = reader.latestOffset()
    return [row["id"] for part in reader.partitions(reader.initialOffset(), end)
            for batch in reader.read(part) for row in batch.to_pylist()]


def test_a_line_over_the_cap_is_a_located_error_and_the_rest_is_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "in.jsonl"
    data = b"".join(record(i) for i in range(10)) + record(5000, 3 * CAP) + b"\n" \
        + b"".join(record(i) for i in range(10, 20)) + record(6000, CAP) \
        + record(20, CAP - 30)
    path.write_bytes(data)
    expected = [json.loads(line)["id"] for line in data.splitlines()
                if line.strip() and len(line) <= CAP]
    with caplog.at_level(logging.ERROR, logger="executor.sources"):
        assert read_all(path, tmp_path) == expected == list(range(21))
    notices = [r.getMessage() for r in caplog.records if "line cap" in r.getMessage()]
    assert len(notices) == 2
    assert f"{path}:11: the line has {len(record(5000, 3 * CAP)) - 1:,} bytes" in notices[0]
    assert f"{path}:23:" in notices[1]  # (line 12 is blank)


def test_an_unended_line_growing_past_the_cap_is_read_once_and_then_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(record(0) + b'{"id": 1, "pad": "')
    said: list[str] = []
    index = sources.LineIndex(str(path), skip_header=False, on_long=said.append)
    read = [0]
    pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        data = pread(fd, n, offset)
        read[0] += len(data)
        return data

    monkeypatch.setattr(os, "pread", counted)
    written = path.stat().st_size
    for _ in range(50):  # 50 triggers, each with 400 more bytes of the one open line
        index.refresh()
        with open(path, "ab") as f:
            f.write(b"y" * 400)
        written += 400
    index.refresh()
    assert len(index.ends) == 1 and not said  # still open: nothing said yet
    assert read[0] <= 2 * written  # each byte read about once, not once per trigger
    with open(path, "ab") as f:
        f.write(b'"}\n' + record(2))
    index.refresh()
    assert len(index.ends) == 2 and len(said) == 1 and f"{path}:2:" in said[0]
    assert index.skipped == [(len(record(0)), path.stat().st_size - len(record(2)))]


def test_a_csv_header_over_the_cap_is_skipped_like_a_line(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"x" * (2 * CAP) + b"\nid\n1\n2\n")
    said: list[str] = []
    index = sources.LineIndex(str(path), skip_header=True, on_long=said.append)
    index.refresh()
    assert len(index.ends) == 3 and len(said) == 1 and f"{path}:1:" in said[0]


def test_a_line_that_is_not_a_json_object_is_a_located_error_and_the_rest_is_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its byte offset counts the skipped long line before it (`sources.piece_offset`)."""
    path = tmp_path / "in.jsonl"
    head = b"".join(record(i) for i in range(5)) + record(5000, 3 * CAP)
    data = head + b"null\n" + b"".join(record(i) for i in range(5, 10)) + b"[1]\n" + record(10)
    path.write_bytes(data)
    with caplog.at_level(logging.ERROR, logger="executor.sources"):
        assert read_all(path, tmp_path) == list(range(11))
    notices = [r.getMessage() for r in caplog.records if "not a JSON object" in r.getMessage()]
    assert len(notices) == 2
    assert f"{path}: byte {len(head):,}: the line is not a JSON object (b'null')" in notices[0]
    assert f"{path}: byte {data.index(b'[1]'):,}: " in notices[1]
