"""How many agents a plan needs (common.tasks.agents_needed), how embedded agents on one host
share its ports (embedded_mesos.cluster.agent_resources), and how `elastiq run` sizes its
embedded cluster from the plan or refuses at once (elastiq.sizing)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.tasks import agents_needed
from compiler.pipeline import compile_spec_file
from embedded_mesos.cluster import agent_resources
from elastiq.sizing import PlanDoesNotFit, size_cluster
from scheduler.config import ExecutorSpec
from scheduler.placement import Offer, QueryDemand, Share, TaskDemand, place

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


# --- elastiq run's embedded cluster, sized from the plan (elastiq.sizing) -----------------------

EXECUTOR = Share(ExecutorSpec.cpus, ExecutorSpec.mem_mb)  # what the executor takes for itself


def many_queries(tmp_path: Path, copies: int, ha: str = "") -> Path:
    """`copies` independent filter + window queries in one spec (2 tasks each)."""
    ops = "".join(
        f'  <operator name="src{i}" type="generator"><param name="shape" value="sensor"/>'
        f'<output name="raw{i}"/></operator>\n'
        f'  <operator name="w{i}" type="window-aggregate"{ha}><input name="raw{i}"/>'
        f'<param name="time" value="ts"/><param name="size" value="1 second"/>'
        f'<aggregate name="n" function="count"/><output name="agg{i}"/></operator>\n'
        f'  <operator name="sink{i}" type="file-sink"><input name="agg{i}"/>'
        f'<param name="path" value="out{i}.jsonl"/></operator>\n'
        for i in range(copies))
    path = tmp_path / "many.xml"
    path.write_text(f'<dataflow name="many">\n{ops}</dataflow>\n')
    return path


def test_left_to_the_plan_the_agents_hold_a_plan_larger_than_the_old_default(
        tmp_path: Path) -> None:
    tasks = compile_spec_file(many_queries(tmp_path, 9)).query.tasks
    need = sum(t.resources.cpus for t in tasks) + EXECUTOR.cpus
    assert need > 4.0  # the old fixed default (one agent of 4 cpus) never placed it
    size = size_cluster(tasks, EXECUTOR)
    assert (size.agents, size.cpus) == (1, math.ceil(need))
    assert size.mem_mb >= sum(t.resources.mem_mb for t in tasks) + EXECUTOR.mem_mb


def test_a_checkpointed_plan_gets_its_apart_agents_each_with_room_for_it(tmp_path: Path) -> None:
    tasks = compile_spec_file(many_queries(tmp_path, 6, ' ha="checkpoint"')).query.tasks
    size = size_cluster(tasks, EXECUTOR)
    assert size.agents == agents_needed(tasks) >= 2


def needs(tasks: tuple) -> tuple[int, int]:
    """The plan's cpus and MB in all, with one executor (the sizes that hold it on one agent)."""
    return (math.ceil(sum(t.resources.cpus for t in tasks) + EXECUTOR.cpus),
            math.ceil(sum(t.resources.mem_mb for t in tasks) + EXECUTOR.mem_mb))


@pytest.mark.parametrize("given", [{"cpus": 2.0}, {"mem_mb": 2048}, {"agents": 1}])
def test_sizes_too_small_for_the_plan_are_refused_naming_the_flag(tmp_path: Path,
                                                                  given: dict) -> None:
    spec = many_queries(tmp_path, 9) if "agents" not in given else SPECS / "e2e-checkpoint.xml"
    tasks = compile_spec_file(spec).query.tasks
    cpus, mem = needs(tasks)
    flag = {"cpus": f"--cpus {cpus}", "mem_mb": f"--mem {mem}",
            "agents": f"--agents {agents_needed(tasks)}"}[next(iter(given))]
    with pytest.raises(PlanDoesNotFit) as refused:
        size_cluster(tasks, EXECUTOR, **given)
    message = str(refused.value)
    assert flag in message, message
    assert "does not fit" in message
    size_cluster(tasks, EXECUTOR, **{k: {"cpus": cpus, "mem_mb": mem}.get(k, agents_needed(tasks))
                                     for k in given})  # the named size does fit


