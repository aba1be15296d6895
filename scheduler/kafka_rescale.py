"""The scheduler's side of rescaling a Kafka-fed operator by the offset handover (pure).

Owns the steps of one such rescale, from k_old to k_new instances (docs/kafka.md, "Rescaling a
Kafka-fed operator: the scheduler's side"): ask every running old instance to stop at a batch
boundary; collect each one's stop report (`parse_report`: its generation, last committed batch,
pinned partition list and committed end offsets, which its executor read from its own
checkpoint folder with `executor.kafka_handover.old_offsets`); once all old instances reported,
compute the handover (`common.kafka_handover.handover`) and launch instances 1..k_new in a new
checkpoint generation, each with its share and Spark startingOffsets; slots beyond k_new stay
stopped (dormant). A handover that cannot be computed exactly is refused with every problem,
located by task, and the old instances resume on their own checkpoints (nothing was moved, so
nothing is lost). A stop at the boundary is a planned end, not a failure: an old instance that
fails instead while stopping is restarted on its checkpoint by the lifecycle, as any failure,
and asked to stop again.

Pure: no I/O, no clock (the caller passes `now`). Does not own stopping a query or reading a
checkpoint (`executor.runtime.TaskRuntime.stop_at_boundary`, `executor.kafka_handover`), the
handover's arithmetic (`common.kafka_handover`), nor the task records and launches
(`scheduler.state`, `scheduler.elasticity`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from common.kafka_handover import MAX_OFFSET, HandoverError, handover, offsets_json
from common.kafka_params import KafkaParamError, parse_starting_offsets
from common.kafka_partitions import MAX_SHARES, Partition, block, starting_offsets_for

STOPPED_KIND = "kafka-stopped"  # the `kind` of a stop report in a task's status data
MAX_REPORTED_PARTITIONS = 100_000  # a report listing more is not one we wrote

# what the scheduler's task records say of a slot, as this module needs it
SlotState = Literal["running", "starting", "stopped", "failed", "dormant"]
Phase = Literal["stopping", "launching", "done", "refused"]


class RescaleRefused(ValueError):
    """A Kafka rescale that cannot be made exactly; the message lists every problem, located."""


@dataclass(frozen=True)
class StopReport:
    """What an old instance's executor reports once it stopped at a batch boundary."""

    task_id: str
    generation: int
    batch: int | None  # its last committed micro-batch (None: it committed none)
    partitions: tuple[Partition, ...]  # its pinned, sorted partition list (all instances')
    # its position, for its block: the end offsets of `batch`; with no batch committed, the
    # offsets it was handed over (generation > 0; -2/-1 for a partition never read yet), or
    # None (generation 0: it starts where the source starts)
    offsets: dict[Partition, int] | None


@dataclass(frozen=True)
class Launch:
    """A new instance: slot `task_id` in checkpoint generation `generation`, share of shares,
    starting at Spark's `starting_offsets` JSON."""

    task_id: str
    generation: int
    share: int
    shares: int
    starting_offsets: str


@dataclass(frozen=True)
class Step:
    """What to do now: slots to ask to stop at a batch boundary, new instances to launch, old
    slots to leave stopped (dormant) or to resume on their own checkpoints (a refusal)."""

    stop: tuple[str, ...] = ()
    launch: tuple[Launch, ...] = ()
    sleep: tuple[str, ...] = ()
    resume: tuple[str, ...] = ()
    refused: str = ""


@dataclass
class KafkaRescale:
    """One rescale in flight (the caller keeps it, e.g. beside `scheduler.elasticity.Rescale`)."""

    operator: str
    slots: tuple[str, ...]
    k_old: int
    k_new: int
    generation: int  # the old instances' checkpoint generation; the new one is generation + 1
    starting: str | None  # the source's starting offsets (None: it starts at a timestamp)
    asked_at: float
    phase: Phase = "stopping"
    asked: set[str] = field(default_factory=set)
    reports: dict[str, StopReport] = field(default_factory=dict)
    launches: tuple[Launch, ...] = ()
    reason: str = ""
    stopped_at: float | None = None  # every old instance stopped: the pause starts
    running_at: float | None = None  # every new instance runs: the pause ends

    @property
    def pause_s(self) -> float | None:
        """The stop-the-world pause: from the rescale's request to the new instances running
        (no instance reads the topic in between, at least from the last stop)."""
        return None if self.running_at is None else self.running_at - self.asked_at


