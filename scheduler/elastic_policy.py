"""Automatic elasticity's decision: how many instances a partitioned operator needs (pure).

Owns the rate-based model of automatic mode (the paper's section 4.3, docs/architecture.md
"References": the rate tuples arrive at an operator against the rate its instances can process;
DS2's "true processing rate": rows processed per second of *busy* time, so idle time does not hide
capacity), sized on a micro-batch cost model where the batches allow it (docs/elasticity.md,
"The cost model"): a batch of r rows takes fixed + per_row x r seconds, both fitted
(`common.batch_cost`) from the batches the instances' heartbeats counted (`spans_of`), and one
instance's capacity is the rate it sustains with batches no longer than the policy's target
(`modelled`); an instance whose executor was throttled in most of its cgroup's cpu periods is at
its limit (`Rates.at_limit`), and a scale-out's target is sized on no more than the rows per
busy second such an instance showed (`sized_at_limit`: the model is fitted at the current
parallelism and over-stated each instance at the next). Where the batches cannot be fitted (too
few, all of a similar size) the model decided last is kept, else the rate model below decides
and says why. A
micro-batch engine that runs batches back to back is busy whenever rows trickle in,
and a batch has a fixed cost: rows per busy second then grow with the load, and only an instance
that falls behind (its batches grow) shows what it can do. So the model keeps a `Capacity` per
operator: the true rate seen while the instances fell behind (`pressed`: the upstream's source
backlog or the batches its channel writers retain grew all window), else the best rate seen so far,
which is only a lower bound; without a cost model, rows per busy second under pressure are
measured only where the instances fell behind (`fell_behind`: their queue grew in this window
and the one before), else a lower bound on which pressure alone moves nothing (`small_queue`).
Scale-outs act on pressure or on a capacity measured under it
(pressure beside instances the capacity says suffice only when the queue is real:
`real_queue`); scale-ins on a capacity that is at most the real one, so neither is fooled
by the fixed cost:
- `Sample`, one heartbeat's cumulative figures of one task, and `sample_of` (heartbeat figures
  -> Sample, refusing what cannot be a sample);
- `SampleHistory`, a bounded history of samples per task (the last `keep_seconds`, at most
  `max_samples` each), fed on every heartbeat;
- `ElasticPolicy` (bounds, target utilisation, scale-in margin, cool-down, window, minimum
  samples), `OperatorView` (what `decide` sees of one operator) and `decide`, which returns a
  `Decision`: scale out, scale in or hold, the target parallelism, a bounded reason class, the
  measured `Rates`, the operator's `Capacity` after this window (`learn`) and an explanation
  with the numbers; `warming_up` names the instances whose first micro-batch (a cold one:
  Python workers, code generation) is still inside the window, which is not measured, and
  `stabilizing` those inside their stabilization window (their attempt's first
  `stabilization_seconds`, as Flink's autoscaler: their batches stay out of the cost fit,
  `settled`, and the policy holds unless an `emergency`). Busy
  fractions count the batch running now (`busy_in`: a heartbeat's `running_ms`), true rates
  only finished batches (a batch's rows are counted when it ends).
Reads no clock (the caller passes `now`, the same clock as the samples' `at`) and does no I/O.
Does not own when it is asked or how a decision is applied (the scheduler and the rescale
mechanism), nor the metrics that count decisions (`scheduler.metrics`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Literal, Mapping, Sequence

from common.batch_cost import (
    TARGET_BATCH_SECONDS, BatchCost, BatchSpan, fit, fit_on_cpu,
)
from common.messages import retained_of

DecisionKind = Literal["out", "in", "hold"]
# why: "load" (the model's need), "backlog" (a queue grew all window), "bounds" (min/max),
# "steady" (the current parallelism fits), "settling" (the need changed inside the window),
# "cooldown", "no_data", "draining", "catching_up" (an instance ended no micro-batch in the
# window and runs one: the rows queued meanwhile wait for its end), "stabilizing" (an instance
# is inside its stabilization window: its first batches are not measured), "small_queue" (rows
# waited longer all window, but the queue is too small to be the instances': `real_queue`,
# or, without a cost model, the instances did not fall behind: `fell_behind`)
Reason = Literal["load", "backlog", "bounds", "steady", "settling", "cooldown", "no_data",
                 "draining", "catching_up", "stabilizing", "small_queue"]
REASONS: tuple[str, ...] = ("load", "backlog", "bounds", "steady", "settling", "cooldown",
                            "no_data", "draining", "catching_up", "stabilizing", "small_queue")
NEED_CAP = 1_000_000  # a need above any parallelism, so huge or odd figures stay integers
MAX_FIGURE = 1e15  # no counter of a task reaches this; bounding them keeps the sums finite
MAX_TIME = 1e12  # seconds, either side of the clock's zero
PRESSED_BUSY = 0.9  # busy fraction of wall time: an instance that falls behind is never idle
RETAINED_RISE = 5.0  # batches: less is acknowledgements' ebb and flow (or a start-up), not a queue
THROTTLED_MOST = 0.5  # CFS periods throttled: an instance throttled in more is at its cpu limit
# seconds after an instance's (re)start (its attempt's first ended micro-batch) whose batches
# are not measured, as Flink's `job.autoscaler.stabilization.interval`: the first ones are cold
# (Python workers, code generation, the JVM's JIT on a fraction of a core, first state-store
# files) and read a start's backlog, and their cost biases the fit high (docs/elasticity.md,
# "Stabilization": on 0.35-cpu agents 0.55-0.68 s of cpu per batch in an instance's first
# minute against 0.20-0.39 s later)
STABILIZATION_SECONDS = 60.0
# while an instance stabilizes the policy acts only when rows queue at least this many times as
# fast as the instances process them (backlog growing all window, the busiest instance busy):
# a cold instance is slower, not that much slower; a x4 step on one instance is
EMERGENCY_RATIO = 1.0
# instances a scale-out adds at most beyond the cost model's need where an instance at its cpu
# limit showed fewer rows per busy second than the model (`sized_at_limit`): the model fitted
# at one parallelism over-stated each instance at the next by 25 % to 2x on 0.35-cpu agents
# (issue 31's benchmark), one instance short
LIMIT_MARGIN = 1
# rows waiting longer all window beside instances the model says suffice (rule 5's "one more")
# are the instances' queue only when it grows by at least this share of the arrival, in the
# window and in the one before it, or when the sources' backlog is more than the instances drain
# in a window at the model's capacity (`real_queue`): on 0.35-cpu agents two instances that
# kept up processed 92-101 % of the arrival with the retained batches rising and the backlog
# growing 1-6 rows/s (issue 31's benchmark, 2026-11-30), and each flap after a step down came
# with the instances processing as much as arrived; the worst over-statement seen (2x: models
# of 583-641 rows/s, two instances doing 253-310 each, 2026-11-30 05:32) left two instances up
# to ~20 % short of the ~600 rows/s arriving
QUEUE_SHARE = 0.1


# --- samples ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One task's cumulative figures at time `at` (seconds, the scheduler's clock): rows in and
    out, milliseconds spent in finished micro-batches, its sources' backlog (offsets not yet
    read), the batches its channel writers retain (sent, not yet acknowledged by every reader)
    and, not cumulative, how long its micro-batch running now has run (`running_ms`, 0: none)."""

    at: float
    tuples_in: float
    tuples_out: float
    busy_ms: float
    backlog: float = 0.0
    retained: float = 0.0
    running_ms: float = 0.0
    batches: float = 0.0  # micro-batches ended in this attempt (cumulative; -> the cost model)
    nr_periods: float = 0.0  # the executor's cgroup's CFS periods (cumulative; 0: not in one)
    nr_throttled: float = 0.0  # ... and those in which it was throttled
    dropped: float = 0.0  # rows its drop operators shed (cumulative; -> scheduler.shed_problem)
    cpu_ms: float = 0.0  # its container's cpu time in the batches below (cumulative; -> the model)
    cpu_batches: float = 0.0  # ended batches whose cpu time was measured (cumulative)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value):
                raise ValueError(f"sample {name} must be a finite number, got {value!r}")
            low, high = (-MAX_TIME, MAX_TIME) if name == "at" else (0.0, MAX_FIGURE)
            if not low <= value <= high:
                raise ValueError(f"sample {name} must be in [{low:g}, {high:g}], got {value!r}")


