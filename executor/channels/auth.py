"""Who may speak on a channel: CURVE keys, the ZAP handler that admits declared readers, key files.

Owns the key values a channel end is given (`KeyPair`, `WriterAuth`, `ReaderAuth`), the ZAP
handler (one per ZeroMQ context, RFC 27) that lets a CURVE client in only if its public key is
one a writer declared and names the reader id that key stands for (ZeroMQ hands that id to the
writer as the frame property "User-Id", so the writer checks every frame's claimed reader id
against the connection's key), and the keypair files `elastiq keygen` writes. Secret keys never
appear in a repr, a log line or an error message. Does not own the protocol (`executor.channels`)
nor who issues keys (the scheduler, `scheduler.state`).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Mapping

import zmq
from zmq.utils import z85

from common.atomic_file import replace_file
from executor.channels.base import _RefusalLog


ZAP_ENDPOINT = "inproc://zeromq.zap.01"
KEY_CHARS = 40  # a CURVE key in Z85 text
HEX_KEY_CHARS = 64  # the same 32 bytes in hexadecimal digits


class ChannelKeyError(ValueError):
    """A key or key file that cannot be used; the message says which and why (never the secret)."""


@dataclass(frozen=True)
class KeyPair:
    """A CURVE keypair in Z85 text. Its repr shows the public key only."""

    public: str
    secret: str = field(repr=False)

    @classmethod
    def generate(cls) -> "KeyPair":
        public, secret = zmq.curve_keypair()
        return cls(public.decode("ascii"), secret.decode("ascii"))

    def to_json(self) -> dict[str, str]:
        return {"public": self.public, "secret": self.secret}

    @classmethod
    def from_json(cls, raw: object) -> "KeyPair":
        if not isinstance(raw, Mapping):
            raise ChannelKeyError("a keypair must be an object with 'public' and 'secret'")
        pair = cls(str(raw.get("public", "")), str(raw.get("secret", "")))
        check_key(pair.public, "public key")
        check_key(pair.secret, "secret key")
        if zmq.curve_public(pair.secret.encode("ascii")).decode("ascii") != pair.public:
            raise ChannelKeyError(f"the secret key does not belong to public key {pair.public}")
        return pair


@dataclass(frozen=True)
class WriterAuth:
    """A writer's CURVE identity and the readers it admits: reader id -> that reader's public key."""

    keys: KeyPair
    readers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReaderAuth:
    """A reader's CURVE identity and the public key of the writer it reads from."""

    keys: KeyPair
    server_key: str


def check_key(key: str, what: str) -> str:
    """`key` as Z85 text if it is a CURVE key, written either as 64 hexadecimal digits (what
    `elastiq keygen` prints: safe in XML) or as 40 Z85 characters (which may contain `<` and `&`,
    so a spec must escape them); ChannelKeyError otherwise."""
    if isinstance(key, str) and len(key) == HEX_KEY_CHARS:
        try:
            return z85.encode(bytes.fromhex(key)).decode("ascii")
        except ValueError:
            raise ChannelKeyError(f"{what} is not {HEX_KEY_CHARS} hexadecimal digits") from None
    if not isinstance(key, str) or len(key) != KEY_CHARS:
        raise ChannelKeyError(f"{what} must be {HEX_KEY_CHARS} hexadecimal digits (as `elastiq "
                              f"keygen` prints it) or {KEY_CHARS} Z85 characters")
    try:
        z85.decode(key.encode("ascii"))
    except (ValueError, KeyError, UnicodeError, IndexError):
        raise ChannelKeyError(f"{what} is not Z85 text") from None
    return key


def key_hex(key: str) -> str:
    """A Z85 CURVE key as 64 hexadecimal digits: how people copy a key into a spec."""
    return z85.decode(key.encode("ascii")).hex()


