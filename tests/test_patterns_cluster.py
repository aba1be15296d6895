"""The five patterns at run time, under faults, on the embedded cluster (docs/architecture.md,
invariant 5).

Each spec asks for one pattern with one attribute (tests/specs/e2e-<pattern>.xml); the compiler
rewrites and splits it, the framework scheduler places its tasks on three agents, real executors
run them, and the tests SIGKILL real processes mid-stream: a task's process (its query's Python
source runner: the executor restarts the query from its checkpoint) and the whole executor of an
agent (the scheduler fails the task over as its pattern prescribes). Every sink is then compared
with a plain-Python oracle over the same deterministic input: nothing missing, nothing twice.
Checkpoint and hot standby take five executor kills in one run. The last test moves a stateful
task between agents with `elastiq migrate` under load. Gaps and overheads are measured by
benchmarks/patterns.py, not here.

Three agents of 2.5 cpus: a protected task starts away from its neighbours, so two hot-standby
replicas and their neighbours need three agents. Helpers and oracles: testkit/e2e_support.py.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest

from testkit.e2e_support import (Stack, compile_spec, generator_rows, hot_items_oracle, hurry,
                                 java_child, kill_session,
                                 read_sink, session_members, sink_path, source_runner_pids, spec_params,
                                 start_stack, stop_query, stop_stack, submit, wait_for_sink, wait_running,
                                 wait_until, window_oracle)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]
log = logging.getLogger("tests.patterns")
SECOND = timedelta(seconds=1)
WINDOW_KEY = ("window_start", "window_end", "sensor", "readings")
READING_KEY = ("sensor", "ts", "temp", "humidity")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("patterns-stack"), cpus_per_agent=2.5,
                          agents=3)
    try:
        yield running
    finally:
        leftovers = stop_stack(running)
        if leftovers:
            log.warning("patterns teardown: SIGKILLed leftover executor processes %s", leftovers)


# --- oracles ------------------------------------------------------------------------------------

def filter_oracle(spec: str) -> Counter:
    """warm := filter(raw.temp > 25 and raw.humidity < 60), in plain Python."""
    return Counter(tuple(r[c] for c in READING_KEY) for r in generator_rows(spec_params(spec)["src"])
                   if r["temp"] > 25 and r["humidity"] < 60)


def count_windows(spec: str) -> tuple[Counter, dict[tuple, float]]:
    """The 2-second per-sensor windows an append-mode query emits, and each one's total temp."""
    windows = window_oracle(generator_rows(spec_params(spec)["src"]), "ts", ["sensor"],
                            2 * SECOND, 2 * SECOND, timedelta(milliseconds=500))
    exact, totals = Counter(), {}
    for (start, sensor), rows in windows.items():
        key = (start, start + 2 * SECOND, sensor, len(rows))
        exact[key] += 1
        totals[key] = sum(r["temp"] for r in rows)
    return exact, totals


def check_windows(sink: Path, spec: str, timeout: float) -> None:
    exact, totals = count_windows(spec)
    wait_for_sink(sink, exact, lambda r: tuple(r[c] for c in WINDOW_KEY), timeout,
                  f"the windows of {spec} to equal the oracle")
    for row in read_sink(sink):
        key = tuple(row[c] for c in WINDOW_KEY)
        assert row["total_temp"] == pytest.approx(totals[key], rel=1e-12), key


# --- running and killing ------------------------------------------------------------------------

def running_query(stack: Stack, spec: str, base: Path) -> Any:
    query = compile_spec(spec, base)
    submit(stack, query)
    wait_running(stack, query.query_id, timeout=180)
    return query


def tasks_with(query: Any, failover: str) -> list[str]:
    found = [t.task_id for t in query.tasks if t.failover == failover]
    assert found, f"no task of {query.query_id} has failover {failover!r}: " \
                  f"{[(t.task_id, t.failover) for t in query.tasks]}"
    return found


def view(stack: Stack, query_id: str, task_id: str) -> dict[str, Any]:
    return stack.tasks(query_id)[task_id]


def assert_alone(stack: Stack, query_id: str, task_id: str) -> str:
    """A protected task starts on an agent none of its query's other tasks share."""
    agents = {t: v["agent_id"] for t, v in stack.tasks(query_id).items()}
    others = {a for t, a in agents.items() if t != task_id}
    assert agents[task_id] not in others, agents
    return agents[task_id]


def grows(sink: Path, than: int, timeout: float, what: str) -> int:
    """Wait until the sink holds more than `than` rows; returns how many."""
    return wait_until(lambda: (n := len(read_sink(sink))) > than and n, timeout, what,
                      lambda: f"{sink.name} still has {len(read_sink(sink))} rows")