SAMPLE_FIGURES = ("tuples_in", "tuples_out", "busy_ms")  # what a heartbeat must carry


def sample_of(at: float, figures: Mapping[str, Any]) -> Sample | None:
    """A Sample from one task's heartbeat figures (`TaskRecord.totals()`); None when a figure
    is missing (an executor that does not report busy time) or is not a finite number >= 0."""
    if any(name not in figures for name in SAMPLE_FIGURES):
        return None
    try:
        tuples_in, tuples_out, busy_ms = (figures[name] for name in SAMPLE_FIGURES)
        return Sample(at, tuples_in, tuples_out, busy_ms,
                      backlog=figures.get("backlog", 0.0),
                      retained=float(sum(retained_of(figures).values())),
                      running_ms=figures.get("running_ms", 0.0),
                      batches=figures.get("batches_ended", 0.0),
                      nr_periods=figures.get("cpus_nr_periods", 0.0),
                      nr_throttled=figures.get("cpus_nr_throttled", 0.0),
                      dropped=figures.get("rows_dropped", 0.0),
                      cpu_ms=figures.get("cpu_ms", 0.0),
                      cpu_batches=figures.get("cpu_batches", 0.0))
    except (ValueError, TypeError):
        return None


def blank(sample: Sample) -> bool:
    """No rows in or out and no busy time: what a heartbeat carries for a task whose runner
    has no metrics to read now (its query being rebuilt, e.g. a generator's rate changed by a
    control tuple). The counters are cumulative over attempts (`TaskRecord.totals`), so after
    figures this is no measurement: recorded, the next sample's whole count would read as
    rows since a restart (`increase`), a spike of arrival (2,662 rows/s for a 600 rows/s
    generator in the 0.35-cpu benchmark, 2026-11-29)."""
    return sample.tuples_in == 0 and sample.tuples_out == 0 and sample.busy_ms == 0


def first_batch_after(known: float | None, last: Sample | None, sample: Sample) -> float | None:
    """When the task's current attempt ended its first micro-batch, after `sample` follows
    `last` (None: the task's first sample) and `known` was the answer before: a fall of the
    batch count is a new attempt (it counts from 0), whose first batch ended at the first
    sample that counts one after a sample that counted none. None: no batch ended in this
    attempt yet, the task counts none (an older executor), or its first sample already counted
    some (it ran before it was first seen, e.g. by a scheduler that just took over: warm)."""
    if last is None:
        return None
    if sample.batches < last.batches:  # a new attempt
        return sample.at if sample.batches > 0 else None
    if known is not None:
        return known
    return sample.at if sample.batches > 0 and last.batches == 0 else None


def first_batch_of(samples: Sequence[Sample]) -> float | None:
    """`first_batch_after` folded over `samples` (oldest first)."""
    known, last = None, None
    for sample in samples:
        known, last = first_batch_after(known, last, sample), sample
    return known


