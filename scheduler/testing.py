"""Small builders of compiled queries and offers for the scheduler's tests and benchmarks.

Owns `chain_query` (a query of tasks linked by channels; not from a spec, so never persisted),
`spec_query` (a spec compiled with the source a leader persists) and `offer`. Values only;
nothing here starts processes or opens sockets. Does not own real compilation (`compiler`).
"""

from __future__ import annotations

from pathlib import Path

from common.tasks import ChannelSpec, CompiledQuery, FailoverMode, Placement, QueryTask, Resources
from common.types import Schema
from scheduler.placement import Offer
from scheduler.query_source import QuerySource, compile_source

SCHEMA = Schema.of(("sensor", "string"), ("value", "double"))


def chain_query(query_id: str, n_tasks: int = 2, cpus: float = 1.0, mem_mb: int = 512,
                groups: tuple[str | None, ...] = (), apart: tuple[tuple[str, ...], ...] = (),
                initially_apart: tuple[tuple[str, ...], ...] = (),
                failover: tuple[FailoverMode | None, ...] = ()) -> CompiledQuery:
    """`n_tasks` tasks `<q>.t0 -> <q>.t1 -> ...`, each linked to the next by one channel;
    task i gets `groups[i]`, `apart[i]`, `initially_apart[i]` and `failover[i]` when given."""
    channels = tuple(
        ChannelSpec(f"{query_id}/s{i}", f"s{i}", SCHEMA, f"{query_id}.t{i}",
                    (f"{query_id}.t{i + 1}",))
        for i in range(n_tasks - 1))
    tasks = tuple(
        QueryTask(
            query_id, f"{query_id}.t{i}", "spark", (f"op{i}",),
            (f"{query_id}/s{i - 1}",) if i > 0 else (),
            (f"{query_id}/s{i}",) if i < n_tasks - 1 else (), False,
            Resources(cpus, mem_mb, 1 if i < n_tasks - 1 else 0), f"# program {i}\n",
            Placement(groups[i] if i < len(groups) else None, apart[i] if i < len(apart) else (),
                      initially_apart[i] if i < len(initially_apart) else ()),
            failover[i] if i < len(failover) else None)
        for i in range(n_tasks))
    return CompiledQuery(query_id, tasks, channels, {})


def spec_query(spec: str | Path, query_id: str,
               base_dir: str | Path) -> tuple[CompiledQuery, QuerySource]:
    """The spec file compiled as `query_id` (relative paths under `base_dir`), with its source:
    `service.submit(query, source=source)` submits it as the API does."""
    source = QuerySource.of(Path(spec).read_bytes(), str(spec), query_id, str(base_dir))
    return compile_source(source), source


def offer(offer_id: str, agent_id: str, cpus: float = 4.0, mem_mb: float = 8192.0,
          ports: tuple[tuple[int, int], ...] = ((31000, 31009),),
          executor_ids: tuple[str, ...] = ()) -> Offer:
    return Offer(offer_id, agent_id, f"host-{agent_id}", cpus, mem_mb, ports, executor_ids)
