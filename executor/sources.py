"""Spark 4 Python streaming data sources of Elastiq task queries; every offset is a sequence number.

Owns three sources and the reasoning for their reader kind:
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
- channel (`elastiq_channel`, simple reader): offset = channel sequence number of the last batch
  included. Batches already arrive at the planner process's ZeroMQ socket, so a full reader would
  add a second hop for nothing; acks go upstream from `commit()`; a fresh checkpoint starts from
  the writer's retained range.
- stream selector (`elastiq_selector`, simple reader): one numbered stream served by k replica
  channels (hot standby); offset = that stream's sequence number, batches taken from whichever
  replica has them first, replays fetched from any replica that can serve them, acks to all.
Both channel readers can take exactly one channel batch per micro-batch (`one_batch`, for
hot-standby replicas whose output must depend only on the numbered input; the channel source then
follows each input batch with one empty flush step, see `one_batch_offset`) and follow the task's
endpoints file (`executor.endpoints_file`), reconnecting when a channel's writer moved.
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
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from common.types import Schema
from executor import shapes
from executor.endpoints_file import EndpointWatcher

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


def planned_offset(spark_checkpoint: str) -> int:
    """The furthest offset of a paced source ({"index": n} or {"line": n}) in the last
    micro-batch Spark planned on `spark_checkpoint` (0 when none): where the source resumes."""
    folder = os.path.join(spark_checkpoint, "offsets")
    try:
        batches = [int(name) for name in os.listdir(folder) if name.isdigit()]
    except FileNotFoundError:
        return 0
    if not batches:
        return 0
    with open(os.path.join(folder, str(max(batches))), encoding="utf-8") as f:
        lines = f.read().splitlines()[2:]  # a version line, the batch's metadata, then sources
    return max((_offset_of(line) for line in lines), default=0)


def _offset_of(line: str) -> int:
    try:
        offset = json.loads(line)
    except ValueError:
        return 0
    if not isinstance(offset, dict):
        return 0
    numbers = [offset[k] for k in OFFSET_KEYS if isinstance(offset.get(k), int)]
    return max(numbers, default=0)


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

    @property
    def stream_schema(self) -> Schema:
        return Schema.of(*self.schema)


@dataclass(frozen=True)
class ChannelConfig:
    task_id: str
    channel: str
    reader_id: str
    endpoint: str
    schema: tuple[tuple[str, str], ...]
    poll_seconds: float
    endpoints_file: str = ""  # the task's endpoints file ("" = never retarget)
    one_batch: bool = False  # at most one channel batch per micro-batch
    log_file: str = ""  # the task's source log ("" = stderr only)
    key_file: str = ""  # this reader's CURVE keypair file ("" = plain text)
    server_key: str = ""  # the writer's CURVE public key

    @property
    def stream_schema(self) -> Schema:
        return Schema.of(*self.schema)


@dataclass(frozen=True)
class Replica:
    """One replica channel a stream selector reads: its id, this task's reader id, its writer
    and the writer's CURVE public key ("" = plain text)."""

    channel: str
    reader_id: str
    endpoint: str
    server_key: str = ""


@dataclass(frozen=True)
class SelectorConfig:
    task_id: str
    replicas: tuple[Replica, ...]
    schema: tuple[tuple[str, str], ...]
    poll_seconds: float
    endpoints_file: str = ""
    one_batch: bool = False
    log_file: str = ""
    fetch_seconds: float = 10.0  # a replay waits this long for one replica before the next
    retry_seconds: float = 2.0  # a replica that failed is re-subscribed after this long
    key_file: str = ""  # this reader's CURVE keypair file ("" = plain text)

    @property
    def stream_schema(self) -> Schema:
        return Schema.of(*self.schema)


def encode_config(config: Any) -> str:
    return json.dumps(asdict(config))