class SampleHistory:
    """The recent samples of each task (key: task id), oldest first: the last `keep_seconds`
    before the task's newest sample, at most `max_samples`. A sample not newer than the task's
    last one is ignored (a duplicate or reordered heartbeat), and so is a `blank` one after
    figures (a heartbeat without metrics). Beside them, when each task's current attempt ended
    its first micro-batch (`first_batch_after`), kept however old (the stabilization window)."""

    def __init__(self, keep_seconds: float = 60.0, max_samples: int = 240) -> None:
        if keep_seconds <= 0 or max_samples < 2:
            raise ValueError("a history keeps more than 0 s and at least 2 samples")
        self.keep_seconds, self.max_samples = keep_seconds, max_samples
        self._samples: dict[str, list[Sample]] = {}
        self._first_batch: dict[str, float] = {}

    def record(self, key: str, sample: Sample | None) -> None:
        """Add `sample` (None: nothing) to task `key`'s history and drop what is too old."""
        if sample is None:
            return
        samples = self._samples.setdefault(key, [])
        if samples and (sample.at <= samples[-1].at or (blank(sample) and not blank(samples[-1]))):
            return
        first = first_batch_after(self._first_batch.get(key), samples[-1] if samples else None,
                                  sample)
        if first is None:
            self._first_batch.pop(key, None)
        else:
            self._first_batch[key] = first
        samples.append(sample)
        oldest = sample.at - self.keep_seconds
        first = next((i for i, s in enumerate(samples) if s.at >= oldest), len(samples))
        del samples[:max(first, len(samples) - self.max_samples)]

    def samples(self, key: str) -> tuple[Sample, ...]:
        return tuple(self._samples.get(key, ()))

    def first_batch_at(self, key: str) -> float | None:
        """When task `key`'s current attempt ended its first micro-batch (None: not yet, or
        it counts no batches)."""
        return self._first_batch.get(key)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget every task not in `keys` (ended, retired, its query gone)."""
        wanted = set(keys)
        for key in [k for k in self._samples if k not in wanted]:
            del self._samples[key]
            self._first_batch.pop(key, None)


# --- what decide sees ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ElasticPolicy:
    """How one operator is scaled. Scale out when the load needs more than `target_utilisation`
    of the current instances; scale in only to a parallelism that would be at most
    `target_utilisation * (1 - scale_in_margin)` busy (the hysteresis); nothing changes within
    `cooldown_seconds` of the last change; rates are taken over the last `window_seconds`, from
    at least `min_samples` samples of every task covering at least half the window; an
    instance's first `stabilization_seconds` of batches are not measured (`stabilizing`)."""

    min_parallelism: int = 1
    max_parallelism: int = 4
    target_utilisation: float = 0.8
    scale_in_margin: float = 0.15
    cooldown_seconds: float = 20.0
    window_seconds: float = 10.0
    min_samples: int = 5
    target_batch_seconds: float = TARGET_BATCH_SECONDS  # the cost model sizes for batches <= this
    # an instance's batches in its first this many seconds (from its attempt's first ended
    # batch) are not measured, and the policy holds while one is inside them (`stabilizing`)
    stabilization_seconds: float = STABILIZATION_SECONDS

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("elastic policy: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Everything wrong with these settings (empty: none)."""
        found = []
        if not 1 <= self.min_parallelism <= self.max_parallelism:
            found.append(f"min-parallelism {self.min_parallelism} must be >= 1 and <= "
                         f"max-parallelism {self.max_parallelism}")
        if not 0.0 < self.target_utilisation <= 1.0:
            found.append(f"target utilisation {self.target_utilisation} must be in (0, 1]")
        if not 0.0 <= self.scale_in_margin < 1.0:
            found.append(f"scale-in margin {self.scale_in_margin} must be in [0, 1)")
        if not (math.isfinite(self.cooldown_seconds) and self.cooldown_seconds >= 0):
            found.append(f"cool-down {self.cooldown_seconds} s must be >= 0")
        if not (math.isfinite(self.window_seconds) and self.window_seconds > 0):
            found.append(f"window {self.window_seconds} s must be > 0")
        if not (math.isfinite(self.target_batch_seconds) and self.target_batch_seconds > 0):
            found.append(f"target batch time {self.target_batch_seconds} s must be > 0")
        if not (math.isfinite(self.stabilization_seconds) and self.stabilization_seconds >= 0):
            found.append(f"stabilization {self.stabilization_seconds} s must be a number >= 0")
        if self.min_samples < 3:
            found.append(f"minimum samples {self.min_samples} must be >= 3 (each half of "
                         f"the window needs two)")
        return found

    def clamp(self, parallelism: int) -> int:
        return max(self.min_parallelism, min(self.max_parallelism, parallelism))


@dataclass(frozen=True)
class Capacity:
    """What one instance of an operator can process: `rate` rows per second. With a `cost`
    model (fitted from the instances' batches, `common.batch_cost`), the rate it sustains with
    batches no longer than the policy's target, and `measured`. Without one (`note` says
    why), rows per busy second: `measured` when seen while the instances fell behind (their
    batches grew, so a batch's fixed cost was spread over many rows: the real figure);
    otherwise the best rate seen while they kept up, a lower bound. `at`: when it was last set
    (the scheduler's clock)."""

    rate: float
    measured: bool
    at: float
    cost: BatchCost | None = None
    # with a cost: why it was not refitted now; without: why there is none (commentary: not
    # part of what the capacity is, so not compared)
    note: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OperatorView:
    """One elastic operator as the scheduler sees it: its current parallelism, the samples of
    each active instance task and of each task feeding its splitter (by task id, oldest
    first), when its parallelism last changed (None: never), and its capacity as the last
    decision left it (None: not known yet)."""

    query_id: str
    operator_id: str
    parallelism: int
    instances: Mapping[str, Sequence[Sample]]
    upstreams: Mapping[str, Sequence[Sample]]
    last_change_at: float | None = None
    capacity: Capacity | None = None
    # when each instance's current attempt ended its first micro-batch (`SampleHistory`); an
    # instance missing here: from its samples (`first_batch_of`)
    first_batch_at: Mapping[str, float] = field(default_factory=dict)

    def started(self, key: str) -> float | None:
        """When instance `key`'s attempt ended its first micro-batch (None: unknown)."""
        known = self.first_batch_at.get(key)
        return known if known is not None else first_batch_of(self.instances.get(key, ()))


def view_of(history: SampleHistory, query_id: str, operator_id: str, parallelism: int,
            instances: Iterable[str], upstreams: Iterable[str],
            last_change_at: float | None, capacity: Capacity | None = None) -> OperatorView:
    """The view `decide` needs, from `history`: `instances` are the ids of the operator's
    active instance tasks (slots 1..parallelism), `upstreams` those of the tasks whose splitter
    feeds it."""
    instances = list(instances)
    firsts = {key: history.first_batch_at(key) for key in instances}
    return OperatorView(query_id, operator_id, parallelism,
                        {key: history.samples(key) for key in instances},
                        {key: history.samples(key) for key in upstreams}, last_change_at,
                        capacity, {key: at for key, at in firsts.items() if at is not None})


@dataclass(frozen=True)
class Rates:
    """What the window showed. Rates in rows per second; `true_rate` is rows per busy second
    of one instance; utilisations are busy fractions of wall time (0..1)."""

    arrival: float  # upstream_out + backlog_slope * upstream selectivity
    upstream_out: float  # rows the upstream tasks handed to the operator's splitter
    backlog_slope: float  # growth of the upstream sources' backlog (offsets per second)
    backlog: float  # the upstream sources' backlog at the last samples
    backlog_growing: bool  # it grew over the whole window (never fell, ended higher)
    retained: float  # batches the upstream tasks' channel writers hold, at the last samples
    retained_rising: bool  # they rose over the whole window (`rising`)
    processed: float  # rows the instances read
    true_rate: float | None  # None: the instances were never busy in the window
    utilisation: float  # mean over the instances
    busiest: float  # the busiest instance's
    window: float  # seconds the samples covered (the shortest task's span)
    # the longest an instance that ended no batch in the window has been in the one it runs
    # (seconds; 0: every instance ended a batch in the window, or runs none)
    in_one_batch: float = 0.0
    # the largest share of CFS periods in which an instance's executor was throttled (0: none,
    # or not in a cgroup it can read)
    throttled: float = 0.0

    @property
    def at_limit(self) -> bool:
        """An instance was throttled most of the window: it uses all the cpu it may."""
        return self.throttled >= THROTTLED_MOST

    @property
    def queued(self) -> bool:
        """Rows waited longer and longer upstream all window."""
        return self.backlog_growing or self.retained_rising

    @property
    def pressed(self) -> bool:
        """The instances fell behind all window: rows queued upstream while the busiest instance
        was busy nearly all the time. A queue beside idle instances is not theirs (an upstream
        that stalls or lacks a core): more instances would not drain it. An instance throttled
        most of the window (`at_limit`) is at its limit however busy its batches show it."""
        return self.queued and (self.busiest >= PRESSED_BUSY or self.at_limit)


@dataclass(frozen=True)
class Decision:
    """What to do with one operator: `kind` to `target` (= `current` for hold), why (`reason`,
    a bounded class), the rates of the whole window and of its recent half (None when there
    were not enough samples), the parallelism the recent half's load needs (None when not
    computed), the operator's capacity for the next decision and a sentence with the numbers."""

    query_id: str
    operator_id: str
    kind: DecisionKind
    current: int
    target: int
    reason: Reason
    explanation: str
    rates: Rates | None = None
    needed: int | None = None
    recent: Rates | None = None
    capacity: Capacity | None = None

    @property
    def outcome(self) -> str:
        """The label of `elastiq_elastic_decisions_total`: out, in, or hold's reason."""
        return self.kind if self.kind != "hold" else f"hold_{self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "operator_id": self.operator_id,
                "kind": self.kind, "current": self.current, "target": self.target,
                "reason": self.reason, "needed": self.needed,
                "explanation": self.explanation,
                "rates": asdict(self.rates) if self.rates is not None else None,
                "recent": asdict(self.recent) if self.recent is not None else None,
                "capacity": self.capacity.to_json() if self.capacity is not None else None}


OUTCOMES: tuple[str, ...] = ("out", "in") + tuple(f"hold_{r}" for r in REASONS)


# --- measuring the window (pure) ---------------------------------------------------------------

