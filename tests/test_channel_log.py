"""The durable upstream backup: `ChannelLog` on real files (reload, torn and corrupt tails, trim,
rolling), a `ChannelWriter` reopened on its log folder and port, and a producer process SIGKILLed
mid-stream three times. Expected results come from plain Python over the tags (`tag_ids`), never
from earlier output."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import zmq

from executor.channels.log import (
    RECORD_HEADER_BYTES,
    ChannelLog,
    ChannelLogError,
    LoggedBatch,
    RecordError,
    check_record_body,
    decode_record_header,
    encode_record_header,
    segment_name,
    segments_to_trim,
)
from executor.channels import Batch, ChannelFull, ChannelReader, ChannelWriter
from executor.wire import FLAG_NON_RETAINING, Header, Kind, decode_header, encode_header, encode_table
from test_channels import drain
from testkit.waiting import poll

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
FIXTURE = Path(__file__).parent / "fixtures" / "channel_log_writer_proc.py"


def tag_ids(tag: int) -> list[int]:
    """The oracle (the fixture process computes the same): 1..7 rows depending on the tag."""
    return [tag * 100 + k for k in range(1 + tag % 7)]


def make_table(tag: int) -> pa.Table:
    ids = tag_ids(tag)
    return pa.table({"id": ids, "payload": [f"tag-{tag}-row-{i}" for i in ids]}, schema=SCHEMA)


def body_of(seq: int) -> bytes:
    """A body whose size and content depend on the seq (0..99 bytes)."""
    return bytes((seq * 7 + k) % 256 for k in range((seq * 13) % 100))


def fill(channel_log: ChannelLog, first: int, last: int) -> None:
    for seq in range(first, last + 1):
        channel_log.append(seq, 10 * seq, seq % 5, body_of(seq))


def expected(first: int, last: int) -> list[LoggedBatch]:
    return [LoggedBatch(seq, 10 * seq, seq % 5, body_of(seq)) for seq in range(first, last + 1)]


def segments(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- pure record encoding ---------------------------------------------------------------------


def test_record_header_round_trip_and_refusals() -> None:
    body = b"arrow ipc bytes"
    raw = encode_record_header(7, 42, 3, body)
    assert len(raw) == RECORD_HEADER_BYTES
    header = decode_record_header(raw)
    assert (header.seq, header.tag, header.rows, header.length) == (7, 42, 3, len(body))
    check_record_body(header, body)
    with pytest.raises(RecordError, match="crc mismatch"):
        check_record_body(header, b"arrow ipc bytez")
    with pytest.raises(RecordError, match="crc mismatch"):  # the numbers are covered too
        check_record_body(decode_record_header(raw[:4] + (8).to_bytes(8, "big") + raw[12:]), body)
    with pytest.raises(RecordError) as short_body:
        check_record_body(header, body[:5])
    assert short_body.value.torn
    with pytest.raises(RecordError) as short_header:
        decode_record_header(raw[:10])
    assert short_header.value.torn
    with pytest.raises(RecordError, match="bad record magic") as bad:
        decode_record_header(b"XXXX" + raw[4:])
    assert not bad.value.torn
    with pytest.raises(ValueError):
        encode_record_header(0, 1, 1, body)


def test_which_segments_a_trim_deletes() -> None:
    firsts = [1, 11, 21]  # seqs 1-10, 11-20, 21-last
    assert segments_to_trim(firsts, 25, 9) == 0
    assert segments_to_trim(firsts, 25, 10) == 1
    assert segments_to_trim(firsts, 25, 20) == 2
    assert segments_to_trim(firsts, 25, 1000) == 2  # the segment holding the last seq stays
    assert segments_to_trim([1], 5, 5) == 0


# --- ChannelLog on files ----------------------------------------------------------------------


def test_append_and_reload_in_seq_order(tmp_path) -> None:
    channel_log = ChannelLog(tmp_path)
    assert (channel_log.first_seq, channel_log.last_seq, channel_log.last_tag) == (1, 0, -1)
    assert channel_log.entries() == []
    fill(channel_log, 1, 40)
    with pytest.raises(ChannelLogError, match="expected 41"):
        channel_log.append(43, 0, 0, b"gap")
    channel_log.close()
    with pytest.raises(ChannelLogError, match="closed"):
        channel_log.append(41, 0, 0, b"late")
    again = ChannelLog(tmp_path)
    assert again.entries() == expected(1, 40)
    assert (again.first_seq, again.last_seq, again.last_tag) == (1, 40, 400)
    fill(again, 41, 45)
    again.close()
    assert ChannelLog(tmp_path).entries() == expected(1, 45)


@pytest.mark.parametrize("damage", ["half_record", "half_header", "flipped_body_byte",
                                    "flipped_header_byte"])
def test_torn_or_corrupt_tail_is_cut_and_the_good_prefix_kept(tmp_path, damage) -> None:
    channel_log = ChannelLog(tmp_path, fsync=True)
    fill(channel_log, 1, 8)
    channel_log.close()
    segment = tmp_path / segment_name(1)
    good = segment.stat().st_size
    sizes = [RECORD_HEADER_BYTES + len(body_of(seq)) for seq in range(1, 9)]
    sixth = sum(sizes[:5])  # where record 6 starts
    data = bytearray(segment.read_bytes())
    if damage == "half_record":  # record 9 half-written when the process died
        record = encode_record_header(9, 90, 4, body_of(9)) + body_of(9)
        data += record[: len(record) // 2]
        keep = 8
    elif damage == "half_header":
        data += encode_record_header(9, 90, 4, body_of(9))[:17]
        keep = 8
    elif damage == "flipped_body_byte":
        data[sixth + RECORD_HEADER_BYTES + 3] ^= 0x01
        keep = 5
    else:
        data[sixth + 6] ^= 0x10  # inside record 6's seq field
        keep = 5
    segment.write_bytes(bytes(data))
    reopened = ChannelLog(tmp_path)
    assert reopened.entries() == expected(1, keep)
    assert (reopened.last_seq, reopened.last_tag) == (keep, 10 * keep)
    assert segment.stat().st_size == sum(sizes[:keep]) <= good
    fill(reopened, keep + 1, 10)  # the producer re-runs what was cut
    reopened.close()
    assert ChannelLog(tmp_path).entries() == expected(1, 10)


def test_rolling_trimming_and_reload_after_trim(tmp_path) -> None:
    channel_log = ChannelLog(tmp_path, segment_bytes=400)
    fill(channel_log, 1, 60)
    names = segments(tmp_path)
    assert len(names) > 5 and channel_log.segment_count() == len(names)
    firsts = [int(name.split(".")[0]) for name in names]
    assert firsts[0] == 1 and firsts == sorted(firsts)
    for first, nxt in zip(firsts, firsts[1:] + [61]):  # each at most 400 bytes, unless 1 record
        size = (tmp_path / segment_name(first)).stat().st_size
        assert size <= 400 or nxt - first == 1
    upto = firsts[3] + 1  # inside the 4th segment: the first three go
    assert channel_log.trim_upto(upto) == 3
    assert segments(tmp_path) == names[3:] and channel_log.first_seq == firsts[3]
    assert channel_log.trim_upto(upto) == 0
    assert ChannelLog(tmp_path).entries() == expected(firsts[3], 60)
    assert channel_log.trim_upto(10_000) == len(names) - 4  # the last segment always stays
    assert segments(tmp_path) == names[-1:]
    channel_log.close()
    reopened = ChannelLog(tmp_path, segment_bytes=400)
    assert (reopened.first_seq, reopened.last_seq, reopened.last_tag) == (firsts[-1], 60, 600)
    fill(reopened, 61, 62)
    reopened.close()
    assert ChannelLog(tmp_path).entries() == expected(firsts[-1], 62)


def test_corrupt_middle_segment_drops_what_follows_and_empty_tail_segment_goes(tmp_path) -> None:
    channel_log = ChannelLog(tmp_path, segment_bytes=300)
    fill(channel_log, 1, 30)
    channel_log.close()
    names = segments(tmp_path)
    second = tmp_path / names[1]
    second_first = int(names[1].split(".")[0])
    data = bytearray(second.read_bytes())
    data[-1] ^= 0xFF  # the last record of the second segment
    second.write_bytes(bytes(data))
    (tmp_path / segment_name(31)).touch()  # created, then the process died before writing
    (tmp_path / "notes.txt").write_text("not a segment")
    reopened = ChannelLog(tmp_path, segment_bytes=300)
    last = reopened.last_seq
    assert second_first <= last < int(names[2].split(".")[0]) - 1
    assert reopened.entries() == expected(1, last)
    assert segments(tmp_path) == sorted(names[:2] + ["notes.txt"])
    reopened.close()


# --- a writer reopened on its log -------------------------------------------------------------


def raw_bodies(endpoint: str, from_seq: int, count: int, limit_s: float = 5.0) -> dict[int, bytes]:
    """The DATA bodies a bare DEALER gets for `count` seqs from `from_seq` (non-retaining)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    bodies: dict[int, bytes] = {}
    try:
        sock.send(encode_header(Header(Kind.SUBSCRIBE, "orders", from_seq, count,
                                       FLAG_NON_RETAINING, 1, "raw")))
        deadline = time.monotonic() + limit_s
        while len(bodies) < count and time.monotonic() < deadline:
            if sock.poll(100):
                frames = sock.recv_multipart()
                header = decode_header(frames[0])
                if header.kind is Kind.DATA:
                    bodies[header.a] = frames[1]
    finally:
        sock.close(linger=0)
    return bodies


