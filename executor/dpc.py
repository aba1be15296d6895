"""Borealis DPC in a running task: `DpcController` applies `common.dpc`'s decisions to a union
or a stream-stream join whose inputs are channels (docs/availability.md).

A thread of the executor reads each input's liveness from its spool receiver (`last_heard`,
`reachable`, `ended`) and steps the decision every POLL_SECONDS. It acts through the spools'
control files (`executor.spool.Control`, read by the Spark source in Spark's planner process):
- DELAYING: every input held (Spark is handed nothing new, so nothing is processed without the
  cut input) and kept (no batch is trimmed: the stable point must stay re-runnable); released
  when the cut input answers again, once its writer's backlog is spooled. Without max-delay (a
  union's consistency without loss) this is all it does: it never goes tentative;
- TENTATIVE: the live inputs released. The first micro-batch after that copies the Spark
  checkpoint aside before it runs (`keep_stable_point`: the offsets, commits and state of the
  batches before it: the stable point, with the channel positions its offsets hold); it and every
  later batch is written marked tentative (`on_batch`);
- RECONCILING (the cut input answers again): every input held until the writers' backlogs are
  spooled, the query stopped, the checkpoint put back from the copy, and the query started again
  with each spool's `upto` at its spooled high: one micro-batch over every input since the
  stable point (so the watermark cannot pass a row of the cut input before it is seen). Its
  output is preceded by a revision record naming the episode it replaces; once Spark has
  finished it, the spools go back to normal and the reconcile time is logged and kept.

The file sink numbers its appends `batch id + shift` (its exactly-once log needs increasing
ids; the re-run numbers batches from the stable point again); the shift and the last episode
number are kept in `dpc/state.json` next to the checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pyarrow as pa

from common import dpc, dpc_view
from common.atomic_file import replace_file
from executor import dpc_marks, spool, spool_source
from executor.json_lines import table_to_lines
from executor.spool_receiver import SpoolReceiver

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1
BACKLOG_SECONDS = 60.0  # a returned writer's backlog must be spooled within this
RERUN_SECONDS = 300.0  # the re-run's micro-batch must finish within this
TENTATIVE_COLUMN = "_tentative"  # the episode number of a tentative row (file and console sink)
REVISION_KEY = "_revision"  # a revision record: the rows of episode N that follow replace its
# tentative ones


@dataclass(frozen=True)
class DpcInput:
    name: str  # the channel id
    receiver: SpoolReceiver
    folder: str  # its spool


@dataclass(frozen=True)
class BatchMark:
    """How the sink writes one micro-batch: tentative (episode number), after a revision
    record (the episode it replaces), or plain (both None)."""

    tentative: int | None = None
    revision: int | None = None


class DpcController:
    """One DPC union's or join's controller. `stop_query` / `start_query` stop the task's query and start
    it again from its (restored) checkpoint. `max_delay` None: a union without max-delay, which
    holds its inputs while one is cut, without a limit, and never goes tentative (so it never
    stops or starts the query, nor marks a row)."""

    def __init__(self, task_id: str, checkpoint_dir: str, inputs: Sequence[DpcInput],
                 max_delay: float | None, stop_query: Callable[[], None],
                 start_query: Callable[[], None]) -> None:
        self.task_id, self.inputs, self.max_delay = task_id, tuple(inputs), max_delay
        self.spark_dir = os.path.join(checkpoint_dir, "spark")
        self.stable_dir = os.path.join(checkpoint_dir, "dpc", "stable")
        self.state_path = os.path.join(checkpoint_dir, "dpc", "state.json")
        self._stop_query, self._start_query = stop_query, start_query
        self.state = dpc.State(since=time.monotonic())
        self.shift, self.episode = _load_state(self.state_path)
        self.highest_id = -1  # the highest append id the file sink was given
        self.stable_batch: int | None = None  # the last batch of the stable point
        self._pending_point = False  # the next batch keeps the stable point first
        self._rerun = False  # the query runs again from the stable point
        self._revision_due: int | None = None
        self.reconcile_seconds: list[float] = []
        self.replacing = False  # the query is being stopped and started again (not a failure)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> None:
        """Start stable: a control file a run before this one left (a restart during an
        episode) would hold the inputs for good."""
        self._control(spool.Control())
        for i in self.inputs:
            i.receiver.liveness = True
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"dpc-{self.task_id}")
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)

    @property
    def mode(self) -> dpc.Mode:
        return self.state.mode

    def figures(self, now: float) -> dict[str, int]:
        """What the task's heartbeat says of DPC (docs/availability.md, "Seeing the mode"): the
        mode's code (`common.dpc.MODE_CODES`), how long it has held (ms, by the monotonic
        `now`), the last episode's number and its reconcile's duration (ms; -1: none yet)."""
        with self._lock:
            state, episode = self.state, self.episode
            last = self.reconcile_seconds[-1] if self.reconcile_seconds else None
        return {"dpc_mode": dpc.MODE_CODES[state.mode],
                "dpc_mode_ms": max(0, int((now - state.since) * 1000)),
                "dpc_episode": episode,
                "dpc_reconcile_ms": -1 if last is None else int(last * 1000)}

    # -- the thread

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - the controller must not die silently
                log.exception("task %s: DPC controller step failed", self.task_id)

    def _views(self) -> tuple[dpc.InputView, ...]:
        return tuple(dpc.InputView(i.name, i.receiver.last_heard, i.receiver.reachable,
                                   i.receiver.ended, i.receiver.dormant) for i in self.inputs)

    def _tick(self) -> None:
        with self._lock:
            decision = dpc.step(self.state, self._views(), self.max_delay, time.monotonic())
            self.state = decision.state
            action = decision.action
            if action is dpc.Action.GO_TENTATIVE:
                self.episode += 1
                self._pending_point = True
                _save_state(self.state_path, self.shift, self.episode)
        if action is not dpc.Action.NONE:
            log.info("task %s: DPC %s -> %s (cut: %s)", self.task_id, action.value,
                     decision.state.mode.value, ", ".join(decision.state.cut) or "none")
        if action is dpc.Action.HOLD:
            self._control(spool.Control(hold=True, keep=True))
        elif action is dpc.Action.RELEASE:
            self._release()
        elif action is dpc.Action.GO_TENTATIVE:
            for i in self.inputs:
                cut = i.name in decision.state.cut
                spool.write_control(i.folder, spool.Control(hold=cut, keep=True))
        elif action is dpc.Action.RECONCILE:
            self._reconcile()

    def _release(self) -> None:
        """The cut input answers again: hand Spark everything once its writer's backlog (the
        batches it numbered during the cut) is spooled too, so the first micro-batch after the
        hold has every input up to then and the watermark cannot pass a row of the returned
        input before that row is seen (the live inputs spooled a whole cut's rows meanwhile)."""
        started = time.monotonic()
        self._await_backlogs()
        self._control(spool.Control())
        log.info("task %s: DPC released after %.2f s of spooling the returned backlog",
                 self.task_id, time.monotonic() - started)

    def _control(self, control: spool.Control) -> None:
        for i in self.inputs:
            spool.write_control(i.folder, control)

    # -- correct

    def _reconcile(self) -> None:
        started = time.monotonic()
        self._control(spool.Control(hold=True, keep=True))
        with self._lock:
            point = self.stable_batch
            self._pending_point = False
        if point is None:  # nothing was written tentatively: nothing to correct
            self._finish(started, "no tentative batch was written")
            return
        self._await_backlogs()
        self.replacing = True
        try:
            self._stop_query()
            restore_stable_point(self.stable_dir, self.spark_dir)
            with self._lock:
                self.shift = max(self.highest_id - point, self.shift)
                _save_state(self.state_path, self.shift, self.episode)
                self._rerun, self._revision_due = True, self.episode
            highs = {i.name: i.receiver.spooled_high for i in self.inputs}
            for i in self.inputs:
                spool.write_control(i.folder, spool.Control(keep=True, upto=highs[i.name]))
            self._start_query()
        finally:
            self.replacing = False
        self._await_rerun(highs)
        self._finish(started, f"re-ran from batch {point + 1} with every input")

    def _await_backlogs(self) -> None:
        """Until each input has spooled what its writer numbered when asked (bounded)."""
        deadline = time.monotonic() + BACKLOG_SECONDS
        for i in self.inputs:
            if i.receiver.ended or i.receiver.dormant:  # spooled to its end, or a dormant
                continue                                 # instance's: its writer may be gone
            last = i.receiver.writer_last_seq(timeout=2.0)
            while last is not None and i.receiver.spooled_high < last and \
                    time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.05)

    def _await_rerun(self, highs: dict[str, int]) -> None:
        deadline = time.monotonic() + RERUN_SECONDS
        while time.monotonic() < deadline and not self._stop.is_set():
            done = [spool_source.finished_seq(self.spark_dir, name) for name in highs]
            if all(d is not None and d >= highs[n] for d, n in zip(done, highs)):
                return
            time.sleep(0.05)
        log.warning("task %s: DPC re-run did not finish within %.0f s", self.task_id,
                    RERUN_SECONDS)

    def _finish(self, started: float, what: str) -> None:
        self._control(spool.Control())
        seconds = time.monotonic() - started
        with self._lock:
            self.state = dpc.reconciled(self.state, time.monotonic())
            self.stable_batch, self._rerun = None, False
            self.reconcile_seconds.append(seconds)
        log.info("task %s: DPC episode %s reconciled in %.2f s (%s)", self.task_id,
                 self.episode, seconds, what)

    # -- the sink's side (Spark's foreachBatch thread)

    def on_batch(self, batch_id: int) -> BatchMark:
        """How micro-batch `batch_id` is written; the first one after the union went tentative
        keeps the stable point (before it runs)."""
        with self._lock:
            if self._pending_point:
                keep_stable_point(self.spark_dir, self.stable_dir, batch_id)
                self.stable_batch, self._pending_point = batch_id - 1, False
                log.info("task %s: DPC stable point kept at batch %s", self.task_id,
                         batch_id - 1)
            if self._rerun:
                due, self._revision_due = self._revision_due, None
                return BatchMark(revision=due)
            if self.stable_batch is not None and batch_id > self.stable_batch:
                return BatchMark(tentative=self.episode)
            return BatchMark()

    def append_id(self, batch_id: int) -> int:
        """The id the file sink's exactly-once log appends batch `batch_id` under."""
        with self._lock:
            self.highest_id = max(self.highest_id, batch_id + self.shift)
            return batch_id + self.shift


