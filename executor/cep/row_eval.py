"""Evaluates a pattern's type-checked conditions and measures on one partial or complete match.

Owns `evaluate` (a tree from `compiler.expr.pattern.compile_define` / `compile_measure` and a
`MatchView` -> a Python value or None), interpreting the node classes of `compiler.expr` with the
language's semantics (docs/expressions.md: three-valued logic, null on int overflow and on
division by zero, `%` with the dividend's sign, NaN equal to itself and larger than every
double) and the navigation functions of a match. Only the functions in
`compiler.expr.pattern.ROW_FUNCTIONS` exist here; the compiler refuses the others. Values are
plain Python: int, float, str, bool, timestamps as int microseconds since the epoch. Nothing
here runs user text: it walks a tree the checker accepted. Does not own matching
(`executor.cep.match`) or Spark (`executor.cep.spark`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Sequence

from compiler import expr

Row = dict[str, Any]
_EPOCH = expr.EPOCH


@dataclass(frozen=True)
class MatchView:
    """The rows of a match so far (the current row last) and the variable of each."""

    rows: Sequence[Row]
    labels: Sequence[str]
    stream: str  # the input stream's name: `stream.col` is the current row, as `col` is

    def of(self, var: str | None) -> list[Row]:
        if var is None or var == self.stream:
            return list(self.rows)
        return [r for r, v in zip(self.rows, self.labels) if v == var]


def timestamp_micros(value: datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def evaluate(node: expr.Expr, view: MatchView) -> Any:
    """The value of `node` on `view` (None is null)."""
    return _EVAL[type(node)](node, view)


def _literal(node: expr.Literal, view: MatchView) -> Any:
    return timestamp_micros(node.value) if isinstance(node.value, datetime) else node.value


def _column(node: expr.ColumnRef, view: MatchView) -> Any:
    rows = view.of(node.stream)
    return rows[-1].get(node.name) if rows else None


def _int(value: int) -> int | None:
    return value if expr.INT_MIN <= value <= expr.INT_MAX else None


def _unary(node: expr.Unary, view: MatchView) -> Any:
    value = evaluate(node.operand, view)
    if value is None:
        return None
    if node.op == "not":
        return not value
    return _int(-value) if type(value) is int else -value


def _is_nan(x: Any) -> bool:
    return type(x) is float and math.isnan(x)


def compare(a: Any, b: Any) -> int:
    """-1, 0 or 1 with Spark's order: NaN equals NaN and is larger than every other double."""
    if _is_nan(a) or _is_nan(b):
        return (_is_nan(a) - _is_nan(b))
    return (a > b) - (a < b)


_COMPARE: dict[str, Callable[[int], bool]] = {
    "=": lambda c: c == 0, "!=": lambda c: c != 0, "<": lambda c: c < 0,
    "<=": lambda c: c <= 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0}


def _logical(op: str, a: Any, b: Any) -> Any:
    if op == "and":
        if a is False or b is False:
            return False
        return None if a is None or b is None else True
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _arithmetic(op: str, a: Any, b: Any) -> Any:
    ints = type(a) is int and type(b) is int
    if op == "/":
        return None if b == 0 else float(a) / float(b)
    if op == "%":
        if b == 0:
            return None
        if ints:
            r = abs(a) % abs(b)
            return r if a >= 0 else -r
        return math.fmod(float(a), float(b))
    if ints:
        return _int({"+": a + b, "-": a - b, "*": a * b}[op])
    x, y = float(a), float(b)
    try:
        return {"+": x + y, "-": x - y, "*": x * y}[op]
    except OverflowError:  # pragma: no cover - float ops give inf, not this
        return math.inf


def _binary(node: expr.Binary, view: MatchView) -> Any:
    a = evaluate(node.left, view)
    if node.op in expr.LOGICAL_OPS:
        if (node.op == "and" and a is False) or (node.op == "or" and a is True):
            return a
        return _logical(node.op, a, evaluate(node.right, view))
    b = evaluate(node.right, view)
    if a is None or b is None:
        return None
    if node.op in _COMPARE:
        return _COMPARE[node.op](compare(a, b))
    return _arithmetic(node.op, a, b)


