"""Control tuples, our own logic without Spark or processes: the catalogue the compiler builds,
the checks of a tuple, the scheduler's state machine (a request checked as a whole, sent to the
tasks it changes, acknowledged with epochs, undone when a task refuses, carried by relaunches),
the executor's state machine, the API's body parsing, the CLI's tuple files, source pacing
across a rate change. The run with real processes is tests/test_control_cluster.py."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import pytest

from common.control import Adjustable, ControlCatalog, ControlRefused
from common.paths import configured_roots
from compiler.control import check_tuple, check_tuples
from compiler.pipeline import compile_spec_text
from elastiq.control_cli import TupleSyntaxError, read_tuples
from executor import executor_state as ex
from executor import mesos_events
from executor.batch_gate import BatchGate, GateClosed, next_batch_id
from executor.sources import pacing_anchor, paced_offset, rebased_anchor, repair_pacing
from executor.task_runner import live_changes
from scheduler.api import ApiError, control_tuples
from scheduler.commands import ReplyToRequest, SendFrameworkMessage
from scheduler.events import ControlRequested, Event, OffersReceived, Tick
from scheduler.lifecycle import TaskState
from scheduler.mesos_adapter import unreachable_endpoints
from scheduler.mesos_json import message_event
from scheduler.state import SchedulerState, restore_query
from tests.test_failover_policy import start, warm_offer
from tests.test_pattern_tasks import compiled
from tests.test_scheduler_state import launched, of, update
from testkit.waiting import wait_for

# the scheduler compiles clients' specs inside its configured roots: this test's folder
pytestmark = pytest.mark.usefixtures("scheduler_path_roots")

SPEC = """<dataflow name="q">
  <operator name="src" type="generator">
    <param name="shape" value="sensor"/><param name="rate" value="100"/><output name="raw"/>
  </operator>
  <operator name="hot" type="filter">
    <input name="raw"/><param name="condition" value="raw.temp &gt; 30"/><output name="h"/>
  </operator>
  <operator name="avg" type="window-aggregate">
    <input name="h"/><param name="time" value="ts"/><param name="size" value="10 seconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="n" function="count"/><output name="a"/>
  </operator>
  <operator name="sink" type="file-sink"><input name="a"/><param name="path" value="out.jsonl"/>
  </operator>
