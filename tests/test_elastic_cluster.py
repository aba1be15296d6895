"""Rescaling a running operator on the embedded cluster (issue 12): real executors with Spark,
real channels, real HTTP and CLI.

One query `sink := file_sink(keep := filter(src := generator))` whose filter has three instance
slots (`max-parallelism="3"`) and starts on one. While the generator runs, the test scales the
filter 1 -> 3 -> 2 -> 1 (through the CLI and the API), each time waiting until the new
instances run and the retired ones drained and went dormant, and checks that the generator's
task was never restarted (the splitter switches between two micro-batches) and that every
instance slot received rows while it ran. The sink must then equal a plain-Python filter over
the generator's rows: nothing lost, nothing twice.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.e2e_support import (ROOT, Stack, generator_rows, pythonpath, read_sink, start_stack,
                               stop_query, stop_stack, submit, wait_for_sink, wait_running,
                               wait_until)

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]
log = logging.getLogger(__name__)

SOURCE = {"shape": "sequence", "rate": "250", "seed": "3", "limit": "30000"}
SPEC = f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="e2e-elastic">
  <operator name="src" type="generator">
    {''.join(f'<param name="{k}" value="{v}"/>' for k, v in SOURCE.items())}
    <output name="nums"/>
  </operator>
  <operator name="keep" type="filter" parallelism="1" max-parallelism="3">
    <input name="nums"/>
    <param name="condition" value="nums.id % 3 != 1"/>
    <output name="kept"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="kept"/>
    <param name="path" value="out/elastic.jsonl"/>
  </operator>
</dataflow>
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("elastic-stack"), cpus_per_agent=2.0,
                          agents=3)
    try:
        yield running
    finally:
        leftovers = stop_stack(running)
        if leftovers:
            log.warning("elastic teardown: SIGKILLed leftover executor processes %s", leftovers)


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastiq.cli", *args, "--scheduler",
                           stack.api.url, "--token-file", str(stack.api.token_file)],
                          capture_output=True, text=True, timeout=200, cwd=ROOT,
                          env={"PYTHONPATH": pythonpath(), "PATH": "/usr/bin:/bin"})


def elastic_view(stack: Stack, query_id: str, operator: str) -> dict[str, Any]:
    return next(e for e in stack.status(query_id)["elastic"] if e["operator"] == operator)


def slot_states(stack: Stack, query_id: str) -> list[str]:
    return [s["state"] for s in elastic_view(stack, query_id, "keep")["slots"]]


def settled(stack: Stack, query_id: str, n: int) -> bool:
    states = slot_states(stack, query_id)
    return states[:n] == ["running"] * n and all(s == "dormant" for s in states[n:])


def rows_in(stack: Stack, query_id: str, task_id: str) -> float:
    return stack.tasks(query_id)[task_id]["figures"].get("tuples_in", 0.0)


def test_a_running_filter_scales_one_three_two_one_and_the_sink_stays_exact(
        stack: Stack, tmp_path: Path) -> None:
    from compiler.pipeline import compile_spec_text

    query = compile_spec_text(SPEC.encode(), str(tmp_path / "e2e-elastic.xml"),
                              base_dir=tmp_path).query
    qid = query.query_id
    (elastic,) = query.elastic
    slots = elastic.slots
    splitter = elastic.splitters[0][0]
    sink = tmp_path / "out" / "elastic.jsonl"
    submit(stack, query)
    try:
        wait_running(stack, qid, timeout=180)
        assert settled(stack, qid, 1), slot_states(stack, qid)
        wait_until(lambda: len(read_sink(sink)) > 200, 120, "first output on one instance")

        # 1 -> 3 by the CLI: two dormant slots start, the splitter routes to all three
        done = cli(stack, "scale", qid, "keep", "3")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "keep runs 3 instances" in done.stdout and "from micro-batch" in done.stdout, \
            done.stdout
        assert settled(stack, qid, 3)
        for task_id in slots[1:]:
            seen = rows_in(stack, qid, task_id)
            wait_until(lambda t=task_id, s=seen: rows_in(stack, qid, t) > s + 100, 120,
                       f"rows reaching the new instance {task_id}")

        # 3 -> 2 by the API: slot 3 drains, then stops and goes dormant
        client = stack.client()
        reply = client.scale(qid, "keep", 2)
        assert reply["request"], reply
        wait_until(lambda: settled(stack, qid, 2), 180, "slot 3 to drain and retire",
                   lambda: f"{elastic_view(stack, qid, 'keep')}\nsplitter: "
                           f"{stack.tasks(qid)[splitter]['figures']}\nslot 3: "
                           f"{stack.tasks(qid)[slots[2]]['figures']}")
        before = rows_in(stack, qid, slots[0])
        wait_until(lambda: rows_in(stack, qid, slots[0]) > before + 100, 120,
                   "rows on two instances")

        # 2 -> 1
        done = cli(stack, "scale", qid, "keep", "1")
        assert done.returncode == 0, done.stdout + done.stderr
        assert settled(stack, qid, 1), slot_states(stack, qid)
        view = elastic_view(stack, qid, "keep")
        assert [(r["from"], r["to"], r["state"]) for r in view["rescales"]] == \
            [(1, 3, "applied"), (3, 2, "applied"), (2, 1, "applied")], view["rescales"]
        assert all(r["pause_s"] is not None and r["pause_s"] < 2.0 for r in view["rescales"]), \
            view["rescales"]

        # the generator's task (which holds the splitter) never restarted
        producer = stack.tasks(qid)[splitter]
        assert producer["attempt"] == 1 and producer["launches"] == 1, producer

        expected = Counter(r["id"] for r in generator_rows(SOURCE) if r["id"] % 3 != 1)
        wait_for_sink(sink, expected, lambda r: r["id"], 300,
                      "the rescaled query's sink to equal the filter oracle")
    finally:
        stop_query(stack, qid)
