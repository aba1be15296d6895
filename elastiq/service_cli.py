"""The `elastiq` commands that run or talk to the long-running scheduler service, and `run`.

Owns the arguments and output of `run`, `scheduler`, `submit`, `update`, `status`, `stop` and
`tail`.
The service itself is `scheduler.mesos_adapter.SchedulerService` behind `scheduler.api`; the
client is `common.api_client.SchedulerClient`; the local run is `elastiq.run`; what `run` and
`scheduler` both start (executor, embedded cluster) is `elastiq.launch`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from common.api_client import DEFAULT_URL, RequestRejected, SchedulerClient, SchedulerUnavailable
from common import upsert_log
from common.api_token import read_token_file
from common.paths import ENV_VAR as PATH_ROOTS_ENV, service_roots
from elastiq.launch import (LaunchError, check_java, embedded_cluster, executor_environment,
                            executor_spec, executor_token_environment)
from elastiq.progress import MIGRATION_WAITS, Timeline, migration_phase
from elastiq.sink_watch import Follower, SinkWatch

TAIL_STATUS_SECONDS = 1.0  # how often `tail` asks whether a control tuple moved its sink
TOKEN_FILE_HELP = ("the scheduler's API token file (default: $ELASTIQ_TOKEN_FILE, else "
                   "$XDG_STATE_HOME/elastiq/api-token-PORT, i.e. ~/.local/state/elastiq/"
                   "api-token-PORT, which `elastiq scheduler` and `elastiq run` write)")


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="run a spec on an embedded one-machine cluster, results to "
                                   "the terminal (Ctrl-C stops it)")
    r.add_argument("spec", metavar="SPEC")
    r.add_argument("--agents", type=int, default=None,
                   help="embedded agents (default: as many as the plan's placement needs)")
    r.add_argument("--cpus", type=float, default=None,
                   help="cpus each agent offers to tasks, enforced per executor container with "
                        "cgroups where they can be made (default: room for the whole plan, at "
                        "least 4; the agent's SparkSession uses at most the machine's cores)")
    r.add_argument("--mem", type=int, default=None,
                   help="MB each agent offers (default: room for the whole plan, at least 6144)")
    r.add_argument("--duration", type=float, help="stop after this many seconds")
    r.add_argument("--state-dir", help="keep checkpoints, sandboxes and logs here")
    r.add_argument("--no-progress", action="store_true", help="no live progress line")
    r.add_argument("--api-port", type=int, default=8088,
                   help="serve the scheduler API on 127.0.0.1:PORT (default 8088; any free port "
                        "when taken) for `elastiq status`, `control` and `migrate`")
    r.add_argument("--no-api", action="store_true", help="do not serve the scheduler API")
    r.add_argument("--path-root", action="append", default=[], metavar="DIR",
                   help="a folder file sources and sinks may use besides the spec's own and "
                        "the state directory's data folder (repeatable)")
    r.set_defaults(handler=cmd_run)

    s = sub.add_parser("scheduler", help="run the scheduler service with its HTTP API")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--master", help="Mesos master: HOST:PORT or zk://HOST:PORT/mesos")
    where.add_argument("--embedded-agents", type=int, default=1,
                       help="start an embedded master with this many agents (default 1)")
    s.add_argument("--listen", default="127.0.0.1:8088", help="API address (default "
                   "127.0.0.1:8088; binds to loopback unless told otherwise)")
    s.add_argument("--state-dir", default="elastiq-state", help="checkpoints and sandboxes")
    s.add_argument("--zk", metavar="HOST:PORT[/ROOT]", help="ZooKeeper for leader election and "
                   "the registry (several schedulers elect one leader); default: none")
    s.add_argument("--zk-session-timeout", type=float, default=10.0,
                   help="ZooKeeper session timeout in seconds (default 10)")
    s.add_argument("--zk-acl-file", metavar="FILE", help="file with USER:PASSWORD: "
                   "authenticate as that digest user and make every node we create its alone")
    s.add_argument("--mesos-principal", metavar="PRINCIPAL",
                   help="with --master: the framework principal to authenticate to Mesos as "
                        "(the embedded master's credential is passed on by itself)")
    s.add_argument("--mesos-secret-file", metavar="FILE",
                   help="with --master: file holding the principal's secret (HTTP Basic)")
    s.add_argument("--executor-command", help="how agents start our executor (default: "
                   "exec <this python> -m executor)")
    s.add_argument("--token-file", metavar="FILE", help="the API's token is this file's text "
                   "(default: a new random token, written with mode 0600 to "
                   "$XDG_STATE_HOME/elastiq/api-token-PORT, i.e. ~/.local/state/elastiq/"
                   "api-token-PORT, where the CLI finds it)")
    s.add_argument("--api-allowed-host", action="append", default=[], metavar="NAME[:PORT]",
                   help="a further Host name clients may reach the API under (repeatable; "
                        "default: only its own address, localhost and 127.0.0.1)")
    s.add_argument("--api-compile-seconds", type=float, default=None, metavar="S",
                   help="a spec sent to the API is compiled in a worker process killed after "
                        "S seconds, the body then refused with 413 (default 120)")
    s.add_argument("--api-compile-memory-mb", type=int, default=None, metavar="MB",
                   help="that worker's address space limit (default 1024)")
    s.add_argument("--api-compile-workers", type=int, default=None, metavar="N",
                   help="compiles at once; one more waits, then 503 (default 2)")
    s.add_argument("--executor-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment for the executors agents start (repeatable), e.g. "
                        "ELASTIQ_SPARK_CORES=8")
    s.add_argument("--path-root", action="append", default=[], metavar="DIR",
                   help="a folder file sources and sinks may use (repeatable); default: the "
                        "working folder; the state directory's data folder always")
    s.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="what the service logs to stderr (default INFO)")
    s.set_defaults(handler=cmd_scheduler)

    for name, helptext, handler in (("submit", "submit a spec to the scheduler", cmd_submit),
                                    ("status", "show queries and their tasks", cmd_status),
                                    ("stop", "stop a query", cmd_stop),
                                    ("tail", "follow a file sink of a query", cmd_tail)):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--scheduler", default=DEFAULT_URL, help=f"API URL (default {DEFAULT_URL})")
        p.add_argument("--token-file", metavar="FILE", help=TOKEN_FILE_HELP)
        if name == "submit":
            p.add_argument("spec", metavar="SPEC")
        elif name == "status":
            p.add_argument("query", nargs="?")
            p.add_argument("--json", action="store_true", help="print the raw JSON")
            p.add_argument("--watch", action="store_true", help="refresh every second")
        else:
            p.add_argument("query")
        if name == "stop":
            p.add_argument("--force", action="store_true",
                           help="stop it even while other queries read a stream it publishes "
                                "(they wait for it)")
        if name == "tail":
            p.add_argument("sink", help="the file-sink operator's name (or a kafka-sink's, "
                                        "with --stable)")
            p.add_argument("--from-start", action="store_true", help="print what is there first")
            p.add_argument("--current", action="store_true",
                           help="print the current view of an upsert log (an updating "
                                "aggregate's or top-n's sink: the last record of each key "
                                "not deleted since) and exit")
            p.add_argument("--stable", action="store_true",
                           help="print the sink's current stable view once (a DPC union's "
                                "tentative rows left out, its corrections applied) and exit; "
                                "a Kafka sink's topic is read read_committed up to its end "
                                "offsets at the start")
        p.set_defaults(handler=handler)

    u = sub.add_parser("update", help="update a running query in place from a new spec: "
                                      "prints the diff, then applies it all or nothing")
    u.add_argument("query")
    u.add_argument("spec", metavar="SPEC")
    u.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
    u.add_argument("--drop-state", action="store_true",
                   help="allow dropping the state of stateful operators whose key, window or "
                        "aggregates change")
    u.add_argument("--scheduler", default=DEFAULT_URL, help=f"API URL (default {DEFAULT_URL})")
    u.add_argument("--token-file", metavar="FILE", help=TOKEN_FILE_HELP)
    u.set_defaults(handler=cmd_update)

    m = sub.add_parser("migrate", help="move a running task of a query to another agent")
    m.add_argument("query")
    m.add_argument("task", help="the task id, as `elastiq status QUERY` lists it")
    m.add_argument("--to", required=True, metavar="AGENT", help="the target agent's id")
    m.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the task to run there (default 120)")
    m.add_argument("--scheduler", default=DEFAULT_URL, help=f"API URL (default {DEFAULT_URL})")
    m.add_argument("--token-file", metavar="FILE", help=TOKEN_FILE_HELP)
    m.set_defaults(handler=cmd_migrate)


def cmd_run(args: argparse.Namespace) -> int:
    from elastiq.run import RunOptions, run

    options = RunOptions(Path(args.spec), agents=args.agents, cpus_per_agent=args.cpus,
                         mem_per_agent_mb=args.mem, duration=args.duration,
                         state_dir=Path(args.state_dir) if args.state_dir else None,
                         show_progress=not args.no_progress,
                         api_port=None if args.no_api else args.api_port,
                         path_roots=tuple(args.path_root))
    try:
        return run(options)
    except LaunchError as e:  # a RunError is one
        print(f"elastiq: {e}", file=sys.stderr)
        return 1


def _compile_limits(args: argparse.Namespace) -> Any:
    """`CompileLimits` from the --api-compile-* flags, the defaults for those not given;
    ValueError when out of range."""
    from scheduler.config import CompileLimits

    given = {"seconds": args.api_compile_seconds, "memory_mb": args.api_compile_memory_mb,
             "workers": args.api_compile_workers}
    return CompileLimits(**{k: v for k, v in given.items() if v is not None})


def cmd_scheduler(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from scheduler.config import SchedulerConfig
    from scheduler.mesos_adapter import SchedulerService, driver_failure

    _, _, port = args.listen.rpartition(":")
    state = Path(args.state_dir).resolve()
    try:
        check_java()
    except LaunchError as e:
        print(f"elastiq: {e}", file=sys.stderr)
        return 1
    try:
        coordination, principal, secret = (_coordination(args), args.mesos_principal,
                                           _secret(args))
        if args.token_file is not None:
            read_token_file(args.token_file)  # a bad token file is a usage error, before anything
        extra_env = executor_environment(args.executor_env)
        compile_limits = _compile_limits(args)
    except (ValueError, OSError) as e:
        print(f"elastiq: {e}", file=sys.stderr)
        return 2
    roots = service_roots(state, args.path_root)
    os.environ[PATH_ROOTS_ENV] = roots.to_env()  # what the API compiles with (configured_roots)
    config = SchedulerConfig(executor=executor_spec(
        state, roots, executor_token_environment(args.token_file, int(port)),
        command=args.executor_command, extra_env=extra_env))
    with ExitStack() as stack:
        master = args.master
        if master is None:
            cluster = stack.enter_context(embedded_cluster(
                args.embedded_agents, {"cpus": 4, "mem": 6144}, state / "cluster"))
            master = cluster.master_address
            principal = cluster.framework_credential.principal
            secret = cluster.framework_credential.secret
        service = SchedulerService(master, config, coordination=coordination,
                                   principal=principal, secret=secret)
        code = _serve(args, service, master, roots.describe(), compile_limits)
    failure = driver_failure()  # pymesos gave up (it interrupts us), e.g. credentials refused
    if code == 0 and failure is not None:
        print(f"elastiq: {failure}", file=sys.stderr)
        return 2
    return code


def _serve(args: argparse.Namespace, service: Any, master: str, confined_to: str,
           compile_limits: Any) -> int:
    """Serve the API and run the scheduler until SIGINT or SIGTERM, then stop both; the exit
    status (the caller stops the embedded cluster, if any, afterwards)."""
    from scheduler.api import ApiServer
    from scheduler.mesos_adapter import credentials_refused, explain_driver_error

    host, _, port = args.listen.rpartition(":")
    try:
        api = ApiServer.serving(service, host=host or "127.0.0.1", port=int(port),
                                token_file=args.token_file,
                                allowed_hosts=args.api_allowed_host,
                                compile_limits=compile_limits)
    except OSError as e:
        print(f"elastiq: cannot serve the API on {args.listen}: {e.strerror or e} "
              f"({e.filename or 'the address'}); choose another address with --listen HOST:PORT "
              "or a token file with --token-file", file=sys.stderr)
        return 1
    service.address = api.url  # what standbys tell clients to use
    # Our handlers go in before the driver starts: pymesos ends its I/O thread by interrupting
    # the main thread, and its own SIGINT handler would raise that error wherever we are.
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        service.start()
    except Exception as e:  # e.g. no ZooKeeper answers, or the master refused our credentials
        refused = credentials_refused(e)
        print(f"elastiq: cannot start the scheduler: "
              f"{explain_driver_error(e) if refused else e}", file=sys.stderr)
        api.stop()
        return 2 if refused else 1
    print(f"elastiq scheduler: API on {api.url} (token in {api.token_file}), master {master}; "
          f"file operators confined to {confined_to}; Ctrl-C stops it", file=sys.stderr)
    try:
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        api.stop()
        service.stop(failover=args.master is not None)
    return 0


def _coordination(args: argparse.Namespace) -> Any:
    """ZooKeeper from --zk (and --zk-acl-file), or None for the in-process default."""
    if not args.zk:
        return None
    from scheduler.zk import ZkSettings, ZooKeeperCoordination, parse_zk_address, read_digest_file

    hosts, root = parse_zk_address(args.zk)
    digest = read_digest_file(args.zk_acl_file) if args.zk_acl_file else None
    return ZooKeeperCoordination(ZkSettings(hosts, root, args.zk_session_timeout, digest))


def _secret(args: argparse.Namespace) -> str | None:
    """The Mesos framework secret from --mesos-secret-file (never the command line)."""
    if args.master is None and (args.mesos_principal or args.mesos_secret_file):
        raise ValueError("--mesos-principal and --mesos-secret-file go with --master; the "
                         "embedded master's credential is passed on by itself")
    if args.mesos_secret_file is None:
        return None
    if not args.mesos_principal:
        raise ValueError("--mesos-secret-file needs --mesos-principal")
    secret = Path(args.mesos_secret_file).read_text(encoding="utf-8").strip()
    if not secret:
        raise ValueError(f"{args.mesos_secret_file} is empty")
    return secret


def _client(args: argparse.Namespace) -> SchedulerClient:
    """A client of --scheduler with the token from --token-file, $ELASTIQ_TOKEN_FILE or the
    default file for the API's port (`common.api_token`)."""
    from common.api_token import read_client_token

    return SchedulerClient(args.scheduler,
                           token=read_client_token(args.token_file, args.scheduler))


