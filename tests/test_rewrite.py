"""The rewrite engine and the five pattern rules (layers 1 and 2, pure): for every rule a golden
before/after plan, a spec where it must not fire, and idempotence; the shape of each replacement
checked against what the pattern must produce; phase order; the invariant checker; the spec
attributes that ask for patterns; `compile` deploying pattern plans but refusing hot standby of
a join, which `explain` still shows.
Set ELASTIQ_UPDATE_GOLDEN=1 to rewrite tests/golden/rewrite/ after an intended change."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from common.diagnostics import SpecError
from common.types import Schema
from compiler.graph import Graph, Node, Stream
from compiler.pipeline import compile_spec_text, logical_graph_text, rules_for
from compiler.rewrite import RewriteError, check_invariants, find_matches, rewrite
from elastiq.cli import main
from elastiq.explain import explain
from tests.spec_snippets import locate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").rglob("*.xml"))
GOLDEN = Path(__file__).resolve().parent / "golden" / "rewrite"
BASE = "/srv/elastiq"
RULES = rules_for()


def spec(example: str, attrs: dict[str, str], dataflow: str = "") -> str:
    """An example spec with pattern attributes added to the named operators (and the query)."""
    text = (ROOT / "examples" / f"{example}.xml").read_text()
    for name, extra in attrs.items():
        text, n = re.subn(rf'<operator name="{name}" type="([a-z\-]+)"',
                          rf'<operator name="{name}" type="\1" {extra}', text)
        assert n == 1, name
    if dataflow:
        text = text.replace(f'<dataflow name="{example}"', f'<dataflow name="{example}" '
                                                            f'{dataflow}')
    return text


def logical(text: str) -> Graph:
    graph, problems = logical_graph_text(text, "spec.xml")
    assert graph is not None, [d.render() for d in problems]
    return graph


def nodes(graph: Graph, **where: object) -> list[Node]:
    return [n for n in graph.nodes if all(getattr(n, k) == v for k, v in where.items())]


# ----------------------------------------------------------------------------------------------
# Golden before/after plans, negatives and idempotence, per rule

CASES = {
    "standby": ("paper-filter", {"myFilter": 'ha="standby"'}),
    "checkpoint": ("hot-sensors", {"avg": 'ha="checkpoint"'}),
    "hot-standby": ("sensor-join", {"matched": 'ha="hot-standby" replicas="3"'}),
    "partitioning": ("sensor-join", {"matched": 'parallelism="2" partition-by="sensor"'}),
    "pipelining": ("hot-sensors", {"avg": 'pipeline="split"'}),
}

NEGATIVE = {  # a spec where the rule must not fire
    "standby": ("hot-sensors", {"hot": 'ha="hot-standby"'}),
    "checkpoint": ("paper-filter", {"myFilter": 'ha="checkpoint"'}),  # stateless: standby
    "hot-standby": ("sensor-join", {"matched": 'ha="checkpoint"'}),
    "partitioning": ("hot-sensors", {"avg": 'parallelism="1"'}),
    "pipelining": ("hot-sensors", {"hot": 'ha="standby"', "avg": 'ha="checkpoint"'}),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_golden_plan_before_and_after(rule: str) -> None:
    example, attrs = CASES[rule]
    c = compile_spec_text(spec(example, attrs), f"{example}.xml", base_dir=BASE, plan_only=True)
    assert [f.rule for f in c.firings] == [rule]
    text = explain(c) + "\n"
    path = GOLDEN / f"{rule}.txt"
    if os.environ.get("ELASTIQ_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with ELASTIQ_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs from what the rewrite produces now"


@pytest.mark.parametrize("rule", sorted(NEGATIVE))
def test_rule_does_not_fire_where_it_must_not(rule: str) -> None:
    example, attrs = NEGATIVE[rule]
    result = rewrite(logical(spec(example, attrs)), RULES)
    assert rule not in [f.rule for f in result.firings]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rewriting_the_rewritten_graph_changes_nothing(rule: str) -> None:
    example, attrs = CASES[rule]
    once = rewrite(logical(spec(example, attrs)), RULES)
    twice = rewrite(once.graph, RULES)
    assert twice.firings == () and twice.graph == once.graph
    assert once.graph != logical(spec(example, attrs))


def test_guards_refuse_what_the_validator_would_also_refuse() -> None:
    """A stateful node asking for standby, or an unpartitionable one for parallelism, does not
    match even if it reaches the engine (e.g. from a scheduler request)."""
    g = logical(spec("hot-sensors", {}))
    avg = g.node("avg")
    forced = [replace(avg, patterns=(("ha", "standby"),)),
              replace(avg, patterns=(("parallelism", 2),), partition_keys=None)]
    for node in forced:
        graph = Graph(g.name, tuple(node if n.name == "avg" else n for n in g.nodes), g.streams)
        assert all(not list(find_matches(graph, r)) for r in RULES)


def asks_for_a_pattern(text: str) -> bool:
    return any(f' {attribute}="' in text for attribute in ("ha", "parallelism", "pipeline"))


def test_examples_without_patterns_are_not_rewritten() -> None:
    plain = [p for p in EXAMPLES if not asks_for_a_pattern(p.read_text())]
    assert len(plain) >= 5
    for path in plain:
        graph = logical(path.read_text())
        result = rewrite(graph, RULES)
        assert result.firings == () and result.graph == graph, path.name


def test_the_resilient_example_fires_one_rule_per_attribute() -> None:
    (path,) = [p for p in EXAMPLES if asks_for_a_pattern(p.read_text())]
    result = rewrite(logical(path.read_text()), RULES)
    # one phase (fault tolerance); within it, rules in name order
    assert [(f.rule, f.focus) for f in result.firings] == [("checkpoint", "avg"),
                                                           ("standby", "hot")]


# ----------------------------------------------------------------------------------------------
# The shape of each replacement, against what the paper's pattern requires

def test_hot_standby_replicates_a_join_onto_distinct_nodes() -> None:
    k = 3
    g = rewrite(logical(spec("sensor-join", {"matched": f'ha="hot-standby" replicas="{k}"'})),
                RULES).graph
    assert "matched" not in {n.name for n in g.nodes}
    replicas = nodes(g, kind="join")
    assert [n.name for n in replicas] == [f"matched_{i}" for i in range(1, k + 1)]
    assert len({n.placement for n in replicas}) == k and all(n.placement for n in replicas)
    (selector,) = nodes(g, kind="stream-selector")
    assert selector.output == "pairs" and selector.inputs == tuple(n.output for n in replicas)
    assert selector.param("replicas") == k and selector.param("protects") == "matched"
    multicasts = nodes(g, kind="multicast")
    assert sorted(m.inputs[0] for m in multicasts) == ["offset", "reading"]
    assert all(m.param("copies") == k for m in multicasts)
    for i, replica in enumerate(replicas, 1):
        readers = [g.producer(s) for s in replica.inputs]
        assert [r.kind for r in readers] == ["network-reader"] * 2
        assert all(r.param("replica") == i and r.placement == replica.placement for r in readers)
        assert [g.producer(r.inputs[0]).inputs[0] for r in readers] == ["reading", "offset"]


def test_partitioning_splits_by_the_key_of_each_input() -> None:
    g = rewrite(logical(spec("hot-sensors", {"avg": 'parallelism="4"'})), RULES).graph
    (splitter,) = nodes(g, kind="splitter")
    assert splitter.param("key") == "sensor" and splitter.param("partitions") == 4
    copies = nodes(g, kind="window-aggregate")
    assert len(copies) == 4 and len({c.placement for c in copies}) == 4
    (merger,) = nodes(g, kind="merger")
    assert merger.output == "averages" and len(merger.inputs) == 4
    partitions = sorted(g.producer(c.inputs[0]).param("partition") for c in copies)
    assert partitions == [1, 2, 3, 4]


def test_standby_failover_names_a_distinct_standby_and_the_replaying_writer() -> None:
    g = rewrite(logical(spec("paper-filter", {"myFilter": 'ha="standby"'})), RULES).graph
    (failover,) = nodes(g, kind="failover")
    f = g.node("myFilter")
    assert failover.inputs == (f.output,) and failover.output == "filteredStream"
    assert failover.param("mode") == "standby" and failover.param("protects") == "myFilter"
    assert failover.param("standby-placement") not in (None, f.placement)
    writer = g.node(failover.param("replay-from"))
    assert writer.kind == "network-writer" and writer.param("backup") == "upstream"
    assert writer.inputs == ("aStream",)


def test_checkpoint_marks_shared_checkpoint_storage_for_the_scheduler() -> None:
    g = rewrite(logical(spec("hot-sensors", {"avg": 'ha="checkpoint"'})), RULES).graph
    (failover,) = nodes(g, kind="failover")
    assert failover.param("mode") == "checkpoint" and failover.param("checkpoint") == "shared"
    assert g.node("avg").stateful and g.node("avg").origin == "checkpoint"


def test_query_wide_pipelining_cuts_every_transform_apart_from_its_upstream() -> None:
    g = rewrite(logical(spec("hot-sensors", {}, dataflow='pipeline="split"')), RULES).graph
    for name in ("hot", "avg"):
        node = g.node(name)
        reader = g.producer(node.inputs[0])
        writer = g.producer(reader.inputs[0])
        assert (reader.kind, writer.kind) == ("network-reader", "network-writer")
        assert reader.placement == node.placement != writer.placement


# ----------------------------------------------------------------------------------------------
# Phases and invariants

def test_phases_run_in_their_written_order_not_in_graph_order() -> None:
    text = spec("sensor-join", {"offsets": 'pipeline="split"', "matched": 'parallelism="2"',
                                "corrected": 'ha="standby"'})
    result = rewrite(logical(text), RULES)
    assert [(f.rule, f.focus) for f in result.firings] == [
        ("standby", "corrected"), ("partitioning", "matched"), ("pipelining", "offsets")]


BROKEN = """\
rule broken
phase fault-tolerance
focus f
match a2 := any(f := project(a1 := any*))
when  wants(f, ha)
=>    a2(merger{partitions: 1}(a1))
"""


def test_the_invariant_checker_catches_a_broken_replacement(tmp_path: Path) -> None:
    (tmp_path / "broken.rule").write_text(BROKEN)
    text = spec("sensor-join", {"corrected": 'ha="standby"'})
    with pytest.raises(RewriteError) as e:
        rewrite(logical(text), rules_for(tmp_path))
    (d,) = e.value.diagnostics
    assert "rule broken" in d.message and "changed type" in d.message
    assert d.position.file == str(tmp_path / "broken.rule") and d.position.line == 1


def test_the_invariant_checker_sees_cycles_and_double_producers() -> None:
    schema = Schema.of(("x", "int"))
    a = Node("a", "filter", "transform", False, ("s2",), "s1")
    b = Node("b", "filter", "transform", False, ("s1",), "s2")
    cycle = Graph("q", (a, b), (Stream("s1", schema, "a"), Stream("s2", schema, "b")))
    assert check_invariants(cycle, cycle, {}) == ["the graph has a cycle"]
    c = Node("c", "filter", "transform", False, ("s1",), "s1")
    double = Graph("q", (a, c), (Stream("s1", schema, "a"), Stream("s1", schema, "c")))
    assert "stream 's1' has more than one producer" in check_invariants(double, double, {})


def test_placement_needing_more_nodes_than_allowed_is_refused() -> None:
    graph = logical(spec("sensor-join", {"matched": 'ha="hot-standby" replicas="3"'}))
    assert rewrite(graph, RULES, max_nodes=3).firings
    with pytest.raises(RewriteError) as e:
        rewrite(graph, RULES, max_nodes=2)
    assert "needs 3 distinct nodes, the plan allows 2" in str(e.value)


# ----------------------------------------------------------------------------------------------
# Spec attributes: located errors

def _errors(text: str) -> list[tuple[int, int, str]]:
    graph, problems = logical_graph_text(text, "spec.xml")
    return [(d.position.line, d.position.column, d.message + " " + d.hint)
            for d in problems if d.severity == "error"]


def _at_value(text: str, attr: str) -> tuple[int, int]:
    line, column = locate(text, attr)
    return line, column + attr.index('"') + 1


@pytest.mark.parametrize("example,attrs,attr,words", [
    ("hot-sensors", {"avg": 'ha="standby"'}, 'ha="standby"', ["stateful", "checkpoint",
                                                             "hot-standby"]),
    ("hot-sensors", {"avg": 'ha="cold"'}, 'ha="cold"', ["not a fault-tolerance pattern"]),
    ("hot-sensors", {"avg": 'parallelism="2" partition-by="temp"'}, 'partition-by="temp"',
     ["cannot be partitioned by 'temp'", "sensor"]),
    ("hot-sensors", {"hot": 'parallelism="2" partition-by="colour"'}, 'partition-by="colour"',
     ["'colour' is not in stream 'raw'"]),
    ("hot-sensors", {"hot": 'replicas="3"'}, 'replicas="3"', ["needs ha=\"hot-standby\""]),
    ("hot-sensors", {"hot": 'ha="hot-standby" replicas="many"'}, 'replicas="many"',
     ["not a whole number"]),
    ("hot-sensors", {"src": 'ha="standby"'}, 'ha="standby"', ["transform operators",
                                                             "source"]),
    ("hot-sensors", {"hot": 'ha="standby" parallelism="2"'}, 'parallelism="2"',
     ["one pattern per operator"]),
    ("hot-sensors", {"hot": 'pipeline="merge"'}, 'pipeline="merge"', ["pipeline=\"split\""]),
    ("hot-sensors", {"hot": 'ha="standby" max-parallelism="4"'}, 'max-parallelism="4"',
     ["one pattern per operator"]),
    ("sensor-join", {"matched": 'parallelism="2" partition-by="temp"'}, 'partition-by="temp"',
     ["cannot be partitioned by 'temp'"]),
])
def test_a_misused_pattern_attribute_is_located(example: str, attrs: dict[str, str], attr: str,
                                                words: list[str]) -> None:
    text = spec(example, attrs)
    errors = _errors(text)
    where = _at_value(text, attr)
    assert any((ln, col) == where and all(w in msg for w in words) for ln, col, msg in errors), (
        where, errors)


def test_a_query_wide_default_applies_to_every_transform_and_errors_name_the_operator() -> None:
    text = spec("hot-sensors", {}, dataflow='ha="hot-standby"')
    graph = logical(text)
    assert graph.node("hot").wants("ha") == "hot-standby" and graph.node("src").wants("ha") is None
    assert graph.node("avg").wants("replicas") == 2
    bad = spec("hot-sensors", {}, dataflow='ha="standby"')
    errors = _errors(bad)
    assert [(ln, col) for ln, col, _ in errors] == [_at_value(bad, 'ha="standby"')]
    assert "for 'avg'" in errors[0][2]


def test_a_plumbing_operator_cannot_be_written_in_a_spec() -> None:
    text = spec("paper-filter", {}).replace('type="filter"', 'type="multicast"')
    errors = _errors(text)
    assert any("plumbing operator" in msg for _, _, msg in errors)


# ----------------------------------------------------------------------------------------------
# compile deploys pattern plans, but refuses hot standby of a two-input operator; explain shows
# both

@pytest.mark.parametrize("rule", sorted(set(CASES) - {"hot-standby"}))
def test_compile_deploys_a_pattern_plan_with_its_plumbing_in_tasks(rule: str) -> None:
    example, attrs = CASES[rule]
    c = compile_spec_text(spec(example, attrs), f"{example}.xml", base_dir=BASE)
    assert c.refused == ()
    placed = [n for t in c.query.tasks for n in t.operators]
    assert sorted(placed) == sorted(n.name for n in c.physical.nodes)  # each operator once
    assert len(c.query.tasks) > 1 and c.query.channels


def test_compile_refuses_hot_standby_of_a_join_with_one_located_diagnostic() -> None:
    text = spec("sensor-join", {"matched": 'ha="hot-standby"'})
    with pytest.raises(SpecError) as e:
        compile_spec_text(text, "sensor-join.xml", base_dir=BASE)
    (d,) = e.value.diagnostics
    assert (d.message, d.hint) == ("hot standby needs an operator with one input",
                                   'use ha="checkpoint" for a join or union')
    assert (d.position.line, d.position.column) == _at_value(text, 'ha="hot-standby"')
    shown = compile_spec_text(text, "sensor-join.xml", base_dir=BASE, plan_only=True)
    assert shown.refused == (d,) and shown.query.tasks


def test_cli_explain_with_a_user_rule_folder_and_compile(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "isolate.rule").write_text(
        "rule a-isolate-filter phase pipelining focus f\n"
        "match a2 := any(f := filter(a1 := any*)) when wants(f, pipeline, split)\n"
        "=> a2(f@p2(network-reader@p2(network-writer{backup: upstream}@p1(a1))))\n")
    path = tmp_path / "paper-filter.xml"
    path.write_text(spec("paper-filter", {"myFilter": 'pipeline="split"'}))
    (tmp_path / "data").mkdir()  # the CLI wants the spec's input file to exist
    (tmp_path / "data" / "numbers.jsonl").write_text('{"n": 1}\n')
    assert main(["explain", str(path), "--rules", str(rules), "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "1. a-isolate-filter [pipelining] on myFilter" in out
    assert "2. " not in out  # the request is consumed: the shipped pipelining rule stays quiet
    assert "myFilter_wr: network-writer {backup: upstream}" in out
    assert main(["compile", str(path), "-o", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "(source, myFilter_wr)" in out and "(myFilter_rd, myFilter, sink)" in out
    joined = tmp_path / "sensor-join.xml"
    joined.write_text(spec("sensor-join", {"matched": 'ha="hot-standby"'}))
    assert main(["compile", str(joined), "-o", str(tmp_path / "j")]) == 1
    assert "hot standby needs an operator with one input" in capsys.readouterr().err
    (rules / "bad.rule").write_text("rule bad phase nowhere focus f\n")
    assert main(["explain", str(path), "--rules", str(rules), "-o", str(tmp_path / "o")]) == 1
    assert f"{rules / 'bad.rule'}:2:1: error: expected 'match'" in capsys.readouterr().err
