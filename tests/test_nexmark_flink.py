"""The plumbing of `benchmarks/nexmark.py --peer flink` that needs no Flink: the events file
writer, the job script's tables and SQL, its result lines and the comparison's goal.

No engine runs here (the benchmark is not run by pytest); these check that PyFlink is given the
events the Elastiq run generates (against the shapes' plain-Python `reference_row`), that its
tables carry the shapes' columns, and how the report decides the issue's goal.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import nexmark_flink
from executor import shapes
from testkit.e2e_support import read_sink

SEED, START, RATE = 7, "2024-01-01T00:00:00Z", 1_000_000.0


def test_the_events_files_hold_the_generators_rows_dealt_over_the_readers(tmp_path: Path) -> None:
    counts = nexmark_flink.write_events(tmp_path, 460, SEED, START, RATE, files=2)
    assert counts == {"bid": 460, "auction": 30, "person": 10}
    first = shapes.parse_start(START)
    for table, rows in counts.items():
        parts = [read_sink(tmp_path / table / f"part-{k}.jsonl") for k in (0, 1)]
        assert [len(p) for p in parts] == [rows - rows // 2, rows // 2]
        shape = shapes.shape_named(table)
        for i in range(rows):  # row i in file i % 2, equal to the plain-Python reference
            assert parts[i % 2][i // 2] == shapes.reference_row(shape, SEED, first, RATE, i)


def test_a_chunk_boundary_keeps_the_round_robin(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nexmark_flink, "CHUNK", 7)  # odd: every other chunk starts in file 1
    nexmark_flink.write_events(tmp_path, 46, SEED, START, RATE, files=2)
    bids = [read_sink(tmp_path / "bid" / f"part-{k}.jsonl") for k in (0, 1)]
    times = [b["date_time"] for i in range(23) for b in (bids[0][i], bids[1][i])]
    assert times == sorted(times) and len(set(times)) == 46


def test_the_flink_tables_carry_the_shapes_columns() -> None:
    job = nexmark_flink.job_script
    for table, columns in job.TABLE_COLUMNS.items():
        assert [c.split()[0] for c in columns] == list(shapes.shape_named(table).columns.names)
    for name, query in nexmark_flink.FLINK_SQL.items():
        assert set(query.tables) <= {*job.TABLE_COLUMNS, job.SIDE_INPUT}, name
        assert job.insert_sql(name).startswith(f"INSERT INTO sink_{name}\nSELECT "), name
        assert f"'path' = '/out/{name}'" in job.sink_ddl(name, f"/out/{name}")
    assert nexmark_flink.flink_queries(["q9", "q2", "q0"]) == ["q2", "q0"]
    counts = nexmark_flink.table_rows(4600)
    assert nexmark_flink.flink_rows_read("q20", counts) == 4600 + 300
    assert nexmark_flink.flink_rows_read("q3", counts) == 300 + 100
    assert nexmark_flink.flink_rows_read("q13", counts) == 4600  # the side input uncounted


def test_the_side_input_is_written_without_its_header(tmp_path: Path) -> None:
    nexmark_flink.write_side_input(tmp_path, "key,value\n0,value-0\n1,value-1\n")
    written = tmp_path / nexmark_flink.job_script.SIDE_INPUT / "side_input.csv"
    assert written.read_text(encoding="utf-8") == "0,value-0\n1,value-1\n"


def test_the_job_scripts_result_lines_are_read_back() -> None:
    job = nexmark_flink.job_script
    lines = ["noise", job.result_line("q0", 1.5, 4.0), "PEERS done", job.result_line("q2", 0.5, 2)]
    timings = nexmark_flink.parse_timings(lines)
    assert timings == {"q0": nexmark_flink.FlinkTiming("q0", 1.5, 4.0),
                       "q2": nexmark_flink.FlinkTiming("q2", 0.5, 2.0)}
    assert nexmark_flink.per_core(1000, 0.5) == 1000.0
    assert math.isnan(nexmark_flink.per_core(1000, 0.0))


def comparison(elastiq: float, flink: float,
               problem: str | None = None) -> nexmark_flink.Comparison:
    return nexmark_flink.Comparison("q0", "pass-through", 10, elastiq, None, 10, flink,
                                    flink / 2, problem)


def test_the_goal_is_elastiq_at_half_of_pyflink_and_both_exact() -> None:
    assert comparison(50.0, 100.0).goal == "MET"
    assert comparison(49.9, 100.0).goal == "MISSED"
    assert comparison(50.0, 100.0, "1 rows missing").goal == "n/a"
    assert comparison(math.nan, 100.0).goal == "n/a"
    assert comparison(80.0, 100.0).ratio == 0.8
    report = nexmark_flink.comparison_report([comparison(50.0, 100.0, "1 rows missing")])
    assert "WRONG: 1 rows missing" in report and "0.50" in report
