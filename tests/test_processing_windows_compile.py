"""Pure compile tests of processing-time windows (issue 37, Nexmark q12): what compiles, what the
generated call carries, and every misuse refused at its value with file:line:column."""

from __future__ import annotations

import pytest

from compiler.pipeline import check_spec_text
from tests.test_nexmark_compile import program, refused_at, spec

COUNT = '    <aggregate name="n" function="count"/>\n'


def processing(params: str, clock: str = "processing") -> str:
    return spec('  <operator name="w" type="window-aggregate">\n    <input name="b"/>\n'
                f'    <param name="clock" value="{clock}"/>\n'
                f'{params}{COUNT}    <output name="s"/>\n  </operator>\n', "s")


SIZE = '    <param name="size" value="10 seconds"/> <param name="group-by" value="bidder"/>\n'


def test_a_processing_time_window_compiles_without_a_time_column(tmp_path: object) -> None:
    text = program(processing(SIZE), tmp_path)
    assert "clock='processing'" in text and "time=None" in text
    graph, _ = check_spec_text(processing(SIZE), "nx.xml")
    assert graph is not None
    assert graph.stream("s").schema.names == ("window_start", "window_end", "bidder", "n")


def test_an_event_time_window_carries_its_clock_only_when_written(tmp_path: object) -> None:
    xml = processing('    <param name="time" value="date_time"/>\n' + SIZE, clock="event")
    assert "clock='event'" in program(xml, tmp_path)
    unwritten = xml.replace('    <param name="clock" value="event"/>\n', "")
    text = program(unwritten, tmp_path)
    assert "clock=" not in text and "time='date_time'" in text


@pytest.mark.parametrize("params,needle,fragment", [
    ('    <param name="time" value="date_time"/>\n', 'date_time"/>', "has no time"),
    ('    <param name="watermark" value="5 seconds"/>\n', '5 seconds"/>', "has no watermark"),
    ('    <param name="gap" value="5 seconds"/>\n', '5 seconds"/>\n    <agg', "has no gap"),
])
def test_processing_time_misuse_is_refused_at_its_value(params: str, needle: str,
                                                        fragment: str) -> None:
    refused_at(processing(params + (SIZE if "gap" not in params else "")), needle, fragment)


def test_an_unknown_clock_is_refused_at_its_value() -> None:
    refused_at(processing(SIZE, clock="wall"), 'wall"/>', "not one of event, processing")


def test_an_event_time_window_without_time_is_refused_with_the_clock_as_hint() -> None:
    xml = processing(SIZE, clock="event")
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is None
    assert any("needs the parameter 'time'" in d.message and "clock" in d.hint
               for d in diagnostics)


def test_a_processing_time_window_and_an_event_time_operator_cannot_share_a_dataflow() -> None:
    other = ('  <operator name="d" type="deduplicate">\n    <input name="b"/>\n'
             '    <param name="key" value="auction"/> <param name="time" value="date_time"/>\n'
             '    <param name="watermark" value="5 seconds"/>\n    <output name="firsts"/>\n'
             '  </operator>\n'
             '  <operator name="sink2" type="file-sink">\n    <input name="firsts"/>\n'
             '    <param name="path" value="firsts.jsonl"/>\n  </operator>\n')
    xml = processing(SIZE).replace("</dataflow>", other + "</dataflow>")
    refused_at(xml, 'processing"/>', "cannot share a dataflow with event-time deduplicate")


def test_a_processing_time_window_cannot_read_event_time() -> None:
    first = ('  <operator name="e" type="window-aggregate">\n    <input name="b"/>\n'
             '    <param name="time" value="date_time"/> <param name="size" value="1 seconds"/>\n'
             f'{COUNT}    <output name="counts"/>\n  </operator>\n')
    xml = processing(SIZE).replace('<operator name="w"', first.strip() + '\n  <operator name="w"')
    xml = xml.replace('<input name="b"/>\n    <param name="clock"',
                      '<input name="counts"/>\n    <param name="clock"')
    refused_at(xml, 'processing"/>', "has event time")


def test_a_processing_time_window_cannot_scale_at_run_time() -> None:
    xml = processing(SIZE).replace('type="window-aggregate"',
                                   'type="window-aggregate" max-parallelism="4"')
    refused_at(xml, '4">', "over event time")


def test_an_event_time_window_may_read_a_processing_time_window(tmp_path: object) -> None:
    second = ('  <operator name="top" type="window-aggregate">\n    <input name="s"/>\n'
              '    <param name="time" value="window_end"/> <param name="size" value="1 minutes"/>\n'
              '    <aggregate name="most" function="max" column="n"/>\n'
              '    <output name="tops"/>\n  </operator>\n')
    xml = processing(SIZE).replace('  <operator name="sink"', second + '  <operator name="sink"')
    xml = xml.replace('<input name="s"/>\n    <param name="path"', '<input name="tops"/>\n'
                      '    <param name="path"')
    assert "rt.window_aggregate(" in program(xml, tmp_path)
