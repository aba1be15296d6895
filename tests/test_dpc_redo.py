"""The pure checkpoint/redo decision of a stateful downstream task (`common.dpc_redo`;
docs/availability.md, "A stateful downstream task"): the first tentative row keeps the stable
point, every batch after it is tentative, the revision asks for one reconcile, the re-run's
first batch announces the revision and is stable; and a seeded fuzz that plays the decision
over random upstream episodes cut into random micro-batches, with the executor's restore and
re-run modelled in plain Python, against the sum over the upstream's stable view."""

from __future__ import annotations

import random

import pytest

from common.dpc_redo import (BatchPlan, RedoError, RedoState, SpoolMarks, from_json, plan,
                             restored, to_json)


def marks(tentative: tuple[int, ...] = (), revisions: dict[int, int] | None = None
          ) -> SpoolMarks:
    return SpoolMarks(frozenset(tentative), tuple(sorted((revisions or {}).items())))


def test_an_episode_keeps_the_stable_point_then_reconciles_once_and_re_runs_stable() -> None:
    state, first = plan(RedoState(), 4, marks())
    assert first == BatchPlan() and state == RedoState()
    state, opened = plan(state, 5, marks((1,)))
    assert opened == BatchPlan(tentative=1, keep_point=True)
    assert state.open == 1 and state.stable_batch == 4
    state, later = plan(state, 6, marks())  # no tentative row read: still tentative
    assert later == BatchPlan(tentative=1)
    state, revising = plan(state, 7, marks((1,), {1: 42}))
    assert revising == BatchPlan(tentative=1, reconcile=True) and state.reconcile_upto == 42
    state, before_stop = plan(state, 8, marks())  # asked once only
    assert before_stop == BatchPlan(tentative=1)
    state = restored(state)
    assert state == RedoState(reconcile_upto=42, rerun=1, superseded=1)
    state, rerun = plan(state, 5, marks((1,), {1: 42}))  # the tentative rows: left out
    assert rerun == BatchPlan(revisions=(1,)) and state == RedoState(superseded=1)
    state, replay = plan(state, 6, marks((1,)))  # a superseded mark opens nothing
    assert replay == BatchPlan() and state.open is None


def test_a_stable_task_passes_a_revision_on_and_a_rerun_may_open_the_next_episode() -> None:
    assert plan(RedoState(), 3, marks((), {2: 9}))[1] == BatchPlan(revisions=(2,))
    state, rerun = plan(RedoState(reconcile_upto=9, rerun=1, superseded=1), 3,
                        marks((1, 2), {1: 9}))
    assert rerun == BatchPlan(tentative=2, revisions=(1,), keep_point=True)
    assert state.open == 2 and state.stable_batch == 2 and state.superseded == 1


def test_restored_needs_an_asked_reconcile() -> None:
    with pytest.raises(RedoError):
        restored(RedoState())
    with pytest.raises(RedoError):
        restored(RedoState(open=1, stable_batch=3))


def test_the_kept_state_round_trips_and_a_bad_one_names_every_bad_field() -> None:
    state = RedoState(open=3, stable_batch=7, reconcile_upto=12, superseded=2)
    assert from_json(to_json(state)) == state
    with pytest.raises(RedoError) as caught:
        from_json({"open": "3", "stable_batch": True, "superseded": None})
    assert "open='3'" in str(caught.value) and "stable_batch=True" in str(caught.value)
    assert "superseded=None" in str(caught.value)
    with pytest.raises(RedoError):
        from_json([1, 2])


# -- the fuzz: an upstream's spool (seq -> rows, each row (value, tentative episode), and the
# episode the seq revises), a downstream summing its rows by the decision

Seq = tuple[list[tuple[int, int | None]], int | None]


def upstream_spool(rng: random.Random) -> tuple[list[Seq], int]:
    """Stable seqs, then episodes: tentative seqs, then the revision on the re-run's first seq
    (its rows stable: the cut input's rows the tentative seqs lacked and theirs again), then
    stable seqs; and the sum of the upstream's stable view (every stable row)."""
    seqs: list[Seq] = []
    stable_total = 0

    def stable_rows() -> list[tuple[int, int | None]]:
        return [(rng.randint(1, 9), None) for _ in range(rng.randint(0, 3))]

    for episode in range(1, rng.randint(1, 4) + 1):
        for _ in range(rng.randint(0, 3)):
            seqs.append((stable_rows(), None))
        live = [[rng.randint(1, 9) for _ in range(rng.randint(0, 3))]
                for _ in range(rng.randint(1, 3))]
        seqs += [([(v, episode) for v in rows], None) for rows in live]
        cut = [rng.randint(1, 9) for _ in range(rng.randint(0, 4))]
        seqs.append(([(v, None) for rows in live for v in rows] + [(v, None) for v in cut],
                     episode))
    seqs.append((stable_rows(), None))
    for rows, _ in seqs:
        stable_total += sum(v for v, e in rows if e is None)
    return seqs, stable_total


def run_downstream(seqs: list[Seq], rng: random.Random) -> tuple[int, list[BatchPlan]]:
    """A downstream task over the spool: micro-batches of random spans; its Spark state (the
    running sum) kept aside at the stable point and put back on a reconcile, the re-run's
    batch up to the revising seq, superseded tentative rows left out as the spool reader
    leaves them out; its sink's stable view summed (plain rows: the last stable batch's sum
    of an updating aggregate is the state then)."""
    state, total, batch, committed = RedoState(), 0, 0, 0  # committed: the seq read up to
    kept: tuple[int, int] | None = None  # (sum, seq) at the stable point
    plans: list[BatchPlan] = []
    last_stable: int | None = 0
    while committed < len(seqs):
        upto = state.reconcile_upto if state.rerun is not None else \
            min(len(seqs), committed + rng.randint(1, 3))
        assert upto is not None
        read = seqs[committed:upto]
        spool_marks = SpoolMarks(
            frozenset(e for rows, _ in read for _, e in rows if e is not None),
            tuple(sorted({r: committed + i + 1 for i, (_, r) in enumerate(read)
                          if r is not None}.items())))
        state, batch_plan = plan(state, batch, spool_marks)
        plans.append(batch_plan)
        if batch_plan.keep_point:
            kept = (total, committed)
        total += sum(v for rows, _ in read for v, e in rows
                     if e is None or e > state.superseded)
        if batch_plan.tentative is None:
            last_stable = total
        batch, committed = batch + 1, upto
        if batch_plan.reconcile:
            assert kept is not None
            state = restored(state)
            total, committed = kept
    assert state.open is None, "an episode still open at the end"
    return (last_stable if last_stable is not None else 0), plans


@pytest.mark.parametrize("seed", range(40))
def test_the_stable_view_of_a_redone_sum_is_the_sum_over_the_upstream_s_stable_view(
        seed: int) -> None:
    rng = random.Random(seed)
    seqs, expected = upstream_spool(rng)
    got, plans = run_downstream(seqs, rng)
    assert got == expected
    episodes = {e for rows, _ in seqs for _, e in rows if e is not None}
    announced = sorted(e for p in plans for e in p.revisions)
    assert set(announced) >= {e for e in episodes
                              if any(p.tentative == e for p in plans)}
