"""The expression language's syntax tree and its closed vocabulary.

Owns the limits (text length, nesting depth, the int range), `Problem` and `ExpressionError`
(every problem of an expression, sorted by offset), the AST node classes (frozen dataclasses
located by offset and length in the text they came from), `TypedExpr`, `Scope`, tree walks, the
depth guard, and the closed table of functions with their signatures (`FUNCTIONS`). Does not own
reading text (`compiler.expr.lexer`, `compiler.expr.parser`), typing (`compiler.expr.checker`) or
running an expression (the executor's `executor.expression_lowering`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Literal as Lit, Mapping, Union

from common.types import ColumnType, Schema

MAX_TEXT_LENGTH = 4096
MAX_DEPTH = 64
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
KEYWORDS = frozenset({"and", "or", "not", "true", "false", "in", "between", "is", "null", "case",
                      "when", "then", "else", "end"})
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# ================================================================================ problems ==


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an expression: where (0-based offset and length into the text), what,
    and what to do about it."""

    offset: int
    length: int
    message: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"at {self.offset}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


class ExpressionError(Exception):
    """Raised by parse/check/compile/from_json; carries every problem found, sorted by offset."""

    def __init__(self, problems: "list[Problem] | tuple[Problem, ...]"):
        self.problems: tuple[Problem, ...] = tuple(
            sorted(problems, key=lambda p: (p.offset, p.message)))
        super().__init__("; ".join(str(p) for p in self.problems))


# ===================================================================================== AST ==
# `offset`/`length` locate a node in the text it was parsed from; they do not take part in
# equality, so parse(render(e)) == e.


@dataclass(frozen=True)
class Literal:
    """A constant: int, double (finite), string, boolean or timestamp (aware, UTC)."""

    value: Any
    type: ColumnType
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ColumnRef:
    """`name` or `stream.name`."""

    stream: str | None
    name: str
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Unary:
    """`-x` or `not x`."""

    op: Lit["-", "not"]
    operand: "Expr"
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Binary:
    """`left op right`; op is one of `or and = != < <= > >= + - * / %`."""

    op: str
    left: "Expr"
    right: "Expr"
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Between:
    """`operand [not] between low and high` (both ends inclusive)."""

    operand: "Expr"
    low: "Expr"
    high: "Expr"
    negated: bool = False
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class InList:
    """`operand [not] in (item, ...)`."""

    operand: "Expr"
    items: "tuple[Expr, ...]"
    negated: bool = False
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class IsNull:
    """`operand is [not] null`."""

    operand: "Expr"
    negated: bool = False
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Call:
    """`function(arg, ...)`; `function` is a lower-case name from `FUNCTIONS`."""

    function: str
    args: "tuple[Expr, ...]"
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Case:
    """`case when c1 then v1 [when c2 then v2 ...] [else d] end`: the value of the first branch
    whose condition is true (null counts as not true), else `default` (null when absent)."""

    branches: "tuple[tuple[Expr, Expr], ...]"
    default: "Expr | None" = None
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


Expr = Union[Literal, ColumnRef, Unary, Binary, Between, InList, IsNull, Call, Case]

LOGICAL_OPS = ("or", "and")
COMPARISON_OPS = ("=", "!=", "<", "<=", ">", ">=")
ARITHMETIC_OPS = ("+", "-", "*", "/", "%")
BINARY_OPS = LOGICAL_OPS + COMPARISON_OPS + ARITHMETIC_OPS


@dataclass(frozen=True)
class TypedExpr:
    """A parsed, type-checked expression with its result type and the text it came from."""

    expr: Expr
    type: ColumnType
    text: str


@dataclass(frozen=True)
class Scope:
    """The names an expression may use: input stream name -> its schema. An unqualified column
    name resolves when exactly one stream has it, or, with `current`, in that stream only.
    `navigation` types the calls of a pattern's navigation functions (`compiler.expr.pattern`):
    given the call, it returns the result type or the problems; None elsewhere."""

    streams: Mapping[str, Schema]
    current: str | None = None
    navigation: "Callable[[Call], ColumnType | list[Problem]] | None" = None


