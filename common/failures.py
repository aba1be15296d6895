"""Kinds of task failure, as the executor names them in a status message and the scheduler reads.

Owns `FailureKind` and its text form: the executor puts the kind first in a failed task's
status message (`tag`: "[port in use] task q.t0 did not start: ..."), since Mesos's own reason
codes are a fixed list, and the scheduler reads it back (`kind_of`) to decide: a port taken by
another program is retried at once on another port; what retrying cannot heal (a missing input
file, a program that does not build) fails the query at once with the reason; a join's
splitter that cannot switch at the time planned for a pending rescale ("refused") has that
rescale undone and is retried with the old routing; anything else is retried from the
checkpoint. Also `kind_of_text`, the classification of a failure reason by its
words (a Spark error, an exception's text), and `innermost_error`, the error a Spark/py4j chain
of wrappers holds (what a user can act on), both pure. Does not own the decisions themselves
(`scheduler.state`) nor how the executor finds the kind of an exception
(`executor.failure_kinds`).
"""

from __future__ import annotations

import re
from typing import Literal

FailureKind = Literal["retry", "port", "permanent", "refused"]

TAGS: dict[FailureKind, str] = {"port": "[port in use] ", "permanent": "[cannot heal] ",
                                "refused": "[switch refused] "}

# words of a failure that retrying does not heal, as Python, Spark and our own checks say them
_PERMANENT = re.compile(
    r"PATH_NOT_FOUND|Path does not exist|FileNotFoundError|SyntaxError|ImportError|"
    r"ModuleNotFoundError|RuntimeSpecError|PathRefused|has no build\(rt\)|"
    r"ended without a sink|"
    # a limit of the user's data: the same rows hit it again after a restart from the checkpoint
    r"PatternOverflow")
_PORT = re.compile(r"Address already in use|EADDRINUSE", re.IGNORECASE)


def tag(kind: FailureKind, message: str) -> str:
    """`message` with its kind in front (a "retry" failure is left as it is)."""
    prefix = TAGS.get(kind, "")
    return message if not prefix or message.startswith(prefix) else prefix + message


def kind_of(message: str) -> FailureKind:
    """The kind a status message was tagged with; "retry" when it carries none."""
    for kind, prefix in TAGS.items():
        if message.startswith(prefix):
            return kind
    return "retry"


def kind_in(text: str) -> FailureKind:
    """The kind tagged anywhere in `text` (a task's last failure, "TASK_FAILED ... [port in
    use] ..."); "retry" when none is."""
    for kind, prefix in TAGS.items():
        if prefix in text:
            return kind
    return "retry"


def kind_of_text(text: str) -> FailureKind:
    """The kind of a failure from its words alone (pure): a port in use, or something retrying
    cannot heal, else "retry"."""
    if _PORT.search(text):
        return "port"
    if "SwitchRefused" in text:
        return "refused"
    if _PERMANENT.search(text):
        return "permanent"
    return "retry"


# A line that names an exception and its message: `pkg.Class: message`, `Caused by: ...`, or
# `: org.apache...Class: message` (py4j's way of appending a Java error to its own).
_ERROR_LINE = re.compile(r"^(?:Caused by: |: )?(?:[A-Za-z_$][\w$]*\.)*"
                         r"([A-Z][\w$]*(?:Error|Exception|Overflow|Refused)): (\S.*)$")
# the wrappers a task's error travels in from a Python worker or a foreachBatch call back to the
# query: they say where it passed, not what went wrong
_WRAPPERS = frozenset({"Py4JJavaError", "Py4JError", "Py4JNetworkError", "SparkException",
                       "PythonException", "StreamingQueryException", "ExecutionException",
                       "InvocationTargetException", "UndeclaredThrowableException",
                       "SparkRuntimeException", "CapturedException"})
MAX_REASON = 500  # characters of a reason a status message carries


def innermost_error(text: str) -> str | None:
    """The error a failure's text holds inside its wrappers, as `Class: message` (pure; None
    when no line names one). A query's exception from Spark nests the error that ended it in
    Python-proxy, py4j, job-abort and Python-worker wrappers, each with its traceback; the
    error whose words retrying cannot heal (a data limit, a refused path) is preferred, else
    the last non-wrapper error named (the innermost: Java's `Caused by` chain and a Python
    traceback both end with it)."""
    found = [(m.group(1), m.group(2).strip()) for m in
             (_ERROR_LINE.match(line.strip()) for line in text.splitlines()) if m]
    errors = [f"{name}: {message}" for name, message in found if name not in _WRAPPERS]
    permanent = [e for e in errors if _PERMANENT.search(e)]
    chosen = permanent[-1] if permanent else errors[-1] if errors else None
    return None if chosen is None else chosen[:MAX_REASON]
