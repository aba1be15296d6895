"""Benchmark: the pattern operator's matcher on the paper's tick-shaped pattern AB+CD+.

Measures rows/s and matches/s of `executor.cep_match.KeyMatcher` (the generic automaton with the
checked conditions interpreted per row) over the `stock` generator's rows (plain-Python
reference rows, per symbol, all fed at once and then in micro-batches of 500 rows through the
state store's JSON round trip), against a tick matcher written by hand for this one pattern in
plain Python (the same semantics: greedy, SKIP PAST LAST ROW, the time bound) in the same run;
both must find the same matches. Medians over repeats. Not run by pytest.

    python benchmarks/cep.py [--rows 40000] [--repeats 3]

Does not measure Spark: the operator's Spark path (applyInPandasWithState) against a
hand-written PySpark job is not benchmarked yet.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

# The repository first, so `common` is the package, and this folder's helpers as
# benchmarks.common.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common import fmt, format_table, median_of, ratio, use_repo_on_path  # noqa: E402

use_repo_on_path()

from executor import shapes  # noqa: E402
from executor.cep_match import KeyMatcher, build_program, measures  # noqa: E402

WITHIN_US = 30_000_000
DEFINES = (("B", "price < prev(price)"),
           ("C", "price > prev(price) and price < first(A.price)"),
           ("D", "price > prev(price) and price > first(A.price)"))
MEASURES = (("start", "first(A.ts)"), ("bottom", "min(B.price)"), ("top", "max(D.price)"),
            ("falls", "count(B)"))
SCHEMA = shapes.shape_named("stock").columns


def stock_rows(count: int) -> dict[str, list[dict[str, Any]]]:
    shape = shapes.shape_named("stock")
    start = shapes.parse_start("2024-01-01T00:00:00Z")
    by_symbol: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i in range(count):
        row = shapes.reference_row(shape, 7, start, 1000.0, i)
        ts = row["ts"] - shapes.EPOCH
        by_symbol[row["symbol"]].append({**row, "ts": (ts.days * 86_400 + ts.seconds)
                                         * 1_000_000 + ts.microseconds})
    return by_symbol


def generic(rows: dict[str, list[dict]], batch: int | None) -> list[tuple]:
    program, _ = build_program("stock", SCHEMA, "ts", "A B+ C D+", DEFINES, MEASURES, WITHIN_US)
    out = []
    for symbol, own in rows.items():
        matcher = KeyMatcher(program)
        step = batch or len(own)
        for i in range(0, len(own), step):
            part = own[i:i + step]
            found = matcher.feed(part, part[-1]["ts"])
            out += [(symbol,) + measures(program, m) for m in found]
            if batch:
                matcher = KeyMatcher.from_json(program, matcher.to_json())
    return out


def by_hand(rows: dict[str, list[dict]], batch: int | None) -> list[tuple]:
    """AB+CD+ written for this pattern: B+ and D+ are maximal runs (a shorter B+ leaves a
    falling row where C needs a rise), so each start row needs one forward scan."""
    out = []
    for symbol, own in rows.items():
        i, n = 0, len(own)
        while i < n:
            end = _tick_at(own, i)
            if end is None:
                i += 1
                continue
            a, match = own[i], own[i:end + 1]
            falls = [r for r in match[1:] if r is not match[-1]]
            b_rows = falls[:_run_length(match)]
            d_rows = match[len(b_rows) + 2:]
            out.append((symbol, a["ts"], min(r["price"] for r in b_rows),
                        max(r["price"] for r in d_rows), len(b_rows)))
            i = end + 1
    return out


def _run_length(match: list[dict]) -> int:
    k = 1
    while match[k + 1]["price"] < match[k]["price"]:
        k += 1
    return k


def _tick_at(rows: list[dict], i: int) -> int | None:
    a = rows[i]
    n = len(rows)

    def ok(j: int) -> bool:
        return j < n and rows[j]["ts"] - a["ts"] <= WITHIN_US

    j = i + 1
    while ok(j) and rows[j]["price"] < rows[j - 1]["price"]:
        j += 1
    if j == i + 1 or not ok(j) or not (rows[j - 1]["price"] < rows[j]["price"] < a["price"]):
        return None
    k = j + 1
    while ok(k) and rows[k - 1]["price"] < rows[k]["price"] and rows[k]["price"] > a["price"]:
        k += 1
    return k - 1 if k > j + 1 else None


def timed(fn: Callable[[], list[tuple]]) -> tuple[float, list[tuple]]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = stock_rows(args.rows)
    sides = {"generic, one batch": lambda: generic(rows, None),
             "generic, batches of 500 + state JSON": lambda: generic(rows, 500),
             "hand-written tick matcher": lambda: by_hand(rows, None)}
    seconds: dict[str, list[float]] = defaultdict(list)
    results: dict[str, list[tuple]] = {}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            took, results[name] = timed(fn)
            seconds[name].append(took)
    reference = sorted(results["hand-written tick matcher"])
    for name, found in results.items():
        if sorted(found) != reference:
            print(f"MISMATCH: {name} found {len(found)} matches, the hand-written matcher "
                  f"{len(reference)}")
            return 1
    base = median_of(seconds["hand-written tick matcher"])
    table = [(name, fmt(args.rows / median_of(s)), fmt(len(reference) / median_of(s)),
              f"{ratio(median_of(s), base):.1f}x") for name, s in seconds.items()]
    print(f"tick pattern AB+CD+ over {args.rows} stock rows (8 symbols), {len(reference)} "
          f"matches, medians of {args.repeats}")
    print(format_table(("matcher", "rows/s", "matches/s", "time vs hand-written"), table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
