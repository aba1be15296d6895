"""The executors' sessions write checkpoint and state files through Hadoop's FileSystem API
(executor/spark_session.py: on the local file system Spark's default, the FileContext API, runs
a `readlink` process per rename side and a `chmod` per file: ~10 processes per micro-batch;
benchmarks/batch_overhead.py measures the CPU). Asked of Spark itself, on the test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from executor.spark_session import FILE_SYSTEM_CHECKPOINTS, session_settings


def test_the_session_settings_name_the_file_system_checkpoint_manager() -> None:
    settings = session_settings(2, "/state")
    assert settings["spark.sql.streaming.checkpointFileManagerClass"] == FILE_SYSTEM_CHECKPOINTS


@pytest.mark.spark
def test_spark_makes_the_file_system_manager_for_a_local_checkpoint(spark: object,
                                                                      tmp_path: Path) -> None:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()  # type: ignore[attr-defined]
    path = jvm.org.apache.hadoop.fs.Path(str(tmp_path / "checkpoint"))
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager \
        .create(path, hadoop_conf)
    assert manager.getClass().getName() == FILE_SYSTEM_CHECKPOINTS
