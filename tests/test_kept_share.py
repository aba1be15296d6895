"""The share of input a shed stream's rows reflect (issue 32; docs/load.md, "What a sink's rows
say about shedding"), pure: the estimate against hand-computed cases and a brute-force
enumeration, and the compiler: which streams carry `kept` (and a window's `lost_input`), the
stream into the drop without it, the channel between tasks with it, what `explain` says, and
every operator that cannot carry it refused at its input, located."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from pathlib import Path

import pytest

from common import kept
from common.diagnostics import SpecError
from common.types import ColumnType, Field, Schema
from compiler.pipeline import Compilation, compile_spec_text
from elastiq.explain import explain

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


# ----------------------------------------------------------------------------------------------
# The estimate: its plain-Python reference (the runtime computes it in Spark,
# `executor.runtime._window_shares`; tests/test_shedding_spark.py checks that against rows)

def keep_share(ratio: float, high_ratio: float = 0.0, worth: bool = False) -> float:
    """A row's keep share at one drop: 1 - the ratio that applies to it."""
    return 1.0 - (high_ratio if worth else ratio)


def estimate(shares: Iterable[float]) -> float:
    """The fraction of its input a window of kept rows with these shares reflects: n / sum(1 /
    share) (1.0 for a window none of whose rows was shed; every share is above 0, a row at
    share 0 was dropped)."""
    values = list(shares)
    if not values:
        raise ValueError("a window has at least one row")
    if any(not 0.0 < s <= 1.0 for s in values):
        raise ValueError(f"a share is outside (0, 1]: {values}")
    return len(values) / sum(1.0 / s for s in values)


def lost(shares: Iterable[float]) -> bool:
    """The window lost input: some of its rows passed a drop that was shedding."""
    return any(s < 1.0 for s in shares)

def test_a_window_of_unshed_rows_reflects_all_its_input() -> None:
    assert estimate([1.0] * 7) == 1.0 and not lost([1.0] * 7)


def test_the_estimate_by_hand() -> None:
    assert estimate([0.5, 0.5]) == 0.5  # 2 rows stand for 4 arrivals
    assert estimate([1.0, 0.5]) == pytest.approx(2 / 3)  # 1 + 2 arrivals
    assert estimate([0.8, 0.5, 0.5]) == pytest.approx(3 / (1.25 + 4))
    assert lost([1.0, 0.999])
    assert keep_share(0.3) == pytest.approx(0.7)
    assert keep_share(0.3, high_ratio=0.1, worth=True) == pytest.approx(0.9)


def test_the_estimate_is_unbiased_for_the_arrivals() -> None:
    """Horvitz-Thompson: over every keep/drop outcome of 4 arrivals with these shares, the
    expected sum of 1/share over the kept rows is the number of arrivals (4): the estimate's
    denominator counts the arrivals a window stood for without bias."""
    shares = [0.5, 0.5, 0.8, 1.0]
    expected = 0.0
    for outcome in itertools.product([True, False], repeat=len(shares)):
        p = math.prod(s if k else 1 - s for s, k in zip(shares, outcome))
        expected += p * sum(1 / s for s, k in zip(shares, outcome) if k)
    assert expected == pytest.approx(len(shares))


@pytest.mark.parametrize("shares", [[], [0.0], [1.5], [0.5, -0.1]])
def test_no_estimate_of_shares_no_kept_row_can_have(shares: list[float]) -> None:
    with pytest.raises(ValueError):
        estimate(shares)


def test_reserved_names_and_schemas() -> None:
    plain = Schema.of(("a", "int"))
    assert kept.with_kept(plain).names == ("a", "kept")
    assert kept.with_kept(kept.with_kept(plain)) == kept.with_kept(plain)
    assert kept.without_kept(kept.with_kept(plain)) == plain
    assert kept.clashes(["a", "Kept", "LOST_INPUT"]) == ["Kept", "LOST_INPUT"]
    assert kept.aggregate_fields() == (Field("kept", ColumnType.DOUBLE),
                                       Field("lost_input", ColumnType.BOOLEAN))


# ----------------------------------------------------------------------------------------------
# The compiler

SHED = '<param name="shed" value="random"/>'
HOT = (EXAMPLES / "hot-sensors.xml").read_text()


def compiled(text: str) -> Compilation:
    return compile_spec_text(text, "/tmp/kept.xml", base_dir="/tmp")


def errors_of(text: str) -> list[str]:
    with pytest.raises(SpecError) as raised:
        compiled(text)
    return [d.render() for d in raised.value.diagnostics if d.severity == "error"]


