"""Pure tests of the file source's line index and partitioned parsing: the vectorised index equals
a plain-Python split of the bytes (seeded fuzz over blank, white-space, CR-LF and partial lines,
slices smaller than a line), and the rows of a line range are the same in any partitioning and
equal to a plain-Python parse of the file. No Spark."""

from __future__ import annotations

import csv
import io
import json
import random
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from common.types import Schema
from executor import shapes, sources

SENSOR = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"),
                   ("humidity", "double"))


def oracle_ends(data: bytes, skip_header: bool) -> list[int]:
    """End offsets of the non-blank complete lines, in plain Python (the header not counted)."""
    ends, pos, header = [], 0, skip_header
    while (feed := data.find(b"\n", pos)) >= 0:
        if header:
            header = False
        elif data[pos:feed].strip():
            ends.append(feed + 1)
        pos = feed + 1
    return ends


def random_text(rng: random.Random) -> bytes:
    pieces = [rng.choice([b"", b" ", b"\t", b"\r", b"  x", b"a,b", b" 1,2 ", b"\x0b",
                          b"x" * rng.randint(1, 300)]) + rng.choice([b"\n", b"\r\n", b""])
              for _ in range(rng.randint(0, 60))]
    return b"".join(pieces)


@pytest.mark.parametrize("seed", range(40))
def test_line_index_equals_a_plain_python_split_of_any_bytes(
        seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(sources, "SCAN_CHUNK_BYTES", rng.choice([1, 7, 64, 1 << 20]))
    path = tmp_path / "in.txt"
    path.write_bytes(b"")
    skip_header = seed % 2 == 0
    index = sources.LineIndex(str(path), skip_header=skip_header)
    written = b""
    for _ in range(rng.randint(1, 5)):  # a growing file, refreshed after each append
        written += random_text(rng)
        path.write_bytes(written)
        index.refresh()
        assert index.ends.tolist() == oracle_ends(written, skip_header)


def sensor_rows(n: int) -> list[dict[str, Any]]:
    shape = shapes.shape_named("sensor")
    start = shapes.parse_start("2024-01-01T00:00:00Z")
    return [shapes.reference_row(shape, 5, start, 100.0, i) for i in range(n)]


def write_input(path: Path, fmt: str, rows: list[dict[str, Any]]) -> None:
    """The rows as csv (with a header, a blank line now and then) or jsonl, in plain Python."""
    lines = ["sensor,ts,temp,humidity"] if fmt == "csv" else []
    for i, r in enumerate(rows):
        ts = r["ts"].isoformat()
        if fmt == "csv":
            lines.append(f"{r['sensor']},{ts},{r['temp']!r},{r['humidity']!r}")
        else:
            lines.append(json.dumps({"sensor": r["sensor"], "ts": ts, "temp": r["temp"],
                                     "humidity": r["humidity"]}))
        if i % 97 == 0:
            lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def oracle_parse(path: Path, fmt: str) -> list[dict[str, Any]]:
    """The file's data rows parsed with the standard library only."""
    text = path.read_text(encoding="utf-8")
    if fmt == "csv":
        records = [r for r in csv.DictReader(io.StringIO(text)) if r]
    else:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [{"sensor": r["sensor"],
             "ts": datetime.fromisoformat(r["ts"]).astimezone(timezone.utc),
             "temp": float(r["temp"]), "humidity": float(r["humidity"])} for r in records]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_any_partitioning_of_a_line_range_gives_the_files_rows_in_order(
        fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"in.{fmt}"
    write_input(path, fmt, sensor_rows(3000))
    expected = oracle_parse(path, fmt)
    index = sources.LineIndex(str(path), skip_header=fmt == "csv")
    index.refresh()
    assert len(index.ends) == len(expected) == 3000
    data = path.read_bytes()
    for first, last in [(0, 3000), (17, 2950), (1000, 1001)]:
        for parts, piece_lines in [(1, 5000), (2, 5000), (3, 1), (7, 37), (2, 400)]:
            ranges = index.partitions(first, last, parts, min_lines=100, piece_lines=piece_lines)
            assert 1 <= len(ranges) <= parts
            assert all(a[-1] == b[0] for a, b in zip(ranges, ranges[1:]))
            pieces = [(lo, hi) for bounds in ranges for lo, hi in zip(bounds, bounds[1:])]
            assert all(lo < hi for lo, hi in pieces)
            got = [sources.parse_lines(data[lo:hi], fmt, SENSOR).to_pylist() for lo, hi in pieces]
            assert all(len(rows) <= piece_lines for rows in got)
            assert [row for rows in got for row in rows] == expected[first:last], \
                (first, last, parts, piece_lines)


def test_partitions_of_an_empty_range_are_none(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"a\n1\n2\n")
    index = sources.LineIndex(str(path), skip_header=True)
    index.refresh()
    assert index.partitions(2, 2, 3) == []
    assert index.partitions(0, 2, 3, min_lines=1) == [(2, 4), (4, 6)]
    assert index.partitions(0, 2, 1, min_lines=1, piece_lines=1) == [(2, 4, 6)]


def reader_rows(path: Path, fmt: str, partitions: int, start: int, end: int,
                tmp_path: Path) -> tuple[int, list[dict[str, Any]]]:
    """(partitions planned, rows) of the file reader's replay of lines [start, end), as Spark
    calls it: a fresh reader (a restarted planner) plans, each partition is read on its own."""
    config = sources.FileConfig("t", "replay", str(path), fmt, sources.schema_pairs(SENSOR),
                                None, str(tmp_path / "pacing" / f"{partitions}.anchor"),
                                partitions)
    reader = sources.FileReader(config)
    planned = reader.partitions({"line": start}, {"line": end})
    return len(planned), [row for part in planned for batch in reader.read(part)
                          for row in batch.to_pylist()]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_file_readers_replay_by_offset_is_the_same_in_any_partition_count(
        fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"in.{fmt}"
    write_input(path, fmt, sensor_rows(70_000))  # > 4 x MIN_PARTITION_LINES
    expected = oracle_parse(path, fmt)
    reader = sources.FileReader(sources.FileConfig(
        "t", "replay", str(path), fmt, sources.schema_pairs(SENSOR), None,
        str(tmp_path / "pacing" / "latest.anchor"), 2))
    assert reader.latestOffset() == {"line": 70_000}
    for start, end in [(0, 70_000), (1234, 69_000)]:
        counts = []
        for partitions in (1, 2, 4):
            count, rows = reader_rows(path, fmt, partitions, start, end, tmp_path)
            assert rows == expected[start:end], (start, end, partitions)
            counts.append(count)
        assert counts == [1, 2, 4]


@pytest.mark.parametrize("batch_rows, batches", [(1000, [1000, 2000, 3000]), (5000, [3000])])
def test_the_file_reader_takes_a_backlog_in_micro_batches_of_its_batch_bytes(
        batch_rows: int, batches: list[int], tmp_path: Path) -> None:
    """`batch_bytes` bounds the lines a micro-batch takes (the default cap, or the large one of
    a task that writes an aggregate locally); the batches cover the file once, in order."""
    path = tmp_path / "in.jsonl"
    write_input(path, "jsonl", sensor_rows(3000))
    width = 1_000_000 // sources.batch_row_cap(SENSOR, 1_000_000)  # Arrow bytes a row counts
    config = sources.FileConfig("t", "cap", str(path), "jsonl", sources.schema_pairs(SENSOR),
                                None, str(tmp_path / "pacing" / "cap.anchor"), 2,
                                batch_bytes=batch_rows * width)
    reader = sources.FileReader(config)
    start = reader.initialOffset()
    ends, rows = [], []
    for _ in range(len(batches) + 1):
        end = reader.latestOffset()
        if end == start:
            break
        rows += [r for part in reader.partitions(start, end) for b in reader.read(part)
                 for r in b.to_pylist()]
        ends.append(end["line"])
        start = end
    assert ends == batches
    assert rows == oracle_parse(path, "jsonl")


def test_a_partition_read_in_many_pieces_gives_its_rows_in_order(tmp_path: Path) -> None:
    """The reader parses a partition piece by piece (`ByteRange.bounds`): pieces of 1, 37 and
    400 lines give the rows of one whole-range parse."""
    path = tmp_path / "in.csv"
    write_input(path, "csv", sensor_rows(2000))
    reader = sources.FileReader(sources.FileConfig(
        "t", "pieces", str(path), "csv", sources.schema_pairs(SENSOR), None,
        str(tmp_path / "pacing" / "pieces.anchor"), 1))
    index = sources.LineIndex(str(path), skip_header=True)
    index.refresh()
    for piece_lines in (1, 37, 400):
        (bounds,) = index.partitions(10, 1990, 1, piece_lines=piece_lines)
        assert len(bounds) - 1 == -(-1980 // piece_lines)
        part = sources.ByteRange(str(path), "csv", bounds)
        rows = [r for batch in reader.read(part) for r in batch.to_pylist()]
        assert rows == oracle_parse(path, "csv")[10:1990], piece_lines
