"""Helpers the rescaling tests on the embedded cluster share (tests/test_elastic_cluster.py and
tests/test_elastic_window_cluster.py): a <generator> operator for their specs, an elastic
operator's view in the query status (its slots and rescales), whether a rescale has settled,
and rescaling a running stateful operator 1 -> 3 -> 2 step by step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from testkit.e2e_support import Stack, read_sink, wait_until


def generator(name: str, params: dict[str, str], output: str) -> str:
    """A <generator> operator of a test spec."""
    body = "".join(f'<param name="{k}" value="{v}"/>' for k, v in params.items())
    return (f'  <operator name="{name}" type="generator">\n    {body}\n'
            f'    <output name="{output}"/>\n  </operator>')


def elastic_view(stack: Stack, query_id: str, operator: str) -> dict[str, Any]:
    return next(e for e in stack.status(query_id)["elastic"] if e["operator"] == operator)


def slot_states(stack: Stack, query_id: str, operator: str = "keep") -> list[str]:
    return [s["state"] for s in elastic_view(stack, query_id, operator)["slots"]]


def settled(stack: Stack, query_id: str, n: int, operator: str = "keep") -> bool:
    """n slots run, the rest are dormant, and the last rescale to n is applied (a scale-out's
    splitters switch only once its new instances run, so the slots settle first)."""
    states = slot_states(stack, query_id, operator)
    rescales = elastic_view(stack, query_id, operator)["rescales"]
    applied = not rescales or (rescales[-1]["to"] == n and rescales[-1]["state"] == "applied")
    return applied and states[:n] == ["running"] * n and all(s == "dormant" for s in states[n:])


def rows_in(stack: Stack, query_id: str, task_id: str) -> float:
    return stack.tasks(query_id)[task_id]["figures"].get("tuples_in", 0.0)


# A step may include an executor SIGKILL and the relaunch of the retiring instance, which then
# drains: on a loaded 2-core machine its new SparkSession alone took 83 s (CI, 2026-11-27), and
# the step ran out of 240 s there.
SETTLE_SECONDS = 420


def scale_one_three_two(stack: Stack, qid: str, operator: str, sink: Path, what: str,
                         during: Callable[[int], None] | None = None) -> list[int]:
    """Rescale a running stateful `operator` 1 -> 3 -> 2 by command (`during(n)` runs while
    the step to n is applied), each step settled with its pause measured (its figures are
    benchmarks/, not timed here) and followed by new `what` in the sink; the switch times, each
    later than the one before. The two steps cover every case a key meets: 1 -> 3 moves keys
    from the one instance to new ones; 3 -> 2 (instance of a row: its key's hash modulo the
    instances running) retires one and moves keys between the two that stay, so an instance
    both gives keys away and takes others at one switch. A further 2 -> 1 (the tests' earlier
    last step) only retired one again, as 3 -> 2 does, and took ~15-25 s a test."""
    client = stack.client()
    switches = []
    for n in (3, 2):
        reply = client.scale(qid, operator, n)
        assert reply["request"], reply
        if during is not None:
            during(n)
        wait_until(lambda n=n: settled(stack, qid, n, operator), SETTLE_SECONDS,
                   f"{operator} to run {n} instances",
                   lambda: f"{elastic_view(stack, qid, operator)}\n" + "\n".join(
                       f"{t}: {v['state']} attempt {v['attempt']} {v['figures']}"
                       for t, v in sorted(stack.tasks(qid).items())))
        rescale = elastic_view(stack, qid, operator)["rescales"][-1]
        assert rescale["state"] == "applied" and rescale["switch_ms"] > 0, rescale
        assert rescale["pause_s"] is not None, rescale
        switches.append(rescale["switch_ms"])
        have = len(read_sink(sink))
        wait_until(lambda h=have: len(read_sink(sink)) > h + 10, 120,
                   f"{what} after the rescale to {n}")
    assert all(a < b for a, b in zip(switches, switches[1:])), switches
    return switches
