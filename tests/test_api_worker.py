"""A spec sent to the API is compiled in a worker process with a time and a memory limit, never
in the scheduler's interpreter (issue 36, item 2).

The attack: a costly body (before the linear pre-scan, 160 KB of unclosed `<!--`: 17.5 s) held
the interpreter of `elastiq run`, so the embedded master took its own agent for silent and the
scheduler failed the executor over. Here a 4 MiB body that still costs seconds to compile is
sent to a real API in front of a real scheduler loop: while it compiles, another request is
answered promptly and a thread of this process keeps running on time (what heartbeats need);
past the time limit it is refused with 413 naming the limit and its worker process is gone;
the memory limit refuses a body that needs more; every worker busy is a 503; a small spec still
compiles after all that.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from common.diagnostics import SpecError
from common.paths import ENV_VAR as PATH_ROOTS_ENV
from common.paths import PathRoots
from compiler.xmlsource import MAX_SPEC_BYTES
from scheduler.api import (MAX_CONTROL_CHARS, MAX_CONTROL_TUPLES, ApiError, ApiServer,
                           control_tuples, migrate_target, scale_parallelism)
from scheduler.compile_worker import CompileRefused, CompileWorkers
from scheduler.config import CompileLimits
from scheduler.loop import SchedulerLoop
from scheduler.query_source import QuerySource
from testkit.waiting import wait_for

TOKEN = "worker-token-abcdefghijklmnop"
SPECS = Path(__file__).resolve().parent / "specs"
HEAD = '<dataflow name="t">\n'


def _many_attributes() -> bytes:
    """4 MiB of one element's attributes: seconds of work in lxml and the validator, and
    over 300 MB."""
    count = (MAX_SPEC_BYTES - 64 - len(HEAD)) // 12
    text = HEAD + "<a " + " ".join(f'x{i}="1"' for i in range(count)) + "/></dataflow>"
    return text.encode()


def _request(server: ApiServer, method: str, target: str, body: bytes = b"",
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request(method, target, body, {"Authorization": f"Bearer {TOKEN}",
                                             **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


class Ticker:
    """A thread that notes the time every 10 ms; its longest gap says how long this process's
    interpreter was held from it."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.times.append(time.monotonic())

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def longest_gap(self) -> float:
        return max((b - a for a, b in zip(self.times, self.times[1:])), default=float("inf"))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").exists() and " Z " in Path(f"/proc/{pid}/stat").read_text()


@pytest.fixture
def served() -> Any:
    loop = SchedulerLoop(tick_interval=0.05).start()
    server = ApiServer(loop, token=TOKEN, compile_limits=CompileLimits(seconds=0.5)).start()
    try:
        yield server
    finally:
        server.stop()
        loop.stop()


def test_a_costly_body_does_not_hold_the_api_and_is_refused_at_the_time_limit(
        served: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PATH_ROOTS_ENV, str(tmp_path))  # the roots the parent passes its worker
    replies: list[tuple[int, dict[str, Any]]] = []
    sender = threading.Thread(target=lambda: replies.append(_request(
        served, "POST", "/queries", _many_attributes(), {"Content-Type": "application/xml"})))
    with Ticker() as ticker:
        sender.start()
        pid = wait_for("the compile worker to start", lambda: served.compilers.last_worker_pid)
        asked = time.monotonic()
        status, listing = _request(served, "GET", "/queries")
        answered_in = time.monotonic() - asked
        sender.join(120)
    assert status == 200 and listing == {"queries": []}
    assert answered_in < 1.0, f"another request waited {answered_in:.2f} s"
    assert ticker.longest_gap() < 0.5, f"this process was held for {ticker.longest_gap():.2f} s"
    assert len(replies) == 1 and replies[0][0] == 413, replies
    assert "took more than 0.5 s" in replies[0][1]["error"]
    wait_for(f"compile worker {pid} to be gone", lambda: _gone(pid), timeout=30)
    spec = (SPECS / "e2e-filter-project.xml").read_bytes()  # the API still compiles
    status, reply = _request(served, "POST", "/queries", spec,
                             {"Content-Type": "application/xml", "X-Spec-Dir": str(tmp_path)})
    assert status == 201, reply


