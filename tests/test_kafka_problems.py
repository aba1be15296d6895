"""What users hit with Kafka, as readable reasons with what to do.

Pure: the kind of problem each client's words show (`common.kafka_problems`, fed the texts
Spark's Java client and librdkafka really print), the reason a failed query gives
(`executor.task_runner.failure_reason`). With a real broker (layer 3): a kafka-source whose
broker does not answer, whose topic does not exist, whose security settings the broker refuses
or the client does not take, each refused at the task's start with the reason within seconds
(Spark's own client waits minutes, then prints a Java stack); and a topic deleted while its
query runs, which ends the query with the reason a status message carries.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from common.kafka_problems import explain, problem_of_text
from common.types import Schema
from executor.task_runner import failure_reason
from tests.kafka_support import create_topic, kafka_parts_missing, kafka_required
from tests.kafka_support import produce, read_committed, temp_topic
from testkit.waiting import wait_for

__all__ = ["kafka_parts_missing"]

READING = Schema.of(("sensor", "string"), ("temp", "double"))

# what the clients print, as seen in runs against the test broker (2026-11-28)
DELETED = ("java.util.concurrent.ExecutionException: org.apache.kafka.common.errors."
           "UnknownTopicOrPartitionException: This server does not host this topic-partition.\n"
           "Caused by: org.apache.kafka.common.errors.UnknownTopicOrPartitionException: This "
           "server does not host this topic-partition.")
NO_NODE = ("org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node "
           "assignment. Call: describeTopics")
RDKAFKA_DOWN = "KafkaError{code=_TRANSPORT,val=-195,str=\"Failed to get metadata: Local: " \
               "Broker transport failure\"}"
SSL = "127.0.0.1:4242/bootstrap: SSL handshake failed: Disconnected: connection closed by peer"
# librdkafka when a listener requires a client certificate and the client has none (TLS 1.3:
# the broker's alert arrives after the handshake, as a transport failure)
NO_CERT = ("ssl://127.0.0.1:4242/bootstrap: Receive failed: ssl/record/rec_layer_s3.c:918:"
           "ssl3_read_bytes error:0A000412:SSL routines::ssl/tls alert bad certificate: SSL alert "
           "number 42 (after 6ms in state APIVERSION_QUERY) (_TRANSPORT)")
SASL = "org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed: " \
       "Invalid username or password"
BAD_VALUE = "KafkaError{code=_INVALID_ARG,val=-186,str=\"Invalid value \"BOGUS\" for " \
            "configuration property \"security.protocol\"\"}"


@pytest.mark.parametrize(("text", "problem"), [
    (DELETED, "no-topic"), (NO_NODE, "unreachable"), (RDKAFKA_DOWN, "unreachable"),
    (SSL, "refused"), (NO_CERT, "refused"), (SASL, "refused"), (BAD_VALUE, "bad-setting"),
    ("java.lang.ArithmeticException: / by zero", None),
    ("FileNotFoundError: /data/in.csv", None)])
def test_the_kind_of_problem_a_clients_words_show(text: str, problem: str | None) -> None:
    assert problem_of_text(text) == problem


def test_the_reason_says_what_to_do_then_the_error_bounded() -> None:
    reason = explain(DELETED, "UnknownTopicOrPartitionException: This server does not host "
                              "this topic-partition.")
    assert reason is not None
    assert reason.startswith("a Kafka topic does not exist or was deleted: create it")
    assert reason.endswith("(UnknownTopicOrPartitionException: This server does not host this "
                           "topic-partition.)")
    assert explain("x" * 50 + " Connection refused " + "y" * 2000, None) is not None
    assert len(explain(NO_NODE + "z" * 2000, None) or "") <= 500
    assert explain("ValueError: bad row", "ValueError: bad row") is None


def test_a_transport_failure_with_security_settings_and_a_listener_is_a_refusal() -> None:
    from executor.kafka_io import start_problem

    transport = "Failed to get metadata: Local: Broker transport failure"
    assert start_problem(transport, secured=True, listening=True) == "refused"
    assert start_problem(transport, secured=True, listening=False) == "unreachable"
    assert start_problem(transport, secured=False, listening=True) == "unreachable"
    assert start_problem(SASL, secured=True, listening=True) == "refused"
    assert start_problem(BAD_VALUE, secured=True, listening=True) == "bad-setting"


class _QueryError(Exception):
    """A StreamingQueryException as `failure_reason` reads it: message and JVM stack."""

    def __init__(self, message: str, stack: str) -> None:
        super().__init__(message)
        self._stackTrace = stack


def test_a_failed_querys_reason_is_the_kafka_advice_not_the_java_stack() -> None:
    exc = _QueryError("org.apache.kafka.common.errors.UnknownTopicOrPartitionException: This "
                      "server does not host this topic-partition.",
                      DELETED + "\n\tat org.apache.kafka.clients.admin.KafkaAdminClient...")
    reason = failure_reason(exc)
    assert reason.startswith("a Kafka topic does not exist or was deleted")
    assert "\tat " not in reason
    other = _QueryError("java.lang.ArithmeticException: / by zero", "")
    assert failure_reason(other) == "ArithmeticException: / by zero"


# --- with a real broker ----------------------------------------------------------------------

def _runtime(spark: Any, tmp_path: Path, name: str) -> Any:
    from executor.runtime import TaskRuntime

    return TaskRuntime(spark, query_id="q", task_id=name, checkpoint_dir=str(tmp_path / name))


def _source(rt: Any, bootstrap: str, topic: str, security_file: str | None = None) -> None:
    rt.kafka_source(op="src", output="raw", schema=READING, bootstrap=bootstrap,
                    topics=(topic,), starting_offsets="earliest", format="jsonl", metadata=(),
                    security_file=security_file)


@pytest.mark.spark
@kafka_required()
def test_a_start_against_a_broker_that_does_not_answer_is_refused_with_the_reason(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elastiq.kafka_broker import free_port
    from executor import kafka_io

    monkeypatch.setattr(kafka_io, "CHECK_TIMEOUT_S", 3.0)
    nowhere = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(kafka_io.KafkaUnavailable) as caught:
        _source(_runtime(spark, tmp_path, "down"), nowhere, "readings")
    assert time.monotonic() - started < 30
    assert str(caught.value).startswith(f"task down, operator src: cannot reach the Kafka "
                                        f"broker at {nowhere}: is it running")


@pytest.mark.spark
@kafka_required()
def test_a_missing_topic_and_refused_or_unknown_security_settings_are_refused_at_start(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    from executor import kafka_io

    with pytest.raises(kafka_io.KafkaUnavailable, match=r"operator src: a Kafka topic at "
                       rf"{kafka_broker} \(no-such-topic\) does not exist"):
        _source(_runtime(spark, tmp_path, "missing"), kafka_broker, "no-such-topic")
    topic = temp_topic("sec")
    create_topic(kafka_broker, topic)
    ssl = tmp_path / "ssl.properties"  # the broker's listener is PLAINTEXT
    ssl.write_text("security.protocol=SSL\n")
    with pytest.raises(kafka_io.KafkaUnavailable, match="refused the connection's security"):
        _source(_runtime(spark, tmp_path, "ssl"), kafka_broker, topic, str(ssl))
    bogus = tmp_path / "bogus.properties"
    bogus.write_text("security.protocol=BOGUS\n")
    with pytest.raises(kafka_io.KafkaUnavailable, match="not one the Kafka client takes"):
        _source(_runtime(spark, tmp_path, "bogus"), kafka_broker, topic, str(bogus))


@pytest.mark.spark
@kafka_required()
def test_a_topic_deleted_while_its_query_runs_ends_it_with_the_reason(
        spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    source, out = temp_topic("del"), temp_topic("delout")
    create_topic(kafka_broker, source, partitions=2)
    produce(kafka_broker, source, [json.dumps({"sensor": "a", "temp": 1.0}).encode()] * 5)
    rt = _runtime(spark, tmp_path, "del")
    _source(rt, kafka_broker, source)
    rt.kafka_sink(op="out", input="raw", bootstrap=kafka_broker, topic=out, format="jsonl",
                  delivery="at-least-once")
    try:
        assert len(read_committed(kafka_broker, out, expect=5, timeout=90, settle=0)) == 5
        admin = AdminClient({"bootstrap.servers": kafka_broker})
        admin.delete_topics([source])[source].result(30)
        wait_for("the query ends", lambda: not rt.query.isActive, timeout=120)
        reason = failure_reason(rt.query.exception())
    finally:
        rt.stop()
    assert reason.startswith("a Kafka topic does not exist or was deleted: create it"), reason
    assert "UnknownTopicOrPartition" in reason and "\tat " not in reason
