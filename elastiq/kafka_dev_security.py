"""The secured dev broker of `elastiq kafka start`: its options, passwords and client files.

Owns deciding what `--user`, `--users-file`, `--mechanism`, `--tls`, `--mutual-tls` and
`--port` ask for (`plan_secured_start`: every problem at once, each located: the option and its
position, or
FILE:LINE of the users file; never repeating a password, and showing a hostile name only
escaped and cut short), reading a users file (`NAME=PASSWORD` lines, owner-only: mode 0600 or
0400, checked), generating the passwords of the users named on the command line (never a
password on a command line: they go to a new 0600 file whose path the command prints), and
writing the Java client properties files (the form docs/kafka.md documents for
`security-file=`) a person hands to a query. Does not own the broker (`elastiq.kafka_broker`)
or the command line's other actions (`elastiq.kafka_cli`).
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from elastiq.kafka_broker import (PASSWORD_RULE, SASL_MECHANISMS, USER_NAME_RULE,
                                  client_properties, password_ok, tls_client_properties,
                                  user_name_ok, write_private)
from elastiq.kafka_tls import ClientTls

DEFAULT_MECHANISM = "SCRAM-SHA-256"
MAX_USERS = 64
MAX_USERS_FILE_CHARS = 65536
PASSWORDS_FILE = "passwords"  # the generated passwords, in the users file's own form


@dataclass(frozen=True)
class SecuredStart:
    """What a valid `elastiq kafka start` asked for."""

    users: dict[str, str]  # name -> password, in the order given
    generated: tuple[str, ...]  # the users whose passwords were generated
    mechanism: str  # the client files' SASL mechanism
    tls: bool
    mutual_tls: bool = False  # an MTLS listener too, and a client keystore the CA signed

    @property
    def secured(self) -> bool:
        return bool(self.users) or self.tls


def shown(text: str, limit: int = 40) -> str:
    """A name from outside as it may appear in a message: escaped (repr) and cut short."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def mode_problem(path: Path, mode: int) -> str | None:
    """Why a users file of `mode` (st_mode) is refused: not a regular file, or readable or
    writable by anyone but its owner."""
    if not stat.S_ISREG(mode):
        return f"{path}: not a regular file"
    if mode & 0o077:
        return (f"{path}: mode {stat.S_IMODE(mode):04o} lets others read or change it; make it "
                f"owner-only: chmod 600 {path}")
    return None


def parse_users_file(text: str, origin: str) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """`NAME=PASSWORD` lines ('#' comments, blank lines ignored) -> name -> (password, line),
    and the problems, each FILE:LINE (a password is never repeated)."""
    users: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    if len(text) > MAX_USERS_FILE_CHARS:
        return {}, [f"{origin}: {len(text)} characters; a users file holds a few NAME=PASSWORD "
                    f"lines (at most {MAX_USERS_FILE_CHARS} characters)"]
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{origin}:{number}"
        name, sep, password = line.partition("=")
        name = name.strip()
        if not sep:
            problems.append(f"{where}: expected NAME=PASSWORD")
            continue
        if not user_name_ok(name):
            problems.append(f"{where}: user {shown(name)}: {USER_NAME_RULE}")
        elif name in users:
            problems.append(f"{where}: user '{name}' again (first on line {users[name][1]})")
        password = password.strip()
        if not password_ok(password):
            problems.append(f"{where}: the password of user {shown(name)}: {PASSWORD_RULE}")
        elif user_name_ok(name) and name not in users:
            users[name] = (password, number)
    return users, problems


