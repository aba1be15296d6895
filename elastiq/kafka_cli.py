"""`elastiq kafka start|stop|status|produce|consume`: a real Kafka broker for trying Elastiq.

Owns the command line of the dev helper (like `elastiq run`'s embedded cluster, a single-machine
convenience): `start` runs one KRaft broker detached on 127.0.0.1 (`elastiq.kafka_broker`) and
records it in the state folder, `stop` ends it, `status` says whether it answers, `produce` sends
standard input's lines to a topic and `consume` prints a topic's records as a `read_committed`
reader sees them. Does not own the broker's configuration or the Kafka operators.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
                    help=f"the broker's port (default: {DEFAULT_PORT}; 0: any free port)")
    st.set_defaults(handler=cmd_start)
    ks.add_parser("stop", help="stop the broker `start` started").set_defaults(handler=cmd_stop)
    ks.add_parser("status", help="say whether the broker answers and where") \
        .set_defaults(handler=cmd_status)
    p = ks.add_parser("produce", help="send standard input's lines to a topic, one record each")
    p.add_argument("topic")
    p.add_argument("--bootstrap", help="bootstrap servers (default: the started broker)")
    p.set_defaults(handler=cmd_produce)
    c = ks.add_parser("consume", help="print a topic's committed records, one per line")
    c.add_argument("topic")
    c.add_argument("--bootstrap", help="bootstrap servers (default: the started broker)")
    c.add_argument("--max", type=int, default=0, help="stop after this many records")
    c.add_argument("--idle", type=float, default=0.0,
                   help="stop after this many seconds without a record (default: never)")
    c.set_defaults(handler=cmd_consume)
    k.set_defaults(handler=lambda _args: (k.print_help(), 2)[1])


def cmd_start(args: argparse.Namespace) -> int:
    from elastiq.kafka_broker import (BrokerError, KafkaBroker, answers, read_record,
                                      write_record)

    old = read_record(args.dir)
    if old is not None and answers(old.bootstrap):
        print(f"a broker already runs at {old.bootstrap} (pid {old.pid})")
        return 0
    try:
        broker = KafkaBroker(args.dir / "broker", port=args.port).start(detached=True)
    except (BrokerError, KafkaPartsMissing) as e:
        print(f"elastiq kafka start: {e}", file=sys.stderr)
        return 1
    write_record(args.dir, broker.record())
    print(f"Kafka broker at {broker.bootstrap} (pid {broker.record().pid}); "
          f"stop it with `elastiq kafka stop`")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from elastiq.kafka_broker import STATE_FILE, read_record, stop_detached

    record = read_record(args.dir)
    if record is None or not stop_detached(record):
        print("no broker is running")
        return 0
    (args.dir / STATE_FILE).unlink(missing_ok=True)
    print(f"stopped the broker at {record.bootstrap}")
    return 0


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
    return 0


def _bootstrap(args: argparse.Namespace) -> str | None:
    from elastiq.kafka_broker import read_record

    if args.bootstrap:
        return str(args.bootstrap)
    record = read_record(args.dir)
    if record is None:
        print("no broker started: pass --bootstrap or run `elastiq kafka start`", file=sys.stderr)
        return None
    return record.bootstrap


def cmd_produce(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    bootstrap = _bootstrap(args)
    if bootstrap is None:
        return 1
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = 0
    for line in sys.stdin:
        producer.produce(args.topic, line.rstrip("\n").encode("utf-8"))
        producer.poll(0)
        sent += 1
    left = producer.flush(30)
    print(f"sent {sent - left} records to {args.topic}", file=sys.stderr)
    return 0 if left == 0 else 1


def cmd_consume(args: argparse.Namespace) -> int:
    import time

    from confluent_kafka import Consumer

    bootstrap = _bootstrap(args)
    if bootstrap is None:
        return 1
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"elastiq-cli-{time.time()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.subscribe([args.topic])
    seen, last = 0, time.monotonic()
    try:
        while not args.max or seen < args.max:
            message = consumer.poll(0.5)
            if message is None or message.error():
                if args.idle and time.monotonic() - last > args.idle:
                    break
                continue
            last = time.monotonic()
            print((message.value() or b"").decode("utf-8", "replace"), flush=True)
            seen += 1
    finally:
        consumer.close()
    return 0
