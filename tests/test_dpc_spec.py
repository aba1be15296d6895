"""max-delay (Borealis DPC, docs/availability.md): where it may be written, its located errors
(all in one run), and what the compiled program passes to the runtime's union and join."""

from __future__ import annotations

from compiler.pipeline import check_spec_text
from tests.spec_snippets import SINK, SOURCE, dataflow, locate

SECOND = SOURCE.replace('name="src"', 'name="src2"').replace('name="raw"', 'name="raw2"')


def _union(attrs: str = "") -> str:
    return (f'  <operator name="u" type="union"{attrs}>\n    <input name="raw"/>\n'
            '    <input name="raw2"/>\n    <output name="both"/>\n  </operator>\n')


def _spec(union_attrs: str = "", query_attrs: str = "", middle: str = "",
          sink: str = "both") -> str:
    xml = dataflow(SOURCE + SECOND + _union(union_attrs) + middle + SINK.format(stream=sink))
    return xml.replace('<dataflow name="t">', f'<dataflow name="t"{query_attrs}>')


def _errors(xml: str) -> list:
    graph, diagnostics = check_spec_text(xml, "dpc.xml")
    errors = [d for d in diagnostics if d.severity == "error"]
    assert graph is None and errors
    return errors


def _at(errors: list, xml: str, needle: str, fragment: str, nth: int = 0) -> None:
    line, column = locate(xml, needle, nth)
    found = [d for d in errors if fragment in d.message
             and (d.position.line, d.position.column) == (line, column)]
    assert found, f"{fragment!r} at {line}:{column}? got " + "; ".join(
        d.render() for d in errors)


def test_max_delay_on_a_union_reaches_its_node() -> None:
    graph, diagnostics = check_spec_text(_spec(' max-delay="3 seconds"'), "dpc.xml")
    assert graph is not None, [d.render() for d in diagnostics]
    assert graph.node("u").max_delay_ms == 3000


def test_a_query_wide_max_delay_applies_to_each_union() -> None:
    graph, _ = check_spec_text(_spec(query_attrs=' max-delay="500 ms"'), "dpc.xml")
    assert graph is not None and graph.node("u").max_delay_ms == 500
    own, _ = check_spec_text(_spec(' max-delay="2 s"', ' max-delay="500 ms"'), "dpc.xml")
    assert own is not None and own.node("u").max_delay_ms == 2000


def test_without_max_delay_nothing_changes() -> None:
    graph, _ = check_spec_text(_spec(), "dpc.xml")
    assert graph is not None and all(n.max_delay_ms is None for n in graph.nodes)


def test_every_misuse_is_located_and_reported_in_one_run() -> None:
    filter_op = ('  <operator name="f" type="filter" max-delay="1 second">\n'
                 '    <input name="both"/>\n    <param name="condition" value="both.temp &gt; 1"/>'
                 '\n    <output name="hot"/>\n  </operator>\n')
    xml = _spec(' max-delay="soon"', ' max-delay="0 seconds"', filter_op, sink="hot")
    errors = _errors(xml)
    _at(errors, xml, "soon", "is not a duration")
    _at(errors, xml, "0 seconds", "out of range")
    _at(errors, xml, '1 second"', "filter with 1 input")


def _join(attrs: str = "") -> str:
    return (f'  <operator name="j" type="join"{attrs}>\n'
            '    <input name="raw"/>\n    <input name="raw2"/>\n'
            '    <param name="left-key" value="sensor"/><param name="right-key" value="sensor"/>\n'
            '    <param name="left-time" value="ts"/><param name="right-time" value="ts"/>\n'
            '    <param name="within" value="1 seconds"/>\n'
            '    <output name="pairs"/>\n  </operator>\n')


def _join_spec(join_attrs: str = "", query_attrs: str = "") -> str:
    xml = dataflow(SOURCE + SECOND + _join(join_attrs) + SINK.format(stream="pairs"))
    return xml.replace('<dataflow name="t">', f'<dataflow name="t"{query_attrs}>')


