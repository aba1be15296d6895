"""The Spark plans of the operators that keep their own state per key: count windows
(`window-aggregate` with `rows`) and updating aggregates (`aggregate`).

Both run through `applyInPandasWithState` in append mode with event-time timeouts: a key's state
is JSON in Spark's state store, checkpointed with the query, so a restarted query (after a
SIGKILL too) resumes every key where the last committed micro-batch left it, and a replayed
micro-batch (same rows, same watermark: Spark keeps both in its offset log) gives the same
output. Rows cross Arrow as text (ints and timestamps as decimal integers, doubles as Java
prints them), so nulls, NaN and 64-bit values arrive unchanged.

A count window releases a key's rows once the watermark has passed them (Spark drops a row at
or before the watermark, so none can come before them any more), in event-time order (rows of
equal time ordered by their aggregated values, which makes every result a function of the
rows), and emits, for each released row, the aggregates over it and the key's n - 1 rows before
it. An updating aggregate folds each micro-batch's rows of a key into running totals and emits
the key's new totals once per micro-batch that brought it rows: an upsert record (the file sink
writes them as an upsert log, `common.upsert_log`). A row more than `ttl` of event time after
the key's latest row starts its totals anew (so the totals are a function of the rows, not of
how micro-batches cut them), and a key's state is dropped once the watermark passes its latest
row's time plus `ttl` (no row after that can join it: it would be late or start anew).
Aggregates are `common.keyed_aggregates`. Does not own argument checks (`executor.runtime`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from common import keyed_aggregates as ka
from common.types import ColumnType, Field, Schema
from executor import arrow_text

_KEY = "__elastiq_key"
_TIME = "__elastiq_time"  # the event time as a timestamp, for the watermark
_TIME_US = "__elastiq_time_us"
STATE_SCHEMA = "state string"


@dataclass(frozen=True)
class Aggregate:
    """One output aggregate: its name, function, the input column it reads (None: count of
    rows) and its result column."""

    name: str
    function: str
    column: Field | None
    out: Field


@dataclass(frozen=True)
class _Layout:
    """The text frame a keyed operator reads: key columns, the aggregated columns (each once,
    as `__v<i>`), the time in microseconds, and the time as a watermarked timestamp."""

    keys: tuple[Field, ...]
    values: tuple[Field, ...]  # the distinct input columns the aggregates read
    slots: tuple[int | None, ...]  # per aggregate: its column's index in `values` (None: rows)

    @staticmethod
    def of(keys: Sequence[Field], aggregates: Sequence[Aggregate]) -> "_Layout":
        values: list[Field] = []
        for a in aggregates:
            if a.column is not None and a.column not in values:
                values.append(a.column)
        slots = tuple(None if a.column is None else values.index(a.column) for a in aggregates)
        return _Layout(tuple(keys), tuple(values), slots)

    def frame(self, df: DataFrame, stream: str, time: str, watermark: str) -> DataFrame:
        texts = df.select(*[arrow_text.to_text(stream, k, k.name) for k in self.keys],
                          *[arrow_text.to_text(stream, v, f"__v{i}")
                            for i, v in enumerate(self.values)],
                          F.unix_micros(F.col(f"`{stream}`.`{time}`")).cast("string")
                          .alias(_TIME_US),
                          F.col(f"`{stream}`.`{time}`").alias(_TIME))
        return texts.withWatermark(_TIME, watermark)

    def rows(self, frames: Iterator[pd.DataFrame]) -> list[tuple[int, list[Any]]]:
        """(time in µs, values) of the call's rows, in event-time order, equal times by their
        values (a total order of what the aggregates read)."""
        rows = [(int(r[_TIME_US]), [arrow_text.from_text(r[f"__v{i}"], v.type)
                                    for i, v in enumerate(self.values)])
                for frame in frames for r in frame.to_dict("records")]
        return sorted(rows, key=row_order)

    def grouping(self) -> list[Column]:
        return [F.col(f"`{k.name}`") for k in self.keys] or [F.lit("").alias(_KEY)]

    def key_texts(self, key: tuple) -> list[str | None]:
        return [arrow_text.text(v) for v in key] if self.keys else []


def row_order(row: tuple[int, Sequence[Any]]) -> tuple:
    """Event time, then the aggregated values (`keyed_aggregates.order_key`)."""
    return (row[0], [ka.order_key(v) for v in row[1]])


def apply_keyed(texts: DataFrame, grouping: Sequence[Column], run: Any,
                out_fields: Sequence[Field]) -> DataFrame:
    """`run` over each key's rows of `texts` (grouped by `grouping`) with its state, in append
    mode with event-time timeouts; its text columns back as `out_fields` (also the updating
    top-n's plan, `executor.top_n_frame`)."""
    schema = ", ".join(f"`{f.name}` string" for f in out_fields)
    result = texts.groupBy(*grouping).applyInPandasWithState(
        run, schema, STATE_SCHEMA, "append", GroupStateTimeout.EventTimeTimeout)
    return result.select(*[arrow_text.typed(f.name, f.type) for f in out_fields])


def _column_values(aggregates: Sequence[Aggregate], layout: _Layout,
                   window: Sequence[tuple[int, Sequence[Any]]]) -> list[str | None]:
    return [arrow_text.text(ka.over_rows(a.function, [1 if slot is None else row[1][slot]
                                            for row in window]))
            for a, slot in zip(aggregates, layout.slots)]


def count_window_frame(df: DataFrame, stream: str, time: str, keys: Sequence[Field],
                       aggregates: Sequence[Aggregate], rows: int, watermark: str
                       ) -> tuple[DataFrame, Schema]:
    """Per input row, once released: window_start (the time of the oldest of the key's last
    `rows` rows), window_end (the row's own time), the key columns, the aggregates over those
    rows."""
    layout = _Layout.of(keys, aggregates)
    out_fields = (Field("window_start", ColumnType.TIMESTAMP),
                  Field("window_end", ColumnType.TIMESTAMP), *keys, *[a.out for a in aggregates])
    names = [f.name for f in out_fields]

    def run(key: tuple, frames: Iterator[pd.DataFrame], state: GroupState
            ) -> Iterator[pd.DataFrame]:
        saved = json.loads(state.get[0]) if state.exists else {"pending": [], "recent": []}
        watermark_us = state.getCurrentWatermarkMs() * 1000
        pending = sorted([tuple(p) for p in saved["pending"]] + layout.rows(frames),
                         key=row_order)
        ready = [p for p in pending if p[0] <= watermark_us]
        waiting = pending[len(ready):]
        recent, out = [tuple(r) for r in saved["recent"]], []
        for row in ready:
            recent = (recent + [row])[-rows:]
            out.append([str(recent[0][0]), str(row[0])] + layout.key_texts(key)
                       + _column_values(aggregates, layout, recent))
        recent = recent[-(rows - 1):] if rows > 1 else []
        if waiting or recent:
            state.update((json.dumps({"pending": waiting, "recent": recent}),))
        else:
            state.remove()
        if waiting:  # woken once the watermark reaches the first waiting row
            first_ms = -(-waiting[0][0] // 1000)
            state.setTimeoutTimestamp(max(first_ms - 1, state.getCurrentWatermarkMs(), 1))
        yield pd.DataFrame(out, columns=names, dtype=object)

    frame = apply_keyed(layout.frame(df, stream, time, watermark), layout.grouping(), run,
                        out_fields)
    return frame, Schema(out_fields)


def updating_frame(df: DataFrame, stream: str, time: str, keys: Sequence[Field],
                   aggregates: Sequence[Aggregate], ttl_us: int, watermark: str
                   ) -> tuple[DataFrame, Schema]:
    """Per key and micro-batch that brought it rows: the key columns and its aggregates over
    its rows since the last gap longer than `ttl_us` (an upsert record); the state is dropped
    once the watermark passes `ttl_us` after the key's latest row."""
    layout = _Layout.of(keys, aggregates)
    out_fields = (*keys, *[a.out for a in aggregates])
    names = [f.name for f in out_fields]

    def run(key: tuple, frames: Iterator[pd.DataFrame], state: GroupState
            ) -> Iterator[pd.DataFrame]:
        watermark_ms = state.getCurrentWatermarkMs()
        if state.hasTimedOut:
            state.remove()
            yield pd.DataFrame([], columns=names, dtype=object)
            return
        saved = json.loads(state.get[0]) if state.exists else None
        accs = saved["accs"] if saved is not None else [list(ka.EMPTY) for _ in aggregates]
        last = saved["last"] if saved is not None else None
        for when, values in layout.rows(frames):
            if last is not None and when > last + ttl_us:  # a gap longer than ttl: anew
                accs = [list(ka.EMPTY) for _ in aggregates]
            accs = [ka.fold(acc, 1 if slot is None else values[slot])
                    for acc, slot in zip(accs, layout.slots)]
            last = when if last is None else max(last, when)
        assert last is not None  # a call without a timeout brings rows
        state.update((json.dumps({"last": last, "accs": accs}),))
        state.setTimeoutTimestamp(max((last + ttl_us) // 1000, watermark_ms, 1))
        out = [layout.key_texts(key) + [arrow_text.text(ka.result(a.function, acc))
                                        for a, acc in zip(aggregates, accs)]]
        yield pd.DataFrame(out, columns=names, dtype=object)

    frame = apply_keyed(layout.frame(df, stream, time, watermark), layout.grouping(), run,
                        out_fields)
    return frame, Schema(tuple(out_fields))
