"""DPC marks across a channel without Spark (docs/availability.md, "Marks across channels"):
the marks' encoding in a channel's Arrow table (a seeded fuzz of the round trip through the
frame codec, against plain-Python rows), forged marks refused by the codec and by a real
ZeroMQ reader (counted, the reader goes on), the downstream sink's lines, the revisions a
micro-batch read from its spool, a batch without a row to carry its revision (a correction
row), the upstream sink's revision riding on the re-run's first batch, and a DPC task's upsert
log (an updating aggregate's file sink) keeping its records, read per key."""

from __future__ import annotations

import json
import random
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import zmq

from common import dpc_redo, dpc_view
from common.types import Schema
from executor import dpc_marks, spool
from executor.channels import ChannelReader
from executor.dpc import BatchMark, DpcSink, marked_lines
from executor.dpc_downstream import revisions_in, row_marks
from executor.dpc_marks import MAX_EPISODE, REVISION_MARK, TENTATIVE_MARK, MarkError
from executor.shapes import arrow_schema
from executor.wire import FrameError, Header, Kind, decode_header, decode_table, encode_header, \
    encode_table

STREAM = Schema.of(("sensor", "string"), ("ts", "timestamp"), ("temp", "double"))
WIRE = arrow_schema(dpc_marks.with_marks(STREAM))
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [{"sensor": rng.choice(["s-1", "s-2", None]), "ts": T0 + timedelta(seconds=i),
             "temp": rng.uniform(-10, 40)} for i in range(n)]


