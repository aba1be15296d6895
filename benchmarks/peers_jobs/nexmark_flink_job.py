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
}


def source_ddl(table: str, folder: str) -> str:
    columns = ",\n  ".join(TABLE_COLUMNS[table])
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
    for table in TABLE_COLUMNS:
        env.execute_sql(source_ddl(table, os.path.join(events, table)))
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
