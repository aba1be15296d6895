"""The control query and the channel reader that follows its moved sink, shared by
tests/test_control_cluster.py and benchmarks/control.py.

Owns `SPEC` (`nums := generator; keep := filter(condition); out := network-sink` over CURVE, its
parameters filled by the caller), `FollowingReader` (a real ZeroMQ channel reader on a thread
that acknowledges each batch and moves to the writer's new endpoint when told) and `free_port`.
"""

from __future__ import annotations

import socket
import threading
import time

from executor.channels.auth import ReaderAuth
from executor.channels.reader import ChannelReader
from executor.shapes import arrow_schema, shape_named

SPEC = """<?xml version="1.0" encoding="UTF-8"?>
<dataflow name="{name}">
  <operator name="src" type="generator">
    <param name="shape" value="sequence"/>
    <param name="rate" value="{rate}"/>
    <param name="seed" value="11"/>
    <output name="nums"/>
  </operator>
  <operator name="keep" type="filter">
    <input name="nums"/>
    <param name="condition" value="{condition}"/>
    <output name="kept"/>
  </operator>
  <operator name="out" type="network-sink">
    <input name="kept"/>
    <param name="endpoint" value="{endpoint}"/>
    <param name="channel" value="ctl-out"/>
    <param name="readers" value="test-reader={reader_key}"/>
    <param name="key-file" value="{key_file}"/>
  </operator>
</dataflow>
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FollowingReader:
    """Reads the query's channel on a thread, acking each batch; `follow(endpoint)` moves it
    to the writer's new endpoint. Records (seq, Spark batch id, endpoint, ids) per batch."""

    def __init__(self, endpoint: str, auth: ReaderAuth) -> None:
        schema = arrow_schema(shape_named("sequence").columns)
        self.reader = ChannelReader("ctl-out", "test-reader", endpoint, schema, auth=auth)
        self.batches: list[tuple[int, int, str, list[int]]] = []
        self._move: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "FollowingReader":
        self.reader.subscribe(from_seq=1)
        self.thread.start()
        return self

    def follow(self, endpoint: str) -> None:
        with self._lock:
            self._move = endpoint

    def ids(self) -> list[int]:
        with self._lock:
            return [i for *_, ids in self.batches for i in ids]

    def tags(self) -> list[int]:
        with self._lock:
            return [tag for _, tag, _, _ in self.batches]

    def _run(self) -> None:
        deadline = time.monotonic() + 400
        while not self._stop.is_set() and time.monotonic() < deadline:
            with self._lock:
                move, self._move = self._move, None
            if move is not None:
                self.reader.connect_to(move)
            for batch in self.reader.poll(0.2):
                with self._lock:
                    self.batches.append((batch.seq, batch.tag, self.reader.endpoint,
                                         batch.table.column("id").to_pylist()))
                self.reader.ack(batch.seq)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.reader.close()
