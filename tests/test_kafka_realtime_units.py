"""The real-time task's own logic without Spark (pure, `executor.kafka_realtime`): dropped
records summed over progress reports once per batch, the corrupt-record column never taking a
declared name, and the fence watch stopping the query once (and only once) it is superseded."""

from __future__ import annotations

import threading
from typing import Any

from common.types import Schema
from executor.kafka_realtime import (BAD_METRIC, UNPARSED, BadRecords, FenceWatch,
                                     parse_options, unparsed_column)
from testkit.waiting import wait_for


def progress(run: str, batch: int, bad: int | None, records: int = 10) -> dict[str, Any]:
    observed = {} if bad is None else {BAD_METRIC: {"bad": bad, "records": records}}
    return {"runId": run, "batchId": batch, "observedMetrics": observed}


def test_bad_records_are_summed_once_per_batch_and_run() -> None:
    counts = BadRecords()
    assert counts.add([progress("r1", 0, 2), progress("r1", 1, 0)]) == 2
    # the same reports again (recentProgress keeps the last ones), one new, one without metrics
    assert counts.add([progress("r1", 0, 2), progress("r1", 1, 0), progress("r1", 2, 3),
                       progress("r1", 3, None)]) == 5
    assert counts.add([progress("r2", 0, 1)]) == 6  # a restarted query numbers batches anew
    assert counts.records == 40


def test_the_corrupt_record_column_never_takes_a_declared_name() -> None:
    assert unparsed_column(Schema.of(("sensor", "string"))) == UNPARSED
    taken = Schema.of((UNPARSED, "string"), (UNPARSED + "_", "int"))
    assert unparsed_column(taken) == UNPARSED + "__"
    assert parse_options("c") == {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "c"}


def test_the_fence_watch_stops_the_query_once_superseded() -> None:
    superseded = threading.Event()
    stops: list[int] = []
    watch = FenceWatch(superseded.is_set, lambda: stops.append(1), poll_s=0.01)
    try:
        assert not watch.fenced and not stops
        superseded.set()
        wait_for("the query stopped", lambda: stops, timeout=10)
        assert watch.fenced
    finally:
        watch.close()
    assert stops == [1]


def test_a_watch_closed_before_its_fence_moves_stops_nothing() -> None:
    stops: list[int] = []
    watch = FenceWatch(lambda: False, lambda: stops.append(1), poll_s=0.01)
    watch.close()
    assert not watch.fenced and stops == []
