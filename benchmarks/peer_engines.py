"""The peer engines' shared machinery for the benchmarks that run them: their virtualenvs and
their job subprocesses.

Owns where a peer engine (PyFlink, bytewax) is installed (its own virtualenv under
`~/.cache/elastiq-bench/`, or $ELASTIQ_BENCH_CACHE, created with `python -m venv` and `pip
install` on first use and reused after: benchmark dependencies, never the product's), where
the job scripts live (benchmarks/peers_jobs/), and `Job`, one job script run in its own
session with its stdout scanned for `PEERS ...` markers and its whole process group killed
when it stops. Does not own any query, measurement or oracle: benchmarks/peers.py and
benchmarks/nexmark_flink.py do.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger("bench.peers")

JOBS = Path(__file__).resolve().parent / "peers_jobs"
CACHE = Path(os.environ.get("ELASTIQ_BENCH_CACHE", Path.home() / ".cache" / "elastiq-bench"))
VENVS = {"flink": ("apache-flink==2.3.0", "pyflink"), "bytewax": ("bytewax==0.21.1", "bytewax")}


def ensure_venv(engine: str) -> str:
    """The interpreter of `engine`'s virtualenv under CACHE, created and installed if missing."""
    requirement, module = VENVS[engine]
    venv = CACHE / f"venv-{engine}"
    python = venv / "bin" / "python"
    probe = [str(python), "-c", f"import {module}"]
    if python.exists() and subprocess.run(probe, capture_output=True, timeout=120).returncode == 0:
        return str(python)
    log.info("installing %s into %s (once; reused next time)", requirement, venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], check=True,
                   timeout=1800)
    subprocess.run(probe, check=True, timeout=120)
    return str(python)



# --- job subprocesses ---------------------------------------------------------------------------

class Job:
    """One engine subprocess in its own session; its stdout scanned for `PEERS ...` markers."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.started = time.time()
        self.running_at: float | None = None
        self.done = threading.Event()
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                     env={**os.environ, **(env or {})})
        self._reader = threading.Thread(target=self._scan, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _scan(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            if line.startswith("PEERS running ") and self.running_at is None:
                self.running_at = float(line.split()[2])
            elif line.startswith("PEERS done"):
                self.done.set()
        self.done.set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, first: int = signal.SIGTERM, grace: float = 30.0) -> None:
        """`first` to the job's own process (it stops what it started), SIGKILL to its whole
        process group after `grace` seconds or once it has ended."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, first)
                self.proc.wait(grace)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                log.warning("%s: still alive %.0f s after signal %s", self.name, grace, first)
        try:  # children that outlived the leader (JVMs, workers) go too
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10.0)
        except subprocess.TimeoutExpired:
            log.warning("%s: pid %s survived SIGKILL", self.name, self.proc.pid)
        self._reader.join(5.0)
        self._log.close()
