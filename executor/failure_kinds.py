"""The kind of a task's failure, found from the exception that ended its start.

Owns `failure_kind`: a port another program holds (a ZeroMQ or socket bind refused with
EADDRINUSE) is "port"; what retrying the same launch cannot heal (the program does not load or
build: a RuntimeSpecError such as a missing input file, a syntax or import error, a refused path,
a missing program file) is "permanent"; a join's splitter launched with a planned switch it
has routed past (SwitchRefused) is "refused"; anything else "retry". It walks the exception's
causes.
The kinds and their text form are `common.failures`; the executor tags its status messages with
them, the scheduler decides.
"""

from __future__ import annotations

import errno

import zmq

from common.failures import FailureKind, kind_of_text
from common.paths import PathRefused

_PERMANENT = (SyntaxError, ImportError, FileNotFoundError, PathRefused)


def failure_kind(exc: BaseException) -> FailureKind:
    """The kind of the failure `exc` (or one of its causes) stands for."""
    from executor.runtime import RuntimeSpecError, SwitchRefused  # loaded once a task started

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, zmq.ZMQError) and current.errno == zmq.EADDRINUSE:
            return "port"
        if isinstance(current, OSError) and current.errno == errno.EADDRINUSE:
            return "port"
        if isinstance(current, SwitchRefused):
            return "refused"
        if isinstance(current, (RuntimeSpecError, *_PERMANENT)):
            return "permanent"
        current = current.__cause__ or current.__context__
    return kind_of_text(str(exc))
