"""The producing end of a channel: numbering, tag idempotence, upstream backup, credit, replay.

`ChannelWriter` binds a ROUTER and owns it from one I/O thread; the pure pieces it is built from
(`RetainedBuffer`, `TagLog`, `retention_floor`, `subscription_start`) are tested alone. With a
`log_dir` the upstream backup is also kept in an `executor.channels.log.ChannelLog` and reloaded by
the next writer on that folder; the log's format and recovery are not owned here.
`executor.channels` describes the protocol, its memory bound, its liveness trade-off and what
survives which failure."""

from __future__ import annotations

import bisect
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Sequence, cast

import pyarrow as pa
import zmq

from executor.channels.base import (
    BATCHED_RECV,
    ChannelError,
    ChannelFull,
    WriterStats,
    _RefusalLog,
    configure_socket,
)
from executor.channels.auth import WriterAuth, ZapHandler, serve_curve
from executor.channels.log import ChannelLog, ChannelLogError
from executor.wire import (
    FLAG_NON_RETAINING,
    NONE,
    READER_KINDS,
    RANGE_ENDED,
    ErrorCode,
    FrameError,
    Header,
    Kind,
    check_frame_sizes,
    decode_header,
    encode_header,
    encode_table,
)

log = logging.getLogger("executor.channels")

_TAG_HISTORY = 65536
BIND_RETRY_S = 2.0


# --- pure pieces of the writer --------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    seq: int
    tag: int
    body: pa.Buffer
    rows: int


class RetainedBuffer:
    """The writer's upstream backup: encoded batches by consecutive seq, with byte accounting."""

    def __init__(self) -> None:
        self._entries: deque[_Entry] = deque()
        self.last_seq = 0
        self.nbytes = 0

    @property
    def first_seq(self) -> int:
        return self._entries[0].seq if self._entries else self.last_seq + 1

    def __len__(self) -> int:
        return len(self._entries)

    def has_room(self, nbytes: int, max_batches: int, max_bytes: int) -> bool:
        if not self._entries:
            return True
        return len(self._entries) < max_batches and self.nbytes + nbytes <= max_bytes

    def append(self, tag: int, body: pa.Buffer | bytes, rows: int) -> int:
        self.last_seq += 1
        self._entries.append(_Entry(self.last_seq, tag, body, rows))
        self.nbytes += len(body)
        return self.last_seq

    def restore(self, seq: int, tag: int, body: pa.Buffer | bytes, rows: int) -> None:
        """Put back a batch from a log: the first one sets the numbering, then seqs follow on.
        Not bounded by retention (a reloaded batch is never dropped)."""
        if self._entries and seq != self.last_seq + 1:
            raise ValueError(f"restored seq {seq} does not follow {self.last_seq}")
        self.last_seq = seq - 1
        self.append(tag, body, rows)

    def get(self, seq: int) -> _Entry:
        return self._entries[seq - self.first_seq]

    def trim_upto(self, seq: int) -> int:
        trimmed = 0
        while self._entries and self._entries[0].seq <= seq:
            self.nbytes -= len(self._entries.popleft().body)
            trimmed += 1
        return trimmed


class TagLog:
    """Which seq a producer tag got: tags are increasing; an empty batch maps to the seq before."""

    def __init__(self, limit: int = _TAG_HISTORY) -> None:
        self._tags: list[int] = []
        self._seqs: list[int] = []
        self._limit = limit
        self.last_tag = -1

    def record(self, tag: int, seq: int) -> None:
        self._tags.append(tag)
        self._seqs.append(seq)
        self.last_tag = tag
        if len(self._tags) > 2 * self._limit:
            del self._tags[: self._limit]
            del self._seqs[: self._limit]

    def seq_for(self, tag: int) -> int | None:
        """The seq recorded at the latest tag <= `tag`; None when older than the history."""
        index = bisect.bisect_right(self._tags, tag) - 1
        return self._seqs[index] if index >= 0 else None


def retention_floor(acked: Mapping[str, int], tracked: set[str]) -> int:
    """The highest seq every tracked reader has acknowledged; 0 (trim nothing) if none tracked."""
    if not tracked:
        return 0
    return min(acked.get(reader, 0) for reader in tracked)


