"""File paths confined to the operator's roots (common/paths.py): the decision itself, the
located errors of validate/compile, the scheduler API (a client's folder widens nothing), a
control tuple moving a sink, the executor's re-check when it opens a file, and the CLI flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.control import ControlRefused
from common.paths import (ENV_VAR, PathRefused, PathRoots, confine, confine_at_open,
                            configured_roots, local_roots, service_roots)
from compiler.control import check_tuple
from compiler.pipeline import check_spec_text, compile_spec_text
from elastiq.cli import main
from executor.sinks import FileSink
from scheduler.api import ApiError, parse_submission
from tests.spec_snippets import SOURCE, dataflow, locate

OUTSIDE = ["/etc/passwd", "/proc/self/environ", "../../x.jsonl", "escape/out.jsonl"]


def sink(path: str, name: str = "sink") -> str:
    return (f'  <operator name="{name}" type="file-sink">\n    <input name="raw"/>\n'
            f'    <param name="path" value="{path}"/>\n  </operator>\n')


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """tmp_path/root (the spec's folder) with a symbolic link `escape` to a folder outside."""
    inside = tmp_path / "root" / "deep" / "er"
    inside.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "deep" / "er" / "escape").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "root" / "deep" / "er" / "stays").symlink_to(tmp_path / "root" / "deep")
    return inside


# --- the decision -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", OUTSIDE)
def test_a_path_out_of_the_roots_is_refused_after_resolving_dots_and_links(
        root: Path, value: str) -> None:
    roots = PathRoots.of([root])  # the spec's folder
    with pytest.raises(PathRefused, match="outside the allowed folders"):
        confine(value, root, roots)


@pytest.mark.parametrize("value", ["out\x01.jsonl", "out\x00.jsonl", "a\nb.jsonl", "x\x7f"])
def test_a_path_with_control_characters_is_refused(root: Path, value: str) -> None:
    with pytest.raises(PathRefused, match="control characters"):
        confine(value, root, PathRoots.of([root]))


def test_a_path_inside_a_root_is_accepted_even_through_a_link_that_stays_inside(
        root: Path) -> None:
    roots = PathRoots.of([root.parent.parent])
    assert confine("out.jsonl", root, roots) == str(root / "out.jsonl")
    assert confine("../out.jsonl", root, roots) == str(root.parent / "out.jsonl")
    assert confine("stays/x.jsonl", root, roots) == str(root / "stays" / "x.jsonl")
    assert confine(str(root / "new" / "sub" / "o.jsonl"), "/", roots).endswith("o.jsonl")
    with pytest.raises(PathRefused, match="names a folder"):
        confine("out/", root, roots)
    with pytest.raises(PathRefused, match="names a folder"):
        confine("out/..", root, roots)
    with pytest.raises(PathRefused, match="at most 4096"):
        confine("x" * 5000, root, roots)


def test_a_root_is_not_a_prefix_match(tmp_path: Path) -> None:
    roots = PathRoots.of([tmp_path / "data"])
    with pytest.raises(PathRefused):
        confine(str(tmp_path / "data-other" / "x"), "/", roots)


def test_the_default_roots(tmp_path: Path) -> None:
    env = {ENV_VAR: os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])}
    local = local_roots(tmp_path / "spec", ["/srv/x"], tmp_path / "state", environ=env)
    assert local.roots == (str(tmp_path / "spec"), str(tmp_path / "state" / "data"), "/srv/x",
                           str(tmp_path / "a"), str(tmp_path / "b"))
    assert configured_roots(env).roots == (str(tmp_path / "a"), str(tmp_path / "b"))
    assert configured_roots({}, cwd=str(tmp_path)).roots == (
        str(tmp_path), str(tmp_path / "elastiq-state" / "data"))
    assert service_roots(tmp_path / "st", [], cwd="/w", environ={}).roots == (
        str(tmp_path / "st" / "data"), "/w")
    assert service_roots(tmp_path / "st", ["/srv"], cwd="/w", environ={}).roots == (
        str(tmp_path / "st" / "data"), "/srv")


# --- validate / compile: located errors, every one at once ------------------------------------

@pytest.mark.parametrize("value", OUTSIDE)
def test_validate_refuses_a_path_out_of_the_roots_at_its_value(root: Path, value: str) -> None:
    text = dataflow(SOURCE + sink(value))
    spec = root / "q.xml"
    graph, diagnostics = check_spec_text(text, str(spec))
    assert graph is None
    (error,) = [d for d in diagnostics if d.severity == "error"]
    line, column = locate(text, value)
    assert (error.position.file, error.position.line, error.position.column) == \
        (str(spec), line, column)
    assert "outside the allowed folders" in error.message and "--path-root" in error.message


