"""Automatic sharing (docs/queries.md, "Automatic sharing"): the canonical forms of streams and
the largest shared part (`compiler.autoshare`), near-misses that must not share, a fuzz test over
random plans against a plain-Python evaluation of the streams, the rewrite into a stream-source,
and the scheduler's part (offers, wiring an internal channel by a `readers` message, the stop
rule, status, updates). No Spark, no sockets."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.diagnostics import SpecError
from common.messages import ReadersMessage
from common.paths import local_roots
from common.tasks import CompiledQuery
from compiler import autoshare
from compiler.pipeline import Compilation, compile_spec_text
from elastiq.explain import explain
from scheduler import sharing, update_plan
from scheduler.api import Call, route, shared_in
from scheduler.commands import ReplyToRequest, SendFrameworkMessage
from scheduler.events import OffersReceived, QueryStopRequested, QuerySubmitted, StatusUpdated
from scheduler.loop import Reply
from scheduler.query_source import BadSource, QuerySource, compile_source
from scheduler.state import SchedulerState
from scheduler.testing import offer
from scheduler.views import snapshot
from tests.spec_snippets import READING_TYPE
from elastiq.service_cli import shared_lines
from tests.test_sharing import keys_for, launches, state, submit  # noqa: F401  (fixture)

SOURCE = """  <operator name="{src}" type="generator">
    <param name="shape" value="sensor"/>
    <param name="seed" value="{seed}"/>
    <param name="rate" value="{rate}"/>
    <param name="limit" value="{limit}"/>
    <output name="{raw}" type="reading"/>
  </operator>
"""
FILTER = """  <operator name="{name}" type="filter">
    <input name="{inp}"/>
    <param name="condition" value="{cond}"/>
    <output name="{out}"/>
  </operator>
"""
SINK = """  <operator name="{name}" type="file-sink">
    <input name="{inp}"/>
    <param name="path" value="{path}"/>
  </operator>
