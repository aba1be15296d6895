"""A throwaway certificate authority and broker certificate for a test broker's TLS listener.

Owns making them with the JDK's `keytool` (the broker needs a JDK anyway; no new Python
dependency): a CA (`ca.p12`, its certificate also as `ca.pem`, what clients trust), and the
broker's key in `broker.p12` (PKCS12) with a certificate the CA signed for 127.0.0.1 and
localhost (subject alternative names, so Java's and librdkafka's host name checks pass). The
store password is random, handed to keytool through its environment (never a command line) and
returned to the caller, who writes it into the broker's 0600 `server.properties`. Valid for 7
days. For mutual TLS also a client's key in `client-NAME.p12` (PKCS12, its own random password)
with a certificate the same CA signed (`make_client_tls`), which a broker listener with
`ssl.client.auth=required` accepts. Does not own the broker's settings (`elastiq.kafka_broker`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_PASSWORD_ENV = "ELASTIQ_KEYSTORE_PASSWORD"
_CLIENT_PASSWORD_ENV = "ELASTIQ_CLIENT_KEYSTORE_PASSWORD"
VALID_DAYS = "7"
SUBJECT_ALT_NAMES = "SAN=ip:127.0.0.1,dns:localhost"


class TlsError(RuntimeError):
    """keytool is missing or failed; the message says which step and what it printed."""


@dataclass(frozen=True)
class BrokerTls:
    ca_pem: Path  # what a client trusts (ssl.truststore.type=PEM)
    keystore: Path  # the broker's PKCS12 key and certificate chain
    password: str  # the keystore's (and its key's) password; the CA's store has the same

    @property
    def ca_store(self) -> Path:
        return self.ca_pem.with_name("ca.p12")


@dataclass(frozen=True)
class ClientTls:
    keystore: Path  # a client's PKCS12 key and certificate chain, signed by the broker's CA
    password: str  # the keystore's (and its key's) password, not the CA's


def _keytool() -> str:
    keytool = shutil.which("keytool")
    if keytool is None:
        raise TlsError("no keytool on PATH (it comes with the JDK: apt-get install "
                       "openjdk-17-jdk-headless)")
    return keytool


def _run(steps: list[tuple[str, tuple[str, ...]]], env: dict[str, str]) -> None:
    keytool = _keytool()
    for what, args in steps:
        done = subprocess.run([keytool, *args], env={**os.environ, **env},
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode("utf-8", "replace")[-400:]
            raise TlsError(f"keytool could not make {what}: {said}")


def make_broker_tls(folder: Path) -> BrokerTls:
    """A new CA and a broker certificate it signed, in `folder` (mode 0700)."""
    _keytool()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    password = secrets.token_urlsafe(18)
    ca, broker = folder / "ca.p12", folder / "broker.p12"
    ca_pem, csr, crt = folder / "ca.pem", folder / "broker.csr", folder / "broker.crt"
    for path in (ca, broker, ca_pem, csr, crt):
        path.unlink(missing_ok=True)
    store = ("-storetype", "PKCS12", "-storepass:env", _PASSWORD_ENV)
    key = ("-keyalg", "RSA", "-keysize", "2048", "-validity", VALID_DAYS)
    steps: list[tuple[str, tuple[str, ...]]] = [
        ("the CA's key", ("-genkeypair", "-alias", "ca", *key, "-dname", "CN=elastiq-test-ca",
                          "-ext", "bc:c", "-keystore", str(ca), *store)),
        ("the CA's certificate", ("-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca),
                                  *store, "-file", str(ca_pem))),
        ("the broker's key", ("-genkeypair", "-alias", "broker", *key, "-dname", "CN=localhost",
                              "-keystore", str(broker), *store)),
        ("the broker's request", ("-certreq", "-alias", "broker", "-keystore", str(broker),
                                  *store, "-file", str(csr))),
        ("the broker's certificate", ("-gencert", "-rfc", "-alias", "ca", "-keystore", str(ca),
                                      *store, "-infile", str(csr), "-outfile", str(crt),
                                      "-validity", VALID_DAYS, "-ext", SUBJECT_ALT_NAMES)),
        ("the CA in the broker's store", ("-importcert", "-noprompt", "-alias", "ca", "-file",
                                          str(ca_pem), "-keystore", str(broker), *store)),
        ("the signed certificate", ("-importcert", "-alias", "broker", "-file", str(crt),
                                    "-keystore", str(broker), *store)),
    ]
    _run(steps, {_PASSWORD_ENV: password})
    return BrokerTls(ca_pem, broker, password)


def make_client_tls(tls: BrokerTls, name: str) -> ClientTls:
    """A client key and a certificate (CN=`name`) that the CA of `tls` signed, in a new PKCS12
    keystore `client-NAME.p12` beside the CA, for a listener that requires client certificates.
    `name` is a user name `elastiq.kafka_broker.check_users` accepted (nothing to quote)."""
    folder = tls.ca_pem.parent
    password = secrets.token_urlsafe(18)
    store, csr, crt = (folder / f"client-{name}.p12", folder / f"client-{name}.csr",
                       folder / f"client-{name}.crt")
    for path in (store, csr, crt):
        path.unlink(missing_ok=True)
    own = ("-storetype", "PKCS12", "-storepass:env", _CLIENT_PASSWORD_ENV)
    ca = ("-storetype", "PKCS12", "-storepass:env", _PASSWORD_ENV)
    steps: list[tuple[str, tuple[str, ...]]] = [
        ("the client's key", ("-genkeypair", "-alias", "client", "-keyalg", "RSA", "-keysize",
                              "2048", "-validity", VALID_DAYS, "-dname", f"CN={name}",
                              "-keystore", str(store), *own)),
        ("the client's request", ("-certreq", "-alias", "client", "-keystore", str(store),
                                  *own, "-file", str(csr))),
        ("the client's certificate", ("-gencert", "-rfc", "-alias", "ca", "-keystore",
                                      str(tls.ca_store), *ca, "-infile", str(csr), "-outfile",
                                      str(crt), "-validity", VALID_DAYS)),
        ("the CA in the client's store", ("-importcert", "-noprompt", "-alias", "ca", "-file",
                                          str(tls.ca_pem), "-keystore", str(store), *own)),
        ("the client's signed certificate", ("-importcert", "-alias", "client", "-file",
                                             str(crt), "-keystore", str(store), *own)),
    ]
    _run(steps, {_PASSWORD_ENV: tls.password, _CLIENT_PASSWORD_ENV: password})
    store.chmod(0o600)
    return ClientTls(store, password)
