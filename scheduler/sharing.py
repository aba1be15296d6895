"""Published streams read by other queries: the scheduler's pure decisions about them.

A query publishes a stream (`<output publish="true">`, its channel "<query>/<stream>"); another
query reads it with a `stream-source` (`CompiledQuery.imports`). Automatic sharing treats a
channel a query serves to its own tasks alike once another query reads it in place of an equal
subgraph (`CompiledQuery.shareable`, `offers`): it is then served as if published. Owns what `scheduler.state`
asks about those links, as functions of the queries it holds: what is wrong with a submitted
query's imports (a stream no query publishes, a type that differs from the writer's, a cycle
between queries; each located at the reader's file:line:column), why a writer may not be stopped
(other queries read it), where a reader's channel is served and with which keys, which readers
a writer admits, and why a reader waits (its writer is absent). Does not own I/O, the records
themselves (`scheduler.state`) nor how a channel admits readers (`executor.channels`).
See docs/queries.md.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol

from common.tasks import CompiledQuery, StreamImport
from common.types import Schema
from scheduler.lifecycle import TaskRecord


class QueryRecord(Protocol):
    """What these decisions read of `scheduler.state.QueryRecord`."""

    @property
    def query(self) -> CompiledQuery: ...
    @property
    def phase(self) -> str: ...
    @property
    def tasks(self) -> Mapping[str, TaskRecord]: ...
    @property
    def keys(self) -> Mapping[str, Mapping[str, str]]: ...
    @property
    def query_id(self) -> str: ...

LIVE = ("active", "stopping")  # phases in which a query reads or serves


def reader_id(task_id: str, channel: str) -> str:
    """The reader id a task reads a channel with (`executor.runtime.channel_reader_id`, which a
    test keeps equal: the scheduler may not import the executor)."""
    return f"{task_id}/read:{channel}"


def _described(schema: Schema) -> str:
    return "(" + ", ".join(f"{f.name} {f.type.value}" for f in schema) + ")"


def served(query: CompiledQuery) -> tuple[str, ...]:
    """The channels of `query` other queries may read: those it publishes, then those automatic
    sharing may read (`CompiledQuery.shareable`)."""
    return tuple(dict.fromkeys([*query.published, *(c for c, _ in query.shareable)]))


def publisher(queries: Mapping[str, QueryRecord], channel: str) -> "QueryRecord | None":
    """The query that serves `channel` to other queries (published, or shareable: `served`;
    its record, in whatever phase), or None."""
    writer = queries.get(channel.rpartition("/")[0])
    return writer if writer is not None and channel in served(writer.query) else None


def offers(queries: Mapping[str, QueryRecord]) -> dict[str, str]:
    """canonical form -> the channel of an active query serving a stream of that form
    (`compiler.autoshare`): what a submitted query may read instead of computing. Of equal
    streams, the first query's (query id order) is offered."""
    found: dict[str, str] = {}
    for _, q in sorted(queries.items()):
        if q.phase == "active":
            for channel, form in q.query.shareable:
                found.setdefault(form, channel)
    return found


def _published_now(queries: Mapping[str, QueryRecord]) -> str:
    names = sorted(c for q in queries.values() if q.phase in LIVE for c in q.query.published)
    return ", ".join(names) if names else "none"


def submit_problems(query: CompiledQuery, queries: Mapping[str, QueryRecord]) -> list[str]:
    """Every problem of `query`'s imports against the queries the scheduler holds, each
    starting with the stream-source's file:line:column."""
    problems = []
    for imp in query.imports:
        writer = publisher(queries, imp.channel_id)
        if imp.auto and (writer is None or writer.phase != "active"):
            problems.append(f"{imp.where}: stream {imp.channel_id}, which this query was "
                            "compiled to read in place of an equal subgraph (automatic "
                            "sharing), is no longer served; submit it again")
            continue
        if writer is None:
            problems.append(f"{imp.where}: no query publishes stream {imp.channel_id} "
                            f"(published: {_published_now(queries)}); submit its writer first, "
                            "with <output ... publish=\"true\"/>")
            continue
        published = next(c.schema for c in writer.query.channels
                         if c.channel_id == imp.channel_id)
        if published != imp.schema:
            problems.append(f"{imp.where}: stream {imp.channel_id} is published as "
                            f"{_described(published)} but is read as {_described(imp.schema)}; "
                            "declare the stream-source's output type as the writer's")
    problems += _cycles(query, queries)
    return problems


