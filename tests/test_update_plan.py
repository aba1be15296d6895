"""Updating a running query in place (docs/queries.md, "Updating a running query"): the pure
plan diff over real compiled specs, task ids kept across an update, every refusal located at
file:line:column, and the scheduler's pure core applying an update (kept tasks keep their
attempt, changed ones are relaunched in place, added and removed ones started and stopped,
a bad update touches nothing). No Spark, no sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common.messages import ReadersMessage
from common.tasks import CompiledQuery
from compiler.pipeline import compile_spec_text
from compiler.tasks import task_ids
from scheduler import update_plan
from scheduler.api import ApiError, Call, route
from scheduler.commands import KillTask, LaunchTasks, ReplyToRequest, SendFrameworkMessage
from scheduler.config import SchedulerConfig
from scheduler.events import (OffersReceived, QuerySubmitted, QueryUpdateRequested, Registered,
                              StatusUpdated, Tick)
from scheduler.loop import Reply
from scheduler.query_source import QuerySource
from scheduler.state import SchedulerState
from scheduler.testing import offer
from tests.spec_snippets import READING_TYPE, locate


def spec(condition: str = "counts.readings &gt; 5", size: str = "10 seconds",
         watermark: str = "2 seconds", extra: str = "", name: str = "pipe",
         weight: str = "1") -> str:
    """generator -> keyed window -> (file sink of every window, filter -> file sink): the
    window's stream has two readers, so the window, its sink and the filter are three tasks."""
    return f"""<dataflow name="{name}">
{READING_TYPE}  <operator name="src" type="generator">
    <param name="shape" value="sensor"/>
    <output name="raw" type="reading"/>
  </operator>
  <operator name="win" type="window-aggregate">
    <input name="raw"/>
    <param name="time" value="ts"/>
    <param name="size" value="{size}"/>
    <param name="watermark" value="{watermark}"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="readings" function="count"/>
    <output name="counts"/>
  </operator>
  <operator name="windows" type="file-sink">
    <input name="counts"/>
    <param name="path" value="windows.jsonl"/>
  </operator>
  <operator name="big" type="filter">
    <input name="counts"/>
    <param name="condition" value="{condition}"/>
    <output name="bigCounts"/>
  </operator>
  <operator name="out" type="file-sink">
    <input name="bigCounts"/>
    <param name="path" value="out.jsonl"/>
    <param name="weight" value="{weight}"/>
  </operator>
{extra}</dataflow>
"""


# a second, stateful task that serves no channel: a window over the windows, with its sink
AGAIN = """  <operator name="again" type="window-aggregate">
    <input name="counts"/>
    <param name="time" value="window_end"/>
    <param name="size" value="{size}"/>
    <param name="watermark" value="2 seconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="windows" function="count"/>
    <output name="perSensor"/>
  </operator>
  <operator name="againOut" type="file-sink">
    <input name="perSensor"/>
    <param name="path" value="again.jsonl"/>
    <param name="weight" value="{weight}"/>
  </operator>
"""

EXTRA_SINK = """  <operator name="also" type="file-sink">
    <input name="counts"/>
    <param name="path" value="also.jsonl"/>
  </operator>
"""


def compiled(text: str, old: CompiledQuery | None = None, retired: tuple[str, ...] = (),
             unpin: set[str] | None = None) -> CompiledQuery:
    """`text` compiled as query pipe, the task ids of `old` pinned but those of the roots in
    `unpin`, which retire (as the API does)."""
    pins = {r: t for r, t in update_plan.pins(old).items() if r not in (unpin or set())} \
        if old is not None else None
    if old is not None:
        retired = (*retired, *(t for r, t in update_plan.pins(old).items() if r in (unpin or ())))
    return compile_spec_text(text, "p.xml", base_dir="/tmp", query_id="pipe", task_ids=pins,
                             retired=retired).query


def by_id(diff: update_plan.PlanDiff) -> dict[str, update_plan.TaskDiff]:
    return {t.task_id: t for t in diff.tasks}


# --- task ids --------------------------------------------------------------------------------------

def test_task_ids_keep_pins_and_never_give_a_held_or_retired_id_again() -> None:
    assert task_ids("q", ["a", "b", "c"]) == ["q.t0", "q.t1", "q.t2"]
    # b was q.t0 and a removed task held q.t1: the unpinned roots take numbers nobody holds
    assert task_ids("q", ["a", "b", "c"], {"b": "q.t0", "gone": "q.t2"}, ("q.t1",)) == \
        ["q.t3", "q.t0", "q.t4"]