def increase(values: Sequence[float]) -> float:
    """How much a cumulative counter grew over `values`; a drop is a restart from 0, whose new
    value is what it counted since (never negative)."""
    return sum(after - before if after >= before else after
               for before, after in zip(values, values[1:]))


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of (time, value) points (0 for fewer than two distinct times)."""
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var <= 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


def in_window(samples: Sequence[Sample], now: float, seconds: float) -> list[Sample]:
    """The samples taken in [now - seconds, now], in time order, one per instant."""
    chosen = sorted((s for s in samples if now - seconds <= s.at <= now), key=lambda s: s.at)
    return [s for i, s in enumerate(chosen) if i == 0 or s.at > chosen[i - 1].at]


def growing(samples: Sequence[Sample]) -> bool:
    """The backlog never fell and rose in each half of the samples (a backlog that sat still
    and jumped only at the end did not grow all window: the load just changed)."""
    values = [s.backlog for s in samples]
    if len(values) < 2 or any(b < a for a, b in zip(values, values[1:])):
        return False
    if len(values) < 4:
        return values[-1] > values[0]
    middle = len(values) // 2
    return values[middle - 1] > values[0] and values[-1] > values[middle]




def rising(samples: Sequence[Sample]) -> bool:
    """The batches retained upstream rose over the whole window: up by at least RETAINED_RISE,
    and the recent half's lowest and highest both above the early half's. Acknowledgements come
    a micro-batch at a time, so the count is a saw-tooth even when the instances keep up; a
    queue shows as a saw-tooth that climbs."""
    values = [s.retained for s in samples]
    if len(values) < 4 or values[-1] - values[0] < RETAINED_RISE:
        return False
    middle = len(values) // 2
    early, recent = values[:middle], values[middle:]
    return min(recent) > min(early) and max(recent) > max(early)


def _windows(tasks: Mapping[str, Sequence[Sample]], now: float, policy: ElasticPolicy
             ) -> tuple[dict[str, list[Sample]], list[str]]:
    """Each task's window, and a phrase for every task whose window is too thin."""
    windows, thin = {}, []
    for key, samples in sorted(tasks.items()):
        window = in_window(samples, now, policy.window_seconds)
        span = window[-1].at - window[0].at if window else 0.0
        if len(window) < policy.min_samples or span < policy.window_seconds / 2:
            thin.append(f"{key} ({len(window)} samples over {span:.1f} s)")
        windows[key] = window
    return windows, thin


def warming_up(tasks: Mapping[str, Sequence[Sample]], since: float) -> list[str]:
    """The tasks whose first micro-batch ended after `since` (an earlier sample shows no busy
    time yet, and a later one at or after `since` the first), or runs now (no sample shows busy
    time, the last a batch running) (pure). A task whose retained samples all show busy time (it
    ran before them) is warm; one that never ran a batch and runs none is idle, not starting."""
    cold = []
    for key, samples in sorted(tasks.items()):
        first = next((i for i, s in enumerate(samples) if s.busy_ms > 0), None)
        if first is None and samples and samples[-1].running_ms > 0:
            cold.append(f"{key} (its first batch has run {samples[-1].running_ms / 1000:.1f} s)")
        elif first is not None and first > 0 and samples[first].at >= since:
            cold.append(f"{key} (its first batch ended {samples[-1].at - samples[first].at:.1f} "
                        f"s ago)")
    return cold


def stabilizing(view: OperatorView, policy: ElasticPolicy, now: float) -> list[str]:
    """The instances inside their stabilization window: their attempt's first micro-batch
    ended less than `policy.stabilization_seconds` before `now` (`OperatorView.started`), each
    with its numbers (pure)."""
    inside = []
    for key in sorted(view.instances):
        started = view.started(key)
        if started is not None and now - started < policy.stabilization_seconds:
            inside.append(f"{key} ({now - started:.1f} s of {policy.stabilization_seconds:g} s "
                          f"since its first micro-batch)")
    return inside


def settled(samples: Sequence[Sample], started: float | None,
            seconds: float) -> Sequence[Sample]:
    """The samples taken once the task's stabilization window (`seconds` from `started`, its
    attempt's first ended batch; None: unknown, all) was over: what the cost model may fit."""
    if started is None:
        return samples
    return [s for s in samples if s.at >= started + seconds]


def _span(window: Sequence[Sample]) -> float:
    return window[-1].at - window[0].at


def _upstream_rates(windows: Mapping[str, list[Sample]]
                    ) -> tuple[float, float, float, float, bool, float, bool]:
    """(rows out per s, backlog slope scaled by selectivity, raw backlog slope, backlog now,
    growing, retained batches now, rising) summed over the upstream tasks."""
    out = scaled = raw = backlog = retained = 0.0
    grew = rose = False
    for window in windows.values():
        rows_in = increase([s.tuples_in for s in window])
        rows_out = increase([s.tuples_out for s in window])
        selectivity = rows_out / rows_in if rows_in > 0 else 1.0
        task_slope = slope([(s.at, s.backlog) for s in window])
        out += rows_out / _span(window)
        raw += task_slope
        scaled += task_slope * selectivity
        backlog += window[-1].backlog
        grew = grew or growing(window)
        retained += window[-1].retained
        rose = rose or rising(window)
    return out, scaled, raw, backlog, grew, retained, rose


def busy_in(window: Sequence[Sample]) -> float:
    """Seconds of `window` its task spent in micro-batches: the finished batches' time, plus
    the running batch's at the end, less the part of the batch running at the start that came
    before the window (within [0, span])."""
    finished = increase([s.busy_ms for s in window])
    running = window[-1].running_ms - window[0].running_ms
    return min(_span(window), max(0.0, (finished + running) / 1000.0))


def in_one_batch(window: Sequence[Sample]) -> float:
    """Seconds the task has been in the micro-batch it runs at the end of `window` when no
    batch of it ended in the window (rows that queued meanwhile wait for that batch's end, so
    the queue says nothing yet of what it can do); 0 otherwise."""
    if increase([s.busy_ms for s in window]) > 0:
        return 0.0
    return window[-1].running_ms / 1000.0


def _instance_rates(windows: Mapping[str, list[Sample]]) -> tuple[float, float | None, float,
                                                                    float, float]:
    """(rows read per s, true rate per instance or None, mean and max busy fraction, the
    longest `in_one_batch`). The true rate is over finished batches only: a batch's rows are
    counted when it ends, so its time is too; the busy fractions count the running batch."""
    rows = busy = 0.0
    processed, fractions = 0.0, []
    for window in windows.values():
        task_rows = increase([s.tuples_in for s in window])
        rows, busy = rows + task_rows, busy + increase([s.busy_ms for s in window]) / 1000.0
        processed += task_rows / _span(window)
        fractions.append(busy_in(window) / _span(window))
    # busy without a row read (a query starting, a micro-batch's fixed cost) says nothing of
    # what an instance can do: no true rate, as when it was never busy
    true_rate = rows / busy if busy > 0 and rows > 0 else None
    mean = sum(fractions) / len(fractions) if fractions else 0.0
    longest = max((in_one_batch(w) for w in windows.values()), default=0.0)
    return processed, true_rate, mean, max(fractions, default=0.0), longest


def throttled_in(window: Sequence[Sample]) -> float:
    """The share of its cgroup's CFS periods in `window` in which the task's executor was
    throttled (0 when it reported none)."""
    periods = increase([s.nr_periods for s in window])
    return min(1.0, increase([s.nr_throttled for s in window]) / periods) if periods > 0 else 0.0


@dataclass(frozen=True)
class Measured:
    """The rates of the whole window and of its two halves (each task's samples split at the
    one nearest the middle of its span, which both halves share): a change of load inside the
    window shows as halves that disagree."""

    whole: Rates
    early: Rates
    recent: Rates


def _rates(instances: Mapping[str, list[Sample]], upstreams: Mapping[str, list[Sample]]
           ) -> Rates:
    out, scaled, raw, backlog, grew, retained, rose = _upstream_rates(upstreams)
    processed, true_rate, mean, busiest, longest = _instance_rates(instances)
    window = min(_span(w) for w in [*instances.values(), *upstreams.values()])
    throttled = max((throttled_in(w) for w in instances.values()), default=0.0)
    return Rates(arrival=max(0.0, out + scaled), upstream_out=out, backlog_slope=raw,
                 backlog=backlog, backlog_growing=grew, retained=retained,
                 retained_rising=rose, processed=processed,
                 true_rate=true_rate, utilisation=mean, busiest=busiest, window=window,
                 in_one_batch=longest, throttled=throttled)


