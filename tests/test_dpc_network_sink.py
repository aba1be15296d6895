"""DPC marks on a network sink with real ZeroMQ and Spark (docs/availability.md, "What a reader
of each sink sees"): task u unions two channels with max-delay and serves the union on its
network sink, marked; a plain channel reader (another program speaking the channel protocol)
reads it while a2's link to u is cut and healed (`testkit.dpc_marks_support`). The marks arrive:
tentative rows during the cut, a revision after the heal, and the stable view computed from
them equals the plain-Python union of all input. And the attacker's side: a network-source
reading a marked stream refuses a forged mark and counts it, spooling nothing of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common import dpc_view
from testkit.dpc_marks_support import READING, keys, network_cut_run, union_oracle
from testkit.waiting import wait_for

pytestmark = pytest.mark.spark

RATE, LIMIT, MAX_DELAY = 100.0, 1700, 2.0  # 17 s of input per upstream task
CUT_SECONDS = 4.0


def test_a_dpc_task_s_network_sink_carries_its_marks_to_a_plain_reader(
        spark: Any, tmp_path: Path) -> None:
    run, refused = network_cut_run(spark, tmp_path, rate=RATE, limit=LIMIT,
                                   cut_seconds=CUT_SECONDS, max_delay=f"{int(MAX_DELAY)} seconds")
    expected = union_oracle(RATE, LIMIT)
    tentative = [r for r in run.at_heal if dpc_view.TENTATIVE in r]
    print(f"first tentative row at the reader {run.first_tentative:.2f} s after the cut; u "
          f"reconciled in {run.reconcile:.2f} s; {len(tentative)} tentative rows replaced; "
          f"stable view {len(expected)} rows")
    assert tentative, "the reader got no tentative row during the cut"
    assert {r[dpc_view.TENTATIVE] for r in tentative} == {1}
    assert {r["sensor"] for r in tentative} and set(keys(tentative)) <= set(expected)
    assert keys(dpc_view.stable_view(run.rows)) == expected
    assert [r[dpc_view.REVISION] for r in run.rows if dpc_view.REVISION in r] == [1]
    assert dpc_view.open_episodes(run.rows) == []
    assert keys(dpc_view.current_view(run.rows)) == expected
    assert refused == 0


def test_a_network_source_refuses_a_forged_mark_and_counts_it(spark: Any, tmp_path: Path) -> None:
    """A writer (a real ChannelWriter) serves a table whose tentative mark is -1 to a
    network-source with marks: its receiver refuses the frame each time it comes, counts it,
    and spools nothing."""
    import pyarrow as pa

    from executor import dpc_marks
    from executor.runtime import ChannelHub, TaskRuntime
    from executor.shapes import arrow_schema
    from testkit.dpc_marks_support import _free_port

    wire = arrow_schema(dpc_marks.with_marks(READING))
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    hub = ChannelHub()
    rt = TaskRuntime(spark, query_id="q", task_id="r", checkpoint_dir=str(tmp_path / "r"),
                     channels=hub)
    try:
        writer = hub.writer("evil", wire, bind=endpoint, expected_readers=["r/in"])
        forged = pa.table({"sensor": ["s1"], "ts": pa.array([0], pa.timestamp("us", "UTC")),
                           "temp": [1.0], dpc_marks.TENTATIVE_MARK: pa.array([-1], pa.int64()),
                           dpc_marks.REVISION_MARK: pa.array([None], pa.int64())}).cast(wire)
        writer.send(forged, 0)
        rt.network_source(op="in", output="in", schema=READING, endpoint=endpoint,
                          channel="evil", marks=True)
        receiver = rt.receivers[0]
        wait_for("the forged frame refused", lambda: receiver.refused_frames() >= 1, 30)
        assert receiver.spooled_high == 0, "a frame with a forged mark was spooled"
    finally:
        rt.stop()
        hub.close()
