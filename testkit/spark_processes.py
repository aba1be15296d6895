"""What the Spark-layer fault tests run and kill on the tests' shared SparkSession: a task
runner of a generated program (as an executor runs a task), the session's JVM, and the Python
processes it forked, found through /proc (the streaming source runners of Python sources, and
the workers its worker daemon forked for Python functions); and when a query has caught up with
its input (`caught_up`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from executor.task_runner import TaskRunner


def program_runner(spark: Any, program: Path, task_id: str, checkpoint: Path, *,
                   max_restarts: int = 3,
                   params: Mapping[str, Mapping[str, Any]] | None = None) -> TaskRunner:
    """A TaskRunner of `program` on `spark` (query "q", micro-batches at most every 0.5 s, a
    failed query restarted after 0.5 s up to `max_restarts` times). `params` are the task's
    control parameters (operator -> keyword -> value), as a control tuple sets them: a
    generator's `rate` there paces its rows and leaves their event times the program's."""
    kwargs: dict[str, Any] = {"query_id": "q", "task_id": task_id,
                              "checkpoint_dir": str(checkpoint), "trigger_seconds": 0.5}
    if params is not None:
        kwargs["params"] = {op: dict(values) for op, values in params.items()}
    return TaskRunner(spark, program, kwargs, max_restarts=max_restarts, backoff_seconds=0.5)


def jvm_pid(spark: Any) -> int:
    """The process id of the session's JVM."""
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def _parents() -> dict[int, int]:
    """Every process's parent (processes that end while read are left out)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return parents


def _runs(pid: int, name: bytes) -> bool:
    try:
        return name in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def source_runner_pids(jvm: int) -> list[int]:
    """The JVM's children running pyspark's Python streaming source runner."""
    return [pid for pid, parent in _parents().items()
            if parent == jvm and _runs(pid, b"python_streaming_source_runner")]


def python_workers(jvm: int) -> list[int]:
    """The Python workers the JVM's worker daemon forked (they run Python functions, such as a
    count window's per-key function): the daemon's children."""
    parents = _parents()
    daemons = {pid for pid, parent in parents.items()
               if parent == jvm and _runs(pid, b"spark_worker_daemon")}
    return [pid for pid, parent in parents.items() if parent in daemons]


def caught_up(query: Any) -> bool:
    """Whether `query` has written everything its sources hold now: no data available, no
    trigger running, and for a stateful query a last batch that read nothing (the no-data batch
    that closes windows at the final watermark has run). A stateless query's last batch is
    complete once its progress is reported; it gets no no-data batch, and Spark reports an
    idle trigger only every 10 s, which waiting for one would add to every test."""
    progress, status = query.lastProgress, query.status
    if not progress or status["isDataAvailable"] or status["isTriggerActive"]:
        return False
    return not progress.get("stateOperators") or progress["numInputRows"] == 0
