"""Spark layer, the run-time side of a rescale (issue 12): a splitter with more partition channels
than it routes to sends rows to the first `active` partitions only (the others are sent
nothing: their writers only advance their tags), a live switch of `active`
routes to the new number from its epoch on, and a number of partitions outside 1..k, or not a
whole number, is refused without changing the routing; a sliding window's splitter sends the
rows whose windows span an event-time switch to both sides, each copy bounded to its side's
windows, so every window is whole on one partition; a join's splitter relaunched with a
planned switch switches there, or refuses at launch when it routed past it; a folding splitter
routes everything to its last (folded) partition at 0. Real Spark (the
session fixture), real
ZeroMQ channels read by test-owned readers; the oracle is the generator's reference twin."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from executor import sinks
from executor.runtime import (ChannelHub, RuntimeSpecError, SwitchRefused, TaskRuntime,
                              with_tick)
from executor.shapes import arrow_schema
from test_runtime_ops import SENSOR
from test_runtime_patterns import ARROW_SENSOR, Collector, collect_rows, sensor_key, settle
from test_runtime_support import START, input_rows, wait_for

pytestmark = pytest.mark.spark

CHANNELS = ("q.el.p1", "q.el.p2", "q.el.p3")
SPLIT = f"split:{'+'.join(CHANNELS)}"
READERS = (("d1",), ("d2",), ("d3",))
RATE, LIMIT = 100.0, 1200


def close_all(rt: TaskRuntime, collectors: list[Collector], hub: ChannelHub) -> None:
    rt.stop()
    for c in collectors:
        c.close()
    hub.close()


def assert_every_row_once(collectors: list[Collector], seed: int) -> None:
    """The partitions together hold the generator's rows (seed `seed`), each once."""
    expected = Counter(sensor_key(r) for r in input_rows("sensor", seed, RATE, LIMIT))
    assert Counter(sensor_key(r) for c in collectors for r in c.rows()) == expected


def started_split(spark: Any, tmp_path: Path, task_id: str, seed: int, **split: Any
                  ) -> tuple[TaskRuntime, ChannelHub, list[Collector]]:
    """A task splitting the sensor generator (paced at RATE rows/s, so a switch comes well
    before its last row) over CHANNELS, with a test-owned reader on each channel."""
    hub = ChannelHub()
    rt = TaskRuntime(spark, query_id="q", task_id=task_id, checkpoint_dir=str(tmp_path / "ck"),
                     channels=hub, trigger_seconds=0.5)
    try:
        rt.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=seed,
                     rate=RATE, limit=LIMIT, start=START)
        rt.split_channel_sink(input="raw", channels=CHANNELS, key=("sensor",), readers=READERS,
                              **split)
    except BaseException:
        close_all(rt, [], hub)
        raise
    return rt, hub, [Collector(ch, task, hub.endpoint(ch) or "", ARROW_SENSOR)
                     for ch, (task,) in zip(CHANNELS, READERS)]


def test_a_split_routes_to_its_active_partitions_and_a_live_switch_widens_it(
        spark: Any, tmp_path: Path) -> None:
    rt, hub, collectors = started_split(spark, tmp_path, "el", 8, active=2)
    try:
        wait_for(lambda: sum(c.pump() for c in collectors) >= RATE, 60, "rows on two partitions")
        switch = rt.live[(SPLIT, "active")].switch
        for bad in (0, 4, True, "2", 2.0, None):
            with pytest.raises(RuntimeSpecError, match=r"routes to 1\.\.3 of them"):
                switch(bad)
        _, epoch = rt.gate.switch(lambda: switch(3), str(tmp_path / "ck" / "spark"), 10)
        collect_rows(collectors, LIMIT, 120)
        assert rt.query is not None and rt.query.exception() is None
    finally:
        close_all(rt, collectors, hub)
    assert_every_row_once(collectors, 8)

    def rows(c: Collector, after: bool) -> list[dict]:
        return [r for b in c.batches if (b.tag >= epoch) == after for r in b.table.to_pylist()]

    before = [rows(c, False) for c in collectors]
    after = [rows(c, True) for c in collectors]
    assert before[0] and before[1] and before[2] == [], "two active partitions before"
    assert all(after), ("three active partitions from the epoch on", epoch,
                        [sorted({b.tag for b in c.batches}) for c in collectors])
    # the third writer sent nothing at all before the switch (an empty partition only
    # advances its tag), so a dormant reader has nothing to drain
    assert collectors[2].batches and min(b.tag for b in collectors[2].batches) >= epoch
    for phase in (before, after):  # by key: a sensor goes to one partition in each phase
        sensors = [{r["sensor"] for r in part} for part in phase]
        assert all(not a & b for i, a in enumerate(sensors) for b in sensors[i + 1:]), sensors


