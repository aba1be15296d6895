"""A real Apache Kafka broker on this machine: KRaft, one node that is broker and controller.

Owns writing its `server.properties` (listeners on 127.0.0.1, single-node replication settings
so transactions and consumer groups work with one broker), formatting its storage with a random
cluster id (`kafka.tools.StorageTool`), starting `kafka.Kafka` with the jars
`scripts/setup.sh --kafka` fetched (`common.kafka_jars`), waiting until it answers a metadata
request, and stopping it (SIGTERM, then SIGKILL after a bound); killing it (SIGKILL, as a crash
or an OOM kill would) and starting it again on the same ports and data dir, not formatted again
(`restart`: its topics, transactions and committed offsets as the killed broker left them on
disk). Used by `elastiq kafka` (a dev helper, detached: the broker outlives the command and its
pid is kept in a state file) and by the tests (attached). Does not own topics or clients beyond
the readiness check.

With `users` (name -> password) the broker also has a SASL_PLAINTEXT listener (`sasl_bootstrap`)
taking mechanisms PLAIN (the users in the listener's JAAS setting of `server.properties`) and
SCRAM-SHA-256 and SCRAM-SHA-512 (the same users' credentials created through the admin API once
the broker answers, so no password is on a command line); `server.properties` and the client
files `client_properties` writes are mode 0600. The PLAINTEXT listener stays (the readiness
check and the tests' own helpers use it): this is a broker for development and tests, not a
hardened one. With `tls`, an SSL listener (`ssl_bootstrap`, TLS only, the broker authenticated
by its certificate, no login), its certificate signed by a throwaway CA (`elastiq.kafka_tls`,
the JDK's keytool) that client files trust as a PEM truststore (`ca_pem`); with `users` too a
SASL_SSL listener (`sasl_ssl_bootstrap`) with the same mechanisms and users; with
`mutual_tls` too an SSL listener named MTLS (`mtls_bootstrap`) that requires a client
certificate the same CA signed (`client_tls`, a PKCS12 keystore). With a fixed `port` the
secured listeners take the ports after it (`SECURED_PORT_OFFSETS`), so a dev broker's addresses
stay the same from one start to the next.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from common.kafka_jars import broker_classpath
from elastiq.kafka_tls import BrokerTls, ClientTls, make_broker_tls, make_client_tls

MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
STATE_FILE = "broker.json"
LOG_FILE = "server.log"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": _SCRAM, "SCRAM-SHA-512": _SCRAM}
# With a fixed port P: the secured listeners' ports are P + these (those the broker has).
SECURED_PORT_OFFSETS = {"sasl": 1, "sasl_ssl": 2, "ssl": 3, "mtls": 4}
_USER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_PASSWORD = re.compile(r"[A-Za-z0-9_.~+/=-]{8,128}\Z")  # nothing to quote in JAAS or properties
JVM_OPTIONS = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")


class BrokerError(RuntimeError):
    """The broker could not be formatted, did not come up, or is not running."""


@dataclass(frozen=True)
class BrokerPorts:
    broker: int
    controller: int
    sasl: int = 0  # 0: no SASL listener
    sasl_ssl: int = 0  # 0: no SASL_SSL listener
    ssl: int = 0  # 0: no SSL listener (TLS only, no login)
    mtls: int = 0  # 0: no MTLS listener (SSL requiring a client certificate)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.broker}"

    def secured(self) -> dict[str, str]:
        """The secured listeners this broker has: name (as in SECURED_PORT_OFFSETS) ->
        bootstrap address."""
        ports = {"sasl": self.sasl, "sasl_ssl": self.sasl_ssl, "ssl": self.ssl,
                 "mtls": self.mtls}
        return {name: f"127.0.0.1:{port}" for name, port in ports.items() if port}

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_ssl}"


@dataclass(frozen=True)
class BrokerRecord:
    """What `elastiq kafka start` leaves in the state folder for `stop` and `status`."""

    pid: int
    bootstrap: str
    work_dir: str
    secured: dict[str, str] = field(default_factory=dict)  # listener -> bootstrap
    secrets: list[str] = field(default_factory=list)  # files `stop` removes (passwords, keys)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int, reuse: bool = False) -> bool:
    """Whether 127.0.0.1:`port` can be bound; `reuse`: with SO_REUSEADDR, as the broker binds
    its listeners, so a port whose listener is gone but whose connections linger in TIME_WAIT
    (a killed broker's) counts as free."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


USER_NAME_RULE = "a name is 1-64 letters, digits, '_' or '-'"
PASSWORD_RULE = "a password is 8-128 letters, digits, '_', '-', '.', '~', '+', '/' or '='"


def user_name_ok(name: str) -> bool:
    return bool(_USER_NAME.match(name))


def password_ok(password: str) -> bool:
    return bool(_PASSWORD.match(password))


def check_users(users: Mapping[str, str]) -> None:
    """Names and passwords a test broker takes: plain characters only (nothing to quote)."""
    for name, password in users.items():
        if not user_name_ok(name) or not password_ok(password):
            raise BrokerError(f"SASL user {name[:64]!r}: {USER_NAME_RULE}; {PASSWORD_RULE}")


def sasl_listener_settings(users: Mapping[str, str], listener: str = "sasl_plaintext"
                           ) -> dict[str, str]:
    """A SASL listener's settings: PLAIN with `users` in its JAAS setting, SCRAM-SHA-256 with
    the credentials the admin API creates."""
    check_users(users)
    plain_users = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    settings = {
        "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
        f"listener.name.{listener}.plain.sasl.jaas.config":
            f"{LOGIN_MODULES['PLAIN']} required {plain_users};",
    }
    for mechanism in SCRAM_MECHANISMS:
        settings[f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"] = \
            f"{LOGIN_MODULES[mechanism]} required;"
    return settings


def tls_settings(tls: BrokerTls) -> dict[str, str]:
    """The broker's own certificate for its SSL listeners (a PKCS12 keystore)."""
    return {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(tls.keystore),
            "ssl.keystore.password": tls.password, "ssl.key.password": tls.password}


def mtls_settings(tls: BrokerTls) -> dict[str, str]:
    """The MTLS listener's own settings: a client certificate the CA signed is required."""
    return {"listener.name.mtls.ssl.client.auth": "required",
            "listener.name.mtls.ssl.truststore.type": "PEM",
            "listener.name.mtls.ssl.truststore.location": str(tls.ca_pem)}


def client_properties(user: str, password: str, mechanism: str,
                      ca_pem: Path | None = None) -> str:
    """A Java client's properties for the SASL listener (with `ca_pem`: the SASL_SSL one,
    trusting that PEM CA): the form Kafka users already have."""
    check_users({user: password})
    protocol = "SASL_PLAINTEXT" if ca_pem is None else "SASL_SSL"
    trust = "" if ca_pem is None else \
        f"ssl.truststore.type=PEM\nssl.truststore.location={ca_pem}\n"
    return (f"security.protocol={protocol}\nsasl.mechanism={mechanism}\n"
            f"sasl.jaas.config={LOGIN_MODULES[mechanism]} required \\\n"
            f'    username="{user}" \\\n    password="{password}";\n{trust}')


def tls_client_properties(ca_pem: Path, client: ClientTls | None = None) -> str:
    """A Java client's properties for the SSL listener (no login), trusting that PEM CA; with
    `client`, for the MTLS one: the client's PKCS12 keystore too."""
    text = f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={ca_pem}\n"
    if client is not None:
        text += (f"ssl.keystore.type=PKCS12\nssl.keystore.location={client.keystore}\n"
                 f"ssl.keystore.password={client.password}\n"
                 f"ssl.key.password={client.password}\n")
    return text


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only (0600 from its creation)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def server_properties(ports: BrokerPorts, log_dir: Path, users: Mapping[str, str] | None = None,
                      tls: BrokerTls | None = None) -> str:
    """The single-node KRaft configuration: every replication factor and minimum ISR is 1 (the
    transaction state log and the offsets topic included, or transactions and groups never
    start), one partition for the internal topics (fast start), no initial rebalance delay, a
    short broker session (a restart after a kill waits for the old one to expire); with
    `users`, a SASL_PLAINTEXT listener too (`sasl_listener_settings`); with `tls`, an SSL
    listener and (with `users`) a SASL_SSL one, and an MTLS one for each nonzero port."""
    sasl = bool(users) and ports.sasl > 0
    sasl_ssl = sasl and tls is not None and ports.sasl_ssl > 0
    ssl = tls is not None and ports.ssl > 0
    mtls = tls is not None and ports.mtls > 0
    listeners = [f"PLAINTEXT://127.0.0.1:{ports.broker}"]
    if sasl:
        listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{ports.sasl}")
    if sasl_ssl:
        listeners.append(f"SASL_SSL://127.0.0.1:{ports.sasl_ssl}")
    if ssl:
        listeners.append(f"SSL://127.0.0.1:{ports.ssl}")
    if mtls:
        listeners.append(f"MTLS://127.0.0.1:{ports.mtls}")
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{ports.controller}",
        "listeners": ",".join([*listeners, f"CONTROLLER://127.0.0.1:{ports.controller}"]),
        "advertised.listeners": ",".join(listeners),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
                                          + (",SASL_PLAINTEXT:SASL_PLAINTEXT" if sasl else "")
                                          + (",SASL_SSL:SASL_SSL" if sasl_ssl else "")
                                          + (",SSL:SSL" if ssl else "")
                                          + (",MTLS:SSL" if mtls else ""),
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        # a restarted (killed) broker is refused as a DUPLICATE_BROKER_REGISTRATION until its
        # old registration's session expires: 3 s instead of 9 s, heartbeats to match
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
    }
    if sasl and users:
        settings.update(sasl_listener_settings(users))
    if sasl_ssl and users and tls is not None:
        settings.update(sasl_listener_settings(users, "sasl_ssl"))
    if tls is not None and (sasl_ssl or ssl or mtls):
        settings.update(tls_settings(tls))
    if mtls and tls is not None:
        settings.update(mtls_settings(tls))
    return "".join(f"{k}={v}\n" for k, v in settings.items())


LOG4J = """log4j.rootLogger=WARN, file
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=WARN
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


def random_cluster_id(random_bytes: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding (as `kafka-storage
    random-uuid` prints), never starting with "-": `kafka-storage format -t -Xy...` would read
    it as an option and fail (1 start in 64; Kafka's own Uuid.randomUuid draws again too)."""
    while True:
        text = base64.urlsafe_b64encode(random_bytes()).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def _java(classpath: str, work_dir: Path, main: str, *args: str) -> list[str]:
    log4j = work_dir / "log4j.properties"
    return ["java", *JVM_OPTIONS, f"-Dlog4j.configuration=file:{log4j}",
            f"-Dkafka.logs.dir={work_dir}", "-cp", classpath, main, *args]


class KafkaBroker:
    """`with KafkaBroker(tmp_path) as broker: broker.bootstrap` -> "127.0.0.1:PORT"."""

    def __init__(self, work_dir: Path, start_timeout: float = 60.0, port: int = 0,
                 users: Mapping[str, str] | None = None, tls: bool = False,
                 mutual_tls: bool = False):
        self.work_dir = Path(work_dir).resolve()
        self.port = port  # 0: a free port
        self.users = dict(users or {})  # SASL users, name -> password (none: no SASL listener)
        if self.users:
            check_users(self.users)
        if mutual_tls and not tls:
            raise BrokerError("mutual TLS needs the TLS listener: give tls too")
        self.tls_wanted = tls
        self.mutual_tls = mutual_tls
        self.tls: BrokerTls | None = None
        self.client_tls: ClientTls | None = None  # the MTLS listener's client keystore
        self.start_timeout = start_timeout
        self.ports = BrokerPorts(0, 0)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return self.ports.bootstrap

    @property
    def sasl_bootstrap(self) -> str:
        if not self.ports.sasl:
            raise BrokerError("this broker has no SASL listener (give it users)")
        return self.ports.sasl_bootstrap

    @property
    def sasl_ssl_bootstrap(self) -> str:
        if not self.ports.sasl_ssl:
            raise BrokerError("this broker has no SASL_SSL listener (give it users and tls)")
        return self.ports.sasl_ssl_bootstrap

    @property
    def ssl_bootstrap(self) -> str:
        if not self.ports.ssl:
            raise BrokerError("this broker has no SSL listener (give it tls)")
        return f"127.0.0.1:{self.ports.ssl}"

    @property
    def mtls_bootstrap(self) -> str:
        if not self.ports.mtls:
            raise BrokerError("this broker has no MTLS listener (give it mutual_tls)")
        return f"127.0.0.1:{self.ports.mtls}"

    def tls_client_properties(self, mutual: bool = False) -> Path:
        """A Java client properties file (mode 0600) for the SSL listener (no login), or with
        `mutual` for the MTLS one (the client keystore too)."""
        if self.tls is None or (mutual and self.client_tls is None):
            raise BrokerError("this broker has no such TLS listener (give it tls, mutual_tls)")
        path = self.work_dir / f"client-{'mtls' if mutual else 'tls'}.properties"
        write_private(path, tls_client_properties(self.tls.ca_pem,
                                                  self.client_tls if mutual else None))
        return path

    def client_properties(self, user: str, mechanism: str, password: str | None = None,
                          tls: bool = False) -> Path:
        """A Java client properties file (mode 0600) under the broker's dir for `user` with
        `mechanism` (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512), with the user's password unless
        `password`;
        `tls`: for the SASL_SSL listener, trusting the broker's CA."""
        if tls and self.tls is None:
            raise BrokerError("this broker has no SASL_SSL listener (give it users and tls)")
        path = self.work_dir / f"client-{user}-{mechanism.lower()}" \
            f"{'-tls' if tls else ''}{'' if password is None else '-given'}.properties"
        ca = self.tls.ca_pem if tls and self.tls is not None else None
        write_private(path, client_properties(user, password or self.users[user], mechanism,
                                              ca))
        return path

    def start(self, detached: bool = False) -> "KafkaBroker":
        if shutil.which("java") is None:
            raise BrokerError("no java on PATH (Kafka needs Java 17: apt-get install "
                              "openjdk-17-jre-headless)")
        classpath = broker_classpath()
        if self.port and not port_free(self.port):
            raise BrokerError(f"127.0.0.1:{self.port} is taken (another broker?); choose "
                              "another port (--port 0: any free one)")
        if self.tls_wanted and self.tls is None:
            self.tls = make_broker_tls(self.work_dir / "tls")
        if self.mutual_tls and self.tls is not None and self.client_tls is None:
            self.client_tls = make_client_tls(self.tls, "elastiq-client")
        for _ in range(3):  # another process may take a free port before Java binds it
            self.ports = self._pick_ports()
            config = self._write_config()
            self._format(classpath, config)
            self.process = self._spawn(classpath, config, detached)
            try:
                if self._wait_ready() and self._add_scram_users():
                    return self
            except Exception as e:  # the admin API refused the users: no broker left behind
                self.stop()
                raise BrokerError(f"the broker did not take the SASL users: {e}") from e
            self.stop()
        raise BrokerError(f"the Kafka broker did not answer within {self.start_timeout:.0f} s; "
                          f"see {self.work_dir / LOG_FILE}")

    def _listeners(self) -> dict[str, bool]:
        """Which secured listeners this broker has (SECURED_PORT_OFFSETS' names)."""
        return {"sasl": bool(self.users), "sasl_ssl": bool(self.users) and self.tls_wanted,
                "ssl": self.tls_wanted, "mtls": self.mutual_tls}

    def _pick_ports(self) -> BrokerPorts:
        """Free ports; with a fixed `port`, the secured listeners at their offsets after it
        (refused, naming them, when one is taken)."""
        wanted = [name for name, on in self._listeners().items() if on]
        if not self.port:
            return BrokerPorts(free_port(), free_port(), **{n: free_port() for n in wanted})
        fixed = {n: self.port + SECURED_PORT_OFFSETS[n] for n in wanted}
        taken = [f"{p} ({n})" for n, p in fixed.items() if p > 65535 or not port_free(p)]
        if taken:
            raise BrokerError(f"127.0.0.1 port(s) {', '.join(taken)} after --port {self.port} "
                              "are taken or out of range; choose another port (0: any free)")
        return BrokerPorts(self.port, free_port(), **fixed)

    def _write_config(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log_dir = self.work_dir / f"data-{self.ports.broker}"
        config = self.work_dir / "server.properties"
        write_private(config, server_properties(self.ports, log_dir, self.users, self.tls))
        (self.work_dir / "log4j.properties").write_text(
            LOG4J.format(log=self.work_dir / LOG_FILE))
        return config

    def _format(self, classpath: str, config: Path) -> None:
        done = subprocess.run(
            _java(classpath, self.work_dir, STORAGE_TOOL, "format", "-t", random_cluster_id(),
                  "-c", str(config)),
            stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        if done.returncode != 0:
            raise BrokerError("formatting the broker's storage failed: "
                              + (done.stderr or done.stdout).decode("utf-8", "replace")[-800:])

    def _spawn(self, classpath: str, config: Path,
               detached: bool) -> "subprocess.Popen[bytes]":
        with open(self.work_dir / "stdout.log", "ab") as out:
            return subprocess.Popen(_java(classpath, self.work_dir, MAIN, str(config)),
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=detached)

    def _add_scram_users(self) -> bool:
        """The users' SCRAM-SHA-256 and -512 credentials (through the PLAINTEXT listener), then wait
        until a SCRAM login on the SASL listener works; True at once without users."""
        if not self.users:
            return True
        from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                           UserScramCredentialAlteration,
                                           UserScramCredentialUpsertion)

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
            # one request per mechanism: a request may alter a user's credentials only once
            info = ScramCredentialInfo(mechanism, 4096)
            upserts: list[UserScramCredentialAlteration] = [
                UserScramCredentialUpsertion(name, info, password.encode())
                for name, password in self.users.items()]
            for future in admin.alter_user_scram_credentials(upserts).values():
                future.result(30)
        name, password = next(iter(self.users.items()))
        scram = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                 "sasl.username": name, "sasl.password": password}
        deadline = time.monotonic() + self.start_timeout
        for _ in range(int(self.start_timeout / 0.2) + 1):
            if answers(self.sasl_bootstrap, timeout=2.0, settings=scram):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return False

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout
        for _ in range(int(self.start_timeout / 0.2) + 1):
            if self.process is None or self.process.poll() is not None:
                return False
            if answers(self.bootstrap, timeout=1.0):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return False

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL the broker (no shutdown: what it had not flushed is recovered from its log
        at the next start) and wait until it is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout)

    def restart(self, detached: bool = False) -> "KafkaBroker":
        """Start the broker again after `kill` or `stop`: the same ports (clients keep their
        bootstrap address) and the same data dir, which keeps its cluster id (no format)."""
        if self.process is not None and self.process.poll() is None:
            raise BrokerError(f"the broker at {self.bootstrap} is still running")
        config = self.work_dir / "server.properties"
        if not self.ports.broker or not config.is_file():
            raise BrokerError("the broker was never started here; start() it first")
        taken = [p for p in (self.ports.broker, self.ports.controller)
                 if not port_free(p, reuse=True)]
        if taken:
            raise BrokerError(f"127.0.0.1 port(s) {taken} of the broker are taken meanwhile")
        self.process = self._spawn(broker_classpath(), config, detached)
        if self._wait_ready():
            return self
        self.stop()
        raise BrokerError(f"the Kafka broker did not come back within "
                          f"{self.start_timeout:.0f} s; see {self.work_dir / LOG_FILE}")

    def stop(self, timeout: float = 20.0) -> None:
        p, self.process = self.process, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def record(self, secrets: list[str] | None = None) -> BrokerRecord:
        assert self.process is not None
        return BrokerRecord(self.process.pid, self.bootstrap, str(self.work_dir),
                            self.ports.secured(), list(secrets or []))

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def answers(bootstrap: str, timeout: float = 1.0,
            settings: Mapping[str, str] | None = None) -> bool:
    """Whether a broker at `bootstrap` answers a metadata request with itself as a broker
    (with the client `settings`, e.g. a SASL login)."""
    host, _, port = bootstrap.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError:
        return False
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(settings or {})})
    try:
        return bool(admin.list_topics(timeout=timeout).brokers)
    except Exception:  # KafkaException while the broker is still starting
        return False


# --- the detached broker of `elastiq kafka start|stop|status` ------------------------------

def write_record(state_dir: Path, record: BrokerRecord) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).write_text(json.dumps(asdict(record)) + "\n")


def read_record(state_dir: Path) -> BrokerRecord | None:
    try:
        return BrokerRecord(**json.loads((state_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def is_broker_process(pid: int) -> bool:
    """Whether `pid` is alive and is a Kafka broker (a pid can be reused after a reboot)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return MAIN.encode() in cmdline.split(b"\0")


def stop_detached(record: BrokerRecord, timeout: float = 20.0) -> bool:
    """SIGTERM the recorded broker, SIGKILL it after `timeout`; True if it was running."""
    if not is_broker_process(record.pid):
        return False
    os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.1) + 1):
        if not is_broker_process(record.pid) or _is_zombie(record.pid):
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    os.kill(record.pid, signal.SIGKILL)
    return True


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