def _decode(cls: type, text: str) -> Any:
    data = json.loads(text)
    data["schema"] = tuple(tuple(pair) for pair in data["schema"])
    if "replicas" in data:
        data["replicas"] = tuple(Replica(**r) for r in data["replicas"])
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

    def initialOffset(self) -> dict:
        return {"index": 0}

    def latestOffset(self) -> dict:
        now = time.time()
        pace = self.config.pace or self.config.rate
        if self._anchor is None:
            self._anchor = pacing_anchor(self.config.anchor_path, now, pace)
        limit = self.config.limit
        available = limit if limit is not None else int(MAX_OFFSET)
        return {"index": paced_offset(self._anchor, now, pace, available, limit)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
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
    path: str
    format: str
    lo: int
    hi: int


WHITESPACE = b" \t\r\x0b\x0c"  # what bytes.strip() removes, but the line feed
SCAN_CHUNK_BYTES = 16 << 20  # a refresh reads the file in slices of this size
MIN_PARTITION_LINES = 16_384  # a file partition holds at least this many lines (but one)


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

    def partitions(self, first: int, last: int, parts: int,
                   min_lines: int = MIN_PARTITION_LINES) -> list[tuple[int, int]]:
        """Byte ranges of data lines [first, last) split into at most `parts` contiguous
        pieces of whole lines (`split_range`), in order."""
        return [self.byte_range(a, b) for a, b in split_range(first, last, parts, min_lines)]


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

    def _lines(self) -> LineIndex:
        if self._index is None:
            self._index = LineIndex(self.config.path, skip_header=self.config.format == "csv")
        self._index.refresh()
        return self._index

    def initialOffset(self) -> dict:
        return {"line": 0}

    def latestOffset(self) -> dict:
        now = time.time()
        available = len(self._lines().ends)
        if self._anchor is None:
            self._anchor = pacing_anchor(self.config.anchor_path, now, self.config.rate,
                                         available)
        return {"line": paced_offset(self._anchor, now, self.config.rate, available, None)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if end["line"] <= start["line"]:
            return []
        index = self._index
        if index is None or len(index.ends) < end["line"]:  # a replay after a restart
            index = self._lines()
        ranges = index.partitions(start["line"], end["line"], self.config.partitions)
        return [ByteRange(self.config.path, self.config.format, lo, hi) for lo, hi in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ByteRange)
        with open(partition.path, "rb") as f:
            f.seek(partition.lo)
            data = f.read(partition.hi - partition.lo)
        table = parse_lines(data, partition.format, self.config.stream_schema)
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


# --- channel ------------------------------------------------------------------------------------

def contiguous_after(batches: Sequence[Any], after: int) -> list[Any]:
    """Batches with seq > after, in seq order, stopping at the first gap (pure)."""
    picked: list[Any] = []
    expected = after + 1
    for batch in sorted(batches, key=lambda b: b.seq):
        if batch.seq < expected:
            continue
        if batch.seq != expected:
            break
        picked.append(batch)
        expected += 1
    return picked


def moved_endpoints(endpoints: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str]:
    """Channel -> new endpoint for each channel of `current` whose endpoint in `endpoints` (the
    task's endpoints file) differs from the one in use (pure)."""
    return {channel: endpoints[channel] for channel, in_use in current.items()
            if endpoints.get(channel) and endpoints[channel] != in_use}


def _to_batches(schema: Schema, tables: Sequence[pa.Table]) -> list[pa.RecordBatch]:
    target = shapes.arrow_schema(schema)
    out: list[pa.RecordBatch] = []
    for table in tables:
        out.extend(table.select(target.names).cast(target).to_batches())
    return out


def _watcher(path: str) -> EndpointWatcher | None:
    return EndpointWatcher(path) if path else None


def source_log_path(checkpoint_dir: str) -> str:
    """Where the channel sources of the task whose folder is `checkpoint_dir` log."""
    return os.path.join(checkpoint_dir, "control", "sources.log")


def _ensure_source_logging(log_file: str) -> None:
    """Spark starts the source runner as a bare Python process: without handlers our INFO lines
    (retargets, replica switches) would be lost. They go to its stderr (the JVM's) and, when
    given, to the task's own `log_file`, where the executor and tests can read them."""
    package = logging.getLogger("executor")
    if package.level == logging.NOTSET:
        package.setLevel(os.environ.get("ELASTIQ_LOG_LEVEL", "INFO"))
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not logging.getLogger().handlers and not package.handlers:
        stderr = logging.StreamHandler()
        stderr.setFormatter(formatter)
        package.addHandler(stderr)
    if log_file and not any(getattr(h, "baseFilename", None) == os.path.abspath(log_file)
                            for h in package.handlers):
        os.makedirs(os.path.dirname(log_file), exist_ok=True)
        to_file = logging.FileHandler(log_file, encoding="utf-8")
        to_file.setFormatter(formatter)
        package.addHandler(to_file)


def one_batch_offset(seq: int, flushed: bool) -> dict:
    """An offset of a channel source taking one channel batch per micro-batch (a hot-standby
    replica). Every input batch is followed by one empty step (`flushed` False -> True): that
    micro-batch reads nothing and emits what the input batch's watermark closed (windows, join
    state), exactly as Spark's own no-data batch would, but at the same point in every replica,
    which a no-data batch (run or not depending on timing) is not. Spark's own no-data batches
    are off for these queries, so without this step a window would only close when the next
    input arrives, and the last windows of a finite input never."""
    return {"seq": seq, "flushed": flushed}


class ChannelReaderSource(SimpleDataSourceStreamReader):
    """Offsets {"seq": s}: every channel batch with seq <= s is included. Runs entirely in the
    query's planner process, where the ZeroMQ reader stays open between calls."""

    def __init__(self, config: ChannelConfig) -> None:
        _ensure_source_logging(config.log_file)
        self.config = config
        self._endpoint = config.endpoint
        self._reader: Any = None
        self._subscribed_after: int | None = None
        self._pending: dict[int, Any] = {}  # polled but not yet handed to Spark (one_batch)
        self._watcher = _watcher(config.endpoints_file)

    def _channel(self) -> Any:
        if self._reader is None:
            from executor.channel_auth import reader_auth
            from executor.channels import ChannelReader

            cfg = self.config
            self._reader = ChannelReader(cfg.channel, cfg.reader_id, self._endpoint,
                                         shapes.arrow_schema(cfg.stream_schema),
                                         auth=reader_auth(cfg.key_file, cfg.server_key))
        return self._reader

    def _follow_endpoints(self) -> None:
        """Reconnect when the endpoints file names another writer for this channel."""
        endpoints = self._watcher.changed() if self._watcher is not None else None
        if not endpoints:
            return
        moved = moved_endpoints(endpoints, {self.config.channel: self._endpoint})
        new = moved.get(self.config.channel)
        if new is None:
            return
        log.info("task %s: channel %s moves %s -> %s", self.config.task_id, self.config.channel,
                 self._endpoint, new)
        self._endpoint = new
        if self._reader is not None:
            self._reader.connect_to(new)

    def initialOffset(self) -> dict:
        self._follow_endpoints()
        first, _last = self._channel().retained_range(timeout=10.0)
        return one_batch_offset(first - 1, flushed=True) if self.config.one_batch \
            else {"seq": first - 1}

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        after = start["seq"]
        if self.config.one_batch and not start.get("flushed", True):
            return iter([]), one_batch_offset(after, flushed=True)  # the flush step
        self._follow_endpoints()
        reader = self._channel()
        if self._subscribed_after is None:
            reader.subscribe(from_seq=after + 1)
            self._subscribed_after = after
        self._pending = {seq: b for seq, b in self._pending.items() if seq > after}
        if after + 1 not in self._pending:
            for batch in reader.poll(self.config.poll_seconds):
                if batch.seq > after:
                    self._pending[batch.seq] = batch
        picked = contiguous_after(list(self._pending.values()), after)
        if self.config.one_batch:
            picked = picked[:1]
        if not picked:
            return iter([]), start
        tables = [b.table for b in picked]
        end = one_batch_offset(picked[-1].seq, flushed=False) if self.config.one_batch \
            else {"seq": picked[-1].seq}
        return iter(_to_batches(self.config.stream_schema, tables)), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        if end["seq"] <= start["seq"]:
            return iter([])  # nothing, or a replica's flush step
        self._follow_endpoints()
        fetched = self._channel().fetch(start["seq"], end["seq"], timeout=30.0)
        picked = contiguous_after(fetched, start["seq"])
        if not picked or picked[-1].seq != end["seq"]:
            raise RuntimeError(
                f"task {self.config.task_id}: channel {self.config.channel} replay of "
                f"({start['seq']}, {end['seq']}] came back incomplete")
        return iter(_to_batches(self.config.stream_schema, [b.table for b in picked]))

    def commit(self, end: dict) -> None:
        self._channel().ack(end["seq"])


class ChannelSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "elastiq_channel"

    def schema(self) -> str:
        return _decode(ChannelConfig, self.options[CONFIG_OPTION]).stream_schema.ddl()

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return ChannelReaderSource(_decode(ChannelConfig, self.options[CONFIG_OPTION]))


# --- stream selector ----------------------------------------------------------------------------

class _ReplicaState:
    """Planner-side state of one replica channel of a selector (mutable, one process)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.endpoint = replica.endpoint
        self.reader: Any = None
        self.subscribed = False
        self.retry_at = 0.0  # monotonic time before which this replica is skipped


class SelectorReaderSource(SimpleDataSourceStreamReader):
    """Offsets {"seq": s} of ONE numbered stream served by k replica channels (same content per
    seq, one writer each). New batches come from whichever replica has them first, preferring
    the one that supplied the last batches; replays from any replica that can serve them; acks
    go to every replica so each writer can trim. No gap and no duplicate: a seq is taken once,
    whoever supplies it."""

    def __init__(self, config: SelectorConfig) -> None:
        _ensure_source_logging(config.log_file)
        if not config.replicas:
            raise ValueError(f"task {config.task_id}: a selector needs at least one replica")
        self.config = config
        self._replicas = [_ReplicaState(r) for r in config.replicas]
        self._current: int | None = None
        self._pending: dict[int, tuple[int, Any]] = {}  # seq -> (replica index, batch)
        self._watcher = _watcher(config.endpoints_file)

    # -- replicas

    def _name(self, index: int) -> str:
        return self._replicas[index].replica.channel

    def _reader(self, index: int, *, force: bool = False) -> Any:
        """The replica's reader, or None while it waits to be retried after an error."""
        state = self._replicas[index]
        if not force and time.monotonic() < state.retry_at:
            return None
        if state.reader is None:
            from executor.channel_auth import reader_auth
            from executor.channels import ChannelReader

            state.reader = ChannelReader(state.replica.channel, state.replica.reader_id,
                                         state.endpoint,
                                         shapes.arrow_schema(self.config.stream_schema),
                                         auth=reader_auth(self.config.key_file,
                                                          state.replica.server_key))
            state.subscribed = False
        return state.reader

    def _fail(self, index: int, error: Exception) -> None:
        """Skip a replica that errored; a fresh reader re-subscribes after `retry_seconds`."""
        state = self._replicas[index]
        log.warning("task %s: selector skips replica %s for %s s: %s", self.config.task_id,
                    self._name(index), self.config.retry_seconds, error)
        if state.reader is not None:
            try:
                state.reader.close(flush_timeout=0)  # its writer is failing
            except Exception:  # noqa: BLE001 - closing a broken reader must not hide the error
                log.debug("task %s: closing replica %s failed", self.config.task_id,
                          self._name(index), exc_info=True)
        state.reader, state.subscribed = None, False
        state.retry_at = time.monotonic() + self.config.retry_seconds

    def _order(self) -> list[int]:
        """Replica indexes, the one that supplied the last batches first."""
        others = [i for i in range(len(self._replicas)) if i != self._current]
        return others if self._current is None else [self._current, *others]

    def _follow_endpoints(self) -> None:
        endpoints = self._watcher.changed() if self._watcher is not None else None
        if not endpoints:
            return
        current = {s.replica.channel: s.endpoint for s in self._replicas}
        for channel, new in moved_endpoints(endpoints, current).items():
            for state in self._replicas:
                if state.replica.channel != channel:
                    continue
                log.info("task %s: selector replica %s moves %s -> %s", self.config.task_id,
                         channel, state.endpoint, new)
                state.endpoint = new
                if state.reader is not None:
                    state.reader.connect_to(new)

    def _supplied(self, index: int, seq: int) -> None:
        if index != self._current:
            log.info("task %s: selector now reads replica %s at seq %s", self.config.task_id,
                     self._name(index), seq)
            self._current = index

    # -- Spark's calls

    def initialOffset(self) -> dict:
        """The highest "first retained - 1" among the replicas that answer."""
        from executor.channels import ChannelError

        self._follow_endpoints()
        deadline = time.monotonic() + 30.0
        while True:
            answers = []
            for index in range(len(self._replicas)):
                try:
                    first, _last = self._reader(index, force=True).retained_range(timeout=2.0)
                    answers.append(first - 1)
                except ChannelError as exc:
                    log.info("task %s: replica %s gave no retained range: %s",
                             self.config.task_id, self._name(index), exc)
            if answers:
                return {"seq": max(answers)}
            if time.monotonic() > deadline:
                raise RuntimeError(f"task {self.config.task_id}: no selector replica answered")

    def _poll(self, index: int, after: int, wait: float) -> None:
        from executor.channels import ChannelError

        reader = self._reader(index)
        if reader is None:
            time.sleep(wait)  # waiting to be retried: keep read()'s loop from spinning
            return
        state = self._replicas[index]
        try:
            if not state.subscribed:
                reader.subscribe(from_seq=after + 1)
                state.subscribed = True
            for batch in reader.poll(wait):
                if batch.seq > after and batch.seq not in self._pending:
                    self._pending[batch.seq] = (index, batch)
        except ChannelError as exc:
            self._fail(index, exc)

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        after = start["seq"]
        self._follow_endpoints()
        self._pending = {seq: v for seq, v in self._pending.items() if seq > after}
        deadline = time.monotonic() + self.config.poll_seconds
        while after + 1 not in self._pending:
            first, *rest = self._order()
            self._poll(first, after, max(0.0, min(0.05, deadline - time.monotonic())))
            for index in rest:
                self._poll(index, after, 0.0)
            if time.monotonic() >= deadline:
                break
        picked = contiguous_after([b for _, b in self._pending.values()], after)
        if self.config.one_batch:
            picked = picked[:1]
        if not picked:
            return iter([]), {"seq": after}
        self._supplied(self._pending[picked[0].seq][0], picked[0].seq)
        tables = [b.table for b in picked]
        return iter(_to_batches(self.config.stream_schema, tables)), {"seq": picked[-1].seq}

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        from executor.channels import ChannelError

        after, upto = start["seq"], end["seq"]
        if upto <= after:
            return iter([])
        self._follow_endpoints()
        ready = [i for i in self._order() if self._reader(i) is not None]
        waiting = [i for i in self._order() if i not in ready]
        for index in ready + waiting:
            try:
                fetched = self._reader(index, force=True).fetch(
                    after, upto, timeout=self.config.fetch_seconds)
            except ChannelError as exc:
                self._fail(index, exc)
                continue
            picked = contiguous_after(fetched, after)
            if picked and picked[-1].seq == upto:
                self._supplied(index, after + 1)
                return iter(_to_batches(self.config.stream_schema, [b.table for b in picked]))
        raise RuntimeError(f"task {self.config.task_id}: no selector replica could replay "
                           f"({after}, {upto}]")

    def commit(self, end: dict) -> None:
        from executor.channels import ChannelError

        for index in range(len(self._replicas)):
            reader = self._reader(index)
            if reader is None:
                continue
            try:
                reader.ack(end["seq"])
            except ChannelError as exc:
                self._fail(index, exc)


class SelectorSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "elastiq_selector"

    def schema(self) -> str:
        return _decode(SelectorConfig, self.options[CONFIG_OPTION]).stream_schema.ddl()

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return SelectorReaderSource(_decode(SelectorConfig, self.options[CONFIG_OPTION]))


ALL_SOURCES: tuple[type[DataSource], ...] = (GeneratorSource, FileSource, ChannelSource,
                                             SelectorSource)
