"""What a reader of a sink written under Borealis DPC sees (docs/availability.md), pure: a file
sink's lines here; a marked channel's rows (a DPC task's network sink) are first turned into
the same records (`channel_records`).

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


# -- a marked channel (a DPC task's network sink, docs/availability.md)

TENTATIVE_MARK = "__elastiq_tentative"  # the two mark columns of a marked channel's rows
REVISION_MARK = "__elastiq_revision"
MAX_EPISODE = 2**31 - 1  # episodes are numbered from 1


def revision_text(episode: int) -> str:
    """A revision record as the file sink writes it (and a Kafka correction's value)."""
    return json.dumps({REVISION: episode}, separators=(",", ":"))


def channel_records(batches: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What a file sink would hold, from a marked channel's batches in seq order (each the
    rows of one DATA frame, with both mark columns): a batch whose rows revise episode N
    starts with `{"_revision": N}`, a tentative row gets `"_tentative": N`, the mark columns
    go. Feed the result to `stable_view` / `current_view`. (The reader checked the marks on
    arrival: `executor.dpc_marks.check_marks`.)"""
    out: list[dict[str, Any]] = []
    for rows in batches:
        revised = {int(r[REVISION_MARK]) for r in rows if r.get(REVISION_MARK) is not None}
        out += [{REVISION: episode} for episode in sorted(revised)]
        for row in rows:
            tentative = row.get(TENTATIVE_MARK)
            plain = {k: v for k, v in row.items() if k not in (TENTATIVE_MARK, REVISION_MARK)}
            out.append(plain if tentative is None else {**plain, TENTATIVE: tentative})
    return out