def _call(fn: Any) -> tuple[int, Any]:
    try:
        return 0, fn()
    except SchedulerUnavailable as e:
        print(f"elastiq: {e}", file=sys.stderr)
        return 1, None
    except (OSError, ValueError) as e:  # e.g. an unreadable token file
        print(f"elastiq: {e}", file=sys.stderr)
        return 1, None
    except RequestRejected as e:
        print(f"elastiq: refused ({e.status}): {e.message}", file=sys.stderr)
        for d in e.diagnostics:
            if d.get("message") == e.message and not d.get("file"):
                continue  # already said
            where = f"{d.get('file')}:{d.get('line')}:{d.get('column')}: " if d.get("file") else ""
            print(f"{where}{d.get('severity', 'error')}: {d.get('message')}"
                  + (f" ({d['hint']})" if d.get("hint") else ""), file=sys.stderr)
        return 1, None


def cmd_submit(args: argparse.Namespace) -> int:
    code, reply = _call(lambda: _client(args).submit_spec(Path(args.spec).resolve()))
    if code == 0:
        print(reply.get("message") or json.dumps(reply))
    return code


def cmd_stop(args: argparse.Namespace) -> int:
    code, reply = _call(lambda: _client(args).stop(args.query, force=args.force))
    if code == 0:
        print(reply.get("message") or json.dumps(reply))
    return code


