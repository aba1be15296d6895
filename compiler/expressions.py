"""The closed expression language of dataflow specs (filter conditions, computed columns,
splitter predicates).

Owns, for expression text written in XML attributes: the tokenizer, the precedence-climbing
parser to an AST of frozen dataclasses, the type checker against the input streams' schemas,
canonical rendering, JSON (de)serialisation of the AST, the pure-Python evaluator (plumbing tasks
and control tuples evaluate predicates without Spark) and the lowering to PySpark `Column`
objects. Every semantic rule (nulls, overflow, division by zero, NaN ordering, rounding, casts)
is defined once in docs/expressions.md and implemented identically by `evaluate` and
`to_column`.

User text is never code: nothing here calls eval/exec, `F.expr`, `spark.sql` or `selectExpr`;
function names resolve only through the closed `FUNCTIONS` table. pyspark is imported lazily,
inside `to_column` only.

Does not own: column types and schemas (`common.types`), mapping offsets to file positions
(`compiler.validate` does that with `ParamDecl.value_pos`), or aliasing input DataFrames with
their stream names (the runtime does `df.alias(stream)`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal as Lit, Mapping, Union

from common.types import ColumnType, Schema

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import Column

MAX_TEXT_LENGTH = 4096
MAX_DEPTH = 64
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
KEYWORDS = frozenset({"and", "or", "not", "true", "false", "in", "between", "is", "null"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MICRO = timedelta(microseconds=1)

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


class _Abort(Exception):
    """Internal: a syntax error after which parsing cannot continue."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem


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


Expr = Union[Literal, ColumnRef, Unary, Binary, Between, InList, IsNull, Call]
Row = Mapping[str, Mapping[str, object]]

LOGICAL_OPS = ("or", "and")
COMPARISON_OPS = ("=", "!=", "<", "<=", ">", ">=")
ARITHMETIC_OPS = ("+", "-", "*", "/", "%")
BINARY_OPS = LOGICAL_OPS + COMPARISON_OPS + ARITHMETIC_OPS
_OP_ALIASES = {"==": "=", "<>": "!="}


@dataclass(frozen=True)
class TypedExpr:
    """A parsed, type-checked expression with its result type and the text it came from."""

    expr: Expr
    type: ColumnType
    text: str


@dataclass(frozen=True)
class Scope:
    """The names an expression may use: input stream name -> its schema. An unqualified column
    name resolves when exactly one stream has it."""

    streams: Mapping[str, Schema]


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
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of the tree, pre-order, without recursion."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def _too_deep(expr: Expr) -> Problem | None:
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


def _guard_depth(expr: Expr) -> None:
    problem = _too_deep(expr)
    if problem is not None:
        raise ExpressionError([problem])


# =============================================================================== functions ==
# Parameter classes: numeric (int|double), int, int_literal, string, timestamp,
# orderable (numeric|string|timestamp, one common type), any (one common type),
# scalar (int|double|string|boolean), value (any single type).
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


def _did_you_mean(name: str, candidates: "list[str] | tuple[str, ...]") -> str:
    best = closest(name, candidates)
    return f"did you mean '{best}'?" if best else ""


# =============================================================================== tokenizer ==


@dataclass(frozen=True)
class Token:
    """One lexical unit. kind: number, string, name, keyword, op, (, ), ",", ".", end."""

    kind: str
    text: str
    offset: int
    length: int
    value: Any = None

    def describe(self) -> str:
        if self.kind == "end":
            return "end of expression"
        if self.kind == "string":
            return f"the string {self.text}"
        if self.kind == "number":
            return f"the number {self.text}"
        if self.kind == "name":
            return f"the name '{self.text}'"
        if self.kind == "keyword":
            return f"the keyword '{self.text.lower()}'"
        return f"'{self.text}'"


_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TWO_CHAR_OPS = ("==", "!=", "<>", "<=", ">=")
_ONE_CHAR = {"=": "op", "<": "op", ">": "op", "+": "op", "-": "op", "*": "op", "/": "op",
             "%": "op", "(": "(", ")": ")", ",": ",", ".": "."}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t"}
_STRAY_HINTS = {
    "|": "strings are joined with concat(a, b); 'or' is the logical or",
    "&": "write 'and'",
    "!": "write 'not x' or 'a != b'",
    "`": "names are not quoted: write the column name as it is; text goes in '...'",
    "$": "there are no variables or substitutions in expressions",
    ";": "an expression is a single value; ';' has no meaning here",
    "[": "there are no arrays or indexing",
    "]": "there are no arrays or indexing",
    "{": "there are no blocks or substitutions",
    "}": "there are no blocks or substitutions",
    "#": "there are no comments in expressions",
    "\\": "backslash escapes are only allowed inside quoted strings",
}
_SPACE = " \t\r\n"


def tokenize(text: str) -> tuple[list[Token], list[Problem]]:
    """Split text into tokens; collects every lexical problem instead of stopping at the first."""
    tokens: list[Token] = []
    problems: list[Problem] = []
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if ch in _SPACE:
            pos += 1
            continue
        token, pos = _scan_one(text, pos, problems)
        if token is not None:
            tokens.append(token)
    tokens.append(Token("end", "", len(text), 0))
    return tokens, problems


def _scan_one(text: str, pos: int, problems: list[Problem]) -> tuple[Token | None, int]:
    ch = text[pos]
    if "0" <= ch <= "9":
        return _scan_number(text, pos, problems)
    if ch in "'\"":
        return _scan_string(text, pos, problems)
    m = _NAME.match(text, pos)
    if m:
        word = m.group()
        kind = "keyword" if word.lower() in KEYWORDS else "name"
        return Token(kind, word, pos, len(word)), m.end()
    two = text[pos:pos + 2]
    if two == "--":
        problems.append(Problem(pos, len(text) - pos, "'--' is not a comment: expressions have "
                                                      "no comments",
                                "remove it; write - -x (with a space) for a double negation"))
        return None, len(text)
    if two in _TWO_CHAR_OPS:
        return Token("op", two, pos, 2), pos + 2
    if ch in _ONE_CHAR:
        return Token(_ONE_CHAR[ch], ch, pos, 1), pos + 1
    problem = _stray_character(text, pos)
    problems.append(problem)
    return None, pos + problem.length


def _stray_character(text: str, pos: int) -> Problem:
    ch = text[pos]
    if ch == "|" and text[pos:pos + 2] == "||":
        return Problem(pos, 2, "'||' is not an operator of this language", _STRAY_HINTS["|"])
    if ord(ch) < 128 and ch.isprintable():
        return Problem(pos, 1, f"unexpected character '{ch}'",
                       _STRAY_HINTS.get(ch, "see docs/expressions.md for the grammar"))
    name = unicodedata.name(ch, "unnamed character")
    return Problem(pos, 1, f"unexpected character {ch!r} (U+{ord(ch):04X} {name})",
                   "names use ASCII letters, digits and '_' only; other text goes in quotes")


def _scan_number(text: str, pos: int, problems: list[Problem]) -> tuple[Token | None, int]:
    m = _NUMBER.match(text, pos)
    assert m is not None
    raw, end = m.group(), m.end()
    if end < len(text) and (text[end] == "." or text[end].isalnum() or text[end] == "_"):
        problems.append(Problem(pos, end + 1 - pos,
                                f"malformed number '{text[pos:end + 1]}'",
                                "numbers look like 42, 1.5 or 2e3"))
        while end < len(text) and (text[end].isalnum() or text[end] in "._"):
            end += 1
        return None, end
    is_double = m.group(1) is not None or m.group(2) is not None
    value: int | float = float(raw) if is_double else int(raw)
    if is_double and math.isinf(value):
        problems.append(Problem(pos, len(raw), f"number {raw} is too large for a double", ""))
        return None, end
    return Token("number", raw, pos, len(raw), value), end


def _scan_string(text: str, pos: int, problems: list[Problem]) -> tuple[Token | None, int]:
    quote, chars, i = text[pos], [], pos + 1
    while i < len(text):
        ch = text[i]
        if ch == quote:
            return Token("string", text[pos:i + 1], pos, i + 1 - pos, "".join(chars)), i + 1
        if ch == "\\":
            nxt = text[i + 1:i + 2]
            if nxt in _ESCAPES:
                chars.append(_ESCAPES[nxt])
            else:
                problems.append(Problem(i, 1 + len(nxt), f"unknown escape '\\{nxt}' in a string",
                                        "known escapes: \\\\ \\' \\\" \\n \\t"))
            i += 2
            continue
        chars.append(ch)
        i += 1
    problems.append(Problem(pos, len(text) - pos, f"unterminated string: no closing {quote}",
                            f"close the string with {quote}; write \\{quote} for a quote inside"))
    return None, len(text)


