"""How scripts/test.sh hands the suite to its two pytest-xdist workers (tests/conftest.py):
a module's tests stay together, in their order, and the heaviest modules go first."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
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


def test_under_loadfile_the_cluster_module_is_handed_out_before_the_pure_one() -> None:
    plain = collected()
    grouped = collected("--dist", "loadfile")
    assert module_of(plain[0]) == "tests/test_atomic_file.py"
    assert module_of(grouped[0]) == "tests/test_port_clash_cluster.py"
    assert sorted(plain) == sorted(grouped)


def test_on_two_workers_each_module_runs_whole_on_one_worker_in_its_order() -> None:
    """Two small pure modules through scripts/test.sh's own options: every test of a module on
    the same worker (its module fixtures start once), in the module's order."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadfile", "--no-loadscope-reorder", "tests/test_atomic_file.py",
         "tests/test_paths.py"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    ran: dict[str, list[str]] = defaultdict(list)
    for worker, nodeid in re.findall(r"\[(gw\d)\][^\n]*? PASSED (\S+)", done.stdout):
        workers[module_of(nodeid)].add(worker)
        ran[module_of(nodeid)].append(nodeid.split("@", 1)[0])
    assert set(workers) == {"tests/test_atomic_file.py", "tests/test_paths.py"}, done.stdout
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    for module, nodeids in ran.items():
        listed = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             module], capture_output=True, text=True, timeout=120, cwd=ROOT).stdout
        assert nodeids == [line for line in listed.splitlines() if "::" in line], module
