"""Load shedding in the compiler (pure): the spec's `shed`, `shed-keep`, `shed-utility` and
`weight` with located errors, the drop operator `rewrite_rules/shedding.rule` inserts (idle, shown
by explain, once per source), its program call, and its ratios in the control catalogue."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.control import ControlRefused
from common.diagnostics import SpecError
from compiler.control import check_tuple
from compiler.pipeline import Compilation, compile_spec_text, logical_graph_text, rules_for
from compiler.rewrite import rewrite
from elastiq.explain import explain

SOURCE_PARAMS = '<param name="shed" value="semantic"/><param name="shed-keep" value="raw.temp &gt; 35"/>'


def spec(source_params: str = SOURCE_PARAMS, weight: str = '<param name="weight" value="2"/>',
         second_sink: bool = False) -> str:
    extra = """
  <operator name="all" type="console-sink"><input name="raw"/></operator>""" if second_sink else ""
    return f"""<dataflow name="shed-q">
  <type name="reading">
    <column name="sensor" type="string"/><column name="ts" type="timestamp"/>
    <column name="temp" type="double"/><column name="humidity" type="double"/>
  </type>
  <operator name="src" type="generator">
    <param name="shape" value="sensor"/><param name="rate" value="100"/>
    {source_params}
    <output name="raw" type="reading"/>
  </operator>
  <operator name="hot" type="filter">
    <input name="raw"/><param name="condition" value="raw.temp &gt; 30"/>
    <output name="hotReadings" type="reading"/>
  </operator>
  <operator name="sink" type="console-sink">
    <input name="hotReadings"/>{weight}
  </operator>{extra}
</dataflow>"""


def compiled(text: str) -> Compilation:
    return compile_spec_text(text, "/tmp/shed-q.xml", base_dir="/tmp")


def test_the_rule_puts_an_idle_drop_after_a_shed_source() -> None:
    c = compiled(spec())
    drop = next(n for n in c.physical.nodes if n.kind == "drop")
    assert drop.inputs == (c.physical.node("src").output,)
    assert drop.output == "raw" and c.physical.node("hot").inputs == ("raw",)
    assert dict(drop.params) == {"ratio": 0, "mode": "semantic", "keep": "raw.temp > 35"}
    assert [(f.rule, f.focus) for f in c.firings] == [("shedding", "src")]
    assert "drop(src := generator)" in c.firings[0].after
    program = c.query.tasks[0].program
    call = program[program.index("rt.drop("):]
    call = call[:call.index(")")]
    for argument in ("op='src_drop'", "input='src_out'", "output='raw'", "ratio=0.0",
                     "mode='semantic'", "keep='raw.temp > 35'"):
        assert argument in call, (argument, call)


def test_one_drop_serves_every_reader_of_the_source() -> None:
    c = compiled(spec(second_sink=True))
    assert [n.kind for n in c.physical.nodes].count("drop") == 1
    assert len(c.firings) == 1  # the rebuilt source is the rule's own: it does not fire again


def test_without_shed_nothing_changes() -> None:
    c = compiled(spec(source_params=""))
    assert c.physical == c.logical and not c.firings
    assert all("drop" not in t.program for t in c.query.tasks)


def test_the_drop_ratios_are_live_parameters() -> None:
    catalog = compiled(spec()).query.controls
    assert catalog is not None
    found = {(a.operator, a.parameter): a for a in catalog.adjustable if a.kind == "drop"}
    assert set(found) == {("src_drop", "ratio"), ("src_drop", "high-ratio")}
    change = check_tuple(catalog, "shed-q", "src_drop", "ratio", "0.25")
    assert change.runtime_value == 0.25
    assert change.adjustable.targets[0].keyword == "ratio"
    for bad in ("1.5", "-0.1", "nan", "half"):
        with pytest.raises(ControlRefused):
            check_tuple(catalog, "shed-q", "src_drop", "ratio", bad)


def test_a_random_drop_has_one_ratio() -> None:
    catalog = compiled(spec('<param name="shed" value="random"/>')).query.controls
    assert catalog is not None
    assert [(a.operator, a.parameter) for a in catalog.adjustable if a.kind == "drop"] == \
        [("src_drop", "ratio")]


def errors_of(text: str) -> list[str]:
    with pytest.raises(SpecError) as raised:
        compiled(text)
    return [d.render() for d in raised.value.diagnostics if d.severity == "error"]


def test_every_shedding_mistake_is_located_at_once() -> None:
    text = spec('<param name="shed" value="semantic"/>'
                '<param name="shed-utility" value="1.5"/>',
                '<param name="weight" value="-1"/>')
    found = errors_of(text)
    assert any("needs shed-keep" in e for e in found), found
    assert any("shed-utility" in e and "1.5" in e for e in found), found
    assert any("weight" in e and "-1" in e for e in found), found
    assert all(e.startswith("/tmp/shed-q.xml:") for e in found)
    line = text.splitlines().index(next(x for x in text.splitlines() if "weight" in x)) + 1
    assert any(e.startswith(f"/tmp/shed-q.xml:{line}:") and "weight" in e for e in found), found


@pytest.mark.parametrize("keep, message", [
    ("raw.nope > 1", "nope"),
    ("raw.temp + 1", "not boolean"),
    ("raw.temp >", ""),
])
def test_a_bad_shed_keep_is_refused(keep: str, message: str) -> None:
    found = errors_of(spec('<param name="shed" value="semantic"/>'
                           f'<param name="shed-keep" value="{keep.replace(">", "&gt;")}"/>'))
    assert any("shed-keep" in e and message in e for e in found), found


def test_keep_without_semantic_is_refused() -> None:
    found = errors_of(spec('<param name="shed" value="random"/>'
                           '<param name="shed-keep" value="raw.temp &gt; 1"/>'))
    assert any("semantic shedding only" in e for e in found), found


def test_an_unknown_mode_is_refused() -> None:
    found = errors_of(spec('<param name="shed" value="sometimes"/>'))
    assert any("shed" in e and "sometimes" in e for e in found), found


GOLDEN = Path(__file__).resolve().parent / "golden" / "rewrite" / "shedding.txt"


def test_golden_plan_before_and_after() -> None:
    """The explain of a shed query, as a reader sees it (ELASTIQ_UPDATE_GOLDEN=1 rewrites it)."""
    c = compile_spec_text(spec(second_sink=True), "shed-q.xml", base_dir="/srv/elastiq",
                          plan_only=True)
    text = explain(c) + "\n"
    if os.environ.get("ELASTIQ_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), f"{GOLDEN} differs from what the rewrite produces now"


def test_rewriting_the_rewritten_graph_changes_nothing() -> None:
    rules = rules_for()
    graph, problems = logical_graph_text(spec(), "spec.xml")
    assert graph is not None, problems
    once = rewrite(graph, rules)
    twice = rewrite(once.graph, rules)
    assert twice.firings == () and twice.graph == once.graph and once.graph != graph


def test_the_compiled_query_carries_every_sinks_weight() -> None:
    """The scheduler's shedding plan weighs sinks from the compiled query (issue 32): every sink
    with its spec weight (default 1), and the same after a round trip through JSON."""
    from common.tasks import CompiledQuery

    query = compiled(spec(second_sink=True)).query
    assert query.weights == {"sink": 2.0, "all": 1.0}
    assert CompiledQuery.from_json(query.to_json()).weights == {"sink": 2.0, "all": 1.0}
    zero = compiled(spec(weight='<param name="weight" value="0"/>')).query
    assert zero.weights == {"sink": 0.0}