def test_an_update_compiled_with_pins_keeps_the_running_tasks_ids() -> None:
    old = compiled(spec())
    # a new operator before the others in dataflow order would renumber them without pins
    new = compiled(spec(extra=EXTRA_SINK), old)
    assert {t.operators[-1]: t.task_id for t in new.tasks} == \
        {"win": "pipe.t0", "windows": "pipe.t1", "out": "pipe.t2", "also": "pipe.t3"}


# --- the diff --------------------------------------------------------------------------------------

def test_the_same_spec_keeps_every_task() -> None:
    old = compiled(spec())
    diff = update_plan.diff_plans(old, compiled(spec(), old))
    assert [t.change for t in diff.tasks] == ["kept"] * 3 and diff.empty and not diff.dropped


def test_a_changed_predicate_is_a_live_change_of_the_filter_task_alone() -> None:
    old = compiled(spec())
    new = compiled(spec("counts.readings &gt; 2"), old)
    diff = update_plan.diff_plans(old, new)
    tasks = by_id(diff)
    assert (tasks["pipe.t0"].change, tasks["pipe.t1"].change) == ("kept", "kept")
    changed = tasks["pipe.t2"]
    assert (changed.change, changed.state) == ("changed", "none")
    assert changed.details == ("operator big (filter) changed",)
    assert changed.live == (("big", "condition", "counts.readings > 2"),)
    assert not diff.dropped and not update_plan.refusals(old, new, diff, False, {})
    assert "~ pipe.t2 [big, out]: changed live (keeps running; big.condition switched at a " \
        "micro-batch boundary)" in update_plan.render(diff)


def test_a_change_to_a_fixed_parameter_restarts_the_task() -> None:
    old = compiled(spec())
    diff = update_plan.diff_plans(old, compiled(spec("counts.readings &gt; 2", weight="2"), old))
    changed = by_id(diff)["pipe.t2"]
    assert (changed.change, changed.state, changed.live) == ("changed", "none", ())
    assert changed.details == ("operator big (filter) changed", "operator out (file-sink) changed")
    assert "~ pipe.t2 [big, out]: changed (stateless: restarted with its new program)" in \
        update_plan.render(diff)


def test_a_stateful_task_whose_stateful_operators_did_not_change_keeps_its_state() -> None:
    old = compiled(spec(extra=AGAIN.format(size="1 minute", weight="1")))
    new = compiled(spec(extra=AGAIN.format(size="1 minute", weight="3")), old)
    changed = by_id(update_plan.diff_plans(old, new))["pipe.t3"]
    assert (changed.change, changed.state, changed.live) == ("changed", "kept", ())


def test_a_changed_watermark_needs_a_new_checkpoint() -> None:
    old = compiled(spec())
    tasks = by_id(update_plan.diff_plans(old, compiled(spec(watermark="5 seconds"), old)))
    assert (tasks["pipe.t0"].change, tasks["pipe.t0"].state) == ("changed", "fresh")


def test_a_changed_window_drops_state_and_is_refused_at_the_operator_without_the_flag() -> None:
    old = compiled(spec())
    text = spec(size="20 seconds")
    new = compiled(text, old)
    diff = update_plan.diff_plans(old, new)
    assert by_id(diff)["pipe.t0"].state == "fresh"
    (problem,) = update_plan.refusals(old, new, diff, False, {})
    line, column = locate(text, '<operator name="win"')
    assert problem.startswith(f"p.xml:{line}:{column}: operator win (window-aggregate) "
                              "changes its key, window")
    assert "--drop-state" in problem
    assert not update_plan.refusals(old, new, diff, True, {})
    assert update_plan.fresh_roots(diff, new) == {"win"}


