"""Pattern plans cut into deployable tasks (layers 1 and 2, pure): for each of the five patterns
on an example spec with one attribute added, the tasks (operators per task), the channels (ids,
producer, consumers), placement groups, apart_from, initially_apart_from, failover modes and
ports; the runtime calls of the generated programs; golden programs per pattern under
tests/golden/patterns/<pattern>/ (ELASTIQ_UPDATE_GOLDEN=1 rewrites them; read the diff); and the
refusal of hot standby for an operator with several inputs, with its file:line:column."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from common.diagnostics import SpecError
from common.tasks import CompiledQuery, QueryTask, partition_channel_id
from compiler import expr
from compiler.pipeline import Compilation, check_spec_text, compile_spec_text
from compiler.tasks import cut_streams
from tests.spec_snippets import locate
from tests.test_rewrite import ROOT, spec

GOLDEN = Path(__file__).resolve().parent / "golden" / "patterns"
BASE = "/srv/elastiq"

# pattern -> (example, the one attribute added); one spec per pattern for the golden programs
PATTERNS = {
    "standby": ("paper-filter", {"myFilter": 'ha="standby"'}),
    "checkpoint": ("hot-sensors", {"avg": 'ha="checkpoint"'}),
    "hot-standby": ("hot-sensors", {"avg": 'ha="hot-standby" replicas="3"'}),
    "partitioning": ("sensor-join", {"matched": 'parallelism="2" partition-by="sensor"'}),
    "pipelining": ("hot-sensors", {"avg": 'pipeline="split"'}),
}


def compiled(example: str, attrs: dict[str, str], dataflow: str = "") -> Compilation:
    return compile_spec_text(spec(example, attrs, dataflow), f"{example}.xml", base_dir=BASE)


def tasks_by_operators(q: CompiledQuery) -> dict[tuple[str, ...], QueryTask]:
    return {t.operators: t for t in q.tasks}


def channels_of(q: CompiledQuery) -> dict[str, tuple[str, tuple[str, ...]]]:
    """channel id -> (producer's operators, consumers' operators), independent of task ids."""
    ops = {t.task_id: t.operators for t in q.tasks}
    return {c.channel_id: (ops[c.producer], tuple(ops[t] for t in c.consumers))
            for c in q.channels}


def rt_calls(program: str) -> list[tuple[str, dict[str, object]]]:
    """The `rt.<method>(k=literal, ...)` calls of a generated program's build(), in order."""
    build = next(n for n in ast.parse(program).body
                 if isinstance(n, ast.FunctionDef) and n.name == "build")
    calls = []
    for stmt in build.body:
        assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
        func = stmt.value.func
        assert isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        assert func.value.id == "rt"
        kwargs = {k.arg: (ast.literal_eval(k.value) if not isinstance(k.value, ast.Name)
                          else k.value.id) for k in stmt.value.keywords}
        calls.append((func.attr, kwargs))
    return calls


def methods(task: QueryTask) -> list[str]:
    return [m for m, _ in rt_calls(task.program)]


# ----------------------------------------------------------------------------------------------
# Without plumbing, tasks split exactly as before the patterns

@pytest.mark.parametrize("path", sorted((ROOT / "examples").rglob("*.xml")), ids=lambda p: p.stem)
def test_a_plan_without_patterns_cuts_only_streams_with_several_readers(path: Path) -> None:
    graph, _ = check_spec_text(path.read_text(), path.name)
    assert graph is not None
    shared = {s.name for s in graph.streams if len(graph.consumers(s.name)) > 1}
    assert cut_streams(graph) == shared


# ----------------------------------------------------------------------------------------------
# Every pattern: what holds for any plan