def _middle(window: Sequence[Sample]) -> int:
    """The index of the sample nearest the middle of the window's time span, leaving each half
    at least two samples (a window has at least three)."""
    middle = (window[0].at + window[-1].at) / 2
    nearest = min(range(len(window)), key=lambda i: abs(window[i].at - middle))
    return max(1, min(len(window) - 2, nearest))


def _half(windows: Mapping[str, list[Sample]], early: bool) -> dict[str, list[Sample]]:
    """Each task's early (up to its middle sample) or recent (from it) half."""
    return {key: w[:_middle(w) + 1] if early else w[_middle(w):] for key, w in windows.items()}


def measure(view: OperatorView, policy: ElasticPolicy, now: float) -> Measured | str:
    """The window's rates (whole and halves), or a sentence saying which tasks lack samples."""
    if not view.instances:
        return "no active instance task has reported"
    if not view.upstreams:
        return "no upstream task has reported"
    instances, thin = _windows(view.instances, now, policy)
    upstreams, thin_up = _windows(view.upstreams, now, policy)
    if thin or thin_up:
        return (f"too few samples in the last {policy.window_seconds:g} s (at least "
                f"{policy.min_samples} over {policy.window_seconds / 2:g} s wanted): "
                + ", ".join(thin + thin_up))
    cold = warming_up(view.instances, now - policy.window_seconds)
    if cold:
        return ("the window holds the first micro-batch of " + ", ".join(cold) +
                " (a first batch also starts Python workers and generates code, so its rows "
                "per busy second are not the instance's rate)")
    halves = [_rates(_half(instances, e), _half(upstreams, e)) for e in (True, False)]
    return Measured(_rates(instances, upstreams), *halves)


# --- deciding (pure) ----------------------------------------------------------------------------

def needed(arrival: float, true_rate: float, utilisation: float) -> int:
    """ceil(arrival / (true_rate x utilisation)): instances that carry `arrival` each busy at
    most `utilisation` of the time (at least 0; NEED_CAP for what no parallelism carries)."""
    capacity = true_rate * utilisation
    if arrival <= 0:
        return 0
    ratio = arrival / capacity if capacity > 0 else math.inf
    if not ratio < NEED_CAP:  # also NaN
        return NEED_CAP
    return max(0, math.ceil(ratio - 1e-9))


def learn(previous: Capacity | None, pressed: bool, true_rate: float | None,
          now: float) -> Capacity | None:
    """The operator's capacity after a window (pure). When the instances fell behind
    (`pressed`), their true rate is the real figure and replaces what was known (the work per
    row may have changed). Otherwise the larger of the known rate and `true_rate`, which the
    instances reached while keeping up; it stays `measured` only if it was."""
    if true_rate is None:
        return previous
    if pressed:
        return Capacity(true_rate, True, now)
    if previous is None:
        return Capacity(true_rate, False, now)
    if true_rate > previous.rate:
        return Capacity(true_rate, previous.measured, now)
    return previous


def spans_of(samples: Sequence[Sample]) -> list[BatchSpan]:
    """The micro-batches that ended between each two consecutive samples of one task (how many,
    their rows, their busy seconds), for the cost model. Left out: a pair across a restart (a
    counter fell: a new attempt counts its batches from 0), one that holds an attempt's first
    batch (a cold one: Python workers, code generation) and one in which no batch ended."""
    spans = []
    for a, b in zip(samples, samples[1:]):
        if b.batches < a.batches or b.tuples_in < a.tuples_in or b.busy_ms < a.busy_ms:
            continue
        if a.batches >= 1 and b.batches > a.batches:
            spans.append(BatchSpan(b.batches - a.batches, b.tuples_in - a.tuples_in,
                                   (b.busy_ms - a.busy_ms) / 1000.0))
    return spans


def cpu_spans_of(samples: Sequence[Sample]) -> list[tuple[BatchSpan, float]]:
    """As `spans_of`, in cpu seconds (the container's, in those batches), each beside its busy
    seconds, for `common.batch_cost.fit_on_cpu`; only the pairs whose every batch had its cpu
    time measured (`cpu_batches` rose as much as `batches`)."""
    spans = []
    for a, b in zip(samples, samples[1:]):
        if b.batches < a.batches or b.tuples_in < a.tuples_in or b.busy_ms < a.busy_ms \
                or b.cpu_ms < a.cpu_ms or b.cpu_batches < a.cpu_batches:
            continue
        ended = b.batches - a.batches
        if a.batches >= 1 and ended > 0 and b.cpu_batches - a.cpu_batches == ended:
            spans.append((BatchSpan(ended, b.tuples_in - a.tuples_in,
                                    (b.cpu_ms - a.cpu_ms) / 1000.0),
                          (b.busy_ms - a.busy_ms) / 1000.0))
    return spans


def effective_target(cost: BatchCost, target: float) -> float:
    """The batch time the model sizes for: `target`, or twice the fixed cost when that alone
    reaches it (no parallelism makes a batch shorter than its fixed cost)."""
    return target if cost.fixed < target else 2.0 * cost.fixed


def modelled(previous: Capacity | None, spans: Sequence[BatchSpan], target: float,
             now: float, cpu_spans: Sequence[tuple[BatchSpan, float]] = ()) -> Capacity | str:
    """The capacity from the cost model fitted over `spans` (every instance's recent batches:
    they run the same plan): the rate one instance sustains with batches no longer than
    `target`. Fitted on cpu time (`fit_on_cpu`) when most spans had their batches' cpu time
    measured (`cpu_spans`), else on busy time; a fit whose fixed cost's standard error is over a
    quarter of `target` is none (`common.batch_cost.MAX_FIXED_ERROR`: it would size on a loose
    intercept). When the spans cannot be fitted, the model the
    last decision fitted, kept (its `note` says why it was not refitted); else the sentence
    saying why there is none (pure)."""
    on_cpu = bool(cpu_spans) and 2 * len(cpu_spans) >= len(spans)
    cost = fit_on_cpu(cpu_spans, target_seconds=target) if on_cpu else \
        fit(spans, target_seconds=target)
    if isinstance(cost, str):
        if previous is not None and previous.cost is not None:
            return replace(previous, note=f"not refitted now: {cost}")
        return cost
    return Capacity(cost.sustained_rate(effective_target(cost, target)), True, now, cost)


def _learnt(view: OperatorView, policy: ElasticPolicy, measured: Measured,
            now: float) -> Capacity | None:
    """The operator's capacity after a window: from the cost model when its instances' recent
    batches fit one (`modelled`); else as before the model, rows per busy second (`_by_rate`),
    measured only where the instances fell behind (`fell_behind`, over the window and the one
    before it), noting why there is no model."""
    kept = [settled(samples, view.started(key), policy.stabilization_seconds)
            for key, samples in view.instances.items()]
    spans = [span for samples in kept for span in spans_of(samples)]
    cpu_spans = [span for samples in kept for span in cpu_spans_of(samples)]
    previous = view.capacity
    capacity = modelled(previous, spans, policy.target_batch_seconds, now, cpu_spans)
    if isinstance(capacity, Capacity):
        return capacity
    before = measure(view, policy, now - policy.window_seconds)
    behind = fell_behind(measured, before)[0]
    by_rate = _by_rate(previous, measured, now, behind)
    return replace(by_rate, note=capacity) if by_rate is not None else None


def _by_rate(previous: Capacity | None, measured: Measured, now: float,
             behind: bool = True) -> Capacity | None:
    """`learn` from a window. Under pressure where the instances fell behind (`behind`:
    `fell_behind`), from its recent half: the rows waited all window, so the instances'
    batches had grown by then; the early half may still hold the load before the step, at a
    rate that says little. Otherwise (also under a pressure whose instances processed what
    arrived: their rows per busy second are their load's share, a lower bound) from the better
    of the two."""
    whole, recent = measured.whole, measured.recent
    if whole.pressed and behind:
        return learn(previous, True, recent.true_rate or whole.true_rate, now)
    rates = [r for r in (whole.true_rate, recent.true_rate) if r is not None]
    return learn(previous, False, max(rates) if rates else None, now)


