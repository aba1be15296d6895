"""The PySpark worker daemon of executor sessions: pyspark's own daemon (`pyspark.daemon.manager`)
started after two changes that cut the CPU of every Python task.

- **A frozen heap.** pyspark's reused workers run a full `gc.collect()` after every task, which
  walks every object the worker holds: ~20-30 ms per task once pyspark's worker, pyarrow and
  pandas are imported (~75,000 objects), and 88 % of a worker's CPU in a stateless query
  (py-spy). Before it forks any worker, the daemon imports the modules Elastiq's tasks use in
  workers (`PRELOADED`) and moves every object it holds to the collector's permanent generation
  (`gc.freeze()`, Python's documented pattern for servers that fork), so a worker's collection
  walks only what its tasks made. A frozen object is still freed when its last reference goes;
  only a reference cycle among the daemon's own start-up objects is never collected.
- **No per-task import cache flush.** pyspark 4.1.x's `setup_spark_files` runs
  `importlib.invalidate_caches()` in every worker task, which re-reads `pyspark.zip` (~300 ms of
  CPU per task, SPARK-54744). Where the installed pyspark still makes the call, it is replaced
  by a version that flushes only when the task ships Python includes (zip/egg files). Elastiq
  never adds Python files to a running session (task programs are loaded by the driver).

Selected by `spark_session.build_session` through `spark.python.daemon.module`. Does not own
anything else about workers: everything after these two steps is pyspark's unmodified daemon.
"""

from __future__ import annotations

import gc
import importlib
import inspect
from typing import IO

PRELOADED = (
    "pyspark.worker",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.pandas.serializers",
    "pyarrow",
    "pandas",
    "executor.sources",
    "executor.spool_source",
)
"""What a worker imports to run Elastiq's tasks: pyspark's worker and Python data source read,
its Arrow serializers (which import pandas), and the sources whose readers run in workers."""


def needs_cache_flush_workaround() -> bool:
    """True when pyspark's `setup_spark_files` still flushes import caches on every task
    (pyspark 4.1.4 does; the fix, SPARK-54744, lands in later releases)."""
    from pyspark import worker_util

    return "invalidate_caches()" in inspect.getsource(worker_util.setup_spark_files)


def _setup_spark_files_without_cache_flush(infile: IO) -> None:
    """Same protocol as pyspark's `setup_spark_files`; flushes import caches only if includes
    were shipped with the task (the only case where new importable files can appear)."""
    from pyspark.serializers import UTF8Deserializer, read_int
    from pyspark.worker_util import add_path, is_remote_only
    import os

    utf8 = UTF8Deserializer()
    spark_files_dir = utf8.loads(infile)
    if not is_remote_only():
        from pyspark.core.files import SparkFiles

        SparkFiles._root_directory = spark_files_dir
        SparkFiles._is_running_on_worker = True
    add_path(spark_files_dir)
    includes = read_int(infile)
    for _ in range(includes):
        add_path(os.path.join(spark_files_dir, utf8.loads(infile)))
    if includes:
        importlib.invalidate_caches()


def install_patch() -> None:
    """Replace `setup_spark_files` before any worker module binds it by name."""
    import pyspark.worker_util as worker_util

    worker_util.setup_spark_files = _setup_spark_files_without_cache_flush


def freeze_preloaded(modules: tuple[str, ...] = PRELOADED) -> int:
    """Import `modules`, collect, then freeze every object this process holds; returns how many
    objects the collector will leave alone from now on (here and in every forked child)."""
    for name in modules:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def main() -> None:
    if needs_cache_flush_workaround():
        install_patch()
    import pyspark.daemon as daemon  # imports the worker module, which now binds the patch

    freeze_preloaded()
    daemon.manager()


if __name__ == "__main__":
    main()
