"""Spark layer, what a running task reports: `TaskRunner.metrics()` read from a real query in the
shared session. The figure checked here is the running micro-batch's time (`running_ms`): seen
above 0 while a batch runs, already in the query's first batch (before any progress report, so
the policy sees a starting instance at work), and never more than that batch's own duration
once it ends (the busy time it then adds), so the elastic policy's busy fractions never count
time that was not spent in a batch."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from test_control_runtime import task_runner

pytestmark = pytest.mark.spark


def test_the_running_batch_is_reported_and_never_outlasts_the_batch_it_times(
        spark: Any, tmp_path: Path) -> None:
    runner = task_runner(spark, tmp_path, "metrics")  # a paced generator -> filter -> sink
    seen: list[tuple[int, int]] = []  # (busy ms of the finished batches, running ms), running
    first_batch = 0  # the longest running_ms seen before the first batch with data ended
    # read from before the query starts: start() returns once its sources are up, and on a
    # loaded machine the first micro-batch may have ended by then
    failed: list[BaseException] = []

    def start() -> None:
        try:
            runner.start()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failed.append(exc)

    starting = threading.Thread(target=start, name="start-metrics-runner")
    try:
        starting.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len({busy for busy, _ in seen}) < 3:
            metrics = runner.metrics()
            if metrics is not None and metrics.running_ms > 0:
                seen.append((metrics.busy_ms, metrics.running_ms))
                if metrics.batches_ended == 0:  # (a trigger without data may have reported)
                    assert metrics.tuples_in == 0
                    first_batch = max(first_batch, metrics.running_ms)
            time.sleep(0.01)
        starting.join(timeout=max(1.0, deadline - time.monotonic()))
        assert not starting.is_alive() and not failed, f"the task's start failed: {failed}"
        assert first_batch > 0, "the first micro-batch was never seen running"
        assert len({busy for busy, _ in seen}) >= 3, \
            f"saw a batch running in fewer than 3 batches within 120 s: {seen}"
        final = None
        while time.monotonic() < deadline + 60:
            metrics = runner.metrics()
            if metrics is not None and metrics.busy_ms > max(busy for busy, _ in seen):
                final = metrics.busy_ms
                break
            time.sleep(0.05)
        assert final is not None, "the last batch seen running never ended"
    finally:
        starting.join(timeout=60)
        runner.stop()
    for busy, running in seen:
        ended = [b for b, _ in seen if b > busy] + [final]
        # the batch seen running added its whole duration to the busy time when it ended
        assert min(ended) - busy >= running, (busy, running, seen)
