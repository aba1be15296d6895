"""Building the one long-lived SparkSession an executor runs its task queries in.

Owns the session settings every Elastiq task query relies on: local mode with the offered cores,
no UI, 1-2 shuffle partitions (frozen into each query's checkpoint at its first start), the
RocksDB state store with changelog checkpointing, checkpoints on the raw local file system (no
`.crc` files) written through Hadoop's FileSystem API, UTC session time, loopback-only
networking, quiet logs, Spark's Kafka connector on the classpath when `scripts/setup.sh --kafka` fetched it
(`common.kafka_jars`; `spark.jars` at launch, as a JVM started without it cannot load it later),
Python processes that import the installed, compiled pyspark (`executor.spark_python_path`)
and workers forked by Elastiq's daemon from a frozen heap (`executor.spark_worker_daemon`). Does not own queries, sources or sinks.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pyspark.sql import SparkSession

from common.kafka_jars import connector_available, connector_jars
from executor.class_archive import session_java_options
from executor.spark_python_path import PYTHONPATH_ENV, session_python_path

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FILE_SYSTEM_CHECKPOINTS = ("org.apache.spark.sql.execution.streaming.checkpointing."
                           "FileSystemBasedCheckpointFileManager")
WORKER_DAEMON_MODULE = "executor.spark_worker_daemon"


def shuffle_partitions_for(cores: int) -> int:
    """1 partition on one core, otherwise 2: enough parallelism, little per-batch overhead."""
    return 1 if cores <= 1 else 2


def session_settings(cores: int, state_dir: str,
                     jars: tuple[str, ...] = (), java_options: str = "") -> dict[str, str]:
    """The Spark configuration of an executor session (pure; unit-testable)."""
    local_dir = str(Path(state_dir) / "spark-local")
    settings = {
        "spark.master": f"local[{cores}]",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.local.dir": local_dir,
        "spark.sql.warehouse.dir": str(Path(state_dir) / "warehouse"),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions_for(cores)),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.minBatchesToRetain": "20",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        # checkpoint and state files on the raw local file system: no `.crc` file beside each
        # one (half the file operations of every offset, commit and state log write: ~100 ms
        # less per micro-batch, benchmarks/batch_overhead.py); Spark 4.1 still checksums the
        # state store's files itself
        "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
        # checkpoint and state files written through Hadoop's FileSystem API, not Spark's
        # default FileContext one: on the local file system (without Hadoop's native library)
        # each FileContext rename runs `readlink` processes (4 per rename) and each create a
        # `chmod` process, ~10 processes per micro-batch of a stateless query (strace); the
        # FileSystem API renames with rename(2), leaving only the creates' `chmod`. Both check
        # that the destination is absent, then rename: the same guarantee on a POSIX file
        # system (benchmarks/batch_overhead.py measures the CPU per micro-batch)
        "spark.sql.streaming.checkpointFileManagerClass": FILE_SYSTEM_CHECKPOINTS,
    }
    # Python workers forked from a frozen heap, without pyspark 4.1's per-task cache flush
    settings["spark.python.daemon.module"] = WORKER_DAEMON_MODULE
    if jars:
        settings["spark.jars"] = ",".join(jars)
    if java_options:
        settings["spark.driver.extraJavaOptions"] = java_options
    return settings


def build_session(cores: int, app_name: str, state_dir: str,
                  java_options: str | None = None) -> SparkSession:
    """Start (or return the already running) SparkSession of this process, configured for
    Elastiq task queries. Takes ~5-9 s the first time; keep the session for the executor's life.
    `java_options`: the driver JVM's extra options (default: map the class archive if built)."""
    if cores < 1:
        raise ValueError(f"build_session: cores must be >= 1, got {cores}")
    os.makedirs(state_dir, exist_ok=True)
    builder = SparkSession.builder.appName(app_name)
    jars = tuple(connector_jars()) if connector_available() else ()
    if java_options is None:
        java_options = session_java_options()
    # the JVM passes this on to every Python process it starts (spark_python_path)
    os.environ[PYTHONPATH_ENV] = session_python_path(os.environ.get(PYTHONPATH_ENV))
    for key, value in session_settings(cores, state_dir, jars, java_options).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    log.info("session %s: local[%s], state under %s, Kafka connector %s, class archive %s",
             app_name, cores, state_dir,
             "on" if jars else "absent", "given" if "SharedArchiveFile" in java_options
             else "absent")
    return spark