@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_every_operator_is_in_one_task_and_every_channel_joins_its_tasks(pattern: str) -> None:
    c = compiled(*PATTERNS[pattern])
    q = c.query
    placed = [n for t in q.tasks for n in t.operators]
    assert sorted(placed) == sorted(n.name for n in c.physical.nodes)
    owner = {n: t.task_id for t in q.tasks for n in t.operators}
    for ch in q.channels:
        assert ch.producer == owner[c.physical.stream(ch.stream).producer]
        assert ch.schema == c.physical.stream(ch.stream).schema
        assert ch.consumers and all(ch.channel_id in q.task(t).inputs for t in ch.consumers)
    for t in q.tasks:
        assert t.outputs == tuple(ch.channel_id for ch in q.channels if ch.producer == t.task_id)
        assert t.resources.ports == len(t.outputs)
        assert set(t.inputs) == {ch.channel_id for ch in q.channels if t.task_id in ch.consumers}


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_apart_from_is_symmetric_and_names_groups_of_other_tasks(pattern: str) -> None:
    q = compiled(*PATTERNS[pattern]).query
    group = {t.task_id: t.placement.group for t in q.tasks}
    for t in q.tasks:
        assert t.placement.group not in t.placement.apart_from
        for other in t.placement.apart_from:
            holders = [u for u in q.tasks if group[u.task_id] == other]
            assert holders and all(t.placement.group in u.placement.apart_from for u in holders)


EXPRESSION_CASES = dict(PATTERNS, **{
    "partitioned-filter": ("stock-ticks", {"big": 'parallelism="2"'}),  # trades.notional
    "pipelined-project": ("sensor-join", {"corrected": 'pipeline="split"'}),  # pairs.temp
})


@pytest.mark.parametrize("case", sorted(EXPRESSION_CASES))
def test_generated_expressions_type_check_against_the_streams_the_program_names(
        case: str) -> None:
    """A copy behind a reader reads its input under the spec's stream name, so its conditions
    (`aStream.x < 42`) and fields resolve; checked by compiling every expression in the scope
    the runtime builds from the call's own `input`."""
    c = compiled(*EXPRESSION_CASES[case])
    checked = 0
    for t in c.query.tasks:
        for method, kw in rt_calls(t.program):
            if method not in ("filter", "project"):
                continue
            schema = c.physical.stream(c.physical.node(str(kw["op"])).inputs[0]).schema
            scope = expr.Scope({str(kw["input"]): schema})
            if method == "filter":
                expr.compile_condition(str(kw["condition"]), scope)
            else:
                for _, text in kw["fields"]:  # type: ignore[union-attr]
                    expr.compile_expression(text, scope)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_a_pattern_query_round_trips_through_json(pattern: str) -> None:
    q = compiled(*PATTERNS[pattern]).query
    assert CompiledQuery.from_json(q.to_json()) == q


# ----------------------------------------------------------------------------------------------
# Each pattern: its tasks, channels, placement and failover

def test_standby_protects_the_filter_task_and_starts_it_apart_from_its_neighbours() -> None:
    q = compiled(*PATTERNS["standby"]).query
    t = tasks_by_operators(q)
    src, f, out = t[("source", "myFilter_w")], t[("myFilter_rd", "myFilter")], \
        t[("myFilter_fo", "sink")]
    assert len(t) == 3
    assert channels_of(q) == {
        "paper-filter/myFilter_w": (src.operators, (f.operators,)),
        "paper-filter/myFilter_out": (f.operators, (out.operators,)),
    }
    assert (f.placement.group, f.placement.apart_from) == ("myFilter.p1", ())
    assert f.placement.initially_apart_from == (src.placement.group, out.placement.group)
    assert (src.placement.group, out.placement.group) == (src.task_id, out.task_id)
    assert (f.failover, src.failover, out.failover) == ("standby", None, None)
    assert [x.resources.ports for x in (src, f, out)] == [1, 1, 0]
    assert methods(src) == ["file_source", "identity", "channel_sink"]
    assert methods(f) == ["channel_source", "identity", "filter", "channel_sink"]
    assert methods(out) == ["channel_source", "identity", "file_sink"]


def test_checkpoint_marks_the_stateful_task_for_a_checkpoint_failover() -> None:
    q = compiled(*PATTERNS["checkpoint"]).query
    t = tasks_by_operators(q)
    assert set(t) == {("src", "hot", "avg_w"), ("avg_rd", "avg"), ("avg_fo", "sink")}
    avg = t[("avg_rd", "avg")]
    assert avg.stateful and avg.failover == "checkpoint" and avg.placement.group == "avg.p1"
    neighbours = {t[("src", "hot", "avg_w")].placement.group, t[("avg_fo", "sink")].placement.group}
    assert set(avg.placement.initially_apart_from) == neighbours
    assert [x.failover for x in q.tasks if x is not avg] == [None, None]


