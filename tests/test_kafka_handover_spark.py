"""A Kafka-fed operator rescaled 1 -> 2 -> 1 with the offset handover, against a real broker and
real Spark: instance tasks (kafka-source share i of k -> filter -> exactly-once kafka-sink, one
output topic), each generation in new checkpoint folders. Generation 1 (one instance) reads a
first lot and stops at a batch boundary; its committed offsets (read from its real checkpoint
by `executor.kafka_handover`) equal the records per partition; more records come; generation 2
(two instances, 10 records a micro-batch each) is stopped while it still has records to read;
more records; generation 3 (one instance) reads the rest. The output topic read
`read_committed` holds every filtered record exactly once (a plain-Python oracle over unique
ids). Runs under the heavy lock (Spark)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from common.types import Schema
from testkit.waiting import wait_for
from tests.kafka_support import (create_topic, kafka_parts_missing,
                                 kafka_required, produce, read_committed, temp_topic)

pytestmark = [pytest.mark.spark, kafka_required()]
__all__ = ["kafka_parts_missing"]

READING = Schema.of(("id", "int"), ("temp", "double"), ("part", "int"))
PARTITIONS = 4


def _rows(first: int, n: int) -> list[dict[str, Any]]:
    return [{"id": i, "temp": float((i * 37) % 60)} for i in range(first, first + n)]


def _hot(rows: list[dict[str, Any]]) -> set[int]:
    """The oracle: the ids the filter keeps."""
    return {r["id"] for r in rows if r["temp"] > 30}


def _produce(bootstrap: str, topic: str, rows: list[dict[str, Any]]) -> None:
    for p in range(PARTITIONS):  # row i goes to partition i % 4
        produce(bootstrap, topic, [json.dumps(r).encode() for r in rows if r["id"] % 4 == p],
                partition=p)


def _instance(spark: Any, bootstrap: str, source: str, out: str, share: int, shares: int,
              ck: Path, max_records: int | None = None) -> Any:
    from executor.runtime import TaskRuntime

    rt = TaskRuntime(spark, query_id="kh", task_id=f"kh.t{share}", checkpoint_dir=str(ck))
    rt.kafka_source(op=f"src_{share}", output="raw", schema=READING, bootstrap=bootstrap,
                    topics=(source,), starting_offsets="earliest", format="jsonl",
                    metadata=(("partition", "part"),), share=share, shares=shares,
                    max_records=max_records)
    rt.filter(op=f"hot_{share}", input="raw", output="hot", condition="raw.temp > 30")
    rt.kafka_sink(op="out", input="hot", bootstrap=bootstrap, topic=out, format="jsonl",
                  delivery="exactly-once")
    return rt


def _ids(bootstrap: str, out: str, expect: int, settle: float = 0.5) -> Counter:
    records = read_committed(bootstrap, out, expect=expect, timeout=60, settle=settle)
    return Counter(json.loads(v)["id"] for _, v in records)


def _places(tmp_path: Path, generation: int, k: int) -> list[Any]:
    from executor.kafka_handover import Instance

    return [Instance(str(tmp_path / f"g{generation}" / f"i{i}"), f"src_{i}")
            for i in range(1, k + 1)]


def _by_the_scheduler(olds: list[Any], generation: int, k_new: int) -> str:
    """The handover `scheduler.kafka_rescale` computes from the old instances' stop reports
    (as their executors would send them, through JSON): the new instance 1's offsets."""
    from executor.kafka_handover import stop_report
    from scheduler import kafka_rescale as kr

    slots = tuple(f"kh.t{i}" for i in range(1, max(len(olds), k_new) + 1))
    r = kr.begin("hot", slots, len(olds), k_new, 1, generation, "earliest", 0.0)
    running: dict[str, kr.SlotState] = {t: "running" for t in slots[:len(olds)]}
    assert kr.step(r, running, 0.0).stop == slots[:len(olds)]
    for task, old in zip(slots, olds):
        kr.report(r, kr.parse_report(json.loads(json.dumps(stop_report(old, generation))), task))
    step = kr.step(r, {t: "stopped" for t in slots[:len(olds)]}, 1.0)
    assert not step.refused and len(step.launch) == k_new
    return step.launch[0].starting_offsets


