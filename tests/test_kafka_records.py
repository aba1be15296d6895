"""Kafka record parsing (executor.kafka_records), pure: a seeded fuzz over JSON, CSV and random
bytes never raises and splits every batch into typed rows and dead letters, one each per
record; a record built to be valid is a row equal to what plain Python reads from it, aligned
with its own offset; one built to be invalid is a dead letter with a reason."""

from __future__ import annotations

import csv
import io
import json
import random
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

from executor.kafka_records import (DeadLetter, RecordLayout, append_dead_letters,
                                    record_keys, record_values, rows_of)

PAIRS = (("sensor", "string"), ("temp", "double"), ("n", "int"), ("ok", "boolean"),
         ("off", "int"), ("k", "string"))
JSON_LAYOUT = RecordLayout(PAIRS, (("offset", "off"), ("key", "k")), "jsonl")
CSV_LAYOUT = RecordLayout(PAIRS, (("offset", "off"), ("key", "k")), "csv")
WHEN = datetime(2024, 1, 1, tzinfo=timezone.utc)


def batch(values: list[bytes | None], keys: list[bytes | None] | None = None) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "key": pa.array(keys or [b"key%d" % i for i in range(n)], pa.binary()),
        "value": pa.array(values, pa.binary()), "topic": pa.array(["t"] * n, pa.string()),
        "partition": pa.array([1] * n, pa.int32()),
        "offset": pa.array(range(100, 100 + n), pa.int64()),
        "timestamp": pa.array([WHEN] * n, pa.timestamp("us", tz="UTC"))})


def good_row(rng: random.Random) -> dict[str, Any]:
    return {"sensor": rng.choice(["a", "b", "c,d", 'q"x', "é"]),
            "temp": round(rng.uniform(-50, 50), 3), "n": rng.randint(-10**12, 10**12),
            "ok": rng.random() < 0.5}


def as_csv(row: dict[str, Any]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(
        [row["sensor"], repr(row["temp"]), row["n"], "true" if row["ok"] else "false"])
    return buf.getvalue().encode()


def bad_json(rng: random.Random) -> bytes | None:
    row = good_row(rng)
    return rng.choice([
        b"", None, b"{", b"[1, 2]", b"42", b'"text"', b"null",
        json.dumps({**row, "temp": "warm"}).encode(), json.dumps({**row, "n": 1.5}).encode(),
        json.dumps({**row, "ok": "yes"}).encode(), json.dumps(row).encode() + b"\n{}",
        json.dumps(row).encode() + json.dumps(row).encode(),
        json.dumps({**row, "n": 10**30}).encode()])


def bad_csv(rng: random.Random) -> bytes | None:
    row = good_row(rng)
    return rng.choice([b"", None, b"a,1.0", b"a,1.0,2,true,extra", b"a,warm,2,true",
                       b"a,1.0,1.5,true", b"a,1.0,2,maybe", as_csv(row) + b"\n" + as_csv(row)])


def expected(row: dict[str, Any], i: int) -> dict[str, Any]:
    return {**row, "off": 100 + i, "k": f"key{i}"}


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.parametrize("seed", range(12))
def test_fuzzed_batches_split_into_rows_and_dead_letters(fmt: str, seed: int) -> None:
    rng = random.Random(seed * 7919 + len(fmt))
    layout = JSON_LAYOUT if fmt == "jsonl" else CSV_LAYOUT
    values: list[bytes | None] = []
    intended: list[dict[str, Any] | None | str] = []  # a row, a bad record, or "any"
    for _ in range(rng.randint(0, 60)):
        kind = rng.random()
        if kind < 0.6:
            row = good_row(rng)
            values.append(json.dumps(row).encode() if fmt == "jsonl" else as_csv(row))
            intended.append(row)
        elif kind < 0.85:
            values.append(bad_json(rng) if fmt == "jsonl" else bad_csv(rng))
            intended.append(None)
        else:
            values.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))))
            intended.append("any")
    rows, letters = rows_of(batch(values), layout)
    got = rows.to_pylist()
    dead = {letter.offset for letter in letters}
    assert len(got) + len(letters) == len(values)
    assert {r["off"] for r in got}.isdisjoint(dead)
    by_offset = {r["off"]: r for r in got}
    for i, want in enumerate(intended):
        if isinstance(want, dict):
            have = by_offset.get(100 + i)
            assert have is not None, (values[i], [x.reason for x in letters if x.offset == 100 + i])
            assert {**have, "temp": round(have["temp"], 3)} == expected(want, i)
        elif want is None:
            assert 100 + i in dead, values[i]
    assert all(letter.reason and letter.topic == "t" and letter.partition == 1
               for letter in letters)