def test_max_delay_on_a_join_reaches_its_node_and_its_compiled_call(tmp_path) -> None:
    from compiler.pipeline import compile_spec_text

    graph, diagnostics = check_spec_text(_join_spec(' max-delay="3 seconds"'), "dpc.xml")
    assert graph is not None, [d.render() for d in diagnostics]
    assert graph.node("j").max_delay_ms == 3000
    assert not [d for d in diagnostics if "max-delay" in d.message]
    compilation = compile_spec_text(_join_spec(' max-delay="3 seconds"'), "dpc.xml",
                                    base_dir=tmp_path)
    calls = [t.program.split("rt.join(", 1)[1].split(")\n", 1)[0]
             for t in compilation.query.tasks if "rt.join(" in t.program]
    assert calls and all("max_delay='3 seconds'" in call for call in calls), calls
    plain = compile_spec_text(_join_spec(), "dpc.xml", base_dir=tmp_path)
    assert "max_delay=" not in "\n".join(t.program for t in plain.query.tasks)


def test_a_query_wide_max_delay_applies_to_each_join_and_union() -> None:
    graph, diagnostics = check_spec_text(_join_spec(query_attrs=' max-delay="500 ms"'),
                                         "dpc.xml")
    assert graph is not None and graph.node("j").max_delay_ms == 500
    assert not [d for d in diagnostics if "max-delay" in d.message]  # (no warning any more)
    own, _ = check_spec_text(_join_spec(' max-delay="2 s"', ' max-delay="500 ms"'), "dpc.xml")
    assert own is not None and own.node("j").max_delay_ms == 2000


def test_every_misuse_on_a_join_is_located_and_reported_in_one_run() -> None:
    """A bad duration on the join, a join with checkpoint HA (a pattern without a merger)
    under the query-wide max-delay, and max-delay on a one-input filter after it: three
    errors, one run."""
    filter_op = ('  <operator name="f" type="filter" max-delay="1 second">\n'
                 '    <input name="pairs"/>\n'
                 '    <param name="condition" value="pairs.temp &gt; 1"/>'
                 '\n    <output name="hot"/>\n  </operator>\n')
    second = _join(' max-delay="soon"').replace('"j"', '"j2"').replace('"pairs"', '"pairs2"')
    third = _join(' ha="checkpoint"').replace('"j"', '"j3"').replace('"pairs"', '"pairs3"')
    xml = dataflow(SOURCE + SECOND + _join() + second + third + filter_op
                   + SINK.format(stream="hot")).replace(
        '<dataflow name="t">', '<dataflow name="t" max-delay="4 seconds">')
    errors = _errors(xml)
    _at(errors, xml, "soon", "is not a duration")
    _at(errors, xml, "4 seconds", "with a pattern")
    _at(errors, xml, '1 second"', "filter with 1 input")


def test_max_delay_with_a_pattern_without_a_merger_is_refused() -> None:
    xml = _spec(' max-delay="3 seconds" ha="checkpoint"')
    _at(_errors(xml), xml, "3 seconds", "with a pattern")


def _window(attrs: str = "") -> str:
    return (f'  <operator name="w" type="window-aggregate"{attrs}>\n    <input name="raw"/>\n'
            '    <param name="time" value="ts"/><param name="size" value="1 seconds"/>\n'
            '    <param name="group-by" value="sensor"/>\n'
            '    <aggregate name="n" function="count"/>\n    <output name="agg"/>\n'
            '  </operator>\n')


def _union_calls(programs: str) -> list[str]:
    """Each `rt.union(...)` call of the generated programs, on one line."""
    import re

    return [" ".join(m.split()) for m in re.findall(r"rt\.union\(.*?\)\n", programs, re.S)]


