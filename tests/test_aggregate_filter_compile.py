"""Pure compile tests of aggregates with a filter (`<aggregate ... where="..."/>`, SQL's
`FILTER (WHERE ...)`, Nexmark q15): what compiles and what the generated call carries, every
misuse refused at its place with file:line:column (all at once), a seeded fuzz of where
conditions against the expression checker as oracle, and an attacker's where texts, which stay
data."""

from __future__ import annotations

import ast
import random

import pytest

from common.diagnostics import SpecError
from compiler import expr as ex
from compiler.pipeline import check_spec_text, compile_spec_text
from executor import shapes
from common.types import Schema
from tests.spec_snippets import locate
from tests.test_nexmark_compile import BIDS, SINK, refused_at

BID_SCHEMA: Schema = shapes.shape_named("bid").columns


def window(aggregates: str, kind: str = "window-aggregate",
           params: str = '    <param name="size" value="10 seconds"/>\n') -> str:
    return (f'<dataflow name="nx">\n{BIDS}'
            f'  <operator name="w" type="{kind}">\n    <input name="b"/>\n'
            f'    <param name="time" value="date_time"/>\n{params}{aggregates}'
            f'    <output name="s"/>\n  </operator>\n{SINK.format("s")}</dataflow>\n')


def aggregate(name: str, function: str, where: str, column: str | None = None,
              by: str | None = None) -> str:
    column_attr = f' column="{column}"' if column else ""
    by_attr = f' by="{by}"' if by else ""
    return (f'    <aggregate name="{name}" function="{function}"{column_attr}{by_attr} '
            f'where="{where}"/>\n')


def window_call(program: str) -> ast.Call:
    calls = [n for n in ast.walk(ast.parse(program)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "window_aggregate"]
    assert len(calls) == 1
    return calls[0]


def compiled_aggregates(xml: str, tmp_path: object) -> tuple:
    compiled = compile_spec_text(xml, "nx.xml", base_dir=str(tmp_path))
    (task,) = compiled.query.tasks
    (keyword,) = [k for k in window_call(task.program).keywords if k.arg == "aggregates"]
    return ast.literal_eval(keyword.value)


Q15_AGGREGATES = (
    aggregate("total_bids", "count", "true")
    + aggregate("rank1_bids", "count", "price &lt; 10000")
    + aggregate("rank1_bidders", "count_distinct", "price &lt; 10000", column="bidder")
    + aggregate("rank2_auctions", "count_distinct",
                "price &gt;= 10000 and price &lt; 1000000", column="auction")
    + aggregate("cheap_top", "max_by", "b.price &lt; 10000", column="bidder", by="price")
    + aggregate("cheap_sum", "sum", "channel = 'Google'", column="price"))


def test_filtered_aggregates_compile_with_their_types_and_conditions(tmp_path: object) -> None:
    xml = window(Q15_AGGREGATES + '    <aggregate name="plain" function="count"/>\n')
    aggregates = compiled_aggregates(xml, tmp_path)
    assert aggregates[1] == ("rank1_bids", "count", None, None, "price < 10000")
    assert aggregates[3] == ("rank2_auctions", "count_distinct", "auction", None,
                             "price >= 10000 and price < 1000000")
    assert aggregates[4] == ("cheap_top", "max_by", "bidder", "price", "b.price < 10000")
    assert aggregates[-1] == ("plain", "count", None), "an aggregate without where is unchanged"
    graph, _ = check_spec_text(xml, "nx.xml")
    assert graph is not None
    types = {f.name: f.type.value for f in graph.stream("s").schema}
    assert types["rank1_bidders"] == "int" and types["cheap_top"] == "int"
    assert types["cheap_sum"] == "int"


def test_a_filter_is_part_of_what_a_window_computes() -> None:
    """Two windows that differ only in a where are different streams (automatic sharing
    compares operators by their parameters)."""
    graphs = [check_spec_text(window(aggregate("n", "count", where)), "nx.xml")[0]
              for where in ("price &lt; 10", "price &lt; 11")]
    assert all(g is not None for g in graphs)
    params = [dict(g.node("w").params)["aggregates"] for g in graphs if g is not None]
    assert params[0] != params[1]


@pytest.mark.parametrize("where,needle,fragment", [
    ("price + 1", "price + 1", "is of type int, not boolean"),
    ("nope &gt; 1", "nope", "unknown column 'nope'"),
    ("price &lt;", '"/>\n    <output name="s"', "expected a value after '<'"),
    ("other.price &gt; 1", "other.price", "other"),
    ("price = 'x'", "price = 'x'", "compare"),
])
def test_a_bad_where_is_refused_at_its_place(where: str, needle: str, fragment: str) -> None:
    refused_at(window(aggregate("n", "count", where)), needle, fragment)


def test_every_problem_is_reported_at_once() -> None:
    xml = window(aggregate("a", "count", "price + 1")
                 + aggregate("b", "sum", "zz &gt; 1", column="price")
                 + aggregate("c", "sum", "price &gt; 1", column="channel"))
    refused_at(xml, "price + 1", "not boolean")
    refused_at(xml, "zz", "unknown column 'zz'")
    refused_at(xml, 'channel"', "needs a numeric column")


@pytest.mark.parametrize("kind,params", [
    ("window-aggregate", '    <param name="rows" value="10"/>\n'),
    ("aggregate", '    <param name="ttl" value="1 hours"/>\n'),
])
def test_per_key_state_operators_take_no_where(kind: str, params: str) -> None:
    xml = window(aggregate("n", "count", "price &gt; 1"), kind, params)
    refused_at(xml, "price &gt; 1", "takes no where")


def test_where_is_refused_outside_aggregate_elements() -> None:
    xml = window('    <aggregate name="n" function="count"/>\n').replace(
        '<param name="size"', '<param name="size" where="x"')
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is None and any("where" in d.message for d in diagnostics)


# --- a seeded fuzz: where conditions against the checker as oracle ---------------------------

ATOMS = ("price < 10000", "price >= 1000000", "bidder = 7", "channel = 'Google'",
         "url is null", "auction % 2 = 0", "b.price between 1 and 9", "true",
         "date_time > timestamp '2024-01-01T00:00:00Z'", "lower(channel) in ('apple', 'x')")
JUNK = ("(", ")", " and ", "'", "<", "&", "price", "+", "zz", "\"", "]]>", "\n", "\\")


def fuzz_where(rng: random.Random) -> str:
    text = rng.choice(ATOMS)
    for _ in range(rng.randrange(3)):
        text = f"{text} {rng.choice(('and', 'or'))} {'not ' * rng.randrange(2)}{rng.choice(ATOMS)}"
    for _ in range(rng.randrange(3)):  # mutations: an insertion or a deletion
        at = rng.randrange(len(text) + 1)
        text = (text[:at] + rng.choice(JUNK) + text[at:]) if rng.random() < 0.6 \
            else text[:at] + text[at + 1:]
    return text


def xml_escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")
            .replace("\n", "&#10;"))


