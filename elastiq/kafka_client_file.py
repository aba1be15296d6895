"""The security file of `elastiq kafka produce|consume` (`--security-file FILE`).

Owns reading the Java client properties file a person names on the command line (the same form
`security-file=` takes on a `kafka-source` or `kafka-sink`, and that `elastiq kafka start`
writes): at most a few settings' size, a regular file, UTF-8; the settings read by the same
pure functions as the operators' (`common.kafka_params.security_properties`, then
`librdkafka_security` for the Python client), so the same keys are allowed (`security.`,
`sasl.`, `ssl.`) and the same refusals come out, located `FILE:LINE`, never repeating a value.
Also which address to use when `--bootstrap` is not given (the started broker's listener for
the file's `security.protocol`), the client's configuration (our own keys last: a file can set
no broker, group or isolation), and the command line's wording of the broker's refusals. Does
not own the commands (`elastiq.kafka_cli`) or the broker's check (`executor.kafka_io`).

No path-root confinement: the file is named on the person's own command line (as
`--users-file` is), not by a spec that may come from someone else.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Mapping

from common.kafka_params import (MAX_SECURITY_FILE_CHARS, KafkaParamError, librdkafka_security,
                                 parse_bootstrap, security_properties)
from elastiq.kafka_dev_security import LISTENER_LABELS

MAX_FILE_BYTES = 4 * MAX_SECURITY_FILE_CHARS  # UTF-8: at most 4 bytes a character

# security.protocol -> the listener of `elastiq kafka start`'s record that speaks it.
LISTENERS = {"SASL_PLAINTEXT": "sasl", "SASL_SSL": "sasl_ssl", "SSL": "ssl"}
START_HINTS = {"sasl": "--user NAME", "sasl_ssl": "--user NAME --tls", "ssl": "--tls",
               "mtls": "--tls --mutual-tls"}


class ClientFileError(ValueError):
    """A security file or option `produce`/`consume` cannot use; the message says where."""


def read_text(path: Path) -> str:
    """The file's text: a regular file (a FIFO or device is refused, never waited on), UTF-8,
    read only up to what a security file may hold."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ClientFileError(f"--security-file {path}: cannot open it: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ClientFileError(f"--security-file {path}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ClientFileError(f"--security-file {path}: not UTF-8 text") from None


def client_security(text: str, origin: str) -> dict[str, str]:
    """The file's settings for librdkafka (pure): Java's syntax, only security keys, translated
    as for the sink and the start check; KafkaParamError located `origin:LINE` otherwise."""
    return librdkafka_security(security_properties(text, origin), origin)


def read_client_security(path: Path) -> dict[str, str]:
    """`client_security` of the file at `path`; ClientFileError with the reason."""
    text = read_text(path)
    try:
        return client_security(text, str(path))
    except KafkaParamError as e:
        raise ClientFileError(str(e)) from None


def listener_of(security: Mapping[str, str]) -> str | None:
    """The listener name of the started broker's record a client with `security` uses (pure):
    None for PLAINTEXT (the record's own bootstrap); SSL with a keystore is the MTLS one."""
    protocol = security.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol == "SSL" and "ssl.keystore.location" in security:
        return "mtls"
    return LISTENERS.get(protocol)


def default_bootstrap(plain: str, secured: Mapping[str, str],
                      security: Mapping[str, str]) -> str:
    """The address of the started broker (`plain`, its listeners `secured`) for a client with
    `security` (pure); ClientFileError when the broker has no such listener."""
    listener = listener_of(security)
    if listener is None:
        if security.get("security.protocol", "PLAINTEXT").strip().upper() != "PLAINTEXT":
            raise ClientFileError(
                f"security.protocol={security['security.protocol'][:40]!r}: not one the "
                "started broker has; pass --bootstrap")
        return plain
    if listener not in secured:
        raise ClientFileError(
            f"the started broker has no {LISTENER_LABELS[listener]} listener for the file's "
            f"security.protocol: start it with {START_HINTS[listener]} (elastiq kafka stop, "
            "then elastiq kafka start ...), or pass --bootstrap")
    return secured[listener]


def checked_bootstrap(text: str) -> str:
    try:
        return parse_bootstrap(text)
    except KafkaParamError as e:
        raise ClientFileError(f"--bootstrap {e}") from None


def client_config(bootstrap: str, security: Mapping[str, str],
                  own: Mapping[str, Any]) -> dict[str, Any]:
    """The client's configuration (pure): the file's settings, then the bootstrap and the
    command's own settings, which win (the translation never yields them either)."""
    return {**security, "log_level": 0, "bootstrap.servers": bootstrap, **own}


# The operators' wording of a refusal, and the command line's.
_CLI_WORDS = (("the file given as security-file=", "the file given as --security-file"),
              ("is bootstrap= right?", "is --bootstrap right?"))


def cli_words(reason: str) -> str:
    """A start check's reason (`executor.kafka_io.check_broker`) in the command line's terms
    (pure): its options instead of the operators' parameters."""
    for operator_words, command_words in _CLI_WORDS:
        reason = reason.replace(operator_words, command_words)
    return reason
