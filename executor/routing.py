"""Where a splitter sends each row: its routing schedule, and how a rescale changes it.

Owns `Schedule` (the number of instances routed to, from which event time on: a stateless
operator's schedule has one entry, replaced at a micro-batch boundary; a stateful one's grows
an entry at each rescale, switching at the first window boundary after every row routed so far,
so every window stays whole on the instance that had it), the pure functions over it (a row's
partition from its key hash and event time, the event time of a switch, the slots a scale-in
retires that still need "ticks" so their watermark passes the switch, rows too late to route),
and the schedule's file next to the task's checkpoint, so a restarted splitter routes as before.
Does not own hashing (Spark's Murmur3, in the query) nor sending (`executor.sinks`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from common.atomic_file import replace_file

# (from_ms, n): from event time `from_ms` on (None: from the start), rows go to n instances
Entry = tuple[int | None, int]


@dataclass(frozen=True)
class Switch:
    """A stateful splitter's event-time switch: its time column, window size, how long after a
    switch it keeps ticking the instances a scale-in retires and the window's slide (ms; the
    size for a tumbling window)."""

    time: str
    window_ms: int
    horizon_ms: int
    slide_ms: int = 0  # 0: tumbling (the slide is the size)
    # a join's right input: a row meets left rows up to this far from its time, so it goes to
    # every instance owning a time within it; its switch time is the scheduler's (`planned`)
    spread_ms: int = 0
    planned: bool = False  # a join's splitters switch at the time the scheduler chose

    @classmethod
    def of(cls, time: str, numbers: Sequence[int], planned: bool = False) -> Switch:
        """From a splitter's `switch` parameter: after the time column, the window size and
        horizon, then optionally the slide and the spread (ms)."""
        window_ms, horizon_ms, *rest = numbers
        slide_ms, spread_ms = (*rest, 0, 0)[:2]
        return cls(time, window_ms, horizon_ms, slide_ms, spread_ms, planned)

    @property
    def slide(self) -> int:
        return self.slide_ms or self.window_ms

    @property
    def sliding(self) -> bool:
        return self.slide < self.window_ms


@dataclass
class Schedule:
    """The routing in force: entries ordered by `from_ms`, the first from the start; and the
    largest event time routed so far (ms; None before any row)."""

    entries: list[Entry] = field(default_factory=list)
    max_seen: int | None = None
    ticks: int = 0  # micro-batches that ticked the partitions the last switch retires

    @property
    def active(self) -> int:
        return self.entries[-1][1]

    def to_json(self) -> dict:
        return {"entries": [list(e) for e in self.entries], "max_seen": self.max_seen,
                "ticks": self.ticks}

    @classmethod
    def from_json(cls, d: dict) -> "Schedule":
        entries = [(None if e[0] is None else int(e[0]), int(e[1])) for e in d["entries"]]
        if not entries or entries[0][0] is not None or any(n < 1 for _, n in entries):
            raise ValueError(f"not a routing schedule: {d!r}")
        seen = d.get("max_seen")
        return cls(entries, None if seen is None else int(seen), int(d.get("ticks", 0)))


def switch_time(max_seen: int | None, slide_ms: int) -> int | None:
    """The first window start after every row routed so far (None: nothing routed yet, so the
    new routing may take over at once): no row routed before the switch lies in a window that
    starts at or after it."""
    if max_seen is None:
        return None
    return (max_seen // slide_ms + 1) * slide_ms


def rescaled(schedule: Schedule, n: int, switch: Switch | None) -> tuple[Schedule, int | None]:
    """The schedule after a change to `n` instances, and the event time it switches at (None:
    at once, from the next micro-batch, which a stateless operator or one that has routed
    nothing yet can afford)."""
    at = switch_time(schedule.max_seen, switch.slide) if switch is not None else None
    if switch is None or at is None:
        return Schedule([(None, n)], schedule.max_seen), None
    last_from = schedule.entries[-1][0]
    if last_from is not None and at <= last_from:  # the last switch is still ahead: keep it,
        at = last_from + switch.slide                # so the instances it added own a span
    entries = [e for e in schedule.entries if e[0] is None or e[0] < at] + [(at, n)]
    return Schedule(entries, schedule.max_seen, 0), at


def spans(schedule: Schedule) -> list[tuple[int | None, int | None, int]]:
    """Each entry as (from, until, n): n instances from event time `from` (None: the start)
    until `until` (None: no end)."""
    ends = [e[0] for e in schedule.entries[1:]] + [None]
    return [(start, until, n) for (start, n), until in zip(schedule.entries, ends)]


def rescaled_at(schedule: Schedule, n: int, at: int, reach_ms: int) -> Schedule:
    """The schedule after a change to `n` instances from event time `at` on, a time the
    scheduler chose for every splitter of a join; ValueError when this splitter routed a row
    whose time plus `reach_ms` (its spread) is at or after `at` already (that row went to the
    old instances only, and a new one would miss it)."""
    if schedule.max_seen is not None and schedule.max_seen + reach_ms >= at:
        raise ValueError(f"event time already reached {schedule.max_seen} ms (+{reach_ms} ms "
                         f"of join bound), at or past the planned switch {at} ms")
    last_from = schedule.entries[-1][0]
    if last_from is not None and at <= last_from:
        raise ValueError(f"the planned switch {at} ms is not after the last one, {last_from} ms")
    entries = [e for e in schedule.entries if e[0] is None or e[0] < at] + [(at, n)]
    return Schedule(entries, schedule.max_seen, 0)


def spread_partitions(hashes: np.ndarray, times: np.ndarray, schedule: Schedule,
                      spread_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """A join's right rows: (row index, partition) pairs, each row once per distinct instance
    owning a time within `spread_ms` of it (pmod(hash, n) with the n in force at that time).
    A left row goes to the owner at its own time only, so each pair (left, right) meets on
    exactly one instance, the left row's."""
    hashes = hashes.astype(np.int64)
    times = times.astype(np.int64)
    candidates = []
    for start, until, n in spans(schedule):
        mask = np.ones(len(times), dtype=bool)
        if start is not None:
            mask &= times + spread_ms >= start
        if until is not None:
            mask &= times - spread_ms < until
        index = np.flatnonzero(mask)
        candidates.append(np.stack([index, np.mod(hashes[index], n)], axis=1))
    pairs = np.unique(np.concatenate(candidates), axis=0)
    return pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)


