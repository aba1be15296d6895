"""Pure tests of a file sink partitioned by time (Nexmark q10): the `partition-by` language and
its located errors, the folder names against an oracle in plain Python (`datetime.strftime`), a
seeded fuzz of patterns and times, which rows go where, and the partitions' files on a real
file system: exactly once across a replayed batch that reached only some partitions, and an
attacker's link at a partition folder (put there before the run or swapped in during it)
refused without a byte written through it. No Spark (tests/test_nexmark_spark.py runs it)."""

from __future__ import annotations

import json
import os
import random
import re
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from common import time_partitions as tp
from common.diagnostics import Diagnostic
from common.paths import PathRefused, PathRoots
from common.safe_open import FileRefused
from compiler.pipeline import check_spec_text, compile_spec_text
from executor import partitioned_sink
from executor.partitioned_sink import PartitionedAppendLog, partition_rows
from tests.spec_snippets import locate

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
Q10 = "dt=yyyy-MM-dd/hm=HH:mm"


def levels(text: str) -> tuple[tp.Level, ...]:
    found, problems = tp.parse(text)
    assert not problems, problems
    return found


# --- the oracle: strftime, and Hive's escaping of ':' --------------------------------------------

STRFTIME = {"yyyy": "%Y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M", "ss": "%S"}


def oracle_folders(text: str, when: datetime | None) -> tuple[str, ...]:
    """The folders of `text` for `when`, from `strftime` (years 1000-9999: glibc does not pad
    %Y), every ':' written %3A."""
    out = []
    for level in text.split("/"):
        name, _, pattern = level.rpartition("=")
        if when is None:
            value = "__DEFAULT_PARTITION__"
        else:
            fmt = re.sub("|".join(STRFTIME), lambda m: STRFTIME[m.group()], pattern)
            value = when.strftime(fmt).replace(":", "%3A")
        out.append(f"{name}={value}" if name else value)
    return tuple(out)


def micros(when: datetime) -> int:
    return (when - EPOCH) // timedelta(microseconds=1)


def test_q10s_folders_are_flink_and_hives() -> None:
    when = datetime(2015, 7, 15, 10, 15, 42, 123456, tzinfo=timezone.utc)
    assert tp.folder_names(levels(Q10), micros(when)) == ("dt=2015-07-15", "hm=10%3A15")
    assert tp.folder_names(levels(Q10), None) == ("dt=__DEFAULT_PARTITION__",
                                                  "hm=__DEFAULT_PARTITION__")
    assert tp.folder_names(levels("yyyy/MM/dd"), micros(when)) == ("2015", "07", "15")
    assert tp.folder_names(levels("t=yyyyMMdd_HH.mm.ss"), micros(when)) == (
        "t=20150715_10.15.42",)
    assert tp.folder_names(levels("y=yyyy"), micros(datetime(1, 1, 1, tzinfo=timezone.utc))) \
        == ("y=0001",)
    assert tp.folder_names(levels("d=dd/t=HH:mm:ss"), -1) == ("d=31", "t=23%3A59%3A59")
    assert tp.canonical(levels(" dt=yyyy-MM-dd / hm=HH:mm ")) == Q10


def random_pattern(rng: random.Random) -> str:
    def pattern() -> str:
        tokens = [rng.choice(list(tp.FIELDS))]
        for _ in range(rng.randrange(4)):
            tokens.insert(rng.randrange(len(tokens) + 1),
                          rng.choice(list(tp.FIELDS)) if rng.random() < 0.5
                          else rng.choice(tp.SEPARATORS))
        return "".join(tokens)
    names = rng.sample(["dt", "hm", "Y", "_x1", "part_2", "s"], rng.randrange(1, 4))
    return "/".join(f"{n}={pattern()}" if rng.random() < 0.7 else pattern() for n in names)


