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

The real-time path (Spark's real-time trigger, Spark's own Kafka sink) through the SASL_SSL
listener with the same file: at least once against the oracle, and a wrong password on the
source or the sink refused at start with the same reason. `elastiq kafka produce|consume
--security-file` through the SCRAM listener: what consume prints equals what produce read; a
wrong password is one line on standard error and exit status 1.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
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


def _real_time_task(spark: Any, tmp_path: Path, name: str, bootstrap: str, source: str,
                    out: str, source_file: Path, sink_file: Path) -> Any:
    """kafka-source -> filter temp > 30 -> at-least-once kafka-sink in Spark's real-time mode
    (`executor.kafka_realtime`), the source with `source_file`, the sink with `sink_file`."""
    from executor.runtime import TaskRuntime

    rt = TaskRuntime(spark, query_id="q", task_id=name, checkpoint_dir=str(tmp_path / name))
    rt.real_time_mode(checkpoint_interval="5 seconds")
    try:
        rt.kafka_source(op="src", output="raw", schema=READING, bootstrap=bootstrap,
                        topics=(source,), starting_offsets="earliest", format="jsonl",
                        metadata=(), security_file=str(source_file))
        rt.filter(op="hot", input="raw", output="hot", condition="raw.temp > 30")
        rt.kafka_sink(op="out", input="hot", bootstrap=bootstrap, topic=out, format="jsonl",
                      delivery="at-least-once", security_file=str(sink_file))
    except BaseException:
        rt.stop()
        raise
    return rt


def test_a_real_time_task_through_sasl_ssl_is_at_least_once_and_a_wrong_password_is_refused(
        spark: Any, sasl_broker: Any, tmp_path: Path) -> None:
    """Spark's real-time mode with one Java client file (SCRAM-SHA-512 over SASL_SSL, the CA
    as a PEM truststore) on the source and the sink: every record of the oracle in the output,
    nothing else (at least once: no duplicates expected in a run without a restart, but
    allowed). A wrong password on the source, and separately on the sink, refuses the task's
    start with the micro-batch path's reason; the refused tasks wrote nothing."""
    from executor import kafka_io

    source, out, bad_out = temp_topic("rt-sec-in"), temp_topic("rt-sec-out"), \
        temp_topic("rt-sec-bad")
    create_topic(sasl_broker.bootstrap, source, partitions=2)
    create_topic(sasl_broker.bootstrap, out)
    rows = readings(300, 17)
    produce(sasl_broker.bootstrap, source, [json.dumps(r).encode() for r in rows])
    bootstrap = sasl_broker.sasl_ssl_bootstrap
    good = sasl_broker.client_properties(USER, "SCRAM-SHA-512", tls=True)
    wrong = sasl_broker.client_properties(USER, "SCRAM-SHA-512", password="not-the-password",
                                          tls=True)
    for name, op, source_file, sink_file in (("rt-bad-src", "src", wrong, good),
                                             ("rt-bad-sink", "out", good, wrong)):
        with pytest.raises(kafka_io.KafkaUnavailable) as caught:
            _real_time_task(spark, tmp_path, name, bootstrap, source, bad_out, source_file,
                            sink_file)
        reason = str(caught.value)
        assert reason.startswith(f"task {name}, operator {op}: the Kafka broker at {bootstrap} "
                                 "refused the connection's security settings"), reason
        assert "fix the file given as security-file=" in reason and "not-the-password" \
            not in reason
    rt = _real_time_task(spark, tmp_path, "rt-ok", bootstrap, source, out, good, good)
    expected = hot(rows)
    try:
        records = read_committed(sasl_broker.bootstrap, out, expect=sum(expected.values()),
                                 timeout=60)
        assert rt.query is not None and rt.query.isActive, rt.query.exception()
    finally:
        rt.stop()
    seen = got(records)
    assert not (expected - seen), f"missing: {expected - seen}"
    assert set(seen) == set(expected), f"unexpected: {set(seen) - set(expected)}"
    assert read_committed(sasl_broker.bootstrap, bad_out, expect=0, timeout=3, settle=0) == []


def run_cli(args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    """`elastiq ARGS` in a process of its own, as a person runs it: its standard error holds its
    own lines only (librdkafka clients that earlier tests left in this process log there too)."""
    return subprocess.run([sys.executable, "-m", "elastiq.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)


def test_the_cli_produces_and_consumes_through_scram_and_a_wrong_password_is_one_line(
        sasl_broker: Any, tmp_path: Path) -> None:
    """`elastiq kafka produce|consume --security-file` (SCRAM-SHA-256 over SASL_PLAINTEXT):
    what consume prints equals what produce read, in order (one partition); consume finds the
    listener from the started broker's record and the file's protocol. A wrong password: one
    line on standard error (not a librdkafka log line, no traceback), exit 1, no password."""
    from elastiq.kafka_broker import write_record

    state, topic = tmp_path / "k", temp_topic("cli-sec")
    write_record(state, sasl_broker.record())  # as `elastiq kafka start` leaves it
    create_topic(sasl_broker.bootstrap, topic)
    good = sasl_broker.client_properties(USER, "SCRAM-SHA-256")
    lines = [json.dumps(r) for r in readings(40, 8)] + ["not json", "ünïcode ✓", ""]
    produced = run_cli(["kafka", "--dir", str(state), "produce", topic, "--bootstrap",
                        sasl_broker.sasl_bootstrap, "--security-file", str(good)],
                       "".join(f"{line}\n" for line in lines))
    assert produced.returncode == 0, produced.stderr
    assert produced.stderr == f"sent {len(lines)} records to {topic}\n"
    consumed = run_cli(["kafka", "--dir", str(state), "consume", topic, "--security-file",
                        str(good), "--max", str(len(lines)), "--idle", "20"], "")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.split("\n")[:-1] == lines and consumed.stderr == ""

    wrong = sasl_broker.client_properties(USER, "SCRAM-SHA-256", password="not-the-password")
    for command in ("produce", "consume"):
        limit = ["--max", "1"] if command == "consume" else []
        printed = run_cli(["kafka", "--dir", str(state), command, topic, "--security-file",
                           str(wrong), *limit], "never sent\n")
        assert printed.returncode == 1, printed.stderr
        assert printed.stdout == "" and printed.stderr.count("\n") == 1, printed.stderr
        assert printed.stderr.startswith(
            f"elastiq kafka {command}: the Kafka broker at {sasl_broker.sasl_bootstrap} "
            "refused the connection's security settings"), printed.stderr
        assert "fix the file given as --security-file" in printed.stderr
        assert "not-the-password" not in printed.stderr