@pytest.mark.parametrize("char", ["&#1;", "&#0;", "\x01", "&#9;", "&#10;"])
def test_a_control_character_in_a_spec_path_is_a_located_error(root: Path, char: str) -> None:
    text = dataflow(SOURCE + sink(f"out{char}.jsonl"))
    graph, diagnostics = check_spec_text(text, str(root / "q.xml"))
    assert graph is None
    rendered = [d.render() for d in diagnostics if d.severity == "error"]
    assert rendered and all(r.startswith(f"{root / 'q.xml'}:") for r in rendered), rendered
    line, _ = locate(text, f"out{char}")
    assert any(f"q.xml:{line}:" in r for r in rendered), rendered
    if char in ("&#9;", "&#10;"):  # XML lets these through: the path check refuses them
        assert any("control characters" in r for r in rendered), rendered


def test_every_bad_path_is_reported_at_once_and_a_good_one_passes(root: Path) -> None:
    source = ('  <operator name="replay" type="file-source">\n'
              '    <param name="path" value="/etc/passwd"/><param name="format" value="csv"/>\n'
              '    <output name="raw" type="reading"/>\n  </operator>\n')
    text = dataflow(source + sink("/proc/self/environ"))
    graph, diagnostics = check_spec_text(text, str(root / "q.xml"))
    assert graph is None
    assert sorted((d.position.line, d.position.column) for d in diagnostics) == \
        sorted([locate(text, "/etc/passwd"), locate(text, "/proc/self/environ")])
    good = dataflow(SOURCE + sink("out/today.jsonl"))
    assert check_spec_text(good, str(root / "q.xml"))[0] is not None


def test_a_path_root_widens_the_local_roots(root: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "shared"
    other.mkdir()
    spec = root / "q.xml"
    spec.write_text(dataflow(SOURCE + sink(str(other / "out.jsonl"))))
    assert main(["validate", str(spec)]) == 1
    line, column = locate(spec.read_text(), str(other))
    assert f"{spec}:{line}:{column}: error: parameter 'path' of 'sink'" in \
        capsys.readouterr().err
    assert main(["validate", "--path-root", str(other), str(spec)]) == 0
    assert main(["compile", "--path-root", str(other), "-o", str(tmp_path / "o"),
                 str(spec)]) == 0
    assert main(["compile", "-o", str(tmp_path / "o2"), str(spec)]) == 1


# --- the scheduler's API: the client's folder resolves, it does not widen ----------------------

def test_the_api_resolves_against_the_client_folder_but_confines_to_its_own_roots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = tmp_path / "served"
    served.mkdir()
    monkeypatch.setenv(ENV_VAR, str(served))
    text = dataflow(SOURCE + sink("passwd")).encode()
    with pytest.raises(ApiError) as refused:
        parse_submission(text, "application/xml", "q.xml", None, "/etc")
    (diagnostic,) = refused.value.diagnostics
    assert diagnostic["message"].startswith(
        "parameter 'path' of 'sink': passwd (that is /etc/passwd) is outside")
    assert (diagnostic["line"], diagnostic["column"]) == locate(text.decode(), "passwd")
    query, _ = parse_submission(text, "application/xml", "q.xml", None, str(served / "sub"))
    assert query.sinks == {"sink": str(served / "sub" / "passwd")}


# --- control: a sink's new path -----------------------------------------------------------------

@pytest.mark.parametrize("value", ["/etc/passwd", "/proc/self/environ", "ROOT/../../x.jsonl",
                                   "ROOT/escape/x.jsonl", "ROOT/x\x01.jsonl", "ROOT/x\x00.jsonl",
                                   "ROOT/", "relative.jsonl"])
def test_a_sink_path_change_out_of_the_roots_is_refused_with_the_reason(
        root: Path, value: str) -> None:
    catalog = compile_spec_text(dataflow(SOURCE + sink("out.jsonl")), str(root / "q.xml")
                                ).query.controls
    with pytest.raises(ControlRefused) as refused:
        check_tuple(catalog, "q", "sink", "path", value.replace("ROOT", str(root)))
    assert any(words in str(refused.value) for words in
               ("outside the allowed folders", "control characters", "names a folder",
                "must be absolute"))
    change = check_tuple(catalog, "q", "sink", "path", str(root / "day2" / "out.jsonl"))
    assert change.runtime_value == str(root / "day2" / "out.jsonl")


# --- the executor re-checks when it opens a file ------------------------------------------------

def test_the_executor_refuses_to_open_a_file_out_of_its_roots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = tmp_path / "allowed"
    monkeypatch.setenv(ENV_VAR, str(allowed))
    with pytest.raises(PathRefused):
        FileSink("t", str(tmp_path / "other" / "out.jsonl"))
    assert not (tmp_path / "other").exists()
    (allowed / "escape").parent.mkdir()
    (allowed / "escape").symlink_to(tmp_path)
    with pytest.raises(PathRefused):
        confine_at_open(str(allowed / "escape" / "out.jsonl"))
    sink_ = FileSink("t", str(allowed / "out.jsonl"))
    with pytest.raises(PathRefused):
        sink_.retarget(str(tmp_path / "moved.jsonl"))
    assert sink_.log.path == str(allowed / "out.jsonl")
    monkeypatch.delenv(ENV_VAR)
    with pytest.raises(PathRefused, match="control characters"):
        confine_at_open("/tmp/a\x01b")