def test_max_delay_on_a_partitioned_operator_is_its_merger_s_and_no_instance_s(tmp_path
                                                                              ) -> None:
    """docs/availability.md, "A partitioned operator's merger": max-delay written on a
    partitioned operator (or the query's) goes to the merger that recombines its instances,
    which the compiled program passes to the merger's union; its instances take none."""
    from compiler.pipeline import compile_spec_text

    for attrs, query_attrs in ((' parallelism="2" max-delay="3 seconds"', ""),
                               (' max-parallelism="3"', ' max-delay="3 seconds"'),
                               (' parallelism="2" max-delay="3 seconds"', ' max-delay="1 s"')):
        xml = dataflow(SOURCE + _window(attrs) + SINK.format(stream="agg")).replace(
            '<dataflow name="t">', f'<dataflow name="t"{query_attrs}>')
        graph, diagnostics = check_spec_text(xml, "dpc.xml")
        assert graph is not None, [d.render() for d in diagnostics]
        assert graph.node("w").max_delay_ms == 3000  # the logical operator's, for its merger
        programs = "\n".join(t.program for t in compile_spec_text(
            xml, "dpc.xml", base_dir=tmp_path).query.tasks)
        unions = _union_calls(programs)
        assert unions and all("max_delay='3 seconds'" in u and "merger=True" in u
                              for u in unions), unions
        assert programs.count("max_delay=") == len(unions)  # no instance takes it
    plain = dataflow(SOURCE + _window(' parallelism="2"') + SINK.format(stream="agg"))
    programs = "\n".join(t.program for t in compile_spec_text(
        plain, "dpc.xml", base_dir=tmp_path).query.tasks)
    assert "merger=True" in programs and "max_delay=" not in programs


def test_a_partitioned_union_s_max_delay_is_its_merger_s(tmp_path) -> None:
    from compiler.pipeline import compile_spec_text

    xml = _spec(' max-delay="3 seconds" parallelism="2"')
    programs = "\n".join(t.program for t in compile_spec_text(
        xml, "dpc.xml", base_dir=tmp_path).query.tasks)
    unions = _union_calls(programs)
    assert [u for u in unions if "max_delay=" in u] == \
        [u for u in unions if "merger=True" in u] != [], unions


def test_a_query_wide_max_delay_without_a_union_is_refused() -> None:
    xml = dataflow(SOURCE + SINK.format(stream="raw")).replace(
        '<dataflow name="t">', '<dataflow name="t" max-delay="3 seconds">')
    _at(_errors(xml), xml, "3 seconds", "has none")


def test_the_compiled_union_call_carries_max_delay(tmp_path) -> None:
    from compiler.pipeline import compile_spec_text

    compilation = compile_spec_text(_spec(' max-delay="3 seconds"'), "dpc.xml",
                                    base_dir=tmp_path)
    programs = "\n".join(t.program for t in compilation.query.tasks)
    assert "max_delay='3 seconds'" in programs


def test_max_delay_is_part_of_the_union_s_signature_only_when_set(tmp_path) -> None:
    from compiler.pipeline import compile_spec_text

    def signature(attrs: str) -> str:
        query = compile_spec_text(_spec(attrs), "dpc.xml", base_dir=tmp_path).query
        return next(o.signature for o in query.operators if o.name == "u")

    plain, three, four = signature(""), signature(' max-delay="3 s"'), signature(' max-delay="4 s"')
    assert len({plain, three, four}) == 3
    assert "3000" not in plain and "3000" in three


def _fanned(second_reader: str) -> str:
    """src's raw is read by the union (a channel: raw also feeds s3) and src2's raw2; the
    union's output by a filter into s1 and by `second_reader` (one more task each)."""
    def sink(name: str, stream: str) -> str:
        return SINK.replace('name="sink"', f'name="{name}"').replace(
            "out.jsonl", f"{name}.jsonl").format(stream=stream)
    hot = ('  <operator name="f1" type="filter">\n    <input name="both"/>\n'
           '    <param name="condition" value="both.temp &gt; 1"/>\n'
           '    <output name="h1"/>\n  </operator>\n')
    return dataflow(SOURCE + SECOND + _union(' max-delay="3 seconds"') + hot + second_reader
                    + sink("s1", "h1") + sink("s2", "h2") + sink("s3", "raw"))


