"""The Spark plan of a `top-n` operator: the first n rows of each event-time window and group.

Spark refuses window functions (`row_number`) over a stream, so the ranking is an aggregate:
each window and group collects its rows (structs of the carried columns) in the state store,
and when the watermark passes the window's end (append mode: once, with every row the window
will ever hold) the collected rows are sorted by the order keys, then by every carried column
(so equal keys still give one order, the same on a replay), and the first n are emitted with
their rank. The result is exact because the sort runs only over finalized windows; the state
is every row of each open window and group (as `count_distinct`'s sets), freed when the window
is emitted. Owns nothing else: the runtime checks the operator's arguments first.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from common.top_n import RANK_COLUMN, OrderKey

_ROWS, _POS, _ROW = "__top_rows", "__top_pos", "__top_row"


def compare(a: Column, b: Column, order: Sequence[OrderKey]) -> Column:
    """array_sort's comparator of two row structs: -1, 0 or 1 by `order`, nulls last in either
    direction: the first key's comparison that is not 0 (one CASE per key, so the expression
    grows linearly with the keys; no user text)."""
    return F.coalesce(*[F.nullif(_compare_key(a[k.column], b[k.column], k.descending), F.lit(0))
                        for k in order], F.lit(0))


def _compare_key(x: Column, y: Column, descending: bool) -> Column:
    before, after = (F.lit(1), F.lit(-1)) if descending else (F.lit(-1), F.lit(1))
    return (F.when(x.isNull() & y.isNull(), F.lit(0))
            .when(x.isNull(), F.lit(1)).when(y.isNull(), F.lit(-1))
            .when(x < y, before).when(x > y, after).otherwise(F.lit(0)))


def full_order(order: Sequence[OrderKey], carried: Sequence[str]) -> tuple[OrderKey, ...]:
    """The order keys, then every other carried column ascending: a total order of rows."""
    named = {k.column for k in order}
    return (*order, *(OrderKey(c, False) for c in carried if c not in named))


def ranked(rows: DataFrame, window: Column, keys: Sequence[Column], key_names: Sequence[str],
           carried: Sequence[Column], carried_names: Sequence[str], order: Sequence[OrderKey],
           n: int, delay_key: str) -> DataFrame:
    """window_start, window_end (carrying the grouped window's watermark metadata, under
    `delay_key`, as a window aggregate's does), the keys, rank and the carried columns of each
    window's and group's first `n` rows."""
    structs = F.struct(*[c.alias(name) for c, name in zip(carried, carried_names)])
    grouped = rows.groupBy(window.alias("window"), *keys).agg(
        F.collect_list(structs).alias(_ROWS))
    event_time = {delay_key: grouped.schema["window"].metadata[delay_key]}
    total = full_order(order, carried_names)
    first = F.slice(F.array_sort(F.col(_ROWS), lambda a, b: compare(a, b, total)), 1, n)
    exploded = grouped.select(F.col("window"), *[F.col(f"`{k}`") for k in key_names],
                              F.posexplode(first).alias(_POS, _ROW))
    return exploded.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end", metadata=event_time),
        *[F.col(f"`{k}`") for k in key_names],
        (F.col(_POS) + 1).cast("bigint").alias(RANK_COLUMN),
        *[F.col(_ROW)[name].alias(name) for name in carried_names])

