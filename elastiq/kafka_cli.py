"""`elastiq kafka start|stop|status|produce|consume`: a real Kafka broker for trying Elastiq.

Owns the command line of the dev helper (like `elastiq run`'s embedded cluster, a single-machine
convenience): `start` runs one KRaft broker detached on 127.0.0.1 (`elastiq.kafka_broker`) and
records it in the state folder (with `--user`/`--users-file` and `--tls` a secured one too:
`elastiq.kafka_dev_security` decides the options and writes the client files), `stop` ends it
and removes the passwords, keys and client files `start` wrote, `status` says whether it
answers, `produce` sends standard input's lines to a topic and `consume` prints a topic's
records as a `read_committed` reader sees them, both through a secured listener with
`--security-file` (a Java client file, read and translated as the operators' `security-file=`
is: `elastiq.kafka_client_file`) after the broker answered with those settings (a refusal is
one line and exit status 1). Does not own the broker's configuration or the Kafka operators.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.kafka_jars import KafkaPartsMissing
from common.paths import DEFAULT_STATE_DIR

DEFAULT_DIR = Path(DEFAULT_STATE_DIR) / "kafka"
DEFAULT_PORT = 9092  # Kafka's own default, which examples/kafka-sensors.xml names


def register(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("kafka", help="a local Apache Kafka broker for trying Elastiq "
                                     "(start, stop, status, produce, consume)")
    k.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                   help=f"the broker's state folder (default: {DEFAULT_DIR})")
    ks = k.add_subparsers(metavar="ACTION")
    st = ks.add_parser("start", help="start a broker (KRaft, one node) on 127.0.0.1")
    st.add_argument("--port", type=int, default=DEFAULT_PORT,
                    help=f"the broker's port (default: {DEFAULT_PORT}; 0: any free port); the "
                         "secured listeners take the next ones (+1 SASL_PLAINTEXT, +2 SASL_SSL, "
                         "+3 SSL, +4 SSL with client certificates)")
    st.add_argument("--user", action="append", default=[], metavar="NAME",
                    help="a SASL user (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with a generated "
                         "password, written to an owner-only file whose path is printed "
                         "(repeatable)")
    st.add_argument("--users-file", type=Path, metavar="FILE",
                    help="SASL users with their passwords, NAME=PASSWORD lines, in an "
                         "owner-only file (chmod 600)")
    st.add_argument("--mechanism", metavar="MECHANISM",
                    help="the SASL mechanism of the client files written (PLAIN, "
                         "SCRAM-SHA-256, SCRAM-SHA-512; default SCRAM-SHA-256)")
    st.add_argument("--tls", action="store_true",
                    help="TLS listeners (SSL, and SASL_SSL with users) whose certificate a "
                         "throwaway CA signed; the client files trust it")
    st.add_argument("--mutual-tls", action="store_true",
                    help="with --tls: also an SSL listener requiring a client certificate "
                         "(port +4) and a client keystore the CA signed, named by "
                         "client-mtls.properties")
    st.set_defaults(handler=cmd_start)
    ks.add_parser("stop", help="stop the broker `start` started").set_defaults(handler=cmd_stop)
    ks.add_parser("status", help="say whether the broker answers and where") \
        .set_defaults(handler=cmd_status)
    p = ks.add_parser("produce", help="send standard input's lines to a topic, one record each")
    _client_options(p)
    p.set_defaults(handler=cmd_produce)
    c = ks.add_parser("consume", help="print a topic's committed records (read_committed), one "
                                      "per line")
    _client_options(c)
    c.add_argument("--max", type=int, default=0, help="stop after this many records")
    c.add_argument("--idle", type=float, default=0.0,
                   help="stop after this many seconds without a record (default: never)")
    c.set_defaults(handler=cmd_consume)
    k.set_defaults(handler=lambda _args: (k.print_help(), 2)[1])


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    p.add_argument("--bootstrap", help="bootstrap servers (default: the started broker; with "
                                       "--security-file its listener for the file's "
                                       "security.protocol)")
    p.add_argument("--security-file", type=Path, metavar="FILE",
                   help="a Java client properties file (security.*, sasl.*, ssl.* keys: what "
                        "security-file= of kafka-source/kafka-sink takes and `start --user` "
                        "writes)")


def cmd_start(args: argparse.Namespace) -> int:
    from elastiq.kafka_broker import (BrokerError, KafkaBroker, answers, read_record,
                                      write_record)

    from elastiq.kafka_dev_security import plan_secured_start, usage_lines, write_client_files
    from elastiq.kafka_tls import TlsError

    start, problems = plan_secured_start(args.user, args.users_file, args.mechanism, args.tls,
                                         args.port, args.mutual_tls)
    if start is None:
        for problem in problems:
            print(f"elastiq kafka start: {problem}", file=sys.stderr)
        return 2
    old = read_record(args.dir)
    if old is not None and answers(old.bootstrap):
        print(f"a broker already runs at {old.bootstrap} (pid {old.pid}); stop it first "
              "(`elastiq kafka stop`) to start it with other options")
        return 0
    broker = KafkaBroker(args.dir / "broker", port=args.port, users=start.users, tls=start.tls,
                         mutual_tls=start.mutual_tls)
    try:
        broker.start(detached=True)
    except (BrokerError, KafkaPartsMissing, TlsError) as e:
        remove_secrets(args.dir, [str(broker.work_dir / "server.properties"),
                                  str(broker.work_dir / "tls")])
        print(f"elastiq kafka start: {e}", file=sys.stderr)
        return 1
    written: list[str] = []
    files = None
    if start.secured:
        ca_pem = broker.tls.ca_pem if broker.tls else None
        files = write_client_files(args.dir.resolve(), start, ca_pem, broker.client_tls)
        written = [str(p) for p in files.paths()] + [str(broker.work_dir / "server.properties")]
        written += [str(broker.work_dir / "tls")] if broker.tls else []
    write_record(args.dir, broker.record(written))
    print(f"Kafka broker at {broker.bootstrap} (pid {broker.record().pid}); "
          f"stop it with `elastiq kafka stop`")
    if files is not None:
        print("\n".join(usage_lines(broker.ports.secured(), files, start)))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from elastiq.kafka_broker import STATE_FILE, read_record, stop_detached

    record = read_record(args.dir)
    running = record is not None and stop_detached(record)
    removed = remove_secrets(args.dir, record.secrets) if record is not None else []
    (args.dir / STATE_FILE).unlink(missing_ok=True)
    print(f"stopped the broker at {record.bootstrap}" if running and record is not None
          else "no broker is running")
    if removed:
        print(f"removed its passwords, keys and client files: {', '.join(removed)}")
    return 0


def remove_secrets(state_dir: Path, paths: list[str]) -> list[str]:
    """Remove the files (and the TLS folder) `start` wrote, only inside `state_dir` (the
    record is a file there: whatever it says, nothing outside is touched); the paths removed."""
    import shutil

    removed = []
    root = state_dir.resolve()
    for text in paths:
        path = Path(text)
        if not path.is_absolute() or root not in path.parent.resolve().parents and \
                path.parent.resolve() != root:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
        else:
            continue
        removed.append(text)
    return removed


def cmd_status(args: argparse.Namespace) -> int:
    from elastiq.kafka_broker import answers, read_record

    record = read_record(args.dir)
    if record is None:
        print("no broker started (elastiq kafka start)")
        return 1
    if not answers(record.bootstrap, timeout=3.0):
        print(f"the broker at {record.bootstrap} (pid {record.pid}) does not answer; "
              f"see {Path(record.work_dir) / 'server.log'}")
        return 1
    print(f"Kafka broker at {record.bootstrap} (pid {record.pid}) answers")
    from elastiq.kafka_dev_security import LISTENER_LABELS

    for name, address in record.secured.items():
        print(f"  {LISTENER_LABELS.get(name, name)} listener at {address}")
    return 0


def _client(args: argparse.Namespace, command: str) -> tuple[str, dict[str, str]] | None:
    """The bootstrap and librdkafka security settings `produce`/`consume` use, once the broker
    answered with them (`executor.kafka_io.check_broker`); None after printing every problem
    (each a line) or the broker's refusal."""
    from common.kafka_params import KafkaParamError, check_topic
    from elastiq.kafka_broker import read_record
    from elastiq.kafka_client_file import (ClientFileError, checked_bootstrap, cli_words,
                                           default_bootstrap, read_client_security)
    from executor.kafka_io import KafkaUnavailable, check_broker

    problems: list[str] = []
    security: dict[str, str] = {}
    bootstrap: str | None = None
    try:
        check_topic(args.topic)
    except KafkaParamError as e:
        problems.append(f"topic {e}")
    try:
        security = read_client_security(args.security_file) if args.security_file else {}
    except ClientFileError as e:
        problems.append(str(e))
    try:
        if args.bootstrap:
            bootstrap = checked_bootstrap(str(args.bootstrap))
        elif (record := read_record(args.dir)) is None:
            problems.append("no broker started: pass --bootstrap or run `elastiq kafka start`")
        elif not problems:
            bootstrap = default_bootstrap(record.bootstrap, record.secured, security)
    except ClientFileError as e:
        problems.append(str(e))
    if problems or bootstrap is None:
        for problem in problems:
            print(f"elastiq kafka {command}: {problem}", file=sys.stderr)
        return None
    try:
        check_broker(bootstrap, (), security, quiet=True)
    except KafkaUnavailable as e:
        print(f"elastiq kafka {command}: {cli_words(str(e))}", file=sys.stderr)
        return None
    return bootstrap, security