def _marked_calls(xml: str, tmp_path) -> list[str]:
    from compiler.pipeline import compile_spec_text

    programs = [t.program for t in compile_spec_text(xml, "dpc.xml", base_dir=tmp_path)
                .query.tasks]
    return [line.strip() for p in programs for line in p.splitlines() if "marks=True" in line]


def test_a_dpc_union_s_channel_carries_marks_to_readers_that_propagate_them(tmp_path) -> None:
    """docs/availability.md, "Marks across channels": the union's channel sink and both
    filtering readers are marked; a window aggregate straight into its sink is marked too
    (checkpoint/redo, "A stateful downstream task"); one with a filter after it is not (the
    runtime would refuse the mark there; the union then waits for a cut input without a
    limit instead, marking nothing), nor a count window."""
    project = ('  <operator name="p" type="project">\n    <input name="both"/>\n'
               '    <field name="sensor" value="both.sensor"/>\n'
               '    <output name="h2"/>\n  </operator>\n')
    calls = _marked_calls(_fanned(project), tmp_path)
    assert sorted(c.split("(")[0] for c in calls) == [
        "rt.channel_sink", "rt.channel_source", "rt.channel_source"], calls
    window = ('  <operator name="w" type="window-aggregate">\n    <input name="both"/>\n'
              '    <param name="time" value="ts"/><param name="size" value="1 seconds"/>\n'
              '    <aggregate name="n" function="count"/>\n'
              '    <output name="h2"/>\n  </operator>\n')
    calls = _marked_calls(_fanned(window), tmp_path)
    assert sorted(c.split("(")[0] for c in calls) == [
        "rt.channel_sink", "rt.channel_source", "rt.channel_source"], calls
    after = window.replace('"h2"', '"w2"') + (
        '  <operator name="g" type="filter">\n    <input name="w2"/>\n'
        '    <param name="condition" value="w2.n &gt; 1"/>\n'
        '    <output name="h2"/>\n  </operator>\n')
    assert _marked_calls(_fanned(after), tmp_path) == []
    counted = window.replace('<param name="size" value="1 seconds"/>',
                             '<param name="rows" value="3"/>')
    assert _marked_calls(_fanned(counted), tmp_path) == []


def _keywords(program: str, method: str) -> list[dict[str, object]]:
    """The literal keyword arguments of each `rt.<method>(...)` call in a generated program."""
    import ast

    return [{k.arg: ast.literal_eval(k.value) for k in node.keywords
             if k.arg is not None and isinstance(k.value, (ast.Constant, ast.Tuple))}
            for node in ast.walk(ast.parse(program))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == method]


def test_a_union_over_a_hot_standby_stream_gets_the_selector_in_its_own_task(tmp_path) -> None:
    """No compiler change for DPC over a selector (docs/availability.md): max-delay stays on
    the union, and the rewrite puts the hot-standby stream's selector in the union's task, so
    the runtime sees the selector's stream as one of the union's channel inputs."""
    from compiler.pipeline import compile_spec_text

    replicated = ('  <operator name="f" type="filter" ha="hot-standby">\n'
                  '    <input name="raw"/>\n'
                  '    <param name="condition" value="raw.temp &gt; 1"/>\n'
                  '    <output name="hot"/>\n  </operator>\n')
    union = _union(' max-delay="3 seconds"').replace('"raw"', '"hot"')
    xml = dataflow(SOURCE + SECOND + replicated + union + SINK.format(stream="both"))
    tasks = compile_spec_text(xml, "dpc.xml", base_dir=tmp_path).query.tasks
    with_union = [t for t in tasks if "u" in t.operators]
    assert len(with_union) == 1
    program = with_union[0].program
    [selector] = _keywords(program, "selector_source")
    [call] = _keywords(program, "union")
    assert selector["output"] == "hot" and len(tuple(selector["channels"])) == 2
    assert call["inputs"] == ("hot", "raw2") and call["max_delay"] == "3 seconds"
    assert sum("max_delay=" in t.program for t in tasks) == 1


