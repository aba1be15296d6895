"""Pure tests of the Nexmark generator shapes (`executor.shapes`): Nexmark's proportions and
id arithmetic, checked against a plain restatement of Nexmark's rules, and the compiler's table
of their columns against the shapes'."""

from __future__ import annotations

from collections import Counter

import pytest

from compiler.operators import GENERATOR_SHAPES, SHAPE_COLUMNS
from executor import shapes

START = shapes.parse_start("2024-01-01T00:00:00Z")
RATE = 10_000.0


def rows(name: str, n: int, seed: int = 3) -> list[dict]:
    shape = shapes.shape_named(name)
    return shapes.generate_batch(shape, shape.columns, seed, START, RATE, 0, n).to_pylist()


def test_the_compiler_knows_every_shape_with_the_shapes_own_columns() -> None:
    assert set(GENERATOR_SHAPES) == set(shapes.SHAPES)
    for name, columns in SHAPE_COLUMNS.items():
        got = tuple((f.name, f.type.value) for f in shapes.SHAPES[name].columns)
        assert got == columns, name


def test_the_three_shapes_interleave_in_one_stream_in_proportions_1_3_46() -> None:
    """Over the first 50,000 events, each event number belongs to exactly one shape, in
    Nexmark's 1:3:46, and each shape's event times rise with its rows."""
    owners: Counter[int] = Counter()
    counts = {"person": 1000, "auction": 3000, "bid": 46000}
    for name, n in counts.items():
        events = [shapes.shape_named(name).events(i) for i in range(n)]
        assert events == sorted(events)
        owners.update(events)
    assert sorted(owners) == list(range(50_000)) and set(owners.values()) == {1}
    assert shapes.shape_named("bid").share == pytest.approx(46 / 50)


def test_ids_follow_nexmarks_rules() -> None:
    """Persons and auctions are numbered from 1000 in event order; a bid names an auction among
    the last 100 (plus Nexmark's lead of 10) and a bidder among the last 1000 people (plus 10);
    a seller is a person seen so far (plus the lead); prices run from 1 $ to 1 M$ in cents."""
    people, auctions, bids = rows("person", 200), rows("auction", 600), rows("bid", 9200)
    assert [p["id"] for p in people] == list(range(1000, 1200))
    assert [a["id"] for a in auctions] == list(range(1000, 1600))
    for i, b in enumerate(bids):
        epoch = i // 46
        last_auction, last_person = 1000 + epoch * 3 + 2, 1000 + epoch
        assert max(1000, last_auction - 100) <= b["auction"] <= last_auction + 10
        assert max(1000, last_person - 1000) <= b["bidder"] <= last_person + 10
        assert 100 <= b["price"] <= 100_000_000
    for i, a in enumerate(auctions):
        assert 1000 <= a["seller"] <= 1000 + i // 3 + 10
        assert 10 <= a["category"] < 15
        assert a["reserve"] > a["initial_bid"] and a["expires"] > a["date_time"]
    hot = Counter(b["auction"] for b in bids).most_common(1)[0][1]
    assert hot > 40  # half the bids go to the hot auction of their epoch
    assert {b["channel"] for b in bids} >= set(shapes.HOT_CHANNELS)


def test_event_time_is_the_events_place_in_the_stream() -> None:
    first_bid = rows("bid", 1)[0]
    assert (first_bid["date_time"] - shapes.EPOCH).total_seconds() * 1e6 == \
        START + 4 * 1e6 / RATE
    second_person = rows("person", 2)[1]
    assert (second_person["date_time"] - shapes.EPOCH).total_seconds() * 1e6 == \
        START + 50 * 1e6 / RATE


def test_the_same_seed_gives_the_same_events_and_another_seed_others() -> None:
    assert rows("bid", 500, seed=9) == rows("bid", 500, seed=9)
    assert rows("bid", 500, seed=9) != rows("bid", 500, seed=10)
