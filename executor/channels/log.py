"""A channel writer's durable upstream backup: numbered batches in append-only segment files.

Owns the on-disk form of a writer's retained batches (one record per numbered batch: seq, tag,
rows and the encoded body), finding a torn or corrupt tail after a crash and cutting it off, and
deleting whole segments once every record in them is acknowledged. Does not own numbering,
retention decisions, readers or sockets (`executor.channels.writer` decides what to append and
up to which seq to trim), nor what a body means (an Arrow IPC stream, opaque here).

On disk: a folder (0700) of segment files (0600: the tuples at rest are the query's alone) named `<first seq, 20 digits>.seg`, each a run of records
with consecutive seqs, segments consecutive too. A record is a fixed header then the body:
    magic "EQLG" | seq i64 | tag i64 | rows i64 | body length u64 | crc32 u32   (network order)
The crc32 covers the four numbers and the body, so a record half-written when its process died,
or damaged later, is detected. Opening a log keeps the longest good prefix in seq order: the first
torn or corrupt record and everything after it are cut off (that batch was never admitted; its
producer re-runs the micro-batch). The segment holding the last record is never trimmed, so the
last seq and tag survive even when every batch has been acknowledged.

Each append is one write of header and body (`os.writev`) to the OS: it survives the death of
the process (the page cache keeps it). It survives a machine or power loss only with
`fsync=True` (each append, and each new segment's directory entry, is fsynced).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from common.safe_open import PRIVATE_FILE_MODE, private_folder

log = logging.getLogger("executor.channels")

RECORD_MAGIC = b"EQLG"
_RECORD = struct.Struct("!4sqqqQI")
RECORD_HEADER_BYTES = _RECORD.size
_NUMBERS = struct.Struct("!qqqQ")  # what the crc covers before the body
_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")


class ChannelLogError(Exception):
    """The log cannot be used: a folder problem, or a seq out of order."""


class RecordError(ValueError):
    """A record that cannot be trusted; `torn` when it is cut short rather than damaged."""

    def __init__(self, message: str, torn: bool = False) -> None:
        super().__init__(message)
        self.torn = torn


@dataclass(frozen=True)
class RecordHeader:
    seq: int
    tag: int
    rows: int
    length: int  # body bytes that follow the header
    crc: int


@dataclass(frozen=True)
class LoggedBatch:
    """One numbered batch as the log gives it back."""

    seq: int
    tag: int
    rows: int
    body: bytes


# --- pure record encoding -------------------------------------------------------------------


def record_crc(seq: int, tag: int, rows: int, body: bytes | memoryview) -> int:
    """The crc32 of a record: its numbers, then its body."""
    return zlib.crc32(body, zlib.crc32(_NUMBERS.pack(seq, tag, rows, len(body))))


def encode_record_header(seq: int, tag: int, rows: int, body: bytes | memoryview) -> bytes:
    """The fixed header that precedes `body` on disk."""
    if seq < 1 or rows < 0:
        raise ValueError(f"record seq must be >= 1 and rows >= 0, got seq {seq} rows {rows}")
    return _RECORD.pack(RECORD_MAGIC, seq, tag, rows, len(body), record_crc(seq, tag, rows, body))


def decode_record_header(raw: bytes | memoryview) -> RecordHeader:
    """The header at the start of `raw`; RecordError (torn if `raw` is too short) otherwise."""
    if len(raw) < RECORD_HEADER_BYTES:
        raise RecordError(f"record header of {len(raw)} bytes, need {RECORD_HEADER_BYTES}",
                          torn=True)
    magic, seq, tag, rows, length, crc = _RECORD.unpack_from(raw, 0)
    if magic != RECORD_MAGIC:
        raise RecordError(f"bad record magic {bytes(magic)!r}, expected {RECORD_MAGIC!r}")
    if seq < 1 or rows < 0:
        raise RecordError(f"impossible record numbers seq {seq} rows {rows}")
    return RecordHeader(seq, tag, rows, length, crc)


def check_record_body(header: RecordHeader, body: bytes | memoryview) -> None:
    """RecordError unless `body` is the whole body `header` announces, with its crc."""
    if len(body) < header.length:
        raise RecordError(f"seq {header.seq}: body of {len(body)} bytes, header says "
                          f"{header.length}", torn=True)
    if record_crc(header.seq, header.tag, header.rows, body) != header.crc:
        raise RecordError(f"seq {header.seq}: crc mismatch")


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}.seg"


def segments_to_trim(firsts: list[int], last_seq: int, upto: int) -> int:
    """How many leading segments (by first seq, ascending) hold only seqs <= `upto`; the segment
    holding `last_seq` is never one of them."""
    count = 0
    for index in range(len(firsts) - 1):
        if firsts[index + 1] - 1 > upto or firsts[index + 1] > last_seq:
            break
        count += 1
    return count


# --- I/O ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scan:
    records: int
    good_bytes: int
    first_seq: int | None
    last_seq: int | None
    last_tag: int | None
    problem: str | None


def _read_records(path: Path, expect_seq: int | None) -> Iterator[tuple[int, LoggedBatch] | str]:
    """The good records of one segment with their end offsets, then a problem text if a record
    is torn, corrupt or out of seq order (reading stops there)."""
    with path.open("rb") as handle:
        offset = 0
        while True:
            raw = handle.read(RECORD_HEADER_BYTES)
            if not raw:
                return
            try:
                header = decode_record_header(raw)
                if expect_seq is not None and header.seq != expect_seq:
                    raise RecordError(f"seq {header.seq} where {expect_seq} was expected")
                body = handle.read(header.length)
                check_record_body(header, body)
            except RecordError as exc:
                kind = "torn" if exc.torn else "corrupt"
                yield f"{kind} record at byte {offset} of {path.name}: {exc}"
                return
            offset += RECORD_HEADER_BYTES + header.length
            expect_seq = header.seq + 1
            yield offset, LoggedBatch(header.seq, header.tag, header.rows, body)


def _scan_segment(path: Path, expect_seq: int) -> _Scan:
    records, good, first, last, tag = 0, 0, None, None, None
    for item in _read_records(path, expect_seq):
        if isinstance(item, str):
            return _Scan(records, good, first, last, tag, item)
        good, batch = item
        records += 1
        first = batch.seq if first is None else first
        last, tag = batch.seq, batch.tag
    return _Scan(records, good, first, last, tag, None)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """Write every byte of `parts` in order; one writev unless the kernel takes less."""
    views = [memoryview(part).cast("B") for part in parts]
    total = sum(len(v) for v in views)
    written = os.writev(fd, views)
    if written == total:
        return
    rest = memoryview(b"".join(bytes(v) for v in views))[written:]
    while rest:
        rest = rest[os.write(fd, rest):]


class ChannelLog:
    """Append-only segments of numbered batches in `folder`; recovers its good prefix on open.

    Thread-safe: one lock serialises append, trim and close (a trim waits at most for the
    append in progress). `name` (the channel id) only labels log messages.
    """

    def __init__(self, folder: str | os.PathLike[str], *, fsync: bool = False,
                 segment_bytes: int = 64 << 20, name: str = "") -> None:
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be positive")
        self.folder = Path(folder)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.name = name or str(folder)
        self._lock = threading.Lock()
        self._firsts: list[int] = []  # first seq of each segment, ascending
        self._fd: int | None = None
        self._closed = False
        self._size = 0
        self.last_seq = 0
        self.last_tag = -1
        self.first_seq = 1
        try:
            private_folder(self.folder)
        except OSError as exc:
            raise ChannelLogError(f"channel log {self.name}: cannot create {folder}: {exc}") from exc
        self._recover()

    # -- opening

    def _segment_files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.folder.iterdir():
            match = _SEGMENT_NAME.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def _recover(self) -> None:
        """Keep the longest good prefix: cut the first bad record, drop what follows it."""
        segments = self._segment_files()
        kept: list[tuple[int, Path]] = []
        expect: int | None = None
        for index, (first, path) in enumerate(segments):
            scan = _scan_segment(path, first if expect is None else expect)
            if scan.problem is not None:
                self._cut(path, scan, segments[index + 1:])
            if scan.records:
                assert scan.last_seq is not None and scan.last_tag is not None  # set by a record
                kept.append((first, path))
                self.last_seq, self.last_tag = scan.last_seq, scan.last_tag
                expect = scan.last_seq + 1
            else:
                path.unlink()  # empty (created, then the process died) or cut to nothing
            if scan.problem is not None:
                break
        self._firsts = [first for first, _ in kept]
        self.first_seq = self._firsts[0] if kept else self.last_seq + 1
        if kept:
            self._open_for_append(kept[-1][1])
        log.info("channel log %s: opened %s with seqs %s..%s in %s segments", self.name,
                 self.folder, self.first_seq, self.last_seq, len(kept))

    def _cut(self, path: Path, scan: _Scan, later: list[tuple[int, Path]]) -> None:
        log.warning("channel log %s: %s; keeping %s records (%s bytes) of it and dropping %s "
                    "later segments", self.name, scan.problem, scan.records, scan.good_bytes,
                    len(later))
        with path.open("r+b") as handle:
            handle.truncate(scan.good_bytes)
        for _, other in later:
            other.unlink()

    def _open_for_append(self, path: Path) -> int:
        """Open `path` as the segment appended to; its file descriptor (now `self._fd`)."""
        if self._fd is not None:
            os.close(self._fd)
        fd = self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                                PRIVATE_FILE_MODE)
        os.fchmod(fd, PRIVATE_FILE_MODE)  # a segment from before segments were 0600
        self._size = os.fstat(fd).st_size
        return fd

    # -- reading

    def entries(self) -> list[LoggedBatch]:
        """Every record in seq order, read back from the segments (holds the lock meanwhile)."""
        out: list[LoggedBatch] = []
        with self._lock:
            for first in self._firsts:
                for item in _read_records(self.folder / segment_name(first), first):
                    if isinstance(item, str):
                        raise ChannelLogError(f"channel log {self.name}: {item} (changed under us?)")
                    if item[1].seq <= self.last_seq:
                        out.append(item[1])
        return out

    def segment_count(self) -> int:
        with self._lock:
            return len(self._firsts)

    # -- writing

    def append(self, seq: int, tag: int, rows: int, body: bytes | memoryview) -> None:
        """Write the record of batch `seq` (which must be last seq + 1) in one write."""
        header = encode_record_header(seq, tag, rows, body)
        with self._lock:
            if self._closed:
                raise ChannelLogError(f"channel log {self.name}: closed")
            if seq != self.last_seq + 1:
                raise ChannelLogError(
                    f"channel log {self.name}: append of seq {seq}, expected {self.last_seq + 1}"
                )
            fd = self._fd
            if fd is None or (self._size and self._size + len(header) + len(body)
                              > self.segment_bytes):
                fd = self._start_segment(seq)
            try:
                _write_all(fd, [header, body])
                if self.fsync:
                    os.fsync(fd)
            except OSError:
                os.ftruncate(fd, self._size)  # no partial record before the next append
                raise
            self._size += len(header) + len(body)
            self.last_seq, self.last_tag = seq, tag

    def _start_segment(self, first_seq: int) -> int:
        fd = self._open_for_append(self.folder / segment_name(first_seq))
        if self.fsync:
            _fsync_dir(self.folder)
        self._firsts.append(first_seq)
        if len(self._firsts) == 1:
            self.first_seq = first_seq
        log.debug("channel log %s: new segment from seq %s", self.name, first_seq)
        return fd

    def trim_upto(self, seq: int) -> int:
        """Delete the segments whose records are all <= `seq`; returns how many were deleted."""
        with self._lock:
            count = segments_to_trim(self._firsts, self.last_seq, seq)
            doomed, self._firsts = self._firsts[:count], self._firsts[count:]
            if count:
                self.first_seq = self._firsts[0]
            for first in doomed:
                (self.folder / segment_name(first)).unlink(missing_ok=True)
        if count:
            log.debug("channel log %s: trimmed %s segments up to seq %s", self.name, count, seq)
        return count

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
