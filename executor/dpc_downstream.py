"""A task downstream of a DPC task: its sink writes the marks its marked channel input brought
(docs/availability.md, "Marks across channels").

The task's stream keeps each row's tentative episode in the hidden column
`dpc_marks.TENTATIVE_MARK` through its filters and projections (a row derived from a tentative
row is tentative); `MarkedSink` writes each micro-batch with those marks as the upstream's own
sink of that kind would (`executor.dpc.write_marked`): a file or console sink's
`"_tentative": N`, a network sink's mark columns, a Kafka sink's `elastiq-tentative` header.
A revision travels on the spooled batches of the channel (`dpc_marks.REVISION_MARK`, or a
correction row), not through Spark (a filter could drop every row carrying it): micro-batch b
announces revision N before its rows (a file's `{"_revision": N}`, a network sink's revision
mark or correction row, a Kafka correction record), with or without rows of its own, when a
spooled batch it read (the seqs between its offsets and batch b - 1's in Spark's offset log)
revises episode N. The spooled batches of a micro-batch stay until Spark commits it, so a
replayed batch finds them again.

A stateful operator (a window or an updating aggregate) cannot carry a row's mark through
Spark's state: its task does checkpoint/redo instead (`RedoController`, deciding by
`common.dpc_redo`; docs/availability.md, "A stateful downstream task"): the batch that first
reads a tentative row keeps the stable point, every batch from then on is tentative as a whole
(`RedoSink`), and the revision makes it re-run from the stable point without the upstream's
superseded tentative rows, after which its output is stable again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from common import dpc_redo
from common.atomic_file import replace_file
from executor import dpc_marks, spool, spool_source
from executor.dpc import (RERUN_SECONDS, close_inner, keep_stable_point, refusal,
                          restore_stable_point, write_marked)
from executor.sources import batch_offsets

log = logging.getLogger(__name__)


def row_marks(table: pa.Table) -> tuple[pa.Table, list[int | None]]:
    """A micro-batch's rows without TENTATIVE_MARK, and each row's tentative episode (None:
    stable) (pure)."""
    if dpc_marks.TENTATIVE_MARK not in table.column_names:
        return table, [None] * table.num_rows
    marks = table.column(dpc_marks.TENTATIVE_MARK).to_pylist()
    return table.drop_columns([dpc_marks.TENTATIVE_MARK]), marks


def _seq_of(offsets: list[dict], name: str) -> int | None:
    found = [o.get("seq") for o in offsets if o.get("spool") == name]
    return found[0] if found and isinstance(found[0], int) else None


def revisions_in(spark_dir: str, batch_id: int, spools: Sequence[tuple[str, str]]) -> list[int]:
    """The episodes the spooled batches of micro-batch `batch_id` revise, for `spools` (name,
    folder) of marked channels."""
    return sorted(spool_marks(spark_dir, batch_id, spools).revised)


def spool_marks(spark_dir: str, batch_id: int, spools: Sequence[tuple[str, str]]
                ) -> dpc_redo.SpoolMarks:
    """What the spooled batches micro-batch `batch_id` reads (the seqs between its offsets and
    batch `batch_id - 1`'s in Spark's offset log) hold of `spools` (name, folder) of marked
    channels: their tentative episodes and the episodes they revise, each with its last seq.
    Only the two mark columns are read (memory-mapped)."""
    tentative: set[int] = set()
    revised: dict[int, int] = {}
    now, before = batch_offsets(spark_dir, batch_id), batch_offsets(spark_dir, batch_id - 1)
    for name, folder in spools:
        end = _seq_of(now, name)
        start = _seq_of(before, name)
        if end is None:
            continue
        for seq, batch in sorted(spool.listing(folder).items()):
            if (start is None or seq > start) and seq <= end:
                path = os.path.join(folder, spool.batch_name(seq, batch.chunks, batch.size))
                with pa.memory_map(path) as source:  # (used while mapped)
                    table = pa.ipc.open_file(source).read_all().select(
                        list(dpc_marks.MARK_COLUMNS))
                    for episode in dpc_marks.revisions_of(table):
                        revised[episode] = max(revised.get(episode, seq), seq)
                    tentative.update(_tentative_of(table))
    return dpc_redo.SpoolMarks(frozenset(tentative), tuple(sorted(revised.items())))


def _tentative_of(table: pa.Table) -> set[int]:
    """The episodes of a spooled batch's tentative rows (correction rows are not rows)."""
    data = table.filter(pc.is_null(table.column(dpc_marks.REVISION_MARK)))
    return {int(e) for e in pc.unique(data.column(dpc_marks.TENTATIVE_MARK)).drop_null()
            .to_pylist()}


