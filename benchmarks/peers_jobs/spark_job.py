"""The peers benchmark's query written by hand in PySpark Structured Streaming (no Elastiq code).

Run by benchmarks/peers.py in a subprocess with the interpreter that has pyspark:

    python spark_job.py --input DIR --sink FILE [--max-files-per-trigger N]

Reads the JSON-lines files of DIR with Spark's own file source (`readStream.json`), keeps
`temp > 30`, 10 s tumbling event-time windows per sensor with a 2 s watermark, avg/max/count,
and appends each micro-batch's window rows to FILE as JSON lines
(`window_start_ms`, `sensor`, `avg_temp`, `max_temp`, `readings`). Prints
`PEERS running <epoch seconds>` once the streaming query has started; runs until it is killed.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

SCHEMA = "sensor STRING, ts TIMESTAMP, temp DOUBLE, humidity DOUBLE"


class Appender:
    """foreachBatch: collect the (few) window rows of a micro-batch and append them."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        if not rows:
            return
        lines = [json.dumps({"window_start_ms": calendar.timegm(r.window_start.timetuple()) * 1000
                             + r.window_start.microsecond // 1000,
                             "sensor": r.sensor, "avg_temp": r.avg_temp,
                             "max_temp": r.max_temp, "readings": r.readings}) for r in rows]
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-files-per-trigger", type=int, default=0)
    args = parser.parse_args()
    os.environ["TZ"] = "UTC"  # collected timestamps are naive local times: make local UTC
    time.tzset()
    spark = (SparkSession.builder.appName("peers-handwritten").master("local[2]")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    reader = spark.readStream.schema(SCHEMA)
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    readings = reader.json(args.input)
    results = (readings.filter(F.col("temp") > 30)
               .withWatermark("ts", "2 seconds")
               .groupBy(F.window("ts", "10 seconds"), "sensor")
               .agg(F.avg("temp").alias("avg_temp"), F.max("temp").alias("max_temp"),
                    F.count(F.lit(1)).alias("readings"))
               .select(F.col("window.start").alias("window_start"), "sensor", "avg_temp",
                       "max_temp", "readings"))
    query = (results.writeStream.foreachBatch(Appender(args.sink))
             .option("checkpointLocation", args.checkpoint).start())
    print(f"PEERS running {time.time():.6f}", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