def _between(node: expr.Between, view: MatchView) -> Any:
    v, lo, hi = (evaluate(n, view) for n in (node.operand, node.low, node.high))
    above = None if v is None or lo is None else compare(v, lo) >= 0
    below = None if v is None or hi is None else compare(v, hi) <= 0
    result = _logical("and", above, below)
    return result if result is None or not node.negated else not result


def _in(node: expr.InList, view: MatchView) -> Any:
    v = evaluate(node.operand, view)
    items = [evaluate(i, view) for i in node.items]
    if v is not None and any(i is not None and compare(v, i) == 0 for i in items):
        result: Any = True
    elif v is None or any(i is None for i in items):
        result = None
    else:
        result = False
    return result if result is None or not node.negated else not result


def _isnull(node: expr.IsNull, view: MatchView) -> bool:
    return (evaluate(node.operand, view) is None) != node.negated


def _extreme(values: list[Any], sign: int) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    best = present[0]
    for v in present[1:]:
        if compare(v, best) * sign > 0:
            best = v
    return best


def _navigation(node: expr.Call, view: MatchView) -> Any:
    name = node.function
    if name == "count":
        var = node.args[0] if node.args else None
        assert var is None or isinstance(var, expr.ColumnRef)  # checked: count() or count(V)
        return len(view.of(var.name if var is not None else None))
    ref = node.args[0]
    assert isinstance(ref, expr.ColumnRef)
    if name == "prev":
        return view.rows[-2].get(ref.name) if len(view.rows) >= 2 else None
    rows = view.of(ref.stream)
    if name in ("first", "last"):
        return (rows[0] if name == "first" else rows[-1]).get(ref.name) if rows else None
    return _extreme([r.get(ref.name) for r in rows], 1 if name == "max" else -1)


def _nulls_in(args: list[Any]) -> bool:
    return any(a is None for a in args)


_ROW_FUNCTIONS: dict[str, Callable[[list[Any]], Any]] = {
    "abs": lambda a: None if a[0] is None else (_int(abs(a[0])) if type(a[0]) is int
                                                else abs(a[0])),
    "least": lambda a: _extreme(_common(a), -1),
    "greatest": lambda a: _extreme(_common(a), 1),
    "coalesce": lambda a: next((v for v in _common(a) if v is not None), None),
    "lower": lambda a: None if a[0] is None else a[0].lower(),
    "upper": lambda a: None if a[0] is None else a[0].upper(),
    "length": lambda a: None if a[0] is None else len(a[0]),
    "concat": lambda a: None if _nulls_in(a) else "".join(a),
    "unix_seconds": lambda a: None if a[0] is None else a[0] // 1_000_000,
    "starts_with": lambda a: None if _nulls_in(a) else a[0].startswith(a[1]),
    "ends_with": lambda a: None if _nulls_in(a) else a[0].endswith(a[1]),
    "contains": lambda a: None if _nulls_in(a) else a[1] in a[0],
}


def _common(values: list[Any]) -> list[Any]:
    """int and double arguments mixed: all as double (the checker's common type)."""
    if any(type(v) is float for v in values):
        return [float(v) if type(v) is int else v for v in values]
    return values


def _call(node: expr.Call, view: MatchView) -> Any:
    if node.function in _ROW_FUNCTIONS:
        return _ROW_FUNCTIONS[node.function]([evaluate(a, view) for a in node.args])
    return _navigation(node, view)


_EVAL: dict[type, Callable[[Any, MatchView], Any]] = {
    expr.Literal: _literal, expr.ColumnRef: _column, expr.Unary: _unary, expr.Binary: _binary,
    expr.Between: _between, expr.InList: _in, expr.IsNull: _isnull, expr.Call: _call,
}
