"""The scheduler's side of a Kafka-fed operator's rescale (pure, `scheduler.kafka_rescale`): a
seeded simulation of 300 chains of rescales while records are produced, in which model
instances read their blocks batch by batch, commit, fail while stopping and are restarted on
their checkpoints, and stop at a batch boundary with the report their executor would send; a
plain-Python oracle (every produced record, from the source's starting offsets) must equal the
records committed across all generations, each once. Then the refusals: bad counts, hostile
reports and stale or mismatched reports, each located, every problem at once, the old instances
resumed. The arithmetic of the handover itself is tests/test_kafka_handover.py."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from scheduler.kafka_rescale import (Launch, RescaleRefused, SlotState, begin, parse_report,
                                     report, step)

P = tuple[str, int]


def owner(position: int, k: int, n: int) -> int:
    """The oracle's owner of the sorted list's `position` (ceil((position+1)k/n))."""
    return -(-(position + 1) * k // n)


class Instance:
    """A model of one instance: its block, its position, its committed offsets and batch."""

    def __init__(self, listed: list[P], share: int, shares: int, starting: dict[P, int],
                 handed: bool) -> None:
        self.block = [p for j, p in enumerate(listed) if owner(j, shares, len(listed)) == share]
        assert set(starting) == set(self.block)
        self.handed = dict(starting) if handed else None
        self.committed: dict[P, int] = {p: (0 if o == -2 else o) for p, o in starting.items()}
        self.batch: int | None = None

    def run_batch(self, produced: dict[P, int], rng: random.Random,
                  out: Counter[tuple[P, int]]) -> None:
        """One micro-batch: up to a few records of each partition, committed (Spark runs no
        batch without new data)."""
        ends = {p: min(produced[p], o + rng.randint(1, 5)) for p, o in self.committed.items()}
        if ends == self.committed:
            return
        for p, end in ends.items():
            out.update((p, o) for o in range(self.committed[p], end))
        self.committed = ends
        self.batch = 0 if self.batch is None else self.batch + 1

    def stop_report(self, listed: list[P], generation: int) -> dict[str, Any]:
        """What its executor reports once it stopped at a batch boundary."""
        return {"kind": "kafka-stopped", "generation": generation, "batch": self.batch,
                "partitions": [list(p) for p in listed],
                "offsets": [[t, p, o] for (t, p), o in sorted(
                    (self.committed if self.batch is not None else self.handed or {}).items())]
                if self.batch is not None or self.handed is not None else None}


def simulate(seed: int) -> None:
    rng = random.Random(seed)
    listed = sorted((t, p) for t in rng.sample(["a", "readings", "x.y"], rng.randint(1, 2))
                    for p in range(rng.randint(1, 6)))
    n, max_k = len(listed), rng.randint(2, 4)
    produced = {p: rng.randint(0, 20) for p in listed}
    explicit = rng.random() < 0.5
    first = {p: rng.randint(0, produced[p]) if explicit else -2 for p in listed}
    starting = json.dumps({t: {str(p): first[(t, p)] for tt, p in listed if tt == t}
                           for t in {t for t, _ in listed}}) if explicit else "earliest"
    slots = tuple(f"q.op_{i}" for i in range(1, max_k + 1))
    k, generation = 1, 0
    live = {slots[0]: Instance(listed, 1, 1, {p: first[p] for p in listed}, False)}
    out: Counter[tuple[P, int]] = Counter()
    for _ in range(rng.randint(1, 5)):
        for p in listed:
            produced[p] += rng.randint(0, 15)
        for inst in live.values():
            for _ in range(rng.randint(0, 3)):
                inst.run_batch(produced, rng, out)
        k_new = rng.choice([x for x in range(1, min(max_k, n) + 1) if x != k] or [k])
        if k_new == k:
            continue
        k, generation, live = rescale(rng, listed, slots, k, k_new, generation, starting, live,
                                      produced, out)
    for p in listed:
        produced[p] += rng.randint(0, 10)
    for inst in live.values():  # the last generation drains the topic
        while any(inst.committed[p] < produced[p] for p in inst.block):
            inst.run_batch(produced, rng, out)
    want = Counter((p, o) for p in listed for o in range(first[p] if first[p] >= 0 else 0,
                                                             produced[p]))
    assert out == want, seed


def rescale(rng: random.Random, listed: list[P], slots: tuple[str, ...], k: int, k_new: int,
            generation: int, starting: str, live: dict[str, Instance], produced: dict[P, int],
            out: Counter[tuple[P, int]]) -> tuple[int, int, dict[str, Instance]]:
    r = begin("op", slots, k, k_new, 1, generation, starting, now=100.0)
    states: dict[str, SlotState] = {t: ("running" if t in live else "dormant") for t in slots}
    stale, staled = rng.random() < 0.1, False
    failed_once: set[str] = set()
    for tick in range(50):
        s = step(r, states, now=100.0 + tick)  # it saw last tick's failures
        for t in slots:
            if states[t] == "failed":
                states[t] = "running"  # the lifecycle restarted it on its checkpoint
                live[t].run_batch(produced, rng, out)
        for t in s.stop:
            if t not in failed_once and rng.random() < 0.3:  # fails while stopping
                failed_once.add(t)
                states[t] = "failed"  # its restart replays from its checkpoint: same offsets
                continue
            assert states[t] == "running" and t in live
            states[t] = "stopped"
            data = live[t].stop_report(listed, generation)
            if stale and not staled and data["offsets"] is not None:
                data["generation"], staled = generation + 1, True  # not of this rescale
            report(r, parse_report(data, t))
        if s.refused:
            assert staled and "stale report" in s.refused and set(s.resume) == set(live)
            assert r.phase == "refused" and not s.launch
            return k, generation, live  # the old instances resume on their checkpoints
        if s.launch:
            assert not staled
            assert [(x.task_id, x.share, x.shares, x.generation) for x in s.launch] == \
                [(slots[i - 1], i, k_new, generation + 1) for i in range(1, k_new + 1)]
            assert set(s.sleep) == set(slots[k_new:k])
            live = {x.task_id: new_instance(listed, x) for x in s.launch}
            states = {t: ("running" if t in live else "dormant") for t in slots}
        if r.phase == "done":
            assert failed_once <= set(r.asked) and r.pause_s is not None and r.pause_s > 0
            return k_new, generation + 1, live
    raise AssertionError("the rescale did not finish")


def new_instance(listed: list[P], launch: Launch) -> Instance:
    offsets = json.loads(launch.starting_offsets)
    return Instance(listed, launch.share, launch.shares,
                    {(t, int(p)): o for t, ps in offsets.items() for p, o in ps.items()}, True)


def test_chains_of_rescales_read_every_record_once_against_the_oracle() -> None:
    for seed in range(300):
        simulate(seed)


def test_one_to_two_to_one_by_hand() -> None:
    listed = [["readings", p] for p in range(4)]
    r = begin("hot", ("t1", "t2", "t3"), 1, 2, 1, 0, "earliest", now=10.0)
    states: dict[str, SlotState] = {"t1": "running", "t2": "dormant", "t3": "dormant"}
    assert step(r, states, 10.5).stop == ("t1",)
    assert step(r, states, 10.6).stop == ()  # asked once
    states["t1"] = "stopped"
    report(r, parse_report({"kind": "kafka-stopped", "generation": 0, "batch": 7,
                            "partitions": listed,
                            "offsets": [["readings", p, 50 + p] for p in range(4)]}, "t1"))
    s = step(r, states, 12.0)
    assert s.launch == (Launch("t1", 1, 1, 2, '{"readings":{"0":50,"1":51}}'),
                        Launch("t2", 1, 2, 2, '{"readings":{"2":52,"3":53}}'))
    states.update(t1="running", t2="starting")
    step(r, states, 13.0)
    assert r.phase == "launching"
    states["t2"] = "running"
    step(r, states, 15.0)
    assert r.phase == "done" and r.pause_s == 5.0 and r.stopped_at == 12.0
    back = begin("hot", ("t1", "t2", "t3"), 2, 1, 1, 1, "earliest", now=20.0)
    assert step(back, states, 20.0).stop == ("t1", "t2")
    # t1 committed nothing since its start: it reports what it was handed (-2: never read)
    for t, batch, offs in (("t1", None, [["readings", 0, -2], ["readings", 1, 51]]),
                           ("t2", 3, [["readings", 2, 60], ["readings", 3, 61]])):
        states[t] = "stopped"
        report(back, parse_report({"kind": "kafka-stopped", "generation": 1, "batch": batch,
                                   "partitions": listed, "offsets": offs}, t))
    s = step(back, states, 22.0)
    assert s.launch == (Launch("t1", 2, 1, 1, '{"readings":{"0":-2,"1":51,"2":60,"3":61}}'),)
    assert s.sleep == ("t2",)


@pytest.mark.parametrize("k_old,k_new,minimum,generation,says", [
    (1, 1, 1, 0, "already runs 1 instances"),
    (1, 4, 1, 0, "asked parallelism 4 is not one of 1..3"),
    (0, 2, 0, 0, "running parallelism 0 is not one of 1..3"),
    (2, 1, 2, 0, "asked parallelism 1 is not one of 2..3"),
    (1, True, 1, 0, "asked parallelism True"),
    (1, 2, 1, -1, "generation -1"),
])
def test_bad_counts_are_refused_with_the_operator(k_old: int, k_new: int, minimum: int,
                                                   generation: int, says: str) -> None:
    with pytest.raises(RescaleRefused, match="operator hot: .*" + says):
        begin("hot", ("a", "b", "c"), k_old, k_new, minimum, generation, "earliest", 0.0)


def test_more_instances_than_partitions_is_refused_and_the_old_resume() -> None:
    r = begin("hot", ("a", "b", "c"), 1, 3, 1, 0, "earliest", 0.0)
    step(r, {"a": "running"}, 0.0)
    report(r, parse_report({"kind": "kafka-stopped", "generation": 0, "batch": 0,
                            "partitions": [["t", 0], ["t", 1]],
                            "offsets": [["t", 0, 5], ["t", 1, 6]]}, "a"))
    s = step(r, {"a": "stopped", "b": "dormant", "c": "dormant"}, 1.0)
    assert s.resume == ("a",) and not s.launch and r.phase == "refused"
    assert "3 new instances for 2 partition(s)" in s.refused and "1 = task a" in s.refused


def test_a_timestamp_start_never_read_is_refused() -> None:
    r = begin("hot", ("a", "b"), 2, 1, 1, 0, None, 0.0)
    step(r, {"a": "running", "b": "running"}, 0.0)
    parts = [["t", 0], ["t", 1]]
    report(r, parse_report({"kind": "kafka-stopped", "generation": 0, "batch": None,
                            "partitions": parts, "offsets": None}, "a"))
    report(r, parse_report({"kind": "kafka-stopped", "generation": 0, "batch": 2,
                            "partitions": parts, "offsets": [["t", 1, 9]]}, "b"))
    s = step(r, {"a": "stopped", "b": "stopped"}, 1.0)
    assert "starts at a timestamp" in s.refused and s.resume == ("a", "b")


def test_mismatched_and_stale_reports_are_all_said_at_once() -> None:
    r = begin("hot", ("a", "b"), 2, 1, 1, 3, "earliest", 0.0)
    step(r, {"a": "running", "b": "running"}, 0.0)
    report(r, parse_report({"kind": "kafka-stopped", "generation": 2, "batch": 0,
                            "partitions": [["t", 0], ["t", 1]], "offsets": [["t", 0, 1]]}, "a"))
    report(r, parse_report({"kind": "kafka-stopped", "generation": 3, "batch": 0,
                            "partitions": [["t", 0], ["t", 1], ["t", 2]],
                            "offsets": [["t", 2, 1]]}, "b"))
    s = step(r, {"a": "stopped", "b": "stopped"}, 1.0)
    assert "task a reports generation 2, not 3" in s.refused
    assert "task b was started with other partitions (3) than task a (2)" in s.refused


def test_a_report_from_a_slot_not_stopping_is_ignored() -> None:
    r = begin("hot", ("a", "b"), 1, 2, 1, 0, "earliest", 0.0)
    report(r, parse_report({"kind": "kafka-stopped", "generation": 0, "batch": None,
                            "partitions": [["t", 0], ["t", 1]], "offsets": None}, "b"))
    assert r.reports == {}
    assert step(r, {"a": "stopped", "b": "dormant"}, 1.0) == step(r, {}, 1.0)  # waits


@pytest.mark.parametrize("data,says", [
    ("kafka-stopped", "not a kafka-stopped report"),
    ({"kind": "other"}, "not a kafka-stopped report"),
    ({"kind": "kafka-stopped", "generation": "1", "batch": 0, "partitions": [],
      "offsets": []}, "generation '1' is not a whole number"),
    ({"kind": "kafka-stopped", "generation": 0, "batch": -1, "partitions": [["t", 0]],
      "offsets": [["t", 0, 1]]}, "batch -1 is not a whole number"),
    ({"kind": "kafka-stopped", "generation": 0, "batch": 1, "partitions": [["t", 0]],
      "offsets": [["t", 0, 2**63]]}, r"offsets\[0\]"),
    ({"kind": "kafka-stopped", "generation": 0, "batch": 1, "partitions": [["t", 0]],
      "offsets": [["t", 0, True]]}, r"offsets\[0\]"),
    ({"kind": "kafka-stopped", "generation": 0, "batch": 1, "partitions": [["t", 0], ["t", 0]],
      "offsets": [["t", 0, 1]]}, "partitions names a partition twice"),
    ({"kind": "kafka-stopped", "generation": 0, "batch": None, "partitions": [["t", 0]],
      "offsets": [["t", 0, 1]]}, "offsets without a committed batch"),
    ({"kind": "kafka-stopped", "generation": 0, "batch": 3, "partitions": [["t", 0]],
      "offsets": None}, "offsets is not a list"),
    ({"kind": "kafka-stopped", "generation": 0, "batch": 3, "partitions": [[0, 0]] * 200_001,
      "offsets": None}, "partitions is not a list of at most 100000 rows"),
])
def test_hostile_reports_are_refused_at_the_task(data: Any, says: str) -> None:
    with pytest.raises(RescaleRefused, match="task q.t7: stop report: .*" + says):
        parse_report(data, "q.t7")


def test_every_problem_of_a_report_at_once() -> None:
    with pytest.raises(RescaleRefused) as got:
        parse_report({"kind": "kafka-stopped", "generation": -4, "batch": 1.5,
                      "partitions": [["t", -1]], "offsets": [["t", 0, "x"]]}, "q.t1")
    for says in ("generation -4", "batch 1.5", "partitions[0]", "offsets[0]"):
        assert says in str(got.value)