def first_logged_seq(folder: str) -> int:
    return min(int(name.split(".")[0]) for name in os.listdir(folder))


def test_reopened_writer_resumes_numbering_tags_and_replay(tmp_path) -> None:
    folder = str(tmp_path / "log")
    small = {"log_segment_bytes": 4096}  # a few batches per segment, so acks delete segments
    writer = ChannelWriter("orders", SCHEMA, expected_readers=("r1",), log_dir=folder, **small)
    endpoint = writer.endpoint
    reader = ChannelReader("orders", "r1", endpoint, SCHEMA)
    try:
        assert writer.last_tag == -1
        for tag in range(50):
            assert writer.send(make_table(tag), tag) == tag + 1
        reader.subscribe(timeout=5)
        got = drain(reader, 50, ack=False)
        assert [b.seq for b in got] == list(range(1, 51))
        reader.ack(20)
        assert poll(lambda: writer.stats().acked == {"r1": 20}, 5.0, 0.01)
        assert poll(lambda: 1 < first_logged_seq(folder) <= 21, 5.0, 0.01)  # acked segments deleted
    finally:
        reader.close()
        writer.close()
    kept_from = first_logged_seq(folder)
    reopened = ChannelWriter("orders", SCHEMA, bind=endpoint, expected_readers=("r1",),
                             log_dir=folder, **small)
    fresh = ChannelReader("orders", "r1", endpoint, SCHEMA)
    try:
        assert reopened.endpoint == endpoint and reopened.epoch == 0
        assert reopened.last_tag == 49 and reopened.retained_range() == (kept_from, 50)
        assert reopened.stats().acked == {"r1": 0}  # nothing trimmed until r1 acks again
        bodies = raw_bodies(endpoint, 21, 30)
        assert bodies == {tag + 1: encode_table(make_table(tag)).to_pybytes()
                          for tag in range(20, 50)}
        fresh.subscribe(from_seq=21, timeout=5)
        replayed = drain(fresh, 50, ack=False)
        assert [(b.seq, b.tag) for b in replayed] == [(tag + 1, tag) for tag in range(20, 50)]
        assert all(b.table.equals(make_table(b.tag)) for b in replayed)
        assert reopened.send(make_table(37), 37) == 38  # an old tag: a re-run, not sent
        assert reopened.last_tag == 49 and reopened.retained_range()[1] == 50
        assert reopened.send(make_table(50), 50) == 51
        more = drain(fresh, 51)
        assert [(b.seq, b.tag) for b in more] == [(51, 50)]
        assert poll(lambda: reopened.retained_range() == (52, 51), 5.0, 0.01)
        assert poll(lambda: len(os.listdir(folder)) == 1, 5.0, 0.01)  # only the one holding seq 51
    finally:
        fresh.close()
        reopened.close()
    third = ChannelWriter("orders", SCHEMA, expected_readers=("r1",), log_dir=folder)
    try:  # everything acknowledged: the last segment's batches come back, numbering and tags too
        assert third.last_tag == 50 and third.retained_range() == (first_logged_seq(folder), 51)
        assert third.send(make_table(51), 51) == 52
    finally:
        third.close()


