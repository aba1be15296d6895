"""The exactly-once Kafka sink rides through a broker SIGKILLed mid-transaction (layer 3).

A real KRaft broker of this test's own is SIGKILLed while the sink's transaction for a batch is
open, and started again on its data dir and port. librdkafka's `send_offsets_to_transaction`
of that transaction never returns (measured: still waiting minutes later), so the sink gives the
call up after its stall bound and writes the batch again with a fresh producer, whose
`init_transactions` fences the stuck one. The batch call must return, not fail the task, and
the topic read `read_committed` must hold every batch once. A broker that stays away fails the
batch, in bounded time, with the stall and the fresh producer's failure both named.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_support import (Batch, create_topic, kafka_parts_missing, kafka_required,
                                 own_broker, read_committed, temp_topic)
from testkit.waiting import wait_for

pytestmark = [kafka_required()]
__all__ = ["kafka_parts_missing", "own_broker"]

STALL_S = 6.0  # the sink's bound on a transactional call, short for the test
CLIENT_S = 10.0  # a client call's own bound (the fresh producer's init), short for the test


def _batch(*sensors: str) -> Batch:
    return Batch([{"sensor": s, "temp": 0.0} for s in sensors])


def test_a_batch_open_when_the_broker_is_killed_is_written_once_after_it_returns(
        own_broker: Any, tmp_path: Path) -> None:
    from executor.kafka_io import KafkaSink

    topic = temp_topic("stall")
    create_topic(own_broker.bootstrap, topic, partitions=2)
    sink = KafkaSink("t", bootstrap=own_broker.bootstrap, topic=topic, fmt="jsonl",
                     key_column=None, exactly_once=True, transactional_id=f"tx-{topic}",
                     run_id=lambda: "run-1", stall_s=STALL_S)
    outcome: dict[str, Any] = {}

    def second_batch() -> None:
        try:
            sink(_batch("b1", "b2"), 1)
            outcome["returned"] = True
        except Exception as exc:  # the test's failure, said below
            outcome["error"] = exc

    try:
        sink(_batch("a1", "a2"), 0)
        own_broker.kill()
        writer = threading.Thread(target=second_batch, daemon=True)
        writer.start()  # its transaction opens while the broker is away
        own_broker.restart()
        wait_for("the batch call to end", lambda: bool(outcome), timeout=180, step=0.1)
        assert "error" not in outcome, f"the batch failed: {outcome.get('error')!r}"
        sink(_batch("c1"), 2)
        records = read_committed(own_broker.bootstrap, topic, expect=5, timeout=60, settle=2.0)
    finally:
        sink.close()
    assert sorted(json.loads(v)["sensor"] for _, v in records) == ["a1", "a2", "b1", "b2", "c1"]


def test_a_broker_that_stays_away_fails_the_batch_with_both_reasons(own_broker: Any) -> None:
    import time

    from executor.kafka_io import KafkaStalled, KafkaUnavailable, KafkaSink

    topic = temp_topic("away")
    create_topic(own_broker.bootstrap, topic, partitions=1)
    sink = KafkaSink("t", bootstrap=own_broker.bootstrap, topic=topic, fmt="jsonl",
                     key_column=None, exactly_once=True, transactional_id=f"tx-{topic}",
                     run_id=lambda: "run-1", stall_s=STALL_S, client_timeout_s=CLIENT_S)
    try:
        sink(_batch("a1"), 0)
        own_broker.kill()
        started = time.monotonic()
        with pytest.raises(KafkaUnavailable) as failed:
            sink(_batch("b1"), 1)
        took = time.monotonic() - started
    finally:
        sink.close()
    said = str(failed.value)
    assert not isinstance(failed.value, KafkaStalled), said
    assert "did not complete the mark of batch 1" in said, said
    assert "a fresh producer could not start" in said and "retried from its checkpoint" in said
    assert took < STALL_S + CLIENT_S + 30, f"the batch failed after {took:.0f} s"
