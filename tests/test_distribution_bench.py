"""The pure parts of benchmarks/distribution.py: its query, oracle, waves and figures.

Nothing runs a cluster here (the benchmark itself is not run by pytest; the cluster test of a
move is tests/test_distribution_cluster.py): these check the yardstick, i.e. that the spec
compiles into four one-chain tasks of the asked cpus in a query that opted in, that the oracle's
heavy values follow from Python's own upper-casing, that the waves are assigned as the issue
says, that slot loads come out of cumulative cpu samples as computed by hand, and that the
mean-only balancer the distributor is compared with moves what it should on the issue's waves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import distribution as db
from compiler.expr import MAX_TEXT_LENGTH
from compiler.pipeline import compile_spec_text
from testkit.heavy_fields import heavy_field, literal


def test_the_spec_compiles_to_four_chains_of_one_task_each_in_a_distributed_query(
        tmp_path: Path) -> None:
    query = compile_spec_text(db.spec(db.QUERY, 100.0, 1000, 3, 0.3).encode(),
                              str(tmp_path / "q.xml"), base_dir=tmp_path, query_id=db.QUERY).query
    assert query.distribute
    assert [(t.operators, t.resources.cpus) for t in query.tasks] == [
        ((f"g{c}", f"heavy{c}", f"keep{c}", f"sink{c}"), 0.3) for c in range(db.CHAINS)]
    assert all(len(heavy_field("sensor", i)) <= MAX_TEXT_LENGTH for i in range(3))


def test_the_oracle_keeps_a_tenth_with_pythons_upper_case_lengths() -> None:
    rows = db.oracle(100.0, 2000, 2, 1)
    assert 100 < sum(rows.values()) < 300  # humidity < 26 of uniform 20..80: ~10 %
    for key in rows:
        sensor, humidity = key[0], key[3]
        assert humidity < 26.0
        assert key[4:] == (len(sensor) + len(literal(0).upper()),
                           len(sensor) + len(literal(1).upper()))
    assert db.oracle(100.0, 2000, 2, 1) != db.oracle(100.0, 2000, 2, 2)  # seeds differ


def test_waves_two_of_the_three_on_one_agent_peak_together() -> None:
    placed = {"q.t0": "A", "q.t1": "A", "q.t2": "A", "q.t3": "B"}
    waves = db.wave_of(placed)
    assert waves == {"q.t0": 1, "q.t1": 1, "q.t2": 2, "q.t3": 2}
    gens = {t: f"g{i}" for i, t in enumerate(sorted(placed))}
    assert db.rates_at(0, waves, gens, 900, 90) == {"g0": 900, "g1": 900, "g2": 90, "g3": 90}
    assert db.rates_at(3, waves, gens, 900, 90) == {"g0": 90, "g1": 90, "g2": 900, "g3": 900}
    with pytest.raises(ValueError):
        db.wave_of({"q.t0": "A", "q.t1": "A", "q.t2": "B", "q.t3": "B"})


def test_slot_loads_from_cumulative_cpu_by_hand() -> None:
    # 0.5 cpu s/s in slot 0 (t 1..4), 1.0 in slot 1 (t 4..9, the interval ending at 5 and the
    # ones ending in 6..9), a counter that falls (a new executor) makes no interval
    samples = [(1.0, 10.0), (4.0, 11.5), (5.0, 12.5), (9.0, 16.5), (11.0, 0.0), (12.0, 2.0)]
    assert db.slot_loads(samples) == {0: 0.5, 1: 1.0, 2: 2.0}
    assert db.peak({"A": {0: 0.5, 1: 1.0}, "B": {1: 3.0, 2: 9.0}}, 0, 1) == 3.0


def waves_by_hand(slots: int) -> dict[str, dict[int, float]]:
    """The issue's tasks: a0 (wave 2), b, c (wave 1) on A, d (wave 2) on B; a wave is 2 for six
    slots, then 0 for six (wave 1 high first). `a0` sorts first: a balancer that sees only equal
    means sends it."""
    def wave(n: int, first: bool) -> float:
        return 2.0 if ((n // 6) % 2 == 0) == first else 0.0
    return {t: {n: wave(n, w == 1) for n in range(slots)}
            for t, w in {"a0": 2, "b": 1, "c": 1, "d": 2}.items()}


FIRST_FIT = {"a0": "A", "b": "A", "c": "A", "d": "B"}


def test_a_mean_only_balancer_over_the_history_moves_once_and_leaves_the_peak() -> None:
    loads = waves_by_hand(48)
    got = db.mean_only_moves(loads, FIRST_FIT, 0, 47, (24, 47), None, 6, 12, 0.2, 24, 60)
    # every task's mean is 1: A 3, B 1; the first task that closes the gap goes: a0, wave 2
    assert got.moves == 1 and got.placement == {"a0": "B", "b": "A", "c": "A", "d": "B"}
    assert got.peak_after == 4.0  # b and c peak together still


def test_a_mean_only_balancer_over_each_round_moves_once_when_it_sees_wave_one_high() -> None:
    loads = waves_by_hand(48)
    got = db.mean_only_moves(loads, FIRST_FIT, 0, 47, (24, 47), 6, 6, 12, 0.2, 24, 60)
    # round at slot 11 sees wave 2 high (A 2, B 2: balanced), at 17 wave 1 (A 4, B 0): moves b
    assert got.moves == 1 and got.placement == {"a0": "A", "b": "B", "c": "A", "d": "B"}
    assert got.peak_after == 2.0
    # rounds three slots off the waves: each round's window holds half a crest of either wave,
    # every task's mean is 1 there, and the balancer sends a0 as over the history: one move,
    # the peak stays
    shifted = {t: {n - 3: v for n, v in s.items() if n >= 3} for t, s in loads.items()}
    again = db.mean_only_moves(shifted, FIRST_FIT, 0, 44, (21, 44), 6, 6, 12, 0.2, 0, 0)
    assert (again.moves, again.peak_after) == (1, 4.0)
