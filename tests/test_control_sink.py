"""The closed loop without Spark: a control-sink's parameters and generated call, how one
micro-batch becomes control requests (`executor.sinks.plan_control`), the sink's one request per
batch, its deduplication and its behaviour when the scheduler refuses or cannot be reached (a
fake client), and that what examples/closed-loop/monitor.xml emits is a tuple the scheduler
accepts for examples/closed-loop/monitored.xml."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from common.api_client import RequestRejected, SchedulerUnavailable
from common.control import ControlRefused
from common.operator_schemas import control_schema_problems
from common.types import Schema
from compiler import expr
from compiler.control import check_tuples
from compiler.operators import CATALOGUE, ParamValueError, parse_url
from compiler.pipeline import compile_spec_file, compile_spec_text
from executor.sinks import ControlPlan, ControlSink, plan_control
from tests import expression_oracle as oracle
from tests.spec_snippets import SOURCE, dataflow

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "examples" / "closed-loop"


def row(query: str | None, operator: str | None, parameter: str | None,
        value: str | None) -> dict[str, Any]:
    return {"query": query, "operator": operator, "parameter": parameter, "value": value}


class FakeClient:
    """Records every control request; answers from a script of outcomes (an exception to raise,
    or None for an accepted request), accepting once the script is used up."""

    def __init__(self, *outcomes: Exception | None) -> None:
        self.outcomes = list(outcomes)
        self.requests: list[tuple[str, list[tuple[str, str, str]]]] = []

    def control(self, query_id: str, tuples: list[tuple[str, str, str]]) -> dict[str, Any]:
        self.requests.append((query_id, list(tuples)))
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome
        return {"request": f"{query_id}-c{len(self.requests)}", "version": len(self.requests)}


HOT35 = row("monitored", "hot", "condition", "raw.temp > 35")
HOT30 = row("monitored", "hot", "condition", "raw.temp > 30")


# --- the operator and its parameters ------------------------------------------------------------

def test_control_sink_is_a_sink_with_one_input_and_an_optional_scheduler() -> None:
    d = CATALOGUE["control-sink"]
    assert d.role == "sink" and d.inputs == (1, 1) and d.outputs == (0, 0) and not d.stateful
    assert d.param_names == ("scheduler", "weight")  # weight: every sink's worth to the load shedder (docs/load.md)
    scheduler = d.param("scheduler")
    assert scheduler is not None and not scheduler.required and scheduler.default is None


@pytest.mark.parametrize("text, expected", [
    ("http://127.0.0.1:8088", "http://127.0.0.1:8088"),
    (" http://scheduler.local:9000/ ", "http://scheduler.local:9000"),
    ("http://[::1]:8088", "http://[::1]:8088"),
    ("http://sched", "http://sched"),
])
def test_scheduler_urls_that_are_accepted(text: str, expected: str) -> None:
    assert parse_url(text) == expected


@pytest.mark.parametrize("text", ["https://127.0.0.1:8088", "http://127.0.0.1:8088/queries",
                                  "http://user:pw@host:1", "tcp://127.0.0.1:8088",
                                  "http://127.0.0.1:0", "http://127.0.0.1:70000", "127.0.0.1:8088",
                                  "http://h:1/'); import os #"])
def test_scheduler_urls_that_are_refused(text: str) -> None:
    with pytest.raises(ParamValueError, match="not an API address"):
        parse_url(text)


def test_a_control_stream_is_exactly_four_string_columns_in_any_order() -> None:
    assert control_schema_problems(Schema.of(("value", "string"), ("query", "string"),
                                             ("parameter", "string"),
                                             ("operator", "string"))) == []
    assert control_schema_problems(Schema.of(("query", "string"), ("operator", "int"),
                                             ("value", "string"), ("at", "timestamp"))) == [
        "no column parameter", "operator is int, not string", "other columns at"]


def test_the_generated_call_names_the_scheduler_or_leaves_it_to_the_executor(
        tmp_path: Path) -> None:
    text = (LOOP / "monitor.xml").read_text()
    default = compile_spec_text(text.encode(), "monitor.xml", base_dir=tmp_path).query
    assert "rt.control_sink(op='ctl', input='control', scheduler=None)" in \
        default.tasks[0].program
    given = text.replace('<input name="control"/>', '<input name="control"/>\n'
                         '    <param name="scheduler" value="http://10.0.0.5:8088/"/>')
    named = compile_spec_text(given.encode(), "monitor.xml", base_dir=tmp_path).query
    assert "rt.control_sink(op='ctl', input='control', scheduler='http://10.0.0.5:8088')" in \
        named.tasks[0].program


def test_a_control_sink_can_read_a_project_of_literals() -> None:
    fields = "".join(f'    <field name="{n}" value="{v}"/>\n' for n, v in (
        ("query", "'q'"), ("operator", "'f'"), ("parameter", "'condition'"),
        ("value", "concat('raw.temp &gt; ', to_string(round(temp)))")))
    xml = dataflow(SOURCE + '  <operator name="p" type="project">\n    <input name="raw"/>\n'
                   + fields + '    <output name="t"/>\n  </operator>\n'
                   '  <operator name="ctl" type="control-sink">\n    <input name="t"/>\n'
                   '  </operator>\n')
    query = compile_spec_text(xml.encode(), "ok.xml").query
    assert [t.operators for t in query.tasks] == [("src", "p", "ctl")]


# --- one batch -> requests (pure) ---------------------------------------------------------------

def test_a_batch_becomes_one_request_per_query_with_equal_rows_once() -> None:
    plan = plan_control([HOT35, row("other", "src", "rate", "50"), HOT35,
                         row("monitored", "src", "rate", "100")])
    assert plan == ControlPlan((
        ("monitored", (("hot", "condition", "raw.temp > 35"), ("src", "rate", "100"))),
        ("other", (("src", "rate", "50"),))))


def test_rows_with_a_null_are_no_tuples() -> None:
    plan = plan_control([row("monitored", "hot", "condition", None), HOT30,
                         row(None, "hot", "condition", "true")])
    assert plan.requests == (("monitored", (("hot", "condition", "raw.temp > 30"),)),)
    assert plan.dropped == ("2 row(s) with a null column (no tuple)",)


def test_a_batch_setting_one_parameter_twice_sends_nothing_to_that_query() -> None:
    plan = plan_control([HOT35, HOT30, row("monitored", "src", "rate", "10"),
                         row("other", "src", "rate", "50")])
    assert plan.requests == (("other", (("src", "rate", "50"),)),)
    assert len(plan.dropped) == 1 and "hot.condition = raw.temp > 30 | raw.temp > 35" in \
        plan.dropped[0] and "monitored" in plan.dropped[0]


def test_an_empty_batch_asks_for_nothing() -> None:
    assert plan_control([]) == ControlPlan(())


# --- the sink with a fake client ------------------------------------------------------------------

def test_each_batch_is_one_request_and_a_repeated_verdict_is_not_sent_again() -> None:
    client = FakeClient()
    sink = ControlSink("monitor.t0", client)
    sink.send(0, [HOT35])
    sink.send(1, [HOT35, HOT35])  # two windows in one batch, same verdict
    sink.send(2, [])
    sink.send(3, [HOT35])
    assert client.requests == [("monitored", [("hot", "condition", "raw.temp > 35")])]
    sink.send(4, [HOT30])
    sink.send(5, [HOT35])
    assert [t[0][2] for _, t in client.requests] == ["raw.temp > 35", "raw.temp > 30",
                                                     "raw.temp > 35"]
    assert (sink.sent, sink.unchanged, sink.rows_out) == (3, 2, 3)


def test_a_batch_with_more_tuples_than_the_last_is_sent_whole() -> None:
    client = FakeClient()
    sink = ControlSink("t", client)
    sink.send(0, [HOT35])
    sink.send(1, [HOT35, row("monitored", "src", "rate", "100")])
    assert client.requests[1] == ("monitored", [("hot", "condition", "raw.temp > 35"),
                                                ("src", "rate", "100")])


def test_a_refused_request_is_logged_not_retried_and_sent_again_by_the_next_batch(
        caplog: pytest.LogCaptureFixture) -> None:
    busy = RequestRejected(409, "control of monitored refused: request x is still being applied",
                           [])
    client = FakeClient(busy)
    sink = ControlSink("monitor.t0", client)
    with caplog.at_level(logging.WARNING, logger="executor.sinks"):
        sink.send(0, [HOT35])
    assert len(client.requests) == 1 and sink.refused == 1 and sink.last_sent == {}
    assert "monitored refused" in caplog.text and "still being applied" in caplog.text
    sink.send(1, [HOT35])  # the same verdict: not a repeat of anything accepted, so sent
    sink.send(2, [HOT35])
    assert len(client.requests) == 2 and sink.sent == 1


def test_an_unreachable_scheduler_drops_the_batch_and_the_sink_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClient(SchedulerUnavailable("no scheduler at http://fake:1"))
    sink = ControlSink("monitor.t0", client)
    with caplog.at_level(logging.WARNING, logger="executor.sinks"):
        sink.send(0, [HOT35])
    assert sink.unreachable == 1 and "dropped" in caplog.text
    sink.send(1, [HOT35])
    assert len(client.requests) == 2 and sink.last_sent == {
        "monitored": (("hot", "condition", "raw.temp > 35"),)}


def test_queries_are_deduplicated_separately() -> None:
    client = FakeClient()
    sink = ControlSink("t", client)
    other = row("other", "f", "condition", "true")
    sink.send(0, [HOT35, other])
    sink.send(1, [HOT35, row("other", "f", "condition", "false")])
    assert [q for q, _ in client.requests] == ["monitored", "other", "other"]


def test_other_errors_are_not_swallowed() -> None:
    sink = ControlSink("t", FakeClient(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        sink.send(0, [HOT35])


# --- the example: what monitor emits is what monitored accepts ------------------------------------

@pytest.mark.parametrize("count, threshold", [(133, "35"), (101, "35"), (100, "30"), (0, "30")])
def test_the_monitor_example_emits_tuples_the_monitored_example_accepts(
        count: int, threshold: str) -> None:
    monitor = compile_spec_file(LOOP / "monitor.xml", base_dir="/srv/elastiq")
    monitored = compile_spec_file(LOOP / "monitored.xml", base_dir="/srv/elastiq")
    project = monitor.logical.node("tuples")
    scope = expr.Scope({"counts": monitor.logical.stream("counts").schema})
    window = {"counts": {"window_start": None, "window_end": None, "n": count}}
    emitted = {name: oracle.evaluate(expr.parse(text), window, scope)
               for name, text in project.param("fields")}
    assert emitted == {"query": "monitored", "operator": "hot", "parameter": "condition",
                       "value": f"raw.temp > {threshold}"}
    assert monitored.query.query_id == emitted["query"]
    (change,) = check_tuples(monitored.query.controls, "monitored",
                             [(emitted["operator"], emitted["parameter"], emitted["value"])])
    assert change.runtime_value == f"raw.temp > {threshold}"
    with pytest.raises(ControlRefused):  # and the scheduler would refuse it for the monitor
        check_tuples(monitor.query.controls, "monitor",
                     [(emitted["operator"], emitted["parameter"], emitted["value"])])
