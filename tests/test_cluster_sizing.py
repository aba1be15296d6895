"""How many agents a plan needs (common.tasks.agents_needed) and how embedded agents on one host
share its ports (elastiq.embedded.cluster.agent_resources)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.tasks import agents_needed
from compiler.pipeline import compile_spec_file
from elastiq.embedded.cluster import agent_resources

SPECS = Path(__file__).resolve().parent / "specs"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("spec, agents", [
    ("e2e-standby.xml", 2),       # the protected filter apart from its two neighbours
    ("e2e-checkpoint.xml", 2),
    ("e2e-hot-standby.xml", 3),   # two replicas apart from each other and from the neighbours
    ("e2e-partitioned.xml", 2),   # two instances on distinct agents
    ("e2e-pipelined.xml", 2),     # upstream and downstream apart
    ("e2e-multi.xml", 1),         # no pattern: anything may share an agent
])
def test_a_plan_needs_as_many_agents_as_its_apart_constraints_ask(spec: str, agents: int) -> None:
    query = compile_spec_file(SPECS / spec).query
    assert agents_needed(query.tasks) == agents
    groups = {t.task_id: t.placement.group or t.task_id for t in query.tasks}
    constrained = [t for t in query.tasks if t.placement.apart_from or
                   t.placement.initially_apart_from]
    assert bool(constrained) == (agents > 1), groups


def test_three_replicas_need_four_agents(tmp_path: Path) -> None:
    text = (SPECS / "e2e-hot-standby.xml").read_text().replace('replicas="2"', 'replicas="3"')
    path = tmp_path / "three.xml"
    path.write_text(text)
    assert agents_needed(compile_spec_file(path).query.tasks) == 4


def test_every_embedded_agent_gets_its_own_band_of_ports() -> None:
    base = {"cpus": 4.0, "mem": 6144, "ports": "31000-31999"}
    bands = [agent_resources(base, i)["ports"] for i in range(3)]
    assert bands == ["31000-31999", "32000-32999", "33000-33999"]
    assert agent_resources(base, 2)["cpus"] == 4.0
    with pytest.raises(ValueError, match="past 65535"):
        agent_resources(base, 40)
