"""The cost of fencing task attempts (`executor.fencing`) on a task's sink calls.

Owns the benchmark only (not a test). Each sink call of a fenced task takes a shared `flock` on
`<checkpoint>/fence.lock` and reads `<checkpoint>/fence` before the sink runs. It times N calls
of a sink that appends one ~100-byte line to a file through the task's `BatchGate`, without a
guard (the baseline) and with the attempt's fence, interleaved, on a local temp folder, and
reports medians over repeats: microseconds per call for each and the added cost per call. A
micro-batch of Spark costs tens of milliseconds or more, so the goal is an added cost under 1%
of a 10 ms batch (100 us per call).

    python benchmarks/fencing.py [--calls 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository: `benchmarks.*`, and the project's packages
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_util import median_of, ratio, use_repo_on_path  # noqa: E402

use_repo_on_path()

from executor.batch_gate import BatchGate  # noqa: E402
from executor.fencing import Fence  # noqa: E402

GOAL_US = 100.0
LINE = "x" * 99 + "\n"


def per_call_us(gate: BatchGate, out: Path, calls: int) -> float:
    with open(out, "a", encoding="utf-8") as f:
        def sink(df: object, batch_id: int) -> None:
            f.write(LINE)
        gated = gate.wrap(sink)
        started = time.perf_counter()
        for batch in range(calls):
            gated(None, batch)
        return (time.perf_counter() - started) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    plain, fenced = [], []
    with tempfile.TemporaryDirectory() as work:
        fence = Fence(str(Path(work) / "checkpoint"), 7, "t.a7")
        fence.raise_()
        for _ in range(args.repeats):
            plain.append(per_call_us(BatchGate(), Path(work) / "plain.out", args.calls))
            fenced.append(per_call_us(BatchGate(fence.holding), Path(work) / "fenced.out",
                                      args.calls))
    base, with_fence = median_of(plain), median_of(fenced)
    added = with_fence - base
    print(f"sink call without fence: {base:8.1f} us (median of {args.repeats} x {args.calls})")
    print(f"sink call with fence:    {with_fence:8.1f} us  ratio {ratio(with_fence, base):.2f}")
    print(f"added per call:          {added:8.1f} us  goal < {GOAL_US:.0f} us: "
          f"{'met' if added < GOAL_US else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
