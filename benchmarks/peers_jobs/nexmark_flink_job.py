"""Nexmark queries in PyFlink's SQL over the events benchmarks/nexmark.py wrote (runs in the
Flink virtualenv).

Run by benchmarks/nexmark_flink.py in a subprocess with the Flink venv's interpreter:

    python nexmark_flink_job.py --events DIR --out DIR --queries q0,q1,... [--parallelism 2]

DIR/<table>/ (table: bid, auction, person) holds JSON-lines files of the built-in Nexmark
generator's events (executor/shapes.py; timestamps ISO-8601 UTC with microseconds and a `Z`).
Each query is Nexmark's standard SQL (github.com/nexmark/nexmark, queries/qN.sql), written
here with this run's column names (`date_time` for `dateTime`; no `extra`: the shapes have none)
and adapted where the Elastiq spec it is compared with computes otherwise (said at each query).
Every query runs as its own streaming job in one TableEnvironment (one JVM, started before the
first), over bounded filesystem tables (one source reader per file), parallelism 2, into a
`filesystem` JSON sink at OUT/<query>/ (its part files committed by checkpoints: every 500 ms
and a final one at the end of the input). Prints one line per query once its job has finished:

    NEXMARK {"query": "q0", "net_runtime_s": ..., "submitted_to_finished_s": ...}

`net_runtime_s` is Flink's own JobExecutionResult net runtime (the job's start on the local
cluster to its end, so to its last committed result; the JVM's start and the SQL's planning
before submission excluded); `submitted_to_finished_s` the wall time from `execute_sql` to the
finished job as this client saw it. The SQL is plain text here (no pyflink import at module
level) so that tests/test_nexmark_flink.py can read it without Flink.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass

# The generator shapes' columns (executor/shapes.py) as Flink types; integers are BIGINT
# (Elastiq's `int` is 64-bit), timestamps at the shapes' microseconds, read as instants.
TABLE_COLUMNS = {
    "bid": ("auction BIGINT", "bidder BIGINT", "price BIGINT", "channel STRING", "url STRING",
            "date_time TIMESTAMP_LTZ(6)"),
    "auction": ("id BIGINT", "item_name STRING", "description STRING", "initial_bid BIGINT",
                "reserve BIGINT", "date_time TIMESTAMP_LTZ(6)", "expires TIMESTAMP_LTZ(6)",
                "seller BIGINT", "category BIGINT"),
    "person": ("id BIGINT", "name STRING", "email_address STRING", "credit_card STRING",
               "city STRING", "state STRING", "date_time TIMESTAMP_LTZ(6)"),
}
# Event time: Flink's rowtime attribute is a TIMESTAMP_LTZ of at most milliseconds, so each
# table's is its date_time cut to milliseconds (the windows here are whole milliseconds long, so
# a row falls in the same window by either), with the Elastiq specs' 5 ms watermark delay.
EVENT_TIME = ("ts AS CAST(date_time AS TIMESTAMP_LTZ(3))",
              "WATERMARK FOR ts AS ts - INTERVAL '0.005' SECOND")
# q13's side input: a CSV file of (key, value) rows without a header, read by a lookup
SIDE_INPUT = "side_input"
SIDE_DDL = ("CREATE TEMPORARY TABLE side_input (`key` BIGINT, `value` STRING) WITH ("
            "'connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv')")
JSON_OPTIONS = ("'format' = 'json', 'json.timestamp-format.standard' = 'ISO-8601', "
                "'json.encode.decimal-as-plain-number' = 'true'")
CHECKPOINT_INTERVAL = "500 ms"


@dataclass(frozen=True)
class FlinkQuery:
    """One query: the tables it reads, its sink's columns and its SELECT."""

    tables: tuple[str, ...]
    columns: tuple[str, ...]
    select: str


BID_OUT = ("auction BIGINT", "bidder BIGINT", "price BIGINT", "channel STRING", "url STRING",
           "date_time TIMESTAMP_LTZ(6)")
HOT = ("apple", "google", "facebook", "baidu")  # q21's channel ids 0..3, as the Elastiq spec's
CHANNEL_ID = "REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)"
HOUR = "HOUR(date_time)"



