"""Every benchmark script still starts: `python benchmarks/X.py --help` imports it the way a
person runs it (from the repository root, with nothing on PYTHONPATH) and prints its usage.
Benchmarks are not run by the suite (benchmarks/README.md); this catches the breakage a rename
leaves behind (a helper module moved, a package shadowed) before someone wants a figure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")
                 if p.name not in ("bench_util.py", "__init__.py"))


def test_the_benchmarks_are_found() -> None:
    assert {"elasticity.py", "first_output.py", "spark_hop.py", "peers.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_starts_and_prints_its_usage(script: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout, done.stdout[-2000:]
