"""The files of a Kafka-fed operator's rescale: old instances' committed offsets in, the new
instances' handover out (the I/O shell of `common.kafka_handover`).

Owns, in each instance task's checkpoint folder:
- `kafka-stopped.json`, `{"batch": N}` (N: the last batch Spark committed, null for none),
  written by `TaskRuntime.stop_at_boundary` once the query stopped between two micro-batches
  and removed when an instance's query starts again. A handover reads only instances that
  carry it and whose last commit is that N: an instance that crashed may have a planned batch
  whose output a sink already made visible, and reading its offsets from the last commit would
  read that batch twice, so it is refused (start it again on its checkpoint, then stop it at a
  batch boundary);
- reading an old instance's end offsets: the last `commits/N` of its Spark checkpoint and the
  Kafka source's line of `offsets/N` (`common.spark_offset_log`), and its pinned partition list
  (`kafka-share-<op>.json`, `executor.kafka_io.assigned_partitions`);
- `prepare`, which writes each new instance's pinned list and `kafka-handover-<op>.json`
  (share, shares and Spark's startingOffsets) into its new checkpoint folder, and
  `handed_over`, which the new instance's source reads at its start;
- `stop_report`, what a stopped instance's executor tells the scheduler, which computes the
  handover of instances on other agents (`scheduler.kafka_rescale.parse_report`): its pinned
  list and its position (the last commit's end offsets, else the offsets it was handed).
A new instance runs in a new checkpoint folder (a new generation): its Spark checkpoint starts
empty, so Spark takes the handed-over startingOffsets; the old folders are left as they are,
the input a handover can be computed from again. docs/kafka.md ("Rescaling a Kafka-fed
operator") says the protocol. Does not own stopping or starting the queries
(`executor.runtime`) nor when a rescale happens (`scheduler.kafka_rescale`: its steps are
built, their wiring into the scheduler and executor is not, docs say so).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

from common import kafka_handover, spark_offset_log
from common.atomic_file import replace_file
from common.kafka_params import KafkaParamError, parse_starting_offsets
from common.kafka_partitions import Partition

STOPPED_FILE = "kafka-stopped.json"
MAX_SMALL = 1 << 22  # a pinned list, a handover or a marker: far below this


class HandoverRefused(ValueError):
    """A handover that cannot be made exactly from these folders; the message says why."""


@dataclass(frozen=True)
class Instance:
    """An instance task's checkpoint folder and its kafka-source copy's operator id."""

    checkpoint_dir: str
    op: str

    def pinned(self) -> str:
        return os.path.join(self.checkpoint_dir, f"kafka-share-{self.op}.json")

    def handover(self) -> str:
        return os.path.join(self.checkpoint_dir, f"kafka-handover-{self.op}.json")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read(MAX_SMALL + 1)
    if len(text) > MAX_SMALL:
        raise HandoverRefused(f"{path}: larger than {MAX_SMALL} characters")
    return text


def _ids(folder: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(folder) if n.isascii() and n.isdigit())
    except FileNotFoundError:
        return []


def last_committed_batch(spark_dir: str) -> int | None:
    """The last batch Spark committed in `spark_dir` (None: none)."""
    commits = _ids(os.path.join(spark_dir, "commits"))
    return commits[-1] if commits else None


def last_committed(spark_dir: str) -> tuple[int, dict[Partition, int]] | None:
    """The last batch Spark committed in `spark_dir` and its Kafka source's end offsets; None
    when it committed none. OffsetLogError (located) for a file that is not whole."""
    n = last_committed_batch(spark_dir)
    if n is None:
        return None
    commit = os.path.join(spark_dir, "commits", str(n))
    spark_offset_log.commit_is_whole(_read(commit), commit)
    planned = os.path.join(spark_dir, "offsets", str(n))
    try:
        text = _read(planned)
    except FileNotFoundError:
        raise spark_offset_log.OffsetLogError(f"{planned}: missing, though batch {n} is "
                                              "committed") from None
    return n, spark_offset_log.kafka_offsets(spark_offset_log.source_entries(text, planned),
                                             planned)


def mark_stopped(checkpoint_dir: str, batch: int | None) -> None:
    """Say that the instance's query stopped between micro-batches, after batch `batch`."""
    replace_file(os.path.join(checkpoint_dir, STOPPED_FILE), json.dumps({"batch": batch}) + "\n")


def clear_stopped(checkpoint_dir: str) -> None:
    """The query starts again: its stop no longer describes the checkpoint."""
    try:
        os.unlink(os.path.join(checkpoint_dir, STOPPED_FILE))
    except FileNotFoundError:
        pass


def old_offsets(old: Instance, where: str) -> dict[Partition, int] | None:
    """Old instance `old`'s committed end offsets (None: it committed no batch), only if it
    stopped at a batch boundary after exactly that batch; HandoverRefused otherwise."""
    try:
        said = json.loads(_read(os.path.join(old.checkpoint_dir, STOPPED_FILE)))
        stopped = said["batch"]
    except FileNotFoundError:
        raise HandoverRefused(f"{where}: it was not stopped at a batch boundary (no "
                              f"{STOPPED_FILE}): start it again on its checkpoint and stop it "
                              "with stop_at_boundary") from None
    except (ValueError, TypeError, KeyError):
        raise HandoverRefused(f"{where}: {STOPPED_FILE} is not {{\"batch\": N}}") from None
    try:
        last = last_committed(os.path.join(old.checkpoint_dir, "spark"))
    except spark_offset_log.OffsetLogError as exc:
        raise HandoverRefused(f"{where}: {exc}") from None
    if (None if last is None else last[0]) != stopped or isinstance(stopped, bool):
        raise HandoverRefused(f"{where}: stopped after batch {stopped}, but its checkpoint's last "
                              f"commit is {None if last is None else last[0]}: it ran again "
                              "since; stop it at a batch boundary again")
    return None if last is None else last[1]


