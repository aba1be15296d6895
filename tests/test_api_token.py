"""The API token's file: made with mode 0600 in a 0700 folder, found by the CLI without flags
(--token-file, then $ELASTIQ_TOKEN_FILE, then the per-user default for the port), removed when
the API that wrote it stops; and the CLI talking to a real API with it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from common.api_client import RequestRejected, SchedulerClient
from common.api_token import default_token_file, read_client_token, token_file_for
from scheduler.api import ApiServer
from scheduler.api_token import write_token_file
from scheduler.loop import SchedulerLoop

ROOT = Path(__file__).resolve().parent.parent


def test_the_token_file_is_private_even_with_an_open_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = tmp_path / "state" / "elastiq" / "api-token-1"
        write_token_file(path, "t0ken")
        write_token_file(path, "t0ken2")  # replaced, still private
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == "t0ken2\n"
    assert [p.name for p in path.parent.iterdir()] == ["api-token-1"]  # no temp file left


def test_where_clients_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ELASTIQ_TOKEN_FILE", raising=False)
    assert default_token_file(8123) == tmp_path / "xdg" / "elastiq" / "api-token-8123"
    assert token_file_for(None, "http://127.0.0.1:8123") == default_token_file(8123)
    assert read_client_token(None, "http://127.0.0.1:8123") is None  # none yet: the API says
    monkeypatch.setenv("ELASTIQ_TOKEN_FILE", str(tmp_path / "env-token"))
    assert token_file_for(None, "http://127.0.0.1:8123") == tmp_path / "env-token"
    assert token_file_for(str(tmp_path / "flag"), "http://x:1") == tmp_path / "flag"
    with pytest.raises(OSError):  # a named file that is missing is an error, not "no token"
        read_client_token(None, "http://127.0.0.1:8123")
    (tmp_path / "flag").write_text("  \n")
    with pytest.raises(ValueError):
        read_client_token(str(tmp_path / "flag"), "http://x:1")


def test_serving_writes_a_fresh_token_the_client_finds_and_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ELASTIQ_TOKEN_FILE", raising=False)
    loop = SchedulerLoop(tick_interval=0.05).start()
    first = ApiServer.serving(loop)
    second = ApiServer.serving(loop)
    try:
        assert first.token != second.token and len(first.token) >= 32
        assert first.token_file == default_token_file(first.port)
        assert stat.S_IMODE(first.token_file.stat().st_mode) == 0o600
        for api in (first, second):
            token = read_client_token(None, api.url)
            assert token == api.token
            assert SchedulerClient(api.url, timeout=5, token=token).status() == {"queries": []}
        with pytest.raises(RequestRejected) as refused:
            SchedulerClient(first.url, timeout=5, token=second.token).status()
        assert refused.value.status == 401
    finally:
        first.stop()
        second.stop()
        loop.stop()
    assert not first.token_file.exists() and not second.token_file.exists()


def test_a_known_token_file_is_used_and_left_alone(tmp_path: Path) -> None:
    known = tmp_path / "token"
    known.write_text("operator-chosen-token\n")
    loop = SchedulerLoop(tick_interval=0.05).start()
    api = ApiServer.serving(loop, token_file=str(known))
    try:
        assert api.token == "operator-chosen-token" and api.token_file == known
        client = SchedulerClient(api.url, timeout=5,
                                 token=read_client_token(str(known), api.url))
        assert client.status() == {"queries": []}
    finally:
        api.stop()
        loop.stop()
    assert known.exists()


def _elastiq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastiq.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=60)


def test_the_cli_finds_the_token_without_flags(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ELASTIQ_TOKEN_FILE", raising=False)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    loop = SchedulerLoop(tick_interval=0.05).start()
    api = ApiServer.serving(loop)
    try:
        found = _elastiq(env, "status", "--scheduler", api.url)
        assert found.returncode == 0 and "no queries" in found.stdout, found.stderr
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token\n")
        refused = _elastiq({**env, "ELASTIQ_TOKEN_FILE": str(wrong)}, "status", "--scheduler",
                           api.url)
        assert refused.returncode == 1 and "refused (401)" in refused.stderr
        assert "ELASTIQ_TOKEN_FILE" in refused.stderr
        flag = _elastiq({**env, "ELASTIQ_TOKEN_FILE": str(wrong)}, "status", "--scheduler",
                        api.url, "--token-file", str(api.token_file))
        assert flag.returncode == 0, flag.stderr
    finally:
        api.stop()
        loop.stop()
