"""Bounded waiting for the tests and benchmarks: poll a check until it holds, never longer than
a timeout; the one polling loop (`poll`). `wait_for` fails when the time is up, for tests;
`poll` answers the last falsy result instead, for a benchmark that records the miss and goes on;
`e2e_support.wait_until` is `wait_for` with a diff. Each `wait_for` logs how long it waited
(logger `testkit.waiting`, INFO): where a slow test's time goes (`pytest --log-file=F
--log-file-level=INFO`)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

log = logging.getLogger(__name__)


def poll(check: Callable[[], Any], timeout: float, step: float = 0.1) -> Any:
    """Call `check` every `step` seconds until it returns something truthy and return that;
    bounded in time and in count: after `timeout` seconds, its last (falsy) result."""
    deadline = time.monotonic() + timeout
    result = None
    for _ in range(int(timeout / step) + 1):
        result = check()
        if result or time.monotonic() > deadline:
            break
        time.sleep(step)
    return result


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0,
             step: float = 0.1, detail: Callable[[], str] | None = None) -> Any:
    """Poll `check` every `step` seconds until it returns something truthy and return that;
    bounded in time and in count; fail naming `what` otherwise, with `detail()` (e.g. expected
    against actual) when given."""
    started = time.monotonic()
    result = poll(check, timeout, step)
    if result:
        log.info("waited %.1f s for %s", time.monotonic() - started, what)
        return result
    log.info("gave up after %.1f s waiting for %s", time.monotonic() - started, what)
    more = f"\n{detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{more}")
