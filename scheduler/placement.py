"""Placement: which offered resources each pending task gets, as a pure function.

Owns the `Offer` value (resources one agent offers us), the demands placement takes
(`TaskDemand`, grouped per query in `QueryDemand`), and `place(offers, demands)`, first-fit as in
the paper with gang placement per query: every pending task of a query is placed in one decision
or none is, so each output channel gets a port from its agent's offer and an endpoint
`tcp://<agent hostname>:<port>` before anything launches. It honours `TaskDemand.apart_from`
(groups that must land on other agents, also against tasks of the query already running; the
state passes a task's `Placement.apart_from`, plus `initially_apart_from` at its first launch)
and `excluded_agents`, and gives a reason for every demand it could not satisfy and every offer
it declines.
Does not own where a task may go (`scheduler.destinations` computes allowed and preferred agents)
nor task lifecycle (`scheduler.state`). No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

PortRange = tuple[int, int]  # inclusive, as Mesos ranges are


@dataclass(frozen=True)
class Offer:
    """Resources one agent offers this framework (several offers of one agent are merged)."""

    offer_id: str
    agent_id: str
    hostname: str
    cpus: float
    mem_mb: float
    ports: tuple[PortRange, ...] = ()
    executor_ids: tuple[str, ...] = ()  # our executors already running on the agent
    attributes: tuple[tuple[str, str], ...] = ()  # the agent's TEXT attributes (name, value)


@dataclass(frozen=True)
class Share:
    """A plain amount of cpus and memory (e.g. what one executor asks for itself)."""

    cpus: float
    mem_mb: float


@dataclass(frozen=True)
class TaskDemand:
    """One task asking for resources; `allowed_agents=None` means any agent."""

    task_id: str
    cpus: float
    mem_mb: float
    outputs: tuple[str, ...]  # channel ids this task serves, one port each
    inputs: tuple[str, ...] = ()
    group: str | None = None
    apart_from: tuple[str, ...] = ()  # groups this task must not share an agent with
    allowed_agents: frozenset[str] | None = None
    preferred_agents: tuple[str, ...] = ()
    preferred_ports: Mapping[str, int] = field(default_factory=dict)  # channel -> port
    extra_ports: int = 0  # ports asked for beyond one per output channel
    excluded_agents: frozenset[str] = frozenset()  # never these (e.g. where it just failed)
    avoid_ports: frozenset[int] = frozenset()  # taken by another program: only as a last resort

    @property
    def port_count(self) -> int:
        return len(self.outputs) + self.extra_ports


@dataclass(frozen=True)
class QueryDemand:
    """All pending tasks of one query, placed together or not at all."""

    query_id: str
    tasks: tuple[TaskDemand, ...]
    occupied: Mapping[str, frozenset[str]] = field(default_factory=dict)  # agent -> groups there
    # agent -> the groups its running tasks must be kept apart from
    occupied_avoids: Mapping[str, frozenset[str]] = field(default_factory=dict)
    known_endpoints: Mapping[str, str] = field(default_factory=dict)  # channel -> endpoint


@dataclass(frozen=True)
class TaskAssignment:
    """Where one task goes, which ports it holds and the endpoints of all its channels."""

    task_id: str
    agent_id: str
    hostname: str
    cpus: float
    mem_mb: float
    ports: tuple[int, ...]
    endpoints: Mapping[str, str]  # channel id -> endpoint, for its inputs and outputs


@dataclass(frozen=True)
class QueryPlacement:
    query_id: str
    assignments: tuple[TaskAssignment, ...]


@dataclass(frozen=True)
class UnplacedDemand:
    query_id: str
    task_id: str
    reason: str


@dataclass(frozen=True)
class DeclinedOffer:
    offer_id: str
    agent_id: str
    reason: str


@dataclass(frozen=True)
class PlacementResult:
    placed: tuple[QueryPlacement, ...]
    unplaced: tuple[UnplacedDemand, ...]
    declined: tuple[DeclinedOffer, ...]
    used_offers: Mapping[str, tuple[str, ...]]  # agent id -> offer ids accepted there
    executor_started_on: frozenset[str] = frozenset()  # agents whose executor share was taken


@dataclass(frozen=True)
class _Pool:
    """What is left on one agent while a decision is being made."""

    agent_id: str
    hostname: str
    offer_ids: tuple[str, ...]
    cpus: float
    mem_mb: float
    free_ports: tuple[int, ...]
    warm: bool  # our executor runs there already (or was charged in this decision)
    groups: frozenset[str] = frozenset()  # groups of the current query placed here
    avoids: frozenset[str] = frozenset()  # groups those tasks must be kept apart from

    def take(self, task: "TaskDemand", ports: tuple[int, ...], executor: Share) -> "_Pool":
        extra_cpus, extra_mem = (0.0, 0.0) if self.warm else (executor.cpus, executor.mem_mb)
        groups = self.groups | {task.group} if task.group else self.groups
        return replace(
            self, cpus=self.cpus - task.cpus - extra_cpus,
            mem_mb=self.mem_mb - task.mem_mb - extra_mem,
            free_ports=tuple(p for p in self.free_ports if p not in ports), warm=True,
            groups=groups, avoids=self.avoids | set(task.apart_from),
        )


_EPS = 1e-9
MAX_PORTS_PER_RANGE = 4096  # enough for any task; keeps huge ranges cheap to enumerate


def place(offers: Iterable[Offer], demands: Iterable[QueryDemand], *,
          executor_id_for: Mapping[str, str] | None = None,
          executor_share: Share = Share(0.0, 0.0),
          warm_agents: frozenset[str] = frozenset()) -> PlacementResult:
    """Place each query's demands first-fit on the offers, gang per query, in the given order.

    An agent where our executor is not running yet pays `executor_share` once, when its first
    task lands there. `executor_id_for` maps agent id -> our executor id there, to recognise
    warm agents from `Offer.executor_ids`; `warm_agents` adds agents known warm otherwise.
    """
    offers = list(offers)
    pools = _pools(offers, executor_id_for or {}, warm_agents)
    placed: list[QueryPlacement] = []
    unplaced: list[UnplacedDemand] = []
    for demand in demands:
        outcome = _place_query(demand, pools, executor_share)
        if isinstance(outcome, tuple):
            pools, assignment = outcome
            placed.append(assignment)
        else:
            unplaced.extend(outcome)
    return _result(offers, pools, placed, unplaced, warm_agents, executor_id_for or {})


def _pools(offers: list[Offer], executor_id_for: Mapping[str, str],
           warm_agents: frozenset[str]) -> dict[str, _Pool]:
    pools: dict[str, _Pool] = {}
    for o in offers:
        warm = o.agent_id in warm_agents or executor_id_for.get(o.agent_id) in o.executor_ids
        prev = pools.get(o.agent_id)
        ports = tuple(_expand(o.ports))
        if prev is None:
            pools[o.agent_id] = _Pool(o.agent_id, o.hostname, (o.offer_id,), o.cpus, o.mem_mb,
                                      ports, warm)
        else:
            pools[o.agent_id] = replace(
                prev, offer_ids=prev.offer_ids + (o.offer_id,), cpus=prev.cpus + o.cpus,
                mem_mb=prev.mem_mb + o.mem_mb, free_ports=prev.free_ports + ports,
                warm=prev.warm or warm)
    return pools


def _expand(ranges: Iterable[PortRange]) -> Iterable[int]:
    for begin, end in ranges:
        yield from range(begin, min(end, begin + MAX_PORTS_PER_RANGE - 1) + 1)


def _place_query(demand: QueryDemand, pools: dict[str, _Pool], executor: Share
                 ) -> tuple[dict[str, _Pool], QueryPlacement] | list[UnplacedDemand]:
    """All tasks of `demand` on a scratch copy of the pools; the copy is kept only if all fit."""
    scratch = {a: replace(p, groups=frozenset(demand.occupied.get(a, frozenset())),
                          avoids=frozenset(demand.occupied_avoids.get(a, frozenset())))
               for a, p in pools.items()}
    chosen: list[tuple[TaskDemand, _Pool, tuple[int, ...]]] = []
    failures: list[UnplacedDemand] = []
    for task in demand.tasks:
        pool = _first_fit(task, _candidates(task, scratch), executor)
        if pool is None:
            failures.append(UnplacedDemand(demand.query_id, task.task_id,
                                           _why_not(task, scratch, executor)))
            continue
        ports = _pick_ports(task, pool)
        scratch[pool.agent_id] = pool.take(task, ports, executor)
        chosen.append((task, pool, ports))
    if failures:
        blocked = {f.task_id for f in failures}
        waiting = f"waits for the rest of its query ({', '.join(sorted(blocked))})"
        failures += [UnplacedDemand(demand.query_id, t.task_id, waiting) for t, _, _ in chosen]
        return failures
    kept = {a: replace(scratch[a], groups=frozenset(), avoids=frozenset()) for a in pools}
    return kept, QueryPlacement(demand.query_id, _assignments(demand, chosen))


def _candidates(task: TaskDemand, pools: Mapping[str, _Pool]) -> list[_Pool]:
    """Pools the task may use, its preferred agents first, otherwise in offer order."""
    allowed = [p for a, p in pools.items()
               if (task.allowed_agents is None or a in task.allowed_agents)
               and a not in task.excluded_agents]
    rank = {a: i for i, a in enumerate(task.preferred_agents)}
    return sorted(allowed, key=lambda p: rank.get(p.agent_id, len(rank)))


def _first_fit(task: TaskDemand, candidates: list[_Pool], executor: Share) -> _Pool | None:
    for pool in candidates:
        if not _shortfalls(task, pool, executor) and not _conflicts(task, pool):
            return pool
    return None


def _needs(task: TaskDemand, pool: _Pool, executor: Share) -> tuple[float, float]:
    if pool.warm:
        return task.cpus, task.mem_mb
    return task.cpus + executor.cpus, task.mem_mb + executor.mem_mb


def _shortfalls(task: TaskDemand, pool: _Pool, executor: Share) -> list[str]:
    cpus, mem = _needs(task, pool, executor)
    out = []
    if pool.cpus + _EPS < cpus:
        out.append(f"needs {cpus:g} cpus, offer has {pool.cpus:g}")
    if pool.mem_mb + _EPS < mem:
        out.append(f"needs {mem:g} MB memory, offer has {pool.mem_mb:g}")
    if len(pool.free_ports) < task.port_count:
        out.append(f"needs {task.port_count} ports, offer has {len(pool.free_ports)}")
    return out


def _conflicts(task: TaskDemand, pool: _Pool) -> list[str]:
    """Groups on the agent this task must be kept apart from, either way round: the task lists
    their group, or they list the task's group."""
    clash = set(task.apart_from) & set(pool.groups)
    if task.group and task.group in pool.avoids:
        others = {g for g in pool.groups if g != task.group}
        clash |= others or {f"(a group avoiding {task.group})"}
    return sorted(clash)


