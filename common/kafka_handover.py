"""The offset handover of a rescaled Kafka-fed operator (pure): which partitions each new
instance reads and from which offsets.

Owns `handover`: given the sorted (topic, partition) list the instances share, the old instance
count k_old, the end offsets of each old instance's last committed micro-batch (per partition
of its block; None for an instance that never committed a batch) and the new count k_new, it
gives each new instance its block (`common.kafka_partitions.block`, the same contiguous blocks
a first start takes) and a Spark `startingOffsets` JSON: a partition's offset is exactly the
one its old owner committed (the next offset to read), or, for a partition whose old owner
never committed, the source's own starting offset (earliest -2, latest -1, or the spec's
per-partition value). Every partition goes to exactly one new instance. Everything that does
not fit (a bad count, offsets of a partition outside the instance's block or unknown, a
negative or huge offset, an instance whose offsets miss part of its block) is refused with
every problem at once (`HandoverError`), never guessed. docs/kafka.md ("Rescaling a Kafka-fed
operator") says the protocol around it. Does not own reading the offsets from a Spark
checkpoint (`common.spark_offset_log`) nor stopping and starting instances
(`executor.kafka_handover`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

from common import kafka_partitions
from common.kafka_params import KafkaParamError, parse_starting_offsets
from common.kafka_partitions import (KafkaShareError, Partition, block, check_share,
                                     starting_offsets_for)

MAX_OFFSET = 2**63 - 1  # Kafka's offsets are signed 64-bit
Offsets = Mapping[Partition, int]


class HandoverError(KafkaShareError):
    """A handover that cannot be computed exactly; the message lists every problem."""


@dataclass(frozen=True)
class NewInstance:
    """Instance `share` of `shares` after the rescale: its block and Spark's startingOffsets."""

    share: int
    shares: int
    block: tuple[Partition, ...]
    starting_offsets: str  # {"topic": {"partition": offset}} as canonical JSON


def handover(partitions: Sequence[Partition], k_old: int,
             committed: Sequence[Offsets | None], k_new: int, starting: str | None,
             where: str = "") -> tuple[NewInstance, ...]:
    """The new instances 1..k_new (pure). `committed[i-1]` holds old instance i's end offsets
    of its last committed batch, for every partition of its block, or None if it never
    committed one; `starting` is the source's starting offsets (earliest, latest or
    per-partition JSON; None for a source that starts at a timestamp, whose never-read
    partitions cannot be given an offset: refused). HandoverError lists every problem."""
    at = f"{where}: " if where else ""
    listed = _listed(partitions, at)
    problems = _count_problems(len(listed), k_old, k_new, len(committed))
    if not problems:
        problems += [p for i, c in enumerate(committed, 1)
                     for p in _offset_problems(listed, i, k_old, c)]
    default = None if problems else _default(starting, listed, committed, k_old)
    if isinstance(default, str):
        problems.append(default)
    if problems:
        raise HandoverError(at + "; ".join(problems))
    assert isinstance(default, dict)
    carried = dict(default)
    for offsets in committed:
        carried.update(offsets or {})
    return tuple(NewInstance(i, k_new, blk, offsets_json({p: carried[p] for p in blk}))
                 for i in range(1, k_new + 1)
                 for blk in [tuple(listed[j] for j in block(len(listed), i, k_new))])


def _listed(partitions: Sequence[Partition], at: str) -> list[Partition]:
    """The sorted, distinct, checked partition list (HandoverError for a bad name or number)."""
    try:
        checked = kafka_partitions.assign(partitions, 1, 1) if partitions else ()
    except KafkaShareError as exc:
        raise HandoverError(f"{at}{exc}") from None
    if not checked:
        raise HandoverError(f"{at}the topic has no partitions to hand over")
    return list(checked)


def _count_problems(n: int, k_old: int, k_new: int, given: int) -> list[str]:
    problems = []
    for name, k in (("old", k_old), ("new", k_new)):
        try:
            check_share(1, k)
        except KafkaShareError as exc:
            problems.append(f"{name} instance count: {exc}")
            continue
        if k > n:
            problems.append(f"{k} {name} instances for {n} partition(s): an instance would read "
                            f"nothing; at most {n}")
    if not problems and given != k_old:
        problems.append(f"offsets of {given} old instance(s) given for {k_old}")
    return problems


def _offset_problems(listed: list[Partition], share: int, shares: int,
                     offsets: Offsets | None) -> list[str]:
    """What is wrong with old instance `share`'s committed offsets (pure)."""
    if offsets is None:
        return []
    at = f"old instance {share} of {shares}"
    if not isinstance(offsets, Mapping):
        return [f"{at}: offsets are not a partition -> offset map"]
    own = [listed[j] for j in block(len(listed), share, shares)]
    problems = [f"{at}: {_name(p)} is not one of its partitions ({_span(own)})"
                for p in sorted(set(offsets) - set(own), key=repr)]
    problems += [f"{at}: offset {offsets[p]!r} of {_name(p)} is not a whole number "
                 f"0..{MAX_OFFSET}" for p in sorted(set(offsets) & set(own))
                 if not _good_offset(offsets[p])]
    missing = [p for p in own if p not in offsets]
    if missing:
        problems.append(f"{at}: committed offsets without {', '.join(map(_name, missing[:5]))}"
                        f"{' ...' if len(missing) > 5 else ''} of its block: its checkpoint is "
                        "not of this assignment")
    return problems


def _good_offset(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_OFFSET


def _default(starting: str | None, listed: list[Partition], committed: Sequence[Offsets | None],
             k_old: int) -> dict[Partition, int] | str:
    """The starting offset of each partition whose old owner never committed; a problem text
    when there is no exact one (a timestamp start, bad JSON)."""
    never = [listed[j] for i, c in enumerate(committed, 1) if c is None
             for j in block(len(listed), i, k_old)]
    if not never:
        return {}
    if starting is None:
        return (f"{_span(never)} were never read by their old instance and the source starts at "
                "a timestamp: no offset to hand over; let every old instance commit a batch "
                "first")
    try:
        canonical = parse_starting_offsets(starting)
    except KafkaParamError as exc:
        return f"starting offsets: {exc}"
    cut = json.loads(starting_offsets_for(canonical, never)) if canonical not in (
        "earliest", "latest") else {}
    value = {"earliest": -2, "latest": -1}.get(canonical)
    return {(t, p): int(cut[t][str(p)]) if value is None else value for t, p in never}


def offsets_json(offsets: Mapping[Partition, int]) -> str:
    """Spark's per-partition startingOffsets: {"topic": {"partition": offset}}, canonical."""
    by_topic: dict[str, dict[str, int]] = {}
    for (topic, number), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, {})[str(number)] = offset
    return json.dumps(by_topic, sort_keys=True, separators=(",", ":"))


def _name(p: object) -> str:
    if isinstance(p, tuple) and len(p) == 2:
        return f"{str(p[0])[:60]}-{str(p[1])[:20]}"
    return repr(p)[:80]


def _span(ps: Sequence[Partition]) -> str:
    shown = ", ".join(_name(p) for p in ps[:4])
    return shown + (f" ... ({len(ps)} partitions)" if len(ps) > 4 else "")

