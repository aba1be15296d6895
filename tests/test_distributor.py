"""The load distributor's pure parts (docs/load.md, "Load distribution"): the load history
(scheduler/load_history.py: cpu split by busy time, slots, bounds) by hand, and the decision
(scheduler/distributor.py) on the issue's two agents with four tasks on two anti-correlated waves,
with its holds (history, threshold, cool-downs, room, apart groups, opt-outs), and a seeded
property: a round never sends an agent more than its free cpus and memory."""

from __future__ import annotations

import math
import random

import pytest

from scheduler.distributor import (DistributionSettings, DistributionView, decide_distribution,
                                   fits)
from scheduler.load_distribution import apply_moves, peak_load
from scheduler.load_history import LoadHistory, cpu_seconds, split

T = 48
WAVE = [math.sin(2 * math.pi * i / T) for i in range(T)]


def wave(sign: float, base: float = 1.0) -> list[float]:
    return [base + sign * w for w in WAVE]


# ---- the load history --------------------------------------------------------------------------

def test_the_agents_cpu_is_split_by_busy_time() -> None:
    h = LoadHistory(slot_seconds=5.0)
    assert h.observe(0.0, "A", 10.0, {"x": 0.0, "y": 0.0}) == {}  # first readings: no interval
    # 2 s later: 2 cpu s used (1.0 s/s); x busy 1.0 s, y 0.5 s -> x gets 2/3, y 1/3
    loads = h.observe(2.0, "A", 12.0, {"x": 1.0, "y": 0.5})
    assert loads == pytest.approx({"x": 2 / 3, "y": 1 / 3})
    assert split(None, {"x": (1.0, 2.0)}) == {"x": 0.5}  # no cpu measured: busy s/s
    assert split(1.0, {"x": (0.0, 2.0), "y": (0.0, 2.0)}) == {"x": 0.0, "y": 0.0}  # none busy
    assert cpu_seconds({"cpus_user_time_secs": 1.5, "cpus_system_time_secs": 0.5}) == 2.0
    assert cpu_seconds({"cpus_user_time_secs": 1.5}) is None


def test_without_cpu_figures_a_task_carries_its_busy_seconds_per_second() -> None:
    h = LoadHistory()
    h.observe(0.0, "A", None, {"x": 0.0})
    assert h.observe(4.0, "A", None, {"x": 3.0}) == {"x": 0.75}


def test_loads_are_averaged_per_slot_and_only_complete_slots_count() -> None:
    h = LoadHistory(slot_seconds=5.0)
    h.observe(0.0, "A", None, {"x": 0.0})
    h.observe(2.0, "A", None, {"x": 1.0})  # 0.5, slot 0
    h.observe(4.0, "A", None, {"x": 3.0})  # 1.0, slot 0
    h.observe(6.0, "A", None, {"x": 3.0})  # 0.0, slot 1 (not complete at now=7)
    assert h.slots("x", now=7.0) == {0: 0.75}
    assert h.slots("x", now=10.0) == {0: 0.75, 1: 0.0}


def test_a_late_heartbeat_does_not_inflate_its_slot() -> None:
    """An executor using 0.5 cpu s/s, its heartbeats sent every second; the one of t=2 arrives at
    2.9 and the next on time at 3.0 (the scheduler's loop was busy): intervals of 1.9 s and 0.1 s,
    the short one at 5 cpu s/s. Weighted by length the slot is 0.5, the truth; the mean of the
    rates was 1.57 (on the cluster a 1-cpu agent measured 15 CPU s/s)."""
    h = LoadHistory(slot_seconds=5.0)
    for received, sent in ((0.0, 0.0), (1.0, 1.0), (2.9, 2.0), (3.0, 3.0), (4.0, 4.0),
                           (6.0, 6.0)):
        h.observe(received, "A", 0.5 * sent, {"x": sent})
    assert h.slots("x", now=10.0) == {0: pytest.approx(0.5), 1: pytest.approx(0.5)}