def test_a_seeded_fuzz_of_patterns_and_times_names_folders_as_the_oracle() -> None:
    rng = random.Random(37)
    low, high = micros(datetime(1000, 1, 1, tzinfo=timezone.utc)), \
        micros(datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc))
    for _ in range(400):
        text = random_pattern(rng)
        parsed = levels(text)
        span = tp.span_us(parsed)
        for _ in range(20):
            t = rng.randrange(low, high) if rng.random() < 0.8 else rng.randrange(-10**12, 10**12)
            when = EPOCH + timedelta(microseconds=t)
            names = tp.folder_names(parsed, t)
            assert names == oracle_folders(text, when), (text, when)
            start = t - t % span  # the time's span names it as the time does
            assert tp.folder_names(parsed, start) == names
            assert tp.folder_names(parsed, start + span - 1) == names
            assert all(n not in ("", ".", "..") and "/" not in n and "\0" not in n
                       for n in names)


def test_no_text_names_a_folder_that_leaves_the_sinks_folder() -> None:
    """Random texts (escape attempts among them): parsed ones only ever name plain folders."""
    rng = random.Random(10)
    pieces = [*tp.FIELDS, *tp.SEPARATORS, "dt=", "x_1=", "/", "..", ".", "=", "%2F", "\\",
              "\0", "~", " ", "\t", "a", "$HOME", "y", "M"]
    shown = 0
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8)))
        parsed, problems = tp.parse(text)
        if problems:
            assert all(0 <= p.offset <= len(text) for p in problems)
            continue
        shown += 1
        for t in (0, -1, 10**15, -(10**15)):
            for name in tp.folder_names(parsed, t):
                assert name not in ("", ".", "..") and "/" not in name and "\0" not in name
                assert os.path.normpath(os.path.join("/base", name)).startswith("/base/")
    assert shown > 50, "the fuzz parsed too few texts to say anything"


@pytest.mark.parametrize("text, offset, fragment", [
    ("dt=yyyy-MM-dd/../x", 14, "has no field"),
    ("/etc", 0, "an empty level"),
    ("dt=yyyy/", 8, "an empty level"),
    ("dt=yyyy//hm=HH", 8, "an empty level"),
    ("dt=%2F..%2Fyyyy", 3, "'%2F' is not a field"),
    ("../dt=yyyy", 0, "has no field"),
    ("a.b=yyyy", 0, "is not a name"),
    ("dt=yyyy/DT=MM", 8, "given twice"),
    ("dt=yy-MM", 3, "'yy' is not a field"),
    ("dt=yyyy MM", 7, "' ' is not a field"),
    ("a/b/c/d/e/f/g", 0, "at most 6"),
    ("dt=" + "yyyy" * 9, 3, "at most 32"),
])
def test_a_bad_pattern_is_refused_at_its_character(text: str, offset: int,
                                                   fragment: str) -> None:
    _, problems = tp.parse(text)
    assert any(p.offset == offset and fragment in p.message for p in problems), problems


# --- the spec: located errors, all at once -------------------------------------------------------

def spec(sink_params: str, middle: str = "", out: str = "b") -> str:
    return ('<dataflow name="nx">\n  <operator name="bids" type="generator">\n'
            '    <param name="shape" value="bid"/>\n    <output name="b"/>\n  </operator>\n'
            f'{middle}  <operator name="sink" type="file-sink">\n    <input name="{out}"/>\n'
            f'    <param name="path" value="out/bids.jsonl"/>\n{sink_params}'
            '  </operator>\n</dataflow>\n')


def errors(xml: str) -> list[Diagnostic]:
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is None, "the spec should be refused"
    return [d for d in diagnostics if d.severity == "error"]


def at(found: list[Diagnostic], xml: str, needle: str, fragment: str, nth: int = 0) -> None:
    line, column = locate(xml, needle, nth)
    assert any((d.position.line, d.position.column) == (line, column) and fragment in d.message
               for d in found), [d.render() for d in found]


def test_a_partitioned_sink_compiles_to_its_column_and_canonical_folders(tmp_path: Path) -> None:
    xml = spec('    <param name="partition-time" value="date_time"/>\n'
               '    <param name="partition-by" value=" dt=yyyy-MM-dd / hm=HH:mm "/>\n')
    (task,) = compile_spec_text(xml, "nx.xml", base_dir=str(tmp_path)).query.tasks
    assert "partition_time='date_time'" in task.program
    assert f"partition_by='{Q10}'" in task.program


