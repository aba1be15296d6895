"""`benchmarks/kafka.py --kill broker`: a SIGKILL of the broker during an exactly-once run.

Owns this scenario only. One real broker (`elastiq.kafka_broker.KafkaBroker`), `--records`
readings produced beforehand (1M by default here), Elastiq's Kafka -> filter -> Kafka task with
`delivery="exactly-once"` and micro-batches of `--batch` records, started as an executor starts
it (`bench_util.start_task`). Once the task has committed 3 batches the broker is SIGKILLed; it
stays down until the task noticed (its query failed, or committed no batch for 5 s), is started
again on the same data dir and ports (`KafkaBroker.restart`), and the task is started again on
its checkpoint whenever its query has ended, as the scheduler restarts a failed task. Printed:
the output topic read `read_committed` against the plain-Python oracle (nothing missing,
nothing twice), the outage, the task's restarts and the wall time.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from bench_util import fmt, start_task

from testkit.waiting import poll


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "spark" / "commits"
    return sum(p.name.isdigit() for p in commits.iterdir()) if commits.is_dir() else 0


class Task:
    """The exactly-once task, started again on its checkpoint whenever its query has ended."""

    def __init__(self, spark: Any, spec: str, run_dir: Path) -> None:
        self.spark, self.spec, self.run_dir = spark, spec, run_dir
        self.starts = 0
        self.runner: Any = None
        self.errors: list[str] = []
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.runner = start_task(self.spark, self.spec, self.run_dir / "kbench.xml",
                                 self.run_dir, "kbench", self.run_dir)

    def ended(self) -> bool:
        query = self.runner.runtime.query if self.runner.runtime is not None else None
        return query is None or not query.isActive

    def keep_running(self) -> None:
        if self.ended():
            query = self.runner.runtime.query if self.runner.runtime is not None else None
            error = query.exception() if query is not None else None
            self.errors.append(str(error)[:200] if error is not None else "ended")
            self.runner.stop()
            self.start()

    def stop(self) -> None:
        self.runner.stop()


def kill_broker_run(spark: Any, broker: Any, spec_of: Callable[[str, str, int], str],
                    new_topic: Callable[[str, str], str], reader_of: Callable[[str], Any],
                    expected: Counter, source: str, batch: int, base: Path) -> None:
    """The scenario on `source` (its records produced), printing its verdict."""
    out = new_topic(broker.bootstrap, "kout")
    run_dir = Path(tempfile.mkdtemp(dir=base))
    checkpoint = run_dir / "checkpoint"
    started = time.monotonic()
    task = Task(spark, spec_of(source, out, batch), run_dir)
    reader = reader_of(out)
    try:
        assert poll(lambda: committed_batches(checkpoint) >= 3 or task.ended(), 600, 0.05)
        at_kill = committed_batches(checkpoint)
        broker.kill()
        killed = time.monotonic()
        noticed = wait_noticed(task, checkpoint)
        broker.restart()
        down_s = time.monotonic() - killed
        total = sum(expected.values())

        def done() -> bool:
            task.keep_running()
            return sum(reader.seqs.values()) >= total

        poll(done, 1800, 0.2)
        time.sleep(3.0)  # a record written twice would show
    finally:
        task.stop()
        reader.close()
    got = reader.seqs
    missing, twice = expected - got, got - expected
    print(f"kill broker: {total:,} expected output records of {sum(1 for _ in expected):,} "
          f"seqs; broker SIGKILLed after {at_kill} committed batches of <= {batch:,}, down "
          f"{fmt(down_s, 1)} s ({noticed}); task started {task.starts} times "
          f"({'; '.join(task.errors) or 'never failed'}); {fmt(time.monotonic() - started)} s")
    print(f"  read_committed vs oracle: {sum(missing.values()):,} missing, "
          f"{sum(twice.values()):,} twice -> "
          f"{'nothing missing, nothing twice' if got == expected else 'NOT EXACT'}")


def wait_noticed(task: Task, checkpoint: Path) -> str:
    """Until the task's query ended, or it committed no batch for 5 s (bounded: 300 s)."""
    state = {"last": committed_batches(checkpoint), "since": time.monotonic()}

    def noticed() -> str:
        now = committed_batches(checkpoint)
        if now != state["last"]:
            state["last"], state["since"] = now, time.monotonic()
        if task.ended():
            return "the task's query failed"
        return "the task stalled" if time.monotonic() - state["since"] > 5.0 else ""

    return str(poll(noticed, 300, 0.1) or "not noticed within 300 s")
