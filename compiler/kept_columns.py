"""Where the shed columns (`kept`, common/kept.py) start in a physical graph, pure.

The validator types every stream from a shed source on with `kept`, as its readers will see it:
after rewriting, the shedding rule's drop stands between the source and them, and it is the
drop that adds the column. Owns `settle`: the stream a shed source writes into its drop gets
the source's own columns back (what the source's program reads or makes; the drop adds
`kept`). Does not own the drop (rewrite_rules/shedding.rule, `executor.runtime`).
"""

from __future__ import annotations

from dataclasses import replace

from common import kept
from compiler.graph import Graph, Node, Stream


def settle(graph: Graph) -> Graph:
    """`graph` with each shed source's stream into its drop typed without `kept`."""
    into_drops = {n.inputs[0] for n in graph.nodes if n.kind == "drop" and n.inputs}
    changed = {s.name for s in graph.streams if s.name in into_drops
               and graph.node(s.producer).param("shed") is not None and kept.carries(s.schema)}
    if not changed:
        return graph
    streams = tuple(_unkept(s) if s.name in changed else s for s in graph.streams)
    return Graph(graph.name, graph.nodes, streams, published=graph.published)


def _unkept(stream: Stream) -> Stream:
    return replace(stream, schema=kept.without_kept(stream.schema))


def sink_lines(graph: Graph) -> list[str]:
    """One line per sink that writes the shed columns (for `elastiq explain`): which columns,
    what `kept` means on its rows, and the drops upstream of it."""
    lines = []
    for sink in graph.sinks():
        schema = graph.stream(sink.inputs[0]).schema if sink.inputs else None
        if schema is None or not kept.carries(schema):
            continue
        if kept.LOST in schema.names:
            what = (f"{kept.KEPT} double (estimated fraction of its input each result "
                    f"reflects), {kept.LOST} boolean (true: the result lost input)")
        else:
            what = f"{kept.KEPT} double (each row's keep share: 1 - ratio at each drop it passed)"
        lines.append(f"  {sink.name}: {what}; shed at {', '.join(_drops_above(graph, sink))}")
    return lines


def _drops_above(graph: Graph, start: Node) -> list[str]:
    """The drop operators upstream of `start`, in graph order."""
    seen: set[str] = set()
    pending = [start]
    while pending:
        for up in graph.upstream(pending.pop()):
            if up.name not in seen:
                seen.add(up.name)
                pending.append(up)
    return [n.name for n in graph.nodes if n.name in seen and n.kind == "drop"]
