"""The offset handover of a rescaled Kafka-fed operator (pure, `common.kafka_handover`): a seeded
property test of thousands of random topics, counts and offset maps against a plain-Python
oracle (each partition's owner computed by its own formula, ceil((j+1)k/N), not by the blocks
the module uses), a 1 -> 2 -> 1 chain, and bad and hostile inputs refused with every problem at
once. The checkpoint reader is tests/test_spark_offset_log.py; the run against a real broker
and Spark is tests/test_kafka_handover_spark.py."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from common.kafka_handover import HandoverError, handover, offsets_json

P = tuple[str, int]


def parts(n: int, topic: str = "t") -> list[P]:
    return [(topic, p) for p in range(n)]


def owner(position: int, k: int, n: int) -> int:
    """The oracle's owner of the sorted list's `position`: the instance i with
    floor((i-1)n/k) <= position < floor(in/k), which is ceil((position+1)k/n)."""
    return -(-(position + 1) * k // n)


def oracle(listed: list[P], k_old: int, committed: list[dict[P, int] | None], k_new: int,
           starting: str) -> list[tuple[list[P], dict[str, dict[str, int]]]]:
    ordered = sorted(set(listed))
    given = {} if starting in ("earliest", "latest") else json.loads(starting)
    out: list[tuple[list[P], dict[str, dict[str, int]]]] = [([], {}) for _ in range(k_new)]
    for j, (topic, number) in enumerate(ordered):
        old = committed[owner(j, k_old, len(ordered)) - 1]
        if old is not None:
            offset = old[(topic, number)]
        elif starting == "earliest":
            offset = -2
        elif starting == "latest":
            offset = -1
        else:
            offset = given.get(topic, {}).get(str(number), -2)
        block, offsets = out[owner(j, k_new, len(ordered)) - 1]
        block.append((topic, number))
        offsets.setdefault(topic, {})[str(number)] = offset
    return out


def random_case(rng: random.Random) -> tuple[list[P], int, list[dict[P, int] | None], int, str]:
    topics = rng.sample(["a", "b.c", "readings", "x-1", "z_z"], rng.randint(1, 3))
    listed = [(t, p) for t in topics for p in rng.sample(range(40), rng.randint(0, 12))]
    while not listed:
        listed = [(topics[0], rng.randrange(100))]
    n = len(set(listed))
    k_old, k_new = rng.randint(1, min(n, 64)), rng.randint(1, min(n, 64))
    ordered = sorted(set(listed))
    committed: list[dict[P, int] | None] = []
    for i in range(1, k_old + 1):
        mine = [p for j, p in enumerate(ordered) if owner(j, k_old, n) == i]
        committed.append(None if rng.random() < 0.2 else
                         {p: rng.choice([0, rng.randrange(10**6), 2**63 - 1]) for p in mine})
    starting = rng.choice(["earliest", "latest", json.dumps(
        {t: {str(p): rng.choice([-2, -1, rng.randrange(1000)]) for tt, p in ordered if tt == t}
         for t in topics if any(tt == t for tt, _ in ordered)})])
    rng.shuffle(listed)
    return listed, k_old, committed, k_new, starting


def test_random_handovers_equal_the_oracle_every_partition_once_offsets_exact() -> None:
    rng = random.Random(3030)
    for case in range(4000):
        listed, k_old, committed, k_new, starting = random_case(rng)
        got = handover(listed, k_old, committed, k_new, starting)
        want = oracle(listed, k_old, committed, k_new, starting)
        assert [(i.share, i.shares) for i in got] == [(i, k_new) for i in range(1, k_new + 1)]
        assert [(list(i.block), json.loads(i.starting_offsets)) for i in got] == want, case
        assert sorted(p for i in got for p in i.block) == sorted(set(listed))  # each once
        assert all(set(json.loads(i.starting_offsets)) == {t for t, _ in i.block} for i in got)


def test_one_to_two_to_one_carries_each_partitions_offset() -> None:
    four = parts(4)
    two = handover(four, 1, [{("t", 0): 5, ("t", 1): 6, ("t", 2): 7, ("t", 3): 8}], 2, "earliest")
    assert [(i.block, i.starting_offsets) for i in two] == [
        ((("t", 0), ("t", 1)), '{"t":{"0":5,"1":6}}'),
        ((("t", 2), ("t", 3)), '{"t":{"2":7,"3":8}}')]
    # instance 2 never committed a batch: its partitions start where the source starts
    one = handover(four, 2, [{("t", 0): 15, ("t", 1): 16}, None], 1, '{"t":{"2":3}}')
    assert one[0].starting_offsets == '{"t":{"0":15,"1":16,"2":3,"3":-2}}'
    assert handover(four, 2, [None, None], 1, "latest")[0].starting_offsets == \
        '{"t":{"0":-1,"1":-1,"2":-1,"3":-1}}'
    assert offsets_json({("b", 1): 2, ("a", 10): 1, ("a", 2): 0}) == \
        '{"a":{"10":1,"2":0},"b":{"1":2}}'


def refused(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(HandoverError) as caught:
        handover(*args, **kwargs)
    return str(caught.value)


def test_bad_counts_are_refused_with_where() -> None:
    four = parts(4)
    assert refused([], 1, [None], 1, "earliest", where="q.t1") == \
        "q.t1: the topic has no partitions to hand over"
    said = refused(four, 0, [], 65, "earliest", where="w")
    assert said.startswith("w: ") and "old instance count: 0 instances: between 1 and 64" in said \
        and "new instance count: 65 instances: between 1 and 64" in said  # both at once
    assert "5 new instances for 4 partition(s): an instance would read nothing; at most 4" in \
        refused(four, 1, [None], 5, "earliest")
    assert "new instance count: 1000000000 instances" in \
        refused(four, 1, [None], 10**9, "earliest")
    assert "offsets of 1 old instance(s) given for 2" in refused(four, 2, [None], 1, "earliest")
    assert "old instance count: shares True is not a whole number" in \
        refused(four, True, [None], 1, "earliest")


def test_attacker_offsets_are_refused_every_problem_at_once() -> None:
    four = parts(4)
    said = refused(four, 2, [{("t", 0): -1, ("t", 1): 2**63, ("t", 2): 4},
                             {("t", 2): 1, ("t", 3): True, ("nope", 9): 1}], 1, "earliest")
    for part in ["old instance 1 of 2: t-2 is not one of its partitions (t-0, t-1)",
                 "old instance 1 of 2: offset -1 of t-0 is not a whole number",
                 "old instance 1 of 2: offset 9223372036854775808 of t-1",
                 "old instance 2 of 2: nope-9 is not one of its partitions (t-2, t-3)",
                 "old instance 2 of 2: offset True of t-3"]:
        assert part in said
    assert "committed offsets without t-3 of its block: its checkpoint is not of this " \
        "assignment" in refused(four, 2, [None, {("t", 2): 1}], 2, "earliest")
    assert "offset '5' of t-0" in refused(parts(1), 1, [{("t", 0): "5"}], 1, "earliest")
    assert "offsets are not a partition -> offset map" in \
        refused(parts(1), 1, [[("t", 0)]], 1, "earliest")


def test_hostile_names_and_starting_offsets_are_refused() -> None:
    for name in ('t"],"x":[1', "../etc", "a" * 300, "", "t\n"):
        assert "is not a Kafka topic name" in refused([(name, 0)], 1, [None], 1, "earliest")
    assert "is not a partition number" in refused([("t", -1)], 1, [None], 1, "earliest")
    assert "is not a partition number" in refused([("t", 10**7)], 1, [None], 1, "earliest")
    assert "starting offsets: " in refused(parts(2), 1, [None], 2, "{not json")
    assert "starting offsets: " in refused(parts(2), 1, [None], 2, '{"t":{"0":-3}}')
    said = refused(parts(2), 2, [{("t", 0): 1}, None], 1, None)
    assert "t-1 were never read by their old instance and the source starts at a timestamp" \
        in said
    assert handover(parts(2), 1, [{("t", 0): 1, ("t", 1): 2}], 2, None)[1].starting_offsets \
        == '{"t":{"1":2}}'  # every partition committed: a timestamp start does not matter
