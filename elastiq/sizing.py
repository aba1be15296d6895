"""How big `elastiq run`'s embedded cluster must be for a plan, decided before anything starts.

Owns one pure decision: from a compiled query's tasks, what each executor takes for itself and
what the user fixed (`--agents`, `--cpus`, `--mem`), the agents to start and what each offers,
or a refusal that says what is missing and which flag provides it. Left to the plan, the
agents are as many as its apart constraints need (`common.tasks.agents_needed`) and each offers
room for the whole plan, so any placement and any failover fits. The answer is checked with the
scheduler's own placement function on the offers those agents will make, so a size this module
accepts is one the scheduler places. It does not start, place or run anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from common.tasks import QueryTask, agents_needed
from scheduler.destinations import apart_groups
from scheduler.placement import Offer, QueryDemand, Share, TaskDemand, place

DEFAULT_CPUS = 4.0  # what an agent offers at least, so a small plan leaves room to grow
DEFAULT_MEM_MB = 6144
PORTS_PER_AGENT = 199  # channel ports each embedded agent offers (a claimed band: elastiq.launch)
FIRST_PORT = 31000  # where the nominal bands of the placement check begin
MAX_AGENTS = 22  # more agents than one machine runs usefully


@dataclass(frozen=True)
class ClusterSize:
    """The embedded agents to start: how many, and what each offers."""

    agents: int
    cpus: float
    mem_mb: int


class PlanDoesNotFit(Exception):
    """The user's sizes cannot hold the plan; the message names what is missing and the flag."""


def size_cluster(tasks: Sequence[QueryTask], executor: Share, agents: int | None = None,
                 cpus: float | None = None, mem_mb: int | None = None) -> ClusterSize:
    """The cluster for `tasks`: the user's sizes where given, the plan's needs otherwise.
    Raises PlanDoesNotFit, naming every shortfall and its flag, when the given sizes are short."""
    _check_given(agents, cpus, mem_mb)
    apart = agents_needed(tasks)
    total_cpus = sum(t.resources.cpus for t in tasks) + executor.cpus
    total_mem = sum(t.resources.mem_mb for t in tasks) + executor.mem_mb
    size = ClusterSize(agents if agents is not None else apart,
                       cpus if cpus is not None else max(DEFAULT_CPUS, math.ceil(total_cpus)),
                       mem_mb if mem_mb is not None else max(DEFAULT_MEM_MB, math.ceil(total_mem)))
    problems = []
    if size.agents < apart:
        problems.append(f"its placement keeps tasks apart on {apart} agents, --agents gives "
                        f"{size.agents}: give --agents {apart} or more (or leave it out)")
    unplaced = _unplaced(tasks, executor, size) if not problems else []
    if unplaced:
        problems.append(f"{unplaced[0]}" + (f" (and {len(unplaced) - 1} more)"
                                             if len(unplaced) > 1 else ""))
        problems += _flags(tasks, executor, size, cpus, mem_mb, total_cpus, total_mem)
    if problems:
        raise PlanDoesNotFit(f"the plan of {len(tasks)} task(s) does not fit {size.agents} "
                             f"agent(s) of {size.cpus:g} cpus and {size.mem_mb} MB: "
                             + "; ".join(problems))
    return size


def _check_given(agents: int | None, cpus: float | None, mem_mb: int | None) -> None:
    """Sizes that are no sizes (zero, negative, not finite) are refused, naming the flag."""
    bad = [f"{flag} must be a number above 0, got {value}"
           for flag, value in (("--agents", agents), ("--cpus", cpus), ("--mem", mem_mb))
           if value is not None and not (math.isfinite(value) and value > 0)]
    if agents is not None and agents > MAX_AGENTS:
        bad.append(f"--agents {agents} is more than one machine runs (at most {MAX_AGENTS})")
    if bad:
        raise PlanDoesNotFit("; ".join(bad))


def _unplaced(tasks: Sequence[QueryTask], executor: Share, size: ClusterSize) -> list[str]:
    """Why tasks would stay unplaced on the offers of `size`'s agents (none: all fit)."""
    offers = [Offer(f"sizing-{i}", f"agent-{i}", "127.0.0.1", size.cpus, size.mem_mb,
                    ((FIRST_PORT + i * PORTS_PER_AGENT,
                      FIRST_PORT + (i + 1) * PORTS_PER_AGENT - 1),))
              for i in range(size.agents)]
    demands = [TaskDemand(t.task_id, t.resources.cpus, float(t.resources.mem_mb), t.outputs,
                          t.inputs, t.placement.group,
                          apart_groups(t.placement.apart_from, t.placement.initially_apart_from, 0),
                          extra_ports=max(0, t.resources.ports - len(t.outputs)))
               for t in tasks]
    result = place(offers, [QueryDemand("sizing", tuple(demands))], executor_share=executor)
    return [f"task {u.task_id}: {u.reason}" for u in result.unplaced
            if not u.reason.startswith("waits for")]


def _flags(tasks: Sequence[QueryTask], executor: Share, size: ClusterSize, cpus: float | None,
           mem_mb: int | None, total_cpus: float, total_mem: float) -> list[str]:
    """Which flag gives what is missing: the sizes that hold the whole plan on every agent."""
    out = []
    biggest_cpus = max((t.resources.cpus for t in tasks), default=0) + executor.cpus
    biggest_mem = max((t.resources.mem_mb for t in tasks), default=0) + executor.mem_mb
    if cpus is not None:
        out.append(f"the plan needs {total_cpus:g} cpus in all (one task and an executor "
                   f"{biggest_cpus:g}): give --cpus {math.ceil(total_cpus)} (or more --agents), "
                   "or leave --cpus out to size the agents from the plan")
    if mem_mb is not None:
        out.append(f"the plan needs {total_mem:g} MB in all (one task and an executor "
                   f"{biggest_mem:g}): give --mem {math.ceil(total_mem)} (or more --agents), or "
                   "leave --mem out to size the agents from the plan")
    return out
