"""Operators' `cpus=` and `mem=` (docs/spec-language.md, "Resources"): checked at their values
with file:line:column, all problems at once; refused when they exceed what a known cluster's
agents can give a task; a task asks for the largest among its operators (each resource on its
own), the defaults unchanged where none asks; partitioned instances keep their operator's."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.tasks import CompiledQuery
from compiler.pipeline import check_spec_text, compile_spec_text
from compiler.validate import AgentRoom
from tests.spec_snippets import SINK, SOURCE, dataflow, locate


def spec(filter_attrs: str = "", project_attrs: str = "") -> str:
    return dataflow(
        SOURCE +
        f'  <operator name="f" type="filter" {filter_attrs}>\n'
        '    <input name="raw"/>\n'
        '    <param name="condition" value="raw.temp &gt; 30"/>\n'
        '    <output name="hot"/>\n'
        '  </operator>\n'
        f'  <operator name="p" type="project" {project_attrs}>\n'
        '    <input name="hot"/>\n'
        '    <field name="sensor" value="hot.sensor"/>\n'
        '    <field name="t2" value="hot.temp * 2"/>\n'
        '    <output name="out"/>\n'
        '  </operator>\n' + SINK.format(stream="out"), name="q")


def compiled(text: str, base: Path, room: AgentRoom | None = None) -> CompiledQuery:
    return compile_spec_text(text, str(base / "q.xml"), base_dir=base, room=room).query


def resources_of(query: CompiledQuery) -> dict[tuple[str, ...], tuple[float, int]]:
    return {t.operators: (t.resources.cpus, t.resources.mem_mb) for t in query.tasks}


def at_value(text: str, attr: str) -> tuple[int, int]:
    line, column = locate(text, attr)
    return line, column + attr.index('"') + 1


def test_a_task_asks_for_the_largest_of_its_operators_each_resource_apart(tmp_path: Path) -> None:
    # one task holds src, f, p and the sink (few, large tasks)
    query = compiled(spec('cpus="0.3" mem="300"', 'cpus="0.2" mem="700"'), tmp_path)
    assert list(resources_of(query).values()) == [(0.3, 700)]


def test_without_requests_the_defaults_hold(tmp_path: Path) -> None:
    assert list(resources_of(compiled(spec(), tmp_path)).values()) == [(0.5, 256)]
    # one resource asked, the other stays the default
    assert list(resources_of(compiled(spec('cpus="0.25"'), tmp_path)).values()) == [(0.25, 256)]


def test_partitioned_instances_keep_their_operators_request(tmp_path: Path) -> None:
    text = spec(project_attrs='max-parallelism="3" partition-by="sensor" cpus="0.3"')
    query = compiled(text, tmp_path)
    instances = [t for t in query.tasks if {"p_1", "p_2", "p_3"} & set(t.operators)]
    assert len(instances) == 3
    assert all(t.resources.cpus == 0.3 for t in instances), resources_of(query)
    others = [t for t in query.tasks if t not in instances]
    assert [t.resources.cpus for t in others] == [0.5, 0.5]  # the splitter's, the merger's


def test_bad_values_are_reported_at_each_value_all_at_once() -> None:
    text = spec('cpus="lots" mem="0.5"', 'cpus="0" mem="16"')
    graph, found = check_spec_text(text, "bad.xml")
    assert graph is None
    where = {(d.position.line, d.position.column): d for d in found}
    expected = {'cpus="lots"': "is not a number of cpus", 'mem="0.5"': "is not a whole number",
                'cpus="0"': "out of range", 'mem="16"': "out of range"}
    for attr, words in expected.items():
        d = where.get(at_value(text, attr))
        assert d is not None and words in d.message, (attr, [x.render() for x in found])
    assert any("more than 0 and at most 64" in d.hint for d in found)
    assert any("32 to 1048576" in d.hint for d in found)


def test_a_request_no_agent_can_hold_is_refused_where_the_cluster_is_known(
        tmp_path: Path) -> None:
    room = AgentRoom(0.4, 900.0, "agents of 0.4 cpus and 1,500 MB, less the executor's share")
    text = spec(project_attrs='cpus="0.5" mem="1000"')
    graph, found = check_spec_text(text, "q.xml", room=room)
    assert graph is None
    messages = {(d.position.line, d.position.column): d.message for d in found}
    assert "more than any agent can give a task (0.4 cpus: agents of 0.4" in \
        messages[at_value(text, 'cpus="0.5"')]
    assert "(900 MB" in messages[at_value(text, 'mem="1000"')]
    # without the cluster known, the same spec compiles (the scheduler decides at submit)
    assert list(resources_of(compiled(text, tmp_path)).values()) == [(0.5, 1000)]
    fits = spec(project_attrs='cpus="0.4" mem="900"')
    assert list(resources_of(compiled(fits, tmp_path, room)).values()) == [(0.4, 900)]


@pytest.mark.parametrize("value", ["1e3", "-1", " ", "0x10", "1,5", "nan", "inf"])
def test_odd_numbers_are_not_cpus(value: str) -> None:
    graph, found = check_spec_text(spec(f'cpus="{value}"'), "bad.xml")
    assert graph is None and any("cpus=" in d.message for d in found)


def test_elastiq_run_knows_the_room_its_flags_give(tmp_path: Path) -> None:
    from elastiq.run import RunOptions, agent_room
    from scheduler.config import ExecutorSpec

    share = ExecutorSpec()
    assert agent_room(RunOptions(tmp_path / "q.xml")) is None  # sized from the plan
    room = agent_room(RunOptions(tmp_path / "q.xml", cpus_per_agent=2.0, mem_per_agent_mb=4000))
    assert room is not None
    assert (room.cpus, room.mem_mb) == (2.0 - share.cpus, 4000 - share.mem_mb)
    assert "--cpus 2 and --mem 4000, less the executor's own" in room.what
    only_mem = agent_room(RunOptions(tmp_path / "q.xml", mem_per_agent_mb=4000))
    assert only_mem is not None and only_mem.cpus == float("inf")


# --- at submit, when only the scheduler knows the agents -----------------------------------------

def test_a_task_no_known_agent_can_hold_is_refused_at_submit() -> None:
    from scheduler.commands import ReplyToRequest
    from scheduler.config import ExecutorSpec, SchedulerConfig
    from scheduler.events import OffersReceived, QuerySubmitted, Tick
    from scheduler.state import SchedulerState
    from scheduler.testing import chain_query, offer

    s = SchedulerState(SchedulerConfig(executor=ExecutorSpec(cpus=0.5)))
    s.handle(Tick("t0", 100.0))
    # before any offer nothing is known: accepted, it waits
    (first,) = [c for c in s.handle(QuerySubmitted("s0", chain_query("early", 1, cpus=9.0)))
                if isinstance(c, ReplyToRequest)]
    assert first.accepted
    # two idle agents of 1 cpu and 2,000 MB; our executor asks 0.5 cpus and 1,500 MB itself
    s.handle(OffersReceived("o", (offer("o1", "a1", cpus=1.0, mem_mb=2000.0),
                                  offer("o2", "a2", cpus=0.6, mem_mb=3000.0))))
    assert s.agent_sizes == {"a1": (1.0, 2000.0), "a2": (0.6, 3000.0)}

    def reply(query_cpus: float, mem_mb: int) -> ReplyToRequest:
        out = s.handle(QuerySubmitted("s", chain_query(f"q{query_cpus}{mem_mb}", 1,
                                                       cpus=query_cpus, mem_mb=mem_mb)))
        (r,) = [c for c in out if isinstance(c, ReplyToRequest)]
        return r

    assert reply(0.5, 500).accepted  # 1.0 cpus and 2,000 MB: a1 holds it exactly
    refused = reply(0.6, 500)  # 1.1 cpus: neither agent
    assert not refused.accepted and refused.status == 400
    assert "task q0.6500.t0" in refused.message and "no agent can ever hold it" in refused.message
    assert "a1: 1 cpus and 2000 MB, a2: 0.6 cpus and 3000 MB" in refused.message
    assert "cpus= or mem=" in refused.message
    assert not reply(0.5, 600).accepted  # a1 lacks memory, a2 cpus: no single agent has both
    # an offer from an agent our executor runs on is not its size (we hold part of it)
    s.handle(OffersReceived("o3", (offer("o3", "a3", cpus=8.0, executor_ids=("e",)),)))
    assert "a3" not in s.agent_sizes
