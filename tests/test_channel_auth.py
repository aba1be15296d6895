"""Channel authentication over real ZeroMQ sockets on 127.0.0.1: CURVE admission of declared
readers only, acknowledgements bound to the authenticated key, undeclared subscribers refused
and untracked, and a seeded fuzz of channel frames from authenticated and unauthenticated peers.
Expected batches come from plain Python over the same input (`batch_ids`)."""

from __future__ import annotations

import os
import random
import time

import pyarrow as pa
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from executor.channels.auth import (ChannelKeyError, KeyPair, ReaderAuth, WriterAuth,
                                   parse_readers, read_key_file, write_key_file, zap_decision)
from executor.channels import ChannelError, ChannelReader, ChannelWriter
from executor.wire import NONE, ErrorCode, Header, Kind, decode_header, encode_header
from testkit.waiting import poll

SCHEMA = pa.schema([("id", pa.int64())])
ROWS = 5
CHANNEL = "auth-q/s"


def batch_ids(tag: int) -> list[int]:
    return [tag * ROWS + k for k in range(ROWS)]


def make_table(tag: int) -> pa.Table:
    return pa.table({"id": batch_ids(tag)}, schema=SCHEMA)


def drain(reader: ChannelReader, upto: int, limit_s: float = 10.0) -> list[int]:
    """Every id read up to seq `upto`, acking as it goes (bounded in time)."""
    ids: list[int] = []
    last = 0
    deadline = time.monotonic() + limit_s
    while last < upto and time.monotonic() < deadline:
        for batch in reader.poll(0.1):
            ids += batch.table.column("id").to_pylist()
            last = batch.seq
            reader.ack(batch.seq)
    return ids


@pytest.fixture()
def keys():
    return {name: KeyPair.generate() for name in ("writer", "a", "b", "stranger")}


@pytest.fixture()
def writer(keys):
    auth = WriterAuth(keys["writer"], {"a": keys["a"].public, "b": keys["b"].public})
    w = ChannelWriter(CHANNEL, SCHEMA, auth=auth)
    yield w
    w.close()


def reader_of(writer: ChannelWriter, reader_id: str, pair: KeyPair,
              server: KeyPair | None = None, **kw) -> ChannelReader:
    server_key = (server.public if server is not None else writer_key(writer))
    return ChannelReader(CHANNEL, reader_id, writer.endpoint, SCHEMA,
                         auth=ReaderAuth(pair, server_key), **kw)


def writer_key(writer: ChannelWriter) -> str:
    return writer._auth.keys.public  # the test's own writer


def raw_dealer(endpoint: str, pair: KeyPair | None, server_key: str | None) -> zmq.Socket:
    return monitored_dealer(endpoint, pair, server_key, monitored=False)[0]


def monitored_dealer(endpoint: str, pair: KeyPair | None, server_key: str | None,
                     monitored: bool = True) -> tuple[zmq.Socket, zmq.Socket | None]:
    """A raw DEALER to `endpoint` (CURVE with `pair` when given) and, if `monitored`, its
    monitor socket, attached before the connect so that no handshake event is missed."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if pair is not None:
        sock.curve_serverkey = server_key.encode()
        sock.curve_publickey = pair.public.encode()
        sock.curve_secretkey = pair.secret.encode()
    monitor = sock.get_monitor_socket() if monitored else None
    sock.connect(endpoint)
    return sock, monitor


REFUSED_HANDSHAKE = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                     zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def send_bounded(sock: zmq.Socket, frame: bytes, within_ms: int = 2000) -> bool:
    """Send `frame` unless the writer has already refused the connection; whether it was queued.
    A refused handshake ends a DEALER's only pipe, after which a plain `send` blocks for ever (on
    a loaded machine the handshake can end between a test's sends: a 300 s pytest-timeout)."""
    sock.setsockopt(zmq.SNDTIMEO, within_ms)
    try:
        sock.send(frame)
    except zmq.Again:
        return False
    return True