def cmd_update(args: argparse.Namespace) -> int:
    """The diff first (also of a refused update), then what was done or why not."""
    def call() -> dict[str, Any]:
        try:
            return _client(args).update_spec(args.query, Path(args.spec).resolve(),
                                             drop_state=args.drop_state, dry_run=args.dry_run)
        except RequestRejected as e:
            for line in ((e.body.get("diff") or {}).get("lines") or ()):
                print(line)
            raise

    code, reply = _call(call)
    if code == 0:
        for line in (reply.get("diff") or {}).get("lines") or ():
            print(line)
        print(reply.get("message") or json.dumps(reply))
    return code


def cmd_migrate(args: argparse.Namespace) -> int:
    """Ask the scheduler to move the task, then wait until it runs on the target: say what it
    waits for in each phase (the old attempt stopping, an offer, the target's executor, its
    SparkSession and the task's query), how long it paused (from the request until it was
    running there) and how long each phase took."""
    client = _client(args)
    code, before = _call(lambda: client.status(args.query))
    if code != 0:
        return code
    attempt = _task_view(before, args.task).get("attempt", 0)
    started = time.monotonic()
    code, reply = _call(lambda: client.migrate(args.query, args.task, args.to))
    if code != 0:
        return code
    print(reply.get("message") or json.dumps(reply))
    timeline = Timeline(started)
    while time.monotonic() - started < args.timeout:
        code, view = _call(lambda: client.status(args.query))
        if code != 0:
            return code
        task, now = _task_view(view, args.task), time.monotonic()
        phase = migration_phase(task, attempt)
        if timeline.observe(phase, now) and phase in MIGRATION_WAITS:
            print(f"  +{now - started:.1f} s: {phase}: waiting for {MIGRATION_WAITS[phase]}")
        if task.get("attempt", 0) > attempt and task.get("state") == "running" and \
                task.get("agent_id") == args.to:
            waited = timeline.summary(now)
            print(f"task {args.task} runs on agent {args.to} (attempt {task['attempt']}): "
                  f"paused {now - started:.1f} s from the request to running there"
                  + (f" ({waited})" if waited else ""))
            return 0
        time.sleep(0.2)
    print(f"elastiq: task {args.task} is not running on agent {args.to} after "
          f"{args.timeout:g} s; `elastiq status {args.query}` says why", file=sys.stderr)
    return 1


