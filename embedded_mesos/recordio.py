"""RecordIO framing as the Mesos v1 HTTP APIs use it: `<length>\\n<json>` repeated.

Owns encoding one JSON record and decoding a byte stream back into records (records may span
reads). It does not own sockets, HTTP headers or chunked transfer encoding (aiohttp's
`StreamResponse` chunks the stream; see `httpio`).
"""

from __future__ import annotations

import json
import re
from typing import Any

_LENGTH = re.compile(rb"(\d+)\n")


def encode_record(record: dict[str, Any]) -> bytes:
    """One RecordIO record: the decimal byte length, a newline, the compact JSON."""
    data = json.dumps(record, separators=(",", ":")).encode("utf-8")
    return b"%d\n%s" % (len(data), data)


class RecordIODecoder:
    """Turns a stream of bytes into JSON records; keeps a partial record until it completes."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add bytes; return every record completed by them, in order."""
        self._buffer += data
        records: list[dict[str, Any]] = []
        while True:
            match = _LENGTH.match(self._buffer)
            if match is None:
                if self._buffer and not self._buffer.isdigit():
                    raise ValueError(f"not a RecordIO length prefix: {self._buffer[:20]!r}")
                return records
            end = match.end() + int(match.group(1))
            if len(self._buffer) < end:
                return records
            records.append(json.loads(self._buffer[match.end():end].decode("utf-8")))
            self._buffer = self._buffer[end:]

