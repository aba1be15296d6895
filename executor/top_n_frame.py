"""The Spark plan of a `top-n` operator: the first n rows of each event-time window and group.

Spark refuses window functions (`row_number`) over a stream, so the ranking is an aggregate:
each window and group collects its rows (structs of the carried columns) in the state store,
and when the watermark passes the window's end (append mode: once, with every row the window
will ever hold) the collected rows are sorted by the order keys, then by every carried column
(so equal keys still give one order, the same on a replay), and the first n are emitted with
their rank. The result is exact because the sort runs only over finalized windows; the state
is every row of each open window and group (as `count_distinct`'s sets), freed when the window
is emitted.

The updating ranking (`ttl` instead of a window, `updating_ranked`) runs over the whole stream
with per-group state in Spark's state store (`keyed_state_frame.apply_keyed`: checkpointed, so
a restarted query continues every ranking, and a replayed micro-batch gives the same records):
a group's first n rows (`common.top_n.fold_ranking`), and per micro-batch that brought it rows
one upsert record per rank whose row changed, and, for a rank that is gone (a ranking started
anew after a gap longer than `ttl` is shorter than the one the view holds), a row with the rank
negated and nulls elsewhere, which the file sink writes as a deletion (`common.upsert_log`).
The state is at most n rows per group, dropped once the watermark passes the group's latest row
plus `ttl`. Owns nothing else: the runtime checks the operator's arguments first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState

from common import top_n
from common.top_n import RANK_COLUMN, OrderKey
from common.types import ColumnType, Field, Schema
from executor import arrow_text
from executor.keyed_state_frame import apply_keyed

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


_KEY, _TIME, _TIME_US = "__elastiq_key", "__elastiq_time", "__elastiq_time_us"


def _texts(df: DataFrame, stream: str, time: str, keys: Sequence[Field],
           carried: Sequence[Field], watermark: str) -> DataFrame:
    """The key columns and carried columns (as `__c<i>`) as text, the time in µs, and the time
    as a watermarked timestamp; rows without an event time are dropped (no window holds them
    either)."""
    at = F.col(f"`{stream}`.`{time}`")
    return (df.where(at.isNotNull())
            .select(*[arrow_text.to_text(stream, k) for k in keys],
                    *[arrow_text.to_text(stream, c, f"__c{i}") for i, c in enumerate(carried)],
                    F.unix_micros(at).cast("string").alias(_TIME_US), at.alias(_TIME))
            .withWatermark(_TIME, watermark))


def _text_of(value: Any) -> str | None:
    """A pandas cell of a text column: its text, None for a null (pandas may give NaN)."""
    return None if value is None or isinstance(value, float) and math.isnan(value) else value


def _rows(frame: pd.DataFrame, carried: int) -> list[top_n.Ranked]:
    """(time in µs, carried texts) of a call's rows; column by column (a group is often one
    row, and pandas' per-row conversions cost several times more than its columns' tolist)."""
    columns = [[_text_of(v) for v in frame[f"__c{i}"].tolist()] for i in range(carried)]
    times = [int(t) for t in frame[_TIME_US].tolist()]
    return [(t, list(values)) for t, values in zip(times, zip(*columns))] if carried \
        else [(t, []) for t in times]


def updating_ranked(df: DataFrame, stream: str, time: str, keys: Sequence[Field],
                    carried: Sequence[Field], order: Sequence[OrderKey], n: int, ttl_us: int,
                    watermark: str) -> tuple[DataFrame, Schema]:
    """Per group and micro-batch that brought it rows: the key columns, rank and carried
    columns of each rank whose row changed, and (key, -rank, nulls) for each rank gone."""
    names = [c.name for c in carried]
    kinds = [c.type for c in carried]
    order_key = top_n.row_key(order, names)

    def key(row: top_n.Ranked) -> tuple:
        return order_key([arrow_text.from_text(t, k) for t, k in zip(row[1], kinds)])

    out_fields = (*keys, Field(RANK_COLUMN, ColumnType.INT), *carried)
    columns = [f.name for f in out_fields]

    def run(group: tuple, frames: Iterator[pd.DataFrame], state: GroupState
            ) -> Iterator[pd.DataFrame]:
        if state.hasTimedOut:
            state.remove()
            yield pd.DataFrame([], columns=columns, dtype=object)
            return
        saved = json.loads(state.get[0]) if state.exists else None
        before = [(r[0], r[1]) for r in saved["rows"]] if saved is not None else None
        rows = [row for frame in frames for row in _rows(frame, len(carried))]
        latest = None if saved is None else saved["last"]
        after, last = top_n.fold_ranking(before or [], latest, rows, n, ttl_us, key)
        assert last is not None  # a call without a timeout brings rows
        changed, gone = top_n.ranking_changes(before, after, n)
        state.update((json.dumps({"last": last, "rows": after}),))
        state.setTimeoutTimestamp(max((last + ttl_us) // 1000, state.getCurrentWatermarkMs(), 1))
        prefix = [arrow_text.text(v) for v in group] if keys else []
        out = [prefix + [str(rank)] + after[rank - 1][1] for rank in changed]
        out += [prefix + [str(-rank)] + [None] * len(carried) for rank in gone]
        yield pd.DataFrame(out, columns=columns, dtype=object)

    grouping = [F.col(f"`{k.name}`") for k in keys] or [F.lit("").alias(_KEY)]
    texts = _texts(df, stream, time, keys, carried, watermark)
    return apply_keyed(texts, grouping, run, out_fields), Schema(tuple(out_fields))
