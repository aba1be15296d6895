"""The peers benchmark's query in PyFlink's Table API (runs in its own virtualenv).

Run by benchmarks/peers.py in a subprocess with the Flink venv's interpreter:

    python flink_job.py --input PATH --sink FILE [--follow]

A filesystem table over PATH (one JSON-lines file: bounded; with --follow a folder watched for
new files every 100 ms: unbounded; run with --parallelism 1 then, so that one reader sees the
files in order and no row comes after a watermark another reader advanced), event time `ts` with a 2 s bounded-out-of-orderness
watermark, `temp > 30`, TUMBLE 10 s per sensor, avg/max/count, collected by this process and
appended to FILE as JSON lines (`window_start_ms`, `sensor`, `avg_temp`, `max_temp`, `readings`).
Prints `PEERS running <epoch seconds>` once the job is submitted and `PEERS done` when a bounded
input is finished (its end-of-input watermark fires every window).
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import time

from pyflink.table import EnvironmentSettings, TableEnvironment

QUERY = """
SELECT window_start, sensor, AVG(temp) AS avg_temp, MAX(temp) AS max_temp, COUNT(*) AS readings
FROM TABLE(TUMBLE(TABLE readings, DESCRIPTOR(ts), INTERVAL '10' SECOND))
WHERE temp > 30
GROUP BY window_start, window_end, sensor
"""


def source_ddl(path: str, follow: bool) -> str:
    monitor = ",\n  'source.monitor-interval' = '100ms'" if follow else ""
    return f"""
CREATE TABLE readings (
  sensor STRING, ts TIMESTAMP_LTZ(3), temp DOUBLE, humidity DOUBLE,
  WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH (
  'connector' = 'filesystem', 'path' = '{path}', 'format' = 'json',
  'json.timestamp-format.standard' = 'ISO-8601', 'json.fail-on-missing-field' = 'true'{monitor}
)"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--follow", action="store_true")
    args = parser.parse_args()
    os.environ["TZ"] = "UTC"
    time.tzset()
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", str(args.parallelism))
    config.set("table.local-time-zone", "UTC")
    env.execute_sql(source_ddl(args.input, args.follow))
    result = env.execute_sql(QUERY)
    print(f"PEERS running {time.time():.6f}", flush=True)
    with result.collect() as rows, open(args.sink, "a", encoding="utf-8") as sink:
        for row in rows:
            start = row[0]
            sink.write(json.dumps({
                "window_start_ms": calendar.timegm(start.timetuple()) * 1000
                + start.microsecond // 1000,
                "sensor": row[1], "avg_temp": row[2], "max_temp": row[3],
                "readings": row[4]}) + "\n")
            sink.flush()
    print("PEERS done", flush=True)


if __name__ == "__main__":
    main()