def children(expr: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of a node, in source order."""
    if isinstance(expr, Unary):
        return (expr.operand,)
    if isinstance(expr, Binary):
        return (expr.left, expr.right)
    if isinstance(expr, Between):
        return (expr.operand, expr.low, expr.high)
    if isinstance(expr, InList):
        return (expr.operand, *expr.items)
    if isinstance(expr, IsNull):
        return (expr.operand,)
    if isinstance(expr, Call):
        return expr.args
    if isinstance(expr, Case):
        parts = tuple(part for branch in expr.branches for part in branch)
        return parts if expr.default is None else (*parts, expr.default)
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of the tree, pre-order, without recursion."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def too_deep(expr: Expr) -> Problem | None:
    """A problem if the tree nests deeper than MAX_DEPTH (checked without recursion)."""
    stack: list[tuple[Expr, int]] = [(expr, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return Problem(node.offset, node.length,
                           f"expression nests more than {MAX_DEPTH} levels deep",
                           "simplify it, e.g. write x in (a, b, c) instead of a long chain of "
                           "'or', or split it over several operators")
        stack.extend((c, depth + 1) for c in children(node))
    return None


def guard_depth(expr: Expr) -> None:
    problem = too_deep(expr)
    if problem is not None:
        raise ExpressionError([problem])


# =============================================================================== functions ==
# Parameter classes: numeric (int|double), int, int_literal, string, timestamp,
# orderable (numeric|string|timestamp, one common type), any (one common type),
# scalar (int|double|string|boolean), value (any single type), pattern (a string literal that
# `compiler.expr.regex` accepts), group (an int literal naming a group of the pattern before it).
# Result: a ColumnType, "arg" (the first argument's type) or "common" (the arguments' common type).


@dataclass(frozen=True)
class FunctionSig:
    """The typed signature of one function of the language."""

    name: str
    params: tuple[str, ...]
    result: ColumnType | str
    min_args: int
    variadic: bool = False  # the last parameter repeats
    doc: str = ""

    @property
    def max_args(self) -> int | None:
        return None if self.variadic else len(self.params)

    def describe(self) -> str:
        params = list(self.params)
        shown = [p if i < self.min_args else f"[{p}]" for i, p in enumerate(params)]
        if self.variadic:
            shown.append("...")
        result = self.result.value if isinstance(self.result, ColumnType) else self.result
        return f"{self.name}({', '.join(shown)}) -> {result}"


def _sig(name: str, params: str, result: ColumnType | str, min_args: int | None = None,
         variadic: bool = False, doc: str = "") -> FunctionSig:
    ps = tuple(params.split()) if params else ()
    return FunctionSig(name, ps, result, len(ps) if min_args is None else min_args, variadic, doc)


_T = ColumnType
FUNCTIONS: dict[str, FunctionSig] = {s.name: s for s in (
    _sig("abs", "numeric", "arg", doc="absolute value; abs of the smallest int is null"),
    _sig("round", "numeric int_literal", "arg", 1,
         doc="round half away from zero to `digits` decimal places (default 0)"),
    _sig("floor", "numeric", _T.INT, doc="largest int <= x; null outside the int range"),
    _sig("ceil", "numeric", _T.INT, doc="smallest int >= x; null outside the int range"),
    _sig("sqrt", "numeric", _T.DOUBLE, doc="square root; NaN for negative x"),
    _sig("ln", "numeric", _T.DOUBLE, doc="natural logarithm; null for x <= 0"),
    _sig("exp", "numeric", _T.DOUBLE, doc="e to the power x"),
    _sig("pow", "numeric numeric", _T.DOUBLE, doc="x to the power y (Java Math.pow rules)"),
    _sig("least", "orderable orderable", "common", variadic=True,
         doc="smallest non-null argument"),
    _sig("greatest", "orderable orderable", "common", variadic=True,
         doc="largest non-null argument"),
    _sig("lower", "string", _T.STRING, doc="lower case"),
    _sig("upper", "string", _T.STRING, doc="upper case"),
    _sig("length", "string", _T.INT, doc="number of characters (code points)"),
    _sig("concat", "string", _T.STRING, variadic=True, doc="joins strings; null if any is"),
    _sig("substring", "string int int", _T.STRING,
         doc="`len` characters from 1-based `start` (negative counts from the end)"),
    _sig("starts_with", "string string", _T.BOOLEAN, doc="s begins with prefix"),
    _sig("ends_with", "string string", _T.BOOLEAN, doc="s ends with suffix"),
    _sig("contains", "string string", _T.BOOLEAN, doc="s contains part"),
    _sig("replace", "string string string", _T.STRING,
         doc="every occurrence of `search` replaced (plain text; an empty search changes nothing)"),
    _sig("split_part", "string string int", _T.STRING,
         doc="the n-th part (1-based; negative counts from the end) of s split at a plain-text "
             "delimiter; '' past the last part; null for n = 0"),
    _sig("regexp_like", "string pattern", _T.BOOLEAN,
         doc="the pattern matches somewhere in s (docs/expressions.md, regular expressions)"),
    _sig("regexp_extract", "string pattern group", _T.STRING,
         doc="group `n` (0: the whole match) of the first match; null when nothing matches, "
             "'' when the group took no part"),
    _sig("coalesce", "any", "common", variadic=True, doc="first non-null argument"),
    _sig("year", "timestamp", _T.INT, doc="UTC year"),
    _sig("month", "timestamp", _T.INT, doc="UTC month 1-12"),
    _sig("day", "timestamp", _T.INT, doc="UTC day of month 1-31"),
    _sig("hour", "timestamp", _T.INT, doc="UTC hour 0-23"),
    _sig("minute", "timestamp", _T.INT, doc="minute 0-59"),
    _sig("second", "timestamp", _T.INT, doc="whole seconds 0-59"),
    _sig("unix_seconds", "timestamp", _T.INT, doc="whole seconds since 1970-01-01Z (floor)"),
    _sig("to_int", "scalar", _T.INT, doc="convert; null when not representable"),
    _sig("to_double", "scalar", _T.DOUBLE, doc="convert; null when not a number"),
    _sig("to_string", "value", _T.STRING, doc="text form of any value"),
)}
ROUND_DIGITS = (-20, 20)


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def closest(name: str, candidates: "list[str] | tuple[str, ...]") -> str | None:
    """The candidate nearest to `name` by edit distance, if near enough to be a likely typo."""
    best = min(candidates, key=lambda c: (_edit_distance(name.lower(), c.lower()), c),
               default=None)
    if best is None:
        return None
    return best if _edit_distance(name.lower(), best.lower()) <= max(1, len(name) // 3) else None


def did_you_mean(name: str, candidates: "list[str] | tuple[str, ...]") -> str:
    best = closest(name, candidates)
    return f"did you mean '{best}'?" if best else ""
