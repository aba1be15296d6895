"""Rule 5's "rows waited longer all window, so one more" acts on a real queue only (issue 31):
`scheduler.elastic_policy.real_queue`, and the start-up emergency leaves out an upstream that
drains its sources' backlog (`draining_upstream`).

Why: in `benchmarks/elasticity.py --agent-cpus 0.35` (2026-11-30 22:58 and 23:29) every second
scale-out step came from that rule, with the cost model at two instances needing two: the two
instances processed 92-101 % of the ~600 rows/s arriving, busy and throttled ~100 % (on 0.35
cpu an instance is throttled at almost any load, so "pressed" reduced to "queued"), the
retained batches rose all window and the generator's backlog grew 1-6 rows/s. The `--window`
run flapped 2 -> 3 after the step down on the same rule while its instances processed 61 of the
59 rows/s arriving. And run 2 of 22:58 moved at base load on the emergency rule: its cold first
instance did 91 rows/s while the generator caught up its start (upstream out 303 rows/s, its
backlog falling 46 rows/s, arrival read 257).

Pure tests on hand-built windows: an upstream task hands rows to the splitter at a steady rate
and n warm instances each read a steady rate, busy and throttled all the time, one micro-batch a
second of the same size (so no cost model is refitted: the view's model is kept). The samples
cover 20 s, the window before (0-10 s) and the window (10-20 s). The oracles are computed here:
the need ceil(arrival / (rate x 0.8)), the queue's growth arrival - processed over arrival, and
what n instances drain in 10 s, (n x rate - arrival) x 10."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from common.batch_cost import BatchCost
from scheduler.elastic_policy import (
    QUEUE_SHARE, Capacity, ElasticPolicy, OperatorView, Sample, decide, draining_upstream,
    fell_behind, measure, queue_share,
)

POLICY = ElasticPolicy(min_parallelism=1, max_parallelism=3)  # the benchmark's, defaults else
# run 1 of 2026-11-30 22:58: 0.586 s + 1.343 ms per row of batch time at 0.35 cpu,
# (2 - 0.5855) / (1.3425 ms x 2) = 527 rows/s per instance
MODEL = BatchCost(0.5855, 1.3425 / 1000.0, 14, 62, 1_044, cpus=0.35, fixed_error=0.037)
MODEL_RATE = MODEL.sustained_rate(2.0)
NOW = 20.0


def need(arrival: float, rate: float) -> int:
    """The oracle: instances that carry `arrival`, each busy at most 0.8 at `rate`."""
    return math.ceil(arrival / (rate * 0.8))


def drained(n: int, rate: float, arrival: float) -> float:
    """The oracle: rows n instances at `rate` drain in 10 s beside `arrival`."""
    return (n * rate - arrival) * 10.0


@dataclass(frozen=True)
class Load:
    """One window's steady figures: rows/s the upstream hands to the splitter (`out`), rows/s
    each instance reads (`each`), how fast the upstream's source backlog grows (rows/s) and the
    batches its channel writers retain (a second)."""

    out: float
    each: float
    backlog_slope: float = 0.0
    retained_rise: float = 1.0


def view(n: int, before: Load, now: Load, backlog: float = 300.0,
         model: BatchCost | None = MODEL, first_batch_at: float | None = None) -> OperatorView:
    """20 one-second samples of the upstream and of n instances: `before` in the first 10 s,
    `now` in the last 10 (the window at NOW); the backlog starts at `backlog`. `model` None:
    no capacity known yet (and the equal batches fit none)."""
    upstream, instances = [], {f"q.f{k}": [] for k in range(1, n + 1)}
    out, left, retained, rows = 50_000.0, backlog, 4.0, 9_000.0
    for t in range(int(NOW) + 1):
        load = before if t <= NOW - 10 else now
        if t > 0:
            out, left = out + load.out, left + load.backlog_slope
            retained, rows = retained + load.retained_rise, rows + load.each
        upstream.append(Sample(float(t), out, out, 0.0, backlog=left, retained=retained))
        for samples in instances.values():  # warm: busy and counting before the samples
            samples.append(Sample(float(t), rows, rows, 40_000.0 + 1000.0 * t,
                                  batches=20.0 + t, nr_periods=100.0 * t,
                                  nr_throttled=100.0 * t, cpu_ms=350.0 * t,
                                  cpu_batches=20.0 + t))
    firsts = {} if first_batch_at is None else {key: first_batch_at for key in instances}
    capacity = None if model is None else Capacity(model.sustained_rate(2.0), True, 0.0, model)
    return OperatorView("bench-elastic", "heavy", n, instances, {"q.up": upstream}, None,
                        capacity, firsts)


# the 2026-11-30 runs at two instances: ~620 rows/s handed over, each instance 303, the
# backlog growing 1 rows/s, the retained batches rising: arrival 621, processed 606
KEPT_UP = Load(out=620.0, each=303.0, backlog_slope=1.0)
# the case the rule exists for: the model (527 rows/s) over-states what each of two instances
# does (264, as one instance at its limit did on 2026-11-30 19:49), the writers' credit absorbs
# the queue (the source backlog flat), the retained batches climbing 2 a second
OVER_STATED = Load(out=620.0, each=264.0, retained_rise=2.0)


def test_the_premise() -> None:
    assert round(MODEL_RATE) == 527 and need(621, MODEL_RATE) == 2  # the model: two suffice
    assert (621 - 606) / 621 < QUEUE_SHARE == 0.1  # 2.4 %: the runs' queue
    assert (620 - 528) / 620 >= QUEUE_SHARE  # 14.8 %: a model over-stating the instances
    assert drained(2, MODEL_RATE, 621) > 300 + 20  # the backlog is what two drain in 10 s


def test_a_queue_of_a_few_rows_a_second_beside_two_instances_that_keep_up_holds() -> None:
    """The 2026-11-30 shape: rows waited longer all window (retained batches rising, backlog
    +1 rows/s), both instances at their cpu limit, and the model at two needs two. The old
    policy added a third ("so one more"); the queue grows 15 rows/s, 2 % of the arrival, and
    its backlog, 320 rows, is within the 4,326 rows two instances drain in 10 s: hold."""
    d = decide(view(2, KEPT_UP, KEPT_UP), POLICY, NOW)
    assert d.rates is not None and d.rates.pressed and d.rates.at_limit
    assert d.needed == need(621, MODEL_RATE) == 2
    assert (d.kind, d.target, d.reason) == ("hold", 2, "small_queue"), d.explanation
    assert round(drained(2, MODEL_RATE, 621)) == 4_326
    assert "but the queue grew 15 rows/s, 2% of the arrival (2% in the window before; a real " \
           "queue grows at least 10% in both) and the backlog, 320 rows, is within what 2 " \
           "instances drain 4,326 rows in 10.0 s at 527 rows/s each" in d.explanation


def test_a_model_that_over_states_the_instances_still_gets_one_more() -> None:
    """The case rule 5 exists for: the model says two suffice, the two process 528 of the
    620 rows/s arriving (14.8 %) in the window and in the one before, the writers' credit
    holding the queue: scale out to 3, reason backlog."""
    d = decide(view(2, OVER_STATED, OVER_STATED), POLICY, NOW)
    assert need(620, MODEL_RATE) == 2 and "ceil(620 / (527 x 0.80)) = 2" in d.explanation
    assert (d.kind, d.target, d.reason) == ("out", 3, "backlog"), d.explanation
    assert "the queue grew 92 rows/s, 15% of the arrival (15% in the window before; at least " \
           "10% in both), so one more" in d.explanation


def test_a_queue_in_one_window_only_waits_for_the_next() -> None:
    """The same 15 % queue in the window, but the window before kept up (2 %): a burst after a
    step or a batch boundary, not yet the instances' queue: hold."""
    d = decide(view(2, KEPT_UP, OVER_STATED), POLICY, NOW)
    assert d.rates is not None and queue_share(d.rates) >= QUEUE_SHARE
    assert (d.kind, d.reason) == ("hold", "small_queue"), d.explanation
    assert "15% of the arrival (2% in the window before" in d.explanation


