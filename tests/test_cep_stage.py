"""The pattern operator pipelined over k stages (`executor.cep.stage`), pure: on thousands of
seeded streams, k stages chained by their items find exactly the matches of one `KeyMatcher`
with skip-to-next-row and of the independent backtracking matcher (tests/cep_oracle.py), run as
`executor.cep.spark.stage_frame` runs them: every stage through the state store's JSON between
batches, every item through its text, a later stage's micro-batches holding whole calls of the
stage before, shuffled and put back in order by `carrier_order`, its watermark trailing the
newest time written for any key by i - 1 ms (and no item ever at or before it, which Spark
would drop); hand-over at i*n rows, ticks, the per-stage bound and the refusals by hand;
`Item.decode` on seeded, mutated texts returns an item of the program's shape (whose own
text decodes to it again) or refuses with ValueError."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from typing import Any

import pytest

from compiler.expr import pattern as pt
from executor.cep.match import KeyMatcher, PatternOverflow, PatternProgram, build_program, measures
from executor.cep.stage import (MAX_ITEM_TEXT, Carried, Item, Stage, StageMatcher,
                                carrier_order)
from tests import cep_oracle
from tests.test_cep import SCHEMA, _random_stream, random_case

FINAL = 10**9  # a watermark past every row: everything is decided


def _program(text: str, defines: dict[str, tuple[str, Any]], within: int,
             max_partial: int = 5000) -> PatternProgram:
    names = pt.variables(pt.parse_pattern(text))
    fields = [("n", "count()"), ("start", "first(ts)"), ("end", "last(ts)")]
    fields += [(f"n{v}", f"count({v})") for v in names]
    return build_program("s", SCHEMA, "ts", text, [(v, c[0]) for v, c in defines.items()],
                         fields, within, max_partial, after_match="skip-to-next-row")[0]


def _later(max_ts: int | None, batch: list[dict], key: str = "ts") -> int | None:
    return max([r[key] for r in batch] + ([max_ts] if max_ts is not None else []),
               default=max_ts)


def _single(program: PatternProgram, batches: list[list[dict]], delay: int) -> list[tuple]:
    """The measures of one KeyMatcher's matches, fed as tests/test_cep_rewrite.py feeds it."""
    matcher, found, max_ts = KeyMatcher(program), [], None
    for batch in batches:
        found += matcher.feed(batch, None if max_ts is None else max_ts - delay)
        matcher = KeyMatcher.from_json(program, matcher.to_json())
        max_ts = _later(max_ts, batch)
    found += matcher.feed([], FINAL)
    assert matcher.idle()
    return [measures(program, m) for m in found]


def _across(items: list[Item], program: PatternProgram) -> list[Item]:
    """`items` after a channel: each through its text; each call's items in time order."""
    assert all(a.time <= b.time for a, b in zip(items, items[1:])), items
    return [Item.decode(item.encode(), item.time, program) for item in items]


def _reloaded(matcher: StageMatcher) -> StageMatcher:
    return StageMatcher.from_json(matcher.program, matcher.stage, matcher.to_json())


# A call: the items one call of a stage wrote for the key, and the newest time that stage wrote
# for any key in the same micro-batch (what moves the next stage's watermark: Spark's watermark
# is one for all keys, and another key's tick carries the stage's progress).
Call = tuple[list[Item], "int | None"]


def _first_stage(program: PatternProgram, stage: Stage, batches: list[list[dict]],
                 delay: int) -> list[Call]:
    """Stage 1 over the batches: each call's items (a micro-batch of one key)."""
    matcher, calls, max_ts = StageMatcher(program, stage), [], None
    for batch in batches:
        watermark = None if max_ts is None else max_ts - delay
        items = _across(matcher.feed_rows(batch, watermark), program)
        calls.append((items, max((i.time for i in items), default=None)))
        matcher = _reloaded(matcher)
        max_ts = _later(max_ts, batch)
    items = _across(matcher.feed_rows([], FINAL), program)
    calls.append((items, FINAL))
    assert matcher.idle() and matcher.next_deadline() is None
    return calls


