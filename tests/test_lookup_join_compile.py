"""Pure tests of the stream-table lookup join (`lookup-join`, Nexmark q13): the side table's
parser (`common.side_table`) against hand-written expectations, what a spec compiles to, and
every misuse refused at its place with file:line:column, including a missing or malformed side
file, a side file outside the path roots, and an attacker's file contents (data, never code)."""

from __future__ import annotations

import ast
from datetime import datetime, timezone
from pathlib import Path

import pytest

from common import side_table
from common.types import Schema
from compiler.pipeline import check_spec_text, compile_spec_text
from tests.spec_snippets import locate

SIDE = Schema.of(("key", "int"), ("value", "string"), ("weight", "double"),
                 ("hot", "boolean"), ("since", "timestamp"))


def test_jsonl_rows_take_the_declared_types_and_nulls() -> None:
    data = (b'{"key": 1, "value": "a", "weight": 2, "hot": true, '
            b'"since": "2024-01-01T00:00:00Z", "extra": [1]}\n\n'
            b'{"key": 2, "value": "b\\u00e9"}\n')
    assert side_table.parse(data, "jsonl", SIDE) == [
        (1, "a", 2.0, True, datetime(2024, 1, 1, tzinfo=timezone.utc)),
        (2, "b\u00e9", None, None, None)]


def test_csv_rows_follow_the_header_not_the_declared_order() -> None:
    data = (b"since,hot,weight,value,key\n2024-01-01T01:00:00+01:00,false,0.5,\"x,y\",-3\n"
            b",,,,\n")
    assert side_table.parse(data, "csv", SIDE) == [
        (-3, "x,y", 0.5, False, datetime(2024, 1, 1, tzinfo=timezone.utc)),
        (None, "", None, None, None)]


@pytest.mark.parametrize("fmt,data,problems", [
    ("jsonl", b'{"key": 1}\n[2]\nnot json\n{"key": true}\n{"key": 1.5}\n',
     ["line 2: not a JSON object", "line 3: not JSON", "line 4: column 'key' is int",
      "line 5: column 'key' is int"]),
    ("jsonl", b'{"key": 9223372036854775808}\n{"weight": "NaN"}\n{"since": "yesterday"}\n',
     ["line 1: column 'key'", "line 2: column 'weight'", "line 3: column 'since'"]),
    ("csv", b"key,value\n1,a\n", ["the header has no column weight, hot, since"]),
    ("csv", b"", ["line 1: no header"]),
    ("csv", b"key,value,weight,hot,since\n1,a,1,maybe,\nx,a,1,true,\n1,a\n",
     ["line 2: column 'hot'", "line 3: column 'key'", "line 4: 2 field(s)"]),
    ("jsonl", b"\xff\n", ["byte 0 is not UTF-8"]),
    ("xml", b"", ["format 'xml'"]),
])
def test_every_problem_of_a_side_file_names_its_line(fmt: str, data: bytes,
                                                      problems: list[str]) -> None:
    with pytest.raises(side_table.SideTableError) as caught:
        side_table.parse(data, fmt, SIDE)
    assert len(caught.value.problems) == len(problems), caught.value.problems
    for problem, want in zip(caught.value.problems, problems):
        assert want in problem


def test_a_side_file_over_the_bound_is_refused_and_problems_are_capped() -> None:
    with pytest.raises(side_table.SideTableError, match="more than"):
        side_table.parse(b" " * (side_table.MAX_SIDE_BYTES + 1), "jsonl", SIDE)
    with pytest.raises(side_table.SideTableError, match="and 5 more") as caught:
        side_table.parse(b"[]\n" * (side_table.MAX_PROBLEMS + 5), "jsonl", SIDE)
    assert len(caught.value.problems) == side_table.MAX_PROBLEMS + 5


def test_attacker_contents_are_values() -> None:
    """Code-like text in a side file is a string value like any other."""
    attack = "__import__('os').system('id')"
    data = f'key,value,weight,hot,since\n1,"{attack}",,,\n'.encode()
    assert side_table.parse(data, "csv", SIDE)[0][1] == attack


