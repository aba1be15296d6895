"""Tests of the pattern operator's pure parts: the pattern syntax (`compiler.expr.pattern`), the
conditions' and measures' typing, the row evaluator (`executor.cep.row_eval`, against the expression
language's oracle tests/expression_oracle.py) and the matcher (`executor.cep.match`, against the
independent backtracking matcher tests/cep_oracle.py on thousands of seeded random streams,
with late rows, the time bound, overlapping candidates and the state store's JSON round trip).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Callable

import pytest

from common.types import ColumnType, Schema
from compiler import expr as ex
from compiler.expr import pattern as pt
from executor.cep.row_eval import MatchView, evaluate
from executor.cep.match import KeyMatcher, PatternOverflow, build_program, measures
from tests import cep_oracle, expression_oracle
from tests.test_expressions import random_expr

SCHEMA = Schema.of(("k", "string"), ("ts", "int"), ("price", "double"), ("volume", "int"))
VARS = ("A", "B", "C")

# ======================================================================== pattern syntax ==


@pytest.mark.parametrize("text,rendered", [
    ("A B+ C D+", "A B+ C D+"), ("(A | B) C*", "(A | B) C*"), ("A (B C)+ D?", "A (B C)+ D?"),
    ("  A\tB  ", "A B"), ("A | B C | D", "A | B C | D"), ("((A))", "A"),
])
def test_patterns_parse_and_render(text: str, rendered: str) -> None:
    tree = pt.parse_pattern(text)
    assert pt.render(tree) == rendered
    assert pt.parse_pattern(pt.render(tree)) == tree


@pytest.mark.parametrize("text,offset,message", [
    ("", 0, "empty"), ("A* B?", 0, "no rows at all"), ("A (B?)+", 2, "repeats a part"),
    ("A B ++", 5, "'+' after '+'"), ("(A B", 4, "expected ')'"), ("A | ", 4, "must not be "),
    ("A 1", 2, "unexpected '1'"), ("A)", 1, "closes no"), ("A+?", 2, "'?' after '+'"),
    ("(" * 17 + "A" + ")" * 17, 16, "nest more than"), ("A " * 65, 128, "at most 64"),
    ("A and+", 2, "is a keyword"),
])
def test_bad_patterns_are_refused_where_they_go_wrong(text: str, offset: int,
                                                      message: str) -> None:
    with pytest.raises(ex.ExpressionError) as info:
        pt.parse_pattern(text)
    first = info.value.problems[0]
    assert (first.offset, message in str(info.value)) == (offset, True), str(info.value)


def test_pattern_syntax_fuzz_every_refusal_located() -> None:
    rng = random.Random(1505)
    alphabet = ["A", "B", "C", "x1", " ", "(", ")", "|", "+", "*", "?", "1", "$", "é", "AB"]
    accepted = refused = 0
    for _ in range(4000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        try:
            tree = pt.parse_pattern(text)
        except ex.ExpressionError as exc:
            refused += 1
            assert exc.problems, text
            for p in exc.problems:
                assert 0 <= p.offset <= len(text) and p.length >= 0 and p.message, (text, p)
            continue
        accepted += 1
        assert not pt.nullable(tree)
        assert pt.parse_pattern(pt.render(tree)) == tree, text
    assert accepted > 100 and refused > 100


# ============================================================== conditions and measures ==

SCOPE = pt.PatternScope("s", SCHEMA, ("A", "B"))


@pytest.mark.parametrize("text,kind", [
    ("price < prev(price)", ColumnType.BOOLEAN),
    ("price > first(A.price) and count(B) < 3", ColumnType.BOOLEAN),
    ("s.price >= B.price", ColumnType.BOOLEAN),
    ("max(B.volume) between 1 and least(volume, 9)", ColumnType.BOOLEAN),
])
def test_conditions_type_check(text: str, kind: ColumnType) -> None:
    assert pt.compile_define(text, SCOPE).type is kind


@pytest.mark.parametrize("text,offset,message", [
    ("price", 0, "must be boolean"),
    ("prev(A.price) > 1", 5, "prev reads the row before"),
    ("first(Z.price) > 1", 6, "unknown pattern variable 'Z'"),
    ("count(price) > 1", 0, "count takes one pattern variable"),
    ("min(price, volume) > 1", 0, "takes one column"),
    ("sqrt(price) > 1", 0, "not available in a pattern"),
    ("last(A.prize) > 1", 5, "unknown column 'prize'"),
    ("volume > 1 and prce > 2", 15, "unknown column 'prce'"),
    ("frist(price) > 1", 0, "unknown function 'frist'"),
])
def test_bad_conditions_are_refused_with_their_place(text: str, offset: int,
                                                     message: str) -> None:
    with pytest.raises(ex.ExpressionError) as info:
        pt.compile_define(text, SCOPE)
    assert any(p.offset == offset and message in str(p) for p in info.value.problems), \
        str(info.value)


def test_measures_have_no_prev_and_type_their_navigation() -> None:
    assert pt.compile_measure("first(A.ts)", SCOPE).type is ColumnType.INT
    assert pt.compile_measure("max(B.price) - A.price", SCOPE).type is ColumnType.DOUBLE
    assert pt.compile_measure("count()", SCOPE).type is ColumnType.INT
    with pytest.raises(ex.ExpressionError, match="unknown function 'prev'"):
        pt.compile_measure("prev(price)", SCOPE)


def test_condition_fuzz_every_refusal_located() -> None:
    rng = random.Random(77)
    parts = ["price", "prev(", "first(", "A.", "B.", "count(", ")", " > ", " and ", "1",
             "'x'", "max(", "C.", ",", "volume", " ", "(", "sqrt(", "s.", "not "]
    for _ in range(3000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 10)))
        try:
            typed = pt.compile_define(text, SCOPE)
        except ex.ExpressionError as exc:
            for p in exc.problems:
                assert 0 <= p.offset <= len(text) and p.message, (text, p)
        else:
            assert typed.type is ColumnType.BOOLEAN


# ================================================================= evaluator vs oracle ==

ONE = Schema.of(("a", "int"), ("b", "double"), ("temp", "double"))


def test_row_evaluator_agrees_with_the_expression_oracle() -> None:
    rng = random.Random(4242)
    scope = ex.Scope({"raw": ONE})
    compared = 0
    for _ in range(6000):
        tree = random_expr(rng, 4)
        if any(isinstance(n, ex.Call) and n.function not in pt.ROW_FUNCTIONS
               for n in ex.walk(tree)):
            continue
        try:
            ex.check(tree, scope)
        except ex.ExpressionError:
            continue
        row = {"a": rng.choice([None, 0, 3, -7, 2**62]),
               "b": rng.choice([None, 0.0, -1.5, math.nan, 1e308]),
               "temp": rng.choice([None, 2.5, -0.0])}
        want = expression_oracle.evaluate(tree, {"raw": row}, scope)
        got = evaluate(tree, MatchView([row], ["A"], "raw"))
        assert _same(got, want), (expression_oracle.render(tree), row, got, want)
        compared += 1
    assert compared > 300


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return type(a) is type(b) and a == b


# ========================================================= matcher vs backtracking oracle ==

Cond = tuple[str, Callable[[list[dict], list[str]], bool]]


def _last_of(rows: list[dict], labels: list[str], var: str) -> Any:
    values = [r["price"] for r, v in zip(rows, labels) if v == var]
    return values[-1] if values else None


def _first_of(rows: list[dict], labels: list[str], var: str) -> Any:
    values = [r["price"] for r, v in zip(rows, labels) if v == var]
    return values[0] if values else None


def _random_condition(rng: random.Random, names: tuple[str, ...]) -> Cond:
    var = rng.choice(names)
    limit = rng.choice([2.0, 3.0, 4.0])
    options: list[Cond] = [
        ("price > prev(price)",
         lambda rows, lb: len(rows) > 1 and rows[-1]["price"] > rows[-2]["price"]),
        ("price < prev(price)",
         lambda rows, lb: len(rows) > 1 and rows[-1]["price"] < rows[-2]["price"]),
        (f"price >= {limit}", lambda rows, lb: rows[-1]["price"] >= limit),
        (f"price < first({var}.price)",
         lambda rows, lb: (_first_of(rows, lb, var) is not None
                           and rows[-1]["price"] < _first_of(rows, lb, var))),
        (f"price > last({var}.price) or volume = 1",
         lambda rows, lb: rows[-1]["volume"] == 1 or (
             _last_of(rows, lb, var) is not None and rows[-1]["price"] > _last_of(rows, lb, var))),
        (f"count({var}) <= 2", lambda rows, lb: lb.count(var) <= 2),
        ("volume % 2 = 0", lambda rows, lb: rows[-1]["volume"] % 2 == 0),
    ]
    return rng.choice(options)


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    def item() -> str:
        if depth < 2 and rng.random() < 0.2:
            return "(" + _random_pattern(rng, depth + 1) + ")" + rng.choice(["", "+", "*", "?"])
        return rng.choice(VARS) + rng.choice(["", "", "+", "*", "?"])
    seq = " ".join(item() for _ in range(rng.randint(1, 3)))
    return seq if rng.random() < 0.8 else seq + " | " + item()


def _random_stream(rng: random.Random) -> list[list[dict]]:
    """Batches of rows of one key: times mostly rising, some ties and stragglers."""
    batches, ts = [], 0
    for _ in range(rng.randint(1, 6)):
        batch = []
        for _ in range(rng.randint(0, 8)):
            ts += rng.choice([0, 1, 1, 2, 3])
            late = rng.random() < 0.1
            batch.append({"k": "x", "ts": ts - (rng.randint(1, 6) if late else 0),
                          "price": float(rng.randint(1, 5)), "volume": rng.randint(1, 3)})
        rng.shuffle(batch)
        batches.append(batch)
    return batches


def random_case(rng: random.Random) -> tuple[str, pt.Node, dict[str, tuple[str, Any]], int, int]:
    """A seeded random pattern that parses, its tree, conditions for most of its variables
    (text, plain-Python check), a time bound and a watermark delay."""
    while True:
        text = _random_pattern(rng)
        try:
            tree = pt.parse_pattern(text)
            break
        except ex.ExpressionError:
            continue
    names = pt.variables(tree)
    defines = {v: _random_condition(rng, names) for v in names if rng.random() < 0.8}
    within = rng.choice([2, 5, 10, 1000])
    delay = rng.choice([0, 1, 3])
    return text, tree, defines, within, delay


def _run_case(rng: random.Random) -> tuple[int, int]:
    text, tree, defines, within, delay = random_case(rng)
    program, _ = build_program("s", SCHEMA, "ts", text,
                               [(v, c[0]) for v, c in defines.items()],
                               [("n", "count()"), ("start", "first(ts)")], within)
    matcher = KeyMatcher(program)
    batches = _random_stream(rng)
    got: list[tuple[int, tuple[str, ...]]] = []
    fed: list[tuple[list[dict], int]] = []
    max_ts: int | None = None
    for batch in batches:
        watermark = None if max_ts is None else max_ts - delay
        if watermark is not None:
            fed.append((batch, watermark))
        for m in matcher.feed(batch, watermark):
            got.append((m.rows[0]["ts"], m.labels))
            assert measures(program, m) == (len(m.rows), m.rows[0]["ts"])
        if watermark is None:
            fed.append((batch, -10**9))
        matcher = KeyMatcher.from_json(program, matcher.to_json())  # through the state store
        max_ts = max([r["ts"] for r in batch] + ([max_ts] if max_ts is not None else []),
                     default=max_ts)
    for m in matcher.feed([], 10**9):  # the end: the watermark passes everything
        got.append((m.rows[0]["ts"], m.labels))
    fed.append(([], 10**9))
    rows = cep_oracle.on_time_rows(fed, "ts")
    conditions = {v: c[1] for v, c in defines.items()}
    want = [(rows[i]["ts"], tuple(labels))
            for i, labels in cep_oracle.all_matches(tree, rows, conditions, within, "ts")]
    assert got == want, (text, {v: c[0] for v, c in defines.items()}, within, delay, batches)
    assert matcher.idle()
    return len(want), sum(1 for b, w in fed for r in b if r not in rows)


def test_matcher_equals_the_backtracking_oracle_on_random_streams() -> None:
    rng = random.Random(2013)
    matches = late = empty = 0
    for _ in range(2500):
        found, dropped = _run_case(rng)
        matches += found
        late += dropped
        empty += found == 0
    assert matches > 1000 and late > 50 and empty > 100, (matches, late, empty)


def test_tick_shape_pattern_on_a_hand_made_stream() -> None:
    """AB+CD+: a fall, a first rise staying below A, then rises above A (the paper's Fig. 7)."""
    stock = Schema.of(("symbol", "string"), ("ts", "int"), ("price", "double"))
    defines = [("B", "price < prev(price)"),
               ("C", "price > prev(price) and price < first(A.price)"),
               ("D", "price > prev(price) and price > first(A.price)")]
    program, _ = build_program("stock", stock, "ts", "A B+ C D+", defines,
                               [("start", "first(A.ts)"), ("bottom", "min(B.price)"),
                                ("top", "last(D.price)"), ("falls", "count(B)")], 100)
    prices = [10, 8, 6, 7, 11, 12, 9, 5]
    rows = [{"symbol": "X", "ts": i, "price": float(p)} for i, p in enumerate(prices)]
    matcher = KeyMatcher(program)
    found = matcher.feed(rows, 100)
    assert [m.labels for m in found] == [("A", "B", "B", "C", "D", "D")]
    assert measures(program, found[0]) == (0, 6.0, 12.0, 2)


def test_partial_matches_beyond_the_bound_fail_loudly() -> None:
    program, _ = build_program("s", SCHEMA, "ts", "A+ B+ C", [("C", "volume = 99")], [], 10**6,
                               max_partial=50)
    rows = [{"k": "x", "ts": i, "price": 1.0, "volume": 1} for i in range(40)]
    with pytest.raises(PatternOverflow, match="max-partial-matches=50"):
        KeyMatcher(program).feed(rows, 10**6)


def _alternation(bound: int, ways: int = 16) -> Any:
    """(V1 | ... | Vn)+ Z where every row is each V and never Z: an attempt's threads multiply by
    `ways` with each row, so one row takes a key from under the bound to `ways` times past it."""
    names = [chr(65 + i) for i in range(ways)]
    return build_program("s", SCHEMA, "ts", f"({' | '.join(names)})+ Z", [("Z", "volume = 99")],
                         [], 10**6, max_partial=bound, after_match="skip-to-next-row")[0]


def _threads_made_when_refused(error: PatternOverflow, matcher: KeyMatcher) -> int:
    """The threads the refused row had made, read off the live frames (independent of
    `error.held`): the stepping loop's count of the attempts it stepped (`held`; `total` where
    the bound was checked after the whole step) plus the list `step_threads` was filling."""
    tb, made = error.__traceback__, 0
    while tb is not None:
        local = tb.tb_frame.f_locals
        if tb.tb_frame.f_code.co_name in ("_process", "_on_row"):
            made += local.get("held", local.get("total", 0))
        if tb.tb_frame.f_code.co_name == "step_threads":
            made += len(local["new"])
        tb = tb.tb_next
    return made


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("bound", [1, 7, 100, 1000])
def test_partial_matches_are_counted_while_stepping_and_never_pass_the_bound(
        bound: int, staged: bool) -> None:
    """The attack: one row of an alternation-heavy pattern made 16x the bound's partial matches
    (at the top of the range, out of memory) before the bound was checked. Now the row is refused
    as the thread past the bound is made: between rows and at the refusal, never more; in a
    matcher of one key and in the first stage of a pipelined pattern alike."""
    from executor.cep.stage import Stage, StageMatcher

    program = _alternation(bound)
    matcher: Any = StageMatcher(program, Stage(1, 2, 50)) if staged else KeyMatcher(program)
    feed = matcher.feed_rows if staged else matcher.feed
    rows = [{"k": "x", "ts": i, "price": 1.0, "volume": 1} for i in range(20)]
    with pytest.raises(PatternOverflow) as refused:
        for row in rows:
            feed([row], row["ts"])
            assert sum(len(a.threads) for a in matcher.attempts) <= bound
    assert _threads_made_when_refused(refused.value, matcher) == bound
    assert refused.value.held == bound and f"max-partial-matches={bound};" in str(refused.value)


def test_a_refused_row_allocates_about_the_bound_not_the_branching_times_it() -> None:
    """Memory, measured: at a bound of 5,000 the refused row of a 16-way alternation allocates
    what ~2x5,000 threads take (the old threads and the new; 0.6 MB measured), not 16x5,000 as
    when the bound was checked after the step (5 MB measured)."""
    import tracemalloc

    matcher = KeyMatcher(_alternation(5000))
    rows = [{"k": "x", "ts": i, "price": 1.0, "volume": 1} for i in range(10)]
    tracemalloc.start()
    try:
        with pytest.raises(PatternOverflow):
            for row in rows:
                matcher.feed([row], row["ts"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, peak


# ================================================================ the operator in a spec ==

from compiler.pipeline import check_spec_text  # noqa: E402
from tests.spec_snippets import locate, with_source_and_sink  # noqa: E402


def _pattern_op(pattern: str = "A B+ C", params: str = "", defines: str = "",
                fields: str = '    <field name="start" value="first(A.ts)"/>\n') -> str:
    return ('  <operator name="p" type="pattern">\n    <input name="raw"/>\n'
            f'    <param name="pattern" value="{pattern}"/>\n'
            '    <param name="time" value="ts"/>\n    <param name="within" value="1 minute"/>\n'
            f'{params}{defines}{fields}    <output name="hits"/>\n  </operator>\n')


_TEMP_DEFINES = ('    <define name="B" value="temp &lt; prev(temp)"/>\n'
                 '    <define name="C" value="temp &gt; first(A.temp)"/>\n')


def test_a_pattern_spec_compiles_to_keys_and_measures() -> None:
    xml = with_source_and_sink(_pattern_op(
        params='    <param name="partition-by" value="sensor"/>\n', defines=_TEMP_DEFINES,
        fields='    <field name="start" value="first(A.ts)"/>\n'
               '    <field name="drop" value="first(A.temp) - min(B.temp)"/>\n'
               '    <field name="n" value="count(B)"/>\n'), "hits")
    graph, diagnostics = check_spec_text(xml, "ok.xml")
    assert graph is not None, [d.render() for d in diagnostics]
    schema = graph.stream("hits").schema
    assert [(f.name, f.type.value) for f in schema] == [
        ("sensor", "string"), ("start", "timestamp"), ("drop", "double"), ("n", "int")]
    assert graph.node("p").partition_keys == ("sensor",)


BAD_SPECS = [
    (_pattern_op("A B++"), "A B++", 4, "'+' after '+'"),
    (_pattern_op("A* B?"), "A* B?", 0, "no rows at all"),
    (_pattern_op(defines='    <define name="Z" value="true"/>\n'), '<define name="Z"', 0,
     "does not use"),
    (_pattern_op(defines='    <define name="B" value="temp &lt; prev(A.temp)"/>\n'),
     "temp &lt; prev(A.temp)", 15, "prev reads the row before"),
    (_pattern_op(defines='    <define name="B" value="temp + 1"/>\n'), "temp + 1", 0,
     "not boolean"),
    (_pattern_op(fields='    <field name="x" value="prev(temp)"/>\n'), "prev(temp)", 0,
     "unknown function 'prev'"),
    (_pattern_op(fields=''), '<operator name="p"', 0, "has no <field>"),
    (_pattern_op(params='    <param name="partition-by" value="sensr"/>\n'), "sensr", 0,
     "not in stream"),
    (_pattern_op().replace('value="1 minute"', 'value="0 seconds"'), "0 seconds", 0,
     "above zero"),
    (_pattern_op().replace('value="ts"', 'value="temp"'), 'value="temp"', 7,
     "needs a timestamp column"),
    (_pattern_op("A raw+"), "A raw+", 0, "has the name of the input stream"),
]


@pytest.mark.parametrize("body,needle,shift,message", BAD_SPECS)
def test_bad_pattern_specs_are_refused_at_file_line_column(body: str, needle: str, shift: int,
                                                           message: str) -> None:
    xml = with_source_and_sink(body, "hits")
    graph, diagnostics = check_spec_text(xml, "bad.xml")
    assert graph is None
    line, column = locate(xml, needle)
    errors = [d for d in diagnostics if d.severity == "error"]
    at = {(d.position.line, d.position.column) for d in errors
          if message in d.message + " " + d.hint}
    assert (line, column + shift) in at, [d.render() for d in errors]


def test_every_problem_of_a_pattern_operator_is_reported_at_once() -> None:
    body = _pattern_op("A B+ C", defines='    <define name="B" value="tmp &lt; 1"/>\n'
                                         '    <define name="C" value="count(temp) &gt; 1"/>\n',
                       fields='    <field name="x" value="sqrt(temp)"/>\n')
    graph, diagnostics = check_spec_text(with_source_and_sink(body, "hits"), "bad.xml")
    messages = " | ".join(d.message for d in diagnostics)
    assert graph is None
    for fragment in ("unknown column 'tmp'", "count takes one pattern variable",
                     "'sqrt' is not available"):
        assert fragment in messages, messages


def test_pattern_spec_fuzz_every_refusal_located() -> None:
    rng = random.Random(915)
    pieces = ["A", "B+", "C*", "(", ")", "|", "?", " ", "1", "A.temp", "&lt;", "prev(temp)",
              "first(", "count(B)", "&amp;", "'", "\u00e9", "temp", "&gt;", ","]
    for _ in range(150):
        pattern = "".join(rng.choice(pieces[:9]) for _ in range(rng.randint(0, 6)))
        condition = " ".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        measure = " ".join(rng.choice(pieces[9:]) for _ in range(rng.randint(0, 4)))
        body = _pattern_op(pattern, defines=f'    <define name="B" value="{condition}"/>\n',
                           fields=f'    <field name="m" value="{measure}"/>\n')
        xml = with_source_and_sink(body, "hits")
        graph, diagnostics = check_spec_text(xml, "fuzz.xml")
        lines = xml.count("\n") + 1
        for d in diagnostics:
            assert d.position.file == "fuzz.xml" and 1 <= d.position.line <= lines, d.render()
            assert d.position.column >= 1 and d.message
        assert (graph is None) == any(d.severity == "error" for d in diagnostics)


def test_control_tuples_cannot_change_a_running_pattern(tmp_path: Path,
                                                        scheduler_path_roots: Path) -> None:
    from common.control import ControlRefused
    from common.paths import configured_roots
    from compiler.control import check_tuple
    from compiler.pipeline import compile_spec_text

    example = Path(__file__).resolve().parent.parent / "examples" / "tick-shape.xml"
    text = example.read_bytes().replace(b"out/tick-shapes.jsonl",
                                              str(tmp_path / "o.jsonl").encode())
    catalog = compile_spec_text(text, str(tmp_path / "t.xml"), base_dir=tmp_path,
                                path_roots=configured_roots()).query.controls
    for parameter, value in (("within", "1 minute"), ("pattern", "A B+"), ("define", "true")):
        with pytest.raises(ControlRefused, match="partial matches per key"):
            check_tuple(catalog, "tick-shape", "tick", parameter, value)


def test_values_cross_arrow_as_text_exactly() -> None:
    """executor.arrow_text, the transport of the pattern operator and the keyed-state operators:
    what Spark's cast to string gives back as the typed value, and results as the text Spark
    casts to their types (Java spellings of NaN and infinities)."""
    from executor.arrow_text import from_text, text

    assert from_text("9223372036854775807", ColumnType.INT) == 2**63 - 1
    assert from_text("-1704067200000000", ColumnType.TIMESTAMP) == -1704067200000000
    assert math.isnan(from_text("NaN", ColumnType.DOUBLE))
    assert from_text("-Infinity", ColumnType.DOUBLE) == -math.inf
    assert from_text("1.0E-4", ColumnType.DOUBLE) == 1e-4
    assert from_text("true", ColumnType.BOOLEAN) is True
    assert from_text(None, ColumnType.STRING) is None
    assert from_text(float("nan"), ColumnType.INT) is None  # pandas' null of a missing value
    assert [text(v) for v in (None, True, math.nan, math.inf, -math.inf, 0.1, 2**63 - 1)] == [
        None, "true", "NaN", "Infinity", "-Infinity", "0.1", "9223372036854775807"]
