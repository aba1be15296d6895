"""Channels over real ZeroMQ sockets on 127.0.0.1: numbering, upstream backup, credit, bad input,
retargeting and a SIGKILLed reader process. Every expected result comes from plain Python over
the same input (`batch_ids`), never from earlier output."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
import zmq

from executor.channels import (
    Batch,
    ChannelError,
    ChannelFull,
    ChannelReader,
    ChannelTimeout,
    ChannelTrimmed,
    ChannelWriter,
    RetainedBuffer,
    TagLog,
    WrongChannel,
    retention_floor,
    subscription_start,
)
from executor.wire import (
    NONE,
    ErrorCode,
    FrameError,
    Header,
    Kind,
    decode_header,
    decode_table,
    encode_header,
    encode_table,
)
from testkit.waiting import poll

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
ROWS = 10
FIXTURE = Path(__file__).parent / "fixtures" / "channel_reader_proc.py"


def batch_ids(tag: int) -> list[int]:
    """The oracle: the ids of the batch produced for `tag`."""
    return [tag * ROWS + k for k in range(ROWS)]


def make_table(tag: int) -> pa.Table:
    ids = batch_ids(tag)
    return pa.table({"id": ids, "payload": [f"row-{i}" for i in ids]}, schema=SCHEMA)


def drain(reader: ChannelReader, upto: int, *, ack: bool = True, limit_s: float = 10.0) -> list[Batch]:
    """Poll until seq `upto` arrived (bounded in time), acking as we go."""
    got: list[Batch] = []
    deadline = time.monotonic() + limit_s
    while (not got or got[-1].seq < upto) and time.monotonic() < deadline:
        batches = reader.poll(0.2)
        got.extend(batches)
        if batches and ack:
            reader.ack(batches[-1].seq)
    return got


@pytest.fixture
def closing():
    """Collects writers/readers and closes them at the end of the test."""
    items: list = []
    yield items.append
    for item in reversed(items):
        item.close()


def writer_and_reader(closing, readers=("r1",), **kw) -> tuple[ChannelWriter, ChannelReader]:
    writer = ChannelWriter("orders", SCHEMA, expected_readers=readers, **kw)
    closing(writer)
    reader = ChannelReader("orders", readers[0], writer.endpoint, SCHEMA)
    closing(reader)
    return writer, reader


# --- pure pieces ----------------------------------------------------------------------------


def test_wire_header_round_trip_and_specific_errors() -> None:
    header = Header(Kind.DATA, "orders", 7, 42, 1, 3, "r1")
    raw = encode_header(header)
    assert decode_header(raw) == header
    with pytest.raises(FrameError, match="bad magic"):
        decode_header(b"XXXX" + raw[4:])
    with pytest.raises(FrameError, match="version"):
        decode_header(raw[:4] + b"\x09" + raw[5:])
    with pytest.raises(FrameError, match="unknown frame kind"):
        decode_header(raw[:5] + b"\x63" + raw[6:])
    with pytest.raises(FrameError, match="length"):
        decode_header(raw + b"extra")
    with pytest.raises(FrameError, match="shorter"):
        decode_header(raw[:10])


def test_wire_table_round_trip_and_refusals() -> None:
    table = make_table(3)
    assert decode_table(encode_table(table), SCHEMA).equals(table)
    with pytest.raises(FrameError, match="not a valid Arrow IPC"):
        decode_table(b"\x00not arrow at all", SCHEMA)
    other = pa.table({"id": [1]})
    with pytest.raises(FrameError, match="does not match the channel schema"):
        decode_table(encode_table(other), SCHEMA)


def test_retention_decisions() -> None:
    buffer = RetainedBuffer()
    assert (buffer.first_seq, buffer.last_seq) == (1, 0)
    for tag in range(5):
        buffer.append(tag, b"x" * 10, 1)
    assert buffer.nbytes == 50 and buffer.get(3).tag == 2
    assert buffer.trim_upto(2) == 2 and buffer.first_seq == 3 and buffer.nbytes == 30
    assert not buffer.has_room(10, 3, 1000) and not buffer.has_room(30, 10, 50)
    assert retention_floor({"a": 4, "b": 2}, {"a", "b"}) == 2
    assert retention_floor({"a": 4}, {"a", "late"}) == 0
    assert retention_floor({"a": 4}, set()) == 0
    assert subscription_start(NONE, 4, 3) == (5, False)
    assert subscription_start(2, 4, 3) == (2, True)
    log = TagLog()
    log.record(10, 1)
    log.record(12, 1)  # an empty batch: no new seq
    log.record(13, 2)
    assert [log.seq_for(t) for t in (9, 10, 11, 12, 13)] == [None, 1, 1, 1, 2]


# --- delivery, numbering, retention -----------------------------------------------------------


def test_ordered_delivery_of_many_batches(closing) -> None:
    writer, reader = writer_and_reader(closing)
    reader.subscribe(timeout=5)
    total = 400
    producer = threading.Thread(target=lambda: [writer.send(make_table(t), t) for t in range(total)])
    producer.start()
    got = drain(reader, total)
    producer.join(10)
    assert [b.seq for b in got] == list(range(1, total + 1))
    assert [b.tag for b in got] == list(range(total))
    assert all(b.table.column("id").to_pylist() == batch_ids(b.tag) for b in got)
    assert reader.stats().duplicates_dropped == 0


def test_tag_idempotence_and_empty_batches(closing) -> None:
    writer, reader = writer_and_reader(closing)
    assert writer.send(make_table(5), 5) == 1
    assert writer.send(make_table(6), 6) == 2
    assert writer.send(make_table(6), 6) == 2  # the re-run of micro-batch 6
    assert writer.send(make_table(5), 5) == 1
    assert writer.send(make_table(7).slice(0, 0), 7) == 2  # empty: skipped, tag advances
    assert writer.send(make_table(7), 7) == 2  # tag 7 is taken: re-run
    assert writer.send(pa.RecordBatch.from_pylist([{"id": 1, "payload": "x"}], SCHEMA), 8) == 3
    reader.subscribe(timeout=5)
    got = drain(reader, 3)
    assert [(b.seq, b.tag) for b in got] == [(1, 5), (2, 6), (3, 8)]
    assert writer.stats().batches_sent == 3


def test_send_refuses_wrong_schema_and_oversized_batches(closing) -> None:
    writer, _ = writer_and_reader(closing, max_frame_bytes=4096)
    with pytest.raises(ChannelError, match="schema"):
        writer.send(pa.table({"id": [1]}), 1)
    big = pa.table({"id": list(range(1000)), "payload": ["x" * 50] * 1000}, schema=SCHEMA)
    with pytest.raises(ChannelError, match="above max_frame_bytes"):
        writer.send(big, 2)
    assert writer.retained_range() == (1, 0)


def test_acks_trim_the_retained_buffer(closing) -> None:
    writer, reader = writer_and_reader(closing)
    for tag in range(10):
        writer.send(make_table(tag), tag)
    assert writer.retained_range() == (1, 10)
    reader.subscribe(timeout=5)
    drain(reader, 10, ack=False)
    reader.ack(4)
    assert poll(lambda: writer.retained_range() == (5, 10), 5.0, 0.01)
    assert reader.retained_range(timeout=5) == (5, 10)
    reader.ack(10)
    assert poll(lambda: writer.retained_range() == (11, 10), 5.0, 0.01)
    assert writer.stats().retained_bytes == 0


def test_replay_after_reader_closes_and_returns_with_same_id(closing) -> None:
    writer, first = writer_and_reader(closing)
    for tag in range(30):
        writer.send(make_table(tag), tag)
    first.subscribe(timeout=5)
    seen = drain(first, 12, ack=False)
    committed = [b for b in seen if b.seq <= 9]
    first.ack(9)  # 10..12 were received but never committed
    first.close()  # confirms its ack first: the writer has trimmed what r1 committed
    assert writer.retained_range() == (10, 30)
    second = ChannelReader("orders", "r1", writer.endpoint, SCHEMA)
    closing(second)
    second.subscribe(timeout=5)  # "after my last ack"
    rest = drain(second, 30)
    union = [b.seq for b in committed] + [b.seq for b in rest]
    assert union == list(range(1, 31))
    ids = [i for b in committed + rest for i in b.table.column("id").to_pylist()]
    assert ids == [i for tag in range(30) for i in batch_ids(tag)]


def test_late_expected_reader_gets_everything(closing) -> None:
    writer = ChannelWriter("orders", SCHEMA, expected_readers=("fast", "late"))
    closing(writer)
    fast = ChannelReader("orders", "fast", writer.endpoint, SCHEMA)
    closing(fast)
    fast.subscribe(timeout=5)
    for tag in range(40):
        writer.send(make_table(tag), tag)
    assert [b.seq for b in drain(fast, 40)] == list(range(1, 41))
    time.sleep(0.1)
    assert writer.retained_range() == (1, 40)  # "late" has not acked: nothing trimmed
    late = ChannelReader("orders", "late", writer.endpoint, SCHEMA)
    closing(late)
    late.subscribe(timeout=5)
    got = drain(late, 40)
    assert [b.tag for b in got] == list(range(40))
    assert poll(lambda: writer.retained_range() == (41, 40), 5.0, 0.01)


def test_two_readers_each_get_every_batch(closing) -> None:
    writer = ChannelWriter("orders", SCHEMA, expected_readers=("a", "b"))
    closing(writer)
    readers = [ChannelReader("orders", rid, writer.endpoint, SCHEMA, credit=3) for rid in "ab"]
    for reader in readers:
        closing(reader)
        reader.subscribe(timeout=5)
    for tag in range(60):
        writer.send(make_table(tag), tag)
    for reader in readers:
        got = drain(reader, 60)
        assert [b.table.column("id").to_pylist() for b in got] == [batch_ids(t) for t in range(60)]
    assert poll(lambda: writer.stats().acked == {"a": 60, "b": 60}, 5.0, 0.01)


def test_backpressure_blocks_and_memory_stays_bounded(closing) -> None:
    bound = sum(len(encode_table(make_table(tag))) for tag in range(6))
    writer, reader = writer_and_reader(closing, max_retained_batches=100, max_retained_bytes=bound)
    reader.subscribe(timeout=5)
    for tag in range(6):
        writer.send(make_table(tag), tag, timeout=1)
    with pytest.raises(ChannelFull, match="retention full"):
        writer.send(make_table(6), 6, timeout=0.3)
    assert writer.stats().retained_bytes <= bound
    drain(reader, 6, ack=False)  # received but not acknowledged: still retained
    result: list[int] = []
    blocked = threading.Thread(target=lambda: result.append(writer.send(make_table(6), 6, timeout=5)))
    blocked.start()
    time.sleep(0.2)
    assert result == [] and writer.stats().retained_bytes <= bound
    reader.ack(2)
    blocked.join(5)
    assert result == [7]
    assert writer.stats().retained_batches == 5 and writer.stats().blocked_sends == 2


def test_count_bound_applies_backpressure(closing) -> None:
    writer, reader = writer_and_reader(closing, max_retained_batches=4)
    for tag in range(4):
        writer.send(make_table(tag), tag)
    with pytest.raises(ChannelFull):
        writer.send(make_table(4), 4, timeout=0.2)
    reader.subscribe(timeout=5)
    drain(reader, 4)
    assert writer.send(make_table(4), 4, timeout=5) == 5


def test_trimmed_range_gives_a_clear_error(closing) -> None:
    writer, reader = writer_and_reader(closing)
    for tag in range(20):
        writer.send(make_table(tag), tag)
    reader.subscribe(timeout=5)
    drain(reader, 20, ack=False)
    reader.ack(12)
    assert poll(lambda: writer.retained_range() == (13, 20), 5.0, 0.01)
    fresh = ChannelReader("orders", "r1", writer.endpoint, SCHEMA)
    closing(fresh)
    with pytest.raises(ChannelTrimmed, match=r"retained range is \(13, 20\)") as info:
        fresh.subscribe(from_seq=3, timeout=5)
    assert (info.value.first, info.value.last) == (13, 20)
    fresh.subscribe(from_seq=13, timeout=5)
    assert [b.seq for b in drain(fresh, 20)] == list(range(13, 21))


def test_fetch_replays_exact_ranges(closing) -> None:
    writer, reader = writer_and_reader(closing, readers=("r1", "slow"))  # "slow" holds retention
    for tag in range(15):
        writer.send(make_table(tag), tag)
    reader.subscribe(timeout=5)
    drain(reader, 5, ack=False)
    assert [b.seq for b in reader.fetch(2, 5, timeout=5)] == [3, 4, 5]  # from the local buffer
    reader.ack(5)
    replayed = reader.fetch(1, 11, timeout=5)  # 2..5 acked locally but retained: replayed
    assert [b.table.column("id").to_pylist() for b in replayed] == [batch_ids(t) for t in range(1, 11)]
    other = ChannelReader("orders", "spark-worker", writer.endpoint, SCHEMA, retains=False)
    closing(other)
    assert [b.tag for b in other.fetch(6, 15, timeout=5)] == list(range(6, 15))
    assert "spark-worker" not in writer.stats().acked
    with pytest.raises(ChannelTimeout):
        other.fetch(15, 16, timeout=0.3)


# --- bad input -------------------------------------------------------------------------------


def test_bad_frames_are_refused_while_a_good_reader_keeps_receiving(closing) -> None:
    writer, reader = writer_and_reader(closing, max_frame_bytes=64 << 10)
    reader.subscribe(timeout=5)
    rogue = zmq.Context.instance().socket(zmq.DEALER)
    closing(rogue)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(writer.endpoint)
    good = encode_header(Header(Kind.ACK, "orders", 1, 1, 0, 0, "r1"))
    bad = [
        [b"garbage"],
        [b"XXXX" + good[4:]],
        [good, b"an unexpected second frame"],
        [encode_header(Header(Kind.DATA, "orders", 1, 1, 0, 0))],  # a writer's kind
        [encode_header(Header(Kind.SUBSCRIBE, "orders", 1, 8, 0, 1))],  # no reader id
        [b"\x00" * ((64 << 10) + 10)],  # above max_frame_bytes, under ZeroMQ's hard cap
    ]
    for tag in range(50):
        writer.send(make_table(tag), tag)
        if tag % 8 == 0 and bad:
            rogue.send_multipart(bad.pop())
    got = drain(reader, 50)
    assert [b.tag for b in got] == list(range(50))
    assert poll(lambda: writer.stats().refused_frames == 6, 5.0, 0.01)
    replies = []
    while rogue.poll(1000) and len(replies) < 6:
        replies.append(decode_header(rogue.recv()))
    assert [h.a for h in replies] == [ErrorCode.BAD_FRAME] * 6
    assert "exceeds max_frame_bytes" in " ".join(h.text for h in replies)
    rogue.send(encode_header(Header(Kind.SUBSCRIBE, "payments", NONE, 8, 0, 1, "x")))
    assert rogue.poll(2000)
    reply = decode_header(rogue.recv())
    assert reply.a == ErrorCode.WRONG_CHANNEL and "serves channel orders, not payments" in reply.text
    rogue.send(b"\x00" * (512 << 10))  # far above: ZeroMQ drops the connection
    writer.send(make_table(50), 50)
    assert [b.tag for b in drain(reader, 51)] == [50]


def test_reader_pointed_at_another_channel_gets_an_explicit_error(closing) -> None:
    writer = ChannelWriter("payments", SCHEMA)
    closing(writer)
    reader = ChannelReader("orders", "r1", writer.endpoint, SCHEMA)
    closing(reader)
    expected = f"endpoint {writer.endpoint} serves channel payments, not orders"
    with pytest.raises(WrongChannel, match=expected):
        reader.subscribe(timeout=5)
    with pytest.raises(WrongChannel, match=expected):
        reader.retained_range(timeout=5)


def _recv_kind(router: zmq.Socket, reader: ChannelReader, kind: Kind, limit_s: float = 5) -> tuple[bytes, Header]:
    """Drive `reader` while waiting for a frame of `kind` on the fake writer's socket."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        reader.poll(0.02)
        while router.poll(0):
            identity, raw = router.recv_multipart()
            header = decode_header(raw)
            if header.kind is kind:
                return identity, header
    raise AssertionError(f"no {kind.name} frame")


