"""`elastiq control`: change what a running query does, or list what may change.

Owns the command's arguments, reading many tuples from a file or stdin (`read_tuples`, pure),
waiting for the tasks' acknowledgements and printing where and when each change took effect;
`--list` prints every adjustable parameter with its type and current value, and the fixed ones
with the reason. The API is `scheduler.api`; the checks are `compiler.control`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

from common.api_client import DEFAULT_URL
from elastiq.service_cli import TOKEN_FILE_HELP, _call, _client


class TupleSyntaxError(ValueError):
    """A line of a tuple file that is not `OPERATOR PARAMETER VALUE`."""


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "control", help="change a running query's parameters (control tuples), or --list them",
        description="Send control tuples <query, operator, parameter, value> to a running query: "
                    "checked together, applied by every task at a batch boundary all or none, "
                    "acknowledged with the batch (epoch) they take effect at.")
    c.add_argument("query")
    c.add_argument("operator", nargs="?", help="the operator's name in the spec")
    c.add_argument("parameter", nargs="?", help="e.g. condition, rate, path, endpoint")
    c.add_argument("value", nargs="?", help="the new value (quote it when it has spaces)")
    c.add_argument("--list", action="store_true",
                   help="show every adjustable parameter, its type and current value")
    c.add_argument("--file", metavar="FILE",
                   help="read tuples from FILE ('-' for stdin), one 'OPERATOR PARAMETER VALUE' "
                        "per line; '#' starts a comment; all are applied together or none")
    c.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for the acknowledgements (default 60)")
    c.add_argument("--json", action="store_true", help="print the raw JSON")
    c.add_argument("--scheduler", default=DEFAULT_URL, help=f"API URL (default {DEFAULT_URL})")
    c.add_argument("--token-file", metavar="FILE", help=TOKEN_FILE_HELP)
    c.set_defaults(handler=cmd_control)


def register_scale(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "scale", help="change a partitioned operator's parallelism while its query runs",
        description="Rescale a running operator to N instances (within its min-parallelism and "
                    "max-parallelism): its splitters switch at a micro-batch boundary, new "
                    "instances start, and instances a scale-in takes away stop once drained. "
                    "Nothing else restarts.")
    c.add_argument("query")
    c.add_argument("operator", help="the partitioned operator's name in the spec")
    c.add_argument("parallelism", type=int, nargs="?",
                   help="the number of instances to run (0: folded into the task after it, "
                        "for an operator with min-parallelism=\"0\")")
    fold = c.add_mutually_exclusive_group()
    fold.add_argument("--split", action="store_true",
                      help="cut the operator out of the task it is folded into, onto an agent of "
                           "its own (parallelism 1)")
    fold.add_argument("--merge", action="store_true",
                      help="fold the operator back into the task after it (parallelism 0)")
    c.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait until the instances run or have retired (default 300: "
                        "a new agent's executor starts a SparkSession first)")
    c.add_argument("--json", action="store_true", help="print the raw JSON")
    c.add_argument("--scheduler", default=DEFAULT_URL, help=f"API URL (default {DEFAULT_URL})")
    c.add_argument("--token-file", metavar="FILE", help=TOKEN_FILE_HELP)
    c.set_defaults(handler=cmd_scale)


def wanted_parallelism(parallelism: int | None, split: bool, merge: bool) -> int | str:
    """The parallelism `elastiq scale` asks for, or why its arguments ask for none (pure)."""
    if (parallelism is not None) + split + merge != 1:
        return "give the number of instances, --split or --merge (one of them)"
    return 1 if split else 0 if merge or parallelism is None else parallelism


def split_refusal(view: dict[str, Any], operator: str) -> str | None:
    """Why `--split` does not apply to an operator's status view, or None: it must be folded
    now (a split one is rescaled by number, never cut back to one instance by --split)."""
    if not view:
        return f"{operator} is not an elastic operator of this query"
    if not view.get("folded_into"):
        return f"{operator} cannot fold (it needs min-parallelism=\"0\"); give a number"
    if int(view.get("parallelism", 0)) != 0:
        return (f"{operator} is split already ({view.get('parallelism')} instances); give a "
                "number to rescale it")
    return None


def cmd_scale(args: argparse.Namespace) -> int:
    wanted = wanted_parallelism(args.parallelism, args.split, args.merge)
    if isinstance(wanted, str):
        print(f"elastiq scale: {wanted}", file=sys.stderr)
        return 2
    client = _client(args)
    if args.split:
        code, status = _call(lambda: client.status(args.query))
        if code != 0:
            return code
        refusal = split_refusal(_elastic_view(status, args.operator), args.operator)
        if refusal:
            print(f"elastiq scale: {refusal}", file=sys.stderr)
            return 1
    started = time.monotonic()
    code, reply = _call(lambda: client.scale(args.query, args.operator, wanted))
    if code != 0:
        return code
    request = reply.get("request", "")
    what = (f"fold {args.query}.{args.operator} into the task after it" if wanted == 0 else
            f"scale {args.query}.{args.operator} to {wanted} instances")
    print(f"{what} (control {request})")
    code = _await(args, client, request, started)
    if code != 0:  # e.g. a scale-out's splitters wait for new instances that found no place
        _, status = _call(lambda: client.status(args.query))
        _print_slots(status or {}, _elastic_view(status or {}, args.operator))
        return code
    return _await_instances(args, client, started)


def _elastic_view(status: dict[str, Any], operator: str) -> dict[str, Any]:
    return next((e for e in status.get("elastic", []) if e["operator"] == operator), {})


def _print_slots(status: dict[str, Any], view: dict[str, Any]) -> None:
    """One line per instance slot: its task and state, and what a pending one waits for."""
    waiting = {t.get("task_id"): t.get("waiting_for") for t in status.get("tasks", [])}
    for slot in view.get("slots", []):
        print(f"  slot {slot['slot']}: {slot['task']} {slot['state']}"
              + (" (retiring: draining)" if slot.get("retiring") else "")
              + (f" (waiting for {waiting[slot['task']]})" if waiting.get(slot["task"]) else ""))


def switch_line(rescale: dict[str, Any] | None) -> str | None:
    """Where a stateful rescale handed its state over: the event time its splitters switched
    at (None for a stateless one, which switches at a micro-batch)."""
    at = (rescale or {}).get("switch_ms")
    if at is None or at < 0:
        return None
    instant = datetime.fromtimestamp(at / 1000, tz=timezone.utc)
    return (f"  state handed over at event time {instant.isoformat(timespec='milliseconds')}: "
            "the old instances finish what lies before it, the new routing takes the rest")


def _await_instances(args: argparse.Namespace, client: Any, started: float) -> int:
    """Poll the query's status until the operator's first N slots run and the others are
    dormant; print each slot and the rescale's figures."""
    view: dict[str, Any] = {}
    status: dict[str, Any] = {}
    while time.monotonic() - started < args.timeout:
        code, status = _call(lambda: client.status(args.query))
        if code != 0:
            return code
        view = _elastic_view(status, args.operator)
        if view and instances_settled(view):
            break
        time.sleep(0.2)
    _print_slots(status, view)
    last = (view.get("rescales") or [None])[-1]
    if view and instances_settled(view):
        pause = f", splitters paused {last['pause_s']:.2f} s" if last and last.get(
            "pause_s") is not None else ""
        print(f"{args.operator} runs {instances_line(view)}{pause}; settled in "
              f"{time.monotonic() - started:.1f} s")
        switched = switch_line(last)
        if switched:
            print(switched)
        return 0
    print(f"elastiq: instances not settled after {args.timeout:g} s; `elastiq status "
          f"{args.query}` shows them", file=sys.stderr)
    return 1


