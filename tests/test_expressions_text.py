"""The expression language's `case` and text functions (replace, split_part, regexp_like,
regexp_extract) and its regular-expression checker (compiler/expr/regex.py).

Pure tests of parsing, typing and located errors; a seeded fuzz test of the new syntax (a
located ExpressionError or a typed tree, never another exception); an attacker's tests (ReDoS
patterns refused with the reason, quotes and escapes cannot leave a string, nothing is executed);
and one Spark-layer test (the shared session) of every new form against the plain-Python oracle
(tests/expression_oracle.py), which runs patterns with Python's `re` read as Java reads them.
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

import pytest

from common.types import ColumnType, Schema
from compiler.expr import (MAX_PATTERN_LENGTH, Case, ExpressionError, Literal, Scope,
                           check_regex, walk,
                           compile_condition, compile_expression, parse)
from tests import expression_oracle as oracle
from tests.expression_oracle import evaluate, from_json, render, to_json

BID = Schema.of(("url", "string"), ("channel", "string"), ("price", "int"), ("x", "double"),
                ("n", "int"))
SCOPE = Scope({"bid": BID})
URL = "https://www.nexmark.com/channel-7/item.htm?query=1&channel_id=42"


def value(text: str, **row: Any) -> Any:
    typed = compile_expression(text, SCOPE)
    full = {"url": URL, "channel": "Apple", "price": 5, "x": 2.5, "n": 3, **row}
    return evaluate(typed.expr, {"bid": full}, SCOPE)


def problems(text: str) -> list[tuple[int, str]]:
    with pytest.raises(ExpressionError) as info:
        compile_expression(text, SCOPE)
    return [(p.offset, p.message) for p in info.value.problems]


# --- case -------------------------------------------------------------------------------------

def test_case_takes_the_first_true_branch_and_null_counts_as_not_true() -> None:
    text = "case when price > 10 then 'big' when price > 1 then 'mid' else 'small' end"
    assert [value(text, price=p) for p in (20, 5, 0, None)] == ["big", "mid", "small", "small"]
    assert value("case when price > 10 then 1 end", price=5) is None
    assert value("case when price > 10 then 1 else 2.5 end", price=20) == 1.0  # int -> double
    assert compile_expression("case when n > 0 then n else x end", SCOPE).type \
        is ColumnType.DOUBLE


def test_case_binds_as_a_value_and_nests() -> None:
    tree = parse("1 + case when a then 2 else 3 end * 4")
    assert render(tree) == "1 + case when a then 2 else 3 end * 4"
    nested = parse("case when a then case when b then 1 end else 0 end")
    assert isinstance(nested, Case) and isinstance(nested.branches[0][1], Case)
    assert (nested.offset, nested.length) == (0, 50)
    for text in ("case when a > 1 then 'x' when b then 'y' else 'z' end",
                 "case when a then case when b then 1 end end + 2", "-case when a then 1 end"):
        e = parse(text)
        assert parse(render(e)) == e and from_json(to_json(e)) == e


@pytest.mark.parametrize("text, offset, fragment", [
    ("case a end", 5, "expected 'when'"),
    ("case when a then b", 18, "'when', 'else' or 'end'"),
    ("case when a b end", 12, "'then' after the condition"),
    ("case end", 5, "expected 'when'"),
    ("then", 0, "expected a value"),
    ("case when a then 1 end end", 23, "expected an operator or end"),
])
def test_case_syntax_errors_are_located(text: str, offset: int, fragment: str) -> None:
    with pytest.raises(ExpressionError) as info:
        parse(text)
    (problem,) = info.value.problems
    assert problem.offset == offset and fragment in problem.message


def test_case_type_errors_are_all_reported_where_they_are() -> None:
    found = problems("case when price then 1 when channel = 'a' then 'x' when url then 2 end")
    assert found == [
        (10, "the condition of 'when' must be boolean but is int"),
        (47, "the values of 'case' must have one type: this one is string but the first is int"),
        (56, "the condition of 'when' must be boolean but is string")]
    assert problems("case when price > 1 then nope end")[0][0] == 25
    with pytest.raises(ExpressionError, match="condition must be boolean"):
        compile_condition("case when price > 1 then 1 else 0 end", SCOPE)


def test_case_words_are_keywords_but_still_columns_after_a_dot() -> None:
    assert problems("end > 1")[0][0] == 0
    scope = Scope({"w": Schema.of(("end", "int"))})
    assert compile_expression("w.end + 1", scope).type is ColumnType.INT


def test_case_is_refused_in_a_pattern() -> None:
    from compiler.expr.pattern import PatternScope, compile_define
    scope = PatternScope("bid", BID, ("A", "B"))
    with pytest.raises(ExpressionError, match="'case' is not available in a pattern"):
        compile_define("case when price > 1 then true else false end", scope)
    with pytest.raises(ExpressionError, match="'regexp_like' is not available"):
        compile_define("regexp_like(url, 'a')", scope)


# --- text functions ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("replace(url, 'channel', 'c')", URL.replace("channel", "c")),
    ("replace('aaa', 'aa', 'b')", "ba"),
    ("replace('abc', '', 'x')", "abc"),
    ("length(url) - length(replace(url, 'c', ''))", URL.count("c")),
    ("split_part(url, '/', 4)", "channel-7"),
    ("split_part(url, '/', -1)", "item.htm?query=1&channel_id=42"),
    ("split_part('a//b', '/', 2)", ""),
    ("split_part('a/b', '/', 3)", ""),
    ("split_part('a/b', '/', -3)", ""),
    ("split_part('a/b', '/', 0)", None),
    ("split_part('a/b', '', 1)", "a/b"),
    ("split_part('a.b', '.', 2)", "b"),
    ("split_part('a/b', '/', 4294967297)", None),
    ("regexp_like(url, 'channel_id=[0-9]+$')", True),
    ("regexp_like(url, '^channel')", False),
    ("regexp_like('a.b', 'a\\\\.b')", True),
    ("regexp_like('axb', 'a\\\\.b')", False),
    ("regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)", "42"),
    ("regexp_extract(url, '(&|^)channel_id=([^&]*)', 0)", "&channel_id=42"),
    ("regexp_extract('abc', 'x(y)?', 1)", None),
    ("regexp_extract('abc', 'b(y)?', 1)", ""),
    ("regexp_extract('a1b22c333', '[0-9]{2,}', 0)", "22"),
    ("regexp_extract('aaa', 'a+?', 0)", "a"),
    ("regexp_like('ab\\n', 'b$')", True),
    ("regexp_like('a\\nb', 'a.b')", False),
])
def test_text_functions(text: str, expected: Any) -> None:
    assert value(text) == expected


def test_text_functions_give_null_for_null() -> None:
    for text in ("replace(url, 'a', 'b')", "split_part(url, '/', 1)", "regexp_like(url, 'a')",
                 "regexp_extract(url, 'a', 0)", "split_part('a', '/', n)"):
        assert value(text, url=None, n=None) is None, text


@pytest.mark.parametrize("text, offset, fragment", [
    ("regexp_like(url, channel)", 17, "the pattern must be a string written out"),
    ("regexp_like(url, concat('a', 'b'))", 17, "the pattern must be a string written out"),
    ("regexp_like(price, 'a')", 12, "expected string but found int"),
    ("regexp_extract(url, 'a(b)', 2)", 28, "the pattern has 1 group, so the group is 0"),
    ("regexp_extract(url, 'a(b)', n)", 28, "the group must be a whole number written out"),
    ("regexp_extract(url, 'ab')", 0, "takes 3 arguments but got 2"),
    ("split_part(url, '/', 'x')", 21, "expected int but found string"),
    ("replace(url, 'a')", 0, "takes 3 arguments but got 2"),
])
def test_text_function_errors_are_located(text: str, offset: int, fragment: str) -> None:
    (found,) = problems(text)
    assert found[0] == offset and fragment in found[1], found


def test_every_problem_is_reported_at_once() -> None:
    found = problems("regexp_like(url, '(a+)+') and regexp_like(nope, '\\\\1') "
                     "and case when price then 1 end > 0")
    assert [offset for offset, _ in found] == [17, 42, 69], found


# --- regular expressions: the checker -----------------------------------------------------------

ACCEPTED = ["(&|^)channel_id=([^&]*)", "[a-z]+@[a-z]+\\.com", "^\\d{3}-\\d{4}$", "(?:ab|cd)*",
            ".*a.*b", "a*?b", "[\\d\\-x]+", "(a|b)+c", "\\(\\)\\[\\]\\{\\}", "x{0,1000}",
            "[^/]+/", "é+", "a b#c"]
REDOS = {  # pattern -> why it is refused
    "(a+)+$": "contains another quantifier",
    "(a*)*": "contains another quantifier",
    "(x+x+)+y": "contains another quantifier",
    "(\\w+\\s?)*$": "contains another quantifier",
    "^(([a-z])+.)+[A-Z]([a-z])+$": "contains another quantifier",
    "(.*a){12}": "contains another quantifier",
    "(a|aa)+$": "can start with the same character",
    "(a|a?)+": "contains another quantifier",
    "(\\d|[0-9a])*x": "can start with the same character",
    "(.|\\n)*": "can start with the same character",
    "(x(a|ab))*": "can start with the same character",
    "(^)*": "can match nothing",
    "(a)\\1": "backreferences",
    "(?<n>a)\\k<n>": "named groups",
    "(?=a)a": "lookaround",
    "(?<!a)b": "lookaround",
    "(?i)a": "inline flags",
    "(?>a+)b": "inline flags",
    "a*+": "possessive",
    "a**": "cannot follow a quantifier",
    "a{1001}": "limited to 1000",
    "a{3,2}": "upper count is below",
    "[a&&b]": "class intersection",
    "[[a]]": "Java would read a nested class",
    "\\bx": "is not supported",
    "a)": "without a matching '('",
    "(a": "is not closed",
    "[a": "is not closed",
    "*a": "nothing to repeat",
    "x{": "repetition count is written",
    "a}": "write \\}",
    "a\\": "lone backslash",
}


@pytest.mark.parametrize("pattern", ACCEPTED)
def test_accepted_patterns(pattern: str) -> None:
    groups, found = check_regex(pattern)
    assert found == []
    assert groups == re.compile(pattern).groups


@pytest.mark.parametrize("pattern, why", sorted(REDOS.items()))
def test_refused_patterns_say_why(pattern: str, why: str) -> None:
    _, found = check_regex(pattern)
    assert found and why in found[0].message, found
    text = f"regexp_like(url, {oracle.quote_string(pattern)})"
    (problem,) = problems(text)
    assert problem[0] == 17 and "the pattern is refused at character" in problem[1]


def test_pattern_length_is_bounded() -> None:
    assert check_regex("a" * MAX_PATTERN_LENGTH)[1] == []
    _, found = check_regex("a" * (MAX_PATTERN_LENGTH + 1))
    assert "limit is 256" in found[0].message


# --- fuzz ----------------------------------------------------------------------------------------

FUZZ_TOKENS = ["case", "when", "then", "else", "end", "price", "url", "channel", "n", "x", "1",
               "2.5", "'a'", "'\\\\d+'", "'(a+)+'", "'(&|^)c=([^&]*)'", ">", "=", "+", "and",
               "or", "not", "(", ")", ",", "regexp_like(", "regexp_extract(", "split_part(",
               "replace(", "length(", "is null", "'", "\\", "0", "-1"]


def test_fuzzed_text_gives_a_typed_tree_or_located_problems() -> None:
    rng = random.Random(37)
    typed = 0
    for _ in range(4000):
        text = " ".join(rng.choice(FUZZ_TOKENS) for _ in range(rng.randint(1, 14)))
        try:
            compiled = compile_expression(text, SCOPE)
        except ExpressionError as error:
            assert error.problems
            assert all(0 <= p.offset <= len(text) and p.message for p in error.problems), text
            continue
        typed += 1
        assert parse(render(compiled.expr)) == compiled.expr, text
        evaluate(compiled.expr, {"bid": {"url": URL, "channel": "c", "price": 1, "x": 0.5,
                                         "n": 2}}, SCOPE)
    assert typed > 50  # the fuzz reaches the checker and the evaluator, not only the parser


def test_fuzzed_patterns_are_refused_or_fast() -> None:
    """Every pattern the checker accepts compiles in Python's re read as Java (the oracle) and
    runs over adversarial text quickly (re backtracks as Java's engine does)."""
    rng = random.Random(2026)
    alphabet = list("ab") * 4 + list("()|*+?{}[]^$.\\-,0123") + ["(?:", "{2,}", "\\d"]
    adversarial = ["a" * 28 + "!", "ab" * 14 + "!", "a" * 14 + "b" * 14 + "\n!"]
    accepted = 0
    for _ in range(6000):
        pattern = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14)))
        groups, found = check_regex(pattern)
        if found:
            assert all(0 <= p.position <= len(pattern) for p in found)
            continue
        accepted += 1
        compiled = oracle.java_regex(pattern)
        assert compiled.groups == groups, pattern
        started = time.monotonic()
        for text in adversarial:
            compiled.search(text)
        assert time.monotonic() - started < 0.5, pattern
    assert accepted > 300


