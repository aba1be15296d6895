"""The pattern operator's repetition partitioned by rewriting (the paper's Figure 8, top;
rewrite_rules/pattern-partitioning.rule), layers 1 and 2, pure: k matchers holding shares of
one key's partial matches find together exactly the matches of one matcher and of the
independent backtracking matcher (tests/cep_oracle.py) on thousands of seeded streams, and
each holds fewer partial matches; `match-instances` is checked with located errors; the rule
parses, fires only where it may, once, and `explain` shows its plan (golden file
tests/golden/rewrite/pattern-partitioning.txt; ELASTIQ_UPDATE_GOLDEN=1 rewrites it); the
generated task programs carry each instance's share."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from compiler.expr import pattern as pt
from compiler.guards import GUARDS
from compiler.pipeline import compile_spec_text
from compiler.rewrite import rewrite
from compiler.rules import load_rules
from elastiq.explain import explain
from executor.cep.match import KeyMatcher, PatternOverflow, build_program, owner
from rewrite_rules import shipped_rule_files
from tests import cep_oracle
from tests.spec_snippets import locate
from tests.test_cep import SCHEMA, _random_stream, random_case
from tests.test_pattern_tasks import rt_calls
from tests.test_rewrite import BASE, RULES, _errors, logical, spec

GOLDEN = Path(__file__).resolve().parent / "golden" / "rewrite" / "pattern-partitioning.txt"
NEXT_ROW = '<param name="after-match" value="skip-to-next-row"/>'


# ================================================ shares of the partial matches vs the oracle ==

def _program(share: tuple[int, int] | None, text: str,
                    defines: dict, within: int):
    return build_program("s", SCHEMA, "ts", text, [(v, c[0]) for v, c in defines.items()],
                         [("n", "count()"), ("start", "first(ts)")], within,
                         after_match="skip-to-next-row", share=share)[0]


def _feed_all(program, batches: list[list[dict]], delay: int) -> list[tuple]:
    """The matches of one matcher over the batches (each through the state store's JSON)."""
    matcher, got, max_ts = KeyMatcher(program), [], None
    for batch in batches:
        watermark = None if max_ts is None else max_ts - delay
        got += matcher.feed(batch, watermark)
        matcher = KeyMatcher.from_json(program, matcher.to_json())
        max_ts = max([r["ts"] for r in batch] + ([max_ts] if max_ts is not None else []),
                     default=max_ts)
    got += matcher.feed([], 10**9)
    assert matcher.idle()
    return [(m.rows[0]["ts"], m.labels, tuple(sorted(m.rows[0].items()))) for m in got]


def _case(rng: random.Random) -> tuple[int, list[int]]:
    text, tree, defines, within, delay = random_case(rng)
    k = rng.choice([2, 3])
    batches = _random_stream(rng)
    one = _feed_all(_program(None, text, defines, within), batches, delay)
    parts = [_feed_all(_program((i, k), text, defines, within), batches, delay)
             for i in range(1, k + 1)]
    for i, part in enumerate(parts, 1):  # an instance finds only matches starting at its rows
        assert all(owner(dict(first), k) == i for _, _, first in part)
    assert sorted(m for part in parts for m in part) == sorted(one), (text, within, batches)
    fed, max_ts = [], None  # the oracle, over the rows that were not late
    for batch in batches:
        fed.append((batch, -10**9 if max_ts is None else max_ts - delay))
        max_ts = max([r["ts"] for r in batch] + ([max_ts] if max_ts is not None else []),
                     default=max_ts)
    fed.append(([], 10**9))
    rows = cep_oracle.on_time_rows(fed, "ts")
    want = [(rows[i]["ts"], tuple(labels)) for i, labels in cep_oracle.all_matches(
        tree, rows, {v: c[1] for v, c in defines.items()}, within, "ts", skip_to_next=True)]
    assert sorted((t, lb) for t, lb, _ in one) == sorted(want), (text, within, batches)
    return len(want), [len(p) for p in parts]


def test_shares_together_find_the_matches_of_one_instance_and_of_the_oracle() -> None:
    rng = random.Random(2024)
    matches = split = empty = 0
    for _ in range(2000):
        found, parts = _case(rng)
        matches += found
        empty += found == 0
        split += sum(1 for n in parts if n) > 1
    assert matches > 1000 and empty > 100 and split > 200, (matches, empty, split)


def test_skip_to_next_row_keeps_overlapping_matches_that_skip_past_last_row_drops() -> None:
    tree = pt.parse_pattern("A B+")
    falling = {"B": lambda rows, lb: rows[-1]["price"] < rows[-2]["price"]}
    defines = [("B", "price < prev(price)")]
    rows = [{"k": "x", "ts": i, "price": float(p), "volume": 1}
            for i, p in enumerate([9, 8, 7, 6, 9])]
    for after, oracle_starts in (("skip-past-last-row", [0]), ("skip-to-next-row", [0, 1, 2])):
        program, _ = build_program("s", SCHEMA, "ts", "A B+", defines, [], 100, after_match=after)
        got = [m.rows[0]["ts"] for m in KeyMatcher(program).feed(rows, 100)]
        want = [i for i, _ in cep_oracle.all_matches(tree, rows, falling, 100, "ts",
                                                     skip_to_next=after != "skip-past-last-row")]
        assert got == want == oracle_starts


def test_each_share_holds_part_of_a_key_s_partial_matches() -> None:
    """One matcher over a long open repetition exceeds its bound; two shares, each with the same
    bound, hold about half each and do not."""
    rows = [{"k": "x", "ts": i, "price": float(i % 7), "volume": 1} for i in range(60)]
    args = ("s", SCHEMA, "ts", "A B+", [("B", "volume = 1")], [], 10**6)
    single, _ = build_program(*args, max_partial=40, after_match="skip-to-next-row")
    with pytest.raises(PatternOverflow, match="max-partial-matches=40"):
        KeyMatcher(single).feed(rows, 10**6)
    owned = [sum(1 for r in rows if owner(r, 2) == i) for i in (1, 2)]
    assert max(owned) <= 40 < len(rows), owned
    for i in (1, 2):
        share, _ = build_program(*args, max_partial=40, after_match="skip-to-next-row",
                                 share=(i, 2))
        KeyMatcher(share).feed(rows, 10**6)  # within the bound


@pytest.mark.parametrize("share", [(0, 2), (3, 2), (1,)])
def test_a_share_outside_its_instances_is_refused(share: tuple) -> None:
    with pytest.raises(ValueError, match="share"):
        build_program("s", SCHEMA, "ts", "A", [], [], 10, share=share)  # type: ignore[arg-type]


def test_owner_is_stable_and_spreads_rows() -> None:
    rows = [{"k": "x", "ts": i, "price": 1.5, "volume": i % 3} for i in range(400)]
    assert owner({"b": 1, "a": 2}, 5) == owner({"a": 2, "b": 1}, 5)
    counts = [sum(1 for r in rows if owner(r, 3) == i) for i in (1, 2, 3)]
    assert all(90 < c < 180 for c in counts), counts


# ============================================================ the spec asks: match-instances ==

def _tick(attrs: str, after: str = NEXT_ROW) -> str:
    text = spec("tick-shape", {"tick": attrs} if attrs else {})
    return text.replace('<param name="time" value="ts"/>',
                        f'<param name="time" value="ts"/>\n    {after}') if after else text


@pytest.mark.parametrize("attrs,after,attr,words", [
    ('match-instances="2"', "", 'match-instances="2"',
     ["skip-past-last-row", "cannot be split", "skip-to-next-row"]),
    ('match-instances="1"', NEXT_ROW, 'match-instances="1"', ["out of range", "2 to 16"]),
    ('match-instances="lots"', NEXT_ROW, 'match-instances="lots"', ["not a whole number"]),
    ('match-instances="2" pipeline="split"', NEXT_ROW, 'match-instances="2"',
     ["one pattern per operator"]),
])
def test_a_misused_match_instances_is_located(attrs: str, after: str, attr: str,
                                              words: list[str]) -> None:
    text = _tick(attrs, after)
    errors = _errors(text)
    tag = '<operator name="tick" type="pattern" '
    line, column = locate(text, tag + attr)
    where = (line, column + len(tag) + attr.index('"') + 1)
    assert any((ln, col) == where and all(w in msg for w in words)
               for ln, col, msg in errors), (where, errors)


def test_match_instances_on_another_operator_is_refused_at_the_attribute() -> None:
    text = spec("hot-sensors", {"hot": 'match-instances="2"'})
    line, column = locate(text, 'match-instances="2"')
    assert any((ln, col) == (line, column + len('match-instances="')) and "pattern operators"
               in msg for ln, col, msg in _errors(text))


def test_a_query_wide_match_instances_reaches_pattern_operators_only() -> None:
    text = _tick("").replace('<dataflow name="tick-shape"',
                             '<dataflow name="tick-shape" match-instances="3"')
    graph = logical(text)
    assert graph.node("tick").wants("match-instances") == 3
    assert all(n.wants("match-instances") is None for n in graph.nodes if n.name != "tick")


# ================================================================= the rule and its plan ==

def test_the_rule_loads_with_its_guard() -> None:
    (rule,) = [r for r in load_rules(shipped_rule_files()) if r.name == "pattern-partitioning"]
    assert rule.phase == "partitioning" and rule.focus == "f"
    assert [(g.name, g.args) for g in rule.guards] == [
        ("wants", ("f", "match-instances")), ("independent-matches", ("f",))]
    tick = logical(_tick('match-instances="2"')).node("tick")
    assert GUARDS["independent-matches"].holds(tick)
    plain = logical(_tick("", after="")).node("tick")
    assert not GUARDS["independent-matches"].holds(plain)


def test_golden_plan_and_explain() -> None:
    c = compile_spec_text(_tick('match-instances="2"'), "tick-shape.xml", base_dir=BASE,
                          plan_only=True)
    assert [f.rule for f in c.firings] == ["pattern-partitioning"]
    text = explain(c) + "\n"
    if os.environ.get("ELASTIQ_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), f"{GOLDEN} differs from what the rewrite produces now"
    assert "tick_merge := merger(tick_1 := pattern@tick.p1(" in text
    assert "network-reader {share: 2, shares: 2}" in text


@pytest.mark.parametrize("attrs,after", [("", NEXT_ROW), ('pipeline="split"', NEXT_ROW),
                                         ('parallelism="2"', "")])
def test_the_rule_does_not_fire_where_it_must_not(attrs: str, after: str) -> None:
    result = rewrite(logical(_tick(attrs, after)), RULES)
    assert "pattern-partitioning" not in [f.rule for f in result.firings]


def test_rewriting_the_rewritten_plan_changes_nothing() -> None:
    once = rewrite(logical(_tick('match-instances="3"')), RULES)
    assert [f.rule for f in once.firings] == ["pattern-partitioning"]
    assert len([n for n in once.graph.nodes if n.kind == "pattern"]) == 3
    twice = rewrite(once.graph, RULES)
    assert twice.firings == () and twice.graph == once.graph


def test_the_generated_instances_carry_their_shares_and_the_producer_is_not_paced() -> None:
    c = compile_spec_text(_tick('match-instances="3"'), "tick-shape.xml", base_dir=BASE)
    shares, paced = [], []
    for task in c.query.tasks:
        for method, kwargs in rt_calls(task.program):
            if method == "pattern":
                assert kwargs["after_match"] == "skip-to-next-row"
                shares.append(kwargs["share"])
            paced.append(method == "paced_batches")
    assert sorted(shares) == [(1, 3), (2, 3), (3, 3)] and not any(paced)
    readers = {t.task_id for t in c.query.tasks if "tick_m" not in t.operators
               and any(o.startswith("tick_rd_") for o in t.operators)}
    (channel,) = [ch for ch in c.query.channels if ch.stream == "tick_m"]
    assert set(channel.consumers) == readers and len(readers) == 3


def test_match_instances_fuzz_compiles_or_refuses_located() -> None:
    """Seeded, bounded: random values of match-instances and after-match, on the pattern, on
    another operator or query-wide; every spec compiles (then the rule fired with that many
    instances) or is refused with every diagnostic inside the file."""
    from common.diagnostics import SpecError
    rng = random.Random(4315)
    values = ["2", "3", "16", "17", "0", "-1", "1", "two", "", "2.5", "x" * 70, "\u00e92", "08"]
    afters = ["skip-to-next-row", "skip-past-last-row", "skip-to-last", "", "SKIP-TO-NEXT-ROW"]
    compiled = refused = 0
    for _ in range(150):
        value, after = rng.choice(values), rng.choice(afters)
        text = _tick("", after=f'<param name="after-match" value="{after}"/>')
        where = rng.choice(['<operator name="tick" type="pattern"',
                            '<operator name="out" type="file-sink"',
                            '<dataflow name="tick-shape"'])
        text = text.replace(where, f'{where} match-instances="{value}"')
        lines = text.count("\n") + 1
        try:
            c = compile_spec_text(text, "fuzz.xml", base_dir=BASE, plan_only=True)
        except SpecError as e:
            refused += 1
            assert e.diagnostics
            for d in e.diagnostics:
                assert d.position.file == "fuzz.xml" and 1 <= d.position.line <= lines
                assert d.position.column >= 1 and d.message
            continue
        compiled += 1
        assert [f.rule for f in c.firings] == ["pattern-partitioning"]
        assert len([n for n in c.physical.nodes if n.kind == "pattern"]) == int(value)
    assert compiled > 5 and refused > 50, (compiled, refused)
