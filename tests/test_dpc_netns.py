"""Borealis DPC between real network namespaces (docs/availability.md, "Between network
namespaces"; issue 34's goal): a union and a join of two sources on two hosts, the link to one
cut in the network, not in a proxy.

Sources a1 and a2 each run as a process on a host of their own (a network namespace on a
private bridge, `testkit.netns`), serving their channel with the product's channel writer
(`testkit.dpc_netns`); tasks "dpc" (`max-delay="3 seconds"`) and "plain" (none) run in this
process's SparkSession and union both channels over a veth, counting per sensor and second
(`testkit.dpc_support`), and task "join" (`max-delay="3 seconds"`) joins a1's rows with a2's on
the sensor within JOIN_WITHIN (`testkit.dpc_join_support`), all behind the same cut
(`cut_runs`). a2's bridge port goes down for CUT_SECONDS: its packets are dropped, no connection
is reset, and a2 runs on, retaining what it sends. With max-delay, results keep coming during
the cut, marked tentative (the join's pairs a subset of the exact ones), and after the heal each
sink's stable view equals a plain-Python oracle over all input; without it nothing is marked and
results resume after the heal. Skipped with the reason when namespaces cannot be created here
(not root, no iproute2, kernel forbids)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest

from executor.spool_receiver import PROBE_SECONDS, PROBE_TIMEOUT
from testkit.dpc_netns import HOSTS, NetnsUpstreams, due_rows
from testkit.dpc_join_support import check_join_cut, joined_within, oracle_pairs
from testkit.dpc_support import (TRIGGER_SECONDS, Downstream, check_union_cut, cut_runs, oracle,
                                 union_counts)
from testkit.netns import NetnsNetwork, netns_unavailable

# 25 s of input per source: ~10 s before the cut, ~7 s after the heal. 50 rows/s, not the
# benchmark's 200: the join's pairs grow with the square of the rate (~37,000 here)
RATE, LIMIT = 50.0, 1250
MAX_DELAY = 3.0  # the issue's
# The join's window: wider than the time to notice the cut (the probe, ~1 s) plus a source's
# batch, so the live rows released after the delay still meet a2's rows held from before it
JOIN_WITHIN = timedelta(seconds=3)
CUT_SECONDS = 8.0  # long enough for max-delay, the probe and a few tentative batches
# The bound on the first tentative row: max-delay, the probe that notices the cut (a silent
# writer is asked after PROBE_SECONDS, unreachable after PROBE_TIMEOUT more), one micro-batch,
# and LOADED_SLACK for a loaded 2-core machine (the same slack as tests/test_dpc_runtime.py;
# measured there up to 3.1 s past max-delay under a load average of 5-10)
LOADED_SLACK = 5.0
FIRST_TENTATIVE_BOUND = MAX_DELAY + PROBE_SECONDS + PROBE_TIMEOUT + TRIGGER_SECONDS + LOADED_SLACK


@pytest.fixture
def net() -> Iterator[NetnsNetwork]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    network = NetnsNetwork(HOSTS).create()
    try:
        yield network
    finally:
        network.close()
        assert not network.leftovers(), f"namespaces left behind: {network.leftovers()}"


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_a_partitioned_source_goes_tentative_and_is_corrected_with_max_delay_unmarked_without(
        spark: Any, tmp_path: Path, net: NetnsNetwork) -> None:
    """With max-delay: tentative rows within FIRST_TENTATIVE_BOUND of the cut, and after the
    heal a stable view equal to the oracle (the reconcile time printed). Without it (the same
    cut): nothing marked, results after the heal, no window above the oracle. The join with
    max-delay: tentative pairs within the same bound, all in the exact join, and a stable view
    equal to the plain-Python join over all input."""
    delay = f"{int(MAX_DELAY)} seconds"
    runs = cut_runs(spark, tmp_path, rate=RATE, limit=LIMIT, cut_seconds=CUT_SECONDS,
                    tasks=(Downstream("dpc", union_counts, delay),
                           Downstream("plain", union_counts, None),
                           Downstream("join", joined_within(JOIN_WITHIN), delay)),
                    upstreams=NetnsUpstreams.on(net))
    run, plain, join = runs["dpc"], runs["plain"], runs["join"]
    expected = oracle(RATE, LIMIT)
    assert run.first_tentative is not None and run.reconcile is not None
    print(f"netns: first tentative row {run.first_tentative:.2f} s after the cut (bound "
          f"{FIRST_TENTATIVE_BOUND:.1f} s), results in the cut at most "
          f"{run.extra_latency or float('nan'):.2f} s later than normal; reconciled in "
          f"{run.reconcile:.2f} s after a {CUT_SECONDS} s cut "
          f"({run.phases['heal to reconciled']:.2f} s from the heal); "
          f"{len(run.tentative)} tentative rows replaced")
    lost = check_union_cut(run, plain, expected, FIRST_TENTATIVE_BOUND, 2 * LIMIT)
    print(f"netns, without max-delay: {lost}")
    expected_pairs = oracle_pairs(RATE, LIMIT, JOIN_WITHIN)
    assert join.first_tentative is not None and join.reconcile is not None
    print(f"netns join: first tentative pair {join.first_tentative:.2f} s after the cut; "
          f"reconciled in {join.reconcile:.2f} s ({join.phases['heal to reconciled']:.2f} s "
          f"from the heal); {len(join.tentative)} tentative pairs replaced; "
          f"{sum(expected_pairs.values())} pairs")
    check_join_cut(join, expected_pairs, FIRST_TENTATIVE_BOUND)


def test_a_source_host_releases_row_i_at_i_over_rate_up_to_its_limit() -> None:
    """`due_rows` (the source process's pacing) against counting the rows whose time came."""
    rate, limit = 200.0, 50
    for elapsed in (-0.1, 0.0, 0.004, 0.005, 0.1, 0.2449, 0.25, 1.0, 9.0):
        expected = sum(1 for i in range(limit) if i / rate <= elapsed)
        assert due_rows(elapsed, rate, limit) == expected, elapsed