class MarkedSink:
    """A sink fed by a marked channel's rows (`inner`: a file or console sink, a marked network
    sink or a Kafka sink): tentative rows carry their episode, a micro-batch that read a
    revision announces it first."""

    def __init__(self, inner: Any, spark_dir: str, spools: Sequence[tuple[str, str]]) -> None:
        from executor import sinks

        reason = refusal(inner)
        if isinstance(inner, sinks.FileSink) and inner.prefix is not None:
            reason = "an upsert file sink after a marked stream (its rows' marks differ)"
        if reason is not None:
            raise TypeError(reason)
        self.inner, self.spark_dir, self.spools = inner, spark_dir, tuple(spools)
        self.rows_out = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        table, tentative = row_marks(df.toArrow())
        revisions = revisions_in(self.spark_dir, batch_id, self.spools)
        self.rows_out += write_marked(self.inner, table, tentative, revisions, batch_id,
                                      batch_id)

    def close(self) -> None:
        close_inner(self.inner)


class RedoController:
    """Checkpoint/redo of a task whose stateful operator (a window or an updating aggregate)
    reads a marked channel (docs/availability.md, "A stateful downstream task"): applies
    `common.dpc_redo`'s decisions. The sink asks `on_batch` how each micro-batch is written
    (copying the stable point aside first when it opens an episode); a batch that reads the
    upstream's revision asks for a reconcile, which this controller's thread carries out: the
    query stopped between micro-batches, the stable point put back, the query started again
    with the spool's `upto` at the revising seq and the superseded tentative rows left out
    (`spool.Control`). Its state and the append shift are kept in `dpc/redo.json`, so a
    restart during an episode stays tentative and still reconciles when the revision comes."""

    def __init__(self, task_id: str, checkpoint_dir: str, channel: tuple[str, str],
                 stop_query: Callable[[], None], start_query: Callable[[], None]) -> None:
        self.task_id, (self.name, self.folder) = task_id, channel
        self.spark_dir = os.path.join(checkpoint_dir, "spark")
        self.stable_dir = os.path.join(checkpoint_dir, "dpc", "redo-stable")
        self.state_path = os.path.join(checkpoint_dir, "dpc", "redo.json")
        self._stop_query, self._start_query = stop_query, start_query
        self.state, self.shift = _load_redo(self.state_path)
        self.highest_id = -1  # the highest append id the sink was given
        self.replacing = False  # the query is being stopped and started again (not a failure)
        self.reconcile_seconds: list[float] = []
        self._lock = threading.Lock()
        self._asked = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """The spool's control as the kept state asks (a restart during an episode keeps its
        spooled batches; one whose reconcile was asked carries it out)."""
        with self._lock:
            spool.write_control(self.folder, control_of(self.state))
            if self.state.reconcile_upto is not None and self.state.rerun is None:
                self._asked.set()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"dpc-redo-{self.task_id}")
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)

    def on_batch(self, batch_id: int) -> dpc_redo.BatchPlan:
        """How micro-batch `batch_id` is written (Spark's foreachBatch thread, before the batch
        runs: its state is not written yet, so the stable point copied here is before it)."""
        marks = spool_marks(self.spark_dir, batch_id, [(self.name, self.folder)])
        with self._lock:
            state, plan = dpc_redo.plan(self.state, batch_id, marks)
            if plan.keep_point:
                keep_stable_point(self.spark_dir, self.stable_dir, batch_id)
                log.info("task %s: DPC episode %s reached a stateful operator: stable point "
                         "kept at batch %s", self.task_id, plan.tentative, batch_id - 1)
            if state != self.state:
                self.state = state
                _save_redo(self.state_path, state, self.shift)
                spool.write_control(self.folder, control_of(state))
            if plan.reconcile:
                log.info("task %s: DPC revision of episode %s read (up to seq %s): reconcile "
                         "asked", self.task_id, state.open, state.reconcile_upto)
                self._asked.set()
        return plan

    def append_id(self, batch_id: int) -> int:
        """The id the sink appends batch `batch_id` under (a re-run numbers its batches from
        the stable point again; an exactly-once log needs them new)."""
        with self._lock:
            self.highest_id = max(self.highest_id, batch_id + self.shift)
            return batch_id + self.shift

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._asked.wait(0.1) and not self._stop.is_set():
                self._asked.clear()
                try:
                    self._reconcile()
                except Exception:  # noqa: BLE001 - the controller must not die silently
                    log.exception("task %s: DPC reconcile failed", self.task_id)

    def _reconcile(self) -> None:
        started = time.monotonic()
        self.replacing = True
        try:
            self._stop_query()
            restore_stable_point(self.stable_dir, self.spark_dir)
            with self._lock:
                point = self.state.stable_batch
                assert point is not None, "a reconcile without a stable point"
                self.shift = max(self.highest_id - point, self.shift)
                self.state = dpc_redo.restored(self.state)
                _save_redo(self.state_path, self.state, self.shift)
                spool.write_control(self.folder, control_of(self.state))
                episode, upto = self.state.rerun, self.state.reconcile_upto
            self._start_query()
        finally:
            self.replacing = False
        assert upto is not None
        deadline = time.monotonic() + RERUN_SECONDS
        while (spool_source.finished_seq(self.spark_dir, self.name) or 0) < upto and \
                time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)
        seconds = time.monotonic() - started
        self.reconcile_seconds.append(seconds)
        log.info("task %s: DPC episode %s reconciled downstream in %.2f s (re-ran from batch "
                 "%s up to seq %s without its tentative rows)", self.task_id, episode, seconds,
                 point + 1, upto)


