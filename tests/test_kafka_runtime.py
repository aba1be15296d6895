"""kafka-source and kafka-sink in a real task query against a real broker (layer 3).

Source -> filter -> exactly-once sink compared with a plain-Python oracle over the produced
records, malformed records in the dead-letter file while the rest flows; the sink's protocol on
its own (a batch committed to Kafka before a crash is not written again by the next attempt,
and the older attempt's producer is fenced); and a SIGKILL of the process running the task,
after which a restart from the checkpoint leaves the output topic, read read_committed, equal
to the oracle: nothing missing, nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from common.types import Schema
from tests.kafka_support import (Batch, create_topic, got, hot, kafka_parts_missing,
                                 kafka_required, produce, read_committed, readings, temp_topic)
from testkit.waiting import wait_for

pytestmark = [pytest.mark.spark, kafka_required()]
__all__ = ["kafka_parts_missing"]

ROOT = Path(__file__).resolve().parent.parent
READING = Schema.of(("sensor", "string"), ("temp", "double"), ("part", "int"), ("off", "int"))


def test_source_filter_sink_is_exact_and_bad_records_go_to_the_dead_letter_file(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    from executor.runtime import TaskRuntime

    source, out = temp_topic("in"), temp_topic("out")
    create_topic(kafka_broker, source, partitions=2)
    rows = readings(300, 1)
    bad = [b"not json", b'{"sensor":"s1","temp":"warm"}', b"[1,2]"]
    values = [json.dumps(r).encode() for r in rows[:150]] + bad + \
        [json.dumps(r).encode() for r in rows[150:]]
    produce(kafka_broker, source, values, keys=[b"k%d" % (i % 3) for i in range(len(values))])
    dead = tmp_path / "dead.jsonl"
    rt = TaskRuntime(spark, query_id="q", task_id="k1", checkpoint_dir=str(tmp_path / "ck"))
    rt.kafka_source(op="src", output="raw", schema=READING, bootstrap=kafka_broker,
                    topics=(source,), starting_offsets="earliest", format="jsonl",
                    metadata=(("partition", "part"), ("offset", "off")), dead_letter=str(dead))
    rt.filter(op="hot", input="raw", output="hot", condition="raw.temp > 30")
    rt.kafka_sink(op="out", input="hot", bootstrap=kafka_broker, topic=out, format="jsonl",
                  delivery="exactly-once", key_column="sensor")
    try:
        expected = hot(rows)
        records = read_committed(kafka_broker, out, expect=sum(expected.values()), timeout=90)
    finally:
        rt.stop()
    assert getattr(rt.sink, "_producer", "absent") is None, \
        "a stopped task's Kafka sink holds no producer (its threads would outlive the task)"
    assert got(records) == expected
    assert all(k == json.loads(v)["sensor"].encode() for k, v in records)
    letters = [json.loads(line) for line in dead.read_text().splitlines()]
    assert sorted(letter["value"] for letter in letters) == sorted(b.decode() for b in bad)
    assert all(letter["topic"] == source and letter["reason"] for letter in letters)
    offsets = {(json.loads(v)["part"], json.loads(v)["off"]) for _, v in records}
    assert len(offsets) == len(records), "every output row comes from its own record"


def _sink(bootstrap: str, topic: str, run: str = "run-1") -> Any:
    from executor.kafka_io import KafkaSink

    return KafkaSink("t", bootstrap=bootstrap, topic=topic, fmt="jsonl", key_column=None,
                     exactly_once=True, transactional_id=f"tx-{topic}", run_id=lambda: run)


def test_a_batch_committed_before_a_crash_is_not_written_again(kafka_broker: str) -> None:
    topic = temp_topic("marks")
    first = _sink(kafka_broker, topic)
    first(Batch([{"sensor": "a", "temp": 1.0}]), 0)
    first(Batch([{"sensor": "b", "temp": 2.0}]), 1)
    # the process dies after Kafka committed batch 1 but before Spark did: Spark replays 1
    again = _sink(kafka_broker, topic)
    again(Batch([{"sensor": "b", "temp": 2.0}]), 1)
    again(Batch([{"sensor": "c", "temp": 3.0}]), 2)
    assert again.skipped_batches == 1
    # a new run (a fresh checkpoint numbers its batches from 0 again) is not skipped
    fresh = _sink(kafka_broker, topic, run="run-2")
    fresh(Batch([{"sensor": "d", "temp": 4.0}]), 0)
    values = [json.loads(v)["sensor"] for _, v in read_committed(kafka_broker, topic, expect=4)]
    assert values == ["a", "b", "c", "d"]


def test_an_older_attempt_is_fenced_by_the_newer_ones_producer(kafka_broker: str) -> None:
    from confluent_kafka import KafkaException

    topic = temp_topic("fence")
    old = _sink(kafka_broker, topic)
    old(Batch([{"sensor": "a", "temp": 1.0}]), 0)
    new = _sink(kafka_broker, topic)
    new(Batch([{"sensor": "b", "temp": 2.0}]), 1)
    with pytest.raises(KafkaException):
        old(Batch([{"sensor": "zombie", "temp": 9.0}]), 1)
    values = [json.loads(v)["sensor"] for _, v in read_committed(kafka_broker, topic, expect=2)]
    assert values == ["a", "b"]


TASK_MAIN = '''
import sys, time
from common.types import Schema
from executor.runtime import TaskRuntime
from executor.spark_session import build_session
bootstrap, source, out, ck, state = sys.argv[1:6]
READING = Schema.of(("sensor", "string"), ("temp", "double"), ("part", "int"), ("off", "int"))
spark = build_session(1, "kafka-kill", state)
rt = TaskRuntime(spark, query_id="q", task_id="kill", checkpoint_dir=ck)
rt.kafka_source(op="src", output="raw", schema=READING, bootstrap=bootstrap, topics=(source,),
                starting_offsets="earliest", format="jsonl", max_records=400,
                metadata=(("partition", "part"), ("offset", "off")))
rt.filter(op="hot", input="raw", output="hot", condition="raw.temp > 30")
rt.kafka_sink(op="out", input="hot", bootstrap=bootstrap, topic=out, format="jsonl",
              delivery="exactly-once")
print("started", flush=True)
rt.query.awaitTermination(240)
'''


def test_a_sigkilled_task_process_resumes_and_the_topic_is_exact(
        kafka_broker: str, tmp_path: Path) -> None:
    """The task runs in a process of its own (its own Spark session, small micro-batches); it is
    SIGKILLed once it has committed some batches, and started again on the same checkpoint.
    3,600 rows are 9 micro-batches of 400: 3 before the kill, the rest after (6,000 rows, 15
    batches, until 2026-11-30, only made the second run longer)."""
    source, out = temp_topic("kin"), temp_topic("kout")
    create_topic(kafka_broker, source, partitions=2)
    rows = readings(3600, 3)
    produce(kafka_broker, source, [json.dumps(r).encode() for r in rows])
    script = tmp_path / "task_main.py"
    script.write_text(TASK_MAIN)
    args = [sys.executable, str(script), kafka_broker, source, out, str(tmp_path / "ck"),
            str(tmp_path / "state")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "task.log", "ab")
    # a process group of its own: the kill takes the task's JVM with it, as a container's does
    first = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        commits = tmp_path / "ck" / "spark" / "commits"

        def committed() -> int:  # Spark's commit log: files 0, 1, ... (and .crc files)
            return sum(p.name.isdigit() for p in commits.iterdir()) if commits.is_dir() else 0

        def committed_three() -> bool:
            assert first.poll() is None, f"the task exited: see {tmp_path / 'task.log'}"
            return committed() >= 3

        wait_for("three committed batches", committed_three, timeout=180)
        assert first.poll() is None
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        done = committed()
        assert done < 9, f"too late to kill mid-run ({done} batches committed)"
        second = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            expected = hot(rows)
            records = read_committed(kafka_broker, out, expect=sum(expected.values()),
                                     timeout=240, settle=3.0)
        finally:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait(30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(30)
        log.close()
    seen = got(records)
    missing, twice = expected - seen, seen - expected
    assert seen == expected, (
        f"{sum(missing.values())} missing, {sum(twice.values())} extra of "
        f"{sum(expected.values())} (killed after {done} batches); task log "
        f"{tmp_path / 'task.log'}")
