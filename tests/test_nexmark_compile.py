"""Pure compile tests of the Nexmark features: session windows (`gap`), the distinct counts,
max_by/min_by (`by`), `deduplicate`, and the Nexmark generator shapes: what compiles, what the
generated call carries, and every misuse refused at its value with file:line:column."""

from __future__ import annotations

import ast

import pytest

from common.diagnostics import Diagnostic
from compiler.pipeline import check_spec_text, compile_spec_text
from tests.spec_snippets import locate

BIDS = ('  <operator name="bids" type="generator">\n'
        '    <param name="shape" value="bid"/>\n    <output name="b"/>\n  </operator>\n')
SINK = ('  <operator name="sink" type="file-sink">\n    <input name="{0}"/>\n'
        '    <param name="path" value="out.jsonl"/>\n  </operator>\n')


def spec(middle: str, out: str) -> str:
    return f'<dataflow name="nx">\n{BIDS}{middle}{SINK.format(out)}</dataflow>\n'


def window(params: str, aggregates: str = '    <aggregate name="n" function="count"/>\n') -> str:
    return spec('  <operator name="w" type="window-aggregate">\n    <input name="b"/>\n'
                '    <param name="time" value="date_time"/>\n'
                f'{params}{aggregates}    <output name="s"/>\n  </operator>\n', "s")


def program(xml: str, tmp_path: object) -> str:
    compiled = compile_spec_text(xml, "nx.xml", base_dir=str(tmp_path))
    (task,) = compiled.query.tasks
    ast.parse(task.program)
    return task.program


def refused_at(xml: str, needle: str, fragment: str) -> Diagnostic:
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is None, "the spec should be refused"
    line, column = locate(xml, needle)
    hits = [d for d in diagnostics if d.severity == "error"
            and (d.position.line, d.position.column) == (line, column)]
    assert any(fragment in d.message or fragment in d.hint for d in hits), \
        [d.render() for d in diagnostics]
    return hits[0]


def test_a_session_window_compiles_to_a_gap_and_no_size(tmp_path: object) -> None:
    text = program(window('    <param name="gap" value="30 seconds"/>\n'
                          '    <param name="group-by" value="bidder"/>\n'), tmp_path)
    assert "gap='30 seconds'" in text and "window=None" in text


def test_a_tumbling_window_still_compiles_without_a_gap(tmp_path: object) -> None:
    text = program(window('    <param name="size" value="10 seconds"/>\n'), tmp_path)
    assert "window='10 seconds'" in text and "gap=" not in text


@pytest.mark.parametrize("params,needle,fragment", [
    ('    <param name="gap" value="7 seconds"/>\n    <param name="size" value="1 seconds"/>\n',
     "7 seconds", "a size or a gap, not both"),
    ('    <param name="gap" value="1 seconds"/>\n    <param name="slide" value="7 seconds"/>\n',
     "7 seconds", "has no slide"),
    ('    <param name="gap" value="0 seconds"/>\n', "0 seconds", "above zero"),
    ('', '<operator name="w"', "needs a size or a gap"),
])
def test_session_window_misuse_is_refused_at_its_value(params: str, needle: str,
                                                       fragment: str) -> None:
    refused_at(window(params), needle, fragment)


def test_a_session_window_cannot_scale_at_run_time() -> None:
    xml = window('    <param name="gap" value="5 seconds"/>\n'
                 '    <param name="group-by" value="bidder"/>\n').replace(
        'type="window-aggregate"', 'type="window-aggregate" max-parallelism="4"')
    refused_at(xml, '4">', "not sessions")


def test_a_session_window_may_be_partitioned_by_its_key(tmp_path: object) -> None:
    xml = window('    <param name="gap" value="5 seconds"/>\n'
                 '    <param name="group-by" value="bidder"/>\n').replace(
        'type="window-aggregate"', 'type="window-aggregate" parallelism="2"')
    compiled = compile_spec_text(xml, "nx.xml", base_dir=str(tmp_path))
    assert sum("rt.window_aggregate(" in t.program for t in compiled.query.tasks) == 2


