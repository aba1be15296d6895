"""Row patterns (the `pattern` operator): their syntax, their automaton, and the typing of the
conditions and measures that navigate a match.

Owns `parse_pattern` (text such as `A B+ (C | D)* E?` -> a tree of `Var`, `Seq`, `Alt`, `Repeat`,
every problem located, length and nesting bounded), the refusals that keep matching finite
(a pattern or a repeated part that can match no rows), `compile_nfa` (the tree -> a Thompson
automaton whose split states list their branches in preference order: greedy quantifiers,
left alternatives first), and `compile_define` / `compile_measure` (an expression of the
language with the navigation functions `prev`, `first`, `last`, `count`, `min`, `max`, parsed and
type-checked in a `Scope` whose unqualified columns are the current row and whose qualifiers may
be pattern variables). The matching itself runs in the executor (`executor.cep.match`), over
these trees; nothing here runs user text. Semantics: docs/spec-language.md, "pattern".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Literal as Lit, NoReturn, Union

from common.types import ColumnType, Schema
from compiler.expr.ast import (FUNCTIONS, KEYWORDS, Call, Case, ColumnRef, Expr, ExpressionError,
                               Problem, Scope, TypedExpr, walk)
from compiler.expr.checker import NotBoolean, check
from compiler.expr.parser import parse

MAX_PATTERN_LENGTH = 512
MAX_PATTERN_DEPTH = 16
MAX_VARIABLES = 26
MAX_PATTERN_ITEMS = 64  # variable occurrences

NAVIGATION = frozenset({"prev", "first", "last", "count", "min", "max"})
MEASURE_NAVIGATION = NAVIGATION - {"prev"}
# The functions of the language a condition or measure may call besides navigation: those the
# executor's row evaluator (`executor.cep.row_eval`) implements.
ROW_FUNCTIONS = frozenset({"abs", "least", "greatest", "coalesce", "lower", "upper", "length",
                           "concat", "unix_seconds", "starts_with", "ends_with",
                           "contains"})
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")

# ==================================================================================== tree ==


@dataclass(frozen=True)
class Var:
    name: str
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Seq:
    items: "tuple[Node, ...]"


@dataclass(frozen=True)
class Alt:
    options: "tuple[Node, ...]"


@dataclass(frozen=True)
class Repeat:
    """`body+` (min 1, many), `body*` (min 0, many), `body?` (min 0, one); greedy."""

    body: "Node"
    op: Lit["+", "*", "?"]
    offset: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)


Node = Union[Var, Seq, Alt, Repeat]


def nullable(node: Node) -> bool:
    """Whether `node` can match zero rows."""
    if isinstance(node, Var):
        return False
    if isinstance(node, Seq):
        return all(nullable(i) for i in node.items)
    if isinstance(node, Alt):
        return any(nullable(o) for o in node.options)
    return node.op != "+" or nullable(node.body)


def variables(node: Node) -> tuple[str, ...]:
    """The pattern's variables in order of first appearance."""
    seen: dict[str, None] = {}
    stack: list[Node] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Var):
            seen.setdefault(n.name, None)
        elif isinstance(n, Seq):
            stack.extend(reversed(n.items))
        elif isinstance(n, Alt):
            stack.extend(reversed(n.options))
        else:
            stack.append(n.body)
    return tuple(seen)


def render(node: Node) -> str:
    """Canonical text of a pattern tree (parse(render(t)) == t)."""
    if isinstance(node, Var):
        return node.name
    if isinstance(node, Seq):
        return " ".join(render(i) if not isinstance(i, Alt) else f"({render(i)})"
                        for i in node.items)
    if isinstance(node, Alt):
        return " | ".join(render(o) for o in node.options)
    body = render(node.body)
    wrap = not isinstance(node.body, Var)
    return f"({body}){node.op}" if wrap else f"{body}{node.op}"

# ================================================================================== parser ==


class _Stop(Exception):
    pass


