"""Kafka through a secured broker (layer 3): a real KRaft broker with a SASL_PLAINTEXT listener,
a SASL_SSL one, an SSL one (TLS only) and an MTLS one (SSL requiring a client certificate)
(`KafkaBroker(users=..., tls=True, mutual_tls=True)`: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512),
and one Java client properties file, the form Kafka users already have, given as
security-file= to the source (Spark's Java client) and the sink and the start check
(librdkafka, through `common.kafka_params.librdkafka_security`).

A task kafka-source -> filter -> exactly-once kafka-sink through the SASL_PLAINTEXT listener
(SCRAM-SHA-256, PLAIN), the SASL_SSL one (SCRAM-SHA-512; its certificate signed by a throwaway
CA that the file trusts as a PEM truststore), the SSL one (no login, the broker authenticated
by its certificate) and the MTLS one (the file names the client's PKCS12 keystore, which both
clients take; a file without it is refused there first): the output topic, read
read_committed, equals a plain-Python oracle. A wrong password (for the source, and for the
sink) or a TLS listener whose CA the file does not trust: the task's start is refused with the
reason its status carries (the broker refused the security settings), nothing is written, and a
task with the right file runs beside them.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from common.types import Schema
from tests.kafka_support import (create_topic, got, hot, kafka_parts_missing, kafka_required,
                                 produce, read_committed, readings, temp_topic)

pytestmark = [pytest.mark.spark, kafka_required()]
__all__ = ["kafka_parts_missing"]

READING = Schema.of(("sensor", "string"), ("temp", "double"))
USER = "elastiq"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A broker with SASL_PLAINTEXT, SASL_SSL, SSL and MTLS listeners and one user, for the
    module."""
    from elastiq.kafka_broker import KafkaBroker

    users = {USER: secrets.token_urlsafe(18)}
    with KafkaBroker(tmp_path_factory.mktemp("kafka-sasl"), users=users, tls=True,
                     mutual_tls=True) as broker:
        yield broker


def _task(spark: Any, tmp_path: Path, name: str, bootstrap: str, source: str, out: str,
          security_file: Path, sink_file: Path | None = None) -> Any:
    """kafka-source -> filter temp > 30 -> exactly-once kafka-sink, both with the file (the
    sink with `sink_file` if given)."""
    from executor.runtime import TaskRuntime

    rt = TaskRuntime(spark, query_id="q", task_id=name, checkpoint_dir=str(tmp_path / name))
    rt.kafka_source(op="src", output="raw", schema=READING, bootstrap=bootstrap,
                    topics=(source,), starting_offsets="earliest", format="jsonl", metadata=(),
                    security_file=str(security_file))
    rt.filter(op="hot", input="raw", output="hot", condition="raw.temp > 30")
    try:
        rt.kafka_sink(op="out", input="hot", bootstrap=bootstrap, topic=out, format="jsonl",
                      delivery="exactly-once", security_file=str(sink_file or security_file))
    except BaseException:
        rt.stop()
        raise
    return rt


def written_then_stop(rt: Any, bootstrap: str, topic: str, expected: Counter) -> Counter:
    """What task `rt` wrote to `topic`, read read_committed once as many records as `expected`
    holds are there (within 90 s); the task is stopped either way."""
    try:
        records = read_committed(bootstrap, topic, expect=sum(expected.values()), timeout=90)
    finally:
        rt.stop()
    return got(records)


def _listener(broker: Any, mechanism: str, listener: str) -> tuple[str, Path]:
    """The bootstrap address of `listener` and a client file for it."""
    if listener == "ssl":
        return broker.ssl_bootstrap, broker.tls_client_properties()
    if listener == "mtls":
        return broker.mtls_bootstrap, broker.tls_client_properties(mutual=True)
    tls = listener == "sasl_ssl"
    return (broker.sasl_ssl_bootstrap if tls else broker.sasl_bootstrap,
            broker.client_properties(USER, mechanism, tls=tls))


