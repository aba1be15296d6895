"""`elastiq kafka start`'s secured-broker options (pure: no broker starts here).

Every bad option is reported at once, each located (the option and its position, or FILE:LINE
of the users file), never repeating a password; a users file must be owner-only; hostile user
names (quotes, JAAS and properties injections, newlines, terminal escapes) are refused escaped
and cut short, and a seeded fuzz checks that whatever is accepted writes a client file that
reads back (Java's syntax, then librdkafka's translation) to exactly that user and password.
The generated passwords' file is a valid users file. `stop` removes only files inside the state
folder. Also the broker's SSL, MTLS and SCRAM-SHA-512 settings.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.kafka_params import librdkafka_security, security_properties
from elastiq.kafka_dev_security import (SecuredStart, parse_users_file, plan_secured_start,
                                        write_client_files)

HOSTILE = ['a"b', "alice\nsasl.jaas.config=x", 'x" user_admin="pw', "a;b", "a b", "",
           "\x1b[2J\x1b[31mred", "../../etc/passwd", "ümlaut", "x" * 65, "a=b", "a\\", "a\0b",
           "a\rb", '"; com.evil.M required;']


def translate(path: Path) -> dict[str, str]:
    text = path.read_text()
    return librdkafka_security(security_properties(text, str(path)), str(path))


def private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_every_bad_option_is_reported_at_once_and_located(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from elastiq.cli import main

    users = private(tmp_path / "users", "bob=pw-0123456789\nnot a line\nok=short\n", 0o644)
    state = tmp_path / "k"
    code = main(["kafka", "--dir", str(state), "start", "--port", "70000", "--user", "a b",
                 "--user", "carol", "--user", "carol", "--users-file", str(users),
                 "--mechanism", "MD5"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err == [
        "elastiq kafka start: --port 70000: a port is 1-65535 (0: any free one)",
        "elastiq kafka start: --user #1 'a b': a name is 1-64 letters, digits, '_' or '-'",
        "elastiq kafka start: --user #3 'carol': named twice",
        f"elastiq kafka start: --users-file {users}: mode 0644 lets others read or change it; "
        f"make it owner-only: chmod 600 {users}",
        "elastiq kafka start: --mechanism 'MD5': one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"]
    assert not state.exists()  # nothing started, nothing written


def test_a_users_file_is_read_with_its_lines_and_never_repeats_a_password(
        tmp_path: Path) -> None:
    text = ("# users\nalice=pw-0123456789\n\nalice=pw-secret-one\nbob\n"
            "x y=pw-0123456789\ncarol=short-\ncarol2=pw with blanks\n")
    users, problems = parse_users_file(text, "u.txt")
    assert users == {"alice": ("pw-0123456789", 2)}
    assert problems == [
        "u.txt:4: user 'alice' again (first on line 2)",
        "u.txt:5: expected NAME=PASSWORD",
        "u.txt:6: user 'x y': a name is 1-64 letters, digits, '_' or '-'",
        "u.txt:7: the password of user 'carol': a password is 8-128 letters, digits, '_', '-', "
        "'.', '~', '+', '/' or '='",
        "u.txt:8: the password of user 'carol2': a password is 8-128 letters, digits, '_', '-', "
        "'.', '~', '+', '/' or '='"]
    assert not any("secret" in p or "short" in p or "blanks" in p for p in problems)
    link = tmp_path / "link"
    link.symlink_to(private(tmp_path / "real", "alice=pw-0123456789\n"))
    for path, why in ((link, "cannot open it"), (tmp_path / "none", "cannot open it"),
                      (private(tmp_path / "empty", "# nobody\n"), "names no user")):
        start, problems = plan_secured_start([], path, None, False, 0)
        assert start is None and len(problems) == 1 and why in problems[0], problems


def test_both_sources_of_users_and_the_generated_passwords_file_reads_back(
        tmp_path: Path) -> None:
    users = private(tmp_path / "users", "alice=pw-0123456789\n")
    start, problems = plan_secured_start(["bob", "alice"], users, None, True, 0)
    assert start is None and problems == [
        f"--user 'alice': also in {users}:1; name a user once (the file's has a password)"]
    assert plan_secured_start([], None, None, False, 0, mutual_tls=True)[1] == [
        "--mutual-tls: needs --tls (the client certificate is signed by the CA --tls makes)"]
    start, problems = plan_secured_start(["bob"], users, "SCRAM-SHA-512", True, 9092,
                                         new_password=lambda: "generated-pw-1")
    assert problems == [] and start == SecuredStart(
        {"alice": "pw-0123456789", "bob": "generated-pw-1"}, ("bob",), "SCRAM-SHA-512", True)
    ca = tmp_path / "ca.pem"
    files = write_client_files(tmp_path / "state", start, ca)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files.paths())
    assert files.passwords is not None
    again, problems = plan_secured_start([], files.passwords, None, False, 0)
    assert problems == [] and again is not None and again.users == {"bob": "generated-pw-1"}
    assert translate(files.clients["bob"]) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "bob", "sasl.password": "generated-pw-1", "ssl.ca.location": str(ca)}
    assert translate(files.clients["tls"]) == {"security.protocol": "SSL",
                                               "ssl.ca.location": str(ca)}
    assert plan_secured_start([], None, "PLAIN", True, 0)[1] == [
        "--mechanism PLAIN: without users (--user, --users-file) the broker has no SASL "
        "listener"]


def test_hostile_user_names_are_refused_escaped_and_a_fuzz_reads_back_what_is_accepted(
        tmp_path: Path) -> None:
    for i, name in enumerate(HOSTILE):
        start, problems = plan_secured_start([name], None, None, False, 0)
        assert start is None and len(problems) == 1, (name, problems)
        assert "\n" not in problems[0] and "\x1b" not in problems[0] and "\r" not in problems[0]
        assert len(problems[0]) < 160, problems[0]
        single = name.split("\n")[0].split("\r")[0]  # a users file line ends at a line break
        if single.partition("=")[0] in ("alice", "a"):  # a valid name once cut there
            continue
        users, problems = parse_users_file(f"# {i}\n{single}=pw-0123456789\n", "u")
        assert users == {} and problems, single
        assert all(p.startswith("u:2: ") and "\x1b" not in p and "pw-0123456789" not in p
                   for p in problems), problems
    rng = random.Random(30)
    alphabet = "ab_-Z9\"';= \\\n\x1b{}$#.:/é\0"
    accepted = 0
    for n in range(400):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        start, problems = plan_secured_start([name], None, rng.choice([None, "PLAIN"]),
                                             bool(n % 2), 0, new_password=lambda: "pw-01234567")
        if start is None:
            assert problems and all("\n" not in p and "\x1b" not in p for p in problems)
            continue
        accepted += 1
        files = write_client_files(tmp_path / f"s{n}", start, tmp_path / "ca.pem")
        settings = translate(files.clients[name])
        assert (settings["sasl.username"], settings["sasl.password"]) == (name, "pw-01234567")
    assert 0 < accepted < 400


def test_stop_removes_only_the_files_start_wrote_inside_its_folder(tmp_path: Path) -> None:
    from elastiq.kafka_cli import remove_secrets

    state = tmp_path / "k"
    (state / "broker" / "tls").mkdir(parents=True)
    inside, outside = private(state / "passwords", "a=b"), private(tmp_path / "mine", "keep")
    assert remove_secrets(state, [str(inside), str(state / "broker" / "tls"), str(outside),
                                  str(state / ".." / "mine"), "passwords"]) == [
        str(inside), str(state / "broker" / "tls")]
    assert outside.exists() and not inside.exists()


def test_a_mutual_tls_file_gives_librdkafka_the_pkcs12_keystore_and_a_jks_one_is_refused(
        tmp_path: Path) -> None:
    from common.kafka_params import KafkaParamError
    from elastiq.kafka_broker import tls_client_properties
    from elastiq.kafka_tls import ClientTls

    ca, store = tmp_path / "ca.pem", tmp_path / "client.p12"
    path = private(tmp_path / "mtls.properties",
                   tls_client_properties(ca, ClientTls(store, "store-pw-1")))
    assert translate(path) == {
        "security.protocol": "SSL", "ssl.ca.location": str(ca),
        "ssl.keystore.location": str(store), "ssl.keystore.password": "store-pw-1",
        "ssl.key.password": "store-pw-1"}
    path.write_text(path.read_text().replace("=PKCS12", "=JKS"))
    with pytest.raises(KafkaParamError, match=r"mtls.properties:4: .* only as PKCS12: .*"
                       r"keytool -importkeystore"):
        translate(path)


def test_the_brokers_ssl_mtls_and_scram_512_settings(tmp_path: Path) -> None:
    from elastiq.kafka_broker import BrokerPorts, server_properties
    from elastiq.kafka_tls import BrokerTls

    tls = BrokerTls(tmp_path / "ca.pem", tmp_path / "broker.p12", "store-pw")
    ports = BrokerPorts(1, 2, 3, 0, ssl=5, mtls=6)
    text = server_properties(ports, tmp_path, {"alice": "pw-0123456789"}, tls)
    settings = dict(line.split("=", 1) for line in text.splitlines())
    assert settings["listeners"] == ("PLAINTEXT://127.0.0.1:1,SASL_PLAINTEXT://127.0.0.1:3,"
                                     "SSL://127.0.0.1:5,MTLS://127.0.0.1:6,"
                                     "CONTROLLER://127.0.0.1:2")
    assert settings["listener.security.protocol.map"].endswith(",SSL:SSL,MTLS:SSL")
    assert settings["listener.name.mtls.ssl.client.auth"] == "required"
    assert settings["listener.name.mtls.ssl.truststore.location"] == str(tls.ca_pem)
    assert "ssl.client.auth" not in settings  # the SSL listener takes any client
    assert settings["sasl.enabled.mechanisms"] == "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    assert "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config" in settings
    assert ports.secured() == {"sasl": "127.0.0.1:3", "ssl": "127.0.0.1:5",
                               "mtls": "127.0.0.1:6"}
