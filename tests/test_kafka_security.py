"""One security file for every Kafka client (pure): a Java client's properties file read as
Java reads it, and translated for librdkafka (the sink and the start check).

`common.kafka_params`: the properties syntax (separators, comments, continuation lines,
escapes, trimming, the line each setting starts on), the translation (the username and password
of a PlainLoginModule or ScramLoginModule entry of `sasl.jaas.config`, a PEM truststore),
located refusals of everything else, an attacker's jaas strings (refused, or read as the literal
password they are, never as another option or module), and a seeded fuzz of hostile files:
only a `KafkaParamError` comes out, never a crash, and a refusal never repeats a password.
`elastiq.kafka_broker`'s client file is read back to the same login.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.kafka_params import (MAX_SECURITY_FILE_CHARS, PLAIN_MODULE, SCRAM_MODULE,
                                 KafkaParamError, librdkafka_security, parse_jaas_login,
                                 security_properties)

SECRET = "S3cr3t-pw"


def translate(text: str, origin: str = "c.properties") -> dict[str, str]:
    return librdkafka_security(security_properties(text, origin), origin)


def jaas(module: str = SCRAM_MODULE, user: str = "alice", password: str = SECRET) -> str:
    return f'{module} required username="{user}" password="{password}";'


def test_the_properties_syntax_is_javas() -> None:
    text = ("# a comment\n! another\n\nsecurity.protocol = SASL_SSL  \n"
            "sasl.mechanism:PLAIN\nssl.truststore.type PEM\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n"
            "    required username=\"u\" \\\n    password=\"p\\u00e9\";\n"
            "ssl.truststore.location=/etc/ca\\\\x.pem\nsasl.mechanism=PLAIN\n")
    found = {s.key: (s.value, s.line) for s in security_properties(text, "c")}
    assert found == {
        "security.protocol": ("SASL_SSL", 4), "ssl.truststore.type": ("PEM", 6),
        "sasl.jaas.config": (f'{PLAIN_MODULE} required username="u" password="pé";', 7),
        "ssl.truststore.location": ("/etc/ca\\x.pem", 10), "sasl.mechanism": ("PLAIN", 11)}


def test_security_settings_only_pass_security_keys_located() -> None:
    for bad, line in (("bootstrap.servers=evil:9092\n", 1), ("# c\nsecurity.protocol\n", 2),
                      ("=x\n", 1), ("ssl.a=1\nssl.b=\\u12\n", 2),
                      ("security.protocol=X\\\n  bootstrap.servers=y\ngroup.id=z\n", 3)):
        with pytest.raises(KafkaParamError, match=f"c.properties:{line}: "):
            security_properties(bad, "c.properties")
    with pytest.raises(KafkaParamError, match="at most"):
        security_properties("ssl.x=1\n" * (MAX_SECURITY_FILE_CHARS // 8 + 1), "c.properties")
    with pytest.raises(KafkaParamError, match="c.properties:1: the value of 'ssl.x'"):
        security_properties("ssl.x=" + "a" * 9000, "c.properties")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_scram_login_becomes_librdkafkas_username_and_password(mechanism: str) -> None:
    in_file = r'a\\\\b\\\"c d;e'  # escaped for the properties file, then for JAAS
    text = (f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism={mechanism}\n"
            f"sasl.jaas.config={jaas(password=in_file)}\n"
            "sasl.login.refresh.window.factor=0.8\nssl.endpoint.identification.algorithm=\n")
    assert translate(text) == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
        "sasl.username": "alice", "sasl.password": 'a\\b"c d;e',
        "ssl.endpoint.identification.algorithm": "none"}


def test_a_pem_truststore_becomes_the_ca_location_and_other_stores_are_refused() -> None:
    pem = "security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location=/ca.pem\n"
    assert translate(pem) == {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem"}
    with pytest.raises(KafkaParamError, match=r"c.properties:2: .* only as PEM"):
        translate("security.protocol=SSL\nssl.truststore.location=/ts.jks\n"
                  "ssl.truststore.password=x\n")
    with pytest.raises(KafkaParamError, match=r"c.properties:1: .* only as PKCS12"):
        translate("ssl.keystore.location=/ks.jks\n")


@pytest.mark.parametrize(("text", "match"), [
    (f"sasl.jaas.config={jaas()}\n", "needs sasl.mechanism=SCRAM-SHA-256 or SCRAM-SHA-512"),
    (f"sasl.mechanism=PLAIN\nsasl.jaas.config={jaas()}\n", "c.properties:2: ScramLoginModule"),
    ("sasl.username=alice\n", "sasl.jaas.config"),
    ("ssl.ca.location=/ca.pem\n", "ssl.truststore.type=PEM"),
    ("sasl.client.callback.handler.class=com.evil.Handler\n", "remove it"),
    ("sasl.login.class=com.evil.Login\n", "remove it"),
])
def test_what_librdkafka_cannot_take_is_refused_with_its_line(text: str, match: str) -> None:
    with pytest.raises(KafkaParamError, match=match) as caught:
        translate(text)
    assert str(caught.value).startswith("c.properties:")


ATTACKS = [
    # another module after the first, or instead of it
    jaas() + " com.sun.security.auth.module.Krb5LoginModule required;",
    jaas() + "\n" + jaas(),
    "com.sun.security.auth.module.JndiLoginModule required user.provider.url=\"ldap://x\";",
    f'{SCRAM_MODULE} optional username="a" password="{SECRET}";',
    # an extra option, with or without quotes, before and after the credentials
    f'{SCRAM_MODULE} required username="a" password="{SECRET}" tokenauth="true";',
    f'{SCRAM_MODULE} required serviceName="kafka" username="a" password="{SECRET}";',
    f'{SCRAM_MODULE} required username=a password="{SECRET}";',
    f'{SCRAM_MODULE} required username="a" username="b" password="{SECRET}";',
    f'{SCRAM_MODULE} required username="a";',
    f'{SCRAM_MODULE} required username="a" password="{SECRET}"',
    # escapes and characters that might end the value early in some reader
    f'{SCRAM_MODULE} required username="a" password="{SECRET}\\n";',
    f'{SCRAM_MODULE} required username="a" password="{SECRET}\x00";',
    f'{SCRAM_MODULE} required username="a" password="{SECRET}',
    f'{SCRAM_MODULE} required username="a" password="{SECRET}\\";',
    "${jndi:ldap://evil/x} required;",
    "",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attackers_jaas_string_is_refused_without_repeating_the_password(
        attack: str) -> None:
    with pytest.raises(KafkaParamError) as caught:
        parse_jaas_login(attack, "c.properties:3")
    message = str(caught.value)
    assert message.startswith("c.properties:3: sasl.jaas.config ")
    assert SECRET not in message


def test_an_injection_inside_the_quotes_is_only_a_literal_password() -> None:
    for password in ('x\\" serviceName=\\"kafka', 'x; com.evil.M required foo=\\"y',
                     "${jndi:ldap://evil/x}"):
        login = parse_jaas_login(f'{PLAIN_MODULE} required username="u" '
                                 f'password="{password}";', "f:1")
        assert login.username == "u"
        assert login.password == password.replace('\\"', '"')


FRAGMENTS = ["security.protocol", "sasl.mechanism", "sasl.jaas.config", "ssl.truststore.type",
             "ssl.truststore.location", "bootstrap.servers", "=", ":", " ", "\t", "\\", "\\\\",
             '"', '\\"', ";", "\n", "\\\n", "#", "!", "\\u0041", "\\u00", "\x00", "é", "\u2028",
             PLAIN_MODULE, SCRAM_MODULE, " required ", "optional", "username=", "password=",
             '"u"', f'"{SECRET}"', "PLAIN", "SCRAM-SHA-256", "PEM", "SASL_PLAINTEXT",
             "com.evil.Module required;", "x" * 5000, "${jndi:ldap://e/}"]


def hostile_file(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(0, 6)):
        if rng.random() < 0.5:  # near-valid lines, mutated
            lines.append(rng.choice([
                "security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
                f"sasl.jaas.config={jaas(PLAIN_MODULE)}", "ssl.truststore.type=PEM"]))
            if rng.random() < 0.7:
                i = rng.randint(0, len(lines[-1]))
                lines[-1] = lines[-1][:i] + rng.choice(FRAGMENTS) + lines[-1][i:]
        else:
            lines.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 8))))
    return "\n".join(lines)


def test_a_seeded_fuzz_of_hostile_files_is_refused_or_harmless() -> None:
    rng = random.Random(30)
    outcomes = {"refused": 0, "accepted": 0, "logins": 0}
    for _ in range(3000):
        text = hostile_file(rng)
        try:
            settings = translate(text, "f.properties")
        except KafkaParamError as exc:
            outcomes["refused"] += 1
            assert str(exc).startswith("f.properties"), exc
            continue
        outcomes["accepted"] += 1
        allowed = {"security.protocol", "sasl.mechanism", "sasl.username", "sasl.password",
                   "ssl.ca.location", "ssl.ca.pem", "ssl.endpoint.identification.algorithm"}
        assert set(settings) <= allowed, settings
        if "sasl.username" in settings:
            outcomes["logins"] += 1
            assert settings["sasl.mechanism"] in ("PLAIN", "SCRAM-SHA-256")
    assert min(outcomes.values()) > 0, outcomes  # the fuzz reaches every outcome


def test_the_test_brokers_client_file_reads_back_to_its_login(tmp_path: Path) -> None:
    from elastiq.kafka_broker import client_properties

    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        text = client_properties("alice", "pw-0123456789", mechanism)
        assert translate(text) == {
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": "alice", "sasl.password": "pw-0123456789"}


def test_a_security_file_is_read_for_both_clients_and_a_huge_one_is_refused(
        tmp_path: Path) -> None:
    from executor.kafka_io import read_security_file

    path = tmp_path / "c.properties"
    path.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    f"sasl.jaas.config={jaas(PLAIN_MODULE)}\n")
    read = read_security_file(str(path))
    assert dict(read.java)["sasl.jaas.config"] == jaas(PLAIN_MODULE)
    assert dict(read.librdkafka)["sasl.password"] == SECRET
    path.write_text("ssl.x=1\n" * 100_000)
    with pytest.raises(KafkaParamError, match="at most"):
        read_security_file(str(path))


def test_the_test_brokers_sasl_and_tls_listeners_and_users(tmp_path: Path) -> None:
    from elastiq.kafka_broker import BrokerError, BrokerPorts, check_users, server_properties
    from elastiq.kafka_tls import BrokerTls

    tls = BrokerTls(tmp_path / "ca.pem", tmp_path / "broker.p12", "store-pw")
    text = server_properties(BrokerPorts(1, 2, 3, 4), tmp_path, {"alice": "pw-0123456789"}, tls)
    settings = dict(line.split("=", 1) for line in text.splitlines())
    assert settings["listeners"] == ("PLAINTEXT://127.0.0.1:1,SASL_PLAINTEXT://127.0.0.1:3,"
                                     "SASL_SSL://127.0.0.1:4,CONTROLLER://127.0.0.1:2")
    assert settings["listener.name.sasl_ssl.plain.sasl.jaas.config"] == (
        f'{PLAIN_MODULE} required user_alice="pw-0123456789";')
    assert settings["ssl.keystore.location"] == str(tmp_path / "broker.p12")
    plain = server_properties(BrokerPorts(1, 2), tmp_path)
    assert "SASL" not in plain and "alice" not in plain
    for name, password in (('a"b', "pw-0123456789"), ("alice", 'pw" user_x="y'),
                           ("alice", "short")):
        with pytest.raises(BrokerError, match="SASL user"):
            check_users({name: password})
