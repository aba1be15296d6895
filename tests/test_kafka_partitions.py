"""Kafka partitions read in parallel by a partitioned operator's instances (pure): the
assignment function's properties (each partition once, balanced within 1, stable) with a seeded
fuzz, bad and hostile inputs refused with where and what to do, the plans the compiler makes
(which operators read their own partitions, which keep the splitter), explain, the source's
Spark options and the assignment pinned in the checkpoint folder. The run against a real
broker and Spark is tests/test_kafka_partitions_spark.py."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from common.kafka_partitions import (KafkaShareError, assign, assign_option, block, check_share,
                                     describe, starting_offsets_for)
from compiler.pipeline import compile_spec_text
from elastiq.explain import explain
from executor import kafka_io

SPEC = """<dataflow name="kp">
  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="temp" type="double"/>
    <column name="ts" type="timestamp"/>
  </type>
  <operator name="src" type="kafka-source">
    <param name="bootstrap" value="127.0.0.1:9092"/>
    {source}
    <output name="raw" type="reading"/>
  </operator>
  {middle}
  <operator name="out" type="kafka-sink">
    <input name="{last}"/>
    <param name="bootstrap" value="127.0.0.1:9092"/>
    <param name="topic" value="results"/>
  </operator>
</dataflow>
"""
TOPIC = '<param name="topic" value="readings"/>'


def hot_filter(attrs: str) -> str:
    return f"""<operator name="hot" type="filter" {attrs}>
    <input name="raw"/>
    <param name="condition" value="raw.temp > 30"/>
    <output name="hot" type="reading"/>
  </operator>"""


def compiled(tmp_path: Path, attrs: str = 'parallelism="2"', source: str = TOPIC,
             middle: str | None = None, last: str = "hot"):  # type: ignore[no-untyped-def]
    text = SPEC.format(source=source, middle=hot_filter(attrs) if middle is None else middle,
                       last=last)
    return compile_spec_text(text, str(tmp_path / "kp.xml"), base_dir=tmp_path, plan_only=True)


# --- the assignment ----------------------------------------------------------------------------

def parts(n: int, topic: str = "t") -> list[tuple[str, int]]:
    return [(topic, p) for p in range(n)]


def test_four_partitions_over_two_instances_are_two_contiguous_blocks() -> None:
    assert assign(parts(4), 1, 2) == (("t", 0), ("t", 1))
    assert assign(parts(4), 2, 2) == (("t", 2), ("t", 3))
    assert assign(parts(5), 1, 2) == (("t", 0), ("t", 1))  # floor: the larger block is last
    assert assign(parts(5), 2, 2) == (("t", 2), ("t", 3), ("t", 4))
    assert assign(list(reversed(parts(3))), 2, 3) == (("t", 1),)  # sorted first: order given
    assert assign_option(assign(parts(4), 2, 2)) == '{"t":[2,3]}'


def test_every_partition_once_balanced_within_one_and_stable_seeded_fuzz() -> None:
    rng = random.Random(30)
    for _ in range(2000):
        topics = [f"topic-{i}" for i in range(rng.randint(1, 3))]
        listed = [(t, p) for t in topics for p in range(rng.randint(0, 9))]
        if not listed:
            continue
        k = rng.randint(1, min(len(listed), 64))
        shuffled = listed[:]
        rng.shuffle(shuffled)
        blocks = [assign(shuffled, i, k) for i in range(1, k + 1)]
        seen = Counter(p for b in blocks for p in b)
        assert set(seen) == set(listed) and set(seen.values()) == {1}  # each exactly once
        sizes = [len(b) for b in blocks]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        assert all(list(b) == sorted(b) for b in blocks)  # contiguous runs of the sorted list
        assert [p for b in blocks for p in b] == sorted(listed)
        assert blocks == [assign(listed, i, k) for i in range(1, k + 1)]  # stable


def test_block_is_the_formula_docs_state() -> None:
    for n in range(1, 40):
        for k in range(1, n + 1):
            assert [len(block(n, i, k)) for i in range(1, k + 1)] == \
                [i * n // k - (i - 1) * n // k for i in range(1, k + 1)]


@pytest.mark.parametrize("listed, share, shares, says", [
    ([], 1, 1, "where: the topic has no partitions to read"),
    (parts(2), 1, 3, 'where: topic(s) t has 2 partition(s), fewer than the 3 instances reading '
                     'them: an instance would read nothing; ask for parallelism="2" or fewer'),
    (parts(4), 0, 2, "where: instance 0 is not one of 1..2"),
    (parts(4), 3, 2, "where: instance 3 is not one of 1..2"),
    (parts(4), -1, 2, "where: instance -1 is not one of 1..2"),
    (parts(4), 1, 0, "where: 0 instances: between 1 and 64"),
    (parts(4), 1, 65, "where: 65 instances: between 1 and 64"),
    (parts(4), True, 2, "where: share True is not a whole number"),
    (parts(4), 1, "2", "where: shares '2' is not a whole number"),
    ([("t", -1)], 1, 1, "where: -1 is not a partition number of 't'"),
    ([("t", 10**7)], 1, 1, "is not a partition number"),
    ([('t"],"x":[1', 0)], 1, 1, "where: "),
    ([("../etc/passwd", 0)], 1, 1, "where: "),
    ([("a" * 250, 0)], 1, 1, "where: "),
])
def test_bad_and_hostile_inputs_are_refused_with_where_and_what_to_do(
        listed: list[tuple[str, int]], share: int, shares: int, says: str) -> None:
    with pytest.raises(KafkaShareError) as refused:
        assign(listed, share, shares, "where")
    assert says in str(refused.value)


def test_a_hostile_topic_name_never_reaches_the_assign_json() -> None:
    for name in ('t"],"x":[1', "t\n", "t;rm -rf /", "${jndi:ldap://x}", ""):
        with pytest.raises(KafkaShareError):
            assign([(name, 0)], 1, 1)
    check_share(2, 2)  # a good share passes


def test_starting_offsets_are_cut_down_to_the_instances_partitions() -> None:
    given = json.dumps({"t": {"0": 5, "1": -2, "2": 7, "3": -1}})
    assert starting_offsets_for(given, [("t", 2), ("t", 3)]) == '{"t":{"2":7,"3":-1}}'
    assert starting_offsets_for("earliest", [("t", 0)]) == "earliest"
    assert starting_offsets_for("latest", [("t", 0)]) == "latest"


def test_source_options_assign_the_share_instead_of_subscribing() -> None:
    settings = kafka_io.SourceSettings("h:1", ("t",), None, '{"t":{"0":1,"1":2,"2":3}}', None,
                                       None)
    options = kafka_io.source_options(settings, (("t", 1), ("t", 2)))
    assert options["assign"] == '{"t":[1,2]}' and "subscribe" not in options
    assert options["startingOffsets"] == '{"t":{"1":2,"2":3}}'
    assert "assign" not in kafka_io.source_options(settings)


def test_the_assignment_is_pinned_at_the_first_start_and_a_changed_topic_is_refused(
        tmp_path: Path) -> None:
    share = kafka_io.Share(2, 2, str(tmp_path / "ck" / "kafka-share-src.json"))
    assert kafka_io.assigned_partitions(share, parts(4)) == (("t", 2), ("t", 3))
    assert kafka_io.assigned_partitions(share, list(reversed(parts(4)))) == (("t", 2), ("t", 3))
    with pytest.raises(kafka_io.KafkaSetupError, match="partitions changed since the instance "
                                                       r"first started \(4 then, 6 now\)"):
        kafka_io.assigned_partitions(share, parts(6))
    Path(share.pinned).write_text("not json")
    with pytest.raises(kafka_io.KafkaSetupError, match="does not hold a partition list"):
        kafka_io.assigned_partitions(share, parts(4))
    few = kafka_io.Share(3, 3, str(tmp_path / "few.json"))
    with pytest.raises(kafka_io.KafkaSetupError, match="instance 3 of 3: topic"):
        kafka_io.assigned_partitions(few, parts(2))
    assert not Path(few.pinned).exists()  # a refused start pins nothing


# --- the plan ----------------------------------------------------------------------------------

def test_a_partitioned_filter_after_a_kafka_source_reads_partitions_in_its_instances(
        tmp_path: Path) -> None:
    c = compiled(tmp_path)
    kinds = Counter(n.kind for n in c.physical.nodes)
    assert kinds["kafka-source"] == 2 and kinds["splitter"] == 0 and kinds["network-reader"] == 0
    by_task = {t.task_id: t for t in c.query.tasks}
    assert len(by_task) == 3  # two instances and the merger's task; no source task
    instances = [t for t in c.query.tasks if t.operators[0].startswith("src_")]
    assert [t.operators for t in instances] == [("src_1", "hot_1"), ("src_2", "hot_2")]
    for i, task in enumerate(instances, 1):
        assert not task.inputs and f"share={i}" in task.program and "shares=2" in task.program
        # the instance's expressions name the spec's stream: the copy's output is read as it
        assert "output='raw'" in task.program and "input='raw'" in task.program
        assert task.placement.apart_from  # the instances stay on distinct agents
    assert c.query.elastic == ()  # a fixed parallelism: nothing to rescale
    text = explain(c)
    assert "kafka-partitions [partitioning] on hot_s" in text
    assert ("kafka  src_2 reads share 2 of 2 of the partitions of readings: a contiguous block"
            in text) and "with 4 partitions 2-3" in text


@pytest.mark.parametrize("attrs, source, why", [
    ('parallelism="2" max-parallelism="4"', TOPIC, "dormant slots: rescalable"),
    ('parallelism="2" max-parallelism="2"', TOPIC, "asked to rescale"),
    ('parallelism="2" min-parallelism="1" elastic="auto"', TOPIC, "automatic"),
    ('parallelism="2"', '<param name="topic-pattern" value="read.*"/>', "a pattern"),
])
def test_operators_kafka_cannot_feed_directly_keep_the_splitter(
        tmp_path: Path, attrs: str, source: str, why: str) -> None:
    c = compiled(tmp_path, attrs, source)
    assert any(n.kind == "splitter" for n in c.physical.nodes), why
    assert [n.name for n in c.physical.nodes if n.kind == "kafka-source"] == ["src"]


def test_a_keyed_window_keeps_the_splitter_which_hashes_its_key(tmp_path: Path) -> None:
    window = """<operator name="agg" type="window-aggregate" parallelism="2">
    <input name="raw"/>
    <param name="time" value="ts"/>
    <param name="size" value="10 seconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="n" function="count"/>
    <output name="counts"/>
  </operator>"""
    c = compiled(tmp_path, middle=window, last="counts")
    assert any(n.kind == "splitter" for n in c.physical.nodes)
    assert "kafka-partitions" not in explain(c)


def test_a_union_of_two_topics_keeps_its_splitters(tmp_path: Path) -> None:
    union = """<operator name="src2" type="kafka-source">
    <param name="bootstrap" value="127.0.0.1:9092"/>
    <param name="topic" value="more"/>
    <output name="more" type="reading"/>
  </operator>
  <operator name="both" type="union" parallelism="2">
    <input name="raw"/>
    <input name="more"/>
    <output name="both" type="reading"/>
  </operator>"""
    c = compiled(tmp_path, middle=union, last="both")
    assert [n.kind for n in c.physical.nodes].count("splitter") == 2
    assert "kafka-partitions" not in explain(c)


def test_describe_says_the_block_for_example_counts() -> None:
    assert describe(("t",), 1, 3) == (
        "reads share 1 of 3 of the partitions of t: a contiguous block of the sorted (topic, "
        "partition) list, counted at the task's first start (of one topic: with 4 partitions "
        "0, with 8 partitions 0-1)")