def _net_source(name: str, stream: str, port: int, marks: str = "") -> str:
    param = f'\n    <param name="marks" value="{marks}"/>' if marks else ""
    return (f'  <operator name="{name}" type="network-source">\n'
            f'    <param name="endpoint" value="tcp://127.0.0.1:{port}"/>{param}\n'
            f'    <output name="{stream}" type="reading"/>\n  </operator>\n')


NET_SINK = ('  <operator name="out" type="network-sink">\n    <input name="{stream}"/>\n'
            '    <param name="endpoint" value="tcp://127.0.0.1:7100"/>\n  </operator>\n')


def _program_calls(xml: str, tmp_path, method: str) -> list[dict[str, object]]:
    from compiler.pipeline import compile_spec_text

    programs = [t.program for t in compile_spec_text(xml, "dpc.xml", base_dir=tmp_path)
                .query.tasks]
    return [call for p in programs for call in _keywords(p, method)]


def test_a_dpc_task_s_network_sink_is_marked_and_a_plain_one_is_not(tmp_path) -> None:
    """docs/availability.md, "What a reader of each sink sees": a union with max-delay over
    two network sources (channel inputs the runtime watches) marks its network sink; without
    max-delay, or over generators of its own task (nothing to cut), the sink is plain."""
    sources = _net_source("n1", "raw", 7001) + _net_source("n2", "raw2", 7002)
    marked = dataflow(sources + _union(' max-delay="3 seconds"') + NET_SINK.format(stream="both"))
    assert [c.get("marks") for c in _program_calls(marked, tmp_path, "network_sink")] == [True]
    plain = dataflow(sources + _union() + NET_SINK.format(stream="both"))
    assert [c.get("marks") for c in _program_calls(plain, tmp_path, "network_sink")] == [None]
    local = dataflow(SOURCE + SECOND + _union(' max-delay="3 seconds"')
                     + NET_SINK.format(stream="both"))
    assert [c.get("marks") for c in _program_calls(local, tmp_path, "network_sink")] == [None]
    replicated = ('  <operator name="f" type="filter" ha="hot-standby">\n'
                  '    <input name="raw"/>\n'
                  '    <param name="condition" value="raw.temp &gt; 1"/>\n'
                  '    <output name="hot"/>\n  </operator>\n')
    union = _union(' max-delay="3 seconds"').replace('"raw"', '"hot"')
    standby = dataflow(SOURCE + SECOND + replicated + union + NET_SINK.format(stream="both"))
    assert [c.get("marks") for c in _program_calls(standby, tmp_path, "network_sink")] == [True]


def _filter(name: str, src: str, out: str) -> str:
    return (f'  <operator name="{name}" type="filter">\n    <input name="{src}"/>\n'
            f'    <param name="condition" value="{src}.temp &gt; 1"/>\n'
            f'    <output name="{out}"/>\n  </operator>\n')


def test_a_network_source_with_marks_reads_them_into_a_file_sink(tmp_path) -> None:
    xml = dataflow(_net_source("n", "raw", 7001, "dpc") + _filter("f", "raw", "hot")
                   + SINK.format(stream="hot"))
    assert [c.get("marks") for c in _program_calls(xml, tmp_path, "network_source")] == [True]
    plain = dataflow(_net_source("n", "raw", 7001) + SINK.format(stream="raw"))
    assert [c.get("marks") for c in _program_calls(plain, tmp_path, "network_source")] == [None]


def test_a_marked_network_source_feeding_what_cannot_carry_marks_is_refused_at_its_param(
        ) -> None:
    window = ('  <operator name="w" type="window-aggregate">\n    <input name="raw"/>\n'
              '    <param name="time" value="ts"/><param name="size" value="1 seconds"/>\n'
              '    <aggregate name="n" function="count"/>\n'
              '    <output name="counts"/>\n  </operator>\n')
    xml = dataflow(_net_source("n", "raw", 7001, "dpc") + window + SINK.format(stream="counts"))
    errors = _errors(xml)
    _at(errors, xml, '<param name="marks"', "reaches 'w' (a window-aggregate)")
    two = dataflow(_net_source("n", "raw", 7001, "dpc") + _filter("f", "raw", "hot")
                   + SINK.format(stream="hot") + NET_SINK.format(stream="raw"))
    _at(_errors(two), two, '<param name="marks"', "2 readers of 'raw'")