class DpcSink:
    """The sink of a task with a DPC union or join: each micro-batch written with the marks
    `DpcController.on_batch` gives it (`write_marked`: a file or console sink's `_tentative`
    and revision lines, a marked channel's mark columns (a channel or network sink,
    `executor.dpc_marks`), a Kafka sink's headers and correction records, docs/kafka.md),
    under `append_id`."""

    def __init__(self, inner: Any, controller: DpcController) -> None:
        reason = refusal(inner)
        if reason is not None:
            raise TypeError(reason)
        self.inner, self.controller = inner, controller
        self.rows_out = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        """A re-run's first batch carries the revision whatever its rows (an empty one: the
        revision alone, as a correction row or record); every row of a tentative batch is
        tentative. Written under `append_id`: a re-run's batches are new to a channel's writer
        (which drops a tag it has sent) and to a Kafka sink's exactly-once mark (which skips
        an id at or below the last one committed); a replay after a restart has the same id."""
        mark = self.controller.on_batch(batch_id)
        table = df.toArrow()
        revisions = [] if mark.revision is None else [mark.revision]
        self.rows_out += write_marked(self.inner, table, [mark.tentative] * table.num_rows,
                                      revisions, self.controller.append_id(batch_id), batch_id)

    def close(self) -> None:
        close_inner(self.inner)