def _why_not(task: TaskDemand, pools: Mapping[str, _Pool], executor: Share) -> str:
    """A reason naming the best offer the task could have had and what it lacked there."""
    candidates = _candidates(task, pools)
    if not candidates:
        where = "any agent" if not pools else "the offered agents"
        allowed = ", ".join(sorted(task.allowed_agents or ())) or where
        if task.excluded_agents:
            allowed += f" but {', '.join(sorted(task.excluded_agents))}"
        return f"no offer from an agent it may use ({allowed})"
    apart = [p for p in candidates if _conflicts(task, p)]
    fitting = [p for p in candidates if not _shortfalls(task, p, executor)]
    if fitting:
        names = ", ".join(f"{p.agent_id} holds {'/'.join(_conflicts(task, p))}" for p in apart)
        return f"every agent with room is ruled out by apart_from: {names}"
    best = max(candidates, key=lambda p: (p.cpus, p.mem_mb, len(p.free_ports)))
    return f"{'; '.join(_shortfalls(task, best, executor))} on agent {best.agent_id}"


def _pick_ports(task: TaskDemand, pool: _Pool) -> tuple[int, ...]:
    """One port per output channel (the preferred one if free), then any extra ports; ports
    the task found taken come last."""
    free = sorted(pool.free_ports, key=lambda p: p in task.avoid_ports)
    picked: list[int] = []
    for channel in task.outputs:
        wanted = task.preferred_ports.get(channel)
        port = wanted if wanted in free else next(p for p in free if p not in picked)
        free.remove(port)
        picked.append(port)
    picked += free[: task.extra_ports]
    return tuple(picked)


