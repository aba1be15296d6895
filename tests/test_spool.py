"""The channel spool without Spark: the folder's operations and the pure range splitting
(`executor.spool`), the receiver thread against real ZeroMQ channel writers
(`executor.spool_receiver`), and the planner-side calls of the Spark reader called directly
(`executor.spool_source`: they are plain Python; `read` is what Spark's workers run). The Spark
layer runs it in tests/test_runtime_patterns.py and tests/test_runtime_faults.py."""

from __future__ import annotations

import json
import os
import random
import string
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from common.types import Schema
from executor import spool
from executor.channels import ChannelWriter
from executor.shapes import arrow_schema
from executor.spool_receiver import Replica, SpoolReceiver
from executor.spool_source import (SpoolConfig, SpoolPart, SpoolStreamReader, decode_config,
                                   encode_config, later, next_one_batch, offset, planned_offset)
from test_runtime_support import wait_for

SCHEMA = Schema.of(("k", "int"), ("v", "string"))
ARROW = arrow_schema(SCHEMA)


def table(lo: int, hi: int) -> pa.Table:
    return pa.table({"k": list(range(lo, hi)), "v": [f"v{i}" for i in range(lo, hi)]},
                    schema=ARROW)


# --- the folder and the pure parts ---------------------------------------------------------------

def test_batch_names_round_trip_and_other_names_are_not_batches() -> None:
    assert spool.parse_name(spool.batch_name(42, 3, 900)) == spool.SpooledBatch(42, 3, 900)
    for name in ("committed", "error", ".7.123.tmp", "42.3.9.arrow", "x" * 20 + ".1.9.arrow",
                 f"{1:020d}.3.arrow"):
        assert spool.parse_name(name) is None


