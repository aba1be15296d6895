"""Helpers for the runtime tests: reading generated input in plain Python, waiting (bounded) for a
query to drain a finite source, and reading a jsonl sink back (`e2e_support.read_sink`)."""

from __future__ import annotations

import re
from typing import Any

from testkit import waiting
from testkit.e2e_support import read_sink
from testkit.spark_processes import caught_up
from executor import shapes

__all__ = ["START", "input_rows", "read_sink", "wait_drained", "wait_for"]

START = "2024-01-01T00:00:00Z"


def input_rows(shape: str, seed: int, rate: float, limit: int) -> list[dict[str, Any]]:
    """The generator's rows computed by the plain-Python reference (not the Spark path)."""
    s = shapes.shape_named(shape)
    start_us = shapes.parse_start(START)
    return [shapes.reference_row(s, seed, start_us, rate, i) for i in range(limit)]


def _offset(value: Any) -> int | None:
    """Our offsets hold one sequence number; progress shows them as JSON or as a dict repr."""
    found = re.search(r"-?\d+", str(value)) if value is not None else None
    return int(found.group()) if found else None


def drained(query: Any, limits: list[int]) -> bool:
    """All sources have reached their limits and the query has caught up with them
    (`spark_processes.caught_up`)."""
    progress = query.lastProgress
    if not progress:
        return False
    ends = sorted(_offset(s["endOffset"]) or 0 for s in progress["sources"])
    return ends == sorted(limits) and caught_up(query)


def wait_drained(query: Any, limits: list[int], timeout: float = 60.0) -> None:
    """Bounded wait until `drained` holds twice, 1 s apart (no-data batches have run)."""
    streak = 0

    def twice() -> bool:
        nonlocal streak
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        streak = streak + 1 if drained(query, limits) else 0
        return streak >= 2

    if not waiting.poll(twice, timeout, 1.0):
        raise AssertionError(f"query did not drain {limits} within {timeout} s: "
                             f"{query.lastProgress}")


def wait_for(predicate: Any, timeout: float, what: str, step: float = 0.2) -> None:
    """`testkit.waiting.wait_for` in the runtime tests' argument order."""
    waiting.wait_for(what, predicate, timeout, step)
