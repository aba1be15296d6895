"""The receiving end of a task's channel input: a thread of the executor process that takes
numbered batches from one writer (a channel) or from k replica writers of one stream (a stream
selector, hot standby) and spools them (`executor.spool`) for the task's Spark query to read.

Owns subscribing, following moved writers (the task's endpoints file), picking batches from
whichever replica has them first (each seq spooled once), acknowledging upstream what Spark has
committed (the spool's `committed` mark), and bounding the spool (no credit is granted while
`max_spool_bytes` of uncommitted batches wait), and with `liveness` (a DPC union's or join's
input, `executor.dpc`) whether the stream's writers answer: a selector's stream is cut only when
every replica is (`common.dpc.selector_view`), and never once it has ended (a writer's range
answer said it ended at a seq, `ChannelWriter.end`, and that seq is spooled). A single
writer's refusal (trimmed, superseded, unauthorized, a changed epoch) is written to the spool
for the reader to raise, as the query's failure; a replica's error only skips that replica
for `retry_seconds`. Does not own the channel protocol (`executor.channels.reader`) nor the
Spark side (`executor.spool_source`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa
import zmq

from common import dpc
from common.safe_open import private_folder
from executor import spool
from executor.channels.base import Batch, ChannelError
from executor.endpoints_file import EndpointWatcher

if TYPE_CHECKING:
    from executor.channels import ChannelReader

log = logging.getLogger("executor.spool")

POLL_SECONDS = 0.05
PROBE_SECONDS = 0.5  # with `liveness`: a writer silent this long is asked for its range
PROBE_TIMEOUT = 0.5  # and is unreachable if it does not answer within this
FINISHED_CHECK_SECONDS = 0.5  # how often Spark's commit log is read for finished batches
BASE_ANSWER_SECONDS = 2.0


@dataclass(frozen=True)
class Replica:
    """One writer serving the spooled stream: its channel id, this task's reader id there, its
    endpoint and its CURVE public key ("" = plain text)."""

    channel: str
    reader_id: str
    endpoint: str
    server_key: str = ""


class _Source:
    """One replica's reader, whether it may be used now and its liveness (mutable, receiver
    thread only)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.endpoint = replica.endpoint
        self.reader: ChannelReader | None = None
        self.subscribed = False
        self.retry_at = 0.0
        self.last_heard = time.monotonic()  # its last batch or answered probe
        self.reachable = True
        self.ended_at: int | None = None  # its writer said its stream ended at this seq

    def view(self, spooled_high: int) -> dpc.InputView:
        ended = self.ended_at is not None and spooled_high >= self.ended_at
        return dpc.InputView(self.replica.channel, self.last_heard, self.reachable, ended,
                             dormant=not self.endpoint)


