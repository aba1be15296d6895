"""The Kafka operators' parameter decisions, shared by the validator and the runtime (pure).

Owns what a `kafka-source`'s and a `kafka-sink`'s parameters may say: a bootstrap list of
HOST:PORT, topic names (Kafka's legal characters), starting offsets (`earliest`, `latest`, or a
per-partition JSON object `{"topic": {"0": 42}}` with -2 for earliest and -1 for latest, as
Spark takes it), the metadata columns (which record field fills which declared column, and the
column type each needs), reading the security settings from a properties file (only `security.`,
`sasl.` and `ssl.` keys: the file cannot redirect the query to another broker or change how
records are read), and the transactional id of a sink. Does not own the catalogue
(`compiler.operators`), Spark options (`executor.kafka_io`) or files beyond reading the
properties text it is given.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Mapping

from common.types import ColumnType

MAX_TOPIC_CHARS = 249  # Kafka's limit
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")
_HOST_PORT = re.compile(r"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):([0-9]{1,5})\Z")
SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")

# Metadata column parameters of a kafka-source: parameter -> (record field, the column's type).
METADATA_COLUMNS: dict[str, tuple[str, ColumnType]] = {
    "key-column": ("key", ColumnType.STRING),
    "topic-column": ("topic", ColumnType.STRING),
    "partition-column": ("partition", ColumnType.INT),
    "offset-column": ("offset", ColumnType.INT),
    "timestamp-column": ("timestamp", ColumnType.TIMESTAMP),
}


class KafkaParamError(ValueError):
    """A Kafka parameter value that cannot be used; the message says what to write."""


def parse_bootstrap(text: str) -> str:
    """'HOST:PORT[,HOST:PORT...]' with ports 1-65535, spaces removed."""
    parts = [p.strip() for p in text.split(",")]
    for part in parts:
        m = _HOST_PORT.match(part)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise KafkaParamError(f"'{part}' is not HOST:PORT; write e.g. 127.0.0.1:9092 "
                                  "(several separated by commas)")
    return ",".join(parts)


def parse_topics(text: str) -> tuple[str, ...]:
    """A comma-separated list of topic names, each of Kafka's legal characters."""
    topics = tuple(t.strip() for t in text.split(","))
    for topic in topics:
        check_topic(topic)
    if len(set(topics)) != len(topics):
        raise KafkaParamError(f"'{text}' names a topic twice")
    return topics


def check_topic(topic: str) -> str:
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise KafkaParamError(f"'{topic[:60]}' is not a Kafka topic name (1-{MAX_TOPIC_CHARS} "
                              "letters, digits, '.', '_' or '-')")
    return topic


def parse_starting_offsets(text: str, topics: tuple[str, ...] = ()) -> str:
    """'earliest', 'latest', or a JSON object topic -> {partition: offset} (offset >= 0, or -2
    earliest, -1 latest); with `topics`, every topic named must be one the source reads.
    Returns the canonical text Spark takes."""
    stripped = text.strip()
    if stripped in ("earliest", "latest"):
        return stripped
    try:
        value = json.loads(stripped)
    except ValueError:
        raise KafkaParamError(f"'{stripped[:60]}' is neither earliest, latest nor a JSON object "
                              'such as {"readings": {"0": 42, "1": -2}}') from None
    if not isinstance(value, dict) or not value:
        raise KafkaParamError('per-partition offsets are a JSON object such as '
                              '{"readings": {"0": 42, "1": -2}}')
    canonical: dict[str, dict[str, int]] = {}
    for topic, partitions in value.items():
        check_topic(str(topic))
        if topics and topic not in topics:
            raise KafkaParamError(f"starting offsets name topic '{topic}', which the source "
                                  f"does not read ({', '.join(topics)})")
        if not isinstance(partitions, dict) or not partitions:
            raise KafkaParamError(f"the offsets of '{topic}' are an object partition -> offset")
        canonical[topic] = {}
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or int(partition) > 1_000_000:
                raise KafkaParamError(f"'{partition}' is not a partition number of '{topic}'")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2 \
                    or offset >= 2**63:
                raise KafkaParamError(f"offset {offset!r} of {topic}/{partition} is not a whole "
                                      "number >= 0 (or -2 earliest, -1 latest)")
            canonical[topic][str(int(partition))] = offset
    return json.dumps(canonical, sort_keys=True, separators=(",", ":"))


