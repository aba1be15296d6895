"""Where a client of the scheduler API finds its bearer token, and reading it.

Clients look at `--token-file`, then `$ELASTIQ_TOKEN_FILE`, then the per-user default for the
API's port, `$XDG_STATE_HOME/elastiq/api-token-<port>` (`~/.local/state/elastiq/api-token-<port>`
when XDG_STATE_HOME is unset). Does not own making or writing a token (`scheduler.api_token`)
or the check of a request's token (`scheduler.api`).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

ENV_VAR = "ELASTIQ_TOKEN_FILE"


def state_home() -> Path:
    base = os.environ.get("XDG_STATE_HOME")
    return Path(base) if base else Path.home() / ".local" / "state"


def default_token_file(port: int) -> Path:
    """Where `elastiq scheduler` / `elastiq run` write the token of the API on `port`."""
    return state_home() / "elastiq" / f"api-token-{port}"


def url_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or 80


def token_file_for(explicit: str | None, url: str) -> Path:
    """The token file a client of the API at `url` reads: `explicit`, else $ELASTIQ_TOKEN_FILE,
    else the default for the URL's port."""
    if explicit:
        return Path(explicit)
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return default_token_file(url_port(url))


def where_to_look() -> str:
    """For refusals: how a client finds the token (no path of this machine is revealed)."""
    return ("the elastiq CLI reads it from --token-file FILE, else $ELASTIQ_TOKEN_FILE, else "
            "$XDG_STATE_HOME/elastiq/api-token-<port> (default ~/.local/state/elastiq/"
            "api-token-<port>), which `elastiq scheduler` and `elastiq run` write at start")


def read_token(path: str | Path) -> str:
    """The token in `path`; ValueError when it is empty, OSError when it cannot be read."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"{path} is empty: put the API token in it")
    return token


def read_client_token(explicit: str | None, url: str) -> str | None:
    """The token a client of `url` sends: from the file `token_file_for` names; None when that
    file is the default one and does not exist (the API's 401 then says where to look). An
    explicitly named file that cannot be read is an error."""
    path = token_file_for(explicit, url)
    if not explicit and not os.environ.get(ENV_VAR) and not path.exists():
        return None
    return read_token(path)


def read_token_file(path: str | Path | None) -> str | None:
    """The API token kept in a file (never on the command line, where `ps` shows it); None
    when no file is named."""
    return None if path is None else read_token(path)
