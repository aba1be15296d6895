"""A plan of 30 tasks on one machine: one embedded agent, one executor, one SparkSession running
30 streaming queries, 10 of them serving a channel each to two readers (docs/architecture.md,
"How many tasks one machine holds"). Every sink is compared with a plain-Python oracle."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from testkit.e2e_support import (Stack, generator_rows, module_stack, stop_query, submit,
                                 wait_for_sink, wait_running, wait_until)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]
log = logging.getLogger("tests.thirty")
SOURCES = 10  # each feeds two filter tasks through a channel: 10 + 2 x 10 = 30 tasks
KEY = ("sensor", "ts", "temp", "humidity")
FILTERS = {"hot": ("raw{i}.temp &gt; 25", lambda r: r["temp"] > 25),
           "dry": ("raw{i}.humidity &lt; 50", lambda r: r["humidity"] < 50)}


def source_params(i: int) -> dict[str, str]:
    return {"shape": "sensor", "rate": "100", "seed": str(100 + i), "limit": "300"}


def thirty_task_spec() -> str:
    ops = []
    for i in range(SOURCES):
        params = "".join(f'<param name="{k}" value="{v}"/>' for k, v in source_params(i).items())
        ops.append(f'  <operator name="src{i}" type="generator">{params}'
                   f'<output name="raw{i}"/></operator>\n')
        for name, (condition, _) in FILTERS.items():
            ops.append(f'  <operator name="{name}{i}" type="filter"><input name="raw{i}"/>'
                       f'<param name="condition" value="{condition.format(i=i)}"/>'
                       f'<output name="{name}Out{i}"/></operator>\n'
                       f'  <operator name="{name}Sink{i}" type="file-sink">'
                       f'<input name="{name}Out{i}"/>'
                       f'<param name="path" value="out/{name}{i}.jsonl"/></operator>\n')
    return f'<dataflow name="thirty">\n{"".join(ops)}</dataflow>\n'


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One agent with room for the whole plan (15 cpus of tasks, as `elastiq run` sizes it)."""
    yield from module_stack(tmp_path_factory.mktemp("thirty-stack"), "thirty", cpus_per_agent=16,
                              mem_per_agent=16384, agents=1)


@pytest.mark.timeout(420)
def test_a_thirty_task_plan_comes_up_on_one_machine_and_every_sink_is_exact(
        stack: Stack, tmp_path: Path) -> None:
    from compiler.pipeline import compile_spec_text

    query = compile_spec_text(thirty_task_spec().encode(), "thirty.xml", base_dir=tmp_path).query
    assert len(query.tasks) == 30 and len(query.channels) == SOURCES
    submit(stack, query)
    try:
        wait_running(stack, query.query_id, timeout=300)
        for i in range(SOURCES):
            rows = generator_rows(source_params(i))
            for name, (_, keep) in FILTERS.items():
                expected = Counter(tuple(r[c] for c in KEY) for r in rows if keep(r))
                assert 0 < sum(expected.values()) < len(rows)
                wait_for_sink(tmp_path / "out" / f"{name}{i}.jsonl", expected,
                              lambda r: tuple(r[c] for c in KEY), 180,
                              f"sink {name}{i} to equal its filter's oracle", settle=0.0)
        restarts = {t: v["figures"].get("restarts", 0) for t, v in stack.tasks(query.query_id).items()}
        log.info("thirty: restarts per task %s", restarts)
    finally:
        stop_query(stack, query.query_id)
        wait_until(lambda: all(v["state"] not in ("staging", "starting", "running")
                               for v in stack.tasks(query.query_id).values()), 120,
                   "the thirty tasks to stop")
