"""Load shedding on real executors (issue 32): the scheduler starts shedding under an overload
no capacity can be added for, and stops when the load falls; the sink keeps exact results.

One agent, so the automatic `heavy` project (max-parallelism 2, testkit/shed_support.py) is
held at one instance by the elastic policy's bound. The generator's rate is raised (a control
tuple, as `elastiq control Q src rate N` sends) to several times what the instance processes;
the test waits until the scheduler sheds (the status' shedding section: a ratio > 0, a
decision `shed (overload)`, rows dropped, `elastiq_task_rows_dropped_total` in /metrics), then
lowers the rate and waits until every ratio is back to 0 (a decision `release`), then raises it
until rows read after the release reach the sink, and pauses the generator until the sink holds
every row read. The sink is compared with a plain-Python oracle: every row is the
correct result of its input row, none twice; the rows read before the first ratio took effect
and after the release took effect (the applied history's epochs, mapped to generator offsets by
Spark's offset log, recorded by a thread while the query runs: Spark purges all but the last 20
batches' files) are all there; the rows missing are exactly the `rows_dropped` the status
reports (the project keeps every row) and more than 0, all counted below the sink's highest id
(the generator reads its ids in order).
"""

from __future__ import annotations

import logging
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from common.api_client import RequestRejected
from testkit.e2e_support import (Stack, end_bounds, generator_offsets, module_stack,
                                 read_sink, recording_offsets, stop_query, submit,
                                 wait_running, wait_until)
from testkit.shed_support import (DROP, SOURCE, check_sink, dropped_of, oracle,
                                  ratio_changes, ratio_of, shedding_view, sink_key, spec)

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]
# Not in the default run yet, for CI time, not for flakiness: its bookkeeping no longer depends
# on timing and it passed every run with the final code (82-140 s; 294-384 s beside a busy
# core, most of it waiting for the rows the overload queued), but at that length it would put
# the suite past its 25 minutes. Bounding the overload by the instance's measured rate is the
# next step (docs/load.md). Run it with ELASTIQ_SHED_CLUSTER=1.
pytestmark.append(pytest.mark.skipif(os.environ.get("ELASTIQ_SHED_CLUSTER") != "1",
                                     reason="CI time; ELASTIQ_SHED_CLUSTER=1 runs it"))
log = logging.getLogger("tests.shedding")

QUERY = "e2e-shed"
FIELDS = 12  # heavy fields: one instance carries ~800 rows/s here (local[3], 2 cores)
BASE = 200  # rows/s while the query starts
# rows/s: about three times what the instance processes, so the elastic policy sees an
# emergency (rows queueing at least as fast as processed) while the new instance stabilizes
OVERLOAD = 2400
LOW = 1  # rows/s once the overload ends, until the release: next to nothing arrives
# rows/s after the release: a sixteenth of the instance's quiet capacity, so a machine loaded
# by a neighbour does not make it shed again (beside a busy core and another test suite the
# instance processed ~105 rows/s; at 150 it shed again after the release)
FINISH = 50
PAUSE = 0.001  # rows/s at the end (the least rate a control tuple sets): the reads stop
# far more than the test reads: the generator never runs out, whatever a loaded machine's
# delays (a limit of 80,000 ran out before the release once in CI); the sink is checked over
# the ids below its highest, once it stopped growing
LIMIT = 200_000
AFTER_RELEASE = 500  # rows read after the release that must reach the sink
SOURCE_PARAMS = {"shape": "sequence", "rate": str(BASE), "seed": "5", "limit": str(LIMIT)}



