"""The `elastiq` command line as a user calls it: exit codes, messages and written files."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.operators import CATALOGUE
from elastiq.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").rglob("*.xml"))


@pytest.mark.parametrize("spec", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_validate_accepts_every_example(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(spec)]) == 0
    assert "ok (" in capsys.readouterr().out


def test_validate_reports_every_problem_and_exits_non_zero(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text('<dataflow name="x">\n  <operator name="a" type="generatr">\n'
                   '    <output name="s"/>\n  </operator>\n'
                   '  <operator name="b" type="file-sink">\n    <input name="z"/>\n'
                   "  </operator>\n</dataflow>\n")
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:2:28: error: unknown operator type 'generatr'" in err
    assert f"{bad}:6:5: error: operator 'b' reads stream 'z'" in err
    assert "needs the parameter 'path'" in err
    assert "3 errors" in err


def test_validate_of_a_missing_file_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/spec.xml"]) == 1
    assert "cannot read the spec" in capsys.readouterr().err


def test_explain_prints_plans_and_writes_pictures(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(ROOT / "examples" / "stock-ticks.xml"), "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "logical plan:" in out and "physical plan:" in out and "tasks (3):" in out
    assert "moving := file_sink(avgPrice := window_aggregate(notional := project(" in out
    for name in ("logical.dot", "logical.mmd", "physical.dot", "physical.mmd"):
        assert (tmp_path / name).read_text().strip()
    assert "subgraph cluster_" in (tmp_path / "physical.dot").read_text()


def test_compile_writes_programs_and_the_query(tmp_path: Path) -> None:
    assert main(["compile", str(ROOT / "examples" / "stock-ticks.xml"), "-o", str(tmp_path)]) == 0
    programs = sorted(tmp_path.glob("*.py"))
    assert [p.name for p in programs] == ["stock-ticks_t0.py", "stock-ticks_t1.py",
                                          "stock-ticks_t2.py"]
    for p in programs:
        ast.parse(p.read_text())
    query = json.loads((tmp_path / "query.json").read_text())
    assert [t["task_id"] for t in query["tasks"]] == ["stock-ticks.t0", "stock-ticks.t1",
                                                      "stock-ticks.t2"]


def test_console_script_runs_as_a_process() -> None:
    result = subprocess.run([sys.executable, "-m", "elastiq.cli", "validate",
                             str(ROOT / "examples" / "paper-filter.xml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "paper-filter.xml: ok" in result.stdout


def test_reference_documents_every_operator_and_parameter() -> None:
    doc = (ROOT / "docs" / "spec-language.md").read_text()
    for kind, definition in CATALOGUE.items():
        assert f"### {kind}" in doc, kind
        for param in definition.params:
            assert f"`{param.name}`" in doc, (kind, param.name)


def test_executor_environment_pairs() -> None:
    from elastiq.launch import executor_environment

    assert executor_environment(["ELASTIQ_SPARK_CORES=8", "JAVA_OPTS=-Xmx2g -Dx=y"]) == (
        ("ELASTIQ_SPARK_CORES", "8"), ("JAVA_OPTS", "-Xmx2g -Dx=y"))
    for bad in ("NOEQUALS", "=value", "BAD NAME=1"):
        with pytest.raises(ValueError, match="NAME=VALUE"):
            executor_environment([bad])
