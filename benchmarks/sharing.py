"""Two queries over one generator, shared (published, or automatically) vs two separate queries:
CPU used (docs/queries.md).

Owns this benchmark only (not a test; nothing in tests/ imports it). On the stack of
testkit/e2e_support.py (embedded master, one agent, the framework scheduler, one real executor
and SparkSession, 127.0.0.1 only) it runs, one arrangement at a time:
- `separate` (the baseline): two queries, each `sink := file_sink(c := project(h :=
  filter(src := generator)))` over the same generator parameters: two generators, two filters;
- `shared`: one query `h := filter(src := generator)` publishing `h`, and two queries
  `sink := file_sink(c := project(stream_source(writer/h)))`: one generator, one filter, the
  hot rows sent over a ZeroMQ channel (with CURVE keys) to both readers;
- `auto` (automatic sharing): the two separate queries' specs, the first publishing `h` (so
  its filter's rows cross a task boundary on a channel; `pipeline="split"` would too, but its
  two tasks must then run on two agents), the second unchanged: compiled with the scheduler's
  offers, the second reads the first's channel without naming it instead of running a
  generator and a filter (3 Spark queries, as `shared`).
It measures the CPU seconds (user + system, from /proc) of every process of the executor's
session (its JVM and Spark's Python workers) over `--seconds` of steady output, after both
sinks have grown (warm-up), and the rows both sinks received meanwhile; it prints, per
arrangement and repeat, CPU seconds per 1,000 output rows, their medians, and the ratio
shared / separate beside the goal (below 1: one source instead of two saves more than the
channel costs). Every task is placed on the one agent, so one executor holds them all.

`--heavy N` makes the shared part expensive: the filter's condition also sums N chains of
HEAVY_DEPTH nested sqrt/pow calls (never negative, so the same rows pass), which the separate
arrangement computes twice and the shared ones once.

    python benchmarks/sharing.py [--seconds S] [--repeats N] [--rate R] [--heavy N]
                                 [--arrangements A,B]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_util import exit_on_sigterm, fmt, format_table, median_of, ratio, use_repo_on_path

use_repo_on_path()

from compiler.pipeline import compile_spec_text  # noqa: E402
from testkit.e2e_support import (Stack, _proc_stat, session_members, start_stack,  # noqa: E402
                                 stop_query, stop_stack, submit, wait_running, wait_until)

log = logging.getLogger("bench.sharing")
GOAL = 1.0  # shared / separate CPU per output row: below it, sharing pays

TYPE = """  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="ts" type="timestamp"/>
    <column name="temp" type="double"/>
    <column name="humidity" type="double"/>
  </type>
"""


HEAVY_DEPTH = 10  # nested sqrt(pow(...)) per chain of a heavy filter (3 levels each; the language allows 64)


def condition(heavy: int) -> str:
    """The shared filter's condition: `raw.temp > 20` (keeps about 2/3), and with `heavy` > 0
    also a sum of `heavy` chains of HEAVY_DEPTH nested sqrt/pow calls that is never negative
    (so the same rows pass) but costs cpu per row: a shared part worth sharing."""
    if heavy <= 0:
        return "raw.temp &gt; 20"
    chains = []
    for i in range(heavy):
        x = f"(raw.temp + {i + 1})"
        for _ in range(HEAVY_DEPTH):
            x = f"sqrt(pow({x}, 2) + raw.humidity)"
        chains.append(x)
    return f"raw.temp &gt; 20 and {' + '.join(chains)} &gt;= 0"


def source(rate: int, publish: bool, heavy: int = 0) -> str:
    out = ' publish="true"' if publish else ""
    return f"""  <operator name="src" type="generator">
    <param name="shape" value="sensor"/>
    <param name="rate" value="{rate}"/>
    <param name="seed" value="5"/>
    <output name="raw" type="reading"/>
  </operator>
  <operator name="h" type="filter">
    <input name="raw"/>
    <param name="condition" value="{condition(heavy)}"/>
    <output name="hot"{out}/>
  </operator>
"""


def tail(name: str, read: str) -> str:
    return f"""  <operator name="c" type="project">
    <input name="{read}"/>
    <field name="sensor" value="{read}.sensor"/>
    <field name="f" value="{read}.temp * 1.8 + 32"/>
    <output name="converted"/>
  </operator>
  <operator name="sink" type="file-sink">
    <input name="converted"/>
    <param name="path" value="out/{name}.jsonl"/>
  </operator>
"""


def specs(arrangement: str, rate: int, repeat: int = 1, heavy: int = 0) -> dict[str, str]:
    """query id -> spec text. The ids of the arrangements that share are new each repeat: under
    the old ids every query is resubmitted after its stop and resumes from its checkpoint, and
    a reader then asks its writer for the batches after its checkpoint's position, which the
    writer, started again with no reader tracked, may already have dropped (it keeps its
    latest 1,024): the reader fails with "asked from seq 204 but the retained range is (206,
    1229)" after its restarts, as a reader stopped too long does (docs/queries.md)."""
    if arrangement in ("separate", "auto"):
        first, second = ("sep-a", "sep-b") if arrangement == "separate" else \
            (f"auto{repeat}-a", f"auto{repeat}-b")
        return {q: f'<dataflow name="{q}">\n{TYPE}'
                   f'{source(rate, q == first and q != "sep-a", heavy)}'
                   f'{tail(q, "hot")}</dataflow>\n' for q in (first, second)}
    writer = f"writer{repeat}"
    reader = f"""  <operator name="in" type="stream-source">
    <param name="stream" value="{writer}/hot"/>
    <param name="start" value="now"/>
    <output name="got" type="reading"/>
  </operator>
"""
    found = {writer: f'<dataflow name="{writer}">\n{TYPE}{source(rate, True, heavy)}'
                     '</dataflow>\n'}
    found |= {q: f'<dataflow name="{q}">\n{TYPE}{reader}{tail(q, "got")}</dataflow>\n'
              for q in (f"shr{repeat}-a", f"shr{repeat}-b")}
    return found


