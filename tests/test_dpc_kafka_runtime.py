"""DPC marks on a Kafka sink with the real broker and Spark (docs/kafka.md, "DPC marks on a
Kafka sink"): task u unions two channels with max-delay into an exactly-once kafka-sink while
a2's link to u is cut and healed (`testkit.dpc_marks_support.kafka_cut_run`). A read_committed
reader sees tentative records (header elastiq-tentative) during the cut and, after the heal,
one correction (header elastiq-revision) committed with the re-run's rows: the stable view is
the plain-Python union of all input, nothing missing, nothing twice (the re-run's batches are
written under new ids, so the exactly-once mark neither skips them nor doubles a batch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common import dpc_view
from tests.kafka_support import create_topic, kafka_parts_missing, kafka_required, temp_topic
from testkit.dpc_marks_support import kafka_cut_run, keys, union_oracle

pytestmark = [pytest.mark.spark, kafka_required()]
__all__ = ["kafka_parts_missing"]

RATE, LIMIT, MAX_DELAY = 100.0, 1700, 2.0  # 17 s of input per upstream task
CUT_SECONDS = 4.0


def test_a_dpc_task_s_kafka_sink_marks_tentative_records_and_commits_the_correction(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    topic = temp_topic("dpc")
    create_topic(kafka_broker, topic)
    run, read = kafka_cut_run(spark, tmp_path, kafka_broker, topic, rate=RATE, limit=LIMIT,
                              cut_seconds=CUT_SECONDS, max_delay=f"{int(MAX_DELAY)} seconds")
    expected = union_oracle(RATE, LIMIT)
    tentative = [r for r in run.at_heal if dpc_view.TENTATIVE in r]
    print(f"first tentative record {run.first_tentative:.2f} s after the cut; u reconciled in "
          f"{run.reconcile:.2f} s; {len(tentative)} tentative records replaced; stable view "
          f"{len(expected)} rows")
    assert read.refused == []
    assert tentative and {r[dpc_view.TENTATIVE] for r in tentative} == {1}
    assert set(keys(tentative)) <= set(expected), "a tentative record the exact result lacks"
    assert keys(dpc_view.stable_view(run.rows)) == expected
    assert [r[dpc_view.REVISION] for r in run.rows if dpc_view.REVISION in r] == [1]
    assert dpc_view.open_episodes(run.rows) == []
