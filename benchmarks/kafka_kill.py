"""`benchmarks/kafka.py --kill broker|executor`: SIGKILLs during an exactly-once run.

Owns these two scenarios only. One real broker (`elastiq.kafka_broker.KafkaBroker`),
`--records` readings produced beforehand (1M by default here), Elastiq's Kafka -> filter ->
Kafka task with `delivery="exactly-once"` and micro-batches of `--batch` records.
- `broker`: the task started as an executor starts it (`bench_util.start_task`), in this
  process. Once the task has committed 3 batches the broker is SIGKILLed; it stays down until
  the task noticed (its query failed, or committed no batch for 5 s), is started again on the
  same data dir and ports (`KafkaBroker.restart`), and the task is started again on its
  checkpoint whenever its query has ended, as the scheduler restarts a failed task.
- `executor`: the task in a process of its own (`ChildTask`: its SparkSession and the task, as
  an executor runs it), its process group SIGKILLed `--kills` times at seeded points of its
  batches and started again on its checkpoint after each.
Printed: the output topic read `read_committed` against the plain-Python oracle (nothing
missing, nothing twice), the kills, the task's starts and the wall time.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from bench_util import fmt, start_task, use_repo_on_path

use_repo_on_path()

from testkit.waiting import poll  # noqa: E402


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
        run_to_the_end(task, reader, sum(expected.values()))
    finally:
        task.stop()
        reader.close()
    print(f"kill broker: {sum(expected.values()):,} expected output records; broker SIGKILLed "
          f"after {at_kill} committed batches of <= {batch:,}, down {fmt(down_s, 1)} s "
          f"({noticed}); task started {task.starts} times "
          f"({'; '.join(task.errors) or 'never failed'}); {fmt(time.monotonic() - started)} s")
    print(verdict(expected, reader.seqs))


def run_to_the_end(task: Any, reader: Any, total: int) -> None:
    """Keep the task running (started again whenever it has ended, as the scheduler restarts a
    failed task) until `reader` holds `total` records (bounded: 30 min), then 3 s more, so a
    record written twice would show."""
    def done() -> bool:
        task.keep_running()
        return sum(reader.seqs.values()) >= total

    poll(done, 1800, 0.2)
    time.sleep(3.0)


def verdict(expected: Counter, got: Counter) -> str:
    """The output read `read_committed` against the oracle, in one line."""
    missing, twice = expected - got, got - expected
    return (f"  read_committed vs oracle: {sum(missing.values()):,} missing, "
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


# --- `--kill executor`: the task's own process SIGKILLed -------------------------------------

CHILD_FLAG = "--task-child"


class ChildTask:
    """The exactly-once task in a process (and process group) of its own, as an executor runs
    it: `python kafka_kill.py --task-child SPEC RUN_DIR` builds its SparkSession and starts the
    task on `RUN_DIR/checkpoint`. Started again whenever it has exited; `kill` SIGKILLs the
    group (the process and its Spark JVM)."""

    def __init__(self, spec_path: Path, run_dir: Path) -> None:
        self.spec_path, self.run_dir = spec_path, run_dir
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log = open(run_dir / "task.log", "ab")
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), CHILD_FLAG, str(self.spec_path),
             str(self.run_dir)], stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def exited(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def keep_running(self) -> None:
        if self.exited():
            self.start()

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(60)

    def stop(self) -> None:
        if not self.exited():
            self.kill()
        self.log.close()


def kill_executor_run(spec: str, reader: Any, expected: Counter, batch: int, kills: int,
                      base: Path, seed: int = 7) -> None:
    """The task over its source (records produced) SIGKILLed `kills` times, each after it
    committed 3 more batches and a seeded 0-1 s more (so a kill lands anywhere in a batch:
    while Spark plans it, while the sink writes it, between Kafka's commit and Spark's); after
    each it is started again on its checkpoint. Prints the verdict against `expected`."""
    run_dir = Path(tempfile.mkdtemp(dir=base))
    spec_path = run_dir / "kbench.xml"
    spec_path.write_text(spec, encoding="utf-8")
    checkpoint = run_dir / "checkpoint"
    rng = random.Random(seed)
    started = time.monotonic()
    task = ChildTask(spec_path, run_dir)
    at_kills: list[int] = []
    try:
        for _ in range(kills):
            target = committed_batches(checkpoint) + 3
            reached = poll(lambda: committed_batches(checkpoint) >= target or task.exited(),
                           600, 0.05)
            if not reached or task.exited():
                break  # the run ended (or failed) before this kill: said below
            time.sleep(rng.uniform(0.0, 1.0))
            at_kills.append(committed_batches(checkpoint))
            task.kill()
            task.start()
        run_to_the_end(task, reader, sum(expected.values()))
    finally:
        task.stop()
        reader.close()
    print(f"kill executor: {sum(expected.values()):,} expected output records; the task's "
          f"process group SIGKILLed {len(at_kills)} times (of {kills} asked), after "
          f"{', '.join(map(str, at_kills)) or '-'} committed batches of <= {batch:,}; started "
          f"{task.starts} times; {fmt(time.monotonic() - started)} s")
    print(verdict(expected, reader.seqs))


def child_main(spec_path: Path, run_dir: Path) -> None:
    """The task's process: its SparkSession and the task, run until it is killed (or its
    query ends, when it exits so that the parent starts it again)."""
    from executor.spark_session import build_session

    spark = build_session(2, "kafka-kill-task", str(run_dir / "state"))
    runner = start_task(spark, spec_path.read_text(encoding="utf-8"), spec_path, run_dir,
                        "kbench", run_dir)
    query = runner.runtime.query
    query.awaitTermination()
    print(f"the task's query ended: {query.exception()}", flush=True)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == CHILD_FLAG:
    child_main(Path(sys.argv[2]), Path(sys.argv[3]))
