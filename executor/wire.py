"""The frames a channel sends over ZeroMQ: encoding, decoding and validation, no sockets.

Owns the byte layout of every channel frame (a fixed header with magic, version, kind and channel
id, plus an optional Arrow IPC stream body for DATA frames) and the checks that refuse a bad frame
with a specific reason (`FrameError`). Nothing here is ever unpickled or evaluated: headers are a
fixed `struct` layout, bodies are Arrow IPC checked against the channel's schema (and a
DPC-marked channel's marks, `executor.dpc_marks.check_marks`). Does not own sockets,
sequencing, credit or retention (see `executor.channels`).

Header layout (network byte order, 42 bytes, then the channel id and a text, both UTF-8):
    magic "EQCH" | version u8 | kind u8 | channel-id length u16 | text length u16 | a, b, c, d i64
The meaning of the four integers and the text depends on the kind (see `Kind`).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import pyarrow as pa

from executor import dpc_marks

MAGIC = b"EQCH"
VERSION = 1
_HEADER = struct.Struct("!4sBBHHqqqq")
HEADER_BYTES = _HEADER.size
MAX_ID_BYTES = 1024
MAX_TEXT_BYTES = 4096
NONE = -1  # the integer that stands for "not given" (e.g. no from_seq)
RANGE_ENDED = "ended"  # a RANGE frame's text when the writer's stream has ended at its last seq


class Kind(enum.IntEnum):
    """Frame kinds. Reader -> writer kinds are below 16, writer -> reader kinds from 16.

    SUBSCRIBE  text=reader id, a=from_seq or NONE, b=credit limit (highest seq the reader takes),
               c=flags (bit 0: the reader does not hold retention), d=subscription id
    CREDIT     text=reader id, a=credit limit, d=subscription id
    ACK        text=reader id, a=acked up to (inclusive), b=credit limit, d=subscription id
    RANGE_REQ  d=request id
    BYE        text=reader id (the reader closes; its retention, if any, stays)
    SUBSCRIBED a=first seq that will be sent, b=epoch, c=last seq, d=subscription id
    DATA       a=seq, b=tag, c=epoch, d=subscription id; second frame: Arrow IPC stream
    RANGE      a=first retained seq, b=last seq, c=epoch, d=request id, text="" or RANGE_ENDED
               (the writer ended its stream: no seq after b will ever be numbered, `range_ended`)
    ERROR      a=ErrorCode, b=first retained seq, c=last seq, d=subscription id, text=message
    """

    SUBSCRIBE = 1
    CREDIT = 2
    ACK = 3
    RANGE_REQ = 4
    BYE = 5
    SUBSCRIBED = 16
    DATA = 17
    RANGE = 18
    ERROR = 19


READER_KINDS = frozenset({Kind.SUBSCRIBE, Kind.CREDIT, Kind.ACK, Kind.RANGE_REQ, Kind.BYE})
WRITER_KINDS = frozenset({Kind.SUBSCRIBED, Kind.DATA, Kind.RANGE, Kind.ERROR})
FLAG_NON_RETAINING = 1


class ErrorCode(enum.IntEnum):
    """Why a writer refused a reader's frame or ended its subscription."""

    BAD_FRAME = 1
    WRONG_CHANNEL = 2
    TRIMMED = 3
    NOT_SUBSCRIBED = 4
    SUPERSEDED = 5
    RETARGETED = 6
    UNAUTHORIZED = 7  # an undeclared reader, or a reader id its connection's key does not own


class FrameError(ValueError):
    """A frame that is refused: the message says exactly what is wrong with it."""


@dataclass(frozen=True)
class Header:
    """A decoded frame header."""

    kind: Kind
    channel_id: str
    a: int = 0
    b: int = 0
    c: int = 0
    d: int = 0
    text: str = ""