def _task_view(view: dict[str, Any], task_id: str) -> dict[str, Any]:
    return next((t for t in view.get("tasks", []) if t.get("task_id") == task_id), {})


def cmd_status(args: argparse.Namespace) -> int:
    """Print the status once, or with --watch redraw a table every second until Ctrl-C."""
    from scheduler.metrics import Readings

    readings: Readings = {}
    try:
        while True:
            code, reply = _call(lambda: _client(args).status(args.query))
            if code != 0:
                return code
            if args.json:
                print(json.dumps(reply, indent=2), flush=True)
            elif args.watch:
                readings = _print_status(reply, readings, watch=True)
            else:
                _print_status(reply)
            if not args.watch:
                return 0
            time.sleep(1.0)
    except (KeyboardInterrupt, BrokenPipeError):
        return 0


def _where(task: dict[str, Any]) -> str:
    """"agent A (host H)": the agent id `migrate --to` takes, and the host it runs on."""
    agent, host = task.get("agent_id"), task.get("hostname")
    if not agent:
        return "-"
    return f"agent {agent} ({host})" if host else f"agent {agent}"


def _print_status(reply: dict[str, Any], readings: Any = None, watch: bool = False) -> Any:
    """One query list; with `watch`, a cleared screen and the table of `status --watch`
    (rates from the previous frame's `readings`; returns this frame's)."""
    from elastiq.progress import summarize
    from scheduler.metrics import format_watch, watch_rows

    if watch:
        rows, readings = watch_rows(reply, readings or {}, time.monotonic())
        sys.stdout.write("\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n")
        print(f"elastiq status at {time.strftime('%H:%M:%S')} (Ctrl-C ends)\n", flush=True)
        print(format_watch(rows) if rows else "no queries", flush=True)
        return readings
    queries = reply["queries"] if "queries" in reply else [reply]
    if not queries:
        print("no queries")
    for q in queries:
        print(f"{q.get('query_id')}: {summarize(q)}")
        for sink, path in sorted((q.get("sinks") or {}).items()):
            print(f"  sink {sink} -> {path}")
        for t in q.get("tasks", []):
            where = _where(t)
            extra = f"  ({t['last_failure']})" if t.get("last_failure") else ""
            extra += f"  [{t['blocked']}]" if t.get("blocked") else ""
            extra += f"  [{t['availability']}]" if t.get("availability") else ""
            print(f"  {t['task_id']:<24} {t['state']:<9} attempt {t['attempt']} on {where}{extra}")
        for line in elastic_lines(q.get("elastic") or []):
            print(line)
        for line in shared_lines(q):
            print(line)
        for line in shedding_lines(q.get("shedding")):
            print(line)
        for line in agent_lines(q.get("agents") or {}):
            print(line)
    for line in distribution_lines(reply.get("distribution")):
        print(line)
    return readings