def metadata_type_problem(parameter: str, column_type: ColumnType) -> str | None:
    """Why a declared column of `column_type` cannot hold the record field `parameter` names."""
    field, needed = METADATA_COLUMNS[parameter]
    if column_type is needed:
        return None
    return f"the record's {field} is {needed.value}, the column is {column_type.value}"


MAX_SECURITY_FILE_CHARS = 65536  # a properties file of a few settings; more is refused
MAX_SECURITY_VALUE_CHARS = 8192  # an inline PEM certificate fits, a runaway value does not


@dataclass(frozen=True)
class SecuritySetting:
    """One `key=value` of a security file, with the line it starts on (for located errors)."""

    key: str
    value: str
    line: int


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Java properties' logical lines with their first physical line's number: a line ending
    in an odd number of backslashes continues on the next (leading blanks dropped)."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip() if pending is not None else raw
        if pending is None and line.strip().startswith(("#", "!")):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        continues = trailing % 2 == 1
        body = line[:-1] if continues else line
        pending = (number, body) if pending is None else (pending[0], pending[1] + body)
        if not continues:
            out.append(pending)
            pending = None
    if pending is not None:
        out.append(pending)
    return out


_JAVA_TRIMMED = "".join(chr(c) for c in range(33))  # what Java's String.trim() removes
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str, where: str) -> str:
    """Java properties' escapes: \\t \\n \\r \\f, \\u and four hex digits, and \\c -> c for
    any other c."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 >= len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2:i + 6]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise KafkaParamError(f"{where}: a \\u escape needs 4 hex digits")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split_property(line: str) -> tuple[str, str, bool]:
    """(key, value, separated) of a logical line: the key ends at the first unescaped '=', ':'
    or blank (Java properties); `separated` is False for a key with nothing after it."""
    line = line.strip()
    i = 0
    while i < len(line) and line[i] not in "=: \t\f":
        i += 2 if line[i] == "\\" else 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    separated = bool(rest) or i < len(line)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest, separated


def security_properties(text: str, origin: str) -> list[SecuritySetting]:
    """The settings of a security properties file as Java's `Properties.load` reads it
    (`key=value`, `key: value` or `key value`; '#'/'!' comments; backslash continuation lines
    and escapes), each with its line: only keys starting with security., sasl. or ssl.;
    anything else is refused with its line. A key given twice: the last one counts (Java)."""
    if len(text) > MAX_SECURITY_FILE_CHARS:
        raise KafkaParamError(f"{origin}: {len(text)} characters; a security file holds a few "
                              f"settings (at most {MAX_SECURITY_FILE_CHARS} characters)")
    found: dict[str, SecuritySetting] = {}
    for number, line in _logical_lines(text):
        if not line.strip():
            continue
        where = f"{origin}:{number}"
        raw_key, raw_value, separated = _split_property(line)
        key = _unescape(raw_key, where)
        if not key or not separated:
            raise KafkaParamError(f"{where}: expected key=value")
        if not key.startswith(SECURITY_PREFIXES):
            raise KafkaParamError(f"{where}: '{key[:80]}' is not a security setting "
                                  f"(allowed: {', '.join(p + '*' for p in SECURITY_PREFIXES)})")
        value = _unescape(raw_value, where).strip(_JAVA_TRIMMED)  # Kafka's ConfigDef trims
        if len(value) > MAX_SECURITY_VALUE_CHARS:
            raise KafkaParamError(f"{where}: the value of '{key}' is {len(value)} characters "
                                  f"long (at most {MAX_SECURITY_VALUE_CHARS})")
        found.pop(key, None)
        found[key] = SecuritySetting(key, value, number)
    return list(found.values())


# --- the same file for librdkafka (the sink and the start check) ---------------------------

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_MODULE_MECHANISMS = {PLAIN_MODULE: ("PLAIN",),
                      SCRAM_MODULE: ("SCRAM-SHA-256", "SCRAM-SHA-512")}
# Java keys librdkafka takes under the same name with the same meaning.
_SAME_KEYS = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.kerberos.service.name", "ssl.key.password",
    "ssl.cipher.suites", "ssl.keystore.location", "ssl.keystore.password"})
# Java-only keys with no bearing on which broker is trusted or who logs in (tuning of Java's
# own login and TLS machinery): left to Java's client, not given to librdkafka.
_JAVA_ONLY_KEYS = frozenset({
    "ssl.protocol", "ssl.enabled.protocols", "ssl.truststore.password", "ssl.provider",
    "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm",
    "ssl.secure.random.implementation"})
_JAVA_ONLY_PREFIXES = ("sasl.login.refresh.", "sasl.login.retry.backoff.")
_TRANSLATED = frozenset({"sasl.jaas.config", "ssl.truststore.location", "ssl.truststore.type",
                         "ssl.keystore.type", "ssl.truststore.certificates",
                         "ssl.endpoint.identification.algorithm"})
# librdkafka's own keys, which Java's client (Spark's source) would not understand.
_JAVA_FORM = {
    "sasl.username": "give the user in sasl.jaas.config (username=\"...\")",
    "sasl.password": "give the password in sasl.jaas.config (password=\"...\")",
    "sasl.mechanisms": "write sasl.mechanism",
    "ssl.ca.location": "write ssl.truststore.type=PEM and ssl.truststore.location",
    "ssl.ca.pem": "write ssl.truststore.type=PEM and ssl.truststore.certificates",
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.$]*")
MAX_JAAS_OPTIONS = 8


@dataclass(frozen=True)
class JaasLogin:
    """A JAAS line's login: which module, and its username and password options."""

    module: str
    username: str
    password: str


