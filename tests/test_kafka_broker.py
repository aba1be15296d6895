"""The Kafka broker launcher (elastiq.kafka_broker) and `elastiq kafka`: the configuration as a
pure function, and one real KRaft broker that answers, takes records in a transaction, and
stops."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from elastiq.kafka_broker import BrokerPorts, random_cluster_id, server_properties
from tests.kafka_support import (kafka_parts_missing, kafka_required, produce,
                                 read_committed, temp_topic)

__all__ = ["kafka_parts_missing"]


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


def test_a_cluster_id_never_starts_with_a_dash_which_kafka_storage_reads_as_an_option() -> None:
    draws = iter([b"\xfb" + bytes(15), b"\xfb" + bytes(15), b"\x01" + bytes(15)])
    assert base64.urlsafe_b64encode(b"\xfb" + bytes(15)).startswith(b"-")  # the bad draw
    picked = random_cluster_id(lambda: next(draws))
    assert not picked.startswith("-") and len(base64.urlsafe_b64decode(picked + "==")) == 16
    assert not any(random_cluster_id().startswith("-") for _ in range(2000))


@kafka_required()
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


@kafka_required()
def test_elastiq_kafka_starts_a_detached_broker_and_stops_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With --user: a SASL listener, a generated owner-only password, and a client file that
    logs in (read as the start check reads it); stop removes the password and the file."""
    import io

    from elastiq.cli import main
    from elastiq.kafka_broker import answers, is_broker_process, read_record
    from executor.kafka_io import read_security_file

    state = str(tmp_path / "k")
    assert main(["kafka", "--dir", state, "start", "--port", "0", "--user", "alice"]) == 0
    record = read_record(Path(state))
    client = tmp_path / "k" / "client-alice.properties"
    try:
        assert record is not None and is_broker_process(record.pid)
        printed = capsys.readouterr().out
        assert f"security-file=\"{client}\"" in printed
        assert (tmp_path / "k" / "passwords").stat().st_mode & 0o777 == 0o600
        assert answers(record.secured["sasl"], timeout=10.0,
                       settings=dict(read_security_file(str(client)).librdkafka))
        assert main(["kafka", "--dir", state, "status"]) == 0
        monkeypatch.setattr("sys.stdin", io.StringIO("one\ntwo\n"))
        assert main(["kafka", "--dir", state, "produce", "lines"]) == 0
        capsys.readouterr()
        assert main(["kafka", "--dir", state, "consume", "lines", "--max", "2"]) == 0
        assert capsys.readouterr().out.splitlines() == ["one", "two"]
    finally:
        assert main(["kafka", "--dir", state, "stop"]) == 0
    assert record is not None and not is_broker_process(record.pid)
    assert not client.exists() and not (tmp_path / "k" / "passwords").exists()
    assert not (tmp_path / "k" / "broker" / "server.properties").exists()
    assert main(["kafka", "--dir", state, "status"]) == 1


def test_missing_kafka_parts_skip_on_a_developers_machine_and_fail_under_ci() -> None:
    from tests.kafka_support import in_ci, missing_parts_action

    assert missing_parts_action(None, ci=True) == "run"
    assert missing_parts_action(None, ci=False) == "run"
    assert missing_parts_action("no broker jars", ci=False) == "skip"
    assert missing_parts_action("no broker jars", ci=True) == "fail"
    assert in_ci({"CI": "true"}) and in_ci({"CI": "1"}) and in_ci({"CI": "TRUE "})
    assert not in_ci({}) and not in_ci({"CI": ""}) and not in_ci({"CI": "false"})


def test_under_ci_a_kafka_test_without_the_parts_fails_with_the_reason(tmp_path: Path) -> None:
    """The wiring, in a pytest of its own with an empty JVM cache: CI=true fails, saying why."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "ELASTIQ_JVM_CACHE": str(tmp_path / "none")}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
            "-rfs", str(Path(__file__)), "-k", "commits_transactions"]
    ci = subprocess.run(args, env={**env, "CI": "true"}, cwd=root, capture_output=True,
                        text=True, timeout=120)
    assert ci.returncode == 1 and "1 error" in ci.stdout, ci.stdout[-2000:]
    assert "CI=true and a test about Kafka cannot run: Apache Kafka's broker is not in" \
        in ci.stdout, ci.stdout[-2000:]
    dev = subprocess.run(args, env={**env, "CI": ""}, cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert dev.returncode == 0 and "1 skipped" in dev.stdout, dev.stdout[-2000:]


def test_a_restarted_broker_is_not_held_back_long_by_its_old_registration() -> None:
    props = _props(server_properties(BrokerPorts(9092, 9093), Path("/tmp/x")))
    assert int(props["broker.session.timeout.ms"]) <= 3000
    assert int(props["broker.heartbeat.interval.ms"]) < int(props["broker.session.timeout.ms"])


@kafka_required()
def test_a_killed_broker_restarts_on_its_data_dir_and_port_with_what_it_committed(
        tmp_path: Path) -> None:
    from confluent_kafka import Producer

    from elastiq.kafka_broker import BrokerError, KafkaBroker

    with KafkaBroker(tmp_path / "k") as broker:
        bootstrap, topic = broker.bootstrap, temp_topic("restart")
        produce(bootstrap, topic, [b"plain"])
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, b"committed")
        producer.commit_transaction(30)
        producer.begin_transaction()
        producer.produce(topic, b"left open")
        producer.flush(10)
        with pytest.raises(BrokerError, match="still running"):
            broker.restart()
        broker.kill()
        assert broker.restart().bootstrap == bootstrap
        again = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
        again.init_transactions(60)  # finishes (aborts) the transaction left open
        assert [v for _, v in read_committed(bootstrap, topic, expect=2)] == [b"plain",
                                                                               b"committed"]