def test_a_slow_queue_acts_once_its_backlog_is_more_than_the_instances_drain() -> None:
    """A queue growing 4.6 % of the arrival (the backlog +15 rows/s: 635 arrive, 606 are
    processed) whose backlog reached 5,000 rows, more than the (2 x 527 - 635) x 10 = 4,186
    two instances drain in a window at the model's capacity: it went on long enough, one
    more."""
    slow = Load(out=620.0, each=303.0, backlog_slope=15.0)
    d = decide(view(2, slow, slow, backlog=4_700.0), POLICY, NOW)
    assert d.rates is not None and round(d.rates.backlog) == 5_000
    assert queue_share(d.rates) < QUEUE_SHARE and round(drained(2, MODEL_RATE, 635)) == 4_186
    assert (d.kind, d.target, d.reason) == ("out", 3, "backlog"), d.explanation
    assert "the backlog, 5,000 rows, is more than 2 instances drain 4,186 rows" in d.explanation


def test_the_flap_after_the_step_down_holds() -> None:
    """The `--window` run of 2026-11-30 22:40 at +280 s: two window instances processing 61
    rows/s (30.5 each, busy and throttled all the time) of the 59 arriving, the retained batches
    rising all window: the old policy went 2 -> 3. The queue shrinks: hold."""
    model = BatchCost(0.9, 2.7 / 1000.0, 14, 5, 77, cpus=0.35, fixed_error=0.05)
    light = Load(out=59.0, each=30.5)
    d = decide(view(2, light, light, backlog=0.0, model=model), POLICY, NOW)
    assert d.rates is not None and d.rates.pressed
    assert (d.kind, d.target, d.reason) == ("hold", 2, "small_queue"), d.explanation
    assert "the queue grew -2 rows/s, -3% of the arrival" in d.explanation