def cmd_produce(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    from elastiq.kafka_client_file import client_config

    client = _client(args, "produce")
    if client is None:
        return 1
    failed: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failed.append(str(error))

    producer = Producer(client_config(*client, {"enable.idempotence": True,
                                                "on_delivery": delivered}))
    sent = 0
    for line in sys.stdin:
        _send(producer, args.topic, line.rstrip("\n").encode("utf-8"))
        sent += 1
    left = producer.flush(30)
    print(f"sent {sent - left - len(failed)} records to {args.topic}", file=sys.stderr)
    if failed or left:
        why = f" ({failed[0][:200]})" if failed else " within 30 s"
        print(f"elastiq kafka produce: {len(failed) + left} records not delivered{why}",
              file=sys.stderr)
        return 1
    return 0


def _send(producer: Any, topic: str, value: bytes) -> None:
    """Queue one record, serving delivery reports while librdkafka's queue is full."""
    while True:
        try:
            producer.produce(topic, value)
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.5)


def committed_consumer(bootstrap: str, security: dict[str, str],
                       own: dict[str, Any] | None = None) -> Any:
    """A read_committed consumer of a group of its own that commits nothing (`consume`, and
    `elastiq tail --stable` on a Kafka sink): records of aborted or open transactions are
    never read."""
    import time

    from confluent_kafka import Consumer

    from elastiq.kafka_client_file import client_config

    return Consumer(client_config(bootstrap, security, {
        "group.id": f"elastiq-cli-{time.time()}", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "isolation.level": "read_committed", **(own or {})}))


