"""Rescaling a running keyed window aggregate on the embedded cluster (issue 12): real
executors with Spark, real channels, real HTTP.

1. A keyed tumbling window aggregate, rescaled 1 -> 3 -> 2: each rescale switches routing
at the next window boundary of event time (the old instances finish the windows before it, the
new ones take those after), retired instances go dormant once their watermark passed the
switch. At 3 -> 2 the executor of the retiring instance is SIGKILLed while it drains. The sink
must equal a plain-Python window oracle.
2. A keyed sliding window aggregate (3 s every 1 s), rescaled 1 -> 3 -> 2: rows whose
windows span a switch go to both sides, each copy bounded to its side's windows; the sink must
equal the window oracle.
Why 1 -> 3 -> 2 covers every case a key meets (and 2 -> 1 after it did not add one):
testkit.elastic_support.scale_one_three_two.

The stateless filter's split, scales and merge, the keyed join and a kill during a scale-out
are tests/test_elastic_cluster.py, the module before, whose running stack this one takes over
(the same `STACK_SHAPE`: warm executors). Shared helpers: testkit/elastic_support.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from testkit.e2e_support import (Stack, StackPool, StackShape, generator_rows, hurry,
                                 kill_executor, read_sink, stop_query, submit, wait_for_sink,
                                 wait_running, wait_until)
from testkit.elastic_support import elastic_view, generator, scale_one_three_two

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]


# one stack for this module and the next one of the same shape (tests/conftest.py `stack_pool`)
STACK_SHAPE = StackShape(cpus_per_agent=3.0, agents=3)


@pytest.fixture(scope="module")
def stack(stack_pool: StackPool) -> Stack:
    return stack_pool.take(STACK_SHAPE, "test_elastic_window_cluster.py")


# As in tests/test_elastic_cluster.py, the generator's input (10 min at its spec's rate) lasts
# far longer than a test needs on a quiet machine, so that a slow machine still rescales while
# rows arrive; once the rescales are done, `hurry` makes the rest at a higher rate.
WINDOWED = {"shape": "sensor", "rate": "100", "seed": "8", "limit": "60000"}


def window_spec(name: str, size_s: int, slide_s: int | None = None) -> str:
    """A per-sensor window aggregate over WINDOWED on one of three slots."""
    slide = f'<param name="slide" value="{slide_s} seconds"/>' if slide_s else ""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="{name}">
{generator('src', WINDOWED, 'raw')}
  <operator name="perSensor" type="window-aggregate" parallelism="1" max-parallelism="3">
    <input name="raw"/>
    <param name="time" value="ts"/>
    <param name="size" value="{size_s} seconds"/>
    {slide}
    <param name="watermark" value="500 milliseconds"/>
    <param name="group-by" value="sensor"/>
    <aggregate name="readings" function="count"/>
    <aggregate name="total_temp" function="sum" column="temp"/>
    <output name="stats"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="stats"/>
    <param name="path" value="out/{name}.jsonl"/>
  </operator>
</dataflow>
"""


WINDOW_KEY = ("window_start", "window_end", "sensor", "readings")


def window_expectation(size_s: int, slide_s: int) -> tuple[Counter, dict[tuple, float]]:
    """The per-sensor windows an append-mode query over WINDOWED emits (plain Python)."""
    from datetime import timedelta

    from testkit.e2e_support import window_oracle

    size = timedelta(seconds=size_s)
    windows = window_oracle(generator_rows(WINDOWED), "ts", ["sensor"], size,
                            timedelta(seconds=slide_s), timedelta(milliseconds=500))
    exact, totals = Counter(), {}
    for (start, sensor), rows in windows.items():
        key = (start, start + size, sensor, len(rows))
        exact[key] += 1
        totals[key] = sum(r["temp"] for r in rows)
    return exact, totals


def rescale_window_one_three_two(stack: Stack, tmp_path: Path, name: str, size_s: int,
                                     slide_s: int, kill_at_two: bool) -> None:
    """Run a window aggregate, rescale it 1 -> 3 -> 2 (with `kill_at_two`, SIGKILL the
    retiring instance's executor mid handover at 3 -> 2) and check its sink against the window
    oracle."""
    from compiler.pipeline import compile_spec_text

    text = window_spec(name, size_s, slide_s if slide_s != size_s else None)
    query = compile_spec_text(text.encode(), str(tmp_path / f"{name}.xml"),
                              base_dir=tmp_path).query
    qid = query.query_id
    (elastic,) = query.elastic
    assert elastic.stateful and elastic.switch_time == "ts"
    assert elastic.switch_close_ms == (size_s - slide_s) * 1000
    sink = tmp_path / "out" / f"{name}.jsonl"
    submit(stack, query)

    def kill_the_retiring_instance() -> None:
        """SIGKILL the executor of slot 3 while it drains (it finishes the windows before the
        switch): it is relaunched from its checkpoint and still retires."""
        old = elastic.slots[2]
        wait_until(lambda: elastic_view(stack, qid, "perSensor")["slots"][2]["retiring"], 30,
                   f"{old} to retire", step=0.05)
        task = stack.tasks(qid)[old]
        assert task["state"] == "running", f"{old} drained before the kill: {task}"
        kill_executor(stack, task["agent_id"], f"the retiring instance {old}")
        wait_until(lambda: stack.tasks(qid)[old]["attempt"] > task["attempt"], 240,
                   f"{old} relaunched after the kill", lambda: str(stack.tasks(qid)[old]))

    try:
        wait_running(stack, qid, timeout=180)
        wait_until(lambda: len(read_sink(sink)) > 20, 240, "first windows on one instance")
        switches = scale_one_three_two(
            stack, qid, "perSensor", sink, "windows",
            lambda n: kill_the_retiring_instance() if n == 2 and kill_at_two else None)
        assert switches[0] % (slide_s * 1000) == 0, switches
        hurry(stack, qid)
        exact, totals = window_expectation(size_s, slide_s)
        wait_for_sink(sink, exact, lambda r: tuple(r[c] for c in WINDOW_KEY), 300,
                      "the rescaled window aggregate's sink to equal the window oracle")
        for row in read_sink(sink):
            key = tuple(row[c] for c in WINDOW_KEY)
            assert row["total_temp"] == pytest.approx(totals[key], rel=1e-12), key
    finally:
        stop_query(stack, qid)


@pytest.mark.timeout(900)  # the kill's step may take SETTLE_SECONDS on its own
def test_a_running_window_aggregate_scales_one_three_two_with_its_state_exact(
        stack: Stack, tmp_path: Path) -> None:
    """Tumbling, 2 s: 1 -> 3 -> 2, and at 3 -> 2 the old instance being retired is
    SIGKILLed mid handover; the sink still equals the window oracle."""
    rescale_window_one_three_two(stack, tmp_path, "e2e-elastic-window", 2, 2, True)


def test_a_running_sliding_window_scales_one_three_two_with_every_window_whole(
        stack: Stack, tmp_path: Path) -> None:
    """Sliding, 3 s every 1 s: windows span each switch, so the rows near it reach both sides,
    each copy bounded to its side's windows; the sink equals the window oracle, each window
    once with all its rows."""
    rescale_window_one_three_two(stack, tmp_path, "e2e-elastic-sliding", 3, 1, False)