def test_reloaded_batches_beyond_retention_are_kept_and_block_new_sends(tmp_path) -> None:
    folder = str(tmp_path / "log")
    writer = ChannelWriter("orders", SCHEMA, expected_readers=("r1",), log_dir=folder)
    for tag in range(10):
        writer.send(make_table(tag), tag)
    writer.close()
    small = ChannelWriter("orders", SCHEMA, expected_readers=("r1",), log_dir=folder,
                          max_retained_batches=4)
    reader = ChannelReader("orders", "r1", small.endpoint, SCHEMA)
    try:
        assert small.retained_range() == (1, 10)
        with pytest.raises(ChannelFull):
            small.send(make_table(10), 10, timeout=0.3)
        reader.subscribe(from_seq=1, timeout=5)
        assert [b.tag for b in drain(reader, 10)] == list(range(10))
        assert small.send(make_table(10), 10, timeout=5) == 11
    finally:
        reader.close()
        small.close()


def test_channel_hub_passes_the_log_folder_through(tmp_path) -> None:
    from executor.runtime import ChannelHub

    hub = ChannelHub()
    try:
        writer = hub.writer("orders", SCHEMA, log_dir=str(tmp_path / "hub-log"))
        writer.send(make_table(3), 3)
    finally:
        hub.close()
    assert ChannelLog(tmp_path / "hub-log").entries()[0].tag == 3


