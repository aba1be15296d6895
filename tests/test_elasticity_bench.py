"""The pure parts of benchmarks/elasticity.py: its query, oracle and the figures it derives.

Nothing runs a cluster here (the benchmark itself is not run by pytest): these check the
yardstick, i.e. that the spec compiles into an automatic elastic operator with every heavy
expression inside the language's limit, that the oracle's heavy values follow from Python's own
upper-casing, and that the figures (detection time, steps, drain, slopes, scale-in) come out of
a synthetic status history as computed by hand.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import elasticity as eb
from compiler.expr import MAX_TEXT_LENGTH
from compiler.pipeline import compile_spec_text

PLAN = eb.Plan(rate=100.0, fields=3, steady=5.0, step=5.0, down=5.0, manual=False)


def test_the_spec_compiles_to_an_automatic_stateless_operator(tmp_path: Path) -> None:
    query = compile_spec_text(eb.spec(PLAN).encode(), str(tmp_path / "q.xml"),
                              base_dir=tmp_path, query_id=eb.QUERY).query
    (elastic,) = query.elastic
    assert (elastic.operator, elastic.mode, elastic.minimum, elastic.maximum,
            elastic.initial, elastic.stateful) == (eb.OPERATOR, "auto", 1, 3, 1, False)
    assert len(elastic.slots) == 3
    for i in range(PLAN.fields):
        assert len(eb.heavy_field("sensor", i)) <= MAX_TEXT_LENGTH
    assert len({eb.literal(i) for i in range(PLAN.fields)}) == PLAN.fields


def test_the_manual_spec_is_manual(tmp_path: Path) -> None:
    manual = eb.Plan(100.0, 2, 5.0, 5.0, 5.0, manual=True)
    query = compile_spec_text(eb.spec(manual).encode(), str(tmp_path / "q.xml"),
                              base_dir=tmp_path, query_id=eb.QUERY).query
    assert query.elastic[0].mode == "manual"


def test_the_oracle_keeps_humid_rows_with_upper_case_lengths() -> None:
    small = eb.Plan(rate=1000.0, fields=2, steady=0.05, step=0.0, down=0.05, manual=False)
    expected = eb.oracle(small)
    rows = list(expected.elements())
    assert 0 < len(rows) < small.limit
    for sensor, _ts, _temp, humidity, *heavy in rows:
        assert humidity < eb.HUMIDITY_BELOW
        # Greek small letters upper-case one to one: the length is the text's plus the key's
        assert heavy == [len(sensor) + eb.LITERAL_CHARS] * 2


WINDOWED = eb.Plan(rate=100.0, fields=3, steady=5.0, step=5.0, down=5.0, manual=False,
                   window=True)


def test_the_window_spec_compiles_to_an_automatic_keyed_window_aggregate(tmp_path: Path) -> None:
    query = compile_spec_text(eb.spec(WINDOWED).encode(), str(tmp_path / "q.xml"),
                              base_dir=tmp_path, query_id=eb.QUERY).query
    (elastic,) = query.elastic
    assert (elastic.operator, elastic.mode, elastic.maximum, elastic.stateful,
            elastic.switch_time) == (eb.OPERATOR, "auto", 3, True, "ts")
    assert WINDOWED.pause_goal == 5.0 and PLAN.pause_goal == 2.0


def test_the_window_oracle_counts_each_closed_window_of_each_sensor() -> None:
    """Counted here independently of `window_oracle`: rows bucketed by the epoch-aligned
    10 s window of their time; a window closes once a later row is 0.5 s past its end."""
    from datetime import timedelta

    from testkit.e2e_support import floor_time, generator_rows

    small = eb.Plan(rate=200.0, fields=2, steady=0.0, step=0.0, down=0.0, manual=False,
                    window=True)
    rows = generator_rows(small.source())
    size = timedelta(seconds=eb.WINDOW_SECONDS)
    closed_by = max(r["ts"] for r in rows) - timedelta(milliseconds=eb.WINDOW_WATERMARK_MS)
    buckets: dict[tuple, list[float]] = {}
    for r in rows:
        buckets.setdefault((floor_time(r["ts"], size), r["sensor"]), []).append(r["humidity"])
    mine = {(start, sensor, len(hs), max(hs), len(hs), len(hs))
            for (start, sensor), hs in buckets.items() if start + size <= closed_by}
    expected = eb.oracle(small)
    assert set(expected) == mine and all(n == 1 for n in expected.values())
    assert len(mine) >= 10 * 10  # ~150 s of rows at 200/s: ten sensors in >= ten windows


def tick(at: float, parallelism: int, backlog: float, processed: float,
         slots: tuple[str, ...] = ("running", "dormant", "dormant")) -> eb.Tick:
    return eb.Tick(at, parallelism, list(slots), None, 0.0, backlog, processed, 0.0)


def synthetic_run() -> eb.Run:
    """Steady 0..10 s at 100 rows/s; the step at 10 s; one instance saturated at 250 rows/s;
    a scale-out 1 -> 2 asked at 14 s, applied at 15 s, running at 16 s; the backlog grows by
    150/s until 16 s, then drains at 200/s; the step down at 40 s, a scale-in 2 -> 1 at 52 s."""
    run = eb.Run(PLAN, began=0.0, step_at=10.0, down_at=40.0, end_at=70.0)
    processed, backlog = 0.0, 0.0
    for second in range(71):
        at = float(second)
        if at <= 10:
            rate = 100.0
        elif at <= 16:
            rate, backlog = 250.0, backlog + 150.0
        elif at <= 40:
            rate, backlog = 600.0, max(0.0, backlog - 200.0)
        else:
            rate = 100.0
        processed += rate
        n = 2 if 15 <= at < 53 else 1
        slots = ("running", "running" if 16 <= at < 53 else "starting" if n == 2 else
                 "dormant", "dormant")
        run.ticks.append(tick(at, n, backlog, processed, slots))
    run.rescales = [
        {"from": 1, "to": 2, "trigger": "auto", "asked_at": 14.0, "applied_at": 15.0,
         "pause_s": 0.5, "state": "applied", "request": "r1", "reason": "out"},
        {"from": 2, "to": 1, "trigger": "auto", "asked_at": 52.0, "applied_at": 52.5,
         "pause_s": 0.25, "state": "applied", "request": "r2", "reason": "in: load"},
    ]
    return run


def test_figures_of_a_synthetic_history_match_the_hand_computed_ones() -> None:
    f = eb.figures_of(synthetic_run())
    assert (f.detect_ask, f.detect_apply, f.detect_running) == (4.0, 5.0, 6.0)
    assert (f.steps_out, f.stable_parallelism, f.flaps) == (1, 2, 0)
    assert f.pauses == [0.5, 0.25]
    assert (f.backlog_peak, f.backlog_peak_at) == (900.0, 6.0)
    # drained = backlog <= 1 s of stepped input (400 rows): 900 - 3 x 200 = 300 at 19 s
    assert f.drained_after == pytest.approx(19.0 - 15.0)
    assert f.before == pytest.approx(100.0)
    assert f.saturated == pytest.approx(250.0)
    assert f.after == pytest.approx(600.0)
    assert f.slope_after < 0  # drains, then stays at 0
    assert (f.scale_in_after, f.scale_in_to, f.scale_in_reason) == (12.0, 1, "in: load")
    assert f.final_parallelism == 1


def test_a_run_that_never_scales_out_has_no_detection() -> None:
    run = synthetic_run()
    run.rescales = []
    f = eb.figures_of(run)
    assert f.steps_out == 0 and math.isnan(f.detect_ask) and math.isnan(f.drained_after)
    assert any("MISSED" in line for line in eb.verdicts([run], [f]))


def test_slope_and_rates() -> None:
    assert eb.slope([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) == pytest.approx(2.0)
    assert math.isnan(eb.slope([(0.0, 1.0), (1.0, 3.0)]))
    ticks = [tick(float(t), 1, 0.0, 10.0 * t) for t in range(5)]
    assert eb.rate_between(ticks, 1.0, 3.0) == pytest.approx(10.0)
    assert math.isnan(eb.rate_between(ticks, 10.0, 20.0))


def decision(kind: str, reason: str, text: str) -> dict[str, object]:
    return {"kind": kind, "reason": reason, "explanation": text}


def test_decision_lines_show_every_move_and_the_first_hold_of_each_reason() -> None:
    run = synthetic_run()
    run.decisions = [(5.0, decision("hold", "settling", "settling before the step")),
                     (12.0, decision("hold", "settling", "settling A")),
                     (13.0, decision("hold", "settling", "settling B")),
                     (13.5, decision("hold", "cooldown", "cool-down")),
                     (14.0, decision("out", "load", "scale out 1 -> 2")),
                     (20.0, decision("hold", "bounds", "at max"))]
    lines = eb.decision_lines(run)
    assert lines == ["  t=   +2.0 s: settling A", "  t=   +4.0 s: scale out 1 -> 2",
                     "  t=  +10.0 s: at max",
                     "  holds (distinct decisions, by reason): settling 3, cooldown 1, bounds 1"]
