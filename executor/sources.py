"""Spark 4 Python streaming data sources of Elastiq task queries; every offset is a sequence number.

Owns three sources and the reasoning for their reader kind:
- generator (`elastiq_generator`, full reader): offset = tuple index; rows of any index range are
  a pure function of (shape, seed, index) (`executor.shapes`), generated in the executor Python
  workers, partitioned across cores (full reader ~200k rows/s vs simple ~130k: all data would
  otherwise pass the one planner process). `latestOffset` advances with wall time at `rate` from
  an anchor instant persisted in the checkpoint directory, so a restarted query catches up
  instead of starting over; `limit` makes it finite.
- file replay (`elastiq_file`, full reader): offset = number of complete data lines; the planner
  indexes byte positions of line ends, partitions carry byte ranges, workers parse with pyarrow.
- channel (`elastiq_channel`, simple reader): offset = channel sequence number of the last batch
  included. Batches already arrive at the planner process's ZeroMQ socket, so a full reader would
  add a second hop for nothing; acks go upstream from `commit()`; a fresh checkpoint starts from
  the writer's retained range.
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

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from compiler.types import Schema
from executor import shapes

log = logging.getLogger(__name__)

CONFIG_OPTION = "config"
ARROW_CHUNK_ROWS = 65_536


# --- pure pacing logic --------------------------------------------------------------------------

def paced_offset(anchor: float, now: float, rate: float | None, available: int,
                 limit: int | None) -> int:
    """How far a paced source may advance: `rate` tuples per second since `anchor`, never beyond
    what is available or `limit` (None = unbounded)."""
    bound = available
    if rate is not None:
        bound = min(bound, max(0, math.floor((now - anchor) * rate)))
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


def read_or_create_anchor(path: str, now: float) -> float:
    """The pacing anchor stored at `path`; the first caller writes `now` (atomically)."""
    try:
        with open(path, encoding="utf-8") as f:
            return float(f.read())
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(repr(now))
    try:
        os.link(tmp, path)  # fails if another process won the race
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    with open(path, encoding="utf-8") as f:
        return float(f.read())


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

    def initialOffset(self) -> dict:
        return {"index": 0}

    def latestOffset(self) -> dict:
        now = time.time()
        if self._anchor is None:
            self._anchor = read_or_create_anchor(self.config.anchor_path, now)
        limit = self.config.limit
        available = limit if limit is not None else 1 << 62
        return {"index": paced_offset(self._anchor, now, self.config.rate, available, limit)}

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


class LineIndex:
    """Byte offsets of the ends of complete lines of a growing file (planner-side, incremental)."""

    def __init__(self, path: str, skip_header: bool) -> None:
        self.path = path
        self.skip_header = skip_header
        self.ends: list[int] = []  # end offset (after "\n") of each data line
        self.header_end = 0
        self._scanned = 0
        self._header_done = not skip_header

    def refresh(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self._scanned)
            chunk = f.read()
        pos = 0
        while (nl := chunk.find(b"\n", pos)) >= 0:
            end = self._scanned + nl + 1
            if not self._header_done:
                self.header_end, self._header_done = end, True
            elif chunk[pos:nl].strip():
                self.ends.append(end)
            pos = nl + 1
        self._scanned += pos

    def byte_range(self, first: int, last: int) -> tuple[int, int]:
        """Bytes of data lines [first, last)."""
        lo = self.ends[first - 1] if first > 0 else self.header_end
        return lo, self.ends[last - 1]


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
        if self._anchor is None:
            self._anchor = read_or_create_anchor(self.config.anchor_path, now)
        available = len(self._lines().ends)
        return {"line": paced_offset(self._anchor, now, self.config.rate, available, None)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if end["line"] <= start["line"]:
            return []
        index = self._lines()
        lo, hi = index.byte_range(start["line"], end["line"])
        return [ByteRange(self.config.path, self.config.format, lo, hi)]

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


class ChannelReaderSource(SimpleDataSourceStreamReader):
    """Offsets {"seq": s}: every channel batch with seq <= s is included. Runs entirely in the
    query's planner process, where the ZeroMQ reader stays open between calls."""

    def __init__(self, config: ChannelConfig) -> None:
        self.config = config
        self._reader: Any = None
        self._subscribed_after: int | None = None

    def _channel(self) -> Any:
        if self._reader is None:
            from executor.channels import ChannelReader

            cfg = self.config
            self._reader = ChannelReader(cfg.channel, cfg.reader_id, cfg.endpoint,
                                         shapes.arrow_schema(cfg.stream_schema))
        return self._reader

    def initialOffset(self) -> dict:
        first, _last = self._channel().retained_range(timeout=10.0)
        return {"seq": first - 1}

    def _to_batches(self, tables: Sequence[pa.Table]) -> list[pa.RecordBatch]:
        target = shapes.arrow_schema(self.config.stream_schema)
        out: list[pa.RecordBatch] = []
        for table in tables:
            out.extend(table.select(target.names).cast(target).to_batches())
        return out

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        after = start["seq"]
        reader = self._channel()
        if self._subscribed_after is None:
            reader.subscribe(from_seq=after + 1)
            self._subscribed_after = after
        picked = contiguous_after(reader.poll(self.config.poll_seconds), after)
        if not picked:
            return iter([]), {"seq": after}
        return iter(self._to_batches([b.table for b in picked])), {"seq": picked[-1].seq}

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        if end["seq"] <= start["seq"]:
            return iter([])
        fetched = self._channel().fetch(start["seq"], end["seq"], timeout=30.0)
        picked = contiguous_after(fetched, start["seq"])
        if not picked or picked[-1].seq != end["seq"]:
            raise RuntimeError(
                f"task {self.config.task_id}: channel {self.config.channel} replay of "
                f"({start['seq']}, {end['seq']}] came back incomplete")
        return iter(self._to_batches([b.table for b in picked]))

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


ALL_SOURCES: tuple[type[DataSource], ...] = (GeneratorSource, FileSource, ChannelSource)
