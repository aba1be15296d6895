"""The micro-batch cost model: a batch of `u` units (rows, or spooled bytes) takes
`fixed + per_unit x u` seconds (pure).

A Spark micro-batch has a large fixed cost (scheduling, state store, commit: ~0.2-0.5 s of CPU
here) beside its cost per row, so rows per busy second grow with the batch size and say little
of what an instance can do (issue 31: 152 to 664 rows/s for one instance in one run). Owns:
- `BatchSpan`, what was measured between two readings of cumulative counters: how many
  micro-batches ended, their units and their seconds (one span may hold several batches);
- `fit`, least squares of seconds = fixed x batches + per_unit x units over spans, with guards
  (too few spans, batches all of a similar size, a per-unit cost that is not positive or whose
  standard error is over half of it, and, given a target batch time, a fixed cost whose standard
  error is over a quarter of that target): it returns a `BatchCost` or a sentence saying why
  there is none; `fit_on_cpu`, the same on the batches' cpu seconds, converted to batch seconds
  at the cpu they ran with (the fixed cost's guard applied after the conversion);
- `BatchCost.sustained_rate(target)`: the input rate one instance carries with batches no longer
  than `target` seconds, (target - fixed) / (per_unit x target): run back to back at rate r,
  a batch of T seconds holds r x T units, so T = fixed + per_unit x r x T, i.e.
  T = fixed / (1 - per_unit x r), and T <= target  <=>  r <= (target - fixed) / (per_unit x target);
- `batch_budget` and `time_bounded`: how many units the next batch may take so that it ends
  within a target time (or twice the fixed cost, where that is longer: `bounded_target`),
  between a floor (so it always progresses) and a cap.
Used by the elastic policy (units: rows, from heartbeats) and by the channel source (units:
spooled bytes, timed where it plans batches). No clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

MIN_SPANS = 4  # spans with a batch in them: fewer fit nothing
MIN_SPREAD = 2.0  # largest mean batch size / smallest: less cannot tell fixed from per unit
MAX_RELATIVE_ERROR = 0.5  # the per-unit cost's standard error over itself: more is noise, no fit
# the fixed cost's standard error over the target batch time: more leaves the sustained rate
# loose. The rate is (target - fixed) / (per_unit x target), so an error e in the fixed cost moves
# it by e / (target - fixed) of itself: e <= target / 4 keeps that within the per-unit cost's 50 %
# for every fixed cost up to half the target. Over the fixed cost itself would refuse a small,
# well-placed fixed cost (0.02 +- 0.03 s beside a 2 s target moves the rate 1.5 %).
MAX_FIXED_ERROR = 0.25
TARGET_BATCH_SECONDS = 2.0  # how long a micro-batch should take at most (sizing and bounding)


@dataclass(frozen=True)
class BatchSpan:
    """`batches` micro-batches ended, holding `units` units, and took `seconds` in all."""

    batches: float
    units: float
    seconds: float


@dataclass(frozen=True)
class BatchCost:
    """seconds of one batch of u units = `fixed` + `per_unit` x u, fitted over `spans` spans
    whose mean batch sizes ranged from `smallest` to `largest` units."""

    fixed: float
    per_unit: float
    spans: int
    smallest: float
    largest: float
    # fitted on cpu seconds and converted to batch seconds at this many cpu seconds per busy
    # second (`fit_on_cpu`); None: fitted on the batches' wall time
    cpus: float | None = None
    # the standard error of `fixed` (seconds, converted as it is); 0 for exact points
    fixed_error: float = 0.0

    def seconds_of(self, units: float) -> float:
        return self.fixed + self.per_unit * units

    def sustained_rate(self, target_seconds: float) -> float:
        """Units per second one instance carries with batches no longer than `target_seconds`:
        (target - fixed) / (per_unit x target); 0 when the fixed cost alone reaches the target."""
        if target_seconds <= self.fixed:
            return 0.0
        return (target_seconds - self.fixed) / (self.per_unit * target_seconds)

    def units_within(self, seconds: float) -> float:
        """The largest batch that ends within `seconds`: (seconds - fixed) / per_unit (>= 0)."""
        return max(0.0, (seconds - self.fixed) / self.per_unit)

    def describe(self, unit: str = "row") -> str:
        on = "" if self.cpus is None else (
            f"; fitted on cpu time, {self.fixed * self.cpus:.3f} s + "
            f"{self.per_unit * self.cpus * 1000:.3f} ms per {unit}, at the {self.cpus:.2f} cpu "
            f"its batches ran with")
        return (f"batch time = {self.fixed:.3f} s (+- {self.fixed_error:.3f}) + "
                f"{self.per_unit * 1000:.3f} ms per {unit} (fitted over {self.spans} spans of "
                f"batches of {self.smallest:,.0f} to {self.largest:,.0f} {unit}s{on})")


def fit(spans: Iterable[BatchSpan], min_spans: int = MIN_SPANS,
        min_spread: float = MIN_SPREAD, target_seconds: float | None = None) -> BatchCost | str:
    """Least squares of seconds = fixed x batches + per_unit x units over the spans that hold a
    batch; a sentence instead when the spans cannot separate the two costs: fewer than
    `min_spans`, mean batch sizes within a factor `min_spread` of each other, a cost per unit
    that is not positive or too noisy, or, given `target_seconds` (what the model sizes for), a
    fixed cost whose standard error is over `MAX_FIXED_ERROR` of it. A negative fixed cost
    (noise) is taken as 0 and the cost per unit refitted alone."""
    cost = _fit(spans, min_spans, min_spread)
    if isinstance(cost, str) or target_seconds is None:
        return cost
    return fixed_guarded(cost, target_seconds)


def fixed_guarded(cost: BatchCost, target_seconds: float) -> BatchCost | str:
    """`cost`, or the sentence saying its fixed cost is too loose to size on: a standard error
    over `MAX_FIXED_ERROR` x `target_seconds` (both in batch seconds)."""
    bound = MAX_FIXED_ERROR * target_seconds
    if cost.fixed_error <= bound:
        return cost
    on = "" if cost.cpus is None else f", from cpu time at the {cost.cpus:.2f} cpu they ran with"
    return (f"the fixed cost is too loose to size on ({cost.fixed:.3f} +- "
            f"{cost.fixed_error:.3f} s of batch time over {cost.spans} spans, mean batch sizes "
            f"{cost.smallest:,.0f} to {cost.largest:,.0f}{on}; at most {bound:.3f} s, "
            f"{MAX_FIXED_ERROR:.0%} of the {target_seconds:g} s target batch, wanted)")


def _fit(spans: Iterable[BatchSpan], min_spans: int, min_spread: float) -> BatchCost | str:
    """`fit` without the fixed cost's guard."""
    used = [s for s in spans if s.batches > 0 and s.seconds >= 0 and s.units >= 0
            and all(math.isfinite(v) for v in (s.batches, s.units, s.seconds))]
    if len(used) < min_spans:
        return f"only {len(used)} spans of ended batches measured (at least {min_spans} wanted)"
    sizes = [s.units / s.batches for s in used]
    smallest, largest = min(sizes), max(sizes)
    if largest <= 0 or largest < min_spread * smallest:
        return (f"the batches were all of a similar size ({smallest:,.0f} to {largest:,.0f} "
                f"per batch, a factor {min_spread:g} apart wanted), which cannot tell a "
                f"batch's fixed cost from its cost per unit")
    fixed, per_unit = _least_squares(used)
    if fixed < 0:
        fixed, per_unit = 0.0, _through_origin(used)
    if not (per_unit > 0 and math.isfinite(per_unit) and math.isfinite(fixed)):
        return (f"the batch time did not grow with the batch size (fitted "
                f"{per_unit * 1000:.4f} ms per unit over {len(used)} spans)")
    fixed_err, error = _standard_errors(used, fixed, per_unit)
    if error > MAX_RELATIVE_ERROR * per_unit:
        return (f"the batch times are too noisy to fit a cost per unit ({per_unit * 1000:.4f} "
                f"+- {error * 1000:.4f} ms over {len(used)} spans; at most "
                f"{MAX_RELATIVE_ERROR:.0%} wanted)")
    return BatchCost(fixed, per_unit, len(used), smallest, largest, fixed_error=fixed_err)