# ================================================================================== parser ==
# Precedence, loosest first: or(1) < and(2) < not(3) < comparisons, between, in, is(4)
# < + -(5) < * / %(6) < unary -(7). Comparisons do not chain.

_BINARY_LEVEL = {"or": 1, "and": 2, **{op: 4 for op in ("=", "==", "!=", "<>", "<", "<=", ">",
                                                        ">=")},
                 "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_COMPARISON_LEVEL = 4
_UNARY_LEVEL = 7


def parse(text: str) -> Expr:
    """Parse expression text to an AST; raises ExpressionError with every problem found."""
    if not isinstance(text, str):
        raise ExpressionError([Problem(0, 0, f"expected expression text, got {type(text).__name__}")])
    if len(text) > MAX_TEXT_LENGTH:
        raise ExpressionError([Problem(
            MAX_TEXT_LENGTH, len(text) - MAX_TEXT_LENGTH,
            f"expression is {len(text)} characters long; the limit is {MAX_TEXT_LENGTH}",
            "split it over several operators")])
    tokens, problems = tokenize(text)
    if problems:
        raise ExpressionError(problems)
    return _Parser(tokens).run()


class _Parser:
    """Recursive descent with precedence climbing over a token list."""

    def __init__(self, tokens: list[Token]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.problems: list[Problem] = []

    # -- driver ---------------------------------------------------------------------------------

    def run(self) -> Expr:
        try:
            if self.peek().kind == "end":
                self.fail("an expression", at_start=True)
            expr = self.expression(0)
            self.expect_end()
        except _Abort as abort:
            self.problems.append(abort.problem)
            raise ExpressionError(self.problems) from None
        deep = _too_deep(expr)
        if deep is not None:
            self.problems.append(deep)
        if self.problems:
            raise ExpressionError(self.problems)
        return expr

    def expect_end(self) -> None:
        tok = self.peek()
        if tok.kind == "end":
            return
        if tok.kind == ")":
            raise _Abort(Problem(tok.offset, 1, "found ')' without a matching '('",
                                 "remove it or add the missing '('"))
        self.fail("an operator or end of expression")

    # -- token helpers --------------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.peek()
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return tok

    def is_keyword(self, word: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.kind == "keyword" and tok.text.lower() == word

    def fail(self, expected: str, hint: str = "", at_start: bool = False) -> None:
        tok = self.peek()
        where = "" if at_start or self.pos == 0 else f" after '{self.tokens[self.pos - 1].text}'"
        raise _Abort(Problem(tok.offset, tok.length,
                             f"expected {expected}{where} but found {tok.describe()}", hint))

    def expect_keyword(self, word: str, what: str) -> Token:
        if not self.is_keyword(word):
            self.fail(what)
        return self.advance()

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            tok = self.peek()
            raise _Abort(Problem(tok.offset, tok.length,
                                 f"expression nests more than {MAX_DEPTH} levels deep",
                                 "remove redundant parentheses or simplify the expression"))

    # -- grammar --------------------------------------------------------------------------------

    def expression(self, min_level: int) -> Expr:
        self.enter()
        try:
            left = self.prefix(min_level)
            while True:
                level = self.binary_level()
                if level is None or level < min_level:
                    return left
                if level == _COMPARISON_LEVEL:
                    left = self.comparison_tail(left)
                    if self.binary_level() == _COMPARISON_LEVEL:
                        self.fail("'and' or 'or' between comparisons",
                                  "comparisons do not chain: write a < b and b < c")
                else:
                    op = self.advance()
                    right = self.expression(level + 1)
                    left = _span(Binary(op.text.lower(), left, right), left, right)
        finally:
            self.depth -= 1

    def binary_level(self) -> int | None:
        tok = self.peek()
        if tok.kind == "op" or (tok.kind == "keyword" and tok.text.lower() in ("and", "or")):
            return _BINARY_LEVEL.get(tok.text.lower())
        if tok.kind == "keyword" and tok.text.lower() in ("between", "in", "is"):
            return _COMPARISON_LEVEL
        if self.is_keyword("not") and (self.is_keyword("between", 1) or self.is_keyword("in", 1)):
            return _COMPARISON_LEVEL
        return None

    def prefix(self, min_level: int) -> Expr:
        if not self.is_keyword("not"):
            return self.unary()
        if min_level > 3:
            self.fail("a value", "put the 'not ...' part in parentheses")
        tok = self.advance()
        operand = self.expression(3)
        return _span(Unary("not", operand), tok, operand)

    def comparison_tail(self, left: Expr) -> Expr:
        negated = self.is_keyword("not")
        if negated:
            self.advance()
        tok = self.advance()
        word = tok.text.lower()
        if word == "between":
            low = self.expression(5)
            self.expect_keyword("and", "'and' between the bounds of 'between'")
            high = self.expression(5)
            return _span(Between(left, low, high, negated), left, high)
        if word == "in":
            items, close = self.in_items()
            return _span(InList(left, items, negated), left, close)
        if word == "is":
            is_not = self.is_keyword("not")
            if is_not:
                self.advance()
            end = self.expect_keyword("null", "'null' or 'not null' after 'is'")
            return _span(IsNull(left, is_not), left, end)
        right = self.expression(5)
        return _span(Binary(_OP_ALIASES.get(tok.text, tok.text), left, right), left, right)

    def in_items(self) -> tuple[tuple[Expr, ...], Token]:
        if self.peek().kind != "(":
            self.fail("'(' after 'in'", "write x in (1, 2, 3)")
        self.advance()
        items = [self.expression(0)]
        while self.peek().kind == ",":
            self.advance()
            items.append(self.expression(0))
        if self.peek().kind != ")":
            self.fail("',' or ')' in the 'in' list")
        return tuple(items), self.advance()

    def unary(self) -> Expr:
        tok = self.peek()
        if not (tok.kind == "op" and tok.text == "-"):
            return self.primary()
        self.advance()
        if self.peek().kind == "number":
            return self.number(self.advance(), negative_from=tok)
        self.enter()
        try:
            operand = self.unary()
        finally:
            self.depth -= 1
        return _span(Unary("-", operand), tok, operand)

    def primary(self) -> Expr:
        tok = self.peek()
        if tok.kind == "number":
            return self.number(self.advance())
        if tok.kind == "string":
            self.advance()
            return Literal(tok.value, ColumnType.STRING, tok.offset, tok.length)
        if tok.kind == "keyword":
            return self.keyword_value()
        if tok.kind == "name":
            return self.name()
        if tok.kind == "(":
            return self.parenthesised()
        self.fail("a value")
        raise AssertionError("unreachable")

    def parenthesised(self) -> Expr:
        open_tok = self.advance()
        inner = self.expression(0)
        if self.peek().kind != ")":
            self.fail(f"')' to close the '(' at offset {open_tok.offset}")
        self.advance()
        return inner

    def keyword_value(self) -> Expr:
        tok = self.peek()
        word = tok.text.lower()
        if word in ("true", "false"):
            self.advance()
            return Literal(word == "true", ColumnType.BOOLEAN, tok.offset, tok.length)
        if word == "null":
            self.advance()
            self.problems.append(Problem(
                tok.offset, tok.length, "'null' may only appear in 'x is null' or 'x is not null'",
                "use coalesce(x, default) to replace nulls"))
            return Literal(False, ColumnType.BOOLEAN, tok.offset, tok.length)
        self.fail("a value")
        raise AssertionError("unreachable")

    def number(self, tok: Token, negative_from: Token | None = None) -> Literal:
        value = -tok.value if negative_from is not None else tok.value
        start = negative_from.offset if negative_from is not None else tok.offset
        length = tok.offset + tok.length - start
        if isinstance(value, float):
            return Literal(value, ColumnType.DOUBLE, start, length)
        if not INT_MIN <= value <= INT_MAX:
            self.problems.append(Problem(
                start, length, f"integer {value} is outside the int range "
                               f"({INT_MIN} .. {INT_MAX})", f"write {value}.0 for a double"))
            value = 0
        return Literal(value, ColumnType.INT, start, length)

    def name(self) -> Expr:
        tok = self.advance()
        nxt = self.peek()
        if tok.text.lower() == "timestamp" and nxt.kind == "string":
            self.advance()
            return self.timestamp_literal(tok, nxt)
        if nxt.kind == "(":
            return self.call(tok)
        if nxt.kind == ".":
            self.advance()
            col = self.peek()
            if col.kind not in ("name", "keyword"):
                self.fail(f"a column name after '{tok.text}.'")
            self.advance()
            return _span(ColumnRef(tok.text, col.text), tok, col)
        return ColumnRef(None, tok.text, tok.offset, tok.length)

    def timestamp_literal(self, kw: Token, tok: Token) -> Literal:
        try:
            value = parse_timestamp(tok.value)
        except ValueError as exc:
            self.problems.append(Problem(tok.offset, tok.length, f"invalid timestamp: {exc}",
                                         "write timestamp '2024-01-01T00:00:00Z'"))
            value = _EPOCH
        return _span(Literal(value, ColumnType.TIMESTAMP), kw, tok)

    def call(self, name_tok: Token) -> Expr:
        name = name_tok.text.lower()
        if name not in FUNCTIONS:
            hint = _did_you_mean(name, list(FUNCTIONS))
            self.problems.append(Problem(
                name_tok.offset, name_tok.length,
                f"unknown function '{name_tok.text}' (functions: {', '.join(sorted(FUNCTIONS))})",
                hint))
        self.advance()  # (
        args: list[Expr] = []
        if self.peek().kind != ")":
            args.append(self.expression(0))
            while self.peek().kind == ",":
                self.advance()
                args.append(self.expression(0))
        if self.peek().kind != ")":
            self.fail(f"',' or ')' in the arguments of {name_tok.text}")
        close = self.advance()
        return _span(Call(name, tuple(args)), name_tok, close)


def _span(node: Any, first: Any, last: Any) -> Any:
    """`node` located from the start of `first` to the end of `last` (tokens or nodes)."""
    end = last.offset + last.length
    return type(node)(**{**_fields(node), "offset": first.offset, "length": end - first.offset})


def _fields(node: Any) -> dict[str, Any]:
    return {name: getattr(node, name) for name in node.__dataclass_fields__}


_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?)?"
    r"(Z|[+-]\d{2}:\d{2})?\Z")


def parse_timestamp(text: str) -> datetime:
    """`YYYY-MM-DD[THH:MM[:SS[.ffffff]]][Z|+HH:MM]` (no zone means UTC) -> aware UTC datetime."""
    m = _TIMESTAMP.match(text)
    if not m:
        raise ValueError(f"'{text}' is not of the form YYYY-MM-DDTHH:MM:SS[.ffffff][Z|+HH:MM]")
    year, month, day, hour, minute, second, frac, zone = m.groups()
    micros = int((frac or "0").ljust(6, "0"))
    tz = timezone.utc
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    value = datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0),
                     int(second or 0), micros, tzinfo=tz)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-05:00 is in year 10000 in UTC
        raise ValueError(f"'{text}' is outside the range of timestamps, 0001-01-01 to "
                         "9999-12-31 in UTC") from None


