"""The Kafka broker launcher (elastiq.kafka_broker) and `elastiq kafka`: the configuration as a
pure function, and one real KRaft broker that answers, takes records in a transaction, and
stops."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from elastiq.kafka_broker import BrokerPorts, random_cluster_id, server_properties
from tests.kafka_support import kafka_broker, produce, read_committed, skip_reason, temp_topic

__all__ = ["kafka_broker"]


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_single_node_settings_let_transactions_and_groups_start() -> None:
    props = _props(server_properties(BrokerPorts(9092, 9093), Path("/tmp/x")))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    for key in ("transaction.state.log.replication.factor", "transaction.state.log.min.isr",
                "offsets.topic.replication.factor"):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.dirs"] == "/tmp/x"


def test_cluster_ids_are_sixteen_random_bytes() -> None:
    a, b = random_cluster_id(), random_cluster_id()
    assert a != b and len(a) == 22
    assert len(base64.urlsafe_b64decode(a + "==")) == 16


@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
def test_a_real_broker_commits_transactions_and_hides_aborted_ones(kafka_broker: str) -> None:
    from confluent_kafka import Producer

    topic = temp_topic("tx")
    produce(kafka_broker, topic, [b"plain"])
    producer = Producer({"bootstrap.servers": kafka_broker, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    assert [v for _, v in read_committed(kafka_broker, topic, expect=2)] == [b"plain",
                                                                              b"committed"]


@pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
def test_elastiq_kafka_starts_a_detached_broker_and_stops_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from elastiq.cli import main
    from elastiq.kafka_broker import is_broker_process, read_record

    state = str(tmp_path / "k")
    assert main(["kafka", "--dir", state, "start", "--port", "0"]) == 0
    record = read_record(Path(state))
    try:
        assert record is not None and is_broker_process(record.pid)
        assert main(["kafka", "--dir", state, "status"]) == 0
        monkeypatch.setattr("sys.stdin", io.StringIO("one\ntwo\n"))
        assert main(["kafka", "--dir", state, "produce", "lines"]) == 0
        capsys.readouterr()
        assert main(["kafka", "--dir", state, "consume", "lines", "--max", "2"]) == 0
        assert capsys.readouterr().out.splitlines() == ["one", "two"]
    finally:
        assert main(["kafka", "--dir", state, "stop"]) == 0
    assert record is not None and not is_broker_process(record.pid)
    assert main(["kafka", "--dir", state, "status"]) == 1