def oracle_accepts(where: str) -> bool:
    try:
        ex.compile_condition(where, ex.Scope({"b": BID_SCHEMA}))
    except ex.ExpressionError:
        return False
    return True


@pytest.mark.parametrize("seed", (1, 2, 3))
def test_fuzzed_where_conditions_are_accepted_exactly_when_they_check(seed: int) -> None:
    """A where is accepted exactly when the expression checker takes it as a boolean over the
    input; a refusal is located inside the where's value; an accepted one compiles to a
    program carrying the condition as a string constant."""
    rng = random.Random(seed)
    accepted = 0
    for case in range(150):
        where = fuzz_where(rng)
        xml = window(aggregate("n", "count", xml_escape(where)))
        graph, diagnostics = check_spec_text(xml, "nx.xml")
        errors = [d for d in diagnostics if d.severity == "error"]
        assert (graph is not None) == oracle_accepts(where), (seed, case, where, errors)
        if graph is None:
            line, column = locate(xml, ' where="')
            value = column + len(' where="')
            assert errors and all(d.position.line == line and d.position.column >= value
                                  for d in errors), (where, [d.render() for d in errors])
            continue
        accepted += 1
        compiled = compile_spec_text(xml, "nx.xml", base_dir="/tmp")
        (task,) = compiled.query.tasks
        (keyword,) = [k for k in window_call(task.program).keywords if k.arg == "aggregates"]
        assert ast.literal_eval(keyword.value) == (("n", "count", None, None, where),)
    assert 10 <= accepted <= 140, accepted


# --- an attacker's where texts --------------------------------------------------------------

ATTACKS = (
    "__import__('os').system('touch /tmp/pwned')",
    "price < 1')), __import__('os').system('id'), (('",
    "price < 1\n    import os\n",
    "eval('1')",
    "b.__class__ = 1",
    "price < 1 -- ''' \"\"\" \\",
)


@pytest.mark.parametrize("where", ATTACKS)
def test_an_attackers_where_stays_data(where: str, tmp_path: object) -> None:
    """Refused as an expression (no such function, no such syntax), never run: the compiler
    reports it and writes no program; nothing was created."""
    xml = window(aggregate("n", "count", xml_escape(where)))
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is None and any(d.severity == "error" for d in diagnostics)
    with pytest.raises(SpecError):
        compile_spec_text(xml, "nx.xml", base_dir=str(tmp_path))


def test_quotes_in_an_accepted_where_stay_inside_a_string_constant(tmp_path: object) -> None:
    """A where with quotes, backslashes and code-like text in a string literal compiles: the
    program carries it as one string constant (the generated module is otherwise fixed)."""
    where = "channel = 'x\\')), __import__(\\'os\\').system(\\'id\\'), ((\\''"
    assert oracle_accepts(where)
    aggregates = compiled_aggregates(window(aggregate("n", "count", xml_escape(where))), tmp_path)
    assert aggregates == (("n", "count", None, None, where),)