def partitions(hashes: np.ndarray, times: np.ndarray | None, schedule: Schedule) -> np.ndarray:
    """Each row's partition (0-based): pmod(hash, n) with the n in force at its event time
    (the last entry's for rows without one)."""
    if times is None or len(schedule.entries) == 1:
        return np.mod(hashes.astype(np.int64), schedule.active)
    starts = np.array([e[0] for e in schedule.entries[1:]], dtype=np.int64)
    counts = np.array([n for _, n in schedule.entries], dtype=np.int64)
    scheme = np.searchsorted(starts, times, side="right")
    return np.mod(hashes.astype(np.int64), counts[scheme])


def folded(rows: int, partitions: int) -> np.ndarray:
    """Every row to the last partition (0-based `partitions - 1`): the splitter of an operator
    folded into its merger's task, while no instance of its own runs (active 0)."""
    return np.full(rows, partitions - 1, dtype=np.int64)


@dataclass(frozen=True)
class Copies:
    """Where a sliding window's splitter sends each row: `rows` indexes the batch (a row may
    appear more than once), `parts` the partition of each copy, and [`lo`, `hi`) the window
    starts (ms) that copy counts for (`UNBOUNDED` on either side: no bound)."""

    rows: np.ndarray
    parts: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


UNBOUNDED = np.iinfo(np.int64).min  # the marker of a missing window-start bound


def sliding_copies(hashes: np.ndarray, times: np.ndarray, schedule: Schedule,
                   window_ms: int, slide_ms: int) -> Copies:
    """The copies of a batch's rows under a sliding window's schedule. A window (key, start s)
    belongs to the instance pmod(hash, n) with the n in force at s. A row lies in the windows
    starting in (t - window, t], and near a switch those starts fall under two entries or more:
    the row then goes to each entry's instance, bounded to that entry's window starts, and each
    instance aggregates a copy only into the windows of its bounds. So every window is whole on
    its one instance, and no window counts a row twice (the bounds of a row's copies are
    disjoint). Away from a switch a row has one copy, unbounded."""
    hashes = hashes.astype(np.int64)
    times = times.astype(np.int64)
    first = (np.floor_divide(times - window_ms, slide_ms) + 1) * slide_ms  # earliest start
    last = np.floor_divide(times, slide_ms) * slide_ms  # latest start
    rows, parts, lo, hi = [], [], [], []
    for start, until, n in spans(schedule):
        mask = np.ones(len(times), dtype=bool)
        if start is not None:
            mask &= last >= start
        if until is not None:
            mask &= first < until
        index = np.flatnonzero(mask)
        rows.append(index)
        parts.append(np.mod(hashes[index], n))
        lo.append(np.where(first[index] < start, start, UNBOUNDED) if start is not None
                  else np.full(len(index), UNBOUNDED, dtype=np.int64))
        hi.append(np.where(last[index] >= until, until, UNBOUNDED) if until is not None
                  else np.full(len(index), UNBOUNDED, dtype=np.int64))
    return Copies(*(np.concatenate(a).astype(np.int64) for a in (rows, parts, lo, hi)))


MIN_TICKS = 5  # a switch ticks its retiring partitions in at least this many micro-batches


def ticked(schedule: Schedule, horizon_ms: int) -> list[int]:
    """Partitions that get a tick this batch: those the entry before the last routed to and
    the last does not (the last switch was a scale-in and retires them), in MIN_TICKS
    micro-batches and until event time passes that switch by `horizon_ms` (a source catching
    up can cross the horizon in one batch); ticks advance their watermark, so they emit the
    windows before the switch."""
    last_from = schedule.entries[-1][0]
    if last_from is None or len(schedule.entries) < 2 or schedule.max_seen is None or (
            schedule.max_seen >= last_from + horizon_ms and schedule.ticks >= MIN_TICKS):
        return []
    return list(range(schedule.active, schedule.entries[-2][1]))


def too_late(parts: np.ndarray, times: np.ndarray, schedule: Schedule,
             horizon_ms: int) -> np.ndarray:
    """Rows bound for a partition the schedule no longer routes to that are older than the
    horizon behind the latest event time: their instance retired once its watermark passed
    them, so they are late for it as for any window (dropped, as Spark drops late rows)."""
    if schedule.max_seen is None:
        return np.zeros(len(parts), dtype=bool)
    return (parts >= schedule.active) & (times < schedule.max_seen - horizon_ms)


def load(path: str) -> Schedule | None:
    """The schedule a splitter persisted at `path`, None when there is none or it is not one
    (then the program's routing is taken; a damaged file is replaced at the next batch)."""
    try:
        with open(path, encoding="utf-8") as f:
            return Schedule.from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def save(path: str, schedule: Schedule) -> None:
    """Write the schedule atomically (temporary file, then rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, json.dumps(schedule.to_json()))