def _jaas_refusal(where: str, why: str) -> KafkaParamError:
    return KafkaParamError(
        f"{where}: sasl.jaas.config {why}; the sink and the start check (librdkafka) take only "
        f"'{PLAIN_MODULE} required username=\"...\" password=\"...\";' or the same with "
        f"{SCRAM_MODULE}")


class _JaasReader:
    """A cursor over a JAAS configuration entry; reads tokens, never evaluates anything."""

    def __init__(self, text: str, where: str) -> None:
        self.text, self.where, self.i = text, where, 0

    def blanks(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t\r\n\f":
            self.i += 1

    def at_end(self) -> bool:
        self.blanks()
        return self.i >= len(self.text)

    def name(self, what: str) -> str:
        self.blanks()
        m = _NAME.match(self.text, self.i)
        if m is None:
            raise _jaas_refusal(self.where, f"has no {what} at character {self.i + 1}")
        self.i = m.end()
        return m.group(0)

    def char(self, expected: str, what: str) -> None:
        self.blanks()
        if not self.text.startswith(expected, self.i):
            raise _jaas_refusal(self.where, f"expects {what} at character {self.i + 1}")
        self.i += len(expected)

    def peek(self, expected: str) -> bool:
        self.blanks()
        return self.text.startswith(expected, self.i)

    def quoted(self, option: str) -> str:
        """A double-quoted value; only \\" and \\\\ escapes; no control characters."""
        self.char('"', f'a double-quoted value of {option}')
        out: list[str] = []
        while self.i < len(self.text):
            c = self.text[self.i]
            if c == '"':
                self.i += 1
                return "".join(out)
            if c == "\\":
                nxt = self.text[self.i + 1:self.i + 2]
                if nxt not in ('"', "\\"):
                    raise _jaas_refusal(self.where, f"has an escape other than \\\" or "
                                                    f"\\\\ in the value of {option}")
                out.append(nxt)
                self.i += 2
                continue
            if ord(c) < 32 or ord(c) == 127:
                raise _jaas_refusal(self.where, f"has a control character in the value of "
                                                f"{option}")
            out.append(c)
            self.i += 1
        raise _jaas_refusal(self.where, f"does not close the quoted value of {option}")


def parse_jaas_login(text: str, where: str) -> JaasLogin:
    """The login of a Java client's `sasl.jaas.config` (pure): exactly one entry of Kafka's
    PlainLoginModule or ScramLoginModule, flag `required`, options `username` and `password`
    (double-quoted) and nothing else, ending in ';'. Anything else is refused with `where`
    (file:line) and why; the refusal never repeats a value (it may be a password)."""
    reader = _JaasReader(text, where)
    module = reader.name("login module")
    if module not in _MODULE_MECHANISMS:
        raise _jaas_refusal(where, f"names login module '{module[:120]}'")
    flag = reader.name("control flag")
    if flag != "required":
        raise _jaas_refusal(where, f"has control flag '{flag[:40]}' (only 'required')")
    options: dict[str, str] = {}
    while not reader.peek(";"):
        if len(options) >= MAX_JAAS_OPTIONS:
            raise _jaas_refusal(where, "has too many options")
        option = reader.name("option name or ';'")
        if option not in ("username", "password"):
            raise _jaas_refusal(where, f"has option '{option[:80]}' (only username and "
                                       "password)")
        if option in options:
            raise _jaas_refusal(where, f"gives {option} twice")
        reader.char("=", f"'=' after {option}")
        options[option] = reader.quoted(option)
    reader.char(";", "';'")
    if not reader.at_end():
        raise _jaas_refusal(where, "has more after the first entry's ';' (a second login "
                                   "module?)")
    for option in ("username", "password"):
        if option not in options:
            raise _jaas_refusal(where, f"has no {option} option")
    return JaasLogin(module, options["username"], options["password"])


def _truststore(by_key: Mapping[str, SecuritySetting], origin: str) -> dict[str, str]:
    """ssl.truststore.* (PEM only) as librdkafka's ssl.ca.location / ssl.ca.pem."""
    out: dict[str, str] = {}
    kind = by_key.get("ssl.truststore.type")
    location, inline = by_key.get("ssl.truststore.location"), by_key.get(
        "ssl.truststore.certificates")
    if (location or inline) and (kind is None or kind.value.strip().upper() != "PEM"):
        line = next(s.line for s in (kind, location, inline) if s is not None)
        raise KafkaParamError(f"{origin}:{line}: the sink and the start check (librdkafka) "
                              "read a truststore only as PEM: set ssl.truststore.type=PEM and "
                              "give a PEM file of CA certificates")
    if location:
        out["ssl.ca.location"] = location.value
    if inline:
        out["ssl.ca.pem"] = inline.value
    keystore = by_key.get("ssl.keystore.type")
    if by_key.get("ssl.keystore.location") and (
            keystore is None or keystore.value.strip().upper() != "PKCS12"):
        line = (keystore or by_key["ssl.keystore.location"]).line
        raise KafkaParamError(f"{origin}:{line}: the sink and the start check (librdkafka) "
                              "read a keystore only as PKCS12: set ssl.keystore.type=PKCS12 "
                              "(a JKS keystore converts with keytool -importkeystore "
                              "-deststoretype PKCS12)")
    return out


def librdkafka_security(properties: list[SecuritySetting], origin: str) -> dict[str, str]:
    """The same security file as librdkafka's settings (pure), for the sink and the start
    check: security.protocol and sasl.mechanism as they are; the login of sasl.jaas.config
    (`parse_jaas_login`) as sasl.username / sasl.password; a PEM truststore as ssl.ca.location
    (or ssl.ca.pem); an empty ssl.endpoint.identification.algorithm as `none`. A key with no
    librdkafka meaning that matters (Java's login or TLS tuning) is left out; any other key is
    refused with its line."""
    by_key = {s.key: s for s in properties}
    out: dict[str, str] = {}
    for s in properties:
        where = f"{origin}:{s.line}"
        if s.key in _SAME_KEYS:
            out[s.key] = s.value
        elif s.key == "sasl.jaas.config":
            login = parse_jaas_login(s.value, where)
            mechanism = by_key.get("sasl.mechanism")
            allowed = _MODULE_MECHANISMS[login.module]
            if mechanism is None or mechanism.value.strip().upper() not in allowed:
                raise KafkaParamError(f"{where}: {login.module.rsplit('.', 1)[-1]} needs "
                                      f"sasl.mechanism={' or '.join(allowed)} in the same file")
            out["sasl.username"], out["sasl.password"] = login.username, login.password
        elif s.key == "ssl.endpoint.identification.algorithm":
            out[s.key] = s.value.strip().lower() or "none"
        elif s.key in _TRANSLATED or s.key in _JAVA_ONLY_KEYS \
                or s.key.startswith(_JAVA_ONLY_PREFIXES):
            continue
        else:
            hint = _JAVA_FORM.get(s.key, "remove it")
            raise KafkaParamError(f"{where}: '{s.key}' is not a Java client setting that the "
                                  "sink and the start check (librdkafka) can take: " + hint)
    out.update(_truststore(by_key, origin))
    return out


def transactional_id(query_id: str, task_id: str, op: str) -> str:
    """The sink's transactional id: the same for every attempt of the task (so a new attempt's
    producer fences the old one's), different for every sink; readable, bounded in length."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", f"elastiq.{query_id}.{task_id}.{op}")[:180]
    digest = hashlib.sha256(f"{query_id}\0{task_id}\0{op}".encode()).hexdigest()[:12]
    return f"{readable}.{digest}"


def spark_security_options(settings: Mapping[str, str]) -> dict[str, str]:
    """Security settings as Spark's Kafka options (`kafka.` before each key)."""
    return {f"kafka.{k}": v for k, v in settings.items()}