def kill_executor(stack: Stack, agent: str, what: str) -> int:
    """SIGKILL every process of the executor on `agent` (the executor, its Spark JVM, Python
    workers); returns the executor's pid once all of them are gone."""
    executor = wait_until(lambda: stack.executor_pid(agent), 30, f"the executor on {agent}")
    victims = kill_session(executor)
    log.info("patterns: SIGKILLed the executor of %s on %s: %s", what, agent, victims)
    # a process forked while the sweep ran (a Spark worker) escapes it: sweep until none is left
    wait_until(lambda: not kill_session(executor) and not session_members(executor), 30,
               f"the killed executor on {agent} to end",
               lambda: f"still alive: {session_members(executor)}")
    return executor


def kill_task_process(stack: Stack, agent: str, what: str) -> int:
    """SIGKILL the Python source runner of the only query on `agent`'s executor."""
    executor = wait_until(lambda: stack.executor_pid(agent), 30, f"the executor on {agent}")
    jvm = wait_until(lambda: java_child(executor), 30, f"the Spark JVM on {agent}")
    runners = wait_until(lambda: source_runner_pids(jvm), 30, f"the source runner of {what}")
    assert len(runners) == 1, f"expected one query on {agent}, found runners {runners}"
    os.kill(runners[0], signal.SIGKILL)
    log.info("patterns: SIGKILLed the source runner %s of %s", runners[0], what)
    return runners[0]


def relaunched(stack: Stack, query_id: str, task_id: str, after_attempt: int,
               timeout: float = 120) -> dict[str, Any]:
    return wait_until(
        lambda: (v := view(stack, query_id, task_id))["attempt"] > after_attempt and
        v["state"] == "running" and v, timeout, f"{task_id} relaunched after attempt "
        f"{after_attempt}", lambda: str(view(stack, query_id, task_id)))


def not_done(sink: Path, total: int, what: str) -> int:
    have = len(read_sink(sink))
    assert have < total, f"too late to kill {what}: the sink is complete ({have} rows)"
    return have


# --- 1. simple standby -----------------------------------------------------------------------------

@pytest.mark.timeout(420)
def test_standby_filter_loses_nothing_when_its_process_and_its_executor_are_killed(
        stack: Stack, tmp_path: Path) -> None:
    spec = "e2e-standby.xml"
    query = running_query(stack, spec, tmp_path)
    qid = query.query_id
    try:
        (task,) = tasks_with(query, "standby")
        agent = assert_alone(stack, qid, task)
        expected = filter_oracle(spec)
        total = sum(expected.values())
        sink = sink_path(tmp_path, spec, "sink")
        have = grows(sink, 0, 120, "first output of the standby query")
        kill_task_process(stack, agent, task)
        wait_until(lambda: view(stack, qid, task)["figures"].get("restarts", 0) >= 1, 60,
                   "the executor to restart the query in place", lambda: str(view(stack, qid, task)))
        have = grows(sink, have, 90, "output after the query restarted in place")
        not_done(sink, total, "the standby's executor")
        kill_executor(stack, agent, task)
        moved = relaunched(stack, qid, task, 1)
        assert moved["agent_id"] != agent, moved
        hurry(stack, qid)
        wait_for_sink(sink, expected, lambda r: tuple(r[c] for c in READING_KEY), 240,
                      "the standby query's sink to equal the filter oracle")
    finally:
        stop_query(stack, qid)


# --- 2. checkpointing, five executor kills -------------------------------------------------------

@pytest.mark.timeout(600)
def test_checkpointed_window_aggregate_survives_five_executor_kills_exactly_once(
        stack: Stack, tmp_path: Path) -> None:
    spec = "e2e-checkpoint.xml"
    query = running_query(stack, spec, tmp_path)
    qid = query.query_id
    try:
        (task,) = tasks_with(query, "checkpoint")
        agent = assert_alone(stack, qid, task)
        total = sum(count_windows(spec)[0].values())
        sink = sink_path(tmp_path, spec, "sink")
        have = grows(sink, 0, 120, "first windows of the checkpointed query")
        kill_task_process(stack, agent, task)
        have = grows(sink, have, 90, "windows after the query restarted in place")
        for kill in range(5):
            attempt, agent = view(stack, qid, task)["attempt"], view(stack, qid, task)["agent_id"]
            alone = agent not in {v["agent_id"] for t, v in stack.tasks(qid).items() if t != task}
            not_done(sink, total, f"executor kill {kill + 1}")
            kill_executor(stack, agent, f"{task} (kill {kill + 1})")
            moved = relaunched(stack, qid, task, attempt, timeout=180)
            if alone:  # with its neighbours gone too, the old agent may be the way back
                assert moved["agent_id"] != agent, (kill, moved)
            have = grows(sink, have, 180, f"windows after failover {kill + 1}")
        hurry(stack, qid)
        check_windows(sink, spec, 300)
    finally:
        stop_query(stack, qid)


