"""The Kafka operators' parameter decisions, shared by the validator and the runtime (pure).

Owns what a `kafka-source`'s and a `kafka-sink`'s parameters may say: a bootstrap list of
HOST:PORT, topic names (Kafka's legal characters), starting offsets (`earliest`, `latest`, or a
per-partition JSON object `{"topic": {"0": 42}}` with -2 for earliest and -1 for latest, as
Spark takes it), the metadata columns (which record field fills which declared column, and the
column type each needs), reading the security settings from a properties file (only `security.`,
`sasl.` and `ssl.` keys: the file cannot redirect the query to another broker or change how
records are read), and the transactional id of a sink. Does not own the catalogue
(`compiler.operators`), Spark options (`executor.kafka_io`) or files beyond reading the
properties text it is given.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Mapping

from common.types import ColumnType

MAX_TOPIC_CHARS = 249  # Kafka's limit
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")
_HOST_PORT = re.compile(r"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):([0-9]{1,5})\Z")
SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")

# Metadata column parameters of a kafka-source: parameter -> (record field, the column's type).
METADATA_COLUMNS: dict[str, tuple[str, ColumnType]] = {
    "key-column": ("key", ColumnType.STRING),
    "topic-column": ("topic", ColumnType.STRING),
    "partition-column": ("partition", ColumnType.INT),
    "offset-column": ("offset", ColumnType.INT),
    "timestamp-column": ("timestamp", ColumnType.TIMESTAMP),
}


class KafkaParamError(ValueError):
    """A Kafka parameter value that cannot be used; the message says what to write."""


def parse_bootstrap(text: str) -> str:
    """'HOST:PORT[,HOST:PORT...]' with ports 1-65535, spaces removed."""
    parts = [p.strip() for p in text.split(",")]
    for part in parts:
        m = _HOST_PORT.match(part)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise KafkaParamError(f"'{part}' is not HOST:PORT; write e.g. 127.0.0.1:9092 "
                                  "(several separated by commas)")
    return ",".join(parts)


def parse_topics(text: str) -> tuple[str, ...]:
    """A comma-separated list of topic names, each of Kafka's legal characters."""
    topics = tuple(t.strip() for t in text.split(","))
    for topic in topics:
        check_topic(topic)
    if len(set(topics)) != len(topics):
        raise KafkaParamError(f"'{text}' names a topic twice")
    return topics


def check_topic(topic: str) -> str:
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise KafkaParamError(f"'{topic[:60]}' is not a Kafka topic name (1-{MAX_TOPIC_CHARS} "
                              "letters, digits, '.', '_' or '-')")
    return topic


def parse_starting_offsets(text: str, topics: tuple[str, ...] = ()) -> str:
    """'earliest', 'latest', or a JSON object topic -> {partition: offset} (offset >= 0, or -2
    earliest, -1 latest); with `topics`, every topic named must be one the source reads.
    Returns the canonical text Spark takes."""
    stripped = text.strip()
    if stripped in ("earliest", "latest"):
        return stripped
    try:
        value = json.loads(stripped)
    except ValueError:
        raise KafkaParamError(f"'{stripped[:60]}' is neither earliest, latest nor a JSON object "
                              'such as {"readings": {"0": 42, "1": -2}}') from None
    if not isinstance(value, dict) or not value:
        raise KafkaParamError('per-partition offsets are a JSON object such as '
                              '{"readings": {"0": 42, "1": -2}}')
    canonical: dict[str, dict[str, int]] = {}
    for topic, partitions in value.items():
        check_topic(str(topic))
        if topics and topic not in topics:
            raise KafkaParamError(f"starting offsets name topic '{topic}', which the source "
                                  f"does not read ({', '.join(topics)})")
        if not isinstance(partitions, dict) or not partitions:
            raise KafkaParamError(f"the offsets of '{topic}' are an object partition -> offset")
        canonical[topic] = {}
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or int(partition) > 1_000_000:
                raise KafkaParamError(f"'{partition}' is not a partition number of '{topic}'")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2 \
                    or offset >= 2**63:
                raise KafkaParamError(f"offset {offset!r} of {topic}/{partition} is not a whole "
                                      "number >= 0 (or -2 earliest, -1 latest)")
            canonical[topic][str(int(partition))] = offset
    return json.dumps(canonical, sort_keys=True, separators=(",", ":"))


def metadata_type_problem(parameter: str, column_type: ColumnType) -> str | None:
    """Why a declared column of `column_type` cannot hold the record field `parameter` names."""
    field, needed = METADATA_COLUMNS[parameter]
    if column_type is needed:
        return None
    return f"the record's {field} is {needed.value}, the column is {column_type.value}"


def security_settings(text: str, origin: str) -> dict[str, str]:
    """The client settings of a security properties file (`key=value` lines, '#' comments):
    only keys starting with security., sasl. or ssl.; anything else is refused with its line."""
    settings: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise KafkaParamError(f"{origin}:{number}: expected key=value")
        if not key.startswith(SECURITY_PREFIXES):
            raise KafkaParamError(f"{origin}:{number}: '{key}' is not a security setting "
                                  f"(allowed: {', '.join(p + '*' for p in SECURITY_PREFIXES)})")
        settings[key] = value.strip()
    return settings


def transactional_id(query_id: str, task_id: str, op: str) -> str:
    """The sink's transactional id: the same for every attempt of the task (so a new attempt's
    producer fences the old one's), different for every sink; readable, bounded in length."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", f"elastiq.{query_id}.{task_id}.{op}")[:180]
    digest = hashlib.sha256(f"{query_id}\0{task_id}\0{op}".encode()).hexdigest()[:12]
    return f"{readable}.{digest}"


def spark_security_options(settings: Mapping[str, str]) -> dict[str, str]:
    """Security settings as Spark's Kafka options (`kafka.` before each key)."""
    return {f"kafka.{k}": v for k, v in settings.items()}