def test_parse_name_never_raises_on_random_names() -> None:
    rng = random.Random(11)
    alphabet = string.printable + "é\x00"
    for _ in range(2000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        found = spool.parse_name(name)
        assert found is None or spool.batch_name(found.seq, found.chunks, found.size) == name


def test_contiguous_high_stops_at_the_first_gap() -> None:
    assert spool.contiguous_high([], 5) == 5
    assert spool.contiguous_high([6, 7, 9], 5) == 7
    assert spool.contiguous_high([3, 4], 5) == 5


def test_capped_high_bounds_a_micro_batch_by_bytes_but_takes_at_least_one_batch() -> None:
    found = {seq: spool.SpooledBatch(seq, 1, 10) for seq in (6, 7, 8, 10)}
    assert spool.capped_high(found, 5, 25) == 7
    assert spool.capped_high(found, 5, 1000) == 8  # and never over a gap
    assert spool.capped_high(found, 5, 1) == 6
    assert spool.capped_high(found, 8, 1) == 8


def test_split_units_covers_every_chunk_once_in_order_and_balances_the_parts() -> None:
    rng = random.Random(7)
    for _ in range(500):
        batches = [spool.SpooledBatch(seq, rng.randrange(1, 6), 1)
                   for seq in range(1, rng.randrange(1, 9))]
        parts = rng.randrange(1, 6)
        runs = spool.split_units(batches, parts)
        flat = [(seq, index) for units in runs for seq, _c, _s, first, end in units
                for index in range(first, end)]
        expected = [(b.seq, index) for b in batches for index in range(b.chunks)]
        assert flat == expected
        sizes = [sum(end - first for _q, _c, _s, first, end in units) for units in runs]
        assert len(runs) == min(parts, len(expected))
        assert not sizes or max(sizes) - min(sizes) <= 1
        chunks = {b.seq: b.chunks for b in batches}
        assert all(c == chunks[seq] for units in runs for seq, c, _s, _f, _e in units)


def test_written_batches_read_back_by_units_trimmed_and_marked(tmp_path: Path) -> None:
    folder = str(tmp_path / "s")
    os.makedirs(folder)
    rows = spool.CHUNK_ROWS * 2 + 5
    spool.write_batch(folder, 1, table(0, rows))
    spool.write_batch(folder, 2, table(rows, rows + 1))
    spool.write_batch(folder, 3, table(0, 0))
    found = spool.listing(folder)
    assert {seq: b.chunks for seq, b in found.items()} == {1: 3, 2: 1, 3: 1}
    assert all(b.size == os.path.getsize(os.path.join(folder, spool.batch_name(
        b.seq, b.chunks, b.size))) for b in found.values())
    runs = spool.split_units([found[1], found[2], found[3]], 2)
    got = [batch for units in runs for batch in spool.read_units(folder, units, ARROW)]
    assert pa.Table.from_batches(got, schema=ARROW).column("k").to_pylist() == \
        list(range(rows + 1))
    spool.write_committed(folder, 2)
    assert spool.read_committed(folder) == 2
    assert spool.trim(folder, 2) == 2
    assert sorted(spool.listing(folder)) == [3]
    with pytest.raises(spool.SpoolError, match="batch 1 is gone"):
        list(spool.read_units(folder, runs[0], ARROW))


def test_an_unreadable_committed_mark_is_refused_with_its_path(tmp_path: Path) -> None:
    (tmp_path / spool.COMMITTED).write_text("12x", encoding="utf-8")
    with pytest.raises(spool.SpoolError, match="unreadable committed mark"):
        spool.read_committed(str(tmp_path))


def test_one_batch_offsets_alternate_a_batch_and_its_flush_step() -> None:
    start = offset("c", 4, True)
    assert next_one_batch(start, 4) == start  # nothing new
    step = next_one_batch(start, 9)
    assert step == offset("c", 5, False)  # one batch, although 5 are there
    assert next_one_batch(step, 9) == offset("c", 5, True)
    assert later(step, offset("c", 5, True)) == offset("c", 5, True)
    assert later(None, step) == step and later(offset("c", 6), step) == offset("c", 6)


def test_config_survives_the_json_option() -> None:
    config = SpoolConfig("t", "select:x", "/ck/spool/x", "/ck/spark", (("k", "int"),), 3, True)
    assert decode_config(encode_config(config)) == config


def test_planned_offset_finds_this_spool_in_sparks_last_offsets_file(tmp_path: Path) -> None:
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    assert planned_offset(str(tmp_path), "a") is None
    for batch, (a, b) in enumerate([(1, 1), (4, 2)]):
        (offsets / str(batch)).write_text("\n".join([
            "v1", json.dumps({"batchWatermarkMs": 0}),
            json.dumps(offset("a", a, False)), json.dumps(offset("b", b))]), encoding="utf-8")
    assert planned_offset(str(tmp_path), "a") == offset("a", 4, False)
    assert planned_offset(str(tmp_path), "b") == offset("b", 2)
    assert planned_offset(str(tmp_path), "c") is None


# --- the receiver against real writers -----------------------------------------------------------

def writer_for(channel: str, reader: str, **kwargs: Any) -> ChannelWriter:
    return ChannelWriter(channel, ARROW, expected_readers=[reader], **kwargs)


def config_for(folder: Path, **kwargs: Any) -> SpoolConfig:
    return SpoolConfig("t", "up", str(folder), str(folder.parent / "spark"),
                       (("k", "int"), ("v", "string")), **kwargs)


def read_range(reader: SpoolStreamReader, start: dict, end: dict) -> list[int]:
    keys: list[int] = []
    for part in reader.partitions(start, end):
        assert isinstance(part, SpoolPart)
        for batch in reader.read(part):
            keys.extend(batch.column("k").to_pylist())
    return keys


def test_receiver_spools_in_order_and_commit_acks_upstream_and_trims(tmp_path: Path) -> None:
    writer = writer_for("up", "t/up")
    folder = tmp_path / "spool"
    writer.send(table(0, 10), 0)  # before the spool exists: the base is before it
    receiver = SpoolReceiver("t", str(folder), [Replica("up", "t/up", writer.endpoint)],
                             ARROW).start()
    try:
        for tag in range(1, 6):
            writer.send(table(tag * 10, tag * 10 + 10), tag)
        reader = SpoolStreamReader(config_for(folder))
        start = reader.initialOffset()
        assert start == offset("up", 0)
        wait_for(lambda: reader.latestOffset()["seq"] == 6, 20, "six spooled batches")
        end = offset("up", 6)
        assert read_range(reader, start, end) == list(range(60))
        reader.commit(end)
        wait_for(lambda: writer.stats().acked.get("t/up") == 6, 20, "the ack upstream")
        assert spool.listing(str(folder)) == {}
        writer.send(table(60, 61), 6)
        wait_for(lambda: reader.latestOffset()["seq"] == 7, 20, "the next batch")
        assert read_range(reader, end, offset("up", 7)) == [60]
    finally:
        receiver.close()
        writer.close()


def test_a_new_receiver_resumes_after_what_is_spooled_and_spark_replays_it(
        tmp_path: Path) -> None:
    """A restarted task: batches spooled but not committed are read again from the folder, and
    the new receiver continues after them (nothing asked twice, nothing lost)."""
    writer = writer_for("up", "t/up")
    folder = tmp_path / "spool"
    replica = [Replica("up", "t/up", writer.endpoint)]
    first = SpoolReceiver("t", str(folder), replica, ARROW).start()
    try:
        for tag in range(3):
            writer.send(table(tag * 10, tag * 10 + 10), tag)
        reader = SpoolStreamReader(config_for(folder))
        wait_for(lambda: reader.latestOffset()["seq"] == 3, 20, "three spooled batches")
        reader.commit(offset("up", 1))
    finally:
        first.close()
    second = SpoolReceiver("t", str(folder), replica, ARROW).start()
    try:
        writer.send(table(30, 40), 3)
        again = SpoolStreamReader(config_for(folder))
        wait_for(lambda: again.latestOffset()["seq"] == 4, 20, "the batch after the restart")
        assert read_range(again, offset("up", 1), offset("up", 4)) == list(range(10, 40))
    finally:
        second.close()
        writer.close()


def test_the_spool_is_bounded_until_spark_commits(tmp_path: Path) -> None:
    writer = writer_for("up", "t/up")
    folder = tmp_path / "spool"
    receiver = SpoolReceiver("t", str(folder), [Replica("up", "t/up", writer.endpoint)], ARROW,
                             credit=2, max_spool_bytes=1).start()
    try:
        for tag in range(8):
            writer.send(table(tag * 10, tag * 10 + 10), tag)
        reader = SpoolStreamReader(config_for(folder))
        wait_for(lambda: reader.latestOffset()["seq"] >= 1, 20, "the first batch")
        wait_for(lambda: writer.stats().data_frames >= 2, 20, "the credit to be used")
        # the credit granted with the first poll's batches (before they were spooled) may still
        # bring frames in; once none came for 0.5 s, more would have come if the receiver
        # granted credit over the bound (it has 8 batches to send)
        seen = {"frames": -1, "since": time.monotonic()}

        def writer_stopped() -> bool:
            frames = writer.stats().data_frames
            if frames != seen["frames"]:
                seen.update(frames=frames, since=time.monotonic())
            return time.monotonic() - seen["since"] >= 0.5

        wait_for(writer_stopped, 20, "the writer to stop sending at the bound")
        sent = writer.stats().data_frames
        spooled = sorted(spool.listing(str(folder)))
        assert spooled in ([1], [1, 2])  # one poll's batches, no more
        assert sent <= len(spooled) + 2 < 8  # at most a credit's worth in flight, then none
        reader.commit(offset("up", 1))
        wait_for(lambda: 2 in spool.listing(str(folder)), 20, "receiving after the commit")
    finally:
        receiver.close()
        writer.close()


def test_a_writers_refusal_reaches_the_reader_as_the_querys_failure(tmp_path: Path) -> None:
    writer = writer_for("up", "t/up")
    folder = tmp_path / "spool"
    for tag in range(3):
        writer.send(table(tag, tag + 1), tag)
    spool.write_committed(str(folder), 0)
    stranger = SpoolReceiver("t", str(folder), [Replica("up", "t/other", writer.endpoint)],
                             ARROW).start()  # a reader id the writer never declared
    try:
        reader = SpoolStreamReader(config_for(folder, start_seconds=1.0))
        wait_for(lambda: spool.read_error(str(folder)) is not None, 20, "the refusal")
        with pytest.raises(spool.SpoolError, match="channel up"):
            reader.latestOffset()
    finally:
        stranger.close()
        writer.close()
    assert spool.listing(str(folder)) == {}


def test_selector_takes_each_seq_once_from_whichever_replica_has_it(tmp_path: Path) -> None:
    writers = [writer_for(f"rep.{i}", f"t/rep.{i}") for i in (1, 2)]
    folder = tmp_path / "spool"
    log_file = tmp_path / "sources.log"
    replicas = [Replica(w.channel_id, f"t/{w.channel_id}", w.endpoint) for w in writers]
    receiver = SpoolReceiver("t", str(folder), replicas, ARROW, log_file=str(log_file),
                             retry_seconds=0.2).start()
    try:
        for tag in range(3):  # replica 2 lags
            writers[0].send(table(tag * 10, tag * 10 + 10), tag)
        reader = SpoolStreamReader(config_for(folder))
        wait_for(lambda: reader.latestOffset()["seq"] == 3, 20, "three batches")
        writers[0].close()  # replica 1 fails; replica 2 serves the rest, and the same seqs again
        for tag in range(6):
            writers[1].send(table(tag * 10, tag * 10 + 10), tag)
        wait_for(lambda: reader.latestOffset()["seq"] == 6, 30, "the rest from replica 2")
        assert read_range(reader, offset("up", 0), offset("up", 6)) == list(range(60))
        reader.commit(offset("up", 6))
        wait_for(lambda: writers[1].stats().acked.get("t/rep.2") == 6, 20, "the ack")
    finally:
        receiver.close()
        writers[1].close()
    logged = log_file.read_text(encoding="utf-8")
    assert "selector now reads replica rep.1 at seq 1" in logged
    assert "selector now reads replica rep.2 at seq 4" in logged


def test_one_batch_reader_takes_one_spooled_batch_per_micro_batch(tmp_path: Path) -> None:
    folder = tmp_path / "spool"
    os.makedirs(folder)
    spool.write_committed(str(folder), 0)
    for seq in (1, 2, 3):
        spool.write_batch(str(folder), seq, table(seq * 10, seq * 10 + 2))
    reader = SpoolStreamReader(config_for(folder, one_batch=True, idle_seconds=0.01))
    start = reader.initialOffset()
    steps = [start]
    for _ in range(7):
        steps.append(reader.latestOffset())
    assert [(s["seq"], s["flushed"]) for s in steps] == [
        (0, True), (1, False), (1, True), (2, False), (2, True), (3, False), (3, True), (3, True)]
    assert read_range(reader, steps[0], steps[1]) == [10, 11]
    assert read_range(reader, steps[1], steps[2]) == []  # the flush step reads nothing
    # a restarted planner resumes where Spark's offset log says, not at the start
    spark = folder.parent / "spark" / "offsets"
    spark.mkdir(parents=True)
    (spark / "0").write_text("v1\n{}\n" + json.dumps(steps[4]), encoding="utf-8")
    fresh = SpoolStreamReader(config_for(folder, one_batch=True, idle_seconds=0.01))
    assert fresh.latestOffset() == offset("up", 3, False)


def test_a_replay_of_batches_never_spooled_fails_with_the_range(tmp_path: Path) -> None:
    folder = tmp_path / "spool"
    os.makedirs(folder)
    spool.write_committed(str(folder), 0)
    spool.write_batch(str(folder), 1, table(0, 1))
    reader = SpoolStreamReader(config_for(folder, replay_seconds=0.3))
    with pytest.raises(spool.SpoolError, match=r"batches 2..3 of \(0, 3\]"):
        reader.partitions(offset("up", 0), offset("up", 3))


def test_a_receiver_waiting_for_its_first_answer_follows_a_moved_writer(tmp_path: Path) -> None:
    """The producer was relaunched elsewhere (its port was taken) before it ever answered:
    the receiver must not keep asking the old endpoint for its base."""
    import socket

    from executor.endpoints_file import write_endpoints

    with socket.socket() as silent:  # an endpoint nobody answers on
        silent.bind(("127.0.0.1", 0))
        gone = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    writer = writer_for("up", "t/up")
    folder = tmp_path / "spool"
    endpoints = tmp_path / "endpoints.json"
    receiver = SpoolReceiver("t", str(folder), [Replica("up", "t/up", gone)], ARROW,
                             endpoints_file=str(endpoints)).start()
    try:
        writer.send(table(0, 5), 0)
        write_endpoints(str(endpoints), {"up": writer.endpoint})
        reader = SpoolStreamReader(config_for(folder))
        wait_for(lambda: reader.latestOffset()["seq"] == 1, 30, "the batch at the new endpoint")
        assert read_range(reader, offset("up", 0), offset("up", 1)) == list(range(5))
    finally:
        receiver.close()
        writer.close()


# --- a selector's liveness (a DPC input, docs/availability.md) -----------------------------------

def test_a_selector_is_reachable_while_any_replica_answers_and_cut_only_when_all_are(
        tmp_path: Path) -> None:
    """Two replica writers, each behind a `LinkProxy` that stops every byte (a partition):
    with one cut the stream stays reachable (the other answers the probes), with both cut it is
    unreachable and last heard at the latest word of either, and `writer_last_seq` is the
    highest answer of the replicas that answer (none: None)."""
    from testkit.dpc_support import LinkProxy

    writers = [writer_for(f"rep.{i}", f"t/rep.{i}") for i in (1, 2)]
    proxies = [LinkProxy(w.endpoint) for w in writers]
    replicas = [Replica(w.channel_id, f"t/{w.channel_id}", p.endpoint)
                for w, p in zip(writers, proxies)]
    receiver = SpoolReceiver("t", str(tmp_path / "spool"), replicas, ARROW, liveness=True,
                             retry_seconds=0.2)
    views = receiver._sources  # the replicas' own liveness, read to know when a probe saw one
    try:
        for w in writers:
            w.send(table(0, 5), 0)
        receiver.start()
        wait_for(lambda: receiver.spooled_high == 1, 20, "the first batch")
        assert receiver.writer_last_seq(timeout=5.0) == 1
        proxies[0].cut()

        def first_cut_seen() -> bool:
            assert receiver.reachable, "the stream went unreachable with a replica answering"
            return not views[0].reachable

        wait_for(first_cut_seen, 20, "replica 1 unreachable", step=0.05)
        assert views[1].reachable and receiver.reachable
        writers[1].send(table(5, 10), 1)  # only replica 2 has seq 2: the highest answer
        wait_for(lambda: receiver.spooled_high == 2, 20, "seq 2 from replica 2")
        assert receiver.writer_last_seq(timeout=5.0) == 2
        proxies[1].cut()
        wait_for(lambda: not receiver.reachable, 20, "the stream unreachable")
        assert not views[0].reachable and not views[1].reachable
        assert receiver.last_heard == max(v.last_heard for v in views) == views[1].last_heard
        assert receiver.writer_last_seq(timeout=0.3) is None
        proxies[1].heal()
        wait_for(lambda: receiver.reachable, 20, "the stream reachable again")
        assert views[1].reachable and not views[0].reachable
        assert receiver.writer_last_seq(timeout=5.0) == 2
    finally:
        receiver.close()
        for p in proxies:
            p.close()
        for w in writers:
            w.close()


def test_range_answers_share_one_wait_among_silent_writers() -> None:
    """Four writers that never answer (a partition) cost one timeout, not four; a writer that
    answers is answered at once."""
    from executor.channels import ChannelReader
    from executor.spool_receiver import range_answers
    from testkit.dpc_support import LinkProxy

    writers = [writer_for(f"w.{i}", f"t/w.{i}") for i in range(5)]
    proxies = [LinkProxy(w.endpoint) for w in writers[1:]]
    for p in proxies:
        p.cut()
    endpoints = [writers[0].endpoint, *(p.endpoint for p in proxies)]
    readers = {i: ChannelReader(w.channel_id, f"t/w.{i}", e, ARROW)
               for i, (w, e) in enumerate(zip(writers, endpoints))}
    try:
        writers[0].send(table(0, 1), 0)
        started = time.monotonic()
        answers, errors = range_answers(readers, 0.5)
        took = time.monotonic() - started
        assert answers == {0: (1, 1)} and errors == {}
        assert 0.5 <= took < 1.5, took  # sequential waits would take at least 2 s
    finally:
        for r in readers.values():
            r.close(flush_timeout=0)
        for p in proxies:
            p.close()
        for w in writers:
            w.close()


# --- the end of a stream: a finished upstream is never cut (docs/availability.md) -----------

def test_an_ended_stream_is_not_cut_when_its_writer_goes_but_one_gone_without_an_end_is(
        tmp_path: Path) -> None:
    """Two real writers, each sends two batches and goes away (closed: its task ended and
    released its channel); one said its stream ended first (`ChannelWriter.end`). Once its
    last seq is spooled the receiver says ended (and stops probing it): the decision of a
    union without max-delay over it stays STABLE. The other is a cut input: the union holds."""
    from common import dpc

    receivers: dict[str, SpoolReceiver] = {}
    writers = {name: writer_for(name, f"t/{name}") for name in ("ends", "vanishes")}
    try:
        for name, writer in writers.items():
            writer.send(table(0, 5), 0)
            receivers[name] = SpoolReceiver(
                "t", str(tmp_path / name), [Replica(name, f"t/{name}", writer.endpoint)],
                ARROW, liveness=True).start()
            writer.send(table(5, 10), 1)
        for name, receiver in receivers.items():
            wait_for(lambda r=receiver: r.spooled_high == 2, 20, f"{name}'s two batches")
        assert writers["ends"].end() == 2
        wait_for(lambda: receivers["ends"].ended, 20, "the end heard by a probe", step=0.05)
        for writer in writers.values():
            writer.close()
        wait_for(lambda: not receivers["vanishes"].reachable, 20, "the vanished writer cut")
        ended, gone = receivers["ends"], receivers["vanishes"]
        views = tuple(dpc.InputView(n, r.last_heard, r.reachable, r.ended)
                      for n, r in (("ends", ended), ("vanishes", gone)))
        assert views[0].ended and not views[0].cut and views[1].cut
        now = time.monotonic()
        assert dpc.step(dpc.State(), views[:1], None, now).state.mode is dpc.Mode.STABLE
        assert dpc.step(dpc.State(), views, None, now).action is dpc.Action.HOLD
    finally:
        for receiver in receivers.values():
            receiver.close()
        for writer in writers.values():
            writer.close()


def test_a_merger_input_retargeted_to_no_writer_is_dormant_and_placed_again_is_waited_for(
        tmp_path: Path) -> None:
    """A merger's input from an instance a scale-in retired: its writer goes (closed, as the
    drained instance is killed) and is cut, until the endpoints file (the scheduler's
    retarget, `messages.UNPLACED`) says it is not placed: then it is dormant, not cut, and not
    probed. A scale-out places a new writer there (a new attempt, the same stream numbering
    on): the receiver reads its next batch, and it is waited for again when that one goes."""
    from common import dpc
    from executor.endpoints_file import write_endpoints

    endpoints = tmp_path / "endpoints.json"
    log = str(tmp_path / "log")  # the instance's upstream backup: a relaunch numbers on
    writer = writer_for("f_2_out", "t/m", log_dir=log)
    receiver = SpoolReceiver("t", str(tmp_path / "spool"), [Replica("f_2_out", "t/m",
                                                                    writer.endpoint)],
                             ARROW, endpoints_file=str(endpoints), liveness=True).start()
    again: ChannelWriter | None = None
    try:
        writer.send(table(0, 5), 0)
        wait_for(lambda: receiver.spooled_high == 1, 20, "the instance's batch")
        writer.close()  # drained and killed by the scale-in
        wait_for(lambda: not receiver.reachable, 20, "the gone writer cut")
        assert dpc.waited_for((view_of(receiver),)) == ("f_2_out",)
        write_endpoints(str(endpoints), {"f_2_out": ""})
        wait_for(lambda: receiver.dormant, 20, "the retarget to no writer")
        assert dpc.waited_for((view_of(receiver),)) == ()
        again = writer_for("f_2_out", "t/m", log_dir=log)
        again.send(table(5, 9), 1)
        write_endpoints(str(endpoints), {"f_2_out": again.endpoint})
        wait_for(lambda: receiver.spooled_high == 2, 20, "the relaunched instance's batch")
        assert not receiver.dormant and receiver.reachable
        again.close()
        wait_for(lambda: not receiver.reachable, 20, "the relaunched writer cut")
        assert dpc.waited_for((view_of(receiver),)) == ("f_2_out",)
    finally:
        receiver.close()
        writer.close()
        if again is not None:
            again.close()


def view_of(receiver: SpoolReceiver) -> Any:
    from common import dpc

    return dpc.InputView("f_2_out", receiver.last_heard, receiver.reachable, receiver.ended,
                         receiver.dormant)
