"""Time partitions of a file sink: parsing `partition-by` and naming a row's partition folders.

Owns the language of a file sink's `partition-by` (Flink and Hive's `dt=yyyy-MM-dd/hm=HH:mm`):
levels separated by `/`, each an optional NAME= and a pattern of the fields yyyy, MM, dd, HH, mm,
ss joined by the separators - _ : . (a closed set), and the folder names a timestamp (UTC
microseconds since the epoch) gets: `dt=2024-01-01`, `hm=10%3A15` (a ':' escaped as Hive and
Flink escape it in a partition path), `__DEFAULT_PARTITION__` for a null time (Flink's default
partition name). A folder name is therefore made of a checked identifier, '=', digits and those
separators, always with a digit: never empty, '.', '..', absolute, nor holding a '/'. Pure: the
compiler checks `partition-by` with it and the executor's partitioned sink
(`executor.partitioned_sink`) names folders with it; nothing here touches a file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MICROS = 1_000_000
# each field's text and the span of time (µs) within which it cannot change
FIELDS: dict[str, int] = {"yyyy": 86_400 * MICROS, "MM": 86_400 * MICROS,
                          "dd": 86_400 * MICROS, "HH": 3_600 * MICROS, "mm": 60 * MICROS,
                          "ss": MICROS}
SEPARATORS = "-_:."
ESCAPED = {":": "%3A"}  # Hive's and Flink's escaping of a partition value in a path
DEFAULT_PARTITION = "__DEFAULT_PARTITION__"  # a null time's folder (Flink's partition.default-name)
MAX_LEVELS = 6
MAX_PATTERN_CHARS = 32
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_TOKEN = re.compile("|".join(sorted(FIELDS, key=len, reverse=True)) + f"|[{re.escape(SEPARATORS)}]")


@dataclass(frozen=True)
class Level:
    """One folder level: its name (None: the folder is the value alone) and its pattern's
    tokens (fields and separators)."""

    name: str | None
    tokens: tuple[str, ...]

    @property
    def text(self) -> str:
        pattern = "".join(self.tokens)
        return pattern if self.name is None else f"{self.name}={pattern}"


@dataclass(frozen=True)
class Problem:
    """A problem of a `partition-by` text at character `offset` of it."""

    offset: int
    message: str


def parse(text: str) -> tuple[tuple[Level, ...], list[Problem]]:
    """The levels of a `partition-by` value, and every problem of it (pure): each level named
    at most once, at most MAX_LEVELS of them."""
    levels: list[Level] = []
    problems: list[Problem] = []
    start = 0
    parts = text.split("/")
    if len(parts) > MAX_LEVELS:
        problems.append(Problem(0, f"{len(parts)} levels; at most {MAX_LEVELS}"))
    seen: set[str] = set()
    for part in parts:
        level = _level(part, start, problems)
        if level is not None and level.name is not None:
            if level.name.lower() in seen:
                problems.append(Problem(start, f"level name '{level.name}' is given twice"))
            seen.add(level.name.lower())
        if level is not None:
            levels.append(level)
        start += len(part) + 1
    return tuple(levels), problems


def _level(part: str, offset: int, problems: list[Problem]) -> Level | None:
    """One level `NAME=PATTERN` or `PATTERN` found at `offset` of the whole text."""
    lead = len(part) - len(part.lstrip())
    body, at = part.strip(), offset + lead
    if not body:
        problems.append(Problem(offset, "an empty level (two '/' in a row, or one at an end)"))
        return None
    name: str | None = None
    if "=" in body:
        name, body = body.split("=", 1)
        if not NAME.match(name):
            problems.append(Problem(at, f"level name '{name[:40]}' is not a name (a letter or "
                                        "'_', then letters, digits, '_'; at most 64)"))
        at += len(name) + 1
    if len(body) > MAX_PATTERN_CHARS:
        problems.append(Problem(at, f"the pattern has {len(body)} characters; at most "
                                    f"{MAX_PATTERN_CHARS}"))
        return None
    tokens = _tokens(body, at, problems)
    if tokens is None:
        return None
    if not any(t in FIELDS for t in tokens):
        problems.append(Problem(at, f"the pattern '{body}' has no field; use "
                                    f"{', '.join(FIELDS)}"))
        return None
    return Level(name, tokens)


def _tokens(body: str, at: int, problems: list[Problem]) -> tuple[str, ...] | None:
    """The pattern's tokens; None after reporting each run of characters that are none."""
    tokens, index, bad = [], 0, False
    while index < len(body):
        m = _TOKEN.match(body, index)
        if m is None:
            end = index + 1
            while end < len(body) and _TOKEN.match(body, end) is None:
                end += 1
            problems.append(Problem(at + index, f"{body[index:end]!r} is not a field "
                                                f"({', '.join(FIELDS)}) nor a separator "
                                                f"({' '.join(SEPARATORS)})"))
            bad, index = True, end
            continue
        tokens.append(m.group())
        index = m.end()
    return None if bad else tuple(tokens)


def canonical(levels: tuple[Level, ...]) -> str:
    """The text of parsed levels (pure): what the compiler hands the executor."""
    return "/".join(level.text for level in levels)


def span_us(levels: tuple[Level, ...]) -> int:
    """The longest span of time (µs, from a multiple of it since the epoch) within which no
    folder name can change: times are grouped by it before they are named (pure)."""
    return min(FIELDS[t] for level in levels for t in level.tokens if t in FIELDS)


def folder_names(levels: tuple[Level, ...], micros: int | None) -> tuple[str, ...]:
    """The folders (one per level) of a row whose time is `micros` since the epoch, UTC (None:
    a null time, the default partition), pure. ValueError outside years 1-9999."""
    if micros is None:
        return tuple(DEFAULT_PARTITION if level.name is None
                     else f"{level.name}={DEFAULT_PARTITION}" for level in levels)
    try:
        when = EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        raise ValueError(f"time {micros} µs since the epoch is outside years 1-9999") from None
    values = {"yyyy": f"{when.year:04d}", "MM": f"{when.month:02d}", "dd": f"{when.day:02d}",
              "HH": f"{when.hour:02d}", "mm": f"{when.minute:02d}", "ss": f"{when.second:02d}"}
    names = []
    for level in levels:
        value = "".join(values.get(t) or ESCAPED.get(t, t) for t in level.tokens)
        names.append(value if level.name is None else f"{level.name}={value}")
    return tuple(names)