def test_the_executors_pulses_between_its_heartbeats_do_not_lose_the_cpu() -> None:
    """An executor sends its full heartbeat (cpu, tasks' busy time) every second and, from a
    thread of its own, a pulse with no figures in between. Its container uses 0.5 cpu s/s; x
    and y are each busy 1 s per s (two Spark cores). Each task carries half the cpu, 0.25; when
    the pulses made the scheduler forget the cpu reading, each carried its busy s/s, 1.0."""
    h = LoadHistory(slot_seconds=5.0)
    for i in range(10):
        h.observe(float(i), "A", 0.5 * i, {"x": float(i), "y": float(i)})
        h.observe(i + 0.5, "A", None, {})  # the pulse
    assert h.slots("x", now=10.0) == {0: pytest.approx(0.25), 1: pytest.approx(0.25)}
    assert h.slots("y", now=10.0) == {0: pytest.approx(0.25), 1: pytest.approx(0.25)}


def test_a_counter_that_falls_or_a_stale_heartbeat_makes_no_interval() -> None:
    h = LoadHistory()
    h.observe(0.0, "A", 50.0, {"x": 10.0})
    assert h.observe(2.0, "A", 1.0, {"x": 11.0}) == {"x": 0.5}  # a new executor: busy s/s
    assert h.observe(2.0, "A", 2.0, {"x": 12.0}) == {}  # the same time again: ignored
    assert h.observe(4.0, "A", 3.0, {"x": 5.0}) == {}  # busy fell
    assert h.observe(6.0, "A", 4.0, {"x": 6.0}) == {"x": 0.5}  # cpu 1 s over 2 s, x alone


def test_a_recent_window_of_measured_cpu_for_the_shedding_problem() -> None:
    """`measured`: a task's mean cpu over the intervals split from its agent's cpu that ended
    in the window, weighted by length; an interval without cpu (no cgroup, or the first after a
    new executor) is not one of them, and a task never measured has None (the shedding problem
    then costs its rows on busy time)."""
    h = LoadHistory(recent_seconds=10.0)
    h.observe(0.0, "A", 0.0, {"x": 0.0, "y": 0.0})
    h.observe(1.0, "A", 0.6, {"x": 1.0, "y": 0.5})  # 0.6 cpu: x 0.4, y 0.2
    h.observe(3.0, "A", 1.0, {"x": 2.0, "y": 1.0})  # 0.2 cpu s/s over 2 s: x 2/15, y 1/15
    assert h.measured("x", since=0.0) == pytest.approx((0.4 * 1 + 2 / 15 * 2) / 3)
    assert h.measured("x", since=2.0) == pytest.approx(2 / 15)  # the second interval alone
    assert h.measured("x", since=4.0) is None  # none ended in the window
    h.observe(4.0, "B", None, {"z": 0.0})
    h.observe(5.0, "B", None, {"z": 1.0})
    assert h.measured("z", since=0.0) is None  # busy only: not measured
    for i in range(4, 20):  # only `recent_seconds` are kept
        h.observe(float(i), "A", 1.0 + 0.1 * (i - 3), {"x": 2.0 + (i - 3), "y": 1.0})
    assert h.measured("x", since=0.0) == pytest.approx(0.1)
    assert len(h._measured["x"]) == 11  # intervals that ended at 9..19 s
    h.keep_only(["y"])
    assert h.measured("x", since=0.0) is None


def test_the_history_is_bounded_and_series_share_their_slots() -> None:
    h = LoadHistory(slot_seconds=1.0, max_slots=3)
    for i in range(10):
        h.observe(float(i), "A", None, {"x": float(i), **({"y": 2.0 * i} if i >= 7 else {})})
    assert sorted(h.slots("x", now=100.0)) == [7, 8, 9]  # at most 3 slots kept
    series, n = h.series(["x", "y"], now=100.0)
    # y: slots 8, 9 (first seen at 7)
    assert n == 2 and series == {"x": [1.0, 1.0], "y": [2.0, 2.0]}
    assert h.series(["x", "nobody"], now=100.0) == ({"x": [], "nobody": []}, 0)
    h.keep_only(["y"])
    assert h.slots("x", now=100.0) == {}