# ================================================================================= checker ==


def check(expr: Expr, scope: Scope) -> ColumnType:
    """The result type of `expr` in `scope`; raises ExpressionError with every problem found."""
    return _Checker(scope).run(expr)


def compile_expression(text: str, scope: Scope) -> TypedExpr:
    """Parse and type-check `text`."""
    expr = parse(text)
    return TypedExpr(expr, check(expr, scope), text)


def compile_condition(text: str, scope: Scope) -> TypedExpr:
    """Like compile_expression, and the result must be boolean (filters, splitter predicates)."""
    typed = compile_expression(text, scope)
    if typed.type is not ColumnType.BOOLEAN:
        raise ExpressionError([Problem(0, len(text), f"a condition must be boolean but this "
                                                     f"expression is {typed.type.value}",
                                       "write a comparison such as raw.temp > 30")])
    return typed


class _Checker:
    """Computes the type of every node and where each column reference resolves; collects all
    problems (a node whose children failed reports nothing more, so errors do not cascade)."""

    def __init__(self, scope: Scope):
        self.scope = scope
        self.problems: list[Problem] = []
        self.types: dict[int, ColumnType] = {}
        self.streams: dict[int, str] = {}  # id(ColumnRef) -> the stream it resolves to

    def run(self, expr: Expr) -> ColumnType:
        _guard_depth(expr)
        result = self.type_of(expr)
        if self.problems or result is None:
            raise ExpressionError(self.problems or [Problem(0, 0, "expression has no type")])
        return result

    def problem(self, node: Expr, message: str, hint: str = "") -> None:
        self.problems.append(Problem(node.offset, node.length, message, hint))

    def type_of(self, node: Expr) -> ColumnType | None:
        method = getattr(self, f"check_{type(node).__name__.lower()}", None)
        if method is None:
            self.problems.append(Problem(0, 0, f"not an expression node: {type(node).__name__}"))
            return None
        result = method(node)
        if result is not None:
            self.types[id(node)] = result
        return result

    # -- leaves ---------------------------------------------------------------------------------

    def check_literal(self, node: Literal) -> ColumnType | None:
        problem = _literal_problem(node.value, node.type)
        if problem:
            self.problem(node, problem)
            return None
        return node.type

    def check_columnref(self, node: ColumnRef) -> ColumnType | None:
        if node.stream is not None:
            return self.qualified(node)
        owners = [s for s, schema in self.scope.streams.items() if schema.get(node.name)]
        if len(owners) == 1:
            self.streams[id(node)] = owners[0]
            return self.scope.streams[owners[0]].get(node.name).type  # type: ignore[union-attr]
        if owners:
            quoted = " and ".join(f"'{s}'" for s in owners)
            self.problem(node, f"column '{node.name}' is ambiguous: streams {quoted} all have it",
                         "qualify it: " + " or ".join(f"{s}.{node.name}" for s in owners))
        else:
            self.unknown_column(node)
        return None

    def qualified(self, node: ColumnRef) -> ColumnType | None:
        schema = self.scope.streams.get(node.stream)  # type: ignore[arg-type]
        if schema is None:
            names = sorted(self.scope.streams)
            self.problem(node, f"unknown stream '{node.stream}' (streams: {', '.join(names)})",
                         _did_you_mean(node.stream or "", names))
            return None
        found = schema.get(node.name)
        if found is None:
            self.problem(node, f"unknown column '{node.name}' in stream '{node.stream}' "
                               f"(columns: {', '.join(schema.names)})",
                         _did_you_mean(node.name, schema.names))
            return None
        self.streams[id(node)] = node.stream  # type: ignore[assignment]
        return found.type

    def unknown_column(self, node: ColumnRef) -> None:
        streams = self.scope.streams
        if len(streams) == 1:
            (name, schema), = streams.items()
            self.problem(node, f"unknown column '{node.name}' in stream '{name}' "
                               f"(columns: {', '.join(schema.names)})",
                         _did_you_mean(node.name, schema.names))
            return
        listing = "; ".join(f"{s}: {', '.join(sc.names)}" for s, sc in streams.items())
        every = [n for sc in streams.values() for n in sc.names]
        self.problem(node, f"unknown column '{node.name}' (streams: {listing or 'none'})",
                     _did_you_mean(node.name, every))

    # -- operators ------------------------------------------------------------------------------

    def check_unary(self, node: Unary) -> ColumnType | None:
        t = self.type_of(node.operand)
        if t is None:
            return None
        if node.op == "not":
            return self.need_boolean(node.operand, t, "'not'")
        if node.op == "-" and t.is_numeric:
            return t
        self.problem(node, f"unary '-' needs a number but found {t.value}")
        return None

    def need_boolean(self, node: Expr, t: ColumnType, what: str) -> ColumnType | None:
        if t is ColumnType.BOOLEAN:
            return t
        self.problem(node, f"{what} needs a boolean operand but found {t.value}",
                     "compare it, e.g. x > 0")
        return None

    def check_binary(self, node: Binary) -> ColumnType | None:
        lt, rt = self.type_of(node.left), self.type_of(node.right)
        if lt is None or rt is None:
            return None
        if node.op in LOGICAL_OPS:
            ok_l = self.need_boolean(node.left, lt, f"'{node.op}'")
            ok_r = self.need_boolean(node.right, rt, f"'{node.op}'")
            return ColumnType.BOOLEAN if ok_l and ok_r else None
        if node.op in COMPARISON_OPS:
            return ColumnType.BOOLEAN if self.comparable(node, lt, rt, node.op) else None
        if node.op in ARITHMETIC_OPS:
            return self.arithmetic(node, lt, rt)
        self.problem(node, f"unknown operator '{node.op}'")
        return None

    def comparable(self, node: Expr, lt: ColumnType, rt: ColumnType, op: str) -> bool:
        if not (lt is rt or (lt.is_numeric and rt.is_numeric)):
            self.problem(node, f"cannot compare {lt.value} with {rt.value} using '{op}'",
                         "convert one side with to_int, to_double or to_string")
            return False
        if op not in ("=", "!=") and not lt.is_orderable:
            self.problem(node, f"'{op}' cannot order {lt.value} values",
                         "booleans support only = and !=")
            return False
        return True

    def arithmetic(self, node: Binary, lt: ColumnType, rt: ColumnType) -> ColumnType | None:
        if lt.is_numeric and rt.is_numeric:
            if node.op == "/" or ColumnType.DOUBLE in (lt, rt):
                return ColumnType.DOUBLE
            return ColumnType.INT
        hint = ""
        if node.op == "+" and ColumnType.STRING in (lt, rt):
            hint = "join strings with concat(a, b)"
        elif ColumnType.TIMESTAMP in (lt, rt):
            hint = "compute with unix_seconds(ts)"
        self.problem(node, f"'{node.op}' needs numbers but found {lt.value} and {rt.value}", hint)
        return None

    def check_between(self, node: Between) -> ColumnType | None:
        t, lo, hi = (self.type_of(n) for n in (node.operand, node.low, node.high))
        if t is None or lo is None or hi is None:
            return None
        ok = self.comparable(node.low, t, lo, "between")
        ok = self.comparable(node.high, t, hi, "between") and ok
        return ColumnType.BOOLEAN if ok else None

    def check_inlist(self, node: InList) -> ColumnType | None:
        t = self.type_of(node.operand)
        item_types = [self.type_of(item) for item in node.items]
        if not node.items:
            self.problem(node, "'in' needs at least one value")
            return None
        if t is None or any(it is None for it in item_types):
            return None
        ok = True
        for item, it in zip(node.items, item_types):
            ok = self.comparable(item, t, it, "in") and ok  # type: ignore[arg-type]
        return ColumnType.BOOLEAN if ok else None

    def check_isnull(self, node: IsNull) -> ColumnType | None:
        return None if self.type_of(node.operand) is None else ColumnType.BOOLEAN

    # -- functions ------------------------------------------------------------------------------

    def check_call(self, node: Call) -> ColumnType | None:
        arg_types = [self.type_of(a) for a in node.args]
        sig = FUNCTIONS.get(node.function)
        if sig is None:
            self.problem(node, f"unknown function '{node.function}' "
                               f"(functions: {', '.join(sorted(FUNCTIONS))})",
                         _did_you_mean(node.function, list(FUNCTIONS)))
            return None
        if not self.arity_ok(node, sig):
            return None
        if any(t is None for t in arg_types):
            return None
        return self.call_type(node, sig, arg_types)  # type: ignore[arg-type]

    def arity_ok(self, node: Call, sig: FunctionSig) -> bool:
        n = len(node.args)
        if sig.min_args <= n and (sig.max_args is None or n <= sig.max_args):
            return True
        if sig.max_args is None:
            wanted = f"at least {sig.min_args}"
        elif sig.min_args == sig.max_args:
            wanted = str(sig.min_args)
        else:
            wanted = f"{sig.min_args} to {sig.max_args}"
        plural = "" if wanted == "1" else "s"
        self.problem(node, f"{sig.name} takes {wanted} argument{plural} but got {n}",
                     sig.describe())
        return False

    def call_type(self, node: Call, sig: FunctionSig,
                  arg_types: list[ColumnType]) -> ColumnType | None:
        ok = True
        for i, (arg, t) in enumerate(zip(node.args, arg_types)):
            param = sig.params[min(i, len(sig.params) - 1)]
            message = _param_problem(param, arg, t)
            if message:
                self.problem(arg, f"argument {i + 1} of {sig.name}: {message}", sig.describe())
                ok = False
        if not ok:
            return None
        if sig.result == "arg":
            return arg_types[0]
        if sig.result == "common":
            common = common_type(arg_types)
            if common is None:
                found = ", ".join(t.value for t in arg_types)
                self.problem(node, f"{sig.name} needs arguments of one type but found {found}",
                             "convert them with to_int, to_double or to_string")
            return common
        return sig.result  # type: ignore[return-value]