def _cycles(query: CompiledQuery, queries: Mapping[str, QueryRecord]) -> list[str]:
    """A cycle the new query would close: it reads a query that (through others) reads it."""
    reads = {qid: {i.writer for i in q.query.imports} for qid, q in queries.items()
             if q.phase in LIVE and qid != query.query_id}
    problems = []
    for imp in query.imports:
        path = _path(reads, imp.writer, query.query_id)
        if path is not None:
            chain = " -> ".join([query.query_id, *path])
            problems.append(f"{imp.where}: reading {imp.channel_id} makes a cycle between "
                            f"queries: {chain} (each reads the next)")
    return problems


def _path(reads: Mapping[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The queries from `start` to `goal` following who reads whom (depth-first), or None."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        at, path = stack.pop()
        if at == goal:
            return path
        if at in seen:
            continue
        seen.add(at)
        stack += [(nxt, path + [nxt]) for nxt in sorted(reads.get(at, ()))]
    return None


def readers(queries: Mapping[str, QueryRecord], channel: str
            ) -> list[tuple[QueryRecord, StreamImport]]:
    """The live queries' imports of `channel`, with their records (query id order)."""
    return [(q, i) for qid, q in sorted(queries.items()) if q.phase in LIVE
            for i in q.query.imports if i.channel_id == channel]


def stop_refusal(query_id: str, queries: Mapping[str, QueryRecord]) -> str | None:
    """Why `query_id` may not be stopped without force: live queries read what it publishes."""
    record = queries.get(query_id)
    if record is None:
        return None
    read = {c: sorted({q.query_id for q, _ in readers(queries, c)} - {query_id})
            for c in served(record.query)}
    read = {c: qs for c, qs in read.items() if qs}
    if not read:
        return None
    words = "; ".join(f"{c} is read by {', '.join(qs)}" for c, qs in sorted(read.items()))
    return (f"query {query_id} publishes streams other queries read ({words}); stop those "
            "first, or force it (elastiq stop --force): they then wait for it")


def _producer(writer: QueryRecord, channel: str) -> "TaskRecord | None":
    spec = next((c for c in writer.query.channels if c.channel_id == channel), None)
    return writer.tasks.get(spec.producer) if spec is not None else None


def _active_producer(queries: Mapping[str, QueryRecord], channel: str) -> "TaskRecord | None":
    """The task of an active writer query that produces `channel`, or None."""
    writer = publisher(queries, channel)
    return _producer(writer, channel) if writer is not None and writer.phase == "active" \
        else None


def wire(record: QueryRecord, task_id: str, queries: Mapping[str, QueryRecord]
         ) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, str]]]:
    """What a task's launch needs across queries: (endpoints of the published channels it
    reads, their writers' public keys, and per published channel it serves the public key of
    each live reader task of other queries)."""
    endpoints, servers = {}, {}
    for imp in record.query.imports:
        if imp.task_id != task_id:
            continue
        active = _active_producer(queries, imp.channel_id)
        at = active.endpoints.get(imp.channel_id) if active is not None else None
        if at is not None:  # where it serves the channel now (or last did)
            endpoints[imp.channel_id] = at
        writer = publisher(queries, imp.channel_id)
        producer = _producer(writer, imp.channel_id) if writer is not None else None
        if writer is not None and producer is not None and producer.task_id in writer.keys:
            servers[imp.channel_id] = writer.keys[producer.task_id]["public"]
    serving: dict[str, dict[str, str]] = {}
    for channel in served(record.query):
        producer = _producer(record, channel)
        if producer is None or producer.task_id != task_id:
            continue
        serving[channel] = {i.task_id: q.keys[i.task_id]["public"]
                            for q, i in readers(queries, channel)
                            if q.query_id != record.query_id and i.task_id in q.keys}
    return endpoints, servers, serving


