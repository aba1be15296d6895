"""Published streams on the embedded cluster (docs/queries.md): query shared-writer publishes
its hot readings, query shared-reader reads them by name. Real executors and SparkSessions, the
channel between the two queries over real ZeroMQ with CURVE keys the scheduler issued; the
reader's sink is checked against a plain-Python oracle of the writer's generator (filter and
projection recomputed in Python). Then the stop rules: stopping the writer is refused (409,
naming the reader) while it is read; stopping the reader leaves the writer running (same
attempt, still producing); the writer then stops.

Automatic sharing: query auto-writer's hot readings feed two sinks (a channel of its own, not
published); query auto-reader, sent through the API with the same generator and filter under
other names, reads that channel instead of running them (one task, no generator), its writer
told of it by a `readers` message; its sink is exact against the oracle from the first row it
got (a contiguous run of the writer's stream: none lost, none twice); the writer's stop is
refused while it is read."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import os

import pytest

from common.api_client import RequestRejected
from compiler.pipeline import compile_spec_file
from elastiq.explain import explain
from executor import shapes
from testkit.e2e_support import (DEFAULT_START, SPECS, Stack, _start_us, compile_spec,
                                 multiset_diff, read_sink, sink_path, spec_params, module_stack,
                                 stop_query, submit, wait_running, wait_until)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]
WRITER, READER = "e2e-shared-writer.xml", "e2e-shared-reader.xml"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from module_stack(tmp_path_factory.mktemp("sharing-stack"), "sharing")


def oracle_prefix(n_rows: int, writer: str = WRITER) -> list[tuple[Any, ...]]:
    """The reader's first `n_rows` output rows in plain Python: the writer's generator rows,
    filtered by temp > 30 and projected to (sensor, ts, temp * 1.8 + 32)."""
    params = spec_params(writer)["src"]
    shape = shapes.shape_named(params["shape"])
    seed, rate = int(params["seed"]), float(params["rate"])
    start_us = _start_us(params.get("start", DEFAULT_START))
    found: list[tuple[Any, ...]] = []
    index = 0
    while len(found) < n_rows:
        row = shapes.reference_row(shape, seed, start_us, rate, index)
        index += 1
        if row["temp"] > 30:
            found.append((row["sensor"], row["ts"], round(row["temp"] * 1.8 + 32, 9)))
    return found


def sink_rows(path: Path) -> Counter:
    return Counter((r["sensor"], r["ts"], round(r["fahrenheit"], 9)) for r in read_sink(path))


def exact_prefix(path: Path, at_least: int) -> Counter:
    """Wait until the sink holds at least `at_least` rows and they are exactly the oracle's
    first rows (none lost, none twice, nothing else)."""
    def check() -> Counter | None:
        got = sink_rows(path)
        n = sum(got.values())
        return got if n >= at_least and got == Counter(oracle_prefix(n)) else None
    return wait_until(check, 180, f"the reader's sink to hold the oracle's first {at_least} rows",
                      lambda: multiset_diff(Counter(oracle_prefix(sum(sink_rows(path).values()))),
                                            sink_rows(path)))


def test_a_query_reads_another_querys_published_stream(stack: Stack) -> None:
    writer, reader = compile_spec(WRITER, stack.work), compile_spec(READER, stack.work)
    submit(stack, writer)
    submit(stack, reader)
    wait_running(stack, "shared-writer", timeout=180)
    wait_running(stack, "shared-reader", timeout=180)
    assert len(stack.tasks("shared-writer")) == 1 and len(stack.tasks("shared-reader")) == 1
    assert stack.status("shared-writer")["published"] == [
        {"channel": "shared-writer/hotReadings", "task": "shared-writer.t0",
         "readers": ["shared-reader"]}]
    exact_prefix(sink_path(stack.work, READER, "sink"), at_least=200)

    client = stack.client()
    with pytest.raises(RequestRejected) as refused:
        client.stop("shared-writer")
    assert refused.value.status == 409
    assert "shared-writer/hotReadings is read by shared-reader" in str(refused.value)
    assert stack.status("shared-writer")["phase"] == "active"

    before = stack.tasks("shared-writer")["shared-writer.t0"]
    stop_query(stack, "shared-reader")
    produced = before["figures"].get("tuples_out", 0)
    wait_until(lambda: (t := stack.tasks("shared-writer")["shared-writer.t0"])["state"] ==
               "running" and t["attempt"] == before["attempt"] and
               t["figures"].get("tuples_out", 0) > produced + 100, 120,
               "the writer to go on producing after its reader stopped",
               lambda: str(stack.tasks("shared-writer")))
    final = sink_rows(sink_path(stack.work, READER, "sink"))
    assert final == Counter(oracle_prefix(sum(final.values()))), "the reader's sink after stop"
    client.stop("shared-writer")  # nobody reads it now
    wait_until(lambda: stack.status("shared-writer")["phase"] == "stopped", 60,
               "the writer to stop")


AUTO_WRITER, AUTO_READER = "e2e-auto-writer.xml", "e2e-auto-reader.xml"


def exact_run(path: Path, at_least: int) -> Counter:
    """Wait until the sink holds at least `at_least` rows and they are exactly a contiguous run
    of the oracle's rows, from the first one the reader got (its earliest event time) on."""
    def expected(got: Counter) -> Counter:
        n = sum(got.values())
        first = min(ts for _, ts, _ in got) if got else None
        rows = oracle_prefix(n + 4 * at_least, AUTO_WRITER)
        k = next((i for i, r in enumerate(rows) if r[1] == first), 0)
        return Counter(rows[k:k + n])

    def check() -> Counter | None:
        got = sink_rows(path)
        return got if sum(got.values()) >= at_least and got == expected(got) else None
    return wait_until(check, 180, f"the automatic reader's sink to hold {at_least} rows, a "
                                  "contiguous run of the oracle's",
                      lambda: multiset_diff(expected(sink_rows(path)), sink_rows(path)))


