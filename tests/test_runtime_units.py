"""Pure unit tests of the runtime's own logic: shapes, pacing, partitioning, the exactly-once
append log, restart decisions, durations, join naming. No Spark, no sockets."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from common.operator_schemas import aggregate_type, join_output_names
from common.types import ColumnType, Field, Schema
from compiler.operators import canonical_duration
from executor import shapes, sinks, sources
from executor.runtime import parse_duration
from executor.task_runner import backlog_of, decide_restart


@pytest.mark.parametrize("name", sorted(shapes.SHAPES))
def test_vectorised_shape_equals_plain_python_reference(name: str) -> None:
    shape = shapes.shape_named(name)
    start = shapes.parse_start("2024-01-01T00:00:00Z")
    batch = shapes.generate_batch(shape, shape.columns, 7, start, 333.0, 100, 1100)
    expected = [shapes.reference_row(shape, 7, start, 333.0, i) for i in range(100, 1100)]
    assert batch.to_pylist() == expected


def test_shape_rows_do_not_depend_on_partitioning() -> None:
    shape = shapes.shape_named("stock")
    whole = shapes.generate_batch(shape, shape.columns, 1, 0, 10.0, 0, 500).to_pylist()
    parts = [shapes.generate_batch(shape, shape.columns, 1, 0, 10.0, lo, hi).to_pylist()
             for lo, hi in sources.split_range(0, 500, 3, min_rows=1)]
    assert sum(parts, []) == whole


def test_shape_values_cover_their_domains() -> None:
    rows = [shapes.reference_row(shapes.SHAPES["sensor"], 3, 0, 1.0, i) for i in range(2000)]
    assert {r["sensor"] for r in rows} == set(shapes.SENSORS)
    assert all(10.0 <= r["temp"] < 40.0 for r in rows)
    assert rows[10]["ts"] - rows[0]["ts"] == timedelta(seconds=10)


def test_shape_schema_mismatch_is_a_clear_error() -> None:
    with pytest.raises(shapes.ShapeError, match="'price'.*not produced"):
        shapes.check_schema(shapes.SHAPES["sensor"], Schema.of(("price", "double")))
    with pytest.raises(shapes.ShapeError, match="is double, not int"):
        shapes.check_schema(shapes.SHAPES["sensor"], Schema.of(("temp", "int")))
    with pytest.raises(shapes.ShapeError, match="unknown generator shape"):
        shapes.shape_named("weather")


def test_paced_offset_follows_wall_time_and_limit() -> None:
    assert sources.paced_offset(100.0, 102.5, 10.0, 1 << 40, None) == 25
    assert sources.paced_offset(100.0, 102.5, 10.0, 1 << 40, 20) == 20
    assert sources.paced_offset(100.0, 99.0, 10.0, 1 << 40, None) == 0
    assert sources.paced_offset(100.0, 200.0, None, 7, None) == 7


def test_split_range_is_contiguous_and_complete() -> None:
    ranges = sources.split_range(10, 10_000, 3, min_rows=1000)
    assert ranges[0][0] == 10 and ranges[-1][1] == 10_000 and len(ranges) == 3
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert sources.split_range(0, 500, 4, min_rows=1000) == [(0, 500)]
    assert sources.split_range(5, 5, 2) == []


def test_anchor_is_created_once(tmp_path) -> None:
    path = str(tmp_path / "a" / "op.anchor")
    assert sources.read_or_create_anchor(path, 12.5) == 12.5
    assert sources.read_or_create_anchor(path, 99.0) == 12.5


def test_line_index_skips_header_blank_and_partial_lines(tmp_path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"a,b\n1,2\n\n3,4\n5,")
    index = sources.LineIndex(str(path), skip_header=True)
    index.refresh()
    assert len(index.ends) == 2
    lo, hi = index.byte_range(0, 2)
    assert path.read_bytes()[lo:hi] == b"1,2\n\n3,4\n"
    with open(path, "ab") as f:
        f.write(b"6\n")
    index.refresh()
    assert len(index.ends) == 3


def test_append_log_writes_each_batch_once_and_heals_torn_appends(tmp_path) -> None:
    log = sinks.JsonlAppendLog(str(tmp_path / "out.jsonl"))
    assert log.append(0, ['{"a":1}'])
    assert log.append(1, ['{"a":2}', '{"a":3}'])
    assert not log.append(1, ['{"a":2}', '{"a":3}'])  # replayed batch id
    with open(log.path, "ab") as f:  # a crash mid-append of batch 2
        f.write(b'{"a":4')
    restarted = sinks.JsonlAppendLog(log.path)
    assert restarted.append(2, ['{"a":4}'])
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [json.loads(x)["a"] for x in lines] == [1, 2, 3, 4]


def test_empty_batches_write_nothing_yet_still_heal_a_torn_append(tmp_path) -> None:
    log = sinks.JsonlAppendLog(str(tmp_path / "out.jsonl"))
    assert log.append(0, ['{"a":1}'])
    mark = (tmp_path / "out.jsonl.commit").read_text()
    assert log.append(1, [])
    assert (tmp_path / "out.jsonl.commit").read_text() == mark  # no new mark for nothing
    with open(log.path, "ab") as f:  # a crash mid-append of batch 2
        f.write(b'{"a":')
    assert sinks.JsonlAppendLog(log.path).append(2, [])
    assert (tmp_path / "out.jsonl").read_text() == '{"a":1}\n'
    assert log.append(3, ['{"a":2}'])
    assert [json.loads(x)["a"] for x in (tmp_path / "out.jsonl").read_text().splitlines()] == [1, 2]


def test_a_new_run_appends_after_an_earlier_runs_results(tmp_path) -> None:
    path = str(tmp_path / "out.jsonl")
    first = sinks.JsonlAppendLog(path, owner="/state/run-1/checkpoint")
    assert first.append(0, ['{"a":1}']) and first.append(5, ['{"a":2}'])
    with open(path, "ab") as f:  # the first run died mid-append
        f.write(b'{"a":')
    second = sinks.JsonlAppendLog(path, owner="/state/run-2/checkpoint")
    assert second.append(0, ['{"a":3}'])  # batch 0 of another checkpoint is new data
    assert not second.append(0, ['{"a":3}'])  # but a replay within the run is not
    assert [json.loads(x)["a"] for x in (tmp_path / "out.jsonl").read_text().splitlines()] == [
        1, 2, 3]


def test_restart_decision_backs_off_and_gives_up() -> None:
    assert decide_restart(0, 3, 1.0).delay_seconds == 1.0
    assert decide_restart(2, 3, 1.0).delay_seconds == 4.0
    assert decide_restart(2, 3, 1.0).restart
    assert not decide_restart(3, 3, 1.0).restart


def test_backlog_from_progress() -> None:
    progress = {"sources": [{"latestOffset": '{"index":50}', "endOffset": '{"index":20}'},
                            {"latestOffset": {"seq": 4}, "endOffset": {"seq": 4}}]}
    assert backlog_of(progress) == 30


def test_durations_and_names() -> None:
    assert parse_duration("250 milliseconds") == timedelta(milliseconds=250)
    assert parse_duration("2 minutes") == timedelta(minutes=2)
    spelled = {ms: canonical_duration(ms) for ms in (0, 250, 10_000, 120_000, 7_200_000)}
    assert spelled == {0: "0 seconds", 250: "250 milliseconds", 10_000: "10 seconds",
                       120_000: "2 minutes", 7_200_000: "2 hours"}
    assert all(parse_duration(text) == timedelta(milliseconds=ms) for ms, text in spelled.items())
    with pytest.raises(ValueError, match="not '<n>"):
        parse_duration("10 sec; DROP")
    left = Schema.of(("k", "string"), ("ts", "timestamp"))
    right = Schema.of(("k", "string"), ("v", "double"))
    assert join_output_names(left, right, "r") == ["r_k", "v"]


def test_aggregate_types() -> None:
    assert aggregate_type("count", None) is ColumnType.INT
    assert aggregate_type("avg", Field("v", ColumnType.INT)) is ColumnType.DOUBLE
    assert aggregate_type("sum", Field("v", ColumnType.INT)) is ColumnType.INT
    with pytest.raises(ValueError, match="numeric"):
        aggregate_type("sum", Field("s", ColumnType.STRING))


def test_input_counter_counts_each_batch_of_each_run_once() -> None:
    from executor.task_runner import InputCounter

    counter = InputCounter()
    first = [{"runId": "a", "batchId": 0, "numInputRows": 10},
             {"runId": "a", "batchId": 1, "numInputRows": 5}]
    assert counter.add(first) == 15
    assert counter.add(first + [{"runId": "a", "batchId": 2, "numInputRows": 1}]) == 16
    # a restarted query is a new run: its batch ids carry on from the checkpoint
    assert counter.add([{"runId": "b", "batchId": 2, "numInputRows": 7}]) == 23


def _report(run: str, batch: int, rows: int, trigger_ms: int, ran: bool = True) -> dict:
    """A progress dict as Spark 4.1 reports it: a batch that ran has `addBatch` among its
    durations; an idle trigger (no new data) only `latestOffset` and `triggerExecution`."""
    durations = {"triggerExecution": trigger_ms, "latestOffset": 1}
    if ran:
        durations.update(addBatch=max(0, trigger_ms - 5), queryPlanning=2)
    return {"runId": run, "batchId": batch, "numInputRows": rows, "durationMs": durations}


def test_busy_time_sums_each_executed_batch_of_each_run_once() -> None:
    from executor.task_runner import InputCounter

    counter = InputCounter()
    first = [_report("a", 0, 10, 1100), _report("a", 1, 5, 200)]
    counter.add(first)
    assert counter.busy_ms == 1300
    counter.add(first + [_report("a", 2, 0, 40)])  # a no-data batch that ran (state cleanup)
    assert (counter.total, counter.busy_ms, counter.batches) == (15, 1340, 3)
    counter.add([_report("b", 2, 7, 90)])  # a restart: a new run goes on from the checkpoint
    assert (counter.total, counter.busy_ms, counter.batches) == (22, 1430, 4)


def test_an_idle_trigger_neither_counts_nor_claims_the_next_batch_id() -> None:
    """Spark reports an idle trigger under the id of the batch it has not run yet (seen on
    Spark 4.1.4: batch 0 ran, then `1 rows=0 [latestOffset, triggerExecution]`, then batch 1
    with its rows); the batch that follows must still be counted, rows and time."""
    from executor.task_runner import InputCounter

    counter = InputCounter()
    counter.add([_report("a", 0, 1, 1124), _report("a", 1, 0, 1, ran=False)])
    assert (counter.total, counter.busy_ms, counter.batches) == (1, 1124, 1)
    counter.add([_report("a", 1, 0, 1, ran=False), _report("a", 1, 2, 204)])
    assert (counter.total, counter.busy_ms, counter.batches) == (3, 1328, 2)


def test_running_clock_times_the_batch_running_now_from_when_it_was_first_seen() -> None:
    from executor.task_runner import RunningClock

    clock = RunningClock()
    assert clock.running_ms(counted=0, running=False, now=10.0) == 0
    assert clock.running_ms(counted=0, running=True, now=11.0) == 0  # first seen now
    assert clock.running_ms(counted=0, running=True, now=14.5) == 3500
    # the batch ended (its time joined the counted busy time) and another runs: timed anew
    assert clock.running_ms(counted=3900, running=True, now=15.0) == 0
    assert clock.running_ms(counted=3900, running=True, now=15.25) == 250
    assert clock.running_ms(counted=4200, running=False, now=16.0) == 0
    # idle between two batches with the same counted time (a read missed the end): anew
    assert clock.running_ms(counted=4200, running=True, now=17.0) == 0
    assert clock.running_ms(counted=4200, running=True, now=16.0) == 0  # never negative


def test_only_a_trigger_processing_new_data_counts_as_running() -> None:
    from executor.task_runner import processing

    assert processing({"isTriggerActive": True, "message": "Processing new data",
                       "isDataAvailable": True})
    assert not processing({"isTriggerActive": False, "message": "Processing new data"})
    assert not processing({"isTriggerActive": True, "message": "Getting offsets from x"})
    assert not processing({"isTriggerActive": True,
                           "message": "No new data but cleaning up state"})
    assert not processing({})


def test_metrics_carry_the_busy_time_they_are_given() -> None:
    from executor.task_runner import metrics_from

    m = metrics_from(_report("a", 4, 3, 250), batches=5, tuples_out=2, tuples_in=9, busy_ms=777)
    assert (m.busy_ms, m.batch_ms, m.tuples_in, m.batch_id) == (777, 250, 9, 4)


def test_a_source_micro_batch_is_bounded_to_about_48_mb_of_its_rows() -> None:
    sensor = shapes.shape_named("sensor").columns
    cap = sources.batch_row_cap(sensor)
    assert cap == sources.MAX_BATCH_BYTES // 56  # 32 (string) + 3 x 8 bytes a row
    assert sources.capped(None, 10**9, cap) == 10**9  # the start not known: no cap
    assert sources.capped(100, 10**9, cap) == 100 + cap
    assert sources.capped(100, 150, cap) == 150


def test_planned_start_is_the_one_source_with_that_offset_key(tmp_path) -> None:
    offsets = tmp_path / "offsets"
    assert sources.planned_start(str(tmp_path), "index") == 0
    offsets.mkdir()
    (offsets / "3").write_text('v1\n{"batchWatermarkMs":0}\n{"index":900}\n{"seq":4}\n')
    assert sources.planned_start(str(tmp_path), "index") == 900
    assert sources.planned_start(str(tmp_path), "line") is None
    (offsets / "4").write_text('v1\n{}\n{"index":900}\n{"index":7}\n')  # two generators
    assert sources.planned_start(str(tmp_path), "index") is None


def test_a_generator_backlog_comes_in_bounded_micro_batches(tmp_path) -> None:
    """Planner-side calls of the generator reader (plain Python): an hour of backlog at
    1M rows/s is taken at most `batch_row_cap` rows per micro-batch, resuming where Spark's
    offset log says after a restart."""
    sensor = shapes.shape_named("sensor").columns
    anchor = tmp_path / "pacing" / "gen.anchor"
    anchor.parent.mkdir()
    anchor.write_text(json.dumps({"anchor": 0.0, "rate": 1e6}))  # started long ago
    config = sources.GeneratorConfig("t", "gen", "sensor", sources.schema_pairs(sensor), 1,
                                     1e6, None, 0, str(anchor), 2)
    cap = sources.batch_row_cap(sensor)
    reader = sources.GeneratorReader(config)
    start = reader.initialOffset()
    first = reader.latestOffset()
    assert first == {"index": cap}
    assert reader.latestOffset() == {"index": 2 * cap}
    spark = tmp_path / "spark" / "offsets"
    spark.mkdir(parents=True)
    (spark / "0").write_text('v1\n{}\n' + json.dumps(first))
    restarted = sources.GeneratorReader(config)
    assert restarted.latestOffset() == {"index": 2 * cap}
    assert start == {"index": 0}
    large = sources.GeneratorReader(replace(config, batch_bytes=sources.LARGE_BATCH_BYTES))
    large_cap = sources.batch_row_cap(sensor, sources.LARGE_BATCH_BYTES)
    assert large_cap > 4 * cap
    assert large.latestOffset() == {"index": cap + large_cap}  # from the planned 1st batch end