def fit_on_cpu(spans: Sequence[tuple[BatchSpan, float]], min_spans: int = MIN_SPANS,
               min_spread: float = MIN_SPREAD,
               target_seconds: float | None = None) -> BatchCost | str:
    """The cost model fitted on cpu time: each span's `seconds` are the cpu seconds its batches
    used, beside the busy (wall) seconds they took. Fitted as `fit` does, then converted to batch
    seconds at the cpu the batches ran with, sum(cpu) / sum(busy): under a CFS quota of L cpus a
    cpu-bound batch runs at L, elsewhere at what the machine gave it. Wall time itself is not
    fitted: throttling and a busy machine stretch it for many batches in a row, and batches run
    back to back, so a stretched batch makes the next one larger and stretched too, and the
    cost per row fitted on wall time reads ~1 / the arrival rate (docs/elasticity.md).
    Given `target_seconds`, the fixed cost's error is bounded in batch seconds, after the
    conversion (`fixed_guarded`)."""
    cost = _fit((span for span, _ in spans), min_spans, min_spread)
    if isinstance(cost, str):
        return cost
    used = [(span, busy) for span, busy in spans if span.batches > 0]
    cpu, busy = sum(s.seconds for s, _ in used), sum(b for _, b in used)
    if not (cpu > 0 and busy > 0 and math.isfinite(cpu / busy)):
        return (f"the batches' cpu time ({cpu:.3f} s) over their busy time ({busy:.3f} s) "
                f"gives no cpu to convert it at")
    cpus = cpu / busy
    converted = BatchCost(cost.fixed / cpus, cost.per_unit / cpus, cost.spans, cost.smallest,
                          cost.largest, cpus, cost.fixed_error / cpus)
    return converted if target_seconds is None else fixed_guarded(converted, target_seconds)


