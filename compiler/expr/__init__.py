"""The closed expression language of dataflow specs (filter conditions, computed columns,
splitter predicates, control tuples' conditions): its one public face, `from compiler import
expr`.

Pure: text -> tokens (`lexer`) -> AST (`parser`, nodes in `ast`) -> types (`checker`), every
problem reported with its offset, lengths and nesting bounded. User text is never code: nothing
here calls eval/exec, and function names resolve only through the closed `FUNCTIONS` table.
Imports no Spark. The semantics (nulls, overflow, division by zero, NaN ordering, rounding,
casts) are in docs/expressions.md; the executor lowers a checked tree to Spark
(`executor.expression_lowering`), and tests/expression_oracle.py is the plain-Python oracle the
tests check that lowering against. Does not own column types and schemas (`common.types`),
mapping offsets to file positions (`compiler.validate`, with `ParamDecl.value_pos`) or aliasing
input DataFrames with their stream names (the runtime does `df.alias(stream)`).
"""

from compiler.expr.ast import (ARITHMETIC_OPS, BINARY_OPS, COMPARISON_OPS, EPOCH, FUNCTIONS,
                               IDENTIFIER, INT_MAX, INT_MIN, KEYWORDS, LOGICAL_OPS, MAX_DEPTH,
                               MAX_TEXT_LENGTH, ROUND_DIGITS, Between, Binary, Call, Case,
                               ColumnRef, Expr, ExpressionError, FunctionSig, InList, IsNull,
                               Literal, Problem, Scope, TypedExpr, Unary, children, closest,
                               did_you_mean, guard_depth, too_deep, walk)
from compiler.expr.checker import (NotBoolean, check, checked, common_type, compile_condition,
                                   compile_expression, literal_problem)
from compiler.expr.lexer import Token, tokenize
from compiler.expr.parser import parse, parse_timestamp
from compiler.expr.regex import MAX_PATTERN_LENGTH, MAX_REPEAT, RegexProblem, check_regex

__all__ = [
    "ARITHMETIC_OPS", "BINARY_OPS", "COMPARISON_OPS", "EPOCH", "FUNCTIONS", "IDENTIFIER",
    "INT_MAX", "INT_MIN", "KEYWORDS", "LOGICAL_OPS", "MAX_DEPTH", "MAX_TEXT_LENGTH",
    "ROUND_DIGITS", "Between", "Binary", "Call", "ColumnRef", "Expr", "ExpressionError",
    "FunctionSig", "InList", "IsNull", "Literal", "Case", "Problem", "Scope", "TypedExpr",
    "Unary",
    "children", "closest", "did_you_mean", "guard_depth", "too_deep", "walk", "NotBoolean",
    "check", "checked", "common_type", "compile_condition", "compile_expression",
    "literal_problem", "Token", "tokenize", "parse", "parse_timestamp", "MAX_PATTERN_LENGTH",
    "MAX_REPEAT", "RegexProblem", "check_regex",
]
