"""Which tasks run in Spark's real-time mode (pure, `compiler.realtime`): a kafka-sink's
mode="real-time" is taken when its task is kafka-source -> filter/project -> that sink, at
least once; otherwise refused at its `mode` value with every reason at once, by compile and by
validate; `explain` says each Kafka task's mode and why; the program asks the runtime for it."""

from __future__ import annotations

import pytest

from common.diagnostics import SpecError
from compiler.pipeline import check_spec_text, compile_spec_text
from elastiq.explain import explain
from tests.spec_snippets import locate

TYPES = """  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="temp" type="double"/>
  </type>
"""


def spec(*, source: str = "", middle: str = "", sink: str = "", feed: str = "hot",
         delivery: str = "at-least-once", columns: str = "") -> str:
    types = TYPES.replace("  </type>", columns + "  </type>")
    return f"""<dataflow name="rt">
{types}  <operator name="src" type="kafka-source">
    <param name="bootstrap" value="127.0.0.1:9092"/>
    <param name="topic" value="in"/>
{source}    <output name="raw" type="reading"/>
  </operator>
  <operator name="flt" type="filter">
    <input name="raw"/>
    <param name="condition" value="raw.temp &gt; 30"/>
    <output name="hot" type="reading"/>
  </operator>
{middle}  <operator name="out" type="kafka-sink">
    <input name="{feed}"/>
    <param name="bootstrap" value="127.0.0.1:9092"/>
    <param name="topic" value="out"/>
    <param name="delivery" value="{delivery}"/>
{sink}  </operator>
</dataflow>
"""


REAL_TIME = '    <param name="mode" value="real-time"/>\n'


def test_an_eligible_task_that_asks_runs_in_real_time_mode() -> None:
    c = compile_spec_text(spec(sink=REAL_TIME), "rt.xml", base_dir="/tmp")
    (task,) = c.query.tasks
    assert "rt.real_time_mode()" in task.program
    assert "mode   real-time" in explain(c)


def test_an_eligible_task_that_does_not_ask_stays_micro_batch_and_explain_says_it_could() -> None:
    c = compile_spec_text(spec(), "rt.xml", base_dir="/tmp")
    assert "real_time_mode" not in c.query.tasks[0].program
    assert 'micro-batch (real-time mode possible: mode="real-time"' in explain(c)


def test_exactly_once_is_refused_at_the_mode_value_with_the_reason() -> None:
    text = spec(sink=REAL_TIME, delivery="exactly-once")
    with pytest.raises(SpecError) as e:
        compile_spec_text(text, "rt.xml", base_dir="/tmp")
    (d,) = e.value.diagnostics
    line, column = locate(text, '"real-time"')
    assert (d.position.line, d.position.column) == (line, column + 1)
    assert "exactly-once" in d.message and "needs micro-batch transactions" in d.message
    graph, problems = check_spec_text(text, "rt.xml", base_dir="/tmp")
    assert graph is None and [p.message for p in problems] == [d.message]


def test_every_reason_is_given_at_once() -> None:
    text = spec(source='    <param name="max-records-per-batch" value="100"/>\n'
                       '    <param name="format" value="csv"/>\n'
                       '    <param name="dead-letter" value="dead.jsonl"/>\n',
                sink=REAL_TIME, columns='    <column name="ts" type="timestamp"/>\n')
    with pytest.raises(SpecError) as e:
        compile_spec_text(text, "rt.xml", base_dir="/tmp")
    (d,) = [d for d in e.value.diagnostics if d.severity == "error"]
    for reason in ("max-records-per-batch", 'format="csv"', "dead-letter file",
                   "timestamp column(s) ts"):
        assert reason in d.message, (reason, d.message)


def test_a_stateful_operator_is_refused_by_name() -> None:
    middle = """  <operator name="seen" type="deduplicate">
    <input name="hot"/>
    <param name="key" value="sensor"/>
    <param name="time" value="ts"/>
    <param name="watermark" value="1 minute"/>
    <output name="once"/>
  </operator>
"""
    text = spec(middle=middle, feed="once", sink=REAL_TIME,
                columns='    <column name="ts" type="timestamp"/>\n')
    with pytest.raises(SpecError) as e:
        compile_spec_text(text, "rt.xml", base_dir="/tmp")
    message = " ".join(d.message for d in e.value.diagnostics)
    assert "operator 'seen' (deduplicate) is not a filter or project" in message


def test_explain_gives_the_reasons_of_a_task_that_cannot() -> None:
    c = compile_spec_text(spec(delivery="exactly-once"), "rt.xml", base_dir="/tmp")
    text = explain(c)
    assert "mode   micro-batch; not real-time because:" in text
    assert "needs micro-batch transactions" in text


def test_queries_without_kafka_show_no_mode() -> None:
    text = """<dataflow name="g">
  <operator name="gen" type="generator">
    <param name="shape" value="sensor"/>
    <output name="raw"/>
  </operator>
  <operator name="out" type="console-sink"><input name="raw"/></operator>
</dataflow>
"""
    c = compile_spec_text(text, "g.xml", base_dir="/tmp")
    assert "mode   " not in explain(c)