def describe(rates: Rates) -> str:
    """The numbers of a window, for explanations."""
    rate = "none (never busy)" if rates.true_rate is None else f"{rates.true_rate:,.0f} rows/s"
    backlog = f"backlog {rates.backlog:,.0f} ({rates.backlog_slope:+,.0f}/s" + \
        (", growing all window)" if rates.backlog_growing else ")")
    retained = f"{rates.retained:,.0f} batches retained upstream" + \
        (", rising all window" if rates.retained_rising else "")
    return (f"over {rates.window:.1f} s: arrival {rates.arrival:,.0f} rows/s (upstream out "
            f"{rates.upstream_out:,.0f} rows/s, {backlog}, {retained}), processed "
            f"{rates.processed:,.0f} rows/s, true rate per instance {rate}, busy "
            f"{rates.utilisation:.0%} on average and {rates.busiest:.0%} at most" +
            (f", one instance {rates.in_one_batch:.1f} s into a micro-batch it has not ended"
             if rates.in_one_batch > 0 else "") +
            (f", throttled in {rates.throttled:.0%} of its cpu periods at most" +
             (" (at its cpu limit)" if rates.at_limit else "") if rates.throttled > 0 else ""))


def _decision(view: OperatorView, kind: DecisionKind, target: int, reason: Reason, why: str,
              measured: Measured | None = None, need: int | None = None,
              capacity: Capacity | None = None) -> Decision:
    """A Decision; `capacity` None keeps the view's."""
    n = view.parallelism
    verb = {"out": f"scale out {n} -> {target}", "in": f"scale in {n} -> {target}",
            "hold": f"hold at {n}"}[kind]
    text = f"{view.query_id}/{view.operator_id}: {verb}: {why}"
    whole, recent = (measured.whole, measured.recent) if measured else (None, None)
    return Decision(view.query_id, view.operator_id, kind, n, target, reason, text, whole, need,
                    recent, capacity if capacity is not None else view.capacity)


def _move(view: OperatorView, target: int, reason: Reason, why: str,
          measured: Measured | None = None, need: int | None = None,
          capacity: Capacity | None = None) -> Decision:
    """Out or in to `target`, or hold when it is the current parallelism."""
    n = view.parallelism
    kind: DecisionKind = "out" if target > n else "in" if target < n else "hold"
    return _decision(view, kind, target, reason if kind != "hold" else "steady", why, measured,
                     need, capacity)


def decide(view: OperatorView, policy: ElasticPolicy, now: float) -> Decision:
    """The parallelism `view`'s operator needs now, in one step (see the module docstring and
    docs/elasticity.md, "The policy"). Never raises for a view of valid samples."""
    n = view.parallelism
    if policy.clamp(n) != n:  # the policy changed under a running operator: at once
        return _move(view, policy.clamp(n), "bounds", f"parallelism {n} is outside "
                     f"[{policy.min_parallelism}, {policy.max_parallelism}]")
    if view.last_change_at is not None and now - view.last_change_at < policy.cooldown_seconds:
        left = policy.cooldown_seconds - (now - view.last_change_at)
        return _decision(view, "hold", n, "cooldown",
                         f"cool-down, {left:.1f} s of {policy.cooldown_seconds:g} s left "
                         f"since the last change")
    inside = stabilizing(view, policy, now)
    measured = measure(view, policy, now)
    if inside:
        return _stabilizing(view, policy, measured, inside, now)
    if isinstance(measured, str):
        return _decision(view, "hold", n, "no_data", f"not enough data: {measured}")
    return _decide_on(view, policy, measured, _learnt(view, policy, measured, now), now)


def queueing(rates: Rates) -> float:
    """Rows per second that arrive and are not processed: they queue at the sources (their
    backlog) or in the channels to the instances (batches the upstream writers retain)."""
    return rates.arrival - rates.processed


def queue_share(rates: Rates) -> float:
    """How fast rows queue (`queueing`) as a share of the arrival (0: nothing arrives)."""
    return queueing(rates) / rates.arrival if rates.arrival > 0 else 0.0


def draining_upstream(rates: Rates) -> bool:
    """The upstream's sources drained a backlog over the window: their backlog fell faster than
    `QUEUE_SHARE` of the arrival. The upstream then hands over more than arrives (rows that
    queued at its sources earlier, e.g. while the first instance started), so its output is a
    one-off amount moving downstream, not a rate of load (2026-11-30 22:58, run 2: upstream out
    303 rows/s from a 150 rows/s generator, its backlog falling 46 rows/s, read as an
    emergency at base load)."""
    return rates.backlog_slope < -QUEUE_SHARE * rates.arrival


def emergency(rates: Rates) -> bool:
    """Rows queue all window, the instances at their limit, and at least `EMERGENCY_RATIO`
    times as fast as the instances process them, while the upstream drains no backlog of its
    sources (`draining_upstream`): an overload no cold start explains. The
    queue counts rows held in the channels too, not the sources' backlog only: on real
    executors an x3 overload queued in the channel to the instance (its writer retaining ever
    more batches) while the generator's backlog grew ~100 rows/s, and no emergency showed."""
    return rates.pressed and not draining_upstream(rates) and \
        queueing(rates) >= EMERGENCY_RATIO * rates.processed > 0


def drainable(rates: Rates, capacity: Capacity, n: int) -> float:
    """The rows `n` instances at `capacity` each drain in the window beside its arrival (>= 0)."""
    return max(0.0, (n * capacity.rate - rates.arrival) * rates.window)


def _share_text(before: Measured | str) -> tuple[float | None, str]:
    """The window before's `queue_share` (None: not measured) and a phrase for it."""
    if isinstance(before, str):
        return None, "the window before not measured"
    share = queue_share(before.whole)
    return share, f"{share:.0%} in the window before"


def fell_behind(measured: Measured, before: Measured | str) -> tuple[bool, str]:
    """Whether the instances fell behind the arrival, and a phrase with the numbers (pure):
    their queue grew by at least `QUEUE_SHARE` of the arrival in the window and in the one
    `before` it (in the window alone where the one before was not measured: a history shorter
    than two windows), or it grew at least as fast as they processed (`emergency`). Only then
    are rows per busy second, without a cost model, what an instance can do (`_by_rate`): a
    micro-batch has a large fixed cost, and an instance that keeps up runs batches back to back
    whose rows per busy second are its share of the load, however busy or throttled it is
    (issue 31's `--window` run, 2026-12-01 02:25: one window instance at base load read 34 rows
    per busy second, pressed, while it processed what arrived, and scaled out 1 -> 2 on it).
    One window alone at 10 % is not enough once the one before is known: a 10 s window counts
    one batch more or less, and a window aggregate's batches at base load hold seconds of its
    rows (up to ~30 % of a window's)."""
    whole = measured.whole
    share = queue_share(whole)
    earlier, said = _share_text(before)
    text = (f"the queue grew {queueing(whole):,.0f} rows/s, {share:.0%} of the arrival "
            f"({said}; instances fall behind at least {QUEUE_SHARE:.0%} in both, or as fast "
            f"as they process)")
    if emergency(whole):
        return True, text
    return share >= QUEUE_SHARE and (earlier is None or earlier >= QUEUE_SHARE), text