@pytest.mark.parametrize("k", [2, 3])
def test_hot_standby_replicas_read_one_multicast_and_one_selector_reads_them(k: int) -> None:
    q = compiled("hot-sensors", {"avg": f'ha="hot-standby" replicas="{k}"'}).query
    t = tasks_by_operators(q)
    upstream, selector = t[("src", "hot", "avg_m")], t[("avg_sel", "sink")]
    replicas = [t[(f"avg_rd_{i}", f"avg_{i}")] for i in range(1, k + 1)]
    assert len(t) == k + 2
    expected = {"hot-sensors/avg_m": (upstream.operators, tuple(r.operators for r in replicas))}
    expected |= {f"hot-sensors/avg_{i}_out": (r.operators, (selector.operators,))
                 for i, r in enumerate(replicas, 1)}
    assert channels_of(q) == expected
    groups = [f"avg.p{i}" for i in range(1, k + 1)]
    for group, r in zip(groups, replicas):
        assert r.failover == "replica" and r.placement.group == group
        assert r.placement.apart_from == tuple(g for g in groups if g != group)
        assert r.placement.initially_apart_from == (upstream.placement.group,
                                                    selector.placement.group)
        assert methods(r)[:2] == ["deterministic_batches", "channel_source"]
    assert upstream.failover is None and selector.failover is None
    calls = rt_calls(selector.program)
    assert [m for m, _ in calls] == ["selector_source", "file_sink"]
    assert calls[0][1] == {"output": "averages", "schema": "SCHEMA_AVERAGES",
                           "channels": tuple(r.outputs[0] for r in replicas)}


@pytest.mark.parametrize("k", [2, 3])
def test_partitioning_gives_each_splitter_one_channel_per_partition(k: int) -> None:
    q = compiled("sensor-join", {"matched": f'parallelism="{k}" partition-by="sensor"'}).query
    t = tasks_by_operators(q)
    left, right = t[("readings", "matched_s_in1")], t[("calib", "offsets", "matched_s_in2")]
    copies = [t[(f"matched_rd_{i}_in1", f"matched_rd_{i}_in2", f"matched_{i}")]
              for i in range(1, k + 1)]
    merge = t[("matched_merge", "corrected", "sink")]
    assert len(t) == k + 3
    expected = {}
    for splitter, stream in ((left, "matched_s_in1"), (right, "matched_s_in2")):
        partitions = tuple(partition_channel_id("sensor-join", stream, i) for i in range(1, k + 1))
        assert splitter.outputs == partitions and splitter.resources.ports == k
        expected |= {ch: (splitter.operators, (copy.operators,))
                     for ch, copy in zip(partitions, copies)}
        ((method, kw),) = [c for c in rt_calls(splitter.program) if c[0] == "split_channel_sink"]
        assert kw["channels"] == partitions and kw["key"] == ("sensor",)
        assert kw["readers"] == tuple((copy.task_id,) for copy in copies)
        assert methods(splitter)[-1] == "split_channel_sink" and "splitter" not in methods(
            splitter)
    expected |= {f"sensor-join/matched_{i}_out": (copy.operators, (merge.operators,))
                 for i, copy in enumerate(copies, 1)}
    assert channels_of(q) == expected
    for i, copy in enumerate(copies, 1):
        assert copy.inputs == (partition_channel_id("sensor-join", "matched_s_in1", i),
                               partition_channel_id("sensor-join", "matched_s_in2", i))
        read = [kw["channel"] for m, kw in rt_calls(copy.program) if m == "channel_source"]
        assert tuple(read) == copy.inputs
        assert copy.placement.group == f"matched.p{i}" and copy.failover is None
        assert copy.placement.initially_apart_from == ()
        assert len(copy.placement.apart_from) == k - 1
    merged = [kw for m, kw in rt_calls(merge.program) if m == "union"]
    assert merged == [{"op": "matched_merge", "output": "pairs",
                       "inputs": tuple(f"matched_{i}_out" for i in range(1, k + 1)),
                       "merger": True}]  # a merger does not wait for a cut instance


