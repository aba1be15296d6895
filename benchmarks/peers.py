"""Elastiq against the engines users would pick instead: PyFlink, hand-written PySpark, bytewax.

Owns this benchmark only (not a test; tests/test_peers_oracle.py checks its pure yardstick: input,
oracle, comparison). One query, hot-sensors.
shape: readings with `temp > 30`, tumbling 10 s event-time windows per sensor, watermark 2 s,
avg/max/count. One input file, written once per run into a temporary folder: `--rows` readings
(default 3M) of the project's `sensor` generator shape (`executor.shapes`, seed 42) as JSON lines
`{"sensor", "ts" (ISO-8601 UTC, 1 ms apart), "temp", "humidity"}`. Each engine runs in its own
subprocess (its own process group, killed in a `finally`):

- elastiq: a spec this script writes (file-source -> filter -> window-aggregate -> file-sink),
  run by `elastiq run` (`python -m elastiq.cli run`, this repository on PYTHONPATH); the
  scheduler API it serves says when the task runs; stopped with SIGINT once the sink is complete
  (a file source follows its file, so the query never ends by itself).
- spark: benchmarks/peers_jobs/spark_job.py, hand-written Structured Streaming with Spark's own
  file source (`readStream.json`, one file, `maxFilesPerTrigger` 1), local[2], this interpreter.
- flink: peers_jobs/flink_job.py, PyFlink Table API (filesystem JSON source, TUMBLE), parallelism 2
  (1 in the latency runs, where it follows a folder: see the README).
- bytewax: peers_jobs/bytewax_job.py, one worker, FileSource, EventClock + TumblingWindower.

Flink and bytewax are installed by this script into their own virtualenvs under
`~/.cache/elastiq-bench/` (reused when present; benchmark dependencies, never the product's).

Measured per engine, medians over `--repeats` runs (order rotated per repeat):
- start-up: from the subprocess's start to the query running (elastiq: the scheduler reports
  the task running; the jobs: the line `PEERS running <time>` they print once their streaming
  query / job / dataflow has started);
- throughput: input rows / (time the sink first held every expected window - running time);
- results: every run's sink against a plain-Python oracle over the same file (windows keyed by
  sensor and window start; avg to 1e-9 relative, max and count exact, no window twice). Spark
  and Elastiq emit a window once the watermark (largest event time - 2 s) passes its end, so on
  a finite input they emit the windows that end by then; Flink and bytewax close every window
  at the end of the input. Each engine is held to its own exact expected set.
- latency at a fixed rate (every engine): once the engine has emitted a warm-up window (two
  rows of sensor `warm-up` before the input's start), a feeder releases the first rows of the
  same file at `--rate` rows/s (a chunk every 50 ms: appended to the file the Elastiq source and
  the bytewax job follow; a new file in the folder Spark's/Flink's source watches); for each
  window, the wall time its row appeared in the sink minus the wall time the chunk holding the
  first row past `window end + watermark` (the row that closes it) was released; p50 pooled.

    python benchmarks/peers.py [--rows N] [--repeats N] [--engines elastiq,spark,flink,bytewax]
                               [--quick] [--no-latency]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository: `benchmarks.*` (as the tests import it), `common`
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_util import fmt, format_table, median_of, percentile, ratio  # noqa: E402
from benchmarks.peer_engines import JOBS, VENVS, Job, ensure_venv  # noqa: E402
from testkit.waiting import poll  # noqa: E402

log = logging.getLogger("bench.peers")

ENGINES = ("elastiq", "spark", "flink", "bytewax")

SEED = 42
START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
ROW_SPACING_MS = 1  # event time advances 1 ms per row
THRESHOLD = 30.0
WINDOW_MS = 10_000
WATERMARK_MS = 2_000
SINK_POLL_S = 0.01
FEED_TICK_S = 0.05
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# how each job is asked to stop, and how long it may take: `elastiq run` stops its query,
# executors and embedded cluster on SIGINT; the peer jobs hold nothing worth a clean stop
STOP: dict[str, tuple[int, float]] = {"elastiq": (signal.SIGINT, 60.0),
                                      "spark": (signal.SIGTERM, 10.0),
                                      "flink": (signal.SIGTERM, 10.0),
                                      "bytewax": (signal.SIGTERM, 10.0)}
WARM_SENSOR = "warm-up"  # latency runs: see warmup_lines()
FLUSHING = frozenset({"flink", "bytewax"})  # close every window at the end of a finite input


# --- pure: rows, windows, the oracle and the comparison -----------------------------------------

@dataclass(frozen=True)
class Reading:
    """One input row as the oracle needs it (only rows that pass the filter are kept)."""

    index: int
    sensor: str
    ts_ms: int
    temp: float


@dataclass(frozen=True)
class WindowRow:
    """One result row, canonical: the window by its start in epoch milliseconds."""

    start_ms: int
    sensor: str
    avg_temp: float
    max_temp: float
    readings: int

    @property
    def key(self) -> tuple[int, str]:
        return (self.start_ms, self.sensor)


def iso_ms(text: str) -> int:
    """An ISO-8601 instant (naive = UTC) -> epoch milliseconds (floored)."""
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    delta = parsed - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def ms_iso(ms: int) -> str:
    """Epoch milliseconds -> `2024-01-01T00:00:00.001Z`."""
    seconds, millis = divmod(ms, 1000)
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + \
        f".{millis:03d}Z"


def input_line(sensor: str, ts_ms: int, temp: float, humidity: float) -> str:
    """One input row as a JSON line (floats in Python's shortest round-trip form)."""
    return (f'{{"sensor":"{sensor}","ts":"{ms_iso(ts_ms)}","temp":{temp!r},'
            f'"humidity":{humidity!r}}}')


def parse_input(lines: Iterable[str]) -> list[Reading]:
    """The rows of the input file that pass `temp > THRESHOLD`, in file order (plain Python)."""
    kept = []
    for index, line in enumerate(lines):
        row = json.loads(line)
        if row["temp"] > THRESHOLD:
            kept.append(Reading(index, row["sensor"], iso_ms(row["ts"]), float(row["temp"])))
    return kept


def window_start(ts_ms: int) -> int:
    return ts_ms - ts_ms % WINDOW_MS


def final_watermark(readings: Sequence[Reading]) -> int:
    """The watermark after the whole input: largest event time (after the filter) - 2 s."""
    return max((r.ts_ms for r in readings), default=-(1 << 62)) - WATERMARK_MS


def oracle(readings: Iterable[Reading], watermark_ms: int | None) -> dict[tuple[int, str], WindowRow]:
    """Window rows of the query in plain Python; with `watermark_ms`, only the windows whose end
    is at or before it (what a watermark-driven engine emits on a finite input)."""
    acc: dict[tuple[int, str], list[float]] = {}
    for r in readings:
        start = window_start(r.ts_ms)
        if watermark_ms is not None and start + WINDOW_MS > watermark_ms:
            continue
        a = acc.setdefault((start, r.sensor), [0.0, -math.inf, 0])
        a[0] += r.temp
        a[1] = max(a[1], r.temp)
        a[2] += 1
    return {k: WindowRow(k[0], k[1], s / n, m, int(n)) for k, (s, m, n) in acc.items()}


def expected_for(engine: str, readings: Sequence[Reading]) -> dict[tuple[int, str], WindowRow]:
    return oracle(readings, None if engine in FLUSHING else final_watermark(readings))


def parse_result(line: str) -> WindowRow:
    """A sink line: Elastiq's file sink (`window_start` ISO-8601) or a peer job's
    (`window_start_ms`)."""
    data = json.loads(line)
    start = (int(data["window_start_ms"]) if "window_start_ms" in data
             else iso_ms(str(data["window_start"])))
    return WindowRow(start, str(data["sensor"]), float(data["avg_temp"]),
                     float(data["max_temp"]), int(data["readings"]))


def rows_equal(a: WindowRow, b: WindowRow) -> bool:
    return (a.key == b.key and a.max_temp == b.max_temp and a.readings == b.readings
            and math.isclose(a.avg_temp, b.avg_temp, rel_tol=1e-9, abs_tol=0.0))


def compare(got: Sequence[WindowRow], expected: Mapping[tuple[int, str], WindowRow]) -> str:
    """'' when `got` is exactly `expected` (no row twice); otherwise what differs, briefly."""
    keyed = {row.key: row for row in got}
    problems = []
    if len(keyed) != len(got):
        problems.append(f"{len(got) - len(keyed)} window(s) written twice")
    missing = expected.keys() - keyed.keys()
    extra = keyed.keys() - expected.keys()
    wrong = [k for k in keyed.keys() & expected.keys() if not rows_equal(keyed[k], expected[k])]
    for label, keys in (("missing", missing), ("unexpected", extra), ("different", wrong)):
        if keys:
            problems.append(f"{len(keys)} {label} (e.g. {sorted(keys)[0]})")
    return "; ".join(problems)


def closing_index(readings: Sequence[Reading], window_start_ms: int) -> int | None:
    """Input index of the first row past the filter with event time >= window end + watermark:
    the row whose arrival lets the window close; None if the input has none."""
    bound = window_start_ms + WINDOW_MS + WATERMARK_MS
    lo, hi = 0, len(readings)
    while lo < hi:
        mid = (lo + hi) // 2
        if readings[mid].ts_ms < bound:
            lo = mid + 1
        else:
            hi = mid
    return readings[lo].index if lo < len(readings) else None


def release_time(chunks: Sequence[tuple[int, float]], index: int) -> float | None:
    """When the feeder released input row `index`; `chunks` = (rows released so far, wall time)
    in release order."""
    for released, wall in chunks:
        if index < released:
            return wall
    return None


def window_latencies(seen: Sequence[tuple[float, WindowRow]], readings: Sequence[Reading],
                     chunks: Sequence[tuple[int, float]]) -> list[float]:
    """Seconds from the release of each window's closing row to its first sink row (one sample
    per window start: all sensors of a window share one close)."""
    first_seen: dict[int, float] = {}
    for wall, row in seen:
        first_seen[row.start_ms] = min(wall, first_seen.get(row.start_ms, math.inf))
    out = []
    for start, wall in sorted(first_seen.items()):
        closer = closing_index(readings, start)
        released = None if closer is None else release_time(chunks, closer)
        if released is not None:
            out.append(wall - released)
    return out


def warmup_lines() -> list[str]:
    """Two rows of sensor WARM_SENSOR, 30 s and 15 s before the input: the second moves the
    watermark past the first one's window, so its result shows that an engine consumes."""
    return [input_line(WARM_SENSOR, START_MS - 30_000, 35.0, 50.0),
            input_line(WARM_SENSOR, START_MS - 15_000, 35.0, 50.0)]


def data_rows(seen: Sequence[tuple[float, WindowRow]]) -> list[tuple[float, WindowRow]]:
    """Sink rows of the measured input (the warm-up window left out)."""
    return [(wall, row) for wall, row in seen if row.sensor != WARM_SENSOR]


def rows_for_rate(rate: float, seconds: float) -> int:
    return int(rate * seconds)


# --- I/O: the input file -------------------------------------------------------------------------

def write_input(path: Path, rows: int) -> None:
    """`rows` readings of the project's `sensor` shape as JSON lines (vectorised in chunks)."""
    from executor import shapes

    shape = shapes.shape_named("sensor")
    schema = shape.columns
    rate = 1000.0 / ROW_SPACING_MS
    start_us = START_MS * 1000
    with open(path, "w", encoding="utf-8") as f:
        for lo in range(0, rows, 200_000):
            hi = min(rows, lo + 200_000)
            batch = shapes.generate_batch(shape, schema, SEED, start_us, rate, lo, hi).to_pydict()
            f.write("".join(
                input_line(s, START_MS + i * ROW_SPACING_MS, t, h) + "\n"
                for i, s, t, h in zip(range(lo, hi), batch["sensor"], batch["temp"],
                                      batch["humidity"])))


def read_input(path: Path) -> list[Reading]:
    with open(path, encoding="utf-8") as f:
        return parse_input(f)


# --- I/O: subprocesses, sink watching, feeding ---------------------------------------------------

class SinkWatcher:
    """Polls a JSON-lines file every SINK_POLL_S; stamps each new complete line with the wall time
    it was first seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[tuple[float, WindowRow]] = []
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sink-watcher", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            return
        if size <= self._offset:
            return
        now = time.time()
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode("utf-8").splitlines():
            if line.strip():
                self.seen.append((now, parse_result(line)))

    def _loop(self) -> None:
        while not self._stop.wait(SINK_POLL_S):
            self._poll()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._poll()

    def time_of_row(self, count: int) -> float | None:
        """When the sink first held `count` rows."""
        return self.seen[count - 1][0] if count and len(self.seen) >= count else None


class Feeder:
    """Releases the first `rows` lines of the input at `rate` rows/s, a chunk every FEED_TICK_S:
    appended to one file (`into_dir` False) or as a new file in a folder (renamed into place).
    `chunks` records (rows released so far, wall time) after each release."""

    def __init__(self, lines: Sequence[str], rate: float, target: Path, into_dir: bool) -> None:
        self.lines, self.rate, self.target, self.into_dir = lines, rate, target, into_dir
        self.chunks: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="feeder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def warm_up(self) -> None:
        """Release the warm-up rows (not part of the measured input)."""
        self._write("".join(line + "\n" for line in warmup_lines()), "warm-up")

    def _write(self, text: str, name: str) -> None:
        if self.into_dir:
            tmp = self.target.parent / f".part-{name}.json"
            tmp.write_text(text, encoding="utf-8")
            os.rename(tmp, self.target / f"part-{name}.json")
        else:
            with open(self.target, "a", encoding="utf-8") as f:
                f.write(text)

    def _release(self, lo: int, hi: int, n: int) -> None:
        self._write("".join(self.lines[lo:hi]), f"{n:06d}")
        self.chunks.append((hi, time.time()))

    def _loop(self) -> None:
        began, released, n = time.time(), 0, 0
        while released < len(self.lines) and not self._stop.wait(FEED_TICK_S):
            due = min(len(self.lines), int((time.time() - began) * self.rate))
            if due > released:
                self._release(released, due, n)
                released, n = due, n + 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the engines ---------------------------------------------------------------------------------

@dataclass
class Run:
    """One run of one engine: its figures, and its sink rows (with the time each was seen)."""

    engine: str
    startup_s: float = math.nan
    rows_per_s: float = math.nan
    seen: list[tuple[float, WindowRow]] = field(default_factory=list)
    problem: str = ""  # '' when the results equal the oracle and nothing timed out
    latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Setup:
    work: Path
    data: Path  # the input file
    rows: int
    readings: list[Reading]  # filtered, in file order
    timeout_s: float
    pythons: Mapping[str, str]  # engine -> interpreter


def spec_text(name: str, source: Path, sink: Path) -> str:
    """The Elastiq spec of the query (our own paths and numbers only)."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="{name}">
  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="ts" type="timestamp"/>
    <column name="temp" type="double"/>
    <column name="humidity" type="double"/>
  </type>
  <operator name="src" type="file-source">
    <param name="path" value="{source}"/>
    <param name="format" value="jsonl"/>
    <output name="raw" type="reading"/>
  </operator>
  <operator name="hot" type="filter">
    <input name="raw"/>
    <param name="condition" value="raw.temp &gt; {THRESHOLD:g}"/>
    <output name="hotReadings" type="reading"/>
  </operator>
  <operator name="avg" type="window-aggregate">
    <input name="hotReadings"/>
    <param name="time" value="ts"/>
    <param name="size" value="{WINDOW_MS // 1000} seconds"/>
    <param name="watermark" value="{WATERMARK_MS // 1000} seconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="avg_temp" function="avg" column="temp"/>
    <aggregate name="max_temp" function="max" column="temp"/>
    <aggregate name="readings" function="count"/>
    <output name="averages"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="averages"/>
    <param name="path" value="{sink}"/>
  </operator>
</dataflow>
"""


API_LINE = re.compile(r"elastiq: API at http://127\.0\.0\.1:(\d+)")


class ElastiqRunning:
    """Watches `elastiq run`'s scheduler API until its task reports running (the port is the
    one `elastiq run` says it serves: another free one if ours was taken meanwhile)."""

    def __init__(self, job: Job, xdg: Path, query_id: str) -> None:
        self.job, self.xdg, self.query_id = job, xdg, query_id
        self._client: Any = None

    def _connect(self) -> Any:
        from common.api_client import SchedulerClient
        from common.api_token import read_token

        found = API_LINE.search(self.job.log_path.read_text(encoding="utf-8", errors="replace"))
        if found is None:
            return None
        token_file = self.xdg / "elastiq" / f"api-token-{found.group(1)}"
        try:
            token = read_token(token_file)
        except (OSError, ValueError):  # not written yet
            return None
        return SchedulerClient(f"http://127.0.0.1:{found.group(1)}", timeout=2.0, token=token)

    def check(self) -> bool:
        if self._client is None:
            self._client = self._connect()
            if self._client is None:
                return False
        try:
            status = self._client.status(self.query_id)
        except Exception:  # not up yet, or busy: ask again
            return False
        tasks = status.get("tasks") or []
        if tasks and all(t.get("state") == "running" for t in tasks):
            self.job.running_at = time.time()
            return True
        return False


def start_engine(engine: str, setup: Setup, run_dir: Path, source: Path, sink: Path,
                 follow: bool) -> tuple[Job, Callable[[], bool]]:
    """Start one engine on `source` (a file, or for spark/flink a folder); returns the job and a
    check that is true once it runs."""
    if engine == "elastiq":
        spec = run_dir / "spec.xml"
        query_id = f"peers-{run_dir.name}"
        spec.write_text(spec_text(query_id, source, sink), encoding="utf-8")
        port = free_port()
        xdg = run_dir / "xdg"
        argv = [sys.executable, "-m", "elastiq.cli", "run", str(spec), "--state-dir",
                str(run_dir / "state"), "--no-progress", "--api-port", str(port),
                "--path-root", str(source.parent), "--path-root", str(sink.parent)]
        job = Job(engine, argv, run_dir, env={"PYTHONPATH": _pythonpath(),
                                              "XDG_STATE_HOME": str(xdg)})
        return job, ElastiqRunning(job, xdg, query_id).check
    if engine == "spark":
        argv = [setup.pythons["spark"], str(JOBS / "spark_job.py"), "--input", str(source),
                "--sink", str(sink), "--checkpoint", str(run_dir / "checkpoint")]
        if not follow:
            argv += ["--max-files-per-trigger", "1"]
    elif engine == "flink":
        argv = [setup.pythons["flink"], str(JOBS / "flink_job.py"), "--input", str(source),
                "--sink", str(sink)] + (["--follow", "--parallelism", "1"] if follow else [])
    elif engine == "bytewax":
        argv = [setup.pythons["bytewax"], str(JOBS / "bytewax_job.py"), "--input", str(source),
                "--sink", str(sink)] + (["--follow"] if follow else [])
    else:
        raise ValueError(f"unknown engine {engine!r}")
    job = Job(engine, argv, run_dir, env={"TZ": "UTC"})
    return job, lambda: job.running_at is not None


def _pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH")
    return f"{ROOT}{os.pathsep}{existing}" if existing else str(ROOT)


def throughput_run(engine: str, setup: Setup, n: int) -> Run:
    """One run over the whole input file; always stops the engine."""
    run_dir = setup.work / f"{engine}-tp-{n}"
    run_dir.mkdir()
    sink = run_dir / "out" / "sink.jsonl"
    sink.parent.mkdir()
    source = setup.data
    if engine == "spark":  # Spark's file source reads folders
        source = run_dir / "in"
        source.mkdir()
        os.link(setup.data, source / setup.data.name)
    expected = expected_for(engine, setup.readings)
    result = Run(engine)
    job, running = start_engine(engine, setup, run_dir, source, sink, follow=False)
    watcher = SinkWatcher(sink)
    try:
        if not poll(lambda: running() or not job.alive(), 240.0, 0.05) or not running():
            result.problem = f"did not start (log {job.log_path})"
            return result
        assert job.running_at is not None
        result.startup_s = job.running_at - job.started
        if not poll(lambda: len(watcher.seen) >= len(expected) or not job.alive(),
                    setup.timeout_s, 0.05):
            result.problem = f"timed out with {len(watcher.seen)}/{len(expected)} windows"
        complete = watcher.time_of_row(len(expected))
        if complete is not None:
            result.rows_per_s = setup.rows / (complete - job.running_at)
        if engine in FLUSHING:  # they end by themselves: let them, so nothing is cut short
            job.done.wait(30.0)
    finally:
        job.stop(*STOP[engine])
        watcher.close()
    result.seen = watcher.seen
    problem = compare([row for _, row in watcher.seen], expected)
    result.problem = "; ".join(p for p in (result.problem, problem) if p)
    log.info("%s run %s: start-up %.1f s, %s rows/s, %s", engine, n, result.startup_s,
             fmt(result.rows_per_s), result.problem or "equal to the oracle")
    return result


def latency_run(engine: str, setup: Setup, lines: Sequence[str], rate: float, n: int) -> Run:
    """The first len(lines) rows released at `rate` rows/s once the engine has emitted the
    warm-up window (so it consumes: a source that starts late would otherwise find seconds of
    files at once, in any order); window-close latencies, and the emitted windows checked
    against the oracle of those rows."""
    run_dir = setup.work / f"{engine}-lat-{n}"
    run_dir.mkdir()
    sink = run_dir / "out" / "sink.jsonl"
    sink.parent.mkdir()
    into_dir = engine in ("spark", "flink")
    source = run_dir / ("in" if into_dir else "input.jsonl")
    if into_dir:
        source.mkdir()
    else:
        source.touch()
    fed = [r for r in setup.readings if r.index < len(lines)]
    expected = oracle(fed, final_watermark(fed))
    result = Run(engine)
    job, running = start_engine(engine, setup, run_dir, source, sink, follow=True)
    watcher = SinkWatcher(sink)
    feeder = Feeder(lines, rate, source, into_dir)
    try:
        if not poll(lambda: running() or not job.alive(), 240.0, 0.05) or not running():
            result.problem = f"did not start (log {job.log_path})"
            return result
        feeder.warm_up()
        if not poll(lambda: len(data_rows(watcher.seen)) < len(watcher.seen)
                    or not job.alive(), 240.0, 0.05) or not job.alive():
            result.problem = f"no warm-up window (log {job.log_path})"
            return result
        feeder.start()
        span = len(lines) / rate
        if not poll(lambda: len(data_rows(watcher.seen)) >= len(expected)
                    or not job.alive(), span + 120.0, 0.05):
            result.problem = (f"timed out with {len(data_rows(watcher.seen))}/{len(expected)} "
                              "windows")
    finally:
        feeder.stop()
        job.stop(*STOP[engine])
        watcher.close()
    result.seen = data_rows(watcher.seen)
    got = [row for _, row in result.seen if row.key in expected or engine not in FLUSHING]
    problem = compare(got, expected)
    result.problem = "; ".join(p for p in (result.problem, problem) if p)
    result.latencies = window_latencies(
        [(w, r) for w, r in result.seen if r.key in expected], fed, feeder.chunks)
    log.info("%s latency run %s: %s window closes, p50 %s ms, %s", engine, n,
             len(result.latencies), fmt(percentile(result.latencies, 50) * 1000),
             result.problem or "equal to the oracle")
    return result


# --- the report ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Figures:
    engine: str
    rows_per_s: float
    startup_s: float
    equal: bool
    runs: int
    latency_p50_ms: float
    latency_samples: int
    problems: tuple[str, ...]


def figures_of(engine: str, runs: Sequence[Run], lat: Sequence[Run]) -> Figures:
    samples = [x for r in lat for x in r.latencies]
    problems = tuple(f"{r.engine}: {r.problem}" for r in [*runs, *lat] if r.problem)
    return Figures(engine, median_of([r.rows_per_s for r in runs]),
                   median_of([r.startup_s for r in runs]),
                   bool(runs) and not problems, len(runs),
                   percentile(samples, 50) * 1000 if samples else math.nan, len(samples),
                   problems)


def report(figures: Mapping[str, Figures], rows: int, repeats: int, rate: float) -> str:
    header = ["engine", "rows/s", "start-up s", "equal to oracle", "window latency p50 ms",
              "closes"]
    table = [[f.engine, fmt(f.rows_per_s), fmt(f.startup_s, 1), "yes" if f.equal else "NO",
              fmt(f.latency_p50_ms), str(f.latency_samples) if f.latency_samples else "-"]
             for f in figures.values()]
    lines = [f"Peers: {rows:,} rows, filter temp > 30 + tumbling 10 s windows per sensor "
             f"(watermark 2 s), avg/max/count; medians of {repeats}; latency at {rate:,.0f} "
             f"rows/s pooled over runs", format_table(header, table)]
    e = figures.get("elastiq")
    for peer, label in (("flink", "Flink"), ("spark", "hand-written Spark"),
                        ("bytewax", "bytewax")):
        if e is not None and peer in figures:
            tp = ratio(e.rows_per_s, figures[peer].rows_per_s)
            goal = "" if peer == "bytewax" else (" (goal >= 1.0: " +
                                                 ("met" if tp >= 1.0 else "MISSED") + ")")
            lines.append(f"Elastiq/{label}: throughput {fmt(tp, 2)}{goal}, start-up "
                         f"{fmt(ratio(e.startup_s, figures[peer].startup_s), 2)}, window "
                         f"latency p50 {fmt(ratio(e.latency_p50_ms, figures[peer].latency_p50_ms), 2)}")
    if e is not None:
        if not math.isnan(e.latency_p50_ms):
            met = "met" if e.latency_p50_ms <= 500 else "MISSED"
            lines.append(f"Elastiq window latency p50 at {rate:,.0f} rows/s: "
                         f"{fmt(e.latency_p50_ms)} ms (goal <= 500 ms: {met})")
        if not math.isnan(e.startup_s):
            met = "met" if e.startup_s <= 8 else "MISSED"
            lines.append(f"Elastiq start-up {e.startup_s:.1f} s (goal <= 8 s: {met})")
    for f in figures.values():
        lines.extend(f"PROBLEM {p}" for p in f.problems)
    return "\n".join(lines)


# --- main ----------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=3_000_000, help="input rows (default 3M)")
    p.add_argument("--repeats", type=int, default=3, help="runs per engine (default 3)")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help=f"comma-separated, of {','.join(ENGINES)}")
    p.add_argument("--rate", type=float, default=2000.0, help="latency runs' rows/s (2000)")
    p.add_argument("--latency-seconds", type=float, default=30.0,
                   help="how long each latency run feeds rows (30)")
    p.add_argument("--latency-engines", default=",".join(ENGINES),
                   help="engines measured for latency (default: all)")
    p.add_argument("--no-latency", action="store_true", help="skip the latency runs")
    p.add_argument("--quick", action="store_true",
                   help="300k rows, 1 repeat, 20 s latency runs: a smoke check, not figures")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.repeats, args.latency_seconds = 300_000, 1, 20.0
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown or not engines:
        p.error(f"--engines: unknown {unknown}; pick from {','.join(ENGINES)}")
    if args.rows < 30_000 or args.repeats < 1:
        p.error("--rows must be >= 30000 (3 windows) and --repeats >= 1")
    args.engine_list = engines
    args.latency_list = [] if args.no_latency else [
        e for e in args.latency_engines.split(",") if e.strip() in engines]
    return args


def order_for(engines: Sequence[str], turn: int) -> list[str]:
    """Rotate the engines' order per repeat."""
    if not engines:
        return []
    k = turn % len(engines)
    return [*engines[k:], *engines[:k]]


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    began = time.monotonic()
    pythons = {"elastiq": sys.executable, "spark": sys.executable}
    skipped = []
    for engine in [e for e in args.engine_list if e in VENVS]:
        try:
            pythons[engine] = ensure_venv(engine)
        except (OSError, subprocess.SubprocessError) as exc:
            log.error("%s could not be installed (%s): measuring the others", engine, exc)
            skipped.append(f"NOTE {engine} not measured: its virtualenv could not be installed "
                           f"({type(exc).__name__}: {exc})")
            args.engine_list.remove(engine)
            args.latency_list = [e for e in args.latency_list if e != engine]
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="elastiq-peers-") as tmp:
        work = Path(tmp)
        data = work / "data" / "readings.jsonl"
        data.parent.mkdir()
        write_input(data, args.rows)
        readings = read_input(data)
        log.info("input: %s rows (%s after the filter), %.0f MB", args.rows, len(readings),
                 data.stat().st_size / 1e6)
        setup = Setup(work, data, args.rows, readings, timeout_s=max(300.0, args.rows / 5000),
                      pythons=pythons)
        runs: dict[str, list[Run]] = {e: [] for e in args.engine_list}
        lat: dict[str, list[Run]] = {e: [] for e in args.engine_list}
        lines: list[str] = []
        if args.latency_list:
            with open(data, encoding="utf-8") as f:
                count = rows_for_rate(args.rate, args.latency_seconds)
                lines = [line for _, line in zip(range(count), f)]
        for turn in range(args.repeats):
            for engine in order_for(args.engine_list, turn):
                runs[engine].append(throughput_run(engine, setup, turn))
            for engine in order_for(args.latency_list, turn):
                lat[engine].append(latency_run(engine, setup, lines, args.rate, turn))
    figures = {e: figures_of(e, runs[e], lat[e]) for e in args.engine_list}
    print(report(figures, args.rows, args.repeats, args.rate), file=out)
    for note in skipped:
        print(note, file=out)
    for engine in args.engine_list:
        print(f"  {engine}: rows/s " + ", ".join(fmt(r.rows_per_s) for r in runs[engine])
              + "; start-up s " + ", ".join(fmt(r.startup_s, 1) for r in runs[engine]), file=out)
    print(f"load average at the start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, at the end "
          + " / ".join(f"{x:.1f}" for x in os.getloadavg())
          + f"; wall time {time.monotonic() - began:.0f} s", file=out)
    return 0 if all(f.equal for f in figures.values()) and not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
