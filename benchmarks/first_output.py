"""How long `elastiq run examples/hot-sensors.xml` takes to show its first result, and where the
time goes.

Starts the real command (`python -m elastiq.cli run ... --api-port P`) as a user does, and
follows it from outside: its terminal output (the first `sink:` line), and its scheduler API
(`status` every 0.1 s: when every task is running, when the first micro-batch has read tuples).
The generator paces event time at wall time (`executor.shapes`: event time = start + i/rate),
so hot-sensors' first window (10 s, watermark 2 s) can close 12 s after its first tuple: the
goal is a first result within 2 s of that moment. Prints per repeat and the medians:
`running` (command start -> every task running: cluster, executor JVM and SparkSession, task
build; the source paces event time from its query's start), `window can close` (running + 12 s),
`first result` (-> first `sink:` line) and the gap between the last two; also `tuples seen`
(-> the status first shows tuples read, which lags behind: heartbeats carry the figures of
finished micro-batches). Stops the command with
Ctrl-C (SIGINT) as a user would. Binds only 127.0.0.1.

    python benchmarks/first_output.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository: `benchmarks.*`, and the project's `common`
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_util import format_table, median_of, use_repo_on_path  # noqa: E402

use_repo_on_path()

WINDOW_CLOSES_AFTER_S = 10.0 + 2.0  # hot-sensors: window size + watermark, in event time
GOAL_S = 2.0
TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(workdir: Path) -> dict[str, float]:
    """One `elastiq run`: the moments (seconds after its start) of each milestone."""
    from common.api_client import SchedulerClient
    from common.api_token import default_token_file, read_token

    port = free_port()
    argv = [sys.executable, "-m", "elastiq.cli", "run", str(ROOT / "examples" / "hot-sensors.xml"),
            "--api-port", str(port), "--no-progress", "--state-dir", str(workdir)]
    began = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            cwd=workdir, start_new_session=True)
    moments: dict[str, float] = {}
    client = None
    try:
        assert proc.stdout is not None
        while time.monotonic() - began < TIMEOUT_S and "first result" not in moments:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline().decode("utf-8", "replace")
                if line.startswith("sink:"):
                    moments["first result"] = time.monotonic() - began
                elif not line and proc.poll() is not None:
                    break
            if client is None and default_token_file(port).exists():
                client = SchedulerClient(f"http://127.0.0.1:{port}", timeout=2.0,
                                         token=read_token(default_token_file(port)))
            if client is not None and "tuples seen" not in moments:
                _observe(client, began, moments)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if "running" in moments:  # its source starts pacing when its query starts
        moments["window can close"] = moments["running"] + WINDOW_CLOSES_AFTER_S
    return moments


def _observe(client: object, began: float, moments: dict[str, float]) -> None:
    try:
        view = client.status("hot-sensors")  # type: ignore[attr-defined]
    except Exception:
        return  # not serving yet
    tasks = view.get("tasks", [])
    if tasks and all(t.get("state") == "running" for t in tasks):
        moments.setdefault("running", time.monotonic() - began)
    if any((t.get("figures") or {}).get("tuples_in", 0) > 0 for t in tasks):
        moments.setdefault("tuples seen", time.monotonic() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import tempfile

    columns = ("running", "tuples seen", "window can close", "first result")
    rows, runs = [], []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="elastiq-first-output-") as tmp:
            moments = measure(Path(tmp))
        runs.append(moments)
        gap = moments.get("first result", math.nan) - moments.get("window can close", math.nan)
        rows.append([f"run {i + 1}"] + [f"{moments.get(c, math.nan):.1f}" for c in columns]
                    + [f"{gap:+.1f}"])
    medians = {c: median_of([r.get(c, math.nan) for r in runs]) for c in columns}
    gap = medians["first result"] - medians["window can close"]
    rows.append(["median"] + [f"{medians[c]:.1f}" for c in columns] + [f"{gap:+.1f}"])
    print(format_table(("seconds after start", *columns, "result - close"), rows))
    verdict = "met" if gap <= GOAL_S else "MISSED"
    print(f"goal: first result within {GOAL_S:.0f} s of the moment its first window can close: "
          f"{verdict} (median {gap:+.1f} s); time to first result {medians['first result']:.1f} s,"
          f" of which {medians['running']:.1f} s until every task ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
