"""Kafka records to typed rows and back: the parsing a `kafka-source` runs on each micro-batch
and the record values a `kafka-sink` writes.

Owns turning a batch of Kafka records (Arrow columns key, value, topic, partition, offset,
timestamp, as Spark's Kafka source gives them) into rows of the stream's declared type: the
record's value parsed as a JSON object or a CSV row with the file source's own parser
(`executor.sources.parse_lines`), the metadata columns filled from the record, and every record
that does not parse set aside as a dead letter (topic, partition, offset, timestamp, reason,
value) instead of failing the task. A whole batch is parsed at once; only a batch with a bad
record (or a value with a line break) is parsed record by record to find it. Also owns
appending dead letters to their JSON-lines file (at least once: a replayed micro-batch appends
its dead letters again; they are identified by topic, partition and offset) and formatting a
sink's rows as record values and keys. Does not own Spark options or producers
(`executor.kafka_io`).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
from dataclasses import dataclass
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from common.types import Schema
from executor import shapes
from executor.json_lines import table_to_lines
from executor.sources import NotJsonObjects, parse_lines

RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
MAX_REASON_CHARS = 300
MAX_DEAD_VALUE_BYTES = 4096  # a dead letter keeps at most this much of the value


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    timestamp: str | None
    reason: str
    value: bytes | None

    def line(self) -> str:
        """One JSON object; the value as text when it is UTF-8, else base64 (value_base64)."""
        out: dict[str, object] = {"topic": self.topic, "partition": self.partition,
                                  "offset": self.offset, "timestamp": self.timestamp,
                                  "reason": self.reason}
        value = (self.value or b"")[:MAX_DEAD_VALUE_BYTES]
        try:
            out["value"] = None if self.value is None else value.decode("utf-8")
        except UnicodeDecodeError:
            out["value_base64"] = base64.b64encode(value).decode("ascii")
        if self.value is not None and len(self.value) > MAX_DEAD_VALUE_BYTES:
            out["value_bytes"] = len(self.value)
        return json.dumps(out, separators=(",", ":"))


@dataclass(frozen=True)
class RecordLayout:
    """How a record becomes a row: the declared schema, which columns come from the record's
    metadata (field -> column), and the value's format."""

    schema_pairs: tuple[tuple[str, str], ...]
    metadata: tuple[tuple[str, str], ...]  # (record field, declared column)
    format: str  # jsonl | csv

    @property
    def schema(self) -> Schema:
        return Schema.of(*self.schema_pairs)

    @property
    def value_schema(self) -> Schema:
        taken = {column for _, column in self.metadata}
        return Schema.of(*((n, t) for n, t in self.schema_pairs if n not in taken))


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:MAX_REASON_CHARS]


def parse_one(value: bytes | None, layout: RecordLayout) -> pa.Table | str:
    """One record's value as a one-row table of the value columns, or why it is not one."""
    if value is None:
        return "the record has no value (a tombstone)"
    if not value.strip():
        return "the value is empty"
    if b"\n" in value.rstrip(b"\r\n") or b"\r" in value.rstrip(b"\r\n"):
        return "the value holds a line break (one record is one JSON object or CSV row)"
    try:  # a value that is not a JSON object never reaches pyarrow (`parse_lines`' guard)
        table = parse_lines(value.rstrip(b"\r\n") + b"\n", layout.format, layout.value_schema)
    except NotJsonObjects:
        return "the value is not a JSON object"
    except Exception as exc:  # any parser failure is this record's problem, never the task's
        return _reason(exc)
    if table.num_rows != 1:
        return f"the value holds {table.num_rows} rows, not one"
    return table


def parse_values(values: pa.Array, layout: RecordLayout) -> tuple[pa.Table, list[int],
                                                                   dict[int, str]]:
    """The value columns of the records that parse, the index of each in `values`, and the
    reason for each that does not. The whole batch is tried at once first."""
    target = shapes.arrow_schema(layout.value_schema)
    n = len(values)
    if n == 0:
        return target.empty_table(), [], {}
    if _whole_batch_parsable(values):
        try:
            joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()),
                                                             values.cast(pa.binary())), b"\n")
            text = joined[0].as_py()  # one list, so one joined value
            table = parse_lines(text + b"\n", layout.format, layout.value_schema)
            if table.num_rows == n:  # (a CSV row of another width fails the parse)
                return table, list(range(n)), {}
        except Exception:  # a bad record somewhere: find it below
            pass
    good: list[pa.Table] = []
    index: list[int] = []
    bad: dict[int, str] = {}
    for i, value in enumerate(values.to_pylist()):
        parsed = parse_one(value, layout)
        if isinstance(parsed, str):
            bad[i] = parsed
        else:
            good.append(parsed)
            index.append(i)
    table = pa.concat_tables(good) if good else target.empty_table()
    return table, index, bad


