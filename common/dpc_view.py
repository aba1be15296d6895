"""What a reader of a file sink written under Borealis DPC sees (docs/availability.md), pure.

A DPC task's file sink holds plain rows (stable), rows with `_tentative: N` (written while the
union went on without a cut-off input, in episode N) and revision records `{"_revision": N}`:
the stable rows that follow one replace episode N's tentative rows. So:
- the stable view is every plain row, in file order (tentative rows are never part of it; a
  revision's rows are plain);
- the current view is the stable view plus the tentative rows of episodes not yet revised.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

TENTATIVE = "_tentative"
REVISION = "_revision"


def records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects of a sink's lines (blank lines skipped)."""
    return [json.loads(line) for line in lines if line.strip()]


def stable_view(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if TENTATIVE not in r and REVISION not in r]


def current_view(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    every = list(rows)
    revised = {r[REVISION] for r in every if REVISION in r}
    return [{k: v for k, v in r.items() if k != TENTATIVE} for r in every
            if REVISION not in r and r.get(TENTATIVE) not in revised]


def open_episodes(rows: Iterable[dict[str, Any]]) -> list[int]:
    """Episodes with tentative rows and no revision yet (the sink is not all stable)."""
    every = list(rows)
    revised = {r[REVISION] for r in every if REVISION in r}
    return sorted({r[TENTATIVE] for r in every if TENTATIVE in r} - revised)
