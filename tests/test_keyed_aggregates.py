"""The aggregates of count windows and updating aggregates, computed in Python (pure): over a
window's values, and as running totals, each against a direct computation."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from common import keyed_aggregates as ka


def running(function: str, values: list) -> Any:
    acc: list = list(ka.EMPTY)
    for v in values:
        acc = ka.fold(acc, v)
    return ka.result(function, acc)


@pytest.mark.parametrize("seed", range(5))
def test_running_totals_equal_the_aggregate_over_all_values(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.choice([None, rng.randint(-50, 50)]) for _ in range(40)]
    present = [v for v in values if v is not None]
    for function, want in (("count", len(present)), ("sum", sum(present)),
                           ("min", min(present)), ("max", max(present)),
                           ("avg", sum(present) / len(present))):
        assert ka.over_rows(function, values) == want
        assert running(function, values) == want


def test_nulls_only_give_null_but_a_count_of_zero() -> None:
    for function in ("sum", "avg", "min", "max"):
        assert ka.over_rows(function, [None, None]) is None
        assert running(function, [None]) is None
    assert ka.over_rows("count", [None]) == 0 and running("count", []) == 0


def test_nan_orders_above_every_number_as_in_spark() -> None:
    nan = float("nan")
    assert math.isnan(ka.over_rows("max", [1.0, nan, 3.0]))
    assert ka.over_rows("min", [nan, 2.0, 1.0]) == 1.0
    assert math.isnan(running("max", [1.0, nan])) and running("min", [nan, 5.0]) == 5.0
    assert sorted([3.0, None, nan, -1.0], key=ka.order_key)[0] is None


def test_an_unknown_function_is_refused() -> None:
    with pytest.raises(ValueError, match="count_distinct"):
        ka.over_rows("count_distinct", [1])
    with pytest.raises(ValueError, match="median"):
        ka.result("median", ka.EMPTY)
