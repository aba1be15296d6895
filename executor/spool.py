"""The channel spool: numbered Arrow batches on disk between a channel's receiver and Spark.

Owns the layout of one spool folder and every operation on it; no sockets, no Spark. A spool
holds one numbered stream (a channel, or the one stream a selector's replicas serve):
- `<seq>.<chunks>.<bytes>.arrow`: batch `seq` as an Arrow IPC file of `chunks` record batches
  and `bytes` bytes, written by the receiver under a temporary name and renamed (a reader never
  sees half a batch; the name tells the reader how to split and bound a micro-batch without
  opening the file);
- `committed`: the highest seq Spark has committed (the reader's `commit()` writes it, then
  unlinks the batches up to it; the receiver acknowledges it upstream). Before the first commit
  it holds the base: the seq before the first batch the writer still retained when the spool
  was created, which is where a fresh query starts;
- `error`: why the receiver gave up (a writer's refusal, a changed epoch), raised by the reader;
- `dpc`: what a union's DPC controller (`executor.dpc`) asks of the reader, when it asks
  anything (`Control`): hold (hand Spark nothing new), keep (trim nothing: a re-run from the
  stable point reads the batches again) and upto (the next micro-batch takes every batch up to
  that seq, whatever its size: the re-run's one batch over every input).
The folder is 0700 and batch files 0600 (`common.safe_open.private_folder`): the tuples
at rest are the query's, not every local user's. Batches are neither fsynced nor copied: a SIGKILLed process loses nothing that the page cache
holds, and a batch lost with the machine is still retained upstream (acks follow commits).
The reading side (`executor.spool_source`, in Spark's processes) memory-maps the files.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Iterable, Iterator, Sequence

import pyarrow as pa

from common.atomic_file import replace_file
from common.safe_open import PRIVATE_FILE_MODE, private_folder
from executor.dpc_marks import without_corrections, without_superseded

CHUNK_ROWS = 32_768  # rows per record batch in a spooled file: the unit Spark partitions split
COMMITTED = "committed"
ERROR = "error"
DPC = "dpc"
_BATCH = re.compile(r"^(\d{20})\.(\d{1,9})\.(\d{1,15})\.arrow$")


class SpoolError(RuntimeError):
    """The spool cannot serve what was asked (the receiver gave up, or batches never came)."""


@dataclass(frozen=True)
class SpooledBatch:
    seq: int
    chunks: int
    size: int  # bytes


def batch_name(seq: int, chunks: int, size: int) -> str:
    return f"{seq:020d}.{chunks}.{size}.arrow"


def parse_name(name: str) -> SpooledBatch | None:
    """The batch a spool file name stands for; None for any other name (pure)."""
    match = _BATCH.match(name)
    if match is None:
        return None
    return SpooledBatch(int(match.group(1)), int(match.group(2)), int(match.group(3)))


def listing(folder: str) -> dict[int, SpooledBatch]:
    """seq -> spooled batch, for every complete batch file in `folder` ({} if none)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return {}
    found = (parse_name(name) for name in names)
    return {b.seq: b for b in found if b is not None}


def contiguous_high(seqs: Iterable[int], after: int) -> int:
    """The highest s such that every seq in (after, s] is in `seqs` (`after` if none) (pure)."""
    present = set(seqs)
    high = after
    while high + 1 in present:
        high += 1
    return high


def capped_high(found: dict[int, SpooledBatch], after: int, max_bytes: int) -> int:
    """Like `contiguous_high`, but stopping before the batch that would take the bytes of
    (after, high] over `max_bytes`; at least one batch when one is there (pure). Bounds a
    micro-batch after a backlog, so that its output still fits a channel frame."""
    high, total = after, 0
    while high + 1 in found:
        total += found[high + 1].size
        if total > max_bytes and high > after:
            break
        high += 1
    return high


def _replace(path: str, text: str) -> None:
    replace_file(path, text)


def read_committed(folder: str) -> int | None:
    """The committed seq (or the base); None before the receiver set one."""
    try:
        with open(os.path.join(folder, COMMITTED), encoding="utf-8") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        raise SpoolError(f"spool {folder}: unreadable committed mark {text[:40]!r}")
    return int(text)


def write_committed(folder: str, seq: int) -> None:
    private_folder(folder)
    _replace(os.path.join(folder, COMMITTED), str(seq))


@dataclass(frozen=True)
class Control:
    """What a DPC controller asks of a spool's reader (the default: nothing)."""

    hold: bool = False
    keep: bool = False
    upto: int | None = None
    superseded: int = 0  # a marked channel's tentative rows of episodes up to it are left out


