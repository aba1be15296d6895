"""The `elastiq` command line.

Owns argument parsing and what each command prints and returns (exit status 0 on success, 1
when the user's input has problems, 2 for usage errors). The work itself lives elsewhere:
the compiler (`compiler.pipeline`), the plan renderings (`elastiq.explain`), the local runner
(`elastiq.run`) and the scheduler service and its client (`scheduler`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from common.diagnostics import Diagnostic, SpecError
from common.paths import PathRoots, local_roots
from compiler.pipeline import check_spec_text, compile_spec_file

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except SpecError as e:
        _print_diagnostics(e.diagnostics)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elastiq", description="Elastic stream queries on Spark and "
                                                            "Mesos, written as XML dataflows.")
    sub = p.add_subparsers(metavar="COMMAND")

    v = sub.add_parser("validate", help="check specs; report every problem with file:line:column")
    v.add_argument("specs", nargs="+", metavar="SPEC")
    add_path_root_option(v)
    v.set_defaults(handler=cmd_validate)

    e = sub.add_parser("explain", help="show the logical and physical plans and the tasks")
    e.add_argument("spec", metavar="SPEC")
    e.add_argument("-o", "--out", metavar="DIR", help="where to write the pictures "
                   "(default: elastiq-out/<query>/plan)")
    e.add_argument("--rules", metavar="DIR", help="a folder of more rewrite rule files (*.rule)")
    e.add_argument("--scheduler", metavar="URL", help="also show what a submit to this "
                   "scheduler's API would read from running queries (automatic sharing)")
    e.add_argument("--token-file", metavar="FILE", help="the API token's file (with --scheduler)")
    add_path_root_option(e)
    e.set_defaults(handler=cmd_explain)

    c = sub.add_parser("compile", help="write the generated task programs")
    c.add_argument("spec", metavar="SPEC")
    c.add_argument("-o", "--out", metavar="DIR", help="output folder "
                   "(default: elastiq-out/<query>/tasks)")
    c.add_argument("--rules", metavar="DIR", help="a folder of more rewrite rule files (*.rule)")
    add_path_root_option(c)
    c.set_defaults(handler=cmd_compile)

    k = sub.add_parser("keygen", help="write a channel CURVE keypair file (0600) and print its "
                       "public key (for a network sink's or source's key-file)")
    k.add_argument("path", metavar="FILE", help="the key file to create (must not exist)")
    k.set_defaults(handler=cmd_keygen)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return p


def add_path_root_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path-root", action="append", default=[], metavar="DIR",
                   help="a folder file sources and sinks may use besides the spec's own and "
                        "elastiq-state/data (repeatable; also $ELASTIQ_PATH_ROOTS)")


def spec_roots(spec: str | Path, args: argparse.Namespace,
               state_dir: str | Path | None = None) -> PathRoots:
    """The path roots of a spec compiled here: its folder, the state data folder, --path-root
    and $ELASTIQ_PATH_ROOTS (`common.paths.local_roots`)."""
    return local_roots(Path(spec).resolve().parent, getattr(args, "path_root", []) or [],
                       state_dir)


def cmd_keygen(args: argparse.Namespace) -> int:
    """Create a keypair file readable by its owner only; print the public key (in hexadecimal
    digits, which a spec takes without escaping), never the secret one."""
    from executor.channels.auth import KeyPair, key_hex, write_key_file

    pair = KeyPair.generate()
    try:
        write_key_file(args.path, pair)
    except OSError as e:
        print(f"elastiq keygen: cannot create {args.path}: {e.strerror}", file=sys.stderr)
        return 1
    print(key_hex(pair.public))
    return 0


def _register_service_commands(sub: argparse._SubParsersAction) -> None:
    from elastiq.service_cli import register

    register(sub)


def _register_control_command(sub: argparse._SubParsersAction) -> None:
    from elastiq.control_cli import register, register_scale

    register(sub)
    register_scale(sub)


def _register_kafka_command(sub: argparse._SubParsersAction) -> None:
    from elastiq.kafka_cli import register

    register(sub)


# Commands whose modules live elsewhere (run, scheduler, submit, status, stop, tail, migrate,
# control, scale, kafka).
_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _register_service_commands, _register_control_command, _register_kafka_command]


def _print_diagnostics(diagnostics: Sequence[Diagnostic]) -> None:
    for d in diagnostics:
        print(d.render(), file=sys.stderr)
    errors = sum(1 for d in diagnostics if d.severity == "error")
    warnings = len(diagnostics) - errors
    if errors:
        print(f"{errors} error{'s' if errors != 1 else ''}"
              + (f", {warnings} warning{'s' if warnings != 1 else ''}" if warnings else ""),
              file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    status = 0
    for path in args.specs:
        try:
            text = Path(path).read_bytes()
        except OSError as e:
            print(f"{path}:1:1: error: cannot read the spec: {e.strerror}", file=sys.stderr)
            status = 1
            continue
        graph, diagnostics = check_spec_text(text, path, path_roots=spec_roots(path, args),
                                              check_inputs=True)
        _print_diagnostics(diagnostics)
        if graph is None:
            status = 1
        else:
            print(f"{path}: ok ({len(graph.nodes)} operators, {len(graph.streams)} streams)")
    return status


def cmd_explain(args: argparse.Namespace) -> int:
    from elastiq.explain import explain, write_pictures

    code, offers = _share_offers(args)
    if code:
        return code
    compilation = compile_spec_file(args.spec, rules_dir=args.rules, plan_only=True,
                                    path_roots=spec_roots(args.spec, args), check_inputs=True,
                                    offers=offers)
    _print_diagnostics(compilation.warnings + compilation.refused)
    out = Path(args.out or Path("elastiq-out") / compilation.query.query_id / "plan")
    print(explain(compilation))
    for written in write_pictures(compilation, out):
        print(f"wrote {written}")
    return 0


def _share_offers(args: argparse.Namespace) -> tuple[int, dict[str, str] | None]:
    """The running streams a submit to --scheduler may read (None without it), after the exit
    code of asking (1: the API refused or is unreachable, said on stderr)."""
    if not args.scheduler:
        return 0, None
    from common.api_client import SchedulerClient
    from common.api_token import read_client_token
    from elastiq.service_cli import _call

    return _call(lambda: SchedulerClient(
        args.scheduler, token=read_client_token(args.token_file, args.scheduler)).share_offers())


def cmd_compile(args: argparse.Namespace) -> int:
    compilation = compile_spec_file(args.spec, rules_dir=args.rules,
                                    path_roots=spec_roots(args.spec, args), check_inputs=True)
    _print_diagnostics(compilation.warnings)
    out = Path(args.out or Path("elastiq-out") / compilation.query.query_id / "tasks")
    out.mkdir(parents=True, exist_ok=True)
    for task in compilation.query.tasks:
        path = out / f"{task.task_id.replace('.', '_')}.py"
        path.write_text(task.program)
        print(f"wrote {path}  ({', '.join(task.operators)})")
    manifest = out / "query.json"
    manifest.write_text(compilation.query.to_json())
    print(f"wrote {manifest}  (the compiled query the scheduler deploys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