def test_an_upstream_catching_up_its_start_is_no_emergency() -> None:
    """Run 2 of 2026-11-30 22:58, 10.6 s into the first window of a cold first instance (here 25 s
    into its stabilization): it reads 91 rows/s, busy and throttled; the generator hands over
    303 rows/s while its source backlog falls 46 rows/s (the start's rows), so arrival reads
    257 and the queue grows 166 rows/s, over the 91 processed: the old policy scaled out at
    base load. The upstream drains its sources' backlog, faster than 10 % of the arrival: its
    output is a one-off amount, hold. With the backlog not falling (a x4 step's), the same
    queue is an emergency."""
    start = Load(out=303.0, each=91.0, backlog_slope=-46.0, retained_rise=3.0)
    d = decide(view(1, start, start, backlog=920.0, first_batch_at=-5.0), POLICY, NOW)
    assert d.rates is not None and round(d.rates.arrival) == 303 - 46
    assert d.rates.arrival - d.rates.processed >= d.rates.processed  # the old emergency
    assert draining_upstream(d.rates)
    assert (d.kind, d.reason) == ("hold", "stabilizing"), d.explanation
    assert "while the upstream drains no backlog of its sources" in d.explanation
    step = Load(out=303.0, each=91.0, retained_rise=3.0)
    out = decide(view(1, step, step, first_batch_at=-5.0), POLICY, NOW)
    assert (out.kind, out.reason) == ("out", "backlog"), out.explanation
    assert "emergency while stabilizing" in out.explanation


def test_the_window_before_is_measured_as_the_window() -> None:
    """`real_queue` reads the window before through `measure` at NOW - 10: its figures are the
    first 10 s's."""
    before = measure(view(2, KEPT_UP, OVER_STATED), POLICY, NOW - 10.0)
    assert not isinstance(before, str)
    assert round(before.whole.processed) == 606 and round(before.whole.arrival) == 621


# --- without a cost model: rows per busy second measure an instance only where it fell behind ---
# The `--window` run of 2026-12-01 02:25 (`--fields 1 --rate 60`, 0.35-cpu agents): one window
# instance at base load, batches back to back of a similar size (no cost model: they cannot
# tell the fixed cost from the cost per row), busy and throttled all the time, the retained
# batches rising: "pressed" while it processed what arrived. Its rows per busy second (here 54,
# all it was given; 34 in the run) read as a measured capacity needed ceil(54 / (54 x 0.8)) = 2,
# and the first decision outside the stabilization window scaled out 1 -> 2 on a window still at
# base load (+4.2 s after the step), then 2 -> 3 at +118.6 s.
BASE = Load(out=54.0, each=54.0)
# the x4 step reaching one instance: 216 rows/s handed over, the instance's batches growing
# (80 rows per busy second), the rest queueing in the writer (retained climbing 3 a second)
STEPPED = Load(out=216.0, each=80.0, retained_rise=3.0)


