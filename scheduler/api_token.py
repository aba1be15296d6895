"""The scheduler API's bearer token: made at start, kept in a file only its user can read, found
by the CLI without flags.

Owns making a token (`secrets`), writing it to a file created with mode 0600 in a folder of mode
0700 (never readable by others, not even for a moment), and removing it. Where clients look for
it and reading it back is `common.api_token`. Does not own the check of a request's token
(`scheduler.api`).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from common.api_token import read_token
from common.atomic_file import replace_file


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, token: str) -> None:
    """Write `token` to `path` with mode 0600 (created so, then renamed into place); the folder
    is created with mode 0700 when missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_file(path, token + "\n", mode=0o600)


def remove_token_file(path: Path, token: str) -> None:
    """Remove `path` if it still holds `token` (another scheduler may have replaced it)."""
    try:
        if read_token(path) == token:
            path.unlink()
    except (OSError, ValueError):
        pass