class SpoolReceiver:
    """Fills the spool `folder` from `replicas` (one for a channel) in a daemon thread."""

    def __init__(self, task_id: str, folder: str, replicas: Sequence[Replica],
                 schema: pa.Schema, *, key_file: str = "", endpoints_file: str = "",
                 log_file: str = "", credit: int = 16, max_spool_bytes: int = 256 << 20,
                 retry_seconds: float = 2.0, finished: Callable[[], int | None] | None = None,
                 from_now: bool = False, liveness: bool = False) -> None:
        if not replicas:
            raise ValueError(f"task {task_id}: a spool needs at least one writer")
        self.task_id, self.folder, self.schema = task_id, folder, schema
        self._sources = [_Source(r) for r in replicas]
        self._key_file = key_file
        self._watcher = EndpointWatcher(endpoints_file) if endpoints_file else None
        self._credit, self._max_bytes, self._retry = credit, max_spool_bytes, retry_seconds
        self._selector = len(replicas) > 1
        self._log = _task_logger(task_id, folder, log_file)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._high = 0  # every seq <= high is spooled (or committed)
        self._acked = 0
        self._pending: dict[int, Batch] = {}  # arrived ahead of a gap (replicas out of step)
        self._sizes: dict[int, int] = {}  # seq -> bytes, spooled and not committed
        self._current: int | None = None  # the replica that supplied the last batch
        # the highest seq of this spool in a micro-batch Spark has finished (None: unknown);
        # acknowledged upstream at once, without waiting for Spark's commit call on the source,
        # which comes only when a next micro-batch starts (an idle channel would never settle)
        self._finished = finished
        self._finished_checked = 0.0
        # a new spool starts after the writer's last batch, not at the oldest it retains
        self._from_now = from_now
        # channel liveness (a DPC union's or join's input, `executor.dpc`): a stream silent
        # for PROBE_SECONDS has each of its writers asked for its retained range; an answer
        # (or data) is a word from that writer, no answer within PROBE_TIMEOUT (one wait shared
        # by every replica) makes it unreachable. The stream is reachable while any writer is,
        # and last heard at the latest word from any (`common.dpc.selector_view`); read by
        # other threads
        self.liveness = liveness
        self.last_heard = time.monotonic()
        self.reachable = True
        # the stream ended (a writer said so, `ChannelWriter.end`, and its last seq is spooled):
        # nothing more comes, so it is neither probed nor ever cut, though its writer goes away
        self.ended = False
        # no writer is placed (a dormant instance slot, `messages.UNPLACED`): never cut
        self.dormant = not any(r.endpoint for r in replicas)
        self._probed = 0.0

    # -- lifecycle

    def start(self) -> "SpoolReceiver":
        """Start receiving; a failure the last receiver left in the spool is cleared first."""
        private_folder(self.folder)
        spool.clear_error(self.folder)
        name = f"spool-{self.task_id}-{os.path.basename(self.folder)}"
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop receiving and close the readers (acks sent are confirmed first, briefly)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        for source in self._sources:
            if source.reader is not None:
                source.reader.close(flush_timeout=0.5)
                source.reader = None
        for handler in list(self._log.handlers):
            self._log.removeHandler(handler)
            handler.close()

    # -- the thread

    def _run(self) -> None:
        try:
            committed = self._base()
            if committed is None:
                return
            self._acked = committed
            self._high = spool.contiguous_high(spool.listing(self.folder), committed)
            while not self._stop.is_set():
                self._follow_endpoints()
                self._acknowledge()
                if self._spooled_bytes() > self._max_bytes:
                    self._stop.wait(POLL_SECONDS / 5)
                    continue
                self._receive()
                self._probe()
        except _GiveUp as exc:
            self._log.warning("task %s: spool %s stops: %s", self.task_id, self.folder, exc)
            spool.set_error(self.folder, str(exc))
        except Exception as exc:  # noqa: BLE001 - the reader must learn why, or it would wait
            self._log.exception("task %s: spool receiver failed", self.task_id)
            spool.set_error(self.folder, f"channel receiver failed: {type(exc).__name__}: {exc}")

    def _base(self) -> int | None:
        """The committed mark; on a new spool, set it to the seq before the first batch a writer
        retains (several replicas: the highest such seq among those that answer)."""
        committed = spool.read_committed(self.folder)
        if committed is None and not any(source.endpoint for source in self._sources):
            # no writer was ever placed (a dormant instance of an elastic operator): it will
            # number its first batch 1
            committed = 0
            spool.write_committed(self.folder, committed)
        while committed is None and not self._stop.is_set():
            self._follow_endpoints()  # the writer may have moved before it ever answered
            answers = []
            for index in range(len(self._sources)):
                if not self._sources[index].endpoint:
                    continue
                try:
                    reader = self._reader(index, force=True)
                    assert reader is not None  # it has an endpoint and `force` skips the wait
                    first, last = reader.retained_range(timeout=BASE_ANSWER_SECONDS)
                    answers.append(last if self._from_now else first - 1)
                except ChannelError as exc:
                    self._log.info("task %s: channel %s gave no retained range: %s",
                                   self.task_id, self._name(index), exc)
            if answers:
                committed = max(answers)
                spool.write_committed(self.folder, committed)
        return committed

    def _receive(self) -> None:
        order = self._order()
        for position, index in enumerate(order):
            batches = self._poll(index, POLL_SECONDS if position == 0 else 0.0)
            for batch in batches:
                self._take(index, batch)
            if batches and position == 0:
                return

    def _take(self, index: int, batch: Batch) -> None:
        self._heard_from(index, True)
        if batch.seq <= self._high:
            return  # another replica supplied it already
        self._pending[batch.seq] = batch
        while self._high + 1 in self._pending:
            ready = self._pending.pop(self._high + 1)
            self._sizes[ready.seq] = spool.write_batch(self.folder, ready.seq, ready.table)
            self._high = ready.seq
            if self._selector and index != self._current:
                self._log.info("task %s: selector now reads replica %s at seq %s", self.task_id,
                               self._name(index), ready.seq)
            self._current = index

    @property
    def spooled_high(self) -> int:
        """Every seq up to this is spooled (or committed)."""
        return self._high

    def _probe(self) -> None:
        """With `liveness`: once the stream is silent, ask each writer for its range (one
        shared wait); mark each reachable or not, and the stream from them."""
        now = time.monotonic()
        if not self.liveness or self.ended or \
                min(now - self.last_heard, now - self._probed) < PROBE_SECONDS:
            return
        self._probed = now
        readers = {index: self._reader(index) for index in range(len(self._sources))}
        answers, errors = range_answers(
            {i: r for i, r in readers.items() if r is not None}, PROBE_TIMEOUT)
        for index, error in errors.items():
            self._fail(index, error)  # a single writer's ends the receiver
        for index in range(len(self._sources)):
            self._heard_from(index, index in answers)

    def _heard_from(self, index: int, answered: bool) -> None:
        """Replica `index` sent data or answered a probe (`answered`), or did not answer one;
        the stream's liveness follows from every replica's."""
        source = self._sources[index]
        if answered and not source.reachable and self.liveness:
            self._log.info("task %s: writer of %s answers again", self.task_id,
                           self._name(index))
        elif not answered and source.reachable and source.endpoint:
            self._log.info("task %s: writer of %s does not answer: unreachable", self.task_id,
                           self._name(index))
        if answered:
            source.last_heard = time.monotonic()
        source.reachable = answered
        if source.reader is not None and source.reader.ended_at is not None:
            source.ended_at = source.reader.ended_at
        view = dpc.selector_view(self._name(0),
                                 tuple(s.view(self._high) for s in self._sources))
        if view.ended and not self.ended:
            self._log.info("task %s: stream %s ended at seq %s: not waited for", self.task_id,
                           self._name(0), self._high)
        self.last_heard, self.reachable, self.ended = view.last_heard, view.reachable, view.ended
        self.dormant = view.dormant

    def refused_frames(self) -> int:
        """Frames its readers refused so far (a body or a DPC mark that does not check, each
        asked for again; `ChannelReader.stats`), any thread; a reader replaced after an error
        starts from 0."""
        readers = [s.reader for s in self._sources if s.reader is not None]
        return sum(r.stats().refused_frames for r in readers)

    def writer_last_seq(self, timeout: float) -> int | None:
        """The last seq the writer has numbered, asked now (any thread): the highest answer of
        the replicas that answer within `timeout` (they number alike), waiting no longer than
        for every replica the last probe found reachable (or, none, for one); None if none
        answers."""
        # the receiver thread's readers, thread-safe (none is made here)
        readers = {i: s.reader for i, s in enumerate(self._sources) if s.reader is not None}
        live = {i for i in readers if self._sources[i].reachable}

        def enough(answers: dict[int, tuple[int, int]]) -> bool:
            return live <= answers.keys() if live else bool(answers)

        try:
            answers, _ = range_answers(readers, timeout, enough)
        except zmq.ZMQError:  # a replica's reader closed meanwhile by the receiver thread
            return None
        return max((last for _, last in answers.values()), default=None)

    def _acknowledge(self) -> None:
        committed = max(spool.read_committed(self.folder) or 0, self._finished_seq())
        if committed <= self._acked:
            return
        self._acked = committed
        for seq in [s for s in self._sizes if s <= committed]:
            del self._sizes[seq]
        for index in range(len(self._sources)):
            reader = self._reader(index)
            if reader is None:
                continue
            try:
                reader.ack(committed)
            except ChannelError as exc:
                self._fail(index, exc)

    def _finished_seq(self) -> int:
        """`finished()`, asked at most every FINISHED_CHECK_SECONDS; never above what is
        spooled."""
        now = time.monotonic()
        if self._finished is None or now - self._finished_checked < FINISHED_CHECK_SECONDS:
            return 0
        self._finished_checked = now
        return min(self._finished() or 0, self._high)

    def _spooled_bytes(self) -> int:
        return sum(self._sizes.values())

    # -- replicas

    def _name(self, index: int) -> str:
        return self._sources[index].replica.channel

    def _order(self) -> list[int]:
        """Replica indexes, the one that supplied the last batches first."""
        others = [i for i in range(len(self._sources)) if i != self._current]
        return others if self._current is None else [self._current, *others]

    def _reader(self, index: int, *, force: bool = False) -> ChannelReader | None:
        """The replica's reader, or None while it waits to be retried after an error."""
        source = self._sources[index]
        if not source.endpoint or (not force and time.monotonic() < source.retry_at):
            return None  # no endpoint yet (a producer never placed), or waiting for a retry
        if source.reader is None:
            from executor.channels.auth import reader_auth
            from executor.channels import ChannelReader

            source.reader = ChannelReader(source.replica.channel, source.replica.reader_id,
                                          source.endpoint, self.schema, credit=self._credit,
                                          auth=reader_auth(self._key_file,
                                                           source.replica.server_key))
            source.subscribed = False
        return source.reader

    def _poll(self, index: int, wait: float) -> list[Batch]:
        reader = self._reader(index)
        if reader is None:
            if wait:
                self._stop.wait(wait)
            return []
        source = self._sources[index]
        try:
            if not source.subscribed:
                reader.subscribe(from_seq=self._high + 1)
                source.subscribed = True
            return reader.poll(wait)
        except ChannelError as exc:
            self._fail(index, exc)
            return []

    def _fail(self, index: int, error: Exception) -> None:
        """A single writer's error ends the receiver (the query fails and is restarted); a
        replica's only skips it, and a fresh reader re-subscribes after `retry_seconds`."""
        if not self._selector:
            raise _GiveUp(f"channel {self._name(index)}: {error}")
        source = self._sources[index]
        self._log.warning("task %s: selector skips replica %s for %s s: %s", self.task_id,
                          self._name(index), self._retry, error)
        _drop_reader(source)
        source.retry_at = time.monotonic() + self._retry

    def _follow_endpoints(self) -> None:
        """Reconnect a reader whose writer the endpoints file now places elsewhere; close one
        whose writer it places nowhere (`messages.UNPLACED`: a dormant instance slot, retired
        by a scale-in once drained), which is then not waited for until it is placed again."""
        endpoints = self._watcher.changed() if self._watcher is not None else None
        if not endpoints:
            return
        for index, source in enumerate(self._sources):
            new = endpoints.get(source.replica.channel)
            if new is None or new == source.endpoint:
                continue
            self._log.info("task %s: channel %s moves %s -> %s", self.task_id,
                           source.replica.channel, source.endpoint or "(not placed)",
                           new or "(not placed: a dormant instance)")
            placed = bool(source.endpoint)
            source.endpoint = new
            if not new:
                _drop_reader(source)
            elif source.reader is not None:
                source.reader.connect_to(new)
                source.retry_at = 0.0  # a replica skipped at its old endpoint is tried at once
            if not placed:  # a writer newly placed is heard from as at the start
                source.last_heard, source.reachable = time.monotonic(), True
            self._heard_from(index, source.reachable)


