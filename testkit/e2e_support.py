"""Helpers of the end-to-end tests (tests/test_end_to_end.py and the cluster tests) and the
benchmarks: the running stack, bounded waits with diffs, process lookups in /proc, and
plain-Python oracles.

Owns `Stack` (two embedded agents, the framework scheduler and its HTTP API, composed as
`elastiq run` composes them; `StackPool` for one shared by a test module and the next ones of
the same `StackShape`), `kill_executor`
(SIGKILL an agent's whole executor session), `wait_until` (poll with a time bound and a diff
on failure), `multiset_diff`, `recording_offsets` (every micro-batch's generator offset, read
before Spark purges it), reading spec parameters with the standard library's XML parser,
the oracles (generator rows from `executor.shapes.reference_row`, then filter / project /
union / windows / join computed in plain Python) and reading file sinks back. Does not own any
product behaviour and never compares against the system's own earlier output.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence,
                    TypeVar)

from common.api_client import RequestRejected
from executor import shapes
from testkit.waiting import wait_for

if TYPE_CHECKING:
    from scheduler.distributor import DistributionSettings

log = logging.getLogger("tests.e2e")
ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "tests" / "specs"
DEFAULT_START = "2024-01-01T00:00:00Z"
T = TypeVar("T")
Row = dict[str, Any]


# --- bounded waiting --------------------------------------------------------------------------

def wait_until(predicate: Callable[[], T], timeout: float, what: str,
               diff: Callable[[], str] | None = None, step: float = 0.25) -> T:
    """`waiting.wait_for` in the stack tests' argument order: poll `predicate` until it returns
    something truthy (returned); on timeout fail with `what` and `diff()` (expected vs actual)."""
    result: T = wait_for(what, predicate, timeout, step, diff)
    return result


def multiset_diff(expected: Counter, actual: Counter, show: int = 8) -> str:
    """What is missing from and extra in `actual`, as a short readable text."""
    missing, extra = expected - actual, actual - expected
    lines = [f"expected {sum(expected.values())} rows, got {sum(actual.values())}: "
             f"{sum(missing.values())} missing, {sum(extra.values())} extra (duplicates or wrong)"]
    for label, items in (("missing", missing), ("extra", extra)):
        for row, n in list(items.items())[:show]:
            lines.append(f"  {label} x{n}: {row}")
    return "\n".join(lines)


# --- ports and processes ----------------------------------------------------------------------

def below_ephemeral() -> tuple[int, int]:
    """Where the stacks' agents take their ports: from 20000 up to the kernel's ephemeral range,
    as `elastiq run`'s agents do (embedded_mesos.ports): in that range any process's outgoing
    connection or port-0 bind takes a port at any time (in a CI run the other test stream took
    a channel's port, and its task was relaunched)."""
    from embedded_mesos.ports import SEARCH_LOW, ephemeral_range

    high = ephemeral_range()[0] - 1
    if high - SEARCH_LOW < 1000:
        raise RuntimeError(f"the kernel's ephemeral ports start at {high + 1}: too few ports "
                           f"below it from {SEARCH_LOW} for the test stacks' agents")
    return SEARCH_LOW, high


def free_port_range(count: int, low: int | None = None,
                    high: int | None = None) -> tuple[int, int]:
    """A run of `count` consecutive ports that are free on 127.0.0.1 right now, in `low..high`
    (default: `below_ephemeral()`)."""
    if low is None or high is None:
        low, high = below_ephemeral()
    start = low + (os.getpid() * 7919) % (high - low - count)
    for attempt in range(200):
        base = low + (start - low + attempt * (count + 13)) % (high - low - count)
        if all(port_free(p) for p in range(base, base + count)):
            return base, base + count - 1
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def port_free(port: int) -> bool:
    """Whether a new listener could take the port, as a channel writer would: with SO_REUSEADDR
    (ZeroMQ sets it), so connections of a closed listener lingering in TIME_WAIT do not count,
    while another socket still listening there does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)
        except OSError:
            return False
    return True


def _proc_stat(pid: int) -> list[str] | None:
    """Fields after `comm` of /proc/<pid>/stat: state ppid pgrp session ..."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def session_members(sid: int) -> set[int]:
    """Live (non-zombie) processes in session `sid` (an executor runs in its own session)."""
    found = set()
    for pid in _pids():
        fields = _proc_stat(pid)
        if fields and fields[0] != "Z" and int(fields[3]) == sid:
            found.add(pid)
    return found


def children(pid: int) -> list[int]:
    return [p for p in _pids() if (f := _proc_stat(p)) and f[0] != "Z" and int(f[1]) == pid]


def java_child(executor_pid: int) -> int | None:
    """The executor's Spark JVM: its child process running java."""
    for pid in children(executor_pid):
        if "java" in _cmdline(pid).split(" ", 1)[0]:
            return pid
    return None


def source_runner_pids(jvm_pid: int) -> list[int]:
    """Children of a Spark JVM running pyspark's Python streaming source runner (one per query
    with a Python data source)."""
    return [p for p in children(jvm_pid) if "python_streaming_source_runner" in _cmdline(p)]


def kill_session(sid: int) -> list[int]:
    """SIGKILL every live process of session `sid` (one we started); returns their pids."""
    victims = sorted(session_members(sid))
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def kill_executor(stack: Stack, agent: str, what: str) -> int:
    """SIGKILL every process of the executor on `agent` (the executor, its Spark JVM, Python
    workers); returns the executor's pid once all of them are gone."""
    executor = wait_until(lambda: stack.executor_pid(agent), 30, f"the executor on {agent}")
    victims = kill_session(executor)
    log.info("e2e: SIGKILLed the executor of %s on %s: %s", what, agent, victims)
    # a process forked while the sweep ran (a Spark worker) escapes it: sweep until none is left
    wait_until(lambda: not kill_session(executor) and not session_members(executor), 30,
               f"the killed executor on {agent} to end",
               lambda: f"still alive: {session_members(executor)}")
    return executor


# --- the stack ----------------------------------------------------------------------------------

@dataclass
class Stack:
    """Two embedded agents, the scheduler and its HTTP API, all on 127.0.0.1."""

    work: Path
    cluster: Any
    service: Any
    api: Any
    port_ranges: tuple[tuple[int, int], ...]
    executor_sessions: set[int] = field(default_factory=set)

    def agent(self, agent_id: str) -> Any:
        return next(a for a in self.cluster.agents if a.agent_id == agent_id)

    def executor_pid(self, agent_id: str) -> int | None:
        pids = list(self.agent(agent_id).executor_pids().values())
        for pid in pids:
            self.executor_sessions.add(pid)
        return pids[0] if pids else None

    def status(self, query_id: str) -> dict[str, Any]:
        return self.service.query_status(query_id) or {}

    def client(self, timeout: float = 30.0) -> Any:
        """A client of the stack's API with its token."""
        from common.api_client import SchedulerClient

        return SchedulerClient(self.api.url, timeout=timeout, token=self.api.token)

    def tasks(self, query_id: str) -> dict[str, dict[str, Any]]:
        return {t["task_id"]: t for t in self.status(query_id).get("tasks", [])}

    def executor_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")
                         for p in sorted((self.work / "cluster").rglob("stderr")))


def pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH")
    return f"{ROOT}:{existing}" if existing else str(ROOT)


def disjoint_port_ranges(count: int, size: int = 16) -> tuple[tuple[int, int], ...]:
    """`count` runs of `size` free ports on 127.0.0.1 that do not overlap, one per agent, below
    the kernel's ephemeral range (`below_ephemeral`)."""
    low, high = below_ephemeral()
    band = (high - low) // max(1, count)  # a band per agent, so the runs cannot overlap
    if band < 4 * size:
        raise ValueError(f"{count} agents of {size} ports do not fit in {low}-{high}")
    return tuple(free_port_range(size, low=low + i * band, high=low + (i + 1) * band)
                 for i in range(count))


# Options for the JVMs of the executors a stack starts (their SparkSessions), from this
# environment variable: tests/conftest.py sets it to JAVA_OPTIONS_FOR_TESTS, benchmarks leave
# it unset (their figures are the product's, with the JVM's defaults).
JAVA_OPTIONS_ENV = "ELASTIQ_TEST_JAVA_OPTIONS"
# C1 only and one GC thread: an executor's SparkSession start (one per agent, again after every
# SIGKILL) takes the least CPU of the shared 2-core machine; a test's inputs are small, so C2's
# faster code never pays back its compile time.
JAVA_OPTIONS_FOR_TESTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# The stacks' executors' ELASTIQ_MIN_BATCH_INTERVAL (docs/deploy.md), from this variable:
# tests/conftest.py sets MIN_BATCH_FOR_TESTS, benchmarks leave it unset (back to back). A test's
# generators run at ~100 rows/s, where back-to-back batches of a few rows spend ~1 cpu per task
# on each batch's fixed cost. At 1 s (was 0.25 s) the filter's 1 -> 3 -> 2 -> 1 cluster test used
# 161 cpu-seconds instead of 235 (the whole stack's cgroup, 2026-11-29) and ended sooner.
MIN_BATCH_ENV = "ELASTIQ_TEST_MIN_BATCH_INTERVAL"
MIN_BATCH_FOR_TESTS = "1.0"


