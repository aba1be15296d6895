"""The JSON-lines text every file, console and Kafka sink writes (`executor.json_lines`), column
by column, against the dict-per-row encoding it replaced (`json.dumps` of each row's dict, each
value through `json_lines.json_value`), on Nexmark's bid rows from the built-in generator: CPU
seconds per 100,000 rows, medians of --repeats, the ratio, and whether both give the same bytes.
Pure: no Spark, no cluster (the sink's share of a Spark task's time is in nexmark.py's figures).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_util  # noqa: E402

bench_util.use_repo_on_path()

import pyarrow as pa  # noqa: E402

from executor import shapes  # noqa: E402
from executor.json_lines import json_value, table_to_lines  # noqa: E402


def per_row(table: pa.Table) -> list[str]:
    """The baseline: a dict per row, `json.dumps` of each."""
    names = table.column_names
    return [json.dumps({n: json_value(row[n]) for n in names}, separators=(",", ":"))
            for row in table.to_pylist()]


def bid_table(rows: int) -> pa.Table:
    shape = shapes.shape_named("bid")
    start = shapes.parse_start("2026-01-01T00:00:00Z")
    return pa.Table.from_batches([shapes.generate_batch(shape, shape.columns, 7, start,
                                                        1_000_000.0, 0, rows)])


def cpu_seconds(encode: Callable[[pa.Table], list[str]], table: pa.Table) -> float:
    began = time.process_time()
    encode(table)
    return time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    table = bid_table(args.rows)
    same = per_row(table) == table_to_lines(table)
    scale = 100_000 / args.rows
    base = bench_util.median_of([cpu_seconds(per_row, table) * scale
                                 for _ in range(args.repeats)])
    ours = bench_util.median_of([cpu_seconds(table_to_lines, table) * scale
                                 for _ in range(args.repeats)])
    print(f"JSON lines of {args.rows:,} Nexmark bid rows, CPU s per 100,000 rows, medians of "
          f"{args.repeats}")
    print(bench_util.format_table(
        ["encoding", "cpu s", "rows/s"],
        [["dict per row (before)", f"{base:.3f}", bench_util.fmt(100_000 / base)],
         ["column by column", f"{ours:.3f}", bench_util.fmt(100_000 / ours)]]))
    print(f"speed-up {bench_util.ratio(base, ours):.2f}x; same bytes: {'yes' if same else 'NO'}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
