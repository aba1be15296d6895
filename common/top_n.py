"""What a `top-n` operator means, shared by the validator and the runtime (pure).

Owns parsing its `order-by` (columns, each `asc` or `desc`), the bound on `n`, and its output
columns: window_start, window_end, the group columns, `rank`, then the input's other columns;
for the updating ranking (`ttl` instead of a window: over the whole stream) the group columns,
`rank` and the other columns, and what that ranking does per micro-batch: the order of rows in
Python (`row_key`, the same as the windowed plan's Spark comparator), a group's ranking folded
over new rows (`fold_ranking`: a gap longer than `ttl` starts it anew) and the upsert records
that change the view (`ranking_changes`). Does not own running it (`executor.runtime`,
`executor.top_n_frame`) nor checking a spec (`compiler.validate`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.types import ColumnType, Field, Schema

# Each window and group keeps all its rows in state until the window closes (the ranking is
# made then), so n bounds the output, not the state; 10,000 output rows per window and group is
# far past any ranking a dashboard shows (Nexmark q19 asks for 10).
MAX_TOP_N = 10_000
RANK_COLUMN = "rank"
WINDOW_COLUMNS = ("window_start", "window_end")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


@dataclass(frozen=True)
class OrderKey:
    column: str
    descending: bool


def parse_order(text: str) -> tuple[tuple[OrderKey, ...], list[str]]:
    """`price desc, date_time` -> its keys and every problem found (empty when it parses)."""
    keys: list[OrderKey] = []
    problems: list[str] = []
    for i, part in enumerate(text.split(","), 1):
        words = part.split()
        if not words:
            problems.append(f"order key {i} is empty")
            continue
        direction = words[1].lower() if len(words) == 2 else "asc"
        if len(words) > 2 or direction not in ("asc", "desc") or not _NAME.match(words[0]):
            problems.append(f"order key {i} '{part.strip()}' is not 'column', 'column asc' "
                            "or 'column desc'")
            continue
        keys.append(OrderKey(words[0], direction == "desc"))
    names = [k.column for k in keys]
    problems += [f"column '{n}' is ordered by twice" for n in sorted(set(names))
                 if names.count(n) > 1]
    return tuple(keys), problems


def carried_fields(schema: Schema, group_by: tuple[str, ...]) -> tuple[Field, ...]:
    """The input columns a ranked row carries: all but the group columns (already in front)."""
    return tuple(f for f in schema if f.name not in group_by)


def output_schema(schema: Schema, group_by: tuple[str, ...], updating: bool = False) -> Schema:
    """window_start, window_end (not when `updating`: the ranking runs over the whole stream),
    the group columns, rank (1 = first), the carried columns."""
    groups = tuple(f for g in group_by for f in schema if f.name == g)
    window = () if updating else tuple(Field(n, ColumnType.TIMESTAMP) for n in WINDOW_COLUMNS)
    return Schema((*window, *groups, Field(RANK_COLUMN, ColumnType.INT),
                   *carried_fields(schema, group_by)))


def reserved_clashes(schema: Schema, updating: bool = False) -> list[str]:
    """Input columns whose names the output already uses (window_start, window_end, rank; only
    rank when `updating`), compared regardless of case as Spark does."""
    reserved = {n.lower() for n in ((RANK_COLUMN,) if updating
                                    else (*WINDOW_COLUMNS, RANK_COLUMN))}
    return [f.name for f in schema if f.name.lower() in reserved]


# --- the updating ranking (top-n with ttl), per group and micro-batch ---------------------------

class _Descending:
    """A sort key in reverse order."""

    __slots__ = ("key",)

    def __init__(self, key: tuple) -> None:
        self.key = key

    def __lt__(self, other: "_Descending") -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key


def value_key(value: Any, descending: bool) -> tuple:
    """One column's sort key in Spark's order: nulls last in either direction, NaN above every
    other double (false before true, strings by code point: UTF-8's byte order)."""
    if value is None:
        return (1,)
    key = (1, 0) if isinstance(value, float) and math.isnan(value) else (0, value)
    return (0, _Descending(key) if descending else key)


def row_key(order: Sequence[OrderKey], carried: Sequence[str]) -> Callable[[Sequence[Any]], tuple]:
    """The sort key of a carried row (its values in `carried`'s order): the order keys, then
    every other carried column ascending, the windowed plan's total order (`full_order`)."""
    slots = [(carried.index(k.column), k.descending) for k in order]
    named = {k.column for k in order}
    slots += [(i, False) for i, c in enumerate(carried) if c not in named]

    def key(values: Sequence[Any]) -> tuple:
        return tuple(value_key(values[i], descending) for i, descending in slots)
    return key


Ranked = tuple[int, list]  # (event time in µs, the row as the state keeps it)


def fold_ranking(ranking: Sequence[Ranked], last: int | None, rows: Sequence[Ranked], n: int,
                 ttl_us: int, key: Callable[[Ranked], tuple]) -> tuple[list[Ranked], int | None]:
    """A group's first `n` rows by `key` and its latest event time, after `rows` (one
    micro-batch's, taken in event-time order, equal times by `key`): a row more than `ttl_us`
    after the group's latest row before it starts the ranking anew, as the updating
    aggregate's totals."""
    current = list(ranking)
    for row in sorted(rows, key=lambda r: (r[0], key(r))):
        if last is not None and row[0] > last + ttl_us:
            current = []
        current.append(row)
        last = row[0] if last is None else max(last, row[0])
        if len(current) > 4 * n + 64:  # keep the work per row bounded
            current = sorted(current, key=key)[:n]
    return sorted(current, key=key)[:n], last


def ranking_changes(before: Sequence[Ranked] | None, after: Sequence[Ranked], n: int
                    ) -> tuple[list[int], list[int]]:
    """(the ranks whose row is new, from 1; the ranks that are gone) when a group's ranking
    goes from `before` to `after`. `before` None: the group has no state (new, or its state
    ended after `ttl`), so the view may still hold an earlier ranking of it, up to rank n."""
    changed = [i for i, row in enumerate(after, 1)
               if before is None or i > len(before) or before[i - 1] != row]
    shown = n if before is None else len(before)
    return changed, list(range(len(after) + 1, shown + 1))