def test_round_robin_partitioning_splits_without_a_key() -> None:
    q = compiled("stock-ticks", {"big": 'parallelism="2"'}).query
    (splitter,) = [t for t in q.tasks if "big_s" in t.operators]
    ((_, kw),) = [c for c in rt_calls(splitter.program) if c[0] == "split_channel_sink"]
    assert kw["key"] == () and kw["input"] == "trades"
    assert len(q.task(splitter.task_id).outputs) == 2


def test_pipelining_puts_the_two_halves_in_groups_kept_apart() -> None:
    q = compiled(*PATTERNS["pipelining"]).query
    t = tasks_by_operators(q)
    up, down = t[("src", "hot", "avg_wr")], t[("avg_rd", "avg", "sink")]
    assert len(t) == 2
    assert channels_of(q) == {"hot-sensors/avg_wr": (up.operators, (down.operators,))}
    assert (up.placement.group, up.placement.apart_from) == ("avg.p1", ("avg.p2",))
    assert (down.placement.group, down.placement.apart_from) == ("avg.p2", ("avg.p1",))
    assert up.failover is None and down.failover is None
    assert up.placement.initially_apart_from == down.placement.initially_apart_from == ()


# ----------------------------------------------------------------------------------------------
# Golden programs, one spec per pattern

@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_pattern_programs_match_golden(pattern: str) -> None:
    q = compiled(*PATTERNS[pattern]).query
    folder = GOLDEN / pattern
    expected = {f"{t.task_id.split('.')[-1]}.py": t.program for t in q.tasks}
    if os.environ.get("ELASTIQ_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.py"):
            stale.unlink()
        for name, program in expected.items():
            (folder / name).write_text(program)
    assert sorted(p.name for p in folder.glob("*.py")) == sorted(expected), (
        f"{folder}: run with ELASTIQ_UPDATE_GOLDEN=1")
    for name, program in expected.items():
        ast.parse(program)
        assert program == (folder / name).read_text(), f"{folder / name} differs"


# ----------------------------------------------------------------------------------------------
# Hot standby of an operator with several inputs is refused where it is asked for

def _at_value(text: str, attr: str) -> tuple[int, int]:
    line, column = locate(text, attr)
    return line, column + attr.index('"') + 1


@pytest.mark.parametrize("example,attrs,dataflow,attr", [
    ("sensor-join", {"matched": 'ha="hot-standby" replicas="2"'}, "", 'ha="hot-standby"'),
    ("two-sites-union", {"all": 'ha="hot-standby"'}, "", 'ha="hot-standby"'),
    ("sensor-join", {}, 'ha="hot-standby"', 'ha="hot-standby"'),  # query-wide: the dataflow's
])
def test_hot_standby_of_a_join_or_union_is_refused_at_its_ha_attribute(
        example: str, attrs: dict[str, str], dataflow: str, attr: str) -> None:
    text = spec(example, attrs, dataflow)
    with pytest.raises(SpecError) as e:
        compile_spec_text(text, f"{example}.xml", base_dir=BASE)
    (d,) = e.value.diagnostics
    assert d.severity == "error" and d.message == "hot standby needs an operator with one input"
    assert d.hint == 'use ha="checkpoint" for a join or union'
    assert (d.position.file, d.position.line, d.position.column) == (
        f"{example}.xml", *_at_value(text, attr))
    shown = compile_spec_text(text, f"{example}.xml", base_dir=BASE, plan_only=True)
    assert shown.refused == (d,)


def test_checkpoint_of_a_join_is_deployed() -> None:
    c = compiled("sensor-join", {"matched": 'ha="checkpoint"'})
    (protected,) = [t for t in c.query.tasks if t.failover]
    assert protected.failover == "checkpoint" and "matched" in protected.operators
    assert len(protected.inputs) == 2