# --- 3. hot standby, five executor kills ---------------------------------------------------------

@pytest.mark.timeout(900)
def test_hot_standby_replicas_killed_in_turn_leave_the_sink_exact(stack: Stack,
                                                                  tmp_path: Path) -> None:
    spec = "e2e-hot-standby.xml"
    query = running_query(stack, spec, tmp_path)
    qid = query.query_id
    try:
        replicas = tasks_with(query, "replica")
        assert len(replicas) == 2, replicas
        agents = [assert_alone(stack, qid, r) for r in replicas]
        assert agents[0] != agents[1]
        total = sum(count_windows(spec)[0].values())
        sink = sink_path(tmp_path, spec, "sink")
        have = grows(sink, 0, 150, "first windows of the hot-standby query")
        kill_task_process(stack, agents[0], replicas[0])
        have = grows(sink, have, 90, "windows after replica 1's query was killed")
        for kill in range(5):
            victim = replicas[kill % 2]
            attempt = view(stack, qid, victim)["attempt"]
            agent = view(stack, qid, victim)["agent_id"]
            not_done(sink, total, f"replica kill {kill + 1}")
            kill_executor(stack, agent, f"{victim} (kill {kill + 1})")
            have = grows(sink, have, 60, f"windows from the other replica after kill {kill + 1}")
            relaunched(stack, qid, victim, attempt, timeout=180)
        hurry(stack, qid)
        check_windows(sink, spec, 300)
    finally:
        stop_query(stack, qid)


# --- 4 and 5. partitioned and pipelined plans ------------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", ["e2e-partitioned.xml", "e2e-pipelined.xml"])
def test_partitioned_and_pipelined_plans_equal_the_oracle(stack: Stack, tmp_path: Path,
                                                          spec: str) -> None:
    query = running_query(stack, spec, tmp_path)
    try:
        agents = {v["agent_id"] for v in stack.tasks(query.query_id).values()}
        assert len(agents) >= 2, f"the pattern should spread {spec} over agents: {agents}"
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


# --- migration: a stateful task moved between agents under load -----------------------------------

@pytest.mark.timeout(400)
def test_migrating_a_stateful_task_twice_leaves_the_sink_exact(
        stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`elastiq migrate` moves the checkpointed window aggregate to another agent and back,
    mid-stream: quiesced, relaunched from its checkpoint and channel logs, its reader retargeted;
    the sink equals the oracle."""
    from elastiq.cli import main

    spec = "e2e-checkpoint.xml"
    query = compile_spec(spec, tmp_path, query_id="e2e-migrate")
    submit(stack, query)
    qid = query.query_id
    try:
        wait_running(stack, qid, timeout=180)
        (task,) = tasks_with(query, "checkpoint")
        sink = sink_path(tmp_path, spec, "sink")
        total = sum(count_windows(spec)[0].values())
        have = grows(sink, 0, 120, "first windows before the migration")
        agents = [a.agent_id for a in stack.cluster.agents]
        for move in range(2):
            here, attempt = view(stack, qid, task)["agent_id"], view(stack, qid, task)["attempt"]
            there = next(a for a in agents if a != here)
            not_done(sink, total, f"migration {move + 1}")
            code = main(["migrate", qid, task, "--to", there, "--scheduler", stack.api.url,
                         "--token-file", str(stack.api.token_file)])
            said = capsys.readouterr().out
            assert code == 0, said
            assert f"task {task} runs on agent {there} (attempt {attempt + 1}): paused " in said
            moved = view(stack, qid, task)
            assert (moved["agent_id"], moved["attempt"], moved["state"]) == \
                (there, attempt + 1, "running")
            have = grows(sink, have, 120, f"windows after migration {move + 1}")
        refused = main(["migrate", qid, task, "--to", "no-such-agent",
                        "--scheduler", stack.api.url, "--token-file", str(stack.api.token_file)])
        assert refused != 0 and "no agent no-such-agent" in capsys.readouterr().err
        hurry(stack, qid)
        check_windows(sink, spec, 300)
        assert view(stack, qid, task)["attempt"] == 3, "the refusal moved nothing"
    finally:
        stop_query(stack, qid)
