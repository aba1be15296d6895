"""The automatic-elasticity policy (`scheduler.elastic_policy`), pure: histories of heartbeat
samples are built by a small simulator of one operator (an upstream task feeding n instances,
each processing `rate` rows per busy second; or, as Spark's back-to-back micro-batches, busy
all the time it has rows), and the decisions are checked against the model's arithmetic done
here by hand. Plus a seeded, bounded fuzz over random histories."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from scheduler.elastic_policy import (
    OUTCOMES, RETAINED_RISE, Capacity, Decision, ElasticPolicy, OperatorView, Sample,
    SampleHistory, busy_in, decide, in_one_batch, increase, learn, measure, needed, rising,
    sample_of, slope, view_of, warming_up,
)

POLICY = ElasticPolicy(min_parallelism=1, max_parallelism=8, target_utilisation=0.8,
                       scale_in_margin=0.15, cooldown_seconds=20.0, window_seconds=10.0,
                       min_samples=5)


@dataclass
class Operator:
    """A simulated elastic operator. The rows the instances cannot take wait `where`: in the
    upstream's source ("source": the upstream hands over only what they take, credit flow
    control, and reports the rest as its backlog), in its channel writer ("writer": it hands
    over everything and retains one batch per BATCH_ROWS waiting rows), or unseen ("none").
    Instances share the load evenly, each busy rows / rate seconds, or (`back_to_back`, as
    Spark's micro-batches run) busy the whole second whenever it has rows."""

    n: int
    rate: float  # rows per busy second of one instance
    where: str = "source"
    back_to_back: bool = False
    selectivity: float = 1.0  # the upstream's rows out per row in
    t: float = 0.0
    backlog: float = 0.0
    upstream: list[Sample] = field(default_factory=list)
    instances: dict[str, list[Sample]] = field(default_factory=dict)
    last_change_at: float | None = None
    capacity: Capacity | None = None  # what the last decision learnt
    totals: dict[str, list[float]] = field(default_factory=dict)  # task -> [in, out, busy]

    def run(self, arrival: float, seconds: int) -> None:
        """`seconds` heartbeats (one a second) with `arrival` rows/s reaching the upstream."""
        for _ in range(seconds):
            self.t += 1.0
            wanted = arrival * self.selectivity + self.backlog * self.selectivity
            taken = min(wanted, self.n * self.rate)
            self.backlog = max(0.0, self.backlog + arrival - taken / self.selectivity)
            handed = arrival * self.selectivity if self.where == "writer" else taken
            up = self.totals.setdefault("up", [0.0, 0.0, 0.0])
            up[0] += handed / self.selectivity
            up[1] += handed
            up[2] += 1000.0 * min(1.0, handed / max(1.0, 10 * self.rate))
            self.upstream.append(Sample(
                self.t, up[0], up[1], up[2],
                backlog=self.backlog if self.where == "source" else 0.0,
                retained=1.0 + self.backlog // BATCH_ROWS if self.where == "writer" else 0.0))
            for i in range(1, self.n + 1):
                key = f"q.f{i}"
                figs = self.totals.setdefault(key, [0.0, 0.0, 0.0])
                share = taken / self.n
                figs[0] += share
                figs[1] += share
                figs[2] += (1000.0 if share > 0 else 0.0) if self.back_to_back else \
                    1000.0 * share / self.rate
                self.instances.setdefault(key, []).append(Sample(self.t, *figs))

    def view(self) -> OperatorView:
        active = {k: v for k, v in self.instances.items() if int(k[3:]) <= self.n}
        return OperatorView("q", "f", self.n, active, {"q.up": self.upstream},
                            self.last_change_at, self.capacity)

    def apply(self, decision: Decision) -> None:
        self.capacity = decision.capacity
        if decision.kind != "hold":
            self.n, self.last_change_at = decision.target, self.t


BATCH_ROWS = 100.0


def overloaded(n: int = 1, rate: float = 1000.0, arrival: float = 3200.0,
               where: str = "source") -> Operator:
    op = Operator(n, rate, where=where)
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

def test_rows_waiting_in_the_upstream_writer_scale_out_to_the_need_in_one_step() -> None:
    """The upstream hands every row to its channel writer, which retains what the instances
    have not taken: its output is the arrival, the retained batches climb (the pressure)."""
    op = overloaded(where="writer")
    d = decide(op.view(), POLICY, op.t)
    # 3200 / (1000 x 0.8) = 4, the capacity measured while rows waited
    assert (d.kind, d.target, d.needed, d.reason) == ("out", 4, 4, "load")
    assert d.rates is not None and d.rates.retained_rising and not d.rates.backlog_growing
    assert d.capacity == Capacity(1000.0, True, op.t)
    assert "rising all window" in d.explanation


def test_without_any_visible_queue_saturated_instances_hold_and_say_why() -> None:
    """No backlog and no retained batches: nothing shows that rows wait, and a true rate seen
    while keeping up is only a lower bound, so its need is an upper bound: hold."""
    op = overloaded(where="none")
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.target, d.reason, d.needed) == ("hold", 1, "steady", 2)
    assert "an upper bound: no rows wait longer" in d.explanation


def test_back_to_back_batches_scale_out_once_and_back_in_once() -> None:
    """Busy all the time it has rows (Spark's back-to-back micro-batches), an instance's rows
    per busy second is its load, not its capacity: 700 rows/s on one instance reads 700. Only
    the x4 step that makes rows wait shows the capacity (2,000); it needs
    ceil(2800 / (2000 x 0.8)) = 2, and 700 afterwards ceil(700 / (2000 x 0.68)) = 1."""
    op = Operator(1, 2000.0, back_to_back=True)
    changes: list[tuple[str, int]] = []
    for second, load in enumerate([700.0] * 40 + [2800.0] * 90 + [700.0] * 90):
        op.run(load, 1)
        if second % 2 == 0:
            d = decide(op.view(), POLICY, op.t)
            if d.kind != "hold":
                changes.append((d.kind, d.target))
            op.apply(d)
    assert changes == [("out", 2), ("in", 1)]
    assert op.capacity is not None and op.capacity.measured
    assert op.capacity.rate == pytest.approx(2000.0)


def test_the_old_rule_would_flip_flop_on_back_to_back_batches() -> None:
    """The need from the window's own true rate, as a fixed per-batch cost distorts it: at a
    steady 700 rows/s it reads ceil(700 / (700 x 0.8)) = 2 on one instance and on two, so the
    capacity a lower bound gives may never scale out; a measured one holds at 1."""
    op = Operator(1, 2800.0, back_to_back=True)
    op.run(700.0, 12)
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.reason, d.needed) == ("hold", "steady", 2)
    assert d.capacity == Capacity(700.0, False, op.t)
    op.capacity = Capacity(2800.0, True, 0.0)
    d = decide(op.view(), POLICY, op.t)
    assert (d.kind, d.reason, d.needed) == ("hold", "steady", 1)
    assert d.capacity == Capacity(2800.0, True, 0.0)


def test_learn_keeps_the_best_lower_bound_and_replaces_it_by_a_measurement() -> None:
    assert learn(None, False, None, 1.0) is None
    low = learn(None, False, 500.0, 1.0)
    assert low == Capacity(500.0, False, 1.0)
    assert learn(low, False, 400.0, 2.0) == low  # a lower window says nothing new
    assert learn(low, False, 600.0, 3.0) == Capacity(600.0, False, 3.0)
    real = learn(low, True, 450.0, 4.0)  # under pressure: the figure, even if lower
    assert real == Capacity(450.0, True, 4.0)
    assert learn(real, False, 900.0, 5.0) == Capacity(900.0, True, 5.0)
    assert learn(real, True, None, 6.0) == real


def _retained(values: list[float]) -> list[Sample]:
    return [Sample(float(t), 0.0, 0.0, 0.0, retained=v) for t, v in enumerate(values)]


@pytest.mark.parametrize("values, expected", [
    ([1, 3, 0, 2, 3, 1, 0, 3, 2, 1, 3], False),  # acknowledgements' saw-tooth, level
    ([1, 3, 2, 4, 3, 5, 4, 6, 5, 7, 6], True),  # a saw-tooth that climbs
    ([0, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9], False),  # a jump at the end, early half flat
    ([2, 2, 2, 2, 6], False),  # under RETAINED_RISE
    ([0, 0, 0, 1, 1, 2, 2, 2], False),  # a start-up: the first batches are in flight
    ([5, 6, 7], False),  # too few samples
])
def test_retained_batches_rise_only_as_a_climbing_saw_tooth(values: list[float],
                                                            expected: bool) -> None:
    assert RETAINED_RISE == 5.0
    assert rising(_retained([float(v) for v in values])) is expected


def test_a_backlog_growing_all_window_adds_one_even_when_the_rates_say_enough() -> None:
    """A skewed partitioning: one instance busy all the time, the other 30%; the mean rates say
    two are enough (1,500 / (1,000 x 0.8) = 2), the queue that only grows says otherwise: 200
    of the 1,500 rows/s arriving (13 %, at least `QUEUE_SHARE`), in the window and in the one
    before (`real_queue`). A queue of 10 rows/s (under 1 %) holds until its backlog is more
    than two instances drain in a window, (2 x 1,000 - 1,310) x 10 = 6,900 rows."""
    def skewed(growth: float, backlog: float = 0.0) -> Decision:
        up = [Sample(float(t), 1300.0 * t, 1300.0 * t, 100.0 * t, backlog + growth * t)
              for t in range(21)]
        inst = {"q.f1": [Sample(float(t), 1000.0 * (t + 9), 1000.0 * (t + 9), 1000.0 * (t + 9))
                         for t in range(21)],  # (t + 9): running before the window, warm
                "q.f2": [Sample(float(t), 300.0 * (t + 9), 300.0 * (t + 9), 300.0 * (t + 9))
                         for t in range(21)]}
        return decide(OperatorView("q", "f", 2, inst, {"q.up": up}), POLICY, 20.0)

    d = skewed(200.0)
    assert (d.kind, d.target, d.reason, d.needed) == ("out", 3, "backlog", 2)
    assert "growing all window" in d.explanation and "so one more" in d.explanation
    assert "the queue grew 200 rows/s, 13% of the arrival (13% in the window before" in \
        d.explanation
    assert (skewed(10.0).kind, skewed(10.0).reason) == ("hold", "small_queue")
    assert (skewed(10.0, backlog=6_800.0).kind, skewed(10.0, backlog=6_800.0).target) == \
        ("out", 3)


def test_a_queue_beside_idle_instances_is_not_theirs() -> None:
    """The upstream stalls (a new executor starting takes the cores): nothing reaches the
    instances, its source backlog grows all window. More instances would not drain it."""
    up = [Sample(float(t), 0.0, 0.0, 0.0, 2000.0 * t) for t in range(11)]
    inst = {"q.f1": [Sample(float(t), 500.0 * (t + 9), 500.0 * (t + 9), 400.0 * (t + 9))
                     for t in range(11)]}
    d = decide(OperatorView("q", "f", 1, inst, {"q.up": up}), POLICY, 10.0)
    assert (d.kind, d.reason) == ("hold", "steady")
    assert d.rates is not None and d.rates.queued and not d.rates.pressed
    assert "busy only 40% of the time: the queue is not the instances'" in d.explanation


def _in_one_batch(running: bool) -> dict[str, list[Sample]]:
    """An instance that ended no batch in the window (rows and busy time stay put): its
    heartbeats say the batch it runs began 5 s before the window (`running`), or, as before
    heartbeats carried `running_ms`, say nothing of it."""
    return {"q.f1": [Sample(float(t), 9000.0, 9000.0, 9000.0,
                            running_ms=1000.0 * (t + 5) if running else 0.0)
                     for t in range(11)]}


def test_an_instance_inside_one_long_batch_is_busy_and_the_queue_waits_for_its_end() -> None:
    """After a scale-in the instance left reads the backlog in one long micro-batch; rows queue
    upstream meanwhile. It is busy, but the queue is that batch's: at a measured capacity that
    carries the load, no scale-out; the policy waits for the batch's end."""
    up = [Sample(float(t), 500.0 * t, 500.0 * t, 100.0 * t, 300.0 * t) for t in range(11)]
    carries = Capacity(2000.0, True, 0.0)  # ceil(800 / (2,000 x 0.8)) = 1
    d = decide(OperatorView("q", "f", 1, _in_one_batch(True), {"q.up": up}, None, carries),
               POLICY, 10.0)
    assert (d.kind, d.reason, d.needed) == ("hold", "catching_up", 1)
    assert d.rates is not None and d.rates.busiest == 1.0 and d.rates.in_one_batch == 15.0
    assert "in one micro-batch for 15.0 s" in d.explanation
    assert "15.0 s into a micro-batch it has not ended" in d.explanation
    # the same heartbeats without the running batch's time read as an idle instance
    blind = decide(OperatorView("q", "f", 1, _in_one_batch(False), {"q.up": up}, None, carries),
                   POLICY, 10.0)
    assert (blind.kind, blind.reason) == ("hold", "steady")
    assert blind.rates is not None and blind.rates.busiest == 0.0
    assert "the queue is not the instances'" in blind.explanation
    # a capacity that does not carry the load still scales out, batch or not
    short = Capacity(500.0, True, 0.0)  # ceil(800 / (500 x 0.8)) = 2
    out = decide(OperatorView("q", "f", 1, _in_one_batch(True), {"q.up": up}, None, short),
                 POLICY, 10.0)
    assert (out.kind, out.target, out.reason) == ("out", 2, "load")


def test_busy_time_in_a_window_counts_the_running_batch_and_not_what_came_before() -> None:
    # a batch 3 s in at the start ends at t=2 (5 s in all), idle, then one runs from t=8
    window = [Sample(0.0, 0.0, 0.0, 1000.0, running_ms=3000.0),
              Sample(2.0, 50.0, 50.0, 6000.0),
              Sample(8.0, 50.0, 50.0, 6000.0),
              Sample(10.0, 50.0, 50.0, 6000.0, running_ms=2000.0)]
    assert busy_in(window) == pytest.approx(4.0)  # 2 s of the first batch, 2 s of the last
    assert in_one_batch(window) == 0.0  # a batch ended in the window
    # a heartbeat that saw the running batch late never makes the time negative or > span
    assert busy_in([Sample(0.0, 0, 0, 0, running_ms=9000.0), Sample(1.0, 0, 0, 0)]) == 0.0
    assert busy_in([Sample(0.0, 0, 0, 0), Sample(1.0, 0, 0, 0, running_ms=9000.0)]) == 1.0
    assert in_one_batch([Sample(0.0, 0, 0, 7.0, running_ms=100.0),
                         Sample(4.0, 0, 0, 7.0, running_ms=4100.0)]) == pytest.approx(4.1)


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
    inst = {"q.f1": [Sample(float(t), 1000.0 * (t + 9), 1000.0 * (t + 9), 800.0 * (t + 9))
                     for t in range(11)]}
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
    assert sample_of(5.0, {**figures, "running_ms": 700.0}) == \
        Sample(5.0, 10.0, 9.0, 300.0, 4.0, running_ms=700.0)
    for bad in (math.nan, -1.0, "7"):
        assert sample_of(5.0, {**figures, "running_ms": bad}) is None, bad
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
        retained = rng.choice([0.0, float(len(samples)), rng.uniform(0, 1e4)])
        running = rng.choice([0.0, 0.0, rng.uniform(0, 1e5), rng.uniform(0, 1e15)])
        samples.append(Sample(round(t, 3), *figs, retained=retained, running_ms=running))
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
        capacity = rng.choice([None, Capacity(rng.choice([0.0, 1e-9, rng.uniform(0, 1e6)]),
                                              rng.random() < 0.5, now)])
        view = OperatorView("q", "f", rng.randint(1, 12), instances, upstreams, last, capacity)
        d = decide(view, policy, now)
        assert policy.min_parallelism <= d.target <= policy.max_parallelism
        assert d.explanation.strip() and d.outcome in OUTCOMES
        assert (d.kind == "hold") == (d.target == d.current)
        assert (d.kind == "out") == (d.target > d.current)
        if d.rates is not None:
            assert all(math.isfinite(v) and v >= 0 for v in (
                d.rates.arrival, d.rates.upstream_out, d.rates.processed,
                d.rates.utilisation, d.rates.busiest, d.rates.in_one_batch))
            assert d.rates.busiest <= 1.0
        kinds.add(d.outcome)
    assert {"out", "in", "hold_no_data", "hold_cooldown"} <= kinds  # the fuzz reaches them


# --- a starting instance ------------------------------------------------------------------------

def starting_instance(t: int) -> Sample:
    """Nothing until t=6, when a cold first micro-batch of 6,000 rows ends after 6 s busy
    (500 rows per busy second at best); then 1,000 rows/s at 25 % busy (4,000 per busy s)."""
    if t < 6:
        return Sample(float(t), 0.0, 0.0, 0.0)
    return Sample(float(t), 6000.0 + 1000.0 * (t - 6), 6000.0 + 1000.0 * (t - 6),
                  6000.0 + 250.0 * (t - 6))


def test_an_instance_is_not_measured_while_its_window_holds_its_first_micro_batch() -> None:
    """At a query's start the first batch also starts Python workers and generates code, and
    rows queue upstream meanwhile: read as the instance's rate, that asked for the maximum
    parallelism before any load (benchmarks/elasticity.py). The policy waits until the first
    batch has left the window, then measures the instance as it runs."""
    up = [Sample(float(t), 1000.0 * t, 1000.0 * t, 100.0 * t, 0.0, float(min(t, 6) * 4))
          for t in range(31)]
    inst = [starting_instance(t) for t in range(31)]

    def view(now: int) -> OperatorView:
        return OperatorView("q", "f", 1, {"q.f1": inst[:now + 1]}, {"q.up": up[:now + 1]})

    early = decide(view(10), ElasticPolicy(max_parallelism=3), 10.0)
    assert (early.kind, early.reason) == ("hold", "no_data"), early.explanation
    assert "first micro-batch of q.f1 (its first batch ended 4.0 s ago)" in early.explanation
    later = decide(view(17), ElasticPolicy(max_parallelism=3), 17.0)
    assert later.kind == "hold" and later.reason == "steady", later.explanation
    assert later.rates is not None and later.rates.true_rate == pytest.approx(4000.0)


def test_warming_up_names_only_the_tasks_whose_first_batch_is_in_the_window() -> None:
    warm = [Sample(float(t), 10.0 * t, 10.0 * t, 5.0 * (t + 1)) for t in range(20)]
    idle = [Sample(float(t), 0.0, 0.0, 0.0) for t in range(20)]
    cold = [starting_instance(t) for t in range(20)]
    tasks = {"a": warm, "b": idle, "c": cold}
    assert warming_up(tasks, 5.0) == ["c (its first batch ended 13.0 s ago)"]
    assert warming_up(tasks, 6.5) == []
    assert warming_up({}, 0.0) == []


def test_a_new_instance_inside_its_first_batch_holds_the_measure() -> None:
    """A scale-out's new instance starts its JVM's Python workers and generates code in its
    first batch, on cores the others share, so their batches slow down meanwhile (1 -> 2 -> 3 at
    40 rows/s in benchmarks/elasticity.py, 2026-11-27, measured 25 rows/s per instance then).
    Its heartbeats show the batch running before any has ended: not measured until it ends."""
    up = [Sample(float(t), 40.0 * t, 40.0 * t, 100.0 * t, 0.0, 2.0 * t) for t in range(21)]
    busy = [Sample(float(t), 25.0 * (t + 9), 25.0 * (t + 9), 1000.0 * (t + 9)) for t in range(21)]
    first = [Sample(float(t), 0.0, 0.0, 0.0, running_ms=1000.0 * max(0, t - 13))
             for t in range(21)]
    d = decide(OperatorView("q", "f", 2, {"q.f1": busy, "q.f2": first}, {"q.up": up}, None,
                            Capacity(26.0, True, 0.0)), POLICY, 20.0)
    assert (d.kind, d.reason) == ("hold", "no_data"), d.explanation
    assert "first micro-batch of q.f2 (its first batch has run 7.0 s)" in d.explanation
    # without the running batch's time the same window scales out (the rule before; the queue
    # grew 15 of the 40 rows/s arriving, 38 %, in the window and in the one before:
    # `real_queue`)
    blind = [Sample(s.at, 0.0, 0.0, 0.0) for s in first]
    out = decide(OperatorView("q", "f", 2, {"q.f1": busy, "q.f2": blind}, {"q.up": up}, None,
                              Capacity(26.0, True, 0.0)), POLICY, 20.0)
    assert out.kind == "out", out.explanation
    # an instance that never ran a batch and runs none is idle, not starting
    assert warming_up({"q.f2": blind}, 0.0) == []