def _assignments(demand: QueryDemand, chosen: list[tuple[TaskDemand, _Pool, tuple[int, ...]]]
                 ) -> tuple[TaskAssignment, ...]:
    endpoints = dict(demand.known_endpoints)
    for task, pool, ports in chosen:
        for channel, port in zip(task.outputs, ports):
            endpoints[channel] = f"tcp://{pool.hostname}:{port}"
    return tuple(
        TaskAssignment(task.task_id, pool.agent_id, pool.hostname, task.cpus, task.mem_mb, ports,
                       {c: endpoints[c] for c in task.inputs + task.outputs if c in endpoints})
        for task, pool, ports in chosen)


def _result(offers: list[Offer], pools: Mapping[str, _Pool], placed: list[QueryPlacement],
            unplaced: list[UnplacedDemand], warm_agents: frozenset[str],
            executor_id_for: Mapping[str, str]) -> PlacementResult:
    used_agents = {a.agent_id for q in placed for a in q.assignments}
    used = {a: pools[a].offer_ids for a in pools if a in used_agents}
    reason = _decline_reason(unplaced)
    declined = tuple(DeclinedOffer(o.offer_id, o.agent_id, reason)
                     for o in offers if o.agent_id not in used_agents)
    initially_warm = {o.agent_id for o in offers if o.agent_id in warm_agents
                      or executor_id_for.get(o.agent_id) in o.executor_ids}
    return PlacementResult(tuple(placed), tuple(unplaced), declined, used,
                           frozenset(used_agents - initially_warm))


def _decline_reason(unplaced: list[UnplacedDemand]) -> str:
    if not unplaced:
        return "no pending task needs it"
    first = unplaced[0]
    more = f" (and {len(unplaced) - 1} more)" if len(unplaced) > 1 else ""
    return f"does not fit task {first.task_id}: {first.reason}{more}"
