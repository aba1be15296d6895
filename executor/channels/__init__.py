"""Channels between tasks: numbered Arrow batches from one producer to named readers over ZeroMQ.

Owns invariants 1-3 (docs/architecture.md) on the wire: the writer numbers batches 1, 2, 3, ... per
(producer, channel, epoch), is idempotent on the caller's tag (the producing micro-batch id), keeps
every batch until every tracked reader has acknowledged it (upstream backup), replays from any
retained number, and sends only within each reader's credit; readers drop numbers they have seen.
Frame layout and validation live in `executor.wire`. Does not own what a batch means, Spark
offsets or checkpoints (the Spark source/sink code), nor where endpoints are registered.

Who may speak. A writer given a `WriterAuth` serves over CURVE (encrypted, authenticated) and
admits, through the context's ZAP handler (`executor.channels.auth`), only the public keys of its
declared readers, each standing for one reader id; every frame's reader id must be the one its
connection's key stands for, else it is refused (ERROR `UNAUTHORIZED`, counted in
`unauthorized_frames`) and nothing of it applies: a forged ACK trims nothing. A peer without a
declared key is dropped at the handshake and sees nothing. Only declared readers are tracked
(`expected_readers`, `auth.readers`, `add_reader`/`retarget_reader`): an undeclared SUBSCRIBE
that would retain is refused, on plain-text writers too, so nobody can pin the backup by
subscribing and vanishing; a non-retaining subscriber pins nothing. A plain-text writer (no
`auth`) trusts its peers' reader ids: for tests, and for network sinks that declare no readers
(`open_readers`, the old behaviour, on a trusted network only).

Threading: the writer binds a ROUTER and runs one background I/O
thread that owns the socket (pyzmq sockets are not thread-safe); `send` only encodes, appends to
the retained buffer under a lock and wakes the I/O thread through an inproc PAIR socket. A reader
is a DEALER with NO thread of its own: every socket operation happens inside the caller's call
(`poll`, `fetch`, `ack`, ...), serialised by a lock, so it can be polled from one thread (a Spark
source's planning calls) or driven by a thread the caller owns. Credit bounds what the writer
pushes to a reader that is not being polled, so nothing piles up while nobody calls.

Memory bound. Writer: the retained buffer holds at most `max_retained_batches` encoded batches and
at most `max_retained_bytes` bytes (a single batch larger than that is admitted only into an empty
buffer); ZeroMQ send queues share those bytes (zero-copy), so the writer holds about
`max_retained_bytes` + one batch being encoded. Reader: at most `credit` batches beyond what the
caller has taken, plus the batches the caller has taken but not yet acknowledged (kept for
`fetch`), which the writer's retention bound caps in turn.

Liveness trade-off. A tracked (declared) reader that vanishes keeps its batches retained: it will come back and replay. Retention is bounded, so once
it fills, `send` blocks (or raises ChannelFull) and the producer stalls for everyone, which is
what upstream backup must do rather than lose data. A reader that is gone for good must be
released with `drop_reader` (or replaced with `retarget_reader`). Readers that vanish never wedge
the I/O thread: every socket send is non-blocking and an unreachable reader's session is ended.
A stalled writer says so: `WriterStats.blocked_seconds` (how long a send has waited for room)
and `readerless_seconds` (how long no reader has been subscribed).

Durability. Without a `log_dir` the upstream backup lives in the writer's memory and dies with
its process. With `log_dir`, every admitted batch is first appended to an
`executor.channels.log.ChannelLog` in that folder (one record per seq: tag, rows, body, crc32),
and segments are deleted once every tracked reader has acknowledged all their records. A writer
opened on the same folder (the relaunched producer, a new process, same epoch) reloads the logged
batches, the last seq and the tags, so it continues the numbering, recognises a re-run micro-batch
by its tag and replays to readers resubscribing from their committed seq + 1; its tracked readers
start at ack 0 and nothing is trimmed until they acknowledge again. A batch torn by the crash is
cut off on reload and the producer re-runs it. What survives: the death of the process (SIGKILL,
OOM kill, a crash), since each append is handed to the OS and sits in its page cache; the loss of
the machine or its power only with `log_fsync=True` and only if the next writer can reach the
folder (storage that outlives the machine, or the same machine coming back). The log costs one
write of each batch's bytes on the producer's `send` path (see `benchmarks/channel_hop.py
--durable`); trims run on the I/O thread outside the writer's lock.
"""

from executor.channels.base import (Batch, ChannelError, ChannelFull, ChannelTimeout,
                                   ChannelTrimmed, ReaderStats, WriterStats, WrongChannel)
from executor.channels.reader import ChannelReader
from executor.channels.writer import (ChannelWriter, RetainedBuffer, TagLog, retention_floor,
                                     subscription_start)

__all__ = [
    "Batch", "ChannelError", "ChannelFull", "ChannelReader", "ChannelTimeout", "ChannelTrimmed",
    "ChannelWriter", "ReaderStats", "RetainedBuffer", "TagLog", "WriterStats", "WrongChannel",
    "retention_floor", "subscription_start",
]
