"""Control tuples end to end on the embedded cluster: the scheduler service and its HTTP API,
real executor processes with Spark, a real ZeroMQ reader in the test.

One query `nums := generator; keep := filter(nums.id % 2 = 0); out := network-sink` (SPEC of
testkit/control_reader.py, which benchmarks/control.py runs too) runs while
the test, through the API and the CLI, moves the network sink to a second endpoint (the test's
reader follows it), changes the filter's condition, and sends every kind of bad tuple. What the
reader received is compared with a plain-Python oracle that switches condition at the
acknowledged epoch (whose first input index is read from Spark's offset log of the task).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from common.api_client import RequestRejected, SchedulerClient
from executor.channels.auth import KeyPair, ReaderAuth, key_hex, write_key_file
from testkit.control_reader import SPEC, FollowingReader, free_port
from testkit.e2e_support import (Stack, StackPool, StackShape, cli, submit, wait_running,
                                 wait_until)

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(420)]

# one stack for this module and tests/test_closed_loop_cluster.py, of the same shape
# (tests/conftest.py `stack_pool`)
STACK_SHAPE = StackShape(cpus_per_agent=2.5, agents=1)


@pytest.fixture(scope="module")
def stack(stack_pool: StackPool) -> Stack:
    return stack_pool.take(STACK_SHAPE, "test_control_cluster.py")


def end_index(checkpoint: Path, batch: int) -> int:
    """The generator's end offset after micro-batch `batch`, from Spark's offset log."""
    lines = (checkpoint / "spark" / "offsets" / str(batch)).read_text().splitlines()
    return int(json.loads(lines[-1])["index"])


def applied(client: SchedulerClient, query: str, tuples: list[tuple[str, str, str]],
            timeout: float = 60.0) -> dict[str, Any]:
    """Send tuples through the API and wait until every task acknowledged them."""
    request = client.control(query, tuples)["request"]
    return wait_until(lambda: (v := client.control_status(query, request))["state"] != "pending"
                      and v, timeout, f"acknowledgements of {tuples}")


def move_to_a_free_port(client: SchedulerClient, query: str,
                        attempts: int = 3) -> tuple[str, dict[str, Any]]:
    """Move the sink's writer (`target-addr`) to a port free when chosen; a move refused
    because another process took that port before the task bound it (a free port is in the
    kernel's ephemeral range, where any outgoing connection may take it: seen in CI beside the
    other test streams) is undone by the task, and the next attempt takes another port."""
    for _ in range(attempts):
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        moved = applied(client, query, [("out", "target-addr", endpoint)])
        if moved["state"] != "refused" or "Address already in use" not in str(moved):
            break
    return endpoint, moved


def current(client: SchedulerClient, query: str) -> dict[tuple[str, str], str]:
    view = client.control_status(query)
    return {(a["operator"], a["parameter"]): a["value"] for a in view["adjustable"]}


def test_control_tuples_move_the_writer_change_the_filter_and_refuse_bad_input(
        stack: Stack, tmp_path: Path) -> None:
    from compiler.pipeline import compile_spec_text

    first = f"tcp://127.0.0.1:{free_port()}"
    # the sink serves over CURVE (its key file as `elastiq keygen` writes it) to the one reader
    # it declares; the test reads as that reader, with its own keypair
    sink_keys, reader_keys = KeyPair.generate(), KeyPair.generate()
    write_key_file(str(tmp_path / "sink.key"), sink_keys)
    spec = SPEC.format(name="e2e-control", rate=200, condition="nums.id % 2 = 0", endpoint=first,
                       reader_key=key_hex(reader_keys.public), key_file=tmp_path / "sink.key")
    query = compile_spec_text(spec.encode(),
                              str(tmp_path / "e2e-control.xml"), base_dir=tmp_path).query
    submit(stack, query)
    wait_running(stack, "e2e-control", timeout=150)
    task_id = query.tasks[0].task_id
    checkpoint = stack.work / "state" / task_id / "checkpoint"
    client = stack.client()
    reader = FollowingReader(first, ReaderAuth(reader_keys, sink_keys.public)).start()
    try:
        wait_until(lambda: len(reader.ids()) >= 20, 120, "rows at the first endpoint")

        # the writer moves (the paper's target-addr); the reader follows once it is acknowledged
        second, moved = move_to_a_free_port(client, "e2e-control")
        assert moved["state"] == "applied", moved
        moved_at = moved["tasks"][task_id]["epoch"]
        reader.follow(second)
        wait_until(lambda: any(t >= moved_at + 2 for t in reader.tags()), 120,
                   "batches at the second endpoint")

        # the filter changes; the CLI prints where and when
        done = cli(stack, "control", "e2e-control", "keep", "condition", "nums.id % 3 = 0")
        assert done.returncode == 0, done.stderr
        assert f"{task_id} on agent" in done.stdout and "from micro-batch" in done.stdout, \
            done.stdout
        switched_at = int(done.stdout.split("from micro-batch ")[1].split()[0])
        listed = cli(stack, "control", "--list", "e2e-control")
        assert listed.returncode == 0 and "nums.id % 3 = 0" in listed.stdout, listed.stdout
        assert "(was nums.id % 2 = 0)" in listed.stdout and second in listed.stdout

        before = current(client, "e2e-control")
        version = client.control_status("e2e-control")["version"]
        bad = [("nosuch", [("keep", "condition", "nums.id > 1")], 404),
               ("e2e-control", [("nope", "condition", "true")], 404),
               ("e2e-control", [("keep", "colour", "red")], 400),
               ("e2e-control", [("src", "seed", "7")], 400),  # fixed: replays other data
               ("e2e-control", [("src", "rate", "fast")], 400),
               # a rate that is not finite or out of bounds (inf used to break the query)
               ("e2e-control", [("src", "rate", "inf")], 400),
               ("e2e-control", [("src", "rate", "nan")], 400),
               ("e2e-control", [("src", "rate", "-5")], 400),
               ("e2e-control", [("src", "rate", "1e12")], 400),
               ("e2e-control", [("keep", "condition", "nums.id >")], 400),
               ("e2e-control", [("keep", "condition", "nums.id + 1")], 400),
               ("e2e-control", [("keep", "condition", "nums.nosuch = 1")], 400),
               ("e2e-control", [("out", "endpoint", "udp://x")], 400),
               # one good tuple with a bad one: neither is applied
               ("e2e-control", [("src", "rate", "100"), ("keep", "condition", "nums.id >")], 400)]
        for query_id, tuples, status in bad:
            with pytest.raises(RequestRejected) as refused:
                client.control(query_id, tuples)
            assert refused.value.status == status, (tuples, refused.value)
        assert current(client, "e2e-control") == before
        assert client.control_status("e2e-control")["version"] == version

        # a target the task cannot serve on (the port is taken): refused by the task, undone
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
            answer = applied(client, "e2e-control", [("out", "endpoint", busy)])
            assert answer["state"] == "refused", answer
        assert current(client, "e2e-control") == before
        wait_until(lambda: stack.tasks("e2e-control")[task_id]["state"] == "running", 30,
                   "the task to run on")
        last_tag = max(reader.tags())
        wait_until(lambda: max(reader.tags()) >= last_tag + 3, 120,
                   "batches after the refused change, at the second endpoint")
    finally:
        reader.close()
        stack.service.stop_query("e2e-control")

    # every tuple reached exactly one endpoint, in order, none lost, none twice
    seqs = [seq for seq, *_ in reader.batches]
    assert seqs == sorted(set(seqs)), "batches out of order or twice"
    assert all(ep == second for _, tag, ep, _ in reader.batches if tag >= moved_at), \
        "a batch made after the move came from the old endpoint"
    assert any(ep == first for _, _, ep, _ in reader.batches)
    boundary = end_index(checkpoint, switched_at - 1)
    end = end_index(checkpoint, max(reader.tags()))
    expected = [i for i in range(boundary) if i % 2 == 0] + \
               [i for i in range(boundary, end) if i % 3 == 0]
    assert sorted(reader.ids()) == expected
    assert reader.ids() == sorted(reader.ids()), "rows out of order"