def _cut(calls: list[Call], rng: random.Random
         ) -> list[tuple[list[tuple[int, int, Item]], int | None]]:
    """The calls' items in random batches of whole calls (a channel batch is one micro-batch of
    the writer, and a reader's micro-batch holds whole channel batches; some batches empty),
    shuffled within a batch as Spark's shuffle may, each with the newest time written for any
    key. A call of ticks alone is sometimes left out: in that micro-batch the key had nothing
    to do, and only the other keys' ticks moved the reader's watermark."""
    chance = rng.choice([0.2, 0.5, 0.9])
    batches: list[tuple[list[tuple[int, int, Item]], int | None]] = [([], None)]
    for items, newest in calls:
        if rng.random() < chance:
            batches += [([], None) for _ in range(2 if rng.random() < 0.1 else 1)]
        entries, before = batches[-1]
        if not all(i.kind == "tick" for i in items) or rng.random() < 0.5:
            entries += [(item.time, seq, item) for seq, item in enumerate(items)]
        batches[-1] = (entries, _later(before, [{"t": newest}] if newest is not None else [],
                                       "t"))
    for entries, _ in batches:
        rng.shuffle(entries)
    return batches


def _later_stage(program: PatternProgram, stage: Stage, calls: list[Call],
                 rng: random.Random) -> list[Call]:
    """A later stage over the calls of the stage before, as `executor.cep.spark.stage_frame` runs it:
    each batch's items put in order by `cep_stage.carrier_order`, its watermark trailing the
    newest time of the batches before by `cep.stage_watermark` (i - 1 ms), and one more call
    once the watermark has moved past the last batch (Spark's no-data batch). Spark would drop
    an item at or before that watermark, so none may be."""
    matcher, out, newest = StageMatcher(program, stage), [], None
    trail = 1000 * (stage.index - 1)
    for entries, written in _cut(calls, rng) + [([], None)]:
        watermark = None if newest is None else newest - trail
        assert watermark is None or all(time > watermark for time, _, _ in entries), \
            (stage, watermark, sorted(entries, key=lambda e: e[:2])[:3])
        items = carrier_order([(item, time, seq) for time, seq, item in entries])
        got = _across(matcher.feed_items(items, watermark), program)
        out.append((got, _later(written, [{"t": i.time} for i in got], "t")))
        matcher = _reloaded(matcher)
        newest = _later(newest, [{"t": written}] if written is not None else [], "t")
    assert matcher.idle() and matcher.next_deadline() is None
    return out


def _oracle(tree: pt.Node, defines: dict[str, tuple[str, Any]], within: int,
            batches: list[list[dict]], delay: int) -> list[tuple]:
    fed, max_ts = [], None  # the oracle, over the rows that were not late
    for batch in batches:
        fed.append((batch, -10**9 if max_ts is None else max_ts - delay))
        max_ts = _later(max_ts, batch)
    fed.append(([], FINAL))
    rows = cep_oracle.on_time_rows(fed, "ts")
    names = pt.variables(tree)
    return [(len(labels), rows[i]["ts"], rows[i + len(labels) - 1]["ts"],
             *(labels.count(v) for v in names))
            for i, labels in cep_oracle.all_matches(
                tree, rows, {v: c[1] for v, c in defines.items()}, within, "ts",
                skip_to_next=True)]


def _case(rng: random.Random, stats: Counter) -> None:
    text, tree, defines, within, delay = random_case(rng)
    count, rows = rng.choice([2, 3, 4]), rng.choice([1, 2, 3])
    batches = _random_stream(rng)
    program = _program(text, defines, within)
    try:
        one = _single(program, batches, delay)
    except PatternOverflow:  # threads that multiply past max-partial: nothing to compare
        stats["overflow"] += 1
        return
    assert sorted(one) == sorted(_oracle(tree, defines, within, batches, delay)), (text, batches)

    calls = _first_stage(program, Stage(1, count, rows), batches, delay)
    stats["handed on"] += any(item.kind == "attempt" for call, _ in calls for item in call)
    for index in range(2, count + 1):
        arriving = sum(1 for call, _ in calls for item in call if item.kind == "match")
        calls = _later_stage(program, Stage(index, count, rows), calls, rng)
        stats["handed on later"] += index < count and any(
            item.kind == "attempt" for call, _ in calls for item in call)
    items = [item for call, _ in calls for item in call]
    assert all(item.kind == "match" for item in items)
    stats["last stage"] += len(items) > arriving
    stats["matches"] += len(items)
    stats["empty"] += not items
    got = [tuple(item.body) for item in items]
    assert sorted(got) == sorted(one), (text, {v: c[0] for v, c in defines.items()}, within,
                                        delay, count, rows, batches)


