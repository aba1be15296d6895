"""What `elastiq run` and `elastiq scheduler` both start, built in one place.

Owns the launch pieces the two commands share: the Java check, the executor every agent starts
(its command and environment), the executors' API token environment, and an embedded cluster
whose agents each offer a claimed band of ports, as one context manager that stops the cluster
and then releases the bands. It decides nothing about a query (that is `elastiq.run`) and parses
no arguments (that is `elastiq.service_cli`).
"""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from common.paths import ENV_VAR as PATH_ROOTS_ENV, PathRoots
from elastiq.sizing import PORTS_PER_AGENT

if TYPE_CHECKING:
    from embedded_mesos import EmbeddedCluster
    from scheduler.config import ExecutorSpec

EXECUTOR_GRACE_SECONDS = 15.0  # an executor stops its Spark queries and session cleanly within
Environment = tuple[tuple[str, str], ...]


class LaunchError(Exception):
    """A problem the user can fix before anything starts (Java missing, ...), in plain words."""


def check_java() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise LaunchError("Java was not found: Spark needs Java 17. Install it (Debian: "
                          "apt-get install openjdk-17-jre-headless) or set JAVA_HOME.")


def executor_spec(state: Path, roots: PathRoots, token_env: Environment,
                  command: str | None = None, extra_env: Environment = ()) -> ExecutorSpec:
    """The executor agents start for us: `command` (default: this Python's `-m executor`) with
    its state folder under `state`, prewarmed, confined to `roots`, told where the API token is
    (`token_env`, from `executor_token_environment`), plus `extra_env`."""
    from scheduler.config import ExecutorSpec

    return ExecutorSpec(command=command or f"exec {sys.executable} -m executor",
                        environment=(("ELASTIQ_STATE_DIR", str(state / "state")),
                                     ("ELASTIQ_PREWARM", "1"),
                                     (PATH_ROOTS_ENV, roots.to_env()))
                        + token_env + extra_env)


def executor_token_environment(token_file: str | None, port: int) -> Environment:
    """ELASTIQ_TOKEN_FILE for the executors (their control sinks call the API): the token file
    the scheduler reads or writes; nothing when the port is only known once bound. On a real
    cluster the agents need that file at that path (or --executor-env ELASTIQ_TOKEN_FILE=...);
    the token itself never goes into the environment, which Mesos shows in its state."""
    from common.api_token import default_token_file

    if token_file is not None:
        return (("ELASTIQ_TOKEN_FILE", str(Path(token_file).resolve())),)
    return (("ELASTIQ_TOKEN_FILE", str(default_token_file(port))),) if port else ()


def executor_environment(pairs: list[str]) -> Environment:
    """`NAME=VALUE` arguments as environment pairs; a malformed one is a usage error."""
    env = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--executor-env takes NAME=VALUE, not {pair!r}")
        env.append((name, value))
    return tuple(env)


@contextmanager
def claimed_bands(count: int, ports_per_agent: int = PORTS_PER_AGENT) -> Iterator[list[Any]]:
    """`count` bands of ports claimed on this machine, one per embedded agent
    (`embedded_mesos.ports`: free when claimed, and never the band of another run); released
    when the block ends, after the cluster that used them stopped."""
    from embedded_mesos.ports import claim_band

    with ExitStack() as stack:
        claims = []
        for _ in range(count):
            claim = claim_band(ports_per_agent)
            stack.callback(claim.release)
            claims.append(claim)
        yield claims


def add_agents(cluster: Any, bands: list[Any], resources: dict[str, Any]) -> None:
    """One embedded agent per claimed band, offering `resources` and the band's ports."""
    for band in bands:
        cluster.add_agent({**resources, "ports": band.ports})


@contextmanager
def embedded_cluster(agents: int, resources: dict[str, Any], work_dir: Path,
                     isolation: Any = "none") -> Iterator[EmbeddedCluster]:
    """An embedded master with `agents` agents, each offering `resources` and a claimed band of
    ports and isolating its executor containers as `isolation` says (`embedded_mesos.agent`'s
    modes; none by default, as a Mesos agent's posix isolators); on leaving, the cluster stops
    (its executors get EXECUTOR_GRACE_SECONDS) and then the bands are released."""
    from embedded_mesos import EmbeddedCluster

    with ExitStack() as stack:
        bands = stack.enter_context(claimed_bands(agents))
        cluster = stack.enter_context(EmbeddedCluster(
            agents=0, work_dir=work_dir, executor_grace_seconds=EXECUTOR_GRACE_SECONDS,
            isolation=isolation))
        add_agents(cluster, bands, resources)
        yield cluster
