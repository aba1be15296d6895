"""Shared pytest fixtures: the one session-scoped SparkSession of the Spark test layer; the one
session-scoped Kafka broker of the tests about Kafka (`kafka_broker`: each test uses topics of
its own; a test that kills its broker takes `tests.kafka_support.own_broker`); the
pool that hands one running embedded stack from a cluster test module to the next module of the
same `STACK_SHAPE` (testkit.e2e_support.StackPool), those modules run one after another; the
`alone` mark of the cluster tests that
scripts/test.sh keeps in its serial cluster stream (ALONE_MODULES) and the `beside` mark of the
Spark cluster tests it runs in its other stream (BESIDE_MODULES); the `quiet` mark of those it
runs last, alone (QUIET_MODULES); and,
when the suite runs on pytest-xdist workers (`pytest -n N --dist loadfile`, for a machine with
more cores than CI's: `scripts/test.sh` runs the cluster layer serially), in what order its
modules are handed out.

Under `--dist loadfile` a module's tests run on one worker in their order, so its shared
fixtures (its embedded cluster, its ZooKeeper, the worker's SparkSession) start once. The
modules are handed out longest first (a module's weight is the sum of its tests' `timeout`
marks, the test authors' bound on how long each may take; unmarked cluster, Spark and pure
tests weigh 60, 10 and 1 s), so the two workers end together instead of one waiting on a
long cluster module started last.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import pytest

if TYPE_CHECKING:
    from testkit.e2e_support import StackPool
    from executor.runtime import TaskRuntime

# Tests outside the Spark cluster layer that scripts/test.sh runs in its serial cluster stream
# (marked `alone`): cluster tests without Spark that measure CPU shares another stream's load
# would skew (beside a Spark cluster module, the half-cpu agent's executor measured 0.16 of a cpu
# against its 0.2-0.55 bound), and Spark tests that SIGKILL a broker and wait out the sink's
# wall-clock bounds (42 s, 83 s before the sink rode through a stall; in the other stream they
# made it the longer by ~200 s), and the DPC
# tests, which cut a link for seconds and bound the time to the first tentative result (in the
# other stream they made it the longer: 1,780 s against the serial stream's 1,678 s).
ALONE_MODULES = frozenset({"tests/test_isolation_cgroups.py", "tests/test_kafka_broker_kill.py",
                           "tests/test_dpc_runtime.py", "tests/test_dpc_join_runtime.py",
                           "tests/test_dpc_marks_runtime.py", "tests/test_dpc_netns.py"})
# Spark cluster tests that kill nothing and bound no timing or CPU share: marked `beside`, they
# leave the serial cluster stream and run last in the other stream, beside the serial stream's
# last modules, which would otherwise run alone while the machine's other core idles.
# tests/test_distribution_cluster.py waits (bounded, 150 s) for a move that needs the agent with
# three tasks to carry more load than the one with one: the other stream slows both executors
# alike, and the gap (0.7 CPU s/s measured) stays far above the test's threshold (0.1).
# On 2026-12-01 the other layers went onto two xdist workers (scripts/test.sh), which left the
# serial stream the longer by minutes, so the Spark cluster modules that only run queries to
# their oracles (no kill, no timing bound; a leftover executor killed in cleanup is not a kill)
# joined them: thirty tasks (54 s serial), two stacks on the same ports (42 s), the shared and
# published subgraphs (25 s), control tuples (10 s), the closed loop (17 s) and the pattern
# overflow (16 s).
BESIDE_MODULES = frozenset({"tests/test_update_cluster.py", "tests/test_distribution_cluster.py",
                            "tests/test_thirty_tasks_cluster.py",
                            "tests/test_port_clash_cluster.py", "tests/test_sharing_cluster.py",
                            "tests/test_control_cluster.py", "tests/test_closed_loop_cluster.py",
                            "tests/test_overflow_cluster.py"})
# Spark cluster tests marked `quiet`: scripts/test.sh runs them last, once every other stream
# ended. tests/test_shedding_cluster.py (63-65 s quiet, 134 s beside a busy core; docs/load.md)
# overloads its one instance at 3x the rate it measured for it and waits for the scheduler to
# shed, which it decides from the CPU the instance's agent got (its cgroup's usage): beside the
# other streams on two xdist workers the instance, busy all the time with its backlog growing,
# came out at 77 % of its agent's capacity and nothing was shed in 180 s (2026-12-01).
QUIET_MODULES = frozenset({"tests/test_shedding_cluster.py"})
UNMARKED_WEIGHT = {"cluster": 60.0, "spark": 10.0}
PURE_WEIGHT = 1.0


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator["object"]:
    """One SparkSession for every @pytest.mark.spark test (local[2], Elastiq settings), its JVM
    with the stacks' executors' options (C1 only, one GC thread: 12 % less CPU over three Spark
    test modules, 240 against 271 CPU-s) beside the class archive."""
    from executor.class_archive import session_java_options
    from executor.spark_session import build_session
    from testkit.e2e_support import JAVA_OPTIONS_ENV

    java_options = f"{session_java_options()} {os.environ.get(JAVA_OPTIONS_ENV, '')}".strip()
    session = build_session(2, "elastiq-tests", str(tmp_path_factory.mktemp("spark-state")),
                            java_options=java_options)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def runtime(spark: object, tmp_path: Path) -> Iterator["TaskRuntime"]:
    """A TaskRuntime on the session's SparkSession, its checkpoint under the test's tmp_path,
    stopped after the test (the Spark layer's tests of one operator or plan)."""
    from executor.runtime import TaskRuntime

    rt = TaskRuntime(spark, query_id="q", task_id=f"t-{tmp_path.name}",
                     checkpoint_dir=str(tmp_path / "ck"), trigger_seconds=0.5)
    yield rt
    rt.stop()


POOL_KEY = pytest.StashKey["StackPool"]()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of a KRaft broker (`elastiq.kafka_broker`, free 127.0.0.1 ports)
    that lives for the test session: started by the first test that asks for it."""
    from elastiq.kafka_broker import KafkaBroker

    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def stack_pool(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator["StackPool"]:
    """The session's StackPool: a module fixture takes its stack from it by the module's
    `STACK_SHAPE`; `pytest_runtest_teardown` releases it once the next module wants another."""
    from testkit.e2e_support import StackPool

    pool = StackPool(tmp_path_factory.mktemp("shared-stacks"))
    request.config.stash[POOL_KEY] = pool
    yield pool
    del request.config.stash[POOL_KEY]
    pool.release()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared stack after a test when the next test's module does not share its shape
    (or no test follows), so no idle stack's executors sit beside other modules' work."""
    pool = item.config.stash.get(POOL_KEY, None)
    if pool is None:
        return
    shape = getattr(getattr(nextitem, "module", None), "STACK_SHAPE", None)
    if not pool.wanted_by(shape):
        pool.release()


@pytest.fixture
def scheduler_path_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The path roots an operator gave the in-process scheduler (`elastiq scheduler
    --path-root`): this test's folder, where its specs write, and the working folder (the
    scheduler's default root). The scheduler compiles specs from clients with these roots only
    (common.paths.configured_roots)."""
    from common.paths import ENV_VAR

    monkeypatch.setenv(ENV_VAR, os.pathsep.join([str(tmp_path), os.getcwd()]))
    return tmp_path


def item_weight(item: pytest.Item) -> float:
    """How long `item` may take, for ordering only: its own `timeout` mark (the closest one:
    the test's, else its class's or module's) when its layer is Spark or cluster, else the
    layer's default weight."""
    layers = [name for name in UNMARKED_WEIGHT if item.get_closest_marker(name) is not None]
    if not layers:
        return PURE_WEIGHT
    timeout = item.get_closest_marker("timeout")
    if timeout is not None and timeout.args:
        return float(timeout.args[0])
    return max(UNMARKED_WEIGHT[name] for name in layers)


def module_of(nodeid: str) -> str:
    """The test file of a pytest node id (`tests/test_x.py::TestY::test_z[1]`)."""
    return nodeid.split("::", 1)[0]


def longest_modules_first(tests: Sequence[tuple[str, float]]) -> list[int]:
    """Given (node id, weight) of each collected test, the positions of the tests regrouped by
    module, the heaviest module (sum of its weights) first, ties and each module's own tests in
    collection order."""
    modules: dict[str, list[int]] = defaultdict(list)
    for position, (nodeid, _) in enumerate(tests):
        modules[module_of(nodeid)].append(position)
    weight = {name: sum(tests[i][1] for i in members) for name, members in modules.items()}
    order = sorted(modules, key=lambda name: -weight[name])  # sorted() is stable
    return [position for name in order for position in modules[name]]


def shapes_together(modules: Sequence[tuple[str, object]]) -> list[str]:
    """Given (module, its `STACK_SHAPE` or None) in collection order, the modules in the order
    to run them: each module that declares a shape moves up to just after the last module
    before it of that shape, so the modules sharing a shape run one after another and the
    StackPool starts each shape's stack once; the rest keep their order."""
    order: list[str] = []
    last_of: dict[object, str] = {}
    for name, shape in modules:
        if shape is not None and shape in last_of:
            order.insert(order.index(last_of[shape]) + 1, name)
        else:
            order.append(name)
        if shape is not None:
            last_of[shape] = name
    return order


def by_shape(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` regrouped by module in `shapes_together`'s order, each module's tests in their
    order."""
    members: dict[str, list[pytest.Item]] = defaultdict(list)
    shapes: dict[str, object] = {}
    for item in items:
        name = module_of(item.nodeid)
        members[name].append(item)
        shapes.setdefault(name, getattr(getattr(item, "module", None), "STACK_SHAPE", None))
    return [item for name in shapes_together(list(shapes.items())) for item in members[name]]


def handed_out(config: pytest.Config) -> bool:
    """Whether pytest-xdist hands this run's tests to workers: on a worker (which collects
    and reports the order), or with `--dist` given (a `--collect-only` shows the order)."""
    return hasattr(config, "workerinput") or getattr(config.option, "dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    from testkit.e2e_support import (JAVA_OPTIONS_ENV, JAVA_OPTIONS_FOR_TESTS, MIN_BATCH_ENV,
                                     MIN_BATCH_FOR_TESTS)

    os.environ.setdefault(JAVA_OPTIONS_ENV, JAVA_OPTIONS_FOR_TESTS)  # the stacks' executors
    os.environ.setdefault(MIN_BATCH_ENV, MIN_BATCH_FOR_TESTS)
    config.addinivalue_line("markers", "alone: a test to run in the serial cluster stream "
                            "only (it measures CPU shares or waits out timings; tests/conftest.py)")
    config.addinivalue_line("markers", "quiet: a Spark cluster test run last, on a machine "
                            "left to it (it decides from CPU shares; tests/conftest.py)")
    config.addinivalue_line("markers", "beside: a Spark cluster test that may run beside "
                            "another cluster test (nothing killed, nothing timed; tests/conftest.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests of ALONE_MODULES `alone`, of BESIDE_MODULES `beside` and of
    QUIET_MODULES `quiet`. On xdist workers the heaviest modules come
    first (`--dist loadfile` hands out whole modules in this order). Other runs keep pytest's
    order, except that modules of one `STACK_SHAPE` run one after another (`by_shape`)."""
    for item in items:
        if module_of(item.nodeid) in ALONE_MODULES:
            item.add_marker(pytest.mark.alone)
        if module_of(item.nodeid) in BESIDE_MODULES:
            item.add_marker(pytest.mark.beside)
        if module_of(item.nodeid) in QUIET_MODULES:
            item.add_marker(pytest.mark.quiet)
    if not handed_out(config):
        items[:] = by_shape(items)
        return
    order = longest_modules_first([(item.nodeid, item_weight(item)) for item in items])
    items[:] = [items[position] for position in order]