def pinned_list(instance: Instance, where: str) -> list[Partition]:
    """The partition list an instance was started with (its `kafka-share-<op>.json`)."""
    try:
        listed = json.loads(_read(instance.pinned()))
        return sorted((str(t), int(p)) for t, p in listed)
    except FileNotFoundError:
        raise HandoverRefused(f"{where}: no {os.path.basename(instance.pinned())}: not an "
                              "instance reading a share of the partitions") from None
    except (ValueError, TypeError):
        raise HandoverRefused(f"{where}: {instance.pinned()} does not hold a partition "
                              "list") from None


def prepare(olds: Sequence[Instance], news: Sequence[Instance], starting: str | None
            ) -> tuple[kafka_handover.NewInstance, ...]:
    """Read the stopped old instances, compute the handover and write it into each new
    instance's (new, empty) checkpoint folder: its pinned partition list and its handover.
    HandoverRefused with every problem at once; nothing is written then."""
    problems: list[str] = []
    lists, committed = [], []
    for i, old in enumerate(olds, 1):
        where = f"old instance {i} of {len(olds)} ({old.checkpoint_dir})"
        try:
            lists.append(pinned_list(old, where))
            committed.append(old_offsets(old, where))
        except HandoverRefused as exc:
            problems.append(str(exc))
    if not problems and any(listed != lists[0] for listed in lists):
        problems.append("the old instances were started with different partition lists")
    problems += [f"new instance {i} of {len(news)}: {new.checkpoint_dir} already holds a Spark "
                 "checkpoint (a new generation starts empty)" for i, new in enumerate(news, 1)
                 if os.path.exists(os.path.join(new.checkpoint_dir, "spark"))]
    if problems or not lists:
        raise HandoverRefused("; ".join(problems or ["no old instances"]))
    try:
        plan = kafka_handover.handover(lists[0], len(olds), committed, len(news), starting)
    except kafka_handover.HandoverError as exc:
        raise HandoverRefused(str(exc)) from None
    for new, instance in zip(news, plan):
        os.makedirs(new.checkpoint_dir, exist_ok=True)
        replace_file(new.pinned(), json.dumps([list(p) for p in lists[0]]) + "\n")
        replace_file(new.handover(), json.dumps({
            "share": instance.share, "shares": instance.shares,
            "startingOffsets": instance.starting_offsets}) + "\n")
    return plan


def handed_over(path: str, share: int, shares: int,
                assigned: Sequence[Partition]) -> str | None:
    """The startingOffsets the handover at `path` gave this instance (None: it has none, a
    first start); HandoverRefused unless it is for this share and exactly these partitions."""
    try:
        said = json.loads(_read(path))
        given = (said["share"], said["shares"], parse_starting_offsets(said["startingOffsets"]))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError, KafkaParamError) as exc:
        raise HandoverRefused(f"{path} is not a handover ({exc})") from None
    if given[:2] != (share, shares):
        raise HandoverRefused(f"{path} is for instance {given[0]} of {given[1]}, "
                              f"not {share} of {shares}")
    offsets = json.loads(given[2]) if given[2] not in ("earliest", "latest") else {}
    named = sorted((t, int(p)) for t, ps in offsets.items() for p in ps)
    if named != sorted(assigned):
        raise HandoverRefused(f"{path} names other partitions than the "
                              f"instance's block ({len(named)} vs {len(assigned)})")
    return given[2]


def stop_report(instance: Instance, generation: int) -> dict[str, object]:
    """What an instance's executor reports once `TaskRuntime.stop_at_boundary` stopped it: the
    data `scheduler.kafka_rescale.parse_report` reads (kind, generation, its last committed
    batch, its pinned partition list, its position). The position is the committed end offsets
    of that batch; with none committed, the offsets its handover gave it (-2/-1 for partitions
    never read), or null for an instance of a first start, which starts where the source
    starts. HandoverRefused (with the folder) when it did not stop at a batch boundary."""
    where = f"instance {instance.checkpoint_dir}"
    listed = pinned_list(instance, where)
    committed = old_offsets(instance, where)
    batch = last_committed_batch(os.path.join(instance.checkpoint_dir, "spark"))
    position = committed if committed is not None else _handed(instance, where)
    return {"kind": "kafka-stopped", "generation": generation, "batch": batch,
            "partitions": [list(p) for p in listed],
            "offsets": None if position is None else
            [[t, p, o] for (t, p), o in sorted(position.items())]}


def _handed(instance: Instance, where: str) -> dict[Partition, int] | None:
    """The offsets the instance's handover gave it (None: it has no handover)."""
    try:
        said = json.loads(_read(instance.handover()))
        given = json.loads(parse_starting_offsets(said["startingOffsets"]))
        return {(str(t), int(p)): int(o) for t, ps in given.items() for p, o in ps.items()}
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError, AttributeError, KafkaParamError) as exc:
        raise HandoverRefused(f"{where}: {instance.handover()} is not a handover ({exc})") \
            from None