KAFKA_SINK = ('  <operator name="k" type="kafka-sink">\n    <input name="{stream}"/>\n'
              '    <param name="bootstrap" value="127.0.0.1:9092"/>\n'
              '    <param name="topic" value="results"/>\n  </operator>\n')


def test_a_downstream_task_s_network_and_kafka_sinks_take_the_marks(tmp_path) -> None:
    """docs/availability.md, "Marks across channels": the union's output is read in two
    other tasks, filtered into a network sink and into a Kafka sink; its channel is marked
    for both, and the downstream network sink serves the marked schema (its own task holds
    no union: the mark comes from its input channel). With a count window as a third
    reader, nothing is marked (an event-time window is: checkpoint/redo)."""
    readers = _filter("f1", "both", "h1") + _filter("f2", "both", "h2")
    sinks = NET_SINK.format(stream="h1") + KAFKA_SINK.format(stream="h2")
    third = SINK.replace("out.jsonl", "s3.jsonl").format(stream="raw")  # raw: a channel
    xml = dataflow(SOURCE + SECOND + _union(' max-delay="3 seconds"') + readers + sinks + third)
    assert sorted(c.split("(")[0] for c in _marked_calls(xml, tmp_path)) == [
        "rt.channel_sink", "rt.channel_source", "rt.channel_source", "rt.network_sink"]
    [net] = _program_calls(xml, tmp_path, "network_sink")
    assert net.get("marks") is True
    window = ('  <operator name="w" type="window-aggregate">\n    <input name="both"/>\n'
              '    <param name="time" value="ts"/><param name="rows" value="3"/>\n'
              '    <aggregate name="n" function="count"/>\n'
              '    <output name="h3"/>\n  </operator>\n')
    plain = xml.replace(third, third + window + SINK.replace('name="sink"', 'name="s4"')
                        .replace("out.jsonl", "s4.jsonl").format(stream="h3"))
    assert _marked_calls(plain, tmp_path) == []


def test_a_marked_network_source_may_feed_a_kafka_or_network_sink(tmp_path) -> None:
    for sink in (KAFKA_SINK.format(stream="hot"),
                 NET_SINK.replace("7100", "7101").format(stream="hot")):
        xml = dataflow(_net_source("n", "raw", 7001, "dpc") + _filter("f", "raw", "hot") + sink)
        graph, diagnostics = check_spec_text(xml, "dpc.xml")
        assert graph is not None, [d.render() for d in diagnostics]
    relay = dataflow(_net_source("n", "raw", 7001, "dpc") + _filter("f", "raw", "hot")
                     + NET_SINK.format(stream="hot"))
    assert [c.get("marks") for c in _program_calls(relay, tmp_path, "network_sink")] == [True]


def test_a_query_names_its_kafka_sinks_topics_for_tail_stable(tmp_path) -> None:
    """`elastiq tail QUERY SINK --stable` reads a Kafka sink's topic: the compiled query (and
    so the scheduler's status) says where it is, through its JSON form."""
    from common.tasks import CompiledQuery
    from compiler.pipeline import compile_spec_text

    secured = KAFKA_SINK.replace('value="results"/>', 'value="results"/>\n'
                                 '    <param name="security-file" value="client.properties"/>')
    xml = dataflow(SOURCE + secured.format(stream="raw"))
    query = compile_spec_text(xml, "dpc.xml", base_dir=tmp_path).query
    assert query.kafka_sinks == {"k": {"bootstrap": "127.0.0.1:9092", "topic": "results",
                                       "format": "jsonl",
                                       "security_file": str(tmp_path / "client.properties")}}
    assert CompiledQuery.from_json(query.to_json()).kafka_sinks == query.kafka_sinks
