"""Pure compile tests of issue 37's column-bounded join (`right-end`) and the `top-n` operator:
what compiles, what the generated call carries, the output columns, and every misuse refused
at its value with file:line:column (all of a spec's problems at once)."""

from __future__ import annotations

import pytest

from common.top_n import OrderKey, parse_order
from compiler.pipeline import check_spec_text
from tests.test_nexmark_compile import program, refused_at, spec

AUCTIONS = ('  <operator name="auctions" type="generator">\n'
            '    <param name="shape" value="auction"/>\n    <output name="a"/>\n'
            '  </operator>\n')


def join(params: str) -> str:
    return spec(AUCTIONS + '  <operator name="j" type="join">\n'
                '    <input name="b"/> <input name="a"/>\n'
                '    <param name="left-key" value="auction"/> <param name="right-key" value="id"/>\n'
                '    <param name="time" value="date_time"/>\n'
                f'{params}    <output name="joined"/>\n  </operator>\n', "joined")


def top(params: str) -> str:
    return spec('  <operator name="t" type="top-n">\n    <input name="b"/>\n'
                '    <param name="time" value="date_time"/>\n'
                f'{params}    <output name="ranked"/>\n  </operator>\n', "ranked")


TOP = ('    <param name="size" value="10 seconds"/> <param name="group-by" value="auction"/>\n'
       '    <param name="n" value="10"/> <param name="order-by" value="price desc, date_time"/>\n')


def test_a_join_bounded_by_a_right_column_compiles_to_right_end(tmp_path: object) -> None:
    text = program(join('    <param name="right-end" value="expires"/>\n'
                        '    <param name="within" value="1 minutes"/>\n'), tmp_path)
    assert "right_end='expires'" in text and "within='1 minutes'" in text


def test_an_interval_join_carries_no_right_end(tmp_path: object) -> None:
    text = program(join('    <param name="within" value="1 minutes"/>\n'), tmp_path)
    assert "right_end" not in text


@pytest.mark.parametrize("value,fragment", [
    ("nope", "does not have"),            # no such column of the right input
    ("seller", "needs a timestamp column"),  # an int column
])
def test_a_bad_right_end_is_refused_at_its_value(value: str, fragment: str) -> None:
    xml = join(f'    <param name="right-end" value="{value}"/>\n'
               '    <param name="within" value="1 minutes"/>\n')
    refused_at(xml, f'{value}"/>', fragment)


def test_a_top_n_compiles_with_its_output_columns(tmp_path: object) -> None:
    text = program(top(TOP), tmp_path)
    assert "rt.top_n(" in text and "n=10" in text and "order_by='price desc, date_time'" in text
    graph, _ = check_spec_text(top(TOP), "nx.xml")
    assert graph is not None
    assert graph.stream("ranked").schema.names == (
        "window_start", "window_end", "auction", "rank", "bidder", "price", "channel", "url",
        "date_time")


def test_a_window_reads_a_top_n_by_window_end(tmp_path: object) -> None:
    xml = top(TOP).replace(
        '  <operator name="sink"',
        '  <operator name="w" type="window-aggregate">\n    <input name="ranked"/>\n'
        '    <param name="time" value="window_end"/> <param name="size" value="10 seconds"/>\n'
        '    <aggregate name="n" function="count"/>\n    <output name="s"/>\n  </operator>\n'
        '  <operator name="sink"').replace('<input name="ranked"/>\n    <param name="path"',
                                            '<input name="s"/>\n    <param name="path"')
    assert "rt.window_aggregate(" in program(xml, tmp_path)


@pytest.mark.parametrize("params,needle,fragment", [
    (TOP.replace('"10"/>', '"0"/>'), '0"/>', "below the minimum 1"),
    (TOP.replace('"10"/>', '"10001"/>'), '10001"/>', "above the maximum 10000"),
    (TOP.replace("price desc, date_time", "price down"), 'price down"/>', "is not 'column'"),
    (TOP.replace("price desc, date_time", "prize desc"), 'prize desc"/>', "price"),
    (TOP.replace("price desc, date_time", "price, price desc"), 'price, price desc"/>',
     "ordered by twice"),
    (TOP.replace("price desc, date_time", "price,,url"), 'price,,url"/>', "is empty"),
    (TOP.replace('"10 seconds"', '"0 seconds"'), '0 seconds"/>', "above zero"),
    (TOP.replace('"auction"/>', '"auctoin"/>'), 'auctoin"/>', "not in stream"),
])
def test_a_bad_top_n_is_refused_at_its_value(params: str, needle: str, fragment: str) -> None:
    refused_at(top(params), needle, fragment)


def test_every_problem_of_a_top_n_at_once() -> None:
    bad = TOP.replace('"10"/>', '"0"/>').replace("price desc, date_time", "prize")
    graph, diagnostics = check_spec_text(top(bad), "nx.xml")
    assert graph is None
    messages = " | ".join(d.message for d in diagnostics if d.severity == "error")
    assert "below the minimum" in messages and "prize" in messages, messages


def test_a_top_n_refuses_an_input_column_named_like_its_own() -> None:
    xml = spec('  <operator name="p" type="project">\n    <input name="b"/>\n'
               '    <field name="rank" value="price"/> <field name="date_time" value="date_time"/>\n'
               '    <output name="q"/>\n  </operator>\n'
               '  <operator name="t" type="top-n">\n    <input name="q"/>\n'
               '    <param name="time" value="date_time"/> <param name="size" value="1 seconds"/>\n'
               '    <param name="n" value="1"/> <param name="order-by" value="rank"/>\n'
               '    <output name="ranked"/>\n  </operator>\n', "ranked")
    refused_at(xml, '<input name="q"/>', "would produce column 'rank' twice")


def test_a_top_n_cannot_be_rescaled_at_run_time() -> None:
    xml = top(TOP).replace('type="top-n"', 'type="top-n" max-parallelism="4"')
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is None
    assert any("stateful top-n" in d.message for d in diagnostics), \
        [d.render() for d in diagnostics]


def test_a_top_n_may_be_partitioned_by_its_group() -> None:
    xml = top(TOP).replace('type="top-n"', 'type="top-n" parallelism="2"')
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is not None, [d.render() for d in diagnostics]


def test_order_keys_parse_with_their_directions() -> None:
    assert parse_order("price desc, date_time ASC ,url") == (
        (OrderKey("price", True), OrderKey("date_time", False), OrderKey("url", False)), [])
    keys, problems = parse_order("a b c, 1x")
    assert keys == () and len(problems) == 2
