"""A blocking call that may not return, run with a bound on how long its caller waits.

Owns `within`: the call runs in a daemon helper thread and the caller waits at most `timeout`
seconds for its result. Used where a library call has no timeout of its own that holds in
every case (a Kafka producer's transactional calls; pymesos's driver, whose stop waits on a
lock its own HTTP calls hold). A call that outlives its bound is left behind in its thread.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class CallTimedOut(TimeoutError):
    """The call had not returned within its bound; it may still be running."""


def within(call: Callable[[], T], timeout: float, what: str) -> T:
    """`call()`'s result (or its exception), run in a helper thread named after `what`;
    CallTimedOut when it has not returned within `timeout` s."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, name=what, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CallTimedOut(f"{what} did not return within {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")  # type: ignore[return-value]