def real_queue(measured: Measured, before: Measured | str, capacity: Capacity,
               n: int) -> tuple[bool, str]:
    """Whether rows waiting longer all window (`Rates.pressed`) beside `n` instances that the
    model says suffice are their queue, and a phrase with the numbers (pure). Real when it
    grows by at least `QUEUE_SHARE` of the arrival in the window and in the one `before` it
    (the model over-states an instance and the writers' credit absorbs the rest), or when the
    sources' backlog is more than the instances drain in a window at `capacity`
    (`drainable`: a slow queue that went on long enough). Otherwise it is the ebb and flow of
    batches and acknowledgements after a step: the retained batches climb by a few and the
    backlog by a few rows a second while the instances process what arrives. The retained
    batches are not counted in rows: the writers' credit bounds them, and a queue that lasts
    shows in the sources' backlog."""
    whole = measured.whole
    spare, share = drainable(whole, capacity, n), queue_share(whole)
    growth = f"the queue grew {queueing(whole):,.0f} rows/s, {share:.0%} of the arrival"
    drain = (f"{n} instances drain {spare:,.0f} rows in {whole.window:.1f} s at "
             f"{capacity.rate:,.0f} rows/s each beside the arrival")
    if whole.backlog > spare:
        return True, f"the backlog, {whole.backlog:,.0f} rows, is more than {drain}"
    earlier, said = _share_text(before)
    if share >= QUEUE_SHARE and earlier is not None and earlier >= QUEUE_SHARE:
        return True, f"{growth} ({said}; at least {QUEUE_SHARE:.0%} in both)"
    return False, (f"{growth} ({said}; a real queue grows at least {QUEUE_SHARE:.0%} in "
                   f"both) and the backlog, {whole.backlog:,.0f} rows, is within what {drain}")


def _stabilizing(view: OperatorView, policy: ElasticPolicy, measured: Measured | str,
                 inside: Sequence[str], now: float) -> Decision:
    """While an instance is inside its stabilization window: hold, saying which and for how
    long, and learn nothing from the window; but an `emergency` scales out as rule 5 would,
    at the capacity of the batches outside every window (or rows per busy second)."""
    n = view.parallelism
    why = (f"stabilizing: {', '.join(inside)}; an instance's first "
           f"{policy.stabilization_seconds:g} s of micro-batches (cold: JIT, Python workers, "
           f"first state-store files) are not measured")
    if isinstance(measured, str):
        return _decision(view, "hold", n, "stabilizing", f"{why}; {measured}")
    numbers = describe(measured.whole)
    if not emergency(measured.whole):
        return _decision(view, "hold", n, "stabilizing", f"{why}; no emergency (rows queueing "
                         f"at least {EMERGENCY_RATIO:g}x as fast as processed, all window, "
                         f"while the upstream drains no backlog of its sources); {numbers}",
                         measured)
    capacity = _learnt(view, policy, measured, now)
    if capacity is None:
        return _decision(view, "hold", n, "stabilizing", f"{why}; an emergency, but no "
                         f"capacity known; {numbers}", measured)
    needs = _needs(measured, capacity, policy.target_utilisation)
    formula = _formula(measured, capacity, policy.target_utilisation, needs,
                       policy.target_batch_seconds)
    return _scale_out(view, policy, measured, needs[2], f"emergency while {why}: the backlog "
                      f"grows {queueing(measured.whole):,.0f} rows/s, at least "
                      f"{EMERGENCY_RATIO:g}x the {measured.whole.processed:,.0f} rows/s "
                      f"processed; {formula}; {numbers}", capacity, "backlog", at_least=n + 1)


def _needs(measured: Measured, capacity: Capacity, utilisation: float) -> tuple[int, int, int]:
    """The need of the whole window and of each half, at the operator's capacity."""
    whole, early, recent = (needed(r.arrival, capacity.rate, utilisation)
                            for r in (measured.whole, measured.early, measured.recent))
    return whole, early, recent


def capacity_text(capacity: Capacity, target: float) -> str:
    """Where the capacity per instance comes from, with its numbers."""
    cost = capacity.cost
    if cost is not None:
        batch = effective_target(cost, target)
        why = "" if batch == target else (f" (the fixed cost reaches the {target:g} s target, "
                                          f"so batches of twice the fixed cost)")
        note = f"; {capacity.note}" if capacity.note else ""
        return (f"from the cost model, {cost.describe()}: batches of at most {batch:g} s"
                f"{why} sustain ({batch:g} - {cost.fixed:.3f}) / ({cost.per_unit * 1000:.3f} "
                f"ms x {batch:g}) = {capacity.rate:,.0f} rows/s{note}")
    kind = ("measured while the instances fell behind" if capacity.measured else
            "a lower bound: the best seen while they kept up")
    no_model = f"; no cost model: {capacity.note}" if capacity.note else ""
    return f"rows per busy second, {kind}{no_model}"


def _formula(measured: Measured, capacity: Capacity, utilisation: float,
             needs: tuple[int, int, int], target: float = TARGET_BATCH_SECONDS) -> str:
    recent = measured.recent
    kind = capacity_text(capacity, target)
    return (f"the last {recent.window:.1f} s need ceil({recent.arrival:,.0f} / "
            f"({capacity.rate:,.0f} x {utilisation:.2f})) = {needs[2]} (the "
            f"{measured.early.window:.1f} s before: {needs[1]}, the whole window: {needs[0]}; "
            f"capacity per instance {capacity.rate:,.0f} rows/s, {kind})")


def _decide_on(view: OperatorView, policy: ElasticPolicy, measured: Measured,
               capacity: Capacity | None, now: float) -> Decision:
    """The decision once the window's rates and the capacity are known. Rows waiting longer
    all window (`Rates.pressed`) scale out to the recent half's need, at least one more where
    that need is the current parallelism only when the queue is the instances' (`real_queue`,
    else `small_queue`); but
    while an instance ended no batch in the window, the queue is that batch's and only the
    need counts (`catching_up`, as after a scale-in, when the rest read the backlog). A
    capacity measured under pressure also scales out before a queue shows, when both halves of
    the window need more (a step of load in the early half leaves the recent half wholly after
    it, so the target is right in one step). A capacity that is only a lower bound gives needs
    that are upper bounds: never a scale-out, but a safe scale-in."""
    n, rates, target_u = view.parallelism, measured.whole, policy.target_utilisation
    numbers = describe(rates)
    if rates.arrival <= 0 and not rates.pressed:
        return _move(view, policy.min_parallelism, "load", f"nothing arrives; {numbers}",
                     measured, 0, capacity)
    if capacity is None:
        return _decision(view, "hold", n, "no_data", f"not enough data: the instances were "
                         f"never busy in the window, so their true rate is unknown; {numbers}",
                         measured)
    needs = _needs(measured, capacity, target_u)
    formula = _formula(measured, capacity, target_u, needs, policy.target_batch_seconds)
    if rates.pressed and needs[2] <= n and rates.in_one_batch > 0:
        return _decision(view, "hold", n, "catching_up", f"{formula}; rows waited longer all "
                         f"window, but an instance has been in one micro-batch for "
                         f"{rates.in_one_batch:.1f} s and ended none in the window: what "
                         f"queued meanwhile waits for that batch's end, which shows whether "
                         f"the instances keep up; {numbers}", measured, needs[2], capacity)
    if rates.pressed and not capacity.measured and not _lasting(measured, view, policy,
                                                                  capacity, now):
        _, behind = fell_behind(measured, measure(view, policy, now - policy.window_seconds))
        return _decision(view, "hold", n, "small_queue", f"{formula}; rows waited longer all "
                         f"window, but {behind}: the instances kept up, so their rows per "
                         f"busy second are their load's share, a lower bound, and the need "
                         f"at it an upper bound; {numbers}", measured, needs[2], capacity)
    if rates.pressed and needs[2] > n:
        return _scale_out(view, policy, measured, needs[2], f"{formula}; {numbers}", capacity,
                          "load", at_least=n + 1)
    if rates.pressed:
        before = measure(view, policy, now - policy.window_seconds)
        real, queue = real_queue(measured, before, capacity, n)
        if not real:
            return _decision(view, "hold", n, "small_queue", f"{formula}; rows waited longer "
                             f"all window, but {queue}: not the instances' queue; {numbers}",
                             measured, needs[2], capacity)
        return _scale_out(view, policy, measured, needs[2], f"{formula}, but rows waited "
                          f"longer all window and {queue}, so one more; {numbers}", capacity,
                          "backlog", at_least=n + 1)
    if rates.queued:
        return _decision(view, "hold", n, "steady", f"{formula}; rows wait longer upstream, "
                         f"but the busiest instance was busy only {rates.busiest:.0%} of the "
                         f"time: the queue is not the instances' (an upstream stalled or short "
                         f"of a core); {numbers}", measured, needs[2], capacity)
    if measured.recent.pressed or (capacity.measured and max(needs) > n):
        if capacity.measured and min(needs[1:]) > n:
            return _scale_out(view, policy, measured, needs[2], f"{formula}; {numbers}",
                              capacity)
        return _decision(view, "hold", n, "settling", f"{formula}: the load changed inside "
                         f"the window, waiting for a whole window of it; {numbers}", measured,
                         needs[2], capacity)
    if needs[2] > n:
        return _decision(view, "hold", n, "steady", f"{formula}, an upper bound: no rows wait "
                         f"longer, so the instances keep up; {numbers}", measured, needs[2],
                         capacity)
    return _scale_in(view, policy, measured, capacity, needs[2], f"{formula}; {numbers}")