def distribution_lines(view: dict[str, Any] | None) -> list[str]:
    """`status` lines of the load distributor (docs/load.md): moves started and refused, its
    last decision with its numbers, and the last few moves (pure; none before its first round)."""
    decision = (view or {}).get("decision")
    if not view or not decision:
        return []
    lines = [f"load distribution: {view['moves']} moves ({view['refused']} refused); last "
             f"round: {decision['kind']} ({decision['reason']}): {decision['explanation']}"]
    for m in view.get("recent", [])[-3:]:
        how = "started" if m["started"] else f"refused: {m['refusal']}"
        lines.append(f"  moved {m['task']} ({m['query_id']}) {m['from']} -> {m['to']}, score "
                     f"{m['score']:+.2f}: {how}")
    return lines


def shared_lines(view: dict[str, Any]) -> list[str]:
    """`status` lines of a query's published streams (each served once, by one task, to the
    queries that read it) and of the published streams it reads (docs/queries.md); a stream
    read by automatic sharing says so on both sides; pure."""
    lines = []
    for p in view.get("published") or []:
        read = ", ".join(p.get("readers") or []) or "no query yet"
        how = "shares" if p.get("auto") else "publishes"
        lines.append(f"  {how} {p['channel']} (task {p['task']}), read by {read}")
    auto = set(view.get("shared") or [])
    for channel in view.get("reads") or []:
        lines.append(f"  reads {channel}" + (" (automatic sharing: in place of an equal "
                                              "subgraph)" if channel in auto else ""))
    return lines