def _read_users_file(path: Path) -> tuple[dict[str, tuple[str, int]], list[str]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return {}, [f"--users-file {path}: cannot open it: {e.strerror}"]
    with os.fdopen(fd, "rb") as f:
        problem = mode_problem(path, os.fstat(f.fileno()).st_mode)
        if problem is not None:
            return {}, [f"--users-file {problem}"]
        data = f.read(MAX_USERS_FILE_CHARS + 1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {}, [f"--users-file {path}: not UTF-8 text"]
    return parse_users_file(text, str(path))


def plan_secured_start(user_names: list[str], users_file: Path | None, mechanism: str | None,
                       tls: bool, port: int, mutual_tls: bool = False,
                       new_password: Callable[[], str] = lambda: secrets.token_urlsafe(18)
                       ) -> tuple[SecuredStart | None, list[str]]:
    """The secured start the options ask for, or None and every problem, each located."""
    problems: list[str] = []
    if mutual_tls and not tls:
        problems.append("--mutual-tls: needs --tls (the client certificate is signed by the "
                        "CA --tls makes)")
    if not 0 <= port <= 65535:
        problems.append(f"--port {port}: a port is 1-65535 (0: any free one)")
    named: list[str] = []
    for i, name in enumerate(user_names, 1):
        if not user_name_ok(name):
            problems.append(f"--user #{i} {shown(name)}: {USER_NAME_RULE}")
        elif name in named:
            problems.append(f"--user #{i} '{name}': named twice")
        else:
            named.append(name)
    from_file: dict[str, tuple[str, int]] = {}
    if users_file is not None:
        from_file, file_problems = _read_users_file(users_file)
        problems += file_problems
        for name in named:
            if name in from_file:
                problems.append(f"--user '{name}': also in {users_file}:{from_file[name][1]}; "
                                "name a user once (the file's has a password)")
        if not from_file and not file_problems:
            problems.append(f"--users-file {users_file}: names no user (NAME=PASSWORD lines)")
    if len(named) + len(from_file) > MAX_USERS:
        problems.append(f"{len(named) + len(from_file)} users; a dev broker takes at most "
                        f"{MAX_USERS}")
    chosen = mechanism if mechanism is not None else DEFAULT_MECHANISM
    if mechanism is not None and mechanism not in SASL_MECHANISMS:
        problems.append(f"--mechanism {shown(mechanism)}: one of {', '.join(SASL_MECHANISMS)}")
    elif mechanism is not None and not named and not from_file:
        problems.append(f"--mechanism {mechanism}: without users (--user, --users-file) the "
                        "broker has no SASL listener")
    if problems:
        return None, problems
    users = {name: password for name, (password, _) in from_file.items()}
    generated = tuple(name for name in named if name not in users)
    users.update({name: new_password() for name in generated})
    return SecuredStart(users, generated, chosen, tls, mutual_tls), []


@dataclass(frozen=True)
class ClientFiles:
    """What `write_client_files` wrote: user (or "tls") -> client file, and the generated
    passwords' file (None if none was generated)."""

    clients: dict[str, Path]
    passwords: Path | None

    def paths(self) -> list[Path]:
        return [*self.clients.values(), *([self.passwords] if self.passwords else [])]


def write_client_files(folder: Path, start: SecuredStart, ca_pem: Path | None,
                       client_tls: ClientTls | None = None) -> ClientFiles:
    """The generated passwords (`passwords`, 0600, NAME=PASSWORD: usable as --users-file) and
    a Java client file (0600) per user for the SASL listener (SASL_SSL with `ca_pem`), with
    `ca_pem` one for the SSL listener (`client-tls.properties`), and with `client_tls` one for
    the MTLS listener (`client-mtls.properties`, naming the client's keystore)."""
    folder.mkdir(parents=True, exist_ok=True)
    passwords: Path | None = None
    if start.generated:
        passwords = folder / PASSWORDS_FILE
        write_private(passwords, "".join(f"{n}={start.users[n]}\n" for n in start.generated))
    clients: dict[str, Path] = {}
    for name, password in start.users.items():
        clients[name] = folder / f"client-{name}.properties"
        write_private(clients[name], client_properties(name, password, start.mechanism, ca_pem))
    if ca_pem is not None:
        clients["tls"] = folder / "client-tls.properties"
        write_private(clients["tls"], tls_client_properties(ca_pem))
    if ca_pem is not None and client_tls is not None:
        clients["mtls"] = folder / "client-mtls.properties"
        write_private(clients["mtls"], tls_client_properties(ca_pem, client_tls))
    return ClientFiles(clients, passwords)


LISTENER_LABELS = {"sasl": "SASL_PLAINTEXT", "sasl_ssl": "SASL_SSL", "ssl": "SSL (TLS only)",
                   "mtls": "SSL with client certificates"}


def usage_lines(secured: dict[str, str], files: ClientFiles, start: SecuredStart) -> list[str]:
    """What `start` prints about the secured listeners and how to use the files."""
    lines = [f"  {LISTENER_LABELS[name]} listener at {address}"
             for name, address in secured.items()]
    if files.passwords is not None:
        lines.append(f"generated passwords of {', '.join(start.generated)}: {files.passwords} "
                     "(owner-only; give it as --users-file to keep them next time)")
    listener = "sasl_ssl" if start.tls and start.users else "sasl" if start.users else "ssl"
    for user, path in files.clients.items():
        what = {"tls": "TLS only, no login", "mtls": "TLS with the client's certificate"}.get(
            user, f"user {user}, {start.mechanism}")
        lines.append(f"client settings ({what}): {path}")
    first = next(iter(files.clients.values()))
    lines.append(f"use them: bootstrap=\"{secured[listener]}\" security-file=\"{first}\" on a "
                 f"kafka-source or kafka-sink (elastiq run and validate: --path-root "
                 f"{first.parent}); Kafka's own tools take the same file (--consumer.config, "
                 "--producer.config, --command-config)")
    return lines