def parse_readers(text: str) -> dict[str, str]:
    """"id=PUBLICKEY, id2=PUBLICKEY2" -> {id: key}; ChannelKeyError naming the bad entry."""
    readers: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        reader_id, sep, key = item.partition("=")
        reader_id, key = reader_id.strip(), key.strip()
        if not sep or not reader_id:
            raise ChannelKeyError(f"reader {item!r} is not 'id=PUBLICKEY'")
        if reader_id in readers:
            raise ChannelKeyError(f"reader {reader_id!r} is declared twice")
        readers[reader_id] = check_key(key, f"public key of reader {reader_id!r}")
    return readers


def write_key_file(path: str, pair: KeyPair) -> None:
    """Write `pair` as JSON to a new file `path` readable by its owner only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(pair.to_json(), out)
        out.write("\n")


def read_key_file(path: str) -> KeyPair:
    """The keypair in `path`; ChannelKeyError when missing, readable by others, or malformed."""
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="utf-8") as source:
            text = source.read()
    except OSError as exc:
        raise ChannelKeyError(f"key file {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ChannelKeyError(f"key file {path} is readable by others (mode "
                              f"{oct(mode & 0o777)}); chmod 600 it")
    try:
        raw = json.loads(text)
    except ValueError:
        raise ChannelKeyError(f"key file {path} is not JSON") from None
    try:
        return KeyPair.from_json(raw)
    except ChannelKeyError as exc:
        raise ChannelKeyError(f"key file {path}: {exc}") from None


# --- the ZAP handler --------------------------------------------------------------------------


def zap_decision(admitted: Mapping[str, Mapping[bytes, str]] | None, domain: str,
                 mechanism: bytes, credentials: list[bytes]) -> tuple[str, str, str]:
    """(status code, status text, user id) for one ZAP request: a CURVE client is admitted only
    if `domain` is a writer's and its public key is one of that writer's readers."""
    if admitted is None or domain not in admitted:
        return "400", f"unknown domain {domain!r}", ""
    if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
        return "400", "CURVE required", ""
    reader_id = admitted[domain].get(credentials[0])
    if reader_id is None:
        return "400", "unknown client key", ""
    return "200", "OK", reader_id


class ZapHandler:
    """Answers ZAP requests for every channel writer of one ZeroMQ context from one thread.
    Writers register a domain with the public keys they admit (raw 32 bytes -> reader id)."""

    _lock = threading.Lock()
    _instances: dict[tuple[int, int], "ZapHandler"] = {}  # (pid, id(context)): a fork starts anew

    def __init__(self, ctx: zmq.Context) -> None:
        self._domains: dict[str, dict[bytes, str]] = {}
        self._guard = threading.Lock()
        self._refusals = _RefusalLog("channel auth (ZAP)")
        self._socket = ctx.socket(zmq.REP)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(ZAP_ENDPOINT)
        self._thread = threading.Thread(target=self._run, name="channel-zap", daemon=True)
        self._thread.start()

    @classmethod
    def of(cls, ctx: zmq.Context) -> "ZapHandler":
        """The context's handler, started on first use (a context has at most one)."""
        with cls._lock:
            key = (os.getpid(), id(ctx))
            handler = cls._instances.get(key)
            if handler is None:
                handler = cls._instances[key] = cls(ctx)
            return handler

    def admit(self, domain: str, readers: Mapping[str, str]) -> None:
        """Let the clients with these public keys (reader id -> Z85 key) into `domain`."""
        keys = {z85.decode(key.encode("ascii")): reader for reader, key in readers.items()}
        with self._guard:
            self._domains.setdefault(domain, {}).update(keys)

    def revoke(self, domain: str, reader_id: str | None = None) -> None:
        """Stop admitting `reader_id` (None: everyone) into `domain`."""
        with self._guard:
            if reader_id is None:
                self._domains.pop(domain, None)
                return
            keys = self._domains.get(domain, {})
            for key in [k for k, r in keys.items() if r == reader_id]:
                del keys[key]

    def _run(self) -> None:
        while True:
            try:
                request = self._socket.recv_multipart()
            except zmq.ZMQError:
                return  # the context is being terminated
            self._socket.send_multipart(self._answer(request))

    def _answer(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, domain, address, _identity, mechanism = request[:6]
        with self._guard:
            status, text, user = zap_decision(
                self._domains, domain.decode("utf-8", "replace"), mechanism, request[6:])
        if status != "200":  # logged rate-limited: a flood of handshakes cannot flood the log
            self._refusals.refuse(f"{mechanism.decode('ascii', 'replace')} client from "
                                  f"{address.decode('ascii', 'replace')} on "
                                  f"{domain.decode('utf-8', 'replace')}: {text}")
        return [version, request_id, status.encode(), text.encode(), user.encode("utf-8"), b""]


def serve_curve(sock: zmq.Socket, auth: WriterAuth, domain: str) -> None:
    """Make `sock` (not yet bound) a CURVE server in `domain`, admitting `auth.readers`."""
    ZapHandler.of(sock.context).admit(domain, auth.readers)
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    sock.setsockopt_string(zmq.ZAP_DOMAIN, domain)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, auth.keys.secret.encode("ascii"))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, auth.keys.public.encode("ascii"))


