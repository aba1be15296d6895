"""DPC marks on a Kafka sink, without a broker (docs/kafka.md, "DPC marks on a Kafka sink"):
the records a batch becomes (headers, the correction record), the reader's parse of (headers,
value) pairs into the file sink's records (a round trip against plain-Python rows, a seeded
fuzz, forged headers refused with a reason), and how `DpcSink` numbers a Kafka sink's
batches through a cut: the re-run is written (not skipped as already written), its correction
in the same transaction as its rows, and a replay of it after a restart is skipped."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from common import dpc, dpc_view
from common.dpc_view import (REVISION_HEADER, TENTATIVE_HEADER, RecordRefused, kafka_record,
                             kafka_records)
from executor.kafka_io import KafkaSink, Mark, already_written, marked_records


def _rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [{"sensor": f"s{rng.randrange(5)}", "temp": rng.uniform(-10, 40)} for _ in range(n)]


def _as_records(rows: list[dict[str, Any]]) -> list[tuple[bytes | None, bytes, Any]]:
    return [(None, json.dumps(r).encode(), None) for r in rows]


def test_marked_records_round_trip_through_the_reader_seeded() -> None:
    """Batches marked plain, tentative or revising, read back as (headers, value): the file
    sink's records, which give the plain-Python stable and current views."""
    rng = random.Random(34)
    messages, expected = [], []
    for _ in range(200):
        rows, kind, episode = _rows(rng, rng.randrange(4)), rng.choice("ptr"), \
            rng.randrange(1, 2**31 - 2)
        tentative = [episode if kind == "t" or rng.random() < 0.3 else None for _ in rows]
        revisions = sorted(rng.sample([episode + 1, episode + 2], rng.randrange(3))) \
            if kind == "r" else []
        for _, value, headers in marked_records(_as_records(rows), tentative, revisions):
            messages.append((headers, value))
        expected += [{dpc_view.REVISION: e} for e in revisions]
        expected += [r if t is None else {**r, dpc_view.TENTATIVE: t}
                     for r, t in zip(rows, tentative)]
    read = kafka_records(messages)
    assert read.refused == [] and read.records == expected
    assert dpc_view.stable_view(read.records) == [r for r in expected if len(r) == 2]
    assert sum(1 for r in read.records if dpc_view.REVISION in r) > 0


def test_a_correction_comes_first_with_its_header_and_no_key() -> None:
    records = marked_records([(b"k", b'{"a":1}', None)], [None], [7])
    assert records == [(None, b'{"_revision":7}', [(REVISION_HEADER, b"7")]),
                       (b"k", b'{"a":1}', None)]
    assert marked_records([(b"k", b"v", [("x", b"y")]), (b"j", b"w", None)], [12, None], []) == [
        (b"k", b"v", [("x", b"y"), (TENTATIVE_HEADER, b"12")]), (b"j", b"w", None)]
    assert marked_records([], [], [3, 4]) == [  # a correction alone: no row to carry it
        (None, b'{"_revision":3}', [(REVISION_HEADER, b"3")]),
        (None, b'{"_revision":4}', [(REVISION_HEADER, b"4")])]
    with pytest.raises(ValueError, match="tentative marks for"):
        marked_records([(b"k", b"v", None)], [], [])


