"""The pattern operator on Spark: one `KeyMatcher` per partition key in Spark's state store.

Owns `pattern_frame` (the input DataFrame -> the DataFrame of matches, through
`applyInPandasWithState` with event-time timeouts: the state of each key is its matcher's JSON,
checkpointed with the query, so a restarted query resumes every partial match exactly once) and
the exact row transport across Arrow: every non-string column crosses as its text (ints and
timestamps as decimal integers, doubles as Java prints them), so nulls, NaN and 64-bit values
arrive unchanged, and the measures come back the same way and are cast to their types. A key
wakes up when new rows arrive or when the watermark reaches its next deadline (a waiting row's
time, or an open match's time bound). Also owns `stage_frame`, one stage of a pattern
pipelined over k stages, whose state is that stage's `executor.cep.stage.StageMatcher`. Does not
own matching (`executor.cep.match`, `executor.cep.stage`).
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from common import pattern_stages
from common.pattern_stages import stage_schema
from common.types import ColumnType, Field, Schema
from executor import arrow_text
from executor.cep.match import KeyMatcher, PatternProgram, measures
from executor.cep.stage import Item, Stage, StageMatcher, carrier_order

log = logging.getLogger(__name__)

_KEY = "__elastiq_key"
_TIME = "__elastiq_time"  # the event time as a timestamp, for the watermark
STATE_SCHEMA = "matcher string"


def _rows(records: list[dict[str, Any]], types: dict[str, ColumnType]) -> list[dict[str, Any]]:
    """The rows of a group's records as the matcher takes them (typed values, the columns of
    `types` only)."""
    return [{name: arrow_text.from_text(value, types[name]) for name, value in record.items()
             if name in types} for record in records]


def _deadline_ms(matcher: KeyMatcher | StageMatcher, watermark_ms: int) -> int | None:
    """The timeout that wakes the key once the watermark reaches its next deadline (Spark fires
    an event-time timeout when the watermark passes it)."""
    deadline = matcher.next_deadline()
    if deadline is None:
        return None
    return max(-(-deadline // 1000) - 1, watermark_ms, 1)


def _keep(state: GroupState, matcher: KeyMatcher | StageMatcher, watermark_ms: int) -> None:
    """Store the key's matcher (or drop an idle one) and wake the key at its next deadline."""
    if matcher.idle():
        state.remove()
        return
    state.update((matcher.to_json(),))
    deadline = _deadline_ms(matcher, watermark_ms)
    if deadline is not None:
        state.setTimeoutTimestamp(deadline)


def _row_texts(df: DataFrame, stream: str, program: PatternProgram, watermark: str
               ) -> DataFrame:
    """The rows as text, with their event time as a timestamp under the operator's watermark."""
    texts = df.select(*[arrow_text.to_text(stream, f) for f in program.schema],
                      F.col(f"`{stream}`.`{program.time}`").alias(_TIME))
    return texts.withWatermark(_TIME, watermark)


def _per_key(texts: DataFrame, grouping: list[Column], run: Any, out_fields: tuple[Field, ...]
             ) -> tuple[DataFrame, Schema]:
    """`run` over each key's rows with its state (event-time timeouts, append mode); its text
    columns cast back to `out_fields`' types."""
    output_schema = ", ".join(f"`{f.name}` string" for f in out_fields)
    result = texts.groupBy(*grouping).applyInPandasWithState(
        run, output_schema, STATE_SCHEMA, "append", GroupStateTimeout.EventTimeTimeout)
    typed = result.select(*[arrow_text.typed(f.name, f.type) for f in out_fields])
    return typed, Schema(out_fields)


def pattern_frame(df: DataFrame, stream: str, program: PatternProgram, keys: Sequence[Field],
                  measure_fields: Sequence[Field], watermark: str) -> tuple[DataFrame, Schema]:
    """The matches of `df` (aliased `stream`): the key columns, then the measures."""
    out_fields = tuple(keys) + tuple(measure_fields)
    key_names = [k.name for k in keys]
    texts = _row_texts(df, stream, program, watermark)
    grouping = [F.col(f"`{k}`") for k in key_names] or [F.lit("").alias(_KEY)]
    types = {f.name: f.type for f in program.schema}

    def run(key: tuple, frames: Iterator[pd.DataFrame], state: GroupState
            ) -> Iterator[pd.DataFrame]:
        matcher = (KeyMatcher.from_json(program, state.get[0]) if state.exists
                   else KeyMatcher(program))
        rows = _rows([record for frame in frames for record in frame.to_dict("records")],
                     types)
        watermark_ms = state.getCurrentWatermarkMs()
        found = matcher.feed(rows, watermark_ms * 1000)
        _keep(state, matcher, watermark_ms)
        key_values = list(key) if key_names else []
        out = [[arrow_text.text(v) for v in key_values]
               + [arrow_text.text(v) for v in measures(program, m)]
               for m in found]
        yield pd.DataFrame(out, columns=[f.name for f in out_fields], dtype=object)

    return _per_key(texts, grouping, run, out_fields)


