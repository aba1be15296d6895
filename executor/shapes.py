"""Deterministic generator shapes: the rows a `<generator>` source produces for any index range.

Owns the built-in shapes ("sensor", "stock", "sequence", and Nexmark's "person", "auction" and
"bid"), their columns, and the counter-based PRNG (splitmix64 over (seed, event, field slot))
that makes row `i` of a shape a pure function of (shape, seed, start, rate, i): a replayed offset
range yields identical rows, in any partitioning. Event time is `start + e / rate` seconds
(microseconds, floored), where `e` is the row's event number: `i` itself, or for a Nexmark shape
the row's place in the one Nexmark event stream the three shapes share (`executor.nexmark`). Two
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
import pyarrow.compute as pc

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
    vector: Callable[[int, np.ndarray, float], dict[str, Any]]  # (seed, event, rate) -> arrays
    scalar: Callable[[int, int, float], dict[str, Any]]  # (seed, event, rate) -> values
    time_column: str = "ts"
    events: Callable[[Any], Any] = lambda index: index  # row index -> event number (int or array)
    share: float = 1.0  # this shape's rows per event of the stream `rate` counts
    # Other timestamp columns come out of `vector`/`scalar` as microseconds after the row's own
    # event time (a Nexmark auction's `expires`).


def _labels(labels: tuple[str, ...], words: np.ndarray) -> pa.Array:
    picks = (words % np.uint64(len(labels))).astype(np.int64)
    return pa.array(labels, pa.string()).take(pa.array(picks))


def _sensor_vec(seed: int, idx: np.ndarray, _rate: float) -> dict[str, Any]:
    return {"sensor": _labels(SENSORS, _draw_np(seed, idx, 0)),
            "temp": 10.0 + 30.0 * _unit_np(_draw_np(seed, idx, 1)),
            "humidity": 20.0 + 60.0 * _unit_np(_draw_np(seed, idx, 2))}


def _sensor_row(seed: int, i: int, _rate: float) -> dict[str, Any]:
    return {"sensor": SENSORS[draw(seed, i, 0) % len(SENSORS)],
            "temp": 10.0 + 30.0 * unit(draw(seed, i, 1)),
            "humidity": 20.0 + 60.0 * unit(draw(seed, i, 2))}


def _stock_vec(seed: int, idx: np.ndarray, _rate: float) -> dict[str, Any]:
    return {"symbol": _labels(TICKERS, _draw_np(seed, idx, 0)),
            "price": 50.0 + 150.0 * _unit_np(_draw_np(seed, idx, 1)),
            "volume": (_draw_np(seed, idx, 2) % np.uint64(1000)).astype(np.int64) + 1}


def _stock_row(seed: int, i: int, _rate: float) -> dict[str, Any]:
    return {"symbol": TICKERS[draw(seed, i, 0) % len(TICKERS)],
            "price": 50.0 + 150.0 * unit(draw(seed, i, 1)),
            "volume": draw(seed, i, 2) % 1000 + 1}


def _sequence_vec(seed: int, idx: np.ndarray, _rate: float) -> dict[str, Any]:
    return {"id": idx.astype(np.int64),
            "key": _labels(KEYS, _draw_np(seed, idx, 0)),
            "value": 100.0 * _unit_np(_draw_np(seed, idx, 1))}


def _sequence_row(seed: int, i: int, _rate: float) -> dict[str, Any]:
    return {"id": i, "key": KEYS[draw(seed, i, 0) % len(KEYS)],
            "value": 100.0 * unit(draw(seed, i, 1))}


# --- Nexmark: persons, auctions and bids ------------------------------------------------------
# One event stream of persons, auctions and bids in Nexmark's proportions 1:3:46, as Nexmark's
# generator (Beam's and Flink's `GeneratorConfig`) makes it: of every 50 events, event 0 is a
# person, 1-3 are auctions, 4-49 bids. Each shape yields its own events of that one stream, so
# three generators with the same seed, rate and start agree: bids name auctions and bidders
# that exist (Nexmark's lead of 10 auctions and persons aside), event time is the event's place
# in the stream at `rate` events per second, and the three shapes together give `rate`.
# Parameters are Nexmark's defaults: first ids 1000, 5 categories from 10, 1000 active people,
# 100 auctions in flight, hot auctions 1 bid in 2, hot bidders and sellers 3 in 4.

NEXMARK_PROPORTIONS = (1, 3, 46)  # person, auction, bid
NEXMARK_TOTAL = sum(NEXMARK_PROPORTIONS)
FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID = 1000, 1000, 10
NUM_CATEGORIES, NUM_ACTIVE_PEOPLE, NUM_IN_FLIGHT_AUCTIONS = 5, 1000, 100
HOT_AUCTION_RATIO, HOT_BIDDER_RATIO, HOT_SELLER_RATIO = 2, 4, 4
PERSON_ID_LEAD, AUCTION_ID_LEAD = 10, 10
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
NUM_CHANNELS = 10_000
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
# Events over which the auctions in flight arrive: an auction lasts up to twice their time.
_AUCTION_EVENTS = NUM_IN_FLIGHT_AUCTIONS * NEXMARK_TOTAL // NEXMARK_PROPORTIONS[1]


def person_event(i: Any) -> Any:
    """Event number of the i-th person (int or int64 array)."""
    return i * NEXMARK_TOTAL


def auction_event(i: Any) -> Any:
    return (i // 3) * NEXMARK_TOTAL + 1 + i % 3


def bid_event(i: Any) -> Any:
    return (i // 46) * NEXMARK_TOTAL + 4 + i % 46


def last_person(event: Any) -> Any:
    """Base-0 id of the last person at or before `event` (Nexmark's lastBase0PersonId)."""
    return event // NEXMARK_TOTAL


def last_auction(event: Any) -> Any:
    """Base-0 id of the last auction at or before `event` (Nexmark's lastBase0AuctionId): an
    auction's own, and for a bid the third of its epoch."""
    offset = event % NEXMARK_TOTAL
    within = (offset - 1 if offset < 4 else 2) if isinstance(offset, int) else \
        np.where(offset < 4, offset - 1, 2)
    return (event // NEXMARK_TOTAL) * 3 + within


def _pick(word: Any, bound: Any) -> Any:
    """A draw reduced to [0, bound) (Nexmark's nextLong(bound), counter-based here)."""
    if isinstance(word, int):
        return word % bound
    return (word % np.asarray(bound).astype(np.uint64)).astype(np.int64)


def _next_person(word: Any, event: Any) -> Any:
    """Nexmark's nextBase0PersonId: one of the active people, or a little ahead of them."""
    people = last_person(event) + 1
    active = min(people, NUM_ACTIVE_PEOPLE) if isinstance(people, int) else \
        np.minimum(people, NUM_ACTIVE_PEOPLE)
    return people - active + _pick(word, active + PERSON_ID_LEAD)


def _next_auction(word: Any, event: Any) -> Any:
    """Nexmark's nextBase0AuctionId: one of the auctions in flight, or a little ahead."""
    top = last_auction(event)
    low = max(top - NUM_IN_FLIGHT_AUCTIONS, 0) if isinstance(top, int) else \
        np.maximum(top - NUM_IN_FLIGHT_AUCTIONS, 0)
    return low + _pick(word, top - low + 1 + AUCTION_ID_LEAD)


def _hot(word: Any, ratio: int) -> Any:
    """Nexmark's `nextInt(ratio) > 0`: true in (ratio - 1) of ratio draws."""
    return word % ratio > 0 if isinstance(word, int) else word % np.uint64(ratio) > 0


def _either(hot: Any, a: Any, b: Any) -> Any:
    return (a if hot else b) if isinstance(hot, bool) else np.where(hot, a, b)


def _price(u: Any) -> Any:
    """Nexmark's nextPrice in cents: 10^(6u) dollars, rounded to a cent (from 1 $ to 1 M$)."""
    if isinstance(u, float):
        return int(math.floor(10.0 ** (u * 6.0) * 100.0))
    return np.floor(np.power(10.0, u * 6.0) * 100.0).astype(np.int64)


def _auction_length_us(word: Any, rate: float) -> Any:
    """Nexmark's nextAuctionLengthMs in microseconds: 1 + up to twice the time in which the
    auctions in flight arrive at `rate`."""
    horizon = max(2 * math.floor(_AUCTION_EVENTS * 1e6 / rate), 1)
    return 1 + _pick(word, horizon)


def _person_vec(seed: int, e: np.ndarray, _rate: float) -> dict[str, Any]:
    first = _labels(FIRST_NAMES, _draw_np(seed, e, 0))
    last = _labels(LAST_NAMES, _draw_np(seed, e, 1))
    card = (_draw_np(seed, e, 4) % np.uint64(10**16)).astype(np.int64)
    mailbox = (_draw_np(seed, e, 5) % np.uint64(1000)).astype(np.int64)
    return {"id": FIRST_PERSON_ID + last_person(e),
            "name": pc.binary_join_element_wise(first, last, " "),
            "email_address": pc.binary_join_element_wise(
                pc.utf8_lower(first), pc.cast(pa.array(mailbox), pa.string()),
                pa.scalar("@nexmark.example"), ""),
            "credit_card": pc.utf8_lpad(pc.cast(pa.array(card), pa.string()), 16, "0"),
            "city": _labels(US_CITIES, _draw_np(seed, e, 2)),
            "state": _labels(US_STATES, _draw_np(seed, e, 3))}


def _person_row(seed: int, e: int, _rate: float) -> dict[str, Any]:
    first = FIRST_NAMES[draw(seed, e, 0) % len(FIRST_NAMES)]
    last = LAST_NAMES[draw(seed, e, 1) % len(LAST_NAMES)]
    return {"id": FIRST_PERSON_ID + e // NEXMARK_TOTAL, "name": f"{first} {last}",
            "email_address": f"{first.lower()}{draw(seed, e, 5) % 1000}@nexmark.example",
            "credit_card": f"{draw(seed, e, 4) % 10**16:016d}",
            "city": US_CITIES[draw(seed, e, 2) % len(US_CITIES)],
            "state": US_STATES[draw(seed, e, 3) % len(US_STATES)]}


def _auction_vec(seed: int, e: np.ndarray, rate: float) -> dict[str, Any]:
    item = pc.cast(pa.array((_draw_np(seed, e, 0) % np.uint64(10_000)).astype(np.int64)),
                   pa.string())
    initial = _price(_unit_np(_draw_np(seed, e, 1)))
    people = last_person(e)
    seller = _either(_hot(_draw_np(seed, e, 4), HOT_SELLER_RATIO),
                     (people // HOT_SELLER_RATIO) * HOT_SELLER_RATIO,
                     _next_person(_draw_np(seed, e, 5), e))
    return {"id": FIRST_AUCTION_ID + last_auction(e),
            "item_name": pc.binary_join_element_wise(pa.scalar("item-"), item, ""),
            "description": pc.binary_join_element_wise(pa.scalar("description of item-"), item,
                                                       ""),
            "initial_bid": initial, "reserve": initial + _price(_unit_np(_draw_np(seed, e, 2))),
            "expires": _auction_length_us(_draw_np(seed, e, 3), rate),
            "seller": FIRST_PERSON_ID + seller,
            "category": FIRST_CATEGORY_ID + (_draw_np(seed, e, 6) % np.uint64(NUM_CATEGORIES))
            .astype(np.int64)}


def _auction_row(seed: int, e: int, rate: float) -> dict[str, Any]:
    item = draw(seed, e, 0) % 10_000
    initial = _price(unit(draw(seed, e, 1)))
    people = e // NEXMARK_TOTAL
    hot = draw(seed, e, 4) % HOT_SELLER_RATIO > 0
    seller = (people // HOT_SELLER_RATIO) * HOT_SELLER_RATIO if hot else \
        _next_person(draw(seed, e, 5), e)
    return {"id": FIRST_AUCTION_ID + (e // NEXMARK_TOTAL) * 3 + e % NEXMARK_TOTAL - 1,
            "item_name": f"item-{item}", "description": f"description of item-{item}",
            "initial_bid": initial, "reserve": initial + _price(unit(draw(seed, e, 2))),
            "expires": _auction_length_us(draw(seed, e, 3), rate),
            "seller": FIRST_PERSON_ID + seller,
            "category": FIRST_CATEGORY_ID + draw(seed, e, 6) % NUM_CATEGORIES}


def _bid_vec(seed: int, e: np.ndarray, _rate: float) -> dict[str, Any]:
    auction = _either(_hot(_draw_np(seed, e, 0), HOT_AUCTION_RATIO),
                      (last_auction(e) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO,
                      _next_auction(_draw_np(seed, e, 1), e))
    bidder = _either(_hot(_draw_np(seed, e, 2), HOT_BIDDER_RATIO),
                     (last_person(e) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1,
                     _next_person(_draw_np(seed, e, 3), e))
    pick = _draw_np(seed, e, 6)
    cold = pc.binary_join_element_wise(
        pa.scalar("channel-"),
        pc.cast(pa.array((pick % np.uint64(NUM_CHANNELS)).astype(np.int64)), pa.string()), "")
    channel = pc.if_else(pa.array(_hot(_draw_np(seed, e, 5), 2)), cold,
                         _labels(HOT_CHANNELS, pick))
    return {"auction": FIRST_AUCTION_ID + auction, "bidder": FIRST_PERSON_ID + bidder,
            "price": _price(_unit_np(_draw_np(seed, e, 4))), "channel": channel,
            "url": pc.binary_join_element_wise(pa.scalar("https://www.nexmark.com/"), channel,
                                               pa.scalar("/item.htm?query=1"), "")}


def _bid_row(seed: int, e: int, _rate: float) -> dict[str, Any]:
    top = (e // NEXMARK_TOTAL) * 3 + 2
    people = e // NEXMARK_TOTAL
    auction = (top // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO \
        if draw(seed, e, 0) % HOT_AUCTION_RATIO > 0 else _next_auction(draw(seed, e, 1), e)
    bidder = (people // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1 \
        if draw(seed, e, 2) % HOT_BIDDER_RATIO > 0 else _next_person(draw(seed, e, 3), e)
    pick = draw(seed, e, 6)
    channel = f"channel-{pick % NUM_CHANNELS}" if draw(seed, e, 5) % 2 > 0 else \
        HOT_CHANNELS[pick % len(HOT_CHANNELS)]
    return {"auction": FIRST_AUCTION_ID + auction, "bidder": FIRST_PERSON_ID + bidder,
            "price": _price(unit(draw(seed, e, 4))), "channel": channel,
            "url": f"https://www.nexmark.com/{channel}/item.htm?query=1"}


NEXMARK_SHAPES = (
    Shape("person", Schema.of(("id", "int"), ("name", "string"), ("email_address", "string"),
                              ("credit_card", "string"), ("city", "string"), ("state", "string"),
                              ("date_time", "timestamp")),
          _person_vec, _person_row, "date_time", person_event, 1 / NEXMARK_TOTAL),
    Shape("auction", Schema.of(("id", "int"), ("item_name", "string"), ("description", "string"),
                               ("initial_bid", "int"), ("reserve", "int"),
                               ("date_time", "timestamp"), ("expires", "timestamp"),
                               ("seller", "int"), ("category", "int")),
          _auction_vec, _auction_row, "date_time", auction_event, 3 / NEXMARK_TOTAL),
    Shape("bid", Schema.of(("auction", "int"), ("bidder", "int"), ("price", "int"),
                           ("channel", "string"), ("url", "string"), ("date_time", "timestamp")),
          _bid_vec, _bid_row, "date_time", bid_event, 46 / NEXMARK_TOTAL),
)


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
    **{shape.name: shape for shape in NEXMARK_SHAPES},
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
    events = shape.events(np.arange(lo, hi, dtype=np.int64))
    values = shape.vector(seed, events, rate)
    times = _event_time_np(start_us, rate, events)
    for name in _later_times(shape):
        values[name] = times + values[name]
    values[shape.time_column] = times
    target = arrow_schema(schema)
    arrays = [pa.array(values[f.name], type=f.type) if not isinstance(values[f.name], pa.Array)
              else values[f.name] for f in target]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def reference_row(shape: Shape, seed: int, start_us: int, rate: float, index: int) -> dict[str, Any]:
    """Row `index` computed in plain Python (timestamps as aware UTC datetimes)."""
    event = shape.events(index)
    row = shape.scalar(seed, event, rate)
    time_us = event_time_us(start_us, rate, event)
    for name in _later_times(shape):
        row[name] = EPOCH + timedelta(microseconds=time_us + row[name])
    row[shape.time_column] = EPOCH + timedelta(microseconds=time_us)
    return row


def _later_times(shape: Shape) -> tuple[str, ...]:
    """The timestamp columns besides event time: offsets (microseconds) from it."""
    return tuple(f.name for f in shape.columns
                 if f.type.value == "timestamp" and f.name != shape.time_column)
