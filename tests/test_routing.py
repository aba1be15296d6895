"""A splitter's routing schedule (`executor.routing`), pure: where each row goes under an
event-time switch, when a switch happens, which retiring partitions get ticks and which rows are
too late; and a sliding window's copies near a switch, checked against an oracle that windows
the same rows in plain Python: every window (key, start) is aggregated whole, by the one
instance that owns it (pmod(hash, n) with the n in force at its start), and nowhere else."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import numpy as np
import pytest

from executor import routing
from executor.routing import UNBOUNDED, Schedule, Switch


def test_a_switch_happens_at_the_first_window_start_after_every_row_routed() -> None:
    assert routing.switch_time(None, 2000) is None
    assert routing.switch_time(0, 2000) == 2000
    assert routing.switch_time(1999, 2000) == 2000
    assert routing.switch_time(2000, 2000) == 4000
    assert routing.switch_time(12_345, 5000) == 15_000


def test_a_switch_reads_the_splitters_parameter_with_the_optional_numbers_defaulting_to_zero(
) -> None:
    assert Switch.of("ts", [10_000, 50_000]) == Switch("ts", 10_000, 50_000, 0, 0, False)
    assert Switch.of("ts", [10_000, 50_000, 2_500]) == Switch("ts", 10_000, 50_000, 2_500)
    assert Switch.of("t", [1, 2, 3, 4], True) == Switch("t", 1, 2, 3, 4, True)
    with pytest.raises(ValueError):
        Switch.of("ts", [10_000])


def test_a_rescale_appends_an_entry_at_the_switch_or_replaces_the_routing_at_once() -> None:
    tumbling = Switch("ts", 10_000, 50_000)
    sliding = Switch("ts", 10_000, 50_000, 2_500)
    assert not tumbling.sliding and tumbling.slide == 10_000
    assert sliding.sliding and sliding.slide == 2_500
    assert routing.spans(Schedule([(None, 1), (4000, 3)])) == [(None, 4000, 1), (4000, None, 3)]
    fresh = Schedule([(None, 1)])
    assert routing.rescaled(fresh, 3, sliding) == (Schedule([(None, 3)]), None)
    routed = Schedule([(None, 1)], max_seen=11_000)
    assert routing.rescaled(routed, 3, tumbling)[1] == 20_000
    after, at = routing.rescaled(routed, 3, sliding)
    assert at == 12_500 and after.entries == [(None, 1), (12_500, 3)] and after.active == 3
    stateless, at = routing.rescaled(routed, 2, None)
    assert at is None and stateless.entries == [(None, 2)]


def test_a_second_rescale_before_event_time_moves_lands_a_slide_after_the_first() -> None:
    sliding = Switch("ts", 10_000, 50_000, 2_500)
    first, at = routing.rescaled(Schedule([(None, 1)], max_seen=11_000), 3, sliding)
    assert at == 12_500
    second, at = routing.rescaled(first, 2, sliding)
    assert at == 15_000 and second.entries == [(None, 1), (12_500, 3), (15_000, 2)]
    assert routing.ticked(second, 50_000) == [2]  # the third instance still owns a span


def test_rows_go_to_the_instances_in_force_at_their_event_time() -> None:
    schedule = Schedule([(None, 1), (4000, 3), (8000, 2)], max_seen=9000)
    hashes = np.array([7, 7, 7, 8, -5])
    times = np.array([3999, 4000, 8000, 100, 5000])
    assert routing.partitions(hashes, times, schedule).tolist() == [0, 1, 1, 0, 1]
    assert routing.partitions(hashes, None, schedule).tolist() == [1, 1, 1, 0, 1]


def test_a_scale_in_ticks_its_retired_partitions_until_past_the_horizon() -> None:
    schedule = Schedule([(None, 3), (4000, 1)], max_seen=5000)
    assert routing.ticked(schedule, 10_000) == [1, 2]
    schedule.ticks = routing.MIN_TICKS
    assert routing.ticked(schedule, 10_000) == [1, 2]
    schedule.max_seen = 14_000
    assert routing.ticked(schedule, 10_000) == []
    assert routing.ticked(Schedule([(None, 1), (4000, 3)], max_seen=5000), 10_000) == []
    late = routing.too_late(np.array([0, 2, 2]), np.array([0, 3000, 13_000]),
                            Schedule([(None, 3), (4000, 1)], max_seen=14_000), 10_000)
    assert late.tolist() == [False, True, False]


def _window_starts(t: int, size: int, slide: int) -> list[int]:
    """The starts of the sliding windows holding event time t, by brute force."""
    first = (t - size) - (t - size) % slide
    return [s for s in range(first, t + 1, slide) if s <= t < s + size]


def _owner(h: int, start: int, schedule: Schedule) -> int:
    n = [count for since, count in schedule.entries if since is None or since <= start][-1]
    return h % n


@pytest.mark.parametrize("seed", range(300))
def test_a_sliding_windows_copies_aggregate_every_window_whole_on_its_owner(seed: int) -> None:
    rng = random.Random(seed)
    slide = rng.choice([500, 1000, 2000])
    size = slide * rng.randint(1, 5) + rng.choice([0, 0, slide // 2])
    span = 40_000
    entries: list[routing.Entry] = [(None, rng.randint(1, 4))]
    for at in sorted(rng.sample(range(slide, span, slide), rng.randint(0, 4))):
        entries.append((at, rng.randint(1, 4)))
    schedule = Schedule(entries, max_seen=span)
    count = rng.randint(0, 400)
    keys = [rng.randint(0, 9) for _ in range(count)]
    hashes = np.array([rng.randint(-2**31, 2**31 - 1) if k == 0 else k * 7919 for k in keys],
                      dtype=np.int64)
    times = np.array([rng.randint(0, span) for _ in range(count)], dtype=np.int64)
    copies = routing.sliding_copies(hashes, times, schedule, size, slide)

    got: dict[tuple[int, int], Counter] = defaultdict(Counter)  # (hash, start) -> instance: rows
    for row, part, lo, hi in zip(copies.rows, copies.parts, copies.lo, copies.hi):
        starts = _window_starts(int(times[row]), size, slide)
        for s in starts:
            if (lo == UNBOUNDED or s >= lo) and (hi == UNBOUNDED or s < hi):
                got[(int(hashes[row]), s)][int(part)] += 1
    want: Counter = Counter((int(h), s) for h, t in zip(hashes, times)
                            for s in _window_starts(int(t), size, slide))
    assert set(got) == set(want)
    for (h, s), instances in got.items():
        assert dict(instances) == {_owner(h, s, schedule): want[(h, s)]}, (h, s)
    # a row has one unbounded copy unless its windows straddle a switch
    switches = [e[0] for e in entries[1:]]
    for row in range(count):
        starts = _window_starts(int(times[row]), size, slide)
        straddles = any(starts[0] < at <= starts[-1] for at in switches)
        mine = np.flatnonzero(copies.rows == row)
        assert len(mine) >= 1 and (len(mine) > 1) == straddles, (row, starts, switches)
        if not straddles:
            assert copies.lo[mine[0]] == UNBOUNDED and copies.hi[mine[0]] == UNBOUNDED


def test_a_tumbling_windows_rows_are_never_copied() -> None:
    schedule = Schedule([(None, 1), (4000, 3)], max_seen=9000)
    hashes, times = np.arange(50, dtype=np.int64), np.arange(0, 10_000, 200, dtype=np.int64)
    copies = routing.sliding_copies(hashes, times, schedule, 2000, 2000)
    assert copies.rows.tolist() == sorted(copies.rows.tolist()) == list(range(50))
    assert (copies.lo == UNBOUNDED).all() and (copies.hi == UNBOUNDED).all()
    assert copies.parts.tolist() == routing.partitions(hashes, times, schedule).tolist()


def test_a_planned_switch_is_refused_once_a_row_could_reach_past_it() -> None:
    schedule = Schedule([(None, 1)], max_seen=9_000)
    after = routing.rescaled_at(schedule, 3, 10_000, 0)
    assert after.entries == [(None, 1), (10_000, 3)] and after.max_seen == 9_000
    assert routing.rescaled_at(Schedule([(None, 2)]), 1, 0, 500).entries == [(None, 2), (0, 1)]
    for reach in (1_000, 5_000):
        with pytest.raises(ValueError, match="past the planned switch 10000"):
            routing.rescaled_at(schedule, 3, 10_000, reach)
    # a plan lands after the last switch, never on or before it: that switch's instances
    # would get no row, nor the ticks that retire them
    ahead = Schedule([(None, 1), (20_000, 3)], max_seen=9_000)
    for at in (15_000, 20_000):
        with pytest.raises(ValueError, match="not after the last one, 20000"):
            routing.rescaled_at(ahead, 2, at, 0)
    later = routing.rescaled_at(ahead, 2, 21_000, 0)
    assert later.entries == [(None, 1), (20_000, 3), (21_000, 2)]
    assert routing.ticked(later, 10_000) == [2]


@pytest.mark.parametrize("seed", range(200))
def test_a_joins_pairs_meet_once_on_the_owner_of_the_left_rows_time(seed: int) -> None:
    """Left rows go to the owner at their own time (`partitions`), right rows to every owner
    within the bound (`spread_partitions`): each pair within the bound meets on exactly one
    instance, the left row's owner, and nowhere twice."""
    rng = random.Random(seed)
    span, bound = 30_000, rng.choice([0, 200, 1000, 4000])
    entries: list[routing.Entry] = [(None, rng.randint(1, 4))]
    for at in sorted(rng.sample(range(1000, span, 1000), rng.randint(0, 4))):
        entries.append((at, rng.randint(1, 4)))
    schedule = Schedule(entries, max_seen=span)
    keys = 6

    def side(count: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([rng.randint(0, keys - 1) * 7919 - 3 for _ in range(count)],
                         dtype=np.int64),
                np.array([rng.randint(0, span) for _ in range(count)], dtype=np.int64))
    lh, lt = side(rng.randint(0, 150))
    rh, rt = side(rng.randint(0, 150))
    left_parts = routing.partitions(lh, lt, schedule)
    rows, right_parts = routing.spread_partitions(rh, rt, schedule, bound)
    assert len(set(zip(rows.tolist(), right_parts.tolist()))) == len(rows)  # once per instance
    met: Counter = Counter()
    for li in range(len(lh)):
        for ri, part in zip(rows, right_parts):
            if lh[li] == rh[ri] and abs(int(lt[li]) - int(rt[ri])) <= bound \
                    and left_parts[li] == part:
                met[(li, int(ri))] += 1
    want = {(li, ri) for li in range(len(lh)) for ri in range(len(rh))
            if lh[li] == rh[ri] and abs(int(lt[li]) - int(rt[ri])) <= bound}
    assert set(met) == want and all(n == 1 for n in met.values())
    for li in range(len(lh)):
        assert left_parts[li] == _owner(int(lh[li]), int(lt[li]), schedule)
