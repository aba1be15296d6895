"""The pure parts of benchmarks/shedding.py and testkit/shed_support.py: the query compiles with
its drop and an automatic operator held at its bound, the oracle's heavy values follow from
Python's own upper-casing, the sink check finds wrong rows, ids twice and the shed ones, and the
latency, backlog and offline LP figures come out of synthetic samples as computed by hand; the
cluster test's record of a generator's offsets keeps the batches Spark purged, and bounds one it
missed. Nothing runs a cluster here."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import shedding as sb
from common.tasks import CompiledQuery
from compiler.pipeline import compile_spec_text
from testkit.heavy_fields import literal
from testkit.e2e_support import end_bounds, recording_offsets
from testkit.shed_support import DROP, check_sink, oracle, spec
from testkit.waiting import wait_for

SOURCE = {"shape": "sequence", "rate": "100", "seed": "3", "limit": "20"}


def compiled(tmp_path: Path, shed: bool = True, instances: int = 1) -> CompiledQuery:
    text = spec("q", SOURCE, 2, "out/s.jsonl", shed=shed, instances=instances)
    return compile_spec_text(text.encode(), str(tmp_path / "q.xml"), base_dir=tmp_path,
                             query_id="q").query


def test_the_spec_has_a_drop_and_an_automatic_operator_at_its_bounds(tmp_path: Path) -> None:
    query = compiled(tmp_path)
    (elastic,) = query.elastic
    assert (elastic.mode, elastic.minimum, elastic.maximum) == ("auto", 1, 2)
    assert DROP in query.task(elastic.splitters[0][0]).operators
    (two,) = compiled(tmp_path, instances=2).elastic
    assert (two.minimum, two.maximum, two.initial) == (2, 2, 2)
    assert not any(DROP in t.operators for t in compiled(tmp_path, shed=False).tasks)


def test_the_oracle_upper_cases_in_python_and_the_check_finds_each_fault() -> None:
    expected = oracle(SOURCE, 2)
    row = expected[0]
    assert row[4] == len((row[2] + literal(0)).upper()) and row[5] == len(
        (row[2] + literal(1)).upper())
    assert row[4] != len(row[2]) + len(literal(0).encode())  # Greek: not the byte count
    keys = [expected[i] for i in range(20) if i not in (3, 4)]
    assert check_sink(keys, expected).missing == {3, 4} and check_sink(keys, expected).sound
    wrong = keys[:-1] + [(*keys[-1][:4], 0, 0)]
    assert check_sink(wrong, expected).wrong and not check_sink(wrong, expected).sound
    assert check_sink(keys + [keys[0]], expected).twice == (0,)


def tick(at: float, made: float, dropped: float, sunk: float) -> sb.Tick:
    return sb.Tick(at, made, dropped, sunk, (0.0, 0.0), (0.0, 0.0), 0.0, "")


def test_latency_and_backlog_from_the_curves_by_hand() -> None:
    # 100 rows made each second, 10 dropped each second, the sink 3 s behind the kept rows
    ticks = [tick(t, 100 * t, 10 * t, max(0.0, 90 * (t - 3))) for t in range(20)]
    assert sb.latencies(ticks, 5, 19) == pytest.approx([3.0] * 15)
    assert sb.backlog_at(ticks, 10) == pytest.approx(1000 - 100 - 630)


def test_the_offline_optimum_keeps_each_instance_within_one_busy_second() -> None:
    # two instances at 2 ms per row each carry 500 rows/s: 1,000 of 3,000 arriving
    assert sb.lp_loss(3000.0, (0.002, 0.002)) == pytest.approx(2 / 3)
    assert sb.lp_loss(800.0, (0.002, 0.002)) == pytest.approx(0.0)
    assert sb.uniform_loss(3000.0, (0.002, 0.002), 0.7) == pytest.approx(0.7)


def write_offsets(folder: Path, batch: int, index: int) -> None:
    """A Spark offset file as the generator's task writes it: a version, metadata, one source."""
    (folder / f".{batch}.tmp").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"index":{index}}}\n')
    (folder / f".{batch}.tmp").rename(folder / str(batch))


def test_the_offset_record_keeps_batches_spark_purged(tmp_path: Path) -> None:
    folder = tmp_path / "spark" / "offsets"
    folder.mkdir(parents=True)
    with recording_offsets(tmp_path, step=0.05) as record:
        for batch in range(6):  # Spark keeps the last two here: older ones are purged
            write_offsets(folder, batch, 10 * (batch + 1))
            wait_for(f"batch {batch} recorded", lambda: batch in record.ends(), 10, 0.05)
            for old in range(batch - 1):
                (folder / str(old)).unlink(missing_ok=True)
        write_offsets(folder, 6, 70)  # read by the last read, on leaving the block
    assert sorted(p.name for p in folder.iterdir()) == ["4", "5", "6"]
    assert record.ends() == {b: 10 * (b + 1) for b in range(7)}


def test_end_bounds_of_a_batch_seen_and_one_missed() -> None:
    ends = {3: 30, 4: 45, 7: 90}
    assert end_bounds(ends, 4) == (45, 45)
    assert end_bounds(ends, 5) == (45, 90)  # between the batches around it
    assert end_bounds(ends, 1) == (0, 30)  # nothing was read before batch 0
    assert end_bounds(ends, 8) == (90, None)