class _PatternParser:
    """alternation = sequence ('|' sequence)*; sequence = item+; item = atom ('+'|'*'|'?')?;
    atom = VARIABLE | '(' alternation ')'."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.depth = 0
        self.items = 0
        self.problems: list[Problem] = []

    def fail(self, message: str, hint: str = "", length: int = 1) -> NoReturn:
        self.problems.append(Problem(self.pos, length, message, hint))
        raise _Stop()

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def run(self) -> Node:
        if not self.peek():
            self.fail("a pattern is empty", "write variables, e.g. A B+ C", 0)
        node = self.alternation()
        if self.peek():
            what = self.peek()
            self.fail(f"unexpected '{what}'", "a pattern has variables, ( ), |, +, * and ?"
                      if what != ")" else "this ')' closes no '('")
        return node

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.item())
        if not items:
            self.fail("expected a variable or '(' here", "an alternative must not be empty",
                      0 if self.pos >= len(self.text) else 1)
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def item(self) -> Node:
        start = self.pos
        node = self.atom()
        if self.peek() in ("+", "*", "?"):
            op = self.text[self.pos]
            self.pos += 1
            node = Repeat(node, op, start, self.pos - start)  # type: ignore[arg-type]  # op is + * or ? (peeked)
            if self.peek() in ("+", "*", "?"):
                self.fail(f"'{self.text[self.pos]}' after '{op}'",
                          "reluctant and possessive quantifiers are not supported; use one of "
                          "+ * ?")
        return node

    def atom(self) -> Node:
        ch = self.peek()
        if ch == "(":
            self.depth += 1
            if self.depth > MAX_PATTERN_DEPTH:
                self.fail(f"parentheses nest more than {MAX_PATTERN_DEPTH} deep")
            self.pos += 1
            node = self.alternation()
            if self.peek() != ")":
                self.fail("expected ')'", "close the '(' opened before", 0 if not self.peek()
                          else 1)
            self.pos += 1
            self.depth -= 1
            return node
        match = _VAR.match(self.text, self.pos)
        if match is None:
            self.fail(f"unexpected '{ch}'", "a variable is a name such as A or rise; "
                      "quantifiers follow a variable or ')'")
        self.items += 1
        if self.items > MAX_PATTERN_ITEMS:
            self.fail(f"a pattern has at most {MAX_PATTERN_ITEMS} variable occurrences")
        name = match.group(0)
        if name.lower() in KEYWORDS:
            self.fail(f"'{name}' is a keyword of the expression language",
                      "name the variable otherwise, e.g. A", len(name))
        if match.end() < len(self.text) and _VAR.match(self.text[match.end()]):
            self.fail("a variable name is at most 32 characters", length=match.end() - self.pos)
        self.pos = match.end()
        return Var(name, match.start(), len(name))


def parse_pattern(text: str) -> Node:
    """A pattern tree; ExpressionError (offsets into `text`) when it is malformed, matches no
    rows at all, or repeats a part that can match no rows."""
    if not isinstance(text, str):
        raise ExpressionError([Problem(0, 0, "expected pattern text")])
    if len(text) > MAX_PATTERN_LENGTH:
        raise ExpressionError([Problem(MAX_PATTERN_LENGTH, len(text) - MAX_PATTERN_LENGTH,
                                       f"a pattern is at most {MAX_PATTERN_LENGTH} characters")])
    parser = _PatternParser(text)
    try:
        node = parser.run()
    except _Stop:
        raise ExpressionError(parser.problems) from None
    problems = _empty_problems(node, text)
    names = variables(node)
    if len(names) > MAX_VARIABLES:
        problems.append(Problem(0, len(text), f"a pattern has at most {MAX_VARIABLES} "
                                              f"variables, this one {len(names)}"))
    if problems:
        raise ExpressionError(problems)
    return node


def _empty_problems(node: Node, text: str) -> list[Problem]:
    problems: list[Problem] = []
    if nullable(node):
        problems.append(Problem(0, len(text), "this pattern can match no rows at all, which "
                                              "would give empty matches",
                                "make one variable mandatory, e.g. A B* instead of A* B*"))
    stack: list[Node] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Repeat):
            if n.op != "?" and nullable(n.body):
                problems.append(Problem(n.offset, n.length, f"'{n.op}' repeats a part that can "
                                        "match no rows", "make the repeated part match at "
                                        "least one row, e.g. (A B?)+ instead of (A? B?)+"))
            stack.append(n.body)
        elif isinstance(n, Seq):
            stack.extend(n.items)
        elif isinstance(n, Alt):
            stack.extend(n.options)
    return problems

# ===================================================================================== NFA ==


@dataclass(frozen=True)
class State:
    """`var`: consume one row as `var`, then go to `next`; `split`: continue with each of
    `branches`, the first preferred; `accept`: the match is complete."""

    kind: Lit["var", "split", "accept"]
    var: str = ""
    next: int = -1
    branches: tuple[int, ...] = ()


@dataclass(frozen=True)
class Nfa:
    states: tuple[State, ...]
    start: int

    def closure(self, pc: int) -> list[int]:
        """The `var` and `accept` states reachable from `pc` without consuming a row, in
        preference order (a pattern accepted by parse_pattern has no row-less cycle)."""
        out: list[int] = []
        stack = [pc]
        while stack:
            s = stack.pop()
            state = self.states[s]
            if state.kind == "split":
                stack.extend(reversed(state.branches))
            else:
                out.append(s)
        return out


def compile_nfa(node: Node) -> Nfa:
    """Thompson construction; state 0 is `accept`."""
    states: list[State] = [State("accept")]

    def add(state: State) -> int:
        states.append(state)
        return len(states) - 1

    def build(n: Node, nxt: int) -> int:
        if isinstance(n, Var):
            return add(State("var", n.name, nxt))
        if isinstance(n, Seq):
            for item in reversed(n.items):
                nxt = build(item, nxt)
            return nxt
        if isinstance(n, Alt):
            return add(State("split", branches=tuple(build(o, nxt) for o in n.options)))
        if n.op == "?":
            return add(State("split", branches=(build(n.body, nxt), nxt)))
        loop = add(State("split"))  # patched below: (body, nxt)
        body = build(n.body, loop)
        states[loop] = State("split", branches=(body, nxt))
        return body if n.op == "+" else loop

    start = build(node, 0)
    return Nfa(tuple(states), start)

# ===================================================================== conditions, measures ==


@dataclass(frozen=True)
class PatternScope:
    """What a condition or measure of a pattern operator may name."""

    stream: str
    schema: Schema
    variables: tuple[str, ...]


def _navigation_types(scope: PatternScope, allowed: frozenset[str]
                      ) -> Callable[[Call], ColumnType | list[Problem]]:
    def type_call(call: Call) -> ColumnType | list[Problem]:
        if call.function not in allowed:
            where = "in a measure" if call.function == "prev" else "here"
            return [Problem(call.offset, call.length, f"'{call.function}' is not available "
                            f"{where}", "prev(col) is the row before the current one of a "
                            "condition; a measure reads the whole match with first, last, "
                            "count, min and max")]
        if call.function not in NAVIGATION:
            return [Problem(call.offset, call.length,
                            f"function '{call.function}' is not available in a pattern",
                            "pattern conditions and measures may call "
                            + ", ".join(sorted(ROW_FUNCTIONS | allowed)))]
        return _navigation_type(scope, call)
    return type_call


def _navigation_type(scope: PatternScope, call: Call) -> ColumnType | list[Problem]:
    name = call.function
    args = call.args
    if name == "count":
        if not args:
            return ColumnType.INT
        if len(args) == 1 and isinstance(args[0], ColumnRef) and args[0].stream is None \
                and args[0].name in scope.variables:
            return ColumnType.INT
        return [Problem(call.offset, call.length, "count takes one pattern variable or nothing",
                        f"write count() for the rows of the match or count(V) for V's rows, V "
                        f"one of {', '.join(scope.variables)}")]
    if len(args) != 1 or not isinstance(args[0], ColumnRef):
        return [Problem(call.offset, call.length, f"{name} takes one column, e.g. "
                        f"{name}(price) or {name}({scope.variables[0]}.price)")]
    ref = args[0]
    if ref.stream is not None and ref.stream != scope.stream and ref.stream not in \
            scope.variables:
        return [Problem(ref.offset, ref.length, f"unknown pattern variable '{ref.stream}'",
                        f"variables: {', '.join(scope.variables)}")]
    if name == "prev" and ref.stream not in (None, scope.stream):
        return [Problem(ref.offset, ref.length, "prev reads the row before the current one: "
                        "write prev(column) without a variable",
                        f"for a variable's rows use last({ref.stream}.{ref.name})")]
    column = scope.schema.get(ref.name)
    if column is None:
        return [Problem(ref.offset, ref.length, f"unknown column '{ref.name}' (columns: "
                                                f"{', '.join(scope.schema.names)})")]
    if name in ("min", "max") and not column.type.is_orderable:
        return [Problem(call.offset, call.length, f"{name} cannot order {column.type.value} "
                                                  "values")]
    return column.type


def _scope(scope: PatternScope, allowed: frozenset[str]) -> Scope:
    streams = {scope.stream: scope.schema, **{v: scope.schema for v in scope.variables}}
    return Scope(streams, current=scope.stream,
                 navigation=_navigation_types(scope, allowed))


def _refuse_other_functions(text: str, expr_tree: Expr) -> None:
    problems = [Problem(n.offset, n.length, f"function '{n.function}' is not available in a "
                        "pattern", "pattern conditions and measures may call "
                        + ", ".join(sorted(ROW_FUNCTIONS | NAVIGATION)))
                for n in walk(expr_tree) if isinstance(n, Call)
                and n.function in FUNCTIONS and n.function not in ROW_FUNCTIONS]
    problems += [Problem(n.offset, n.length, "'case' is not available in a pattern",
                         "give each case its own pattern variable")
                 for n in walk(expr_tree) if isinstance(n, Case)]
    if problems:
        raise ExpressionError(problems)


def compile_define(text: str, scope: PatternScope) -> TypedExpr:
    """A variable's condition: boolean; `col` is the current row, `V.col` the last row of V
    (the current row when the condition is V's own), `prev(col)` the row before the current
    one in the match, `first/last/min/max(V.col)`, `count(V)` over the match so far."""
    tree = parse(text, NAVIGATION)
    _refuse_other_functions(text, tree)
    result = check(tree, _scope(scope, NAVIGATION))
    if result is not ColumnType.BOOLEAN:
        raise NotBoolean(text, result)
    return TypedExpr(tree, result, text)


def compile_measure(text: str, scope: PatternScope) -> TypedExpr:
    """A measure of a complete match: `col` is the match's last row, `V.col` V's last row,
    first/last/min/max/count as in conditions; no prev."""
    tree = parse(text, MEASURE_NAVIGATION)
    _refuse_other_functions(text, tree)
    return TypedExpr(tree, check(tree, _scope(scope, MEASURE_NAVIGATION)), text)
