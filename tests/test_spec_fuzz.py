"""Fuzzing the compiler's front door: mutated specs and random expressions through validate,
compile and explain.

The property (docs/spec-language.md, "Bounds"): whatever the text, `check_spec_text`,
`compile_spec_text` and `explain` either succeed or raise the project's `SpecError`, never
anything else; every refusal's every diagnostic names the file, a line >= 1 within the text and a
column >= 1, and says something; a spec that validates also compiles (and explains), and every
generated task program is Python that `ast.parse` accepts.

Seeded and bounded: a fixed number of cases per seed, each small. A failure prints the seed, the
case number and the spec text, so `_case(random.Random(f"{seed}:{i}"))` reproduces it.
"""

from __future__ import annotations

import ast
import random
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pytest

from common.diagnostics import Diagnostic, SpecError
from common.types import ColumnType
from compiler import expr as ex
from compiler.pipeline import check_spec_text, compile_spec_text
from elastiq.explain import explain
from tests import expression_oracle as oracle
from tests.spec_snippets import READING_TYPE, SINK, SOURCE, dataflow, with_source_and_sink

ROOT = Path(__file__).resolve().parent.parent
FILENAME = "fuzz.xml"
CASES_PER_SEED = 500
SEEDS = (1, 2, 3, 4, 5, 6)

# --------------------------------------------------------------------------------- base specs


def _snippet_specs() -> list[str]:
    window = ('  <operator name="w" type="window-aggregate">\n    <input name="raw"/>\n'
              '    <param name="time" value="ts"/>\n    <param name="size" value="10 seconds"/>\n'
              '    <param name="group-by" value="sensor"/>\n'
              '    <aggregate name="n" function="count"/>\n'
              '    <aggregate name="t" function="avg" column="temp"/>\n'
              '    <output name="agg"/>\n  </operator>\n')
    hot = ('  <operator name="f" type="filter" ha="standby">\n    <input name="raw"/>\n'
           '    <param name="condition" value="raw.temp &gt; 30"/>\n'
           '    <output name="hot"/>\n  </operator>\n')
    proj = ('  <operator name="p" type="project" parallelism="2">\n    <input name="raw"/>\n'
            '    <field name="s" value="upper(raw.sensor)"/>\n'
            '    <field name="t" value="raw.temp * 2"/>\n    <output name="out"/>\n'
            '  </operator>\n')
    return [dataflow(SOURCE + SINK.format(stream="raw")), with_source_and_sink(window, "agg"),
            with_source_and_sink(hot, "hot"), with_source_and_sink(proj, "out")]


def _base_specs() -> list[str]:
    files = sorted((ROOT / "tests" / "specs").glob("*.xml")) + sorted(
        (ROOT / "examples").glob("**/*.xml"))
    return [f.read_text() for f in files] + _snippet_specs()


BASES = _base_specs()

# --------------------------------------------------------------------------------- mutations

NUMBERS = ("inf", "-inf", "nan", "NaN", "1e400", "-1e400", "1e-400", "0", "-0", "-1", "0.0005",
           "1000001", "9" * 19, "9" * 30, "-" + "9" * 25, "1_000", "0x10", "", " ", "1e3", "+5",
           "3.5", "9223372036854775807", "9223372036854775808", "-9223372036854775808")
TIMESTAMPS = ("9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00", "2024-02-30T00:00:00Z",
              "99999-01-01T00:00:00Z", "1899-12-31T23:59:59Z", "9000-01-01T00:00:00Z",
              "2024-01-01T00:00:00+14:00", "2024-01-01", "now")
DURATIONS = ("0 seconds", "999999999 hours", "8761 hours", "8760 hours", "1 ms", "-1 s",
             "1 fortnight", "10 seconds", "1.5 seconds")
ODD_TEXT = ("ünï", "名前", "a\u200bb", "&#1;", "&#x7f;", "x" * 70, "_", "a-b", "1abc", "&amp;",
            "&lt;x&gt;", "raw", "RAW", "Raw")


def _attr_spans(text: str) -> list[re.Match[str]]:
    return list(re.finditer(r'(?P<name>[\w-]+)="(?P<value>[^"]*)"', text))


def _case_variant(rng: random.Random, text: str) -> str:
    names = [m.group("value") for m in _attr_spans(text) if m.group("name") == "name"]
    if not names:
        return "X"
    name = rng.choice(names)
    flipped = name.swapcase() if name.swapcase() != name else name.upper() + "x"
    return flipped


