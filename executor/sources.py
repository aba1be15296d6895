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

import io
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

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
    parsed one piece (bounds[i], bounds[i+1]) of whole lines at a time."""
    path: str
    format: str
    bounds: tuple[int, ...]


WHITESPACE = b" \t\r\x0b\x0c"  # what bytes.strip() removes, but the line feed
SCAN_CHUNK_BYTES = 16 << 20  # a refresh reads the file in slices of this size
MIN_PARTITION_LINES = 16_384  # a file partition holds at least this many lines (but one)
PIECE_LINES = 131_072  # a partition parses and hands over this many lines at a time


def data_line_ends(chunk: bytes, base: int) -> tuple[np.ndarray, int]:
    """(end offsets, after the line feed, of the non-blank lines of `chunk`, each + `base`;
    bytes consumed = up to the last line feed) (pure, vectorised: no per-line Python but for
    lines that begin with white space, which are checked for being blank one by one)."""
    raw = np.frombuffer(chunk, dtype=np.uint8)
    feeds = np.flatnonzero(raw == 10)
    if feeds.size == 0:
        return np.empty(0, dtype=np.int64), 0
    starts = np.empty_like(feeds)
    starts[0] = 0
    starts[1:] = feeds[:-1] + 1
    keep = feeds > starts  # an empty line is blank
    firsts = raw[np.minimum(starts, feeds)]
    doubtful = np.flatnonzero(keep & np.isin(firsts, np.frombuffer(WHITESPACE, np.uint8)))
    for i in doubtful:  # rare: a line that begins with white space may be all white space
        keep[i] = bool(chunk[starts[i]:feeds[i]].strip())
    return feeds[keep].astype(np.int64) + (base + 1), int(feeds[-1]) + 1


class LineIndex:
    """Byte offsets of the ends of complete lines of a growing file (planner-side, incremental;
    a numpy buffer, scanned without per-line Python)."""

    def __init__(self, path: str, skip_header: bool) -> None:
        self.path = path
        self.skip_header = skip_header
        self._ends = np.empty(1024, dtype=np.int64)
        self._count = 0
        self.header_end = 0
        self._scanned = 0
        self._header_done = not skip_header

    @property
    def ends(self) -> np.ndarray:
        """End offset (after the line feed) of each data line, in order."""
        return self._ends[:self._count]

    def refresh(self) -> None:
        """Index the complete lines appended since the last refresh."""
        size = SCAN_CHUNK_BYTES
        with open(self.path, "rb") as f:
            while True:
                f.seek(self._scanned)
                chunk = f.read(size)
                if self._take(chunk):
                    size = SCAN_CHUNK_BYTES
                elif len(chunk) < size:
                    return  # nothing more, or only a partial last line
                else:
                    size *= 2  # one line longer than a slice: read more of it at once

    def _take(self, chunk: bytes) -> bool:
        """Index the complete lines of `chunk` (read at `_scanned`); whether it held any."""
        if not self._header_done:
            feed = chunk.find(b"\n")
            if feed < 0:
                return False
            self.header_end, self._header_done = self._scanned + feed + 1, True
            self._scanned = self.header_end
            return True
        ends, used = data_line_ends(chunk, self._scanned)
        self._append(ends)
        self._scanned += used
        return used > 0

    def _append(self, ends: np.ndarray) -> None:
        need = self._count + ends.size
        if need > self._ends.size:
            grown = np.empty(max(need, 2 * self._ends.size), dtype=np.int64)
            grown[:self._count] = self._ends[:self._count]
            self._ends = grown
        self._ends[self._count:need] = ends
        self._count = need

    def byte_range(self, first: int, last: int) -> tuple[int, int]:
        """Bytes of data lines [first, last)."""
        lo = int(self._ends[first - 1]) if first > 0 else self.header_end
        return lo, int(self._ends[last - 1])

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


def parse_lines(data: bytes, fmt: str, schema: Schema) -> pa.Table:
    """Data lines (jsonl objects or header-less csv rows) -> an Arrow table of `schema`."""
    target = shapes.arrow_schema(schema)
    if fmt == "jsonl":
        import pyarrow.json as pj

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
            self._index = LineIndex(self.config.path, skip_header=self.config.format == "csv")
        self._index.refresh()
        return self._index

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
        return [ByteRange(self.config.path, self.config.format, bounds) for bounds in parts]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's rows, parsed a piece at a time: a Python worker holds one piece's
        bytes and table, however many lines the micro-batch has (`LARGE_BATCH_BYTES`)."""
        assert isinstance(partition, ByteRange)
        bounds = partition.bounds
        with open(partition.path, "rb") as f:
            for lo, hi in zip(bounds, bounds[1:]):
                f.seek(lo)
                table = parse_lines(f.read(hi - lo), partition.format, self.config.stream_schema)
                yield from table.to_batches(max_chunksize=ARROW_CHUNK_ROWS)

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
