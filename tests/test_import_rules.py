"""The import rules between Elastiq's packages (R1-R7 of issue 16, R8-R9 of issue 35), checked
on the source.

Walks every module of common/, compiler/, rewrite_rules/, scheduler/, executor/ and elastiq/
with `ast`, including imports inside functions and under `TYPE_CHECKING`, resolves relative
imports, and reports every import that breaks a rule with file:line, all in one failure. The
golden task programs (tests/golden) stand for the generated programs (R7): tests/test_compiler.py
keeps them equal to what the compiler generates. A synthetic forbidden import proves the checker
reports one, and the known violations must still exist, so their list stays honest. R8 keeps
the scheduler's pure core (scheduler/state.py and every scheduler module it imports) free of
zmq and other makers of keys, randomness or I/O: those belong to the shell that feeds it events.
R9 forbids any import cycle between our modules (there was one, elastiq/run.py <->
elastiq/service_cli.py; their shared launch code is elastiq/launch.py now). R10 keeps tests and
benchmarks apart (what both use lives in testkit/), and R11 keeps one polling loop for them all,
testkit/waiting.py.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "compiler", "rewrite_rules", "scheduler", "executor", "elastiq",
            "embedded_mesos")
OURS = frozenset(PACKAGES)
STDLIB = frozenset(sys.stdlib_module_names)

# What the scheduler's pure core (R8) never imports: keys, randomness, sockets, threads, drivers.
CORE_FORBIDDEN = frozenset({"zmq", "random", "secrets", "uuid", "socket", "threading", "pymesos",
                            "kazoo", "aiohttp", "subprocess"})

# (file, imported module) pairs that break a rule today and that a planned step removes.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    module: str
    rule: str
    what: str = "imports"  # R11's are definitions

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what} {self.module}: {self.rule}"


def _top(module: str) -> str:
    return module.split(".")[0]


def _is_ours_module(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(rel: str, source: str) -> list[tuple[int, str]]:
    """Every module a source imports, with its line: `from a import b` counts as a.b when a.b is
    one of our modules (`from compiler import expressions`), else as a."""
    package = rel[:-3].split("/")[:-1]  # the package a relative import starts from
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "__future__":
                continue
            for a in node.names:
                sub = f"{module}.{a.name}"
                out.append((node.lineno, sub if _top(module) in OURS and _is_ours_module(sub)
                            else module))
    return out


def _module_file(module: str) -> str:
    """`a.b` -> "a/b.py" or "a/b/__init__.py" (relative to the repository)."""
    path = ROOT.joinpath(*module.split("."))
    found = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
    return found.relative_to(ROOT).as_posix()


def _ours_of(module: str) -> str | None:
    """The module of ours `module` is or lies in (`a.b.C` -> `a.b`), or None."""
    while module and not _is_ours_module(module):
        module = module.rpartition(".")[0]
    return module or None


@cache
def scheduler_core() -> frozenset[str]:
    """The files of the scheduler's pure core: scheduler/state.py and every scheduler module it
    imports, directly or not."""
    core: set[str] = set()
    todo = ["scheduler.state"]
    while todo:
        rel = _module_file(todo.pop())
        if rel in core:
            continue
        core.add(rel)
        for _, module in imported_modules(rel, (ROOT / rel).read_text(encoding="utf-8")):
            ours = _ours_of(module) if _top(module) == "scheduler" else None
            if ours is not None and ours != "scheduler":
                todo.append(ours)
    return frozenset(core)


def _third_party(top: str) -> bool:
    return top not in STDLIB and top not in OURS


def rule_for(rel: str, module: str) -> str | None:
    """The rule `module` breaks when `rel` imports it, or None."""
    top = _top(module)
    owner = rel.split("/")[0]
    if owner == "common":
        if top != "common" and top not in STDLIB:
            return "R1: common imports the standard library and common only"
    elif owner == "compiler":
        if top not in STDLIB and top not in {"common", "compiler", "rewrite_rules", "lxml",
                                             "jinja2"}:
            return "R2: compiler imports common, compiler, rewrite_rules, lxml, jinja2 only"
    elif owner == "rewrite_rules":
        if top not in STDLIB:
            return "R3: rewrite_rules imports the standard library only"
    elif owner == "executor":
        if top in {"scheduler", "elastiq", "rewrite_rules", "embedded_mesos"}:
            return "R4: the executor never imports scheduler, elastiq or the embedded cluster"
        if top == "compiler" and module != "compiler.expr" and not module.startswith(
                "compiler.expr."):
            return "R4: the executor imports only compiler.expr of the compiler"
        if top == "pymesos" and rel != "executor/mesos_executor.py":
            return "R4: pymesos only in executor/mesos_executor.py"
    elif owner == "scheduler":
        if top in {"executor", "elastiq", "pyspark", "rewrite_rules", "embedded_mesos"}:
            return ("R5: the scheduler never imports executor, elastiq, pyspark or the embedded "
                    "cluster (it must run the same against a real Mesos master)")
        if top == "pymesos" and rel != "scheduler/mesos_adapter.py":
            return "R5: pymesos only in scheduler/mesos_adapter.py"
        if top == "kazoo" and rel != "scheduler/zk.py":
            return "R5: kazoo only in scheduler/zk.py"
        if top in CORE_FORBIDDEN and rel in scheduler_core():
            return ("R8: the scheduler's pure core makes no keys, randomness or I/O (the shell "
                    "does, and hands them over on events)")
    elif owner == "embedded_mesos":
        if top in OURS and top not in {"common", "embedded_mesos"}:
            return "R6: embedded_mesos imports common and embedded_mesos only"
    return None


def violations(rel: str, source: str) -> list[Violation]:
    found: dict[tuple[int, str], Violation] = {}
    for line, module in imported_modules(rel, source):
        rule = rule_for(rel, module)
        if rule is not None:
            found.setdefault((line, module), Violation(rel, line, module, rule))
    return list(found.values())


def program_violations(rel: str, source: str) -> list[Violation]:
    """R7: a generated task program imports exactly common.types and executor.runtime."""
    modules = imported_modules(rel, source)
    names = {m for _, m in modules}
    if names == {"common.types", "executor.runtime"}:
        return []
    line = modules[0][0] if modules else 1
    return [Violation(rel, line, ", ".join(sorted(names)) or "nothing",
                      "R7: a task program imports exactly common.types and executor.runtime")]


def tree_violations() -> list[Violation]:
    found: list[Violation] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found += violations(rel, path.read_text(encoding="utf-8"))
    return found


def import_cycles(sources: dict[str, str]) -> list[list[str]]:
    """R9: every cycle of imports (each strongly connected set of two or more modules) among
    `sources` (file -> text), as sorted module names."""
    def name(rel: str) -> str:
        return rel[:-3].replace("/", ".").removesuffix(".__init__")

    modules = {name(rel) for rel in sources}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for rel, source in sources.items():
        for _, imported in imported_modules(rel, source):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name(rel):
                edges[name(rel)].add(imported)
    return [sorted(c) for c in _strongly_connected(edges) if len(c) > 1]


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
    return found


def tree_sources() -> dict[str, str]:
    return {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def test_no_two_modules_import_each_other() -> None:
    cycles = import_cycles(tree_sources())
    assert not cycles, "R9: import cycles between our modules:\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_an_import_cycle_is_reported_with_its_modules() -> None:
    planted = {"elastiq/run.py": "def f():\n    from elastiq.service_cli import cmd_run\n",
               "elastiq/service_cli.py": "from elastiq.run import run\n",
               "elastiq/launch.py": "from elastiq import sizing\n",
               "elastiq/sizing.py": "import math\n"}
    assert import_cycles(planted) == [["elastiq.run", "elastiq.service_cli"]]
    three = {"a/x.py": "import a.y\n", "a/y.py": "import a.z\n", "a/z.py": "import a.x\n",
             "a/w.py": "import a.x\n"}
    assert import_cycles(three) == [["a.x", "a.y", "a.z"]]
    del planted["elastiq/service_cli.py"]
    assert import_cycles(planted) == []


def test_the_scheduler_core_is_state_and_what_it_imports() -> None:
    core = scheduler_core()
    assert {"scheduler/state.py", "scheduler/events.py", "scheduler/placement.py",
            "scheduler/lifecycle.py"} <= core
    assert not core & {"scheduler/mesos_adapter.py", "scheduler/loop.py", "scheduler/zk.py",
                       "scheduler/channel_keys.py", "scheduler/api.py"}


def test_every_package_keeps_the_import_rules() -> None:
    found = tree_violations()
    new = [v for v in found if (v.file, v.module) not in KNOWN_VIOLATIONS]
    assert not new, "imports that break the rules:\n" + "\n".join(map(str, new))


def test_the_known_violations_still_exist() -> None:
    present = {(v.file, v.module) for v in tree_violations()}
    gone = sorted(KNOWN_VIOLATIONS - present)
    assert not gone, ("these known violations are gone; remove them from KNOWN_VIOLATIONS: "
                      + ", ".join(f"{f} -> {m}" for f, m in gone))


def test_generated_programs_import_only_the_types_and_the_runtime() -> None:
    programs = sorted((ROOT / "tests" / "golden").rglob("*.py"))
    assert programs, "no golden task programs under tests/golden"
    found = [v for p in programs
             for v in program_violations(p.relative_to(ROOT).as_posix(), p.read_text("utf-8"))]
    assert not found, "\n".join(map(str, found))


def test_a_forbidden_import_is_reported_with_its_line() -> None:
    source = ("import json\n\n\ndef f():\n    from scheduler.client import X\n    return X\n")
    found = violations("executor/x.py", source)
    assert [(v.file, v.line, v.module) for v in found] == [("executor/x.py", 5,
                                                            "scheduler.client")]
    assert str(found[0]).startswith("executor/x.py:5: imports scheduler.client: R4")


def test_each_rule_reports_its_forbidden_edges() -> None:
    cases = {
        ("common/x.py", "import zmq"): "R1",
        ("common/x.py", "from compiler.tasks import TaskPlan"): "R1",
        ("compiler/x.py", "from pyspark.sql import functions"): "R2",
        ("compiler/x.py", "if TYPE_CHECKING:\n    from elastiq.cli import main"): "R2",
        ("rewrite_rules/x.py", "import lxml"): "R3",
        ("executor/x.py", "from compiler import operators"): "R4",
        ("executor/x.py", "import pymesos"): "R4",
        ("scheduler/x.py", "from ..executor import runtime"): "R5",
        ("scheduler/x.py", "from kazoo.client import KazooClient"): "R5",
        ("embedded_mesos/x.py", "from scheduler import state"): "R6",
        ("executor/x.py", "from embedded_mesos import agent"): "R4",
        ("scheduler/x.py", "import embedded_mesos.master"): "R5",
        ("scheduler/state.py", "import zmq"): "R8",
        ("scheduler/events.py", "def f():\n    import secrets"): "R8",
    }
    for (rel, source), rule in cases.items():
        found = violations(rel, source)
        assert [v.rule[:2] for v in found] == [rule], (rel, source, found)
    allowed = {("executor/x.py", "from compiler.expr import parser"),
               ("executor/x.py", "from .runtime import TaskRuntime"),
               ("scheduler/x.py", "from compiler.tasks import split_into_tasks"),
               ("embedded_mesos/x.py", "from . import protocol"),
               ("elastiq/x.py", "from scheduler import state"),
               ("scheduler/channel_keys.py", "import zmq")}
    for rel, source in allowed:
        assert violations(rel, source) == [], (rel, source)
    assert program_violations("p.py", "from compiler.types import Schema\n"
                                      "from executor.runtime import TaskRuntime\n")


# Tests that import a benchmark do so to check that benchmark's own yardstick (its oracle and
# figures), never to borrow a helper: helpers both use live in testkit/.
BENCHMARK_CHECKS = {"tests/test_peers_oracle.py": "benchmarks.peers",
                    "tests/test_elasticity_bench.py": "benchmarks.elasticity",
                    "tests/test_distribution_bench.py": "benchmarks.distribution",
                    "tests/test_shedding_bench.py": "benchmarks.shedding",
                    "tests/test_benchmark_scripts.py": "benchmarks.bench_util",
                    "tests/test_nexmark_flink.py": "benchmarks.nexmark_flink"}


def helper_violations(rel: str, source: str) -> list[Violation]:
    """R10: benchmarks/ and testkit/ never import tests; testkit/ never imports benchmarks;
    a test imports a benchmark only to check it (BENCHMARK_CHECKS)."""
    found = []
    checked = {"benchmarks", BENCHMARK_CHECKS[rel]} if rel in BENCHMARK_CHECKS else set()
    for line, module in imported_modules(rel, source):
        top = _top(module)
        tests_module = top == "tests" or top in {"e2e_support", "waiting"} or \
            top.startswith("test_")
        if rel.startswith(("benchmarks/", "testkit/")) and tests_module:
            found.append(Violation(rel, line, module, "R10: benchmarks and testkit never import "
                                                      "tests (shared helpers live in testkit)"))
        elif rel.startswith("testkit/") and top == "benchmarks":
            found.append(Violation(rel, line, module, "R10: testkit never imports benchmarks"))
        elif rel.startswith("tests/") and top == "benchmarks" and module not in checked:
            found.append(Violation(rel, line, module, "R10: a test imports a benchmark only to "
                                                      "check it (BENCHMARK_CHECKS)"))
    if rel.startswith("benchmarks/") and '"tests"' in source and "sys.path" in source:
        found.append(Violation(rel, 1, "tests (on sys.path)", "R10: benchmarks never put tests/ "
                                                              "on sys.path"))
    return found


def test_tests_and_benchmarks_share_helpers_only_through_testkit() -> None:
    found = [v for folder in ("tests", "benchmarks", "testkit")
             for path in sorted((ROOT / folder).glob("*.py"))
             for v in helper_violations(path.relative_to(ROOT).as_posix(),
                                        path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(map(str, found))


def test_a_benchmark_borrowing_a_test_helper_is_reported() -> None:
    cases = {("benchmarks/x.py", "from tests.e2e_support import Stack"): "R10",
             ("benchmarks/x.py", "from test_control_cluster import SPEC"): "R10",
             ("benchmarks/x.py", 'import sys\nsys.path.append(str(ROOT / "tests"))'): "R10",
             ("testkit/x.py", "from benchmarks import bench_util"): "R10",
             ("tests/test_x.py", "from benchmarks import peers"): "R10"}
    for (rel, source), rule in cases.items():
        assert [v.rule[:3] for v in helper_violations(rel, source)] == [rule], (rel, source)
    for rel, source in (("benchmarks/x.py", "from testkit.e2e_support import Stack"),
                        ("tests/test_peers_oracle.py", "from benchmarks import peers"),
                        ("tests/test_x.py", "from testkit.waiting import wait_for")):
        assert helper_violations(rel, source) == [], (rel, source)


# R11: the one polling loop of tests and benchmarks is testkit/waiting.py's `poll`.
POLLING_LOOP = "testkit/waiting.py"


def polling_copies(rel: str, source: str) -> list[Violation]:
    """R11: every function named `wait...` or `_wait...` outside testkit/waiting.py that sleeps
    inside a loop of its own (a copy of the polling loop; waits on a condition variable or an
    event, which sleep in no loop, are not copies)."""
    if rel == POLLING_LOOP:
        return []
    found = []
    for node in ast.walk(ast.parse(source, rel)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                not node.name.lstrip("_").startswith("wait"):
            continue
        sleeps = [call for loop in ast.walk(node) if isinstance(loop, (ast.While, ast.For))
                  for call in ast.walk(loop) if isinstance(call, ast.Call)
                  and (getattr(call.func, "attr", None) == "sleep"
                       or getattr(call.func, "id", None) == "sleep")]
        if sleeps:
            found.append(Violation(rel, node.lineno, node.name, "R11: a polling loop of its own; "
                                   "use testkit.waiting's wait_for or poll", "defines"))
    return found


def test_tests_and_benchmarks_poll_only_through_testkit_waiting() -> None:
    found = [v for folder in ("tests", "benchmarks", "testkit")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for v in polling_copies(path.relative_to(ROOT).as_posix(),
                                     path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(map(str, found))


def test_a_copy_of_the_polling_loop_is_reported() -> None:
    copy = ("import time\n\n\ndef wait_until(check, timeout):\n"
            "    deadline = time.monotonic() + timeout\n"
            "    while time.monotonic() < deadline:\n"
            "        if check():\n            return True\n        time.sleep(0.1)\n"
            "    return False\n")
    assert [(v.line, v.module, v.rule[:3]) for v in polling_copies("benchmarks/x.py", copy)] \
        == [(4, "wait_until", "R11")]
    method = "class W:\n    def _wait_ready(self):\n        for _ in range(9):\n" \
             "            sleep(1)\n"
    assert [v.module for v in polling_copies("tests/x.py", method)] == ["_wait_ready"]
    for rel, source in (
            ("tests/x.py", "def wait(check):\n    return wait_for('it', check, 5)\n"),
            ("tests/x.py", "def wait_for(self, cond):\n    while not cond():\n"
                           "        self._cond.wait(1)\n"),
            ("tests/x.py", "def run():\n    while True:\n        time.sleep(1)\n"),
            (POLLING_LOOP, copy)):
        assert polling_copies(rel, source) == [], (rel, source)
