"""Fencing of task attempts (`executor.fencing`): a stale attempt keeps running beside the newer one
and every write of it is refused, with real processes, real files and real `flock` locks.

The old attempt is a separate Python process that writes micro-batches through the executor's own
`BatchGate` guarded by its `Fence` (the path every sink call of a task takes) and reports each
outcome; the test process is the newer attempt. Oracle: the file holds exactly the batches each
attempt was told were written, the old one's all before the fence went up, none after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit.waiting import wait_for

from executor.batch_gate import BatchGate
from executor.fencing import Fence, Fenced

ROOT = Path(__file__).resolve().parents[1]

OLD_ATTEMPT = """
import json, os, sys, time
from executor.batch_gate import BatchGate
from executor.fencing import Fence, Fenced
folder, out, stop = sys.argv[1:4]
fence = Fence(folder, 1, "t.a1")
fence.raise_()
def sink(df, batch_id):
    with open(out, "a") as f:
        f.write(json.dumps({"attempt": 1, "batch": batch_id}) + "\\n")
        f.flush()
        time.sleep(0.02)  # a write that takes a while: the newer attempt's raise must wait
        f.write(json.dumps({"attempt": 1, "batch": batch_id, "end": True}) + "\\n")
gated = BatchGate(fence.holding).wrap(sink)
batch = 0
while not os.path.exists(stop) and batch < 2000:
    try:
        gated(None, batch)
        print("ok", batch, flush=True)
        batch += 1
    except Fenced:
        print("refused", batch, flush=True)  # no self-fencing: it keeps trying
    time.sleep(0.005)
"""


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_stale_attempt_runs_on_beside_the_new_one_and_every_write_of_it_is_refused(
        tmp_path: Path) -> None:
    folder, out, stop = tmp_path / "checkpoint", tmp_path / "sink.jsonl", tmp_path / "stop"
    outcomes = tmp_path / "old.out"
    with open(outcomes, "w") as report:
        old = subprocess.Popen([sys.executable, "-c", OLD_ATTEMPT, str(folder), str(out),
                                str(stop)], stdout=report, cwd=ROOT,
                               env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        said = lambda: outcomes.read_text().split("\n")  # noqa: E731
        wait_for("the old attempt to write 5 batches",
                 lambda: sum(line.startswith("ok") for line in said()) >= 5, 30)
        Fence(str(folder), 2, "t.a2").raise_()
        after_raise = len(records(out))
        new = Fence(str(folder), 2, "t.a2")
        gate = BatchGate(new.holding)
        for batch in range(100, 103):  # the newer attempt writes while the old one runs on
            gate.wrap(lambda df, b: out.open("a").write(json.dumps({"attempt": 2, "batch": b})
                                                        + "\n"))(None, batch)
        wait_for("the old attempt to have three writes refused",
                 lambda: sum(line.startswith("refused") for line in said()) >= 3, 30)
        assert old.poll() is None, "the old attempt stopped: no self-fencing was asked of it"
    finally:
        stop.touch()
        old.wait(30)
    written = [int(line.split()[1]) for line in said() if line.startswith("ok")]
    got = records(out)
    assert len(got) == after_raise + 3  # nothing of the old attempt landed after the raise
    old_rows = [r for r in got if r["attempt"] == 1]
    assert [r["batch"] for r in old_rows if "end" in r] == written  # every write it was told of
    assert [r["batch"] for r in old_rows if "end" not in r] == written  # and no half of one
    assert [r["batch"] for r in got[len(old_rows):]] == [100, 101, 102]  # then only the new


def test_a_launch_older_than_the_fence_is_refused_and_epoch_0_is_unfenced(tmp_path: Path) -> None:
    folder = str(tmp_path / "cp")
    Fence(folder, 7).raise_()
    with pytest.raises(Fenced, match="stale"):
        Fence(folder, 6).raise_()
    Fence(folder, 7).raise_()  # the same attempt again (a restart of its query): allowed
    with pytest.raises(Fenced, match="refused"):
        with Fence(folder, 3).holding():
            pytest.fail("a stale commit ran")
    with Fence(folder, 0).holding():  # unfenced launches do not look at the fence
        pass
    assert Fence(folder, 0).current() == 7


def test_an_unreadable_fence_file_counts_as_0_and_the_next_raise_replaces_it(
        tmp_path: Path) -> None:
    folder = tmp_path / "cp"
    folder.mkdir()
    (folder / "fence").write_text("{not json")
    fence = Fence(str(folder), 4)
    assert fence.current() == 0
    fence.raise_()
    assert json.loads((folder / "fence").read_text())["epoch"] == 4


def test_raising_waits_for_a_commit_in_progress_and_gives_up_after_its_timeout(
        tmp_path: Path) -> None:
    folder = str(tmp_path / "cp")
    holder = Fence(folder, 1)
    with holder.holding():
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            Fence(folder, 2).raise_(timeout=0.2)
        assert time.monotonic() - started >= 0.2
    Fence(folder, 2).raise_(timeout=0.2)
    assert holder.current() == 2

