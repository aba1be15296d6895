"""How the suite is handed out (tests/conftest.py): on pytest-xdist workers a module's tests
stay together, in their order, and the heaviest modules go first; and one running embedded stack
passes from a cluster module to the next one of the same shape, and stops before any other."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import longest_modules_first, module_of, shapes_together

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


def test_modules_of_one_shape_run_one_after_another_and_the_rest_keep_their_order() -> None:
    modules = [("a", None), ("b", "x"), ("c", "x"), ("d", None), ("e", "y"), ("f", "x"),
               ("g", None), ("h", "y"), ("i", "x")]
    assert shapes_together(modules) == ["a", "b", "c", "f", "i", "d", "e", "h", "g"]
    assert shapes_together([]) == []
    assert shapes_together([("a", None), ("b", None)]) == ["a", "b"]


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


# --- one running stack handed from a cluster module to the next of the same shape ---------------

def fake_stacks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the stack's start and stops in testkit.e2e_support with recorders (this checks
    the pool's hand-over logic only; the cluster modules run it for real)."""
    import testkit.e2e_support as support

    calls: list[str] = []

    def start(work: Path, cpus_per_agent: float, agents: int) -> object:
        calls.append(f"start {work.name} {cpus_per_agent}x{agents}")
        return work.name

    monkeypatch.setattr(support, "start_stack", start)
    monkeypatch.setattr(support, "stop_queries", lambda stack: calls.append(f"queries {stack}"))
    monkeypatch.setattr(support, "stop_stack", lambda stack: (calls.append(f"stop {stack}"), [])[1])
    return calls


def test_a_stack_passes_to_the_next_module_of_its_shape_and_stops_at_another(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from testkit.e2e_support import StackPool, StackShape

    calls = fake_stacks(monkeypatch)
    pool, three, two = StackPool(tmp_path), StackShape(3.0, 3), StackShape(2.5, 3)
    first = pool.take(three, "a")
    assert pool.take(three, "b") == first and pool.wanted_by(three)  # what a left runs no more
    assert not pool.wanted_by(two) and not pool.wanted_by(None)
    assert pool.take(two, "c") != first
    pool.release()
    pool.release()  # nothing held: nothing to stop
    assert calls == ["start stack-1 3.0x3", "queries stack-1", "stop stack-1",
                     "start stack-2 2.5x3", "stop stack-2"]


def test_the_suite_releases_the_stack_when_the_next_test_wants_another_or_none(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from conftest import POOL_KEY, pytest_runtest_teardown
    from testkit.e2e_support import StackPool, StackShape

    calls = fake_stacks(monkeypatch)
    config = SimpleNamespace(stash=pytest.Stash())
    pool = StackPool(tmp_path)
    config.stash[POOL_KEY] = pool

    def item(shape: StackShape | None) -> Any:
        return SimpleNamespace(config=config, module=SimpleNamespace(STACK_SHAPE=shape))

    shape = StackShape(3.0, 3)
    pool.take(shape, "a")
    pytest_runtest_teardown(item(shape), item(shape))  # type: ignore[arg-type]
    assert calls == ["start stack-1 3.0x3"]
    pytest_runtest_teardown(item(shape), item(StackShape(2.5, 3)))  # type: ignore[arg-type]
    assert calls[-1] == "stop stack-1"
    pool.take(shape, "b")
    pytest_runtest_teardown(item(shape), None)  # type: ignore[arg-type]
    assert calls[-1] == "stop stack-2"


def test_the_runs_of_scripts_test_sh_split_the_suite_whole() -> None:
    """scripts/test.sh's runs (their `-m` expressions read from the script) select every test
    once: the serial stream holds the Spark cluster tests and the modules marked `alone` (the
    cgroups isolation test, which measures CPU shares; the broker SIGKILL test, which waits out
    the Kafka sink's bounds), the second stream the other layers and the Spark cluster tests
    marked `beside`, a third stream the cluster tests without Spark, and the last run the
    Spark cluster tests marked `quiet` (the shedding test)."""
    script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8").splitlines()
    marks = [m for line in script if not line.lstrip().startswith("#")
             for m in re.findall(r'-m "([^"]+)"', line)]
    assert len(marks) == 5, marks

    def selected(expression: str) -> set[str]:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             "-m", expression, "tests/test_isolation_cgroups.py", "tests/test_embedded_auth.py",
             "tests/test_port_clash_cluster.py", "tests/test_update_cluster.py",
             "tests/test_kafka_broker_kill.py", "tests/test_json_lines.py",
             "tests/test_elastic_cluster.py", "tests/test_shedding_cluster.py"],
            capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode in (0, 5), done.stdout + done.stderr
        return {line for line in done.stdout.splitlines() if "::" in line}

    others, beside, light, serial, quiet = (selected(m) for m in marks)  # the script's order
    runs = (others, beside, light, serial, quiet)
    assert all(not (a & b) for i, a in enumerate(runs) for b in runs[i + 1:])
    assert others | light | beside | serial | quiet == selected("cluster or not cluster")
    assert {module_of(n) for n in serial} == {"tests/test_isolation_cgroups.py",
                                              "tests/test_elastic_cluster.py",
                                              "tests/test_kafka_broker_kill.py"}
    assert {module_of(n) for n in others} == {"tests/test_json_lines.py",  # and the pure
                                              "tests/test_embedded_auth.py"}  # tests beside
    assert {module_of(n) for n in light} == {"tests/test_embedded_auth.py"}
    assert {module_of(n) for n in beside} == {"tests/test_update_cluster.py",
                                              "tests/test_port_clash_cluster.py"}
    assert {module_of(n) for n in quiet} == {"tests/test_shedding_cluster.py"}
