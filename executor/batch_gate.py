"""The batch boundary of a running task, where control tuples take effect.

Owns `BatchGate`, which every sink of a task's query passes through (`TaskRuntime` wraps the
sink's foreachBatch function). For a change the running query can take (a sink's destination or
routing), `switch()` applies it between two sink calls and tells the first micro-batch that has
it. For a change that needs a new query, `drain()` lets the micro-batch in flight finish and
`close()` waits until no batch is being written, then refuses every later batch (it fails
before writing anything, so Spark runs it again in the next run of the query, which carries the
new parameters). Also owns `next_batch_id`, which reads Spark's offset and commit logs to tell
which micro-batch comes next: the epoch a change is acknowledged with, and `await_commit`, which
waits for Spark to commit a written batch. Each sink call runs inside the gate's guard, the
task attempt's fence (`executor.fencing`): a stale attempt's batch fails before it writes, so
Spark never commits it. Does not own stopping or rebuilding the query (`executor.task_runner`).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class GateClosed(RuntimeError):
    """A batch reached a task whose query is being rebuilt with new parameters; it runs again
    in the next run of the query."""


class BatchGate:
    """Brackets each sink call; `close` makes the current batch the last one written."""

    def __init__(self, guard: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
        # what each sink call runs inside: the attempt's fence (`executor.fencing`), which
        # refuses the call before it writes once a newer attempt of the task owns the checkpoint
        self._guard = guard
        self._cond = threading.Condition()
        self._writing: int | None = None  # the batch being written
        self._closed = False
        self.last_written: int | None = None  # the last batch the sink returned from

    def wrap(self, sink: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        def gated(df: Any, batch_id: int) -> None:
            self._enter(batch_id)
            try:
                with self._guard():
                    sink(df, batch_id)
            except BaseException:
                self._leave(None)
                raise
            self._leave(batch_id)
        return gated

    def _enter(self, batch_id: int) -> None:
        with self._cond:
            if self._closed:
                raise GateClosed(f"batch {batch_id} arrived while the task is being "
                                 "reconfigured; it runs again with the new parameters")
            self._writing = batch_id

    def _leave(self, written: int | None) -> None:
        with self._cond:
            self._writing = None
            if written is not None:
                self.last_written = written
            self._cond.notify_all()

    def drain(self, busy: Callable[[], bool], timeout: float, poll: float = 0.02) -> bool:
        """Let the micro-batch in flight (`busy()`: Spark's trigger is active) finish and be
        written, so its work is not thrown away; True when none is in flight any more, False
        after `timeout` s (the caller then interrupts it and Spark runs it again)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            written = self.last_written
        while busy():
            with self._cond:
                if self.last_written != written and self._writing is None:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(poll, left))
        return True

    def switch(self, apply: Callable[[], T], spark_checkpoint: str, timeout: float,
               alive: Callable[[], bool] = lambda: True) -> tuple[T, int]:
        """Run `apply` between two sink calls and return its result with the first micro-batch
        whose sink call comes after it (the epoch). Waits (at most `timeout` s in all) for a
        sink call in progress to return and for Spark to commit the batch it wrote: a batch
        written but not committed runs again after a failure, and must not meet the new values.
        No sink call starts meanwhile. TimeoutError (nothing applied) if either takes longer or
        the query stops being `alive()` before that commit."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._writing is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"batch {self._writing} was still being written after "
                                       f"{timeout} s")
                self._cond.wait(left)
            written = self.last_written
            # holding the lock while waiting: Spark commits without a sink call
            if not await_commit(spark_checkpoint, written, deadline, alive):
                raise TimeoutError(f"batch {written} was written but not committed (waited "
                                   f"up to {timeout} s while the query ran)")
            return apply(), next_batch_id(spark_checkpoint, written)

    def close(self, timeout: float) -> bool:
        """Refuse later batches and wait (at most `timeout` s) for the one being written;
        False if it was still being written when the time was up."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            while self._writing is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


def _ids(folder: str) -> list[int]:
    try:
        return [int(name) for name in os.listdir(folder) if name.isdigit()]
    except FileNotFoundError:
        return []


def next_batch_id(spark_checkpoint: str, last_written: int | None = None) -> int:
    """The micro-batch a query started on `spark_checkpoint` runs first: the last planned one
    if it was not committed (Spark runs it again), else the one after the last commit; never at
    or before `last_written` (a batch the sink wrote but Spark had not yet committed is skipped
    by the sinks on its re-run, so its output is the old parameters')."""
    planned = _ids(os.path.join(spark_checkpoint, "offsets"))
    committed = _ids(os.path.join(spark_checkpoint, "commits"))
    last_planned = max(planned, default=-1)
    last_committed = max(committed, default=-1)
    following = last_planned if last_planned > last_committed else last_committed + 1
    if last_written is not None:
        following = max(following, last_written + 1)
    return following


def await_commit(spark_checkpoint: str, written: int | None, deadline: float,
                 alive: Callable[[], bool] = lambda: True) -> bool:
    """Wait until Spark has committed batch `written` (None: nothing to wait for); False if the
    monotonic `deadline` passed or the query stopped being `alive()` first."""
    while written is not None and next_batch_id(spark_checkpoint) <= written:
        if time.monotonic() > deadline or not alive():
            return False
        time.sleep(0.002)
    return True
