"""A real Kafka broker for the tests about Kafka, and small client helpers over it.

Owns what a test about Kafka does when the parts are
not fetched (`kafka_required`: a skip on a developer's machine without `setup.sh --kafka`, a
failure that says why under CI, where a silent skip would pass a suite that tested no Kafka),
and producing and reading topics with confluent-kafka (reads are `read_committed`, bounded in
time); also the readings and their oracle that the Kafka task tests share (`readings`, `hot`,
`got`). Does not own assertions.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence

import pytest

from common.kafka_jars import missing_parts


def skip_reason() -> str | None:
    why = missing_parts()
    if why:
        return why
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "confluent-kafka is not installed (pip install confluent-kafka)"
    return None


def in_ci(env: Mapping[str, str]) -> bool:
    """Whether the tests run in CI (CI=true, as CI services set it)."""
    return env.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_parts_action(reason: str | None, ci: bool) -> Literal["run", "skip", "fail"]:
    """What a test about Kafka does (pure): run when the parts are here; else skip on a
    developer's machine, fail under CI."""
    if reason is None:
        return "run"
    return "fail" if ci else "skip"


def kafka_required() -> pytest.MarkDecorator:
    """The mark of a test that needs the broker's jars and confluent-kafka."""
    reason = skip_reason()
    action = missing_parts_action(reason, in_ci(os.environ))
    if action == "skip":
        return pytest.mark.skip(reason=str(reason))
    if action == "fail":
        return pytest.mark.usefixtures("kafka_parts_missing")
    return pytest.mark.skipif(False, reason="the Kafka parts are here")  # a mark doing nothing


@pytest.fixture(scope="session")  # first, before a broker is tried
def kafka_parts_missing() -> None:
    """Fails (errors) the test under CI with why the Kafka parts cannot be used."""
    pytest.fail(f"CI=true and a test about Kafka cannot run: {skip_reason()} "
                "(CI runs scripts/setup.sh --test, which fetches them)", pytrace=False)


@pytest.fixture()
def own_broker(tmp_path: Path) -> Iterator[Any]:
    """A broker this test alone uses, so it may kill it (`KafkaBroker.kill` / `restart`)."""
    from elastiq.kafka_broker import KafkaBroker

    with KafkaBroker(tmp_path / "kafka") as broker:
        yield broker


class Batch:
    """A micro-batch as a Kafka sink sees it (only `toArrow` is used): rows of sensor and
    temp."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa

        self.table = pa.Table.from_pylist(rows, pa.schema([("sensor", pa.string()),
                                                           ("temp", pa.float64())]))

    def toArrow(self) -> Any:  # noqa: N802 (Spark's name)
        return self.table


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)])
    futures[topic].result(30)


def produce(bootstrap: str, topic: str, values: Sequence[bytes],
            keys: Sequence[bytes | None] | None = None, partition: int | None = None) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    for i, value in enumerate(values):
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, value, key=keys[i] if keys else None, **kwargs)
        producer.poll(0)
    assert producer.flush(30) == 0, "records left unsent"


def read_committed(bootstrap: str, topic: str, expect: int, timeout: float = 60.0,
                   settle: float = 1.0) -> list[tuple[bytes | None, bytes]]:
    """Every (key, value) a read_committed reader sees: read until `expect` records arrived,
    then `settle` seconds more (so extra records, duplicates, show), bounded by `timeout`."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    out: list[tuple[bytes | None, bytes]] = []
    deadline = time.monotonic() + timeout
    settle_until: float | None = None
    try:
        for _ in range(int(timeout / 0.2) + 100):
            now = time.monotonic()
            if now > deadline or (settle_until is not None and now > settle_until):
                break
            for message in consumer.consume(1000, 0.2):  # the bound counts polls
                if not message.error():
                    out.append((message.key(), message.value() or b""))
            if settle_until is None and len(out) >= expect:
                settle_until = time.monotonic() + settle
    finally:
        consumer.close()
    return out


def temp_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


__all__ = ["kafka_parts_missing", "create_topic", "produce", "read_committed",
           "skip_reason", "kafka_required", "missing_parts_action", "temp_topic", "Path"]


def readings(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` sensor readings, deterministic by `seed`."""
    return [{"sensor": f"s{(i * 7 + seed) % 5}", "temp": float((i * 37 + seed) % 60)}
            for i in range(n)]


def hot(rows: list[dict[str, Any]]) -> Counter:
    """The oracle: the sensor and temperature of every reading above 30, as a multiset."""
    return Counter((r["sensor"], r["temp"]) for r in rows if r["temp"] > 30)


def got(records: list[tuple[bytes | None, bytes]]) -> Counter:
    """The sensor and temperature of each JSON record value read, as a multiset."""
    return Counter((json.loads(v)["sensor"], json.loads(v)["temp"]) for _, v in records)