def close_inner(inner: Any) -> None:
    """Close the sink a marking sink wraps, if that has a close (a Kafka sink's producer)."""
    close = getattr(inner, "close", None)
    if close is not None:
        close()


def refusal(inner: Any) -> str | None:
    """Why `inner` cannot write DPC marks (None: it can): file sinks (an upsert log's batch
    marked as a whole: `marked_lines`), console and Kafka sinks and marked channels can
    (pure)."""
    from executor import kafka_io, sinks

    if isinstance(inner, sinks.ChannelSink) and dpc_marks.carries_marks(inner.schema) or \
            isinstance(inner, (sinks.FileSink, sinks.ConsoleSink, kafka_io.KafkaSink)):
        return None
    return (f"DPC marks are written by file, console and Kafka sinks and marked channels, not "
            f"{type(inner).__name__}{_why_not(inner)}")


def write_marked(inner: Any, table: pa.Table, tentative: Sequence[int | None],
                 revisions: Sequence[int], append_id: int, batch_id: int) -> int:
    """Write one micro-batch with its DPC marks (row i tentative in episode `tentative[i]`,
    None: stable; the batch revising `revisions`, announced before its rows) to a sink
    `refusal` takes, under `append_id`; the rows (a file or console sink: the lines) written.
    The one writer of marks, for a DPC task's sink (`DpcSink`) and a downstream task's
    (`executor.dpc_downstream.MarkedSink`)."""
    from executor import kafka_io, sinks

    if isinstance(inner, sinks.ChannelSink):
        inner.writer.send(dpc_marks.mark_rows(table, inner.schema, tentative, revisions),
                          append_id)
        return table.num_rows
    if isinstance(inner, kafka_io.KafkaSink):
        inner.write(table, append_id, tentative, revisions)
        return table.num_rows
    lines = [revision_line(e) for e in revisions] + marked_lines(table, tentative, inner)
    return write_lines(inner, append_id, batch_id, lines)


