"""The expression language's type checker.

Owns `check` (the result type of an AST in a `Scope`, every problem collected, no cascades),
`compile_expression` (parse + check), `compile_condition` (the one place that decides that a
condition - a filter's, a splitter's, a control tuple's - is boolean; `NotBoolean` otherwise),
`checked` (the type of every node and the stream each column resolves to, for the lowering),
`common_type` and `literal_problem`. Does not own running an expression: the executor lowers a
checked tree to Spark (`executor.expression_lowering`).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from common.types import ColumnType
from compiler.expr.ast import (ARITHMETIC_OPS, COMPARISON_OPS, FUNCTIONS, INT_MAX, INT_MIN,
                               LOGICAL_OPS, ROUND_DIGITS, Between, Binary, Call, Case, ColumnRef,
                               Expr, ExpressionError, FunctionSig, InList, IsNull, Literal,
                               Problem, Scope, TypedExpr, Unary, did_you_mean, guard_depth)
from compiler.expr.parser import parse
from compiler.expr.regex import check_regex

_T = ColumnType


class NotBoolean(ExpressionError):
    """A condition that parses and type-checks but is not boolean; `type` is what it is."""

    def __init__(self, text: str, type: ColumnType):
        super().__init__([Problem(0, len(text), f"a condition must be boolean but this "
                                                f"expression is {type.value}",
                                  "write a comparison such as raw.temp > 30")])
        self.type = type


def check(expr: Expr, scope: Scope) -> ColumnType:
    """The result type of `expr` in `scope`; raises ExpressionError with every problem found."""
    return _Checker(scope).run(expr)


def compile_expression(text: str, scope: Scope) -> TypedExpr:
    """Parse and type-check `text`."""
    expr = parse(text)
    return TypedExpr(expr, check(expr, scope), text)


def compile_condition(text: str, scope: Scope) -> TypedExpr:
    """Like compile_expression, and the result must be boolean (filters, splitter predicates,
    control tuples); NotBoolean, an ExpressionError, when it is not."""
    typed = compile_expression(text, scope)
    if typed.type is not ColumnType.BOOLEAN:
        raise NotBoolean(text, typed.type)
    return typed


def checked(expr: Expr, scope: Scope) -> tuple[dict[int, ColumnType], dict[int, str]]:
    """The type of every node (by id) and the stream every column reference resolves to (by
    id) of `expr` in `scope`; raises ExpressionError as `check` does."""
    checker = _Checker(scope)
    checker.run(expr)
    return checker.types, checker.streams


class _Checker:
    """Computes the type of every node and where each column reference resolves; collects all
    problems (a node whose children failed reports nothing more, so errors do not cascade)."""

    def __init__(self, scope: Scope):
        self.scope = scope
        self.problems: list[Problem] = []
        self.types: dict[int, ColumnType] = {}
        self.streams: dict[int, str] = {}  # id(ColumnRef) -> the stream it resolves to

    def run(self, expr: Expr) -> ColumnType:
        guard_depth(expr)
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
        problem = literal_problem(node.value, node.type)
        if problem:
            self.problem(node, problem)
            return None
        return node.type

    def check_columnref(self, node: ColumnRef) -> ColumnType | None:
        if node.stream is not None:
            return self.qualified(node)
        owners = [s for s, schema in self.scope.streams.items() if schema.get(node.name)]
        if self.scope.current is not None:
            owners = [s for s in owners if s == self.scope.current]
        if len(owners) == 1:
            self.streams[id(node)] = owners[0]
            column = self.scope.streams[owners[0]].get(node.name)  # every owner has it
            return column.type if column is not None else None
        if owners:
            quoted = " and ".join(f"'{s}'" for s in owners)
            self.problem(node, f"column '{node.name}' is ambiguous: streams {quoted} all have it",
                         "qualify it: " + " or ".join(f"{s}.{node.name}" for s in owners))
        else:
            self.unknown_column(node)
        return None

    def qualified(self, node: ColumnRef) -> ColumnType | None:
        stream = node.stream or ""  # a qualified reference has its stream
        schema = self.scope.streams.get(stream)
        if schema is None:
            names = sorted(self.scope.streams)
            self.problem(node, f"unknown stream '{node.stream}' (streams: {', '.join(names)})",
                         did_you_mean(node.stream or "", names))
            return None
        found = schema.get(node.name)
        if found is None:
            self.problem(node, f"unknown column '{node.name}' in stream '{node.stream}' "
                               f"(columns: {', '.join(schema.names)})",
                         did_you_mean(node.name, schema.names))
            return None
        self.streams[id(node)] = stream
        return found.type

    def unknown_column(self, node: ColumnRef) -> None:
        streams = self.scope.streams
        if self.scope.current is not None:
            streams = {self.scope.current: streams[self.scope.current]}
        if len(streams) == 1:
            (name, schema), = streams.items()
            self.problem(node, f"unknown column '{node.name}' in stream '{name}' "
                               f"(columns: {', '.join(schema.names)})",
                         did_you_mean(node.name, schema.names))
            return
        listing = "; ".join(f"{s}: {', '.join(sc.names)}" for s, sc in streams.items())
        every = [n for sc in streams.values() for n in sc.names]
        self.problem(node, f"unknown column '{node.name}' (streams: {listing or 'none'})",
                     did_you_mean(node.name, every))

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
        known = [it for it in item_types if it is not None]
        if t is None or len(known) != len(item_types):
            return None
        ok = True
        for item, it in zip(node.items, known):
            ok = self.comparable(item, t, it, "in") and ok
        return ColumnType.BOOLEAN if ok else None

    def check_isnull(self, node: IsNull) -> ColumnType | None:
        return None if self.type_of(node.operand) is None else ColumnType.BOOLEAN

    def check_case(self, node: Case) -> ColumnType | None:
        conditions_ok = True
        for condition, _ in node.branches:
            t = self.type_of(condition)
            if t is not None and t is not ColumnType.BOOLEAN:
                self.problem(condition, f"the condition of 'when' must be boolean but is "
                                        f"{t.value}", "compare it, e.g. x > 0")
            conditions_ok = conditions_ok and t is ColumnType.BOOLEAN
        values = [value for _, value in node.branches]
        values += [node.default] if node.default is not None else []
        types = [self.type_of(v) for v in values]
        known = [t for t in types if t is not None]
        if len(known) != len(types):
            return None
        common = common_type(known)
        if common is None:
            first = known[0]
            for value, t in zip(values, known):
                if not (t is first or (t.is_numeric and first.is_numeric)):
                    self.problem(value, f"the values of 'case' must have one type: this one is "
                                        f"{t.value} but the first is {first.value}",
                                 "convert them with to_int, to_double or to_string")
        return common if conditions_ok else None

    # -- functions ------------------------------------------------------------------------------

    def check_call(self, node: Call) -> ColumnType | None:
        if self.scope.navigation is not None and node.function not in FUNCTIONS:
            return self.navigation(node)
        arg_types = [self.type_of(a) for a in node.args]
        sig = FUNCTIONS.get(node.function)
        if sig is None:
            self.problem(node, f"unknown function '{node.function}' "
                               f"(functions: {', '.join(sorted(FUNCTIONS))})",
                         did_you_mean(node.function, list(FUNCTIONS)))
            return None
        if not self.arity_ok(node, sig):
            return None
        known = [t for t in arg_types if t is not None]
        if len(known) != len(arg_types):
            return None
        return self.call_type(node, sig, known)

    def navigation(self, node: Call) -> ColumnType | None:
        """A pattern's navigation call, typed by the scope's hook (its argument is a column or
        variable reference, never a nested expression, so nothing below it needs checking)."""
        hook = self.scope.navigation
        assert hook is not None  # checked by our caller
        result = hook(node)
        if isinstance(result, list):
            self.problems.extend(result)
            return None
        return result

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
        if not ok or not self.group_ok(node, sig):
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
        assert isinstance(sig.result, ColumnType)  # "arg" and "common" are handled above
        return sig.result


    def group_ok(self, node: Call, sig: FunctionSig) -> bool:
        """A `group` argument names a group of the pattern argument before it."""
        for i, param in enumerate(sig.params):
            if param != "group" or i >= len(node.args):
                continue
            pattern, group = node.args[i - 1], node.args[i]
            assert isinstance(pattern, Literal) and isinstance(group, Literal)  # params checked
            groups, _ = check_regex(pattern.value)
            if group.value > groups:
                self.problem(group, f"argument {i + 1} of {sig.name}: the pattern has {groups} "
                                    f"group{'s' if groups != 1 else ''}, so the group is 0 (the "
                                    f"whole match){f' to {groups}' if groups else ''}",
                             sig.describe())
                return False
        return True


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
    "pattern": (_T.STRING,),
    "group": (_T.INT,),
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
    if param == "pattern":
        return _pattern_problem(arg)
    if param == "group" and not (isinstance(arg, Literal) and arg.value >= 0):
        return "the group must be a whole number written out: 0 (the whole match), 1, 2, ..."
    return ""


def _pattern_problem(arg: Expr) -> str:
    if not isinstance(arg, Literal):
        return ("the pattern must be a string written out, as in '[0-9]+', so that it is "
                "checked before it runs (docs/expressions.md, regular expressions)")
    _, problems = check_regex(arg.value)
    return "; ".join(f"the pattern is refused at character {p.position + 1}: {p.message}"
                     for p in problems)


def literal_problem(value: Any, t: ColumnType) -> str:
    """Why `value` is not a valid literal of type `t` ('' if it is)."""
    ok = {
        ColumnType.INT: type(value) is int and INT_MIN <= value <= INT_MAX,
        ColumnType.DOUBLE: type(value) is float and math.isfinite(value),
        ColumnType.STRING: type(value) is str,
        ColumnType.BOOLEAN: type(value) is bool,
        ColumnType.TIMESTAMP: isinstance(value, datetime) and value.tzinfo is not None,
    }.get(t, False)
    return "" if ok else f"invalid {getattr(t, 'value', t)} literal {value!r}"
