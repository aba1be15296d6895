"""Which Kafka partitions each instance of a partitioned operator reads (pure).

Owns the assignment of a topic's partitions to the k instances of a stateless operator that
reads a `kafka-source` directly (`compiler.kafka_partitions` puts one copy of the source into
each instance's task, with `share` i of `shares` k): contiguous blocks of the sorted
(topic, partition) list, instance i taking positions floor((i-1)N/k) .. floor(iN/k)-1, so every
partition goes to exactly one instance and the blocks differ in size by at most 1. Also the
JSON of Spark's `assign` option for a block, per-partition starting offsets cut down to a block
(Spark refuses offsets for partitions a source does not read), and the located refusals of bad
values. docs/kafka.md ("Partitions read in parallel") says why contiguous. Does not own
reading the partition count (`executor.kafka_io`, at the task's start).
"""

from __future__ import annotations

import json
from typing import Sequence

from common.kafka_params import KafkaParamError, check_topic

MAX_SHARES = 64  # compiler.validate.MAX_PARALLELISM
MAX_PARTITIONS = 1_000_000  # a topic's partitions; common.kafka_params refuses larger numbers

Partition = tuple[str, int]  # (topic, partition number)
# an instance's copy of a kafka-source keeps, as this parameter, the stream the spec's source
# wrote: the name its operator's expressions use (`compiler.codegen.program_names`)
SPEC_STREAM = "spec-stream"


class KafkaShareError(KafkaParamError):
    """A share of a topic's partitions that cannot be read; the message says what to do."""


def check_share(share: int, shares: int, where: str = "") -> None:
    """That `share` is one of `shares` instances (1-based); KafkaShareError otherwise."""
    at = f"{where}: " if where else ""
    for name, value in (("share", share), ("shares", shares)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise KafkaShareError(f"{at}{name} {value!r} is not a whole number")
    if not 1 <= shares <= MAX_SHARES:
        raise KafkaShareError(f"{at}{shares} instances: between 1 and {MAX_SHARES} may share a "
                              "topic's partitions")
    if not 1 <= share <= shares:
        raise KafkaShareError(f"{at}instance {share} is not one of 1..{shares}")


def block(count: int, share: int, shares: int) -> range:
    """The positions instance `share` of `shares` reads among `count` partitions (pure)."""
    return range((share - 1) * count // shares, share * count // shares)


def assign(partitions: Sequence[Partition], share: int, shares: int,
           where: str = "") -> tuple[Partition, ...]:
    """The partitions instance `share` of `shares` reads: its contiguous block of the sorted
    list. KafkaShareError when there are no partitions, fewer than instances (an instance would
    read nothing and wait for ever), a bad topic name or partition number, or a bad share."""
    check_share(share, shares, where)
    at = f"{where}: " if where else ""
    checked = sorted(set(_checked(p, at) for p in partitions))
    if not checked:
        raise KafkaShareError(f"{at}the topic has no partitions to read")
    if len(checked) < shares:
        raise KafkaShareError(
            f"{at}{_topics(checked)} {'has' if len({t for t, _ in checked}) == 1 else 'have'} "
            f"{len(checked)} partition(s), fewer than the {shares} instances reading them: an "
            f"instance would read nothing; ask for parallelism=\"{len(checked)}\" or fewer, or "
            "add partitions to the topic (kafka-topics.sh --alter --partitions)")
    return tuple(checked[i] for i in block(len(checked), share, shares))


def _checked(p: Partition, at: str) -> Partition:
    topic, number = p
    try:
        check_topic(str(topic))
    except KafkaParamError as exc:
        raise KafkaShareError(f"{at}{exc}") from None
    if isinstance(number, bool) or not isinstance(number, int) \
            or not 0 <= number < MAX_PARTITIONS:
        raise KafkaShareError(f"{at}{number!r} is not a partition number of '{topic}'")
    return str(topic), number


def _topics(partitions: Sequence[Partition]) -> str:
    return "topic(s) " + ", ".join(sorted({t for t, _ in partitions}))


def assign_option(partitions: Sequence[Partition]) -> str:
    """Spark's `assign` option: {"topic": [partition, ...], ...} as JSON."""
    by_topic: dict[str, list[int]] = {}
    for topic, number in sorted(partitions):
        by_topic.setdefault(topic, []).append(number)
    return json.dumps(by_topic, sort_keys=True, separators=(",", ":"))


def starting_offsets_for(starting: str, partitions: Sequence[Partition]) -> str:
    """`starting` (earliest, latest, or canonical per-partition JSON,
    `common.kafka_params.parse_starting_offsets`) for a source that reads only `partitions`:
    the JSON cut down to them (Spark refuses offsets of partitions a source is not assigned). A
    partition the JSON leaves out gets -2 (earliest); Spark refuses such JSON for a source that
    subscribes to the whole topic, so the single-instance plan would not have started either."""
    if starting in ("earliest", "latest"):
        return starting
    given = json.loads(starting)
    cut: dict[str, dict[str, int]] = {}
    for topic, number in sorted(partitions):
        cut.setdefault(topic, {})[str(number)] = int(given.get(topic, {}).get(str(number), -2))
    return json.dumps(cut, sort_keys=True, separators=(",", ":"))


def describe(topics: Sequence[str], share: int, shares: int,
             examples: Sequence[int] = (2, 4, 8)) -> str:
    """What explain says of an instance's share (the partition count is read at its start)."""
    shown = [f"with {n} partitions {_ranges(block(n, share, shares))}" for n in examples
             if n >= shares]
    return (f"reads share {share} of {shares} of the partitions of {', '.join(topics)}: a "
            "contiguous block of the sorted (topic, partition) list, counted at the task's "
            "first start" + (f" (of one topic: {', '.join(shown)})" if shown else ""))


def _ranges(r: range) -> str:
    return str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}"
