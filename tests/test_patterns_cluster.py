"""The partitioned and pipelined plans at run time on the embedded cluster (docs/architecture.md,
invariant 5): window aggregates, the tick pattern (CEP) split into instances or stages, and a
window over another task's windows, each across an executor SIGKILL where its plan protects it.

Each spec asks for one pattern with one attribute (tests/specs/e2e-<pattern>.xml); the compiler
rewrites and splits it, the framework scheduler places its tasks on three agents, real executors
run them, and the tests SIGKILL an agent's whole executor mid-stream. Every sink is then
compared with a plain-Python oracle over the same deterministic input: nothing missing, nothing
twice. Standby, checkpointing, hot standby and migration under kills are
tests/test_patterns_failover_cluster.py, the next module, which takes this module's running
stack over (the same `STACK_SHAPE`: warm executors). Gaps and overheads are measured by
benchmarks/patterns.py, not here.

Three agents of 2.5 cpus, as for the failover tests. Helpers and oracles:
testkit/patterns_support.py and testkit/e2e_support.py.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from testkit.e2e_support import (Stack, StackPool, StackShape, generator_rows, hot_items_oracle,
                                 hurry, kill_executor, read_sink, sink_path, spec_params,
                                 stop_query, wait_for_sink, wait_until)
from testkit.patterns_support import (SECOND, assert_alone, check_windows, grows, not_done,
                                      relaunched, running_query, tasks_with, view)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]


# one stack for this module and the next one of the same shape (tests/conftest.py `stack_pool`)
STACK_SHAPE = StackShape(cpus_per_agent=2.5, agents=3)


@pytest.fixture(scope="module")
def stack(stack_pool: StackPool) -> Stack:
    return stack_pool.take(STACK_SHAPE, "test_patterns_cluster.py")


# --- 4 and 5. partitioned and pipelined plans ------------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", ["e2e-partitioned.xml", "e2e-pipelined.xml"])
def test_partitioned_and_pipelined_plans_equal_the_oracle(stack: Stack, tmp_path: Path,
                                                          spec: str) -> None:
    query = running_query(stack, spec, tmp_path)
    try:
        agents = {v["agent_id"] for v in stack.tasks(query.query_id).values()}
        assert len(agents) >= 2, f"the pattern should spread {spec} over agents: {agents}"
        hurry(stack, query.query_id)  # nothing is timed or killed: the input need not be paced
        check_windows(sink_path(tmp_path, spec, "sink"), spec, 240)
    finally:
        stop_query(stack, query.query_id)


def _pattern_plan_survives_a_kill(stack: Stack, tmp_path: Path, spec: str,
                                  copies: tuple[str, ...], victim: str) -> None:
    """The tick pattern's copies (`copies`, by operator name) run on distinct agents; the
    executor of the agent running `victim` is SIGKILLed mid-stream and its tasks resume from
    their checkpoints; the sink then holds every match the independent matcher
    (skip-to-next-row) decides by the end, nothing twice and nothing it does not find."""
    from test_cep_spark import _expected

    query = running_query(stack, spec, tmp_path)
    try:
        tasks = {op: t for t in query.tasks for op in t.operators if op in copies}
        placed = stack.tasks(query.query_id)
        assert len({placed[t.task_id]["agent_id"] for t in tasks.values()}) == len(copies)
        rows = generator_rows(spec_params(spec)["ticks"])
        want = {(m["symbol"], m["start"]): m for ms in _expected(
            rows, SECOND // timedelta(microseconds=1), skip_to_next=True).values() for m in ms}
        final_watermark = max(r["ts"] for r in rows) - SECOND
        sure = {k for k, m in want.items() if m["start"] + SECOND < final_watermark}
        assert len(sure) > 80
        sink = sink_path(tmp_path, spec, "out")
        got = lambda: read_sink(sink)  # noqa: E731
        task = tasks[victim].task_id
        grows(sink, 0, 120, "first matches")
        not_done(sink, len(sure), f"the executor running {victim}")
        attempt = view(stack, query.query_id, task)["attempt"]
        kill_executor(stack, placed[task]["agent_id"], task)
        relaunched(stack, query.query_id, task, attempt, timeout=180)
        hurry(stack, query.query_id, "ticks")
        wait_until(lambda: sure <= {(m["symbol"], m["start"]) for m in got()}, 240,
                   "every decided match in the sink")
        found = got()
        keys = Counter((m["symbol"], m["start"]) for m in found)
        assert max(keys.values()) == 1, "a match twice"
        assert all(want.get((m["symbol"], m["start"])) == m for m in found), \
            "a match the matcher does not find"
    finally:
        stop_query(stack, query.query_id)


@pytest.mark.timeout(300)
def test_a_partitioned_pattern_finds_the_matchers_matches_once_across_a_kill(
        stack: Stack, tmp_path: Path) -> None:
    """match-instances="2": the tick pattern's two instances on distinct agents read every tick
    through a multicast channel and the merger unites their matches; the first instance's
    executor is killed."""
    _pattern_plan_survives_a_kill(stack, tmp_path, "e2e-pattern-partitioned.xml",
                                  ("tick_1", "tick_2"), "tick_1")


@pytest.mark.timeout(300)
def test_a_pipelined_pattern_finds_the_matchers_matches_once_across_a_kill(
        stack: Stack, tmp_path: Path) -> None:
    """pipeline-stages="3": the tick pattern's three stages on distinct agents, chained by
    channels that carry rows, partial matches handed on and progress; the middle stage's
    executor is killed, and the last stage's sink holds the matches."""
    _pattern_plan_survives_a_kill(stack, tmp_path, "e2e-pattern-pipelined.xml",
                                  ("tick_1", "tick_2", "tick_3"), "tick_2")


# --- chained windows across tasks ---------------------------------------------------------------

HOT_KEY = ("window_start", "window_end", "top", "windows")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("spec", ["e2e-hot-items-pipelined.xml", "e2e-hot-items-checkpoint.xml"])
def test_a_window_over_a_windows_results_in_another_task_equals_the_oracle(
        stack: Stack, tmp_path: Path, spec: str) -> None:
    """Hot items with the second window across a channel from the first; with the first
    checkpointed, its executor is SIGKILLed once mid-stream and the sink stays exact."""
    query = running_query(stack, spec, tmp_path)
    qid = query.query_id
    try:
        expected = hot_items_oracle(generator_rows(spec_params(spec)["src"]), "symbol", SECOND,
                                    SECOND / 2, timedelta(milliseconds=200), SECOND / 2,
                                    second_watermark=timedelta(0))
        assert len(expected) >= 20, expected
        sink = sink_path(tmp_path, spec, "sink")
        grows(sink, 0, 150, f"first hot items of {spec}")
        if "checkpoint" in spec:
            (task,) = tasks_with(query, "checkpoint")
            agent = assert_alone(stack, qid, task)
            not_done(sink, sum(expected.values()), "the first window's executor")
            attempt = view(stack, qid, task)["attempt"]
            kill_executor(stack, agent, task)
            relaunched(stack, qid, task, attempt, timeout=180)
        hurry(stack, qid)
        wait_for_sink(sink, expected, lambda r: tuple(r[c] for c in HOT_KEY), 300,
                      f"the hot items of {spec} to equal the oracle")
    finally:
        stop_query(stack, qid)