# --- the attacker ---------------------------------------------------------------------------------

BREAKOUTS = [
    "regexp_like(url, 'a') or true or ('')",
    "regexp_like(url, 'a\\') or true or (\\'')",
    "regexp_like(url, \"a'); java.lang.Runtime.getRuntime().exec('x\")",
    "split_part(url, '/', 1) = '' or '1' = '1",
    "regexp_like(url, '\\Q.*\\E')",
]


@pytest.mark.parametrize("text", BREAKOUTS)
def test_quotes_and_escapes_cannot_leave_a_string(text: str) -> None:
    try:
        typed = compile_expression(text, SCOPE)
    except ExpressionError as error:
        assert error.problems and all(p.message for p in error.problems)
        return
    # what compiles is exactly the calls and literals written: no string became structure
    literals = [n.value for n in walk(typed.expr) if isinstance(n, Literal)]
    assert render(typed.expr) == render(parse(render(typed.expr)))
    assert all(isinstance(v, (str, int, bool)) for v in literals)


def test_a_java_quoting_escape_is_refused_not_interpreted() -> None:
    _, found = check_regex("\\Q(a+)+\\E")
    assert found and "not supported" in found[0].message


# --- Spark ----------------------------------------------------------------------------------------

SPARK_ROWS = [
    (URL, "Apple", 5, 2.5, 3),
    ("https://www.nexmark.com/Google/item.htm?query=1", "Google", 2_000_000, -1.0, -1),
    ("a//b/\n", "channel-1", None, None, 0),
    (None, None, 7, 0.0, None),
    ("ab\r\n", "ÄÖ straße", -3, 1e10, 4),
    ("x\u2028", "", 0, float("nan"), 2),
]
SPARK_EXPRESSIONS = [
    "case when price > 10 then 'big' when price > 1 then 'mid' else 'small' end",
    "case when lower(channel) = 'apple' then 0 when channel = 'Google' then x end",
    "case when n > 0 then n else x end", "case when n is null then 'none' end",
    "replace(url, '/', '|')", "replace(url, '', 'x')", "replace(channel, 'a', '')",
    "length(url) - length(replace(url, 'c', ''))",
    "split_part(url, '/', 1)", "split_part(url, '/', 4)", "split_part(url, '/', -1)",
    "split_part(url, '/', -5)", "split_part(url, '', 1)", "split_part(url, '/', n)",
    "split_part(url, '.', 2)",
    "regexp_like(url, 'channel_id=[0-9]+$')", "regexp_like(url, 'b$')", "regexp_like(url, 'x.')",
    "regexp_like(url, '^https?://[^/]+/[A-Za-z]+/')", "regexp_like(channel, '\\\\s')",
    "regexp_like(channel, '\\\\w+')", "regexp_like(url, '')",
    "regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)",
    "regexp_extract(url, '(&|^)channel_id=([^&]*)', 1)",
    "regexp_extract(url, '/([a-zA-Z]+)(-([0-9]))?/', 3)",
    "regexp_extract(url, '[0-9]{1,2}', 0)", "regexp_extract(url, '.$', 0)",
    "regexp_extract(url, 'b(x)?', 1)", "regexp_extract(url, '\\\\.([a-z]+)\\\\?', 1)",
    "regexp_extract(channel, '[^a-z ]+', 0)",
    "regexp_like(url, 'a\\'; DROP TABLE x; --')",
    "regexp_like(url, 'item\\\\.htm\\\\?query=1$')",
]


@pytest.mark.spark
def test_spark_agrees_with_the_python_oracle(spark: Any) -> None:
    from tests.test_expressions import mismatches_of, spark_against_oracle

    typed, expected, collected = spark_against_oracle(spark, "bid", BID, SPARK_ROWS,
                                                      SPARK_EXPRESSIONS)
    assert mismatches_of(typed, expected, collected) == []
    assert collected[0][SPARK_EXPRESSIONS.index(
        "regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)")] == "42"  # checked by hand
