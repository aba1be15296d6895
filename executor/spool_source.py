"""The Spark side of a task's channel input: `elastiq_spool`, a full Python streaming data source
over a spool (`executor.spool`) that a receiver thread of the executor fills.

Offsets {"spool": name, "seq": s}: every batch with seq <= s is included. The planner process
only lists the spool folder (`latestOffset`: the highest contiguous seq), cuts a micro-batch's
range into `partitions` runs of record batches and writes the committed mark (`commit`: then
the receiver acknowledges upstream, and batches up to it are unlinked); the data never passes
through it: Spark's Python workers memory-map the Arrow files and hand the record batches over
as they are (no per-row Python, several partitions in parallel). A replay after a restart reads
the same files: batches are unlinked only once committed, and a replay waits for the receiver to
spool what was not yet there (the writer still retains it: acks follow commits).

A micro-batch is bounded in time as well as in bytes: it takes what the task did in
`target_batch_seconds` at the rate its recent batches showed (`common.batch_cost.time_bounded`:
the cost model of their sizes and times when they fit one, else the last one's rate), at least
`min_batch_bytes` and one spooled batch, at most `max_batch_bytes`. A batch is timed from its
planning (`partitions`) to Spark's next `latestOffset` (asked once it has ended and committed).
So an overloaded task keeps a pace of seconds (results, control tuples, rescales and the
scheduler's measurements) instead of taking its whole backlog, minutes of work, in one batch.

`one_batch` (hot-standby replicas, whose output must depend only on the numbered input): each
micro-batch takes exactly one spooled batch and is followed by one empty flush step
(`{"flushed": false}` -> `true`), which emits what that batch's watermark closed at the same
point in every replica (Spark's own no-data batches are off for these queries: run or not
depending on timing, they would make replicas differ). Without it a window would close only when
the next input arrived, and the last windows of a finite input never.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from common.batch_cost import TARGET_BATCH_SECONDS, BatchSpan, time_bounded
from common.types import Schema
from executor import shapes, spool
from executor.sources import MAX_BATCH_BYTES, finished_offsets, planned_offsets

CONFIG_OPTION = "config"
# the time bound's floor, and the first batch's bound. A CPU-heavy operator does few rows a
# second: at 64 KB (~1,600 rows) every batch of an overloaded 0.3-cpu instance of
# benchmarks/run_scale.py stayed at the floor, 15-50 s each. Not smaller: where no cost model
# fits, a fixed cost over the target shrinks every batch to the floor (`bounded_target` keeps a
# fitted one from doing so), and the task then does floor / fixed
MIN_BATCH_BYTES = 16 << 10
RECENT_BATCHES = 16  # timed micro-batches the bound is fitted over


@dataclass(frozen=True)
class SpoolConfig:
    task_id: str
    name: str  # the spool's name in offsets: a channel id, or "select:<stream>"
    folder: str
    spark_dir: str  # the query's Spark checkpoint (where a one-batch source resumes)
    schema: tuple[tuple[str, str], ...]
    partitions: int = 2
    one_batch: bool = False
    start_seconds: float = 30.0  # initialOffset waits this long for the receiver's base
    replay_seconds: float = 30.0  # a replayed range waits this long to be spooled again
    idle_seconds: float = 0.05  # latestOffset waits up to this long for a new batch
    max_batch_bytes: int = MAX_BATCH_BYTES  # spooled bytes per micro-batch (at least one batch)
    # a micro-batch takes what the task can do in this time at its measured rate (at least
    # `min_batch_bytes`, and at least one spooled batch): `common.batch_cost.time_bounded`
    target_batch_seconds: float = TARGET_BATCH_SECONDS
    min_batch_bytes: int = MIN_BATCH_BYTES

    @property
    def stream_schema(self) -> Schema:
        return Schema.of(*self.schema)


def encode_config(config: SpoolConfig) -> str:
    return json.dumps(asdict(config))


def decode_config(text: str) -> SpoolConfig:
    data = json.loads(text)
    data["schema"] = tuple(tuple(pair) for pair in data["schema"])
    return SpoolConfig(**data)


# --- offsets (pure) ------------------------------------------------------------------------------

def offset(name: str, seq: int, flushed: bool | None = None) -> dict:
    """An offset; `flushed` only for a one-batch source (see the module docstring)."""
    out: dict[str, Any] = {"spool": name, "seq": seq}
    if flushed is not None:
        out["flushed"] = flushed
    return out


def next_one_batch(previous: dict, high: int) -> dict:
    """A one-batch source's next offset after `previous`, `high` being the highest contiguous
    spooled seq: the flush step of an unflushed batch, else the next batch, else no change."""
    if not previous.get("flushed", True):
        return {**previous, "flushed": True}
    if high > previous["seq"]:
        return {**previous, "seq": previous["seq"] + 1, "flushed": False}
    return previous


def later(a: dict | None, b: dict) -> dict:
    """The further of two offsets of one source (None counts as before everything) (pure)."""
    if a is None:
        return b
    key_a = (a["seq"], a.get("flushed", True))
    key_b = (b["seq"], b.get("flushed", True))
    return a if key_a >= key_b else b


def finished_seq(spark_dir: str, name: str) -> int | None:
    """The highest seq of spool `name` in the last micro-batch Spark finished on `spark_dir`."""
    found = [o for o in finished_offsets(spark_dir) if o.get("spool") == name]
    return int(found[0]["seq"]) if found and isinstance(found[0].get("seq"), int) else None


def planned_offset(spark_dir: str, name: str) -> dict | None:
    """The offset of spool `name` in the last micro-batch Spark planned on `spark_dir`."""
    found = [o for o in planned_offsets(spark_dir) if o.get("spool") == name]
    return found[0] if found else None


# --- the reader ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpoolPart(InputPartition):
    folder: str
    units: tuple[spool.Unit, ...]


class SpoolStreamReader(DataSourceStreamReader):
    """Planner-side calls list the folder; `read` runs in Spark's Python workers."""

    def __init__(self, config: SpoolConfig, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.config, self.clock = config, clock
        self._last: dict | None = None  # the furthest offset handed to Spark
        self._stamp: int | None = None
        self._planned: tuple[float, int] | None = None  # (when, bytes) of the batch running
        self._timed: deque[BatchSpan] = deque(maxlen=RECENT_BATCHES)

    def _raise_error(self) -> None:
        problem = spool.read_error(self.config.folder)
        if problem is not None:
            raise spool.SpoolError(f"task {self.config.task_id}: {problem}")

    def _committed(self, wait: float) -> int:
        deadline = time.monotonic() + wait
        while True:
            self._raise_error()
            committed = spool.read_committed(self.config.folder)
            if committed is not None:
                return committed
            if time.monotonic() >= deadline:
                raise spool.SpoolError(
                    f"task {self.config.task_id}: no writer of {self.config.name} answered "
                    f"within {wait:.0f} s")
            time.sleep(0.02)

    def initialOffset(self) -> dict:
        base = self._committed(self.config.start_seconds)
        flushed = True if self.config.one_batch else None
        return offset(self.config.name, base, flushed)

    def _high(self, after: int) -> int:
        """The furthest seq the next micro-batch (after `after`) may take."""
        self._committed(self.config.start_seconds)  # raises the receiver's error, if any
        return spool.capped_high(spool.listing(self.config.folder), after, self.batch_bytes())

    def batch_bytes(self) -> int:
        """The bytes the next micro-batch may take: what the recent batches show the task does
        in the target time (`time_bounded`), within [min_batch_bytes, max_batch_bytes]."""
        cfg = self.config
        return int(time_bounded(list(self._timed), cfg.target_batch_seconds,
                                min(cfg.min_batch_bytes, cfg.max_batch_bytes),
                                cfg.max_batch_bytes))

    def _batch_ended(self, now: float) -> None:
        """Spark asks for the next offset once the batch planned last has ended: time it."""
        if self._planned is not None:
            since, size = self._planned
            self._timed.append(BatchSpan(1, size, max(0.0, now - since)))
            self._planned = None

    def _wait_for_change(self) -> None:
        """Sleep until the folder changes, up to `idle_seconds` (keeps idle queries cheap)."""
        deadline = time.monotonic() + self.config.idle_seconds
        while time.monotonic() < deadline:
            stamp = os.stat(self.config.folder).st_mtime_ns
            if stamp != self._stamp:
                self._stamp = stamp
                return
            time.sleep(0.005)

    def latestOffset(self) -> dict:
        cfg = self.config
        self._batch_ended(self.clock())
        if self._last is None:
            self._last = planned_offset(cfg.spark_dir, cfg.name) or self.initialOffset()
        control = spool.read_control(cfg.folder)
        if control.hold:
            self._wait_for_change()
            return self._last  # a DPC union waits for a cut-off input: nothing new
        if control.upto is not None and control.upto > self._last["seq"]:
            self._last = later(self._last, offset(cfg.name, control.upto))
            return self._last  # a DPC re-run: every batch up to `upto`, in one micro-batch
        high = self._high(self._last["seq"])
        if high <= self._last["seq"] and self._last.get("flushed", True):
            self._wait_for_change()
            high = self._high(self._last["seq"])
        if cfg.one_batch:
            latest = next_one_batch(self._last, high)
        else:
            latest = later(self._last, offset(cfg.name, high))
        self._last = latest
        return latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self._last = later(self._last, end)
        after, upto = start["seq"], end["seq"]
        if upto <= after:
            return [SpoolPart(self.config.folder, ())]  # nothing, or a one-batch flush step
        batches = self._spooled(after, upto)
        self._planned = (self.clock(), sum(b.size for b in batches))
        runs = spool.split_units(batches, self.config.partitions)
        return [SpoolPart(self.config.folder, units) for units in runs] or \
            [SpoolPart(self.config.folder, ())]

    def _spooled(self, after: int, upto: int) -> list[spool.SpooledBatch]:
        """The spooled batches (after, upto], waiting for the receiver to spool a replay."""
        deadline = time.monotonic() + self.config.replay_seconds
        while True:
            self._raise_error()
            found = spool.listing(self.config.folder)
            missing = [seq for seq in range(after + 1, upto + 1) if seq not in found]
            if not missing:
                return [found[seq] for seq in range(after + 1, upto + 1)]
            if time.monotonic() >= deadline:
                raise spool.SpoolError(
                    f"task {self.config.task_id}: {self.config.name} batches {missing[0]}.."
                    f"{missing[-1]} of ({after}, {upto}] were not spooled within "
                    f"{self.config.replay_seconds:.0f} s")
            time.sleep(0.02)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpoolPart)
        schema = shapes.arrow_schema(self.config.stream_schema)
        return spool.read_units(partition.folder, partition.units, schema)

    def commit(self, end: dict) -> None:
        folder = self.config.folder
        if end["seq"] > (spool.read_committed(folder) or 0):
            spool.write_committed(folder, end["seq"])
        if not spool.read_control(folder).keep:  # a DPC stable point may be re-run from
            spool.trim(folder, end["seq"])


class SpoolSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "elastiq_spool"

    def schema(self) -> str:
        return decode_config(self.options[CONFIG_OPTION]).stream_schema.ddl()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SpoolStreamReader(decode_config(self.options[CONFIG_OPTION]))
