"""Compiling a spec sent to the API in a worker process with a time and a memory limit.

A spec body is user text of up to 4 MiB: parsing and compiling it in the scheduler's own
interpreter held the interpreter (a thread does not help: the GIL), so one costly body froze
the API, the scheduler's loop, its driver and, in `elastiq run`, the embedded master and agents,
which then took their own agent for lost (issue 36). Here each compile runs in a process of its
own, forked from a small server process that has the compiler loaded (multiprocessing's
"forkserver": forked from a process with no other threads, so the fork is safe and takes
milliseconds); the worker limits its own address space (RLIMIT_AS) before it reads the spec,
and is killed when it has not answered by the deadline. At most `CompileLimits.workers`
compiles run at once; one more waits for a free worker as long as a compile may take, else is
refused (503).

Owns `CompileWorkers` (the limits and the slots) and `CompileRefused` (a body refused for its
cost: the API answers it with its status and message). Does not own the compiler
(`scheduler.query_source.compile_source`), the limits' defaults (`scheduler.config`) nor the
HTTP answers (`scheduler.api`).
"""

from __future__ import annotations

import logging
import multiprocessing
import resource
import threading
from multiprocessing.connection import Connection
from typing import Any

from common.diagnostics import SpecError
from common.paths import PathRoots
from common.tasks import CompiledQuery
from scheduler.config import CompileLimits
from scheduler.query_source import QuerySource, compile_source

log = logging.getLogger("elastiq.scheduler.compile_worker")
_CONTEXT = multiprocessing.get_context("forkserver")
# "__main__": the server imports the main module once, so a worker need not (multiprocessing's
# rule: a main module that starts work is guarded by `if __name__ == "__main__"`)
_CONTEXT.set_forkserver_preload(["__main__", "scheduler.compile_worker", "compiler.pipeline"])
_KILL_WAIT = 10.0  # seconds to wait for a killed worker to be reaped


class CompileRefused(Exception):
    """A spec the API will not compile within its limits: an HTTP status and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class CompileWorkers:
    """`compile(source, roots)`: the compiled query, SpecError with every diagnostic, or
    CompileRefused (over the time or memory limit: 413; every worker busy: 503). Blocking:
    call it from a thread, never from an event loop."""

    def __init__(self, limits: CompileLimits):
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.workers)
        self.last_worker_pid: int | None = None  # for tests: the worker of the last compile

    def warm(self) -> None:
        """Start the fork server now, so the first submission does not pay for it."""
        from multiprocessing import forkserver

        forkserver.ensure_running()

    def compile(self, source: QuerySource, roots: PathRoots) -> CompiledQuery:
        if not self._slots.acquire(timeout=self.limits.seconds):
            raise CompileRefused(503, f"all {self.limits.workers} compile workers stayed busy "
                                      f"for {self.limits.seconds:g} s; submit again later")
        try:
            return self._in_worker(source, roots)
        finally:
            self._slots.release()

    def _in_worker(self, source: QuerySource, roots: PathRoots) -> CompiledQuery:
        receiver, sender = _CONTEXT.Pipe(duplex=False)
        worker = _CONTEXT.Process(target=_work, name="elastiq-compile", daemon=True,
                                  args=(sender, source, roots, self.limits.memory_mb))
        worker.start()
        self.last_worker_pid = worker.pid
        sender.close()
        try:
            if not receiver.poll(self.limits.seconds):
                raise CompileRefused(413, f"compiling the spec took more than "
                                          f"{self.limits.seconds:g} s, this API's limit "
                                          "(CompileLimits.seconds); make the spec smaller")
            try:
                kind, value = receiver.recv()
            except (EOFError, OSError):
                worker.join(_KILL_WAIT)
                raise CompileRefused(413, self._died(worker.exitcode)) from None
        finally:
            receiver.close()
            _end(worker)
        return _result(kind, value, self.limits)

    def _died(self, exitcode: int | None) -> str:
        return (f"the compiler ended without an answer (exit code {exitcode}), most likely over "
                f"this API's memory limit of {self.limits.memory_mb} MB "
                "(CompileLimits.memory_mb); make the spec smaller")


def _result(kind: str, value: Any, limits: CompileLimits) -> CompiledQuery:
    if kind == "ok":
        return value
    if kind == "spec":
        raise SpecError(value)
    if kind == "memory":
        raise CompileRefused(413, f"compiling the spec needs more than this API's memory limit "
                                  f"of {limits.memory_mb} MB (CompileLimits.memory_mb); make "
                                  "the spec smaller")
    raise RuntimeError(f"the compile worker failed: {value}")


def _end(worker: Any) -> None:
    """The worker gone: killed if it still runs, reaped either way."""
    if worker.is_alive():
        worker.kill()
    worker.join(_KILL_WAIT)
    if worker.exitcode is not None:
        worker.close()
    else:
        log.warning("[compile] worker %s did not end within %s s of SIGKILL", worker.pid,
                    _KILL_WAIT)


def _work(sender: Connection, source: QuerySource, roots: PathRoots, memory_mb: int) -> None:
    """In the worker: limit the address space, compile, send one answer."""
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        answer: tuple[str, Any] = ("ok", compile_source(source, roots))
    except SpecError as e:
        answer = ("spec", list(e.diagnostics))
    except MemoryError:
        answer = ("memory", None)
    except Exception as e:  # a compiler bug: the API answers 500 and logs it
        answer = ("error", f"{type(e).__name__}: {e}")
    try:
        sender.send(answer)
    except MemoryError:
        sender.send(("memory", None))
    finally:
        sender.close()