def _why_not(inner: Any) -> str:
    """Why a sink gets no DPC marks, where it is a choice (docs/availability.md)."""
    from executor import partitioned_sink, sinks

    if isinstance(inner, sinks.ControlSink):
        return (": a tentative control tuple would change a running query on a guess, which no "
                "correction undoes")
    if isinstance(inner, partitioned_sink.PartitionedFileSink):
        return (": a time-partitioned file sink would need a revision record in every "
                "partition the episode's tentative rows reached, and its readers to apply it")
    if isinstance(inner, sinks.ChannelSink):
        return ": its channel's schema carries no marks"
    return ""


def marked_lines(table: pa.Table, tentative: Sequence[int | None],
                 inner: Any = None) -> list[str]:
    """The JSON lines of a batch's rows in row order, row i's with `"_tentative": N` where
    `tentative[i]` is N (pure). With `inner` an upsert file sink, the lines are its records
    and deletions (`FileSink.lines`, deletions after records), and the batch is tentative or
    stable as a whole (a DPC task's own sink; a downstream task's is refused by
    `dpc_downstream.MarkedSink`)."""
    from executor import sinks

    if isinstance(inner, sinks.FileSink) and inner.prefix is not None:
        episodes = set(tentative)
        if len(episodes) > 1:
            raise ValueError("an upsert log's batch is tentative or stable as a whole")
        lines = inner.lines(table)
        return [_with_tentative(line, next(iter(episodes), None)) for line in lines]
    return [_with_tentative(line, e) for line, e in zip(table_to_lines(table), tentative)]


def _with_tentative(line: str, episode: int | None) -> str:
    """A row's JSON object line with `"_tentative": episode` added (None: as it is)."""
    if episode is None:
        return line
    member = f"{json.dumps(TENTATIVE_COLUMN)}:{int(episode)}"
    return "{" + member + "}" if line == "{}" else f"{line[:-1]},{member}}}"


def revision_line(episode: int) -> str:
    return dpc_view.revision_text(episode)


def write_lines(inner: Any, append_id: int, batch_id: int, lines: list[str]) -> int:
    """Write a marked batch's JSON lines to a file sink (exactly once, under `append_id`) or a
    console sink (tagged with the task and `batch_id`); how many lines were written."""
    from executor import sinks

    if isinstance(inner, sinks.FileSink):
        return len(lines) if inner.log.append(append_id, lines) else 0
    out = inner.out()
    for line in lines:
        out.write(f"[{inner.task_id} #{batch_id}] {line}\n")
    out.flush()
    return len(lines)


# -- the stable point on disk

_VERSIONED = re.compile(r"^\.?(\d+)(\.(?:changelog|zip|delta|snapshot))?(\.crc)?$")


def keep_stable_point(spark_dir: str, dest: str, first_tentative: int) -> None:
    """Copy the checkpoint as it was before batch `first_tentative`: its offsets and commits
    before it, the state versions up to it (state version v is after batch v - 1); shared files
    (RocksDB's SSTs) last, so every snapshot copied finds the files it names."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    later: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(spark_dir):
        rel = os.path.relpath(root, spark_dir)
        os.makedirs(os.path.join(dest, rel), exist_ok=True)
        for name in files:
            if _after_point(rel, name, first_tentative):
                continue
            pair = (os.path.join(root, name), os.path.join(dest, rel, name))
            if "SSTs" in rel.split(os.sep):
                later.append(pair)
            else:
                shutil.copy2(*pair)
    for src, dst in later:
        shutil.copy2(src, dst)


def _after_point(rel: str, name: str, first: int) -> bool:
    match = _VERSIONED.match(name)
    if match is None:
        return False
    number = int(match.group(1))
    top = rel.split(os.sep)[0]
    if top in ("offsets", "commits"):
        return number >= first
    if top == "state" and match.group(2):
        return number > first
    return False


def restore_stable_point(stable_dir: str, spark_dir: str) -> None:
    """Put the stable point back as the query's checkpoint."""
    aside = f"{spark_dir}.tentative"
    if os.path.exists(aside):
        shutil.rmtree(aside)
    os.replace(spark_dir, aside)
    shutil.copytree(stable_dir, spark_dir)
    shutil.rmtree(aside)


def _load_state(path: str) -> tuple[int, int]:
    """(shift, last episode number) kept across restarts of the task."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return int(data["shift"]), int(data["episode"])
    except FileNotFoundError:
        return 0, 0


def _save_state(path: str, shift: int, episode: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, json.dumps({"shift": shift, "episode": episode}))