def test_run_refuses_at_once_when_the_given_sizes_are_short(tmp_path: Path) -> None:
    """`elastiq run --no-progress --cpus 1` of a plan that needs more: a message naming the flag
    and exit status 1 before any cluster starts (no state folder is made)."""
    spec = many_queries(tmp_path, 3)
    cpus, _ = needs(compile_spec_file(spec).query.tasks)
    state = tmp_path / "state"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", "import sys; from elastiq.cli import main; "
                             "sys.exit(main())", "run", str(spec), "--no-progress", "--cpus", "1",
                             "--no-api", "--state-dir", str(state)],
                            capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 1, result.stderr
    assert f"--cpus {cpus}" in result.stderr and "does not fit" in result.stderr, result.stderr
    assert time.monotonic() - started < 60
    assert not (state / "cluster").exists()



def test_fuzzed_sizes_either_fit_or_are_refused_naming_a_flag() -> None:
    """Seeded, bounded: any mix of --agents, --cpus and --mem (zero, negative, huge, NaN,
    infinite) gives a size the scheduler's placement accepts, or a refusal naming a flag."""
    tasks = compile_spec_file(SPECS / "e2e-checkpoint.xml").query.tasks
    rng = random.Random(18)
    cpu_values = [None, 0, -1, 0.25, 1, 2, 3.5, 8, 64, 1e9, float("nan"), float("inf")]
    mem_values = [None, 0, -5, 100, 2048, 6144, 20000, 10**9]
    for _ in range(300):
        agents = rng.choice([None, -2, 0, 1, 2, 3, 22, 30, 10**6])
        cpus, mem = rng.choice(cpu_values), rng.choice(mem_values)
        try:
            size = size_cluster(tasks, EXECUTOR, agents, cpus, mem)
        except PlanDoesNotFit as exc:
            assert any(f in str(exc) for f in ("--agents", "--cpus", "--mem")), str(exc)
            continue
        assert size.agents >= agents_needed(tasks) and size.cpus > 0 and size.mem_mb > 0
        offers = [Offer(f"o{i}", f"a{i}", "h", size.cpus, size.mem_mb, ((20000, 20999),))
                  for i in range(size.agents)]
        demands = [TaskDemand(t.task_id, t.resources.cpus, float(t.resources.mem_mb),
                              t.outputs, t.inputs, t.placement.group,
                              t.placement.apart_from + t.placement.initially_apart_from)
                   for t in tasks]
        assert not place(offers, [QueryDemand("q", tuple(demands))],
                         executor_share=EXECUTOR).unplaced


ISSUE_31_EXAMPLE = """<dataflow name="issue-31">
  <operator name="src" type="generator" cpus="0.3"><param name="shape" value="sensor"/>
    <param name="rate" value="5000"/><output name="raw"/></operator>
  <operator name="heavy" type="project" partition-by="sensor" max-parallelism="3" cpus="0.3">
    <input name="raw"/><field name="sensor" value="sensor"/><field name="ts" value="ts"/>
    <field name="h" value="length(upper(concat(sensor, 'αβγδε')))"/><output name="scored"/>
  </operator>
  <operator name="sink" type="file-sink" cpus="0.3"><input name="scored"/>
    <param name="path" value="out.jsonl"/></operator>
</dataflow>
"""


def test_the_issues_example_places_on_agents_of_0_4_cpus(tmp_path: Path) -> None:
    """Issue 31's example, `elastiq run SPEC --agents 5 --cpus 0.4` with a partitioned project
    (max-parallelism 3) and every operator asking cpus="0.3": the executor's own 0.1 cpus and a
    task's 0.3 fill an agent of 0.4 exactly, one task per agent. With the share it had (0.5
    cpus) each agent needed 0.8 and the plan was refused."""
    spec = tmp_path / "issue-31.xml"
    spec.write_text(ISSUE_31_EXAMPLE, encoding="utf-8")
    tasks = compile_spec_file(spec).query.tasks
    assert {t.resources.cpus for t in tasks} == {0.3} and len(tasks) == 5
    assert EXECUTOR.cpus + 0.3 <= 0.4
    size = size_cluster(tasks, EXECUTOR, 5, 0.4)
    assert (size.agents, size.cpus) == (5, 0.4)
    with pytest.raises(PlanDoesNotFit, match="needs 0.8 cpus, offer has 0.4"):
        size_cluster(tasks, Share(0.5, EXECUTOR.mem_mb), 5, 0.4)