"""


def plan(query: str, *, src: str = "src", raw: str = "raw", seed: int = 5, rate: int = 100,
         limit: int = 1000, cond: str = "{s}.temp &gt; 30", f: str = "hot", out: str = "hotR",
         sinks: int = 2, share: str = "", tail: str = "") -> str:
    """generator -> filter -> `sinks` file sinks (two: the filter's stream is a channel)."""
    body = SOURCE.format(src=src, seed=seed, rate=rate, limit=limit, raw=raw)
    body += FILTER.format(name=f, inp=raw, cond=cond.format(s=raw), out=out)
    body += "".join(SINK.format(name=f"sink{i}", inp=out, path=f"{query}-{i}.jsonl")
                    for i in range(sinks))
    attr = f' share="{share}"' if share else ""
    return f'<dataflow name="{query}"{attr}>\n{READING_TYPE}{body}{tail}</dataflow>\n'


def compile_(text: str, offers: dict[str, str] | None = None, name: str = "q.xml"
             ) -> Compilation:
    return compile_spec_text(text, name, base_dir="/tmp", offers=offers)


def offers_of(*queries: CompiledQuery) -> dict[str, str]:
    return {form: channel for q in queries for channel, form in q.shareable}


# --- canonical forms ------------------------------------------------------------------------------

def test_names_do_not_matter_but_every_parameter_does() -> None:
    writer = compile_(plan("w")).query
    assert writer.shareable and writer.shareable[0][0] == "w/hotR"
    renamed = compile_(plan("n", src="g", raw="rows", f="warm", out="w2", sinks=1),
                       offers_of(writer))
    assert [(s.stream, s.channel, s.replaced) for s in renamed.shares] == \
        [("w2", "w/hotR", ("g", "warm"))]
    for miss in ({"seed": 6}, {"rate": 101}, {"limit": 999}, {"cond": "{s}.temp &gt; 31"},
                 {"cond": "{s}.temp &gt;= 30"}):
        near = compile_(plan("n", sinks=1, **miss), offers_of(writer))  # type: ignore[arg-type]
        assert near.shares == () and near.query.imports == (), miss


def test_a_string_literal_that_names_a_stream_is_not_taken_for_it() -> None:
    """`a.sensor = 'a.x'` over input a and `b.sensor = 'b.x'` over input b differ: only the
    qualifier outside quotes is written by port."""
    assert autoshare.by_port("a.sensor = 'a.x'", ("a",)) != \
        autoshare.by_port("b.sensor = 'b.x'", ("b",))
    assert autoshare.by_port("a.temp > 3", ("a",)) == autoshare.by_port("b.temp  >  3", ("b",))
    assert autoshare.by_port("a.temp >", ("a",)).startswith("$0 ")
    assert autoshare.by_port("'unended", ("a",)) == "raw:'unended"


def test_file_paths_are_compared_resolved() -> None:
    spec = f"""<dataflow name="{{q}}">
{READING_TYPE}  <operator name="src" type="file-source">
    <param name="path" value="{{path}}"/>
    <output name="raw" type="reading"/>
  </operator>
  <operator name="a" type="file-sink"><input name="raw"/><param name="path" value="{{q}}a.jsonl"/></operator>
  <operator name="b" type="file-sink"><input name="raw"/><param name="path" value="{{q}}b.jsonl"/></operator>
</dataflow>
"""
    writer = compile_(spec.format(q="w", path="in.jsonl")).query
    same = compile_(spec.format(q="n", path="/tmp/in.jsonl"), offers_of(writer))
    other = compile_(spec.format(q="n", path="/tmp/other.jsonl"), offers_of(writer))
    assert [s.channel for s in same.shares] == ["w/raw"] and other.shares == ()


def test_streams_that_depend_on_when_they_run_have_no_form() -> None:
    shed = plan("w").replace('<param name="limit" value="1000"/>',
                             '<param name="limit" value="1000"/>\n'
                             '    <param name="shed" value="random"/>')
    assert compile_(shed).query.shareable == ()  # a shedding source: its rows may be dropped
    reader = f"""<dataflow name="r">
{READING_TYPE}  <operator name="in" type="stream-source">
    <param name="stream" value="w/hotR"/>
    <output name="got" type="reading"/>
  </operator>
  <operator name="a" type="file-sink"><input name="got"/><param name="path" value="a"/></operator>
  <operator name="b" type="file-sink"><input name="got"/><param name="path" value="b"/></operator>
</dataflow>
"""
    assert compile_(reader).query.shareable == ()


def test_the_largest_shared_part_is_read_and_a_branch_that_needs_more_keeps_it() -> None:
    """Offers for both the generator's and the filter's streams: the filter's is read (the
    generator is not run); a second branch reading the generator's rows directly keeps reading
    them from the running query's generator channel instead."""
    writer = compile_(plan("w").replace('<input name="hotR"/>\n    <param name="path" '
                                        'value="w-1.jsonl"/>',
                                        '<input name="raw"/>\n    <param name="path" '
                                        'value="w-1.jsonl"/>')).query
    assert {c for c, _ in writer.shareable} == {"w/raw", "w/hotR"} or \
        {c for c, _ in writer.shareable} == {"w/raw"}
    offers = offers_of(writer)
    both = offers | {autoshare.forms(compile_(plan("x")).written or
                                     compile_(plan("x")).logical)["hotR"]: "w/hotR"}
    alone = compile_(plan("n", sinks=1), both)
    assert [(s.stream, s.channel) for s in alone.shares] == [("hotR", "w/hotR")]
    branch = compile_(plan("n", sinks=1, tail=SINK.format(name="rawsink", inp="raw",
                                                          path="n-raw.jsonl")), both)
    assert sorted((s.stream, s.channel) for s in branch.shares) == \
        [("hotR", "w/hotR"), ("raw", "w/raw")]
    assert [n.kind for n in branch.logical.nodes].count("generator") == 0


def test_share_false_opts_out_and_an_own_published_stream_is_never_read() -> None:
    writer = compile_(plan("w")).query
    assert compile_(plan("n", sinks=1, share="false"), offers_of(writer)).shares == ()
    published = plan("n", sinks=1).replace('<output name="hotR"/>',
                                           '<output name="hotR" publish="true"/>')
    assert compile_(published, offers_of(writer)).shares == ()
    with pytest.raises(SpecError) as refused:
        compile_(plan("n", share="maybe"))
    assert "share" in str(refused.value.diagnostics[0].render())


def test_the_rewrite_reads_the_running_stream_and_explain_shows_it() -> None:
    writer = compile_(plan("w")).query
    c = compile_(plan("n", sinks=1), offers_of(writer), name="n.xml")
    (task,) = c.query.tasks
    assert task.operators == ("hot", "sink0") and task.inputs == ("w/hotR",)
    (imp,) = c.query.imports
    assert (imp.channel_id, imp.auto, imp.start, imp.where) == \
        ("w/hotR", True, "retained", c.written and f"n.xml:{_line(plan('n'), 'hot')}:3")
    assert "stream_source" in task.program and "w/hotR" in task.program
    shown = explain(c)
    assert "hotR: hot := filter(src := generator)" in shown
    assert "read from w/hotR (start: retained) instead of computed" in shown
    assert "sink0 := file_sink(hot := stream_source)" in shown
    assert compile_(plan("n", sinks=1)).written is None  # nothing offered: as before


def _line(text: str, operator: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1)
                if f'<operator name="{operator}"' in line)