def begin(operator: str, slots: Sequence[str], k_old: int, k_new: int, minimum: int,
          generation: int, starting: str | None, now: float) -> KafkaRescale:
    """A rescale of `operator` (slots 1..max, `k_old` of them running) to `k_new`; RescaleRefused
    with every problem when the counts do not allow one."""
    at = f"operator {operator}"
    problems = []
    for name, k in (("running", k_old), ("asked", k_new)):
        if isinstance(k, bool) or not isinstance(k, int) or not \
                max(1, minimum) <= k <= min(len(slots), MAX_SHARES):
            problems.append(f"{name} parallelism {k!r} is not one of "
                            f"{max(1, minimum)}..{min(len(slots), MAX_SHARES)} (an instance that "
                            "reads a share of the partitions needs at least one)")
    if not problems and k_old == k_new:
        problems.append(f"already runs {k_new} instances")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        problems.append(f"generation {generation!r} is not a whole number >= 0")
    if len(set(slots)) != len(slots):
        problems.append("its slots are not distinct tasks")
    if problems:
        raise RescaleRefused(f"{at}: " + "; ".join(problems))
    return KafkaRescale(operator, tuple(slots), k_old, k_new, generation, starting, now)


def parse_report(data: Any, task_id: str) -> StopReport:
    """An old instance's stop report (status data `{"kind": "kafka-stopped", "generation": g,
    "batch": N|null, "partitions": [[topic, p], ...], "offsets": [[topic, p, offset], ...]|null}`),
    checked; RescaleRefused with every problem, located at the task."""
    at = f"task {task_id}: stop report"
    if not isinstance(data, Mapping) or data.get("kind") != STOPPED_KIND:
        raise RescaleRefused(f"{at}: not a {STOPPED_KIND} report")
    problems: list[str] = []
    said, batch = data.get("generation"), data.get("batch")
    generation = said if isinstance(said, int) and _whole(said, 2**31) else -1
    if generation < 0:
        problems.append(f"generation {_short(said)} is not a whole number")
    if batch is not None and not _whole(batch, MAX_OFFSET):
        problems.append(f"batch {_short(batch)} is not a whole number or null")
    partitions = _pairs(data.get("partitions"), 2, "partitions", problems)
    offsets = None if data.get("offsets") is None and batch is None else \
        _pairs(data.get("offsets"), 3, "offsets", problems, batch is None)
    if batch is None and data.get("offsets") is not None and generation == 0:
        problems.append("offsets without a committed batch in generation 0 (only an instance "
                        "started from a handover reports the offsets it was handed)")
    if batch is None and data.get("offsets") is None and generation > 0:
        problems.append(f"no offsets in generation {generation}: an instance started from a "
                        "handover reports the offsets it was handed until it commits a batch")
    if problems:
        raise RescaleRefused(f"{at}: " + "; ".join(problems))
    return StopReport(task_id, generation, None if batch is None else int(batch),
                      tuple(sorted((str(t), int(p)) for t, p in partitions)),
                      None if offsets is None else {(str(t), int(p)): int(o)
                                                     for t, p, o in offsets})


