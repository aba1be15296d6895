"""Spark layer, control tuples: a running task's query is rebuilt with new parameters at a batch
boundary (TaskRunner.reconfigure in the shared session), or, for a sink's destination, switched
without a rebuild. The file sinks are compared with a plain Python oracle that switches at the
acknowledged epoch, whose first input index is read from Spark's own offset log; a change that
does not build, or a destination that cannot be made, leaves the old query running as it was."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from executor.task_runner import ReconfigureFailed, TaskRunner
from test_runtime_support import read_sink, wait_for

pytestmark = pytest.mark.spark

PROGRAM = '''
from common.types import Schema
SEQ = Schema.of(("id", "int"), ("ts", "timestamp"), ("key", "string"), ("value", "double"))
def build(rt):
    rt.generator(op="src", output="nums", schema=SEQ, shape="sequence", seed=3, rate=400.0,
                 limit=None, start="2024-01-01T00:00:00Z")
    rt.filter(op="keep", input="nums", output="kept", condition="nums.id % 2 = 0")
    rt.file_sink(op="sink", input="kept", path=OUT)
'''


def task_runner(spark: Any, tmp_path: Path, task_id: str) -> TaskRunner:
    """PROGRAM as task `task_id`, its sink at tmp_path/kept.jsonl, checkpoint at tmp_path/ck."""
    program = tmp_path / "program.py"
    program.write_text(f"OUT = {str(tmp_path / 'kept.jsonl')!r}\n" + PROGRAM, encoding="utf-8")
    return TaskRunner(spark, program, {"query_id": "q", "task_id": task_id,
                                       "checkpoint_dir": str(tmp_path / "ck"),
                                       "trigger_seconds": 0.3})


def ids_in(path: Path) -> list[int]:
    return [row["id"] for row in read_sink(path)]


def end_index(checkpoint: Path, batch: int) -> int:
    """The generator's end offset of micro-batch `batch`, from Spark's offset log (the last
    line of offsets/<batch> is the one source's offset JSON)."""
    lines = (checkpoint / "spark" / "offsets" / str(batch)).read_text().splitlines()
    return int(json.loads(lines[-1])["index"])


def written_end(checkpoint: Path, ids: list[int]) -> int:
    """The end offset of the last micro-batch the sink wrote (the batch whose range holds the
    largest id written; it may be written but not yet committed when the query stopped)."""
    folder = checkpoint / "spark" / "offsets"
    ends = sorted(end_index(checkpoint, int(p.name)) for p in folder.iterdir() if p.name.isdigit())
    return min(e for e in ends if e > max(ids))


def last_committed(checkpoint: Path) -> int:
    return max(int(p.name) for p in (checkpoint / "spark" / "commits").iterdir()
               if p.name.isdigit())


def test_a_filter_changed_at_a_batch_boundary_matches_an_oracle_switching_at_the_epoch(
        spark: Any, tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "kept.jsonl", tmp_path / "ck"
    runner = task_runner(spark, tmp_path, "ctl")
    try:
        runner.start()
        wait_for(lambda: len(ids_in(out)) > 50, 60, "output under the first condition")
        done = runner.reconfigure(1, {"keep": {"condition": "nums.id % 3 = 0"}})
        assert done.version == 1 and done.epoch >= 1
        wait_for(lambda: last_committed(checkpoint) >= done.epoch + 2, 60,
                 "batches under the new condition")
        with pytest.raises(ReconfigureFailed):
            runner.reconfigure(2, {"keep": {"condition": "nums.key"}})  # a string, not boolean
        assert runner.params_version == 1
        settled = last_committed(checkpoint)
        wait_for(lambda: last_committed(checkpoint) >= settled + 2, 60,
                 "batches after the refused change (the query went on)")
        runner.stop()
        boundary = end_index(checkpoint, done.epoch - 1)
        end = written_end(checkpoint, ids_in(out))
        expected = [i for i in range(boundary) if i % 2 == 0] + \
                   [i for i in range(boundary, end) if i % 3 == 0]
        assert sorted(ids_in(out)) == expected
        assert any(i % 2 == 0 for i in range(boundary, end) if i % 3 != 0), \
            "the run was too short to tell the conditions apart"
    finally:
        runner.stop()


def test_a_rate_change_paces_the_generator_from_where_it_was_and_a_new_path_takes_the_rest(
        spark: Any, tmp_path: Path) -> None:
    out, checkpoint, moved = tmp_path / "kept.jsonl", tmp_path / "ck", tmp_path / "moved.jsonl"
    runner = task_runner(spark, tmp_path, "rate")
    try:
        runner.start()
        wait_for(lambda: len(ids_in(out)) > 20, 60, "first output")
        done = runner.reconfigure(1, {"src": {"rate": 40.0}, "sink": {"path": str(moved)}})
        wait_for(lambda: last_committed(checkpoint) >= done.epoch + 1, 60, "paced batches")
        t0, i0 = time.monotonic(), end_index(checkpoint, last_committed(checkpoint))
        time.sleep(4.0)
        t1, i1 = time.monotonic(), end_index(checkpoint, last_committed(checkpoint))
        rate = (i1 - i0) / (t1 - t0)
        assert 10 < rate < 80, f"{rate:.0f} tuples/s after the change to 40/s (was 400/s)"
        runner.stop()
        with pytest.raises(ReconfigureFailed, match="is stopping"):
            runner.reconfigure(2, {"src": {"rate": 400.0}})  # no query starts after a stop
        assert runner.runtime is not None and not runner.runtime.query.isActive
        boundary = end_index(checkpoint, done.epoch - 1)
        end = written_end(checkpoint, ids_in(moved))
        assert sorted(ids_in(out)) == [i for i in range(boundary) if i % 2 == 0]
        assert sorted(ids_in(moved)) == [i for i in range(boundary, end) if i % 2 == 0]
    finally:
        runner.stop()


def test_a_new_path_is_switched_in_the_running_query_exactly_at_the_epoch(
        spark: Any, tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "kept.jsonl", tmp_path / "ck"
    moved, back = tmp_path / "moved" / "kept.jsonl", tmp_path / "back.jsonl"
    runner = task_runner(spark, tmp_path, "live")
    try:
        runner.start()
        wait_for(lambda: len(ids_in(out)) > 20, 60, "first output")
        query_id = runner.status().query_id
        with pytest.raises(ReconfigureFailed, match="OSError|FileExistsError|NotADirectory"):
            runner.reconfigure(1, {"sink": {"path": str(out / "under-a-file.jsonl")}})
        first = runner.reconfigure(2, {"sink": {"path": str(moved)}})
        wait_for(lambda: last_committed(checkpoint) >= first.epoch + 2, 60, "batches in moved")
        second = runner.reconfigure(3, {"sink": {"path": str(back)}})
        wait_for(lambda: last_committed(checkpoint) >= second.epoch + 2, 60, "batches in back")
        assert runner.status().query_id == query_id, "a new path must not restart the query"
        runner.stop()
        cut1, cut2 = end_index(checkpoint, first.epoch - 1), end_index(checkpoint, second.epoch - 1)
        end = written_end(checkpoint, ids_in(back))
        assert cut1 < cut2 < end
        assert sorted(ids_in(out)) == [i for i in range(cut1) if i % 2 == 0]
        assert sorted(ids_in(moved)) == [i for i in range(cut1, cut2) if i % 2 == 0]
        assert sorted(ids_in(back)) == [i for i in range(cut2, end) if i % 2 == 0]
    finally:
        runner.stop()


def test_a_sink_path_that_is_a_folder_is_refused_before_acknowledging_and_the_old_file_goes_on(
        spark: Any, tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "kept.jsonl", tmp_path / "ck"
    folder, marked = tmp_path / "a-folder", tmp_path / "marked.jsonl"
    folder.mkdir()
    (tmp_path / "marked.jsonl.commit").mkdir()  # the sidecar's place is taken by a folder
    runner = task_runner(spark, tmp_path, "folder")
    try:
        runner.start()
        wait_for(lambda: len(ids_in(out)) > 20, 60, "first output")
        query_id = runner.status().query_id
        with pytest.raises(ReconfigureFailed, match="IsADirectoryError"):
            runner.reconfigure(1, {"sink": {"path": str(folder)}})
        with pytest.raises(ReconfigureFailed, match="IsADirectoryError"):
            runner.reconfigure(1, {"sink": {"path": str(marked)}})
        assert runner.params_version == 0 and not marked.exists()
        settled = last_committed(checkpoint)
        wait_for(lambda: last_committed(checkpoint) >= settled + 2, 60,
                 "batches after the refusals, in the old file")
        assert runner.status().query_id == query_id and runner.status().state == "running"
        runner.stop()
        end = written_end(checkpoint, ids_in(out))
        assert sorted(ids_in(out)) == [i for i in range(end) if i % 2 == 0]
        assert list(folder.iterdir()) == []
    finally:
        runner.stop()


def test_an_unreadable_pacing_state_is_reported_and_the_source_resumes_where_it_was(
        spark: Any, tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "kept.jsonl", tmp_path / "ck"
    state = checkpoint / "pacing" / "src.anchor"
    runner = task_runner(spark, tmp_path, "pace")
    try:
        runner.start()
        wait_for(lambda: len(ids_in(out)) > 20, 60, "first output")
        with pytest.raises(ReconfigureFailed, match="finite"):  # the executor refuses it too
            runner.reconfigure(1, {"src": {"rate": float("inf")}})
        json.loads(state.read_text())  # the state stayed readable
        runner.stop()
    finally:
        runner.stop()
    resumed = end_index(checkpoint, max(int(p.name) for p in (checkpoint / "spark" / "offsets")
                                        .iterdir() if p.name.isdigit()))
    state.write_text('{"anchor": -Infinity, "rate": 400.0}')  # what `rate inf` used to leave
    again = task_runner(spark, tmp_path, "pace")
    try:
        again.start()
        status = again.status()
        assert status.state == "running" and "src.anchor was unreadable" in status.reason, status
        assert f"resumes at offset {resumed}" in status.reason
        stored = json.loads(state.read_text())
        assert stored["rate"] == 400.0 and stored["anchor"] < time.time()
        settled = last_committed(checkpoint)
        wait_for(lambda: last_committed(checkpoint) >= settled + 3, 60,
                 "batches after the recovery")
        t0, i0 = time.monotonic(), end_index(checkpoint, last_committed(checkpoint))
        time.sleep(2.0)
        t1, i1 = time.monotonic(), end_index(checkpoint, last_committed(checkpoint))
        assert (i1 - i0) / (t1 - t0) < 800, "the recovered source bursts (400/s expected)"
        again.stop()
        end = written_end(checkpoint, ids_in(out))
        assert end > resumed
        assert sorted(ids_in(out)) == [i for i in range(end) if i % 2 == 0]  # no loss, no replay
    finally:
        again.stop()
