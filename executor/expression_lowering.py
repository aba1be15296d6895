"""The expression language lowered to Spark: a checked tree -> a PySpark `Column`.

Owns `to_column`: every node of a tree that `compiler.expr` parsed and type-checked becomes
Column operations with exactly the semantics of docs/expressions.md (nulls, overflow to null
with try_* arithmetic, division by zero, NaN ordering, rounding, casts, UTC time fields), the
same rules the test oracle (tests/expression_oracle.py) computes in plain Python. Column
references become F.col("`stream`.`name`"), so each input DataFrame must be aliased with its
stream name (the runtime does). User text is never code: nothing here calls `F.expr`,
`spark.sql` or `selectExpr`, and functions resolve only through the closed `FUNCTIONS` table.
Does not own parsing or typing (`compiler.expr`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Mapping

from pyspark.sql import Column
from pyspark.sql import functions as F

from common.types import ColumnType
from compiler.expr import (COMPARISON_OPS, EPOCH, FUNCTIONS, IDENTIFIER, INT_MIN, LOGICAL_OPS,
                           Between, Binary, Call, Case, ColumnRef, Expr, ExpressionError, InList,
                           IsNull, Literal, Problem, Scope, Unary, checked, common_type)

_ONE_MICRO = timedelta(microseconds=1)
_DOUBLE_2_63 = 2.0**63


def to_column(expr: Expr, scope: Scope) -> Column:
    """The expression as a PySpark Column. Column references become F.col("`stream`.`name`"),
    so each input DataFrame must be aliased with its stream name. Raises ExpressionError if the
    expression does not type-check in `scope`."""
    types, streams = checked(expr, scope)
    return _Lowering(types, streams).lower(expr)


class _Lowering:
    """Builds Column objects bottom-up from a checked tree."""

    def __init__(self, types: Mapping[int, ColumnType], streams: Mapping[int, str]):
        self.F = F
        self.types = types
        self.streams = streams

    def type(self, node: Expr) -> ColumnType:
        return self.types[id(node)]

    def lower(self, node: Expr) -> Column:
        return getattr(self, f"lower_{type(node).__name__.lower()}")(node)

    def lower_as(self, node: Expr, target: ColumnType) -> Column:
        """The node's column, cast from int to double when `target` is double."""
        col = self.lower(node)
        if target is ColumnType.DOUBLE and self.type(node) is ColumnType.INT:
            return col.cast("double")
        return col

    def int_lit(self, value: int) -> Column:
        return self.F.lit(value).cast("bigint")

    def null_of(self, t: ColumnType) -> Column:
        return self.F.lit(None).cast(t.spark_type_name())

    # -- leaves ---------------------------------------------------------------------------------

    def lower_literal(self, node: Literal) -> Column:
        F = self.F
        if node.type is ColumnType.INT:
            return self.int_lit(node.value)
        if node.type is ColumnType.DOUBLE:
            return F.lit(float(node.value))
        if node.type is ColumnType.TIMESTAMP:
            micros = (node.value - EPOCH) // _ONE_MICRO
            return F.timestamp_micros(self.int_lit(micros))
        return F.lit(node.value)

    def lower_columnref(self, node: ColumnRef) -> Column:
        stream = self.streams[id(node)]
        if not (IDENTIFIER.match(stream) and IDENTIFIER.match(node.name)):
            raise ExpressionError([Problem(node.offset, node.length,
                                           f"'{stream}.{node.name}' is not a valid column name")])
        return self.F.col(f"`{stream}`.`{node.name}`")

    # -- operators ------------------------------------------------------------------------------

    def lower_unary(self, node: Unary) -> Column:
        operand = self.lower(node.operand)
        if node.op == "not":
            return ~operand
        if self.type(node) is ColumnType.INT:
            return self.F.try_subtract(self.int_lit(0), operand)
        return -operand

    def lower_binary(self, node: Binary) -> Column:
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

    def comparison(self, op: str, a: Expr, b: Expr) -> Column:
        target = common_type([self.type(a), self.type(b)]) or self.type(a)
        left, right = self.lower_as(a, target), self.lower_as(b, target)
        return {"=": left == right, "!=": left != right, "<": left < right,
                "<=": left <= right, ">": left > right, ">=": left >= right}[op]

    def lower_between(self, node: Between) -> Column:
        inside = (self.comparison(">=", node.operand, node.low)
                  & self.comparison("<=", node.operand, node.high))
        return ~inside if node.negated else inside

    def lower_inlist(self, node: InList) -> Column:
        nodes = (node.operand, *node.items)
        target = common_type([self.type(n) for n in nodes]) or self.type(node.operand)
        value, *items = (self.lower_as(n, target) for n in nodes)
        found = value.isin(*items)
        return ~found if node.negated else found

    def lower_isnull(self, node: IsNull) -> Column:
        col = self.lower(node.operand)
        return col.isNotNull() if node.negated else col.isNull()

    def lower_case(self, node: Case) -> Column:
        target = self.type(node)
        (first, value), *rest = node.branches
        col = self.F.when(self.lower(first), self.lower_as(value, target))
        for condition, value in rest:
            col = col.when(self.lower(condition), self.lower_as(value, target))
        default = self.null_of(target) if node.default is None else \
            self.lower_as(node.default, target)
        return col.otherwise(default)

    def lower_call(self, node: Call) -> Column:
        if node.function not in FUNCTIONS:  # the checker refused it already; never getattr blind
            raise ExpressionError([Problem(node.offset, node.length,
                                           f"unknown function '{node.function}'")])
        return getattr(self, f"fn_{node.function}")(node)

    # -- functions ------------------------------------------------------------------------------

    def args(self, node: Call, target: ColumnType | None = None) -> list[Column]:
        if target is None:
            return [self.lower(a) for a in node.args]
        return [self.lower_as(a, target) for a in node.args]

    def fn_abs(self, node: Call) -> Column:
        (x,) = self.args(node)
        if self.type(node) is ColumnType.DOUBLE:
            return self.F.abs(x)
        return self.F.when(x == self.int_lit(INT_MIN), self.null_of(ColumnType.INT)) \
            .otherwise(self.F.abs(x))

    def fn_round(self, node: Call) -> Column:
        x = self.lower(node.args[0])
        written = node.args[1] if len(node.args) > 1 else None
        assert written is None or isinstance(written, Literal)  # checked: an int literal
        digits = written.value if written is not None else 0
        if self.type(node) is ColumnType.DOUBLE:
            return self.F.round(x, digits)
        if digits >= 0:
            return x
        return self.F.round(x.cast("decimal(20,0)"), digits).try_cast("bigint")

    def floor_ceil(self, node: Call, fn: Callable[[Any], Column]) -> Column:
        (x,) = self.args(node)
        if self.type(node.args[0]) is ColumnType.INT:
            return x
        in_range = (x >= self.F.lit(-_DOUBLE_2_63)) & (x < self.F.lit(_DOUBLE_2_63))
        return self.F.when(in_range, fn(x).cast("bigint")).otherwise(
            self.null_of(ColumnType.INT))

    def fn_floor(self, node: Call) -> Column:
        return self.floor_ceil(node, self.F.floor)

    def fn_ceil(self, node: Call) -> Column:
        return self.floor_ceil(node, self.F.ceil)

    def fn_sqrt(self, node: Call) -> Column:
        return self.F.sqrt(*self.args(node, ColumnType.DOUBLE))

    def fn_ln(self, node: Call) -> Column:
        return self.F.ln(*self.args(node, ColumnType.DOUBLE))

    def fn_exp(self, node: Call) -> Column:
        return self.F.exp(*self.args(node, ColumnType.DOUBLE))

    def fn_pow(self, node: Call) -> Column:
        return self.F.pow(*self.args(node, ColumnType.DOUBLE))

    def fn_least(self, node: Call) -> Column:
        return self.F.least(*self.args(node, self.type(node)))

    def fn_greatest(self, node: Call) -> Column:
        return self.F.greatest(*self.args(node, self.type(node)))

    def fn_lower(self, node: Call) -> Column:
        return self.F.lower(*self.args(node))

    def fn_upper(self, node: Call) -> Column:
        return self.F.upper(*self.args(node))

    def fn_length(self, node: Call) -> Column:
        return self.F.length(*self.args(node)).cast("bigint")

    def fn_concat(self, node: Call) -> Column:
        return self.F.concat(*self.args(node))

    def fn_substring(self, node: Call) -> Column:
        s, pos, length = self.args(node)
        return self.F.substring(s, pos.try_cast("int"), length.try_cast("int"))

    def fn_starts_with(self, node: Call) -> Column:
        return self.F.startswith(*self.args(node))

    def fn_ends_with(self, node: Call) -> Column:
        return self.F.endswith(*self.args(node))

    def fn_contains(self, node: Call) -> Column:
        return self.F.contains(*self.args(node))

    def fn_replace(self, node: Call) -> Column:
        return self.F.replace(*self.args(node))

    def fn_split_part(self, node: Call) -> Column:
        s, delimiter, n = self.args(node)
        part = n.try_cast("int")  # Spark refuses part 0 with an error: it is null here
        return self.F.when(part != 0, self.F.split_part(s, delimiter, part)).otherwise(
            self.null_of(ColumnType.STRING))

    def pattern(self, node: Call) -> str:
        """The pattern argument: a string literal the checker accepted (compiler.expr.regex),
        handed to Spark as a literal, never as code."""
        written = node.args[1]
        assert isinstance(written, Literal) and isinstance(written.value, str)
        return written.value

    def fn_regexp_like(self, node: Call) -> Column:
        return self.lower(node.args[0]).rlike(self.pattern(node))

    def fn_regexp_extract(self, node: Call) -> Column:
        s, group = self.lower(node.args[0]), node.args[2]
        assert isinstance(group, Literal)  # checked: an int literal naming a group
        pattern = self.pattern(node)
        return self.F.when(s.rlike(pattern), self.F.regexp_extract(s, pattern, group.value))

    def fn_coalesce(self, node: Call) -> Column:
        return self.F.coalesce(*self.args(node, self.type(node)))

    # Time fields are computed from the epoch value, so they are UTC whatever the session's
    # time zone is (Spark's hour()/year() would use spark.sql.session.timeZone).

    def seconds(self, node: Call) -> Column:
        return self.F.unix_seconds(self.lower(node.args[0]))

    def floor_div(self, col: Column, n: int) -> Column:
        """Exact floor(col / n) for bigint col and positive n."""
        return ((col - self.F.pmod(col, self.int_lit(n))) / n).cast("bigint")

    def utc_date(self, node: Call) -> Column:
        days = self.floor_div(self.seconds(node), 86400)
        return self.F.date_from_unix_date(days.cast("int"))

    def fn_unix_seconds(self, node: Call) -> Column:
        return self.seconds(node)

    def fn_year(self, node: Call) -> Column:
        return self.F.year(self.utc_date(node)).cast("bigint")

    def fn_month(self, node: Call) -> Column:
        return self.F.month(self.utc_date(node)).cast("bigint")

    def fn_day(self, node: Call) -> Column:
        return self.F.dayofmonth(self.utc_date(node)).cast("bigint")

    def fn_hour(self, node: Call) -> Column:
        return self.floor_div(self.F.pmod(self.seconds(node), self.int_lit(86400)), 3600)

    def fn_minute(self, node: Call) -> Column:
        return self.floor_div(self.F.pmod(self.seconds(node), self.int_lit(3600)), 60)

    def fn_second(self, node: Call) -> Column:
        return self.F.pmod(self.seconds(node), self.int_lit(60))

    def fn_to_int(self, node: Call) -> Column:
        (x,) = self.args(node)
        return x if self.type(node.args[0]) is ColumnType.INT else x.try_cast("bigint")

    def fn_to_double(self, node: Call) -> Column:
        (x,) = self.args(node)
        return x.try_cast("double")

    def fn_to_string(self, node: Call) -> Column:
        (x,) = self.args(node)
        if self.type(node.args[0]) is ColumnType.TIMESTAMP:
            return self.timestamp_text(x)
        return x.cast("string")

    def timestamp_text(self, ts: Column) -> Column:
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
