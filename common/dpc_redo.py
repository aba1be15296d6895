"""Borealis DPC at a stateful downstream task: checkpoint/redo (docs/availability.md, "A stateful
downstream task"), the pure decision of how each micro-batch is written.

A task whose window or updating aggregate reads a marked channel cannot carry a row's tentative
mark through Spark's state. It does what Borealis's downstream nodes do instead: on the first
micro-batch that reads a tentative row of the upstream's episode N it keeps its last stable
point (the Spark checkpoint before that batch, copied aside by the executor), and writes that
batch and every later one tentative in episode N as a whole. When a batch reads the upstream's
revision of N (the stable re-run rows that replace N's tentative ones follow it in the spool),
it asks for a reconcile: the executor stops the query, puts the stable point back and runs it
again up to the revising spooled batch, leaving out the upstream's tentative rows of N (they
are superseded: `superseded` is the highest episode revised). That re-run's first batch
announces revision N before its rows, which are stable again: the sink's stable view is then
the aggregate over the upstream's stable view, exact.

`plan` decides from what a batch's spooled batches hold (`SpoolMarks`, read by the executor)
and the task's `RedoState`; no I/O, no clock. Episode numbers are the upstream's (one marked
channel per task).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SpoolMarks:
    """What the spooled batches one micro-batch reads hold: the episodes of their tentative
    rows, and for each episode revised the highest seq revising it."""

    tentative: frozenset[int] = frozenset()
    revisions: tuple[tuple[int, int], ...] = ()  # (episode, seq), sorted

    @property
    def revised(self) -> dict[int, int]:
        return dict(self.revisions)


@dataclass(frozen=True)
class RedoState:
    """A stateful downstream task's DPC state, kept across restarts of the task (`dpc/redo.json`).
    `open`: the upstream episode whose tentative rows its Spark state holds (None: stable);
    `stable_batch`: the last batch of the stable point kept; `reconcile_upto`: a reconcile is
    asked (or runs), re-running up to that seq; `rerun`: the stable point was put back, the re-run's first
    batch revises that episode; `superseded`: the highest episode revised (its tentative rows,
    and earlier ones', are left out of any read)."""

    open: int | None = None
    stable_batch: int | None = None
    reconcile_upto: int | None = None
    rerun: int | None = None
    superseded: int = 0


@dataclass(frozen=True)
class BatchPlan:
    """How one micro-batch is written: every row tentative in `tentative` (None: stable),
    after revision records for `revisions`; `keep_point`: copy the checkpoint aside before the
    batch runs (the stable point); `reconcile`: after this batch, put the stable point back and
    re-run it (`RedoState.reconcile_upto`)."""

    tentative: int | None = None
    revisions: tuple[int, ...] = ()
    keep_point: bool = False
    reconcile: bool = False


class RedoError(ValueError):
    """A decision asked in a state that cannot have it (a bug, or a state file edited by hand)."""


def plan(state: RedoState, batch_id: int, marks: SpoolMarks) -> tuple[RedoState, BatchPlan]:
    """The next state and how micro-batch `batch_id` is written, given what its spooled batches
    hold."""
    if state.rerun is not None:
        return _rerun_batch(state, batch_id, marks)
    live = sorted(e for e in marks.tentative if e > state.superseded)
    revised = marks.revised
    if state.open is None:
        if not live:  # stable; a revision of an episode this task held nothing of passes on
            return state, BatchPlan(revisions=tuple(sorted(revised)))
        state = replace(state, open=live[0], stable_batch=batch_id - 1)
        return _tentative_batch(state, revised, keep_point=True)
    return _tentative_batch(state, revised, keep_point=False)


def _tentative_batch(state: RedoState, revised: dict[int, int], keep_point: bool
                     ) -> tuple[RedoState, BatchPlan]:
    """A batch while the state holds episode `state.open`'s tentative rows; the one that reads
    its revision asks for the reconcile (once: later batches before the stop stay tentative)."""
    episode = state.open
    assert episode is not None
    others = tuple(sorted(e for e in revised if e != episode))
    ask = episode in revised and state.reconcile_upto is None
    if ask:
        state = replace(state, reconcile_upto=revised[episode])
    return state, BatchPlan(tentative=episode, revisions=others, keep_point=keep_point,
                            reconcile=ask)


def restored(state: RedoState) -> RedoState:
    """The stable point is back as the checkpoint: the next batch is the re-run's first."""
    if state.open is None or state.reconcile_upto is None:
        raise RedoError(f"restored without a reconcile asked ({state})")
    return RedoState(reconcile_upto=state.reconcile_upto, rerun=state.open,
                     superseded=max(state.superseded, state.open))


def _rerun_batch(state: RedoState, batch_id: int, marks: SpoolMarks
                 ) -> tuple[RedoState, BatchPlan]:
    """The re-run's first batch: revision N first, its rows stable, unless it also reads a
    later episode's tentative rows (then that episode opens from the same stable point)."""
    episode = state.rerun
    assert episode is not None
    announce = tuple(sorted({episode, *marks.revised}))
    live = sorted(e for e in marks.tentative if e > max(state.superseded, episode))
    calm = RedoState(superseded=max(state.superseded, episode))
    if not live:
        return calm, BatchPlan(revisions=announce)
    opened = replace(calm, open=live[0], stable_batch=batch_id - 1)
    return opened, BatchPlan(tentative=live[0], revisions=announce, keep_point=True)


def to_json(state: RedoState) -> dict[str, int | None]:
    return {"open": state.open, "stable_batch": state.stable_batch,
            "reconcile_upto": state.reconcile_upto, "rerun": state.rerun,
            "superseded": state.superseded}


def from_json(data: object) -> RedoState:
    """A state as `to_json` wrote it; RedoError naming every bad field."""
    if not isinstance(data, dict):
        raise RedoError(f"a DPC redo state is an object, not {type(data).__name__}")
    problems, values = [], {}
    for name in ("open", "stable_batch", "reconcile_upto", "rerun", "superseded"):
        value = data.get(name)
        optional = name != "superseded"
        if (value is None and optional) or (isinstance(value, int)
                                            and not isinstance(value, bool) and value >= -1):
            values[name] = value
        else:
            problems.append(f"{name}={value!r}")
    if problems:
        raise RedoError(f"bad DPC redo state field(s): {', '.join(problems)}")
    return RedoState(**values)  # type: ignore[arg-type]
