"""Malformed specs: each is refused with its message at the exact file:line:column.

Every case names a needle: the text in the spec where the diagnostic must point (its first
character), so the expected position is read off the spec itself, not hard-coded."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from compiler.pipeline import check_spec_text
from tests.spec_snippets import READING_TYPE, SINK, SOURCE, dataflow, locate, with_source_and_sink


@dataclass(frozen=True)
class Case:
    id: str
    xml: str
    needle: str  # where the diagnostic points
    message: str  # a fragment of the message (or hint)
    nth: int = 0


def _filter(condition: str, out_type: str = ' type="reading"') -> str:
    return (f'  <operator name="f" type="filter">\n    <input name="raw"/>\n'
            f'    <param name="condition" value="{condition}"/>\n'
            f'    <output name="hot"{out_type}/>\n  </operator>\n')


def _window(params: str, aggregates: str = '    <aggregate name="n" function="count"/>\n') -> str:
    return (f'  <operator name="w" type="window-aggregate">\n    <input name="raw"/>\n{params}'
            f'{aggregates}    <output name="agg"/>\n  </operator>\n')


_W_OK = ('    <param name="time" value="ts"/>\n    <param name="size" value="10 seconds"/>\n')

def _over(stream: str, time: str, out: str = "agg2") -> str:
    """A second window, over `stream`, on event time `time`."""
    return (f'  <operator name="w2" type="window-aggregate">\n    <input name="{stream}"/>\n'
            f'    <param name="time" value="{time}"/>\n    <param name="size" value="1 minute"/>\n'
            f'    <aggregate name="top" function="max" column="n"/>\n'
            f'    <output name="{out}"/>\n  </operator>\n')


def _keep(fields: str) -> str:
    """A project of the window's results into `kept`."""
    return (f'  <operator name="p" type="project">\n    <input name="agg"/>\n{fields}'
            f'    <output name="kept"/>\n  </operator>\n')


_SECOND_SOURCE = ('  <operator name="src2" type="generator">\n    <param name="shape" value="stock"/>\n'
                  '    <output name="ticks"/>\n  </operator>\n')


def _control(fields: dict[str, str], scheduler: str = "") -> str:
    """A project building `fields` from raw, read by a control-sink `ctl`."""
    lines = "".join(f'    <field name="{n}" value="{v}"/>\n' for n, v in fields.items())
    param = f'    <param name="scheduler" value="{scheduler}"/>\n' if scheduler else ""
    return (f'  <operator name="p" type="project">\n    <input name="raw"/>\n{lines}'
            f'    <output name="tuples"/>\n  </operator>\n'
            f'  <operator name="ctl" type="control-sink">\n    <input name="tuples"/>\n{param}'
            f'  </operator>\n')


_TUPLE = {"query": "'q'", "operator": "'f'", "parameter": "'condition'", "value": "'true'"}