def test_distinct_counts_and_arg_max_compile_with_their_types(tmp_path: object) -> None:
    aggregates = ('    <aggregate name="bidders" function="count_distinct" column="bidder"/>\n'
                  '    <aggregate name="approx" function="approx_count_distinct" '
                  'column="bidder"/>\n'
                  '    <aggregate name="top" function="max_by" column="bidder" by="price"/>\n'
                  '    <aggregate name="cheap" function="min_by" column="url" by="price"/>\n')
    xml = window('    <param name="size" value="10 seconds"/>\n', aggregates)
    assert "('top', 'max_by', 'bidder', 'price')" in program(xml, tmp_path)
    graph, _ = check_spec_text(xml, "nx.xml")
    assert graph is not None
    types = {f.name: f.type.value for f in graph.stream("s").schema}
    assert types == {"window_start": "timestamp", "window_end": "timestamp", "bidders": "int",
                     "approx": "int", "top": "int", "cheap": "string"}


@pytest.mark.parametrize("aggregate,needle,fragment", [
    ('<aggregate name="t" function="max_by" column="bidder"/>', '<aggregate name="t"',
     "needs a by column"),
    ('<aggregate name="t" function="min_by" column="bidder" by="nope"/>', 'nope',
     "does not have"),
    ('<aggregate name="t" function="sum" column="price" by="price"/>', 'price"/>',
     "takes no by column"),
    ('<aggregate name="t" function="count_distinct"/>', '<aggregate name="t"', "needs a column"),
    ('<aggregate name="t" function="count_distinct" column="zz"/>', 'zz', "does not have"),
])
def test_aggregate_misuse_is_refused_at_its_value(aggregate: str, needle: str,
                                                  fragment: str) -> None:
    xml = window('    <param name="size" value="10 seconds"/>\n', f"    {aggregate}\n")
    refused_at(xml, needle, fragment)


DEDUP = ('  <operator name="d" type="deduplicate">\n    <input name="b"/>\n'
         '    <param name="key" value="{key}"/>\n    <param name="time" value="{time}"/>\n'
         '    <param name="watermark" value="10 seconds"/>\n    <output name="u"/>\n'
         '  </operator>\n')


def test_deduplicate_compiles_and_keeps_its_inputs_type(tmp_path: object) -> None:
    xml = spec(DEDUP.format(key="auction, bidder", time="date_time"), "u")
    text = program(xml, tmp_path)
    assert "rt.deduplicate(" in text and "keys=('auction', 'bidder')" in text
    graph, _ = check_spec_text(xml, "nx.xml")
    assert graph is not None
    assert graph.stream("u").schema == graph.stream("b").schema


@pytest.mark.parametrize("key,time,needle,fragment", [
    ("auction, nope", "date_time", "auction, nope", "not in stream"),
    ("auction", "price", 'price"/>\n    <param name="watermark"', "timestamp"),
])
def test_deduplicate_misuse_is_refused_at_its_value(key: str, time: str, needle: str,
                                                    fragment: str) -> None:
    refused_at(spec(DEDUP.format(key=key, time=time), "u"), needle, fragment)


def test_a_window_over_deduplicated_rows_uses_its_time_column() -> None:
    xml = spec(DEDUP.format(key="bidder", time="date_time")
               + '  <operator name="w" type="window-aggregate">\n    <input name="u"/>\n'
                 '    <param name="time" value="expires"/>\n'
                 '    <param name="size" value="1 seconds"/>\n'
                 '    <aggregate name="n" function="count"/>\n    <output name="s"/>\n'
                 '  </operator>\n', "s")
    xml = xml.replace('value="bid"', 'value="auction"').replace('"bidder"', '"seller"')
    refused_at(xml, 'expires"', "not an event-time column")


def projection(fields: str) -> str:
    return spec('  <operator name="p" type="project">\n    <input name="b"/>\n'
                f'{fields}    <output name="p"/>\n  </operator>\n', "p")


def test_case_regular_expressions_and_split_compile(tmp_path: object) -> None:
    text = program(projection(
        '    <field name="kind" value="case when price &gt; 10 then \'big\' else \'small\' end"/>\n'
        '    <field name="id" value="regexp_extract(url, \'(&amp;|^)id=([^&amp;]*)\', 2)"/>\n'
        '    <field name="dir" value="split_part(url, \'/\', 4)"/>\n'), tmp_path)
    assert "(&|^)id=([^&]*)" in text


def test_every_problem_of_the_new_forms_is_refused_at_its_place() -> None:
    xml = projection(
        '    <field name="kind" value="case when price then 1 else \'x\' end"/>\n'
        '    <field name="bad" value="regexp_like(url, \'(a+)+$\')"/>\n')
    refused_at(xml, "price then", "the condition of 'when' must be boolean")
    refused_at(xml, "'x' end", "the values of 'case' must have one type")
    refused_at(xml, "'(a+)+$'", "backtrack exponentially")