def write_control(folder: str, control: Control) -> None:
    private_folder(folder)
    _replace(os.path.join(folder, DPC), json.dumps(asdict(control)))


def read_control(folder: str) -> Control:
    """The controller's request; the default when there is none (or it is unreadable)."""
    try:
        with open(os.path.join(folder, DPC), encoding="utf-8") as f:
            data = json.loads(f.read())
        return Control(bool(data["hold"]), bool(data["keep"]),
                       None if data["upto"] is None else int(data["upto"]),
                       int(data.get("superseded", 0)))
    except FileNotFoundError:
        return Control()
    except (ValueError, KeyError, TypeError) as exc:
        raise SpoolError(f"spool {folder}: unreadable dpc control: {exc}") from None


def trim(folder: str, upto: int) -> int:
    """Unlink the batches with seq <= `upto`; how many went."""
    gone = 0
    for seq, batch in listing(folder).items():
        if seq <= upto:
            try:
                os.unlink(os.path.join(folder, batch_name(seq, batch.chunks, batch.size)))
                gone += 1
            except FileNotFoundError:
                pass
    return gone


def write_batch(folder: str, seq: int, table: pa.Table) -> int:
    """Spool batch `seq` (atomically: temporary file, then rename); its size in bytes."""
    batches = table.to_batches(max_chunksize=CHUNK_ROWS) or [
        pa.RecordBatch.from_pylist([], schema=table.schema)]
    tmp = os.path.join(folder, f".{seq}.{os.getpid()}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                     PRIVATE_FILE_MODE))  # made 0600 before a byte of data is in it
    os.chmod(tmp, PRIVATE_FILE_MODE)  # (a leftover of a killed writer kept its old mode)
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    size = os.path.getsize(tmp)
    os.replace(tmp, os.path.join(folder, batch_name(seq, len(batches), size)))
    return size


def set_error(folder: str, message: str) -> None:
    private_folder(folder)
    _replace(os.path.join(folder, ERROR), message)


def clear_error(folder: str) -> None:
    try:
        os.unlink(os.path.join(folder, ERROR))
    except FileNotFoundError:
        pass


def read_error(folder: str) -> str | None:
    try:
        with open(os.path.join(folder, ERROR), encoding="utf-8") as f:
            return f.read() or "the channel receiver failed"
    except FileNotFoundError:
        return None


# --- splitting a micro-batch's range into Spark partitions ---------------------------------------

Unit = tuple[int, int, int, int, int]  # (seq, chunks, size, first, end): batches [first, end)


def split_units(batches: Sequence[SpooledBatch], parts: int) -> list[tuple[Unit, ...]]:
    """The record batches of `batches` (in seq order) cut into at most `parts` runs of nearly
    equal chunk counts, each a tuple of units; a batch may be cut between two parts (pure)."""
    total = sum(b.chunks for b in batches)
    if total == 0:
        return []
    parts = max(1, min(parts, total))
    bounds = [total * i // parts for i in range(parts + 1)]
    out: list[tuple[Unit, ...]] = []
    position = 0  # chunks before the current batch
    index = 0
    for lo, hi in zip(bounds, bounds[1:]):
        units: list[Unit] = []
        while index < len(batches) and position < hi:
            batch = batches[index]
            first = max(lo, position) - position
            end = min(hi, position + batch.chunks) - position
            if end > first:
                units.append((batch.seq, batch.chunks, batch.size, first, end))
            if position + batch.chunks <= hi:
                position += batch.chunks
                index += 1
            else:
                break
        out.append(tuple(units))
    return [units for units in out if units]


def read_units(folder: str, units: Sequence[Unit], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The record batches `units` name, memory-mapped, as `schema` (a Spark Python worker's side);
    a marked channel's correction rows left out (`dpc_marks.without_corrections`), and its
    tentative rows of the episodes a stateful downstream task's re-run supersedes
    (`Control.superseded`, `dpc_marks.without_superseded`)."""
    superseded = read_control(folder).superseded if units else 0
    for seq, chunks, size, first, end in units:
        path = os.path.join(folder, batch_name(seq, chunks, size))
        try:
            reader = pa.ipc.open_file(pa.memory_map(path))  # batches keep the mapping alive
        except FileNotFoundError:
            raise SpoolError(f"spool {folder}: batch {seq} is gone (trimmed before it was "
                             "read)") from None
        for index in range(first, end):
            batch = without_superseded(without_corrections(reader.get_batch(index)), superseded)
            if batch.num_rows == 0:  # every row a correction or superseded: nothing to read
                continue
            if not batch.schema.equals(schema, check_metadata=False):
                batch = pa.Table.from_batches([batch]).select(schema.names) \
                    .cast(schema).combine_chunks().to_batches()[0]
            yield batch

