"""A SIGKILL of the Kafka broker during an exactly-once run (layer 3, issue 30).

A real KRaft broker of this test's own (`elastiq.kafka_broker.KafkaBroker`), a real Spark task in
a process of its own (kafka-source -> filter -> exactly-once kafka-sink, small micro-batches, as
`test_kafka_runtime`'s SIGKILL test runs it). Once the task has committed some batches the broker
is SIGKILLed; it stays down until the task has noticed (no batch commits for a while, or the task
failed), is started again on the same data dir and port, and the task is started again on its
checkpoint whenever it has exited, as the scheduler restarts a failed task. The output topic read
`read_committed` must equal the plain-Python oracle over the input: nothing missing, nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from tests.kafka_support import (create_topic, kafka_parts_missing, kafka_required, own_broker,
                                 produce, read_committed, temp_topic)
from tests.test_kafka_runtime import TASK_MAIN, got, hot, readings
from testkit.waiting import wait_for

pytestmark = [pytest.mark.spark, kafka_required()]
__all__ = ["kafka_parts_missing", "own_broker"]

ROOT = Path(__file__).resolve().parent.parent
ROWS = 4000  # 10 micro-batches of 400 records
MAX_TASK_STARTS = 4


class TaskProcess:
    """The task's process, started again on its checkpoint whenever it has exited."""

    def __init__(self, args: list[str], log: IO[bytes]) -> None:
        self.args, self.log = args, log
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        assert self.starts < MAX_TASK_STARTS, "the task failed again and again: see its log"
        self.starts += 1
        # a process group of its own: a kill takes the task's JVM with it
        self.process = subprocess.Popen(self.args, env=self.env, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def exited(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def keep_running(self) -> None:
        if self.exited():
            self.start()

    def end(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(30)


class CommittedReader:
    """How many records of `topic` a read_committed reader has seen so far."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{topic}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                  "isolation.level": "read_committed"})
        self.consumer.subscribe([topic])
        self.count = 0

    def read(self) -> int:
        self.count += sum(not m.error() for m in self.consumer.consume(1000, 0.2))
        return self.count

    def close(self) -> None:
        self.consumer.close()


def test_a_sigkilled_broker_comes_back_and_the_topic_is_exact(own_broker: object,
                                                              tmp_path: Path) -> None:
    from elastiq.kafka_broker import KafkaBroker

    assert isinstance(own_broker, KafkaBroker)
    broker, bootstrap = own_broker, own_broker.bootstrap
    source, out = temp_topic("bkin"), temp_topic("bkout")
    create_topic(bootstrap, source, partitions=2)
    rows = readings(ROWS, 5)
    produce(bootstrap, source, [json.dumps(r).encode() for r in rows])
    script = tmp_path / "task_main.py"
    script.write_text(TASK_MAIN)
    commits = tmp_path / "ck" / "spark" / "commits"

    def committed() -> int:  # Spark's commit log: files 0, 1, ... (and .crc files)
        return sum(p.name.isdigit() for p in commits.iterdir()) if commits.is_dir() else 0

    with open(tmp_path / "task.log", "ab") as log:
        task = TaskProcess([sys.executable, str(script), bootstrap, source, out,
                            str(tmp_path / "ck"), str(tmp_path / "state")], log)
        try:
            def two_committed() -> bool:
                assert not task.exited(), f"the task exited: see {tmp_path / 'task.log'}"
                return committed() >= 2

            wait_for("two committed batches", two_committed, timeout=180, step=0.05)
            broker.kill()
            at_kill = committed()
            assert at_kill < ROWS // 400, f"too late to kill mid-run ({at_kill} batches)"
            noticed = _wait_until_noticed(task, committed)
            broker.restart()
            expected = hot(rows)
            reader = CommittedReader(bootstrap, out)
            try:
                def all_out() -> bool:
                    task.keep_running()  # as the scheduler restarts a failed task
                    return reader.read() >= sum(expected.values())

                wait_for("the whole output", all_out, timeout=240, step=0.2)
            finally:
                reader.close()
        finally:
            task.end()
    records = read_committed(bootstrap, out, expect=sum(expected.values()), timeout=60,
                             settle=2.0)  # everything, and any extra record
    seen = got(records)
    missing, twice = expected - seen, seen - expected
    assert seen == expected, (
        f"{sum(missing.values())} missing, {sum(twice.values())} extra of "
        f"{sum(expected.values())} (broker killed after {at_kill} batches, {noticed}; task "
        f"started {task.starts} times); task log {tmp_path / 'task.log'}")


def _wait_until_noticed(task: TaskProcess, committed: "object") -> str:
    """Keep the broker down until the task has noticed: it failed (exited), or it committed
    no batch for 5 s, where it commits one every ~0.5 s with the broker up."""
    assert callable(committed)
    last, since = committed(), time.monotonic()

    def noticed() -> str:
        nonlocal last, since
        now = committed()
        if now != last:
            last, since = now, time.monotonic()
        if task.exited():
            return "the task failed"
        return "the task stalled" if time.monotonic() - since > 5.0 else ""

    return str(wait_for("the task to notice the broker is gone", noticed, timeout=120))