@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One agent, so the heavy project cannot scale out. Its executor's Spark runs local[3]:
    the heavy instance's micro-batches take two Spark cores (its channel source's two
    partitions), and with local[2] the generator's batches waited for them, grew with each
    wait and sent ever larger channel batches, which the instance must take whole (a batch
    of 68,000 rows took 105 s; nothing showed a queue to the policies). With a third core the
    generator keeps its pace beside the instance, as on an agent of its own."""
    yield from module_stack(tmp_path_factory.mktemp("shed-stack"), "shedding",
                            cpus_per_agent=2.5, agents=1, spark_cores=3)


class Watch:
    """Polls the query's status; keeps every distinct shedding decision it saw."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.decisions: list[dict[str, Any]] = []
        self.elastic = ""  # the elastic policy's latest explanation (logged when it changes)

    def status(self) -> dict[str, Any]:
        status = self.stack.status(QUERY)
        decision = shedding_view(status).get("decision")
        if decision and (not self.decisions or self.decisions[-1]["at"] != decision["at"]):
            self.decisions.append(decision)
            log.info("shedding decision: %s (%s): %s", decision["kind"], decision["reason"],
                     decision["explanation"])
        elastic = (status.get("elastic") or [{}])[0].get("decision") or {}
        if elastic.get("explanation", "") != self.elastic:
            self.elastic = elastic.get("explanation", "")
            log.info("elastic decision: %s (%s): %s", elastic.get("kind"),
                     elastic.get("reason"), self.elastic)
        return status

    def seen(self, kind: str, reason: str | None = None) -> bool:
        return any(d["kind"] == kind and (reason is None or d["reason"] == reason)
                   for d in self.decisions)

    def figures(self) -> str:
        status = self.stack.status(QUERY)
        return "\n".join([f"shedding: {shedding_view(status)}"] + [
            f"{t['task_id']}: {t['state']} {t['figures']}" for t in status.get("tasks", [])] +
            [f"decisions: {[(d['kind'], d['reason']) for d in self.decisions]}",
             f"elastic: {self.elastic}"])


def set_rate(stack: Stack, rate: float) -> None:
    """The generator's rate, sent until taken (a query takes one control request at a time:
    one of the shedding policy's may be pending) and waited for until applied."""
    client = stack.client()

    def asked() -> str | None:
        try:
            return client.control(QUERY, [(SOURCE, "rate", str(rate))])["request"]
        except RequestRejected as exc:
            if exc.status != 409 and "still being applied" not in str(exc):
                raise
            return None

    request = wait_until(asked, 120, f"the rate {rate} accepted", step=0.5)
    view = wait_until(lambda: (v := client.control_status(QUERY, request))["state"] != "pending"
                      and v, 120, f"the rate {rate} applied", step=0.2)
    assert view["state"] == "applied", view



def max_id(sink: Path) -> int:
    return max((r["id"] for r in read_sink(sink)), default=-1)


def caught_up(sink: Path, checkpoint: Path) -> None:
    """Until the sink holds the last row the generator's task read (its planned batches'
    end offset): with the generator paused, every row read is then at the sink or was shed."""
    def done() -> bool:
        read = max(generator_offsets(checkpoint).values(), default=0)
        return read > 0 and max_id(sink) + 1 >= read

    wait_until(done, 120, "the sink to hold every row read", step=0.5)


