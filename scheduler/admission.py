"""Admission: structural checks on a `CompiledQuery` before the scheduler accepts it.

Owns `problems(query) -> list[str]`, every reason the scheduler cannot deploy a query (duplicate
task ids, channels naming unknown tasks, impossible resources...), all collected at once, and
`unholdable(query, agents, executor)`: the tasks no known agent could hold even empty (an
operator's cpus=/mem= larger than any agent), which the scheduler refuses at submit.
Does not own checks on the user's spec (the compiler's diagnostics) nor whether the cluster has
room now (placement reports that as pending reasons, not as rejection).
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from common.tasks import CompiledQuery, QueryTask

MAX_TASKS = 1000
EPS = 1e-9


def unholdable(query: CompiledQuery, agents: Mapping[str, tuple[float, float]],
               executor: tuple[float, float]) -> list[str]:
    """Why tasks of `query` can never run: each needs its resources plus the `executor`'s own
    (cpus, MB) on one agent, and no agent of `agents` (agent id -> the cpus and MB it offered
    with nothing of ours on it: its size as far as this framework can tell) has them. Empty
    when every task fits one, or when no agent is known yet (nothing to judge by)."""
    if not agents:
        return []
    found = []
    for task in query.tasks:
        cpus, mem = task.resources.cpus + executor[0], task.resources.mem_mb + executor[1]
        if any(cpus <= c + EPS and mem <= m + EPS for c, m in agents.values()):
            continue
        sizes = ", ".join(f"{a}: {c:g} cpus and {m:g} MB" for a, (c, m) in sorted(agents.items()))
        found.append(f"task {task.task_id} ({', '.join(task.operators)}) asks for "
                     f"{task.resources.cpus:g} cpus and {task.resources.mem_mb} MB, with its "
                     f"executor's own {executor[0]:g} cpus and {executor[1]:g} MB "
                     f"{cpus:g} cpus and {mem:g} MB on one agent; no agent can ever hold it "
                     f"(the agents offer at most {sizes}): ask for less with cpus= or mem= "
                     f"on its operators, or run larger agents")
    return found


def problems(query: CompiledQuery) -> list[str]:
    """Every structural problem of `query`; empty when it can be deployed."""
    found: list[str] = []
    if not query.query_id or "/" in query.query_id or query.query_id.strip() != query.query_id:
        found.append(f"query id {query.query_id!r} must be non-empty, without '/' or spaces")
    if not query.tasks:
        found.append(f"query {query.query_id} has no tasks")
    if len(query.tasks) > MAX_TASKS:
        found.append(f"query {query.query_id} has {len(query.tasks)} tasks, at most {MAX_TASKS}")
    counts = Counter(t.task_id for t in query.tasks)
    found += [f"task id {t} appears {n} times" for t, n in counts.items() if n > 1]
    for task in query.tasks:
        found += _task_problems(query, task)
    found += _channel_problems(query, set(counts))
    return found


def _task_problems(query: CompiledQuery, task: QueryTask) -> list[str]:
    found = []
    if task.query_id != query.query_id:
        found.append(f"task {task.task_id} belongs to query {task.query_id}, "
                     f"not {query.query_id}")
    if not (0 < task.resources.cpus <= 1024):
        found.append(f"task {task.task_id} asks for {task.resources.cpus} cpus")
    if not (0 < task.resources.mem_mb <= 1 << 22):
        found.append(f"task {task.task_id} asks for {task.resources.mem_mb} MB memory")
    if task.resources.ports < 0:
        found.append(f"task {task.task_id} asks for {task.resources.ports} ports")
    known = {c.channel_id for c in query.channels} | {i.channel_id for i in query.imports}
    found += [f"task {task.task_id} uses unknown channel {c}"
              for c in task.inputs + task.outputs if c not in known]
    return found


def _channel_problems(query: CompiledQuery, task_ids: set[str]) -> list[str]:
    found = []
    for c in query.channels:
        if c.producer not in task_ids:
            found.append(f"channel {c.channel_id} is produced by unknown task {c.producer}")
        elif c.channel_id not in query.task(c.producer).outputs:
            found.append(f"channel {c.channel_id}: producer {c.producer} does not list it "
                         "as an output")
        found += [f"channel {c.channel_id} is consumed by unknown task {t}"
                  for t in c.consumers if t not in task_ids]
    return found
