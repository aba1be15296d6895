"""Coordination among schedulers: the small interface, an in-process implementation, and the
typed registry the scheduler keeps in it.

Owns `Coordination` (leader election with an epoch per leader, a key-value registry whose leader
writes are fenced by the leader's term, and liveness through ephemeral announcements),
`InProcessCoordination` (one machine, no ZooKeeper: `elastiq run` and tests; several handles on
one `InProcessHub` elect among themselves and `expire()` simulates a lost session) and
`SchedulerRegistry` (framework id, queries as their sources (spec text and compile options,
never compiled programs: a new leader recompiles them) and placements, channel endpoints, task
liveness, control history). Does not own kazoo (`scheduler.zk`) nor what a
change of leadership means (`scheduler.leadership`).

Callbacks (`on_elected`, `on_deposed`, connection listeners) run on the coordination's own
threads; they must return quickly and never call back into the coordination from a connection
listener.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Literal
from urllib.parse import quote, unquote

from scheduler.leadership import Term

log = logging.getLogger("elastiq.scheduler.coordination")

ConnectionState = Literal["connected", "suspended", "lost"]
ConnectionListener = Callable[[ConnectionState], None]
OnElected = Callable[[Term], None]
OnDeposed = Callable[[str], None]


class CoordinationError(RuntimeError):
    """The coordination service could not do what was asked (with which key and why)."""


class FencedOut(CoordinationError):
    """A write carried the term of a leader that has since been replaced."""


def registry_key(*parts: str) -> str:
    """A registry key from free-text parts (each part is escaped: ids may contain '/')."""
    if not parts or any(not p for p in parts):
        raise ValueError(f"registry key parts must be non-empty: {parts!r}")
    return "/".join(quote(p, safe="").replace(".", "%2E") for p in parts)


def key_part(escaped: str) -> str:
    """The free text of one escaped key part (the inverse of `registry_key` per part)."""
    return unquote(escaped)


@dataclass(frozen=True)
class LeaderInfo:
    address: str
    epoch: int


class Coordination(ABC):
    """Leader election, a registry and liveness; see the module docstring for threads."""

    session_timeout: float = 10.0

    @abstractmethod
    def start(self, timeout: float = 15.0) -> None:
        """Connect; raise CoordinationError when that fails within `timeout`."""

    @abstractmethod
    def close(self) -> None:
        """Resign if leading, drop ephemeral announcements, disconnect."""

    @abstractmethod
    def add_connection_listener(self, listener: ConnectionListener) -> None: ...

    @abstractmethod
    def campaign(self, address: str, on_elected: OnElected, on_deposed: OnDeposed) -> None:
        """Join the election (returns at once); re-join after a lost session."""

    @abstractmethod
    def resign(self) -> None: ...

    @abstractmethod
    def leader(self) -> LeaderInfo | None:
        """The current leader as announced by it, or None."""

    @abstractmethod
    def put(self, key: str, value: bytes, term: Term | None = None) -> None:
        """Create or replace; with `term`, raise FencedOut unless `term` is still current."""

    @abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abstractmethod
    def delete(self, key: str, term: Term | None = None) -> None: ...

    @abstractmethod
    def children(self, key: str) -> list[str]:
        """The escaped names directly under `key` (sorted); [] when there is none."""

    @abstractmethod
    def announce(self, key: str, value: bytes) -> None:
        """An ephemeral entry: gone when this session ends (task and scheduler liveness)."""

    @abstractmethod
    def withdraw(self, key: str) -> None: ...


# ---- in-process ------------------------------------------------------------------------------
@dataclass
class InProcessHub:
    """What a ZooKeeper ensemble holds, for handles in one process."""

    data: dict[str, bytes] = field(default_factory=dict)
    ephemeral: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # key -> (owner, v)
    epoch: int = 0
    queue: list[int] = field(default_factory=list)  # candidate handle ids, first leads
    leader: LeaderInfo | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)


_handles = itertools.count(1)


class InProcessCoordination(Coordination):
    def __init__(self, hub: InProcessHub | None = None, session_timeout: float = 10.0):
        self.hub = hub or InProcessHub()
        self.session_timeout = session_timeout
        self._id = next(_handles)
        self._listeners: list[ConnectionListener] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._term: Term | None = None

    def start(self, timeout: float = 15.0) -> None:
        return None

    def close(self) -> None:
        with self.hub.cond:
            self._closed = True
        self._leave_session("closed")
        if self._thread is not None:
            self._thread.join(5)

    def add_connection_listener(self, listener: ConnectionListener) -> None:
        self._listeners.append(listener)

    def expire(self) -> None:
        """Simulate a lost session: listeners hear "lost", then "connected" (a new session)."""
        for listener in self._listeners:
            listener("lost")
        self._leave_session("session lost", rejoin=True)
        for listener in self._listeners:
            listener("connected")

    def _leave_session(self, why: str, rejoin: bool = False) -> None:
        with self.hub.cond:
            self.hub.ephemeral = {k: v for k, v in self.hub.ephemeral.items()
                                  if v[0] != self._id}
            if self._id in self.hub.queue:
                self.hub.queue.remove(self._id)
                if rejoin and not self._closed:
                    self.hub.queue.append(self._id)
            self.hub.cond.notify_all()

    def campaign(self, address: str, on_elected: OnElected, on_deposed: OnDeposed) -> None:
        with self.hub.cond:
            self.hub.queue.append(self._id)
        self._thread = threading.Thread(target=self._campaign, name=f"campaign-{self._id}",
                                        args=(address, on_elected, on_deposed), daemon=True)
        self._thread.start()

    def _campaign(self, address: str, on_elected: OnElected, on_deposed: OnDeposed) -> None:
        for _ in itertools.count():
            with self.hub.cond:
                while not self._closed and (not self.hub.queue or self.hub.queue[0] != self._id):
                    self.hub.cond.wait(0.5)
                if self._closed:
                    return
                self.hub.epoch += 1
                self._term = Term(self.hub.epoch, self.hub.epoch)
                self.hub.leader = LeaderInfo(address, self.hub.epoch)
            on_elected(self._term)
            with self.hub.cond:
                while not self._closed and self.hub.queue and self.hub.queue[0] == self._id:
                    self.hub.cond.wait(0.5)
                if self.hub.leader and self.hub.leader.epoch == self._term.epoch:
                    self.hub.leader = None
            on_deposed("resigned" if self._closed else "leadership lost")

    def resign(self) -> None:
        self._leave_session("resigned", rejoin=False)

    def leader(self) -> LeaderInfo | None:
        return self.hub.leader

    def _check(self, term: Term | None) -> None:
        if term is not None and term.fence != self.hub.epoch:
            raise FencedOut(f"term {term.epoch} is over (current epoch {self.hub.epoch})")

    def put(self, key: str, value: bytes, term: Term | None = None) -> None:
        with self.hub.cond:
            self._check(term)
            self.hub.data[key] = bytes(value)

    def get(self, key: str) -> bytes | None:
        with self.hub.cond:
            found = self.hub.data.get(key)
            return found if found is not None else (self.hub.ephemeral.get(key) or (0, None))[1]

    def delete(self, key: str, term: Term | None = None) -> None:
        with self.hub.cond:
            self._check(term)
            self.hub.data.pop(key, None)

    def children(self, key: str) -> list[str]:
        prefix = key.rstrip("/") + "/"
        with self.hub.cond:
            names = {k[len(prefix):].split("/")[0] for k in [*self.hub.data, *self.hub.ephemeral]
                     if k.startswith(prefix)}
        return sorted(names)

    def announce(self, key: str, value: bytes) -> None:
        with self.hub.cond:
            self.hub.ephemeral[key] = (self._id, bytes(value))

    def withdraw(self, key: str) -> None:
        with self.hub.cond:
            if self.hub.ephemeral.get(key, (None,))[0] == self._id:
                del self.hub.ephemeral[key]


# ---- the scheduler's registry ----------------------------------------------------------------
@dataclass(frozen=True)
class PersistedQuery:
    """One query as the registry holds it, unchecked."""

    query_id: str
    source: bytes  # `QuerySource.to_json()` when we wrote it
    placements: dict[str, Any] | None


def _json_object(raw: bytes | None) -> dict[str, Any] | None:
    try:
        value = json.loads(raw.decode("utf-8")) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class SchedulerRegistry:
    """Typed access to what the scheduler keeps in a `Coordination`.

    Layout: `framework_id`; `queries/<q>` (the query's source as JSON: spec text, file name,
    query id, base and rules dirs; see `scheduler.query_source`); `placements/<q>` (phase and,
    per task, attempt, launches, state, agent, ports, endpoints); `channels/<q>/<channel>`
    (endpoint); `live/tasks/<mesos task id>` (ephemeral); `control/<q>/<seq>` (JSON).
    """

    def __init__(self, coordination: Coordination):
        self.c = coordination

    def framework_id(self) -> str | None:
        raw = self.c.get("framework_id")
        return raw.decode("utf-8") if raw else None

    def save_framework_id(self, framework_id: str, term: Term | None) -> None:
        self.c.put("framework_id", framework_id.encode("utf-8"), term)

    def save_query(self, query_id: str, source_json: str, term: Term | None) -> None:
        self.c.put(registry_key("queries", query_id), source_json.encode("utf-8"), term)

    def save_placements(self, query_id: str, placements: dict[str, Any],
                        term: Term | None) -> None:
        self.c.put(registry_key("placements", query_id),
                   json.dumps(placements, sort_keys=True).encode("utf-8"), term)

    def load_queries(self) -> list[PersistedQuery]:
        """Every persisted query: its id, source JSON and placements (None when absent or
        unreadable), by query id. Nothing here is compiled or trusted."""
        out = []
        for name in self.c.children("queries"):
            source = self.c.get(f"queries/{name}")
            if source is None:
                continue
            placed = self.c.get(f"placements/{name}")
            out.append(PersistedQuery(key_part(name), source, _json_object(placed)))
        return out

    def save_endpoint(self, query_id: str, channel_id: str, endpoint: str,
                      term: Term | None) -> None:
        self.c.put(registry_key("channels", query_id, channel_id), endpoint.encode(), term)

    def endpoints(self, query_id: str) -> dict[str, str]:
        base = registry_key("channels", query_id)
        return {key_part(n): (self.c.get(f"{base}/{n}") or b"").decode()
                for n in self.c.children(base)}

    def announce_task(self, mesos_task_id: str, info: dict[str, Any]) -> None:
        self.c.announce(registry_key("live", "tasks", mesos_task_id),
                        json.dumps(info).encode("utf-8"))

    def live_tasks(self) -> dict[str, dict[str, Any]]:
        base = registry_key("live", "tasks")
        found = {key_part(n): self.c.get(f"{base}/{n}") for n in self.c.children(base)}
        return {t: json.loads(v) for t, v in found.items() if v}

    def append_control(self, query_id: str, seq: int, tuple_json: dict[str, Any],
                       term: Term | None) -> None:
        self.c.put(registry_key("control", query_id, f"{seq:010d}"),
                   json.dumps(tuple_json).encode("utf-8"), term)

    def control_history(self, query_id: str) -> list[dict[str, Any]]:
        base = registry_key("control", query_id)
        return [json.loads((self.c.get(f"{base}/{n}") or b"null").decode())
                for n in self.c.children(base)]


# ---- persisting the leader's state -----------------------------------------------------------
class QueryPersister:
    """Writes what the leader's state says into the registry, off the loop thread.

    `observe(state)` runs on the event loop after each step (lock held): it compares cheaply and
    queues changed entries (the framework id, a query's source once per submission, its
    placements whenever they change, and the endpoint of each channel whose producer was placed
    somewhere new: the channel registry). A writer thread writes them fenced by the leader's term;
    a `FencedOut` drops everything (we are no longer the leader). Does not decide anything.
    """

    def __init__(self, registry: SchedulerRegistry):
        self._registry = registry
        self._cond = threading.Condition()
        self._term: Term | None = None
        self._pending: dict[tuple[str, str], Any] = {}  # (kind, id) -> value, in order
        self._seen_query: dict[str, int] = {}  # query id -> id() of the CompiledQuery written
        self._seen_placements: dict[str, dict[str, Any]] = {}
        self._seen_channels: dict[str, dict[str, str]] = {}
        self._framework_id: str | None = None
        self._busy = False
        self._thread: threading.Thread | None = None
        self._stopped = False

    def begin(self, term: Term) -> None:
        with self._cond:
            self._term, self._pending, self._framework_id = term, {}, None
            self._seen_query, self._seen_placements, self._seen_channels = {}, {}, {}
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="registry-writer",
                                            daemon=True)
            self._thread.start()

    def end(self) -> None:
        with self._cond:
            self._term, self._pending = None, {}

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(5)

    def observe(self, state: Any) -> None:
        from scheduler.state import durable_placements  # state imports nothing of ours

        if self._term is None or (state.leadership is not None
                                   and state.leadership.role == "standby"):
            return
        updates: dict[tuple[str, str], Any] = {}
        if state.framework_id and state.framework_id != self._framework_id:
            self._framework_id = state.framework_id
            updates[("framework_id", "")] = state.framework_id
        for qid, record in state.queries.items():
            if self._seen_query.get(qid) != id(record.query):
                self._seen_query[qid] = id(record.query)
                if record.source is None:
                    log.warning("[registry] query %s was not submitted from a spec: it is not "
                                "persisted, and a new leader will not know it", qid)
                else:
                    updates[("query", qid)] = record.source
            placements = durable_placements(record)
            if self._seen_placements.get(qid) != placements:
                self._seen_placements[qid] = placements
                updates[("placements", qid)] = placements
            served = {c: e for t in record.tasks.values() for c, e in t.endpoints.items()
                      if c in t.task.outputs}
            if self._seen_channels.get(qid) != served:
                changed = {c: e for c, e in served.items()
                           if self._seen_channels.get(qid, {}).get(c) != e}
                self._seen_channels[qid] = served
                updates[("channels", qid)] = changed
        if updates:
            with self._cond:
                self._pending.update(updates)
                self._cond.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued entry is written; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or bool(self._pending))
                if self._stopped:
                    return
                key = next(iter(self._pending))
                value, term = self._pending.pop(key), self._term
                self._busy = True
            try:
                if term is not None:
                    self._write(key, value, term)
            except FencedOut as e:
                log.warning("[registry] %s; dropping queued writes", e)
                self.end()
            except CoordinationError as e:
                log.warning("[registry] writing %s failed (%s); retrying", key, e)
                with self._cond:
                    self._pending.setdefault(key, value)
                threading.Event().wait(0.2)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, key: tuple[str, str], value: Any, term: Term) -> None:
        kind, ident = key
        if kind == "framework_id":
            self._registry.save_framework_id(value, term)
        elif kind == "query":
            self._registry.save_query(ident, value.to_json(), term)  # a QuerySource
        elif kind == "channels":  # the channel registry: where each channel is served now
            for channel_id, endpoint in sorted(value.items()):
                self._registry.save_endpoint(ident, channel_id, endpoint, term)
        else:
            self._registry.save_placements(ident, value, term)