def cmd_consume(args: argparse.Namespace) -> int:
    from common.kafka_problems import problem_of_text

    client = _client(args, "consume")
    if client is None:
        return 1
    consumer = committed_consumer(*client)
    consumer.subscribe([args.topic])
    seen, last = 0, time.monotonic()
    try:
        while not args.max or seen < args.max:
            message = consumer.poll(0.5)
            error = message.error() if message is not None else None
            if error is not None and problem_of_text(str(error)) in ("refused", "bad-setting"):
                print(f"elastiq kafka consume: {error}", file=sys.stderr)
                return 1
            if message is None or error is not None:
                if args.idle and time.monotonic() - last > args.idle:
                    break
                continue
            last = time.monotonic()
            print((message.value() or b"").decode("utf-8", "replace"), flush=True)
            seen += 1
    finally:
        consumer.close()
    return 0


READ_SECONDS = 60.0  # `read_to_end`'s bound: a topic not read to its end offsets by then


class TopicUnreadable(RuntimeError):
    """A topic that cannot be read (it does not exist, its metadata does not come)."""


@dataclass(frozen=True)
class TopicRead:
    """The records of a topic up to the end offsets taken at the start: (headers, value) each,
    where each one is (partition, offset), and the partitions not read to their end in time
    (an open transaction holds a read_committed reader back)."""

    messages: list[tuple[Any, bytes | None]]
    where: list[tuple[int, int]]
    unfinished: list[int]


def read_to_end(bootstrap: str, topic: str, security: dict[str, str],
                timeout: float = READ_SECONDS) -> TopicRead:
    """Every committed record of `topic` below the end offsets each partition has now, read
    `read_committed` from the beginning; bounded by `timeout` seconds."""
    consumer = committed_consumer(bootstrap, security, {"enable.partition.eof": True})
    try:
        ends = _end_offsets(consumer, topic)
        return _consume_to(consumer, topic, ends, time.monotonic() + timeout)
    finally:
        consumer.close()


def _end_offsets(consumer: Any, topic: str) -> dict[int, int]:
    from confluent_kafka import KafkaException, TopicPartition

    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise TopicUnreadable(f"topic {topic}: {getattr(metadata, 'error', 'not found')}")
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in metadata.partitions}
    except KafkaException as exc:
        raise TopicUnreadable(f"topic {topic}: {exc}") from None


def _consume_to(consumer: Any, topic: str, ends: dict[int, int], deadline: float) -> TopicRead:
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    todo = {p: end for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
    messages: list[tuple[Any, bytes | None]] = []
    where: list[tuple[int, int]] = []
    while todo and time.monotonic() < deadline:
        for message in consumer.consume(500, 0.5):
            partition, offset, error = message.partition(), message.offset(), message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise TopicUnreadable(f"topic {topic}: {error}")
            if partition not in todo:
                continue
            if error is None and offset < todo[partition]:
                messages.append((message.headers(), message.value()))
                where.append((partition, offset))
            if offset >= todo[partition] - (0 if error is not None else 1):
                del todo[partition]  # at its end offset (an EOF there, or its last record)
    return TopicRead(messages, where, sorted(todo))