def test_with_drop_state_a_window_becomes_a_new_task_and_its_old_id_is_retired() -> None:
    old = compiled(spec(extra=AGAIN.format(size="1 minute", weight="1")))
    text = spec(extra=AGAIN.format(size="2 minutes", weight="1"))
    new = compiled(text, old, unpin={"againOut"})
    diff = update_plan.diff_plans(old, new)
    tasks = by_id(diff)
    assert tasks["pipe.t3"].change == "removed" and tasks["pipe.t4"].change == "added"
    assert tasks["pipe.t4"].operators == ("again", "againOut")
    assert [t.change for t in diff.tasks[:3]] == ["kept", "kept", "kept"]
    (dropped,) = diff.dropped  # the operator moved to another task: its state goes
    assert dropped.operator.name == "again" and "from task pipe.t3 to pipe.t4" in dropped.why
    line, column = locate(text, '<operator name="again"')
    (problem,) = update_plan.refusals(old, new, diff, False, {})
    assert problem.startswith(f"p.xml:{line}:{column}: operator again")
    assert not update_plan.refusals(old, new, diff, True, {})
    source = update_plan.updated_source(QuerySource("x", "p.xml", "pipe"), None, old, new)
    assert source.retired == ("pipe.t3",) and dict(source.task_ids)["againOut"] == "pipe.t4"


def test_a_replaced_task_whose_stream_running_tasks_read_is_refused_even_with_drop_state(
        ) -> None:
    old = compiled(spec())
    text = spec(size="20 seconds")
    new = compiled(text, old, unpin={"win"})
    diff = update_plan.diff_plans(old, new)
    assert by_id(diff)["pipe.t0"].change == "removed" and by_id(diff)["pipe.t3"].change == "added"
    (problem,) = update_plan.refusals(old, new, diff, True, {})
    line, column = locate(text, '<operator name="win"')
    assert problem.startswith(f"p.xml:{line}:{column}: task pipe.t3 (root win) would serve "
                              "pipe/counts anew to pipe.t1, pipe.t2")


def test_a_new_reader_of_a_kept_producer_is_added_and_the_producer_admits_it() -> None:
    old = compiled(spec())
    diff = update_plan.diff_plans(old, compiled(spec(extra=EXTRA_SINK), old))
    tasks = by_id(diff)
    assert tasks["pipe.t3"].change == "added"
    assert tasks["pipe.t0"].change == "kept"
    assert tasks["pipe.t0"].readers_added == (("pipe/counts", "pipe.t3"),)
    back = update_plan.diff_plans(compiled(spec(extra=EXTRA_SINK), old), compiled(spec(), old))
    assert by_id(back)["pipe.t3"].change == "removed"
    assert by_id(back)["pipe.t0"].readers_dropped == (("pipe/counts", "pipe.t3"),)


def test_a_published_stream_that_is_read_may_not_change_its_type() -> None:
    from scheduler.state import QueryRecord
    from scheduler.lifecycle import TaskRecord

    published = spec().replace('<output name="bigCounts"/>',
                               '<output name="bigCounts" publish="true"/>')
    old = compiled(published)
    reader = compile_spec_text(f"""<dataflow name="reader">
  <type name="c">
    <column name="window_start" type="timestamp"/>
    <column name="window_end" type="timestamp"/>
    <column name="sensor" type="string"/>
    <column name="readings" type="int"/>
  </type>
  <operator name="in" type="stream-source">
    <param name="stream" value="pipe/bigCounts"/>
    <output name="x" type="c"/>
  </operator>
  <operator name="s" type="file-sink">
    <input name="x"/>
    <param name="path" value="r.jsonl"/>
  </operator>
</dataflow>
""", "r.xml", base_dir="/tmp").query
    queries = {q.query_id: QueryRecord(q, {t.task_id: TaskRecord(t) for t in q.tasks})
               for q in (old, reader)}
    # the filter now reads the raw readings: the type of the stream it publishes changes
    text = published.replace('<input name="counts"/>\n    <param name="condition" '
                             'value="counts.readings &gt; 5"/>',
                             '<input name="raw"/>\n    <param name="condition" '
                             'value="raw.temp &gt; 5"/>')
    assert text != published
    new = compiled(text, old)
    diff = update_plan.diff_plans(old, new)
    problems = update_plan.refusals(old, new, diff, False, queries)
    line, column = locate(text, '<operator name="big"')
    assert [p for p in problems if p.startswith(f"p.xml:{line}:{column}: stream "
                                                "pipe/bigCounts is read by reader as")]


# --- the scheduler's pure core ---------------------------------------------------------------------

def keys_for(query: CompiledQuery) -> dict[str, dict[str, str]]:
    return {t.task_id: {"public": f"pub-{t.task_id}", "secret": f"sec-{t.task_id}"}
            for t in query.tasks}