def rows_dropped_metric(stack: Stack, task: str) -> float:
    with urllib.request.urlopen(stack.api.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = re.compile(r'^elastiq_task_rows_dropped_total\{([^}]*)\} (\S+)$', re.M)
    return sum(float(value) for labels, value in pattern.findall(text)
               if f'task="{task}"' in labels and f'query="{QUERY}"' in labels)


def test_overload_at_the_bound_sheds_then_releases_and_the_sink_stays_exact(
        stack: Stack, tmp_path: Path) -> None:
    from compiler.pipeline import compile_spec_text

    began = time.monotonic()
    text = spec(QUERY, SOURCE_PARAMS, FIELDS, "out/shed.jsonl")
    query = compile_spec_text(text.encode(), str(tmp_path / f"{QUERY}.xml"),
                              base_dir=tmp_path, query_id=QUERY).query
    source_task = next(t.task_id for t in query.tasks if DROP in t.operators)
    sink = tmp_path / "out" / "shed.jsonl"
    expected = oracle(SOURCE_PARAMS, FIELDS)
    watch = Watch(stack)
    checkpoint = stack.work / "state" / source_task / "checkpoint"
    submit(stack, query)
    try:
        with recording_offsets(checkpoint) as offsets:
            history, status = overload_then_release(stack, watch, sink, checkpoint, source_task)
    finally:
        stop_query(stack, QUERY)
    rows = read_sink(sink)  # once stopped: a batch being appended may show its rows part-way

    dropped = dropped_of(status)
    below = max(r["id"] for r in rows) + 1  # every id under it was read (one generator, in order)
    checked = check_sink([sink_key(r, FIELDS) for r in rows], expected)
    missing = sorted(i for i in checked.missing if i < below)
    assert checked.sound, checked.describe()
    assert len(missing) == dropped > 0, (checked.describe(), below, dropped)
    changes = ratio_changes(history, source_task)
    assert changes and changes[0][1] > 0 and changes[-1][1] == 0, changes
    ends = offsets.ends()
    # rows below it were read while the ratio was 0; rows from it on after the release (bounds
    # by the batches around, should the record have missed the batch before either change)
    first_shed, _ = end_bounds(ends, changes[0][0] - 1)
    exact_release, released = end_bounds(ends, changes[-1][0] - 1)
    assert released is not None, ("no batch after the release recorded", changes, max(ends))
    assert released < below, ("no row was read after the release", released, below)
    assert missing[0] >= first_shed and missing[-1] < released, \
        (first_shed, released, missing[0], missing[-1])
    log.info("%s rows shed of %s read (ids %s..%s), first ratio %s, %s batches recorded "
             "(release batch %s), %.0f s in all", dropped, below, first_shed, released,
             changes[0][1], len(ends), "exact" if exact_release == released else "bounded",
             time.monotonic() - began)


def overload_then_release(stack: Stack, watch: Watch, sink: Path, checkpoint: Path,
                          source_task: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Overload until the scheduler sheds, crawl until it releases, finish with rows read after
    the release, pause until the sink holds every row read; the control history and status."""
    began = time.monotonic()
    wait_running(stack, QUERY, timeout=180)
    wait_until(lambda: read_sink(sink), 180, "first rows at the sink")
    log.info("running after %.0f s; overload at %s rows/s", time.monotonic() - began, OVERLOAD)

    set_rate(stack, OVERLOAD)
    wait_until(lambda: ratio_of(watch.status()) > 0 and watch.seen("shed", "overload") and
               dropped_of(watch.status()) > 0, 180,
               "the scheduler to shed (ratio > 0, a decision shed (overload), rows dropped)",
               watch.figures, step=0.5)
    log.info("shedding after %.0f s: %s", time.monotonic() - began,
             shedding_view(watch.status()))
    wait_until(lambda: rows_dropped_metric(stack, source_task) > 0, 30,
               "elastiq_task_rows_dropped_total > 0 in /metrics", step=0.5)

    set_rate(stack, LOW)
    wait_until(lambda: ratio_of(watch.status()) == 0 and watch.seen("release"), 180,
               "every ratio back to 0 (a decision release)", watch.figures, step=0.5)
    log.info("released after %.0f s", time.monotonic() - began)
    read_by_release = max(generator_offsets(checkpoint).values(), default=0)
    set_rate(stack, FINISH)
    # behind the rows the overload queued in the instance's channel: 19-69 s here on a quiet
    # or shared machine, 170 s beside a busy core and a pure test run (the instance at ~200
    # rows/s of its ~800, the overload 12 times that)
    wait_until(lambda: max_id(sink) >= read_by_release + AFTER_RELEASE, 360,
               f"{AFTER_RELEASE} rows read after the release at the sink", watch.figures,
               step=1.0)
    set_rate(stack, PAUSE)
    caught_up(sink, checkpoint)
    return stack.client().control_status(QUERY)["history"], watch.status()
