"""The scheduler service as an operator uses it: `elastiq scheduler` in its own process, then
`submit`, `status`, `tail` and `stop` from the command line, and Ctrl-C ending everything.

The query is the paper's example (replay of examples/data/numbers.jsonl, filter x < 42); the sink
is compared with the same filter computed in plain Python over the input file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bad_token(tmp_path: Path) -> Path:
    path = tmp_path / "wrong-token"
    path.write_text("not-the-token\n")
    return path


def _elastiq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastiq.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def _oracle(numbers: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in numbers.read_text().splitlines()]
    return [r for r in rows if r["x"] < 42]


def _sink_rows(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _same_rows(rows: list[dict[str, object]], expected: list[dict[str, object]]) -> bool:
    """Same multiset of (x, instant) pairs; timestamps compared as instants."""
    def key(r: dict[str, object]) -> tuple[int, str]:
        ts = str(r["ts"]).replace("Z", "").ljust(26, "0") if "." in str(r["ts"]) else \
            str(r["ts"]).replace("Z", "") + ".000000"
        return int(r["x"]), ts  # type: ignore[arg-type]
    return sorted(map(key, rows)) == sorted(map(key, expected))


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(240)
def test_scheduler_submit_status_tail_stop_from_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI finds the token the scheduler wrote without any flag."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))  # the token's default home
    monkeypatch.delenv("ELASTIQ_TOKEN_FILE", raising=False)
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "examples" / "paper-filter.xml", tmp_path / "spec.xml")
    shutil.copy(ROOT / "examples" / "data" / "numbers.jsonl", tmp_path / "data" / "numbers.jsonl")
    expected = _oracle(tmp_path / "data" / "numbers.jsonl")
    url = f"http://127.0.0.1:{_free_port()}"
    token_file = tmp_path / "xdg" / "elastiq" / f"api-token-{url.rsplit(':', 1)[1]}"
    log = open(tmp_path / "scheduler.log", "w")
    service = subprocess.Popen(
        [sys.executable, "-m", "elastiq.cli", "scheduler", "--listen", url[len("http://"):],
         "--state-dir", str(tmp_path / "state"), "--path-root", str(tmp_path)],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        wait_for("the scheduler's API",
                 lambda: _elastiq("status", "--scheduler", url).returncode == 0, 60, 0.5)
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        denied = _elastiq("status", "--scheduler", url, "--token-file", str(bad_token(tmp_path)))
        assert denied.returncode == 1 and "refused (401)" in denied.stderr
        bad = tmp_path / "bad.xml"
        bad.write_text('<dataflow name="bad">\n  <operator name="a" type="nope"/>\n</dataflow>\n')
        refused = _elastiq("submit", "--scheduler", url, str(bad))
        assert refused.returncode == 1
        assert f"{bad}:2:28: error: unknown operator type 'nope'" in refused.stderr

        submitted = _elastiq("submit", "--scheduler", url, str(tmp_path / "spec.xml"))
        assert submitted.returncode == 0, submitted.stderr
        assert "paper-filter accepted" in submitted.stdout

        sink = tmp_path / "out" / "paper-filter.jsonl"
        wait_for("the sink to match the oracle", lambda: _same_rows(_sink_rows(sink), expected),
                 150, 0.5)
        status = _elastiq("status", "--scheduler", url, "paper-filter")
        assert status.returncode == 0 and "paper-filter.t0" in status.stdout, status.stderr

        tail_proc = subprocess.Popen([sys.executable, "-m", "elastiq.cli", "tail", "--scheduler",
                                      url, "paper-filter", "sink", "--from-start"],
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            first = [tail_proc.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
        finally:
            tail_proc.send_signal(signal.SIGINT)
            tail_proc.wait(timeout=10)
        assert [json.loads(line) for line in first] == _sink_rows(sink)[:3]

        stopped = _elastiq("stop", "--scheduler", url, "paper-filter")
        assert stopped.returncode == 0 and "stopping" in stopped.stdout
        wait_for("the query to stop", lambda: "stopped" in _elastiq(
            "status", "--scheduler", url, "paper-filter").stdout, 60, 0.5)

        # a spec whose sink lies outside the scheduler's roots: the scheduler compiles it with
        # its own roots (the client's folder only resolves relative paths) and refuses it with
        # the sink's file:line:column; nothing reaches an executor, no file appears
        outside = tmp_path.parent / f"{tmp_path.name}-outside"
        spec = (tmp_path / "spec.xml").read_text().replace(
            "out/paper-filter.jsonl", str(outside / "escaped.jsonl")).replace(
            'name="paper-filter"', 'name="escape"')
        (tmp_path / "escape.xml").write_text(spec)
        refused = _elastiq("submit", "--scheduler", url, str(tmp_path / "escape.xml"))
        assert refused.returncode != 0, refused.stdout
        assert "outside the allowed folders" in refused.stderr, refused.stderr
        line = next(i for i, text in enumerate(spec.splitlines(), 1) if "escaped.jsonl" in text)
        assert f"escape.xml:{line}:" in refused.stderr, refused.stderr
        assert "escape" not in _elastiq("status", "--scheduler", url).stdout
        assert not outside.exists()
    finally:
        service.send_signal(signal.SIGINT)
        try:
            code = service.wait(timeout=60)
        finally:
            if service.poll() is None:
                os.killpg(service.pid, signal.SIGKILL)
            log.close()
    assert code == 0, (tmp_path / "scheduler.log").read_text()[-2000:]
    assert not token_file.exists()  # removed with the API that wrote it
    wait_for("every executor process to end", lambda: not _processes_under(tmp_path), 30, 0.5)


def _processes_under(folder: Path) -> list[int]:
    """Processes whose command line or working directory mentions the test's folder."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if str(folder) in cmd or cwd.startswith(str(folder)):
            found.append(int(pid))
    return found