def common_type(types: "list[ColumnType]") -> ColumnType | None:
    """One type all of `types` convert to: int and double mix to double; otherwise equal."""
    if all(t.is_numeric for t in types):
        return ColumnType.DOUBLE if ColumnType.DOUBLE in types else ColumnType.INT
    return types[0] if all(t is types[0] for t in types) else None


_PARAM_CLASSES: dict[str, tuple[ColumnType, ...]] = {
    "numeric": (_T.INT, _T.DOUBLE),
    "int": (_T.INT,),
    "int_literal": (_T.INT,),
    "string": (_T.STRING,),
    "timestamp": (_T.TIMESTAMP,),
    "orderable": (_T.INT, _T.DOUBLE, _T.STRING, _T.TIMESTAMP),
    "any": tuple(_T),
    "value": tuple(_T),
    "scalar": (_T.INT, _T.DOUBLE, _T.STRING, _T.BOOLEAN),
}


def _param_problem(param: str, arg: Expr, t: ColumnType) -> str:
    allowed = _PARAM_CLASSES[param]
    if t not in allowed:
        names = " or ".join(a.value for a in allowed)
        return f"expected {names} but found {t.value}"
    if param == "int_literal":
        lo, hi = ROUND_DIGITS
        if not (isinstance(arg, Literal) and lo <= arg.value <= hi):
            return f"the number of digits must be a whole number from {lo} to {hi} written out"
    return ""


def _literal_problem(value: Any, t: ColumnType) -> str:
    """Why `value` is not a valid literal of type `t` ('' if it is)."""
    ok = {
        ColumnType.INT: type(value) is int and INT_MIN <= value <= INT_MAX,
        ColumnType.DOUBLE: type(value) is float and math.isfinite(value),
        ColumnType.STRING: type(value) is str,
        ColumnType.BOOLEAN: type(value) is bool,
        ColumnType.TIMESTAMP: isinstance(value, datetime) and value.tzinfo is not None,
    }.get(t, False)
    return "" if ok else f"invalid {getattr(t, 'value', t)} literal {value!r}"


# ================================================================================== render ==

