"""The pipelined pattern operator in the plan: `pipeline-stages="k"` (and `stage-rows`) on a
pattern with after-match skip-to-next-row makes rewrite_rules/pattern-pipelining.rule cut it
into k stages on distinct nodes, chained by channels whose stream is
`common.pattern_stages.stage_schema`; the rule language's `chain` construct that rule is
written with; the located refusals of every misuse; and the programs the stages run (their
stage and the row type the later ones need). The matcher the stages run is tested in
tests/test_cep_stage.py, on Spark in tests/test_cep_spark.py, on the embedded cluster in
tests/test_patterns_cluster.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.diagnostics import SpecError
from common.pattern_stages import stage_schema
from compiler.guards import GUARDS
from compiler.pipeline import compile_spec_text
from compiler.rewrite import rewrite
from compiler.rules import load_rules, parse_rule
from elastiq.explain import explain
from rewrite_rules import shipped_rule_files
from tests.spec_snippets import locate
from tests.test_cep_rewrite import NEXT_ROW, _tick
from tests.test_pattern_tasks import rt_calls
from tests.test_rewrite import BASE, RULES, _errors, logical, spec


# ============================================================================ the spec asks ==

@pytest.mark.parametrize("attrs,after,attr,words", [
    ('pipeline-stages="2"', "", 'pipeline-stages="2"',
     ["skip-past-last-row", "stages could not decide", "skip-to-next-row"]),
    ('pipeline-stages="1"', NEXT_ROW, 'pipeline-stages="1"', ["out of range", "2 to 16"]),
    ('pipeline-stages="17"', NEXT_ROW, 'pipeline-stages="17"', ["out of range", "2 to 16"]),
    ('pipeline-stages="two"', NEXT_ROW, 'pipeline-stages="two"', ["not a whole number"]),
    ('pipeline-stages="2" stage-rows="0"', NEXT_ROW, 'stage-rows="0"', ["out of range"]),
    ('stage-rows="3"', NEXT_ROW, 'stage-rows="3"', ["needs pipeline-stages="]),
    ('match-instances="2" pipeline-stages="2"', NEXT_ROW, 'pipeline-stages="2"',
     ["one pattern per operator"]),
])
def test_a_misused_pipeline_stages_is_located(attrs: str, after: str, attr: str,
                                              words: list[str]) -> None:
    text = _tick(attrs, after)
    errors = _errors(text)
    tag = '<operator name="tick" type="pattern" '
    line, column = locate(text, tag + attrs)
    where = (line, column + len(tag) + attrs.index(attr) + attr.index('"') + 1)
    assert any((ln, col) == where and all(w in msg for w in words)
               for ln, col, msg in errors), (where, errors)


def test_pipeline_stages_on_another_operator_is_refused_at_the_attribute() -> None:
    text = spec("hot-sensors", {"hot": 'pipeline-stages="2"'})
    line, column = locate(text, 'pipeline-stages="2"')
    assert any((ln, col) == (line, column + len('pipeline-stages="')) and "pattern operators"
               in msg for ln, col, msg in _errors(text))


def test_a_query_wide_pipeline_reaches_pattern_operators_only_with_its_stage_rows() -> None:
    text = _tick("").replace('<dataflow name="tick-shape"',
                             '<dataflow name="tick-shape" pipeline-stages="3" stage-rows="4"')
    graph = logical(text)
    assert graph.node("tick").wants("pipeline-stages") == 3
    assert graph.node("tick").wants("stage-rows") == 4
    assert all(n.wants("pipeline-stages") is None for n in graph.nodes if n.name != "tick")
    assert logical(_tick('pipeline-stages="2"')).node("tick").wants("stage-rows") == 2


# ====================================================================== the rule and its plan ==

def test_the_rule_loads_with_its_guards_and_its_chain() -> None:
    (rule,) = [r for r in load_rules(shipped_rule_files()) if r.name == "pattern-pipelining"]
    assert rule.phase == "pipelining" and rule.focus == "f"
    assert [(g.name, g.args) for g in rule.guards] == [
        ("wants", ("f", "pipeline-stages")), ("independent-matches", ("f",))]
    assert GUARDS["independent-matches"].holds(logical(_tick('pipeline-stages="2"')).node("tick"))


@pytest.mark.parametrize("k,rows", [(2, 2), (3, 1), (5, 7)])
def test_the_plan_chains_k_stages_on_distinct_nodes_through_typed_channels(k: int,
                                                                            rows: int) -> None:
    text = _tick(f'pipeline-stages="{k}" stage-rows="{rows}"')
    before = logical(text)
    result = rewrite(before, RULES)
    assert [f.rule for f in result.firings] == ["pattern-pipelining"]
    g = result.graph
    stages = [g.node(f"tick_{i}") for i in range(1, k + 1)]
    assert all(n.kind == "pattern" for n in stages)
    assert len([n for n in g.nodes if n.kind == "pattern"]) == k
    stock, shapes = before.stream("stock").schema, before.stream("shapes").schema
    between = stage_schema([stock.get("symbol")])
    for i, node in enumerate(stages, 1):
        reader = g.producer(node.inputs[0])
        assert reader.kind == "network-reader"
        assert (reader.param("stage"), reader.param("stages"), reader.param("stage-rows")) == \
            (i, k, rows)
        writer = g.producer(reader.inputs[0])
        assert writer.kind == "network-writer"
        upstream = g.producer(writer.inputs[0])
        assert upstream.name == ("ticks" if i == 1 else f"tick_{i - 1}")
        assert g.stream(node.inputs[0]).schema == (stock if i == 1 else between)
        assert g.stream(node.output).schema == (shapes if i == k else between)
        assert node.placement == f"tick.p{i}"
    assert stages[-1].output == "shapes" and g.producer("shapes").name == f"tick_{k}"
    twice = rewrite(g, RULES)
    assert twice.firings == () and twice.graph == g


def test_explain_shows_the_stages_and_the_streams_between_them() -> None:
    c = compile_spec_text(_tick('pipeline-stages="3"'), "tick-shape.xml", base_dir=BASE,
                          plan_only=True)
    text = explain(c)
    assert "pattern-pipelining [pipelining] on tick" in text
    assert ("tick_3 := pattern@tick.p3(tick_rd_3 := network_reader@tick.p3(tick_wr_3 := "
            "network_writer(tick_2 := pattern@tick.p2(") in text
    assert "network-reader {stage: 2, stages: 3, stage-rows: 2}" in text
    assert "tick_1_out (symbol string, __elastiq_stage_time timestamp" in text


@pytest.mark.parametrize("attrs,after", [("", NEXT_ROW), ('pipeline="split"', NEXT_ROW),
                                         ('match-instances="2"', NEXT_ROW)])
def test_the_rule_does_not_fire_where_it_must_not(attrs: str, after: str) -> None:
    result = rewrite(logical(_tick(attrs, after)), RULES)
    assert "pattern-pipelining" not in [f.rule for f in result.firings]


def test_the_generated_stages_carry_their_stage_and_the_rows_type() -> None:
    c = compile_spec_text(_tick('pipeline-stages="3" stage-rows="4"'), "tick-shape.xml",
                          base_dir=BASE)
    stock = logical(_tick('pipeline-stages="3"')).stream("stock").schema
    seen = {}
    for task in c.query.tasks:
        for method, kwargs in rt_calls(task.program):
            if method == "pattern":
                seen[kwargs["stage"]] = kwargs.get("row_schema")
    assert sorted(seen) == [(1, 3, 4), (2, 3, 4), (3, 3, 4)]
    assert seen[(1, 3, 4)] is None
    (program,) = [t.program for t in c.query.tasks if "tick_2" in t.operators]
    const = seen[(2, 3, 4)]
    assert seen[(3, 3, 4)] == const and f"{const} = Schema.of(" in program
    defined = program.split(f"{const} = Schema.of(")[1].split(")\n")[0]
    assert all(f"({f.name!r}, {f.type.value!r})" in defined for f in stock), defined
    assert len({t.task_id for t in c.query.tasks}) == 4


def test_pipeline_stages_fuzz_compiles_or_refuses_located() -> None:
    """Seeded, bounded: random values of pipeline-stages, stage-rows and after-match, on the
    pattern, on another operator or query-wide; every spec compiles (the rule fired) or is
    refused with every diagnostic inside the file."""
    rng = random.Random(815)
    values = ["2", "3", "16", "17", "0", "-1", "1", "two", "", "2.5", "x" * 70, "\u00e92", "08"]
    afters = ["skip-to-next-row"] * 4 + ["skip-past-last-row", "", "SKIP-TO-NEXT-ROW"]
    compiled = refused = 0
    for _ in range(200):
        text = _tick("", after=f'<param name="after-match" value="{rng.choice(afters)}"/>')
        where = rng.choice(['<operator name="tick" type="pattern"',
                            '<operator name="out" type="file-sink"',
                            '<dataflow name="tick-shape"'])
        extra = f' stage-rows="{rng.choice(values)}"' if rng.random() < 0.4 else ""
        text = text.replace(where, f'{where} pipeline-stages="{rng.choice(values)}"{extra}')
        lines = text.count("\n") + 1
        try:
            c = compile_spec_text(text, "fuzz.xml", base_dir=BASE, plan_only=True)
        except SpecError as e:
            refused += 1
            for d in e.diagnostics:
                assert d.position.file == "fuzz.xml" and 1 <= d.position.line <= lines
                assert d.position.column >= 1 and d.message
            assert e.diagnostics
            continue
        compiled += 1
        assert [f.rule for f in c.firings] == ["pattern-pipelining"]
    assert compiled > 5 and refused > 50, (compiled, refused)


# ==================================================================== the rule language: chain ==

HEAD = "rule r\nphase pipelining\nfocus f\nmatch a2 := any(f := pattern(a1 := any*))\n"


def _refusal(text: str) -> list[tuple[int, int, str]]:
    with pytest.raises(SpecError) as e:
        parse_rule(text, "r.rule")
    return [(d.position.line, d.position.column, d.message) for d in e.value.diagnostics]


def test_a_chain_whose_body_never_reads_the_previous_copy_is_refused_located() -> None:
    got = _refusal(HEAD + "=> a2(chain i in 1..3 from a1 as s: f[i](network-writer(a1)))\n")
    assert any(line == 5 and col == 7 and "never reads 's'" in msg for line, col, msg in got), got


def test_a_chain_that_names_an_operator_inside_is_refused() -> None:
    got = _refusal(HEAD + "=> a2(chain i in 1..3 from a1 as s: f[i](w := network-writer(s)))\n")
    assert any("names 'w'" in msg for _, _, msg in got), got


def test_a_chain_reusing_a_binding_as_its_name_is_refused() -> None:
    got = _refusal(HEAD + "=> a2(chain i in 1..2 from a1 as f: f[i](network-writer(f)))\n")
    assert any("name 'f' is already used" in msg for _, _, msg in got), got


@pytest.mark.parametrize("tail,expect", [
    ("chain i in 1..3 a1 as s: f[i](s)", "'from'"),
    ("chain i in 1..3 from a1 s: f[i](s)", "'as'"),
    ("chain i in x..3 from a1 as s: f[i](s)", "a first number"),
])
def test_chain_syntax_errors_say_what_was_expected(tail: str, expect: str) -> None:
    got = _refusal(HEAD + f"=> a2({tail})\n")
    assert any(expect in msg and line == 5 for line, _, msg in got), got


def test_chaining_an_operator_that_has_no_stages_is_a_rewrite_error() -> None:
    rule = parse_rule("rule r\nphase pipelining\nfocus f\nmatch a2 := any(f := any(a1 := any*))\n"
                      "when wants(f, pipeline, split)\n"
                      "=> a2(chain i in 1..2 from a1 as s: f[i](network-reader(network-writer(s))))\n",
                      "r.rule")
    with pytest.raises(SpecError, match="only a pattern operator runs in stages"):
        rewrite(logical(spec("hot-sensors", {"hot": 'pipeline="split"'})), (rule,))


def test_the_shipped_rule_file_is_where_the_docs_say() -> None:
    assert any(Path(p).name == "pattern-pipelining.rule" for p in shipped_rule_files())
