"""Pure tests of the updating ranking (`top-n` with `ttl` instead of a window, issue 37, Nexmark
q18 and q19): what compiles and what the generated calls carry (the file sink's upsert key is
the groups and rank, rank deleting), every misuse refused at its value with file:line:column,
all at once; the ranking's fold, its records and deletions, the order of rows against an
independent order, and the file sink's deletion records read back as the current view."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from common import top_n
from common.upsert_log import current_view, read_current
from compiler.pipeline import check_spec_text
from executor.sinks import FileSink
from tests.test_nexmark_compile import program, refused_at, spec

TTL = '    <param name="ttl" value="1 hours"/>\n'


def ranking(params: str = TTL, order: str = "price desc", reader: str = "",
            group: str = "auction") -> str:
    return spec('  <operator name="r" type="top-n">\n    <input name="b"/>\n'
                f'    <param name="time" value="date_time"/> <param name="group-by" '
                f'value="{group}"/>\n    <param name="n" value="10"/> '
                f'<param name="order-by" value="{order}"/>\n{params}    <output name="t"/>\n'
                f'  </operator>\n{reader}', "t" if not reader else "r2")


def test_an_updating_top_n_compiles_with_a_deleting_upsert_sink(tmp_path: Path) -> None:
    text = program(ranking(), tmp_path)
    assert "rt.top_n(" in text and "ttl='1 hours'" in text and "window=None" in text
    assert "upsert_key=('auction', 'rank')" in text and "upsert_deletes_by='rank'" in text
    graph, _ = check_spec_text(ranking(), "nx.xml")
    assert graph is not None
    assert graph.stream("t").schema.names == ("auction", "rank", "bidder", "price", "channel",
                                              "url", "date_time")


def test_a_windowed_top_n_still_compiles_without_ttl_or_deletions(tmp_path: Path) -> None:
    text = program(ranking('    <param name="size" value="10 seconds"/>\n'), tmp_path)
    assert "ttl=" not in text and "upsert" not in text and "window='10 seconds'" in text


@pytest.mark.parametrize("params,needle,fragment", [
    ('    <param name="ttl" value="0 seconds"/>\n', '0 seconds"/>', "a ttl must be above zero"),
    (TTL + '    <param name="size" value="10 seconds"/>\n', '10 seconds"/>',
     "an updating top-n (ttl) has no size"),
    (TTL + '    <param name="slide" value="1 seconds"/>\n', '1 seconds"/>', "has no slide"),
    ("", '<operator name="r" type="top-n">', "needs a size (a ranking per window) or a ttl"),
])
def test_updating_top_n_misuse_is_refused_at_its_value(params: str, needle: str,
                                                       fragment: str) -> None:
    refused_at(ranking(params), needle, fragment)


FILTER = ('  <operator name="f" type="filter">\n    <input name="t"/>\n'
          '    <param name="condition" value="t.price &gt; 1"/>\n    <output name="r2"/>\n'
          '  </operator>\n')
HOURLY = ('  <operator name="h" type="window-aggregate">\n    <input name="b"/>\n'
          '    <param name="time" value="date_time"/> <param name="size" value="1 hours"/>\n'
          '    <param name="group-by" value="auction"/>\n'
          '    <aggregate name="price" function="max" column="price"/>\n'
          '    <output name="hs"/>\n  </operator>\n')


def test_its_results_go_only_to_sinks_and_are_not_published() -> None:
    refused_at(ranking(reader=FILTER), '<input name="t"/>\n    <param name="condition"',
               "cannot read 't', the updating results of top-n 'r'")
    published = ranking().replace('<output name="t"/>', '<output name="t" publish="true"/>')
    refused_at(published, '<output name="t" publish', "top-n 'r' cannot publish 't'")


def test_it_reads_only_a_stream_without_event_time_and_gives_none() -> None:
    after = spec(HOURLY + '  <operator name="r" type="top-n">\n    <input name="hs"/>\n'
                 '    <param name="time" value="window_end"/> <param name="n" value="3"/>\n'
                 f'    <param name="order-by" value="price desc"/>\n{TTL}'
                 '    <output name="t"/>\n  </operator>\n', "t")
    refused_at(after, '<input name="hs"/>', "comes after a window, top-n, join or deduplicate")


def test_it_is_not_partitioned_and_its_log_not_partitioned_either() -> None:
    xml = ranking().replace('type="top-n"', 'type="top-n" parallelism="2"')
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    assert graph is None and any("cannot be partitioned" in d.message for d in diagnostics)


def test_every_problem_is_reported_at_once() -> None:
    xml = ranking('    <param name="ttl" value="0 seconds"/>\n'
                  '    <param name="size" value="1 seconds"/>\n', order="prize desc",
                  reader=FILTER)
    graph, diagnostics = check_spec_text(xml, "nx.xml")
    messages = [d.message for d in diagnostics if d.severity == "error"]
    assert graph is None
    for fragment in ("a ttl must be above zero", "has no size", "'prize'", "cannot read 't'"):
        assert any(fragment in m for m in messages), (fragment, messages)


def test_a_rank_column_of_the_input_clashes_but_window_columns_do_not() -> None:
    renamed = spec('  <operator name="p" type="project">\n    <input name="b"/>\n'
                   '    <field name="auction" value="b.auction"/>\n'
                   '    <field name="rank" value="b.price"/>\n'
                   '    <field name="window_end" value="b.date_time"/>\n'
                   '    <output name="q"/>\n  </operator>\n'
                   '  <operator name="r" type="top-n">\n    <input name="q"/>\n'
                   '    <param name="time" value="window_end"/> <param name="n" value="3"/>\n'
                   f'    <param name="order-by" value="rank desc"/>\n{TTL}'
                   '    <output name="t"/>\n  </operator>\n', "t")
    diagnostic = refused_at(renamed, '<input name="q"/>', "would produce column 'rank' twice")
    assert "window_end" not in diagnostic.message


# --- the ranking in Python: fold, records, order -------------------------------------------------

def _key(order: list[top_n.OrderKey], names: list[str]) -> Any:
    rk = top_n.row_key(order, names)
    return lambda row: rk(row[1])


def test_the_fold_keeps_the_first_n_and_starts_anew_after_a_gap_longer_than_ttl() -> None:
    key = _key([top_n.OrderKey("p", True)], ["p", "t"])
    rows = [(t, [p, t]) for t, p in ((1, 5), (2, 9), (3, 7), (4, 1))]
    after, last = top_n.fold_ranking([], None, rows, 2, 10, key)
    assert [r[1][0] for r in after] == [9, 7] and last == 4
    # in event-time order: 15 > 4 + 10 starts anew, 20 then joins it
    again, last = top_n.fold_ranking(after, last, [(20, [3, 20]), (15, [2, 15])], 2, 10, key)
    assert [r[1][0] for r in again] == [3, 2] and last == 20


def test_the_records_are_the_changed_ranks_and_the_deletions_the_ranks_gone() -> None:
    a, b, c = (1, ["a"]), (2, ["b"]), (3, ["c"])
    assert top_n.ranking_changes([a, b], [c, a, b], 5) == ([1, 2, 3], [])
    assert top_n.ranking_changes([a, b, c], [a, c], 5) == ([2], [3])
    assert top_n.ranking_changes([a, b], [a, b], 5) == ([], [])
    assert top_n.ranking_changes(None, [a], 3) == ([1], [2, 3])  # no state: rank 2, 3 may show


def _spark_like_compare(x: Any, y: Any, descending: bool) -> int:
    """An independent comparison in Spark's order (`top_n_frame.compare`'s cases): nulls last,
    NaN above every other double and equal to itself."""
    if x is None or y is None:
        return 0 if x is None and y is None else (1 if x is None else -1)
    nan_x, nan_y = isinstance(x, float) and math.isnan(x), isinstance(y, float) and math.isnan(y)
    if nan_x or nan_y:
        below = -1 if nan_y and not nan_x else (1 if nan_x and not nan_y else 0)
    else:
        below = -1 if x < y else (1 if x > y else 0)
    return -below if descending else below


def test_the_row_order_is_sparks_nulls_last_nan_highest_then_the_other_columns() -> None:
    order = [top_n.OrderKey("d", True), top_n.OrderKey("s", False)]
    names = ["s", "d", "i"]
    values = {"s": [None, "a", "b", "é"], "d": [None, float("nan"), -1.5, 0.0, 2.0],
              "i": [None, 1, 2]}
    rows = [list(v) for v in itertools.product(values["s"], values["d"], values["i"])]
    random.Random(3).shuffle(rows)
    rk = top_n.row_key(order, names)
    got = sorted(rows, key=rk)

    def before_or_equal(x: list, y: list) -> bool:
        for column, descending in (("d", True), ("s", False), ("i", False)):
            i = names.index(column)
            step = _spark_like_compare(x[i], y[i], descending)
            if step:
                return step < 0
        return True
    assert all(before_or_equal(x, y) for x, y in zip(got, got[1:]))
    assert got[0][1] is not None and math.isnan(got[0][1]) and got[-1][1] is None


# --- the upsert log's deletions ------------------------------------------------------------------

def test_the_file_sink_writes_negative_ranks_as_deletions_and_the_view_drops_them(
        tmp_path: Path) -> None:
    sink = FileSink("t", str(tmp_path / "out.jsonl"), owner=str(tmp_path / "ck"),
                    roots=None, upsert_key=("g", "rank"), deletes_by="rank")
    first = pa.table({"g": [1, 1, 1, 2], "rank": [1, 2, 3, 1], "v": ["a", "b", "c", "x"]})
    second = pa.table({"g": [1, 1, 1], "rank": [1, -2, -3], "v": ["z", None, None]})
    lines = sink.lines(first) + sink.lines(second)
    assert json.loads(lines[-1]) == {"@delete": ["g", "rank"], "g": 1, "rank": 3}
    assert current_view(lines) == [{"g": 1, "rank": 1, "v": "z"}, {"g": 2, "rank": 1, "v": "x"}]
    with pytest.raises(ValueError):
        FileSink("t", str(tmp_path / "o2.jsonl"), upsert_key=("g",), deletes_by="rank")


def test_a_deleted_key_comes_back_at_the_end_of_the_view(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"@key":["k"],"k":1,"v":1}\n{"@key":["k"],"k":2,"v":2}\n'
                   '{"@delete":["k"],"k":1}\n{"@delete":["k"],"k":9}\n'
                   '{"@key":["k"],"k":1,"v":3}\n', encoding="utf-8")
    assert read_current(str(log)) == [{"k": 2, "v": 2}, {"k": 1, "v": 3}]
