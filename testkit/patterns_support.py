"""Helpers the pattern tests on the embedded cluster share (tests/test_patterns_cluster.py and
tests/test_patterns_failover_cluster.py): the plain-Python oracles of their specs
(tests/specs/e2e-<pattern>.xml), running a spec's query, finding a pattern's tasks and where
they run, SIGKILLing a task's query process, and waiting for a relaunch or for the sink to grow.
Killing a whole executor is `e2e_support.kill_executor`.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from testkit.e2e_support import (Stack, compile_spec, generator_rows, java_child, read_sink,
                                 source_runner_pids, spec_params, submit, wait_for_sink,
                                 wait_running, wait_until, window_oracle)

log = logging.getLogger("tests.patterns")
SECOND = timedelta(seconds=1)
WINDOW_KEY = ("window_start", "window_end", "sensor", "readings")
READING_KEY = ("sensor", "ts", "temp", "humidity")


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