def executor_test_environment() -> tuple[tuple[str, str], ...]:
    """The executor environment from JAVA_OPTIONS_ENV's JVM options and MIN_BATCH_ENV's interval
    (nothing for what is unset)."""
    from executor.mesos_executor import MIN_BATCH_ENV as EXECUTOR_MIN_BATCH_ENV

    options = os.environ.get(JAVA_OPTIONS_ENV, "").strip()
    interval = os.environ.get(MIN_BATCH_ENV, "").strip()
    return ((("JAVA_TOOL_OPTIONS", options),) if options else ()) + \
        (((EXECUTOR_MIN_BATCH_ENV, interval),) if interval else ())


def start_stack(work: Path, cpus_per_agent: float = 1.5, mem_per_agent: int = 8192,
                spark_cores: int = 2, agents: int = 2,
                port_ranges: tuple[tuple[int, int], ...] | None = None,
                isolation: str = "auto", executor_cpus: float | None = None,
                distribution: DistributionSettings | None = None) -> Stack:
    """Start the cluster (`agents` agents with distinct free port ranges, or `port_ranges`),
    the scheduler and its API. `isolation`: the embedded agents' (`cgroups`: each executor
    container held to what it asked, docs/deploy.md); `executor_cpus`: what the executor asks
    for itself (default ExecutorSpec's); `distribution`: the scheduler's load distribution
    settings (default `DistributionSettings()`'s)."""
    from embedded_mesos import EmbeddedCluster
    from scheduler.api import ApiServer
    from scheduler.api_token import new_token, write_token_file
    from scheduler.config import ExecutorSpec, SchedulerConfig
    from scheduler.distributor import DistributionSettings
    from scheduler.mesos_adapter import SchedulerService

    ranges = port_ranges or disjoint_port_ranges(agents)
    token_file = work / "api-token"  # the API's token, for the tests' clients and control sinks
    write_token_file(token_file, new_token())
    executor = ExecutorSpec(command=f"exec {sys.executable} -m executor",
                            cpus=ExecutorSpec.cpus if executor_cpus is None else executor_cpus,
                            environment=(
        ("ELASTIQ_STATE_DIR", str(work / "state")), ("ELASTIQ_SPARK_CORES", str(spark_cores)),
        ("PYTHONPATH", pythonpath()), ("ELASTIQ_TOKEN_FILE", str(token_file)),
        *executor_test_environment()))
    config = SchedulerConfig(executor=executor, backoff_initial=0.5, same_agent_wait=60.0,
                             offer_hold_seconds=1.0, decline_seconds=0.5,
                             distribution=distribution or DistributionSettings())
    cluster = EmbeddedCluster(agents=0, work_dir=work / "cluster", executor_grace_seconds=15.0,
                              isolation=isolation)  # type: ignore[arg-type]
    cluster.start()
    service = api = None
    try:
        for low, high in ranges:
            cluster.add_agent({"cpus": cpus_per_agent, "mem": mem_per_agent,
                               "ports": f"{low}-{high}"})
        credential = cluster.framework_credential
        service = SchedulerService(cluster.master_address, config, tick_interval=0.1,
                                   principal=credential.principal,
                                   secret=credential.secret).start()
        api = ApiServer.serving(service, host="127.0.0.1", port=0, token_file=str(token_file))
        wait_until(lambda: service.status()["connected"], 20, "the scheduler to register")
    except BaseException:
        stop_parts(cluster, service, api)
        raise
    return Stack(work, cluster, service, api, ranges)