def reply_of(out: list[Any]) -> ReplyToRequest:
    (reply,) = [c for c in out if isinstance(c, ReplyToRequest)]
    return reply


@pytest.fixture
def running() -> tuple[SchedulerState, CompiledQuery]:
    """The pipe query submitted, launched on agent a1 and running (every task attempt 1)."""
    s = SchedulerState(SchedulerConfig())
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    query = compiled(spec())
    assert reply_of(s.handle(QuerySubmitted("s", query, None, keys_for(query)))).accepted
    out = s.handle(OffersReceived("o1", (offer("o1", "a1", cpus=8, mem_mb=16384),)))
    assert len([t for c in out if isinstance(c, LaunchTasks) for t in c.tasks]) == 3
    for t in query.tasks:
        s.handle(StatusUpdated("u", f"{t.task_id}.a1", "RUNNING", "", "", "a1",
                               "elastiq-exec-a1", "SOURCE_EXECUTOR"))
    return s, query


def update(s: SchedulerState, new: CompiledQuery, **flags: bool) -> list[Any]:
    return s.handle(QueryUpdateRequested("up", new, None, keys_for(new), **flags))


def test_a_changed_predicate_switches_live_by_control_without_a_restart(
        running: tuple[SchedulerState, CompiledQuery]) -> None:
    from common.messages import ControlMessage

    s, old = running
    new = compiled(spec("counts.readings &gt; 2"), old)
    out = update(s, new)
    reply = reply_of(out)
    assert reply.accepted and reply.body is not None
    assert reply.body["attempts"] == {"pipe.t2": 1} and reply.body["live"] == {"pipe.t2": "pipe-up"}
    assert not [c for c in out if isinstance(c, KillTask)]
    (sent,) = [c.message for c in out if isinstance(c, SendFrameworkMessage)]
    assert isinstance(sent, ControlMessage) and sent.task == "pipe.t2.a1"
    assert "counts.readings > 2" in json.dumps(sent.params)
    assert ("big", "condition", "counts.readings > 2") in \
        s.queries["pipe"].control.requests["pipe-up"].tuples
    assert s.queries["pipe"].query is new
    # a later update's relaunch runs the new spec's condition, not the value control set
    out = update(s, compiled(spec("counts.readings &gt; 7", weight="2"), new))
    assert reply_of(out).accepted
    assert s.queries["pipe"].control.param_set("pipe.t2").params == {}


def test_an_update_keeps_the_window_task_and_relaunches_the_filter_in_place(
        running: tuple[SchedulerState, CompiledQuery]) -> None:
    s, old = running
    new = compiled(spec("counts.readings &gt; 2", weight="2"), old)
    out = update(s, new)
    reply = reply_of(out)
    assert reply.accepted and reply.status == 200
    assert reply.body is not None and reply.body["attempts"] == {"pipe.t2": 2}
    assert [c.mesos_task_id for c in out if isinstance(c, KillTask)] == ["pipe.t2.a1"]
    record = s.queries["pipe"]
    assert record.query is new and record.tasks["pipe.t2"].task.program == new.tasks[2].program
    # the killed attempt ends; the new program is relaunched at once on the same agent
    s.handle(StatusUpdated("k", "pipe.t2.a1", "KILLED", "", "", "a1", "elastiq-exec-a1",
                           "SOURCE_EXECUTOR"))
    out = s.handle(OffersReceived("o2", (offer("o2", "a1", cpus=8, mem_mb=16384),)))
    (launch,) = [t for c in out if isinstance(c, LaunchTasks) for t in c.tasks]
    assert launch.mesos_task_id == "pipe.t2.a2"
    assert json.loads(launch.data)["task"]["program"] == new.tasks[2].program
    assert record.tasks["pipe.t0"].attempt == 1 and record.tasks["pipe.t0"].state.value == \
        "running"
    assert record.tasks["pipe.t2"].failures == 0 and not record.tasks["pipe.t2"].last_failure


def test_a_dry_run_answers_the_diff_and_changes_nothing(
        running: tuple[SchedulerState, CompiledQuery]) -> None:
    s, old = running
    out = update(s, compiled(spec("counts.readings &gt; 2", weight="2"), old), dry_run=True)
    reply = reply_of(out)
    assert reply.accepted and reply.body is not None and "dry run" in reply.message
    assert any(line.startswith("~ pipe.t2") for line in reply.body["diff"]["lines"])
    assert out == [reply] and s.queries["pipe"].query is old