def test_a_body_needing_more_memory_than_the_limit_is_refused() -> None:
    workers = CompileWorkers(CompileLimits(seconds=60, memory_mb=128))
    source = QuerySource.of(_many_attributes(), "wide.xml", "", "/nonexistent")
    with pytest.raises(CompileRefused) as refused:
        workers.compile(source, PathRoots.of(["/nonexistent"]))
    assert refused.value.status == 413 and "memory limit of 128 MB" in refused.value.message
    pid = workers.last_worker_pid
    assert pid is not None
    wait_for(f"compile worker {pid} to be gone", lambda: _gone(pid), timeout=30)


def test_diagnostics_come_back_from_the_worker_located() -> None:
    workers = CompileWorkers(CompileLimits())
    source = QuerySource.of(b'<dataflow name="t">\n  <!DOCTYPE x>\n</dataflow>\n', "bad.xml", "",
                            "/nonexistent")
    with pytest.raises(SpecError) as error:
        workers.compile(source, PathRoots.of(["/nonexistent"]))
    [d] = error.value.diagnostics
    assert (d.position.file, d.position.line, d.position.column) == ("bad.xml", 2, 3)


def test_every_worker_busy_is_a_503_after_waiting_the_time_limit() -> None:
    workers = CompileWorkers(CompileLimits(seconds=0.2, workers=1))
    source = QuerySource.of(b'<dataflow name="t"/>', "t.xml", "", "/nonexistent")
    assert workers._slots.acquire(timeout=1)  # the one worker is busy
    try:
        with pytest.raises(CompileRefused) as refused:
            workers.compile(source, PathRoots.of(["/nonexistent"]))
    finally:
        workers._slots.release()
    assert refused.value.status == 503 and "busy" in refused.value.message


def test_limits_out_of_range_are_refused() -> None:
    for bad in ({"seconds": 0}, {"memory_mb": 64}, {"workers": 0}):
        with pytest.raises(ValueError):
            CompileLimits(**bad)


def test_elastiq_scheduler_takes_the_limits_as_flags() -> None:
    from elastiq.cli import _parser
    from elastiq.service_cli import _compile_limits

    args = _parser().parse_args(["scheduler", "--api-compile-seconds", "5",
                                 "--api-compile-memory-mb", "512"])
    assert _compile_limits(args) == CompileLimits(seconds=5, memory_mb=512)
    assert _compile_limits(_parser().parse_args(["scheduler"])) == CompileLimits()
    with pytest.raises(ValueError):
        _compile_limits(_parser().parse_args(["scheduler", "--api-compile-workers", "0"]))


# ---- the other routes that read user text: bounded before anything reaches the loop ----------
def _tuples(n: int, value: str = "1") -> bytes:
    return json.dumps({"tuples": [{"operator": f"f{i}", "parameter": "rate", "value": value}
                                  for i in range(n)]}).encode()


def test_a_control_request_is_bounded_in_tuples_and_in_characters() -> None:
    assert len(control_tuples(_tuples(MAX_CONTROL_TUPLES))) == MAX_CONTROL_TUPLES
    with pytest.raises(ApiError) as many:
        control_tuples(_tuples(MAX_CONTROL_TUPLES + 1))
    assert many.value.status == 413 and str(MAX_CONTROL_TUPLES) in many.value.message
    condition = "temp > " + "1" * 4000  # one condition near the grammar's 4,096 characters
    fits = MAX_CONTROL_CHARS // len(condition)
    assert len(control_tuples(_tuples(fits, condition))) == fits
    with pytest.raises(ApiError) as long:
        control_tuples(_tuples(fits + 1, condition))
    assert long.value.status == 413 and str(MAX_CONTROL_CHARS) in long.value.message


@pytest.mark.parametrize("parse", [control_tuples, scale_parallelism, migrate_target])
def test_deeply_nested_json_is_a_400_not_a_crash(parse: Any) -> None:
    for body in (b"[" * 200_000, b'{"tuples": ' + b"[" * 200_000, b"[1]", b'"x"'):
        with pytest.raises(ApiError) as refused:
            parse(body)
        assert refused.value.status == 400