</dataflow>"""


def query(tmp_path: Path):
    """The query as the scheduler compiles it: inside its configured roots."""
    return compile_spec_text(SPEC.encode(), str(tmp_path / "q.xml"), base_dir=tmp_path,
                             path_roots=configured_roots()).query


# --- the catalogue and the checks ---------------------------------------------------------------

def test_the_catalogue_lists_adjustable_and_fixed_parameters_with_their_places(tmp_path: Path
                                                                               ) -> None:
    catalog = query(tmp_path).controls
    found = {(a.operator, a.parameter): a for a in catalog.adjustable}
    assert set(found) == {("src", "rate"), ("hot", "condition"), ("sink", "path")}
    assert found["sink", "path"].value == str(tmp_path / "out.jsonl")  # as the task opens it
    assert [t.to_json() for t in found["hot", "condition"].targets] == [["q.t0", "hot",
                                                                          "condition"]]
    fixed = {(f.operator, f.parameter): f.reason for f in catalog.fixed}
    assert "corrupt" in fixed["avg", "size"] and "corrupt" in fixed["avg", "aggregate"]


@pytest.mark.parametrize("operator, parameter, value, words", [
    ("nope", "rate", "1", "has no operator 'nope' (operators: avg, hot, sink, src)"),
    ("hot", "colour", "red", "hot (filter) has no parameter 'colour' (adjustable: condition)"),
    ("avg", "size", "5 seconds", "avg.size cannot change while the query runs: its windows"),
    ("src", "seed", "3", "a new one would replay other data"),
    ("src", "rate", "fast", "'fast' is not a number"),
    ("src", "rate", "0", "below the minimum"),
    ("hot", "condition", "raw.temp >", "hot.condition = 'raw.temp >'"),
    ("hot", "condition", "raw.temp + 1", "must be boolean"),
    ("hot", "condition", "raw.nosuch > 1", "nosuch"),
    ("sink", "path", "relative.jsonl", "must be absolute"),
])
def test_bad_tuples_are_refused_with_what_to_fix(tmp_path: Path, operator: str, parameter: str,
                                                 value: str, words: str) -> None:
    with pytest.raises(ControlRefused) as refused:
        check_tuple(query(tmp_path).controls, "q", operator, parameter, value)
    assert words in str(refused.value)


@pytest.mark.parametrize("value", ["inf", "Infinity", "-inf", "nan", "NaN", "-5", "1e400",
                                   "1e12", "10000001"])
def test_a_rate_that_is_not_finite_or_out_of_bounds_is_refused_and_the_query_keeps_its_rate(
        tmp_path: Path, value: str) -> None:
    with pytest.raises(ControlRefused) as refused:
        check_tuple(query(tmp_path).controls, "q", "src", "rate", value)
    assert f"src.rate = {value!r}" in str(refused.value)
    assert any(words in str(refused.value) for words in
               ("too large; write a finite number", "is not a number", "below the minimum 0.001",
                "above the maximum 1000000"))
    s = running(tmp_path)
    out = s.handle(ControlRequested("c", "q", (("src", "rate", value),)))
    (reply,) = of(ReplyToRequest, out)
    assert (reply.accepted, reply.status) == (False, 400) and not of(SendFrameworkMessage, out)
    assert s.queries["q"].control.version == 0 and s.queries["q"].control.values == {}


def test_the_rate_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    catalog = query(tmp_path).controls
    assert check_tuple(catalog, "q", "src", "rate", "0.001").runtime_value == 0.001
    assert check_tuple(catalog, "q", "src", "rate", "1e6").runtime_value == 1_000_000.0


def test_a_condition_longer_than_the_bound_is_refused(tmp_path: Path) -> None:
    long_condition = " or ".join(["raw.temp > 30"] * 800)  # 13,597 characters
    with pytest.raises(ControlRefused, match="at most 10000 are taken") as refused:
        check_tuple(query(tmp_path).controls, "q", "hot", "condition", long_condition)
    assert len(str(refused.value)) < 400  # the value is shown shortened
    short = " or ".join(["raw.temp > 30"] * 20)
    assert check_tuple(query(tmp_path).controls, "q", "hot", "condition", short).text == short


def test_a_request_is_checked_as_a_whole_and_reports_every_problem(tmp_path: Path) -> None:
    catalog = query(tmp_path).controls
    change = check_tuple(catalog, "q", "hot", "condition", " raw.temp > 35 ")
    assert (change.text, change.runtime_value) == ("raw.temp > 35", "raw.temp > 35")
    with pytest.raises(ControlRefused) as refused:
        check_tuples(catalog, "q", [("src", "rate", "50"), ("hot", "condition", "x >"),
                                    ("src", "rate", "60"), ("nope", "a", "b")])
    assert len(refused.value.problems) == 3 and refused.value.status == 400
    assert "src.rate is set twice" in str(refused.value)


def test_hot_standby_replicas_and_stateful_partitions_keep_their_parameters() -> None:
    replicated = compiled("hot-sensors", {"hot": 'ha="hot-standby" replicas="2"'}).query.controls
    assert replicated.find("hot", "condition") is None
    assert any(f.operator == "hot" and "identical" in f.reason for f in replicated.fixed)
    partitioned = compiled("stock-ticks", {"big": 'parallelism="2"'}).query.controls
    condition = partitioned.find("big", "condition")
    assert condition is not None and len(condition.targets) == 2  # one per partition
    routing = partitioned.find("big", "partition-key")
    assert routing is not None and routing.targets[0].keyword == "key"
    keyed = compiled("sensor-join", {"matched": 'parallelism="2" partition-by="sensor"'})
    assert any(f.parameter == "partition-key" and "state" in f.reason
               for f in keyed.query.controls.fixed)


# --- the scheduler's state machine --------------------------------------------------------------

def running(tmp_path: Path) -> SchedulerState:
    s, _ = start(query(tmp_path), warm_offer("o1", "a1"))
    return s


def ack(task: str, request: str, applied: bool = True, epoch: int = 7,
        message: str = "") -> Event:
    body = {"kind": "control-ack", "task": task, "request": request, "version": 1,
            "applied": applied, "epoch": epoch, "pause_s": 0.4, "message": message, "at": 5.0}
    return message_event("f", "elastiq-exec-a1", "a1", json.dumps(body).encode())


def test_a_request_reaches_its_task_is_acknowledged_and_enters_the_history(tmp_path: Path
                                                                           ) -> None:
    s = running(tmp_path)
    out = s.handle(ControlRequested("c", "q", (("hot", "condition", "raw.temp > 35"),)))
    (reply,) = of(ReplyToRequest, out)
    assert (reply.accepted, reply.status) == (True, 202)
    request = reply.body["request"]
    (message,) = of(SendFrameworkMessage, out)
    sent = json.loads(message.data)
    assert sent == {"kind": "control", "task": "q.t0.a1", "request": request, "version": 1,
                    "params": {"hot": {"condition": "raw.temp > 35"}}}
    s.handle(ack("q.t0.a1", request))
    control = s.queries["q"].control
    assert control.requests[request].state == "applied"
    assert control.history[-1]["epochs"] == {"q.t0": 7}
    # a relaunch carries the parameters
    s.handle(Tick("t", 101.0))
    s.handle(update("q.t0.a1", "FAILED"))
    s.handle(Tick("t", 200.0))
    data = next(iter(launched(s.handle(OffersReceived("o", (warm_offer("o2", "a1"),))))
                     .values()))[1]
    assert data["control"] == {"version": 1, "params": {"hot": {"condition": "raw.temp > 35"}}}


def test_a_persisted_value_refused_by_todays_checks_is_dropped_when_the_query_is_restored(
        tmp_path: Path) -> None:
    compiled = query(tmp_path)
    placements = {"control": {
        "version": 2,
        "values": {"src": {"rate": "inf"}, "hot": {"condition": "raw.temp > 35"}},
        "task_params": {"q.t0": {"src": {"rate": float("inf")},
                                 "hot": {"condition": "raw.temp > 35"}}}}}
    stored = json.loads(json.dumps(placements))  # as ZooKeeper gives it back (Infinity)
    record = restore_query(compiled, None, stored, 10.0)
    assert record.control.values == {"hot": {"condition": "raw.temp > 35"}}
    assert record.control.task_params == {"q.t0": {"hot": {"condition": "raw.temp > 35"}}}
    assert record.control.version == 2


def test_a_refused_request_changes_nothing_and_a_task_refusal_undoes_it(tmp_path: Path) -> None:
    s = running(tmp_path)
    out = s.handle(ControlRequested("c", "q", (("hot", "condition", "raw.temp >"),)))
    (reply,) = of(ReplyToRequest, out)
    assert (reply.accepted, reply.status) == (False, 400) and not of(SendFrameworkMessage, out)
    assert s.queries["q"].control.version == 0
    assert s.handle(ControlRequested("c", "nope", (("a", "b", "c"),)))[0].status == 404
    out = s.handle(ControlRequested("c", "q", (("sink", "path", str(tmp_path / "x.jsonl")),)))
    request = of(ReplyToRequest, out)[0].body["request"]
    busy = s.handle(ControlRequested("c2", "q", (("src", "rate", "5"),)))
    assert busy[0].status == 409 and "still being applied" in busy[0].message
    s.handle(ack("q.t0.a1", request, applied=False, message="cannot open"))
    control = s.queries["q"].control
    assert control.requests[request].state == "refused"
    assert control.values == {} and control.task_params["q.t0"] == {}


def test_a_task_that_does_not_run_refuses_the_request(tmp_path: Path) -> None:
    s = running(tmp_path)
    s.handle(Tick("t", 101.0))
    s.handle(update("q.t0.a1", "FAILED"))
    assert s.queries["q"].tasks["q.t0"].state is not TaskState.RUNNING
    (reply,) = s.handle(ControlRequested("c", "q", (("src", "rate", "5"),)))
    assert reply.status == 409 and "try again when it runs" in reply.message


# --- the executor's state machine ---------------------------------------------------------------

def executor_with_running_task() -> ex.ExecutorState:
    state = ex.ExecutorState()
    state.handle(ex.Registered("r", "e", "a1"))
    launch = ex.TaskLaunch("q.t0.a1", "q.t0", "q", "spark", "def build(rt): pass", {}, 1)
    state.handle(ex.TaskLaunched("l", launch))
    state.handle(ex.RunnerStatusChanged("p", "q.t0.a1", "running"))
    return state


def message(body: dict) -> ex.Event:
    return mesos_events.message_event("m", base64.b64encode(json.dumps(body).encode()))


def test_the_executor_applies_a_control_message_once_and_acknowledges_it() -> None:
    state = executor_with_running_task()
    body = {"kind": "control", "task": "q.t0.a1", "request": "r1", "version": 2,
            "params": {"hot": {"condition": "raw.temp > 1"}}}
    (apply,) = state.handle(message(body))
    assert apply == ex.ApplyParams("m", "q.t0.a1", "r1", 2, {"hot": {"condition": "raw.temp > 1"}})
    assert state.handle(message(body)) == []  # the same version again
    (sent,) = state.handle(ex.ParamsApplied("a", "q.t0.a1", "r1", 2, 9, 0.3, 5.0))
    assert json.loads(mesos_events.ack_bytes(sent))["epoch"] == 9
    (refusal,) = state.handle(message({**body, "task": "q.t9.a1", "version": 3}))
    assert isinstance(refusal, ex.SendControlAck) and not refusal.applied
    assert state.handle(message({**body, "version": 0})) == []  # unreadable: ignored


# --- the batch gate and where the next batch starts ---------------------------------------------

def test_a_closed_gate_refuses_later_batches_and_epochs_follow_spark_logs(tmp_path: Path) -> None:
    gate, written = BatchGate(), []
    sink = gate.wrap(lambda df, batch: written.append(batch))
    sink(None, 4)
    assert gate.close(1.0) and gate.last_written == 4
    with pytest.raises(GateClosed):
        sink(None, 5)
    assert written == [4]
    spark = tmp_path / "spark"
    for folder, ids in (("offsets", (0, 1, 2)), ("commits", (0, 1))):
        (spark / folder).mkdir(parents=True)
        for i in ids:
            (spark / folder / str(i)).write_text("x")
    assert next_batch_id(str(spark)) == 2  # planned, not committed: it runs again
    (spark / "commits" / "2").write_text("x")
    assert next_batch_id(str(spark)) == 3
    assert next_batch_id(str(spark), last_written=4) == 5
    assert next_batch_id(str(tmp_path / "none")) == 0


def spark_logs(folder: Path, planned: range, committed: range) -> str:
    for name, ids in (("offsets", planned), ("commits", committed)):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in ids:
            (folder / name / str(i)).write_text("x")
    return str(folder)


def test_a_live_switch_waits_for_the_written_batch_to_commit_and_no_sink_call_meets_it(
        tmp_path: Path) -> None:
    import threading

    spark = spark_logs(tmp_path / "spark", range(4), range(3))  # batch 3 planned, not committed
    gate, events = BatchGate(), []
    sink = gate.wrap(lambda df, batch: events.append(f"write {batch}"))
    sink(None, 3)  # written; Spark commits it a moment later
    threading.Timer(0.2, lambda: (tmp_path / "spark" / "commits" / "3").write_text("x")).start()
    threading.Timer(0.1, lambda: sink(None, 4)).start()  # the next batch reaches its sink meanwhile
    result, epoch = gate.switch(lambda: events.append("switch") or "done", spark, timeout=5.0)
    assert (result, epoch) == ("done", 4)
    wait_for("the next batch's write", lambda: "write 4" in events, timeout=5.0, step=0.01)
    assert events == ["write 3", "switch", "write 4"]


def test_a_live_switch_that_cannot_wait_applies_nothing(tmp_path: Path) -> None:
    spark = spark_logs(tmp_path / "spark", range(2), range(1))
    gate, applied = BatchGate(), []
    gate.wrap(lambda df, batch: None)(None, 1)  # written, never committed
    with pytest.raises(TimeoutError, match="batch 1 was written but not committed"):
        gate.switch(lambda: applied.append(1), spark, timeout=0.1)
    with pytest.raises(TimeoutError):  # the query died: no commit is coming, do not wait
        gate.switch(lambda: applied.append(2), spark, timeout=60.0, alive=lambda: False)
    assert applied == []
    fresh = BatchGate()  # nothing written yet in this run: the next batch is the planned one
    assert fresh.switch(lambda: None, spark, timeout=0.1) == (None, 1)


def test_only_sink_destinations_and_routing_are_switched_live() -> None:
    live = {("sink", "path"): "/out/a.jsonl", ("split:p1+p2", "key"): ["sensor"]}
    assert live_changes({}, {"sink": {"path": "/out/b.jsonl"}}, live) == \
        {("sink", "path"): "/out/b.jsonl"}
    assert live_changes({"sink": {"path": "/out/b.jsonl"}}, {}, live) == \
        {("sink", "path"): "/out/a.jsonl"}  # withdrawn: back to the program's value
    assert live_changes({"sink": {"path": "/out/b.jsonl"}}, {"sink": {"path": "/out/b.jsonl"}},
                        live) == {}
    assert live_changes({}, {"keep": {"condition": "x > 1"}}, live) is None  # needs a rebuild
    assert live_changes({"keep": {"condition": "x > 1"}},
                        {"keep": {"condition": "x > 1"}, "split:p1+p2": {"key": ["zone"]}},
                        live) == {("split:p1+p2", "key"): ["zone"]}
    assert live_changes({}, {"split:p1+p2": {"key": ["sensor"]}}, live) == {}


# --- pacing across a rate change ----------------------------------------------------------------

def test_a_new_rate_continues_from_what_the_old_one_allowed(tmp_path: Path) -> None:
    assert rebased_anchor(100.0, 10.0, 40.0, 110.0, 0) == pytest.approx(107.5)
    assert rebased_anchor(0.0, None, 10.0, 50.0, 200) == pytest.approx(30.0)
    path = str(tmp_path / "pacing" / "src.anchor")
    anchor = pacing_anchor(path, 100.0, 10.0)
    assert paced_offset(anchor, 110.0, 10.0, 1 << 40, None) == 100
    anchor = pacing_anchor(path, 110.0, 40.0)  # the control tuple's rate, at 110 s
    assert paced_offset(anchor, 110.0, 40.0, 1 << 40, None) == 100  # no jump
    assert paced_offset(anchor, 111.0, 40.0, 1 << 40, None) == 140
    assert pacing_anchor(path, 500.0, 40.0) == anchor  # later restarts keep it
    legacy = tmp_path / "legacy.anchor"
    legacy.write_text("12.5")
    assert pacing_anchor(str(legacy), 99.0, 10.0) == 12.5


def test_a_non_finite_pace_is_never_stored_and_an_extreme_rebase_stays_finite(
        tmp_path: Path) -> None:
    path = str(tmp_path / "pacing" / "src.anchor")
    pacing_anchor(path, 100.0, 10.0)
    before = Path(path).read_text()
    for rate in (float("inf"), float("nan"), -1.0, 0.0):
        with pytest.raises(ValueError):
            pacing_anchor(path, 110.0, rate)
        assert Path(path).read_text() == before  # the state on disk is untouched
    # from the slowest rate to the fastest, 10^9 s later: finite, and no jump
    anchor = pacing_anchor(path, 100.0, 0.001)
    anchor = pacing_anchor(path, 1e9, 1e7)
    assert math.isfinite(anchor) and paced_offset(anchor, 1e9, 1e7, 1 << 62, None) == \
        pytest.approx((1e9 - 100.0) * 0.001, abs=1)
    assert paced_offset(-math.inf, 5.0, 10.0, 1000, None) == 1000  # bounded by what exists
    assert paced_offset(math.nan, 5.0, 10.0, 1000, None) == 0


@pytest.mark.parametrize("garbage", ["", "not json", "{\"anchor\": Infinity, \"rate\": 500}",
                                     "{\"anchor\": -Infinity, \"rate\": 500.0}",
                                     "{\"anchor\": 5.0, \"rate\": Infinity}",
                                     "{\"anchor\": 5.0, \"rate\": NaN}", "{\"rate\": 1}",
                                     "[1, 2]", "\u0000\u0001\xff", "1e999"])
def test_an_unreadable_pacing_state_is_replaced_where_spark_planned_and_said(
        tmp_path: Path, garbage: str) -> None:
    task = tmp_path / "task"
    offsets = task / "spark" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "3").write_text('v1\n{"batchWatermarkMs":0}\n{"index":900}\n')
    (offsets / "4").write_text('v1\n{"batchWatermarkMs":0}\n{"index":1200}\n')
    state = task / "pacing" / "src.anchor"
    state.parent.mkdir()
    state.write_bytes(garbage.encode("utf-8", errors="surrogatepass"))
    notice = repair_pacing(str(state), 1000.0, 100.0)
    assert notice is not None and "unreadable" in notice and "offset 1200" in notice
    anchor = pacing_anchor(str(state), 1000.0, 100.0)
    assert paced_offset(anchor, 1000.0, 100.0, 1 << 62, None) == 1200  # no replay, no stall
    assert paced_offset(anchor, 1001.0, 100.0, 1 << 62, None) == 1300
    assert repair_pacing(str(state), 1001.0, 100.0) is None  # readable now


def test_a_reader_that_meets_an_unreadable_state_recovers_it_itself(tmp_path: Path) -> None:
    state = tmp_path / "pacing" / "src.anchor"
    state.parent.mkdir()
    state.write_text('{"anchor": -Infinity, "rate": 500.0}')
    anchor = pacing_anchor(str(state), 50.0, 500.0)  # no Spark log yet: resumes at 0
    assert anchor == 50.0 and paced_offset(anchor, 51.0, 500.0, 1 << 62, None) == 500


# --- the API body, the CLI's files, probing endpoints -------------------------------------------

def test_the_api_reads_tuples_and_names_malformed_ones() -> None:
    body = {"tuples": [{"operator": "hot", "parameter": "condition", "value": "raw.temp > 1"}]}
    assert control_tuples(json.dumps(body).encode()) == [("hot", "condition", "raw.temp > 1")]
    with pytest.raises(ApiError) as bad:
        control_tuples(json.dumps({"tuples": [{"operator": "hot"}, ["x"]]}).encode())
    assert bad.value.message == ("tuple 1: needs text operator, parameter and value; tuple 2: "
                                 "needs text operator, parameter and value")
    with pytest.raises(ApiError):
        control_tuples(b"not json")


def test_a_tuple_file_keeps_the_rest_of_the_line_as_the_value() -> None:
    lines = ["# raise the bar", "", "hot condition raw.temp > 35 and raw.humidity < 60",
             "src  rate   50"]
    assert read_tuples(lines) == [("hot", "condition", "raw.temp > 35 and raw.humidity < 60"),
                                  ("src", "rate", "50")]
    with pytest.raises(TupleSyntaxError, match="f.txt:2: expected 'OPERATOR PARAMETER VALUE'"):
        read_tuples(["hot condition x", "lonely"], "f.txt")


def test_a_network_source_endpoint_nobody_listens_on_is_refused() -> None:
    import socket

    view = ControlCatalog((Adjustable("in", "network-source", "endpoint", "endpoint",
                                      "tcp://127.0.0.1:1", ()),))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        live = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        assert unreachable_endpoints(view, [("in", "endpoint", live)]) == []
    problems = unreachable_endpoints(view, [("in", "target-addr", live), ("x", "endpoint", live)])
    assert len(problems) == 1 and "nobody listens there" in problems[0]


def test_metrics_count_control_requests_by_outcome_once(tmp_path: Path) -> None:
    from scheduler.metrics import SchedulerMetrics

    metrics, s = SchedulerMetrics(), running(tmp_path)

    def sample(outcome: str) -> float | None:
        return metrics.registry.get_sample_value("elastiq_control_requests_total",
                                                 {"query": "q", "outcome": outcome})

    for command in s.handle(ControlRequested("c", "q", (("src", "rate", "x"),))):
        metrics.observe_command(command, s, 100.0)
    out = s.handle(ControlRequested("c", "q", (("src", "rate", "5"),)))
    s.handle(ack("q.t0.a1", of(ReplyToRequest, out)[0].body["request"]))
    metrics.observe_state(s, 100.0)
    metrics.observe_state(s, 101.0)
    assert (sample("refused"), sample("applied"), sample("undone")) == (1.0, 1.0, None)


def test_draining_waits_for_the_batch_in_flight_to_be_written_not_longer() -> None:
    import threading

    gate = BatchGate()
    sink = gate.wrap(lambda df, batch: None)
    in_flight = threading.Event()
    in_flight.set()
    threading.Timer(0.1, lambda: (sink(None, 3), in_flight.clear())).start()
    assert gate.drain(in_flight.is_set, timeout=5.0) and gate.last_written == 3
    assert gate.drain(lambda: True, timeout=0.05) is False  # a batch that never comes
    assert gate.drain(lambda: False, timeout=0.0)  # nothing in flight: at once


def test_a_new_leader_restores_the_parameters_in_force(tmp_path: Path) -> None:
    from scheduler.query_source import QuerySource, compile_source
    from scheduler.state import durable_placements, restore_query

    s = running(tmp_path)
    out = s.handle(ControlRequested("c", "q", (("hot", "condition", "raw.temp > 35"),)))
    s.handle(ack("q.t0.a1", of(ReplyToRequest, out)[0].body["request"]))
    record = s.queries["q"]
    saved = json.loads(json.dumps(durable_placements(record)))  # as ZooKeeper keeps it
    source = QuerySource.of(SPEC.encode(), str(tmp_path / "q.xml"), "q", str(tmp_path))
    restored = restore_query(compile_source(source), source, saved, 500.0)  # recompiled
    assert restored.control.version == 1
    assert restored.control.values == {"hot": {"condition": "raw.temp > 35"}}
    assert restored.control.params_of("q.t0")["params"] == {"hot": {"condition": "raw.temp > 35"}}
    assert restored.control.history[-1]["epochs"] == {"q.t0": 7}
    assert restored.query.controls == record.query.controls  # the catalogue is recompiled


def test_values_already_in_force_are_applied_without_touching_a_task(tmp_path: Path) -> None:
    s = running(tmp_path)
    out = s.handle(ControlRequested("c", "q", (("src", "rate", "100.0"),)))  # as it started
    (reply,) = out
    assert (reply.accepted, reply.status, reply.body["state"]) == (True, 200, "applied")
    assert s.queries["q"].control.version == 0
    out = s.handle(ControlRequested("c", "q", (("src", "rate", "50"), ("hot", "condition",
                                                                        "raw.temp > 30"))))
    (message,) = of(SendFrameworkMessage, out)  # only the rate changes
    assert json.loads(message.data)["params"] == {"src": {"rate": 50.0}}
    s.handle(ack("q.t0.a1", of(ReplyToRequest, out)[0].body["request"]))
    (again,) = s.handle(ControlRequested("c", "q", (("src", "rate", "50"),)))
    assert again.status == 200 and s.queries["q"].control.version == 1


def test_an_old_attempts_refusal_does_not_undo_what_its_relaunch_runs_with(tmp_path: Path
                                                                          ) -> None:
    s = running(tmp_path)
    out = s.handle(ControlRequested("c", "q", (("src", "rate", "5"),)))
    request = of(ReplyToRequest, out)[0].body["request"]
    s.handle(Tick("t", 101.0))
    s.handle(update("q.t0.a1", "FAILED"))
    s.handle(Tick("t", 200.0))
    (mid, (agent, data)), = launched(s.handle(OffersReceived("o", (warm_offer("o2", "a1"),))))\
        .items()
    assert data["control"]["params"] == {"src": {"rate": 5.0}}
    s.handle(ack("q.t0.a1", request, applied=False, message="task is not on this executor"))
    s.handle(update(mid, "RUNNING", agent))
    control = s.queries["q"].control
    assert control.requests[request].state == "applied"
    assert control.values == {"src": {"rate": "5"}}