def encode_header(header: Header) -> bytes:
    """The bytes of `header`; raises FrameError if the id or text are too long."""
    cid = header.channel_id.encode("utf-8")
    text = header.text.encode("utf-8")
    if len(cid) > MAX_ID_BYTES or len(text) > MAX_TEXT_BYTES:
        raise FrameError(f"channel id or text too long ({len(cid)}, {len(text)} bytes)")
    fixed = _HEADER.pack(
        MAGIC, VERSION, int(header.kind), len(cid), len(text),
        header.a, header.b, header.c, header.d,
    )
    return fixed + cid + text


def decode_header(raw: bytes | memoryview) -> Header:
    """The header in `raw`, or FrameError naming what is wrong (magic, version, kind, lengths)."""
    if len(raw) < HEADER_BYTES:
        raise FrameError(f"header of {len(raw)} bytes is shorter than {HEADER_BYTES}")
    magic, version, kind, cid_len, text_len, a, b, c, d = _HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FrameError(f"unsupported frame version {version}, this end speaks {VERSION}")
    if kind not in Kind._value2member_map_:
        raise FrameError(f"unknown frame kind {kind}")
    if len(raw) != HEADER_BYTES + cid_len + text_len:
        raise FrameError(
            f"header length {len(raw)} does not match its fields "
            f"({HEADER_BYTES} + {cid_len} + {text_len})"
        )
    tail = bytes(raw[HEADER_BYTES:])
    try:
        cid = tail[:cid_len].decode("utf-8")
        text = tail[cid_len:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(f"channel id or text is not UTF-8: {exc}") from None
    return Header(Kind(kind), cid, a, b, c, d, text)


def range_ended(header: Header) -> bool:
    """Whether a RANGE frame says its writer's stream ended at seq `header.b`; FrameError for
    any other text, or an end whose range is not one a writer has (first 1..last + 1)."""
    if header.text not in ("", RANGE_ENDED):
        raise FrameError(f"RANGE text {header.text[:64]!r} is neither empty nor {RANGE_ENDED!r}")
    ended = header.text == RANGE_ENDED
    if ended and not (header.b >= 0 and 1 <= header.a <= header.b + 1):
        raise FrameError(f"RANGE ended with an impossible range ({header.a}, {header.b})")
    return ended


def check_frame_sizes(frames: list[int], max_frame_bytes: int) -> None:
    """Refuse a multipart message with a frame above `max_frame_bytes` (sizes in bytes)."""
    for index, size in enumerate(frames):
        if size > max_frame_bytes:
            raise FrameError(
                f"frame {index} of {size} bytes exceeds max_frame_bytes {max_frame_bytes}"
            )


def encode_table(table: pa.Table) -> pa.Buffer:
    """`table` as one Arrow IPC stream, in an Arrow buffer (sent by ZeroMQ without a copy)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def decode_table(body: bytes | memoryview | pa.Buffer, schema: pa.Schema) -> pa.Table:
    """The table in an Arrow IPC stream `body`; FrameError if it does not decode or its schema
    is not `schema` (field names, types and nullability; metadata ignored)."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(body))
        table = reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise FrameError(f"body is not a valid Arrow IPC stream: {exc}") from None
    if not table.schema.equals(schema, check_metadata=False):
        raise FrameError(f"body schema {table.schema} does not match the channel schema "
                         f"{schema}{_marks_hint(table.schema, schema)}")
    if dpc_marks.carries_marks(schema):
        try:
            dpc_marks.check_marks(table)
        except dpc_marks.MarkError as exc:
            raise FrameError(f"bad DPC mark: {exc}") from None
    return table


def _marks_hint(body: pa.Schema, expected: pa.Schema) -> str:
    """Why a body's schema differs when DPC marks are the difference (pure): a network-source
    must say marks="dpc" to read a DPC task's network sink, and only then."""
    sent, wanted = dpc_marks.carries_marks(body), dpc_marks.carries_marks(expected)
    if sent and not wanted:
        return ("; the writer sends DPC marks (a network-sink after a union or join with "
                "max-delay): read it with marks=\"dpc\" (docs/availability.md)")
    if wanted and not sent:
        return "; marks=\"dpc\" was asked for, but the writer sends no DPC marks"
    return ""
