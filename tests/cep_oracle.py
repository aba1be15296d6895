"""An independent plain-Python row-pattern matcher, the oracle of the pattern operator's tests.

Written apart from `executor.cep.match`: a recursive backtracking matcher over the pattern tree
(continuation passing, preferred branch first: greedy quantifiers, left alternatives), tried from
each row in time order; after a match, from the row after its last (SKIP PAST LAST ROW), or
with `skip_to_next`, from the row after its first (every start row keeps its match). Rows
are ordered by time (ties by their JSON form) after dropping late rows, which it works out from
the batches as the docs define them (a row at or before the highest watermark of the batches
before its own is late). Conditions are plain Python functions of (rows so far, their variables),
which the tests write next to each condition's text.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Sequence

from compiler.expr.pattern import Alt, Node, Seq, Var

Row = dict[str, Any]
Condition = Callable[[list[Row], list[str]], bool]
Cont = Callable[[int, list[str]], "list[str] | None"]


def match_at(tree: Node, rows: Sequence[Row], start: int, conditions: dict[str, Condition],
             within: int, time: str) -> list[str] | None:
    """The variables of the preferred match starting at `rows[start]`, or None."""

    def var(name: str, i: int, labels: list[str], k: Cont) -> list[str] | None:
        if i >= len(rows) or rows[i][time] - rows[start][time] > within:
            return None
        now = labels + [name]
        cond = conditions.get(name)
        if cond is not None and not cond(list(rows[start:i + 1]), now):
            return None
        return k(i + 1, now)

    def m(node: Node, i: int, labels: list[str], k: Cont) -> list[str] | None:
        if isinstance(node, Var):
            return var(node.name, i, labels, k)
        if isinstance(node, Seq):
            return seq(node.items, i, labels, k)
        if isinstance(node, Alt):
            for option in node.options:
                found = m(option, i, labels, k)
                if found is not None:
                    return found
            return None
        if node.op == "+":
            return m(node.body, i, labels, lambda j, lb: star(node.body, j, lb, k))
        if node.op == "*":
            return star(node.body, i, labels, k)
        found = m(node.body, i, labels, k)
        return found if found is not None else k(i, labels)

    def star(body: Node, i: int, labels: list[str], k: Cont) -> list[str] | None:
        found = m(body, i, labels, lambda j, lb: star(body, j, lb, k))
        return found if found is not None else k(i, labels)

    def seq(items: tuple[Node, ...], i: int, labels: list[str], k: Cont) -> list[str] | None:
        if not items:
            return k(i, labels)
        return m(items[0], i, labels, lambda j, lb: seq(items[1:], j, lb, k))

    return m(tree, start, [], lambda i, labels: labels)


def all_matches(tree: Node, rows: Sequence[Row], conditions: dict[str, Condition], within: int,
                time: str, skip_to_next: bool = False) -> list[tuple[int, list[str]]]:
    """(first row index, variables) of every match of one key's time-ordered rows."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    out, i = [], 0
    while i < len(rows):
        found = match_at(tree, rows, i, conditions, within, time)
        if found:
            out.append((i, found))
            i += 1 if skip_to_next else len(found)
        else:
            i += 1
    return out


def on_time_rows(batches: Sequence[tuple[Sequence[Row], int]], time: str) -> list[Row]:
    """The rows of (rows, watermark) batches that are not late, in matching order."""
    kept: list[Row] = []
    seen_watermark: int | None = None
    for rows, watermark in batches:
        kept += [r for r in rows if r.get(time) is not None
                 and (seen_watermark is None or r[time] > seen_watermark)]
        seen_watermark = watermark if seen_watermark is None else max(seen_watermark, watermark)
    return sorted(kept, key=lambda r: (r[time], json.dumps(r, sort_keys=True, default=str)))