def test_the_number_of_active_partitions_is_a_whole_number_within_the_slots(
        spark: Any, tmp_path: Path) -> None:
    rt = TaskRuntime(spark, query_id="q", task_id="act", checkpoint_dir=str(tmp_path / "ck"))
    for good in (1, 2, 3):
        assert rt._active(SPLIT, good, 3) == good
    assert rt._active(SPLIT, 0, 2, folded=True) == 0  # routes to the folded partition
    for bad in (0, 4, -1, True, False, "2", 2.0, None, [2]):
        with pytest.raises(RuntimeSpecError) as refused:
            rt._active(SPLIT, bad, 3)
        assert f"not {bad!r}" in str(refused.value) and "act" in str(refused.value)


def count(c: Collector, lo: int, hi: float) -> int:
    """Rows a collector got in the batches tagged lo..hi (hi excluded)."""
    return sum(b.table.num_rows for b in c.batches if lo <= b.tag < hi)


def test_a_folding_split_routes_everything_to_the_folded_partition_at_zero_and_none_after(
        spark: Any, tmp_path: Path) -> None:
    """rewrite_rules/folding.rule: the last channel feeds the instance folded into the merger's
    task. At 0 every row goes there; a split to 2 routes by key to the first two from its epoch
    on, and the folded channel gets none; a merge back to 0 routes everything to it again."""
    rt, hub, collectors = started_split(spark, tmp_path, "fold", 5, active=0, folded=True)
    try:
        wait_for(lambda: sum(c.pump() for c in collectors) >= RATE / 2, 60, "folded rows")
        switch = rt.live[(SPLIT, "active")].switch
        for bad in (3, -1, True, None):
            with pytest.raises(RuntimeSpecError, match=r"routes to 0\.\.2 of them"):
                switch(bad)
        ck = str(tmp_path / "ck" / "spark")
        _, split = rt.gate.switch(lambda: switch(2), ck, 10)
        wait_for(lambda: all(c.pump() >= 0 for c in collectors) and all(
            count(c, split, float("inf")) > 0 for c in collectors[:2]), 60,
            "rows on both split partitions")
        _, merged = rt.gate.switch(lambda: switch(0), ck, 10)
        collect_rows(collectors, LIMIT, 120)
        assert rt.query is not None and rt.query.exception() is None
    finally:
        close_all(rt, collectors, hub)
    assert_every_row_once(collectors, 5)
    assert split < merged
    phases = [(0, split), (split, merged), (merged, float("inf"))]
    counts = [[count(c, lo, hi) for c in collectors] for lo, hi in phases]
    assert counts[0][:2] == [0, 0] and counts[0][2] > 0, counts
    assert counts[1][0] > 0 and counts[1][1] > 0 and counts[1][2] == 0, counts
    assert counts[2][:2] == [0, 0] and counts[2][2] > 0, counts


def test_a_launch_whose_control_parameters_ask_too_many_partitions_is_refused(
        spark: Any, tmp_path: Path) -> None:
    """A relaunch carries the parameters in force; a bad `active` among them is refused with
    the operator named, before the query starts."""
    hub = ChannelHub()
    rt = TaskRuntime(spark, query_id="q", task_id="el", checkpoint_dir=str(tmp_path / "ck"),
                     channels=hub, trigger_seconds=0.5, params={SPLIT: {"active": 5}})
    try:
        rt.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=8,
                     rate=300.0, limit=10, start=START)
        with pytest.raises(RuntimeSpecError, match=r"1\.\.3 of them, not 5"):
            rt.split_channel_sink(input="raw", channels=CHANNELS, key=("sensor",),
                                  readers=READERS)
        assert rt.query is None
    finally:
        rt.stop()
        hub.close()