def test_stages_together_find_the_matches_of_one_matcher_and_of_the_oracle() -> None:
    rng, stats = random.Random(4711), Counter()
    cases = 2500
    for _ in range(cases):
        _case(rng, stats)
    assert stats["matches"] > 1000 and stats["empty"] > 100 and stats["overflow"] < 20, stats
    assert stats["handed on"] > cases // 3 and stats["handed on later"] > cases // 10, stats
    assert stats["last stage"] > cases // 10, stats


# ======================================================================== by hand ==

def _ab(max_partial: int = 100_000, within: int = 10) -> PatternProgram:
    """A B+ with every row a B: one thread per attempt, which never ends by itself."""
    return build_program("s", SCHEMA, "ts", "A B+", [("B", "volume = 1")],
                         [("n", "count()"), ("start", "first(ts)")], within, max_partial,
                         after_match="skip-to-next-row")[0]


def _rows(times: range | list[int], volume: int = 1) -> list[dict]:
    return [{"k": "x", "ts": t, "price": 1.0, "volume": volume} for t in times]


def _shape(items: list[Item]) -> list[tuple]:
    return [(i.kind, i.time) + ((i.body.start_ts, len(i.body.rows)) if i.kind == "attempt"
                                else tuple(i.body) if i.kind == "match" else ())
            for i in items]


def test_an_attempt_is_handed_on_right_after_its_i_times_n_th_row() -> None:
    program = _ab()
    first = StageMatcher(program, Stage(1, 3, 2))
    out = first.feed_rows(_rows(range(3)), 2)
    assert _shape(out) == [("row", 0), ("row", 1), ("attempt", 1, 0, 2), ("row", 2),
                           ("attempt", 2, 1, 2), ("tick", 2)]
    assert [(a.start_ts, len(a.rows)) for a in first.attempts] == [(2, 1)]
    second = StageMatcher(program, Stage(2, 3, 2))
    assert _shape(second.feed_items(out, None)) == [("row", 0), ("row", 1), ("row", 2),
                                                    ("tick", 2)]
    assert [(a.start_ts, len(a.rows)) for a in second.attempts] == [(0, 3), (1, 2)]
    out = second.feed_items(first.feed_rows(_rows([3]), 3), None)
    assert _shape(out) == [("row", 3), ("attempt", 3, 0, 4), ("tick", 3)]
    assert [(a.start_ts, len(a.rows)) for a in second.attempts] == [(1, 3), (2, 2)]
    third = StageMatcher(program, Stage(3, 3, 2))
    assert third.feed_items(out, None) == [] and len(third.attempts) == 1  # the last keeps it
    assert third.feed_items([Item("row", 4, _rows([4])[0])], None) == []
    assert len(third.attempts[0].rows) == 5


def test_an_attempt_that_arrives_holding_enough_rows_moves_on_at_once() -> None:
    program = _ab()
    carried = Carried(0, ((2, "AB"),), "AB", tuple(_rows([0, 1])))
    assert program.nfa.states[2].var == "B"
    out = StageMatcher(program, Stage(2, 3, 1)).feed_items([Item("attempt", 1, carried)], None)
    assert _shape(out) == [("attempt", 1, 0, 2)]


def test_a_tick_decides_an_attempt_whose_key_gets_no_more_rows() -> None:
    program = _ab(within=10)
    first = StageMatcher(program, Stage(1, 2, 1))
    items = first.feed_rows(_rows([0, 1]), 1)
    assert _shape(items) == [("row", 0), ("attempt", 0, 0, 1), ("row", 1),
                             ("attempt", 1, 1, 1), ("tick", 1)]
    last = StageMatcher(program, Stage(2, 2, 1))
    assert last.feed_items(items, None) == []
    assert not last.idle() and last.next_deadline() == 10
    assert last.feed_items([Item("tick", 9, None)], None) == []  # not yet past the bound
    tick = first.feed_rows([], 100)
    assert _shape(tick) == [("tick", 100)]
    assert _shape(last.feed_items(tick, None)) == [("match", 100, 2, 0)]  # B+ ended: row 1
    assert last.idle() and last.next_deadline() is None
    # the same, by the watermark given to the later stage instead of a tick
    other = StageMatcher(program, Stage(2, 2, 1))
    other.feed_items(items, None)
    assert _shape(other.feed_items([], 11)) == [("match", 11, 2, 0)] and other.idle()