def base_table(data: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(data, schema=arrow_schema(STREAM))


def wire_table(data: list[dict[str, Any]], tentative: list[int | None],
               revision: list[int | None]) -> pa.Table:
    """A wire table built column by column, marks as given (for forging)."""
    return base_table(data).append_column(TENTATIVE_MARK, pa.array(tentative, pa.int64())) \
        .append_column(REVISION_MARK, pa.array(revision, pa.int64()))


def test_marks_round_trip_through_the_frame_codec_seeded_fuzz() -> None:
    """Rows marked one by one and a batch's revisions (none, one, two), through the codec:
    a reader's records (`channel_records`) are the plain-Python ones, and a revision rides on
    the stable rows when it can, else on a correction row."""
    rng = random.Random(34)
    for _ in range(300):
        data = rows(rng, rng.randrange(0, 12))
        episode = rng.choice([1, 2, rng.randrange(1, MAX_EPISODE - 1), MAX_EPISODE - 2])
        tentative = [rng.choice([None, episode]) for _ in data]
        revisions = sorted(rng.sample([episode + 1, episode + 2], rng.choice([0, 0, 1, 1, 2])))
        table = dpc_marks.mark_rows(base_table(data), WIRE, tentative, revisions)
        back = decode_table(encode_table(table), WIRE)
        assert dpc_marks.check_marks(back) == revisions == dpc_marks.revisions_of(back)
        expected = [{dpc_view.REVISION: e} for e in revisions] + [
            r if t is None else {**r, dpc_view.TENTATIVE: t} for r, t in zip(data, tentative)]
        assert dpc_view.channel_records([back.to_pylist()]) == expected
        on_rows = len(revisions) == 1 and None in tentative
        assert back.num_rows == len(data) + (0 if on_rows else len(revisions))
        spooled = [dpc_marks.without_corrections(b) for b in back.to_batches()]
        assert sum(b.num_rows for b in spooled) == len(data)  # what Spark reads of it


FORGED = {
    "episode 0": ([0], [None]),
    "a negative episode": ([-5], [None]),
    "an episode past the range": ([MAX_EPISODE + 1], [None]),
    "a revision 0": ([None], [0]),
    "a correction row with data": ([3], [3]),
    "a row tentative in one episode revising another": ([3], [4]),
    "two episodes revised in one batch": ([None, None], [1, 2]),
}


@pytest.mark.parametrize("what", sorted(FORGED))
def test_a_forged_mark_is_refused_by_the_codec(what: str) -> None:
    tentative, revision = FORGED[what]
    data = rows(random.Random(1), len(tentative))
    forged = wire_table(data, tentative, revision)
    with pytest.raises(FrameError, match="bad DPC mark"):
        decode_table(encode_table(forged), WIRE)


def test_marks_of_another_type_or_missing_are_refused_as_a_schema_mismatch() -> None:
    data = rows(random.Random(2), 2)
    as_text = base_table(data).append_column(TENTATIVE_MARK, pa.array(["1", None])) \
        .append_column(REVISION_MARK, pa.array([None, None], pa.int64()))
    for table in (as_text, base_table(data)):
        with pytest.raises(FrameError, match="does not match the channel schema"):
            decode_table(encode_table(table), WIRE)


def test_marking_refuses_what_no_frame_may_carry() -> None:
    table = base_table(rows(random.Random(3), 1))
    with pytest.raises(MarkError, match="both tentative"):
        dpc_marks.mark_table(table, WIRE, 1, 1)
    with pytest.raises(MarkError, match="outside"):
        dpc_marks.mark_table(table, WIRE, 0, None)
    with pytest.raises(ValueError, match="reserved for DPC marks"):
        dpc_marks.with_marks(Schema.of(("x", "int"), (TENTATIVE_MARK, "int")))


def _recv_kind(router: zmq.Socket, kind: Kind, reader: ChannelReader) -> tuple[bytes, Header]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        reader.poll(0.05)  # the reader's thread of control sends from its poll
        if router.poll(50):
            identity, raw = router.recv_multipart()
            header = decode_header(raw)
            if header.kind is kind:
                return identity, header
    raise AssertionError(f"no {kind.name} frame")


def test_a_real_reader_counts_a_forged_mark_asks_again_and_goes_on() -> None:
    """A writer (a ROUTER socket speaking the protocol) sends seq 1 with a forged mark: the
    reader refuses it (counted), subscribes again from seq 1 and takes the good batch."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    reader = ChannelReader("u.out", "f", f"tcp://127.0.0.1:{port}", WIRE)
    try:
        reader.subscribe()
        data = rows(random.Random(4), 3)
        good = dpc_marks.mark_table(base_table(data), WIRE, 2, None)
        forged = wire_table(data, [2, 2, -1], [None, None, None])
        identity, sub = _recv_kind(router, Kind.SUBSCRIBE, reader)
        for table in (forged, good):
            router.send_multipart([identity, encode_header(
                Header(Kind.SUBSCRIBED, "u.out", 1, 0, 0, sub.d))])
            router.send_multipart([identity, encode_header(
                Header(Kind.DATA, "u.out", 1, 1, 0, sub.d)), encode_table(table).to_pybytes()])
            if table is forged:
                identity, sub = _recv_kind(router, Kind.SUBSCRIBE, reader)
                assert sub.a == 1, "the reader did not ask for seq 1 again"
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = reader.poll(0.1)
        assert [b.table.to_pylist() for b in got] == [good.to_pylist()]
        assert reader.stats().refused_frames == 1
    finally:
        reader.close(flush_timeout=0)
        router.close()


def test_marked_lines_mark_each_row_derived_from_a_tentative_one() -> None:
    rng = random.Random(5)
    for _ in range(50):
        data = rows(rng, rng.randrange(0, 10))
        marks = [rng.choice([None, 1, 7]) for _ in data]
        table = base_table(data).append_column(TENTATIVE_MARK, pa.array(marks, pa.int64()))
        got = [{**r, "ts": datetime.fromisoformat(r["ts"])}
               for r in map(json.loads, marked_lines(*row_marks(table)))]
        expected = [{**r, **({} if m is None else {dpc_view.TENTATIVE: m})}
                    for r, m in zip(data, marks)]
        assert sorted(got, key=repr) == sorted(expected, key=repr)
        assert len(dpc_view.stable_view(got)) == marks.count(None)


def _offsets(spark_dir: Path, batch: int, seq: int) -> None:
    folder = spark_dir / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(batch)).write_text(
        'v1\n{"batchWatermarkMs":0}\n' + json.dumps({"spool": "u.out", "seq": seq}) + "\n")


def test_a_micro_batch_writes_the_revisions_of_the_spooled_batches_it_read(
        tmp_path: Path) -> None:
    folder, spark_dir = tmp_path / "spool", tmp_path / "spark"
    folder.mkdir()
    data = rows(random.Random(6), 2)
    marks = {1: (None, None), 2: (3, None), 3: (None, 3), 4: (None, None), 5: (None, 4)}
    for seq, (tentative, revision) in marks.items():
        spool.write_batch(str(folder), seq, dpc_marks.mark_table(base_table(data), WIRE,
                                                                  tentative, revision))
    _offsets(spark_dir, 0, 2)
    _offsets(spark_dir, 1, 4)
    _offsets(spark_dir, 2, 5)
    spools = [("u.out", str(folder))]
    assert revisions_in(str(spark_dir), 0, spools) == []
    assert revisions_in(str(spark_dir), 1, spools) == [3]
    assert revisions_in(str(spark_dir), 2, spools) == [4]
    assert revisions_in(str(spark_dir), 3, spools) == []  # not planned yet


def test_a_stateful_task_s_controller_keeps_its_point_asks_once_and_persists_it(
        tmp_path: Path) -> None:
    """`RedoController.on_batch` over a real spool and offset log (no Spark): the batch that
    first reads a tentative row copies the checkpoint before it aside and keeps the spool's
    batches; the one that reads the revision holds the spool and asks for the reconcile (up to
    the revising seq); the state survives a new controller (a restart); the spool's reader then
    leaves the superseded tentative rows out (`spool.read_units`)."""
    from executor.dpc_downstream import RedoController, control_of

    folder, checkpoint = tmp_path / "spool", tmp_path / "task"
    spark_dir = checkpoint / "spark"
    folder.mkdir()
    data = rows(random.Random(8), 3)
    for seq, (tentative, revision) in {1: (None, None), 2: (1, None), 3: (1, None),
                                       4: (None, 1), 5: (None, None)}.items():
        spool.write_batch(str(folder), seq, dpc_marks.mark_table(base_table(data), WIRE,
                                                                  tentative, revision))
    for batch, seq in enumerate((1, 2, 3, 5)):
        _offsets(spark_dir, batch, seq)
    (spark_dir / "commits").mkdir()
    (spark_dir / "commits" / "0").write_text("v1\n{}\n")
    asked: list[str] = []
    redo = RedoController("w", str(checkpoint), ("u.out", str(folder)),
                          lambda: asked.append("stop"), lambda: asked.append("start"))
    assert redo.on_batch(0).tentative is None
    opened = redo.on_batch(1)
    assert opened.tentative == 1 and opened.keep_point
    assert (checkpoint / "dpc" / "redo-stable" / "offsets" / "0").exists()
    assert not (checkpoint / "dpc" / "redo-stable" / "offsets" / "1").exists()
    assert spool.read_control(str(folder)) == spool.Control(keep=True)
    assert redo.on_batch(2).tentative == 1
    revising = redo.on_batch(3)
    assert revising.tentative == 1 and revising.reconcile
    assert spool.read_control(str(folder)) == spool.Control(hold=True, keep=True)
    again = RedoController("w", str(checkpoint), ("u.out", str(folder)), lambda: None,
                           lambda: None)
    assert again.state == redo.state and again.state.reconcile_upto == 4
    restored = dpc_redo.restored(again.state)
    assert control_of(restored) == spool.Control(keep=True, upto=4, superseded=1)
    spool.write_control(str(folder), control_of(restored))
    read = pa.Table.from_batches(list(spool.read_units(
        str(folder), [(seq, 1, spool.listing(str(folder))[seq].size, 0, 1)
                      for seq in (1, 2, 3, 4)], WIRE)))
    assert read.num_rows == 3 + 3  # seq 1's and the revising seq 4's; 2's and 3's left out
    assert read.column(TENTATIVE_MARK).null_count == read.num_rows


def test_a_reader_leaves_out_only_superseded_tentative_rows() -> None:
    table = wire_table(rows(random.Random(9), 4), [None, 1, 2, None], [None, None, None, 1])
    batch = table.combine_chunks().to_batches()[0]
    assert dpc_marks.without_superseded(batch, 0).num_rows == 4
    assert dpc_marks.without_superseded(batch, 1).column(TENTATIVE_MARK).to_pylist() == \
        [None, 2, None]
    assert dpc_marks.without_superseded(batch, 2).num_rows == 2
    plain = base_table(rows(random.Random(9), 2)).to_batches()[0]
    assert dpc_marks.without_superseded(plain, 5).num_rows == 2


class _Writer:
    def __init__(self) -> None:
        self.sent: list[tuple[int, pa.Table]] = []

    def send(self, table: pa.Table, tag: int) -> int:
        self.sent.append((tag, table))
        return len(self.sent)


class _Controller:
    """The two calls DpcSink makes of its controller, with the marks given."""

    def __init__(self, marks: list[BatchMark]) -> None:
        self.marks = marks

    def on_batch(self, batch_id: int) -> BatchMark:
        return self.marks[batch_id]

    def append_id(self, batch_id: int) -> int:
        return batch_id + 100


class _Frame:
    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def toArrow(self) -> pa.Table:  # noqa: N802 - Spark's name
        return self.table


def test_the_upstream_revision_rides_on_the_re_run_s_first_batch_even_without_rows() -> None:
    """A re-run's first batch carries the revision: on its rows, or, without a row, as a
    correction row (so a reader needs no later batch with rows to learn of it)."""
    from executor import sinks

    writer = _Writer()
    inner = sinks.ChannelSink("u", writer, WIRE)
    marks = [BatchMark(tentative=1), BatchMark(revision=1), BatchMark(), BatchMark(tentative=2),
             BatchMark(revision=2), BatchMark()]
    sink = DpcSink(inner, _Controller(marks))  # type: ignore[arg-type]
    data = rows(random.Random(7), 2)
    for batch_id, n in enumerate([2, 0, 2, 2, 2, 2]):
        sink(_Frame(base_table(data[:n])), batch_id)
    assert [tag for tag, _ in writer.sent] == [100, 101, 102, 103, 104, 105]
    seen = [(dpc_marks.revisions_of(t), t.num_rows) for _, t in writer.sent]
    assert seen == [([], 2), ([1], 1), ([], 2), ([], 2), ([2], 2), ([], 2)]
    for _, table in writer.sent:
        decode_table(encode_table(table), WIRE)  # every frame sent passes the reader's check
    records = dpc_view.channel_records([t.to_pylist() for _, t in writer.sent])
    assert [r for r in records if dpc_view.REVISION in r] == [{dpc_view.REVISION: 1},
                                                               {dpc_view.REVISION: 2}]
    assert len(dpc_view.stable_view(records)) == 6 and dpc_view.open_episodes(records) == []


def _upsert_oracle(batches: list[list[tuple[int, int, int]]]) -> list[dict[str, int]]:
    """Plain Python: (group, rank, value) rows applied in order, a negative rank deleting the
    key (group, -rank); the last row of each key, keys in the order they (re)appeared."""
    view: dict[tuple[int, int], dict[str, int]] = {}
    for batch in batches:
        for g, rank, v in batch:
            if rank < 0:
                view.pop((g, -rank), None)
            else:
                view[(g, rank)] = {"g": g, "rank": rank, "v": v}
    return list(view.values())


def test_a_dpc_upsert_log_keeps_its_records_and_each_view_folds_per_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A DPC task's updating aggregate into a file sink: its tentative records and deletions
    carry the episode, the stable view per key is the stable batches' upserts and the current
    view adds the open episode's (it wrote unkeyed lines before)."""
    from elastiq.service_cli import _print_stable, print_current
    from executor import sinks

    stable_before = [(1, 1, 10), (1, 2, 20), (2, 1, 5)]
    tentative = [(1, 1, 11), (1, -2, 0), (3, 1, 7)]  # a deletion among them
    rerun = [(1, 1, 12), (2, 1, 6)]  # the re-run's stable records: (1, 2) kept
    open_episode = [(2, 1, 99), (2, -1, 0)]
    batches = [stable_before, tentative, rerun, open_episode]
    marks = [BatchMark(), BatchMark(tentative=1), BatchMark(revision=1), BatchMark(tentative=2)]
    path = tmp_path / "out.jsonl"
    inner = sinks.FileSink("t", str(path), upsert_key=("g", "rank"), deletes_by="rank")
    sink = DpcSink(inner, _Controller(marks))  # type: ignore[arg-type]
    for batch_id, batch in enumerate(batches):
        g, rank, v = zip(*batch)
        sink(_Frame(pa.table({"g": list(g), "rank": list(rank), "v": list(v)})), batch_id)
    rows = dpc_view.records(path.read_text().splitlines())
    stable = dpc_view.folded(dpc_view.stable_view(rows))
    assert stable == _upsert_oracle([stable_before, rerun])
    assert dpc_view.folded(dpc_view.current_view(rows)) == \
        _upsert_oracle([stable_before, rerun, open_episode])
    assert dpc_view.open_episodes(rows) == [2]
    assert {r.get("_tentative") for r in rows if "@delete" in r} == {1, 2}  # deletions marked
    capsys.readouterr()
    assert print_current(str(path)) == 0  # `elastiq tail --current`
    assert dpc_view.records(capsys.readouterr().out.splitlines()) == \
        _upsert_oracle([stable_before, rerun, open_episode])
    assert _print_stable(path) == 0  # `elastiq tail --stable`
    printed = capsys.readouterr()
    assert dpc_view.records(printed.out.splitlines()) == stable
    assert "episode(s) [2] await" in printed.err


def test_a_reader_sees_the_stable_and_the_current_view() -> None:
    lines = ['{"w":1,"n":5}', '{"w":2,"n":3,"_tentative":1}', '{"w":3,"n":1,"_tentative":1}',
             "", '{"_revision":1}', '{"w":2,"n":4}', '{"w":3,"n":2}',
             '{"w":4,"n":1,"_tentative":2}']
    rows = dpc_view.records(lines)
    assert dpc_view.stable_view(rows) == [{"w": 1, "n": 5}, {"w": 2, "n": 4}, {"w": 3, "n": 2}]
    assert dpc_view.current_view(rows) == [{"w": 1, "n": 5}, {"w": 2, "n": 4}, {"w": 3, "n": 2},
                                           {"w": 4, "n": 1}]
    assert dpc_view.open_episodes(rows) == [2]
    before = dpc_view.records(lines[:4])
    assert dpc_view.current_view(before) == [{"w": 1, "n": 5}, {"w": 2, "n": 3}, {"w": 3, "n": 1}]