# --- a producer process SIGKILLed mid-stream --------------------------------------------------


class Producer:
    """The fixture process and its stdout lines, read with bounded waits."""

    def __init__(self, bind: str, folder: Path, total: int, delay: float) -> None:
        args = [sys.executable, str(FIXTURE), bind, str(folder), str(total), str(delay)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._pending = b""
        self.lines: list[str] = []

    def read_until(self, prefix: str, limit_s: float = 20.0) -> str:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            for line in self._take_lines():
                if line.startswith(prefix):
                    return line
            if self._selector.select(0.1) and not self._read_some():
                break
        raise AssertionError(f"no {prefix!r} line; stderr: {self._stderr()}")

    def _read_some(self) -> bool:
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        self._pending += chunk
        return bool(chunk)

    def _take_lines(self) -> list[str]:
        *whole, self._pending = self._pending.split(b"\n")
        lines = [w.decode() for w in whole]
        self.lines += lines
        return lines

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read().decode()[-2000:]

    def kill(self) -> list[str]:
        """SIGKILL; every line it printed."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)
        while self._read_some():
            pass
        self._take_lines()
        return self.lines

    def finish(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(10)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()
        self._selector.close()


def sent_lines(lines: list[str]) -> list[tuple[int, int]]:
    return [(int(t), int(s)) for _, t, s in (line.split() for line in lines if line.startswith("sent "))]


def test_sigkilled_producer_resumes_from_its_log_nothing_lost_or_twice(tmp_path) -> None:
    total, kills, lag = 240, 3, 3
    folder = tmp_path / "log"
    committed: list[Batch] = []  # what the reader acknowledged, in order
    pending: list[Batch] = []  # received, not yet acknowledged
    bind = "tcp://127.0.0.1:0"
    reader: ChannelReader | None = None
    producer: Producer | None = None
    ahead_at_kill: list[int] = []
    resumed: list[tuple[int, int]] = []  # (reloaded last seq, last tag) per process

    def take(limit_s: float, until) -> None:
        deadline = time.monotonic() + limit_s
        while not until() and time.monotonic() < deadline:
            pending.extend(reader.poll(0.1))
            if len(pending) > lag:
                committed.extend(pending[:-lag])
                del pending[:-lag]
                reader.ack(committed[-1].seq)

    try:
        for round_ in range(kills + 1):
            producer = Producer(bind, folder, total, 0.004)
            _, endpoint, last_seq, last_tag = producer.read_until("ready ").split()
            resumed.append((int(last_seq), int(last_tag)))
            bind = endpoint  # the relaunched task gets the same port
            if reader is None or round_ == 2:  # round 2: a restarted reader, from its commit
                if reader is not None:
                    reader.close()
                pending.clear()
                reader = ChannelReader("orders", "r1", endpoint, SCHEMA, credit=4)
                reader.subscribe(from_seq=len(committed) + 1 if committed else None, timeout=10)
            if round_ < kills:
                target = (round_ + 1) * total // (kills + 1)
                take(20, lambda: len(committed) >= target)
                assert len(committed) >= target, f"round {round_}: {len(committed)} committed"
                time.sleep(0.3)  # the reader stalls: the producer runs ahead into the log
                lines = producer.kill()
                producer.end()
                sent = sent_lines(lines)
                received = (pending or committed)[-1].seq
                ahead_at_kill.append(sent[-1][1] - received)
                assert sent[-1][0] < total - 1, "killed after the producer had finished"
            else:
                take(30, lambda: len(committed) + len(pending) >= total)
                committed.extend(pending)
                pending.clear()
                reader.ack(committed[-1].seq)
                producer.read_until("done")
                assert producer.finish() == 0
                producer.end()
    finally:
        if producer is not None:
            producer.end()
        if reader is not None:
            reader.close()
    assert [b.tag for b in committed] == list(range(total))  # each once, nothing missing
    assert [b.seq for b in committed] == list(range(1, total + 1))
    assert [b.table.column("id").to_pylist() for b in committed] == [tag_ids(t) for t in range(total)]
    assert all(b.table.equals(make_table(b.tag)) for b in committed)
    assert resumed[0] == (0, -1)
    assert all(seq == tag + 1 and seq > 0 for seq, tag in resumed[1:])  # numbering continued
    assert all(ahead > 0 for ahead in ahead_at_kill), ahead_at_kill  # served from the log
