"""A query's source, the only form a query is persisted in: its JSON is checked field by field,
and a new leader's recompilation skips (and describes) every entry that is not a spec of its
query while the rest restore. Pure: the compiler runs, nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.coordination import InProcessCoordination, PersistedQuery, SchedulerRegistry
from scheduler.query_source import BadSource, QuerySource, recompile_all
from scheduler.testing import chain_query, spec_query

SPEC = Path(__file__).parent / "specs" / "e2e-filter-project.xml"


def test_a_source_round_trips_and_keeps_its_bytes(tmp_path: Path) -> None:
    source = QuerySource.of(b"<dataflow name='x'>\xe9</dataflow>", "x.xml", "x", str(tmp_path))
    back = QuerySource.from_json(source.to_json())
    assert back == source and back.spec_bytes() == b"<dataflow name='x'>\xe9</dataflow>"


@pytest.mark.parametrize("text", [
    "not json", "[]", '{"format": "elastiq-query-source/1"}',
    chain_query("q", 1).to_json(),  # a compiled query, programs and all
    '{"format": "elastiq-query-source/1", "spec": "<a/>", "filename": "a", "query_id": "q", '
    '"program": "import os"}',
    '{"format": "elastiq-query-source/1", "spec": "<a/>", "filename": "a", "query_id": 1}',
])
def test_what_is_not_a_source_is_refused(text: str) -> None:
    with pytest.raises(BadSource):
        QuerySource.from_json(text)


def test_recompiling_skips_bad_entries_and_restores_the_rest(tmp_path: Path) -> None:
    good, good_source = spec_query(SPEC, "good", tmp_path)
    _, other = spec_query(SPEC, "other", tmp_path)
    broken = QuerySource.of(b"<dataflow name='b'><nope/></dataflow>", "b.xml", "broken", None)
    entries = [PersistedQuery("good", good_source.to_json().encode(), {"phase": "active"}),
               PersistedQuery("evil", chain_query("evil", 1).to_json().encode(), None),
               PersistedQuery("broken", broken.to_json().encode(), None),
               PersistedQuery("misfiled", other.to_json().encode(), None)]
    cache: dict = {}
    restored, skipped = recompile_all(entries, cache)
    assert [(r.query.query_id, r.placements) for r in restored] == [("good", {"phase": "active"})]
    assert restored[0].query.to_json() == good.to_json()  # the same plan and programs
    assert [s.split(":")[0] for s in skipped] == ["query evil", "query broken", "query misfiled"]
    assert "b.xml:1" in skipped[1]  # the compiler's located diagnostic
    again, skipped_again = recompile_all(entries, cache)  # a standby polling: said once
    assert [r.query.query_id for r in again] == ["good"] and skipped_again == []


def test_the_registry_holds_the_source_and_reads_back_placements(tmp_path: Path) -> None:
    registry = SchedulerRegistry(InProcessCoordination())
    _, source = spec_query(SPEC, "q/1", tmp_path)
    registry.save_query("q/1", source.to_json(), None)
    registry.save_placements("q/1", {"phase": "active"}, None)
    [entry] = registry.load_queries()
    assert entry.query_id == "q/1" and entry.placements == {"phase": "active"}
    assert QuerySource.from_json(entry.source) == source
    assert "program" not in json.loads(entry.source)