def agent_lines(agents: dict[str, Any]) -> list[str]:
    """`status` lines of the agents a query's tasks run on: each one's isolation (`cgroups
    v1`, `cgroups v2`, `none`; `unknown` when the agent does not say), pure."""
    return [f"  agent {agent_id}: isolation: {view.get('isolation', 'unknown')}"
            for agent_id, view in sorted(agents.items())]


def shedding_lines(view: dict[str, Any] | None) -> list[str]:
    """`status` lines of a query's load shedding (docs/load.md): each drop operator's ratio in
    force and the rows its task shed, each sink's weight and expected result loss under the
    plan in force, and the policy's last decision (pure; none without drop operators)."""
    if not view:
        return []
    lines = []
    for d in view.get("drops", []):
        high = f", high-ratio {d['high_ratio']:.2f}" if "high_ratio" in d else ""
        lines.append(f"  shed {d['operator']} (on {d['task']}): ratio {d['ratio']:.2f}{high}, "
                     f"{d['rows_dropped']:,.0f} rows dropped")
    for s in view.get("sinks", []):
        lines.append(f"  sink {s['sink']} (weight {s['weight']:g}): expected result loss "
                     f"{s['expected_loss']:.0%}")
    decision = view.get("decision")
    if decision:
        lines.append(f"    shedding: {decision['kind']} ({decision['reason']}): "
                     f"{decision['explanation']}")
    return lines


