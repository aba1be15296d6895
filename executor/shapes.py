"""Deterministic generator shapes: the rows a `<generator>` source produces for any index range.

Owns the three built-in shapes ("sensor", "stock", "sequence"), their columns, and the
counter-based PRNG (splitmix64 over (seed, index, field slot)) that makes row `i` of a shape a pure
function of (shape, seed, start, rate, i): a replayed offset range yields identical rows, in any
partitioning. Event time is `start + i / rate` seconds (microseconds, floored). Two
implementations of the same rows: `generate_batch` (numpy/Arrow, used by Spark readers) and
`reference_row` (plain Python, used to cross-check). Does not own pacing or offsets (see
`executor.sources`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from common.types import Schema

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
SLOTS_PER_ROW = 8  # field slots per index: draws never collide across rows
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

SENSORS = tuple(f"s-{i}" for i in range(10))
TICKERS = ("AAPL", "AMZN", "GOOG", "IBM", "META", "MSFT", "NVDA", "ORCL")
KEYS = tuple(f"k-{i}" for i in range(5))


class ShapeError(ValueError):
    """An unknown shape, or a schema that asks for columns the shape does not produce."""


# --- the PRNG, scalar and vectorised ----------------------------------------------------------

def mix64(x: int) -> int:
    """splitmix64 finaliser on a Python int (the reference implementation)."""
    z = (x + _GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def draw(seed: int, index: int, slot: int) -> int:
    """The 64-bit random word of (seed, row index, field slot)."""
    return mix64(mix64(seed & MASK64) ^ ((index * SLOTS_PER_ROW + slot) & MASK64))


def _mix64_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def _draw_np(seed: int, index: np.ndarray, slot: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        counter = index.astype(np.uint64) * np.uint64(SLOTS_PER_ROW) + np.uint64(slot)
    return _mix64_np(np.uint64(mix64(seed & MASK64)) ^ counter)


def unit(word: int) -> float:
    """A draw mapped to [0, 1) with 53 bits."""
    return (word >> 11) * 2.0**-53


def _unit_np(words: np.ndarray) -> np.ndarray:
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


# --- event time -------------------------------------------------------------------------------

def parse_start(start: str) -> int:
    """ISO-8601 start instant -> microseconds since the epoch (naive means UTC)."""
    try:
        parsed = datetime.fromisoformat(start)
    except ValueError as exc:
        raise ShapeError(f"generator start {start!r} is not an ISO-8601 instant") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return (parsed - EPOCH) // timedelta(microseconds=1)


def event_time_us(start_us: int, rate: float, index: int) -> int:
    return start_us + math.floor(index * 1e6 / rate)


def _event_time_np(start_us: int, rate: float, index: np.ndarray) -> np.ndarray:
    return np.int64(start_us) + np.floor(index.astype(np.float64) * 1e6 / rate).astype(np.int64)


# --- shapes -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """A named row layout; `columns` lists every column the shape can produce."""

    name: str
    columns: Schema
    vector: Callable[[int, np.ndarray], dict[str, Any]]  # (seed, index) -> column arrays
    scalar: Callable[[int, int], dict[str, Any]]  # (seed, index) -> column values


def _labels(labels: tuple[str, ...], words: np.ndarray) -> pa.Array:
    picks = (words % np.uint64(len(labels))).astype(np.int64)
    return pa.array(labels, pa.string()).take(pa.array(picks))


def _sensor_vec(seed: int, idx: np.ndarray) -> dict[str, Any]:
    return {"sensor": _labels(SENSORS, _draw_np(seed, idx, 0)),
            "temp": 10.0 + 30.0 * _unit_np(_draw_np(seed, idx, 1)),
            "humidity": 20.0 + 60.0 * _unit_np(_draw_np(seed, idx, 2))}


def _sensor_row(seed: int, i: int) -> dict[str, Any]:
    return {"sensor": SENSORS[draw(seed, i, 0) % len(SENSORS)],
            "temp": 10.0 + 30.0 * unit(draw(seed, i, 1)),
            "humidity": 20.0 + 60.0 * unit(draw(seed, i, 2))}


def _stock_vec(seed: int, idx: np.ndarray) -> dict[str, Any]:
    return {"symbol": _labels(TICKERS, _draw_np(seed, idx, 0)),
            "price": 50.0 + 150.0 * _unit_np(_draw_np(seed, idx, 1)),
            "volume": (_draw_np(seed, idx, 2) % np.uint64(1000)).astype(np.int64) + 1}


def _stock_row(seed: int, i: int) -> dict[str, Any]:
    return {"symbol": TICKERS[draw(seed, i, 0) % len(TICKERS)],
            "price": 50.0 + 150.0 * unit(draw(seed, i, 1)),
            "volume": draw(seed, i, 2) % 1000 + 1}


def _sequence_vec(seed: int, idx: np.ndarray) -> dict[str, Any]:
    return {"id": idx.astype(np.int64),
            "key": _labels(KEYS, _draw_np(seed, idx, 0)),
            "value": 100.0 * _unit_np(_draw_np(seed, idx, 1))}


def _sequence_row(seed: int, i: int) -> dict[str, Any]:
    return {"id": i, "key": KEYS[draw(seed, i, 0) % len(KEYS)],
            "value": 100.0 * unit(draw(seed, i, 1))}


SHAPES: dict[str, Shape] = {
    "sensor": Shape("sensor", Schema.of(("sensor", "string"), ("ts", "timestamp"),
                                        ("temp", "double"), ("humidity", "double")),
                    _sensor_vec, _sensor_row),
    "stock": Shape("stock", Schema.of(("symbol", "string"), ("ts", "timestamp"),
                                      ("price", "double"), ("volume", "int")),
                   _stock_vec, _stock_row),
    "sequence": Shape("sequence", Schema.of(("id", "int"), ("ts", "timestamp"),
                                            ("key", "string"), ("value", "double")),
                      _sequence_vec, _sequence_row),
}


def shape_named(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ShapeError(f"unknown generator shape {name!r}; known: {sorted(SHAPES)}") from None


def check_schema(shape: Shape, schema: Schema) -> None:
    """Every requested column must be one the shape produces, with the same type."""
    problems = []
    for field in schema:
        have = shape.columns.get(field.name)
        if have is None:
            problems.append(f"column {field.name!r} is not produced by shape {shape.name!r} "
                            f"(it has {list(shape.columns.names)})")
        elif have.type is not field.type:
            problems.append(f"column {field.name!r} of shape {shape.name!r} is "
                            f"{have.type.value}, not {field.type.value}")
    if problems:
        raise ShapeError("; ".join(problems))


ARROW_TYPES: dict[str, pa.DataType] = {
    "int": pa.int64(), "double": pa.float64(), "string": pa.string(), "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema Elastiq uses on the wire and in Spark sources for a stream schema."""
    return pa.schema([pa.field(f.name, ARROW_TYPES[f.type.value]) for f in schema])


def generate_batch(shape: Shape, schema: Schema, seed: int, start_us: int, rate: float,
                   lo: int, hi: int) -> pa.RecordBatch:
    """Rows [lo, hi) of a shape as one Arrow batch with exactly `schema`'s columns."""
    idx = np.arange(lo, hi, dtype=np.int64)
    values = shape.vector(seed, idx)
    values["ts"] = _event_time_np(start_us, rate, idx)
    target = arrow_schema(schema)
    arrays = [pa.array(values[f.name], type=f.type) if not isinstance(values[f.name], pa.Array)
              else values[f.name] for f in target]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def reference_row(shape: Shape, seed: int, start_us: int, rate: float, index: int) -> dict[str, Any]:
    """Row `index` computed in plain Python (timestamps as aware UTC datetimes)."""
    row = shape.scalar(seed, index)
    row["ts"] = EPOCH + timedelta(microseconds=event_time_us(start_us, rate, index))
    return row