@pytest.mark.parametrize("at, refused", [(45_000, True), (60_000, False)])
def test_a_join_splitter_launched_with_a_planned_switch_switches_there_or_refuses(
        spark: Any, tmp_path: Path, at: int, refused: bool) -> None:
    """A join's right splitter relaunched while a rescale is pending gets `active` = [n, at]:
    it switches at `at` if what it routed before its death (its persisted schedule) plus the
    join bound stays before it, else its launch fails SwitchRefused (the scheduler then undoes
    the rescale) before the query starts."""
    from urllib.parse import quote

    from executor import routing

    path = tmp_path / "ck" / "routing" / (quote(SPLIT, safe="") + ".json")
    path.parent.mkdir(parents=True)
    routing.save(str(path), routing.Schedule([(None, 1)], max_seen=44_900))
    hub = ChannelHub()
    rt = TaskRuntime(spark, query_id="q", task_id="jr", checkpoint_dir=str(tmp_path / "ck"),
                     channels=hub, trigger_seconds=0.5, params={SPLIT: {"active": [3, at]}})
    try:
        rt.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=8,
                     rate=300.0, limit=10, start=START)

        def build() -> None:
            rt.split_channel_sink(input="raw", channels=CHANNELS, key=("sensor",),
                                  readers=READERS, active=1,
                                  switch=("ts", 1000, 32_200, 1000, 200, 1))
        if refused:
            with pytest.raises(SwitchRefused, match="44900 ms .* planned switch 45000"):
                build()
            assert rt.query is None
            assert routing.load(str(path)).entries == [(None, 1)]
        else:
            build()
            assert routing.load(str(path)).entries == [(None, 1), (60_000, 3)]
    finally:
        rt.stop()
        hub.close()


def _ms(value: Any) -> int:
    return int(value.timestamp() * 1000)


def test_a_sliding_windows_split_sends_rows_near_the_switch_to_both_sides_bounded(
        spark: Any, tmp_path: Path) -> None:
    size, slide = 2000, 1000
    hub = ChannelHub()
    rt = TaskRuntime(spark, query_id="q", task_id="sl", checkpoint_dir=str(tmp_path / "ck"),
                     channels=hub, trigger_seconds=0.5)
    wire = arrow_schema(with_tick(SENSOR, bounded=True))
    collectors: list[Collector] = []

    def distinct() -> int:
        for c in collectors:
            c.pump()
        return len({sensor_key(r) for c in collectors for r in c.rows()})
    try:
        rt.generator(op="src", output="raw", schema=SENSOR, shape="sensor", seed=8,
                     rate=RATE, limit=LIMIT, start=START)
        rt.split_channel_sink(input="raw", channels=CHANNELS, key=("sensor",), readers=READERS,
                              active=1, switch=("ts", size, 40_000, slide))
        collectors = [Collector(ch, task, hub.endpoint(ch) or "", wire)
                      for ch, (task,) in zip(CHANNELS, READERS)]
        wait_for(lambda: distinct() >= RATE, 60, "rows on the first partition")
        switch = rt.live[(SPLIT, "active")].switch
        rt.gate.switch(lambda: switch(3), str(tmp_path / "ck" / "spark"), 10)
        at = int(rt.switch_detail["switch_ms"])
        wait_for(lambda: distinct() == LIMIT, 120, "every row on some partition")
        settle(collectors)
        assert rt.query is not None and rt.query.exception() is None
    finally:
        close_all(rt, collectors, hub)
    assert at > 0 and at % slide == 0

    def starts(ts: int) -> list[int]:  # the sliding windows holding ts, by brute force
        first = (ts - size) - (ts - size) % slide
        return [s for s in range(first, ts + 1, slide) if s <= ts < s + size]

    want = Counter((r["sensor"], s) for r in input_rows("sensor", 8, RATE, LIMIT)
                   for s in starts(_ms(r["ts"])))
    got: dict[tuple, Counter] = {}
    copies = Counter()
    for index, c in enumerate(collectors):
        for row in c.rows():
            assert row[sinks.TICK_COLUMN] is False  # a scale-out ticks nobody
            lo, hi = row[sinks.FROM_COLUMN], row[sinks.UNTIL_COLUMN]
            copies[sensor_key(row)] += 1
            for start in starts(_ms(row["ts"])):
                if (lo is None or start >= _ms(lo)) and (hi is None or start < _ms(hi)):
                    got.setdefault((row["sensor"], start), Counter())[index] += 1
    assert set(got) == set(want)
    owner: dict[str, int] = {}
    for (sensor, start), parts in got.items():
        assert len(parts) == 1 and sum(parts.values()) == want[(sensor, start)], (sensor, start)
        (part,) = parts
        if start < at:
            assert part == 0, (sensor, start, "before the switch, one instance")
        else:
            assert owner.setdefault(sensor, part) == part, (sensor, "one owner after")
    assert len(set(owner.values())) >= 2, owner
    near = {k for k, n in copies.items() if n == 2}
    assert near and all(at <= _ms(k[1]) < at + size for k in near)
    assert all(n <= 2 for n in copies.values())
