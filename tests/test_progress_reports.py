"""An executor's reading of a query's recent progress reports (executor/progress_reports.py):
the merge of what it held with what Spark holds now, against a plain list model of Spark's
bounded report queue; and on the test session, a real query's reports read a few at a time
equal to what pyspark's own `recentProgress` gives, while Spark drops old ones."""

from __future__ import annotations

import random
import time

import pytest

from executor.progress_reports import RecentProgress, merge_reports, report_key


def _report(run: str, batch: int, stamp: int) -> dict:
    return {"runId": run, "batchId": batch, "timestamp": f"t{stamp}", "numInputRows": batch}


def test_a_merge_keeps_what_spark_keeps_through_appends_drops_and_a_new_run() -> None:
    rng = random.Random(1177)
    for _ in range(300):
        bound, spark, held, stamp = rng.randint(1, 6), [], [], 0
        run, batch = "r0", 0
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.1:  # the query restarted: a new run, a new (empty) queue
                run, spark = f"r{stamp}", []
            for _ in range(rng.randint(0, 3)):  # reports posted since the last read
                stamp += 1
                batch += rng.random() < 0.7  # an idle trigger repeats the batch id
                spark = (spark + [_report(run, batch, stamp)])[-bound:]
            walked = []

            def newest_first():
                for r in reversed(spark):
                    walked.append(r)
                    yield r
            held = merge_reports(held, newest_first(), len(spark))
            assert held == spark
            assert len(walked) <= len(spark)


def test_a_merge_reads_only_the_reports_it_does_not_hold() -> None:
    old = [_report("r", b, b) for b in range(5)]
    new = old[2:] + [_report("r", 5, 5), _report("r", 6, 6)]
    walked = []

    def newest_first():
        for r in reversed(new):
            walked.append(report_key(r))
            yield r
    assert merge_reports(old, newest_first(), len(new)) == new
    assert walked == [("r", 6, "t6"), ("r", 5, "t5"), ("r", 4, "t4")]
    assert merge_reports(old, iter(()), 0) == []


@pytest.mark.spark
def test_a_real_querys_reports_read_a_few_at_a_time_equal_pysparks(spark, tmp_path) -> None:
    key = "spark.sql.streaming.numRecentProgressUpdates"
    before = spark.conf.get(key)
    spark.conf.set(key, "4")  # Spark drops old reports from the front while it runs
    query = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
             .writeStream.format("noop").trigger(processingTime="100 milliseconds")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    reader, reads = RecentProgress(), 0
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            reports = reader.read(query)
            reads += 1
            if reports and int(reports[-1]["batchId"]) >= 12:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the rate query never reached batch 12")
    finally:
        query.stop()
        spark.conf.set(key, before)
    mine = reader.read(query)
    oracle = [(str(p["runId"]), p["batchId"], p["timestamp"], p["numInputRows"])
              for p in query.recentProgress]
    assert [(r["runId"], r["batchId"], r["timestamp"], r["numInputRows"]) for r in mine] == oracle
    # Spark dropped reports from the front (it keeps at most 4 of 12+ batches' reports)
    assert 1 <= len(oracle) <= 4 and oracle[-1][1] >= 12 and reads > 4