def _lasting(measured: Measured, view: OperatorView, policy: ElasticPolicy,
             capacity: Capacity, now: float) -> bool:
    """Beside instances that did not fall behind (`fell_behind`), whose capacity is then a
    lower bound: a backlog more than they drain in a window at it (`real_queue`'s `drainable`
    clause), counted only where that capacity says they drain at all (n x rate above the
    arrival): a queue that went on long enough is theirs whatever its growth."""
    n = view.parallelism
    if drainable(measured.whole, capacity, n) <= 0:
        return False
    return real_queue(measured, measure(view, policy, now - policy.window_seconds),
                      capacity, n)[0]


def at_limit_rate(measured: Measured) -> float | None:
    """The true rate per instance of the whole window when an instance was at its cpu limit in
    it (`Rates.at_limit`), the figures the explanation shows; None otherwise. Not the recent
    half's: right after a step it holds the step's first, large batches, whose rows per busy
    second the instances do not keep once the load is split (2026-11-30 23:00: the whole
    window 343 rows/s, the recent half over 396, two instances then ~306 each)."""
    whole = measured.whole
    return whole.true_rate if whole.at_limit else None


def sized_at_limit(measured: Measured, capacity: Capacity, utilisation: float,
                   need: int) -> tuple[int, str]:
    """A scale-out's need, and a phrase saying why when it is not `need`: where an instance
    was at its cpu limit and did fewer rows per busy second than the cost model's capacity,
    the need at that rate (`at_limit_rate`) when it is larger. The model is fitted at the
    current parallelism and extrapolates to batches of the target time; at the new one each
    instance did less (issue 31's benchmark, 0.35-cpu agents: a model of 488 rows/s at one
    instance, ~375 each at two; 583-641 against 253-310 on 2026-11-30 05:32), so the target
    that holds is sized on what an instance at its limit showed, at most `LIMIT_MARGIN` more
    than the model's need: an instance whose batches are mostly fixed cost (a window aggregate
    at a light load: 20-31 rows per busy second, busy and throttled ~100 %) is at its limit
    whatever its load, and its rate then says nothing of what it could do. Only a scale-out
    the rules already decided is sized so: whether to scale out is unchanged (pure)."""
    limit = at_limit_rate(measured)
    if capacity.cost is None or limit is None or limit >= capacity.rate:
        return need, ""
    arrival = measured.recent.arrival
    at_limit = needed(arrival, limit, utilisation)
    if at_limit <= need:
        return need, ""
    sized = min(at_limit, need + LIMIT_MARGIN)
    capped = "" if sized == at_limit else \
        f", at most {LIMIT_MARGIN} more than the model's {need}: {sized}"
    return sized, (f"; sized at the {limit:,.0f} rows/s per busy second an instance at its "
                   f"cpu limit did, under the model's {capacity.rate:,.0f}: "
                   f"ceil({arrival:,.0f} / ({limit:,.0f} x {utilisation:.2f})) = "
                   f"{at_limit}{capped}")


def _scale_out(view: OperatorView, policy: ElasticPolicy, measured: Measured, need: int,
               why: str, capacity: Capacity, reason: Reason = "load",
               at_least: int = 0) -> Decision:
    """Out to `need` (at least `at_least`; larger where an instance at its cpu limit showed
    less than the model, `sized_at_limit`) within the bounds, or hold at the maximum."""
    n = view.parallelism
    need, sized = sized_at_limit(measured, capacity, policy.target_utilisation, need)
    why = f"{why}{sized}"
    target = policy.clamp(max(need, at_least))
    if target <= n:
        return _decision(view, "hold", n, "bounds", f"{why}; already at max-parallelism "
                         f"{policy.max_parallelism}", measured, need, capacity)
    return _decision(view, "out", target, reason, why, measured, need, capacity)


def _scale_in(view: OperatorView, policy: ElasticPolicy, measured: Measured,
              capacity: Capacity, need: int, why: str) -> Decision:
    """Scale in only when both halves of the window fit fewer instances each busy at most
    target x (1 - margin) (the hysteresis), to what the recent half needs; never while the
    backlog drains."""
    n, rates = view.parallelism, measured.whole
    relaxed = policy.target_utilisation * (1.0 - policy.scale_in_margin)
    _, early, recent = _needs(measured, capacity, relaxed)
    target = policy.clamp(recent)
    why = (f"{why}; with the scale-in margin (busy at most {relaxed:.2f}) the halves need "
           f"{early} and {recent}")
    if early >= n or target >= n:
        return _decision(view, "hold", n, "steady", why, measured, need, capacity)
    if rates.backlog_slope < 0 and rates.backlog > 0:
        return _decision(view, "hold", n, "draining", f"{why}, but the backlog is still "
                         f"draining", measured, need, capacity)
    return _decision(view, "in", target, "load", why, measured, need, capacity)


__all__ = ["Sample", "sample_of", "SampleHistory", "ElasticPolicy", "Capacity", "OperatorView",
           "view_of", "Rates", "learn", "rising", "busy_in", "in_one_batch", "Measured", "Decision",
           "decide", "measure", "needed", "increase", "slope", "OUTCOMES", "REASONS", "blank",
           "spans_of", "cpu_spans_of", "modelled", "STABILIZATION_SECONDS", "EMERGENCY_RATIO",
           "stabilizing", "settled", "first_batch_of", "first_batch_after", "emergency",
           "effective_target", "capacity_text", "throttled_in", "at_limit_rate", "sized_at_limit",
           "LIMIT_MARGIN", "QUEUE_SHARE", "queue_share", "draining_upstream", "drainable",
           "real_queue", "queueing", "fell_behind"]