_LEVEL_OF_OP = {"or": 1, "and": 2, **{op: 4 for op in COMPARISON_OPS},
                "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}


def render(expr: Expr) -> str:
    """Canonical text of `expr`: lower-case keywords, minimal parentheses, `=` and `!=`.
    parse(render(e)) == e."""
    _guard_depth(expr)
    return _render(expr)


def _level(node: Expr) -> int:
    if isinstance(node, Binary):
        return _LEVEL_OF_OP[node.op]
    if isinstance(node, Unary):
        return 3 if node.op == "not" else _UNARY_LEVEL
    if isinstance(node, (Between, InList, IsNull)):
        return _COMPARISON_LEVEL
    return 8


def _child(node: Expr, min_level: int) -> str:
    text = _render(node)
    return f"({text})" if _level(node) < min_level else text


def _render(node: Expr) -> str:
    if isinstance(node, Literal):
        return render_literal(node)
    if isinstance(node, ColumnRef):
        return f"{node.stream}.{node.name}" if node.stream else node.name
    if isinstance(node, Unary):
        return _render_unary(node)
    if isinstance(node, Binary):
        level = _LEVEL_OF_OP[node.op]
        left_min = level + 1 if level == _COMPARISON_LEVEL else level
        return f"{_child(node.left, left_min)} {node.op} {_child(node.right, level + 1)}"
    neg = "not " if getattr(node, "negated", False) else ""
    if isinstance(node, Between):
        return (f"{_child(node.operand, 5)} {neg}between {_child(node.low, 5)} "
                f"and {_child(node.high, 5)}")
    if isinstance(node, InList):
        items = ", ".join(_render(i) for i in node.items)
        return f"{_child(node.operand, 5)} {neg}in ({items})"
    if isinstance(node, IsNull):
        return f"{_child(node.operand, 5)} is {neg}null"
    if isinstance(node, Call):
        return f"{node.function}({', '.join(_render(a) for a in node.args)})"
    raise ExpressionError([Problem(0, 0, f"not an expression node: {type(node).__name__}")])


def _render_unary(node: Unary) -> str:
    if node.op == "not":
        return f"not {_child(node.operand, 3)}"
    operand = node.operand
    numeric_literal = isinstance(operand, Literal) and operand.type.is_numeric
    if numeric_literal or (isinstance(operand, Unary) and operand.op == "-"):
        return f"-({_render(operand)})"
    return f"-{_child(operand, _UNARY_LEVEL)}"


def render_literal(node: Literal) -> str:
    """The canonical text of a literal."""
    value = node.value
    if node.type is ColumnType.BOOLEAN:
        return "true" if value else "false"
    if node.type is ColumnType.INT:
        return str(value)
    if node.type is ColumnType.DOUBLE:
        return repr(float(value))
    if node.type is ColumnType.STRING:
        return quote_string(value)
    return f"timestamp '{format_timestamp_iso(value)}'"


def quote_string(value: str) -> str:
    escaped = (value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
               .replace("\t", "\\t"))
    return f"'{escaped}'"


def format_timestamp_iso(value: datetime) -> str:
    v = value.astimezone(timezone.utc)
    text = (f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:"
            f"{v.second:02d}")
    return text + (f".{v.microsecond:06d}" if v.microsecond else "") + "Z"


# ==================================================================================== JSON ==


def to_json(expr: Expr) -> dict[str, Any]:
    """The AST as plain JSON-compatible data (no source offsets)."""
    _guard_depth(expr)
    return _to_json(expr)


def _to_json(node: Expr) -> dict[str, Any]:
    if isinstance(node, Literal):
        value = (format_timestamp_iso(node.value) if node.type is ColumnType.TIMESTAMP
                 else node.value)
        return {"kind": "literal", "type": node.type.value, "value": value}
    if isinstance(node, ColumnRef):
        return {"kind": "column", "stream": node.stream, "name": node.name}
    if isinstance(node, Unary):
        return {"kind": "unary", "op": node.op, "operand": _to_json(node.operand)}
    if isinstance(node, Binary):
        return {"kind": "binary", "op": node.op, "left": _to_json(node.left),
                "right": _to_json(node.right)}
    if isinstance(node, Between):
        return {"kind": "between", "negated": node.negated, "operand": _to_json(node.operand),
                "low": _to_json(node.low), "high": _to_json(node.high)}
    if isinstance(node, InList):
        return {"kind": "in", "negated": node.negated, "operand": _to_json(node.operand),
                "items": [_to_json(i) for i in node.items]}
    if isinstance(node, IsNull):
        return {"kind": "is_null", "negated": node.negated, "operand": _to_json(node.operand)}
    if isinstance(node, Call):
        return {"kind": "call", "function": node.function,
                "args": [_to_json(a) for a in node.args]}
    raise ExpressionError([Problem(0, 0, f"not an expression node: {type(node).__name__}")])


def from_json(data: dict[str, Any]) -> Expr:
    """Rebuild an AST from `to_json` output, validating everything (closed node kinds,
    operators, function names, literal values, identifiers, depth)."""
    try:
        return _from_json(data, "$", 1)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExpressionError([Problem(0, 0, f"invalid expression JSON: {exc!s}")]) from None


def _json_fail(path: str, message: str) -> ExpressionError:
    return ExpressionError([Problem(0, 0, f"invalid expression JSON at {path}: {message}")])


def _from_json(d: Any, path: str, depth: int) -> Expr:
    if depth > MAX_DEPTH:
        raise _json_fail(path, f"nests more than {MAX_DEPTH} levels deep")
    if not isinstance(d, dict):
        raise _json_fail(path, f"expected an object, found {type(d).__name__}")
    kind = d.get("kind")
    builder = _JSON_BUILDERS.get(kind)  # type: ignore[arg-type]
    if builder is None:
        raise _json_fail(path, f"unknown kind {kind!r}")
    return builder(d, path, depth)


def _sub(d: dict[str, Any], key: str, path: str, depth: int) -> Expr:
    return _from_json(d[key], f"{path}.{key}", depth + 1)


def _subs(d: dict[str, Any], key: str, path: str, depth: int) -> tuple[Expr, ...]:
    items = d[key]
    if not isinstance(items, list):
        raise _json_fail(f"{path}.{key}", "expected a list")
    return tuple(_from_json(x, f"{path}.{key}[{i}]", depth + 1) for i, x in enumerate(items))


def _flag(d: dict[str, Any], path: str) -> bool:
    value = d.get("negated", False)
    if type(value) is not bool:
        raise _json_fail(f"{path}.negated", "expected true or false")
    return value


def _json_literal(d: dict[str, Any], path: str, depth: int) -> Expr:
    t = ColumnType(d["type"])
    value = d["value"]
    if t is ColumnType.TIMESTAMP:
        value = parse_timestamp(value) if isinstance(value, str) else value
    elif t is ColumnType.DOUBLE and type(value) is int:
        value = float(value)
    problem = _literal_problem(value, t)
    if problem:
        raise _json_fail(path, problem)
    return Literal(value, t)


def _json_column(d: dict[str, Any], path: str, depth: int) -> Expr:
    stream, name = d.get("stream"), d["name"]
    for part in (stream, name):
        if part is not None and (not isinstance(part, str) or not _IDENT.match(part)):
            raise _json_fail(path, f"{part!r} is not a name")
    if stream is None and name.lower() in KEYWORDS:
        raise _json_fail(path, f"'{name}' is a keyword; qualify it with its stream")
    return ColumnRef(stream, name)


def _json_unary(d: dict[str, Any], path: str, depth: int) -> Expr:
    if d["op"] not in ("-", "not"):
        raise _json_fail(path, f"unknown unary operator {d['op']!r}")
    return Unary(d["op"], _sub(d, "operand", path, depth))


def _json_binary(d: dict[str, Any], path: str, depth: int) -> Expr:
    if d["op"] not in BINARY_OPS:
        raise _json_fail(path, f"unknown operator {d['op']!r}")
    return Binary(d["op"], _sub(d, "left", path, depth), _sub(d, "right", path, depth))


def _json_between(d: dict[str, Any], path: str, depth: int) -> Expr:
    return Between(_sub(d, "operand", path, depth), _sub(d, "low", path, depth),
                   _sub(d, "high", path, depth), _flag(d, path))


def _json_in(d: dict[str, Any], path: str, depth: int) -> Expr:
    items = _subs(d, "items", path, depth)
    if not items:
        raise _json_fail(path, "'in' needs at least one item")
    return InList(_sub(d, "operand", path, depth), items, _flag(d, path))


def _json_is_null(d: dict[str, Any], path: str, depth: int) -> Expr:
    return IsNull(_sub(d, "operand", path, depth), _flag(d, path))


def _json_call(d: dict[str, Any], path: str, depth: int) -> Expr:
    if d["function"] not in FUNCTIONS:
        raise _json_fail(path, f"unknown function {d['function']!r}")
    return Call(d["function"], _subs(d, "args", path, depth))


_JSON_BUILDERS: dict[str, Callable[[dict[str, Any], str, int], Expr]] = {
    "literal": _json_literal, "column": _json_column, "unary": _json_unary,
    "binary": _json_binary, "between": _json_between, "in": _json_in,
    "is_null": _json_is_null, "call": _json_call,
}


def referenced_columns(expr: Expr) -> set[tuple[str | None, str]]:
    """(qualifier as written or None, column name) of every column reference."""
    return {(n.stream, n.name) for n in walk(expr) if isinstance(n, ColumnRef)}


# =============================================================== semantics (pure Python) ==
# Each helper implements one rule of docs/expressions.md exactly as Spark 4.1 computes it.


def _int_or_null(value: int) -> int | None:
    """64-bit overflow gives null."""
    return value if INT_MIN <= value <= INT_MAX else None


def _is_double(value: object) -> bool:
    return type(value) is float


def _promote(a: Any, b: Any) -> tuple[Any, Any]:
    """int and double operands meet as doubles."""
    if _is_double(a) or _is_double(b):
        return float(a), float(b)
    return a, b


def arith(op: str, a: Any, b: Any) -> Any:
    """`a op b` for numbers; null in -> null; x/0 and x%0 -> null; int overflow -> null."""
    if a is None or b is None:
        return None
    if op == "/":
        a, b = float(a), float(b)
        return None if b == 0.0 else a / b
    a, b = _promote(a, b)
    if op == "%":
        return None if b == 0 else _remainder(a, b)
    result = a + b if op == "+" else a - b if op == "-" else a * b
    return result if _is_double(result) else _int_or_null(result)


def _remainder(a: Any, b: Any) -> Any:
    """Java/SQL remainder: the sign follows the dividend."""
    if _is_double(a):
        try:
            return math.fmod(a, b)
        except ValueError:  # fmod(inf, y)
            return math.nan
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def negate(a: Any) -> Any:
    if a is None:
        return None
    return -a if _is_double(a) else _int_or_null(-a)


def compare(a: Any, b: Any) -> int:
    """-1/0/1 in Spark's order: numbers meet as doubles when mixed; NaN equals NaN and is
    larger than every other double; -0.0 equals 0.0."""
    if isinstance(a, datetime):
        a, b = _as_utc(a), _as_utc(b)
    elif not isinstance(a, str):
        a, b = _promote(a, b)
    if _is_double(a):
        a_nan, b_nan = math.isnan(a), math.isnan(b)
        if a_nan or b_nan:
            return (a_nan > b_nan) - (a_nan < b_nan)
    return (a > b) - (a < b)


_COMPARATORS: dict[str, Callable[[int], bool]] = {
    "=": lambda c: c == 0, "!=": lambda c: c != 0, "<": lambda c: c < 0,
    "<=": lambda c: c <= 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0,
}


def compare_op(op: str, a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    return _COMPARATORS[op](compare(a, b))


def kleene_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def kleene_or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def kleene_not(a: bool | None) -> bool | None:
    return None if a is None else not a


def in_list(value: Any, items: list[Any]) -> bool | None:
    """SQL IN: true on a match; else null if the value or any item is null; else false."""
    if value is None:
        return None
    saw_null = False
    for item in items:
        if item is None:
            saw_null = True
        elif compare(value, item) == 0:
            return True
    return None if saw_null else False


# -- functions ---------------------------------------------------------------------------------

_DOUBLE_2_63 = 2.0**63


def _abs(x: Any) -> Any:
    return abs(x) if _is_double(x) else _int_or_null(abs(x))


def _round(x: Any, digits: int = 0) -> Any:
    """HALF_UP on the shortest decimal form of a double (Spark: BigDecimal.valueOf)."""
    if _is_double(x):
        if not math.isfinite(x):
            return x
        quantum = Decimal(1).scaleb(-digits)
        rounded = Decimal(repr(x)).quantize(quantum, ROUND_HALF_UP, Context(prec=1000))
        return float(rounded) + 0.0
    if digits >= 0:
        return x
    rounded = Decimal(x).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP, Context(prec=100))
    return _int_or_null(int(rounded))


def _floor_or_ceil(x: Any, fn: Callable[[float], int]) -> Any:
    if not _is_double(x):
        return x
    if math.isnan(x) or not -_DOUBLE_2_63 <= x < _DOUBLE_2_63:
        return None
    return fn(x)


def _sqrt(x: Any) -> float:
    x = float(x)
    return math.nan if x < 0 else math.sqrt(x)


def _ln(x: Any) -> float | None:
    x = float(x)
    return None if x <= 0 else math.log(x)


def _exp(x: Any) -> float:
    try:
        return math.exp(float(x))
    except OverflowError:
        return math.inf


def java_pow(x: Any, y: Any) -> float:
    """Math.pow's rules (Java), which differ from C's for NaN and |x| = 1 with infinite y."""
    x, y = float(x), float(y)
    if y == 0.0:
        return 1.0
    if math.isnan(x) or math.isnan(y) or (abs(x) == 1.0 and math.isinf(y)):
        return math.nan
    odd_int = math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2.0) != 0.0
    try:
        return math.pow(x, y)
    except OverflowError:
        return -math.inf if x < 0 and odd_int else math.inf
    except ValueError:
        if x == 0.0:  # zero to a negative power
            return -math.inf if math.copysign(1.0, x) < 0 and odd_int else math.inf
        return math.nan  # negative base, non-integer power


