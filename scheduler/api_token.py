"""The scheduler API's bearer token: made at start, kept in a file only its user can read, found
by the CLI without flags.

Owns making a token (`secrets`), writing it to a file created with mode 0600 in a folder of mode
0700 (never readable by others, not even for a moment), and removing it: when the API stops, at
any exit that runs code (`ExitCleanup`: atexit and SIGTERM, SIGINT, SIGHUP), and, for an exit
that runs none (SIGKILL), at the next start (`remove_stale_token_files`: each token file we
write has an `.owner` file beside it naming its process, pid and start time, so a pid reused
by another process does not keep a dead owner's file). Where clients look for it and reading it
back is `common.api_token`. Does not own the check of a request's token (`scheduler.api`).
"""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Callable

from common.api_token import read_token
from common.atomic_file import replace_file


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def write_token_file(path: Path, token: str, owned: bool = False) -> None:
    """Write `token` to `path` with mode 0600 (created so, then renamed into place); the folder
    is created with mode 0700 when missing. `owned`: this process is its owner (`.owner`), so
    the next start removes it once this process is gone."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if owned:
        replace_file(owner_file(path), f"{process_identity(os.getpid())}\n", mode=0o600)
    replace_file(path, token + "\n", mode=0o600)


def remove_token_file(path: Path, token: str) -> None:
    """Remove `path` (and its `.owner`) if it still holds `token` (another scheduler may have
    replaced it)."""
    try:
        if read_token(path) == token:
            path.unlink()
            owner_file(path).unlink(missing_ok=True)
    except (OSError, ValueError):
        pass


def owner_file(path: Path) -> Path:
    return path.with_name(path.name + ".owner")


def process_identity(pid: int) -> str | None:
    """`pid:start` for a live process (start: its start time in clock ticks since boot, from
    /proc; `?` on a system without /proc), None when no process has that pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if Path("/proc/self/stat").exists():
            return None
        return f"{pid}:?" if _alive(pid) else None
    return f"{pid}:{stat.rsplit(')', 1)[1].split()[19]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_token_files(folder: Path) -> list[Path]:
    """Remove the token files in `folder` whose owner process is gone (killed by a signal that
    runs no code); the ones removed."""
    removed = []
    for owner in sorted(folder.glob("api-token-*.owner")):
        try:
            identity = owner.read_text(encoding="utf-8").strip()
            pid = int(identity.split(":", 1)[0])
        except (OSError, ValueError):
            continue
        if process_identity(pid) == identity:
            continue
        token = owner.with_name(owner.name[:-len(".owner")])
        token.unlink(missing_ok=True)
        owner.unlink(missing_ok=True)
        removed.append(token)
    return removed


Handler = Callable[[int, FrameType | None], Any] | int | None


class ExitCleanup:
    """Runs `remove` at any exit of this process that runs code: at interpreter exit (atexit)
    and on SIGTERM, SIGINT and SIGHUP, after which the signal has the effect it had before (the
    previous handler is called; a default action is taken again by re-sending the signal; a
    signal the process ignores stays ignored).
    Signal handlers are installed only from the main thread (Python allows no other);
    `uninstall` puts back those still ours."""

    def __init__(self, remove: Callable[[], None]):
        self._remove = remove
        self._previous: dict[int, Handler] = {}

    def install(self) -> "ExitCleanup":
        atexit.register(self._remove)
        if threading.current_thread() is threading.main_thread():
            for signum in EXIT_SIGNALS:
                previous = signal.getsignal(signum)
                if previous != signal.SIG_IGN:  # an ignored signal ends nothing
                    self._previous[signum] = previous
                    signal.signal(signum, self._on_signal)
        return self

    def uninstall(self) -> None:
        atexit.unregister(self._remove)
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._remove()
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:  # the default action: end as the signal would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