def handshake_refused(monitor: zmq.Socket, within: float = 30.0) -> int:
    """Wait (on the socket's monitor events, bounded) until the writer refuses the handshake;
    the refusal event. Fails if the handshake succeeds or nothing is decided in time."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        if not monitor.poll(int(left * 1000) + 1):
            break
        event = recv_monitor_message(monitor)["event"]
        assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED, "the writer admitted the peer"
        if event in REFUSED_HANDSHAKE:
            return event
    raise AssertionError(f"no handshake refusal within {within:.0f} s")


def replies(sock: zmq.Socket, within: float) -> list[Header]:
    out: list[Header] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if sock.poll(50):
            out.append(decode_header(sock.recv_multipart()[0]))
    return out


# --- pure pieces ----------------------------------------------------------------------------


def test_zap_decision_admits_only_declared_keys_of_the_domain():
    key = os.urandom(32)
    admitted = {"d1": {key: "reader-a"}}
    assert zap_decision(admitted, "d1", b"CURVE", [key]) == ("200", "OK", "reader-a")
    assert zap_decision(admitted, "d1", b"CURVE", [os.urandom(32)])[0] == "400"
    assert zap_decision(admitted, "d2", b"CURVE", [key])[0] == "400"
    assert zap_decision(admitted, "d1", b"NULL", [])[0] == "400"


def test_parse_readers_and_key_errors_never_show_the_secret(tmp_path):
    pair = KeyPair.generate()
    assert parse_readers(f" r1={pair.public}, ") == {"r1": pair.public}
    for bad in ("r1", f"={pair.public}", "r1=short", f"r1={pair.public},r1={pair.public}"):
        with pytest.raises(ChannelKeyError):
            parse_readers(bad)
    assert pair.secret not in repr(pair) and pair.secret not in repr(WriterAuth(pair))
    path = tmp_path / "k.json"
    write_key_file(str(path), pair)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert read_key_file(str(path)) == pair
    path.chmod(0o644)
    with pytest.raises(ChannelKeyError, match="chmod 600") as info:
        read_key_file(str(path))
    assert pair.secret not in str(info.value)
    other = tmp_path / "bad.json"
    other.write_text('{"public": "%s", "secret": "%s"}' % (pair.public, KeyPair.generate().secret))
    other.chmod(0o600)
    with pytest.raises(ChannelKeyError, match="does not belong"):
        read_key_file(str(other))


# --- real sockets ---------------------------------------------------------------------------


def test_declared_reader_gets_every_batch_once_and_its_acks_trim(writer, keys):
    reader = reader_of(writer, "a", keys["a"])
    other = reader_of(writer, "b", keys["b"])
    try:
        reader.subscribe(timeout=5)
        other.subscribe(timeout=5)
        for tag in range(1, 21):
            writer.send(make_table(tag), tag=tag)
        assert drain(reader, 20) == [i for t in range(1, 21) for i in batch_ids(t)]
        assert drain(other, 20) == [i for t in range(1, 21) for i in batch_ids(t)]
        assert poll(lambda: writer.retained_range() == (21, 20), 5.0, 0.01)
        stats = writer.stats()
        assert stats.authenticated and stats.unauthorized_frames == 0
        assert stats.acked == {"a": 20, "b": 20}
    finally:
        reader.close()
        other.close()


@pytest.mark.parametrize("who", ["plain", "unknown-key", "wrong-server-key"])
def test_unauthenticated_subscriber_gets_nothing_and_is_not_tracked(writer, keys, who):
    pair = {"plain": None, "unknown-key": keys["stranger"], "wrong-server-key": keys["a"]}[who]
    server = KeyPair.generate().public if who == "wrong-server-key" else writer_key(writer)
    sock, monitor = monitored_dealer(writer.endpoint, pair, server)
    assert monitor is not None
    try:
        writer.send(make_table(1), tag=1)
        for reader_id in ("a", "intruder"):
            send_bounded(sock, encode_header(Header(Kind.SUBSCRIBE, CHANNEL, 1, 100, 0, 1,
                                                    reader_id)))
            send_bounded(sock, encode_header(Header(Kind.ACK, CHANNEL, 1, 100, 0, 1, reader_id)))
        handshake_refused(monitor)
        assert replies(sock, 1.0) == []
        stats = writer.stats()
        assert stats.sessions == () and stats.acked == {"a": 0, "b": 0}
        assert writer.retained_range() == (1, 1)
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()
    # the declared readers still trim once they acknowledge
    readers = [reader_of(writer, r, keys[r]) for r in ("a", "b")]
    try:
        for r in readers:
            r.subscribe(timeout=5)
            assert drain(r, 1) == batch_ids(1)
        assert poll(lambda: writer.retained_range() == (2, 1), 5.0, 0.01)
    finally:
        for r in readers:
            r.close()


def test_declared_key_cannot_claim_an_undeclared_or_another_readers_id(writer, keys):
    for tag in range(1, 6):
        writer.send(make_table(tag), tag=tag)
    forger = raw_dealer(writer.endpoint, keys["a"], writer_key(writer))
    try:
        forger.send(encode_header(Header(Kind.SUBSCRIBE, CHANNEL, NONE, 100, 0, 1, "intruder")))
        forger.send(encode_header(Header(Kind.ACK, CHANNEL, 5, 100, 0, 1, "b")))
        forger.send(encode_header(Header(Kind.SUBSCRIBE, CHANNEL, NONE, 100, 0, 2, "b")))
        got = [h for h in replies(forger, 1.0)]
        assert [h.a for h in got] == [ErrorCode.UNAUTHORIZED] * 3
        assert all(h.kind is Kind.ERROR for h in got)
        stats = writer.stats()
        assert stats.acked == {"a": 0, "b": 0} and stats.unauthorized_frames == 3
        assert stats.sessions == ()
    finally:
        forger.close()
    reader_a = reader_of(writer, "a", keys["a"])
    reader_a.subscribe(timeout=5)
    assert drain(reader_a, 5) == [i for t in range(1, 6) for i in batch_ids(t)]
    reader_a.close()
    assert poll(lambda: writer.stats().acked == {"a": 5, "b": 0}, 5.0, 0.01)
    assert writer.retained_range() == (1, 5)  # b has acknowledged nothing: nothing trimmed
    reader_b = reader_of(writer, "b", keys["b"])
    reader_b.subscribe(timeout=5)
    assert drain(reader_b, 5) == [i for t in range(1, 6) for i in batch_ids(t)]
    reader_b.close()


def test_a_reader_using_anothers_key_is_refused(writer, keys):
    impostor = reader_of(writer, "b", keys["a"])
    try:
        with pytest.raises(ChannelError, match="may not speak for reader 'b'"):
            impostor.subscribe(timeout=5)
    finally:
        impostor.close()
    assert writer.stats().sessions == ()


def test_plain_writer_refuses_undeclared_subscribers_and_does_not_track_them():
    writer = ChannelWriter(CHANNEL, SCHEMA, expected_readers=("a",))
    stranger = ChannelReader(CHANNEL, "vanisher", writer.endpoint, SCHEMA)
    declared = ChannelReader(CHANNEL, "a", writer.endpoint, SCHEMA)
    try:
        with pytest.raises(ChannelError, match="not declared"):
            stranger.subscribe(timeout=5)
        declared.subscribe(timeout=5)
        for tag in range(1, 4):
            writer.send(make_table(tag), tag=tag)
        assert drain(declared, 3) == [i for t in range(1, 4) for i in batch_ids(t)]
        assert poll(lambda: writer.retained_range() == (4, 3), 5.0, 0.01)
        assert writer.stats().acked == {"a": 3}
    finally:
        stranger.close()
        declared.close()
        writer.close()


def test_retarget_to_a_moved_writer_and_to_a_new_reader_key(keys, tmp_path):
    auth = WriterAuth(keys["writer"], {"a": keys["a"].public})
    first = ChannelWriter(CHANNEL, SCHEMA, auth=auth, log_dir=str(tmp_path))
    reader = reader_of(first, "a", keys["a"], server=keys["writer"])
    reader.subscribe(timeout=5)
    for tag in range(1, 4):
        first.send(make_table(tag), tag=tag)
    ids = drain(reader, 2)
    first.close()  # the producer moves: same log, same key, new port
    second = ChannelWriter(CHANNEL, SCHEMA, auth=auth, log_dir=str(tmp_path))
    try:
        reader.connect_to(second.endpoint)
        second.send(make_table(4), tag=4)
        ids += drain(reader, 4)
        assert ids == [i for t in range(1, 5) for i in batch_ids(t)]
        reader.close()
        successor = KeyPair.generate()
        second.retarget_reader("a", "a2", successor.public)
        second.send(make_table(5), tag=5)
        new = ChannelReader(CHANNEL, "a2", second.endpoint, SCHEMA,
                            auth=ReaderAuth(successor, keys["writer"].public))
        new.subscribe(timeout=5)
        assert drain(new, 5) == batch_ids(5)
        new.close()
        old = reader_of(second, "a", keys["a"], server=keys["writer"])
        with pytest.raises(ChannelError):
            old.subscribe(timeout=2)  # revoked: the handshake fails, no answer
        old.close()
    finally:
        second.close()


# --- fuzz -----------------------------------------------------------------------------------


def _mutations(rng: random.Random, count: int) -> list[list[bytes]]:
    """Valid reader frames, then bytes flipped, cut, extended or frames added (seeded)."""
    valid = [
        encode_header(Header(Kind.SUBSCRIBE, CHANNEL, NONE, 8, 0, 1, "a")),
        encode_header(Header(Kind.ACK, CHANNEL, 3, 8, 0, 1, "b")),
        encode_header(Header(Kind.CREDIT, CHANNEL, 99, 0, 0, 1, "b")),
        encode_header(Header(Kind.RANGE_REQ, CHANNEL, 0, 0, 0, 7)),
        encode_header(Header(Kind.BYE, CHANNEL, text="b")),
    ]
    out = []
    for _ in range(count):
        frame = bytearray(rng.choice(valid))
        op = rng.randrange(4)
        if op == 0:
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
        elif op == 1:
            del frame[rng.randrange(len(frame)):]
        elif op == 2:
            frame += os.urandom(rng.randint(1, 64))
        parts = [bytes(frame)] + ([os.urandom(rng.randint(0, 32))] if op == 3 else [])
        out.append(parts)
    return out


@pytest.mark.parametrize("authenticated", [True, False])
def test_fuzzed_frames_break_nothing_and_the_stream_stays_exact(writer, keys, authenticated):
    rng = random.Random(20261124 + authenticated)
    fuzzer = raw_dealer(writer.endpoint, keys["a"] if authenticated else None, writer_key(writer))
    reader = reader_of(writer, "b", keys["b"])
    try:
        reader.subscribe(timeout=5)
        ids: list[int] = []
        for tag, burst in enumerate(range(20), start=1):
            for parts in _mutations(rng, 25):
                try:
                    fuzzer.send_multipart(parts, zmq.NOBLOCK)
                except zmq.Again:  # a peer refused at the handshake never drains its queue
                    pass
            writer.send(make_table(tag), tag=tag)
            ids += drain(reader, tag)
        assert ids == [i for t in range(1, 21) for i in batch_ids(t)]
        assert writer._thread.is_alive()
        assert poll(lambda: writer.stats().acked["b"] == 20, 5.0, 0.01)
        stats = writer.stats()
        assert stats.acked["b"] == 20 and stats.acked["a"] == 0  # a never acked, b's acks only
        # a's key may subscribe as a (a mutated SUBSCRIBE "a"); nobody else gets a session
        assert stats.sessions in (("b",), ("a", "b")) if authenticated else ("b",)
        if authenticated:
            assert stats.refused_frames > 0
    finally:
        fuzzer.close()
        reader.close()
