"""The peers benchmark's query as a bytewax dataflow (runs in its own virtualenv).

Run by benchmarks/peers.py in a subprocess with the bytewax venv's interpreter:

    python bytewax_job.py --input FILE --sink FILE [--follow]

Reads the JSON-lines FILE with bytewax's FileSource (one partition, one worker; with --follow, a
small source of this file that keeps reading the lines appended to FILE until killed), keeps
`temp > 30`, keys by sensor, 10 s tumbling event-time windows (EventClock, 2 s allowed lateness)
folding sum/max/count, and appends each closed window to the sink as a JSON line
(`window_start_ms`, `sensor`, `avg_temp`, `max_temp`, `readings`). The end of the file closes
every window. Prints `PEERS running <epoch seconds>` when the dataflow starts, `PEERS done` at the
end.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import bytewax.operators as op
from bytewax.connectors.files import FileSource
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.operators import windowing as win
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.testing import run_main

ALIGN = datetime(1970, 1, 1, tzinfo=timezone.utc)
LENGTH = timedelta(seconds=10)


class _Appender(StatelessSinkPartition):
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")

    def write_batch(self, items: list[str]) -> None:
        self._file.write("".join(line + "\n" for line in items))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class AppendSink(DynamicSink):
    """Appends string items to one file (one worker)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Appender:
        print(f"PEERS running {time.time():.6f}", flush=True)
        return _Appender(self.path)


class _Following(StatefulSourcePartition[str, int]):
    def __init__(self, path: str, offset: int) -> None:
        self._file = open(path, "rb")
        self._file.seek(offset)
        self._pending = b""
        self._idle = False

    def next_batch(self) -> list[str]:
        data = self._pending + self._file.read()
        end = data.rfind(b"\n") + 1
        self._pending = data[end:]
        self._idle = end == 0
        return data[:end].decode("utf-8").splitlines() if end else []

    def next_awake(self) -> datetime | None:
        return datetime.now(timezone.utc) + timedelta(milliseconds=5) if self._idle else None

    def snapshot(self) -> int:
        return self._file.tell() - len(self._pending)

    def close(self) -> None:
        self._file.close()


class FollowSource(FixedPartitionedSource[str, int]):
    """The lines of one growing file, as they are appended (never ends)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def list_parts(self) -> list[str]:
        return ["follow"]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _Following:
        return _Following(self.path, resume_state or 0)


def parse(line: str) -> dict[str, Any]:
    row = json.loads(line)
    row["ts"] = datetime.fromisoformat(row["ts"])
    return row


def fold(acc: list[float], row: dict[str, Any]) -> list[float]:
    temp = row["temp"]
    acc[0] += temp
    acc[1] = temp if acc[2] == 0 or temp > acc[1] else acc[1]
    acc[2] += 1
    return acc


def merge(a: list[float], b: list[float]) -> list[float]:
    return [a[0] + b[0], max(a[1], b[1]), a[2] + b[2]]


def render(item: tuple[str, tuple[int, list[float]]]) -> str:
    sensor, (window_id, (total, top, count)) = item
    start = ALIGN + window_id * LENGTH
    return json.dumps({"window_start_ms": int((start - ALIGN) / timedelta(milliseconds=1)),
                       "sensor": sensor, "avg_temp": total / count, "max_temp": top,
                       "readings": int(count)})


def flow(source: str, sink: str, follow: bool) -> Dataflow:
    df = Dataflow("peers")
    lines = op.input("in", df, FollowSource(source) if follow else FileSource(source))
    hot = op.filter("hot", op.map("parse", lines, parse), lambda r: r["temp"] > 30)
    keyed = op.key_on("key", hot, lambda r: r["sensor"])
    clock = win.EventClock(lambda r: r["ts"], wait_for_system_duration=timedelta(seconds=2))
    windower = win.TumblingWindower(length=LENGTH, align_to=ALIGN)
    windows = win.fold_window("window", keyed, clock, windower, lambda: [0.0, 0.0, 0], fold,
                              merge)
    op.output("out", op.map("render", windows.down, render), AppendSink(sink))
    return df


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--follow", action="store_true")
    args = parser.parse_args()
    run_main(flow(args.input, args.sink, args.follow))
    print("PEERS done", flush=True)


if __name__ == "__main__":
    main()
