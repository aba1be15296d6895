"""The compiler from spec to tasks: graphs, notation, task splitting, generated programs, and
golden files of each example's plans and programs (set ELASTIQ_UPDATE_GOLDEN=1 to rewrite them
after an intended change, then read the diff)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from common.diagnostics import SpecError
from common.paths import PathRoots, control_characters
from compiler.codegen import py_literal
from compiler.graph import notation, to_dot, to_mermaid
from compiler.pipeline import Compilation, compile_spec_file, compile_spec_text
from elastiq.explain import explain
from tests.spec_snippets import SOURCE, SINK, dataflow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").rglob("*.xml"))
GOLDEN = Path(__file__).resolve().parent / "golden"
BASE = "/srv/elastiq"  # fixed base folder so golden programs do not depend on the checkout


def _compile(path: Path) -> Compilation:
    return compile_spec_file(path, base_dir=BASE)


def _example(path: Path) -> str:
    """An example's name relative to examples/, without .xml (`closed-loop/monitor`)."""
    return path.relative_to(ROOT / "examples").with_suffix("").as_posix()


def _check_golden(path: Path, text: str) -> None:
    if os.environ.get("ELASTIQ_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with ELASTIQ_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs from what the compiler produces now"


def test_there_are_the_four_required_examples() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"paper-filter", "hot-sensors", "sensor-join", "stock-ticks"} <= names


@pytest.mark.parametrize("spec", EXAMPLES, ids=[_example(p) for p in EXAMPLES])
def test_example_plans_match_golden(spec: Path) -> None:
    c = _compile(spec)
    _check_golden(GOLDEN / _example(spec) / "explain.txt", explain(c) + "\n")
    _check_golden(GOLDEN / _example(spec) / "physical.dot",
                  to_dot(c.physical, {p.task_id: list(p.nodes) for p in c.plans}))


@pytest.mark.parametrize("spec", EXAMPLES, ids=[_example(p) for p in EXAMPLES])
def test_example_programs_match_golden(spec: Path) -> None:
    c = _compile(spec)
    for task in c.query.tasks:
        ast.parse(task.program)
        _check_golden(GOLDEN / _example(spec) / f"{task.task_id.split('.')[-1]}.py", task.program)


def test_paper_example_in_paper_notation() -> None:
    c = _compile(ROOT / "examples" / "paper-filter.xml")
    assert notation(c.logical) == ["sink := file_sink(myFilter := filter(source := file_source))"]


def test_a_chain_is_one_task() -> None:
    c = _compile(ROOT / "examples" / "hot-sensors.xml")
    assert len(c.query.tasks) == 1
    task = c.query.tasks[0]
    assert task.operators == ("src", "hot", "avg", "sink")
    assert task.stateful and task.inputs == () and task.outputs == ()


def test_a_shared_stream_becomes_a_channel_between_tasks() -> None:
    c = _compile(ROOT / "examples" / "stock-ticks.xml")
    tasks = {t.task_id: t for t in c.query.tasks}
    assert len(tasks) == 3
    (channel,) = c.query.channels
    assert channel.channel_id == "stock-ticks/trades"
    producer = tasks[channel.producer]
    assert producer.operators == ("ticks", "notional") and producer.outputs == ("stock-ticks/trades",)
    assert producer.resources.ports == 1
    consumers = [tasks[t] for t in channel.consumers]
    assert sorted(t.operators for t in consumers) == [("avgPrice", "moving"), ("big", "alerts")]
    assert all(t.inputs == ("stock-ticks/trades",) for t in consumers)
    assert [t.stateful for t in consumers if "avgPrice" in t.operators] == [True]


def test_join_and_union_keep_both_inputs_in_one_task() -> None:
    for name in ("sensor-join", "two-sites-union"):
        c = _compile(ROOT / "examples" / f"{name}.xml")
        assert len(c.query.tasks) == 1, name
        assert len([n for n in c.logical.nodes if n.role == "source"]) == 2


def test_window_output_schema_is_window_group_aggregates() -> None:
    c = _compile(ROOT / "examples" / "hot-sensors.xml")
    schema = c.logical.stream("averages").schema
    assert [(f.name, f.type.value) for f in schema] == [
        ("window_start", "timestamp"), ("window_end", "timestamp"), ("sensor", "string"),
        ("avg_temp", "double"), ("max_temp", "double"), ("readings", "int")]


def test_join_renames_clashing_right_columns() -> None:
    c = _compile(ROOT / "examples" / "sensor-join.xml")
    names = c.logical.stream("pairs").schema.names
    assert names == ("sensor", "ts", "temp", "humidity", "offset_sensor", "offset_ts", "offset")


def test_compiled_query_round_trips_through_json() -> None:
    c = _compile(ROOT / "examples" / "stock-ticks.xml")
    from common.tasks import CompiledQuery
    assert CompiledQuery.from_json(c.query.to_json()) == c.query


def test_pictures_name_every_node_and_stream() -> None:
    c = _compile(ROOT / "examples" / "stock-ticks.xml")
    dot, mmd = to_dot(c.logical), to_mermaid(c.logical)
    for node in c.logical.nodes:
        assert f'"{node.name}"' in dot and node.name in mmd
    for stream in c.logical.streams:
        assert f'label="{stream.name}"' in dot and f"|{stream.name}|" in mmd


# -- user text in generated programs -----------------------------------------------------------

