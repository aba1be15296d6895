"""Attacks on the files of file sources and sinks while a query runs (common/safe_open.py, as
`executor.sinks.JsonlAppendLog` / `FileSink` and `executor.sources.LineIndex` / `FileReader`
use it): whoever can write into a path root swaps the sink's file, the source's file or a
folder on their path for a symbolic link or a hard link to a file outside every root, between
two micro-batches. The oracle is the outside file itself (the same bytes before and after) and
the rows read (none of the outside file's). Driven on the sink and source classes with real
files, no Spark; a seeded fuzz of swap sequences at the end."""

from __future__ import annotations

import json
import os
import random
import stat
from pathlib import Path

import pytest

from common.paths import ENV_VAR, PathRefused
from common.types import Schema
from executor import sinks, sources

IDS = Schema.of(("id", "int"))
REFUSED = (OSError, PathRefused)  # the open or the batch fails: nothing read or written


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The one path root (`$ELASTIQ_PATH_ROOTS`, as `elastiq run` sets it for executors)."""
    folder = tmp_path / "root"
    folder.mkdir()
    monkeypatch.setenv(ENV_VAR, str(folder))
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside every root holding a file worth protecting."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.jsonl").write_bytes(b"".join(
        json.dumps({"id": 1000 + i}).encode() + b"\n" for i in range(2000)))
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (not following links) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def lines(n: int, first: int = 0) -> list[str]:
    return [json.dumps({"id": i}) for i in range(first, first + n)]


def append_refused(log: sinks.JsonlAppendLog, batch: int) -> bool:
    """Whether appending `batch` was refused (an OSError: the batch fails)."""
    try:
        log.append(batch, lines(3, 100 * batch))
    except REFUSED:
        return True
    return False


# --- the sink -----------------------------------------------------------------------------------

def test_a_sink_file_swapped_for_a_link_to_an_outside_file_leaves_it_untouched(
        root: Path, outside: Path) -> None:
    path = root / "out.jsonl"
    log = sinks.JsonlAppendLog(str(path))
    assert log.append(0, lines(5))
    before = snapshot(outside)
    path.unlink()
    path.symlink_to(outside / "secret.jsonl")
    assert append_refused(log, 1)
    assert snapshot(outside) == before
    with pytest.raises(REFUSED):  # a restarted task is refused too
        sinks.JsonlAppendLog(str(path))
    assert snapshot(outside) == before


def test_a_sink_file_swapped_for_a_hard_link_to_an_outside_file_leaves_it_untouched(
        root: Path, outside: Path) -> None:
    path = root / "out.jsonl"
    log = sinks.JsonlAppendLog(str(path))
    assert log.append(0, lines(5))
    before = snapshot(outside)
    path.unlink()
    os.link(outside / "secret.jsonl", path)
    assert append_refused(log, 1)
    assert snapshot(outside) == before
    with pytest.raises(OSError, match="hard links"):  # nor opened by a restarted task
        sinks.JsonlAppendLog(str(path))
    assert snapshot(outside) == before


def test_a_sink_opened_on_a_hard_link_to_an_outside_file_is_refused(
        root: Path, outside: Path) -> None:
    os.link(outside / "secret.jsonl", root / "out.jsonl")
    before = snapshot(outside)
    with pytest.raises(REFUSED):
        sinks.JsonlAppendLog(str(root / "out.jsonl")).append(0, lines(1))
    assert snapshot(outside) == before


def test_a_folder_of_the_sink_path_swapped_for_a_link_leaves_the_outside_untouched(
        root: Path, outside: Path) -> None:
    (outside / "out.jsonl").write_bytes(b'{"id":7}\n' * 1000)
    (outside / "out.jsonl.commit").write_text('{"batch_id": 0, "length": 10, "owner": ""}')
    log = sinks.JsonlAppendLog(str(root / "day" / "out.jsonl"))
    assert log.append(0, lines(5))
    before = snapshot(outside)
    (root / "day").rename(root / "day-old")
    (root / "day").symlink_to(outside)
    assert append_refused(log, 1)
    assert snapshot(outside) == before
    with pytest.raises(REFUSED):
        sinks.JsonlAppendLog(str(root / "day" / "out.jsonl"))
    assert snapshot(outside) == before
    assert len((root / "day-old" / "out.jsonl").read_text().splitlines()) == 5


def test_a_sink_moved_by_a_control_tuple_is_held_to_the_same_rules(
        root: Path, outside: Path) -> None:
    sink = sinks.FileSink("t", str(root / "day1.jsonl"))
    assert sink.log.append(0, lines(2))
    sink.retarget(str(root / "day2.jsonl"))
    assert sink.log.append(1, lines(2, 2))
    before = snapshot(outside)
    (root / "day2.jsonl").unlink()
    (root / "day2.jsonl").symlink_to(outside / "secret.jsonl")
    assert append_refused(sink.log, 2)
    (root / "day3.jsonl").symlink_to(outside / "secret.jsonl")
    with pytest.raises(REFUSED):  # a retarget onto a link is refused, the sink stays put
        sink.retarget(str(root / "day3.jsonl"))
    assert snapshot(outside) == before


def test_the_sink_cuts_a_torn_append_only_in_the_file_its_mark_names(root: Path) -> None:
    """A commit mark copied next to another file (or a file copied over the sink's) records a
    length for another inode: the file is taken as it is, never cut to that length."""
    path = root / "out.jsonl"
    log = sinks.JsonlAppendLog(str(path))
    assert log.append(0, lines(3))
    del log
    kept = b'{"id":1}\n' * 50
    path.rename(root / "kept-alive.jsonl")  # (so that its inode is not reused at once)
    path.write_bytes(kept)  # another file (another inode) under the same name
    again = sinks.JsonlAppendLog(str(path))
    assert again.append(1, lines(1, 9))
    assert path.read_bytes().startswith(kept)
    mark = sinks.read_mark(f"{path}.commit")
    assert mark is not None and mark.file == (os.stat(path).st_dev, os.stat(path).st_ino)


def test_an_existing_file_without_a_mark_is_appended_to_not_emptied(root: Path) -> None:
    path = root / "out.jsonl"
    path.write_bytes(b'{"id":1}\n{"id":2}\n')
    log = sinks.JsonlAppendLog(str(path))
    assert log.append(0, lines(1, 3))
    assert [json.loads(x)["id"] for x in path.read_text().splitlines()] == [1, 2, 3]


# --- the source ---------------------------------------------------------------------------------

def replay(reader: sources.FileReader, start: dict) -> tuple[dict, list[int], bool]:
    """(next offset, ids read, whether an OSError stopped it) of one micro-batch."""
    ids: list[int] = []
    try:
        end = reader.latestOffset()
        for part in reader.partitions(start, end):
            ids += [row["id"] for batch in reader.read(part) for row in batch.to_pylist()]
    except REFUSED:
        return start, ids, True
    return end, ids, False


def file_reader(path: Path, tmp_path: Path) -> sources.FileReader:
    return sources.FileReader(sources.FileConfig(
        "t", "src", str(path), "jsonl", sources.schema_pairs(IDS), None,
        str(tmp_path / "pacing" / "src.anchor"), 1))


@pytest.mark.parametrize("swap", ["symlink", "hard link", "folder symlink"])
def test_a_source_file_swapped_between_batches_yields_no_outside_row(
        swap: str, root: Path, outside: Path, tmp_path: Path) -> None:
    (root / "in").mkdir()
    path = root / "in" / "data.jsonl"
    path.write_text("\n".join(lines(10)) + "\n")
    reader = file_reader(path, tmp_path)
    start, ids, refused = replay(reader, reader.initialOffset())
    assert ids == list(range(10)) and not refused
    if swap == "folder symlink":
        (root / "in").rename(root / "in-old")
        (root / "in").symlink_to(outside)
        os.link(outside / "secret.jsonl", outside / "data.jsonl")
    else:
        path.unlink()
        if swap == "symlink":
            path.symlink_to(outside / "secret.jsonl")
        else:
            os.link(outside / "secret.jsonl", path)
    _, ids, refused = replay(reader, start)
    assert refused and not [i for i in ids if i >= 1000]
    restarted = file_reader(path, tmp_path)  # a restarted planner is refused as well
    _, ids, refused = replay(restarted, {"line": 10})
    assert not [i for i in ids if i >= 1000]


def test_a_worker_reads_only_the_file_its_planner_indexed(
        root: Path, outside: Path, tmp_path: Path) -> None:
    path = root / "data.jsonl"
    path.write_text("\n".join(lines(10)) + "\n")
    reader = file_reader(path, tmp_path)
    end = reader.latestOffset()
    planned = reader.partitions(reader.initialOffset(), end)
    path.unlink()
    os.link(outside / "secret.jsonl", path)  # swapped after planning, before the read
    with pytest.raises(OSError):
        [b for part in planned for b in reader.read(part)]


def test_a_fifo_given_as_a_source_or_sink_is_refused_with_its_own_message(root: Path) -> None:
    fifo = root / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="FIFO"):  # and never blocks waiting for a writer
        sources.open_input(sources.rooted_input(str(fifo), ""))
    with pytest.raises(OSError, match="FIFO"):
        sinks.JsonlAppendLog(str(fifo))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --- seeded fuzz: random swaps between batches --------------------------------------------------

SWAPS = ("none", "file-symlink", "file-hardlink", "folder-symlink", "rename-away",
         "replace-copy", "mark-symlink")


def swap(kind: str, folder: Path, name: str, outside: Path, round: int) -> None:
    """One move an attacker with write access to the root makes between two batches (in
    the root only: once the folder is a link out, the attacker waits for the sink)."""
    if folder.is_symlink():
        return
    target = folder / name
    if kind == "file-symlink" and target.exists():
        target.unlink()
        target.symlink_to(outside / "secret.jsonl")
    elif kind == "file-hardlink" and target.exists() and not target.is_symlink():
        target.unlink()
        os.link(outside / "secret.jsonl", target)
    elif kind == "folder-symlink" and folder.is_dir() and not folder.is_symlink():
        folder.rename(folder.with_name(f"{folder.name}-{round}"))
        folder.symlink_to(outside)
    elif kind == "rename-away" and target.exists():
        target.rename(folder / f"{name}.old")
    elif kind == "replace-copy" and target.is_file() and not target.is_symlink():
        data = target.read_bytes()
        target.unlink()
        target.write_bytes(data)
    elif kind == "mark-symlink" and folder.is_dir():
        mark = folder / f"{name}.commit"
        if mark.exists() or mark.is_symlink():
            mark.unlink()
        mark.symlink_to(outside / "secret.jsonl")


def grow(path: Path, new: list[str]) -> None:
    """The legitimate writer appends to the input, when it is still its own file."""
    if path.parent.is_symlink() or path.is_symlink() or not path.is_file() \
            or path.stat().st_nlink > 1:
        return
    with open(path, "a") as f:
        f.write("\n".join(new) + "\n")


def heal(folder: Path) -> None:
    """Undo a folder swap (the operator puts things back), so later rounds have a path."""
    if folder.is_symlink():
        folder.unlink()
    folder.mkdir(exist_ok=True)


@pytest.mark.parametrize("seed", range(12))
def test_fuzzed_swaps_never_read_or_change_anything_outside_the_root(
        seed: int, root: Path, outside: Path, tmp_path: Path) -> None:
    rng = random.Random(seed)
    (outside / "out.jsonl").write_bytes(b'{"id":5000}\n' * 10)
    (outside / "in.jsonl").write_bytes(b'{"id":6000}\n' * 10)
    before = snapshot(outside)
    folder = root / "d"
    folder.mkdir()
    (folder / "in.jsonl").write_text("\n".join(lines(20)) + "\n")
    sink: sinks.JsonlAppendLog | None = None
    reader = file_reader(folder / "in.jsonl", tmp_path)
    start = reader.initialOffset()
    for batch in range(25):
        if sink is None:
            try:
                sink = sinks.JsonlAppendLog(str(folder / "out.jsonl"))
            except REFUSED:
                pass
        if sink is not None and append_refused(sink, batch):
            sink = None  # the batch failed: the task restarts, opening the path again
        start, ids, refused = replay(reader, start)
        assert all(i < 1000 for i in ids), (seed, batch)
        if refused:
            reader = file_reader(folder / "in.jsonl", tmp_path)
            start = {"line": 0}
        grow(folder / "in.jsonl", lines(2, 20 + 2 * batch))
        kind = rng.choice(SWAPS)
        swap(kind, folder, rng.choice(["out.jsonl", "in.jsonl"]), outside, batch)
        if rng.random() < 0.3:
            heal(folder)
        assert snapshot(outside) == before, (seed, batch, kind)


def test_validate_refuses_a_fifo_as_a_source_with_its_own_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "data").mkdir()
    os.mkfifo(tmp_path / "data" / "numbers.jsonl")
    spec = tmp_path / "q.xml"
    spec.write_text((repo / "examples" / "paper-filter.xml").read_text())
    from elastiq.cli import main

    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    assert f"{spec}:11:31: error: parameter 'path' of 'source': data/numbers.jsonl is a FIFO " \
           "(named pipe), not a regular file" in err
    assert "does not exist" not in err


def test_a_link_that_stays_inside_the_root_is_placed_once_then_never_followed(
        root: Path, outside: Path) -> None:
    """As `validate` resolves links that stay inside the roots, so does a task's first open;
    after it, the real path is walked with no link followed."""
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    log = sinks.JsonlAppendLog(str(root / "alias" / "out.jsonl"))
    assert log.append(0, lines(2))
    assert log.where.parts == ("real", "out.jsonl")
    assert len((root / "real" / "out.jsonl").read_text().splitlines()) == 2
    before = snapshot(outside)
    (root / "real").rename(root / "real-old")
    (root / "real").symlink_to(outside)
    assert append_refused(log, 1)
    assert snapshot(outside) == before