def _extreme(args: list[Any], pick_larger: bool) -> Any:
    """least/greatest: skip nulls; on ties keep the earlier argument."""
    best = None
    for value in args:
        if value is None:
            continue
        if best is None or (compare(value, best) > 0 if pick_larger else compare(value, best) < 0):
            best = value
    return best


def substring_sql(s: str, pos: Any, length: Any) -> str | None:
    """Spark's substring: 1-based pos, 0 acts as 1, negative counts from the end; positions and
    lengths beyond the 32-bit range give null."""
    int32 = (-(2**31), 2**31 - 1)
    if not (int32[0] <= pos <= int32[1] and int32[0] <= length <= int32[1]):
        return None
    n = len(s)
    start = pos - 1 if pos > 0 else (n + pos if pos < 0 else 0)
    end = min(max(start + length, int32[0]), int32[1])
    start = max(start, 0)
    return "" if start >= end else s[start:min(end, n)]


def _as_utc(ts: datetime) -> datetime:
    return (ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def unix_seconds(ts: datetime) -> int:
    micros = (_as_utc(ts) - _EPOCH) // _ONE_MICRO
    return micros // 1_000_000


def double_to_int(x: float) -> int | None:
    """Spark's ANSI double -> bigint cast under try_cast: truncate toward zero; null for NaN and
    values whose floor/ceil fall outside [-2^63, 2^63] (2^63 itself saturates)."""
    if math.isnan(x) or math.isinf(x):
        return None
    if math.floor(x) <= _DOUBLE_2_63 and math.ceil(x) >= -_DOUBLE_2_63:
        return max(INT_MIN, min(INT_MAX, int(x)))
    return None


_LONG_TEXT = re.compile(r"([+-]?)([0-9]+)\Z")
_DOUBLE_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?\Z")
_HEX_DOUBLE_TEXT = re.compile(
    r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?\Z")
_SPECIAL_DOUBLES = {"nan": math.nan, "infinity": math.inf, "+infinity": math.inf,
                    "-infinity": -math.inf, "inf": math.inf, "+inf": math.inf,
                    "-inf": -math.inf}


def _trim_ascii(s: str) -> str:
    """Spark trims ASCII whitespace and control characters (<= U+0020) before casting."""
    return s.strip("".join(chr(c) for c in range(33)))


def text_to_int(s: str) -> int | None:
    m = _LONG_TEXT.match(_trim_ascii(s))
    if not m:
        return None
    value = int(m.group(2))
    return _int_or_null(-value if m.group(1) == "-" else value)


def text_to_double(s: str) -> float | None:
    t = _trim_ascii(s)
    special = _SPECIAL_DOUBLES.get(t.lower())
    if special is not None:
        return special
    if _HEX_DOUBLE_TEXT.match(t):
        return float.fromhex(t.rstrip("fFdD"))
    if not _DOUBLE_TEXT.match(t):
        return None
    return float(t.rstrip("fFdD"))


def java_double_text(x: float) -> str:
    """Java's Double.toString (what Spark's cast to string prints)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign, digits, exponent = Decimal(repr(x)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    point = len(digits) + exponent  # position of the decimal point after the first digit group
    prefix = "-" if sign else ""
    if 1e-3 <= abs(x) < 1e7:
        if point <= 0:
            return f"{prefix}0.{'0' * -point}{text}"
        whole, frac = text[:point].ljust(point, "0"), text[point:]
        return f"{prefix}{whole}.{frac or '0'}"
    return f"{prefix}{text[0]}.{text[1:] or '0'}E{point - 1}"


def timestamp_text(ts: datetime) -> str:
    """`YYYY-MM-DD HH:MM:SS[.fraction without trailing zeros]` in UTC."""
    v = _as_utc(ts)
    text = (f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:"
            f"{v.second:02d}")
    return text + (f".{v.microsecond:06d}".rstrip("0") if v.microsecond else "")


def to_int_value(x: Any) -> int | None:
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, str):
        return text_to_int(x)
    return double_to_int(x) if _is_double(x) else x


def to_double_value(x: Any) -> float | None:
    if isinstance(x, str):
        return text_to_double(x)
    return float(x)


def to_string_value(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, datetime):
        return timestamp_text(x)
    if _is_double(x):
        return java_double_text(x)
    return str(x)


# name -> implementation over already evaluated, non-null (for strict functions) arguments
_PY_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": _abs,
    "round": _round,
    "floor": lambda x: _floor_or_ceil(x, math.floor),
    "ceil": lambda x: _floor_or_ceil(x, math.ceil),
    "sqrt": _sqrt,
    "ln": _ln,
    "exp": _exp,
    "pow": java_pow,
    "least": lambda *a: _extreme(list(a), pick_larger=False),
    "greatest": lambda *a: _extreme(list(a), pick_larger=True),
    "lower": lambda s: s.lower(),
    "upper": lambda s: s.upper(),
    "length": len,
    "concat": lambda *a: "".join(a),
    "substring": substring_sql,
    "starts_with": lambda s, p: s.startswith(p),
    "ends_with": lambda s, p: s.endswith(p),
    "contains": lambda s, p: p in s,
    "coalesce": lambda *a: next((v for v in a if v is not None), None),
    "year": lambda t: _as_utc(t).year,
    "month": lambda t: _as_utc(t).month,
    "day": lambda t: _as_utc(t).day,
    "hour": lambda t: _as_utc(t).hour,
    "minute": lambda t: _as_utc(t).minute,
    "second": lambda t: _as_utc(t).second,
    "unix_seconds": unix_seconds,
    "to_int": to_int_value,
    "to_double": to_double_value,
    "to_string": to_string_value,
}
_NULL_SKIPPING = frozenset({"least", "greatest", "coalesce"})
assert set(_PY_FUNCTIONS) == set(FUNCTIONS)


# =============================================================================== evaluator ==


def evaluate(expr: Expr, row: Row, scope: Scope | None = None) -> object:
    """The value of `expr` over one row (`row[stream][column]`), with Spark's semantics.
    Values are int, float, str, bool, aware datetime (naive means UTC) or None. With `scope`,
    int values in double columns are read as doubles and mixed int/double results are always
    doubles even when the double side is null (exactly as Spark types them)."""
    return evaluator(expr, scope)(row)


def evaluator(expr: Expr, scope: Scope | None = None) -> Callable[[Row], object]:
    """A function evaluating `expr` over rows; checks depth (and types, with `scope`) once."""
    _guard_depth(expr)
    types: dict[int, ColumnType] = {}
    streams: dict[int, str] = {}
    if scope is not None:
        checker = _Checker(scope)
        checker.run(expr)
        types, streams = checker.types, checker.streams
    else:
        unknown = sorted({n.function for n in walk(expr) if isinstance(n, Call)} - set(FUNCTIONS))
        if unknown:
            raise ExpressionError([Problem(0, 0, f"unknown function '{unknown[0]}'")])
    return lambda row: _Evaluator(row, types, streams).value(expr)


class _Evaluator:
    """Walks the tree for one row."""

    def __init__(self, row: Row, types: Mapping[int, ColumnType], streams: Mapping[int, str]):
        self.row = row
        self.types = types
        self.streams = streams  # id(ColumnRef) -> stream, when resolved against a scope

    def value(self, node: Expr) -> Any:
        result = _EVAL[type(node)](self, node)
        if self.types.get(id(node)) is ColumnType.DOUBLE and type(result) is int:
            return float(result)
        return result

    def literal(self, node: Literal) -> Any:
        return node.value

    def column(self, node: ColumnRef) -> Any:
        stream = node.stream or self.streams.get(id(node)) or self.owner(node)
        try:
            return self.row[stream][node.name]
        except KeyError:
            raise ExpressionError([Problem(node.offset, node.length,
                                           f"row has no column '{stream}.{node.name}'")]) from None

    def owner(self, node: ColumnRef) -> str:
        owners = [s for s, cols in self.row.items() if node.name in cols]
        if len(owners) != 1:
            what = "no stream" if not owners else f"streams {', '.join(owners)}"
            raise ExpressionError([Problem(node.offset, node.length,
                                           f"column '{node.name}' is in {what} of the row")])
        return owners[0]

    def unary(self, node: Unary) -> Any:
        operand = self.value(node.operand)
        return kleene_not(operand) if node.op == "not" else negate(operand)

    def binary(self, node: Binary) -> Any:
        left = self.value(node.left)
        if node.op == "and" and left is False:
            return False
        if node.op == "or" and left is True:
            return True
        right = self.value(node.right)
        if node.op == "and":
            return kleene_and(left, right)
        if node.op == "or":
            return kleene_or(left, right)
        if node.op in COMPARISON_OPS:
            return compare_op(node.op, left, right)
        return arith(node.op, left, right)

    def between(self, node: Between) -> Any:
        v, lo, hi = (self.value(n) for n in (node.operand, node.low, node.high))
        inside = kleene_and(compare_op(">=", v, lo), compare_op("<=", v, hi))
        return kleene_not(inside) if node.negated else inside

    def in_list(self, node: InList) -> Any:
        values = [self.value(n) for n in (node.operand, *node.items)]
        if self.wants_double(node.operand, *node.items) or any(map(_is_double, values)):
            values = [v if v is None else float(v) for v in values]
        found = in_list(values[0], values[1:])
        return kleene_not(found) if node.negated else found

    def wants_double(self, *nodes: Expr) -> bool:
        return any(self.types.get(id(n)) is ColumnType.DOUBLE for n in nodes)

    def is_null(self, node: IsNull) -> bool:
        return (self.value(node.operand) is None) != node.negated

    def call(self, node: Call) -> Any:
        args = [self.value(a) for a in node.args]
        if node.function in _NULL_SKIPPING:
            if self.wants_double(node, *node.args) or any(map(_is_double, args)):
                args = [a if a is None or isinstance(a, bool) else float(a) for a in args]
        elif any(a is None for a in args):
            return None
        return _PY_FUNCTIONS[node.function](*args)


_EVAL: dict[type, Callable[[_Evaluator, Any], Any]] = {
    Literal: _Evaluator.literal, ColumnRef: _Evaluator.column, Unary: _Evaluator.unary,
    Binary: _Evaluator.binary, Between: _Evaluator.between, InList: _Evaluator.in_list,
    IsNull: _Evaluator.is_null, Call: _Evaluator.call,
}


# ================================================================================ lowering ==


def to_column(expr: Expr, scope: Scope) -> "Column":
    """The expression as a PySpark Column. Column references become F.col("`stream`.`name`"),
    so each input DataFrame must be aliased with its stream name. Raises ExpressionError if the
    expression does not type-check in `scope`."""
    checker = _Checker(scope)
    checker.run(expr)
    return _Lowering(checker.types, checker.streams).lower(expr)


class _Lowering:
    """Builds Column objects bottom-up from a checked tree (pyspark imported here only)."""

    def __init__(self, types: Mapping[int, ColumnType], streams: Mapping[int, str]):
        from pyspark.sql import functions as F

        self.F = F
        self.types = types
        self.streams = streams

    def type(self, node: Expr) -> ColumnType:
        return self.types[id(node)]

    def lower(self, node: Expr) -> "Column":
        return getattr(self, f"lower_{type(node).__name__.lower()}")(node)

    def lower_as(self, node: Expr, target: ColumnType) -> "Column":
        """The node's column, cast from int to double when `target` is double."""
        col = self.lower(node)
        if target is ColumnType.DOUBLE and self.type(node) is ColumnType.INT:
            return col.cast("double")
        return col

    def int_lit(self, value: int) -> "Column":
        return self.F.lit(value).cast("bigint")

    def null_of(self, t: ColumnType) -> "Column":
        return self.F.lit(None).cast(t.spark_type_name())

    # -- leaves ---------------------------------------------------------------------------------

    def lower_literal(self, node: Literal) -> "Column":
        F = self.F
        if node.type is ColumnType.INT:
            return self.int_lit(node.value)
        if node.type is ColumnType.DOUBLE:
            return F.lit(float(node.value))
        if node.type is ColumnType.TIMESTAMP:
            micros = (node.value - _EPOCH) // _ONE_MICRO
            return F.timestamp_micros(self.int_lit(micros))
        return F.lit(node.value)

    def lower_columnref(self, node: ColumnRef) -> "Column":
        stream = self.streams[id(node)]
        if not (_IDENT.match(stream) and _IDENT.match(node.name)):
            raise ExpressionError([Problem(node.offset, node.length,
                                           f"'{stream}.{node.name}' is not a valid column name")])
        return self.F.col(f"`{stream}`.`{node.name}`")

    # -- operators ------------------------------------------------------------------------------

    def lower_unary(self, node: Unary) -> "Column":
        operand = self.lower(node.operand)
        if node.op == "not":
            return ~operand
        if self.type(node) is ColumnType.INT:
            return self.F.try_subtract(self.int_lit(0), operand)
        return -operand

    def lower_binary(self, node: Binary) -> "Column":
        if node.op in LOGICAL_OPS:
            left, right = self.lower(node.left), self.lower(node.right)
            return left & right if node.op == "and" else left | right
        if node.op in COMPARISON_OPS:
            return self.comparison(node.op, node.left, node.right)
        target = self.type(node)
        if node.op == "/":
            target = ColumnType.DOUBLE
        left, right = self.lower_as(node.left, target), self.lower_as(node.right, target)
        fn = {"+": self.F.try_add, "-": self.F.try_subtract, "*": self.F.try_multiply,
              "/": self.F.try_divide, "%": self.F.try_mod}[node.op]
        return fn(left, right)

    def comparison(self, op: str, a: Expr, b: Expr) -> "Column":
        target = common_type([self.type(a), self.type(b)]) or self.type(a)
        left, right = self.lower_as(a, target), self.lower_as(b, target)
        return {"=": left == right, "!=": left != right, "<": left < right,
                "<=": left <= right, ">": left > right, ">=": left >= right}[op]

    def lower_between(self, node: Between) -> "Column":
        inside = (self.comparison(">=", node.operand, node.low)
                  & self.comparison("<=", node.operand, node.high))
        return ~inside if node.negated else inside

    def lower_inlist(self, node: InList) -> "Column":
        nodes = (node.operand, *node.items)
        target = common_type([self.type(n) for n in nodes]) or self.type(node.operand)
        value, *items = (self.lower_as(n, target) for n in nodes)
        found = value.isin(*items)
        return ~found if node.negated else found

    def lower_isnull(self, node: IsNull) -> "Column":
        col = self.lower(node.operand)
        return col.isNotNull() if node.negated else col.isNull()

    def lower_call(self, node: Call) -> "Column":
        if node.function not in FUNCTIONS:  # the checker refused it already; never getattr blind
            raise ExpressionError([Problem(node.offset, node.length,
                                           f"unknown function '{node.function}'")])
        return getattr(self, f"fn_{node.function}")(node)

    # -- functions ------------------------------------------------------------------------------

    def args(self, node: Call, target: ColumnType | None = None) -> list["Column"]:
        if target is None:
            return [self.lower(a) for a in node.args]
        return [self.lower_as(a, target) for a in node.args]

    def fn_abs(self, node: Call) -> "Column":
        (x,) = self.args(node)
        if self.type(node) is ColumnType.DOUBLE:
            return self.F.abs(x)
        return self.F.when(x == self.int_lit(INT_MIN), self.null_of(ColumnType.INT)) \
            .otherwise(self.F.abs(x))

    def fn_round(self, node: Call) -> "Column":
        x = self.lower(node.args[0])
        digits = node.args[1].value if len(node.args) > 1 else 0  # type: ignore[union-attr]
        if self.type(node) is ColumnType.DOUBLE:
            return self.F.round(x, digits)
        if digits >= 0:
            return x
        return self.F.round(x.cast("decimal(20,0)"), digits).try_cast("bigint")

    def floor_ceil(self, node: Call, fn: Callable[[Any], "Column"]) -> "Column":
        (x,) = self.args(node)
        if self.type(node.args[0]) is ColumnType.INT:
            return x
        in_range = (x >= self.F.lit(-_DOUBLE_2_63)) & (x < self.F.lit(_DOUBLE_2_63))
        return self.F.when(in_range, fn(x).cast("bigint")).otherwise(
            self.null_of(ColumnType.INT))

    def fn_floor(self, node: Call) -> "Column":
        return self.floor_ceil(node, self.F.floor)

    def fn_ceil(self, node: Call) -> "Column":
        return self.floor_ceil(node, self.F.ceil)

    def fn_sqrt(self, node: Call) -> "Column":
        return self.F.sqrt(*self.args(node, ColumnType.DOUBLE))

    def fn_ln(self, node: Call) -> "Column":
        return self.F.ln(*self.args(node, ColumnType.DOUBLE))

    def fn_exp(self, node: Call) -> "Column":
        return self.F.exp(*self.args(node, ColumnType.DOUBLE))

    def fn_pow(self, node: Call) -> "Column":
        return self.F.pow(*self.args(node, ColumnType.DOUBLE))

    def fn_least(self, node: Call) -> "Column":
        return self.F.least(*self.args(node, self.type(node)))

    def fn_greatest(self, node: Call) -> "Column":
        return self.F.greatest(*self.args(node, self.type(node)))

    def fn_lower(self, node: Call) -> "Column":
        return self.F.lower(*self.args(node))

    def fn_upper(self, node: Call) -> "Column":
        return self.F.upper(*self.args(node))

    def fn_length(self, node: Call) -> "Column":
        return self.F.length(*self.args(node)).cast("bigint")

    def fn_concat(self, node: Call) -> "Column":
        return self.F.concat(*self.args(node))

    def fn_substring(self, node: Call) -> "Column":
        s, pos, length = self.args(node)
        return self.F.substring(s, pos.try_cast("int"), length.try_cast("int"))

    def fn_starts_with(self, node: Call) -> "Column":
        return self.F.startswith(*self.args(node))

    def fn_ends_with(self, node: Call) -> "Column":
        return self.F.endswith(*self.args(node))

    def fn_contains(self, node: Call) -> "Column":
        return self.F.contains(*self.args(node))

    def fn_coalesce(self, node: Call) -> "Column":
        return self.F.coalesce(*self.args(node, self.type(node)))

    # Time fields are computed from the epoch value, so they are UTC whatever the session's
    # time zone is (Spark's hour()/year() would use spark.sql.session.timeZone).

    def seconds(self, node: Call) -> "Column":
        return self.F.unix_seconds(self.lower(node.args[0]))

    def floor_div(self, col: "Column", n: int) -> "Column":
        """Exact floor(col / n) for bigint col and positive n."""
        return ((col - self.F.pmod(col, self.int_lit(n))) / n).cast("bigint")

    def utc_date(self, node: Call) -> "Column":
        days = self.floor_div(self.seconds(node), 86400)
        return self.F.date_from_unix_date(days.cast("int"))

    def fn_unix_seconds(self, node: Call) -> "Column":
        return self.seconds(node)

    def fn_year(self, node: Call) -> "Column":
        return self.F.year(self.utc_date(node)).cast("bigint")

    def fn_month(self, node: Call) -> "Column":
        return self.F.month(self.utc_date(node)).cast("bigint")

    def fn_day(self, node: Call) -> "Column":
        return self.F.dayofmonth(self.utc_date(node)).cast("bigint")

    def fn_hour(self, node: Call) -> "Column":
        return self.floor_div(self.F.pmod(self.seconds(node), self.int_lit(86400)), 3600)

    def fn_minute(self, node: Call) -> "Column":
        return self.floor_div(self.F.pmod(self.seconds(node), self.int_lit(3600)), 60)

    def fn_second(self, node: Call) -> "Column":
        return self.F.pmod(self.seconds(node), self.int_lit(60))

    def fn_to_int(self, node: Call) -> "Column":
        (x,) = self.args(node)
        return x if self.type(node.args[0]) is ColumnType.INT else x.try_cast("bigint")

    def fn_to_double(self, node: Call) -> "Column":
        (x,) = self.args(node)
        return x.try_cast("double")

    def fn_to_string(self, node: Call) -> "Column":
        (x,) = self.args(node)
        if self.type(node.args[0]) is ColumnType.TIMESTAMP:
            return self.timestamp_text(x)
        return x.cast("string")

    def timestamp_text(self, ts: "Column") -> "Column":
        """`YYYY-MM-DD HH:MM:SS[.fraction]` in UTC, built from the epoch value."""
        F = self.F
        micros = F.unix_micros(ts)
        secs = self.floor_div(micros, 1_000_000)
        day_secs = F.pmod(secs, self.int_lit(86400))
        date = F.date_from_unix_date(self.floor_div(secs, 86400).cast("int")).cast("string")
        clock = F.format_string("%02d:%02d:%02d", self.floor_div(day_secs, 3600),
                                self.floor_div(F.pmod(day_secs, self.int_lit(3600)), 60),
                                F.pmod(day_secs, self.int_lit(60)))
        frac = F.pmod(micros, self.int_lit(1_000_000))
        frac_text = F.when(frac == 0, F.lit("")).otherwise(
            F.concat(F.lit("."), F.regexp_replace(F.lpad(frac.cast("string"), 6, "0"),
                                                  "0+$", "")))
        return F.concat(date, F.lit(" "), clock, frac_text)
