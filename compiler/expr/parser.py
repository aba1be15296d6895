"""The expression language's parser: tokens -> AST.

Owns `parse` (precedence climbing over `compiler.expr.lexer` tokens, every problem reported with
its offset, nesting bounded by MAX_DEPTH) and `parse_timestamp` (the text of a timestamp
literal). Does not own types (`compiler.expr.checker`).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from common.types import ColumnType
from compiler.expr.ast import (EPOCH, FUNCTIONS, INT_MAX, INT_MIN, MAX_DEPTH, MAX_TEXT_LENGTH,
                               Between, Binary, Call, Case, ColumnRef, Expr, ExpressionError,
                               InList, IsNull, Literal, Problem, Unary, did_you_mean, too_deep)
from compiler.expr.lexer import Token, tokenize

_OP_ALIASES = {"==": "=", "<>": "!="}


class _Abort(Exception):
    """Internal: a syntax error after which parsing cannot continue."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem


# ================================================================================= grammar ==
# Precedence, loosest first: or(1) < and(2) < not(3) < comparisons, between, in, is(4)
# < + -(5) < * / %(6) < unary -(7). Comparisons do not chain.

_BINARY_LEVEL = {"or": 1, "and": 2, **{op: 4 for op in ("=", "==", "!=", "<>", "<", "<=", ">",
                                                        ">=")},
                 "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_COMPARISON_LEVEL = 4
_UNARY_LEVEL = 7


def parse(text: str, navigation: frozenset[str] = frozenset()) -> Expr:
    """Parse expression text to an AST; raises ExpressionError with every problem found.
    `navigation` names the extra functions a pattern's conditions and measures may call
    (`compiler.expr.pattern`); elsewhere there are none."""
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
    return _Parser(tokens, navigation).run()


class _Parser:
    """Recursive descent with precedence climbing over a token list."""

    def __init__(self, tokens: list[Token], navigation: frozenset[str] = frozenset()):
        self.tokens = tokens
        self.navigation = navigation
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
        deep = too_deep(expr)
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
        if word == "case":
            return self.case()
        if word == "null":
            self.advance()
            self.problems.append(Problem(
                tok.offset, tok.length, "'null' may only appear in 'x is null' or 'x is not null'",
                "use coalesce(x, default) to replace nulls"))
            return Literal(False, ColumnType.BOOLEAN, tok.offset, tok.length)
        self.fail("a value")
        raise AssertionError("unreachable")

    def case(self) -> Expr:
        """`case when c then v {when c then v} [else d] end` (the `case` token is next)."""
        start = self.advance()
        if not self.is_keyword("when"):
            self.fail("'when'", "write case when x > 0 then 'a' else 'b' end")
        branches: list[tuple[Expr, Expr]] = []
        while self.is_keyword("when"):
            self.advance()
            condition = self.expression(0)
            self.expect_keyword("then", "'then' after the condition of 'when'")
            branches.append((condition, self.expression(0)))
        default = None
        if self.is_keyword("else"):
            self.advance()
            default = self.expression(0)
        end = self.expect_keyword("end", "'when', 'else' or 'end' in 'case'")
        return _span(Case(tuple(branches), default), start, end)

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
            value = EPOCH
        return _span(Literal(value, ColumnType.TIMESTAMP), kw, tok)

    def call(self, name_tok: Token) -> Expr:
        name = name_tok.text.lower()
        if name not in FUNCTIONS and name not in self.navigation:
            known = [*FUNCTIONS, *self.navigation]
            hint = did_you_mean(name, known)
            self.problems.append(Problem(
                name_tok.offset, name_tok.length,
                f"unknown function '{name_tok.text}' (functions: {', '.join(sorted(known))})",
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
