"""The automatic-elasticity policy (`scheduler.elastic_policy`), pure: histories of heartbeat
samples are built by a small simulator of one operator (an upstream task feeding n instances,
each processing `rate` rows per busy second), and the decisions are checked against the
model's arithmetic done here by hand. Plus a seeded, bounded fuzz over random histories."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from scheduler.elastic_policy import (
    OUTCOMES, Decision, ElasticPolicy, OperatorView, Sample, SampleHistory, decide, increase,
    measure, needed, sample_of, slope, view_of,
)

POLICY = ElasticPolicy(min_parallelism=1, max_parallelism=8, target_utilisation=0.8,
                       scale_in_margin=0.15, cooldown_seconds=20.0, window_seconds=10.0,
                       min_samples=5)


@dataclass
class Operator:
    """A simulated elastic operator: the upstream hands over what the instances can take
    (credit flow control) and the rest waits in its source's backlog, which it reports when
    `backlog_visible`; instances share the load evenly, each busy rows / rate seconds."""

    n: int
    rate: float  # rows per busy second of one instance
    backlog_visible: bool = True
    selectivity: float = 1.0  # the upstream's rows out per row in
    t: float = 0.0
    backlog: float = 0.0
    upstream: list[Sample] = field(default_factory=list)
    instances: dict[str, list[Sample]] = field(default_factory=dict)
    last_change_at: float | None = None
    totals: dict[str, list[float]] = field(default_factory=dict)  # task -> [in, out, busy]

    def run(self, arrival: float, seconds: int) -> None:
        """`seconds` heartbeats (one a second) with `arrival` rows/s reaching the upstream."""
        for _ in range(seconds):
            self.t += 1.0
            wanted = arrival * self.selectivity + self.backlog * self.selectivity
            taken = min(wanted, self.n * self.rate)
            self.backlog = max(0.0, self.backlog + arrival - taken / self.selectivity)
            up = self.totals.setdefault("up", [0.0, 0.0, 0.0])
            up[0] += taken / self.selectivity
            up[1] += taken
            up[2] += 1000.0 * min(1.0, taken / max(1.0, 10 * self.rate))
            self.upstream.append(Sample(self.t, up[0], up[1], up[2],
                                        self.backlog if self.backlog_visible else 0.0))
            for i in range(1, self.n + 1):
                key = f"q.f{i}"
                figs = self.totals.setdefault(key, [0.0, 0.0, 0.0])
                share = taken / self.n
                figs[0] += share
                figs[1] += share
                figs[2] += 1000.0 * share / self.rate
                self.instances.setdefault(key, []).append(Sample(self.t, *figs))

    def view(self) -> OperatorView:
        active = {k: v for k, v in self.instances.items() if int(k[3:]) <= self.n}
        return OperatorView("q", "f", self.n, active, {"q.up": self.upstream},
                            self.last_change_at)

    def apply(self, decision: Decision) -> None:
        if decision.kind != "hold":
            self.n, self.last_change_at = decision.target, self.t


def overloaded(n: int = 1, rate: float = 1000.0, arrival: float = 3200.0,
               visible: bool = True) -> Operator:
    op = Operator(n, rate, backlog_visible=visible)
    op.run(arrival, 12)
    return op


# --- the model -----------------------------------------------------------------------------------

def test_a_load_that_rose_inside_the_window_waits_for_a_whole_window_of_it() -> None:
    op = Operator(1, 1000.0)
    op.run(800.0, 12)
    op.run(3200.0, 4)  # the step is 4 s old: the window's early half does not show it
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.reason) == ("hold", "settling")
    op.run(3200.0, 7)
    assert (decide(op.view(), POLICY, op.t).kind, decide(op.view(), POLICY, op.t).target) == \
        ("out", 4)


def test_steady_load_under_capacity_holds() -> None:
    op = Operator(2, 1000.0)
    op.run(1000.0, 12)  # each instance half busy: 1000 / (1000 x 0.8) needs 2
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.target, d.reason, d.needed) == ("hold", 2, "steady", 2)
    assert d.rates is not None
    assert d.rates.true_rate == pytest.approx(1000.0)
    assert d.rates.utilisation == pytest.approx(0.5)
    assert d.rates.arrival == pytest.approx(1000.0)


def test_a_fourfold_step_scales_out_to_the_right_parallelism_in_one_decision() -> None:
    op = Operator(1, 1000.0)
    op.run(800.0, 12)
    assert decide(op.view(), POLICY, op.t).kind == "hold"
    op.run(3200.0, 12)  # x4: one instance takes 1000/s, the backlog grows by 2200/s
    d = decide(op.view(), POLICY, op.t)
    # arrival = upstream out (1000/s) + backlog slope (2200/s) = 3200; 3200 / (1000 x 0.8) = 4
    assert (d.kind, d.target, d.reason, d.needed) == ("out", 4, "load", 4)
    assert d.rates is not None and d.rates.arrival == pytest.approx(3200.0)
    assert d.rates.busiest == pytest.approx(1.0)
    assert "3,200 rows/s" in d.explanation and "1,000 rows/s" in d.explanation
    assert "scale out 1 -> 4" in d.explanation
    op.apply(d)
    op.run(3200.0, 25)  # four instances drain the backlog, then carry the load
    after = decide(op.view(), POLICY, op.t)
    assert after.kind == "hold" and after.target == 4


def test_the_load_goes_up_and_down_with_one_change_each_way_and_no_flapping() -> None:
    op = Operator(1, 1000.0)
    loads = [800.0] * 40 + [3000.0] * 90 + [500.0] * 90
    changes: list[tuple[str, int]] = []
    for second, load in enumerate(loads):
        op.run(load, 1)
        if second % 2 == 0:  # the scheduler asks every other second
            d = decide(op.view(), POLICY, op.t)
            if d.kind != "hold":
                changes.append((d.kind, d.target))
            op.apply(d)
    # 500 / (1000 x 0.8 x 0.85) = 0.74: one instance is enough again
    assert changes == [("out", 4), ("in", 1)]


def test_scale_in_after_the_load_falls_goes_to_what_fits_with_the_margin() -> None:
    op = Operator(6, 1000.0)
    op.run(2000.0, 12)  # 2000 / (1000 x 0.68) = 2.94 -> 3 (4 at the target 0.8 would be 3 too)
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.target, d.reason, d.needed) == ("in", 3, "load", 3)
    assert "scale in 6 -> 3" in d.explanation


def test_no_scale_in_inside_the_margin() -> None:
    op = Operator(2, 1000.0)
    op.run(750.0, 12)  # one instance would be 75% busy: under 0.8, over 0.8 x 0.85 = 0.68
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.target, d.reason, d.needed) == ("hold", 2, "steady", 1)
    assert "scale-in margin (busy at most 0.68) the halves need 2 and 2" in d.explanation


def test_a_scale_out_target_never_asks_for_a_scale_in_under_the_same_load() -> None:
    """For any load, the parallelism a scale-out picks stays put: the scale-in need (at the
    relaxed utilisation) is never below the scale-out need."""
    for arrival in range(50, 20000, 37):
        out = needed(float(arrival), 1000.0, 0.8)
        assert needed(float(arrival), 1000.0, 0.8 * 0.85) >= out


def test_cool_down_holds_even_an_overload() -> None:
    op = overloaded()
    op.last_change_at = op.t - 5.0
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.target, d.reason) == ("hold", 1, "cooldown")
    assert "15.0 s of 20 s left" in d.explanation
    assert decide(op.view(), POLICY, op.t + 15.0).reason != "cooldown"


def test_nothing_arriving_scales_in_to_the_minimum() -> None:
    op = Operator(3, 1000.0)
    op.run(0.0, 12)
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.target, d.reason) == ("in", 1, "load")
    assert "nothing arrives" in d.explanation


# --- missing data ---------------------------------------------------------------------------------

def test_too_few_samples_hold_and_say_which_task() -> None:
    op = Operator(2, 1000.0)
    op.run(3000.0, 3)
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.reason, d.rates) == ("hold", "no_data", None)
    assert "q.f1 (3 samples over 2.0 s)" in d.explanation and "q.up" in d.explanation


def test_old_samples_do_not_count_as_the_window() -> None:
    op = overloaded()
    d = decide(op.view(), POLICY, op.t + 30.0)  # nothing heard for 30 s
    assert (d.kind, d.reason) == ("hold", "no_data")


def test_no_instance_or_no_upstream_holds() -> None:
    op = overloaded()
    bare = OperatorView("q", "f", 1, {}, {"q.up": op.upstream})
    assert "no active instance" in decide(bare, POLICY, op.t).explanation
    orphan = OperatorView("q", "f", 1, dict(op.instances), {})
    assert "no upstream" in decide(orphan, POLICY, op.t).explanation


def test_instances_never_busy_while_rows_arrive_hold_without_a_true_rate() -> None:
    op = overloaded()
    idle = {k: [Sample(s.at, 0, 0, 0) for s in v] for k, v in op.instances.items()}
    view = OperatorView("q", "f", 1, idle, {"q.up": op.upstream})
    d = decide(view, POLICY, op.t)
    assert (d.kind, d.reason) == ("hold", "no_data")
    assert "true rate is unknown" in d.explanation and d.rates is not None


# --- bounds ---------------------------------------------------------------------------------------

def test_a_need_above_max_is_clamped_to_max() -> None:
    op = overloaded(arrival=12000.0)  # needs 15
    d = decide(op.view(), ElasticPolicy(max_parallelism=4), op.t)
    assert (d.kind, d.target, d.needed) == ("out", 4, 15)


def test_at_max_an_overload_holds_and_says_so() -> None:
    op = overloaded(n=4, arrival=12000.0)
    d = decide(op.view(), ElasticPolicy(max_parallelism=4), op.t)
    assert (d.kind, d.target, d.reason) == ("hold", 4, "bounds")
    assert "already at max-parallelism 4" in d.explanation


def test_a_parallelism_outside_the_bounds_is_brought_inside_at_once() -> None:
    op = Operator(1, 1000.0)
    op.run(100.0, 2)
    op.last_change_at = op.t  # even during a cool-down, and without data
    policy = ElasticPolicy(min_parallelism=2, max_parallelism=4)
    d = decide(op.view(), policy, op.t)
    assert (d.kind, d.target, d.reason) == ("out", 2, "bounds")
    high = OperatorView("q", "f", 9, {}, {}, None)
    assert (decide(high, policy, 0.0).kind, decide(high, policy, 0.0).target) == ("in", 4)


def test_the_minimum_holds_when_nothing_arrives() -> None:
    op = Operator(2, 1000.0)
    op.run(0.0, 12)
    d = decide(op.view(), ElasticPolicy(min_parallelism=2), op.t)
    assert (d.kind, d.target) == ("hold", 2)


# --- backlog and selectivity ----------------------------------------------------------------------

def test_saturated_instances_without_a_visible_backlog_still_scale_out() -> None:
    """When the sources do not report their backlog, the arrival seen is what the saturated
    instances take: 1 x 1000 / (1000 x 0.8) = 1.25 -> 2, one more instance per step."""
    op = overloaded(visible=False)
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.target, d.needed) == ("out", 2, 2)


def test_a_backlog_growing_all_window_adds_one_even_when_the_rates_say_enough() -> None:
    op = Operator(2, 1000.0)
    op.run(1000.0, 12)
    up = [Sample(s.at, s.tuples_in, s.tuples_out, s.busy_ms, 10.0 * i)
          for i, s in enumerate(op.upstream)]  # +10 offsets/s: too little to change the need
    view = OperatorView("q", "f", 2, op.view().instances, {"q.up": up})
    d = decide(view, POLICY, op.t)
    assert (d.kind, d.target, d.reason) == ("out", 3, "backlog")
    assert "growing all window" in d.explanation


def test_no_scale_in_while_the_backlog_drains() -> None:
    op = Operator(1, 1000.0)
    op.run(3200.0, 60)  # a backlog of 60 x 2200 = 132,000 rows
    op.n = 6
    op.run(500.0, 12)  # six instances drain 5,500 rows/s of it: still falling after 12 s
    assert op.backlog > 0
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.target, d.reason) == ("hold", 6, "draining")
    assert d.rates is not None and d.rates.arrival == pytest.approx(500.0)
    op.run(500.0, 30)  # drained: now it gives instances back
    assert decide(op.view(), POLICY, op.t).kind == "in"


def test_the_backlog_counts_through_the_upstream_selectivity() -> None:
    up = [Sample(float(t), 2000.0 * t, 1000.0 * t, 100.0 * t, 1000.0 * t) for t in range(11)]
    inst = {"q.f1": [Sample(float(t), 1000.0 * t, 1000.0 * t, 800.0 * t) for t in range(11)]}
    measured = measure(OperatorView("q", "f", 1, inst, {"q.up": up}), POLICY, 10.0)
    assert not isinstance(measured, str)
    rates = measured.whole
    # out 1000/s, backlog +1000 offsets/s at selectivity 1000/2000: arrival 1500
    assert rates.arrival == pytest.approx(1500.0)
    assert rates.true_rate == pytest.approx(1250.0)
    assert rates.utilisation == pytest.approx(0.8)


# --- counters that restart ------------------------------------------------------------------------

def test_a_counter_that_restarts_never_gives_a_negative_increase() -> None:
    assert increase([100.0, 200.0, 50.0, 150.0]) == 250.0  # 100, then 50 since 0, then 100
    assert increase([5.0, 0.0, 0.0]) == 0.0
    assert increase([]) == 0.0 and increase([7.0]) == 0.0


def test_an_instance_restarted_mid_window_keeps_its_rates_positive() -> None:
    op = Operator(2, 1000.0)
    op.run(1000.0, 12)
    restarted = [Sample(s.at, s.tuples_in - 9000, s.tuples_out - 9000, s.busy_ms - 9000)
                 if s.tuples_in > 9000 else s for s in op.instances["q.f1"]]
    view = OperatorView("q", "f", 2, {**op.view().instances, "q.f1": restarted},
                        {"q.up": op.upstream})
    d = decide(view, POLICY, op.t)
    assert d.rates is not None and d.rates.true_rate is not None
    assert d.rates.true_rate > 0 and d.rates.processed > 0 and d.rates.utilisation >= 0
    assert d.kind in ("hold", "in")


def test_slope_is_least_squares_and_zero_without_two_times() -> None:
    assert slope([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) == pytest.approx(2.0)
    assert slope([(1.0, 4.0), (1.0, 9.0)]) == 0.0
    assert slope([]) == 0.0


# --- samples and history --------------------------------------------------------------------------

def test_sample_of_reads_heartbeat_figures_and_refuses_what_is_not_a_sample() -> None:
    figures = {"tuples_in": 10.0, "tuples_out": 9.0, "busy_ms": 300.0, "backlog": 4.0,
               "batch_ms": 12.0}
    assert sample_of(5.0, figures) == Sample(5.0, 10.0, 9.0, 300.0, 4.0)
    assert sample_of(5.0, {"tuples_in": 1.0, "tuples_out": 1.0}) is None  # no busy time
    for bad in (math.nan, math.inf, -1.0, 1e16, True, "12"):
        assert sample_of(5.0, {**figures, "busy_ms": bad}) is None, bad
    assert sample_of(math.inf, figures) is None


def test_history_keeps_a_bounded_recent_window_per_task() -> None:
    history = SampleHistory(keep_seconds=60.0, max_samples=50)
    for t in range(200):
        history.record("a", Sample(float(t), t, t, t))
    kept = history.samples("a")
    assert len(kept) == 50 and kept[-1].at == 199.0 and kept[0].at == 150.0
    history.record("a", Sample(100.0, 1, 1, 1))  # reordered: ignored
    history.record("a", None)
    assert history.samples("a")[-1].at == 199.0
    long = SampleHistory(keep_seconds=10.0, max_samples=500)
    for t in range(100):
        long.record("b", Sample(t * 0.5, t, t, t))
    assert [s.at for s in long.samples("b")][0] == pytest.approx(39.5)
    long.keep_only(["c"])
    assert long.samples("b") == ()


def test_heartbeats_through_the_history_give_the_same_decision_as_the_samples() -> None:
    """The integration path: heartbeat figures -> sample_of -> SampleHistory -> view_of."""
    op = overloaded()
    history = SampleHistory()
    for key, samples in [("q.up", op.upstream), *op.instances.items(), ("q.f2", [])]:
        for s in samples:
            history.record(key, sample_of(s.at, {"tuples_in": s.tuples_in, "busy_ms": s.busy_ms,
                                                 "tuples_out": s.tuples_out,
                                                 "backlog": s.backlog, "state": "running"}))
    view = view_of(history, "q", "f", 1, ["q.f1"], ["q.up"], None)
    assert list(view.instances["q.f1"]) == op.instances["q.f1"]
    assert list(view.upstreams["q.up"]) == op.upstream
    assert decide(view, POLICY, op.t) == decide(op.view(), POLICY, op.t)
    assert history.samples("q.f2") == ()


def test_a_policy_with_wrong_settings_names_every_problem() -> None:
    with pytest.raises(ValueError) as err:
        ElasticPolicy(min_parallelism=3, max_parallelism=2, target_utilisation=1.5,
                      scale_in_margin=1.0, cooldown_seconds=-1, window_seconds=0,
                      min_samples=1)
    text = str(err.value)
    for phrase in ("min-parallelism 3", "target utilisation 1.5", "scale-in margin 1.0",
                   "cool-down -1", "window 0", "minimum samples 1 must be >= 3"):
        assert phrase in text


def test_a_decision_reads_as_json_and_its_outcome_is_a_known_label() -> None:
    d = decide(overloaded().view(), POLICY, 12.0)
    data = d.to_json()
    assert data["kind"] == "out" and data["rates"]["arrival"] == pytest.approx(3200.0)
    assert d.outcome == "out" and "hold_cooldown" in OUTCOMES


# --- fuzz -----------------------------------------------------------------------------------------

def _random_samples(rng: random.Random, now: float) -> list[Sample]:
    samples, t, figs = [], now - rng.uniform(0, 30), [0.0, 0.0, 0.0, 0.0]
    for _ in range(rng.randint(0, 25)):
        t += rng.choice([0.0, 0.01, 0.5, 1.0, 1.0, 3.0])
        if rng.random() < 0.08:
            figs = [rng.uniform(0, 50) for _ in figs]  # a restart
        else:
            figs = [f + rng.choice([0.0, rng.uniform(0, 1e4), rng.uniform(0, 1e12)])
                    for f in figs]
        figs = [min(f, 1e15) for f in figs]
        figs[3] = rng.choice([0.0, rng.uniform(0, 1e6), figs[3]])
        samples.append(Sample(round(t, 3), *figs))
    if rng.random() < 0.1:
        rng.shuffle(samples)  # a view built by hand may hold them in any order
    return samples


def _random_policy(rng: random.Random) -> ElasticPolicy:
    low = rng.randint(1, 4)
    return ElasticPolicy(min_parallelism=low, max_parallelism=low + rng.randint(0, 6),
                         target_utilisation=rng.choice([0.01, 0.5, 0.8, 1.0]),
                         scale_in_margin=rng.choice([0.0, 0.15, 0.99]),
                         cooldown_seconds=rng.choice([0.0, 20.0]),
                         window_seconds=rng.choice([0.1, 10.0, 60.0]),
                         min_samples=rng.choice([3, 5]))


def test_fuzz_random_histories_never_raise_and_stay_within_the_bounds() -> None:
    rng = random.Random(1205)
    kinds: set[str] = set()
    for _ in range(1500):
        policy, now = _random_policy(rng), rng.uniform(-100, 1e6)
        instances = {f"q.f{i}": _random_samples(rng, now) for i in range(rng.randint(0, 4))}
        upstreams = {f"q.u{i}": _random_samples(rng, now) for i in range(rng.randint(0, 2))}
        last = rng.choice([None, now - rng.uniform(0, 40)])
        view = OperatorView("q", "f", rng.randint(1, 12), instances, upstreams, last)
        d = decide(view, policy, now)
        assert policy.min_parallelism <= d.target <= policy.max_parallelism
        assert d.explanation.strip() and d.outcome in OUTCOMES
        assert (d.kind == "hold") == (d.target == d.current)
        assert (d.kind == "out") == (d.target > d.current)
        if d.rates is not None:
            assert all(math.isfinite(v) and v >= 0 for v in (
                d.rates.arrival, d.rates.upstream_out, d.rates.processed,
                d.rates.utilisation, d.rates.busiest))
        kinds.add(d.outcome)
    assert {"out", "in", "hold_no_data", "hold_cooldown"} <= kinds  # the fuzz reaches them
