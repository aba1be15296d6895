"""How scripts/test.sh hands the suite to its two pytest-xdist workers (tests/conftest.py):
a module's tests stay together, in their order, and the heaviest modules go first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import longest_modules_first, module_of

ROOT = Path(__file__).resolve().parents[1]


def test_a_node_ids_module_is_its_file() -> None:
    assert module_of("tests/test_x.py::TestY::test_z[a::b]") == "tests/test_x.py"
    assert module_of("tests/test_x.py") == "tests/test_x.py"


def test_modules_stay_whole_and_the_heaviest_comes_first() -> None:
    tests = [("a.py::t1", 1.0), ("b.py::t1", 300.0), ("a.py::t2", 1.0), ("c.py::t1", 2.0),
             ("b.py::t2", 60.0), ("c.py::t2", 0.0)]
    # b weighs 360, c 2, a 2: c and a tie, and keep their collection order (a first)
    assert longest_modules_first(tests) == [1, 4, 0, 2, 3, 5]


def test_nothing_is_lost_or_doubled() -> None:
    tests = [(f"m{i % 7}.py::t{i}", float(i % 5)) for i in range(50)]
    order = longest_modules_first(tests)
    assert sorted(order) == list(range(50))
    weights = {}
    for position in order:
        name = module_of(tests[position][0])
        weights[name] = weights.get(name, 0.0) + tests[position][1]
    assert list(weights.values()) == sorted(weights.values(), reverse=True)


def collected(*args: str) -> list[str]:
    """Node ids pytest collects from two small modules (one cluster test, pure tests)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/test_atomic_file.py", "tests/test_port_clash_cluster.py", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_under_loadgroup_the_cluster_module_is_handed_out_before_the_pure_one() -> None:
    plain = collected()
    grouped = collected("--dist", "loadgroup")
    assert module_of(plain[0]) == "tests/test_atomic_file.py"
    assert module_of(grouped[0]) == "tests/test_port_clash_cluster.py"
    assert sorted(plain) == sorted(grouped)
