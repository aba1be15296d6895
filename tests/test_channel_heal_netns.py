"""A channel's reader notices a healed partition within a bound, between real network namespaces
(docs/availability.md, "Between network namespaces": noticing the heal).

A writer serves its channel from a host of its own (a network namespace on a private bridge,
`testkit.netns`; the source process of `testkit.dpc_netns`, the product's `ChannelWriter`, one
batch per 0.5 s); the product's `ChannelReader` reads it in this process's namespace over a veth.
The host's bridge port goes down for CUT_SECONDS: packets are dropped, nothing is reset, ZeroMQ's
heartbeat closes the reader's connection 3-4 s into the cut and its reconnect sends SYNs that are
dropped. Without a connect timeout the kernel retries that one SYN: on this machine's kernel
(6.18, `tcp_syn_linear_timeouts` 4) 1 s apart four times, then 2, 4 and 8 s apart (seen with
`ss`: about 11 and 19 s after the close), later ones further apart; older kernels double from
1 s. A heal at 17 s waits for the SYN near 22-23 s (measured: the next batch 6.50 and 6.64 s after
the heal without the fix; on an older kernel the retry near 18-19 s would come within the bound,
so there the test proves the bound, not the old delay). With the reader's `CONNECT_TIMEOUT_MS` a
pending connect is given up and a fresh one (a fresh SYN) made every ~1.2 s, so the writer's next
batch arrives within HEAL_BOUND of the heal, however long the cut. Every row read is checked
against the plain-Python rows of the generator (`testkit.dpc_support.input_rows`): the same rows,
in order, none twice.
No Spark; skipped with the reason when namespaces cannot be created here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from executor.channels.base import CONNECT_TIMEOUT_MS, RECONNECT_IVL_MAX_MS
from testkit.dpc_netns import SourceHost, due_rows
from testkit.dpc_support import READING_FIELDS, input_rows
from testkit.netns import NetnsNetwork, netns_unavailable
from testkit.waiting import wait_for

HOST, CHANNEL, READER, SEED = "w", "w.raw", "heal-reader", 1
RATE = 10.0  # rows/s: a small batch every 0.5 s
CUT_SECONDS = 17.0  # between two retries of the reconnect's SYN without the fix (see above)
LIMIT = int(RATE * (CUT_SECONDS + 6))  # the writer sends until a few seconds past the heal
# The bound from the heal to the next batch: a connect attempt's timeout, ZeroMQ's reconnect
# interval (up to twice RECONNECT_IVL_MS), the CURVE-less handshake and the resubscription (ms
# on a veth), and slack for a loaded 2-core machine
HEAL_BOUND = 3.0


@pytest.fixture
def net() -> Iterator[NetnsNetwork]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    network = NetnsNetwork((HOST,)).create()
    try:
        yield network
    finally:
        network.close()
        assert not network.leftovers(), f"namespaces left behind: {network.leftovers()}"


class Received:
    """What the reader got: rows in order, and when each batch arrived (monotonic)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.rows: list[dict[str, Any]] = []
        self.arrivals: list[float] = []

    def take(self, timeout: float = 0.1) -> bool:
        """Poll once; True when a batch arrived (its rows kept, acknowledged)."""
        batches = self.reader.poll(timeout)
        for b in batches:
            self.rows.extend(b.table.to_pylist())
            self.arrivals.append(time.monotonic())
            self.reader.ack(b.seq)
        return bool(batches)

    def holds(self, rows: int) -> bool:
        """Poll once; whether `rows` rows have arrived."""
        self.take(0.05)
        return len(self.rows) >= rows

    def first_after(self, instant: float) -> float | None:
        return next((t - instant for t in self.arrivals if t > instant), None)


def _reader(endpoint: str) -> Any:
    from common.types import Schema
    from executor import shapes
    from executor.channels import ChannelReader

    wire = shapes.arrow_schema(Schema.of(*READING_FIELDS))
    return ChannelReader(CHANNEL, READER, endpoint, wire)


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_reader_gets_the_writers_next_batch_within_a_bound_of_a_healed_partition(
        tmp_path: Path, net: NetnsNetwork) -> None:
    """Cut for CUT_SECONDS, then healed: the next batch within HEAL_BOUND of the heal; nothing
    during the cut; every row read equal to the generator's, in order."""
    assert CONNECT_TIMEOUT_MS <= 1000 and RECONNECT_IVL_MAX_MS == 0  # what the bound rests on
    source = SourceHost(net, HOST, CHANNEL, SEED, RATE, LIMIT, [READER], tmp_path)
    reader = None
    try:
        reader = _reader(source.endpoint)
        got = Received(reader)
        reader.subscribe(1, timeout=30)
        go = time.time()
        source.go(go)
        wait_for("the first batch", got.take, 30, 0.01)
        net.cut(HOST)
        cut_at = time.monotonic()
        while time.monotonic() - cut_at < CUT_SECONDS:
            got.take(min(0.5, max(0.01, CUT_SECONDS - (time.monotonic() - cut_at))))
        assert got.first_after(cut_at + 1.0) is None, "a batch crossed the cut"
        net.restore(HOST)
        healed, sent = time.monotonic(), due_rows(time.time() - go, RATE, LIMIT)
        wait_for("a batch after the heal", got.take, 60, 0.01)
        after = got.first_after(healed)
        assert after is not None
        wait_for("the rows sent during the cut",
                 lambda: got.holds(sent), 30, 0.01)
        print(f"channel heal: the writer's next batch {after:.2f} s after the heal of a "
              f"{CUT_SECONDS:.0f} s cut (bound {HEAL_BOUND} s)")
        expected = [{k: r[k] for k, _ in READING_FIELDS} for r in input_rows(SEED, RATE, LIMIT)]
        assert got.rows == expected[:len(got.rows)], "rows differ from the generator's"
        assert after <= HEAL_BOUND
    finally:
        if reader is not None:
            reader.close(0)
        source.close()