# ---- the decision ------------------------------------------------------------------------------

LOADS = {"w1a": wave(1), "w1b": wave(1), "w2a": wave(-1), "w2b": wave(-1)}
FIRST_FIT = {"A": ["w1a", "w1b", "w2a"], "B": ["w2b"]}  # first fit at capacity 3
SETTINGS = DistributionSettings(threshold=0.5, min_slots=12)


def view(movable: set[str] | None = None, free_b: tuple[float, float] = (4.0, 4096.0),
         forbidden: frozenset[tuple[str, str]] = frozenset()) -> DistributionView:
    return DistributionView(FIRST_FIT, frozenset(LOADS if movable is None else movable),
                            {t: (1.0, 512.0) for t in LOADS},
                            {"A": (0.0, 0.0), "B": free_b}, forbidden)


def test_the_move_chosen_lowers_the_busiest_agents_peak() -> None:
    """A carries w1a + w1b + w2a = 3 + sin, B w2b = 1 - sin: means 3 and 1, gap 2 >= 0.5. The
    one-way scores (rho with the rest of A minus rho with B): w1a's rest, w1b + w2a, is flat
    (rho 0), so 0 - (-1) = 1, w1b the same; w2a's rest (w1a + w1b) peaks against it (rho
    -1) and B's w2b with it (1): -2. Ties go to the name: w1a moves, and both agents are flat
    at 2 (peak 4 -> 2)."""
    d = decide_distribution(view(), LOADS, T, SETTINGS, now=1000.0)
    assert (d.kind, [(m.task, m.source, m.target) for m in d.moves]) == \
        ("move", [("w1a", "A", "B")])
    assert d.moves[0].score == pytest.approx(1.0)
    assert d.means == pytest.approx({"A": 3.0, "B": 1.0})
    assert (d.peak_before, d.peak_after) == (pytest.approx(4.0), pytest.approx(2.0))
    assert peak_load(apply_moves(FIRST_FIT, d.moves), LOADS) <= 0.75 * d.peak_before
    assert "peak 4.000 -> 2.000" in d.explanation


def test_an_opted_out_cooling_or_kept_apart_task_is_passed_over_for_the_next_best() -> None:
    for d in (decide_distribution(view(movable={"w1b", "w2a"}), LOADS, T, SETTINGS, 1000.0),
              decide_distribution(view(), LOADS, T, SETTINGS, 1000.0,
                                  last_task_move={"w1a": 900.0}),
              decide_distribution(view(forbidden=frozenset({("w1a", "B")})), LOADS, T,
                                  SETTINGS, 1000.0)):
        assert [m.task for m in d.moves] == ["w1b"] and d.peak_after == pytest.approx(2.0)
    cooled = decide_distribution(view(), LOADS, T, SETTINGS, 1000.0,
                                 last_task_move={"w1a": 600.0})  # 400 s ago: cool-down over
    assert [m.task for m in cooled.moves] == ["w1a"]


@pytest.mark.parametrize("kwargs, slots, reason, words", [
    ({}, 11, "history", "11 slots of load history in common, 12 wanted"),
    ({"free_b": (0.5, 4096.0)}, T, "no_candidate", "no task of A may move to B"),
    ({"free_b": (4.0, 100.0)}, T, "no_candidate", "no room"),
    ({"movable": set()}, T, "no_candidate", "opted out"),
])
def test_holds_say_why(kwargs: dict, slots: int, reason: str, words: str) -> None:
    d = decide_distribution(view(**kwargs), LOADS, slots, SETTINGS, now=1000.0)
    assert (d.kind, d.reason, d.moves) == ("hold", reason, ())
    assert words in d.explanation