def test_a_tombstone_and_a_line_break_are_dead_letters_with_their_reason() -> None:
    row = json.dumps({"sensor": "a", "temp": 1.0, "n": 1, "ok": True}).encode()
    rows, letters = rows_of(batch([row, None, row + b"\n" + row, row]), JSON_LAYOUT)
    assert [r["off"] for r in rows.to_pylist()] == [100, 103]
    assert [(x.offset, x.reason.split(" (")[0]) for x in letters] == [
        (101, "the record has no value"), (102, "the value holds a line break")]


def test_dead_letters_keep_non_utf8_values_as_base64(tmp_path: Any) -> None:
    path = tmp_path / "dead" / "d.jsonl"
    append_dead_letters(str(path), [DeadLetter("t", 0, 5, None, "bad", b"\xff\xfe"),
                                    DeadLetter("t", 0, 6, None, "bad", b"x" * 5000)])
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["value_base64"] == "//4=" and "value" not in first
    assert len(second["value"]) == 4096 and second["value_bytes"] == 5000


def test_a_key_that_is_not_utf8_stays_readable() -> None:
    row = json.dumps({"sensor": "a", "temp": 1.0, "n": 1, "ok": True}).encode()
    rows, _ = rows_of(batch([row], keys=[b"\xffk"]), JSON_LAYOUT)
    assert rows.to_pylist()[0]["k"] == "\ufffdk"


def test_sink_values_round_trip_through_the_source_parser() -> None:
    table = pa.Table.from_pylist([{"sensor": "c,d", "temp": 1.5, "n": 3, "ok": False}],
                                 pa.schema([("sensor", pa.string()), ("temp", pa.float64()),
                                            ("n", pa.int64()), ("ok", pa.bool_())]))
    layout = RecordLayout(PAIRS[:4], (), "csv")
    for fmt, lay in (("csv", layout), ("jsonl", RecordLayout(PAIRS[:4], (), "jsonl"))):
        values = record_values(table, fmt)
        rows, letters = rows_of(batch(values), lay)
        assert letters == [] and rows.to_pylist() == table.to_pylist()
    assert record_keys(table, "n") == [b"3"] and record_keys(table, None) == [None]


def mutated(rng: random.Random, value: bytes) -> bytes:
    """`value` with up to three byte-level edits: deletions, JSON/CSV punctuation, or tokens
    that have crashed parsers (a bare null, NaN, huge exponents, NUL)."""
    b = bytearray(value)
    for _ in range(rng.randint(0, 3)):
        op, i = rng.random(), rng.randrange(len(b) + 1)
        if op < 0.4 and b:
            del b[min(i, len(b) - 1)]
        elif op < 0.8:
            b.insert(i, rng.choice(b'{}[]",:0123456789.eE-+ntrufalse\\ \x00\xff'))
        else:
            b[i:i] = rng.choice([b"null", b"NaN", b"1e999", b'"\\u0000"', b"-0", b"[]", b"{}"])
    return bytes(b)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_mutated_records_never_crash_the_parser(fmt: str) -> None:
    """A crash here would be the Python worker's: pyarrow 26 segfaults on a leading `null`."""
    layout = JSON_LAYOUT if fmt == "jsonl" else CSV_LAYOUT
    for seed in range(150):
        rng = random.Random(seed)
        rows = [good_row(rng) for _ in range(rng.randint(1, 20))]
        values = [mutated(rng, json.dumps(r).encode() if fmt == "jsonl" else as_csv(r))
                  for r in rows]
        if seed % 10 == 0:
            values.insert(0, b"null")
        out, letters = rows_of(batch(values), layout)
        assert out.num_rows + len(letters) == len(values)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_batch_of_good_records_is_parsed_at_once_not_record_by_record(
        fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-batch path is taken (record by record was ~1,300 records/s, the Kafka
    source's bottleneck, while a bug in joining the batch sent every batch that way)."""
    import executor.kafka_records as records

    def one_by_one(*_: Any) -> Any:
        raise AssertionError("parsed record by record")

    monkeypatch.setattr(records, "parse_one", one_by_one)
    rng = random.Random(7)
    rows = [good_row(rng) for _ in range(50)]
    values = [json.dumps(r).encode() if fmt == "jsonl" else as_csv(r) for r in rows]
    parsed, letters = records.rows_of(batch(values), JSON_LAYOUT if fmt == "jsonl"
                                      else CSV_LAYOUT)
    assert parsed.num_rows == 50 and not letters
    assert parsed.to_pylist() == [expected(r, i) for i, r in enumerate(rows)]