def test_an_update_that_drops_state_is_refused_whole_and_touches_nothing(
        running: tuple[SchedulerState, CompiledQuery]) -> None:
    s, old = running
    text = spec("counts.readings &gt; 2", size="20 seconds")
    out = update(s, compiled(text, old, unpin={"win"}))
    reply = reply_of(out)
    line, column = locate(text, '<operator name="win"')
    assert (reply.accepted, reply.status) == (False, 409) and out == [reply]
    assert reply.message.startswith(f"p.xml:{line}:{column}: operator win")
    assert s.queries["pipe"].query is old
    assert [t.attempt for t in s.queries["pipe"].tasks.values()] == [1, 1, 1]


def test_with_drop_state_the_old_task_is_killed_and_its_replacement_placed() -> None:
    s = SchedulerState(SchedulerConfig())
    s.handle(Registered("r", "fw-1", "127.0.0.1:5050"))
    old = compiled(spec(extra=AGAIN.format(size="1 minute", weight="1")))
    assert reply_of(s.handle(QuerySubmitted("s", old, None, keys_for(old)))).accepted
    s.handle(OffersReceived("o1", (offer("o1", "a1", cpus=8, mem_mb=16384),)))
    for t in old.tasks:
        s.handle(StatusUpdated("u", f"{t.task_id}.a1", "RUNNING", "", "", "a1",
                               "elastiq-exec-a1", "SOURCE_EXECUTOR"))
    new = compiled(spec(extra=AGAIN.format(size="2 minutes", weight="1")), old, unpin={"againOut"})
    assert reply_of(update(s, new)).status == 409
    out = update(s, new, drop_state=True)
    assert reply_of(out).accepted
    assert [c.mesos_task_id for c in out if isinstance(c, KillTask)] == ["pipe.t3.a1"]
    tasks = s.queries["pipe"].tasks
    assert "pipe.t3" not in tasks and tasks["pipe.t4"].state.value == "pending"
    assert s.queries["pipe"].keys["pipe.t4"]["public"] == "pub-pipe.t4"
    assert "pipe.t3" not in s.queries["pipe"].keys
    out = s.handle(OffersReceived("o2", (offer("o2", "a1", cpus=8, mem_mb=16384),)))
    assert [t.task_id for c in out if isinstance(c, LaunchTasks) for t in c.tasks] == ["pipe.t4"]
    # its old attempt's end is of a task the query no longer has: ignored
    assert s.handle(StatusUpdated("k", "pipe.t3.a1", "KILLED", "", "", "a1", "elastiq-exec-a1",
                                  "SOURCE_EXECUTOR")) == []


def test_a_kept_producer_admits_an_added_reader(
        running: tuple[SchedulerState, CompiledQuery]) -> None:
    s, old = running
    out = update(s, compiled(spec(extra=EXTRA_SINK), old))
    assert reply_of(out).accepted
    (sent,) = [c for c in out if isinstance(c, SendFrameworkMessage)]
    assert isinstance(sent.message, ReadersMessage)
    assert (sent.message.task, sent.message.channel, sent.message.add, sent.message.drop) == \
        ("pipe.t0.a1", "pipe/counts", (("pipe.t3/read:pipe/counts", "pub-pipe.t3"),), ())
    assert not [c for c in out if isinstance(c, KillTask)]
    assert "pipe.t3" in s.queries["pipe"].keys


def test_an_unknown_or_stopping_query_is_refused(
        running: tuple[SchedulerState, CompiledQuery]) -> None:
    s, old = running
    other = compile_spec_text(spec(name="other"), "o.xml", base_dir="/tmp").query
    assert (reply_of(update(s, other)).status, reply_of(update(s, other)).message) == \
        (404, "no query other")
    s.queries["pipe"].phase = "stopping"
    assert reply_of(update(s, compiled(spec(), old))).status == 409
    s.handle(Tick("t", 1.0))