def shed_hot(extra: str = SHED) -> str:
    return HOT.replace('<param name="seed" value="42"/>',
                       f'<param name="seed" value="42"/>{extra}')


ALL = """
  <operator name="all" type="console-sink"><input name="raw"/></operator>
</dataflow>"""


def test_a_shed_window_query_carries_kept_to_its_sink_over_the_channel() -> None:
    c = compiled(shed_hot().replace("\n</dataflow>", ALL))
    streams = {s.name: s.schema.names for s in c.physical.streams}
    assert streams["src_out"] == ("sensor", "ts", "temp", "humidity")  # into the drop: none
    assert streams["raw"][-1] == "kept" and streams["hotReadings"][-1] == "kept"
    assert streams["averages"][-2:] == ("kept", "lost_input")
    channel = next(ch for ch in c.query.channels if ch.stream == "raw")  # to another task
    assert channel.schema.names == streams["raw"]
    source_task = next(t for t in c.query.tasks if "src" in t.operators)
    assert "('kept', 'double')" not in source_task.program.split("rt.drop(")[0]
    text = explain(c)
    assert "shed columns on sink rows" in text
    assert "sink: kept double (estimated fraction of its input each result reflects), " \
           "lost_input boolean" in text and "shed at src_drop" in text


def test_without_shed_no_stream_has_kept() -> None:
    c = compiled(HOT)
    assert not any(kept.carries(s.schema) for s in c.physical.streams)
    assert "shed columns" not in explain(c)


def test_a_projection_carries_kept_and_may_not_name_a_field_so() -> None:
    text = shed_hot().replace('<output name="hotReadings" type="reading"/>',
                              '<output name="hot1" type="reading"/>') \
        .replace('<input name="hotReadings"/>', '<input name="hotReadings"/>', 1)
    projected = text.replace('<operator name="avg"', '''<operator name="p" type="project">
    <input name="hot1"/><field name="sensor" value="hot1.sensor"/>
    <field name="ts" value="hot1.ts"/><field name="temp" value="hot1.temp"/>
    <output name="hotReadings"/>
  </operator>
  <operator name="avg"''')
    c = compiled(projected)
    assert c.physical.stream("hotReadings").schema.names == ("sensor", "ts", "temp", "kept")
    clash = projected.replace('<field name="temp" value="hot1.temp"/>',
                              '<field name="kept" value="hot1.temp"/>')
    found = errors_of(clash)
    assert any("field 'kept' of 'p'" in e and "reserved" in e for e in found), found


def test_an_aggregate_may_not_be_named_kept_after_a_shed_stream() -> None:
    found = errors_of(shed_hot().replace('name="readings"', 'name="lost_input"'))
    assert any("'lost_input' is already an output column" in e for e in found), found
    compiled(HOT.replace('name="readings"', 'name="lost_input"'))  # unshed: an ordinary name


def test_a_shed_source_with_a_kept_column_is_refused() -> None:
    text = shed_hot().replace('<column name="humidity" type="double"/>',
                              '<column name="kept" type="double"/>').replace(
        '<operator name="src" type="generator">\n    <param name="shape" value="sensor"/>\n'
        '    <param name="rate" value="2000"/>',
        '<operator name="src" type="file-source">\n    <param name="path" value="in.jsonl"/>')
    found = errors_of(text)
    assert any("'src' is shed but its output has column(s) ['kept']" in e for e in found), found


JOIN = (EXAMPLES / "sensor-join.xml").read_text()


def test_a_join_of_a_shed_stream_is_refused_at_its_input() -> None:
    text = JOIN.replace('<param name="seed" value="1"/>', f'<param name="seed" value="1"/>{SHED}')
    found = errors_of(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if '<input name="reading"/>' in l)
    assert any(e.startswith(f"/tmp/kept.xml:{line}:") and "join 'matched'" in e
               and "cannot carry" in e for e in found), found


def test_a_union_needs_every_input_shed_or_none() -> None:
    def union(first: str, second: str) -> str:
        return f"""<dataflow name="u">
  <operator name="a" type="generator"><param name="shape" value="sensor"/>{first}
    <output name="ra"/></operator>
  <operator name="b" type="generator"><param name="shape" value="sensor"/>{second}
    <output name="rb"/></operator>
  <operator name="both" type="union"><input name="ra"/><input name="rb"/>
    <output name="all"/></operator>
  <operator name="sink" type="console-sink"><input name="all"/></operator>
</dataflow>"""
    c = compiled(union(SHED, SHED))
    assert c.physical.stream("all").schema.names[-1] == "kept"
    found = errors_of(union(SHED, ""))
    assert any("union 'both' reads shed stream 'ra' and unshed stream 'rb'" in e
               for e in found), found