def test_every_problem_of_a_partitioned_sink_is_refused_at_its_place_at_once() -> None:
    xml = spec('    <param name="partition-time" value="price"/>\n'
               '    <param name="partition-by" value="dt=yyyy/../x=hh"/>\n')
    found = errors(xml)
    at(found, xml, 'price"', "'partition-time' needs a timestamp column")
    at(found, xml, "../x", "has no field")
    at(found, xml, "hh", "'hh' is not a field")
    assert len(found) == 3
    missing = spec('    <param name="partition-by" value="dt=yyyy"/>\n'
                   '    <param name="partition-time" value="no_such"/>\n')
    at(errors(missing), missing, "no_such", "does not have")
    alone = spec('    <param name="partition-by" value="dt=yyyy"/>\n')
    at(errors(alone), alone, '<param name="partition-by"', "needs partition-time")
    time_only = spec('    <param name="partition-time" value="date_time"/>\n')
    at(errors(time_only), time_only, '<param name="partition-time"', "needs partition-by")


def test_an_upsert_log_is_not_partitioned() -> None:
    aggregate = ('  <operator name="agg" type="aggregate">\n    <input name="b"/>\n'
                 '    <param name="time" value="date_time"/> <param name="ttl" value="1 hours"/>\n'
                 '    <param name="group-by" value="auction"/>\n'
                 '    <aggregate name="n" function="count"/>\n    <output name="t"/>\n'
                 '  </operator>\n')
    xml = spec('    <param name="partition-time" value="auction"/>\n'
               '    <param name="partition-by" value="dt=yyyy"/>\n', aggregate, "t")
    found = errors(xml)
    at(found, xml, '<param name="partition-by"', "cannot partition the upsert log")
    at(found, xml, 'auction"/>', "needs a timestamp column", nth=1)


# --- rows to partitions ---------------------------------------------------------------------------

def test_each_row_goes_to_the_oracles_folders_in_batch_order() -> None:
    rng = random.Random(5)
    start = micros(datetime(2024, 1, 1, 23, 58, tzinfo=timezone.utc))
    times = [None if rng.random() < 0.05 else start + rng.randrange(-5 * 10**6, 300 * 10**6)
             for _ in range(1000)]
    for unit, per in (("us", 1), ("ms", 1000), ("ns", 1)):
        column = [None if t is None else (t // per if unit == "ms" else t * 1000 if unit == "ns"
                                          else t) for t in times]
        table = pa.table({"ts": pa.array(column, pa.timestamp(unit, tz="UTC")),
                          "i": list(range(len(times)))})
        want: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i, t in enumerate(column):
            if t is not None:
                t = t * per if unit == "ms" else t // 1000 if unit == "ns" else t
            want[oracle_folders(Q10, None if t is None else
                                EPOCH + timedelta(microseconds=t))].append(i)
        got = partition_rows(table, "ts", levels(Q10))
        assert [f for f, _ in got] == sorted(want)
        assert {f: list(rows) for f, rows in got} == want
        assert len(want) >= 6  # two days, several minutes, the null partition


# --- the partitions' files -----------------------------------------------------------------------

def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


A, B = ("dt=2024-01-01", "hm=23%3A59"), ("dt=2024-01-02", "hm=00%3A00")


def test_a_replayed_batch_is_written_once_in_each_partition(tmp_path: Path) -> None:
    """Batch 1 reached partition A, then B could not be written (a link in the way, as a crash
    would leave it half done); Spark's replay of batch 1 skips A and writes B; a batch replayed
    again adds nothing; the least recently used partition is closed and reopened on the way."""
    roots = PathRoots((str(tmp_path),))
    sink = PartitionedAppendLog(str(tmp_path / "out" / "bids.jsonl"), "run-1", roots)
    assert sink.append(0, [(A, ["a0"])]) == [A]
    (tmp_path / "out" / "dt=2024-01-02").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "out" / "dt=2024-01-02" / "hm=00%3A00")
    with pytest.raises(FileRefused, match="symbolic link"):
        sink.append(1, [(A, ["a1"]), (B, ["b1"])])
    assert os.listdir(tmp_path / "elsewhere") == []
    os.unlink(tmp_path / "out" / "dt=2024-01-02" / "hm=00%3A00")
    old = partitioned_sink.MAX_OPEN
    partitioned_sink.MAX_OPEN = 1
    try:
        assert sink.append(1, [(A, ["a1"]), (B, ["b1"])]) == [B]
        assert sink.append(1, [(A, ["a1"]), (B, ["b1"])]) == []
        assert sink.append(2, [(A, ["a2"]), (B, ["b2"])]) == [A, B]
    finally:
        partitioned_sink.MAX_OPEN = old
    sink.close()
    again = PartitionedAppendLog(str(tmp_path / "out" / "bids.jsonl"), "run-1", roots)
    assert again.append(2, [(A, ["a2"])]) == []  # a restart replaying batch 2
    again.close()
    base = tmp_path / "out"
    assert lines_of(base.joinpath(*A, "bids.jsonl")) == ["a0", "a1", "a2"]
    assert lines_of(base.joinpath(*B, "bids.jsonl")) == ["b1", "b2"]
    mark = json.loads(base.joinpath(*B, "bids.jsonl.commit").read_text())
    assert (mark["batch_id"], mark["owner"]) == (2, "run-1")
    assert oct(base.joinpath(*B).stat().st_mode & 0o777) == "0o700"