CASES = [
    Case("not-well-formed", '<dataflow name="t">\n  <operator name="a" type="filter">\n</dataflow>\n',
         "</dataflow>", "not well-formed"),
    Case("doctype", '<?xml version="1.0"?>\n<!DOCTYPE dataflow>\n<dataflow name="t"/>\n',
         "<!DOCTYPE", "DOCTYPE is not allowed"),
    Case("billion-laughs",
         '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
         ' <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">\n]>\n'
         '<dataflow name="&lol2;"/>\n', "<!DOCTYPE", "DOCTYPE is not allowed"),
    Case("xxe", '<?xml version="1.0"?>\n<!DOCTYPE d [ <!ENTITY x SYSTEM "file:///etc/passwd"> ]>\n'
                '<dataflow name="t">&x;</dataflow>\n', "<!DOCTYPE", "DOCTYPE is not allowed"),
    Case("wrong-root", '<pipeline name="t"/>\n', "<pipeline", "expected <dataflow>"),
    Case("no-name", "<dataflow>\n" + READING_TYPE + SOURCE + SINK.format(stream="raw")
         + "</dataflow>\n", "<dataflow", "needs a 'name' attribute"),
    Case("bad-query-name", dataflow(SOURCE + SINK.format(stream="raw"), name="my query"),
         'name="my query"', "not a valid name"),
    Case("unknown-element", dataflow(SOURCE + '  <operatr name="x" type="filter"/>\n'
                                     + SINK.format(stream="raw")),
         "<operatr", "did you mean 'operator'"),
    Case("unknown-attribute", dataflow(SOURCE.replace('type="generator"',
                                                      'type="generator" speed="3"')
                                       + SINK.format(stream="raw")),
         'speed="3"', "has no attribute 'speed'"),
    Case("param-without-value", dataflow(SOURCE.replace('<param name="seed" value="3"/>',
                                                        '<param name="seed"/>')
                                         + SINK.format(stream="raw")),
         '<param name="seed"/>', "needs a 'value' attribute"),
    Case("unknown-operator-type", with_source_and_sink(_filter("raw.temp &gt; 3").replace(
        'type="filter"', 'type="filtr"'), "hot"), 'filtr"', "did you mean 'filter'"),
    Case("duplicate-operator", with_source_and_sink(
        _filter("raw.temp &gt; 3").replace('name="f"', 'name="src"'), "hot"),
        '<operator name="src"', "declared twice", nth=1),
    Case("duplicate-type", dataflow(SOURCE + SINK.format(stream="raw"),
                                    types=READING_TYPE + READING_TYPE),
         '<type name="reading">', "type 'reading' is declared twice", nth=1),
    Case("duplicate-column", dataflow(SOURCE.replace('type="reading"', "") + SINK.format(
        stream="raw"), types='  <type name="r">\n    <column name="a" type="int"/>\n'
                             '    <column name="a" type="int"/>\n  </type>\n'),
         '<column name="a"', "column 'a' appears twice", nth=1),
    Case("unknown-column-type", dataflow(SOURCE.replace(' type="reading"', '') + SINK.format(
        stream="raw"), types='  <type name="r">\n    <column name="a" type="integer"/>\n  </type>\n'),
         'integer"', "did you mean 'int'"),
    Case("unknown-stream", dataflow(SOURCE + SINK.format(stream="rawz")),
         '<input name="rawz"', "did you mean 'raw'"),
    Case("two-producers", dataflow(SOURCE + SOURCE.replace('name="src"', 'name="src2"')
                                   + SINK.format(stream="raw")),
         '<output name="raw"', "produced by both 'src' and 'src2'", nth=1),
    Case("cycle", dataflow(
        '  <operator name="a" type="filter">\n    <input name="y"/>\n'
        '    <param name="condition" value="true"/>\n    <output name="x" type="reading"/>\n'
        '  </operator>\n  <operator name="b" type="filter">\n    <input name="x"/>\n'
        '    <param name="condition" value="true"/>\n    <output name="y" type="reading"/>\n'
        '  </operator>\n' + SINK.format(stream="x")), '<operator name="a"', "has a cycle"),
    Case("missing-condition", with_source_and_sink(
        '  <operator name="f" type="filter">\n    <input name="raw"/>\n'
        '    <output name="hot"/>\n  </operator>\n', "hot"),
        '<operator name="f"', "needs the parameter 'condition'"),
    Case("misspelt-param", with_source_and_sink(_filter("raw.temp &gt; 3").replace(
        'name="condition"', 'name="conditon"'), "hot"), '<param name="conditon"',
        "did you mean 'condition'"),
    Case("condition-parse-error", with_source_and_sink(_filter("raw.temp &gt; &gt; 3"), "hot"),
         "&gt; 3", "condition of 'f'"),
    Case("condition-unknown-column", with_source_and_sink(_filter("raw.tmp &gt; 3"), "hot"),
         "raw.tmp", "tmp"),
    Case("condition-not-boolean", with_source_and_sink(_filter("raw.temp + 1"), "hot"),
         'raw.temp + 1"', "not boolean"),
    Case("condition-type-mismatch", with_source_and_sink(_filter("raw.sensor &gt; 3"), "hot"),
         "raw.sensor", "string"),
    Case("injection-python", with_source_and_sink(_filter("__import__('os').system('id')"), "hot"),
         "__import__", "condition of 'f'"),
    Case("injection-spark-reflect", with_source_and_sink(
        _filter("reflect('java.lang.Runtime', 'getRuntime') = 1"), "hot"), "reflect",
        "reflect"),
    Case("rate-not-a-number", dataflow(SOURCE.replace('<param name="seed" value="3"/>',
                                                      '<param name="rate" value="fast"/>')
                                       + SINK.format(stream="raw")),
         'fast"', "'fast' is not a number"),
    Case("unknown-shape", dataflow(SOURCE.replace('value="sensor"', 'value="weather"')
                                   + SINK.format(stream="raw")),
         'weather"', "not one of sensor, stock, sequence"),
    Case("generator-type-mismatch", dataflow(SOURCE.replace('value="sensor"', 'value="stock"')
                                             + SINK.format(stream="raw")),
         '<output name="raw"', "declared as type 'reading'"),
    Case("source-without-type", dataflow(
        '  <operator name="src" type="file-source">\n    <param name="path" value="in.jsonl"/>\n'
        '    <output name="raw"/>\n  </operator>\n' + SINK.format(stream="raw")),
        '<output name="raw"', "needs a type"),
    Case("window-without-time", with_source_and_sink(
        _window('    <param name="size" value="10 seconds"/>\n'), "agg"),
        '<operator name="w"', "needs the parameter 'time'"),
    Case("window-time-not-timestamp", with_source_and_sink(
        _window('    <param name="time" value="temp"/>\n    <param name="size" value="1 minute"/>\n'),
        "agg"), 'temp"/>', "needs a timestamp column"),
    Case("window-slide-larger", with_source_and_sink(
        _window(_W_OK + '    <param name="slide" value="20 seconds"/>\n'), "agg"),
        '20 seconds"', "at most the window size"),
    Case("window-over-window-start", with_source_and_sink(
        _window(_W_OK) + _over("agg", "window_start"), "agg2"),
        'window_start"', "not an event-time column of stream 'agg'"),
    Case("window-after-project-dropped-event-time", with_source_and_sink(
        _window(_W_OK) + _keep('    <field name="late_t" value="window_start"/>\n'
                               '    <field name="n" value="n"/>\n')
        + _over("kept", "late_t"), "agg2"),
        'late_t"', "its event-time columns are none", nth=1),
    Case("window-bad-duration", with_source_and_sink(
        _window('    <param name="time" value="ts"/>\n    <param name="size" value="ten seconds"/>\n'),
        "agg"), 'ten seconds"', "not a duration"),
    Case("aggregate-unknown-function", with_source_and_sink(_window(
        _W_OK, '    <aggregate name="a" function="average" column="temp"/>\n'), "agg"),
        'average"', "did you mean 'avg'"),
    Case("sum-over-string", with_source_and_sink(_window(
        _W_OK, '    <aggregate name="a" function="sum" column="sensor"/>\n'), "agg"),
        'sensor"/>', "sum(sensor) needs a numeric column", nth=1),
    Case("avg-without-column", with_source_and_sink(_window(
        _W_OK, '    <aggregate name="a" function="avg"/>\n'), "agg"),
        '<aggregate name="a"', "needs a column"),
    Case("group-by-unknown", with_source_and_sink(_window(
        _W_OK + '    <param name="group-by" value="sensr"/>\n'), "agg"),
        'sensr"', "did you mean 'sensor'"),
    Case("join-one-input", with_source_and_sink(
        '  <operator name="j" type="join">\n    <input name="raw"/>\n'
        '    <param name="key" value="sensor"/>\n    <param name="time" value="ts"/>\n'
        '    <param name="within" value="1 second"/>\n    <output name="pairs"/>\n  </operator>\n',
        "pairs"), '<operator name="j"', "takes exactly 2 inputs"),
    Case("join-key-types-differ", dataflow(SOURCE + _SECOND_SOURCE +
        '  <operator name="j" type="join">\n    <input name="raw"/>\n    <input name="ticks"/>\n'
        '    <param name="left-key" value="temp"/>\n    <param name="right-key" value="symbol"/>\n'
        '    <param name="time" value="ts"/>\n    <param name="within" value="1 second"/>\n'
        '    <output name="pairs"/>\n  </operator>\n' + SINK.format(stream="pairs")),
        '<operator name="j"', "have different types"),
    Case("union-types-differ", dataflow(SOURCE + _SECOND_SOURCE +
        '  <operator name="u" type="union">\n    <input name="raw"/>\n    <input name="ticks"/>\n'
        '    <output name="all"/>\n  </operator>\n' + SINK.format(stream="all")),
        '<input name="ticks"', "differs from 'raw'"),
    Case("no-sink", dataflow(SOURCE), '<dataflow', "has no sink"),
    Case("sink-with-output", dataflow(SOURCE + SINK.format(stream="raw").replace(
        "  </operator>", '    <output name="more" type="reading"/>\n  </operator>')),
        '<operator name="sink"', "takes exactly 0 outputs"),
    Case("field-on-filter", with_source_and_sink(_filter("true").replace(
        "    <output", '    <field name="x" value="1"/>\n    <output'), "hot"),
        '<field name="x"', "not used by a filter"),
    Case("project-duplicate-field", with_source_and_sink(
        '  <operator name="p" type="project">\n    <input name="raw"/>\n'
        '    <field name="a" value="temp"/>\n    <field name="a" value="humidity"/>\n'
        '    <output name="proj"/>\n  </operator>\n', "proj"),
        '<field name="a"', "field 'a' appears twice", nth=1),
    Case("bad-endpoint", dataflow(SOURCE + '  <operator name="net" type="network-sink">\n'
                                           '    <input name="raw"/>\n'
                                           '    <param name="endpoint" value="http://x:80"/>\n'
                                           '  </operator>\n'),
         'http://x:80"', "not a ZeroMQ TCP endpoint"),
    Case("control-sink-missing-column", dataflow(SOURCE + _control(
        {k: v for k, v in _TUPLE.items() if k != "parameter"})),
        '<input name="tuples"', "not a control stream: no column parameter"),
    Case("control-sink-value-not-string", dataflow(SOURCE + _control(
        {**_TUPLE, "value": "temp"})),
        '<input name="tuples"', "value is double, not string"),
    Case("control-sink-extra-column", dataflow(SOURCE + _control({**_TUPLE, "ts": "ts"})),
        '<input name="tuples"', "other columns ts"),
    Case("control-sink-reads-raw-readings", dataflow(SOURCE + '  <operator name="ctl" '
        'type="control-sink">\n    <input name="raw"/>\n  </operator>\n'),
        '<input name="raw"', "build them with a project"),
    Case("control-sink-bad-scheduler", dataflow(SOURCE + _control(
        _TUPLE, scheduler="https://127.0.0.1:8088")),
        'https://127.0.0.1:8088"', "not an API address"),
    Case("unknown-output-type", dataflow(SOURCE.replace('type="reading"', 'type="readng"')
                                         + SINK.format(stream="raw")),
         '<output name="raw"', "did you mean 'reading'"),
    Case("param-twice", dataflow(SOURCE.replace('<param name="seed" value="3"/>',
                                                '<param name="seed" value="3"/><param name="seed" '
                                                'value="4"/>') + SINK.format(stream="raw")),
         '<param name="seed" value="4"', "given twice"),
    Case("text-in-operator", dataflow(SOURCE.replace("  </operator>", "    oops\n  </operator>")
                                      + SINK.format(stream="raw")),
         '<operator name="src"', "may not contain text"),
    Case("type-without-columns",
         dataflow(SOURCE + _filter("true", ' type="empty"') + SINK.format(stream="hot"),
                  types=READING_TYPE + '  <type name="empty"/>\n'),
         '<type name="empty"', "has no columns"),
    Case("value-too-long", with_source_and_sink(_filter("x" * 5000), "hot"),
         'value="xxx', "too long"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_spec_is_refused_at_its_position(case: Case) -> None:
    graph, diagnostics = check_spec_text(case.xml, "bad.xml")
    assert graph is None, "a broken spec must not compile"
    line, column = locate(case.xml, case.needle, case.nth)
    errors = [d for d in diagnostics if d.severity == "error"]
    matching = [d for d in errors if case.message in d.message + " " + d.hint]
    assert matching, f"no error mentions {case.message!r}; got:\n" + "\n".join(
        d.render() for d in errors)
    positions = {(d.position.line, d.position.column) for d in matching}
    assert (line, column) in positions, (
        f"expected {case.message!r} at {line}:{column}, got "
        + "; ".join(d.render() for d in matching))
    assert all(d.position.file == "bad.xml" for d in errors)


def test_there_are_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30


def test_every_problem_is_reported_in_one_run() -> None:
    xml = dataflow(
        SOURCE.replace('value="sensor"', 'value="weather"')
        + _filter("raw.tmp &gt; 3").replace('type="filter"', 'type="filter" speed="1"')
        + '  <operator name="w" type="window-aggregate">\n    <input name="nothing"/>\n'
          '    <output name="agg"/>\n  </operator>\n'
        + SINK.format(stream="hot"))
    graph, diagnostics = check_spec_text(xml, "many.xml")
    assert graph is None
    messages = " | ".join(d.message for d in diagnostics)
    for fragment in ("has no attribute 'speed'", "not one of sensor", "'nothing'",
                     "needs the parameter 'time'"):
        assert fragment in messages, messages


def test_diagnostics_render_as_file_line_column() -> None:
    xml = with_source_and_sink(_filter("raw.tmp &gt; 3"), "hot")
    _, diagnostics = check_spec_text(xml, "specs/x.xml")
    line, column = locate(xml, "raw.tmp")
    rendered = [d.render() for d in diagnostics if d.severity == "error"]
    assert any(r.startswith(f"specs/x.xml:{line}:{column}: error: ") for r in rendered), rendered


def test_unused_stream_is_a_warning_not_an_error() -> None:
    xml = dataflow(SOURCE + SOURCE.replace('name="src"', 'name="other"').replace(
        'name="raw"', 'name="spare"') + SINK.format(stream="raw"))
    graph, diagnostics = check_spec_text(xml, "w.xml")
    assert graph is not None
    assert [d.severity for d in diagnostics] == ["warning"]
    assert "never read" in diagnostics[0].message


@pytest.mark.parametrize("middle", [
    _window(_W_OK) + _over("agg", "window_end"),
    _window(_W_OK) + _keep('    <field name="t" value="agg.window_end"/>\n'
                           '    <field name="n" value="n"/>\n') + _over("kept", "t"),
], ids=["window-over-window-end", "through-a-project"])
def test_a_window_over_a_windows_results_on_window_end_is_valid(middle: str) -> None:
    graph, diagnostics = check_spec_text(with_source_and_sink(middle, "agg2"), "ok.xml")
    assert graph is not None, [d.render() for d in diagnostics]
    assert [d for d in diagnostics if d.severity == "error"] == []


def test_an_unended_xml_declaration_with_an_encoding_is_refused_at_its_start() -> None:
    """lxml refuses text that keeps an encoding declaration (ValueError): the strip only takes
    a declaration ended by '?>' (found by test_spec_fuzz's seed 2)."""
    graph, diagnostics = check_spec_text('<?xml version="1.0" encoding="X"?\n<dataflow/>\n',
                                         "x.xml")
    assert graph is None
    (d,) = diagnostics
    assert (d.position.line, d.position.column, d.severity) == (1, 1, "error")
    assert "does not end with '?>'" in d.message