def test_matches_of_earlier_stages_pass_through_unchanged() -> None:
    program = _ab()
    match = Item("match", 5, [3, 1])
    assert StageMatcher(program, Stage(2, 3, 1)).feed_items([match], None) == [match]
    assert StageMatcher(program, Stage(3, 3, 1)).feed_items([match], 7) == [match]


def test_a_stage_s_items_of_one_call_are_in_time_order() -> None:
    """A later stage that read rows past its progress still ends its call with its tick; the
    tick moves before them (it promises no row at or before its time)."""
    program = _ab(within=2)
    second = StageMatcher(program, Stage(2, 3, 1))
    carried = Carried(0, ((2, "A"),), None, tuple(_rows([0])))
    out = second.feed_items([Item("tick", 0, None), Item("attempt", 0, carried),
                             Item("row", 5, _rows([5])[0])], None)
    assert _shape(out) == [("tick", 0), ("row", 5)]  # 5 is past the bound: A alone, no match
    assert second.idle()


def test_each_stage_has_the_bound_on_partial_matches() -> None:
    """60 rows of A B+: one matcher holds 60 attempts, over its bound of 40; two stages that
    hand on at 30 rows hold about 30 each; handing on at 10 leaves 50 in the last stage."""
    rows = _rows(range(60))
    with pytest.raises(PatternOverflow, match="max-partial-matches=40"):
        KeyMatcher(_ab(max_partial=40, within=10**6)).feed(rows, 10**6)
    program = _ab(max_partial=40, within=10**6)
    for n, fails in ((30, False), (10, True)):
        first, last = StageMatcher(program, Stage(1, 2, n)), StageMatcher(program, Stage(2, 2, n))
        items = first.feed_rows(rows, 10**6 - 1)  # every row, no attempt ended
        assert len(first.attempts) < n
        if fails:
            with pytest.raises(PatternOverflow, match="stage 2 of 2 .* max-partial-matches=40"):
                last.feed_items(items, None)
        else:
            last.feed_items(items, None)
            assert len(last.attempts) <= 40


@pytest.mark.parametrize("after,share,words", [
    ("skip-past-last-row", None, "skip-to-next-row"),
    ("skip-to-next-row", (1, 2), "share"),
])
def test_programs_stages_cannot_run_are_refused(after: str, share: tuple | None,
                                                words: str) -> None:
    program = build_program("s", SCHEMA, "ts", "A B+", [], [], 10, after_match=after,
                            share=share)[0]
    with pytest.raises(ValueError, match=words):
        StageMatcher(program, Stage(1, 2, 1))


