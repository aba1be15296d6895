"""A move made by the load distributor on the embedded cluster (issue 32): real executors with
Spark, real channels, heartbeats and the migration protocol; the real-executor counterpart of
tests/test_distribution_state.py.

Two agents of 1.65 cpus; one query, `distribute="true"`, of four equal chains (generator ->
project with a heavy field -> filter -> file sink; benchmarks/distribution.py's query at steady
rates), each one task of 0.5 cpus: gang first fit puts three of them on one agent (with the
executor's 0.1, 1.6 cpus) and the fourth on the other. The scheduler runs with small but
ordinary `DistributionSettings` (a round every 5 s, 3 slots of 5 s of history, threshold 0.1
CPU s/s): once the tasks have their history, the agent with three tasks carries about three
times the load of the other, and the distributor moves one of its tasks there (one move narrows
the gap from about twice a task's load to about none; a second would widen it again). The test
waits until the decision is `move`, the task it names runs on the other agent and the move is
counted in `/metrics`, then makes the generators finish and compares every sink with a
plain-Python oracle: nothing lost, nothing twice.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from scheduler.distributor import DistributionSettings
from testkit import distribution_support as bench
from testkit.e2e_support import (Stack, module_stack, stop_query, submit, wait_for_sink,
                                 wait_running, wait_until)

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(300)]

QUERY = "e2e-distribute"
# 180 s of input at the spec's rate; `set_rates` hurries the rest once the move is behind. The
# move came 21 s after the submit in a run alone, and the whole test took 135 s in a CI run
# under load; 300 s of input (60,000 rows a chain, until 2026-11-30) left ~56,000 rows a chain
# to process after the move, most of the test's time, and proved nothing more
RATE, LIMIT, FIELDS = 200.0, 36000, 1
SETTINGS = DistributionSettings(period_seconds=5.0, threshold=0.1, min_slots=3)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from module_stack(tmp_path_factory.mktemp("distribution"),
                            "test_distribution_cluster.py", cpus_per_agent=1.65,
                            distribution=SETTINGS)


def metric(stack: Stack, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"{stack.api.url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"{name}{{") and all(p in line for p in labels.split(",")))


def distribution(stack: Stack) -> dict[str, Any]:
    return stack.service.status().get("distribution") or {}


def test_the_distributor_moves_a_task_of_the_busy_agent_and_loses_nothing(
        stack: Stack, tmp_path: Path) -> None:
    from compiler.pipeline import compile_spec_text

    query = compile_spec_text(bench.spec(QUERY, RATE, LIMIT, FIELDS).encode(),
                              str(tmp_path / f"{QUERY}.xml"), base_dir=tmp_path,
                              query_id=QUERY).query
    assert query.distribute
    submit(stack, query)
    try:
        wait_running(stack, QUERY, timeout=180)
        first = {t: v["agent_id"] for t, v in stack.tasks(QUERY).items()}
        per_agent = Counter(first.values())
        assert sorted(per_agent.values()) == [1, 3], first  # first fit: three, then one
        busy = next(a for a, n in per_agent.items() if n == 3)
        idle = next(a for a, n in per_agent.items() if n == 1)

        def moved() -> dict[str, Any] | None:
            view = distribution(stack)
            started = [m for m in view.get("recent", []) if m["started"]]
            return view if started else None

        view = wait_until(moved, 150, "the distributor's first move",
                          lambda: json.dumps(distribution(stack), indent=1, default=str))
        (move,) = [m for m in view["recent"] if m["started"]]
        task = move["task"]
        assert (move["query_id"], move["from"], move["to"]) == (QUERY, busy, idle), view
        assert first[task] == busy, (task, first)
        decision = view["decision"]
        assert decision["kind"] == "move" and f"{task} {busy} -> {idle}" in \
            decision["explanation"], decision
        means = decision["mean_loads"]
        assert means[busy] > means[idle] + SETTINGS.threshold, decision
        # the decision states the busiest agent's peak before and after its moves; which is
        # lower over 3 slots of 5 s is noise on a loaded machine (0.412 -> 0.445 and 0.376 ->
        # 0.388 seen in CI-like runs of 2026-11-30), so only their presence is checked here:
        # that the chosen move lowers the peak is tests/test_distributor.py's, on clean series
        assert decision["peak_before"] > 0 and decision["peak_after"] > 0, decision
        assert f"peak {decision['peak_before']:.3f} -> {decision['peak_after']:.3f}" in \
            decision["explanation"], decision
        wait_until(lambda: (t := stack.tasks(QUERY)[task])["state"] == "running"
                   and t["agent_id"] == idle, 120, f"{task} running on {idle}",
                   lambda: json.dumps(stack.tasks(QUERY)[task], default=str))
        assert metric(stack, "elastiq_distribution_moves_total",
                      f'query="{QUERY}",outcome="started"') == 1
        # every other task stayed where first fit put it, and nothing else restarted
        now = stack.tasks(QUERY)
        assert {t: v["agent_id"] for t, v in now.items() if t != task} == \
            {t: a for t, a in first.items() if t != task}, now
        assert distribution(stack)["moves"] == 1

        bench.set_rates(stack, QUERY, {f"g{c}": 20000.0 for c in range(bench.CHAINS)})
        for c, path in enumerate(bench.sink_paths(tmp_path)):
            wait_for_sink(path, bench.oracle(RATE, LIMIT, FIELDS, c),
                          lambda r: bench.sink_key(r, FIELDS), 180,
                          f"sink {c} to equal the oracle")
        assert distribution(stack)["moves"] == 1  # the pair cools down: no second move
    finally:
        stop_query(stack, QUERY)
