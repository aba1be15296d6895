"""The cost model's fixed cost, its error bounded (issue 31; `common.batch_cost.MAX_FIXED_ERROR`).

The benchmark's second run at 0.35 cpu (2026-11-29) fitted its model at base load on 9 spans of
batches 1,077 to 2,194 rows (a spread just over the factor 2 the fit wants), with the machine's
noise on them: 0.76 s + 1.11 ms per row of cpu, i.e. 2.19 s of fixed batch time, over the 2 s
target, so 158 rows/s per instance where 285 were measured. The per-row cost's guard passed
(its error was small); the fixed cost, extrapolated from batches all far from 0 rows, was loose.
Pure tests on that shape: an engine of known cpu costs (the oracle: 0.20 s + 1.47 ms per row of
cpu, the first run's warm instance, at 0.35 cpu), batches drawn with a seeded multiplicative
noise; numpy's covariance of the same fit is the independent check of the standard error."""

from __future__ import annotations

import math
import random

import pytest

from common.batch_cost import (
    MAX_FIXED_ERROR, BatchCost, BatchSpan, fit, fit_on_cpu, fixed_error,
)
from scheduler.elastic_policy import Capacity, effective_target, modelled, needed

CPU_FIXED, CPU_PER_ROW, LIMIT = 0.20, 1.47e-3, 0.35
TARGET = 2.0
# by hand: (2 - 0.2/0.35) / (1.47e-3/0.35 x 2) = 170.1 rows/s per instance
TRUE_RATE = (TARGET - CPU_FIXED / LIMIT) / (CPU_PER_ROW / LIMIT * TARGET)
SEEDS = range(50)


def draw(smallest: float, largest: float, n: int, noise: float,
         seed: int) -> list[tuple[BatchSpan, float]]:
    """n spans of one batch each, evenly from `smallest` to `largest` rows, each batch's cpu
    time the engine's times (1 + N(0, noise)), beside its busy time at LIMIT cpu."""
    rnd = random.Random(seed)
    spans = []
    for i in range(n):
        rows = smallest + (largest - smallest) * i / (n - 1)
        cpu = (CPU_FIXED + CPU_PER_ROW * rows) * (1.0 + rnd.gauss(0.0, noise))
        spans.append((BatchSpan(1, rows, cpu), cpu / LIMIT))
    return spans


def run_2(seed: int, noise: float = 0.08) -> list[tuple[BatchSpan, float]]:
    return draw(1077, 2194, 9, noise, seed)


def start(seed: int, noise: float = 0.08) -> list[tuple[BatchSpan, float]]:
    """A query's start: the backlog read in large batches, then the base load in small ones."""
    return draw(48, 1908, 12, noise, seed)


def sized_rate(cost: BatchCost) -> float:
    return cost.sustained_rate(effective_target(cost, TARGET))


def test_the_fixed_costs_error_is_the_fits_covariance() -> None:
    import numpy as np

    spans = run_2(0)
    cost = fit_on_cpu(spans)
    assert isinstance(cost, BatchCost)
    rows = np.array([s.units for s, _ in spans])
    (_, intercept), cov = np.polyfit(rows, [s.seconds for s, _ in spans], 1, cov=True)
    assert cost.fixed * LIMIT == pytest.approx(intercept)
    # converted to batch time as the fixed cost is
    assert cost.fixed_error == pytest.approx(math.sqrt(cov[1][1]) / LIMIT)
    exact = [BatchSpan(1, r, CPU_FIXED + CPU_PER_ROW * r) for r in (50, 400, 900, 1500)]
    assert fixed_error(exact, CPU_FIXED, CPU_PER_ROW) == pytest.approx(0.0, abs=1e-9)


def test_run_2s_shape_fitted_a_loose_fixed_cost_and_a_capacity_anywhere() -> None:
    """Without the bound (no target given: the old fit) every draw fits, the per-row guard
    passes, and the capacity sized on it lands anywhere from under half to ~1.3x the engine's."""
    rates = []
    for seed in SEEDS:
        cost = fit_on_cpu(run_2(seed))
        assert isinstance(cost, BatchCost)
        rates.append(sized_rate(cost))
    rates.sort()
    assert rates[len(rates) // 10] < 0.5 * TRUE_RATE
    assert rates[9 * len(rates) // 10] > 1.2 * TRUE_RATE


def test_run_2s_shape_is_refused_and_says_why() -> None:
    refused = [fit_on_cpu(run_2(seed), target_seconds=TARGET) for seed in SEEDS]
    said = [r for r in refused if isinstance(r, str)]
    assert len(said) >= 0.9 * len(refused)
    assert all(r.startswith("the fixed cost is too loose to size on") for r in said)
    assert f"at most {MAX_FIXED_ERROR * TARGET:.3f} s, 25% of the 2 s target batch" in said[0]
    assert "from cpu time at the 0.35 cpu they ran with" in said[0]
    # a bound at one standard error makes a loose fit unlikely, not impossible: of the few
    # draws that pass it (3 of 50 here), one still sizes at half the engine's rate


def test_a_starts_spread_still_fits_within_the_bound() -> None:
    for seed in SEEDS:
        cost = fit_on_cpu(start(seed), target_seconds=TARGET)
        assert isinstance(cost, BatchCost), cost
        assert cost.fixed_error <= MAX_FIXED_ERROR * TARGET
        assert sized_rate(cost) == pytest.approx(TRUE_RATE, rel=0.25)


def test_a_small_fixed_cost_known_to_a_few_tens_of_ms_is_no_reason_to_refuse() -> None:
    """Bounded over the target batch, not over the fixed cost itself: 0.02 s +- 0.03 s is 150 %
    of itself, but moves the sized rate by 1.5 %."""
    noise = (0.03, -0.03, -0.03, 0.03, 0.03, -0.03)
    spans = [BatchSpan(1, r, 0.02 + 1e-3 * r + e)
             for r, e in zip((100, 300, 600, 900, 1200, 1500), noise)]
    cost = fit(spans, target_seconds=TARGET)
    assert isinstance(cost, BatchCost)
    assert cost.fixed_error > cost.fixed
    assert cost.fixed_error < 0.05 * TARGET


def test_the_policy_keeps_its_last_model_or_sizes_on_no_loose_one() -> None:
    """A loose fit at base load is not taken: the model fitted at the start is kept (its note
    says why), or with none, there is no model (the policy falls back to rows per busy second,
    a lower bound, which scales nothing out). The old fit sized on it."""
    loose = run_2(1)
    spans = [s for s, _ in loose]
    old = fit_on_cpu(loose)
    assert isinstance(old, BatchCost) and old.fixed_error > MAX_FIXED_ERROR * TARGET
    good = fit_on_cpu(start(1), target_seconds=TARGET)
    assert isinstance(good, BatchCost)
    previous = Capacity(sized_rate(good), True, 1.0, good)
    kept = modelled(previous, spans, TARGET, 30.0, loose)
    assert isinstance(kept, Capacity) and kept.cost == good and kept.rate == previous.rate
    assert kept.note.startswith("not refitted now: the fixed cost is too loose")
    none = modelled(None, spans, TARGET, 30.0, loose)
    assert isinstance(none, str) and "too loose" in none
    # at the same base load the old fit asked for 14 instances (14 rows/s each: issue 31's
    # "need 25" kind of window), the kept model for 2 (170 rows/s: 150 is 88 % of one instance)
    assert needed(150.0, sized_rate(old), 0.8) == 14
    assert needed(150.0, previous.rate, 0.8) == 2