def _fake_writer_and_reader(closing) -> tuple[zmq.Socket, ChannelReader]:
    """A bare ROUTER socket standing for a writer (what a bug or a garbled frame would send)
    and a subscribed reader of channel "orders" connected to it, both closed after the test."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    closing(router)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    reader = ChannelReader("orders", "r1", f"tcp://127.0.0.1:{port}", SCHEMA)
    closing(reader)
    reader.subscribe()
    return router, reader


def test_reader_refuses_undecodable_and_mismatched_bodies(closing) -> None:
    router, reader = _fake_writer_and_reader(closing)

    def data(seq: int, sub: int, body: bytes, channel: str = "orders") -> list[bytes]:
        return [encode_header(Header(Kind.DATA, channel, seq, seq, 0, sub)), body]

    assert router.poll(5000)
    identity, raw = router.recv_multipart()
    assert decode_header(raw).kind is Kind.SUBSCRIBE
    router.send_multipart([identity, encode_header(Header(Kind.SUBSCRIBED, "orders", 1, 0, 0, 1))])
    router.send_multipart([identity, *data(1, 1, encode_table(make_table(1)))])
    router.send_multipart([identity, b"not a frame"])
    router.send_multipart([identity, *data(2, 1, encode_table(make_table(2)), channel="payments")])
    router.send_multipart([identity, *data(2, 1, b"\xff" * 64)])  # IPC that does not decode
    got = drain(reader, 1, ack=False)
    identity, sub = _recv_kind(router, reader, Kind.SUBSCRIBE)  # it asks for seq 2 again
    assert sub.a == 2
    router.send_multipart([identity, encode_header(Header(Kind.SUBSCRIBED, "orders", 2, 0, 0, sub.d))])
    router.send_multipart([identity, *data(2, sub.d, encode_table(pa.table({"x": [1.0]})))])
    identity, sub = _recv_kind(router, reader, Kind.SUBSCRIBE)
    router.send_multipart([identity, encode_header(Header(Kind.SUBSCRIBED, "orders", 2, 0, 0, sub.d))])
    for seq in (2, 3):
        router.send_multipart([identity, *data(seq, sub.d, encode_table(make_table(seq)))])
    got += drain(reader, 3, ack=False)
    assert [b.table.column("id").to_pylist() for b in got] == [batch_ids(t) for t in (1, 2, 3)]
    assert reader.stats().refused_frames == 4


def test_reader_drops_duplicates_and_stale_subscription_data(closing) -> None:
    router, reader = _fake_writer_and_reader(closing)
    identity, sub = _recv_kind(router, reader, Kind.SUBSCRIBE)
    router.send_multipart([identity, encode_header(Header(Kind.SUBSCRIBED, "orders", 1, 0, 0, sub.d))])
    for seq, sub_id in ((1, sub.d), (2, sub.d), (1, sub.d), (2, sub.d), (3, sub.d - 1), (3, sub.d)):
        header = encode_header(Header(Kind.DATA, "orders", seq, seq, 0, sub_id))
        router.send_multipart([identity, header, encode_table(make_table(seq))])
    got = drain(reader, 3, ack=False)
    assert [b.seq for b in got] == [1, 2, 3]
    assert [b.table.column("id").to_pylist() for b in got] == [batch_ids(t) for t in (1, 2, 3)]
    assert reader.stats().duplicates_dropped == 3


# --- retargeting and lifecycle ----------------------------------------------------------------


def test_reader_retargets_to_a_replica_writer_without_gap_or_duplicate(closing) -> None:
    primary = ChannelWriter("orders", SCHEMA, expected_readers=("r1",))
    replica = ChannelWriter("orders", SCHEMA, expected_readers=("r1",))
    closing(primary)
    closing(replica)
    for tag in range(25):  # deterministic replicas number the same stream identically
        primary.send(make_table(tag), tag)
        replica.send(make_table(tag), tag)
    reader = ChannelReader("orders", "r1", primary.endpoint, SCHEMA)
    closing(reader)
    reader.subscribe(timeout=5)
    before = drain(reader, 10)  # up to a credit window more than 10
    reader.connect_to(replica.endpoint)
    after = drain(reader, 25)
    seqs = [b.seq for b in before + after]
    assert seqs == list(range(1, 26))
    assert [b.table.column("id").to_pylist() for b in before + after] == [batch_ids(t) for t in range(25)]


def test_writer_retargets_from_one_reader_id_to_another(closing) -> None:
    writer = ChannelWriter("orders", SCHEMA, expected_readers=("old",))
    closing(writer)
    # credit 1: the old reader cannot already hold everything when the writer lets it go
    old = ChannelReader("orders", "old", writer.endpoint, SCHEMA, credit=1)
    closing(old)
    for tag in range(12):
        writer.send(make_table(tag), tag)
    old.subscribe(timeout=5)
    drain(old, 5, ack=False)
    old.ack(5)
    assert poll(lambda: writer.stats().acked == {"old": 5}, 5.0, 0.01)
    writer.retarget_reader("old", "new")
    with pytest.raises(ChannelError, match="no longer serves reader old"):
        drain(old, 12)
    assert writer.stats().acked == {"new": 5}
    new = ChannelReader("orders", "new", writer.endpoint, SCHEMA)
    closing(new)
    new.subscribe(timeout=5)
    assert [b.seq for b in drain(new, 12)] == list(range(6, 13))


def test_close_joins_the_io_thread_and_unblocks_senders() -> None:
    writer = ChannelWriter("orders", SCHEMA, max_retained_batches=1)
    writer.send(make_table(0), 0)
    errors: list[Exception] = []

    def blocked_send() -> None:
        try:
            writer.send(make_table(1), 1)
        except ChannelError as exc:
            errors.append(exc)

    sender = threading.Thread(target=blocked_send)
    sender.start()
    time.sleep(0.1)
    writer.close()
    sender.join(5)
    assert not writer._thread.is_alive() and not sender.is_alive()
    assert len(errors) == 1 and "closed" in str(errors[0])
    with pytest.raises(ChannelError, match="closed"):
        writer.send(make_table(2), 2)


# --- a reader process killed mid-stream --------------------------------------------------------


def _start_reader_proc(endpoint: str, sink: Path, last: int, delay: float) -> subprocess.Popen:
    args = [sys.executable, str(FIXTURE), endpoint, "orders", "killed", str(sink), str(last), str(delay)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _committed(sink: Path) -> list[dict]:
    data = sink.read_bytes() if sink.exists() else b""
    return [json.loads(line) for line in data.splitlines() if line.endswith(b"}")]


def test_sigkilled_reader_process_resumes_with_nothing_lost_or_twice(closing, tmp_path) -> None:
    total = 300
    writer = ChannelWriter("orders", SCHEMA, expected_readers=("killed", "steady"))
    closing(writer)
    steady = ChannelReader("orders", "steady", writer.endpoint, SCHEMA)
    closing(steady)
    steady.subscribe(timeout=5)
    producer = threading.Thread(target=lambda: [writer.send(make_table(t), t, timeout=20) for t in range(total)])
    producer.start()
    sink = tmp_path / "sink.jsonl"
    proc = _start_reader_proc(writer.endpoint, sink, total, 0.005)
    try:
        steady_got = drain(steady, 60, limit_s=20)  # the other reader keeps going meanwhile
        assert poll(lambda: len(_committed(sink)) >= 40, 20.0, 0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        killed_at = len(_committed(sink))
        assert 40 <= killed_at < total
        steady_got += drain(steady, total, limit_s=20)
        proc = _start_reader_proc(writer.endpoint, sink, total, 0.0)
        assert proc.wait(30) == 0, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stderr.close()
        producer.join(20)
    committed = _committed(sink)
    assert [line["seq"] for line in committed] == list(range(1, total + 1))
    assert [line["ids"] for line in committed] == [batch_ids(t) for t in range(total)]
    assert [b.seq for b in steady_got] == list(range(1, total + 1))
    assert poll(lambda: writer.retained_range() == (total + 1, total), 5.0, 0.01)


def test_a_published_writer_nobody_reads_drops_its_oldest_instead_of_blocking(closing) -> None:
    """docs/queries.md: while no reader is tracked, a published channel keeps its latest
    batches up to its bound; once another query's reader is declared, it is upstream backup
    again (blocks when full)."""
    writer = ChannelWriter("q/hot", SCHEMA, max_retained_batches=3, published=True)
    closing(writer)
    for tag in range(5):
        assert writer.send(make_table(tag), tag, timeout=1) == tag + 1
    assert writer.retained_range() == (3, 5)
    writer.add_reader("r1")  # another query's reader, from what the writer retains
    with pytest.raises(ChannelFull):
        writer.send(make_table(5), 5, timeout=0.3)
    reader = ChannelReader("q/hot", "r1", writer.endpoint, SCHEMA)
    closing(reader)
    reader.subscribe(3, timeout=5)
    assert [b.seq for b in drain(reader, 5, ack=False)] == [3, 4, 5]
    writer.drop_reader("r1")  # a stopped reader holds nothing back
    assert writer.send(make_table(5), 5, timeout=5) == 6


# --- the end of a stream (docs/availability.md, "Without max-delay") -------------------------


def test_an_ended_writer_says_so_in_its_range_and_numbers_nothing_more(closing) -> None:
    """`end`: range answers carry RANGE_ENDED at the last seq; a later new batch is refused,
    a re-run of an earlier tag and an empty batch are not; a writer not ended says nothing."""
    writer, reader = writer_and_reader(closing)
    for tag in (1, 2):
        writer.send(make_table(tag), tag)
    assert reader.retained_range(timeout=5) == (1, 2) and reader.ended_at is None
    assert writer.end() == 2
    assert reader.retained_range(timeout=5) == (1, 2) and reader.ended_at == 2
    with pytest.raises(ChannelError, match="ended at seq 2"):
        writer.send(make_table(3), 3)
    assert writer.send(make_table(2), 2) == 2  # a re-run: numbered before the end
    assert writer.send(make_table(4).slice(0, 0), 4) == 2
    reader.subscribe(1)
    assert [b.table.column("id").to_pylist() for b in drain(reader, 2)] == [
        batch_ids(t) for t in (1, 2)]
    assert reader.stats().refused_frames == 0


def _range_frame(text: str, first: int, last: int, request: int) -> bytes:
    return encode_header(Header(Kind.RANGE, "orders", first, last, 0, request, text))


def test_a_reader_refuses_a_garbled_or_inconsistent_end(closing) -> None:
    """A fake writer (what a bug or a garbled frame would send; over CURVE nobody else can
    speak): an unknown RANGE text, an impossible ended range, an end before a seq the reader
    has received, and an end that contradicts an earlier one are each refused and counted,
    and the reader believes none of them; a consistent end is believed."""
    router, reader = _fake_writer_and_reader(closing)
    identity, sub = _recv_kind(router, reader, Kind.SUBSCRIBE)
    subscribed = Header(Kind.SUBSCRIBED, "orders", 1, 0, 0, sub.d)
    router.send_multipart([identity, encode_header(subscribed)])
    for seq in (1, 2):
        header = encode_header(Header(Kind.DATA, "orders", seq, seq, 0, sub.d))
        router.send_multipart([identity, header, encode_table(make_table(seq))])
    assert [b.seq for b in drain(reader, 2, ack=False)] == [1, 2]

    def answer(text: str, first: int, last: int) -> tuple[int, int] | None:
        request = reader.ask_range()
        _recv_kind(router, reader, Kind.RANGE_REQ)
        router.send_multipart([identity, _range_frame(text, first, last, request)])
        return reader.range_answer(request, 1.0)

    bad = [("ended!", 1, 2), ("ENDED", 1, 2), ("ended", 5, 2), ("ended", 0, 2), ("ended", 1, -1),
           ("ended", 1, 1)]  # the last: it ended at 1, yet seq 2 was received
    for text, first, last in bad:
        assert answer(text, first, last) is None, (text, first, last)
        assert reader.ended_at is None
    assert reader.stats().refused_frames == len(bad)
    assert answer("", 1, 2) == (1, 2) and reader.ended_at is None
    assert answer("ended", 1, 2) == (1, 2) and reader.ended_at == 2
    assert answer("ended", 1, 3) is None and reader.ended_at == 2  # contradicts the first end
    assert reader.stats().refused_frames == len(bad) + 1


def test_range_frames_fuzzed_are_refused_or_read_never_crash() -> None:
    """Seeded fuzz of the RANGE frame's new field: random texts (and byte flips of a good
    ended frame) decode to a header whose `range_ended` is True only for RANGE_ENDED with a
    possible range, else False for "", else FrameError; nothing else is raised."""
    import random

    from executor.wire import RANGE_ENDED, range_ended

    rng = random.Random(34)
    alphabet = "ended" + "ENDÉ\x00 \n-!"
    good = _range_frame(RANGE_ENDED, 1, 7, 9)
    outcomes = {"ended": 0, "open": 0, "refused": 0}
    for _ in range(3000):
        if rng.random() < 0.5:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
            first, last = rng.randint(-3, 10), rng.randint(-3, 10)
            raw = _range_frame(text, first, last, 1)
        else:
            raw = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            raw = bytes(raw)
        try:
            header = decode_header(raw)
            if header.kind is not Kind.RANGE:
                outcomes["refused"] += 1
                continue
            ended = range_ended(header)
        except FrameError:
            outcomes["refused"] += 1
            continue
        expected_end = header.text == RANGE_ENDED and header.b >= 0 and \
            1 <= header.a <= header.b + 1
        assert ended == expected_end and (ended or header.text == ""), header
        outcomes["ended" if ended else "open"] += 1
    assert min(outcomes.values()) > 0, outcomes
