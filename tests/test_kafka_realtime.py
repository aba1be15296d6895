"""A task in Spark's real-time mode against a real broker (layer 3): kafka-source -> filter ->
project -> kafka-sink, at least once, built JVM-only (`executor.kafka_realtime`).

One query, one test (a query start costs seconds): the output topic against a plain-Python
oracle over the produced records (at least once: every expected record present, nothing
unexpected; a repeat of an expected record would be a duplicate, allowed by the guarantee and
reported), hostile records (not JSON, wrong types, a tombstone, bytes that are not UTF-8, a
value of 300 kB, deep nesting) dropped and counted while the rest flows, records whose text
looks like code passed through as data, and the fence: once a newer attempt raises it, the
driver stops the query and records produced after that are not written. A second test stops a
real-time task mid-run and starts it again on its checkpoint: nothing missing.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from common.types import Schema
from tests.kafka_support import (create_topic, kafka_parts_missing,
                                 kafka_required, produce, read_committed, temp_topic)
from testkit.waiting import wait_for

pytestmark = [pytest.mark.spark, kafka_required()]
__all__ = ["kafka_parts_missing"]

READING = Schema.of(("sensor", "string"), ("temp", "double"), ("part", "int"))
OUT = Schema.of(("sensor", "string"), ("hot", "double"))

HOSTILE = [b"not json", b"[1,2]", b'"just a string"', b"null", b'{"sensor":"s1","temp":"warm"}',
           b'{"sensor":"s1","temp":1.5e400x}', b"\xff\xfe\x00garbage",
           b'{"sensor":"' + b"A" * 300_000 + b'","temp":"hot"}', b"[" * 5000 + b"]" * 5000,
           b'{"sensor":"s1","temp":true}']
AS_DATA = [b'{"sensor":"${jndi:ldap://127.0.0.1/x}","temp":45.0}',
           b'{"sensor":"__import__(\'os\').system(\'touch /tmp/elastiq-pwned\')","temp":50.0}',
           b'{"sensor":"\\u0000\\n<script>","temp":31.5}']


def readings(n: int, seed: int) -> list[bytes]:
    return [json.dumps({"sensor": f"s{(i * 7 + seed) % 5}",
                        "temp": float((i * 37 + seed) % 60)}).encode() for i in range(n)]


def oracle(values: list[bytes | None]) -> Counter:
    """Plain Python: each value that is a JSON object with a string sensor and a number temp
    (not a bool) above 30, as (sensor, temp + 1.0)."""
    out: Counter = Counter()
    for value in values:
        try:
            row = json.loads(value) if value is not None else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if not isinstance(row, dict) or not isinstance(row.get("sensor"), str):
            continue
        temp = row.get("temp")
        if isinstance(temp, (int, float)) and not isinstance(temp, bool) and temp > 30:
            out[(row["sensor"], float(temp) + 1.0)] += 1
    return out


def seen(records: list[tuple[bytes | None, bytes]]) -> Counter:
    return Counter((json.loads(v)["sensor"], json.loads(v)["hot"]) for _, v in records)


def test_real_time_task_matches_the_oracle_counts_bad_records_and_stops_when_fenced(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    from executor.fencing import Fence

    source, out = temp_topic("rtin"), temp_topic("rtout")
    create_topic(kafka_broker, source, partitions=2)
    create_topic(kafka_broker, out)
    good = readings(400, 5)
    values: list[bytes | None] = good[:200] + HOSTILE + AS_DATA + [None] + good[200:]
    ck = tmp_path / "ck"
    Fence(str(ck), 1, "attempt-1").raise_()
    rt = _real_time_task(spark, kafka_broker, source, out, ck, task_id="rt1",
                         fence=Fence(str(ck), 1, "attempt-1"), key_column="sensor")
    try:
        producer_values = [v for v in values if v is not None]
        produce(kafka_broker, source, producer_values)
        produce(kafka_broker, source, [b""])  # empty value: not a JSON object either
        _produce_tombstone(kafka_broker, source)
        expected = oracle(values)
        records = read_committed(kafka_broker, out, expect=sum(expected.values()), timeout=120)
        bad = len(HOSTILE) + 2  # + the empty value and the tombstone
        wait_for(f"{bad} dropped records counted", lambda: rt.dropped_records() >= bad,
                 timeout=60)
        assert rt.dropped_records() == bad
        assert rt.query is not None and rt.query.isActive, rt.query.exception()

        Fence(str(ck), 2, "attempt-2").raise_()  # a newer attempt took the task over
        wait_for("the fenced query stopped", lambda: not rt.query.isActive, timeout=30)
        produce(kafka_broker, source, readings(50, 9))
        after = read_committed(kafka_broker, out, expect=len(records) + 1, timeout=5)
    finally:
        rt.stop()
    got = seen(records)
    assert not (expected - got), f"missing: {expected - got}"
    assert set(got) == set(expected), f"unexpected: {set(got) - set(expected)}"
    duplicates = sum((got - expected).values())
    assert duplicates == 0, f"{duplicates} duplicates in a run without a restart"
    assert all(k == json.loads(v)["sensor"].encode() for k, v in records)
    assert len(after) == len(records), "the fenced attempt wrote after the fence was raised"
    assert not Path("/tmp/elastiq-pwned").exists()


def _produce_tombstone(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, None, key=b"gone")
    assert producer.flush(30) == 0


def _real_time_task(spark: Any, bootstrap: str, source: str, out: str, ck: Path,
                    task_id: str = "rt2", fence: Any = None, key_column: str | None = None) -> Any:
    """Kafka -> filter `temp > 30` -> project -> Kafka, at least once, in real-time mode."""
    from executor.runtime import TaskRuntime

    rt = TaskRuntime(spark, query_id="q", task_id=task_id, checkpoint_dir=str(ck), fence=fence)
    rt.real_time_mode(checkpoint_interval="5 seconds")
    rt.kafka_source(op="src", output="raw", schema=READING, bootstrap=bootstrap,
                    topics=(source,), starting_offsets="earliest", format="jsonl",
                    metadata=(("partition", "part"),))
    rt.filter(op="hot", input="raw", output="warm", condition="raw.temp > 30")
    rt.project(op="p", input="warm", output="res",
               fields=(("sensor", "warm.sensor"), ("hot", "warm.temp + 1")))
    rt.kafka_sink(op="out", input="res", bootstrap=bootstrap, topic=out, format="jsonl",
                  delivery="at-least-once", key_column=key_column)
    return rt


def test_a_stopped_real_time_task_resumes_from_its_checkpoint_at_least_once(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    """Stopped mid-run (between two checkpoint intervals) and started again on its checkpoint:
    every expected record is in the topic; records after the last checkpoint may come twice."""
    source, out = temp_topic("rsin"), temp_topic("rsout")
    create_topic(kafka_broker, source, partitions=2)
    create_topic(kafka_broker, out)
    first, second = readings(300, 11), readings(300, 12)
    rt = _real_time_task(spark, kafka_broker, source, out, tmp_path / "ck")
    try:
        produce(kafka_broker, source, first)
        read_committed(kafka_broker, out, expect=sum(oracle(first).values()), timeout=120,
                       settle=0)
        wait_for("a checkpoint interval ended", lambda: rt.query.lastProgress, timeout=60)
    finally:
        rt.stop()
    produce(kafka_broker, source, second)  # while no query runs
    rt = _real_time_task(spark, kafka_broker, source, out, tmp_path / "ck")
    try:
        expected = oracle(first + second)
        records = read_committed(kafka_broker, out, expect=sum(expected.values()),
                                 timeout=120, settle=2.0)
    finally:
        rt.stop()
    got = seen(records)
    assert not (expected - got), f"missing: {sum((expected - got).values())}"
    assert set(got) == set(expected), f"unexpected: {set(got) - set(expected)}"