# --- fuzz: random chains against a plain-Python evaluation ----------------------------------------

@dataclass(frozen=True)
class Op:
    kind: str  # "above": temp > c; "below": temp < c; "scale": temp * c
    c: int


def chain_spec(query: str, seed: int, ops: list[Op], cut: int | None, prefix: str) -> str:
    """generator -> ops, each stream named with `prefix`; stream `cut` (an op's index) also
    feeds a second sink (so it is a channel), the last feeds a sink."""
    body = SOURCE.format(src=f"{prefix}g", seed=seed, rate=100, limit=500, raw=f"{prefix}s0")
    for i, op in enumerate(ops):
        inp, out = f"{prefix}s{i}", f"{prefix}s{i + 1}"
        if op.kind == "scale":
            body += f"""  <operator name="{prefix}o{i}" type="project">
    <input name="{inp}"/>
    <field name="sensor" value="{inp}.sensor"/>
    <field name="ts" value="{inp}.ts"/>
    <field name="temp" value="{inp}.temp * {op.c}"/>
    <field name="humidity" value="{inp}.humidity"/>
    <output name="{out}"/>
  </operator>
"""
        else:
            sign = "&gt;" if op.kind == "above" else "&lt;"
            body += FILTER.format(name=f"{prefix}o{i}", inp=inp, out=out,
                                  cond=f"{inp}.temp {sign} {op.c}")
    body += SINK.format(name=f"{prefix}end", inp=f"{prefix}s{len(ops)}", path=f"{query}.jsonl")
    if cut is not None:
        body += SINK.format(name=f"{prefix}cut", inp=f"{prefix}s{cut}", path=f"{query}-c.jsonl")
    return f'<dataflow name="{query}">\n{READING_TYPE}{body}</dataflow>\n'


def evaluate(seed: int, ops: list[Op]) -> list[float]:
    """The stream after `ops` in plain Python over rows fixed by the generator's seed (the
    oracle: two chains over one seed are equal streams when this agrees on many rows)."""
    rows = [float(random.Random(seed * 1000 + i).randint(-20, 60)) for i in range(400)]
    for op in ops:
        if op.kind == "above":
            rows = [t for t in rows if t > op.c]
        elif op.kind == "below":
            rows = [t for t in rows if t < op.c]
        else:
            rows = [t * op.c for t in rows]
    return rows


