"""Spark's offset and commit logs as text (pure): what a Kafka source committed.

Owns the parsers of the two files of a Spark checkpoint that tell where a stopped query's Kafka
source is: `offsets/N`, written when micro-batch N is planned (`v1`, a line of batch metadata,
then one line per source: its end offsets as JSON, or `-`), and `commits/N`, written when N
is done (`v1`, a JSON object). The end offsets of the last committed batch are the next offset
to read of each partition, which is what `common.kafka_handover` hands to a new instance. Every
file that is not exactly that shape (truncated, another log version, not JSON, several
sources, negative or non-integer offsets, hostile names) is refused with where and what
(`OffsetLogError`), never guessed. Does not own listing or reading the files
(`executor.kafka_handover`).
"""

from __future__ import annotations

import json
from typing import Any

from common.kafka_params import KafkaParamError, check_topic
from common.kafka_partitions import MAX_PARTITIONS, Partition

VERSION = "v1"  # the offset and commit log version Spark 4.x writes (OffsetSeqLog, CommitLog)
MAX_CHARS = 4 << 20  # an offset file of a few sources; larger is not one
MAX_OFFSET = 2**63 - 1


class OffsetLogError(ValueError):
    """A file of a Spark checkpoint that does not say exactly what it should."""


def source_entries(text: str, where: str) -> tuple[str | None, ...]:
    """The per-source lines of an `offsets/N` file (None for a source without offsets, `-`)."""
    lines = _lines(text, where)
    if len(lines) < 3:
        raise OffsetLogError(f"{where}: an offset file has a version line, a metadata line and "
                             f"a line per source; this one has {len(lines)} line(s) (truncated?)")
    _object(lines[1], f"{where}, line 2 (batch metadata)")
    return tuple(None if line == "-" else line for line in lines[2:])


def commit_is_whole(text: str, where: str) -> None:
    """That a `commits/N` file is whole (its version and a JSON object); OffsetLogError if
    not: a commit file cut short is no commit."""
    lines = _lines(text, where)
    if len(lines) != 2:
        raise OffsetLogError(f"{where}: a commit file is a version line and one JSON line; "
                             f"this one has {len(lines)} line(s) (truncated?)")
    _object(lines[1], f"{where}, line 2")


def kafka_offsets(entries: tuple[str | None, ...], where: str) -> dict[Partition, int]:
    """The Kafka source's end offsets, {(topic, partition): next offset}, of a task with one
    source (the instances `compiler.kafka_partitions` makes read one source each)."""
    if len(entries) != 1:
        raise OffsetLogError(f"{where}: {len(entries)} sources in the offset file; a handover "
                             "reads the offsets of a task with exactly one Kafka source")
    if entries[0] is None:
        raise OffsetLogError(f"{where}: the source has no offsets in this batch")
    at = f"{where}, line 3"
    value = _object(entries[0], at)
    offsets: dict[Partition, int] = {}
    problems: list[str] = []
    for topic, partitions in value.items():
        try:
            check_topic(topic)
        except KafkaParamError as exc:
            problems.append(str(exc))
            continue
        if not isinstance(partitions, dict) or not partitions:
            problems.append(f"the offsets of '{topic}' are not an object partition -> offset")
            continue
        for number, offset in partitions.items():
            if not (number.isascii() and number.isdigit()) or int(number) >= MAX_PARTITIONS:
                problems.append(f"'{number[:20]}' is not a partition number of '{topic}'")
            elif isinstance(offset, bool) or not isinstance(offset, int) \
                    or not 0 <= offset <= MAX_OFFSET:
                problems.append(f"offset {str(offset)[:30]} of {topic}-{number} is not a whole "
                                f"number 0..{MAX_OFFSET}")
            else:
                offsets[(topic, int(number))] = offset
    if problems:
        raise OffsetLogError(f"{at}: " + "; ".join(problems))
    if not offsets:
        raise OffsetLogError(f"{at}: no Kafka partition offsets")
    return offsets


def _lines(text: str, where: str) -> list[str]:
    if len(text) > MAX_CHARS:
        raise OffsetLogError(f"{where}: larger than {MAX_CHARS} characters: not a Spark log file")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if not lines or lines[0] != VERSION:
        first = lines[0][:20] if lines else ""
        raise OffsetLogError(f"{where}: starts with {first!r}, not {VERSION!r}: "
                             "not a Spark 4 offset or commit log file (another Spark version's "
                             "checkpoint cannot be handed over)")
    return lines


def _object(line: str, at: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        raise OffsetLogError(f"{at}: not JSON (truncated?)") from None
    if not isinstance(value, dict):
        raise OffsetLogError(f"{at}: not a JSON object")
    return value