def cli(stack: Stack, *args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    """Run `elastiq ARGS` against the stack's API with its token, from the project root."""
    return subprocess.run([sys.executable, "-m", "elastiq.cli", *args, "--scheduler",
                           stack.api.url, "--token-file", str(stack.api.token_file)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={"PYTHONPATH": pythonpath(), "PATH": "/usr/bin:/bin"})


def module_stack(work: Path, users: str, **options: Any) -> Iterator[Stack]:
    """A module fixture's stack: `start_stack(work, **options)` yielded, then stopped
    (`stop_stack_of`, naming `users`). Use as `yield from module_stack(...)`."""
    running = start_stack(work, **options)
    try:
        yield running
    finally:
        stop_stack_of(running, users)


def stop_stack_of(stack: Stack, users: str) -> None:
    """`stop_stack`, with a warning naming `users` when executor processes had to be
    SIGKILLed."""
    leftovers = stop_stack(stack)
    if leftovers:
        log.warning("%s teardown: SIGKILLed leftover executor processes %s", users, leftovers)


def stop_queries(stack: Stack) -> None:
    """Stop every active query of the stack and wait (bounded) until none of their tasks runs;
    a query that does not stop in time is logged, not raised (this is teardown). Forced: every
    query goes, so a writer whose published stream another query reads is no reason to wait."""
    service = stack.service
    for query_id, view in service.status()["queries"].items():
        if view["phase"] == "active":
            service.stop_query(query_id, force=True)
    try:
        wait_until(lambda: all(not _live(v) for v in service.status()["queries"].values()),
                   30, "every query to stop")
    except AssertionError as exc:
        log.warning("e2e teardown: %s", exc)


def stop_stack(stack: Stack) -> list[int]:
    """Stop every query, the scheduler (failover=False), the API and the cluster; then SIGKILL
    whatever is left of executor sessions this module saw. Returns the pids killed that way."""
    service = stack.service
    stop_queries(stack)
    for agent in stack.cluster.agents:
        stack.executor_sessions.update(agent.executor_pids().values())
    stop_parts(stack.cluster, service, stack.api)
    leftovers = []
    for sid in sorted(stack.executor_sessions):
        leftovers += kill_session(sid)
    return leftovers


def _live(view: Mapping[str, Any]) -> bool:
    return any(t["state"] in ("staging", "starting", "running") for t in view["tasks"])


def stop_parts(cluster: Any, service: Any, api: Any) -> None:
    if api is not None:
        api.stop()
    if service is not None:
        service.stop(failover=False)
    cluster.stop()


@dataclass(frozen=True)
class StackShape:
    """What a test module's shared stack is made of; consecutive modules that declare the same
    shape (a module global `STACK_SHAPE`) share one running stack through `StackPool`."""

    cpus_per_agent: float
    agents: int


class StackPool:
    """At most one running stack, handed from a test module to the next one of the same shape
    (tests/conftest.py `stack_pool`; released when the next test's module declares another
    shape or none, and at the end of the session).

    Sharing saves a stack's start and, above all, its executors' warm-up: each agent's first
    task starts an executor whose JVM and SparkSession take 10-60 s of this machine's two cores.
    A module taking the stack over first stops every query the previous module left active;
    its tests then see a running cluster with warm executors, as a module's second test always
    did."""

    def __init__(self, work: Path) -> None:
        self._work = work
        self._started = 0
        self._held: tuple[StackShape, Stack, list[str]] | None = None

    def take(self, shape: StackShape, what: str) -> Stack:
        """The running stack of `shape` (started if the held one has another shape or none)."""
        if self._held is not None and self._held[0] == shape:
            _, stack, users = self._held
            stop_queries(stack)
            users.append(what)
            log.info("e2e: %s takes over the running stack of %s", what, ", ".join(users[:-1]))
            return stack
        self.release()
        self._started += 1
        stack = start_stack(self._work / f"stack-{self._started}",
                            cpus_per_agent=shape.cpus_per_agent, agents=shape.agents)
        self._held = (shape, stack, [what])
        return stack

    def wanted_by(self, shape: StackShape | None) -> bool:
        return self._held is not None and self._held[0] == shape

    def release(self) -> None:
        """Stop the held stack, if any, with a warning naming its modules if executor processes
        had to be SIGKILLed."""
        if self._held is None:
            return
        _, stack, users = self._held
        self._held = None
        stop_stack_of(stack, ", ".join(users))


# --- submitting and following queries -----------------------------------------------------------

def compile_spec(name: str, base_dir: Path, query_id: str | None = None) -> Any:
    """Compile tests/specs/<name> with relative paths (its sinks) resolved under `base_dir`."""
    from compiler.pipeline import compile_spec_text

    path = SPECS / name
    return compile_spec_text(path.read_bytes(), str(path), base_dir=base_dir,
                             query_id=query_id).query


def submit(stack: Stack, query: Any) -> None:
    reply = stack.service.submit(query)
    assert reply.accepted, f"the scheduler refused {query.query_id}: {reply.message}"


def wait_running(stack: Stack, query_id: str, timeout: float = 90.0) -> dict[str, Any]:
    """Every task of the query RUNNING; returns the query's status view."""
    return wait_until(
        lambda: (v := stack.status(query_id)) and v.get("status") == "running" and v,
        timeout, f"query {query_id} running",
        lambda: json.dumps(stack.status(query_id), indent=1, default=str)[:3000])


def stop_query(stack: Stack, query_id: str) -> None:
    stack.service.stop_query(query_id)
    wait_until(lambda: not _live(stack.status(query_id) or {"tasks": []}), 30,
               f"query {query_id} to stop")


def wait_for_sink(path: Path, expected: Counter, key: Callable[[Row], Any], timeout: float,
                  what: str, settle: float = 2.0) -> Counter:
    """Wait until the sink's rows (as `key`s) equal `expected`, then stay equal for `settle`
    seconds (a late duplicate would show). Fails with the multiset diff."""
    actual = lambda: Counter(key(r) for r in read_sink(path))  # noqa: E731
    wait_until(lambda: actual() == expected, timeout, what,
               lambda: multiset_diff(expected, actual()))
    time.sleep(settle)
    final = actual()
    assert final == expected, f"{what}: changed after matching\n{multiset_diff(expected, final)}"
    return final


def read_sink(path: Path) -> list[Row]:
    """A JSON-lines file sink's complete rows; ISO-8601 `...Z` strings become aware datetimes.

    A line without its newline is a batch still being written (the sink appends a batch with
    one write, which a concurrent reader can see half done): it is left for the next read.
    The result always equals parsing the whole file as it is now: the lines of the bytes read
    last time are reused only when the file still starts with exactly those bytes (a sink cuts a
    torn append back and rewrites it), so a poll parses only what was appended since."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    seen, rows = _SINK_READS.get(path, (b"", []))
    if not complete.startswith(seen):
        seen, rows = b"", []
    rows = rows + _sink_rows(complete[len(seen):])
    _SINK_READS[path] = (complete, rows)
    return [dict(r) for r in rows]


_SINK_READS: dict[Path, tuple[bytes, list[Row]]] = {}


def generator_offsets(checkpoint: Path) -> dict[int, int]:
    """Micro-batch -> the end offset (rows read) of the task's one generator after it, from
    Spark's offset log in the task's checkpoint folder; batches not planned yet are absent, and
    so are the batches Spark purged (it keeps the last `minBatchesToRetain`, 20:
    `OffsetRecord` keeps them all), also one purged between listing and reading."""
    found = {}
    folder = checkpoint / "spark" / "offsets"
    for entry in folder.iterdir() if folder.is_dir() else ():
        if entry.name.isdigit():
            try:
                lines = entry.read_text().splitlines()
            except FileNotFoundError:
                continue
            if lines:
                found[int(entry.name)] = int(json.loads(lines[-1])["index"])
    return found


class OffsetRecord:
    """Every micro-batch's generator end offset, read from the task's offset log by a thread
    every `step` seconds while the query runs (`recording_offsets`): Spark purges all but the
    last 20 batches' files, so reading them only when a test needs one loses the older ones
    (a purged file was a KeyError in CI). A batch it never saw (a loaded machine starved the
    thread for 20 batches) is bounded by the batches around it (`end_bounds`)."""

    def __init__(self, checkpoint: Path, step: float) -> None:
        self.checkpoint, self.step = checkpoint, step
        self._ends: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def read(self) -> None:
        found = generator_offsets(self.checkpoint)
        with self._lock:
            self._ends.update(found)

    def ends(self) -> dict[int, int]:
        with self._lock:
            return dict(self._ends)

    def run(self) -> None:
        """Read every `step` seconds until `stop`."""
        while not self._stop.wait(self.step):
            self.read()

    def stop(self) -> None:
        self._stop.set()


@contextmanager
def recording_offsets(checkpoint: Path, step: float = 0.25) -> Iterator[OffsetRecord]:
    """An `OffsetRecord` of `checkpoint` whose thread runs inside the block; read once more
    at its end (leave the block before the query stops: its checkpoint may go)."""
    record = OffsetRecord(checkpoint, step)
    thread = threading.Thread(target=record.run, name="offset-record", daemon=True)
    thread.start()
    try:
        yield record
    finally:
        record.stop()
        thread.join(timeout=10)
        record.read()


def end_bounds(ends: Mapping[int, int], batch: int) -> tuple[int, int | None]:
    """(at most, at least) what the generator had read by the end of micro-batch `batch`, from
    the batches seen (`ends`): exact when `batch` was seen; else the end of the latest earlier
    batch seen (0: before batch 0 nothing was read) and of the earliest later one (None: none
    seen). Ends grow with the batch (one generator reads in order)."""
    if batch in ends:
        return ends[batch], ends[batch]
    below = [b for b in ends if b < batch]
    above = [b for b in ends if b > batch]
    return (ends[max(below)] if below else 0), (ends[min(above)] if above else None)


def _sink_rows(text: bytes) -> list[Row]:
    rows = []
    for line in text.decode("utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for k, v in row.items():
            if isinstance(v, str) and v.endswith("Z") and "T" in v:
                row[k] = datetime.fromisoformat(v.replace("Z", "+00:00"))
        rows.append(row)
    return rows


# --- spec parameters (read with the standard library, not the compiler) -------------------------

def spec_params(name: str) -> dict[str, dict[str, str]]:
    """operator name -> {param name: value} of tests/specs/<name>."""
    root = ET.parse(SPECS / name).getroot()
    return {op.get("name", ""): {p.get("name", ""): p.get("value", "") for p in op.iter("param")}
            for op in root.iter("operator")}


def sink_path(base_dir: Path, name: str, sink_op: str) -> Path:
    return base_dir / spec_params(name)[sink_op]["path"]


# --- oracles ------------------------------------------------------------------------------------

def hurry(stack: Stack, query_id: str, source: str = "src", rate: str = "20000") -> None:
    """What the test does while the query runs is done: the generator `source` makes its
    remaining rows at `rate` (a live change of its pacing; their event times stay the spec's),
    so the test ends with its work, while the spec's slow rate leaves a loaded machine time for
    the kills and rescales. A task that is starting (after a kill took its executor) refuses
    control with 409, "try again when it runs": it is sent again until the task runs."""
    client = stack.client()

    def sent() -> bool:
        try:
            client.control(query_id, [(source, "rate", rate)])
        except RequestRejected as refused:
            if refused.status != 409:
                raise
            return False
        return True

    wait_for(f"{query_id}: {source} rate {rate} taken (refused with 409 while a task starts)",
             sent, timeout=180, step=1.0)


def generator_rows(params: Mapping[str, str]) -> list[Row]:
    """A <generator>'s rows from its params, through the plain-Python reference generator."""
    shape = shapes.shape_named(params["shape"])
    rate = float(params.get("rate", "1000"))
    seed = int(params.get("seed", "0"))
    start_us = _start_us(params.get("start", DEFAULT_START))
    limit = int(params["limit"])
    return [shapes.reference_row(shape, seed, start_us, rate, i) for i in range(limit)]


def _start_us(text: str) -> int:
    instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (instant - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def row_key(row: Row, columns: Sequence[str]) -> tuple:
    return tuple(row[c] for c in columns)


def floor_time(ts: datetime, size: timedelta, offset: timedelta = timedelta(0)) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    n = math.floor((ts - epoch - offset) / size)
    return epoch + offset + n * size


def windows_of(ts: datetime, size: timedelta, slide: timedelta) -> list[datetime]:
    """Starts of the windows (aligned to the epoch, every `slide`) that contain `ts`."""
    last = floor_time(ts, slide)
    starts, start = [], last
    while start > ts - size:
        starts.append(start)
        start -= slide
    return starts


@dataclass(frozen=True)
class WindowResult:
    window_start: datetime
    group: tuple
    values: tuple[float, ...]  # per input row column given to the oracle


def window_oracle(rows: Iterable[Row], time_col: str, group_by: Sequence[str], size: timedelta,
                  slide: timedelta, watermark: timedelta) -> dict[tuple, list[Row]]:
    """(window_start, *group) -> the input rows of each window an append-mode query emits: those
    whose end is at or before the final watermark (largest event time - delay)."""
    rows = list(rows)
    closed_by = max(r[time_col] for r in rows) - watermark
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        for start in windows_of(r[time_col], size, slide):
            groups[(start, *row_key(r, group_by))].append(r)
    return {k: v for k, v in groups.items() if k[0] + size <= closed_by}


def session_oracle(rows: Iterable[Row], key: str, time_col: str, gap: timedelta,
                   watermark: timedelta) -> dict[tuple, list[Row]]:
    """(key, session start, session end) -> the rows of each session window an append-mode
    query emits (end at or before the final watermark, which Spark keeps in whole milliseconds:
    a session's end need not be one): per key in time order, a row opens [t, t + gap); a row at
    or before the open session's end joins it (Spark merges sessions that touch) and moves its
    end to its own t + gap; a later row starts the next session."""
    rows = list(rows)
    latest = max(r[time_col] for r in rows)
    closed_by = latest - timedelta(microseconds=latest.microsecond % 1000) - watermark
    per_key: dict[Any, list[Row]] = defaultdict(list)
    for r in rows:
        per_key[r[key]].append(r)
    sessions: dict[tuple, list[Row]] = {}
    for k, members in per_key.items():
        members.sort(key=lambda r: r[time_col])
        current = [members[0]]
        end = members[0][time_col] + gap
        for r in members[1:]:
            if r[time_col] > end:
                sessions[(k, current[0][time_col], end)] = current
                current = []
            current.append(r)
            end = max(end, r[time_col] + gap)
        sessions[(k, current[0][time_col], end)] = current
    return {s: v for s, v in sessions.items() if s[2] <= closed_by}


def hot_items_oracle(rows: Sequence[Row], key: str, size: timedelta, slide: timedelta,
                     watermark: timedelta, size2: timedelta,
                     second_watermark: timedelta | None = None) -> Counter:
    """Chained windows ("hot items"): counts per `key` in (size, slide) windows of `ts`, then per
    tumbling `size2` window over each count's event time, its window's end, the largest count
    and how many counts it holds, as (window_start, window_end, top, windows). The second window
    closes by the first's watermark when both run in one query (`second_watermark` None), else
    by its own over the ends it received (the largest emitted end - `second_watermark`)."""
    first = window_oracle(rows, "ts", [key], size, slide, watermark)
    ends = [start + size for start, _ in first]
    closed_by = (max(r["ts"] for r in rows) - watermark if second_watermark is None
                 else max(ends) - second_watermark)
    groups: dict[datetime, list[int]] = defaultdict(list)
    for (start, _), members in first.items():
        groups[floor_time(start + size, size2)].append(len(members))
    return Counter((s, s + size2, max(ns), len(ns)) for s, ns in groups.items()
                   if s + size2 <= closed_by)


def join_oracle(left: Sequence[Row], right: Sequence[Row], key: str, time_col: str,
                within: timedelta, right_name: str) -> list[Row]:
    """Inner equi-join with |left time - right time| <= within; right columns whose names are
    taken by the left are renamed `<right stream>_<column>`."""
    by_key: dict[Any, list[Row]] = defaultdict(list)
    for r in right:
        by_key[r[key]].append(r)
    out = []
    for lrow in left:
        for rrow in by_key[lrow[key]]:
            if abs(lrow[time_col] - rrow[time_col]) <= within:
                joined = dict(lrow)
                joined.update({(f"{right_name}_{k}" if k in lrow else k): v
                               for k, v in rrow.items()})
                out.append(joined)
    return out