def _whole_batch_parsable(values: pa.Array) -> bool:
    """Whether the batch may go to the parser as one text: no tombstone and no line break
    (vectorised checks; a JSON value that is not an object makes `parse_lines` refuse the
    text before pyarrow sees it, and the batch is parsed record by record)."""
    return not (values.null_count
                or pc.any(pc.match_substring_regex(values, "[\r\n]")).as_py())


def _metadata_column(batch: pa.RecordBatch, field: str, rows: pa.Array) -> pa.Array:
    column = batch.column(field).take(rows)
    if field == "key":
        try:
            return column.cast(pa.string())
        except pa.ArrowInvalid:  # a key that is not UTF-8: kept readable
            return pa.array([None if k is None else k.decode("utf-8", "replace")
                             for k in column.to_pylist()], pa.string())
    if field in ("partition", "offset"):
        return column.cast(pa.int64())
    if field == "timestamp":
        return column.cast(pa.timestamp("us", tz="UTC"))
    return column.cast(pa.string())


def rows_of(batch: pa.RecordBatch, layout: RecordLayout) -> tuple[pa.RecordBatch,
                                                                   list[DeadLetter]]:
    """A batch of Kafka records -> a batch of the declared type, and the dead letters."""
    table, index, bad = parse_values(batch.column("value"), layout)
    rows = pa.array(index, pa.int64())
    by_column = {column: field for field, column in layout.metadata}
    target = shapes.arrow_schema(layout.schema)
    arrays = [(_metadata_column(batch, by_column[f.name], rows) if f.name in by_column
               else table.column(f.name).combine_chunks()) for f in target]
    out = pa.RecordBatch.from_arrays(arrays, schema=target)
    return out, dead_letters(batch, bad)


def dead_letters(batch: pa.RecordBatch, bad: dict[int, str]) -> list[DeadLetter]:
    if not bad:
        return []
    rows = pa.array(sorted(bad), pa.int64())
    picked = batch.select(list(RECORD_COLUMNS)).take(rows).to_pylist()
    out = []
    for i, record in zip(sorted(bad), picked):
        ts = record["timestamp"]
        out.append(DeadLetter(str(record["topic"]), int(record["partition"]),
                              int(record["offset"]), None if ts is None else ts.isoformat(),
                              bad[i], record["value"]))
    return out


def append_dead_letters(path: str, letters: Sequence[DeadLetter]) -> None:
    """Append to the dead-letter file in one write (O_APPEND: concurrent partitions' writes do
    not interleave within a line on a local file system)."""
    if not letters:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = "".join(letter.line() + "\n" for letter in letters).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RecordParser:
    """The function Spark's `mapInArrow` runs over the Kafka source's record batches (pickled to
    the Python workers: plain data only)."""

    layout: RecordLayout
    dead_letter: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows, letters = rows_of(batch, self.layout)
            append_dead_letters(self.dead_letter, letters)
            yield rows


# --- sink side: rows -> record values and keys ----------------------------------------------

def record_values(table: pa.Table, fmt: str) -> list[bytes]:
    """Each row as a record value: a compact JSON object (ISO-8601 UTC timestamps) or a CSV row
    in column order."""
    lines = table_to_lines(table)
    if fmt == "jsonl":
        return [line.encode("utf-8") for line in lines]
    out = []
    for line in lines:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="").writerow(
            "" if v is None else v for v in json.loads(line).values())
        out.append(buf.getvalue().encode("utf-8"))
    return out


def record_keys(table: pa.Table, column: str | None) -> list[bytes | None]:
    """Each row's key: the column's value as text (None stays no key); no column: no keys."""
    if column is None:
        return [None] * table.num_rows
    values = table.column(column)
    if pa.types.is_string(values.type):
        texts = values.to_pylist()
    else:
        texts = [None if v is None else json.loads(line)[column]
                 for v, line in zip(values.to_pylist(), table_to_lines(table.select([column])))]
    return [None if t is None else str(t).encode("utf-8") for t in texts]