def cpu_seconds(pids: set[int]) -> float:
    """utime + stime of the processes (those that ended in between are not counted)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        stat = _proc_stat(pid)
        if stat is not None:
            total += int(stat[11]) + int(stat[12])
    return total / tick


def lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def measure(stack: Stack, work: Path, arrangement: str, rate: int, seconds: float,
            repeat: int = 1, heavy: int = 0) -> tuple[float, int]:
    """(CPU seconds of the executor session, rows both sinks got) over `seconds` of steady
    output; the queries are stopped afterwards."""
    texts = specs(arrangement, rate, repeat, heavy)
    for query_id, text in texts.items():  # in order: the second is offered the first's channel
        query = compile_spec_text(text, f"{query_id}.xml", base_dir=work,
                                  offers=stack.service.share_offers()).query
        if arrangement == "auto" and query_id.endswith("-b"):
            assert [i.channel_id for i in query.imports if i.auto], f"{query_id} shares nothing"
        submit(stack, query)
        wait_running(stack, query_id, timeout=240)
    sinks = [work / "out" / f"{q}.jsonl" for q in texts if not q.startswith("writer")]
    wait_until(lambda: all(lines(p) > 2 * rate for p in sinks), 240, "both sinks to grow",
               lambda: "; ".join([f"{p.name}: {lines(p)} rows" for p in sinks] + [
                   f"{t['task_id']} {t['state']} attempt {t['attempt']} {t['waiting_for']} "
                   f"{t['last_failure'][:300]}" for q in texts for t in stack.tasks(q).values()]))
    (agent,) = stack.cluster.agents
    executor = stack.executor_pid(agent.agent_id)
    assert executor is not None, "no executor runs"
    pids = session_members(executor)
    rows0, cpu0, t0 = sum(lines(p) for p in sinks), cpu_seconds(pids), time.monotonic()
    wait_until(lambda: time.monotonic() - t0 >= seconds, seconds + 30, "the measured window")
    pids |= session_members(executor)  # workers Spark started meanwhile
    cpu, rows = cpu_seconds(pids) - cpu0, sum(lines(p) for p in sinks) - rows0
    for query_id in reversed(list(texts)):  # readers before what they read
        stop_query(stack, query_id)
    for p in sinks:
        p.unlink(missing_ok=True)
    return cpu, rows


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window (30)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per arrangement (2)")
    parser.add_argument("--rate", type=int, default=2000, help="generator rows/s (2000)")
    parser.add_argument("--heavy", type=int, default=0,
                        help="chains of nested sqrt/pow in the shared filter, 0-12 (0: the "
                             "cheap filter alone; 12 fill the language's 4,096 characters)")
    parser.add_argument("--arrangements", default="separate,shared,auto",
                        help="which to run, comma-separated (separate,shared,auto; the "
                             "baseline separate always runs)")
    args = parser.parse_args()
    if not 0 <= args.heavy <= 12:
        parser.error("--heavy takes 0 to 12 chains (a condition is at most 4,096 characters)")
    chosen = ["separate"] + [a for a in ("shared", "auto") if a in args.arrangements.split(",")]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; shared "
          f"filter: {'raw.temp > 20' if args.heavy <= 0 else f'raw.temp > 20 and {args.heavy} chains of {HEAVY_DEPTH} nested sqrt/pow'}", flush=True)
    results: dict[str, list[float]] = {"separate": [], "shared": [], "auto": []}
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="elastiq-bench-sharing-") as tmp:
        stack = start_stack(Path(tmp) / "stack", cpus_per_agent=3.0, agents=1)
        try:
            for repeat in range(args.repeats):
                for arrangement in chosen:
                    cpu, rows = measure(stack, Path(tmp), arrangement, args.rate, args.seconds,
                                        repeat + 1, args.heavy)
                    per_k = 1000 * cpu / rows if rows else float("inf")
                    results[arrangement].append(per_k)
                    rows_out.append([arrangement, str(repeat + 1), fmt(cpu, 1), str(rows),
                                     fmt(per_k, 3)])
                    print(f"{arrangement} #{repeat + 1}: {cpu:.1f} cpu s, {rows} rows, "
                          f"{per_k:.3f} cpu s / 1000 rows", flush=True)
        finally:
            stop_stack(stack)
    print(format_table(["arrangement", "run", "cpu s", "rows out", "cpu s / 1000 rows"],
                       rows_out))
    separate, shared = median_of(results["separate"]), median_of(results["shared"])
    auto = median_of(results["auto"])
    print(f"median cpu s / 1000 rows: separate {separate:.3f}, shared {shared:.3f}, "
          f"auto {auto:.3f} (nan: not run)")
    print(f"ratio shared/separate {ratio(shared, separate):.2f}, auto/separate "
          f"{ratio(auto, separate):.2f} (goal < {GOAL:.1f} each)")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
