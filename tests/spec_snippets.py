"""Helpers for tests that write small specs: a valid base and a way to locate text in it."""

from __future__ import annotations

READING_TYPE = """  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="ts" type="timestamp"/>
    <column name="temp" type="double"/>
    <column name="humidity" type="double"/>
  </type>
"""

SOURCE = """  <operator name="src" type="generator">
    <param name="shape" value="sensor"/>
    <param name="seed" value="3"/>
    <output name="raw" type="reading"/>
  </operator>
"""

SINK = """  <operator name="sink" type="file-sink">
    <input name="{stream}"/>
    <param name="path" value="out.jsonl"/>
  </operator>
"""


def dataflow(body: str, name: str = "t", types: str = READING_TYPE) -> str:
    """A spec with the reading type declared and `body` as its operators."""
    return f'<dataflow name="{name}">\n{types}{body}</dataflow>\n'


def with_source_and_sink(middle: str, sink_stream: str) -> str:
    return dataflow(SOURCE + middle + SINK.format(stream=sink_stream))


def locate(text: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """1-based (line, column) of the nth occurrence of needle in text."""
    index = -1
    for _ in range(nth + 1):
        index = text.index(needle, index + 1)
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, column
