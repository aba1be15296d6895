"""PySpark worker daemon that skips the per-task `importlib.invalidate_caches()` of pyspark 4.1.x.

Owns one thing: starting pyspark's own daemon (`pyspark.daemon.manager`) with
`pyspark.worker_util.setup_spark_files` replaced by a version that invalidates the import caches
only when the task ships Python includes (zip/egg files). In pyspark 4.1.4 every worker task
re-reads `pyspark.zip` through that call (~300 ms of CPU per task, SPARK-54744). Elastiq never
adds Python files to a running session (task programs are loaded by the driver), so skipping the
call is safe. Selected by `spark_session.build_session` through `spark.python.daemon.module`,
and only when the installed pyspark still makes the call. Does not own anything else about
workers: everything after the patch is pyspark's unmodified daemon.
"""

from __future__ import annotations

import importlib
from typing import IO


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


def main() -> None:
    install_patch()
    import pyspark.daemon as daemon  # imports the worker module, which now binds the patch

    daemon.manager()


if __name__ == "__main__":
    main()
