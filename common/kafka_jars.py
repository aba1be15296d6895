"""Where the Kafka parts that `scripts/setup.sh --kafka` fetched with Maven live.

Owns finding the jar folders in the JVM cache (`$ELASTIQ_JVM_CACHE`, else `.cache/jvm/` in the
repository): Apache Kafka's broker and tools (`kafka-broker/`) and Spark's Kafka connector with
the jars pyspark does not ship (`spark-kafka/`). A folder counts only with the `.complete` marker
the fetch script writes last. Does not own fetching (scripts/fetch-kafka.sh), starting a broker
(`elastiq.kafka_broker`) or putting the connector on a Spark session (`executor.spark_session`).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "ELASTIQ_JVM_CACHE"
BROKER_FOLDER = "kafka-broker"
CONNECTOR_FOLDER = "spark-kafka"
COMPLETE_MARKER = ".complete"
FETCH_HINT = "run `scripts/setup.sh --kafka` (it fetches them with Maven)"


class KafkaPartsMissing(RuntimeError):
    """The broker's or the connector's jars are not in the cache; the message says what to do."""


def jvm_cache() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / ".cache" / "jvm"


def _jars(folder: str, what: str) -> list[str]:
    path = jvm_cache() / folder
    if not (path / COMPLETE_MARKER).is_file():
        raise KafkaPartsMissing(f"{what} is not in {path}: {FETCH_HINT}")
    return sorted(str(p) for p in path.glob("*.jar"))


def broker_classpath() -> str:
    """The classpath of Apache Kafka's broker and tools, ':'-joined."""
    return ":".join(_jars(BROKER_FOLDER, "Apache Kafka's broker"))


def connector_jars() -> list[str]:
    """Spark's Kafka connector and the jars it needs beside pyspark's own."""
    return _jars(CONNECTOR_FOLDER, "Spark's Kafka connector")


def connector_available() -> bool:
    return (jvm_cache() / CONNECTOR_FOLDER / COMPLETE_MARKER).is_file()


def missing_parts() -> str | None:
    """Why a Kafka broker or connector cannot be used here, or None when both can."""
    for folder, what in ((BROKER_FOLDER, "Apache Kafka's broker"),
                         (CONNECTOR_FOLDER, "Spark's Kafka connector")):
        if not (jvm_cache() / folder / COMPLETE_MARKER).is_file():
            return f"{what} is not in {jvm_cache() / folder}: {FETCH_HINT}"
    return None
