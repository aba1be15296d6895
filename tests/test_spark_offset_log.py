"""Reading a stopped instance's committed Kafka offsets from its Spark checkpoint (pure parsers,
`common.spark_offset_log`, and the small I/O shell, `executor.kafka_handover`): files a real
Kafka query wrote (tests/fixtures/spark_offset_log/, copied from a run of
tests/test_kafka_handover_spark.py, which reads its own real checkpoints too), and truncated
and hostile files, each refused with where and what, never guessed; the stop record that a
handover requires."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.spark_offset_log import (OffsetLogError, commit_is_whole, kafka_offsets,
                                     source_entries)
from executor import kafka_handover
from executor.kafka_handover import HandoverRefused, Instance

FIXTURES = Path(__file__).parent / "fixtures" / "spark_offset_log"
REAL_OFFSETS = (FIXTURES / "offsets-0").read_text(encoding="utf-8")  # one instance, 4 partitions
REAL_SHARE = (FIXTURES / "offsets-8-share-2-of-2").read_text(encoding="utf-8")
REAL_COMMIT = (FIXTURES / "commits-0").read_text(encoding="utf-8")
TOPIC = "kh-in-9e2384a0"  # the test's topic in that run
META = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'


def offsets_of(text: str) -> dict[tuple[str, int], int]:
    return kafka_offsets(source_entries(text, "f"), "f")


def test_the_files_a_real_kafka_query_wrote() -> None:
    assert offsets_of(REAL_OFFSETS) == {(TOPIC, p): 50 for p in range(4)}
    assert offsets_of(REAL_SHARE) == {(TOPIC, 2): 92, (TOPIC, 3): 91}
    commit_is_whole(REAL_COMMIT, "c")
    assert offsets_of(f"v1\n{META}\n" + '{"a":{"0":0,"10":7},"b":{"2":9223372036854775807}}') \
        == {("a", 0): 0, ("a", 10): 7, ("b", 2): 2**63 - 1}


@pytest.mark.parametrize("text, says", [
    ("", "f: starts with '', not 'v1'"),
    ("v1", "this one has 1 line(s) (truncated?)"),
    (f"v1\n{META}", "this one has 2 line(s) (truncated?)"),
    (f"v1\n{META[:20]}\n{{}}", "f, line 2 (batch metadata): not JSON (truncated?)"),
    ('v1\n{"a": 1}\n{"t":{"0":', "f, line 3: not JSON (truncated?)"),
    (f"v2\n{META}\n{{}}", "not 'v1': not a Spark 4 offset or commit log file"),
    (f"v1\n{META}\n-", "f: the source has no offsets in this batch"),
    (f"v1\n{META}\n{{}}\n{{}}", "2 sources in the offset file"),
    (f"v1\n{META}\n[1, 2]", "f, line 3: not a JSON object"),
    (f"v1\n{META}\n{{}}", "f, line 3: no Kafka partition offsets"),
    (f'v1\n{META}\n{{"t":{{"0":-1}}}}', "offset -1 of t-0 is not a whole number"),
    (f'v1\n{META}\n{{"t":{{"0":1.5}}}}', "offset 1.5 of t-0 is not a whole number"),
    (f'v1\n{META}\n{{"t":{{"0":true}}}}', "offset True of t-0"),
    (f'v1\n{META}\n{{"t":{{"0":{2**63}}}}}', "offset 9223372036854775808 of t-0"),
    (f'v1\n{META}\n{{"t":{{"x":1, "-1":2, "\u0663":3}}}}', "'x' is not a partition number"),
    (f'v1\n{META}\n{{"t":{{"99999999":1}}}}', "'99999999' is not a partition number"),
    (f'v1\n{META}\n{{"t":[1]}}', "the offsets of 't' are not an object"),
    (f'v1\n{META}\n{{"../x":{{"0":1}},"t\\"]":{{"0":1}}}}', "'../x' is not a Kafka topic name"),
    ("v1\n" + META + "\n" + "[" * 100_000, "f, line 3: not JSON"),
    ("v1\n" + "x" * (5 << 20), "larger than"),
])
def test_truncated_and_hostile_offset_files_are_refused(text: str, says: str) -> None:
    with pytest.raises(OffsetLogError) as refused:
        offsets_of(text)
    assert says in str(refused.value)


def test_every_bad_entry_is_said_at_once() -> None:
    with pytest.raises(OffsetLogError) as refused:
        offsets_of(f'v1\n{META}\n{{"t":{{"0":-1,"1":"2"}},"u u":{{"0":1}}}}')
    said = str(refused.value)
    assert said.startswith("f, line 3: ") and "t-0" in said and "t-1" in said \
        and "'u u' is not a Kafka topic name" in said


@pytest.mark.parametrize("text", ["", "v1", "v1\n", "v1\n{\"nextBatch", "v1\n[]", "v1\n{}\n{}"])
def test_a_commit_file_cut_short_is_no_commit(text: str) -> None:
    with pytest.raises(OffsetLogError):
        commit_is_whole(text, "c")


def checkpoint(tmp_path: Path, name: str, commits: int, planned: int) -> Instance:
    """A task folder holding the real files as batches 0..planned-1, committed up to
    commits-1, a pinned list, and a stop record after the last commit."""
    folder = tmp_path / name
    for sub in ("offsets", "commits"):
        (folder / "spark" / sub).mkdir(parents=True)
    for n in range(planned):
        shutil.copy(FIXTURES / "offsets-0", folder / "spark" / "offsets" / str(n))
    for n in range(commits):
        shutil.copy(FIXTURES / "commits-0", folder / "spark" / "commits" / str(n))
    (folder / "kafka-share-src_1.json").write_text(
        json.dumps([[TOPIC, p] for p in range(4)]))
    kafka_handover.mark_stopped(str(folder), commits - 1 if commits else None)
    return Instance(str(folder), "src_1")


def test_the_shell_reads_the_last_commit_and_refuses_an_instance_not_stopped_there(
        tmp_path: Path) -> None:
    old = checkpoint(tmp_path, "old", 2, 3)  # batch 2 planned, refused by the closed gate
    assert kafka_handover.last_committed(str(tmp_path / "old" / "spark")) == \
        (1, {(TOPIC, p): 50 for p in range(4)})
    new = [Instance(str(tmp_path / "n1"), "src_1"), Instance(str(tmp_path / "n2"), "src_2")]
    plan = kafka_handover.prepare([old], new, "earliest")
    assert [json.loads(p.starting_offsets) for p in plan] == [{TOPIC: {"0": 50, "1": 50}},
                                                              {TOPIC: {"2": 50, "3": 50}}]
    assert kafka_handover.handed_over(new[1].handover(), 2, 2, [(TOPIC, 2), (TOPIC, 3)]) \
        == plan[1].starting_offsets
    assert json.loads(Path(new[1].pinned()).read_text()) == [[TOPIC, p] for p in range(4)]
    with pytest.raises(HandoverRefused, match="for instance 2 of 2, not 1 of 2"):
        kafka_handover.handed_over(new[1].handover(), 1, 2, [])
    with pytest.raises(HandoverRefused, match="names other partitions"):
        kafka_handover.handed_over(new[1].handover(), 2, 2, [(TOPIC, 3)])
    assert kafka_handover.handed_over(str(tmp_path / "none.json"), 1, 1, []) is None
    # the new generation started: handing over into it again is refused, all problems at once
    (tmp_path / "n1" / "spark").mkdir()
    kafka_handover.clear_stopped(str(tmp_path / "old"))
    with pytest.raises(HandoverRefused) as refused:
        kafka_handover.prepare([old], new, "earliest")
    assert "not stopped at a batch boundary" in str(refused.value) \
        and "n1 already holds a Spark checkpoint" in str(refused.value)


def test_a_stop_record_older_than_the_last_commit_or_a_cut_commit_is_refused(
        tmp_path: Path) -> None:
    old = checkpoint(tmp_path, "old", 2, 2)
    kafka_handover.mark_stopped(old.checkpoint_dir, 0)  # it ran again after that stop
    with pytest.raises(HandoverRefused, match="stopped after batch 0, but its checkpoint's last "
                                              "commit is 1"):
        kafka_handover.old_offsets(old, "old 1")
    kafka_handover.mark_stopped(old.checkpoint_dir, 1)
    (tmp_path / "old" / "spark" / "commits" / "1").write_text("v1\n")
    with pytest.raises(HandoverRefused, match="this one has 1 line"):
        kafka_handover.old_offsets(old, "old 1")
    (tmp_path / "old" / "spark" / "commits" / "1").write_text(REAL_COMMIT)
    (tmp_path / "old" / "spark" / "offsets" / "1").unlink()
    with pytest.raises(HandoverRefused, match="missing, though batch 1 is committed"):
        kafka_handover.old_offsets(old, "old 1")
    never = checkpoint(tmp_path, "never", 0, 1)
    assert kafka_handover.old_offsets(never, "never") is None  # starts where the source does
    other = checkpoint(tmp_path, "other", 1, 1)
    (tmp_path / "other" / "kafka-share-src_1.json").write_text(json.dumps([[TOPIC, 0]]))
    with pytest.raises(HandoverRefused, match="different partition lists"):
        kafka_handover.prepare([never, other], [Instance(str(tmp_path / "x"), "src_1")],
                               "earliest")


def test_the_stop_report_the_scheduler_reads(tmp_path: Path) -> None:
    from scheduler.kafka_rescale import parse_report
    old = checkpoint(tmp_path, "old", 2, 3)
    said = kafka_handover.stop_report(old, 0)
    got = parse_report(json.loads(json.dumps(said)), "q.t2")  # as it travels, in JSON
    assert (got.generation, got.batch, got.offsets) == (0, 1, {(TOPIC, p): 50 for p in range(4)})
    assert got.partitions == tuple((TOPIC, p) for p in range(4))
    # a new instance that committed nothing since its handover reports what it was handed
    new = [Instance(str(tmp_path / "n1"), "src_1"), Instance(str(tmp_path / "n2"), "src_2")]
    kafka_handover.prepare([old], new, "earliest")
    kafka_handover.mark_stopped(new[1].checkpoint_dir, None)
    got = parse_report(kafka_handover.stop_report(new[1], 1), "q.t3")
    assert (got.batch, got.offsets) == (None, {(TOPIC, 2): 50, (TOPIC, 3): 50})
    # a first start that never committed: no position, it starts where the source starts
    first = checkpoint(tmp_path, "first", 0, 1)
    assert kafka_handover.stop_report(first, 0)["offsets"] is None
    kafka_handover.clear_stopped(first.checkpoint_dir)
    with pytest.raises(HandoverRefused, match="not stopped at a batch boundary"):
        kafka_handover.stop_report(first, 0)
    Path(new[0].handover()).write_text('{"startingOffsets": 7}')
    kafka_handover.mark_stopped(new[0].checkpoint_dir, None)
    with pytest.raises(HandoverRefused, match="is not a handover"):
        kafka_handover.stop_report(new[0], 1)
