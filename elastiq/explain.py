"""What `elastiq explain` shows: the plans in the paper's notation, the tasks, and pictures.

Owns the text and picture files of a compilation; it only reads a `Compilation`.
"""

from __future__ import annotations

from pathlib import Path

from compiler.graph import Graph, notation, to_dot, to_mermaid
from compiler.pipeline import Compilation


def explain(c: Compilation) -> str:
    q = c.query
    lines = [f"query {q.query_id}", "", "logical plan:"]
    lines += [f"  {line}" for line in notation(c.logical)]
    same = c.physical == c.logical
    lines += ["", "physical plan:" + ("  (no patterns asked for: same as the logical plan)"
                                      if same else "")]
    lines += [f"  {line}" for line in notation(c.physical)]
    lines += ["", f"tasks ({len(q.tasks)}):"]
    for task in q.tasks:
        state = "stateful" if task.stateful else "stateless"
        r = task.resources
        lines.append(f"  {task.task_id}: {', '.join(task.operators)}  [{state}; "
                     f"{r.cpus:g} cpus, {r.mem_mb} MB, {r.ports} port(s)]")
        for ch in task.inputs:
            lines.append(f"      reads  {ch}")
        for ch in task.outputs:
            lines.append(f"      writes {ch}")
    if q.channels:
        lines += ["", "channels:"]
        for ch in q.channels:
            lines.append(f"  {ch.channel_id}: {ch.producer} -> {', '.join(ch.consumers)}")
    lines += ["", "streams:"]
    for s in c.physical.streams:
        cols = ", ".join(f"{f.name} {f.type.value}" for f in s.schema)
        lines.append(f"  {s.name} ({cols})")
    return "\n".join(lines)


def task_clusters(c: Compilation) -> dict[str, list[str]]:
    return {plan.task_id: list(plan.nodes) for plan in c.plans}


def write_pictures(c: Compilation, out: Path) -> list[Path]:
    """logical.dot/.mmd and physical.dot/.mmd (the physical ones boxed by task)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, graph, clusters in (("logical", c.logical, None),
                                  ("physical", c.physical, task_clusters(c))):
        written += _write(out, name, graph, clusters)
    return written


def _write(out: Path, name: str, graph: Graph, clusters: dict[str, list[str]] | None) -> list[Path]:
    dot, mmd = out / f"{name}.dot", out / f"{name}.mmd"
    dot.write_text(to_dot(graph, clusters))
    mmd.write_text(to_mermaid(graph, clusters))
    return [dot, mmd]
