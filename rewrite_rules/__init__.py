"""Where rewrite rules live: the shipped rule files (one rule per `*.rule` file in this folder)
and an optional user folder of more rule files.

Owns locating rule files only; reading and checking them is `compiler.rules`, applying them is
`compiler.rewrite`. Rule files are data (the rule language of docs/patterns.md), never Python.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped_rule_files() -> list[Path]:
    """The rule files that ship with Elastiq, sorted by name."""
    folder = Path(str(resources.files("rewrite_rules")))
    return sorted(folder.glob("*.rule"))


def user_rule_files(folder: str | Path) -> list[Path]:
    """The `*.rule` files of a user's folder, sorted by name; a missing folder is an error."""
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(f"rule folder {path} does not exist")
    return sorted(path.glob("*.rule"))


def rule_files(user_folder: str | Path | None = None) -> list[Path]:
    """Shipped rule files, then the user's."""
    extra = user_rule_files(user_folder) if user_folder is not None else []
    return shipped_rule_files() + extra