def fixed_error(spans: Sequence[BatchSpan], fixed: float, per_unit: float) -> float:
    """The standard error of the fitted fixed cost: sqrt(s^2 x sum(u^2) / det), one diagonal
    term of `_standard_errors`' covariance (the other is the per-unit cost's)."""
    return _standard_errors(spans, fixed, per_unit)[0]


def _standard_errors(spans: Sequence[BatchSpan], fixed: float,
                     per_unit: float) -> tuple[float, float]:
    """(fixed's, per_unit's) standard errors: the square roots of the diagonal of
    s^2 x inverse([[kk, ku], [ku, uu]])."""
    kk = sum(s.batches * s.batches for s in spans)
    ku = sum(s.batches * s.units for s in spans)
    uu = sum(s.units * s.units for s in spans)
    det = kk * uu - ku * ku
    if det <= 0 or len(spans) <= 2:
        return math.inf, math.inf
    residuals = sum((s.seconds - fixed * s.batches - per_unit * s.units) ** 2 for s in spans)
    variance = residuals / (len(spans) - 2)
    return math.sqrt(variance * uu / det), math.sqrt(variance * kk / det)


def _least_squares(spans: Sequence[BatchSpan]) -> tuple[float, float]:
    """(fixed, per_unit) solving the normal equations of seconds ~ batches, units (no
    intercept: a span of k batches carries k fixed costs); (0, 0) when singular."""
    kk = sum(s.batches * s.batches for s in spans)
    ku = sum(s.batches * s.units for s in spans)
    uu = sum(s.units * s.units for s in spans)
    ks = sum(s.batches * s.seconds for s in spans)
    us = sum(s.units * s.seconds for s in spans)
    det = kk * uu - ku * ku
    if det <= 1e-12 * max(kk * uu, 1e-300):
        return 0.0, 0.0
    return (uu * ks - ku * us) / det, (kk * us - ku * ks) / det


def _through_origin(spans: Sequence[BatchSpan]) -> float:
    uu = sum(s.units * s.units for s in spans)
    return sum(s.units * s.seconds for s in spans) / uu if uu > 0 else 0.0


def time_bounded(spans: Sequence[BatchSpan], target_seconds: float, floor: float,
                 cap: float) -> float:
    """Units the next micro-batch may take so that it ends within `target_seconds`, from the
    recent batches (oldest first): at their fitted cost (`fit`, `batch_budget`; for twice the
    fixed cost where that is longer, `bounded_target`) when they fit one, else the last batch's rate (units per second) x the target; `floor` before any
    batch was timed. Within [floor, cap]: a batch always progresses and never exceeds the cap.
    Rate x target converges to the cost model's answer too: a batch of r units that took
    fixed + per_unit x r seconds gives next r' = target x r / (fixed + per_unit x r), whose
    fixed point is (target - fixed) / per_unit."""
    cost = fit(spans)
    if isinstance(cost, BatchCost):
        return batch_budget(cost, bounded_target(cost, target_seconds), floor, cap)
    timed = [s for s in spans if s.units > 0 and s.seconds > 0]
    if not timed:
        return floor
    return max(floor, min(cap, target_seconds * timed[-1].units / timed[-1].seconds))


def bounded_target(cost: BatchCost, target_seconds: float) -> float:
    """The batch time to size for: `target_seconds`, or twice the fixed cost where that is
    longer, so a batch spends at least half its time on its units. Where the fixed cost alone
    reaches the target (a loaded machine), sizing for the target would shrink every batch to
    the floor and the task's throughput to floor / fixed."""
    return max(target_seconds, 2.0 * cost.fixed)


def batch_budget(cost: BatchCost | None, target_seconds: float, floor: float,
                 cap: float) -> float:
    """Units the next micro-batch may take to end within `target_seconds` at the measured cost:
    `cost.units_within(target)`, never below `floor` (a batch always makes progress, even when
    the fixed cost alone reaches the target) nor above `cap`; `cap` when nothing is measured."""
    if cost is None:
        return cap
    return max(floor, min(cap, cost.units_within(target_seconds)))


__all__ = ["BatchSpan", "BatchCost", "fit", "fit_on_cpu", "fixed_guarded", "batch_budget",
           "bounded_target", "time_bounded", "fixed_error", "MIN_SPANS", "MIN_SPREAD",
           "MAX_FIXED_ERROR", "TARGET_BATCH_SECONDS"]
