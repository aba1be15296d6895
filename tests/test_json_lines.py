"""The JSON lines every JSON-writing sink emits (`executor.json_lines`), held to a plain-Python
oracle: a dict per row through `json.dumps`, each value written by the documented rules. The
column path and the value path must give the oracle's bytes for every type, null, edge value and
column name, on seeded random tables."""

from __future__ import annotations

import json
import math
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest

from common.types import Schema
from executor import shapes
from executor.json_lines import table_to_lines

UTC = timezone.utc


def oracle_value(value: Any) -> Any:
    """The documented rule for one value, written out independently of the module."""
    if isinstance(value, datetime):
        instant = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        instant = instant.astimezone(UTC)
        return (f"{instant.year:d}-{instant.month:02d}-{instant.day:02d}T{instant.hour:02d}:"
                f"{instant.minute:02d}:{instant.second:02d}.{instant.microsecond:06d}Z")
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def oracle(table: pa.Table) -> list[str]:
    return [json.dumps({name: oracle_value(row[name]) for name in table.column_names},
                       separators=(",", ":")) for row in table.to_pylist()]


def test_a_generated_row_reads_as_iso_utc() -> None:
    batch = shapes.generate_batch(shapes.SHAPES["sequence"], Schema.of(("id", "int"),
                                  ("ts", "timestamp")), 1, 1_500_000, 2.0, 0, 2)
    assert table_to_lines(pa.Table.from_batches([batch])) == [
        '{"id":0,"ts":"1970-01-01T00:00:01.500000Z"}',
        '{"id":1,"ts":"1970-01-01T00:00:02.000000Z"}']


def test_edge_values_of_every_type() -> None:
    table = pa.table({
        "i": pa.array([0, -2**63, 2**63 - 1, None], pa.int64()),
        "d": pa.array([-0.0, 1e-05, 1e16, float("nan")], pa.float64()),
        "inf": pa.array([float("inf"), float("-inf"), None, 0.1], pa.float64()),
        "s": pa.array(['"\\', "\u00e9\U0001f600\n\t\x00", None, "%s %%"], pa.string()),
        "b": pa.array([True, False, None, True]),
        "t": pa.array([datetime(1000, 1, 1, tzinfo=UTC), None,
                       datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
                       datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC)],
                      pa.timestamp("us", tz="UTC")),
        "naive": pa.array([datetime(2026, 1, 1, 12), None, datetime(2026, 1, 1), None],
                          pa.timestamp("us")),
    })
    assert table_to_lines(table) == oracle(table)
    assert '"inf":"Infinity"' in table_to_lines(table)[0]


def test_values_the_column_path_leaves_to_the_value_path() -> None:
    table = pa.table({
        "early": pa.array([datetime(1, 1, 1, tzinfo=UTC), datetime(999, 12, 31, tzinfo=UTC)],
                          pa.timestamp("us", tz="UTC")),
        "ms": pa.array([datetime(2026, 1, 1, 0, 0, 0, 5000), None], pa.timestamp("ms")),
        "berlin": pa.array([datetime(2026, 6, 1, 12, tzinfo=UTC)] * 2,
                           pa.timestamp("us", tz="Europe/Berlin")),
        "f32": pa.array([0.1, None], pa.float32()),
        "list": pa.array([[1, 2], None], pa.list_(pa.int64())),
    })
    lines = table_to_lines(table)
    assert lines == oracle(table)
    assert '"early":"1-01-01T00:00:00.000000Z"' in lines[0]  # Python's unpadded year, as before
    assert '"berlin":"2026-06-01T12:00:00.000000Z"' in lines[0]  # the instant, in UTC


def test_column_names_that_look_like_formats_or_need_escaping() -> None:
    table = pa.table({"%s": [1], "a\"b": ["x"], "%%d": [True], "\u00fc": [2.5], "": [None]})
    assert table_to_lines(table) == oracle(table)


def test_no_columns_and_no_rows() -> None:
    assert table_to_lines(pa.table({"a": pa.array([], pa.int64())})) == []
    assert table_to_lines(pa.table({"a": [1, 2]}).select([])) == ["{}", "{}"]


def _random_value(rng: random.Random, kind: str) -> Any:
    if rng.random() < 0.15:
        return None
    if kind == "int":
        return rng.choice([0, 1, -1, 2**63 - 1, -2**63, rng.randint(-10**12, 10**12)])
    if kind == "double":
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 10 ** rng.randint(-30, 30),
                           float("nan"), float("inf"), float("-inf"), -0.0, 1.0])
    if kind == "string":
        alphabet = 'ab "\\\n\t\x01\x7f\u00e9\u2028\U0001f600%{}'
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
    if kind == "boolean":
        return rng.random() < 0.5
    low = datetime(1000, 1, 1, tzinfo=UTC) if rng.random() < 0.9 else datetime(1, 1, 1, tzinfo=UTC)
    return low + timedelta(microseconds=rng.randint(0, 9_000 * 365 * 86_400 * 10**6))


_ARROW = {"int": pa.int64(), "double": pa.float64(), "string": pa.string(),
          "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC")}


@pytest.mark.parametrize("seed", range(12))
def test_seeded_random_tables_equal_the_oracle(seed: int) -> None:
    rng = random.Random(seed)
    kinds = [rng.choice(sorted(_ARROW)) for _ in range(rng.randint(1, 7))]
    rows = rng.randint(0, 300)
    table = pa.table({f"c{i}_{kind}": pa.array([_random_value(rng, kind) for _ in range(rows)],
                                                _ARROW[kind])
                      for i, kind in enumerate(kinds)})
    lines = table_to_lines(table)
    assert lines == oracle(table)
    assert all(json.loads(line) is not None for line in lines)