NASTY = [
    "'; import os; os.system('id') #",
    '"""\nimport os\n"""',
    "\\\" + __import__('os').getcwd() + \"",
    "{{ 7*7 }} {% raw %}",
    "line1\nline2\r\n\u2028end",
]


@pytest.mark.parametrize("text", NASTY)
def test_py_literal_is_the_same_string_and_never_code(text: str) -> None:
    literal = py_literal(text)
    tree = ast.parse(literal, mode="eval")
    assert isinstance(tree.body, ast.Constant) and tree.body.value == text


def test_py_literal_refuses_anything_but_plain_values() -> None:
    with pytest.raises(TypeError):
        py_literal(object())
    with pytest.raises(TypeError):
        py_literal(float("nan"))


@pytest.mark.parametrize("text", NASTY)
def test_hostile_paths_stay_data_in_the_generated_program(text: str) -> None:
    xml_text = text.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;").replace(
        "\n", "&#10;").replace("\r", "&#13;")
    spec = dataflow(SOURCE + SINK.format(stream="raw").replace(
        'value="out.jsonl"', f'value="/tmp/{xml_text}"'))
    roots = PathRoots.of(["/tmp"])
    if control_characters(text):  # refused before any program is written (common.paths)
        with pytest.raises(SpecError, match=r"nasty\.xml:\d+:\d+: error: .*control characters"):
            compile_spec_text(spec, "nasty.xml", base_dir=BASE, path_roots=roots)
        return
    c = compile_spec_text(spec, "nasty.xml", base_dir=BASE, path_roots=roots)
    (task,) = c.query.tasks
    tree = ast.parse(task.program)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "file_sink"]
    (call,) = calls
    path = next(k.value for k in call.keywords if k.arg == "path")
    assert isinstance(path, ast.Constant) and path.value.endswith(text.strip())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert sorted(m.module for m in imports) == ["common.types", "executor.runtime"]


def test_hostile_condition_never_reaches_the_program() -> None:
    spec = dataflow(SOURCE + '  <operator name="f" type="filter">\n    <input name="raw"/>\n'
                    '    <param name="condition" value="raw.temp &gt; 1 or raw.sensor = &quot;\'); '
                    'import os; (&quot;"/>\n    <output name="hot"/>\n  </operator>\n'
                    + SINK.format(stream="hot"))
    c = compile_spec_text(spec, "c.xml", base_dir=BASE)
    tree = ast.parse(c.query.tasks[0].program)
    conditions = [k.value.value for n in ast.walk(tree) if isinstance(n, ast.Call)
                  for k in n.keywords if k.arg == "condition"]
    assert conditions == ['raw.temp > 1 or raw.sensor = "\'); import os; ("']


WINDOW = """  <operator name="avg" type="window-aggregate">
    <input name="{input}"/>
    <param name="time" value="ts"/>
    <param name="size" value="10 seconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="readings" function="count"/>
    <output name="averages"/>
  </operator>
"""
HOT = """  <operator name="hot" type="filter">
    <input name="{input}"/>
    <param name="condition" value="{input}.temp &gt; 30"/>
    <output name="hot"/>
  </operator>
"""
CONSOLE = """  <operator name="show" type="console-sink">
    <input name="{stream}"/>
  </operator>
"""


@pytest.mark.parametrize("body, large", [
    (WINDOW.format(input="raw") + SINK.format(stream="averages"), (True,)),
    (HOT.format(input="raw") + WINDOW.format(input="hot") + CONSOLE.format(stream="averages"),
     (True,)),
    (WINDOW.format(input="raw") + HOT.format(input="averages").replace("temp", "readings")
     + SINK.format(stream="hot"), (True,)),
    (HOT.format(input="raw") + SINK.format(stream="hot"), (False,)),
    (SINK.format(stream="raw"), (False,)),
    (WINDOW.format(input="raw").replace('type="window-aggregate"',
                                        'type="window-aggregate" pipeline="split"')
     + SINK.format(stream="averages"), (False, True)),
    (WINDOW.format(input="raw") + HOT.format(input="averages").replace("temp", "readings")
     .replace('type="filter"', 'type="filter" pipeline="split"') + SINK.format(stream="hot"),
     (False, False)),
], ids=["window-file", "filter-window-console", "window-filter-file", "filter-file", "file",
        "window-in-its-own-task", "window-then-a-channel"])
def test_a_task_writing_an_aggregate_locally_asks_for_large_batches(
        body: str, large: tuple[bool, ...]) -> None:
    """Only a task whose local sink is fed, within the task, by a window aggregate (through
    row-by-row operators) lets its sources take large micro-batches (channel sources too):
    its output batch holds closed windows, not rows read. A task whose output grows with its
    input, or goes out on a channel (a frame bounds it), keeps the default cap."""
    c = compile_spec_text(dataflow(SOURCE + body), "t.xml", base_dir=BASE)
    tasks = sorted(c.query.tasks, key=lambda t: t.task_id)
    assert tuple("rt.large_batches()" in t.program for t in tasks) == large


def test_every_operator_kind_has_one_code_generator_entry() -> None:
    """`codegen._CALLS` is the code generator's one place per operator kind (beside
    `validate._RESOLVERS`): every kind of the catalogue and the plumbing has its entry, except
    the two whose channel calls stand for them."""
    from compiler.codegen import _CALLS
    from compiler.operators import CATALOGUE, PLUMBING

    assert set(_CALLS) == (set(CATALOGUE) | set(PLUMBING)) - {"stream-selector", "splitter"}
    assert {method for method, _ in _CALLS.values()} >= {"identity", "union", "pattern"}
