"""The plain-Python oracle of the expression language: what the tests compare Spark with.

Owns, for tests only: canonical rendering (`render`: parse(render(e)) == e), the AST as JSON
(`to_json`/`from_json`, validated), `referenced_columns`, and `evaluate`/`evaluator`, which
compute an expression over one row with Spark's semantics, each rule of docs/expressions.md
written out independently of the lowering (`executor.expression_lowering`). Nothing in the
product calls any of this: tests/test_expressions.py checks Spark against it.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any, Callable, Mapping

from common.types import ColumnType
from compiler.expr import (BINARY_OPS, COMPARISON_OPS, EPOCH, FUNCTIONS, IDENTIFIER, INT_MAX,
                           INT_MIN, KEYWORDS, MAX_DEPTH, Between, Binary, Call, Case, ColumnRef,
                           Expr,
                           ExpressionError, InList, IsNull, Literal, Problem, Scope, Unary,
                           checked, guard_depth, literal_problem, parse_timestamp, walk)

Row = Mapping[str, Mapping[str, object]]
_COMPARISON_LEVEL = 4  # the parser's precedence levels (compiler.expr.parser)
_UNARY_LEVEL = 7
_ONE_MICRO = timedelta(microseconds=1)

# ================================================================================== render ==

_LEVEL_OF_OP = {"or": 1, "and": 2, **{op: 4 for op in COMPARISON_OPS},
                "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}


def render(expr: Expr) -> str:
    """Canonical text of `expr`: lower-case keywords, minimal parentheses, `=` and `!=`.
    parse(render(e)) == e."""
    guard_depth(expr)
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
    if isinstance(node, Case):
        branches = " ".join(f"when {_render(c)} then {_render(v)}" for c, v in node.branches)
        default = f" else {_render(node.default)}" if node.default is not None else ""
        return f"case {branches}{default} end"
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
    guard_depth(expr)
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
    if isinstance(node, Case):
        return {"kind": "case", "branches": [[_to_json(c), _to_json(v)] for c, v in node.branches],
                "default": None if node.default is None else _to_json(node.default)}
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
    problem = literal_problem(value, t)
    if problem:
        raise _json_fail(path, problem)
    return Literal(value, t)


def _json_column(d: dict[str, Any], path: str, depth: int) -> Expr:
    stream, name = d.get("stream"), d["name"]
    for part in (stream, name):
        if part is not None and (not isinstance(part, str) or not IDENTIFIER.match(part)):
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


def _json_case(d: dict[str, Any], path: str, depth: int) -> Expr:
    branches = d["branches"]
    if not isinstance(branches, list) or not branches:
        raise _json_fail(f"{path}.branches", "expected a non-empty list")
    pairs = []
    for i, pair in enumerate(branches):
        where = f"{path}.branches[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise _json_fail(where, "expected [condition, value]")
        pairs.append((_from_json(pair[0], f"{where}[0]", depth + 1),
                      _from_json(pair[1], f"{where}[1]", depth + 1)))
    default = None if d.get("default") is None else _sub(d, "default", path, depth)
    return Case(tuple(pairs), default)


_JSON_BUILDERS: dict[str, Callable[[dict[str, Any], str, int], Expr]] = {
    "literal": _json_literal, "column": _json_column, "unary": _json_unary,
    "binary": _json_binary, "between": _json_between, "in": _json_in,
    "is_null": _json_is_null, "call": _json_call, "case": _json_case,
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
    micros = (_as_utc(ts) - EPOCH) // _ONE_MICRO
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


def replace_text(s: str, search: str, replacement: str) -> str:
    """Spark's replace: every occurrence, left to right; an empty search changes nothing."""
    return s if search == "" else s.replace(search, replacement)


def split_part(s: str, delimiter: str, n: int) -> str | None:
    """Spark's split_part at a plain-text delimiter (an empty one does not split): 1-based,
    negative from the end, '' past either end; part 0 and parts outside 32 bits are null."""
    if n == 0 or not -(2**31) <= n < 2**31:
        return None
    parts = s.split(delimiter) if delimiter else [s]
    index = n - 1 if n > 0 else len(parts) + n
    return parts[index] if 0 <= index < len(parts) else ""


# Java's line terminators: `.` matches none of them; `$` matches at the end of the text and
# before one final terminator (\r\n counts as one; not between its \r and \n).
_JAVA_DOT = r"[^\n\r\x85\u2028\u2029]"
_JAVA_DOLLAR = r"(?:(?=\r\n\Z)|(?<!\r)(?=\n\Z)|(?=[\r\x85\u2028\u2029]\Z)|\Z)"


def java_regex(pattern: str) -> "re.Pattern[str]":
    """A checked pattern (compiler.expr.regex) as Python `re` with Java's meaning: `.` and `$`
    as Java reads them without flags, \\d \\w \\s over ASCII only."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
            out.append(ch)
        elif ch == "[":
            in_class = True
            out.append(ch)
            if pattern[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
        else:
            out.append(_JAVA_DOT if ch == "." else _JAVA_DOLLAR if ch == "$" else ch)
        i += 1
    return re.compile("".join(out), re.ASCII)


def regexp_extract(s: str, pattern: str, group: int) -> str | None:
    found = java_regex(pattern).search(s)
    if found is None:
        return None
    part = found.group(group)
    return "" if part is None else part


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
    "replace": replace_text,
    "split_part": split_part,
    "regexp_like": lambda s, p: java_regex(p).search(s) is not None,
    "regexp_extract": regexp_extract,
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
    guard_depth(expr)
    types: dict[int, ColumnType] = {}
    streams: dict[int, str] = {}
    if scope is not None:
        types, streams = checked(expr, scope)
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

    def case(self, node: Case) -> Any:
        for condition, result in node.branches:
            if self.value(condition) is True:
                return self.value(result)
        return None if node.default is None else self.value(node.default)

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
    IsNull: _Evaluator.is_null, Call: _Evaluator.call, Case: _Evaluator.case,
}