# ------------------------------------------------------------------------------------------------
# A stage of a pipelined pattern operator (docs/patterns.md, "Pipelining a pattern's repetition")

_SEQ = "__elastiq_seq"
_TIME_US = "__elastiq_time_us"
_ITEM = "__elastiq_item"
# How far a later stage's watermark trails the newest item time it has read: stage i >= 2
# trails by i - 1 ms. Spark drops a row at or before the watermark, so every item a stage writes
# must lie after the next stage's watermark. A stage writes nothing later than the newest item
# it has read, and ends each call with a tick (and matches) at its progress, which may be its
# own watermark: the next stage trailing 1 ms more than this one keeps those after its own
# watermark (docs/patterns.md, "Pipelining a pattern's repetition").


def stage_watermark(stage: Stage) -> str:
    """The watermark delay of a stage after the first (the first uses the operator's)."""
    return f"{stage.index - 1} milliseconds"


def stage_frame(df: DataFrame, stream: str, program: PatternProgram, keys: Sequence[Field],
                measure_fields: Sequence[Field], watermark: str, stage: Stage
                ) -> tuple[DataFrame, Schema]:
    """Stage `stage` of the pattern over `df` (aliased `stream`): the first reads rows, the
    others the items the stage before writes; the last returns the matches (the key columns,
    then the measures), the others the items for the next stage
    (`common.pattern_stages.stage_schema`)."""
    key_names = [k.name for k in keys]
    last = stage.last
    out_fields = tuple(keys) + (tuple(measure_fields) if last else
                                tuple(stage_schema(keys))[len(keys):])
    if stage.index == 1:
        texts = _row_texts(df, stream, program, watermark)
    else:
        texts = df.select(*[arrow_text.to_text(stream, f) for f in keys],
                          F.col(f"`{stream}`.`{pattern_stages.TIME}`").alias(_TIME),
                          F.unix_micros(F.col(f"`{stream}`.`{pattern_stages.TIME}`"))
                          .cast("string").alias(_TIME_US),
                          F.col(f"`{stream}`.`{pattern_stages.SEQ}`").cast("string").alias(_SEQ),
                          F.col(f"`{stream}`.`{pattern_stages.ITEM}`").alias(_ITEM))
        texts = texts.withWatermark(_TIME, stage_watermark(stage))
    grouping = [F.col(f"`{k}`") for k in key_names] or [F.lit("").alias(_KEY)]
    types = {f.name: f.type for f in program.schema}

    def run(key: tuple, frames: Iterator[pd.DataFrame], state: GroupState
            ) -> Iterator[pd.DataFrame]:
        matcher = (StageMatcher.from_json(program, stage, state.get[0]) if state.exists
                   else StageMatcher(program, stage))
        watermark_ms = state.getCurrentWatermarkMs()
        records = [record for frame in frames for record in frame.to_dict("records")]
        if stage.index == 1:
            items = matcher.feed_rows(_rows(records, types), watermark_ms * 1000)
        else:
            items = matcher.feed_items(_items_in_order(records, program), watermark_ms * 1000)
        _keep(state, matcher, watermark_ms)
        key_values = [arrow_text.text(v) for v in key] if key_names else []
        out = ([key_values + [arrow_text.text(v) for v in item.body] for item in items
                if item.kind == "match"] if last else
               [key_values + [str(item.time), str(seq), item.encode()]
                for seq, item in enumerate(items)])
        yield pd.DataFrame(out, columns=[f.name for f in out_fields], dtype=object)

    return _per_key(texts, grouping, run, out_fields)


def _items_in_order(records: list[dict[str, Any]], program: PatternProgram) -> list[Item]:
    """The items of one key, decoded (`Item.decode` checks them and runs nothing: a malformed
    one fails the query with what is wrong), in the order the stage before wrote them
    (`cep_stage.carrier_order`)."""
    timed = [(int(r[_TIME_US]), int(r[_SEQ]), r[_ITEM]) for r in records]
    return carrier_order([(Item.decode(text, time, program), time, seq)
                          for time, seq, text in timed])