def instances_line(view: dict[str, Any]) -> str:
    """Where an elastic operator runs: on n instances, or folded into a task (pure)."""
    if int(view.get("parallelism", 0)) == 0 and view.get("folded_into"):
        return f"folded into {view['folded_into']}"
    return f"{view.get('parallelism')} instances"


def instances_settled(view: dict[str, Any]) -> bool:
    """An operator's status view: its first `parallelism` slots run, the others are dormant
    (pure)."""
    n = int(view.get("parallelism", 0))
    slots = view.get("slots", [])
    return all((s["state"] == "running") == (i < n) and (i < n or s["state"] == "dormant")
               for i, s in enumerate(slots))


def read_tuples(lines: Iterable[str], source: str = "<stdin>") -> list[tuple[str, str, str]]:
    """`OPERATOR PARAMETER VALUE` lines (the value is the rest of the line) -> tuples; blank
    lines and `#` comments are skipped; TupleSyntaxError names every bad line (pure)."""
    tuples, problems = [], []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split(None, 2)
        if len(parts) < 3:
            problems.append(f"{source}:{number}: expected 'OPERATOR PARAMETER VALUE', got {text!r}")
            continue
        tuples.append((parts[0], parts[1], parts[2]))
    if problems:
        raise TupleSyntaxError("\n".join(problems))
    return tuples


