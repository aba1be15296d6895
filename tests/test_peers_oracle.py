"""The pure helpers of benchmarks/peers.py: its input file, oracle, comparison and latency maths.

No engine runs here (the benchmark itself is not run by pytest); these check that the yardstick
the benchmark holds every engine to is right: the input file holds the project's `sensor` shape,
the oracle's windows, the watermark cut, the comparison's tolerance and what it reports.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import peers
from executor import shapes

T0 = peers.START_MS


def reading(index: int, sensor: str, offset_ms: int, temp: float) -> peers.Reading:
    return peers.Reading(index, sensor, T0 + offset_ms, temp)


def test_input_file_holds_the_sensor_shape_and_the_oracle_reads_it_back(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    peers.write_input(path, 3000)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3000
    shape = shapes.shape_named("sensor")
    kept = peers.read_input(path)
    expected = []
    for i in range(3000):  # plain-Python reference of the project's shape, 1 ms apart
        row = shapes.reference_row(shape, peers.SEED, T0 * 1000, 1000.0, i)
        assert peers.iso_ms(row["ts"].isoformat()) == T0 + i
        if row["temp"] > 30:
            expected.append(peers.Reading(i, row["sensor"], T0 + i, row["temp"]))
    assert kept == expected
    assert 700 < len(kept) < 1300  # temp is uniform in [10, 40): about a third pass


def test_input_line_round_trips_floats_and_instants() -> None:
    line = peers.input_line("s-3", T0 + 12_345, 30.000000000000004, 79.99999999999999)
    assert '"ts":"2024-01-01T00:00:12.345Z"' in line
    (r,) = peers.parse_input([line])
    assert r == peers.Reading(0, "s-3", T0 + 12_345, 30.000000000000004)
    assert peers.parse_input([peers.input_line("s-3", T0, 30.0, 50.0)]) == []  # not > 30


def test_oracle_windows_and_aggregates() -> None:
    rows = [reading(0, "s-1", 0, 31.0), reading(1, "s-1", 9_999, 35.0),
            reading(2, "s-2", 5_000, 32.5), reading(3, "s-1", 10_000, 33.0)]
    got = peers.oracle(rows, None)
    assert got == {(T0, "s-1"): peers.WindowRow(T0, "s-1", 33.0, 35.0, 2),
                   (T0, "s-2"): peers.WindowRow(T0, "s-2", 32.5, 32.5, 1),
                   (T0 + 10_000, "s-1"): peers.WindowRow(T0 + 10_000, "s-1", 33.0, 33.0, 1)}


def test_watermark_keeps_only_windows_ending_by_it() -> None:
    rows = [reading(0, "s-1", 0, 31.0), reading(1, "s-1", 15_000, 31.0),
            reading(2, "s-1", 21_999, 31.0)]
    assert peers.final_watermark(rows) == T0 + 19_999
    assert set(peers.oracle(rows, peers.final_watermark(rows))) == {(T0, "s-1")}
    # a window ending exactly at the watermark is emitted (Spark: end <= watermark)
    assert set(peers.oracle(rows, T0 + 20_000)) == {(T0, "s-1"), (T0 + 10_000, "s-1")}
    assert set(peers.expected_for("flink", rows)) == {(T0, "s-1"), (T0 + 10_000, "s-1"),
                                                      (T0 + 20_000, "s-1")}
    assert set(peers.expected_for("spark", rows)) == {(T0, "s-1")}


def test_compare_accepts_equal_rows_and_names_every_kind_of_difference() -> None:
    a = peers.WindowRow(T0, "s-1", 33.0, 35.0, 2)
    b = peers.WindowRow(T0, "s-2", 31.5, 32.0, 4)
    expected = {a.key: a, b.key: b}
    assert peers.compare([a, b], expected) == ""
    close = peers.WindowRow(T0, "s-1", 33.0 * (1 + 5e-10), 35.0, 2)
    assert peers.compare([close, b], expected) == ""
    far = peers.WindowRow(T0, "s-1", 33.0 * (1 + 5e-9), 35.0, 2)
    assert "1 different" in peers.compare([far, b], expected)
    off_max = peers.WindowRow(T0, "s-1", 33.0, math.nextafter(35.0, 36.0), 2)
    assert "1 different" in peers.compare([off_max, b], expected)
    assert "1 different" in peers.compare([peers.WindowRow(T0, "s-1", 33.0, 35.0, 3), b],
                                          expected)
    assert "1 missing" in peers.compare([a], expected)
    other = peers.WindowRow(T0 + 10_000, "s-1", 33.0, 35.0, 2)
    assert "1 unexpected" in peers.compare([a, b, other], expected)
    assert "1 window(s) written twice" in peers.compare([a, a, b], expected)


def test_parse_result_reads_elastiq_and_peer_lines_alike() -> None:
    elastiq = ('{"window_start": "2024-01-01T00:00:10+00:00", "window_end": '
               '"2024-01-01T00:00:20+00:00", "sensor": "s-4", "avg_temp": 33.5, '
               '"max_temp": 39.9, "readings": 7}')
    peer = ('{"window_start_ms": %d, "sensor": "s-4", "avg_temp": 33.5, "max_temp": 39.9, '
            '"readings": 7}' % (T0 + 10_000))
    assert peers.parse_result(elastiq) == peers.parse_result(peer) == \
        peers.WindowRow(T0 + 10_000, "s-4", 33.5, 39.9, 7)


def test_window_latency_runs_from_the_release_of_the_closing_row() -> None:
    rows = [reading(i, "s-1", i * 1_000, 31.0) for i in range(0, 30)]
    # window [0, 10 s) closes at the first row with ts >= 12 s: index 12
    assert peers.closing_index(rows, T0) == 12
    assert peers.closing_index(rows, T0 + 20_000) is None  # needs ts >= 32 s
    chunks = [(10, 100.0), (20, 100.5), (30, 101.0)]
    assert peers.release_time(chunks, 9) == 100.0
    assert peers.release_time(chunks, 12) == 100.5
    assert peers.release_time(chunks, 30) is None
    seen = [(100.9, peers.WindowRow(T0, "s-1", 31.0, 31.0, 10)),
            (100.95, peers.WindowRow(T0, "s-2", 31.0, 31.0, 1)),
            (101.4, peers.WindowRow(T0 + 10_000, "s-1", 31.0, 31.0, 10))]
    assert peers.window_latencies(seen, rows, chunks) == pytest.approx([0.4, 0.4])


def test_arguments() -> None:
    args = peers.parse_args(["--quick", "--engines", "spark,bytewax"])
    assert (args.rows, args.repeats, args.engine_list) == (300_000, 1, ["spark", "bytewax"])
    assert args.latency_list == ["spark", "bytewax"]
    assert peers.parse_args(["--no-latency"]).latency_list == []
    for bad in (["--engines", "storm"], ["--rows", "10"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            peers.parse_args(bad)
    assert peers.order_for(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert peers.order_for([], 2) == []


def test_report_gives_ratios_goals_and_problems() -> None:
    def figures(engine: str, rows_per_s: float, startup: float, latency: float,
                problems: tuple[str, ...] = ()) -> peers.Figures:
        return peers.Figures(engine, rows_per_s, startup, not problems, 3, latency, 15, problems)

    text = peers.report({"elastiq": figures("elastiq", 300_000, 9.0, 400.0),
                         "spark": figures("spark", 250_000, 10.0, 800.0),
                         "flink": figures("flink", 600_000, 6.0, 200.0, ("flink: 1 missing",))},
                        3_000_000, 3, 2000.0)
    assert "Elastiq/Flink: throughput 0.50 (goal >= 1.0: MISSED), start-up 1.50" in text
    assert "Elastiq/hand-written Spark: throughput 1.20 (goal >= 1.0: met)" in text
    assert "window latency p50 0.50" in text
    assert "(goal <= 500 ms: met)" in text and "start-up 9.0 s (goal <= 8 s: MISSED)" in text
    assert "PROBLEM flink: 1 missing" in text
    assert [line.split()[3] for line in text.splitlines() if line.startswith("flink ")] == ["NO"]
    assert "bytewax" not in text


def test_warm_up_window_closes_by_itself_and_is_left_out_of_the_results() -> None:
    warm = peers.parse_input(peers.warmup_lines())
    assert {r.sensor for r in warm} == {peers.WARM_SENSOR}
    assert max(r.ts_ms for r in warm) < T0  # before every measured row: never late data
    closed = peers.oracle(warm, peers.final_watermark(warm))
    assert list(closed) == [(T0 - 30_000, peers.WARM_SENSOR)]
    row = peers.WindowRow(T0, "s-1", 31.0, 31.0, 1)
    seen = [(1.0, closed[(T0 - 30_000, peers.WARM_SENSOR)]), (2.0, row)]
    assert peers.data_rows(seen) == [(2.0, row)]
