"""Pure compile tests of a join of two windows' results on the window (Nexmark q8): it
compiles to one task whose join reads both windows' window_end, and a join of window results
on another time column is refused at its value."""

from __future__ import annotations

from compiler.pipeline import check_spec_text, compile_spec_text
from tests.test_nexmark_compile import refused_at

Q8 = """<dataflow name="q8">
  <operator name="persons" type="generator">
    <param name="shape" value="person"/> <output name="persons"/>
  </operator>
  <operator name="auctions" type="generator">
    <param name="shape" value="auction"/> <output name="auctions"/>
  </operator>
  <operator name="new_persons" type="window-aggregate">
    <input name="persons"/> <output name="new_persons"/>
    <param name="time" value="date_time"/> <param name="size" value="10 seconds"/>
    <param name="group-by" value="id, name"/> <aggregate name="n" function="count"/>
  </operator>
  <operator name="sellers" type="window-aggregate">
    <input name="auctions"/> <output name="sellers"/>
    <param name="time" value="date_time"/> <param name="size" value="10 seconds"/>
    <param name="group-by" value="seller"/> <aggregate name="opened" function="count"/>
  </operator>
  <operator name="same_window" type="join">
    <input name="new_persons"/> <input name="sellers"/> <output name="new_sellers"/>
    <param name="left-key" value="id, window_start"/>
    <param name="right-key" value="seller, window_start"/>
    <param name="time" value="{time}"/> <param name="within" value="0 ms"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="new_sellers"/> <param name="path" value="out.jsonl"/>
  </operator>
</dataflow>
"""


def test_a_join_of_two_windows_on_the_window_compiles(tmp_path: object) -> None:
    xml = Q8.format(time="window_end")
    graph, diagnostics = check_spec_text(xml, "q8.xml")
    assert graph is not None, [d.render() for d in diagnostics]
    assert graph.stream("new_sellers").schema.names == (
        "window_start", "window_end", "id", "name", "n", "sellers_window_start",
        "sellers_window_end", "seller", "opened")
    compiled = compile_spec_text(xml, "q8.xml", base_dir=str(tmp_path))
    (task,) = compiled.query.tasks
    assert "left_keys=('id', 'window_start')" in task.program
    assert "left_time='window_end'" in task.program and "within='0 seconds'" in task.program


def test_a_join_of_window_results_on_another_time_is_refused_at_its_value() -> None:
    refused_at(Q8.format(time="window_start"), 'window_start"/> <param name="within"',
               "window_end")
