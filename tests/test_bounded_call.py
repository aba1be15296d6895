"""common.bounded_call.within, and the Mesos driver whose calls it bounds: a master that
accepts a call and never answers fails the call within the bound instead of holding the
driver's lock for ever (a real socket, a real pymesos driver)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import pytest

from common import bounded_call
from scheduler import mesos_adapter


def test_within_returns_the_value_and_reraises_the_error() -> None:
    assert bounded_call.within(lambda: 41 + 1, 5, "add") == 42
    with pytest.raises(ZeroDivisionError):
        bounded_call.within(lambda: 1 // 0, 5, "divide")


def test_within_gives_up_on_a_call_that_does_not_return() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(bounded_call.CallTimedOut, match="wait for ever did not return"):
        bounded_call.within(lambda: release.wait(60), 0.5, "wait for ever")
    assert time.monotonic() - started < 10
    release.set()


@pytest.fixture
def silent_master() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never reads nor answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        server.close()


def test_a_call_to_a_master_that_never_answers_fails_within_the_bound_and_frees_the_lock(
        silent_master: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mesos_adapter, "CALL_TIMEOUT_S", 1.0)
    driver = mesos_adapter.BoundedDriver(object(), {"user": "t", "name": "t"}, silent_master,
                                         use_addict=False)
    driver._master, driver.stream_id = silent_master, "stream"  # as after SUBSCRIBED
    driver._framework["id"] = {"value": "f"}
    started = time.monotonic()
    with pytest.raises(OSError):  # socket.timeout is an OSError
        driver.suppressOffers()
    assert time.monotonic() - started < 10
    assert driver._lock.acquire(timeout=1), "the call left the driver's lock held"
    driver._lock.release()