def _drop_reader(source: _Source) -> None:
    """Close a source's reader (after an error, or its writer is no longer placed)."""
    if source.reader is not None:
        try:
            source.reader.close(flush_timeout=0)
        except Exception:  # noqa: BLE001 - closing a broken reader must not hide the error
            log.debug("closing %s's reader failed", source.replica.channel, exc_info=True)
    source.reader, source.subscribed = None, False


def range_answers(readers: dict[int, ChannelReader], timeout: float,
                  enough: Callable[[dict[int, tuple[int, int]]], bool] | None = None
                  ) -> tuple[dict[int, tuple[int, int]], dict[int, ChannelError]]:
    """Each reader's writer asked for its retained range at once, the answers awaited together
    for at most `timeout` s (or until `enough(answers)`): (index -> (first, last) of those that
    answered, index -> the error of those whose reader raised one)."""
    asked: dict[int, int] = {}
    answers: dict[int, tuple[int, int]] = {}
    errors: dict[int, ChannelError] = {}
    for index, reader in readers.items():
        asked[index] = reader.ask_range()
    deadline = time.monotonic() + timeout
    while True:
        pending = [i for i in asked if i not in answers and i not in errors]
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0 or (enough is not None and enough(answers)):
            return answers, errors
        for index in pending:
            try:
                answer = readers[index].range_answer(asked[index],
                                                     min(remaining, 0.05) / len(pending))
            except ChannelError as exc:
                errors[index] = exc
                continue
            if answer is not None:
                answers[index] = answer


class _GiveUp(Exception):
    """The stream cannot continue from this writer (raised inside the receiver thread)."""


def _task_logger(task_id: str, folder: str, log_file: str) -> logging.Logger:
    """A child of `executor.spool` for this receiver that also writes to the task's source log
    (`log_file`, "" = none), where the executor and tests read retargets and replica switches."""
    logger = log.getChild(f"{task_id}.{os.path.basename(folder)}")
    if log_file:
        private_folder(os.path.dirname(log_file))
        handler = logging.FileHandler(log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    return logger