SPEC = """<dataflow name="nx">
  <type name="side_row">
    <column name="key" type="int"/> <column name="value" type="string"/>
  </type>
  <operator name="bids" type="generator">
    <param name="shape" value="bid"/>
    <output name="b"/>
  </operator>
  <operator name="keyed" type="project">
    <input name="b"/>
    <field name="auction" value="auction"/> <field name="key" value="auction % 100"/>
    <output name="k"/>
  </operator>
  <operator name="lookup" type="lookup-join">
    <input name="k"/>
    <param name="path" value="{path}"/> <param name="side-type" value="{side}"/>
    <param name="{key}" value="{columns}"/>
    <output name="j"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="j"/> <param name="path" value="out.jsonl"/>
  </operator>
</dataflow>
"""


def spec(path: str = "side.csv", side: str = "side_row", key: str = "key",
         columns: str = "key") -> str:
    return SPEC.format(path=path, side=side, key=key, columns=columns)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "side.csv").write_text("key,value\n1,one\n2,two\n")
    return tmp_path


def check(xml: str, folder: Path) -> tuple:
    return check_spec_text(xml, str(folder / "nx.xml"), base_dir=str(folder),
                           check_inputs=True)


def errors_at(xml: str, folder: Path, needle: str) -> list[str]:
    graph, diagnostics = check(xml, folder)
    assert graph is None
    line, column = locate(xml, needle)
    return [d.message for d in diagnostics if d.severity == "error"
            and (d.position.line, d.position.column) == (line, column)]


def test_a_lookup_join_compiles_to_its_file_type_and_keys(folder: Path) -> None:
    xml = spec()
    graph, diagnostics = check(xml, folder)
    assert graph is not None, [d.render() for d in diagnostics]
    assert [(f.name, f.type.value) for f in graph.stream("j").schema] == [
        ("auction", "int"), ("key", "int"), ("side_row_key", "int"), ("value", "string")]
    compiled = compile_spec_text(xml, str(folder / "nx.xml"), base_dir=str(folder))
    (task,) = compiled.query.tasks
    (call,) = [n for n in ast.walk(ast.parse(task.program)) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Attribute) and n.func.attr == "lookup_join"]
    args = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert args == {"op": "lookup", "input": "k", "output": "j",
                    "path": str(folder / "side.csv"), "format": "csv", "side": "side_row",
                    "side_columns": (("key", "int"), ("value", "string")),
                    "left_keys": ("key",), "right_keys": ("key",)}
    assert not task.stateful


def test_a_missing_side_file_is_refused_at_its_path(folder: Path) -> None:
    messages = errors_at(spec(path="sid.csv"), folder, "sid.csv")
    assert any("does not exist" in m for m in messages)


def test_a_malformed_side_file_is_refused_at_its_path_with_each_line(folder: Path) -> None:
    (folder / "bad.csv").write_text("key,value\n1,a\nx,b\n3\n")
    (message,) = errors_at(spec(path="bad.csv"), folder, "bad.csv")
    assert "line 3: column 'key' is int" in message and "line 4: 1 field(s)" in message


def test_a_side_file_outside_the_roots_or_behind_a_link_out_is_refused(folder: Path) -> None:
    (folder / "out.csv").symlink_to("/etc/hostname")
    for path in ("/etc/hostname", "../../etc/hostname", "out.csv"):
        messages = errors_at(spec(path=path), folder, path + '"')
        assert any("outside the allowed folders" in m for m in messages), messages


@pytest.mark.parametrize("kwargs,needle,fragment", [
    ({"side": "side_rw"}, "side_rw", "not a declared type"),
    ({"columns": "kee"}, "<operator name=\"lookup\"", "join key 'kee'"),
    ({"key": "left-key", "columns": "auction"}, "<operator name=\"lookup\"", "needs its key"),
])
def test_lookup_join_misuse_is_refused_at_its_place(folder: Path, kwargs: dict, needle: str,
                                                    fragment: str) -> None:
    messages = errors_at(spec(**kwargs), folder, needle)
    assert any(fragment in m for m in messages), messages


def test_every_problem_is_reported_at_once(folder: Path) -> None:
    xml = spec(path="nope.csv", side="side_rw")
    graph, diagnostics = check(xml, folder)
    assert graph is None
    rendered = " | ".join(d.message for d in diagnostics if d.severity == "error")
    assert "does not exist" in rendered and "not a declared type" in rendered
