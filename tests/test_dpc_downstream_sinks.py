"""DPC marks into a downstream task's network and Kafka sinks, with real ZeroMQ, Spark and the
real Kafka broker (docs/availability.md, "Marks across channels"; docs/kafka.md, "DPC marks on
a Kafka sink"): task u unions two channels with max-delay and serves the union on a marked
channel to two stateless tasks, each keeping the rows with temp > THRESHOLD: "fn" into a
network sink (read by a plain channel reader), "fk" into an exactly-once kafka-sink (read
read_committed); a2's link to u is cut for 4 s and healed (`testkit.dpc_marks_support`). Both
sinks carry tentative rows during the cut and the correction after it, so each one's stable
view equals the plain-Python filter over all input; `elastiq tail --stable` on the topic prints
that view too. And the attacker's side: forged mark headers on a topic are left out by
`tail --stable`, each named with its reason, and the view of the rest is exact."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from common import dpc_view
from elastiq.service_cli import print_stable_topic
from tests.kafka_support import create_topic, kafka_parts_missing, kafka_required, temp_topic
from testkit.dpc_marks_support import THRESHOLD, downstream_sinks_cut_run, keys, oracle

pytestmark = [pytest.mark.spark, kafka_required()]
__all__ = ["kafka_parts_missing"]

RATE, LIMIT, MAX_DELAY = 100.0, 1700, 2.0  # 17 s of input per upstream task
# The cut outlasts max-delay by 4 s: the Kafka sink's first tentative record comes after the
# delay, a micro-batch and a transaction; at 2 s over it missed once under load (4.8 s after a
# 4.4 s cut, 2026-12-01, load average ~9).
CUT_SECONDS = 6.0


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _timed(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "ts": datetime.fromisoformat(row["ts"].replace("Z", "+00:00"))}


def test_a_downstream_filter_s_network_and_kafka_sinks_carry_the_marks(
        spark: Any, kafka_broker: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    topic = temp_topic("dpc-down")
    create_topic(kafka_broker, topic)
    down = downstream_sinks_cut_run(spark, tmp_path, kafka_broker, topic, rate=RATE,
                                    limit=LIMIT, cut_seconds=CUT_SECONDS,
                                    max_delay=f"{int(MAX_DELAY)} seconds")
    run, expected = down.run, oracle(RATE, LIMIT)
    cut = run.healed_at - run.cut_at
    sinks = {"network": (run.rows, down.network_first, down.network_revised),
             "kafka": (down.kafka.records, down.kafka_first, down.kafka_revised)}
    for name, (records, first, revised) in sinks.items():
        tentative = [r for r in records if dpc_view.TENTATIVE in r]
        with capsys.disabled():  # the figures, past the capture of tail's output below
            print(f"\n{name} sink: first tentative row {_seconds(first)} after the cut; "
                  f"u reconciled in {run.reconcile:.2f} s after a {cut:.1f} s cut; the "
                  f"revision at the reader {_seconds(revised)} after the heal; "
                  f"{len(tentative)} tentative rows replaced; stable view {len(expected)} rows")
        assert first is not None and first < cut, f"{name}: no tentative row during the cut"
        assert revised is not None, f"{name}: no revision reached the reader"
        assert {r[dpc_view.TENTATIVE] for r in tentative} == {1}
        assert all(r["temp"] > THRESHOLD for r in tentative)
        assert set(keys(tentative)) <= set(expected), f"{name}: a tentative row not exact"
        assert keys(dpc_view.stable_view(records)) == expected, name
        assert [r[dpc_view.REVISION] for r in records if dpc_view.REVISION in r] == [1], name
        assert dpc_view.open_episodes(records) == []
    assert down.refused_frames == 0 and down.kafka.refused == []
    capsys.readouterr()
    assert print_stable_topic("k", {"bootstrap": kafka_broker, "topic": topic}) == 0
    printed = capsys.readouterr()
    assert keys([_timed(json.loads(line)) for line in printed.out.splitlines()]) == expected
    assert printed.err == ""  # no record left out, no episode awaiting its correction


FORGED: list[tuple[list[tuple[str, bytes]], bytes, str]] = [
    ([(dpc_view.TENTATIVE_HEADER, b"0")], b'{"x":90}', "not an episode"),
    ([(dpc_view.TENTATIVE_HEADER, b"1"), (dpc_view.TENTATIVE_HEADER, b"2")], b'{"x":91}',
     "twice"),
    ([("elastiq-stable", b"1")], b'{"x":92}', "unknown Elastiq header"),
    ([(dpc_view.REVISION_HEADER, b"7")], b'{"_revision":8}', "whose value is not"),
    ([(dpc_view.TENTATIVE_HEADER, b"1"), (dpc_view.REVISION_HEADER, b"1")], b'{"x":93}',
     "both"),
    ([], b'{"_tentative":1,"x":94}', "marks are headers"),
    ([], b"__import__('os').system('touch /tmp/pwned')", "not JSON"),
]


def test_tail_stable_on_a_topic_leaves_forged_marks_out_with_their_reason(
        kafka_broker: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A topic holding rows, a tentative row of episode 1 and its correction, a tentative
    row of episode 2 (open), records with forged marks, and a row of an aborted transaction:
    the printed view is the plain-Python stable view of the good records, each forged one is
    named (partition, offset, reason), episode 2 awaits its correction, nothing is run."""
    from confluent_kafka import Producer

    topic = temp_topic("dpc-forged")
    create_topic(kafka_broker, topic)
    good = [([], b'{"x":1}'), ([(dpc_view.TENTATIVE_HEADER, b"1")], b'{"x":2}'),
            ([(dpc_view.REVISION_HEADER, b"1")], b'{"_revision":1}'), ([], b'{"x":3}'),
            ([("trace", b"\xff"), (dpc_view.TENTATIVE_HEADER, b"2")], b'{"x":4}')]
    sent = good[:3] + [(h, v) for h, v, _ in FORGED] + good[3:]
    producer = Producer({"bootstrap.servers": kafka_broker, "enable.idempotence": True})
    for headers, value in sent:
        producer.produce(topic, value, headers=headers or None)
    assert producer.flush(30) == 0
    aborted = Producer({"bootstrap.servers": kafka_broker, "transactional.id": topic})
    aborted.init_transactions(30)
    aborted.begin_transaction()
    aborted.produce(topic, b'{"x":99}')
    aborted.abort_transaction(30)
    capsys.readouterr()
    assert print_stable_topic("k", {"bootstrap": kafka_broker, "topic": topic}) == 0
    printed = capsys.readouterr()
    assert [json.loads(line) for line in printed.out.splitlines()] == [{"x": 1}, {"x": 3}]
    left_out = [line for line in printed.err.splitlines() if "left out" in line]
    assert len(left_out) == len(FORGED)
    for line, (_, _, reason), offset in zip(left_out, FORGED, range(3, 3 + len(FORGED))):
        assert f"partition 0 offset {offset} left out" in line and reason in line, line
    assert "episode(s) [2] await their correction" in printed.err
    assert not Path("/tmp/pwned").exists()
