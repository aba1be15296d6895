"""The stream type between the stages of a pipelined pattern operator.

A pattern operator pipelined over k stages (docs/patterns.md, "Pipelining a pattern's
repetition") runs as k streaming queries in a chain; each stage but the last writes, and each
but the first reads, a stream of *items* (rows, partial matches handed on, matches found, and
progress ticks: `executor.cep.stage`). Owns that stream's columns: the operator's partition-key
columns, the item's event time (what the next stage's watermark follows), its position in the
output of the call that emitted it (what orders items of equal time), and the item's JSON text.
The rewrite engine types the streams between stages with it; the executor reads and writes them.
"""

from __future__ import annotations

from typing import Sequence

from common.types import ColumnType, Field, Schema

TIME = "__elastiq_stage_time"
SEQ = "__elastiq_stage_seq"
ITEM = "__elastiq_stage_item"


def stage_schema(keys: Sequence[Field]) -> Schema:
    """The columns of the stream between two stages of a pattern partitioned by `keys`."""
    return Schema(tuple(keys) + (Field(TIME, ColumnType.TIMESTAMP), Field(SEQ, ColumnType.INT),
                                 Field(ITEM, ColumnType.STRING)))
