"""Issue 31, item 5: no default max-parallelism. Instance slots are not free, measured on the
compiled plan (pure): at parallelism 1 an operator with slots runs as a splitter, an instance
and a merger, so the query launches two more tasks and two more channel hops than without; each
dormant slot adds one task and two channels to the plan. So `elastiq scale` on an operator
compiled without slots is refused with the exact attribute to add."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.control import PARALLELISM, ControlRefused
from common.tasks import CompiledQuery
from compiler.control import check_tuple
from compiler.pipeline import compile_spec_text
from tests.spec_snippets import SINK, SOURCE, dataflow


def aggregate(attrs: str = "", group_by: bool = True) -> str:
    keyed = '    <param name="group-by" value="sensor"/>\n' if group_by else ""
    return dataflow(SOURCE + f'''  <operator name="agg" type="window-aggregate" {attrs}>
    <input name="raw"/>
    <param name="time" value="ts"/>
    <param name="size" value="10 seconds"/>
{keyed}    <aggregate name="n" function="count"/>
    <output name="out"/>
  </operator>
''' + SINK.format(stream="out"), name="q")


def compiled(text: str, base: Path) -> CompiledQuery:
    return compile_spec_text(text, str(base / "q.xml"), base_dir=base).query


def launched_at_start(query: CompiledQuery) -> int:
    """Tasks the query starts: all but the slots beyond each operator's initial parallelism."""
    dormant = {slot for e in query.elastic for slot in e.slots[e.initial:]}
    return len([t for t in query.tasks if t.task_id not in dormant])


def test_slots_cost_tasks_and_channels_even_at_parallelism_one(tmp_path: Path) -> None:
    plain = compiled(aggregate(), tmp_path)
    slots = {m: compiled(aggregate(f'max-parallelism="{m}"'), tmp_path) for m in (2, 4, 8)}
    assert (len(plain.tasks), len(plain.channels), launched_at_start(plain)) == (1, 0, 1)
    for m, query in slots.items():
        # the source's task with the splitter, m instance slots, the merger's task with the sink
        assert len(query.tasks) == m + 2, m
        assert len(query.channels) == 2 * m, m  # to each slot, and from each slot to the merger
        assert launched_at_start(query) == 3, m  # two more tasks than without slots


def test_scaling_an_operator_without_slots_names_the_attribute_to_add(tmp_path: Path) -> None:
    catalog = compiled(aggregate(), tmp_path).controls
    assert catalog is not None
    with pytest.raises(ControlRefused) as refused:
        check_tuple(catalog, "q", "agg", PARALLELISM, "2")
    text = refused.value.problems[0]
    assert text.startswith("agg (window-aggregate) has no parameter 'parallelism'")
    assert 'add max-parallelism="4" (2 to 64) to <operator name="agg"> in the spec' in text
    assert "(keyed: with group-by)" in text
    # the attribute it names is the one that makes the operator rescalable
    fixed = compiled(aggregate('max-parallelism="4"'), tmp_path).controls
    assert fixed is not None and check_tuple(fixed, "q", "agg", PARALLELISM, "2").runtime_value == 2


def test_an_operator_that_cannot_be_partitioned_keeps_the_plain_refusal(tmp_path: Path) -> None:
    catalog = compiled(aggregate(), tmp_path).controls
    assert catalog is not None
    with pytest.raises(ControlRefused) as refused:
        check_tuple(catalog, "q", "src", PARALLELISM, "2")
    assert "max-parallelism" not in refused.value.problems[0]