def test_a_query_reads_an_equal_running_subgraph_instead_of_computing_it(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    from common.paths import ENV_VAR

    # the API compiles specs sent by clients within its path roots: the stack's folder
    monkeypatch.setenv(ENV_VAR, os.pathsep.join([str(stack.work), os.getcwd()]))
    specs = {name: stack.work / name for name in (AUTO_WRITER, AUTO_READER)}
    for name, path in specs.items():
        path.write_text((SPECS / name).read_text())
    client = stack.client()
    client.submit_spec(specs[AUTO_WRITER])
    wait_running(stack, "auto-writer", timeout=180)
    offers = client.share_offers()
    assert list(offers.values()) == ["auto-writer/hotReadings"]
    shown = explain(compile_spec_file(specs[AUTO_READER], offers=offers, plan_only=True))
    assert "warmRows: warm := filter(gen := generator)\n      read from " \
        "auto-writer/hotReadings (start: retained)" in shown  # elastiq explain --scheduler
    reply = client.submit_spec(specs[AUTO_READER])
    assert reply["query_id"] == "auto-reader" and reply["shared"] == ["auto-writer/hotReadings"]
    assert "reads auto-writer/hotReadings (in place of its operator " in reply["message"]
    wait_running(stack, "auto-reader", timeout=180)
    (task,) = stack.tasks("auto-reader").values()
    assert task["task_id"] == "auto-reader.t0"
    view = stack.status("auto-reader")
    assert view["reads"] == view["shared"] == ["auto-writer/hotReadings"]
    assert stack.status("auto-writer")["published"] == [
        {"channel": "auto-writer/hotReadings", "task": "auto-writer.t0",
         "readers": ["auto-reader"], "auto": True}]
    exact_run(sink_path(stack.work, AUTO_READER, "sink"), at_least=200)

    with pytest.raises(RequestRejected) as refused:
        client.stop("auto-writer")
    assert refused.value.status == 409
    assert "auto-writer/hotReadings is read by auto-reader" in str(refused.value)
    stop_query(stack, "auto-reader")
    final = sink_rows(sink_path(stack.work, AUTO_READER, "sink"))
    assert final == exact_run(sink_path(stack.work, AUTO_READER, "sink"), sum(final.values()))
    stop_query(stack, "auto-writer")
