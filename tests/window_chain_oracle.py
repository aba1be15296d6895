"""Plain-Python oracle of chained windows ("hot items"): counts per key in sliding windows, then,
per tumbling window over those results' event time (`window_end`), the largest count and how many
results fell in it. Append mode: a window is out once its end is at most the watermark."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def window_starts(ts: datetime, size: timedelta, slide: timedelta) -> list[datetime]:
    """Every start of a window [start, start + size) on the slide grid that holds `ts`."""
    start = ts - (ts - EPOCH) % slide
    starts = []
    while start + size > ts:
        starts.append(start)
        start -= slide
    return starts


def counts(rows: list[dict[str, Any]], key: str, size: timedelta, slide: timedelta,
           closed_by: datetime) -> dict[tuple[datetime, Any], int]:
    """(window_start, key) -> tuples, for the windows whose end is at most `closed_by`."""
    found: dict[tuple[datetime, Any], int] = defaultdict(int)
    for r in rows:
        for start in window_starts(r["ts"], size, slide):
            found[(start, r[key])] += 1
    return {k: n for k, n in found.items() if k[0] + size <= closed_by}


def hot_items(first: dict[tuple[datetime, Any], int], size: timedelta, size2: timedelta,
              closed_by: datetime) -> dict[datetime, dict[str, int]]:
    """window_start of the second (tumbling) window -> {"top": largest count, "windows": how
    many first results it holds}, each first result placed by its event time, its window's end."""
    groups: dict[datetime, list[int]] = defaultdict(list)
    for (start, _), n in first.items():
        (start2,) = window_starts(start + size, size2, size2)
        groups[start2].append(n)
    return {s: {"top": max(ns), "windows": len(ns)} for s, ns in groups.items()
            if s + size2 <= closed_by}
