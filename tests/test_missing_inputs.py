"""A file source whose input file is not there is refused by `validate`, `explain` and `compile`
at the path's line and column, with the near names of its folder ("did you mean"); every such
path at once; a seeded fuzz of input paths never escapes as an exception."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import pytest

from compiler.pipeline import check_spec_text
from elastiq.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "paper-filter.xml"
LOCATED = re.compile(r"^.+:(\d+):(\d+): error: ", re.M)


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "examples" / "data" / "numbers.jsonl", tmp_path / "data" / "numbers.jsonl")
    return tmp_path


def with_input(spec_dir: Path, value: str, name: str = "q.xml") -> Path:
    path = spec_dir / name
    path.write_text(EXAMPLE.read_text().replace('value="data/numbers.jsonl"',
                                                f'value="{value}"'))
    return path


@pytest.mark.parametrize("command", ["validate", "explain", "compile"])
def test_a_misspelt_input_is_refused_at_its_value_with_a_did_you_mean(
        spec_dir: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = with_input(spec_dir, "data/number.jsonl")
    argv = [command, str(spec)] + ([] if command == "validate" else ["-o", str(spec_dir / "o")])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"{spec}:11:31: error: parameter 'path' of 'source': input file data/number.jsonl " \
           "does not exist" in err
    assert "did you mean 'numbers.jsonl'?" in err
    assert not (spec_dir / "o").exists()


def test_an_existing_input_passes_and_a_missing_folder_says_so(
        spec_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(with_input(spec_dir, "data/numbers.jsonl"))]) == 0
    spec = with_input(spec_dir, "nowhere/numbers.jsonl")
    assert main(["validate", str(spec)]) == 1
    assert "does not exist either" in capsys.readouterr().err


def test_the_library_default_leaves_inputs_to_the_machine_that_runs_them(spec_dir: Path) -> None:
    spec = with_input(spec_dir, "data/later.jsonl")  # a scheduler's compile, or a restore
    graph, diagnostics = check_spec_text(spec.read_bytes(), str(spec))
    assert graph is not None and not diagnostics
    graph, diagnostics = check_spec_text(spec.read_bytes(), str(spec), check_inputs=True)
    assert graph is None and len(diagnostics) == 1


def test_fuzzed_input_paths_are_refused_located_or_accepted_never_crash(spec_dir: Path) -> None:
    rng = random.Random(17)
    alphabet = "abcdnumbers._-/" + "é\u00a0*?[]~"
    for i in range(150):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
        value = value.replace('"', "")
        spec = with_input(spec_dir, value.replace("&", ""), f"f{i}.xml")
        graph, diagnostics = check_spec_text(spec.read_bytes(), str(spec), check_inputs=True)
        target = spec_dir / value
        if graph is None:
            assert diagnostics and all(d.position.line >= 1 for d in diagnostics), value
            assert all(LOCATED.match(d.render()) for d in diagnostics), value
        else:
            assert target.is_file(), value
