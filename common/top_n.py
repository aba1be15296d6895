"""What a `top-n` operator means, shared by the validator and the runtime (pure).

Owns parsing its `order-by` (columns, each `asc` or `desc`), the bound on `n`, and its output
columns: window_start, window_end, the group columns, `rank`, then the input's other columns.
Does not own running it (`executor.runtime`) nor checking a spec (`compiler.validate`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


def output_schema(schema: Schema, group_by: tuple[str, ...]) -> Schema:
    """window_start, window_end, the group columns, rank (1 = first), the carried columns."""
    groups = tuple(f for g in group_by for f in schema if f.name == g)
    return Schema((*(Field(n, ColumnType.TIMESTAMP) for n in WINDOW_COLUMNS), *groups,
                   Field(RANK_COLUMN, ColumnType.INT), *carried_fields(schema, group_by)))


def reserved_clashes(schema: Schema) -> list[str]:
    """Input columns whose names the output already uses (window_start, window_end, rank),
    compared regardless of case as Spark does."""
    reserved = {n.lower() for n in (*WINDOW_COLUMNS, RANK_COLUMN)}
    return [f.name for f in schema if f.name.lower() in reserved]
