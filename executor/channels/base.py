"""Channel values shared by the writer and the reader: numbered batches, statistics, errors,
and the rate-limited log of refused frames. `executor.channels` describes the protocol."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
import zmq

log = logging.getLogger("executor.channels")

FRAME_SLACK_BYTES = 64 << 10  # ZeroMQ's hard cap is max_frame_bytes + this (headers, ids)
HEARTBEAT_MS = 1000  # ZeroMQ heartbeats on both ends; a peer silent for 3 of them is gone
# A reader's connect: a pending TCP connect is given up after CONNECT_TIMEOUT_MS and made again
# (a fresh SYN) after RECONNECT_IVL_MS to twice that, never backing off (RECONNECT_IVL_MAX_MS 0).
# Without it a reconnect during a partition sits in SYN-SENT while the kernel retries its SYN
# at doubling intervals, so a healed link was noticed up to ~16 s late (docs/availability.md).
CONNECT_TIMEOUT_MS = 1000  # far above a connect's round trip between two hosts of a cluster
RECONNECT_IVL_MS = 100  # libzmq's default, stated: what the bound on noticing a heal rests on
RECONNECT_IVL_MAX_MS = 0  # no exponential backoff of the reconnect interval
BATCHED_RECV = 256  # messages handled per I/O wake-up before pumping again


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """One numbered batch as a reader delivers it."""

    seq: int
    tag: int
    table: pa.Table


@dataclass(frozen=True)
class WriterStats:
    channel_id: str
    epoch: int
    batches_sent: int  # numbered batches accepted by send()
    rows_sent: int
    data_frames: int  # DATA frames put on the wire, replays included
    retained_batches: int
    retained_bytes: int
    first_seq: int
    last_seq: int
    acked: Mapping[str, int]  # per tracked reader
    sessions: tuple[str, ...]  # reader ids currently served
    refused_frames: int
    blocked_sends: int  # sends that had to wait for room
    unauthorized_frames: int = 0  # undeclared subscribers, frames claiming another reader's id
    blocked_seconds: float = 0.0  # how long the current send has waited for room (0: not blocked)
    authenticated: bool = False  # served over CURVE
    readerless_seconds: float = 0.0  # how long no reader has been subscribed (0: one is)


@dataclass(frozen=True)
class ReaderStats:
    channel_id: str
    reader_id: str
    endpoint: str
    epoch: int | None
    next_seq: int | None  # the next sequence number the reader accepts
    handed_upto: int  # highest seq returned by poll/fetch
    acked_upto: int
    buffered_batches: int
    batches_received: int
    duplicates_dropped: int
    refused_frames: int
    resubscribes: int


class ChannelError(Exception):
    """A channel cannot do what was asked; the message says which channel and why."""


class ChannelFull(ChannelError):
    """`send` timed out waiting for retention room (readers are not acknowledging)."""


class ChannelTrimmed(ChannelError):
    """A replay asked for batches the writer no longer retains."""

    def __init__(self, message: str, first: int, last: int) -> None:
        super().__init__(message)
        self.first = first
        self.last = last


class WrongChannel(ChannelError):
    """The endpoint serves another channel."""


class ChannelTimeout(ChannelError):
    """No answer (or not all the asked batches) within the timeout."""


class _RefusalLog:
    """Logs refused frames without letting a flood of garbage flood the log."""

    def __init__(self, who: str) -> None:
        self.count = 0
        self._who = who

    def refuse(self, reason: str) -> None:
        self.count += 1
        if self.count <= 10 or self.count & (self.count - 1) == 0:
            log.warning("%s: refused frame #%s: %s", self._who, self.count, reason)


def configure_socket(sock: "zmq.Socket", max_frame_bytes: int) -> None:
    """The options both ends of a channel share: no linger on close, a hard cap on message size
    (ZeroMQ drops a peer that exceeds it), and heartbeats so a vanished peer is noticed."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes + FRAME_SLACK_BYTES)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)


def configure_connect(sock: "zmq.Socket") -> None:
    """The options of a connecting end (a reader): a healed partition is noticed within about
    CONNECT_TIMEOUT_MS + 2 * RECONNECT_IVL_MS, however long the link was cut, since every
    connect attempt sends a fresh SYN instead of waiting out the kernel's SYN backoff."""
    sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
