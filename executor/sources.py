"""Spark 4 Python streaming data sources of Elastiq task queries; every offset is a sequence number.

Owns two sources and the reasoning for their reader kind:
- generator (`elastiq_generator`, full reader): offset = tuple index; rows of any index range are
  a pure function of (shape, seed, index) (`executor.shapes`), generated in the executor Python
  workers, partitioned across cores (full reader ~200k rows/s vs simple ~130k: all data would
  otherwise pass the one planner process). `latestOffset` advances with wall time at `rate` from
  an anchor instant persisted in the checkpoint directory, so a restarted query catches up
  instead of starting over; `limit` makes it finite. The pacing state is never stored with a
  number that cannot be read back; an unreadable one is replaced (`repair_pacing`) so that the
  source resumes at the offset Spark last planned for it.
- file replay (`elastiq_file`, full reader): offset = number of complete data lines; the planner
  indexes byte positions of line ends (numpy, no per-line Python), a micro-batch's lines are split
  into several partitions of whole lines (byte ranges), workers parse each range with pyarrow's
  CSV/JSON reader. Any split of the same lines gives the same rows in the same order.
Channel inputs (a channel, a hot-standby group's stream selector) are `executor.spool_source`,
fed by `executor.spool_receiver`.
Does not own the operators or sinks (`executor.runtime`, `executor.sinks`) nor the channel protocol
(`executor.channels`).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from common import safe_open
from common.paths import executor_roots
from common.safe_open import RootedPath, rooted
from common.types import Schema
from executor import shapes

log = logging.getLogger(__name__)

CONFIG_OPTION = "config"
ARROW_CHUNK_ROWS = 65_536
MAX_OFFSET = float(1 << 62)  # further than any source goes: an unbounded generator's limit


# --- pure pacing logic --------------------------------------------------------------------------

def paced_offset(anchor: float, now: float, rate: float | None, available: int,
                 limit: int | None) -> int:
    """How far a paced source may advance: `rate` tuples per second since `anchor`, never beyond
    what is available or `limit` (None = unbounded)."""
    bound = available
    if rate is not None:
        allowed = (now - anchor) * rate
        if not allowed >= 0:  # negative (a clock stepped back) or not a number
            allowed = 0.0
        if allowed < bound:  # an infinite or huge allowance is bounded by what is available
            bound = math.floor(allowed)
    if limit is not None:
        bound = min(bound, limit)
    return bound


def generator_backlog(anchor_path: str, rate: float, limit: int | None, now: float) -> int:
    """Tuples a paced generator has made available and no micro-batch has planned yet: what
    its task lags behind its rate (Spark's own progress shows a Python source's latest offset
    as the planned end, so it never shows this)."""
    stored = _read_anchor(anchor_path)
    start = planned_start(spark_dir_of(anchor_path), "index")
    if stored is None or start is None:
        return 0
    available = limit if limit is not None else int(MAX_OFFSET)
    pace = stored[1] if stored[1] is not None else rate
    return max(0, paced_offset(stored[0], now, pace, available, limit) - start)


def split_range(lo: int, hi: int, parts: int, min_rows: int = 1024) -> list[tuple[int, int]]:
    """[lo, hi) split into at most `parts` contiguous ranges of at least `min_rows` (but one)."""
    total = hi - lo
    if total <= 0:
        return []
    count = max(1, min(parts, total // max(1, min_rows)))
    step = math.ceil(total / count)
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)]


def rebased_anchor(anchor: float, old_rate: float | None, rate: float, now: float,
                   unpaced_bound: int) -> float:
    """The anchor that makes a source paced at `rate` from `now` on allow exactly what it
    allowed at `now` before (`old_rate` from `anchor`, or `unpaced_bound` when it was not
    paced): a rate change takes effect without a jump or a stall (pure)."""
    allowed = unpaced_bound if old_rate is None else max(0.0, (now - anchor) * old_rate)
    return now - min(allowed, MAX_OFFSET) / rate


class PacingStateError(ValueError):
    """A source's persisted pacing state cannot be read back (not JSON, not numbers, or numbers
    that are not finite): it is replaced, never used."""


def usable_rate(rate: float | None) -> bool:
    """Whether a source can be paced at `rate` (None: not paced) and the pace stored (pure)."""
    return rate is None or (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0)


def _parse_anchor(text: str) -> tuple[float, float | None, bool]:
    """(anchor, the rate it was written for, whether that rate is known) from a pacing file's
    text (an anchor written before rates were stored is a bare number); PacingStateError when
    it is anything else (pure)."""
    try:
        stored = json.loads(text)
        if isinstance(stored, dict):
            rate = stored.get("rate")
            found = float(stored["anchor"]), None if rate is None else float(rate), True
        else:
            found = float(stored), None, False
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise PacingStateError(f"not a pacing state ({type(exc).__name__}: {exc})") from None
    if not math.isfinite(found[0]) or not usable_rate(found[1]):
        raise PacingStateError(f"anchor {found[0]!r} or rate {found[1]!r} is not a finite "
                               "number (a rate must be > 0)")
    return found


def _read_anchor(path: str) -> tuple[float, float | None, bool] | None:
    """What the pacing file at `path` holds (see `_parse_anchor`); None when there is none."""
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except FileNotFoundError:
        return None
    return _parse_anchor(data.decode("utf-8", errors="replace"))


def _anchor_tmp(path: str, anchor: float, rate: float | None) -> str:
    """A private file next to `path` holding the anchor, to be moved or linked into place.
    ValueError for a state that could not be read back: it is never written."""
    if not math.isfinite(anchor) or not usable_rate(rate):
        raise ValueError(f"pacing state anchor={anchor!r} rate={rate!r} is not finite; "
                         "not stored")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"anchor": anchor, "rate": rate}, f, allow_nan=False)
    return tmp


def _write_anchor(path: str, anchor: float, rate: float | None) -> None:
    os.replace(_anchor_tmp(path, anchor, rate), path)


def _stored_anchor(path: str, now: float, rate: float | None) -> tuple[float, float | None, bool]:
    """What `_read_anchor` finds at `path`; the first caller writes `now` (atomically: of racing
    writers, one wins and every caller reads its anchor)."""
    found = _read_anchor(path)
    if found is not None:
        return found
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = _anchor_tmp(path, now, rate)
    try:
        os.link(tmp, path)  # fails if another process won the race
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    found = _read_anchor(path)
    assert found is not None
    return found


def read_or_create_anchor(path: str, now: float, rate: float | None = None) -> float:
    """The pacing anchor stored at `path`; the first caller writes `now` (atomically)."""
    return _stored_anchor(path, now, rate)[0]


def pacing_anchor(path: str, now: float, rate: float | None, unpaced_bound: int = 0) -> float:
    """The pacing anchor of a source paced at `rate` (None: not paced): the one stored at
    `path` (the first caller writes `now`), rebased and stored again when it was written for
    another rate - a control tuple changed the rate, and later restarts keep the new anchor.
    An unreadable state is logged and replaced (`repair_pacing`)."""
    if not usable_rate(rate):
        raise ValueError(f"a source cannot be paced at {rate!r} tuples per second")
    try:
        anchor, stored_rate, known = _stored_anchor(path, now, rate)
    except PacingStateError:
        log.error("%s", repair_pacing(path, now, rate))
        anchor, stored_rate, known = _stored_anchor(path, now, rate)
    if not known:
        _write_anchor(path, anchor, rate)
    elif rate is not None and stored_rate != rate:
        anchor = rebased_anchor(anchor, stored_rate, rate, now, unpaced_bound)
        _write_anchor(path, anchor, rate)
    return anchor


# --- recovering from an unreadable pacing state -------------------------------------------------

OFFSET_KEYS = ("index", "line")  # the offsets of paced sources: generator, file replay


def _last_batch(folder: str) -> int | None:
    try:
        batches = [int(name) for name in os.listdir(folder) if name.isdigit()]
    except FileNotFoundError:
        return None
    return max(batches) if batches else None


def planned_offsets(spark_checkpoint: str) -> list[dict]:
    """The source offsets (JSON objects, in the query's source order) of the last micro-batch
    Spark planned on `spark_checkpoint`; [] before any."""
    batch = _last_batch(os.path.join(spark_checkpoint, "offsets"))
    return [] if batch is None else batch_offsets(spark_checkpoint, batch)


def finished_offsets(spark_checkpoint: str) -> list[dict]:
    """The source offsets of the last micro-batch Spark finished on `spark_checkpoint` (its
    commit log entry written: its sink is done and it never runs again); [] before any. Spark
    calls a source's `commit` only when the next batch starts, so this is ahead of it."""
    batch = _last_batch(os.path.join(spark_checkpoint, "commits"))
    return [] if batch is None else batch_offsets(spark_checkpoint, batch)


def batch_offsets(spark_checkpoint: str, batch: int) -> list[dict]:
    """The source offsets of micro-batch `batch` from Spark's offset log ([] if missing)."""
    try:
        with open(os.path.join(spark_checkpoint, "offsets", str(batch)), encoding="utf-8") as f:
            lines = f.read().splitlines()[2:]  # a version line, the batch's metadata, sources
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            offset = json.loads(line)
        except ValueError:
            continue
        if isinstance(offset, dict):
            out.append(offset)
    return out


def planned_offset(spark_checkpoint: str) -> int:
    """The furthest offset of a paced source ({"index": n} or {"line": n}) in the last
    micro-batch Spark planned on `spark_checkpoint` (0 when none): where the source resumes."""
    numbers = [offset[k] for offset in planned_offsets(spark_checkpoint) for k in OFFSET_KEYS
               if isinstance(offset.get(k), int)]
    return max(numbers, default=0)


# --- bounded micro-batches ----------------------------------------------------------------------

MAX_BATCH_BYTES = 48 << 20  # about this much Arrow data per source micro-batch
# ... in a task that asks for large batches (`TaskRuntime.large_batches`: its output is an
# aggregate's results, written locally, so an output batch does not grow with its input)
LARGE_BATCH_BYTES = 256 << 20
_WIDTHS = {"int": 8, "double": 8, "timestamp": 8, "boolean": 1, "string": 32}


def batch_row_cap(schema: Schema, batch_bytes: int = MAX_BATCH_BYTES) -> int:
    """Rows per micro-batch that make about `batch_bytes` of `schema`'s Arrow data (pure).
    A backlog (a restart after downtime, a slow batch) then comes in several micro-batches,
    as Spark's maxOffsetsPerTrigger does, and an output batch still fits a channel frame."""
    width = sum(_WIDTHS.get(f.type.value, 32) for f in schema)
    return max(1, batch_bytes // max(1, width))


def capped(start: int | None, latest: int, cap: int) -> int:
    """`latest`, but at most `cap` past `start` (None: not known, no cap) (pure)."""
    return latest if start is None else min(latest, max(start, start + cap))


def planned_start(spark_checkpoint: str, key: str) -> int | None:
    """Where the next micro-batch of the task's one source with offsets {key: n} starts: its
    offset in the last batch Spark planned (0 before any); None when the task has several such
    sources (which line is whose is not known)."""
    offsets = planned_offsets(spark_checkpoint)
    found = [o[key] for o in offsets if isinstance(o.get(key), int)]
    if not offsets:
        return 0
    return found[0] if len(found) == 1 else None


def spark_dir_of(anchor_path: str) -> str:
    """The Spark checkpoint of the task whose pacing file is `anchor_path`
    (<task>/pacing/<op>.anchor -> <task>/spark; `TaskRuntime` lays them out so)."""
    return os.path.join(os.path.dirname(os.path.dirname(anchor_path)), "spark")


def repair_pacing(path: str, now: float, rate: float | None) -> str | None:
    """If the pacing state at `path` is unreadable, replace it with one that lets the source
    resume exactly where Spark planned it last (at `rate` from `now` on: no replay, no stall,
    no burst for a task with one paced source; a task with several lets the others catch up
    to the furthest one) and say so; None when the state is readable or absent."""
    try:
        _read_anchor(path)
        return None
    except PacingStateError as exc:
        problem = str(exc)
    resume = planned_offset(spark_dir_of(path))
    anchor = now if rate is None else now - resume / rate
    _write_anchor(path, anchor, rate)
    return (f"pacing state {path} was unreadable ({problem}); replaced: the source resumes at "
            f"offset {resume} at {rate if rate is not None else 'full'} tuples/s")


# --- configs (JSON in the "config" option) ------------------------------------------------------

@dataclass(frozen=True)
class GeneratorConfig:
    task_id: str
    op: str
    shape: str
    schema: tuple[tuple[str, str], ...]
    seed: int
    rate: float
    limit: int | None
    start_us: int
    anchor_path: str
    partitions: int
    pace: float | None = None  # tuples per second now (a control tuple's rate); None: `rate`
    batch_bytes: int = MAX_BATCH_BYTES  # Arrow data per micro-batch (`batch_row_cap`)

    @property
    def stream_schema(self) -> Schema:
        return Schema.of(*self.schema)


@dataclass(frozen=True)
class FileConfig:
    task_id: str
    op: str
    path: str
    format: str  # "jsonl" | "csv"
    schema: tuple[tuple[str, str], ...]
    rate: float | None
    anchor_path: str
    partitions: int = 2  # Spark partitions a micro-batch's lines are split into
    batch_bytes: int = MAX_BATCH_BYTES  # Arrow data per micro-batch (`batch_row_cap`)
    root: str = ""  # the path root the file is opened under ("": the executor's roots)

    @property
    def stream_schema(self) -> Schema:
        return Schema.of(*self.schema)


def encode_config(config: Any) -> str:
    return json.dumps(asdict(config))


def _decode(cls: type, text: str) -> Any:
    data = json.loads(text)
    data["schema"] = tuple(tuple(pair) for pair in data["schema"])
    return cls(**data)


def schema_pairs(schema: Schema) -> tuple[tuple[str, str], ...]:
    return tuple((f.name, f.type.value) for f in schema)


# --- generator ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexRange(InputPartition):
    lo: int
    hi: int


class GeneratorReader(DataSourceStreamReader):
    """Offsets {"index": n}: tuples [0, n) are available."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        self._anchor: float | None = None
        self._start: int | None = None  # where the next micro-batch starts, once known
        self._known = False

    def initialOffset(self) -> dict:
        self._start, self._known = 0, True
        return {"index": 0}

    def latestOffset(self) -> dict:
        now = time.time()
        pace = self.config.pace or self.config.rate
        if self._anchor is None:
            self._anchor = pacing_anchor(self.config.anchor_path, now, pace)
        if not self._known:
            self._start = planned_start(spark_dir_of(self.config.anchor_path), "index")
            self._known = True
        limit = self.config.limit
        available = limit if limit is not None else int(MAX_OFFSET)
        latest = capped(self._start, paced_offset(self._anchor, now, pace, available, limit),
                        batch_row_cap(self.config.stream_schema,
                                      self.config.batch_bytes))
        self._start = latest if self._start is None else max(self._start, latest)
        return {"index": latest}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self._start = end["index"] if self._start is None else max(self._start, end["index"])
        self._known = True
        ranges = split_range(start["index"], end["index"], self.config.partitions)
        return [IndexRange(lo, hi) for lo, hi in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IndexRange)
        cfg = self.config
        shape = shapes.shape_named(cfg.shape)
        for lo in range(partition.lo, partition.hi, ARROW_CHUNK_ROWS):
            hi = min(lo + ARROW_CHUNK_ROWS, partition.hi)
            yield shapes.generate_batch(shape, cfg.stream_schema, cfg.seed, cfg.start_us,
                                        cfg.rate, lo, hi)

    def commit(self, end: dict) -> None:
        return None


class GeneratorSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "elastiq_generator"

    def schema(self) -> str:
        return _decode(GeneratorConfig, self.options[CONFIG_OPTION]).stream_schema.ddl()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return GeneratorReader(_decode(GeneratorConfig, self.options[CONFIG_OPTION]))


# --- file replay --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ByteRange(InputPartition):
    """One partition of a file micro-batch: the bytes from bounds[0] to bounds[-1], read and
    parsed one piece (bounds[i], bounds[i+1]) of whole lines at a time, leaving out the
    `skipped` byte ranges (lines over the line cap). `root` and `file` (device, inode) are
    the path root the planner opened the file under and the file it indexed: a worker opens
    the path the same way (`common.safe_open`) and reads only that file ("" / None: the
    executor's roots, any file)."""
    path: str
    format: str
    bounds: tuple[int, ...]
    skipped: tuple[tuple[int, int], ...] = ()
    root: str = ""
    file: tuple[int, int] | None = None


WHITESPACE = b" \t\r\x0b\x0c"  # what bytes.strip() removes, but the line feed
SCAN_CHUNK_BYTES = 16 << 20  # a refresh reads the file in slices of this size
MIN_PARTITION_LINES = 16_384  # a file partition holds at least this many lines (but one)
PIECE_LINES = 131_072  # a partition parses and hands over this many lines at a time
MAX_LINE_BYTES = 1 << 20  # a data line longer than this (line feed not counted) is skipped


@dataclass(frozen=True)
class LineSpans:
    """The non-blank complete lines of a chunk: start and end (after the line feed) offsets,
    each line's number among the chunk's lines (0-based), and the bytes consumed."""
    starts: np.ndarray
    ends: np.ndarray
    numbers: np.ndarray
    used: int
    lines: int  # line feeds consumed


def line_spans(chunk: bytes, base: int) -> LineSpans:
    """The non-blank complete lines of `chunk`, offsets + `base` (pure, vectorised: no
    per-line Python but for lines that begin with white space, which are checked for being
    blank one by one)."""
    raw = np.frombuffer(chunk, dtype=np.uint8)
    feeds = np.flatnonzero(raw == 10)
    if feeds.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return LineSpans(empty, empty, empty, 0, 0)
    starts = np.empty_like(feeds)
    starts[0] = 0
    starts[1:] = feeds[:-1] + 1
    keep = feeds > starts  # an empty line is blank
    firsts = raw[np.minimum(starts, feeds)]
    doubtful = np.flatnonzero(keep & np.isin(firsts, np.frombuffer(WHITESPACE, np.uint8)))
    for i in doubtful:  # rare: a line that begins with white space may be all white space
        keep[i] = bool(chunk[starts[i]:feeds[i]].strip())
    return LineSpans(starts[keep].astype(np.int64) + base,
                     feeds[keep].astype(np.int64) + (base + 1),
                     np.flatnonzero(keep), int(feeds[-1]) + 1, int(feeds.size))


def data_line_ends(chunk: bytes, base: int) -> tuple[np.ndarray, int]:
    """(end offsets, after the line feed, of the non-blank lines of `chunk`, each + `base`;
    bytes consumed = up to the last line feed) (pure, `line_spans`)."""
    spans = line_spans(chunk, base)
    return spans.ends, spans.used


def long_line_notice(path: str, line: int, size: int | None, cap: int) -> str:
    """The located error for a line over the cap (pure)."""
    length = f"{size:,} bytes" if size is not None else "more bytes"
    return (f"{path}:{line}: the line has {length}, more than the file source's line cap of "
            f"{cap:,} bytes (MAX_LINE_BYTES); it is skipped and the lines after it are read")


def rooted_input(path: str, root: str) -> RootedPath:
    """The input file `path` under `root` ("": the executor's roots) (`common.safe_open`)."""
    if root:
        return RootedPath(root, tuple(os.path.relpath(path, root).split(os.sep)))
    return rooted(path, executor_roots())


def open_input(where: RootedPath) -> tuple[int, int]:
    """(folder, file) descriptors of an input file, opened from its root without following
    a link (`common.safe_open`: FileRefused for a link, FIFO or other non-regular file)."""
    folder, fd, _ = safe_open.open_file(where)
    return folder, fd


class LineIndex:
    """Byte offsets of the ends of complete lines of a growing file (planner-side, incremental;
    a numpy buffer, scanned without per-line Python).

    The file is opened once (`open_input`) and kept open; each refresh first checks that the
    path still names it (`safe_open.same_file`: FileRefused when a link, another file or
    folder was swapped in), then reads only past what it has indexed. A line longer than
    `max_line` bytes is not indexed: its bytes are recorded in `skipped`, `on_long` is told
    where it is (`long_line_notice`), and the lines after it are read; a last line without a
    line feed is looked at only in its new bytes, so it costs no memory past the cap and no
    re-read of the file."""

    def __init__(self, path: str, skip_header: bool, root: str = "",
                 max_line: int | None = None,
                 on_long: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.skip_header = skip_header
        self.where = rooted_input(path, root)
        self.max_line = max_line if max_line is not None else MAX_LINE_BYTES
        self.on_long = on_long if on_long is not None else _log_long_line
        self.skipped: list[tuple[int, int]] = []  # byte ranges of lines over the cap
        self._ends = np.empty(1024, dtype=np.int64)
        self._count = 0
        self.header_end = 0
        self._scanned = 0
        self._probe = 0  # bytes from `_scanned` to here hold no line feed
        self._long_from: int | None = None  # start of a line found longer than the cap
        self._line = 0  # line feeds before `_scanned`
        self._header_done = not skip_header
        self._handle: tuple[int, int] | None = None

    @property
    def ends(self) -> np.ndarray:
        """End offset (after the line feed) of each data line, in order."""
        return self._ends[:self._count]

    @property
    def file(self) -> tuple[int, int]:
        """The indexed file's (device, inode)."""
        return safe_open.identity(self._open()[1])

    def _open(self) -> tuple[int, int]:
        if self._handle is None:
            self._handle = open_input(self.where)
        else:
            safe_open.same_file(self.where, *self._handle)
        return self._handle

    def close(self) -> None:
        handle = getattr(self, "_handle", None)  # (missing when __init__ failed)
        self._handle = None
        for fd in handle or ():
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def refresh(self) -> None:
        """Index the complete lines appended since the last refresh."""
        fd = self._open()[1]
        size = SCAN_CHUNK_BYTES
        while True:  # each pass consumes bytes, doubles `size` or returns at the file's end
            if self._long_from is not None:
                if not self._pass_long(fd):
                    return
                continue
            if self._probe > self._scanned and not self._fed(fd):
                return  # the last line is still open and under the cap
            chunk = os.pread(fd, size, self._scanned)
            if self._take(chunk):
                size = SCAN_CHUNK_BYTES
            elif len(chunk) > self.max_line:
                self._long_from, self._probe = self._scanned, self._scanned + len(chunk)
            elif len(chunk) < size:
                self._probe = self._scanned + len(chunk)
                return  # nothing more, or only a partial last line under the cap
            else:
                size *= 2  # one line longer than a slice: read more of it at once

    def _fed(self, fd: int) -> bool:
        """Whether a line feed came after the open last line (looking at new bytes only)."""
        while True:
            chunk = os.pread(fd, SCAN_CHUNK_BYTES, self._probe)
            if not chunk:
                return False
            if b"\n" in chunk:
                self._probe = self._scanned
                return True
            self._probe += len(chunk)
            if self._probe - self._scanned > self.max_line:
                self._long_from = self._scanned
                return True

    def _pass_long(self, fd: int) -> bool:
        """Look for the end of the over-long line at `_long_from` in the bytes past `_probe`;
        once found, skip the line and say so. Whether it ended."""
        while True:
            chunk = os.pread(fd, SCAN_CHUNK_BYTES, self._probe)
            if not chunk:
                return False
            feed = chunk.find(b"\n")
            if feed >= 0:
                start, end = self._long_from, self._probe + feed + 1
                assert start is not None
                self._skip(start, end, self._line + 1)
                self._scanned = self._probe = end
                self._line += 1
                self._long_from = None
                return True
            self._probe += len(chunk)

    def _skip(self, start: int, end: int, line: int) -> None:
        if not self._header_done:  # the header itself was over the cap
            self.header_end, self._header_done = end, True
        else:
            self.skipped.append((start, end))
        self.on_long(long_line_notice(self.path, line, end - start - 1, self.max_line))

    def _take(self, chunk: bytes) -> bool:
        """Index the complete lines of `chunk` (read at `_scanned`); whether it held any."""
        if not self._header_done:
            feed = chunk.find(b"\n")
            if feed < 0:
                return False
            if feed > self.max_line:
                self._skip(self._scanned, self._scanned + feed + 1, 1)
            self.header_end, self._header_done = self._scanned + feed + 1, True
            self._scanned = self._probe = self.header_end
            self._line += 1
            return True
        spans = line_spans(chunk, self._scanned)
        long = (spans.ends - spans.starts - 1) > self.max_line
        for i in np.flatnonzero(long):
            self._skip(int(spans.starts[i]), int(spans.ends[i]),
                       self._line + int(spans.numbers[i]) + 1)
        self._append(spans.ends[~long] if long.any() else spans.ends)
        self._scanned += spans.used
        self._probe = max(self._probe, self._scanned)
        self._line += spans.lines
        return spans.used > 0

    def _append(self, ends: np.ndarray) -> None:
        need = self._count + ends.size
        if need > self._ends.size:
            grown = np.empty(max(need, 2 * self._ends.size), dtype=np.int64)
            grown[:self._count] = self._ends[:self._count]
            self._ends = grown
        self._ends[self._count:need] = ends
        self._count = need

    def byte_range(self, first: int, last: int) -> tuple[int, int]:
        """Bytes of data lines [first, last) (with any skipped line between them)."""
        lo = int(self._ends[first - 1]) if first > 0 else self.header_end
        return lo, int(self._ends[last - 1])

    def skipped_in(self, lo: int, hi: int) -> tuple[tuple[int, int], ...]:
        """The skipped lines within bytes [lo, hi)."""
        return tuple(s for s in self.skipped if lo <= s[0] and s[1] <= hi)

    def partitions(self, first: int, last: int, parts: int, min_lines: int = MIN_PARTITION_LINES,
                   piece_lines: int = PIECE_LINES) -> list[tuple[int, ...]]:
        """Data lines [first, last) split into at most `parts` contiguous partitions of whole
        lines (`split_range`), in order; each as the byte offsets that bound its pieces of at
        most `piece_lines` lines (start, cuts..., end)."""
        return [self._bounds(a, b, piece_lines)
                for a, b in split_range(first, last, parts, min_lines)]

    def _bounds(self, first: int, last: int, piece_lines: int) -> tuple[int, ...]:
        cuts = range(first + piece_lines, last, max(1, piece_lines))
        lo, hi = self.byte_range(first, last)
        return (lo, *(int(self._ends[i - 1]) for i in cuts), hi)


def _log_long_line(notice: str) -> None:
    log.error("file source: %s", notice)


def read_piece(fd: int, lo: int, hi: int, skipped: Sequence[tuple[int, int]]) -> bytes:
    """Bytes [lo, hi) of the open file, without the `skipped` ranges inside them."""
    out, at = [], lo
    for start, end in skipped:
        if lo <= start and end <= hi:
            out.append(os.pread(fd, start - at, at))
            at = end
    out.append(os.pread(fd, hi - at, at))
    return b"".join(out)


# A JSON data line is an object. pyarrow 26's JSON reader crashes the process (SIGSEGV) on input
# whose first line is a bare `null`, and reads a later `null` line as a row of nulls: only lines
# that start with `{` ever reach it (`json_object_lines`, the one guard for files and Kafka).
JSON_OBJECT_START = r"\A[ \t]*\{"
_BLANK_LINE = r"\A[ \t\r\x0b\x0c]*\n?\z"  # blank as `line_spans` has it (bytes.strip())
NOT_AN_OBJECT = "the line is not a JSON object"
MAX_BAD_LINE_PREVIEW = 120


@dataclass(frozen=True)
class JsonLines:
    """jsonl text split for pyarrow's reader: `objects` holds the lines that start a JSON
    object (each ending with a line feed), `bad` the byte offset in the text and the first
    bytes of every other non-blank line. Blank lines are dropped."""

    objects: bytes
    bad: tuple[tuple[int, bytes], ...]


class NotJsonObjects(ValueError):
    """jsonl text with a non-blank line that is not a JSON object (never given to pyarrow)."""


def json_object_lines(data: bytes) -> JsonLines:
    """The guard in front of pyarrow's JSON reader (pure, vectorised: one regular expression
    over all lines as one Arrow array, no per-line Python): text whose lines all start an
    object or are blank is returned as it is; otherwise the other lines are taken out."""
    import pyarrow.compute as pc

    raw = np.frombuffer(data, dtype=np.uint8)
    starts = np.concatenate(([0], np.flatnonzero(raw == 10) + 1)).astype(np.int64)
    offsets = np.append(starts, len(data)).astype(np.int64)
    lines = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(starts),
                                             [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    objects = pc.match_substring_regex(lines, JSON_OBJECT_START)
    blank = pc.match_substring_regex(lines, _BLANK_LINE)
    if pc.all(pc.or_(objects, pc.and_(blank, pc.equal(pc.binary_length(lines), 0)))).as_py():
        return JsonLines(data, ())  # every line an object (or the empty tail): unchanged
    bad = np.flatnonzero(~pc.or_(objects, blank).to_numpy(zero_copy_only=False))
    kept = lines.filter(objects)
    joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array([0, len(kept)], pa.int64()),
                                                          kept),
                            pa.scalar(b"", pa.large_binary()))[0].as_py() or b""
    if joined and not joined.endswith(b"\n"):
        joined += b"\n"
    return JsonLines(joined, tuple(
        (int(starts[i]), data[starts[i]:min(offsets[i + 1], starts[i] + MAX_BAD_LINE_PREVIEW)]
         .rstrip(b"\r\n")) for i in bad))


def parse_piece(data: bytes, fmt: str, schema: Schema) -> tuple[pa.Table, JsonLines | None]:
    """Data lines -> an Arrow table of `schema`, and for jsonl the split that kept the lines
    that are not JSON objects away from the parser (their offsets locate them)."""
    if fmt != "jsonl":
        return _read_lines(data, fmt, schema), None
    split = json_object_lines(data)
    return _read_lines(split.objects, fmt, schema), split


def piece_offset(lo: int, skipped: Sequence[tuple[int, int]], at: int) -> int:
    """The file offset of byte `at` of the piece `read_piece` read from `lo` (the `skipped`
    ranges left out of it put later bytes further into the file) (pure)."""
    pos, done = lo, 0
    for start, end in sorted(skipped):
        if start < lo:
            continue
        if at < done + (start - pos):
            break
        done, pos = done + (start - pos), end
    return pos + (at - done)


def not_an_object_notice(path: str, offset: int, line: bytes) -> str:
    """The located error for a jsonl line that is not a JSON object (pure)."""
    return (f"{path}: byte {offset:,}: {NOT_AN_OBJECT} ({line[:40]!r}); it is skipped and the "
            "lines after it are read")


def parse_lines(data: bytes, fmt: str, schema: Schema) -> pa.Table:
    """Data lines (jsonl objects or header-less csv rows) -> an Arrow table of `schema`;
    NotJsonObjects for jsonl with a line that is not an object (it never reaches pyarrow)."""
    table, split = parse_piece(data, fmt, schema)
    if split is not None and split.bad:
        offset, line = split.bad[0]
        raise NotJsonObjects(f"{NOT_AN_OBJECT} (byte {offset}: {line[:40]!r})")
    return table


def _read_lines(data: bytes, fmt: str, schema: Schema) -> pa.Table:
    target = shapes.arrow_schema(schema)
    if fmt == "jsonl":
        import pyarrow.json as pj

        if not data:
            return target.empty_table()
        table = pj.read_json(io.BytesIO(data), parse_options=pj.ParseOptions(
            explicit_schema=target, unexpected_field_behavior="ignore"))
    else:
        import pyarrow.csv as pc

        table = pc.read_csv(io.BytesIO(data),
                            read_options=pc.ReadOptions(column_names=list(target.names)),
                            convert_options=pc.ConvertOptions(column_types=target))
    return table.select(target.names).cast(target)


class FileReader(DataSourceStreamReader):
    """Offsets {"line": n}: data lines [0, n) are available (csv header not counted)."""

    def __init__(self, config: FileConfig) -> None:
        self.config = config
        self._index: LineIndex | None = None
        self._anchor: float | None = None
        self._start: int | None = None  # where the next micro-batch starts, once known
        self._known = False

    def _lines(self) -> LineIndex:
        if self._index is None:
            self._index = LineIndex(self.config.path, skip_header=self.config.format == "csv",
                                    root=self.config.root, on_long=self._say)
        self._index.refresh()
        return self._index

    def _say(self, notice: str) -> None:
        log.error("task %s: file source %s: %s", self.config.task_id, self.config.op, notice)

    def initialOffset(self) -> dict:
        self._start, self._known = 0, True
        return {"line": 0}

    def latestOffset(self) -> dict:
        now = time.time()
        available = len(self._lines().ends)
        if self._anchor is None:
            self._anchor = pacing_anchor(self.config.anchor_path, now, self.config.rate,
                                         available)
        if not self._known:
            self._start = planned_start(spark_dir_of(self.config.anchor_path), "line")
            self._known = True
        latest = capped(self._start,
                        paced_offset(self._anchor, now, self.config.rate, available, None),
                        batch_row_cap(self.config.stream_schema,
                                      self.config.batch_bytes))
        self._start = latest if self._start is None else max(self._start, latest)
        return {"line": latest}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self._start = end["line"] if self._start is None else max(self._start, end["line"])
        self._known = True
        if end["line"] <= start["line"]:
            return []
        index = self._index
        if index is None or len(index.ends) < end["line"]:  # a replay after a restart
            index = self._lines()
        parts = index.partitions(start["line"], end["line"], self.config.partitions)
        file = index.file
        return [ByteRange(self.config.path, self.config.format, bounds,
                          index.skipped_in(bounds[0], bounds[-1]), index.where.root, file)
                for bounds in parts]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's rows, parsed a piece at a time: a Python worker holds one piece's
        bytes and table, however many lines the micro-batch has (`LARGE_BATCH_BYTES`). The
        file is opened as the planner opened it (`open_input`) and must be the file it
        indexed (FileRefused otherwise: nothing of another file is read)."""
        assert isinstance(partition, ByteRange)
        bounds = partition.bounds
        folder, fd = open_input(rooted_input(partition.path, partition.root))
        try:
            if partition.file is not None and safe_open.identity(fd) != partition.file:
                raise safe_open.FileRefused(
                    errno.ESTALE, "the input file was replaced since its lines were indexed",
                    partition.path)
            for lo, hi in zip(bounds, bounds[1:]):
                data = read_piece(fd, lo, hi, partition.skipped)
                table, split = parse_piece(data, partition.format, self.config.stream_schema)
                for at, line in split.bad if split is not None else ():
                    log.error("task %s: file source %s: %s", self.config.task_id,
                              self.config.op, not_an_object_notice(
                                  partition.path, piece_offset(lo, partition.skipped, at), line))
                yield from table.to_batches(max_chunksize=ARROW_CHUNK_ROWS)
        finally:
            os.close(fd)
            os.close(folder)

    def commit(self, end: dict) -> None:
        return None


class FileSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "elastiq_file"

    def schema(self) -> str:
        return _decode(FileConfig, self.options[CONFIG_OPTION]).stream_schema.ddl()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FileReader(_decode(FileConfig, self.options[CONFIG_OPTION]))


# --- channel inputs -----------------------------------------------------------------------------

def source_log_path(checkpoint_dir: str) -> str:
    """Where the channel inputs of the task whose folder is `checkpoint_dir` log (retargets,
    replica switches; `executor.spool_receiver`)."""
    return os.path.join(checkpoint_dir, "control", "sources.log")


ALL_SOURCES: tuple[type[DataSource], ...] = (GeneratorSource, FileSource)
