"""Bounded waiting for the tests and benchmarks: poll a check until it holds, never longer than
a timeout; the one polling loop (`e2e_support.wait_until` is its spelling with a diff)."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0,
             step: float = 0.1, detail: Callable[[], str] | None = None) -> Any:
    """Poll `check` every `step` seconds until it returns something truthy and return that;
    bounded in time and in count; fail naming `what` otherwise, with `detail()` (e.g. expected
    against actual) when given."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / step) + 1):
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            break
        time.sleep(step)
    more = f"\n{detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{more}")
