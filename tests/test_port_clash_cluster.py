"""Two deployments on one machine whose agents offer the same ports (two `elastiq run`s that
used to share 31000-31999): the second's producer finds its channel port taken by the first's,
is relaunched on another port from the offer, its consumers follow it, and both three-task
queries complete exactly (sinks against the plain-Python oracle). Real processes, sockets and
Spark; one agent per stack to keep it lean."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from testkit.e2e_support import (compile_spec, disjoint_port_ranges, hurry, start_stack,
                                 stop_query, stop_stack, submit, wait_running)
from test_end_to_end import MULTI, check_multi_sinks

log = logging.getLogger(__name__)
pytestmark = [pytest.mark.cluster, pytest.mark.spark]


@pytest.mark.timeout(420)
def test_two_stacks_on_the_same_ports_both_complete_exactly(tmp_path: Path) -> None:
    shared = disjoint_port_ranges(1)  # both stacks' agents offer exactly these ports
    first = start_stack(tmp_path / "a", cpus_per_agent=4.0, agents=1, spark_cores=1,
                        port_ranges=shared)
    second = None
    try:
        second = start_stack(tmp_path / "b", cpus_per_agent=4.0, agents=1, spark_cores=1,
                             port_ranges=shared)
        q1 = compile_spec(MULTI, tmp_path / "a-out", "clash-a")
        submit(first, q1)
        wait_running(first, q1.query_id, timeout=180)
        taken = {t["endpoints"][f"{q1.query_id}/trades"].rsplit(":", 1)[1]
                 for t in first.status(q1.query_id)["tasks"]}
        q2 = compile_spec(MULTI, tmp_path / "b-out", "clash-b")
        submit(second, q2)
        view = wait_running(second, q2.query_id, timeout=180)
        producer = next(t for t in view["tasks"] if t["task_id"] == f"{q2.query_id}.t0")
        assert "[port in use]" in producer["last_failure"], producer
        assert producer["endpoints"][f"{q2.query_id}/trades"].rsplit(":", 1)[1] not in taken
        for stack, query in ((first, q1), (second, q2)):  # the clash is behind: no more pacing
            hurry(stack, query.query_id, "ticks")
        for stack, query, out in ((first, q1, "a-out"), (second, q2, "b-out")):
            check_multi_sinks(tmp_path / out, MULTI, timeout=180)
            assert stack.status(query.query_id)["phase"] == "active"
            stop_query(stack, query.query_id)
    finally:
        for stack in (second, first):
            if stack is not None and stop_stack(stack):
                log.warning("port clash test: leftover executor processes killed")