def test_rescale_one_two_one_hands_offsets_over_exactly(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    from executor.kafka_handover import (HandoverRefused, last_committed, last_committed_batch,
                                         prepare)

    source, out = temp_topic("kh-in"), temp_topic("kh-out")
    create_topic(kafka_broker, source, partitions=PARTITIONS)
    create_topic(kafka_broker, out)
    started = time.monotonic()
    lots = [_rows(0, 200)]
    _produce(kafka_broker, source, lots[0])

    # generation 1: one instance reads everything, commits, stops at a batch boundary
    g1 = _places(tmp_path, 1, 1)
    rt = _instance(spark, kafka_broker, source, out, 1, 1, Path(g1[0].checkpoint_dir))
    assert set(_ids(kafka_broker, out, len(_hot(lots[0])), settle=0.2)) == _hot(lots[0])
    last = rt.stop_at_boundary()
    committed = last_committed(str(Path(g1[0].checkpoint_dir) / "spark"))
    assert committed is not None and committed[0] == last
    assert committed[1] == {(source, p): 50 for p in range(PARTITIONS)}  # the real checkpoint

    lots.append(_rows(200, 120))  # produced while no instance runs
    _produce(kafka_broker, source, lots[1])
    g2 = _places(tmp_path, 2, 2)
    plan = prepare(g1, g2, "earliest")
    assert [json.loads(i.starting_offsets) for i in plan] == [
        {source: {"0": 50, "1": 50}}, {source: {"2": 50, "3": 50}}]
    with pytest.raises(HandoverRefused, match="not stopped at a batch boundary"):
        prepare(g2, _places(tmp_path, 9, 1), "earliest")  # g2 never ran: nothing to hand

    # generation 2: two instances, 10 records a batch each; stopped with records still unread
    rts = [_instance(spark, kafka_broker, source, out, i, 2, Path(g2[i - 1].checkpoint_dir), 10)
           for i in (1, 2)]
    lots.append(_rows(320, 400))
    _produce(kafka_broker, source, lots[2])
    seen = _ids(kafka_broker, out, len(_hot(lots[0] + lots[1])) + 20, settle=0)
    stopping = time.monotonic()
    for r in rts:
        r.stop_at_boundary()
    stop_s = time.monotonic() - stopping
    assert max(seen.values()) == 1
    g3 = _places(tmp_path, 3, 1)
    plan = prepare(g2, g3, "earliest")
    assert _by_the_scheduler(g2, 2, 1) == plan[0].starting_offsets  # the same from the reports
    handed = json.loads(plan[0].starting_offsets)[source]
    assert all(50 <= handed[str(p)] <= 180 for p in range(PARTITIONS)), handed
    assert sum(handed.values()) < 4 * 180, "stopped with records still unread"

    # generation 3: one instance again, the rest and one more lot
    lots.append(_rows(720, 80))
    starting = time.monotonic()
    rt = _instance(spark, kafka_broker, source, out, 1, 1, Path(g3[0].checkpoint_dir))
    wait_for("generation 3's first commit", lambda: last_committed_batch(
        str(Path(g3[0].checkpoint_dir) / "spark")) is not None, timeout=60)
    print(f"the pause's parts: 2 instances stopped at a batch boundary in {stop_s:.2f} s; "
          f"the new instance's first batch committed {time.monotonic() - starting:.2f} s after "
          "its start")
    _produce(kafka_broker, source, lots[3])
    everything = [r for lot in lots for r in lot]
    ids = _ids(kafka_broker, out, len(_hot(everything)), settle=2.0)
    rt.stop_at_boundary()
    print(f"1 -> 2 -> 1 with {len(everything)} records: {time.monotonic() - started:.1f} s")
    assert set(ids) == _hot(everything), "nothing missing, nothing extra"
    assert max(ids.values()) == 1, "nothing twice"
    final = last_committed(str(Path(g3[0].checkpoint_dir) / "spark"))
    assert final is not None and final[1] == {(source, p): 200 for p in range(PARTITIONS)}