def seconds(ms: int) -> str:
    """A window's length as a Flink SQL interval (`INTERVAL '0.010' SECOND`)."""
    return f"INTERVAL '{ms / 1000:.3f}' SECOND"


# q15-q17's price ranks (Nexmark's FILTER (WHERE ...)) and what each counts per rank
RANKS = (("total", ""), ("rank1", "price < 10000"),
         ("rank2", "price >= 10000 AND price < 1000000"), ("rank3", "price >= 1000000"))
RANKED_ALL = (("bids", "*"), ("bidders", "DISTINCT bidder"), ("auctions", "DISTINCT auction"))


def rank_counts(counted: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """(column, aggregate) of each count per rank, e.g. ("rank1_bids", "COUNT(*) FILTER
    (WHERE price < 10000)")."""
    return [(f"{rank}_{what}",
             f"COUNT({arg})" + (f" FILTER (WHERE {where})" if where else ""))
            for what, arg in counted for rank, where in RANKS]


def ranked_stats(query: str, group: tuple[str, ...]) -> FlinkQuery:
    """q15 (no group), q16 (per channel: every count), q17 (per auction: the bid counts, the
    prices' min, max, average as a double as the spec's avg, and sum), per 50 ms tumbling
    window where Nexmark groups per day."""
    counts = rank_counts(RANKED_ALL if query != "q17" else RANKED_ALL[:1])
    prices = [("min_price", "MIN(price)"), ("max_price", "MAX(price)"),
              ("avg_price", "AVG(CAST(price AS DOUBLE))"), ("sum_price", "SUM(price)")]
    extra = prices if query == "q17" else []
    keys = [f"{g} {'STRING' if g == 'channel' else 'BIGINT'}" for g in group]
    columns = ("window_start TIMESTAMP_LTZ(3)", *keys,
               *(f"{name} {'DOUBLE' if name == 'avg_price' else 'BIGINT'}"
                 for name, _ in counts + extra))
    select = ", ".join(["CAST(window_start AS TIMESTAMP_LTZ(3)) AS window_start", *group,
                        *(f"{agg} AS {name}" for name, agg in counts + extra)])
    return FlinkQuery(("bid",), columns,
                      f"SELECT {select} FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(ts), "
                      f"{seconds(50)})) GROUP BY " + ", ".join(["window_start", "window_end",
                                                                *group]))


QUERIES: dict[str, FlinkQuery] = {
    # q0: pass-through
    "q0": FlinkQuery(("bid",), BID_OUT,
                     "SELECT auction, bidder, price, channel, url, date_time FROM bid"),
    # q1: currency conversion (Nexmark's decimal 0.908 * price; Elastiq computes a double)
    "q1": FlinkQuery(("bid",), ("auction BIGINT", "bidder BIGINT", "price DECIMAL(23, 3)",
                                "date_time TIMESTAMP_LTZ(6)"),
                     "SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid"),
    # q2: selection
    "q2": FlinkQuery(("bid",), ("auction BIGINT", "price BIGINT"),
                     "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    # q3: local item suggestion, Nexmark's unbounded regular join
    "q3": FlinkQuery(("auction", "person"),
                     ("name STRING", "city STRING", "state STRING", "id BIGINT"),
                     "SELECT P.name, P.city, P.state, A.id FROM auction AS A "
                     "INNER JOIN person AS P ON A.seller = P.id "
                     "WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' "
                     "OR P.state = 'CA')"),
    # q14: calculation; count_char(extra, 'c') (a Java UDF of Nexmark's) is the count of url's
    # 'c's here, as the Elastiq spec counts them (the bid shape has no extra)
    "q14": FlinkQuery(("bid",), ("auction BIGINT", "bidder BIGINT", "price DECIMAL(23, 3)",
                                 "bid_time_type STRING", "date_time TIMESTAMP_LTZ(6)",
                                 "c_counts INT"),
                      "SELECT auction, bidder, 0.908 * price AS price, "
                      f"CASE WHEN {HOUR} >= 8 AND {HOUR} <= 18 THEN 'dayTime' "
                      f"WHEN {HOUR} <= 6 OR {HOUR} >= 20 THEN 'nightTime' "
                      "ELSE 'otherTime' END AS bid_time_type, date_time, "
                      "CHAR_LENGTH(url) - CHAR_LENGTH(REPLACE(url, 'c', '')) AS c_counts "
                      "FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000"),
    # q20: expand bid with auction, Nexmark's unbounded regular join
    "q20": FlinkQuery(("bid", "auction"),
                      (*BID_OUT, "item_name STRING", "initial_bid BIGINT", "reserve BIGINT",
                       "expires TIMESTAMP_LTZ(6)", "seller BIGINT", "category BIGINT"),
                      "SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time, "
                      "A.item_name, A.initial_bid, A.reserve, A.expires, A.seller, A.category "
                      "FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id "
                      "WHERE A.category = 10"),
    # q21: channel id
    "q21": FlinkQuery(("bid",), ("auction BIGINT", "bidder BIGINT", "price BIGINT",
                                 "channel STRING", "channel_id STRING"),
                      "SELECT auction, bidder, price, channel, CASE "
                      + " ".join(f"WHEN LOWER(channel) = '{c}' THEN '{i}'"
                                 for i, c in enumerate(HOT))
                      + f" ELSE {CHANNEL_ID} END AS channel_id FROM bid "
                      f"WHERE {CHANNEL_ID} IS NOT NULL OR LOWER(channel) IN ("
                      + ", ".join(f"'{c}'" for c in HOT) + ")"),
    # q22: url directories; a part past the url's last is '' as the Elastiq spec's split_part
    # gives it (SPLIT_INDEX gives null)
    "q22": FlinkQuery(("bid",), ("auction BIGINT", "bidder BIGINT", "price BIGINT",
                                 "channel STRING", "dir1 STRING", "dir2 STRING", "dir3 STRING"),
                      "SELECT auction, bidder, price, channel, "
                      + ", ".join(f"COALESCE(SPLIT_INDEX(url, '/', {i}), '') AS dir{i - 2}"
                                  for i in (3, 4, 5)) + " FROM bid"),
    **{name: query for name, query in (("q15", ranked_stats("q15", ())),
                                       ("q16", ranked_stats("q16", ("channel",))),
                                       ("q17", ranked_stats("q17", ("auction",))))},
    # q5: hot items, per hopping window (50 ms sliding by 10 ms: the Elastiq spec's scale)
    # the auction with the most bids: a window Top-1 after the window aggregate, one auction
    # per window as the spec's max_by (Nexmark joins the counts with their maximum, listing
    # every tied auction); named by its window's end, as the spec's second window is
    "q5": FlinkQuery(("bid",), ("window_start TIMESTAMP_LTZ(3)", "top BIGINT", "auction BIGINT"),
                     "SELECT CAST(window_end AS TIMESTAMP_LTZ(3)) AS window_start, n AS top, "
                     "auction FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, "
                     "window_end ORDER BY n DESC) AS rn FROM (SELECT window_start, window_end, "
                     "auction, COUNT(*) AS n FROM TABLE(HOP(TABLE bid, DESCRIPTOR(ts), "
                     f"{seconds(10)}, {seconds(50)})) "
                     "GROUP BY window_start, window_end, auction)) WHERE rn <= 1"),
    # q7: highest bid per 10 ms tumbling window, one bid (a window Top-1) as the spec's max_by
    # (Nexmark joins the bids with the window's maximum price, listing every tied bid)
    "q7": FlinkQuery(("bid",), ("window_start TIMESTAMP_LTZ(3)", "price BIGINT",
                                "auction BIGINT", "bidder BIGINT"),
                     "SELECT CAST(window_start AS TIMESTAMP_LTZ(3)) AS window_start, price, "
                     "auction, bidder FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "
                     "window_start, window_end ORDER BY price DESC) AS rn FROM TABLE(TUMBLE("
                     f"TABLE bid, DESCRIPTOR(ts), {seconds(10)}))) WHERE rn <= 1"),
    # q8: monitor new users, Nexmark's window join of two 10 ms tumbling windows' groups
    "q8": FlinkQuery(("person", "auction"), ("id BIGINT", "name STRING",
                                             "starttime TIMESTAMP_LTZ(3)"),
                     "SELECT P.id, P.name, CAST(P.window_start AS TIMESTAMP_LTZ(3)) AS starttime "
                     "FROM (SELECT id, name, window_start, window_end FROM TABLE(TUMBLE(TABLE "
                     f"person, DESCRIPTOR(ts), {seconds(10)})) "
                     "GROUP BY id, name, window_start, window_end) P "
                     "JOIN (SELECT seller, window_start, window_end FROM TABLE(TUMBLE(TABLE "
                     f"auction, DESCRIPTOR(ts), {seconds(10)})) "
                     "GROUP BY seller, window_start, window_end) A "
                     "ON P.id = A.seller AND P.window_start = A.window_start "
                     "AND P.window_end = A.window_end"),
    # q13: bounded side input join, each bid by auction % 10000 in the side input's file
    # (key, value): a regular join with the bounded file table, as the filesystem connector
    # offers no lookup (Nexmark's FOR SYSTEM_TIME AS OF a processing time asks for a lookup
    # source; Flink 2.3 plans it as a versioned join and wants a primary key)
    "q13": FlinkQuery(("bid", SIDE_INPUT), ("auction BIGINT", "bidder BIGINT", "price BIGINT",
                                           "date_time TIMESTAMP_LTZ(6)", "`value` STRING"),
                      "SELECT B.auction, B.bidder, B.price, B.date_time, S.`value` FROM bid AS B "
                      "JOIN side_input AS S ON MOD(B.auction, 10000) = S.`key`"),
}


def source_ddl(table: str, folder: str) -> str:
    columns = ",\n  ".join((*TABLE_COLUMNS[table], *EVENT_TIME))
    return (f"CREATE TEMPORARY TABLE {table} (\n  {columns}\n) WITH (\n"
            f"  'connector' = 'filesystem', 'path' = '{folder}', {JSON_OPTIONS},\n"
            "  'json.fail-on-missing-field' = 'true'\n)")


def sink_table(query: str) -> str:
    return f"sink_{query}"


def sink_ddl(query: str, folder: str) -> str:
    columns = ",\n  ".join(QUERIES[query].columns)
    return (f"CREATE TEMPORARY TABLE {sink_table(query)} (\n  {columns}\n) WITH (\n"
            f"  'connector' = 'filesystem', 'path' = '{folder}', {JSON_OPTIONS}\n)")


def insert_sql(query: str) -> str:
    return f"INSERT INTO {sink_table(query)}\n{QUERIES[query].select}"


def result_line(query: str, net_runtime_s: float, submitted_to_finished_s: float) -> str:
    return "NEXMARK " + json.dumps({"query": query, "net_runtime_s": net_runtime_s,
                                    "submitted_to_finished_s": submitted_to_finished_s})


def run(events: str, out: str, queries: list[str], parallelism: int) -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", str(parallelism))
    config.set("table.local-time-zone", "UTC")
    config.set("execution.checkpointing.interval", CHECKPOINT_INTERVAL)
    # the joins' state outgrows the default in-memory checkpoint storage (5 MB), whose failed
    # checkpoints restart the job without end: checkpoints to files, and a failure ends the job
    config.set("execution.checkpointing.storage", "filesystem")
    config.set("execution.checkpointing.dir", "file://" + os.path.join(out, "_checkpoints"))
    config.set("restart-strategy.type", "none")
    for table in TABLE_COLUMNS:
        env.execute_sql(source_ddl(table, os.path.join(events, table)))
    if os.path.isdir(os.path.join(events, SIDE_INPUT)):
        env.execute_sql(SIDE_DDL.format(path=os.path.join(events, SIDE_INPUT)))
    for query in queries:
        env.execute_sql(sink_ddl(query, os.path.join(out, query)))
        submitted = time.monotonic()
        result = env.execute_sql(insert_sql(query))
        client = result.get_job_client()
        assert client is not None, "an INSERT has a job"
        finished = client.get_job_execution_result().result()
        wall = time.monotonic() - submitted
        print(result_line(query, finished.get_net_runtime() / 1000.0, wall), flush=True)
    print("PEERS done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--queries", required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()
    os.environ["TZ"] = "UTC"
    time.tzset()
    wanted = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in wanted if q not in QUERIES]
    if unknown:
        parser.error(f"no Flink SQL for {unknown}; known: {sorted(QUERIES)}")
    run(args.events, args.out, wanted, args.parallelism)


if __name__ == "__main__":
    main()