def with_wiring(keys: Mapping[str, Any] | None, servers: Mapping[str, str],
                serving: Mapping[str, Mapping[str, str]]) -> dict[str, Any] | None:
    """A task's launch keys with the cross-query servers and readers merged in."""
    if keys is None:
        return None
    merged = dict(keys)
    merged["servers"] = {**keys.get("servers", {}), **servers}
    theirs = {c: {**keys.get("readers", {}).get(c, {}), **r} for c, r in serving.items()}
    merged["readers"] = {**keys.get("readers", {}), **theirs}
    return merged


def admissions(reader: QueryRecord, queries: Mapping[str, QueryRecord]
               ) -> list[tuple[TaskRecord, str, dict[str, str]]]:
    """For each running writer task a reader query's imports read: (that task, the channel,
    reader id -> public key ("" without keys)) to admit."""
    found = []
    for imp in reader.query.imports:
        producer = _active_producer(queries, imp.channel_id)
        if producer is None or not producer.state.launched:
            continue  # its launch will carry the reader's key
        key = reader.keys.get(imp.task_id, {}).get("public", "")
        found.append((producer, imp.channel_id, {reader_id(imp.task_id, imp.channel_id): key}))
    return found


def served_readers(writer: QueryRecord, task_id: str, queries: Mapping[str, QueryRecord]
                   ) -> list[tuple[str, dict[str, str]]]:
    """For each channel task `task_id` of `writer` serves other queries: (the channel, reader id
    -> public key ("" without keys) of every live reader task of another query)."""
    found = []
    for channel in served(writer.query):
        producer = _producer(writer, channel)
        if producer is None or producer.task_id != task_id:
            continue
        ids = {reader_id(i.task_id, channel): q.keys.get(i.task_id, {}).get("public", "")
               for q, i in readers(queries, channel) if q.query_id != writer.query_id}
        if ids:
            found.append((channel, ids))
    return found


def reader_tasks(writer: QueryRecord, launched: Iterable[str],
                 queries: Mapping[str, QueryRecord]
                 ) -> list[tuple[QueryRecord, TaskRecord, str, str]]:
    """Other queries' reader tasks of the channels the just launched tasks of `writer` serve:
    (their query, their task, the channel, its endpoint now)."""
    started = set(launched)
    found = []
    for channel in served(writer.query):
        producer = _producer(writer, channel)
        endpoint = producer.endpoints.get(channel) if producer is not None else None
        if producer is None or producer.task_id not in started or endpoint is None:
            continue
        for q, imp in readers(queries, channel):
            task = q.tasks.get(imp.task_id)
            if q.query_id != writer.query_id and task is not None:
                found.append((q, task, channel, endpoint))
    return found


def wait_reasons(queries: Mapping[str, QueryRecord]) -> dict[str, str]:
    """task id -> why a reader task of a live query waits: its writer query is absent."""
    reasons = {}
    for q in queries.values():
        if q.phase != "active":
            continue
        for imp in q.query.imports:
            writer = publisher(queries, imp.channel_id)
            if writer is None:
                reasons[imp.task_id] = f"waits for stream {imp.channel_id}: no query publishes it"
            elif writer.phase != "active":
                reasons[imp.task_id] = (f"waits for stream {imp.channel_id}: its query "
                                        f"{writer.query_id} is {writer.phase}")
    return reasons


def shared_tasks(record: QueryRecord, queries: Mapping[str, QueryRecord]
                 ) -> list[dict[str, Any]]:
    """Each published channel of a query once, and each channel other queries read by
    automatic sharing: its producing task and the live queries that read it (`auto`: read in
    place of an equal subgraph; for `status`)."""
    shown = []
    for channel in served(record.query):
        producer = _producer(record, channel)
        read = [(q, i) for q, i in readers(queries, channel) if q.query_id != record.query_id]
        if channel not in record.query.published and not read:
            continue
        entry: dict[str, Any] = {"channel": channel,
                                 "task": producer.task_id if producer else "",
                                 "readers": sorted({q.query_id for q, _ in read})}
        if channel not in record.query.published:
            entry["auto"] = True
        shown.append(entry)
    return shown
