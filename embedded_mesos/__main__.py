"""Command line: `python -m embedded_mesos master|agent|cluster [options]`.

Owns parsing options, the cluster secret of a master and agents in separate processes
(`ELASTIQ_EMBEDDED_SECRET`, else `--secret-file`: a master creates it, mode 0600, when missing;
never an option's value, which `ps` would show), the framework credential schedulers must
present to a master (principal `--framework-principal`, `elastiq` by default; secret from
`ELASTIQ_EMBEDDED_FRAMEWORK_SECRET`, else `--framework-secret-file`, created like the cluster
secret's; `--no-authenticate-http-frameworks` turns the check off, unsafe), starting the requested pieces, printing one
`ELASTIQ_EMBEDDED_READY {json}` line on stdout once they serve, and stopping cleanly on SIGTERM
or Ctrl-C. It does not own any behaviour of the pieces.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any, Callable

from embedded_mesos.agent import EmbeddedAgent, SilenceSetting
from embedded_mesos.auth import (
    DEFAULT_PRINCIPAL, FRAMEWORK_SECRET_ENV, FrameworkCredential, new_framework_credential,
)
from embedded_mesos.cluster import READY_PREFIX, EmbeddedCluster
from embedded_mesos.httpio import SECRET_ENV
from embedded_mesos.master import EmbeddedMaster, new_secret
from embedded_mesos.resources import ResourceError, parse_agent_resources


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m embedded_mesos",
                                     description="Embedded Mesos-compatible master and agent")
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("master", "cluster"):
        p = sub.add_parser(role)
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=5050 if role == "master" else 0)
        p.add_argument("--offer-interval", type=float, default=1.0)
        p.add_argument("--agent-timeout", type=float, default=5.0)
        p.add_argument("--heartbeat-interval", type=float, default=15.0)
        p.add_argument("--framework-principal", default=DEFAULT_PRINCIPAL,
                       help=f"the principal schedulers authenticate as (default "
                            f"{DEFAULT_PRINCIPAL})")
        p.add_argument("--framework-secret-file", default=None,
                       help=f"file holding that principal's secret (when {FRAMEWORK_SECRET_ENV} "
                            f"is unset); created (mode 0600) if missing; give the scheduler the "
                            f"same file (elastiq scheduler --mesos-secret-file)")
        p.add_argument("--no-authenticate-http-frameworks", action="store_true",
                       help="UNSAFE: let any scheduler that reaches the master subscribe and "
                            "launch commands on its agents")
    agent = sub.add_parser("agent")
    agent.add_argument("--master", required=True, help="http://127.0.0.1:PORT")
    agent.add_argument("--host", default="127.0.0.1")
    agent.add_argument("--port", type=int, default=0)
    agent.add_argument("--agent-id", default=None)
    agent.add_argument("--ping-interval", type=float, default=0.5)
    agent.add_argument("--executor-grace", type=float, default=3.0)
    agent.add_argument("--executor-silence", type=_silence, default="auto",
                       help="kill an executor with live tasks silent this long: seconds, 'off', "
                            "or 'auto' (ELASTIQ_EXECUTOR_SILENCE_SECONDS, else 10)")
    for p in (agent, sub.choices["cluster"]):
        p.add_argument("--isolation", choices=("auto", "cgroups", "none"), default="auto",
                       help="cgroups: each executor container gets cpu shares, a CFS quota and a "
                            "memory limit of its resources (as Mesos's cgroups/cpu,cgroups/mem; "
                            "unisolated, said once in the log, where no cgroup can be made); "
                            "none: as Mesos's posix isolators; auto: ELASTIQ_AGENT_ISOLATION, "
                            "else none")
        p.add_argument("--resources", default='{"cpus": 2, "mem": 2048, "ports": "31000-31999"}',
                       help="JSON object, e.g. '{\"cpus\": 2, \"mem\": 1024, "
                            "\"ports\": \"31000-31999\"}'")
        p.add_argument("--work-dir", default=None)
    sub.choices["cluster"].add_argument("--agents", type=int, default=1)
    for p in (agent, sub.choices["master"]):
        p.add_argument("--secret-file", default=None,
                       help=f"file holding the cluster secret (when {SECRET_ENV} is unset); "
                            f"a master creates it (mode 0600) if missing")
    parser.add_argument("--log-level", default="INFO")
    return parser


def _silence(text: str) -> SilenceSetting:
    if text.strip().lower() == "auto":
        return "auto"
    if text.strip().lower() == "off":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, 'off' or 'auto', got {text!r}") \
            from None


def _resources(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        parse_agent_resources(value)
        return value
    except (ValueError, ResourceError) as exc:
        raise SystemExit(f"--resources: {exc}") from None


def _serve(start: Callable[[], dict[str, Any]], stop: Callable[[], None]) -> int:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    try:
        ready = start()
        print(READY_PREFIX + json.dumps(ready), flush=True)
        done.wait()
    finally:
        stop()
    return 0


def _secret(path: str | None, create: bool, env: str = SECRET_ENV,
            option: str = "--secret-file") -> str | None:
    """A secret: $`env` (the cluster secret's by default), else the file at `path` (created
    with a fresh secret, mode 0600, when `create` and missing), else None."""
    if os.environ.get(env):
        return os.environ[env]
    if path is None:
        return None
    try:
        if create and not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(new_secret())
        with open(path) as source:
            return source.read().strip() or None
    except OSError as exc:
        raise SystemExit(f"{option}: {exc}") from None


def _framework_options(args: argparse.Namespace) -> dict[str, Any]:
    """The master's framework-authentication options from the command line and environment."""
    secret = _secret(args.framework_secret_file, True, FRAMEWORK_SECRET_ENV,
                     "--framework-secret-file")
    try:
        credential = (FrameworkCredential(args.framework_principal, secret) if secret
                      else new_framework_credential(args.framework_principal))
    except ValueError as exc:
        raise SystemExit(f"framework credential: {exc}") from None
    return {"framework_credential": credential,
            "authenticate_frameworks": not args.no_authenticate_http_frameworks}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.role == "master":
        master = EmbeddedMaster(args.host, args.port, args.offer_interval,
                                args.heartbeat_interval, args.agent_timeout,
                                secret=_secret(args.secret_file, create=True),
                                **_framework_options(args))
        return _serve(lambda: {"url": master.start().url, "master_id": master.state.master_id},
                      master.stop)
    if args.role == "agent":
        agent = EmbeddedAgent(args.master, _resources(args.resources), args.work_dir,
                              args.agent_id, args.host, args.port, args.ping_interval,
                              args.executor_grace,
                              executor_silence_after=args.executor_silence,
                              secret=_secret(args.secret_file, create=False),
                              isolation=args.isolation)
        return _serve(lambda: {"url": agent.start().url, "agent_id": agent.agent_id,
                               "isolation": agent.isolation}, agent.stop)
    cluster = EmbeddedCluster(args.agents, _resources(args.resources), args.work_dir,
                              args.offer_interval, args.agent_timeout, args.heartbeat_interval,
                              isolation=args.isolation, host=args.host, port=args.port,
                              **_framework_options(args))
    return _serve(lambda: {"url": cluster.start().master_url,
                           "agents": [a.agent_id for a in cluster.agents]}, cluster.stop)


if __name__ == "__main__":
    sys.exit(main())
