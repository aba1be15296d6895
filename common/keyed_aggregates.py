"""Aggregates computed in Python over one key's rows, for the operators that keep their own
state per key in Spark's state store (pure; shared by the validator and the runtime).

Two uses: a count window (`window-aggregate` with `rows`: the aggregates over a key's last n
rows, recomputed for each row as it is released in event-time order, `over_rows`), and an
updating aggregate (`aggregate`: running totals over a key's rows so far, `fold` and `result`,
whose state is a short list of numbers per aggregate). Values are the runtime's plain Python
values: ints, floats, strings, booleans, and timestamps as microseconds since the epoch. Nulls
are skipped (count without a column counts rows); NaN orders above every other double, as in
Spark. Does not own Spark plumbing (`executor.keyed_state_frame`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# The functions these operators compute: each is exact over its rows, and the updating
# aggregate's state for each is constant in size (count, sum, min, max).
ROW_FUNCTIONS = ("count", "sum", "avg", "min", "max")
# A count window holds at most this many rows per key (its state: the key's last rows - 1).
MAX_WINDOW_ROWS = 10_000

# The columns of a count window's output besides the group columns and the aggregates: the
# time of the oldest row in the window and of the row that completes it.
WINDOW_COLUMNS = ("window_start", "window_end")


def order_key(value: Any) -> tuple:
    """A total order of one column's values: nulls first, NaN above every other double."""
    if value is None:
        return (0, 0, 0)
    if isinstance(value, float) and math.isnan(value):
        return (1, 1, 0)
    return (1, 0, value)


def over_rows(function: str, values: Sequence[Any]) -> Any:
    """`function` over one window's values of its column (for count without a column, any
    non-null marker per row); None when no value is non-null (but count: 0)."""
    present = [v for v in values if v is not None]
    if function == "count":
        return len(present)
    if not present:
        return None
    if function == "sum":
        return _sum(present)
    if function == "avg":
        return _sum(present) / len(present)
    if function == "min":
        return min(present, key=order_key)
    if function == "max":
        return max(present, key=order_key)
    raise ValueError(f"unknown aggregate {function!r} (known: {', '.join(ROW_FUNCTIONS)})")


def _sum(values: Sequence[Any]) -> Any:
    total: Any = 0
    for v in values:
        total += v
    return total


# An updating aggregate's running state of one aggregate: [non-null values, sum, min, max].
EMPTY = (0, None, None, None)


def fold(acc: Sequence[Any], value: Any) -> list[Any]:
    """The running state after one more value (None: a null, which only count() counts; count
    without a column passes a marker per row)."""
    n, total, low, high = acc
    if value is None:
        return [n, total, low, high]
    return [n + 1, value if total is None else total + value,
            value if low is None or order_key(value) < order_key(low) else low,
            value if high is None or order_key(value) > order_key(high) else high]


def result(function: str, acc: Sequence[Any]) -> Any:
    """The aggregate of a running state."""
    n, total, low, high = acc
    if function == "count":
        return n
    if function == "sum":
        return total
    if function == "avg":
        return None if n == 0 else total / n
    if function == "min":
        return low
    if function == "max":
        return high
    raise ValueError(f"unknown aggregate {function!r} (known: {', '.join(ROW_FUNCTIONS)})")
