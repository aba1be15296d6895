"""The API token's file goes at any exit (issue 36, item 5): `kill -9` of `elastiq run` left it.

A real process serving the API with a fresh token (as `elastiq run` and `elastiq scheduler` do)
is sent real signals: SIGTERM, SIGINT and SIGHUP remove the file before the process ends as the
signal would have ended it; after SIGKILL (which runs no code) the file stays until the next
API starts, which removes it because its owner's process is gone. The oracle is the file system.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.api_token import (owner_file, process_identity, remove_stale_token_files,
                                 write_token_file)

ROOT = Path(__file__).resolve().parent.parent
# As started from a terminal: a test runner (or a background job) may have left SIGINT or
# SIGHUP ignored, which its children inherit.
# It then waits as a server's main loop does (elastiq's polls): in short sleeps. The kernel may
# hand a signal to any thread, and Python runs the handler in the main thread only between its
# bytecodes, so one long blocking wait there could hold the handler until it ends.
SERVE = ("import signal, time\n"
         "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
         "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
         "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
         "from scheduler.api import ApiServer\n"
         "api = ApiServer.serving(object(), port=0)\n"
         "print(api.token_file, flush=True)\n"
         "for _ in range(1200):\n"
         "    time.sleep(0.1)\n")


def _serving(state_home: Path, script: str = SERVE) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "XDG_STATE_HOME": str(state_home), "PYTHONPATH": str(ROOT)}
    env.pop("ELASTIQ_TOKEN_FILE", None)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # the process prints it once the file is written
    assert line, "the API process ended before serving"
    return proc, Path(line)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_that_runs_code_removes_the_token_file(signum: int, tmp_path: Path) -> None:
    proc, token_file = _serving(tmp_path)
    try:
        assert token_file.is_file() and owner_file(token_file).is_file()
        proc.send_signal(signum)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0  # it ended as the signal ends it
    assert not token_file.exists() and not owner_file(token_file).exists()


def test_an_ignored_signal_stays_ignored_and_keeps_the_file(tmp_path: Path) -> None:
    ignoring = SERVE.replace("signal.signal(signal.SIGHUP, signal.SIG_DFL)",
                             "signal.signal(signal.SIGHUP, signal.SIG_IGN)")
    proc, token_file = _serving(tmp_path, ignoring)
    try:
        proc.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)  # it goes on serving, as before (nohup)
        assert token_file.is_file()
        proc.terminate()
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert not token_file.exists()


def test_after_sigkill_the_next_start_removes_the_dead_process_token_file(
        tmp_path: Path) -> None:
    killed, stale = _serving(tmp_path)
    killed.kill()
    killed.wait(timeout=30)
    assert stale.is_file()  # SIGKILL runs no code
    proc, fresh = _serving(tmp_path)
    try:
        assert fresh != stale and fresh.is_file()
        assert not stale.exists() and not owner_file(stale).exists()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not fresh.exists()


def test_a_live_owner_keeps_its_file_and_a_reused_pid_does_not(tmp_path: Path) -> None:
    ours = tmp_path / "api-token-1"
    write_token_file(ours, "t0ken", owned=True)
    reused = tmp_path / "api-token-2"  # our pid, but another start time: an earlier process
    write_token_file(reused, "t0ken2")
    owner_file(reused).write_text(f"{os.getpid()}:1\n")
    unowned = tmp_path / "api-token-3"  # not ours to judge (e.g. written by --token-file users)
    write_token_file(unowned, "t0ken3")
    assert process_identity(os.getpid()) == owner_file(ours).read_text().strip()
    assert remove_stale_token_files(tmp_path) == [reused]
    assert ours.is_file() and unowned.is_file() and not reused.exists()
