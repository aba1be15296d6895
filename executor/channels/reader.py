"""The consuming end of a channel: `ChannelReader`, a DEALER with no thread of its own that
subscribes, grants credit, drops duplicates, fetches replays and acknowledges.
`executor.channels` describes the protocol."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable

import pyarrow as pa
import zmq

from executor.channels.auth import ReaderAuth, connect_curve
from executor.channels.base import (
    BATCHED_RECV,
    Batch,
    ChannelError,
    ChannelTimeout,
    ChannelTrimmed,
    ReaderStats,
    WrongChannel,
    _RefusalLog,
    configure_connect,
    configure_socket,
)
from executor.wire import (
    FLAG_NON_RETAINING,
    NONE,
    WRITER_KINDS,
    ErrorCode,
    FrameError,
    Header,
    Kind,
    check_frame_sizes,
    decode_header,
    decode_table,
    encode_header,
    range_ended,
)

log = logging.getLogger("executor.channels")


# --- the reader -----------------------------------------------------------------------------


class ChannelReader:
    """The consuming end of one channel for one named reader; no thread of its own.

    Every method is safe to call from any thread (a lock serialises them); socket I/O happens only
    inside calls. `poll` waits in short slices so a concurrent `ack` is never held long.
    """

    def __init__(
        self,
        channel_id: str,
        reader_id: str,
        endpoint: str,
        schema: pa.Schema,
        *,
        credit: int = 8,
        max_frame_bytes: int = 64 << 20,
        retains: bool = True,
        refresh_interval: float = 0.5,
        auth: ReaderAuth | None = None,
    ) -> None:
        """`auth`: connect over CURVE with `auth.keys`, to a writer whose public key is
        `auth.server_key` (the writer must have declared this reader with that public key)."""
        if not reader_id or credit < 1:
            raise ValueError("reader_id must be non-empty and credit >= 1")
        self.channel_id = channel_id
        self.reader_id = reader_id
        self.endpoint = endpoint
        self.schema = schema
        self._credit = credit
        self._max_frame = max_frame_bytes
        self._retains = retains
        self._refresh = refresh_interval
        self._auth = auth
        self._lock = threading.RLock()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._open(endpoint)
        self._sub_id = 0
        self._subscribed = False
        self._confirmed = False
        self._next: int | None = None
        self._handed = 0
        self._acked = 0
        self._acks_unconfirmed = False
        self._fetch_upto = 0
        self._limit_sent = 0
        self._received: dict[int, Batch] = {}
        self._epoch: int | None = None
        self._error: ChannelError | None = None
        self._ranges: dict[int, tuple[int, int]] = {}
        self._ended_at: int | None = None  # the writer said its stream ended at this seq
        self._req_ids = itertools.count(1)
        self._last_heard = time.monotonic()
        self._last_resub = 0.0
        self._needs_resub = False
        self._refusals = _RefusalLog(f"channel {channel_id} reader {reader_id}")
        self._counts = {"received": 0, "dups": 0, "resubs": 0}

    def _open(self, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        configure_socket(sock, self._max_frame)
        configure_connect(sock)
        if self._auth is not None:
            connect_curve(sock, self._auth)
        sock.connect(endpoint)
        return sock

    # -- public API

    def subscribe(self, from_seq: int | None = None, *, timeout: float | None = None) -> None:
        """Ask to be served from `from_seq` (None: after this reader's last ack, or where this
        instance left off). With `timeout`, wait for the writer's answer and raise its error."""
        if from_seq is not None and from_seq < 1:
            raise ValueError(f"from_seq must be >= 1, got {from_seq}")
        with self._lock:
            self._error = None
            if from_seq is not None:
                self._restart_at(from_seq)
                self._handed = from_seq - 1
            self._send_subscribe()
            if timeout is not None:
                self._wait_until(lambda: self._confirmed, timeout, "subscription answer")

    def poll(self, timeout: float) -> list[Batch]:
        """New batches in seq order (duplicates dropped); [] if none arrived within `timeout`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._require_subscribed()
        while True:
            with self._lock:
                self._pump_socket(0)
                out = self._take_new()
                if out:
                    self._grant_credit()
                    return out
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._pump_socket(min(remaining, 0.05))
                out = self._take_new()
                if out:
                    self._grant_credit()
                    return out

    def fetch(self, after: int, upto: int, timeout: float) -> list[Batch]:
        """Exactly the batches (after, upto], from the local buffer or by asking for a replay."""
        if upto <= after:
            return []
        with self._lock:
            self._fetch_upto = max(self._fetch_upto, upto)
            missing = self._first_missing(after, upto)
            if missing is not None and (self._next is None or missing < self._next
                                        or not self._subscribed):
                self._restart_at(missing)
                self._send_subscribe()
            else:
                self._grant_credit(force=True)
            self._wait_until(lambda: self._first_missing(after, upto) is None, timeout,
                             f"batches ({after}, {upto}]")
            self._handed = max(self._handed, upto)
            return [self._received[seq] for seq in range(after + 1, upto + 1)]

    def ack(self, upto: int) -> None:
        """All seqs <= `upto` are committed downstream: the writer may trim them."""
        with self._lock:
            self._acked = max(self._acked, upto)
            self._handed = max(self._handed, self._acked)
            for seq in [s for s in self._received if s <= self._acked]:
                del self._received[seq]
            if self._next is not None and self._next <= self._acked:
                self._next = self._acked + 1
            limit = self._limit()
            self._send(Header(Kind.ACK, self.channel_id, self._acked, limit, 0, self._sub_id,
                              self.reader_id))
            self._limit_sent = max(self._limit_sent, limit)
            self._acks_unconfirmed = True

    def retained_range(self, timeout: float) -> tuple[int, int]:
        """The writer's (first retained seq, last seq); needs no subscription."""
        with self._lock:
            request = self.ask_range()
            self._wait_until(lambda: request in self._ranges, timeout, "retained range")
            return self._take_range(request)

    def ask_range(self) -> int:
        """Ask the writer for its retained range without waiting: the request's id, whose
        answer `range_answer` takes (several writers asked at once share one wait)."""
        with self._lock:
            request = next(self._req_ids)
            self._send(Header(Kind.RANGE_REQ, self.channel_id, 0, 0, 0, request))
            return request

    def range_answer(self, request: int, wait: float) -> tuple[int, int] | None:
        """The writer's (first retained seq, last seq) answering `ask_range`'s `request`, if it
        came within `wait` s; None if not (yet)."""
        with self._lock:
            if request not in self._ranges:
                self._pump_socket(wait)
            return self._take_range(request) if request in self._ranges else None

    def _take_range(self, request: int) -> tuple[int, int]:
        self._acks_unconfirmed = False  # answered after every ack sent before the request
        return self._ranges.pop(request)

    def connect_to(self, endpoint: str) -> None:
        """Read from the writer at `endpoint` instead, continuing at the next expected seq."""
        with self._lock:
            self._socket.close(linger=0)
            self._socket = self._open(endpoint)
            log.info("channel %s: reader %s retargeted %s -> %s",
                     self.channel_id, self.reader_id, self.endpoint, endpoint)
            self.endpoint = endpoint
            self._epoch = None
            self._error = None
            if self._subscribed:
                self._send_subscribe()

    def stats(self) -> ReaderStats:
        with self._lock:
            return ReaderStats(
                channel_id=self.channel_id,
                reader_id=self.reader_id,
                endpoint=self.endpoint,
                epoch=self._epoch,
                next_seq=self._next,
                handed_upto=self._handed,
                acked_upto=self._acked,
                buffered_batches=len(self._received),
                batches_received=self._counts["received"],
                duplicates_dropped=self._counts["dups"],
                refused_frames=self._refusals.count,
                resubscribes=self._counts["resubs"],
            )

    def close(self, flush_timeout: float = 0.5) -> None:
        """Say goodbye and close. Acks sent since the writer last answered are confirmed first by
        a round trip on this connection (up to `flush_timeout` s; 0 skips it): a successor that
        subscribes "after my last ack" on another connection then finds them applied."""
        with self._lock:
            if self._socket.closed:
                return
            if self._acks_unconfirmed and flush_timeout > 0:
                self._flush_acks(flush_timeout)
            try:
                self._socket.send(encode_header(Header(Kind.BYE, self.channel_id,
                                                       text=self.reader_id)), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self._socket.close(linger=0)

    def _flush_acks(self, timeout: float) -> None:
        """Wait for the writer to answer a range request: it has handled every earlier ack."""
        try:
            self.retained_range(timeout)
        except ChannelError as exc:
            log.info("channel %s: reader %s closes without confirming its acks: %s",
                     self.channel_id, self.reader_id, exc)

    # -- state changes

    def _restart_at(self, seq: int) -> None:
        """Accept from `seq` on; what was received from there will come again."""
        self._next = seq
        for buffered in [s for s in self._received if s >= seq]:
            del self._received[buffered]

    def _limit(self) -> int:
        return max(self._acked, self._handed, self._fetch_upto) + self._credit

    def _send_subscribe(self) -> None:
        self._sub_id += 1
        self._subscribed = True
        self._confirmed = False
        self._needs_resub = False
        self._last_resub = self._last_heard = time.monotonic()
        from_seq = self._next if self._next is not None else NONE
        window = self._limit() - (self._next - 1) if self._next is not None else self._credit
        flags = 0 if self._retains else FLAG_NON_RETAINING
        self._send(Header(Kind.SUBSCRIBE, self.channel_id, from_seq, window, flags, self._sub_id,
                          self.reader_id))
        self._limit_sent = (self._next or 1) - 1 + window

    def _grant_credit(self, force: bool = False) -> None:
        limit = self._limit()
        if force or limit - self._limit_sent >= max(1, self._credit // 2):
            self._send(Header(Kind.CREDIT, self.channel_id, limit, 0, 0, self._sub_id,
                              self.reader_id))
            self._limit_sent = limit

    def _take_new(self) -> list[Batch]:
        out = []
        while self._handed + 1 in self._received:
            self._handed += 1
            out.append(self._received[self._handed])
        return out

    def _first_missing(self, after: int, upto: int) -> int | None:
        for seq in range(after + 1, upto + 1):
            if seq not in self._received:
                return seq
        return None

    def _require_subscribed(self) -> None:
        if not self._subscribed:
            raise ChannelError(
                f"channel {self.channel_id}: reader {self.reader_id} must subscribe() first"
            )

    # -- socket I/O (under the lock)

    def _send(self, header: Header) -> None:
        try:
            self._socket.send(encode_header(header), zmq.NOBLOCK)
        except zmq.Again:  # queue full while disconnected: keep-alive will repeat it
            log.debug("channel %s: reader %s dropped a %s frame (queue full)",
                      self.channel_id, self.reader_id, header.kind.name)

    def _wait_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._pump_socket(0)
            if done():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout(
                    f"channel {self.channel_id}: reader {self.reader_id} got no {what} from "
                    f"{self.endpoint} within {timeout} s"
                )
            self._pump_socket(min(remaining, 0.05))
            if done():
                return

    def _pump_socket(self, wait: float) -> None:
        """Handle what has arrived (waiting up to `wait` s for the first), keep the subscription
        alive, and raise a pending error."""
        if wait > 0:
            self._socket.poll(int(wait * 1000) or 1)
        for _ in range(BATCHED_RECV):
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._last_heard = time.monotonic()
            self._handle(frames)
        self._keep_alive()
        self._raise_pending()

    def _keep_alive(self) -> None:
        if not self._subscribed:
            return
        now = time.monotonic()
        if self._needs_resub and now - self._last_resub >= min(0.2, self._refresh):
            self._counts["resubs"] += 1
            self._send_subscribe()
        elif now - self._last_heard >= self._refresh:
            self._last_heard = now  # lost frames or a restarted writer: re-assert our credit
            if self._confirmed:
                self._grant_credit(force=True)
            else:
                self._send_subscribe()

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _handle(self, frames: list[zmq.Frame]) -> None:
        try:
            header = self._parse(frames)
        except FrameError as exc:
            self._refusals.refuse(f"from {self.endpoint}: {exc}")
            return
        if header.kind is Kind.DATA:
            self._on_data(header, frames[1])
        elif header.kind is Kind.SUBSCRIBED:
            self._on_subscribed(header)
        elif header.kind is Kind.RANGE:
            self._on_range(header)
        else:
            self._on_error(header)

    def _parse(self, frames: list[zmq.Frame]) -> Header:
        check_frame_sizes([len(f) for f in frames], self._max_frame)
        header = decode_header(frames[0].bytes)
        if header.kind not in WRITER_KINDS:
            raise FrameError(f"frame kind {header.kind.name} is not one a writer sends")
        if header.channel_id != self.channel_id:
            raise FrameError(f"frame of channel {header.channel_id}, not {self.channel_id}")
        expected = 2 if header.kind is Kind.DATA else 1
        if len(frames) != expected:
            raise FrameError(f"{header.kind.name} with {len(frames)} frames, expected {expected}")
        return header

    def _on_range(self, header: Header) -> None:
        """A range answer; one saying the stream ended (`range_ended`) is believed only if it
        is consistent: no seq after its end was received, and no earlier end said otherwise
        (else refused and counted, as a bad frame)."""
        try:
            ended = range_ended(header)
            received = (self._next - 1) if self._next is not None else self._handed
            if ended and received > header.b:
                raise FrameError(f"RANGE says the stream ended at seq {header.b}, but seq "
                                 f"{received} was received")
            if ended and self._ended_at not in (None, header.b):
                raise FrameError(f"RANGE says the stream ended at seq {header.b}, an earlier "
                                 f"one at {self._ended_at}")
        except FrameError as exc:
            self._refusals.refuse(f"from {self.endpoint}: {exc}")
            return
        if ended:
            self._ended_at = header.b
        self._ranges[header.d] = (header.a, header.b)

    @property
    def ended_at(self) -> int | None:
        """The seq the writer's stream ended at, once a range answer said so (None: not ended,
        or not known yet). Nothing is numbered after it."""
        with self._lock:
            return self._ended_at

    def _on_subscribed(self, header: Header) -> None:
        if header.d != self._sub_id:
            return
        self._confirmed = True
        self._check_epoch(header.b)
        start = header.a
        if self._next is None or start > self._next:
            self._next = start
            self._handed = max(self._handed, start - 1)
        self._grant_credit()

    def _on_data(self, header: Header, body: zmq.Frame) -> None:
        seq = header.a
        if header.d != self._sub_id or self._next is None or seq < self._next:
            self._counts["dups"] += 1
            return
        if seq > self._next:
            log.warning("channel %s: reader %s expected seq %s, got %s; asking for a replay",
                        self.channel_id, self.reader_id, self._next, seq)
            self._needs_resub = True
            return
        try:
            table = decode_table(body.buffer, self.schema)
        except FrameError as exc:
            self._refusals.refuse(f"seq {seq} from {self.endpoint}: {exc}")
            self._needs_resub = True
            return
        self._check_epoch(header.c)
        self._received[seq] = Batch(seq, header.b, table)
        self._next = seq + 1
        self._counts["received"] += 1

    def _check_epoch(self, epoch: int) -> None:
        if self._epoch is None:
            self._epoch = epoch
        elif epoch != self._epoch:
            self._error = ChannelError(
                f"channel {self.channel_id}: writer epoch changed {self._epoch} -> {epoch}; "
                f"sequence numbers of the old epoch are not valid"
            )

    def _on_error(self, header: Header) -> None:
        code = ErrorCode(header.a) if header.a in ErrorCode._value2member_map_ else None
        if code is ErrorCode.NOT_SUBSCRIBED:
            if self._subscribed and header.d == self._sub_id:
                self._counts["resubs"] += 1
                self._send_subscribe()  # the writer lost our session (restart, reconnect)
            return
        if code is not ErrorCode.WRONG_CHANNEL and header.d not in (0, self._sub_id):
            return  # about an earlier subscription
        if code in (ErrorCode.WRONG_CHANNEL, ErrorCode.TRIMMED, ErrorCode.SUPERSEDED,
                    ErrorCode.RETARGETED, ErrorCode.UNAUTHORIZED):
            self._subscribed = False
        self._error = _error_for(code, header)


def _error_for(code: ErrorCode | None, header: Header) -> ChannelError:
    """The exception a reader raises for a writer's ERROR frame."""
    if code is ErrorCode.WRONG_CHANNEL:
        return WrongChannel(header.text)
    if code is ErrorCode.TRIMMED:
        return ChannelTrimmed(header.text, header.b, header.c)
    return ChannelError(header.text or f"writer error code {header.a}")