@pytest.mark.parametrize("args,words", [
    ((0, 2, 1), "not one of stages 1 to 2"), ((3, 2, 1), "not one of stages 1 to 2"),
    ((1, 1, 1), "at least 2 stages"), ((1, 2, 0), "at least 1 row"),
    ((True, 2, 1), "not a whole number"), ((1, 2.0, 1), "not a whole number"),
])
def test_a_stage_outside_the_pipeline_is_refused(args: tuple, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Stage(*args)


def test_rows_go_to_stage_1_and_items_to_the_others() -> None:
    with pytest.raises(ValueError, match="stage 2 reads items"):
        StageMatcher(_ab(), Stage(2, 2, 1)).feed_rows(_rows([0]), 0)
    with pytest.raises(ValueError, match="stage 1 reads rows"):
        StageMatcher(_ab(), Stage(1, 2, 1)).feed_items([], 0)


def test_late_rows_are_dropped_and_counted_in_stage_1() -> None:
    first = StageMatcher(_ab(), Stage(1, 2, 5))
    first.feed_rows(_rows([3, 1]), 2)
    assert first.pending == _rows([3]) and first.next_deadline() == 3
    first.feed_rows(_rows([2]) + [{"k": "x", "ts": None, "price": 1.0, "volume": 1}], None)
    assert first.late == 2 and first.progress == 2
    assert StageMatcher.from_json(first.program, first.stage, first.to_json()).late == 2


def test_the_item_texts() -> None:
    program = _ab()
    row = {"k": "\u00e9", "ts": 1, "price": math.nan, "volume": None}
    attempt = Carried(0, ((3, "AB"), (2, "AB")), "AB", tuple(_rows([0, 1])))
    texts = [Item("row", 1, row).encode(), Item("attempt", 1, attempt).encode(),
             Item("match", 1, [2, 0]).encode(), Item("tick", 1, None).encode()]
    assert texts == [
        '["row",{"k":"\\u00e9","ts":1,"price":NaN,"volume":null}]',
        '["attempt",[0,[[3,"AB"],[2,"AB"]],"AB",[{"k":"x","ts":0,"price":1.0,"volume":1},'
        '{"k":"x","ts":1,"price":1.0,"volume":1}]]]',
        '["match",[2,0]]', '["tick",null]']
    for text in texts:
        assert Item.decode(text, 1, program).encode() == text


# ==================================================================== decoding fuzz ==

BAD_VALUES: list[Any] = [None, True, 0, -1, 1.5, math.nan, math.inf, 2**63, -2**63 - 1, 10**40,
                         "", "A", "Z", "ab", "AAAA", [], {}, [1], {"k": 1}, "row", "tick"]


def _mutate_value(data: Any, rng: random.Random) -> Any:
    """`data` with one value somewhere in it replaced, dropped or repeated."""
    if isinstance(data, (list, dict)) and data and rng.random() < 0.85:
        copy = list(data) if isinstance(data, list) else dict(data)
        at = rng.randrange(len(copy)) if isinstance(copy, list) else rng.choice(list(copy))
        roll = rng.random()
        if roll < 0.1:
            del copy[at]
        elif roll < 0.2 and isinstance(copy, list):
            copy.insert(at, copy[at])
        elif roll < 0.2:
            copy[at + "x"] = copy[at]
        else:
            copy[at] = _mutate_value(copy[at], rng)
        return copy
    if isinstance(data, str) and data and rng.random() < 0.5:  # labels, mostly
        i = rng.randrange(len(data))
        return data[:i] + rng.choice("ABCDZa-") + data[i + 1:]
    if type(data) is int and rng.random() < 0.5:  # automaton states and times, mostly
        return data + rng.choice([-2, -1, 1, 2])
    return rng.choice(BAD_VALUES)


def _mutate_text(text: str, rng: random.Random) -> str:
    roll = rng.random()
    i = rng.randrange(len(text) + 1)
    if roll < 0.15:
        return text[:i]
    if roll < 0.3:
        return text[:i] + rng.choice(' ,[]{}":0-.eE9NaAZ\\u\x00\u00e9') + text[i + 1:]
    if roll < 0.37:
        return text[:i] + rng.choice([" ", "\n", "1e400", "NaN", "-0", "00", "\ud800"]) + text[i:]
    if roll < 0.42:
        return text.replace('"ts":', '"ts":"ts":', 1).replace("1.0", "1", 1)
    if roll < 0.47:
        return text.replace('["row"', '["attempt"', 1).replace('["match"', '["row"', 1)
    if roll < 0.5:
        return "[" * rng.choice([10, 5000, 100_000]) + text
    if roll < 0.55:
        return text.replace("1", "9" * rng.choice([20, 5000]), 1)
    return json.dumps(_mutate_value(json.loads(text), rng), separators=(",", ":"))


def _sample_items(rng: random.Random) -> tuple[PatternProgram, list[Item]]:
    defines = {"B": ("price < prev(price)", None), "C": ("volume % 2 = 0", None)}
    program = _program("A B+ C*", defines, 1000)
    items = [item for call, _ in _first_stage(program, Stage(1, 3, 1), _random_stream(rng), 0)
             for item in call]
    second = StageMatcher(program, Stage(2, 3, 1)).feed_items(items, None)
    return program, items + second + StageMatcher(program, Stage(3, 3, 1)).feed_items(second,
                                                                                      None)


def test_decoding_mutated_item_texts_returns_what_re_encodes_or_refuses() -> None:
    rng = random.Random(1789)
    decoded = refused = 0
    kinds: Counter = Counter()
    for _ in range(40):
        program, items = _sample_items(rng)
        if not items:
            continue
        for _ in range(100):
            item = rng.choice(items)
            text = _mutate_text(item.encode(), rng)
            time = item.time if rng.random() < 0.9 else rng.choice([-1, 2**63, 1.0, True])
            try:
                got = Item.decode(text, time, program)
            except ValueError as exc:
                refused += 1
                assert str(exc)
                continue
            decoded += 1
            kinds[got.kind] += 1
            assert isinstance(got, Item) and got.time == time
            again = Item.decode(got.encode(), time, program)  # its canonical text is stable
            assert again.encode() == got.encode() and again.kind == got.kind
            later = StageMatcher(program, Stage(2, 3, 1))  # and a stage can run it
            later.feed_items([got], None)
            later.feed_items([Item("tick", FINAL, None)], None)
            assert later.idle()
    assert decoded > 200 and refused > 1500, (decoded, refused)
    assert len(kinds) == 4, kinds


@pytest.mark.parametrize("text,words", [
    ("", "not JSON"), ("[" * 100_000, "nests too deeply|not JSON"),
    (" " * (MAX_ITEM_TEXT + 1), "over the limit"), ('["tock",null]', "kind one of"),
('["tick",0]', "tick's body is null"),
    ('["match",[1]]', "list of 2 measure values"), ('["match",[1,[2]]]', "not a scalar"),
    ('["row",{"k":"x","ts":5,"price":1.0,"volume":1}]', "row item at 1 holds a row at 5"),
    ('["row",{"k":"x","ts":1,"price":1,"volume":1}]', "'price' is a double"),
    ('["row",{"k":"x","ts":1,"price":1.0}]', "missing \\['volume'\\]"),
    ('["attempt",[1,[[1,"A"]],null,[{"k":"x","ts":1,"price":1.0,"volume":1}]]]',
     "not \\[automaton state, labels\\]"),
], ids=lambda value: value[:30])
def test_item_texts_are_refused_with_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Item.decode(text, 1, _ab())


def test_an_attacker_s_items_are_data_or_refused(tmp_path: Any) -> None:
    """What a hostile writer of the channel between stages could send: code in a string column
    is a string (stepped, matched, never run); an attempt forged to claim the automaton's accept
    state, a variable the pattern does not have, more threads than the bound, or rows beyond
    its time bound is refused before any stage sees it."""
    program = _ab(max_partial=4)
    marker = tmp_path / "pwned"
    code = f"__import__('os').system('touch {marker}')"
    row = {"k": code, "ts": 1, "price": 1.0, "volume": 1}
    got = Item.decode(Item("row", 1, row).encode(), 1, program)
    assert got.body["k"] == code
    stage = StageMatcher(program, Stage(2, 2, 1))
    stage.feed_items([got, Item("tick", FINAL, None)], None)
    assert not marker.exists()
    accept = next(i for i, s in enumerate(program.nfa.states) if s.kind == "accept")
    var = next(i for i, s in enumerate(program.nfa.states) if s.kind == "var")
    one = {"k": "x", "ts": 1, "price": 1.0, "volume": 1}
    fair = json.dumps(["attempt", [1, [[var, "A"]], None, [one]]], separators=(",", ":"))
    assert Item.decode(fair, 10**6, program).kind == "attempt"
    forged = {
        "not \\[automaton state, labels\\]": [1, [[accept, "A"]], None, [one]],
        "labels of letters A to B": [1, [[var, "Z"]], None, [one]],
        "1 to 4 threads": [1, [[var, "A"]] * 5, None, [one]],
        "holds rows from 1 to 1000000": [1, [[var, "AA"]], None, [one, {**one, "ts": 10**6}]],
    }
    for words, body in forged.items():
        text = json.dumps(["attempt", body], separators=(",", ":"))
        with pytest.raises(ValueError, match=words):
            Item.decode(text, 10**6, program)