def control_of(state: dpc_redo.RedoState) -> spool.Control:
    """What the spool's reader is asked in `state` (pure): keep every batch while an episode is
    open or re-run; hand nothing new once a reconcile is asked; the re-run's batch up to the
    revising seq; the superseded tentative rows left out."""
    keep = state.open is not None or state.rerun is not None
    if state.rerun is not None:
        return spool.Control(keep=True, upto=state.reconcile_upto, superseded=state.superseded)
    hold = state.open is not None and state.reconcile_upto is not None
    return spool.Control(hold=hold, keep=keep, superseded=state.superseded)


def _load_redo(path: str) -> tuple[dpc_redo.RedoState, int]:
    """(state, append shift) kept across restarts of the task; a fresh one without a file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return dpc_redo.RedoState(), 0
    except ValueError as exc:
        raise dpc_redo.RedoError(f"{path}: not JSON: {exc}") from None
    shift = data.get("shift") if isinstance(data, dict) else None
    if not isinstance(shift, int) or isinstance(shift, bool) or shift < 0:
        raise dpc_redo.RedoError(f"{path}: bad shift {shift!r}")
    return dpc_redo.from_json(data.get("state")), shift


def _save_redo(path: str, state: dpc_redo.RedoState, shift: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, json.dumps({"state": dpc_redo.to_json(state), "shift": shift}))


class RedoSink:
    """The sink of a stateful downstream task over a marked channel: each micro-batch written
    as a whole, tentative or stable, after the revisions it announces, as `RedoController`
    plans it, through the one writer of marks (`executor.dpc.write_marked`: a file sink's
    lines, an upsert log's records, a console's lines, a Kafka sink's headers, a marked
    network sink's columns), under `append_id`."""

    def __init__(self, inner: Any, controller: RedoController) -> None:
        reason = refusal(inner)
        if reason is not None:
            raise TypeError(reason)
        self.inner, self.controller = inner, controller
        self.rows_out = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        plan = self.controller.on_batch(batch_id)
        table = df.toArrow()
        self.rows_out += write_marked(self.inner, table, [plan.tentative] * table.num_rows,
                                      plan.revisions, self.controller.append_id(batch_id),
                                      batch_id)

    def close(self) -> None:
        close_inner(self.inner)
