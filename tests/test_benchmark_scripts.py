"""Every benchmark script still starts: `python benchmarks/X.py --help` imports it the way a
person runs it (from the repository root, with nothing on PYTHONPATH) and prints its usage.
Benchmarks are not run by the suite (benchmarks/README.md); this catches the breakage a rename
leaves behind (a helper module moved, a package shadowed) before someone wants a figure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ("bench_util.py", "__init__.py", "peer_engines.py", "nexmark_flink.py",
           "kafka_kill.py")  # scenarios of kafka.py (`--kill broker|executor`), run through it
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name not in HELPERS)


def test_the_benchmarks_are_found() -> None:
    assert {"elasticity.py", "first_output.py", "spark_hop.py", "peers.py", "kafka.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_starts_and_prints_its_usage(script: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout, done.stdout[-2000:]


def test_sigterm_runs_a_benchmarks_finally_blocks(tmp_path: Path) -> None:
    """`bench_util.exit_on_sigterm`: a benchmark killed with SIGTERM still stops what it started
    (its `finally` runs) and exits with 128 + 15."""
    marker = tmp_path / "stopped"
    script = tmp_path / "bench.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "from bench_util import exit_on_sigterm\n"
        "exit_on_sigterm()\n"
        "try:\n"
        "    print('started', flush=True)\n"
        "    time.sleep(60)\n"
        "finally:\n"
        f"    open({str(marker)!r}, 'w').write('yes')\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert marker.read_text(encoding="utf-8") == "yes"


def test_a_periodic_sampler_samples_until_it_exits_and_outlives_a_failed_sample() -> None:
    """`bench_util.Periodic`: `sample()` runs on its thread inside the `with` block only, and a
    sample that raises is logged, not the end of sampling."""
    import threading

    from benchmarks.bench_util import Periodic

    class Counting(Periodic):
        def __init__(self) -> None:
            self.calls = 0
            self.third = threading.Event()
            super().__init__(0.01, "counting")

        def sample(self) -> None:
            self.calls += 1
            if self.calls >= 3:
                self.third.set()
            if self.calls == 1:
                raise RuntimeError("the first sample fails")

    with Counting() as sampler:
        assert sampler.third.wait(30), "sampling stopped after the failed sample"
    stopped_at = sampler.calls
    assert not sampler._thread.is_alive()
    assert sampler.calls == stopped_at