def subscription_start(from_seq: int, acked: int, first: int) -> tuple[int, bool]:
    """(first seq to send, trimmed?) for a subscribe asking `from_seq` (NONE: after its ack)."""
    start = acked + 1 if from_seq == NONE else from_seq
    return start, start < first


@dataclass
class _Session:
    """Writer-side state of one subscribed reader (I/O thread only, under the writer lock)."""

    reader_id: str
    identity: bytes
    sub_id: int
    next_seq: int
    limit: int
    retains: bool


def _user_id(frame: zmq.Frame) -> str | None:
    """The User-Id the ZAP handler gave the frame's connection; None when there is none."""
    try:
        return cast(str, frame.get("User-Id"))  # a string property (stubs: int | str)
    except zmq.ZMQError:
        return None


def _tcp_bind_address(bind: str) -> str:
    return bind[: -len(":0")] + ":*" if bind.startswith("tcp://") and bind.endswith(":0") else bind


def _as_table(table: pa.Table | pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table


# --- the writer -----------------------------------------------------------------------------


class ChannelWriter:
    """The producing end of one channel: binds, numbers, retains, serves readers within credit."""

    def __init__(
        self,
        channel_id: str,
        schema: pa.Schema,
        *,
        bind: str = "tcp://127.0.0.1:0",
        expected_readers: Sequence[str] = (),
        epoch: int = 0,
        max_retained_batches: int = 1024,
        max_retained_bytes: int = 256 << 20,
        max_frame_bytes: int = 64 << 20,
        log_dir: str | None = None,
        log_fsync: bool = False,
        log_segment_bytes: int = 64 << 20,
        auth: WriterAuth | None = None,
        open_readers: bool = False,
        published: bool = False,
    ) -> None:
        """`auth`: serve over CURVE with `auth.keys` and admit only the readers `auth.readers`
        declares (each frame's reader id must be the one its connection's key stands for); every
        declared reader is tracked. Without `auth` the channel is plain text and trusts its
        peers' reader ids (a test, a trusted network). Either way only declared readers
        (`expected_readers`, `auth.readers`, `add_reader`) are tracked and may subscribe with
        retention; `open_readers` (plain text only: a network sink that declares no readers)
        tracks whoever subscribes, as before readers were declared.
        `log_dir`: keep the upstream backup in a `ChannelLog` there too, and start from what
        it holds (seqs, tags, bodies) - the writer a relaunched producer opens on the same folder
        continues the numbering. `log_fsync`: fsync each append (survives machine loss).
        `log_segment_bytes`: the log is trimmed by whole segments of about this size.
        `published`: a stream other queries read by name (docs/queries.md): while no reader is
        tracked and the retention is full, the oldest batches go instead of `send` blocking,
        so a writer nobody reads never stalls and a later reader finds the latest batches."""
        if not channel_id or max_retained_batches < 1 or max_retained_bytes < 1:
            raise ValueError("channel_id must be non-empty and retention bounds positive")
        if auth is not None and (open_readers or not set(expected_readers) <= set(auth.readers)):
            raise ValueError(f"channel {channel_id}: with CURVE every expected reader needs a "
                             "declared key, and readers cannot be open")
        declared = list(expected_readers) + list(auth.readers if auth is not None else ())
        self.channel_id = channel_id
        self.schema = schema
        self.epoch = epoch
        self._max_batches = max_retained_batches
        self._max_bytes = max_retained_bytes
        self._max_frame = max_frame_bytes
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._buffer = RetainedBuffer()
        self._tags = TagLog()
        self._auth = auth
        self._open_readers = open_readers
        self._published = published
        self._domain = f"elastiq-channel-{uuid.uuid4().hex}"
        self._tracked: set[str] = set(declared)
        self._acked: dict[str, int] = {reader: 0 for reader in declared}
        self._sessions: dict[str, _Session] = {}
        self._to_end: list[tuple[str, ErrorCode, str]] = []
        self._closing = False
        self._ended = False  # `end`: no batch follows the last one
        self._backlog = False
        self._refusals = _RefusalLog(f"channel {channel_id} writer")
        self._counts = {"batches": 0, "rows": 0, "frames": 0, "blocked": 0, "unauthorized": 0}
        self._blocked_since: float | None = None
        self._reader_seen = time.monotonic()  # last time a reader was subscribed
        self._log: ChannelLog | None = None
        self._log_floor = self._log_trimmed = 0
        if log_dir is not None:
            self._log = ChannelLog(log_dir, fsync=log_fsync, segment_bytes=log_segment_bytes,
                                   name=channel_id)
            self._reload(self._log)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        try:
            self._router = self._open_router(bind)
        except ChannelError:
            if self._log is not None:
                self._log.close()
            self._revoke()
            raise
        self.endpoint: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._wake_rx, self._wake_tx = self._open_wake_pair()
        self._wake_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, name=f"channel-writer-{channel_id}", daemon=True
        )
        self._thread.start()
        log.info("channel %s: writer epoch %s bound %s (%s)", channel_id, epoch, self.endpoint,
                 f"CURVE, key {auth.keys.public}" if auth is not None else "plain text")

    def _reload(self, channel_log: ChannelLog) -> None:
        """Retain every logged batch again and remember its tag; readers' acks start at 0."""
        count = 0
        for entry in channel_log.entries():
            self._buffer.restore(entry.seq, entry.tag, entry.body, entry.rows)
            self._tags.record(entry.tag, entry.seq)
            count += 1
        log.info("channel %s: reloaded %s batches (seqs %s..%s, last tag %s) from %s",
                 self.channel_id, count, self._buffer.first_seq, self._buffer.last_seq,
                 self._tags.last_tag, channel_log.folder)

    @property
    def last_tag(self) -> int:
        """The last producer tag recorded (sent, empty or reloaded from the log); -1 if none."""
        with self._cond:
            return self._tags.last_tag

    # -- sockets

    def _open_router(self, bind: str) -> zmq.Socket:
        """Bind a ROUTER. A port still in use is retried for up to BIND_RETRY_S: ZeroMQ closes
        sockets asynchronously, so a writer on this port closed an instant ago may not have
        released it yet (a producer relaunched in the same process, on the same port)."""
        deadline = time.monotonic() + BIND_RETRY_S
        retried = 0
        while True:
            sock = self._ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            configure_socket(sock, self._max_frame)
            if self._auth is not None:
                serve_curve(sock, self._auth, self._domain)
            try:
                sock.bind(_tcp_bind_address(bind))
            except zmq.ZMQError as exc:
                sock.close()
                if exc.errno == zmq.EADDRINUSE and time.monotonic() < deadline:
                    retried += 1
                    time.sleep(0.02)
                    continue
                raise ChannelError(f"channel {self.channel_id}: cannot bind {bind}: {exc}") from exc
            if retried:
                log.info("channel %s: %s was in use, bound after %s retries", self.channel_id,
                         bind, retried)
            return sock

    def _open_wake_pair(self) -> tuple[zmq.Socket, zmq.Socket]:
        address = f"inproc://elastiq-channel-wake-{uuid.uuid4().hex}"
        rx = self._ctx.socket(zmq.PAIR)
        rx.bind(address)
        tx = self._ctx.socket(zmq.PAIR)
        tx.setsockopt(zmq.LINGER, 0)
        tx.connect(address)
        return rx, tx

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_tx.closed:
                return
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass  # wake-ups already queued

    # -- the producer's API

    def send(self, table: pa.Table | pa.RecordBatch, tag: int, timeout: float | None = None) -> int:
        """Number and retain `table` (tagged with the producing micro-batch id) and return its seq.

        A tag <= the last tag sent is a re-run: nothing is sent and the earlier seq is returned.
        An empty table is not sent; its tag advances and the current last seq is returned.
        Blocks while retention is full; raises ChannelFull after `timeout` seconds.
        """
        table = _as_table(table)
        if not table.schema.equals(self.schema, check_metadata=False):
            raise ChannelError(
                f"channel {self.channel_id}: batch schema {table.schema} is not {self.schema}"
            )
        with self._send_lock:
            earlier = self._rerun_seq(tag)
            if earlier is not None:
                return earlier
            if table.num_rows and self._ended:
                raise ChannelError(f"channel {self.channel_id}: the stream ended at seq "
                                   f"{self._buffer.last_seq}; batch with tag {tag} not sent")
            if table.num_rows == 0:
                with self._cond:
                    self._tags.record(tag, self._buffer.last_seq)
                    return self._buffer.last_seq
            body = encode_table(table)
            if len(body) > self._max_frame:
                raise ChannelError(
                    f"channel {self.channel_id}: batch with tag {tag} encodes to {len(body)} "
                    f"bytes, above max_frame_bytes {self._max_frame}"
                )
            seq = self._admit(tag, body, table.num_rows, timeout)
        self._wake()
        return seq

    def end(self) -> int:
        """No batch follows the last one sent: the stream ends at that seq, which every reader
        asking for the range is told (RANGE_ENDED), so a union waiting for a cut input knows
        this one will send nothing more and may go away (docs/availability.md, "Without
        max-delay"). A later `send` of a new non-empty batch raises ChannelError. The last seq.
        Not kept in the log: a writer reopened on it has not ended."""
        with self._send_lock, self._cond:
            self._ended = True
            log.info("channel %s: stream ended at seq %s", self.channel_id,
                     self._buffer.last_seq)
            return self._buffer.last_seq

    def _rerun_seq(self, tag: int) -> int | None:
        with self._cond:
            if self._closing:
                raise ChannelError(f"channel {self.channel_id}: writer is closed")
            if tag > self._tags.last_tag:
                return None
            seq = self._tags.seq_for(tag)
        log.info("channel %s: tag %s re-run ignored (seq %s)", self.channel_id, tag, seq)
        return seq if seq is not None else 0

    def _admit(self, tag: int, body: pa.Buffer, rows: int, timeout: float | None) -> int:
        """Wait for room, log the batch (outside the lock: the I/O thread keeps serving), then
        make it visible to readers. Only the send path appends, so the seq cannot change."""
        seq = self._wait_for_room(len(body), timeout) + 1
        if self._log is not None:
            try:
                self._log.append(seq, tag, rows, body)
            except (ChannelLogError, OSError) as exc:
                raise ChannelError(
                    f"channel {self.channel_id}: batch with tag {tag} (seq {seq}) not logged, "
                    f"not sent: {exc}"
                ) from exc
        with self._cond:
            seq = self._buffer.append(tag, body, rows)
            self._tags.record(tag, seq)
            self._counts["batches"] += 1
            self._counts["rows"] += rows
            return seq

    def _wait_for_room(self, nbytes: int, timeout: float | None) -> int:
        """Block until a batch of `nbytes` fits the retention bounds; returns the last seq."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if not self._buffer.has_room(nbytes, self._max_batches, self._max_bytes):
                self._counts["blocked"] += 1
                self._blocked_since = time.monotonic()
            try:
                return self._wait_locked(nbytes, timeout, deadline)
            finally:
                self._blocked_since = None

    def _wait_locked(self, nbytes: int, timeout: float | None, deadline: float | None) -> int:
        """The wait of `_wait_for_room`, under the writer lock."""
        while not self._buffer.has_room(nbytes, self._max_batches, self._max_bytes):
            if self._published and not self._tracked and len(self._buffer):
                self._buffer.trim_upto(self._buffer.first_seq)  # nobody reads: the oldest goes
                self._log_floor = max(self._log_floor, self._buffer.first_seq - 1)
                continue
            if self._closing:
                raise ChannelError(f"channel {self.channel_id}: writer is closed")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ChannelFull(
                    f"channel {self.channel_id}: retention full ({len(self._buffer)} "
                    f"batches, {self._buffer.nbytes} bytes) for {timeout} s; "
                    f"acked={dict(self._acked)}"
                )
            self._cond.wait(remaining)
        return self._buffer.last_seq

    def retained_range(self) -> tuple[int, int]:
        """(first retained seq, last seq); (last + 1, last) when nothing is retained."""
        with self._cond:
            return self._buffer.first_seq, self._buffer.last_seq

    def stats(self) -> WriterStats:
        with self._cond:
            return WriterStats(
                channel_id=self.channel_id,
                epoch=self.epoch,
                batches_sent=self._counts["batches"],
                rows_sent=self._counts["rows"],
                data_frames=self._counts["frames"],
                retained_batches=len(self._buffer),
                retained_bytes=self._buffer.nbytes,
                first_seq=self._buffer.first_seq,
                last_seq=self._buffer.last_seq,
                acked={r: self._acked.get(r, 0) for r in sorted(self._tracked)},
                sessions=tuple(sorted(self._sessions)),
                refused_frames=self._refusals.count,
                blocked_sends=self._counts["blocked"],
                unauthorized_frames=self._counts["unauthorized"],
                blocked_seconds=(0.0 if self._blocked_since is None
                                 else time.monotonic() - self._blocked_since),
                authenticated=self._auth is not None,
                readerless_seconds=(0.0 if self._sessions
                                    else time.monotonic() - self._reader_seen),
            )

    # -- retargeting (control tuples)

    def add_reader(self, reader_id: str, acked: int = 0, public_key: str | None = None) -> None:
        """Declare `reader_id` and retain for it from `acked` + 1 on, before it subscribes; a
        CURVE writer admits it with `public_key` (None: the key it was declared with)."""
        with self._cond:
            if self._auth is not None and public_key is not None:
                ZapHandler.of(self._ctx).admit(self._domain, {reader_id: public_key})
            self._tracked.add(reader_id)
            self._acked[reader_id] = max(self._acked.get(reader_id, 0), acked)

    def drop_reader(self, reader_id: str) -> None:
        """Stop serving and retaining for `reader_id` (gone for good)."""
        self._end_reader(reader_id, ErrorCode.RETARGETED, None)

    def retarget_reader(self, old_reader: str, new_reader: str,
                        public_key: str | None = None) -> None:
        """Serve `new_reader` (admitted with `public_key` on a CURVE writer) instead of
        `old_reader`, continuing after the old reader's ack."""
        self._end_reader(old_reader, ErrorCode.RETARGETED, new_reader, public_key)

    def _end_reader(self, reader_id: str, code: ErrorCode, successor: str | None,
                    public_key: str | None = None) -> None:
        with self._cond:
            acked = self._acked.pop(reader_id, 0)
            self._tracked.discard(reader_id)
            if self._auth is not None:
                ZapHandler.of(self._ctx).revoke(self._domain, reader_id)
            if successor is not None:
                self.add_reader(successor, acked, public_key)
            message = f"channel {self.channel_id}: writer no longer serves reader {reader_id}"
            self._to_end.append((reader_id, code, message))
            self._trim()
        log.info("channel %s: reader %s ended (successor %s)", self.channel_id, reader_id, successor)
        self._wake()

    def close(self) -> None:
        """Stop the I/O thread, join it, and close the sockets; blocked senders get ChannelError."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._wake()
        self._thread.join(timeout=10)
        with self._wake_lock:
            self._wake_tx.close(linger=0)
        if self._log is not None:
            self._log.close()
        self._revoke()
        log.info("channel %s: writer closed", self.channel_id)

    def _revoke(self) -> None:
        if self._auth is not None:
            ZapHandler.of(self._ctx).revoke(self._domain)

    # -- the I/O thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        try:
            while not self._closing:
                events = dict(poller.poll(5 if self._backlog else 200))
                if self._wake_rx in events:
                    self._drain_wake()
                if self._router in events:
                    self._drain_router()
                with self._cond:
                    self._end_sessions()
                    self._pump()
                    floor = self._log_floor
                self._trim_log(floor)
        except Exception:  # noqa: BLE001 - a crash here must be visible, not silent
            log.exception("channel %s: writer I/O thread failed", self.channel_id)
            raise
        finally:
            self._router.close(linger=0)
            self._wake_rx.close(linger=0)

    def _drain_wake(self) -> None:
        while True:
            try:
                self._wake_rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _drain_router(self) -> None:
        for _ in range(BATCHED_RECV):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            peer = _user_id(frames[1]) if len(frames) > 1 else None
            with self._cond:
                self._handle(frames[0].bytes, [f.bytes for f in frames[1:]], peer)

    def _handle(self, identity: bytes, frames: list[bytes], peer: str | None = None) -> None:
        """One reader message; `peer` is the reader id the connection's CURVE key stands for
        (None on a plain-text writer)."""
        try:
            header = self._parse(frames)
        except FrameError as exc:
            self._refusals.refuse(f"from peer {identity.hex()}: {exc}")
            self._reply_error(identity, ErrorCode.BAD_FRAME, 0, str(exc))
            return
        if self._auth is not None and header.text and header.text != peer:
            self._refuse_claim(identity, header, peer)
            return
        if header.channel_id != self.channel_id:
            message = (
                f"endpoint {self.endpoint} serves channel {self.channel_id}, "
                f"not {header.channel_id}"
            )
            self._refusals.refuse(message)
            self._reply_error(identity, ErrorCode.WRONG_CHANNEL, header.d, message, header.channel_id)
            return
        handler = {
            Kind.SUBSCRIBE: self._on_subscribe,
            Kind.CREDIT: self._on_credit,
            Kind.ACK: self._on_ack,
            Kind.RANGE_REQ: self._on_range_request,
            Kind.BYE: self._on_bye,
        }[header.kind]
        handler(identity, header)

    def _refuse_claim(self, identity: bytes, header: Header, peer: str | None) -> None:
        """A frame whose reader id is not the one its connection authenticated as: nothing of
        it is applied (a forged ACK trims nothing)."""
        self._counts["unauthorized"] += 1
        message = (f"channel {self.channel_id}: peer authenticated as {peer!r} may not speak "
                   f"for reader {header.text!r}")
        self._refusals.refuse(f"{header.kind.name} from peer {identity.hex()}: {message}")
        self._reply_error(identity, ErrorCode.UNAUTHORIZED, header.d, message)

    def _parse(self, frames: list[bytes]) -> Header:
        check_frame_sizes([len(f) for f in frames], self._max_frame)
        if len(frames) != 1:
            raise FrameError(f"expected 1 frame after the routing id, got {len(frames)}")
        header = decode_header(frames[0])
        if header.kind not in READER_KINDS:
            raise FrameError(f"frame kind {header.kind.name} is not one a reader sends")
        if header.kind in (Kind.SUBSCRIBE, Kind.CREDIT, Kind.ACK) and not header.text:
            raise FrameError(f"{header.kind.name} without a reader id")
        return header

    def _on_subscribe(self, identity: bytes, header: Header) -> None:
        reader_id, from_seq, window, sub_id = header.text, header.a, header.b, header.d
        if from_seq != NONE and from_seq < 1:
            self._reply_error(identity, ErrorCode.BAD_FRAME, sub_id, f"from_seq {from_seq} < 1")
            return
        retains = not header.c & FLAG_NON_RETAINING
        if retains and reader_id not in self._tracked and not self._open_readers:
            self._counts["unauthorized"] += 1
            message = (f"channel {self.channel_id}: reader {reader_id!r} is not declared for "
                       "this channel")
            self._refusals.refuse(f"SUBSCRIBE from peer {identity.hex()}: {message}")
            self._reply_error(identity, ErrorCode.UNAUTHORIZED, sub_id, message)
            return
        start, trimmed = subscription_start(
            from_seq, self._acked.get(reader_id, 0), self._buffer.first_seq
        )
        if trimmed:
            self._reply_trimmed(identity, reader_id, start, sub_id)
            return
        self._replace_session(reader_id, identity)
        self._sessions[reader_id] = _Session(
            reader_id, identity, sub_id, start, start - 1 + max(window, 0), retains
        )
        if retains and reader_id not in self._tracked:
            self.add_reader(reader_id, start - 1)
        reply = Header(Kind.SUBSCRIBED, self.channel_id, start, self.epoch, self._buffer.last_seq, sub_id)
        self._send_frames(identity, [encode_header(reply)])
        log.info("channel %s: reader %s subscribed from %s", self.channel_id, reader_id, start)

    def _reply_trimmed(self, identity: bytes, reader_id: str, start: int, sub_id: int) -> None:
        first, last = self._buffer.first_seq, self._buffer.last_seq
        message = (
            f"channel {self.channel_id}: reader {reader_id} asked from seq {start} but the "
            f"retained range is ({first}, {last})"
        )
        log.warning("%s", message)
        self._reply_error(identity, ErrorCode.TRIMMED, sub_id, message, first=first, last=last)

    def _replace_session(self, reader_id: str, identity: bytes) -> None:
        old = self._sessions.pop(reader_id, None)
        if old is not None and old.identity != identity:
            message = f"channel {self.channel_id}: another reader subscribed as {reader_id}"
            self._reply_error(old.identity, ErrorCode.SUPERSEDED, old.sub_id, message)

    def _session_of(self, identity: bytes, header: Header) -> _Session | None:
        session = self._sessions.get(header.text)
        if session is None or session.identity != identity:
            message = f"channel {self.channel_id}: {header.text} is not subscribed here"
            self._reply_error(identity, ErrorCode.NOT_SUBSCRIBED, header.d, message)
            return None
        return session

    def _on_credit(self, identity: bytes, header: Header) -> None:
        session = self._session_of(identity, header)
        if session is not None and session.sub_id == header.d:
            session.limit = max(session.limit, header.a)

    def _on_ack(self, identity: bytes, header: Header) -> None:
        reader_id, upto = header.text, min(header.a, self._buffer.last_seq)
        if reader_id in self._tracked and upto > self._acked.get(reader_id, 0):
            self._acked[reader_id] = upto
            self._trim()
        session = self._sessions.get(reader_id)
        if session is not None and session.identity == identity and session.sub_id == header.d:
            session.limit = max(session.limit, header.b)

    def _on_range_request(self, identity: bytes, header: Header) -> None:
        first, last = self._buffer.first_seq, self._buffer.last_seq
        reply = Header(Kind.RANGE, self.channel_id, first, last, self.epoch, header.d,
                       RANGE_ENDED if self._ended else "")
        self._send_frames(identity, [encode_header(reply)])

    def _on_bye(self, identity: bytes, header: Header) -> None:
        session = self._sessions.get(header.text)
        if session is not None and session.identity == identity:
            del self._sessions[header.text]
            log.info("channel %s: reader %s said bye", self.channel_id, header.text)

    def _trim(self) -> None:
        floor = retention_floor(self._acked, self._tracked)
        if self._buffer.trim_upto(floor):
            self._cond.notify_all()
        self._log_floor = max(self._log_floor, floor)

    def _trim_log(self, floor: int) -> None:
        """Delete acknowledged log segments (I/O thread, outside the writer lock)."""
        if self._log is not None and floor > self._log_trimmed:
            self._log.trim_upto(floor)
            self._log_trimmed = floor

    def _end_sessions(self) -> None:
        for reader_id, code, message in self._to_end:
            session = self._sessions.pop(reader_id, None)
            if session is not None:
                self._reply_error(session.identity, code, session.sub_id, message)
        self._to_end.clear()

    def _pump(self) -> None:
        self._backlog = False
        if self._sessions:
            self._reader_seen = time.monotonic()
        for session in list(self._sessions.values()):
            self._pump_session(session)

    def _pump_session(self, session: _Session) -> None:
        while session.next_seq <= min(session.limit, self._buffer.last_seq):
            if session.next_seq < self._buffer.first_seq:
                del self._sessions[session.reader_id]
                self._reply_trimmed(session.identity, session.reader_id, session.next_seq, session.sub_id)
                return
            entry = self._buffer.get(session.next_seq)
            header = Header(Kind.DATA, self.channel_id, entry.seq, entry.tag, self.epoch, session.sub_id)
            outcome = self._send_frames(session.identity, [encode_header(header), entry.body])
            if outcome == "blocked":
                self._backlog = True
                return
            if outcome == "gone":
                self._sessions.pop(session.reader_id, None)
                log.warning("channel %s: reader %s unreachable, session ended",
                            self.channel_id, session.reader_id)
                return
            self._counts["frames"] += 1
            session.next_seq += 1

    def _reply_error(
        self, identity: bytes, code: ErrorCode, sub_id: int, message: str,
        channel_id: str | None = None, first: int = 0, last: int = 0,
    ) -> None:
        header = Header(Kind.ERROR, channel_id or self.channel_id, int(code), first, last, sub_id,
                        message[:4000])
        self._send_frames(identity, [encode_header(header)])

    def _send_frames(self, identity: bytes, frames: list[bytes | pa.Buffer]) -> str:
        try:
            self._router.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return "blocked"
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return "gone"
            raise
        return "sent"