def test_a_window_instance_at_base_load_without_a_model_holds() -> None:
    """The base-load window: pressed, need 2 at its rows per busy second, but the queue grew 0
    rows/s (0 % in both windows): the old policy scaled out 1 -> 2 (reason load); now it holds,
    small_queue, and the capacity it keeps is a lower bound, not a measurement."""
    d = decide(view(1, BASE, BASE, backlog=0.0, model=None), POLICY, NOW)
    assert d.rates is not None and d.rates.pressed and d.rates.at_limit
    assert d.needed == need(54, 54) == 2
    assert (d.kind, d.target, d.reason) == ("hold", 1, "small_queue"), d.explanation
    assert d.capacity is not None and not d.capacity.measured
    assert round(d.capacity.rate) == 54 and d.capacity.cost is None
    assert "the queue grew 0 rows/s, 0% of the arrival (0% in the window before" in \
        d.explanation and "a lower bound" in d.explanation
    assert "no cost model: the batches were all of a similar size" in d.explanation


def test_the_base_load_capacity_moves_nothing_in_the_next_quiet_window() -> None:
    """The capacity the base-load window leaves, fed to the next window with nothing queued
    (retained flat, not pressed): a lower bound needs 2 but holds, steady. The old policy's
    measured 54 rows/s scaled out on rule 6 (both halves need more at a measured capacity)."""
    first = decide(view(1, BASE, BASE, backlog=0.0, model=None), POLICY, NOW)
    quiet = Load(out=54.0, each=54.0, retained_rise=0.0)
    then = replace(view(1, quiet, quiet, backlog=0.0, model=None), capacity=first.capacity)
    d = decide(then, POLICY, NOW)
    assert d.rates is not None and not d.rates.pressed
    assert (d.kind, d.target, d.reason) == ("hold", 1, "steady"), d.explanation


def test_after_the_x4_step_one_window_instance_scales_out_once_to_the_maximum() -> None:
    """The window after the step: 216 rows/s handed over, 80 processed, the queue growing 136
    rows/s (63 %), faster than the instance processes (the window before at base load, 0 %):
    it fell behind, its rows per busy second are measured, ceil(216 / (80 x 0.8)) = 4, clamped
    to the benchmark's 3: one step 1 -> 3."""
    d = decide(view(1, BASE, STEPPED, backlog=0.0, model=None), POLICY, NOW)
    assert d.rates is not None and round(d.rates.processed) == 80
    assert need(216, 80) == 4
    assert (d.kind, d.target, d.reason) == ("out", 3, "load"), d.explanation
    assert d.capacity is not None and d.capacity.measured and round(d.capacity.rate) == 80


def test_fell_behind_wants_both_windows_or_a_queue_as_fast_as_the_processing() -> None:
    """The oracle here: share = (arrival - processed) / arrival in each window. 15 % now and 2 %
    before: not behind; 15 % in both: behind; before not measured (a history of one window):
    this window's 15 %; 63 % now (the queue faster than the 80 processed): behind at once."""
    def of(before: Load, now: Load, n: int = 2) -> tuple[bool, str]:
        v = view(n, before, now, model=None)
        measured = measure(v, POLICY, NOW)
        assert not isinstance(measured, str)
        return fell_behind(measured, measure(v, POLICY, NOW - 10.0))

    assert not of(KEPT_UP, OVER_STATED)[0]
    assert "15% of the arrival (2% in the window before" in of(KEPT_UP, OVER_STATED)[1]
    assert of(OVER_STATED, OVER_STATED)[0]
    one = view(2, OVER_STATED, OVER_STATED, model=None)
    measured = measure(one, POLICY, NOW)
    assert not isinstance(measured, str)
    assert fell_behind(measured, "not measured")[0]
    assert (216 - 80) >= 80 and of(BASE, STEPPED, n=1)[0]
    assert not of(BASE, BASE, n=1)[0]
