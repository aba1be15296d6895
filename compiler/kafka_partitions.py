"""Kafka partitions read in parallel: each instance of a partitioned operator reads its own.

Owns `read_in_instances`, a step after the rewrite rules: where the partitioning rule put a
splitter right after a `kafka-source` (one task reading every partition, re-distributing rows
over channels), each instance's network-reader is replaced by a copy of the source with
`share: i, shares: k`, which reads only its block of the topic's partitions
(`common.kafka_partitions.assign`, at the task's start) and keeps its offsets in its own task's
Spark checkpoint; the splitter and the source's own task go. It applies only where it is sound
and nothing is lost:
- the operator is stateless (a keyed, stateful operator needs each key's rows in one instance;
  Elastiq cannot know that the producers partitioned the topic by the operator's key, so it
  keeps the splitter, which hashes the key);
- its parallelism is fixed: no dormant slots, no `elastic`/`min-parallelism` (a rescale moves
  partitions between instances, whose offsets would have to be handed over: not built, so an
  elastic operator keeps the splitter, which rescales as docs/elasticity.md says);
- each instance reads this one stream only (a union's other input keeps its splitter, which a
  rescale would route alone, leaving the Kafka shares of retired instances unread);
- the source names its topics (a `topic-pattern` may match topics that appear later) and feeds
  only the splitter.
docs/kafka.md ("Partitions read in parallel") says it for users. A rule file cannot say it:
the rule language gives parameters only to plumbing operators and cannot drop the source.
"""

from __future__ import annotations

from dataclasses import replace

from common.kafka_partitions import SPEC_STREAM
from compiler.graph import Graph, Node, Stream
from compiler.rewrite import Firing, local_notation

STEP = "kafka-partitions"


def read_in_instances(graph: Graph) -> tuple[Graph, tuple[Firing, ...]]:
    """`graph` with every eligible splitter after a kafka-source replaced (pure), and one
    `Firing` per replacement for explain."""
    firings = []
    for splitter in [n for n in graph.nodes if n.kind == "splitter"]:
        readers = eligible_readers(graph, splitter)
        if readers:
            source, before = graph.producer(splitter.inputs[0]).name, _around(graph, readers)
            graph, copies = _replace(graph, splitter, readers)
            firings.append(Firing(STEP, "partitioning", splitter.name,
                                  (("src", source), ("split", splitter.name)),
                                  before, _around(graph, copies), tuple(c.name for c in copies)))
    return graph, tuple(firings)


def eligible_readers(graph: Graph, splitter: Node) -> list[Node]:
    """The network-readers of `splitter`'s partitions 1..k in order, when the splitter may be
    replaced by k copies of its kafka-source (the module's conditions); [] otherwise."""
    source = graph.producer(splitter.inputs[0])
    k = splitter.param("partitions")
    if source.kind != "kafka-source" or not source.param("topic") or not isinstance(k, int) \
            or graph.consumers(source.produced) != (splitter,) \
            or source.produced in graph.published or splitter.produced in graph.published \
            or splitter.param("folded") or splitter.param("active") not in (None, k):
        return []
    readers = sorted(graph.consumers(splitter.produced), key=lambda r: r.param("partition") or 0)
    if [r.param("partition") for r in readers] != list(range(1, k + 1)) \
            or any(r.kind != "network-reader" for r in readers):
        return []
    instances = [c for r in readers for c in graph.consumers(r.produced)]
    if any(c.stateful or len(c.inputs) != 1 or c.wants("elastic") is not None
           or c.wants("min-parallelism") is not None for c in instances):
        return []
    return readers


def _replace(graph: Graph, splitter: Node, readers: list[Node]) -> tuple[Graph, list[Node]]:
    source = graph.producer(splitter.inputs[0])
    k = len(readers)
    taken = {n.name.casefold() for n in graph.nodes} | {s.name.casefold() for s in graph.streams}
    copies = {r.name: _copy(source, r, i, k, taken) for i, r in enumerate(readers, 1)}
    gone = {source.name, splitter.name}
    nodes = tuple(copies.get(n.name, n) for n in graph.nodes if n.name not in gone)
    streams = tuple(_produced_by(s, copies) for s in graph.streams
                    if s.name not in (source.produced, splitter.produced))
    return Graph(graph.name, nodes, streams, graph.published), list(copies.values())


def _copy(source: Node, reader: Node, i: int, k: int, taken: set[str]) -> Node:
    """Source copy i of k, in reader i's place (its output stream and placement)."""
    name, n = f"{source.name}_{i}", 2
    while name.casefold() in taken:
        name, n = f"{source.name}_{i}_{n}", n + 1
    taken.add(name.casefold())
    return replace(source, name=name, output=reader.output, placement=reader.placement,
                   origin=STEP, params=source.params + (("share", i), ("shares", k),
                                                        (SPEC_STREAM, source.produced)))


def _produced_by(stream: Stream, copies: dict[str, Node]) -> Stream:
    copy = copies.get(stream.producer)
    return stream if copy is None else replace(stream, producer=copy.name)


def _around(graph: Graph, tops: list[Node]) -> str:
    """Each reader's (or source copy's) consumers written down to it, `; ` between them."""
    return "; ".join(local_notation(graph, c, set()) for t in tops
                     for c in graph.consumers(t.produced))
