"""`Coordination` through ZooKeeper with kazoo: the ONLY module importing kazoo.

Owns `ZkSettings` and `parse_zk_address` (`HOST:PORT[,HOST:PORT...][/root]`), and
`ZooKeeperCoordination`: a kazoo client with a session timeout, optional digest ACLs on every
node it creates, leader election with kazoo's Lock recipe under `<root>/leader/election`, an
epoch counter node `<root>/leader/epoch` bumped by every new leader (its version is the fence:
a leader's registry writes are transactions that check it), the leader's announcement
`<root>/leader/current` (ephemeral JSON: address, epoch), the registry under `<root>/registry`
and ephemeral announcements under `<root>/registry/...` too.

Connection states are turned into "connected"/"suspended"/"lost" for listeners; the kazoo
listener itself never calls ZooKeeper. A LOST session ends the current leadership at once; the
campaign thread then re-joins the election in the new session. Does not own what leadership
means to the scheduler (`scheduler.leadership`, `scheduler.mesos_adapter`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError, CancelledError, KazooException, NodeExistsError, NoNodeError,
    RolledBackError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_digest_acl

from scheduler.coordination import (
    Coordination, ConnectionListener, ConnectionState, CoordinationError, FencedOut, LeaderInfo,
    OnDeposed, OnElected,
)
from scheduler.leadership import Term

log = logging.getLogger("elastiq.scheduler.zk")

_STATES: dict[str, ConnectionState] = {
    KazooState.CONNECTED: "connected", KazooState.SUSPENDED: "suspended",
    KazooState.LOST: "lost",
}


@dataclass(frozen=True)
class ZkSettings:
    hosts: str  # "h1:2181,h2:2181"
    root: str = "/elastiq"
    session_timeout: float = 10.0
    digest: tuple[str, str] | None = None  # (user, password): nodes readable/writable by it only


def parse_zk_address(text: str) -> tuple[str, str]:
    """`[zk://]HOST:PORT[,HOST:PORT...][/root]` -> (hosts, root); root defaults to /elastiq."""
    raw = text.strip().removeprefix("zk://")
    hosts, slash, root = raw.partition("/")
    problems = [h for h in hosts.split(",")
                if not h or ":" not in h or not h.rpartition(":")[2].isdigit()]
    if not hosts or problems:
        raise ValueError(f"ZooKeeper address {text!r} is not HOST:PORT[,HOST:PORT...][/root]"
                         + (f" (bad: {', '.join(problems)})" if problems else ""))
    root = "/" + root.strip("/") if slash and root.strip("/") else "/elastiq"
    return hosts, root


def read_digest_file(path: str) -> tuple[str, str]:
    """A file holding `USER:PASSWORD` (first line)."""
    with open(path, encoding="utf-8") as f:
        line = f.readline().strip()
    user, sep, password = line.partition(":")
    if not sep or not user or not password:
        raise ValueError(f"{path}: expected one line USER:PASSWORD")
    return user, password


def _wrapped(fn: Any) -> Any:
    """Let no kazoo exception escape this module (callers know only CoordinationError)."""
    def call(self: "ZooKeeperCoordination", *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except KazooException as e:
            raise CoordinationError(f"ZooKeeper {fn.__name__}{args[:1]!r} failed: "
                                    f"{type(e).__name__} {e}") from e
    call.__name__ = fn.__name__
    call.__doc__ = fn.__doc__
    return call


class ZooKeeperCoordination(Coordination):
    def __init__(self, settings: ZkSettings):
        self.settings = settings
        self.session_timeout = settings.session_timeout
        root = settings.root.rstrip("/")
        self._election = f"{root}/leader/election"
        self._epoch = f"{root}/leader/epoch"
        self._current = f"{root}/leader/current"
        self._registry = f"{root}/registry"
        auth, acl = None, None
        if settings.digest:
            user, password = settings.digest
            auth = [("digest", f"{user}:{password}")]
            acl = [make_digest_acl(user, password, all=True)]
        self.client = KazooClient(hosts=settings.hosts, timeout=settings.session_timeout,
                                  auth_data=auth, default_acl=acl,
                                  connection_retry={"max_tries": -1, "delay": 0.1,
                                                    "max_delay": 1.0})
        self._listeners: list[ConnectionListener] = []
        self._stop_leading = threading.Event()
        self._stop_reason = ""
        self._closed = False
        self._lock: Any = None
        self._thread: threading.Thread | None = None

    # ---- connection --------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> None:
        self.client.add_listener(self._on_state)
        try:
            self.client.start(timeout=timeout)
        except KazooTimeoutError:
            self.client.stop()
            self.client.close()
            raise CoordinationError(f"no ZooKeeper answered at {self.settings.hosts} within "
                                    f"{timeout:g} s") from None
        for path in (self._election, self._registry):
            self.client.ensure_path(path)
        try:
            self.client.create(self._epoch, b"0")
        except NodeExistsError:
            pass
        log.info("[zk] connected to %s (root %s, session timeout %.1fs)", self.settings.hosts,
                 self.settings.root, self.session_timeout)

    def _on_state(self, state: str) -> None:
        """kazoo's listener: no ZooKeeper calls here; only flags and our listeners."""
        mapped = _STATES.get(state)
        if mapped is None:
            return
        if mapped == "lost":
            self._end_leadership("ZooKeeper session lost")
        for listener in list(self._listeners):
            try:
                listener(mapped)
            except Exception:  # a listener's bug must not break kazoo's connection thread
                log.exception("[zk] connection listener failed on %s", mapped)

    def add_connection_listener(self, listener: ConnectionListener) -> None:
        self._listeners.append(listener)

    def close(self) -> None:
        self._closed = True
        self._end_leadership("closed")
        if self._lock is not None:
            self._lock.cancel()
        if self._thread is not None:
            self._thread.join(5)
        self.client.stop()
        self.client.close()

    # ---- election ----------------------------------------------------------------------------
    def campaign(self, address: str, on_elected: OnElected, on_deposed: OnDeposed) -> None:
        self._lock = self.client.Lock(self._election, address)
        self._thread = threading.Thread(target=self._campaign, name="zk-campaign",
                                        args=(address, on_elected, on_deposed), daemon=True)
        self._thread.start()

    def _campaign(self, address: str, on_elected: OnElected, on_deposed: OnDeposed) -> None:
        while not self._closed:
            self._stop_leading.clear()
            try:
                if not self._lock.acquire():
                    continue
                if self._closed:
                    self._release()
                    return
            except CancelledError:
                continue
            except KazooException as e:
                log.info("[zk] campaign of %s interrupted (%s); retrying", address, e)
                time.sleep(min(1.0, self.session_timeout / 4))
                continue
            try:
                self._lead(address, on_elected)
            finally:
                self._release()
            on_deposed(self._stop_reason or "leadership ended")

    def _lead(self, address: str, on_elected: OnElected) -> None:
        try:
            term = self._bump_epoch()
            self._announce_leader(address, term)
        except KazooException as e:
            log.warning("[zk] %s won the election but could not take office: %s", address, e)
            self._stop_reason = f"could not take office: {e}"
            return
        log.info("[zk] %s leads in epoch %s", address, term.epoch)
        on_elected(term)
        self._stop_leading.wait()

    def _bump_epoch(self) -> Term:
        for _ in range(10):
            data, stat = self.client.get(self._epoch)
            epoch = int(data or b"0") + 1
            try:
                new = self.client.set(self._epoch, str(epoch).encode(), version=stat.version)
            except BadVersionError:
                continue
            return Term(epoch, new.version)
        raise CoordinationError("the epoch counter kept changing under us")

    def _announce_leader(self, address: str, term: Term) -> None:
        body = json.dumps({"address": address, "epoch": term.epoch}).encode()
        try:
            self.client.delete(self._current)
        except NoNodeError:
            pass
        self.client.create(self._current, body, ephemeral=True)

    def _release(self) -> None:
        try:
            self._lock.release()
        except KazooException as e:
            log.info("[zk] releasing the election lock: %s (its session is gone)", e)

    def _end_leadership(self, reason: str) -> None:
        self._stop_reason = reason
        self._stop_leading.set()

    def resign(self) -> None:
        self._end_leadership("resigned")

    def leader(self) -> LeaderInfo | None:
        try:
            data, _ = self.client.get(self._current)
            body = json.loads(data.decode("utf-8"))
            return LeaderInfo(str(body["address"]), int(body["epoch"]))
        except (NoNodeError, ValueError, KeyError):
            return None
        except KazooException:
            return None

    # ---- registry (kazoo errors leave this module as CoordinationError) ----------------------
    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or "//" in key or key.endswith("/"):
            raise ValueError(f"bad registry key {key!r}")
        return f"{self._registry}/{key}"

    @_wrapped
    def put(self, key: str, value: bytes, term: Term | None = None) -> None:
        path = self._path(key)
        if term is None:
            try:
                self.client.set(path, value)
            except NoNodeError:
                self.client.create(path, value, makepath=True)
            return
        parent = path.rpartition("/")[0]
        if parent != self._registry:
            self.client.ensure_path(parent)
        exists = self.client.exists(path) is not None
        self._fenced(term, key, lambda tx: tx.set_data(path, value) if exists
                     else tx.create(path, value))

    def _fenced(self, term: Term, key: str, op: Any) -> None:
        tx = self.client.transaction()
        tx.check(self._epoch, term.fence)
        op(tx)
        results = tx.commit()
        errors = [r for r in results if isinstance(r, Exception)
                  and not isinstance(r, RolledBackError)]
        if not errors:
            return
        if isinstance(results[0], BadVersionError):
            raise FencedOut(f"write of {key} refused: epoch {term.epoch} is no longer current")
        raise CoordinationError(f"write of {key} failed: {errors[0]!r}")

    @_wrapped
    def get(self, key: str) -> bytes | None:
        try:
            data, _ = self.client.get(self._path(key))
            return bytes(data)
        except NoNodeError:
            return None

    @_wrapped
    def delete(self, key: str, term: Term | None = None) -> None:
        path = self._path(key)
        if term is None:
            try:
                self.client.delete(path, recursive=True)
            except NoNodeError:
                pass
            return
        if self.client.exists(path) is not None:
            self._fenced(term, key, lambda tx: tx.delete(path))

    @_wrapped
    def children(self, key: str) -> list[str]:
        try:
            return sorted(self.client.get_children(self._path(key)))
        except NoNodeError:
            return []

    @_wrapped
    def announce(self, key: str, value: bytes) -> None:
        path = self._path(key)
        try:
            self.client.create(path, value, ephemeral=True, makepath=True)
        except NodeExistsError:
            self.client.set(path, value)

    @_wrapped
    def withdraw(self, key: str) -> None:
        try:
            self.client.delete(self._path(key))
        except NoNodeError:
            pass
