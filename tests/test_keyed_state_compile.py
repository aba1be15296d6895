"""Pure compile tests of count windows (`window-aggregate` with `rows`) and updating aggregates
(`aggregate`, issue 37, Nexmark q4 and q6): what compiles, what the generated calls carry, and
every misuse refused at its value with file:line:column, all of them at once."""

from __future__ import annotations

import pytest

from compiler.pipeline import check_spec_text
from tests.test_nexmark_compile import program, refused_at, spec, window

COUNT = '    <aggregate name="n" function="count"/>\n'
AVG = '    <aggregate name="avg_price" function="avg" column="price"/>\n'
ROWS = '    <param name="rows" value="10"/> <param name="group-by" value="bidder"/>\n'


def updating(params: str = '    <param name="ttl" value="1 hours"/>\n',
             aggregates: str = AVG, reader: str = "") -> str:
    return spec('  <operator name="a" type="aggregate">\n    <input name="b"/>\n'
                '    <param name="time" value="date_time"/> <param name="group-by" '
                f'value="auction"/>\n{params}{aggregates}    <output name="t"/>\n'
                f'  </operator>\n{reader}', "t" if not reader else "r")


def test_a_count_window_compiles_to_rows_with_a_windows_output(tmp_path: object) -> None:
    text = program(window(ROWS, AVG), tmp_path)
    assert "rows=10" in text and "window=None" in text
    graph, _ = check_spec_text(window(ROWS, AVG), "nx.xml")
    assert graph is not None
    assert graph.stream("s").schema.names == ("window_start", "window_end", "bidder",
                                              "avg_price")


def test_an_updating_aggregate_compiles_with_an_upsert_file_sink(tmp_path: object) -> None:
    text = program(updating(), tmp_path)
    assert "rt.updating_aggregate(" in text and "ttl='1 hours'" in text
    assert "upsert_key=('auction',)" in text
    graph, _ = check_spec_text(updating(), "nx.xml")
    assert graph is not None and graph.stream("t").schema.names == ("auction", "avg_price")


def test_a_plain_file_sink_carries_no_upsert_key(tmp_path: object) -> None:
    assert "upsert_key" not in program(window(ROWS, AVG), tmp_path)


@pytest.mark.parametrize("params,aggregates,needle,fragment", [
    ('    <param name="rows" value="10"/> <param name="size" value="1 seconds"/>\n', COUNT,
     '1 seconds"/>', "a count window (rows) has no size"),
    ('    <param name="rows" value="10"/> <param name="gap" value="1 seconds"/>\n', COUNT,
     '1 seconds"/>', "has no gap"),
    ('    <param name="rows" value="0"/>\n', COUNT, '0"/>', "below the minimum 1"),
    ('    <param name="rows" value="10001"/>\n', COUNT, '10001"/>', "above the maximum 10000"),
    (ROWS, '    <aggregate name="d" function="count_distinct" column="price"/>\n',
     'count_distinct"', "computes count, sum, avg, min, max, not count_distinct"),
    (ROWS, '    <aggregate name="w" function="max_by" column="bidder" by="price"/>\n',
     'max_by"', "not max_by"),
])
def test_count_window_misuse_is_refused_at_its_value(params: str, aggregates: str, needle: str,
                                                     fragment: str) -> None:
    refused_at(window(params, aggregates), needle, fragment)


def test_an_updating_aggregates_misuse_is_refused_at_its_value() -> None:
    refused_at(updating('    <param name="ttl" value="0 seconds"/>\n'), '0 seconds"/>',
               "a ttl must be above zero")
    refused_at(updating(aggregates='    <aggregate name="d" function="approx_count_distinct" '
                                   'column="bidder"/>\n'), 'approx_count_distinct"',
               "not approx_count_distinct")
    graph, diagnostics = check_spec_text(updating(""), "nx.xml")
    assert graph is None and any("ttl" in d.message for d in diagnostics)


FILTER = ('  <operator name="f" type="filter">\n    <input name="t"/>\n'
          '    <param name="condition" value="t.avg_price &gt; 1"/>\n    <output name="r"/>\n'
          '  </operator>\n')


def test_an_updating_aggregates_results_go_only_to_a_file_or_console_sink() -> None:
    refused_at(updating(reader=FILTER), '<input name="t"/>\n    <param name="condition"',
               "cannot read 't', the updating results")
    published = updating().replace('<output name="t"/>', '<output name="t" publish="true"/>')
    refused_at(published, '<output name="t" publish', "cannot publish 't'")


HOURLY = ('  <operator name="h" type="window-aggregate">\n    <input name="b"/>\n'
          '    <param name="time" value="date_time"/> <param name="size" value="1 hours"/>\n'
          f'{COUNT}    <output name="hs"/>\n  </operator>\n')


def test_keyed_operators_read_only_streams_without_event_time() -> None:
    """After a window (an aggregation: Spark runs no applyInPandasWithState after one) a count
    window is refused at its input; a window after a count window is refused at its time
    (the count window's rows come behind the watermark: no event time to carry)."""
    after = spec(HOURLY + '  <operator name="w" type="window-aggregate">\n'
                 '    <input name="hs"/>\n    <param name="time" value="window_end"/>\n'
                 f'    <param name="rows" value="3"/>\n{COUNT}    <output name="s"/>\n'
                 '  </operator>\n', "s")
    refused_at(after, '<input name="hs"/>', "comes after a window, top-n, join or deduplicate")
    before = spec('  <operator name="w" type="window-aggregate">\n    <input name="b"/>\n'
                  f'    <param name="time" value="date_time"/>\n{ROWS}{COUNT}'
                  '    <output name="s"/>\n  </operator>\n'
                  '  <operator name="h" type="window-aggregate">\n    <input name="s"/>\n'
                  '    <param name="time" value="window_end"/> <param name="size" '
                  f'value="1 hours"/>\n{COUNT}    <output name="hs"/>\n  </operator>\n', "hs")
    refused_at(before, 'window_end"/> <param name="size"', "count window or updating aggregate")


def test_a_count_window_is_not_partitioned() -> None:
    xml = window(ROWS, COUNT).replace('type="window-aggregate"',
                                      'type="window-aggregate" parallelism="2"')
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is None and any("cannot be partitioned" in d.message
                                 and "count windows" in d.hint for d in diagnostics)


def test_every_problem_is_reported_at_once() -> None:
    xml = updating('    <param name="ttl" value="0 seconds"/>\n',
                   '    <aggregate name="d" function="count_distinct" column="bidder"/>\n',
                   reader=FILTER)
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    messages = [d.message for d in diagnostics if d.severity == "error"]
    assert graph is None
    assert any("ttl" in m for m in messages) and any("count_distinct" in m for m in messages)