def elastic_lines(operators: list[dict[str, Any]]) -> list[str]:
    """`status` lines of a query's elastic operators: parallelism, bounds, mode, the last
    rescale, the capacity the policy knows and its last decision (pure)."""
    lines = []
    for e in operators:
        retiring = [s["task"] for s in e.get("slots", []) if s.get("retiring")]
        folded = f", folded into {e['folded_into']}" if e.get("folded_into") and \
            not e["parallelism"] else ""
        lines.append(f"  elastic {e['operator']}: {e['parallelism']} of {e['max']} instances "
                     f"(min {e['min']}, {e['mode']}{folded})"
                     + (f", retiring {', '.join(retiring)}" if retiring else ""))
        last = (e.get("rescales") or [None])[-1]
        if last:
            pause = f", paused {last['pause_s']:.2f} s" if last.get("pause_s") is not None else ""
            lines.append(f"    last rescale {last['from']} -> {last['to']} ({last['trigger']}, "
                         f"{last['state']}{pause})")
        decision = e.get("decision")
        if decision:
            capacity = decision.get("capacity")
            if capacity:
                kind = ("measured while rows queued" if capacity.get("measured") else
                        "a lower bound, the best seen while keeping up")
                lines.append(f"    capacity: {capacity.get('rate', 0.0):,.0f} rows/s per "
                             f"instance ({kind})")
            lines.append(f"    policy: {decision.get('explanation', '')}")
    return lines


def print_current(path: str) -> int:
    """Print the current view of the upsert log at `path`, one JSON object per key (the key's
    last record, without `@key`; a deleted key not at all); 1 with the reason when it cannot be
    read or is not one. A DPC task's log (common.dpc_view) is read with its marks: its
    tentative records count until their episode's correction."""
    from common import dpc_view

    try:
        lines = upsert_log.complete_lines(path)
        view = (upsert_log.fold(dpc_view.current_view(dpc_view.records(lines)))
                if dpc_view.mentions_marks(lines) else upsert_log.current_view(lines))
    except (OSError, ValueError) as exc:  # UpsertLogError is a ValueError
        print(f"elastiq: {path}: {exc}", file=sys.stderr)
        return 1
    for row in view:
        print(json.dumps(row, separators=(",", ":")), flush=True)
    return 0


def _print_stable(path: Path) -> int:
    """The stable view of a file sink (`common.dpc_view`), one JSON object a line (an upsert
    log's: the last stable record of each key)."""
    from common import dpc_view

    try:
        with open(path, encoding="utf-8") as f:
            rows = dpc_view.records(f)
    except (OSError, ValueError) as exc:
        print(f"elastiq: cannot read sink file {path}: {exc}", file=sys.stderr)
        return 1
    return _print_view(rows, str(path))


def _print_view(rows: list[dict[str, Any]], where: str) -> int:
    """Print a sink's stable view, one JSON object a line (an upsert log's folded per key), and
    which episodes still await their correction (standard error); 1 with the reason when its
    upsert records do not fold."""
    from common import dpc_view

    try:
        stable = dpc_view.folded(dpc_view.stable_view(rows))
    except upsert_log.UpsertLogError as exc:
        print(f"elastiq: {where}: {exc}", file=sys.stderr)
        return 1
    for row in stable:
        print(json.dumps(row, separators=(",", ":")), flush=True)
    waiting = dpc_view.open_episodes(rows)
    if waiting:
        print(f"elastiq: tentative rows of episode(s) {waiting} await their correction",
              file=sys.stderr)
    return 0