def test_the_api_prints_the_diff_of_a_refusal_and_compiles_with_the_running_ids() -> None:
    old = compiled(spec())
    seen: list[QuerySource] = []

    class Service:
        def running_plan(self, query_id: str) -> Any:
            return (old, None) if query_id == "pipe" else None

        def update(self, query: CompiledQuery, source: Any = None, **flags: Any) -> Reply:
            diff = update_plan.diff_plans(old, query)
            return Reply(False, 409, "p.xml:1:1: no", {"diff": diff.to_json(),
                                                       "problems": ["p.xml:1:1: no"]})

    def compile(source: QuerySource) -> CompiledQuery:
        seen.append(source)
        return compile_spec_text(source.spec_bytes(), "p.xml", base_dir="/tmp",
                                 query_id=source.query_id, task_ids=dict(source.task_ids)).query

    call = Call("POST", "/queries/pipe/update", ("queries", "pipe", "update"), {},
                {"Content-Type": "application/xml"}, spec(extra=EXTRA_SINK).encode())
    with pytest.raises(ApiError) as refused:
        route(Service(), call, compile)  # type: ignore[arg-type]
    assert refused.value.status == 409
    assert any(line.startswith("+ pipe.t3") for line in refused.value.body()["diff"]["lines"])
    assert dict(seen[0].task_ids) == {"win": "pipe.t0", "windows": "pipe.t1", "out": "pipe.t2"}
    missing = Call("POST", "/queries/nope/update", ("queries", "nope", "update"), {},
                   {"Content-Type": "application/xml"}, b"<dataflow/>")
    with pytest.raises(ApiError) as unknown:
        route(Service(), missing, compile)  # type: ignore[arg-type]
    assert unknown.value.status == 404


def test_a_source_with_pins_round_trips_and_bad_pins_are_refused() -> None:
    from scheduler.query_source import BadSource

    source = QuerySource("<x/>", "p.xml", "pipe", None, None, (("win", "pipe.t3"),),
                         ("pipe.t0",))
    assert QuerySource.from_json(source.to_json()) == source
    assert "task_ids" not in QuerySource("<x/>", "p.xml", "pipe").to_json()
    raw = json.loads(source.to_json())
    raw["task_ids"] = [["win"]]
    with pytest.raises(BadSource, match="task_ids must be"):
        QuerySource.from_json(json.dumps(raw))


def test_a_persisted_updated_source_recompiles_to_the_same_tasks(tmp_path: Any) -> None:
    from common.paths import PathRoots
    from scheduler.query_source import compile_source

    old = compiled(spec(extra=AGAIN.format(size="1 minute", weight="1")))
    text = spec(extra=AGAIN.format(size="2 minutes", weight="1"))
    new = compiled(text, old, unpin={"againOut"})
    source = update_plan.updated_source(QuerySource(text, "p.xml", "pipe", "/tmp"), None,
                                        old, new)
    again = compile_source(QuerySource.from_json(source.to_json()), PathRoots.of(["/tmp"]))
    assert [(t.task_id, t.operators) for t in again.tasks] == \
        [(t.task_id, t.operators) for t in new.tasks]


def test_elastiq_update_prints_the_diff_before_a_refusal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Any) -> None:
    import argparse

    from common.api_client import RequestRejected
    from elastiq import service_cli

    class Client:
        def update_spec(self, query_id: str, path: Any, **flags: bool) -> dict[str, Any]:
            raise RequestRejected(409, "p.xml:9:3: operator win ...", [
                {"message": "p.xml:9:3: operator win ..."}],
                {"diff": {"lines": ["~ pipe.t0 [src, win]: changed"]}})

    monkeypatch.setattr(service_cli, "_client", lambda args: Client())
    spec_file = tmp_path / "p.xml"
    spec_file.write_text(spec())
    code = service_cli.cmd_update(argparse.Namespace(query="pipe", spec=str(spec_file),
                                                     drop_state=False, dry_run=True))
    out = capsys.readouterr()
    assert code == 1 and out.out.splitlines() == ["~ pipe.t0 [src, win]: changed"]
    assert "refused (409): p.xml:9:3: operator win" in out.err


def test_a_state_change_compiled_with_its_pin_is_refused_once_for_its_state(
        running: tuple[SchedulerState, CompiledQuery]) -> None:
    s, old = running
    text = spec(watermark="5 seconds")
    reply = reply_of(update(s, compiled(text, old)))
    assert reply.status == 409 and reply.body is not None
    line, column = locate(text, '<operator name="win"')
    (problem,) = reply.body["problems"]
    assert problem.startswith(f"p.xml:{line}:{column}: operator win (window-aggregate) changes")