FORGED: dict[str, tuple[list[tuple[str, bytes | None]], bytes | None, str]] = {
    "episode 0": ([(TENTATIVE_HEADER, b"0")], b"{}", "not an episode"),
    "a negative episode": ([(TENTATIVE_HEADER, b"-1")], b"{}", "not an episode"),
    "a leading zero": ([(TENTATIVE_HEADER, b"01")], b"{}", "not an episode"),
    "a space": ([(TENTATIVE_HEADER, b" 1")], b"{}", "not an episode"),
    "an exponent": ([(TENTATIVE_HEADER, b"1e3")], b"{}", "not an episode"),
    "a non-ASCII digit": ([(TENTATIVE_HEADER, "\u0661".encode())], b"{}", "not an episode"),
    "past the range": ([(TENTATIVE_HEADER, b"2147483648")], b"{}", "outside"),
    "eleven digits": ([(TENTATIVE_HEADER, b"12345678901")], b"{}", "not an episode"),
    "no value": ([(TENTATIVE_HEADER, None)], b"{}", "without a value"),
    "given twice": ([(TENTATIVE_HEADER, b"1"), (TENTATIVE_HEADER, b"2")], b"{}", "twice"),
    "both marks": ([(TENTATIVE_HEADER, b"1"), (REVISION_HEADER, b"1")], b"{}", "both"),
    "an unknown mark": ([("elastiq-stable", b"1")], b"{}", "unknown Elastiq header"),
    "a correction's value not its own": ([(REVISION_HEADER, b"3")], b'{"_revision":4}',
                                         "whose value is not"),
    "a correction with a row": ([(REVISION_HEADER, b"3")], b'{"_revision":3,"x":1}',
                                "whose value is not"),
    "a mark in the value": ([], b'{"_tentative":1,"x":1}', "marks are headers"),
    "code as the value": ([], b"__import__('os').system('touch /tmp/pwned')", "not JSON"),
    "a JSON list": ([], b"[1, 2]", "not an object"),
    "deep nesting": ([], b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    "not UTF-8": ([], b"\xff\xfe{", "not JSON"),
}


@pytest.mark.parametrize("what", sorted(FORGED))
def test_a_forged_record_is_refused_with_its_reason(what: str) -> None:
    headers, value, reason = FORGED[what]
    with pytest.raises(RecordRefused, match=reason):
        kafka_record(headers, value)
    read = kafka_records([([], b'{"x":1}'), (headers, value), ([], b'{"x":2}')])
    assert read.records == [{"x": 1}, {"x": 2}] and [i for i, _ in read.refused] == [1]


def test_other_applications_headers_are_left_alone() -> None:
    assert kafka_record([("trace-id", b"\x00\xff"), (TENTATIVE_HEADER, b"5")], b'{"x":1}') == \
        {"x": 1, dpc_view.TENTATIVE: 5}


def test_header_parse_seeded_fuzz_never_crashes() -> None:
    """Random header names and values and random values: a record or RecordRefused, never
    another exception; an accepted tentative header is digits naming 1..2^31-1."""
    rng = random.Random(3434)
    alphabet = [b"0", b"1", b"9", b"-", b" ", b"e", b"\xff", b"\x00", b"{", b"}", b'"']
    for _ in range(5000):
        value = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        name = rng.choice([TENTATIVE_HEADER, REVISION_HEADER, "elastiq-x", "other", "ELASTIQ-A"])
        body = rng.choice([b'{"x":1}', b"", value, dpc_view.revision_text(1).encode()])
        try:
            record = kafka_record([(name, rng.choice([value, None]))], body)
        except RecordRefused:
            continue
        assert isinstance(record, dict)
        mark = record.get(dpc_view.TENTATIVE, record.get(dpc_view.REVISION))
        assert mark is None or 1 <= mark <= dpc_view.MAX_EPISODE


class _Transactions(KafkaSink):
    """A KafkaSink whose transactions are recorded instead of sent (the sink's own logic: the
    mark it keeps, the skip it decides); `committed` is what Kafka would hold."""

    def __init__(self) -> None:
        super().__init__("u", bootstrap="127.0.0.1:9", topic="o", fmt="jsonl", key_column=None,
                         exactly_once=True, transactional_id="tx", run_id=lambda: "run-1")
        self.committed: list[tuple[int, list[Any]]] = []

    def _start_transactions(self) -> None:
        if self._producer is None:
            self._producer, self._run = object(), "run-1"
            self._mark = self.committed and Mark(self.committed[-1][0], "run-1") or None

    def _write(self, records: Any, batch_id: int, run: str) -> None:
        self.committed.append((batch_id, list(records)))
        self._mark = Mark(batch_id, run)


class _Frame:
    def __init__(self, temps: list[float]) -> None:
        self.table = pa.table({"temp": pa.array(temps, pa.float64())})

    def toArrow(self) -> pa.Table:  # noqa: N802 (Spark's name)
        return self.table


def test_a_kafka_sink_through_a_cut_writes_the_re_run_and_skips_its_replay(
        tmp_path: Path) -> None:
    """Batches 0-2 stable, 3-5 tentative (episode 1), the reconcile re-runs from batch 3: its
    first batch (Spark's id 3 again) is written under an id above every one written, with the
    correction first in its transaction; 4 (empty) writes nothing; a restart that replays
    the re-run's batch 3 skips it under the same id."""
    from executor.dpc import DpcController, DpcSink

    kafka = _Transactions()
    sink: DpcSink

    def rerun() -> None:
        sink(_Frame([30.0, 31.0]), 3)  # the re-run's batch, as Spark calls it
        sink(_Frame([]), 4)

    controller = DpcController("u", str(tmp_path), [], 1.0, lambda: None, rerun)
    (tmp_path / "spark").mkdir()
    sink = DpcSink(kafka, controller)
    for b in range(3):
        sink(_Frame([float(b)]), b)
    controller.episode, controller._pending_point = 1, True  # GO_TENTATIVE's effect
    for b in range(3, 6):
        sink(_Frame([10.0 + b]), b)
    controller.state = replace(controller.state, mode=dpc.Mode.RECONCILING)  # the heal
    controller._reconcile()
    ids = [batch for batch, _ in kafka.committed]
    assert ids == [0, 1, 2, 3, 4, 5, 6], ids  # the re-run's batch 3 went in as 6
    assert already_written(Mark(5, "run-1"), "run-1", 3), "the re-run would have been skipped"
    headers = [[h for _, _, h in records] for _, records in kafka.committed]
    assert headers[3:6] == [[[(TENTATIVE_HEADER, b"1")]]] * 3
    assert headers[6] == [[(REVISION_HEADER, b"1")], None, None]
    read = kafka_records((h, v) for _, records in kafka.committed for _, v, h in records)
    assert [r["temp"] for r in dpc_view.stable_view(read.records)] == [0.0, 1.0, 2.0, 30.0, 31.0]
    assert dpc_view.open_episodes(read.records) == []
    restarted = _Transactions()
    restarted.committed = kafka.committed
    again = DpcController("u", str(tmp_path), [], 1.0, lambda: None, lambda: None)
    DpcSink(restarted, again)(_Frame([30.0, 31.0]), 3)  # Spark replays the uncommitted batch
    assert (again.append_id(3), restarted.skipped_batches, len(restarted.committed)) == (6, 1, 7)


def test_a_downstream_batch_writes_each_row_s_mark_and_a_correction_even_without_rows() -> None:
    """`write_marked` as a downstream task's Kafka sink uses it (docs/kafka.md): a micro-batch
    mixing stable and tentative rows gets a header on its tentative records only; a batch
    whose rows a filter dropped still commits the correction it read, alone in its
    transaction; an empty batch without one writes nothing."""
    from executor.dpc import write_marked

    kafka = _Transactions()
    table = _Frame([1.0, 2.0, 3.0]).table
    write_marked(kafka, table, [None, 4, None], [], 0, 0)
    write_marked(kafka, _Frame([]).table, [], [4], 1, 1)
    write_marked(kafka, _Frame([]).table, [], [], 2, 2)
    assert [batch for batch, _ in kafka.committed] == [0, 1]
    assert [h for _, _, h in kafka.committed[0][1]] == [None, [(TENTATIVE_HEADER, b"4")], None]
    assert kafka.committed[1][1] == [(None, b'{"_revision":4}', [(REVISION_HEADER, b"4")])]
    read = kafka_records((h, v) for _, records in kafka.committed for _, v, h in records)
    assert read.refused == [] and dpc_view.open_episodes(read.records) == []
    assert [r["temp"] for r in dpc_view.stable_view(read.records)] == [1.0, 3.0]
