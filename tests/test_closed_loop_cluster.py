"""The closed loop end to end on the embedded cluster: examples/closed-loop/monitored.xml runs,
then examples/closed-loop/monitor.xml, whose control-sink sends its windows' verdicts to the
scheduler's API (its address given as the sink's `scheduler` parameter, since the test's
scheduler listens on a free port). The monitored query's filter condition must change to the
monitor's verdict through one request only (the monitor repeats its verdict every window and the
sink sends nothing new), and its file sink must equal a plain-Python oracle that switches
condition at the acknowledged epoch (whose first input index is read from Spark's offset log of
the task, as in tests/test_control_cluster.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.api_client import SchedulerClient
from executor import shapes
from executor.sinks import read_mark
from testkit.e2e_support import (ROOT, Stack, StackPool, StackShape, read_sink, stop_query,
                                 submit, wait_running, wait_until)
from testkit.e2e_support import generator_offsets

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(300)]

LOOP = ROOT / "examples" / "closed-loop"
RAISED = "raw.temp > 35"  # what monitor.xml asks for: its bound is exceeded in every window
WINDOW_ROWS = 400  # 2-second windows of 200 readings per second


# one stack for this module and tests/test_control_cluster.py, of the same shape
# (tests/conftest.py `stack_pool`: the second module finds the executor warm)
STACK_SHAPE = StackShape(cpus_per_agent=2.5, agents=1)


@pytest.fixture(scope="module")
def stack(stack_pool: StackPool) -> Stack:
    return stack_pool.take(STACK_SHAPE, "test_closed_loop_cluster.py")


def latest_index(checkpoint: Path) -> int:
    found = generator_offsets(checkpoint)
    return found[max(found)] if found else 0


def condition(client: SchedulerClient) -> dict[str, Any]:
    view = client.control_status("monitored")
    (hot,) = [a for a in view["adjustable"] if (a["operator"], a["parameter"]) ==
              ("hot", "condition")]
    return {"value": hot["value"], "version": view["version"], "history": view["history"]}


def test_the_monitor_raises_the_monitored_filter_threshold_once(stack: Stack,
                                                                 tmp_path: Path) -> None:
    from compiler.pipeline import compile_spec_file, compile_spec_text

    monitored = compile_spec_file(LOOP / "monitored.xml", base_dir=tmp_path).query
    text = (LOOP / "monitor.xml").read_text()
    text = text.replace('<input name="control"/>', '<input name="control"/>\n    <param '
                        f'name="scheduler" value="{stack.api.url}"/>')
    assert stack.api.url in text
    monitor = compile_spec_text(text.encode(), str(LOOP / "monitor.xml"),
                                base_dir=tmp_path).query
    (task,) = monitored.tasks
    (watcher,) = monitor.tasks
    checkpoint = stack.work / "state" / task.task_id / "checkpoint"
    watcher_checkpoint = stack.work / "state" / watcher.task_id / "checkpoint"
    sink = Path(monitored.sinks["sink"])
    client = stack.client()

    submit(stack, monitored)
    wait_running(stack, "monitored", timeout=120)
    wait_until(lambda: len(read_sink(sink)) >= 20, 60, "rows under the first condition")
    assert condition(client)["value"] == "raw.temp > 30"
    submit(stack, monitor)
    try:
        changed = wait_until(lambda: (c := condition(client))["history"] and c, 90,
                             "the monitor's verdict applied to monitored",
                             lambda: stack.executor_logs()[-4000:])
        assert changed["value"] == RAISED and changed["version"] == 1, changed
        (entry,) = changed["history"]
        assert (entry["operator"], entry["parameter"], entry["value"]) == \
            ("hot", "condition", RAISED)
        epoch = entry["epochs"][task.task_id]

        # the monitor closes more windows with the same verdict; the sink sends nothing more
        seen = latest_index(watcher_checkpoint)
        wait_until(lambda: latest_index(watcher_checkpoint) >= seen + 3 * WINDOW_ROWS, 60,
                   "three more windows of the monitor")
        wait_until(lambda: any(b >= epoch + 2 for b in generator_offsets(checkpoint)),
                   30, "monitored batches under the new condition")
        after = condition(client)
        assert after["version"] == 1 and len(after["history"]) == 1, after
        stop_query(stack, "monitored")
    finally:
        stack.service.stop_query("monitor")

    # the file sink: readings above 30 before the epoch, above 35 from it on, none lost or twice
    mark = read_mark(f"{sink}.commit")
    assert mark is not None
    ends = generator_offsets(checkpoint)
    boundary, end = ends[epoch - 1], ends[mark.batch_id]
    shape = shapes.shape_named("sensor")
    start = shapes.parse_start("2024-01-01T00:00:00Z")
    readings = [shapes.reference_row(shape, 7, start, 200.0, i) for i in range(end)]
    expected = [r for r in readings[:boundary] if r["temp"] > 30] + \
               [r for r in readings[boundary:] if r["temp"] > 35]
    rows = read_sink(sink)
    assert boundary < end and any(30 < r["temp"] <= 35 for r in rows)
    assert sorted(rows, key=lambda r: r["ts"]) == expected