def test_threshold_pair_cool_down_and_a_lone_agent_hold() -> None:
    high = DistributionSettings(threshold=2.5, min_slots=12)
    d = decide_distribution(view(), LOADS, T, high, now=1000.0)
    assert (d.kind, d.reason) == ("hold", "balanced")
    assert "A 3.000 vs B 1.000 CPU s/s: gap 2.000 under the threshold 2.500" in d.explanation
    d = decide_distribution(view(), LOADS, T, SETTINGS, now=1000.0,
                            last_pair_move={frozenset({"A", "B"}): 950.0})
    assert (d.kind, d.reason) == ("hold", "cooldown") and "50 s ago" in d.explanation
    alone = DistributionView({"A": list(LOADS)}, frozenset(LOADS), {}, {})
    assert decide_distribution(alone, LOADS, T, SETTINGS, 1000.0).reason == "agents"


def test_two_way_re_places_the_pair_when_every_move_is_allowed() -> None:
    two = DistributionSettings(threshold=0.5, min_slots=12, mode="two-way")
    d = decide_distribution(view(), LOADS, T, two, now=1000.0)
    assert d.kind == "move" and d.peak_after == pytest.approx(2.0)
    assert len(d.moves) >= 1


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="min_slots >= 2"):
        DistributionSettings(min_slots=1)


def test_a_round_never_overfills_an_agent() -> None:
    """Seeded: random clusters of 2-6 agents, 1-12 tasks of random waves, demands and free
    room; the moves sent to every agent fit in what it had free, and no task is lost."""
    rng = random.Random(32)
    moved = 0
    for _ in range(300):
        agents = [f"a{i}" for i in range(rng.randint(2, 6))]
        tasks = [f"t{i}" for i in range(rng.randint(1, 12))]
        loads = {t: [max(0.0, rng.uniform(0, 1) + rng.choice((-1, 1)) * w) for w in WAVE[:16]]
                 for t in tasks}
        placed: dict[str, list[str]] = {a: [] for a in agents}
        for t in tasks:
            placed[rng.choice(agents)].append(t)
        demand = {t: (rng.choice((0.25, 0.5, 1.0, 2.0)), rng.choice((256.0, 512.0, 1024.0)))
                  for t in tasks}
        free = {a: (rng.uniform(0, 3), rng.uniform(0, 3000)) for a in agents}
        v = DistributionView(placed, frozenset(rng.sample(tasks, rng.randint(0, len(tasks)))),
                             demand, free)
        settings = DistributionSettings(threshold=0.1, min_slots=2,
                                        mode=rng.choice(("one-way", "two-way")))
        d = decide_distribution(v, loads, 16, settings, now=0.0)
        sent: dict[str, list[str]] = {}
        for m in d.moves:
            assert m.task in v.movable and m.task in placed[m.source]
            sent.setdefault(m.target, []).append(m.task)
        for target, ts in sent.items():
            assert fits(v, ts[-1], target, ts[:-1]), (target, ts, free[target])
        after = apply_moves(placed, d.moves)
        assert sorted(t for ts in after.values() for t in ts) == sorted(tasks)
        moved += len(d.moves)
    assert moved > 50  # the property was exercised


# ---- the opt-in ---------------------------------------------------------------------------------

def test_a_query_opts_in_with_distribute_on_its_dataflow(tmp_path) -> None:
    from common.tasks import CompiledQuery
    from compiler.pipeline import compile_spec_text
    from compiler.spec import SpecError
    from tests.spec_snippets import with_source_and_sink

    spec = with_source_and_sink("", "raw")
    query = compile_spec_text(spec, "t.xml", base_dir=tmp_path).query
    assert query.distribute is False  # the default: never moved by the distributor
    opted = compile_spec_text(spec.replace('<dataflow name="t"',
                                           '<dataflow name="t" distribute="true"'),
                              "t.xml", base_dir=tmp_path).query
    assert opted.distribute is True and CompiledQuery.from_json(opted.to_json()).distribute
    with pytest.raises(SpecError) as refused:
        compile_spec_text(spec.replace('<dataflow name="t"', '<dataflow name="t" distribute="1"'),
                          "t.xml", base_dir=tmp_path)
    assert "t.xml:1:" in str(refused.value) and "distribute='1' is not allowed" in str(
        refused.value)