@pytest.mark.parametrize(("mechanism", "listener"), [
    ("SCRAM-SHA-256", "sasl"), ("PLAIN", "sasl"), ("SCRAM-SHA-512", "sasl_ssl"),
    ("none", "ssl"), ("none", "mtls")])
def test_source_filter_sink_through_a_secured_listener_is_exact(
        spark: Any, sasl_broker: Any, tmp_path: Path, mechanism: str, listener: str) -> None:
    from executor import kafka_io

    source, out = temp_topic("sasl-in"), temp_topic("sasl-out")
    create_topic(sasl_broker.bootstrap, source, partitions=2)
    rows = readings(200, len(mechanism + listener))
    produce(sasl_broker.bootstrap, source, [json.dumps(r).encode() for r in rows])
    bootstrap, security = _listener(sasl_broker, mechanism, listener)
    assert security.stat().st_mode & 0o777 == 0o600
    if listener == "mtls":  # without the client's certificate the listener refuses the start
        with pytest.raises(kafka_io.KafkaUnavailable, match="task no-cert, operator src: the "
                           "Kafka broker at .* refused the connection's security settings"):
            _task(spark, tmp_path, "no-cert", bootstrap, source, out,
                  sasl_broker.tls_client_properties())
    rt = _task(spark, tmp_path, "good", bootstrap, source, out, security)
    expected = hot(rows)
    assert written_then_stop(rt, sasl_broker.bootstrap, out, expected) == expected


def test_a_wrong_password_is_refused_with_the_reason_and_writes_nothing(
        spark: Any, sasl_broker: Any, tmp_path: Path) -> None:
    from executor import kafka_io

    source, bad_out, good_out = temp_topic("pw-in"), temp_topic("pw-bad"), temp_topic("pw-ok")
    create_topic(sasl_broker.bootstrap, source)
    rows = readings(60, 3)
    produce(sasl_broker.bootstrap, source, [json.dumps(r).encode() for r in rows])
    wrong = sasl_broker.client_properties(USER, "SCRAM-SHA-256", password="not-the-password")
    with pytest.raises(kafka_io.KafkaUnavailable) as caught:
        _task(spark, tmp_path, "bad", sasl_broker.sasl_bootstrap, source, bad_out, wrong)
    reason = str(caught.value)  # the status: "task bad did not start: KafkaUnavailable: " + it
    assert reason.startswith(f"task bad, operator src: the Kafka broker at "
                             f"{sasl_broker.sasl_bootstrap} refused the connection's security "
                             "settings"), reason
    assert "fix the file given as security-file=" in reason
    assert "not-the-password" not in reason
    good = sasl_broker.client_properties(USER, "SCRAM-SHA-256")
    with pytest.raises(kafka_io.KafkaUnavailable, match="task bad-sink, operator out: the Kafka "
                       "broker at .* refused the connection's security settings"):
        _task(spark, tmp_path, "bad-sink", sasl_broker.sasl_bootstrap, source, bad_out, good,
              sink_file=wrong)
    untrusted = tmp_path / "untrusted.properties"  # SASL_SSL, but the CA is not trusted
    untrusted.write_text("\n".join(line for line in good.read_text().splitlines()
                                   if line.startswith(("security", "sasl", " ")))
                         .replace("SASL_PLAINTEXT", "SASL_SSL") + "\n")
    with pytest.raises(kafka_io.KafkaUnavailable, match="task untrusted, operator src: the "
                       "Kafka broker at .* refused the connection's security settings"):
        _task(spark, tmp_path, "untrusted", sasl_broker.sasl_ssl_bootstrap, source, bad_out,
              untrusted)
    # a task with the right file runs beside them; the refused ones wrote nothing
    rt = _task(spark, tmp_path, "ok", sasl_broker.sasl_bootstrap, source, good_out, good)
    expected = hot(rows)
    assert written_then_stop(rt, sasl_broker.bootstrap, good_out, expected) == expected
    assert read_committed(sasl_broker.bootstrap, bad_out, expect=0, timeout=5, settle=0) == []