def print_stable_topic(sink: str, ref: dict[str, str]) -> int:
    """The stable view of a Kafka sink (`ref`: `CompiledQuery.kafka_sinks`), read
    read_committed up to the end offsets taken at the start (`kafka_cli.read_to_end`); each
    record left out (forged or unreadable marks, a value that is no JSON object) is named on
    standard error with its partition, offset and reason (docs/kafka.md)."""
    from common import dpc_view
    from elastiq.kafka_cli import TopicUnreadable, read_to_end
    from elastiq.kafka_client_file import ClientFileError, read_client_security
    from executor.kafka_io import KafkaUnavailable, check_broker

    topic = ref["topic"]
    if ref.get("format", "jsonl") != "jsonl":
        print(f"elastiq: Kafka sink {sink} writes {ref['format']} values; its stable view "
              "reads JSON-lines topics only", file=sys.stderr)
        return 1
    try:
        security = read_client_security(Path(ref["security_file"])) \
            if ref.get("security_file") else {}
        check_broker(ref["bootstrap"], (), security, quiet=True)
        read = read_to_end(ref["bootstrap"], topic, security)
    except (ClientFileError, KafkaUnavailable, TopicUnreadable) as exc:
        print(f"elastiq: Kafka sink {sink}: {exc}", file=sys.stderr)
        return 1
    got = dpc_view.kafka_records(read.messages)
    for index, reason in got.refused:
        partition, offset = read.where[index]
        print(f"elastiq: {topic} partition {partition} offset {offset} left out: {reason}",
              file=sys.stderr)
    if read.unfinished:
        print(f"elastiq: {topic} partition(s) {read.unfinished} not read to their end offset "
              "in time (an open transaction?); the view is of what was read", file=sys.stderr)
    return _print_view(got.records, f"topic {topic}")


def cmd_tail(args: argparse.Namespace) -> int:
    code, reply = _call(lambda: _client(args).status(args.query))
    if code != 0:
        return code
    sinks, topics = reply.get("sinks", {}), reply.get("kafka_sinks", {})
    if args.sink in topics:
        if getattr(args, "stable", False):
            return print_stable_topic(args.sink, topics[args.sink])
        print(f"elastiq: '{args.sink}' is a Kafka sink: tail prints its stable view "
              f"(--stable); `elastiq kafka consume {topics[args.sink]['topic']}` follows it",
              file=sys.stderr)
        return 1
    if args.sink not in sinks:
        print(f"elastiq: query {args.query} has no file or Kafka sink '{args.sink}' "
              f"(sinks: {', '.join([*sinks, *topics]) or 'none'})", file=sys.stderr)
        return 1
    if getattr(args, "current", False):
        return print_current(sinks[args.sink])
    if getattr(args, "stable", False):
        return _print_stable(Path(sinks[args.sink]))
    follower, watch = Follower(), SinkWatch()
    for _, path in watch.update({args.sink: sinks[args.sink]}):
        if not args.from_start:
            follower.skip_existing(path)
    polled = time.monotonic()
    try:
        while True:
            for _, path in watch.files():
                for line in follower.lines(path):
                    print(line, flush=True)
            if time.monotonic() - polled >= TAIL_STATUS_SECONDS:  # a control tuple moved it?
                polled = time.monotonic()
                code, reply = _call(lambda: _client(args).status(args.query))
                now = reply.get("sinks", {}) if code == 0 else {}
                for _, path in watch.update({k: v for k, v in now.items() if k == args.sink}):
                    print(f"elastiq: sink {args.sink} now writes to {path}", file=sys.stderr,
                          flush=True)
            time.sleep(0.25)
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