def mutate_attribute(rng: random.Random, text: str) -> str:
    spans = _attr_spans(text)
    if not spans:
        return text
    m = rng.choice(spans)
    pool = rng.choice((NUMBERS, TIMESTAMPS, DURATIONS, ODD_TEXT))
    value = _case_variant(rng, text) if rng.random() < 0.2 else rng.choice(pool)
    if rng.random() < 0.1:
        value = "".join(chr(rng.randrange(1, 32)) for _ in range(2))  # raw control characters
    return text[:m.start("value")] + value + text[m.end("value"):]


def _lines(text: str) -> list[str]:
    return text.split("\n")


def drop_line(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    del lines[rng.randrange(len(lines))]
    return "\n".join(lines)


def duplicate_line(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    lines.insert(i, lines[i])
    return "\n".join(lines)


def swap_lines(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def truncate(rng: random.Random, text: str) -> str:
    return text[:rng.randrange(len(text))]


def nest_deeply(rng: random.Random, text: str) -> str:
    depth = rng.choice((3, 50, 300))
    at = text.find("<operator")
    if at < 0:
        return text
    return text[:at] + "<x>" * depth + "</x>" * depth + text[at:]


def case_collision(rng: random.Random, text: str) -> str:
    """A second element whose name differs from an existing one only in case."""
    spans = [m for m in _attr_spans(text) if m.group("name") == "name"]
    if not spans:
        return text
    m = rng.choice(spans)
    return text[:m.start("value")] + _case_variant(rng, text) + text[m.end("value"):]


PATTERNS = ('ha="standby"', 'ha="checkpoint"', 'ha="hot-standby"', 'ha="hot-standby" replicas="3"',
            'replicas="99"', 'parallelism="2"', 'parallelism="3" partition-by="sensor"',
            'parallelism="65"', 'partition-by="nope"', 'pipeline="split"', 'pipeline="join"',
            'ha="standby" pipeline="split"', 'match-instances="2"', 'match-instances="x"')


def add_pattern(rng: random.Random, text: str) -> str:
    """A pattern request on a random operator, or as the query-wide default."""
    starts = [m.end() for m in re.finditer(r"<(operator|dataflow) ", text)]
    if not starts:
        return text
    at = rng.choice(starts)
    return text[:at] + rng.choice(PATTERNS) + " " + text[at:]


def long_chain(rng: random.Random, text: str) -> str:
    n = rng.choice((5, 5, 120, 350))
    ops = "".join(f'  <operator name="f{i}" type="filter"><input name="s{i}"/>'
                  f'<param name="condition" value="s{i}.temp &gt; {i}"/>'
                  f'<output name="s{i + 1}"/></operator>\n' for i in range(n))
    order = list(ops.splitlines(keepends=True))
    if rng.random() < 0.5:
        order.reverse()
    return dataflow(SOURCE.replace('name="raw"', 'name="s0"') + "".join(order)
                    + SINK.format(stream=f"s{n}"))


# ------------------------------------------------------------------------------- expressions

_COLUMNS = {"sensor": ColumnType.STRING, "ts": ColumnType.TIMESTAMP, "temp": ColumnType.DOUBLE,
            "humidity": ColumnType.DOUBLE}
_TOKENS = ("raw.temp", "raw.ts", "raw.sensor", "temp", "other.x", "1", "2.5", "'a'", "true",
           "null", "timestamp '2024-01-01T00:00:00Z'", "timestamp '9999-12-31T23:59:59-05:00'",
           "1e400", "99999999999999999999999", "+", "-", "*", "/", "%", "=", "!=", "<", "<=",
           ">", ">=", "and", "or", "not", "in", "between", "is", "like", "(", ")", ",", "'",
           "\\", "@", "#", "é") + tuple(sorted(ex.FUNCTIONS))


def random_tokens(rng: random.Random) -> str:
    return " ".join(rng.choice(_TOKENS) for _ in range(rng.randrange(1, 25)))


def _literal(rng: random.Random) -> ex.Expr:
    kind = rng.randrange(5)
    if kind == 0:
        return ex.Literal(rng.choice((0, 1, -7, ex.INT_MAX, ex.INT_MIN)), ColumnType.INT)
    if kind == 1:
        return ex.Literal(rng.choice((0.0, 2.5, -1e300, 1e-300)), ColumnType.DOUBLE)
    if kind == 2:
        return ex.Literal(rng.choice(("", "a'b", "x\\y", "ü\n")), ColumnType.STRING)
    if kind == 3:
        return ex.Literal(rng.random() < 0.5, ColumnType.BOOLEAN)
    moment = rng.choice((datetime(1, 1, 1), datetime(2024, 1, 1), datetime(9999, 12, 31)))
    return ex.Literal(moment.replace(tzinfo=timezone.utc), ColumnType.TIMESTAMP)


def random_ast(rng: random.Random, depth: int) -> ex.Expr:
    """A well-formed expression tree (not necessarily well-typed) of at most `depth` levels."""
    if depth <= 1 or rng.random() < 0.25:
        if rng.random() < 0.5:
            return _literal(rng)
        return ex.ColumnRef(rng.choice(("raw", None)), rng.choice(tuple(_COLUMNS)))
    sub: Callable[[], ex.Expr] = lambda: random_ast(rng, depth - 1)  # noqa: E731
    shape = rng.randrange(7)
    if shape == 0:
        return ex.Unary(rng.choice(("-", "not")), sub())
    if shape == 1:
        return ex.Binary(rng.choice(ex.BINARY_OPS), sub(), sub())
    if shape == 2:
        return ex.Between(sub(), sub(), sub(), rng.random() < 0.5)
    if shape == 3:
        return ex.InList(sub(), tuple(sub() for _ in range(rng.randrange(1, 4))),
                         rng.random() < 0.5)
    if shape == 4:
        return ex.IsNull(sub(), rng.random() < 0.5)
    name = rng.choice(sorted(ex.FUNCTIONS))
    return ex.Call(name, tuple(sub() for _ in range(rng.randrange(0, 4))))


def _xml_attr(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("\n", "&#10;"))


def with_expression(rng: random.Random, _: str) -> str:
    if rng.random() < 0.5:
        expression = random_tokens(rng)
    else:
        tree = random_ast(rng, rng.randrange(1, 9))
        expression = oracle.render(tree)
        assert ex.parse(expression) == tree, f"render/parse round trip: {expression}"
    where = rng.choice(("condition", "field"))
    if where == "condition":
        body = ('  <operator name="f" type="filter">\n    <input name="raw"/>\n'
                f'    <param name="condition" value="{_xml_attr(expression)}"/>\n'
                '    <output name="out"/>\n  </operator>\n')
    else:
        body = ('  <operator name="p" type="project">\n    <input name="raw"/>\n'
                f'    <field name="v" value="{_xml_attr(expression)}"/>\n'
                '    <output name="out"/>\n  </operator>\n')
    return dataflow(SOURCE + body + SINK.format(stream="out"), types=READING_TYPE)


MUTATIONS: tuple[Callable[[random.Random, str], str], ...] = (
    mutate_attribute, mutate_attribute, mutate_attribute, drop_line, duplicate_line, swap_lines,
    truncate, nest_deeply, case_collision, with_expression, with_expression, long_chain,
    add_pattern, add_pattern,
)


def _case(rng: random.Random) -> str:
    text = rng.choice(BASES)
    for _ in range(rng.choice((1, 1, 2, 3))):
        text = rng.choice(MUTATIONS)(rng, text)
    return text


# ------------------------------------------------------------------------------------ checks


def _located(diagnostics: tuple[Diagnostic, ...] | list[Diagnostic], text: str) -> None:
    lines = text.count("\n") + 1
    assert diagnostics, "a refusal without a diagnostic"
    for d in diagnostics:
        assert d.position.file == FILENAME, d.render()
        assert 1 <= d.position.line <= lines, d.render()
        assert d.position.column >= 1, d.render()
        assert d.message.strip(), d.render()


def _check(text: str, base: Path) -> str:
    """What became of the text ('refused' or 'compiled'); raises AssertionError otherwise."""
    graph, diagnostics = check_spec_text(text, FILENAME)
    if graph is None:
        _located([d for d in diagnostics if d.severity == "error"], text)
        return "refused"
    compiled = compile_spec_text(text, FILENAME, base_dir=base)
    for task in compiled.query.tasks:
        ast.parse(task.program)
    # a plan-only compile differs only where a plan is refused, and this one was not
    assert explain(compiled)
    return "compiled"


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_specs_are_compiled_or_refused_with_located_errors(seed: int,
                                                                   tmp_path: Path) -> None:
    outcomes = {"refused": 0, "compiled": 0}
    for i in range(CASES_PER_SEED):
        rng = random.Random(f"{seed}:{i}")
        text = _case(rng)
        try:
            outcomes[_check(text, tmp_path)] += 1
        except SpecError as e:  # only validation may refuse; compile must take what it accepts
            pytest.fail(f"seed {seed} case {i}: compile refused a spec that validates:\n"
                        f"{e}\n--- spec ---\n{text}")
        except BaseException as e:  # noqa: BLE001 - the property is that nothing escapes
            print(f"seed {seed} case {i}; spec:\n{text}")
            raise AssertionError(f"seed {seed} case {i}: {type(e).__name__}: {e}") from e
    # the mutations reach both sides of the property, or the test tests nothing
    assert outcomes["refused"] > CASES_PER_SEED // 10, outcomes
    assert outcomes["compiled"] > CASES_PER_SEED // 20, outcomes
