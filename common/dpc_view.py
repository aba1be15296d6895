"""What a reader of a sink written under Borealis DPC sees (docs/availability.md), pure: a file
sink's lines here; a marked channel's rows (a DPC task's network sink) and a Kafka sink's
records (headers and value) are first turned into the same records (`channel_records`,
`kafka_records`).

A DPC task's file sink holds plain rows (stable), rows with `_tentative: N` (written while the
union went on without a cut-off input, in episode N) and revision records `{"_revision": N}`:
the stable rows that follow one replace episode N's tentative rows. So:
- the stable view is every plain row, in file order (tentative rows are never part of it; a
  revision's rows are plain);
- the current view is the stable view plus the tentative rows of episodes not yet revised.
A DPC task's upsert log (an updating aggregate into a file sink) holds upsert records marked
the same way; either view, folded to the last record of each key (`folded`), is its table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from common import upsert_log

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


def folded(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A view as its reader wants it: an upsert log's records (a DPC task's updating aggregate
    into a file sink) folded to the last record of each key (`common.upsert_log.fold`:
    UpsertLogError where plain rows and records mix); other rows as they are."""
    every = list(rows)
    return upsert_log.fold(every) if any(upsert_log.is_record(r) for r in every) else every


def mentions_marks(lines: Iterable[str]) -> bool:
    """Whether any line may hold a DPC mark (a cheap test of the text: a reader then takes the
    marks into account; an unmarked line read that way reads the same)."""
    return any(f'"{TENTATIVE}"' in line or f'"{REVISION}"' in line for line in lines)


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
    rows of one DATA frame, with both mark columns): a batch that revises episode N starts
    with `{"_revision": N}` (its stable rows carry REVISION_MARK = N, or, in a batch without
    such a row, a correction row of its own stands for it: both marks N, no data), a
    tentative row gets `"_tentative": N`, the mark columns go. Feed the result to
    `stable_view` / `current_view`. (The reader checked the marks on arrival:
    `executor.dpc_marks.check_marks`.)"""
    out: list[dict[str, Any]] = []
    for rows in batches:
        revised = {int(r[REVISION_MARK]) for r in rows if r.get(REVISION_MARK) is not None}
        out += [{REVISION: episode} for episode in sorted(revised)]
        for row in rows:
            tentative = row.get(TENTATIVE_MARK)
            if tentative is not None and row.get(REVISION_MARK) is not None:
                continue  # a correction row: its revision is above
            plain = {k: v for k, v in row.items() if k not in (TENTATIVE_MARK, REVISION_MARK)}
            out.append(plain if tentative is None else {**plain, TENTATIVE: tentative})
    return out


# -- a Kafka sink's records (docs/kafka.md, "DPC marks on a Kafka sink")

TENTATIVE_HEADER = "elastiq-tentative"  # on a tentative record: its episode, ASCII digits
REVISION_HEADER = "elastiq-revision"  # on a correction record: the episode it replaces
MARK_HEADERS = (TENTATIVE_HEADER, REVISION_HEADER)
Headers = Sequence[tuple[str, bytes | None]]


class RecordRefused(ValueError):
    """A record whose marks or value a reader cannot take; the message says why."""


def header_value(episode: int) -> bytes:
    """The header value of `episode`: its ASCII digits."""
    if not 1 <= episode <= MAX_EPISODE:
        raise ValueError(f"episode {episode} is outside 1..{MAX_EPISODE}")
    return str(episode).encode("ascii")


def header_episode(value: bytes | None) -> int:
    """The episode a mark header's value names: ASCII digits without a leading zero, 1 to
    MAX_EPISODE; RecordRefused otherwise (nothing in it is evaluated)."""
    if value is None:
        raise RecordRefused("a mark header without a value")
    if not 1 <= len(value) <= 10 or not all(0x30 <= b <= 0x39 for b in value) \
            or value[:1] == b"0":
        raise RecordRefused(f"mark header value {value[:16]!r} is not an episode number")
    episode = int(value)
    if episode > MAX_EPISODE:
        raise RecordRefused(f"episode {episode} is outside 1..{MAX_EPISODE}")
    return episode


def record_marks(headers: Headers | None) -> tuple[int | None, int | None]:
    """(tentative episode, revised episode) of a record's headers (None: not); each mark
    header at most once, never both, no other `elastiq-` header; RecordRefused otherwise."""
    found: dict[str, int] = {}
    for name, value in headers or ():
        if not isinstance(name, str) or not name.lower().startswith("elastiq-"):
            continue  # another application's header
        if name not in MARK_HEADERS:
            raise RecordRefused(f"unknown Elastiq header {name[:40]!r}")
        if name in found:
            raise RecordRefused(f"header {name} given twice")
        found[name] = header_episode(value)
    if len(found) == 2:
        raise RecordRefused("a record both tentative and a correction")
    return found.get(TENTATIVE_HEADER), found.get(REVISION_HEADER)


def kafka_record(headers: Headers | None, value: bytes | None) -> dict[str, Any]:
    """A JSON-lines Kafka sink's record as the file sink's record: a row (with `"_tentative":
    N` under a tentative header) or a correction `{"_revision": N}`, whose value must be
    exactly that text; RecordRefused with the reason otherwise."""
    tentative, revision = record_marks(headers)
    if revision is not None:
        if value != revision_text(revision).encode("ascii"):
            raise RecordRefused(f"a correction of episode {revision} whose value is not "
                                f"{revision_text(revision)}")
        return {REVISION: revision}
    try:
        row = json.loads(value or b"")
    except (ValueError, RecursionError) as exc:
        raise RecordRefused(f"value is not JSON: {str(exc)[:80]}") from None
    if not isinstance(row, dict):
        raise RecordRefused(f"value is a JSON {type(row).__name__}, not an object")
    if TENTATIVE in row or REVISION in row:
        raise RecordRefused(f"a row with the key {TENTATIVE} or {REVISION} (marks are headers)")
    return row if tentative is None else {**row, TENTATIVE: tentative}


@dataclass(frozen=True)
class KafkaRead:
    """The records of a Kafka sink in the file sink's form, and why each other one was
    refused (its position among the records read, the reason)."""

    records: list[dict[str, Any]]
    refused: list[tuple[int, str]]


def kafka_records(messages: Iterable[tuple[Headers | None, bytes | None]]) -> KafkaRead:
    """Every (headers, value) a read_committed reader got, as records for `stable_view` /
    `current_view`; a record that does not parse is left out and named in `refused`."""
    records: list[dict[str, Any]] = []
    refused: list[tuple[int, str]] = []
    for index, (headers, value) in enumerate(messages):
        try:
            records.append(kafka_record(headers, value))
        except RecordRefused as exc:
            refused.append((index, str(exc)))
    return KafkaRead(records, refused)