def test_a_partition_folder_swapped_for_a_link_mid_run_writes_nothing_through_it(
        tmp_path: Path) -> None:
    roots = PathRoots((str(tmp_path / "data"),))
    (tmp_path / "data").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "bids.jsonl").write_text("precious\n")
    sink = PartitionedAppendLog(str(tmp_path / "data" / "bids.jsonl"), "run", roots)
    assert sink.append(0, [(A, ["a0"])]) == [A]
    day = tmp_path / "data" / A[0]
    day.rename(tmp_path / "data" / "moved")
    os.symlink(outside, day)  # dt=2024-01-01 -> outside (which has no hm=... folder)
    (outside / A[1]).symlink_to(outside)  # and its hm folder: a link to outside itself
    with pytest.raises(FileRefused):
        sink.append(1, [(A, ["a1"])])
    sink.close()
    fresh = PartitionedAppendLog(str(tmp_path / "data" / "bids.jsonl"), "run", roots)
    with pytest.raises(FileRefused, match="symbolic link"):
        fresh.append(1, [(A, ["a1"])])  # a restarted task follows no link either
    fresh.close()
    assert (outside / "bids.jsonl").read_text() == "precious\n"
    assert sorted(os.listdir(outside)) == sorted(["bids.jsonl", A[1]])


def test_a_sink_folder_outside_the_roots_is_refused_before_any_batch(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path, tmp_path / "data" / "up")
    with pytest.raises(PathRefused, match="outside the allowed folders"):
        PartitionedAppendLog(str(tmp_path / "data" / "up" / "bids.jsonl"), "run",
                             PathRoots((str(tmp_path / "data"),)))


class Batch:
    """What the sink reads of a micro-batch (its Arrow table): a stand-in for a DataFrame."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def toArrow(self) -> pa.Table:
        return self.table


def test_a_control_tuple_moves_the_partitions_and_an_undo_moves_them_back(
        tmp_path: Path) -> None:
    roots = PathRoots((str(tmp_path),))
    sink = partitioned_sink.PartitionedFileSink("t", str(tmp_path / "a" / "bids.jsonl"), "ts",
                                                levels(Q10), "run", roots)
    first = micros(datetime(2024, 1, 1, 23, 59, 30, tzinfo=timezone.utc))
    batch = Batch(pa.table({"ts": pa.array([first, first + 60 * 10**6, None],
                                           pa.timestamp("us", tz="UTC")), "n": [1, 2, 3]}))
    sink(batch, 0)
    undo = sink.retarget(tmp_path / "b" / "bids.jsonl")
    sink(batch, 1)
    undo()
    sink(batch, 1)
    sink(batch, 1)  # a replay: nothing more
    assert sink.rows_out == 9
    for folder, batches in (("a", 2), ("b", 1)):
        found = {f.relative_to(tmp_path / folder).parts[:-1]: len(lines_of(f))
                 for f in (tmp_path / folder).rglob("bids.jsonl")}
        assert found == {A: batches, B: batches,
                         ("dt=__DEFAULT_PARTITION__", "hm=__DEFAULT_PARTITION__"): batches}
    assert not (tmp_path / "a" / "bids.jsonl").exists()