def random_ops(rng: random.Random, n: int) -> list[Op]:
    return [Op(rng.choice(("above", "below", "scale")), rng.choice((1, 2, 3, 30)))
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_shared_streams_equal_the_ones_they_replace(seed: int) -> None:
    """Random running chains (one stream served as a channel) and random new chains, some a
    renamed copy with one operator changed: whatever is shared, the plain-Python evaluation
    of the running stream equals the new query's stream it replaces; and when the new chain's
    prefix up to the running channel is an unchanged copy, it is shared."""
    rng = random.Random(seed)
    for _ in range(12):
        ops_w = random_ops(rng, rng.randint(1, 4))
        cut = rng.randint(0, len(ops_w) - 1)  # the stream after op `cut`... (s{cut+1})
        gseed = rng.choice((1, 2))
        writer = compile_(chain_spec("w", gseed, ops_w, cut + 1, "a")).query
        ops_n = list(ops_w) + random_ops(rng, rng.randint(0, 2))
        mutated = rng.random() < 0.5
        if mutated:
            i = rng.randrange(len(ops_n))
            ops_n[i] = Op(ops_n[i].kind, ops_n[i].c + rng.choice((1, -1)))
        nseed = gseed if rng.random() < 0.8 else 3 - gseed
        new = compile_(chain_spec("n", nseed, ops_n, None, "b"), offers_of(writer))
        served = dict(writer.shareable)
        for s in new.shares:
            k = int(s.stream.removeprefix("bs"))
            w = int(s.channel.removeprefix("w/as"))
            assert s.channel in served
            assert nseed == gseed and evaluate(nseed, ops_n[:k]) == evaluate(gseed, ops_w[:w])
        copy = nseed == gseed and ops_n[:cut + 1] == ops_w[:cut + 1]
        if copy and len(ops_n) > cut + 1:
            assert any(s.channel == f"w/as{cut + 1}" for s in new.shares), (ops_w, ops_n, cut)
        if not copy:
            assert all(s.channel != f"w/as{cut + 1}" for s in new.shares)


# --- the scheduler --------------------------------------------------------------------------------

def running(s: SchedulerState, text: str, agent: str = "a1") -> CompiledQuery:
    q = compile_(text).query
    assert submit(s, q, f"s-{q.query_id}").accepted
    s.handle(OffersReceived(f"o-{q.query_id}", (offer(f"o-{q.query_id}", agent),)))
    for t in q.tasks:
        s.handle(StatusUpdated(f"u-{t.task_id}", f"{t.task_id}.a1", "RUNNING", "", "", agent,
                               f"elastiq-exec-{agent}", "SOURCE_EXECUTOR"))
    return q


def test_offers_wire_an_internal_channel_by_a_readers_message_and_stop_follows_the_rule(
        state: SchedulerState) -> None:  # noqa: F811
    writer = running(state, plan("w"))
    offers = sharing.offers(state.queries)
    assert offers == offers_of(writer)
    reader = compile_(plan("n", sinks=1), offers).query
    out = state.handle(QuerySubmitted("s-n", reader, None, keys_for(reader)))
    assert [c for c in out if isinstance(c, ReplyToRequest)][0].accepted
    producer = next(c.producer for c in writer.channels if c.channel_id == "w/hotR")
    (admit,) = [c for c in out if isinstance(c, SendFrameworkMessage)]
    key = state.queries["n"].keys["n.t0"]["public"]
    assert admit.message == ReadersMessage(f"{producer}.a1", "w/hotR",
                                           (("n.t0/read:w/hotR", key),))
    launched = launches(state.handle(OffersReceived("o2", (offer("o2", "a2"),))))["n.t0"]
    assert launched["keys"]["servers"] == \
        {"w/hotR": state.queries["w"].keys[producer]["public"]}
    view = snapshot(state)["queries"]
    assert view["w"]["published"] == [{"channel": "w/hotR", "task": producer,
                                       "readers": ["n"], "auto": True}]
    assert view["n"]["reads"] == view["n"]["shared"] == ["w/hotR"]
    assert shared_lines(view["w"]) == [f"  shares w/hotR (task {producer}), read by n"]
    assert shared_lines(view["n"]) == ["  reads w/hotR (automatic sharing: in place of an "
                                       "equal subgraph)"]
    (refused,) = state.handle(QueryStopRequested("st", "w"))
    assert (refused.accepted, refused.status) == (False, 409)
    assert "w/hotR is read by n" in refused.message
    assert state.handle(QueryStopRequested("st2", "n"))[0].accepted
    state.handle(StatusUpdated("k", "n.t0.a1", "KILLED", "", "", "a2", "elastiq-exec-a2",
                               "SOURCE_EXECUTOR"))
    assert state.queries["n"].phase == "stopped"
    assert state.handle(QueryStopRequested("st3", "w"))[0].accepted
    assert sharing.offers(state.queries) == {}


def test_an_update_may_not_change_what_computes_a_stream_read_by_sharing(
        state: SchedulerState) -> None:  # noqa: F811
    writer = running(state, plan("w"))
    reader = compile_(plan("n", sinks=1), sharing.offers(state.queries)).query
    assert submit(state, reader, "s-n").accepted
    changed = compile_(plan("w", cond="{s}.temp &gt; 31")).query
    diff = update_plan.diff_plans(writer, changed)
    problems = update_plan.refusals(writer, changed, diff, True, state.queries)
    assert any("w/hotR is read by n in place of an equal subgraph" in p for p in problems)
    same = compile_(plan("w")).query
    assert not update_plan.refusals(writer, same, update_plan.diff_plans(writer, same), True,
                                    state.queries)


def test_a_source_keeps_the_offers_it_reads_and_recompiles_to_the_same_plan() -> None:
    writer = compile_(plan("w")).query
    offered = tuple(sorted(offers_of(writer).items()))
    query = compile_(plan("n", sinks=1), dict(offered)).query
    kept = shared_in(query, offered)
    assert kept == offered
    source = QuerySource(plan("n", sinks=1), "q.xml", "n", "/tmp", shared=kept)
    back = QuerySource.from_json(source.to_json())
    assert back == source
    assert compile_source(back, local_roots(Path("/tmp"))).imports == query.imports
    with pytest.raises(BadSource, match="shared must be"):
        QuerySource.from_json(source.to_json().replace('"shared": [[', '"shared": [[1, '))
    assert CompiledQuery.from_json(query.to_json()) == query


def test_a_stream_a_pattern_cuts_is_shareable_through_its_network_writer() -> None:
    """pipeline="split" on the projection: the filter's rows cross to its task through the
    pipelining rule's network-writer, the same rows: a plain copy of the query reads them."""
    text = (Path(__file__).parent / "specs" / "e2e-auto-reader.xml").read_text()
    pipelined = compile_(text.replace('type="project"', 'type="project" pipeline="split"')
                         .replace("auto-reader", "w")).query
    ((channel, _),) = pipelined.shareable
    assert channel.startswith("w/") and channel != "w/warmRows"
    new = compile_(text, offers_of(pipelined))
    assert [(s.stream, s.channel) for s in new.shares] == [("warmRows", channel)]
    assert [t.operators for t in new.query.tasks] == [("warm", "convert", "sink")]


def test_the_api_compiles_a_submit_with_the_offers_and_keeps_those_it_reads() -> None:
    """POST /queries: compiled with the service's offers, the reply names what is read by
    automatic sharing, the source handed to the scheduler keeps only those offers; GET /shares
    answers the offers (what `elastiq explain --scheduler` compiles with)."""
    writer = compile_(plan("w")).query
    offers = offers_of(writer) | {"f" * 64: "x/unused"}
    got: list[tuple[CompiledQuery, QuerySource]] = []

    class Service:
        def share_offers(self) -> dict[str, str]:
            return offers

        def submit(self, query: CompiledQuery, timeout: float = 10.0,
                   source: QuerySource | None = None) -> Reply:
            assert source is not None
            got.append((query, source))
            return Reply(True, 200, f"query {query.query_id} accepted")

    def compile(source: QuerySource) -> CompiledQuery:
        return compile_spec_text(source.spec_bytes(), "n.xml", base_dir="/tmp",
                                 offers=dict(source.shared)).query

    body = plan("n", sinks=1).encode()
    call = Call("POST", "/queries", ("queries",), {}, {"Content-Type": "application/xml"}, body)
    status, reply = route(Service(), call, compile)  # type: ignore[arg-type]
    assert status == 201 and reply["shared"] == ["w/hotR"]
    assert reply["message"].startswith("query n accepted; reads w/hotR (in place of its "
                                       "operator n.xml:") and "by automatic sharing" in \
        reply["message"]
    ((query, source),) = got
    assert [i.channel_id for i in query.imports if i.auto] == ["w/hotR"]
    assert source.shared == tuple(p for p in offers.items() if p[1] == "w/hotR")
    shares = Call("GET", "/shares", ("shares",), {}, {}, b"")
    assert route(Service(), shares, compile) == (200, {"offers": offers})  # type: ignore[arg-type]


def test_a_submit_compiled_to_share_with_a_writer_that_stopped_since_is_refused(
        state: SchedulerState) -> None:  # noqa: F811
    running(state, plan("w"))
    reader = compile_(plan("n", sinks=1), sharing.offers(state.queries), name="n.xml").query
    assert state.handle(QueryStopRequested("st", "w"))[0].accepted
    reply = submit(state, reader, "s-n")
    assert (reply.accepted, reply.status) == (False, 400)
    assert reply.message.startswith("n.xml:") and "stream w/hotR, which this query was " \
        "compiled to read in place of an equal subgraph (automatic sharing), is no longer " \
        "served; submit it again" in reply.message
