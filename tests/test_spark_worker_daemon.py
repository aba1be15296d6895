"""Executor sessions' Python workers are forked from a frozen heap (executor/spark_worker_daemon):
pyspark's reused workers run a full gc.collect() after every task, which walked every module
object (~20-30 ms per task); frozen, it walks only what the task made. Asked of a fresh process
and of a real worker of the test session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENOUGH = 20_000  # pyspark's worker alone is ~37,000 objects; with pyarrow and pandas ~75,000

PROBE = """
import gc, json, sys
from executor.spark_worker_daemon import PRELOADED, freeze_preloaded
before = gc.get_freeze_count()
frozen = freeze_preloaded()
print(json.dumps({"before": before, "frozen": frozen, "unfrozen": len(gc.get_objects()),
                  "missing": [m for m in PRELOADED if m not in sys.modules]}))
"""


def test_the_daemon_imports_its_modules_then_freezes_what_it_holds() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["before"] == 0 and figures["missing"] == []
    assert figures["frozen"] >= ENOUGH
    assert figures["unfrozen"] < figures["frozen"] // 100  # almost nothing left to walk


@pytest.mark.spark
def test_a_python_worker_of_the_session_runs_on_a_frozen_heap(spark: object) -> None:
    from pyspark.sql.functions import udf

    def frozen_objects(_: int) -> int:
        import gc

        return gc.get_freeze_count()

    rows = spark.range(2).select(  # type: ignore[attr-defined]
        udf(frozen_objects, "long")("id").alias("frozen")).collect()
    assert all(row["frozen"] >= ENOUGH for row in rows), rows