def connect_curve(sock: zmq.Socket, auth: ReaderAuth) -> None:
    """Make `sock` (not yet connected) a CURVE client of the writer whose key is `auth.server_key`."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, auth.server_key.encode("ascii"))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, auth.keys.public.encode("ascii"))
    sock.setsockopt(zmq.CURVE_SECRETKEY, auth.keys.secret.encode("ascii"))


# --- a task's keys, as the scheduler issues them ----------------------------------------------


@dataclass(frozen=True)
class TaskKeys:
    """What a task's launch data carries: its own keypair, the public key of the producer of
    each channel it reads, and the public keys of the reader tasks of each channel it serves."""

    own: KeyPair
    servers: Mapping[str, str] = field(default_factory=dict)  # input channel -> producer's key
    readers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # channel -> task -> key

    @classmethod
    def from_json(cls, raw: object) -> "TaskKeys":
        """The launch data's "keys" object; ChannelKeyError naming what is wrong."""
        if not isinstance(raw, Mapping):
            raise ChannelKeyError("keys must be a JSON object")
        servers, readers = raw.get("servers", {}), raw.get("readers", {})
        if not isinstance(servers, Mapping) or not isinstance(readers, Mapping) or not all(
                isinstance(v, Mapping) for v in readers.values()):
            raise ChannelKeyError("keys.servers must map channels to keys and keys.readers "
                                  "channels to {task: key}")
        return cls(
            KeyPair.from_json(raw.get("own")),
            {str(c): check_key(k, f"producer key of channel {c}") for c, k in servers.items()},
            {str(c): {str(t): check_key(k, f"key of reader {t} of channel {c}")
                      for t, k in tasks.items()} for c, tasks in readers.items()})

    def writer_auth(self, channel: str, reader_ids: Mapping[str, str]) -> WriterAuth:
        """The auth of this task's writer of `channel`, admitting `reader_ids` (reader task ->
        the reader id it subscribes with); ChannelKeyError if a reader task has no key."""
        keys = self.readers.get(channel, {})
        missing = sorted(set(reader_ids) - set(keys))
        if missing:
            raise ChannelKeyError(f"no key for readers {missing} of channel {channel}")
        return WriterAuth(self.own, {rid: keys[task] for task, rid in reader_ids.items()})

    def server_key(self, channel: str) -> str:
        """The public key of `channel`'s producer; ChannelKeyError if none was issued."""
        key = self.servers.get(channel)
        if key is None:
            raise ChannelKeyError(f"no producer key for channel {channel}")
        return key


def reader_auth(key_file: str, server_key: str) -> ReaderAuth | None:
    """A reader's auth from its key file and its writer's public key; None when both are empty
    (a plain-text channel); ChannelKeyError when only one is given or either is bad."""
    if not key_file and not server_key:
        return None
    if not key_file or not server_key:
        raise ChannelKeyError("a CURVE reader needs both a key file and the writer's public key")
    return ReaderAuth(read_key_file(key_file), check_key(server_key, "writer's public key"))


def save_key_file(path: str, pair: KeyPair) -> None:
    """Write `pair` to `path` (0600), replacing what is there atomically."""
    replace_file(path, json.dumps(pair.to_json()) + "\n", mode=0o600)
