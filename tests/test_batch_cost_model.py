"""The micro-batch cost model (`common.batch_cost`) and the elastic policy sized on it
(`scheduler.elastic_policy`), pure. The fit is checked on hand-computed points; the policy on a
small simulator of Spark instances that run micro-batches back to back, each of
FIXED + PER_ROW x rows seconds (issue 31's case: rows per busy second then follow the load, from
~150 at base load to ~650 saturated), against the formula computed here by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

from common.batch_cost import (
    BatchCost, BatchSpan, batch_budget, bounded_target, fit, time_bounded,
)
from executor import spool
from executor.spool_source import SpoolConfig, SpoolStreamReader
from scheduler.elastic_policy import (
    THROTTLED_MOST, Capacity, Decision, ElasticPolicy, OperatorView, Sample, decide,
    effective_target, modelled, needed, sample_of, spans_of, throttled_in,
)

FIXED, PER_ROW = 0.25, 1.0 / 700.0  # seconds per batch, seconds per row: 700 rows/s saturated
POLICY = ElasticPolicy(min_parallelism=1, max_parallelism=8, target_utilisation=0.8,
                       scale_in_margin=0.15, cooldown_seconds=20.0, window_seconds=10.0,
                       min_samples=5, target_batch_seconds=2.0,
                       # the simulated engine has no cold start (a batch costs the same from the
                       # first), and its start's catch-up is the spread the fit needs: the
                       # stabilization window is tests/test_stabilization.py's
                       stabilization_seconds=0.0)
# by hand: (2 - 0.25) / (1/700 x 2) = 612.5 rows/s per instance; x 0.8 = 490
SUSTAINED = (2.0 - FIXED) / (PER_ROW * 2.0)


# --- the fit ------------------------------------------------------------------------------------

def spans(*sizes: float, batches: float = 1.0) -> list[BatchSpan]:
    return [BatchSpan(batches, batches * r, batches * (FIXED + PER_ROW * r)) for r in sizes]


def test_the_fit_recovers_fixed_and_per_row_costs_from_exact_batches() -> None:
    cost = fit(spans(50, 100, 400, 1000))
    assert isinstance(cost, BatchCost)
    assert cost.fixed == pytest.approx(FIXED)
    assert cost.per_unit == pytest.approx(PER_ROW)
    assert (cost.spans, cost.smallest, cost.largest) == (4, 50, 1000)


def test_a_span_of_several_batches_counts_one_fixed_cost_per_batch() -> None:
    # 3 batches of 100 rows: 300 rows in 3 x 0.25 + 300/700 s
    cost = fit(spans(40, 500) + spans(100, 200, batches=3.0))
    assert isinstance(cost, BatchCost)
    assert (cost.fixed, cost.per_unit) == (pytest.approx(FIXED), pytest.approx(PER_ROW))


def test_too_few_spans_or_batches_of_one_size_fit_nothing_and_say_why() -> None:
    few = fit(spans(50, 1000, 400))
    assert isinstance(few, str) and "only 3 spans" in few
    alike = fit(spans(100, 120, 150, 180, 110))
    assert isinstance(alike, str) and "similar size" in alike and "100 to 180" in alike
    no_batch = fit([BatchSpan(0, 0, 0)] * 6)
    assert isinstance(no_batch, str) and "only 0 spans" in no_batch


def test_a_batch_time_that_does_not_grow_with_rows_is_no_model() -> None:
    flat = fit([BatchSpan(1, r, 0.5 - r / 10_000) for r in (10, 100, 500, 1000)])
    assert isinstance(flat, str) and "did not grow" in flat


def test_a_negative_fixed_cost_is_taken_as_zero() -> None:
    # times 2 ms per row minus 0.1 s: the fit through the origin is sum(u s) / sum(u^2)
    points = [BatchSpan(1, r, 0.002 * r - 0.1) for r in (100, 200, 400, 800)]
    cost = fit(points)
    assert isinstance(cost, BatchCost) and cost.fixed == 0.0
    uu = sum(p.units ** 2 for p in points)
    assert cost.per_unit == pytest.approx(sum(p.units * p.seconds for p in points) / uu)


def test_the_rate_sustained_within_a_target_follows_the_stated_formula() -> None:
    cost = BatchCost(0.25, 0.002, 4, 10, 1000)
    assert cost.sustained_rate(2.0) == pytest.approx(1.75 / 0.004)  # 437.5
    # check it: a batch at that rate holds r x T rows and takes fixed + per_row x r x T = T
    r = cost.sustained_rate(2.0)
    assert cost.seconds_of(r * 2.0) == pytest.approx(2.0)
    assert cost.sustained_rate(0.25) == 0.0 and cost.sustained_rate(0.1) == 0.0
    assert effective_target(cost, 2.0) == 2.0 and effective_target(cost, 0.2) == 0.5


def test_the_batch_budget_ends_within_the_target_between_its_floor_and_cap() -> None:
    cost = BatchCost(0.25, 0.002, 4, 10, 1000)
    assert batch_budget(cost, 2.0, 10.0, 1e9) == pytest.approx(875.0)  # 1.75 / 0.002
    assert batch_budget(cost, 2.0, 10.0, 500.0) == 500.0
    assert batch_budget(cost, 0.2, 10.0, 1e9) == 10.0  # the fixed cost alone is over: floor
    assert batch_budget(None, 2.0, 10.0, 48.0) == 48.0


# --- heartbeats -> spans ------------------------------------------------------------------------

def test_spans_leave_out_the_first_batch_restarts_and_idle_pairs() -> None:
    s = [Sample(0, 0, 0, 0), Sample(1, 500, 500, 3000, batches=1),  # the cold first batch
         Sample(2, 600, 600, 3400, batches=2), Sample(3, 600, 600, 3400, batches=2),
         Sample(4, 900, 900, 4100, batches=4),
         Sample(5, 950, 950, 4400, batches=0),  # a new attempt counts from 0
         Sample(6, 990, 990, 4700, batches=1), Sample(7, 1100, 1100, 5000, batches=2)]
    assert spans_of(s) == [BatchSpan(1, 100, 0.4), BatchSpan(2, 300, 0.7),
                           BatchSpan(1, 110, 0.3)]


def test_a_heartbeat_carries_the_batch_count_and_cgroup_figures_into_a_sample() -> None:
    sample = sample_of(3.0, {"tuples_in": 10, "tuples_out": 9, "busy_ms": 500,
                             "batches_ended": 4, "cpus_nr_periods": 100,
                             "cpus_nr_throttled": 60})
    assert sample is not None
    assert (sample.batches, sample.nr_periods, sample.nr_throttled) == (4, 100, 60)
    old = sample_of(3.0, {"tuples_in": 10, "tuples_out": 9, "busy_ms": 500})
    assert old is not None and (old.batches, old.nr_periods) == (0, 0)


def test_throttled_share_is_over_the_window_periods() -> None:
    w = [Sample(0, 0, 0, 0, nr_periods=1000, nr_throttled=100),
         Sample(10, 0, 0, 0, nr_periods=1100, nr_throttled=170)]
    assert throttled_in(w) == pytest.approx(0.7)
    assert throttled_in([Sample(0, 0, 0, 0), Sample(1, 0, 0, 0)]) == 0.0


# --- the policy on a simulated micro-batch engine -----------------------------------------------

@dataclass
class Instance:
    queue: float = 0.0
    batch_rows: float = 0.0
    batch_left: float = 0.0  # seconds (0: no batch runs)
    batch_took: float = 0.0
    rows: float = 0.0
    busy_ms: float = 0.0
    batches: float = 0.0
    samples: list[Sample] = field(default_factory=list)


@dataclass
class Engine:
    """n instances, each running a batch of all its queued rows, back to back, each batch
    FIXED + PER_ROW x rows long; the upstream hands every row to its channel writer at once
    (which retains one batch per 100 rows the instances have not taken). `report_batches`
    False: heartbeats without the batch count (an executor before the cost model)."""

    n: int
    report_batches: bool = True
    t: float = 0.0
    arrived: float = 0.0
    instances: list[Instance] = field(default_factory=list)
    upstream: list[Sample] = field(default_factory=list)
    capacity: Capacity | None = None
    last_change_at: float | None = None
    dt: float = 0.01

    def run(self, arrival: float, seconds: int) -> None:
        while len(self.instances) < self.n:
            self.instances.append(Instance())
        for _ in range(seconds):
            for _ in range(round(1.0 / self.dt)):
                self._step(arrival)
            self.t = round(self.t + 0.0, 6)
            self._heartbeat()

    def _step(self, arrival: float) -> None:
        self.t += self.dt
        self.arrived += arrival * self.dt
        for inst in self.instances[:self.n]:
            inst.queue += arrival * self.dt / self.n
        for inst in self.instances:
            if inst.batch_left > 0:
                inst.batch_left -= self.dt
                if inst.batch_left <= 1e-9:
                    inst.batch_left = 0.0
                    inst.rows += inst.batch_rows
                    inst.busy_ms += 1000.0 * inst.batch_took
                    inst.batches += 1
            if inst.batch_left == 0 and inst.queue >= 1.0:
                inst.batch_rows, inst.queue = math.floor(inst.queue), inst.queue % 1.0
                inst.batch_took = inst.batch_left = FIXED + PER_ROW * inst.batch_rows

    def _heartbeat(self) -> None:
        queued = sum(i.queue + (i.batch_rows if i.batch_left > 0 else 0) for i in self.instances)
        self.upstream.append(Sample(self.t, self.arrived, self.arrived, 0.0,
                                    retained=1.0 + queued // 100))
        for inst in self.instances:
            running = 1000.0 * (inst.batch_took - inst.batch_left) if inst.batch_left else 0.0
            inst.samples.append(Sample(self.t, inst.rows, inst.rows, inst.busy_ms,
                                       running_ms=running,
                                       batches=inst.batches if self.report_batches else 0.0))
            inst.samples = inst.samples[-60:]  # the scheduler's history keeps 60 s

    def view(self) -> OperatorView:
        return OperatorView("q", "f", self.n,
                            {f"q.f{i + 1}": inst.samples
                             for i, inst in enumerate(self.instances[:self.n])},
                            {"q.up": self.upstream[-60:]}, self.last_change_at, self.capacity)

    def decide(self) -> Decision:
        d = decide(self.view(), POLICY, self.t)
        self.capacity = d.capacity
        if d.kind != "hold":
            self.n, self.last_change_at = d.target, self.t
        return d


def rows_per_busy_second(inst: Instance, since: int) -> float:
    first, last = inst.samples[-since - 1], inst.samples[-1]
    return (last.tuples_in - first.tuples_in) / ((last.busy_ms - first.busy_ms) / 1000)


def test_rows_per_busy_second_follows_the_load_as_in_issue_31() -> None:
    """The figure the rate model divides by is the load itself: ~150 at base load, ~600 at
    four times it (the issue measured 152 to 664), because back-to-back batches keep an
    instance busy whatever their size; the batches grow instead (0.32 s, then 1.75 s)."""
    for load in (150.0, 600.0):
        engine = Engine(1)
        engine.run(load, 30)
        assert rows_per_busy_second(engine.instances[0], 10) == pytest.approx(load, rel=0.05)


def run_the_issues_load(engine: Engine) -> list[Decision]:
    """A start with rows queued (the instance was starting), base load, a x4 step, one
    decision a second from 15 s on."""
    engine.instances.append(Instance(queue=1500.0))
    decisions = []
    engine.run(150.0, 15)
    for second in range(75):
        engine.run(150.0 if second < 30 else 600.0, 1)
        decisions.append(engine.decide())
    return decisions


def test_the_cost_model_sizes_issue_31s_load_stably() -> None:
    """Base load 150 rows/s, then 600: the model fits the engine's own costs, so the capacity
    per instance is (2 - 0.25) / (2/700) = 612.5 rows/s whatever the load, and the needs are
    ceil(150 / 490) = 1 and ceil(600 / 490) = 2: no scale-out at base load, one step to 2."""
    decisions = run_the_issues_load(Engine(1))
    fitted = [d.capacity.cost for d in decisions if d.capacity and d.capacity.cost]
    assert len(fitted) == len(decisions)  # the start's catch-up batches fitted it at once
    for cost in fitted:
        assert cost.fixed == pytest.approx(FIXED, abs=0.01)
        assert cost.per_unit == pytest.approx(PER_ROW, rel=0.03)
    assert all(d.capacity is not None and d.capacity.rate == pytest.approx(SUSTAINED, rel=0.03)
               for d in decisions)
    base, step = decisions[:30], decisions[30:]
    assert all(d.kind == "hold" for d in base)
    assert {d.needed for d in base if d.needed is not None} == {needed(150, SUSTAINED, 0.8)} == {1}
    changes = [(d.kind, d.current, d.target) for d in step if d.kind != "hold"]
    assert changes == [("out", 1, 2)]
    after = [d.needed for d in step if d.needed is not None and d.current == 2]
    assert after and set(after) == {needed(600, SUSTAINED, 0.8)} == {2}
    assert "from the cost model" in step[-1].explanation
    assert "sustain (2 - 0.250) / (1.429 ms x 2)" in step[-1].explanation


def test_without_the_batch_count_the_rate_model_decides_and_says_why() -> None:
    """The same load from executors that report no batch count: rows per busy second at base
    load is ~150, an upper-bound need of ceil(150 / (150 x 0.8)) = 2 (held, but wrong)."""
    decisions = run_the_issues_load(Engine(1, report_batches=False))
    base = [d for d in decisions[:30] if d.needed is not None]
    assert base and max(d.needed or 0 for d in base) >= 2  # the misread the model removes
    assert all(d.capacity is None or d.capacity.cost is None for d in decisions)
    assert "no cost model: only 0 spans" in base[-1].explanation


def test_a_window_of_small_batches_does_not_shrink_the_modelled_capacity() -> None:
    """Issue 31's spurious "need 25": right after a step, a window of small batches gives a
    tiny rows per busy second. The model keeps the capacity its batches show."""
    engine = Engine(1)
    engine.instances.append(Instance(queue=1500.0))
    engine.run(150.0, 30)
    engine.decide()
    engine.run(20.0, 12)  # a lull: tiny batches, mostly the fixed cost
    d = engine.decide()
    assert d.rates is not None and d.rates.true_rate is not None and d.rates.true_rate < 60
    assert d.capacity is not None and d.capacity.rate == pytest.approx(SUSTAINED, rel=0.03)
    # the rate model would divide 600 rows/s by that window's figure
    assert needed(600, d.rates.true_rate, 0.8) >= 12
    assert needed(600, d.capacity.rate, 0.8) == 2


def test_a_model_is_kept_while_new_batches_cannot_be_fitted_and_says_so() -> None:
    previous = Capacity(SUSTAINED, True, 1.0, BatchCost(FIXED, PER_ROW, 5, 50, 900))
    kept = modelled(previous, spans(100, 110, 120, 105), 2.0, 9.0)
    assert isinstance(kept, Capacity) and kept == previous
    assert kept.note.startswith("not refitted now: the batches were all of a similar size")
    assert isinstance(modelled(None, spans(100, 110), 2.0, 9.0), str)


def test_a_throttled_instance_with_rows_waiting_is_at_its_limit() -> None:
    """Batches that show it busy 60% of the time, but its cgroup throttled it in 80% of the
    periods and rows wait longer all window: pressed (scale out), and the explanation says so."""
    samples, up = [], []
    for t in range(12):
        samples.append(Sample(float(t), 300.0 * t, 300.0 * t, 600.0 * (t + 1),
                              batches=float(t + 10),  # long past its first batches
                              nr_periods=100.0 * t, nr_throttled=80.0 * t))
        up.append(Sample(float(t), 600.0 * t, 600.0 * t, 0.0, retained=1.0 + 30 * t))
    view = OperatorView("q", "f", 1, {"q.f1": samples}, {"q.up": up}, None,
                        Capacity(SUSTAINED, True, 0.0, BatchCost(FIXED, PER_ROW, 5, 50, 900)))
    d = decide(view, POLICY, 11.0)
    assert d.rates is not None and d.rates.busiest == pytest.approx(0.6)
    assert d.rates.throttled == pytest.approx(0.8) and d.rates.throttled >= THROTTLED_MOST
    assert d.rates.pressed and d.kind == "out"
    assert "throttled in 80% of its cpu periods at most (at its cpu limit)" in d.explanation


# --- micro-batches bounded in time --------------------------------------------------------------

def test_time_bounded_uses_the_fitted_cost_else_the_last_rate_else_the_floor() -> None:
    # fitted: (2 - 0.25) x 700 = 1225 rows in 2 s
    assert time_bounded(spans(50, 100, 400, 1000), 2.0, 10, 1e9) == pytest.approx(1225)
    # one batch of 100 rows in 0.25 + 100/700 s: 2 s at its rate
    one = spans(100)
    assert time_bounded(one, 2.0, 10, 1e9) == pytest.approx(2.0 * 100 / one[0].seconds)
    assert time_bounded(one, 2.0, 10, 300) == 300
    assert time_bounded([], 2.0, 10, 1e9) == 10


def test_a_fixed_cost_over_the_target_sizes_batches_for_twice_it_not_the_floor() -> None:
    """A loaded machine: 3 s of fixed cost per batch against a 2 s target. Sizing for the
    target would give nothing past the fixed cost (the floor, 10 rows: 3.3 rows/s); sizing
    for twice the fixed cost gives (6 - 3) x 700 = 2,100 rows, half the batch on rows."""
    heavy = [BatchSpan(1, r, 3.0 + PER_ROW * r) for r in (50, 100, 400, 1000)]
    assert time_bounded(heavy, 2.0, 10, 1e9) == pytest.approx(2100)
    cost = fit(heavy)
    assert isinstance(cost, BatchCost)
    assert bounded_target(cost, 2.0) == pytest.approx(6.0)
    light = fit(spans(50, 100, 400, 1000))
    assert isinstance(light, BatchCost)
    assert bounded_target(light, 2.0) == 2.0  # 0.25 s of fixed cost: the target


def test_rate_times_target_converges_to_the_cost_models_batch() -> None:
    """Each batch the size the last one's rate allows: the fixed point is the batch that takes
    exactly the target, (2 - 0.25) x 700 = 1225 rows, reached from a small first batch."""
    size, timed = 10.0, []
    for _ in range(12):
        timed.append(BatchSpan(1, size, FIXED + PER_ROW * size))
        size = time_bounded(timed[-1:], 2.0, 10, 1e9)  # the rule alone, no fit
    assert size == pytest.approx(1225, rel=0.01)


def test_the_channel_source_bounds_a_backlog_by_the_time_its_batches_take(tmp_path: Path) -> None:
    """200 spooled batches of equal size waiting: the first micro-batch takes the floor's worth;
    timed at a made-up clock, the next takes what that rate does in the target time (hand
    computed), and never fewer than one spooled batch."""
    folder = tmp_path / "spool"
    folder.mkdir()
    spool.write_committed(str(folder), 0)
    rows = pa.table({"k": list(range(1000))}, schema=pa.schema([("k", pa.int64())]))
    for seq in range(1, 201):
        spool.write_batch(str(folder), seq, rows)
    size = spool.listing(str(folder))[1].size
    now = [0.0]
    config = SpoolConfig("t", "up", str(folder), str(tmp_path / "spark"), (("k", "bigint"),),
                         idle_seconds=0.01, min_batch_bytes=5 * size, target_batch_seconds=2.0)
    reader = SpoolStreamReader(config, clock=lambda: now[0])
    start = reader.initialOffset()
    first = reader.latestOffset()
    assert first["seq"] == 5  # the floor: 5 batches' bytes
    reader.partitions(start, first)
    now[0] += 0.5  # the batch took 0.5 s: 10 batches' bytes a second
    second = reader.latestOffset()
    assert second["seq"] - first["seq"] == 20  # 2 s at that rate
    reader.partitions(first, second)
    now[0] += 40.0  # a very slow batch: the floor
    assert reader.latestOffset()["seq"] - second["seq"] == 5
    slow = SpoolStreamReader(SpoolConfig("t", "up", str(folder), str(tmp_path / "spark"),
                                         (("k", "bigint"),), idle_seconds=0.01,
                                         min_batch_bytes=1), clock=lambda: 0.0)
    assert slow.latestOffset()["seq"] == 1  # at least one spooled batch, however large


def test_batch_times_too_noisy_for_the_cost_per_row_fit_nothing() -> None:
    """A cheap operator: 0.01 ms a row beside a 0.3 s fixed cost, times +-50 ms of noise. Over
    batches of 100 to 2,000 rows the noise is larger than the rows' cost: the fit says so (its
    standard error, checked against numpy's, is several times the estimate) instead of returning
    a cost per row that could as well be 0 or several times the true one."""
    import numpy as np

    sizes, noise = (100, 2000, 500, 1500), (0.05, 0.05, -0.05, -0.05)
    points = [BatchSpan(1, r, 0.3 + 1e-5 * r + e) for r, e in zip(sizes, noise)]
    (slope, _), cov = np.polyfit(np.array(sizes, float), [p.seconds for p in points], 1,
                                 cov=True)
    found = fit(points)
    assert isinstance(found, str) and "too noisy" in found
    assert f"{slope * 1000:.4f} +- {math.sqrt(cov[0][0]) * 1000:.4f} ms" in found
    # the same sizes at 1 ms a row: the noise is small beside it, and the fit is close
    clear = fit([BatchSpan(1, p.units, p.seconds + 0.00099 * p.units) for p in points])
    assert isinstance(clear, BatchCost) and clear.per_unit == pytest.approx(1e-3, rel=0.05)
