"""Instances of a partitioned filter each reading their own Kafka partitions, against a real
broker and real Spark (layer 3): a topic of 4 partitions, two instance tasks (share 1 and 2 of
2, as `compiler.kafka_partitions` compiles them) each kafka-source -> filter -> exactly-once
kafka-sink. Each instance's output carries the Kafka partition of every row, so the test sees
that it read only its block; the union read `read_committed` equals a plain-Python oracle. A
topic with fewer partitions than instances is refused at the task's start, located, not a hang.
Runs under the heavy lock (Spark)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from common.types import Schema
from tests.kafka_support import (create_topic, hot, kafka_parts_missing,
                                 kafka_required, produce, read_committed, readings, temp_topic)

pytestmark = [pytest.mark.spark, kafka_required()]
__all__ = ["kafka_parts_missing"]

READING = Schema.of(("sensor", "string"), ("temp", "double"), ("part", "int"))


def _instance(spark: Any, bootstrap: str, source: str, out: str, share: int,
              ck: Path) -> Any:
    from executor.runtime import TaskRuntime

    rt = TaskRuntime(spark, query_id="kp", task_id=f"kp.t{share}", checkpoint_dir=str(ck))
    rt.kafka_source(op=f"src_{share}", output="raw", schema=READING, bootstrap=bootstrap,
                    topics=(source,), starting_offsets="earliest", format="jsonl",
                    metadata=(("partition", "part"),), share=share, shares=2)
    rt.filter(op=f"hot_{share}", input="raw", output="hot", condition="raw.temp > 30")
    rt.kafka_sink(op="out", input="hot", bootstrap=bootstrap, topic=out, format="jsonl",
                  delivery="exactly-once", key_column="sensor")
    return rt


def _produce_by_partition(bootstrap: str, topic: str, rows: list[dict[str, Any]]) -> None:
    for p in range(4):  # partition p holds rows p, p+4, ...: its own readings
        produce(bootstrap, topic, [json.dumps(r).encode() for r in rows[p::4]], partition=p)


def _run(spark: Any, bootstrap: str, source: str, outs: list[str], tmp_path: Path,
         expect: list[int]) -> list[list[dict[str, Any]]]:
    """Both instances started (on their checkpoints, if any), each output topic read until it
    holds `expect[i]` records (then a settle), the instances stopped; the rows read."""
    runtimes = [_instance(spark, bootstrap, source, outs[i - 1], i, tmp_path / f"ck{i}")
                for i in (1, 2)]
    try:
        got = [read_committed(bootstrap, out, expect=n, timeout=120, settle=2.0)
               for out, n in zip(outs, expect)]
    finally:
        for rt in runtimes:
            rt.stop()
    return [[json.loads(v) for _, v in records] for records in got]


def test_two_instances_read_their_own_partitions_resume_and_the_output_is_exact(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    source, outs = temp_topic("parts"), [temp_topic("out1"), temp_topic("out2")]
    create_topic(kafka_broker, source, partitions=4)
    rows = readings(400, 3)
    _produce_by_partition(kafka_broker, source, rows)

    def expected_of(rows: list[dict[str, Any]]) -> list[int]:
        per = [sum(hot(rows[p::4]).values()) for p in range(4)]
        return [per[0] + per[1], per[2] + per[3]]

    started = time.monotonic()
    seen = _run(spark, kafka_broker, source, outs, tmp_path, expected_of(rows))
    print(f"two instances, 400 readings of 4 partitions: {time.monotonic() - started:.1f} s")
    assert {r["part"] for r in seen[0]} == {0, 1}, "instance 1 reads partitions 0-1 only"
    assert {r["part"] for r in seen[1]} == {2, 3}, "instance 2 reads partitions 2-3 only"
    for p in range(4):
        mine = seen[0] if p < 2 else seen[1]
        assert Counter((r["sensor"], r["temp"]) for r in mine if r["part"] == p) \
            == hot(rows[p::4])
    union = Counter((r["sensor"], r["temp"]) for records in seen for r in records)
    assert union == hot(rows)  # nothing missing, nothing twice
    pinned = json.loads((tmp_path / "ck2" / "kafka-share-src_2.json").read_text())
    assert pinned == [[source, p] for p in range(4)]
    # restarted on their checkpoints: each resumes its partitions where it committed
    more = readings(200, 11)
    _produce_by_partition(kafka_broker, source, more)
    again = _run(spark, kafka_broker, source, outs, tmp_path, expected_of(rows + more))
    assert {r["part"] for r in again[0]} == {0, 1} and {r["part"] for r in again[1]} == {2, 3}
    assert Counter((r["sensor"], r["temp"]) for records in again for r in records) \
        == hot(rows) + hot(more)


def test_fewer_partitions_than_instances_is_refused_at_start_with_the_reason(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    from executor.runtime import RuntimeSpecError, TaskRuntime

    source = temp_topic("few")
    create_topic(kafka_broker, source, partitions=2)
    rt = TaskRuntime(spark, query_id="kp", task_id="kp.t3", checkpoint_dir=str(tmp_path))
    started = time.monotonic()
    with pytest.raises(RuntimeSpecError) as refused:
        rt.kafka_source(op="src_3", output="raw", schema=READING, bootstrap=kafka_broker,
                        topics=(source,), starting_offsets="earliest", format="jsonl",
                        metadata=(("partition", "part"),), share=3, shares=3)
    assert time.monotonic() - started < 30
    text = str(refused.value)
    assert "src_3" in text and "instance 3 of 3" in text
    assert f"topic(s) {source} has 2 partition(s), fewer than the 3 instances" in text
    assert 'parallelism="2" or fewer' in text