def cmd_control(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    try:
        tuples = _tuples_of(args)
    except (TupleSyntaxError, OSError) as exc:
        print(f"elastiq: {exc}", file=sys.stderr)
        return 2
    client = _client(args)
    started = time.monotonic()
    code, reply = _call(lambda: client.control(args.query, tuples))
    if code != 0:
        return code
    request = reply.get("request", "")
    print(f"control {request} (version {reply.get('version')}): "
          + ", ".join(f"{o}.{p} = {v!r}" for o, p, v in tuples))
    return _await(args, client, request, started)


def _tuples_of(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    given = [args.operator, args.parameter, args.value]
    if args.file is not None:
        if any(g is not None for g in given):
            raise TupleSyntaxError("give tuples either on the command line or with --file")
        if args.file == "-":
            return read_tuples(sys.stdin)
        with open(args.file, encoding="utf-8") as f:
            return read_tuples(f, args.file)
    if any(g is None for g in given):
        raise TupleSyntaxError("usage: elastiq control QUERY OPERATOR PARAMETER VALUE "
                               "(or --file FILE, or --list)")
    return [(args.operator, args.parameter, args.value)]


def _await(args: argparse.Namespace, client: Any, request: str, started: float) -> int:
    """Poll the request until every task answered; print where and when it took effect."""
    view: dict[str, Any] = {}
    while time.monotonic() - started < args.timeout:
        code, view = _call(lambda: client.control_status(args.query, request))
        if code != 0:
            return code
        if view.get("state") != "pending":
            break
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    if args.json:
        print(json.dumps(view, indent=2))
    agents = _agents(args, client)
    for task_id, answer in sorted((view.get("tasks") or {}).items()):
        where = f"{task_id} on agent {agents.get(task_id, '?')}"
        if answer is None:
            print(f"  {where}: no acknowledgement yet")
        elif answer.get("applied"):
            epoch = answer.get("epoch", -1)
            when = f"from micro-batch {epoch}" if epoch >= 0 else answer.get("message", "")
            print(f"  {where}: {when} (query paused {answer.get('pause_s', 0):.2f} s)")
        else:
            print(f"  {where}: refused: {answer.get('message')}")
    state = view.get("state")
    if state == "applied" and not view.get("tasks"):
        print(f"  {view.get('reason') or 'nothing to apply'}")
    if state == "applied":
        print(f"applied in {elapsed:.2f} s")
        return 0
    if state == "refused":
        print(f"elastiq: refused, nothing changed: {view.get('reason')}", file=sys.stderr)
        return 1
    print(f"elastiq: not acknowledged after {args.timeout:g} s; `elastiq control --list "
          f"{args.query}` shows what is in force", file=sys.stderr)
    return 1


def _agents(args: argparse.Namespace, client: Any) -> dict[str, str]:
    code, view = _call(lambda: client.status(args.query))
    if code != 0 or not view:
        return {}
    return {t.get("task_id"): t.get("agent_id") or "?" for t in view.get("tasks", [])}


def _list(args: argparse.Namespace) -> int:
    code, view = _call(lambda: _client(args).control_status(args.query))
    if code != 0:
        return code
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    print(f"query {args.query} ({view.get('phase')}), parameters version {view.get('version')}")
    rows = [(a["operator"], a["parameter"], a["type"], a["value"],
             "" if a["value"] == a["initial"] else f"(was {a['initial']})")
            for a in view.get("adjustable", [])]
    if rows:
        print(_table(("OPERATOR", "PARAMETER", "TYPE", "VALUE", ""), rows))
    else:
        print("nothing in this query can change while it runs")
    fixed = view.get("fixed", [])
    if fixed:
        print("\nfixed while it runs:")
        for (operator, reason), parameters in _grouped(fixed).items():
            print(f"  {operator}.{', '.join(parameters)}: {reason}")
    return 0


def _grouped(fixed: list[dict[str, str]]) -> dict[tuple[str, str], list[str]]:
    """(operator, reason) -> its parameters, in listing order."""
    groups: dict[tuple[str, str], list[str]] = {}
    for f in fixed:
        groups.setdefault((f["operator"], f["reason"]), []).append(f["parameter"])
    return groups


def _table(head: tuple[str, ...], rows: Sequence[tuple[Any, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in (head, *rows))