def _whole(value: object, top: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top


def _short(value: object) -> str:
    return repr(value)[:40]


def _pairs(value: object, width: int, name: str, problems: list[str],
           markers: bool = False) -> list[list[Any]]:
    """`value` as a list of [topic, partition(, offset)] rows; problems added otherwise.
    `markers`: an offset may be -2 or -1 (earliest, latest: a handed-over partition never
    read)."""
    if not isinstance(value, list) or len(value) > MAX_REPORTED_PARTITIONS:
        problems.append(f"{name} is not a list of at most {MAX_REPORTED_PARTITIONS} rows")
        return []
    good = []
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != width or not isinstance(row[0], str) or \
                not all(_whole(x, MAX_OFFSET) or (markers and j == 2 and x in (-2, -1)
                                                   and not isinstance(x, bool))
                        for j, x in enumerate(row[1:], 1)):
            problems.append(f"{name}[{i}] {_short(row)} is not [topic, partition"
                            f"{', offset' if width == 3 else ''}] of whole numbers")
            if len(problems) > 20:
                break
            continue
        good.append(row)
    keys = [(r[0], r[1]) for r in good]
    if len(set(keys)) != len(keys):
        problems.append(f"{name} names a partition twice")
    return good


def report(r: KafkaRescale, stopped: StopReport) -> None:
    """Record an old instance's stop report (its stop is planned: not a failure)."""
    if r.phase == "stopping" and stopped.task_id in r.slots[:r.k_old]:
        r.reports[stopped.task_id] = stopped


def step(r: KafkaRescale, states: Mapping[str, SlotState], now: float) -> Step:
    """The next step of `r` given each slot's state (pure but for `r`'s own bookkeeping)."""
    old = r.slots[:r.k_old]
    if r.phase == "stopping":
        for task in old:  # a failed or restarted instance is asked again once it runs
            if states.get(task) != "running" and task not in r.reports:
                r.asked.discard(task)
        ask = tuple(t for t in old if states.get(t) == "running" and t not in r.asked
                    and t not in r.reports)
        r.asked.update(ask)
        if len(r.reports) < len(old) or any(states.get(t) != "stopped" for t in old):
            return Step(stop=ask)
        r.stopped_at = now
        return _launch(r)
    if r.phase == "launching" and all(states.get(launch.task_id) == "running"
                                      for launch in r.launches):
        r.phase, r.running_at = "done", now
    return Step()


def _launch(r: KafkaRescale) -> Step:
    """All old instances stopped: the handover, or a refusal and the old instances resumed."""
    old = r.slots[:r.k_old]
    try:
        r.launches = plan(r, [r.reports[t] for t in old])
    except RescaleRefused as exc:
        r.phase, r.reason = "refused", str(exc)
        return Step(resume=old, refused=r.reason)
    r.phase = "launching"
    return Step(launch=r.launches, sleep=old[r.k_new:])


def plan(r: KafkaRescale, reports: Sequence[StopReport]) -> tuple[Launch, ...]:
    """Instances 1..k_new of generation + 1 from the old instances' reports (in slot order);
    RescaleRefused with every problem, located by task."""
    at = f"operator {r.operator}, rescale {r.k_old} -> {r.k_new}"
    problems = [f"task {s.task_id} reports generation {s.generation}, not {r.generation}: a stale "
                "report" for s in reports if s.generation != r.generation]
    problems += [f"task {s.task_id} was started with other partitions ({len(s.partitions)}) than "
                 f"task {reports[0].task_id} ({len(reports[0].partitions)})"
                 for s in reports[1:] if s.partitions != reports[0].partitions]
    if not problems:
        problems += _handed_problems(reports, r.k_old)
    if problems:
        raise RescaleRefused(f"{at}: " + "; ".join(problems))
    committed = [s.offsets if s.batch is not None else None for s in reports]
    try:
        instances = handover(reports[0].partitions, r.k_old, committed, r.k_new,
                             _never_read(reports, r.k_old, r.starting))
    except HandoverError as exc:
        named = ", ".join(f"{i} = task {s.task_id}" for i, s in enumerate(reports, 1))
        raise RescaleRefused(f"{at}: {exc} (old instances: {named})") from None
    return tuple(Launch(r.slots[i.share - 1], r.generation + 1, i.share, i.shares,
                        i.starting_offsets) for i in instances)


def _handed_problems(reports: Sequence[StopReport], k_old: int) -> list[str]:
    """An instance that committed nothing since it started from a handover reports the offsets
    it was handed: they must be exactly its block."""
    listed = reports[0].partitions
    return [f"task {s.task_id}: the offsets it was handed over are not its block "
            f"({len(s.offsets)} partitions)" for i, s in enumerate(reports, 1)
            if s.batch is None and s.offsets is not None and set(s.offsets) !=
            {listed[j] for j in block(len(listed), i, k_old)}]


def _never_read(reports: Sequence[StopReport], k_old: int, starting: str | None) -> str | None:
    """Where each partition whose old owner committed no batch starts again: where the source
    starts (`starting`), except in an instance that itself started from a handover: there, the
    offsets it was handed (exact offsets, or -2/-1 for partitions still never read, which are
    the source's own start). Without such instances, `starting` itself."""
    handed = {p: o for s in reports if s.batch is None and s.offsets is not None
              for p, o in s.offsets.items()}
    listed = reports[0].partitions
    rest = [listed[j] for i, s in enumerate(reports, 1) if s.batch is None and s.offsets is None
            for j in block(len(listed), i, k_old)]
    if not handed or (rest and starting is None):
        return starting  # a timestamp start with partitions never read: the handover refuses
    try:
        source = _source_start(starting, rest) if rest and starting is not None else {}
    except KafkaParamError:
        return starting  # the handover says what is wrong with it
    return offsets_json({**source, **handed})


def _source_start(starting: str, partitions: Sequence[Partition]) -> dict[Partition, int]:
    """The source's own starting offset of each of `partitions` (-2 earliest, -1 latest)."""
    canonical = parse_starting_offsets(starting)
    if canonical in ("earliest", "latest"):
        return {p: -2 if canonical == "earliest" else -1 for p in partitions}
    cut = json.loads(starting_offsets_for(canonical, partitions))
    return {(t, int(q)): int(v) for t, ps in cut.items() for q, v in ps.items()}
