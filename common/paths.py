"""Where file sources and sinks may point: the path roots an operator configures.

Owns `PathRoots` (the folders file operators may read and write, each kept as its real path),
the defaults (`local_roots` for a local `elastiq run/validate/compile`: the spec's folder, the
state directory's data folder and the operator's own; `configured_roots` for a process serving
remote clients: the operator's, from `$ELASTIQ_PATH_ROOTS`, else its working folder and its
default state data folder) and `confine`, which decides whether one path may be used: no control
character or NUL, not a folder name (a trailing separator), and, once relative parts are taken
against the base folder and `..` and symbolic links resolved, inside a root. The decision is
pure but for resolving links, which goes through the `realpath` it is given. Does not own where
a refused path is reported (`compiler.validate.check_paths`, `compiler.control`, the executor's
open-time re-check in `executor.sinks` / `executor.sources`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

ENV_VAR = "ELASTIQ_PATH_ROOTS"  # os.pathsep-separated folders
DEFAULT_STATE_DIR = "elastiq-state"  # `elastiq scheduler`'s default --state-dir
DATA_FOLDER = "data"  # the folder of a state directory that file operators may use
MAX_PATH_CHARS = 4096  # Linux's PATH_MAX

RealPath = Callable[[str], str]


class PathRefused(ValueError):
    """A path a file operator may not use, with the reason and what to do."""


@dataclass(frozen=True)
class PathRoots:
    """The folders (real, absolute paths) file operators may read and write under."""

    roots: tuple[str, ...]

    @classmethod
    def of(cls, folders: Iterable[str | os.PathLike[str]],
           realpath: RealPath = os.path.realpath) -> "PathRoots":
        found: list[str] = []
        for folder in folders:
            text = os.fspath(folder)
            if not text or control_characters(text):
                continue
            real = realpath(os.path.abspath(text))
            if real not in found:
                found.append(real)
        return cls(tuple(found))

    def to_env(self) -> str:
        return os.pathsep.join(self.roots)

    def plus(self, other: "PathRoots") -> "PathRoots":
        return PathRoots(self.roots + tuple(r for r in other.roots if r not in self.roots))

    def describe(self) -> str:
        return ", ".join(self.roots) or "none"


def roots_from_env(environ: Mapping[str, str] = os.environ,
                   realpath: RealPath = os.path.realpath) -> PathRoots | None:
    """The roots `$ELASTIQ_PATH_ROOTS` names; None when it is not set."""
    text = environ.get(ENV_VAR)
    if text is None:
        return None
    return PathRoots.of((p for p in text.split(os.pathsep) if p), realpath)


def local_roots(spec_dir: str | os.PathLike[str], extra: Iterable[str] = (),
                state_dir: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] = os.environ,
                realpath: RealPath = os.path.realpath) -> PathRoots:
    """Roots for a spec compiled on the operator's own machine: the spec's folder, the state
    directory's data folder (default ./elastiq-state/data), `extra` (--path-root) and those of
    `$ELASTIQ_PATH_ROOTS`."""
    state = os.fspath(state_dir) if state_dir is not None else DEFAULT_STATE_DIR
    base = PathRoots.of([spec_dir, os.path.join(state, DATA_FOLDER), *extra], realpath)
    from_env = roots_from_env(environ, realpath)
    return base.plus(from_env) if from_env is not None else base


def service_roots(state_dir: str | os.PathLike[str], extra: Iterable[str] = (),
                  cwd: str | None = None, environ: Mapping[str, str] = os.environ,
                  realpath: RealPath = os.path.realpath) -> PathRoots:
    """Roots of `elastiq scheduler`: its state directory's data folder, the --path-root folders
    (`extra`; none given: its working folder) and those of `$ELASTIQ_PATH_ROOTS`."""
    chosen = list(extra) or [cwd if cwd is not None else os.getcwd()]
    base = PathRoots.of([os.path.join(os.fspath(state_dir), DATA_FOLDER), *chosen], realpath)
    from_env = roots_from_env(environ, realpath)
    return base.plus(from_env) if from_env is not None else base


def configured_roots(environ: Mapping[str, str] = os.environ, cwd: str | None = None,
                     realpath: RealPath = os.path.realpath) -> PathRoots:
    """Roots of a process compiling specs for remote clients (the scheduler's API): the ones
    `$ELASTIQ_PATH_ROOTS` names (`elastiq scheduler` sets it from --path-root and its state
    directory), else its working folder and ./elastiq-state/data. A client's own folder is
    never one of them."""
    from_env = roots_from_env(environ, realpath)
    if from_env is not None:
        return from_env
    here = cwd if cwd is not None else os.getcwd()
    return PathRoots.of([here, os.path.join(here, DEFAULT_STATE_DIR, DATA_FOLDER)], realpath)


def control_characters(text: str) -> list[str]:
    """The control characters (NUL included) in `text`, as escapes (pure)."""
    return sorted({repr(ch)[1:-1] for ch in text if ord(ch) < 32 or ord(ch) == 127})


def confine(value: str, base: str | os.PathLike[str], roots: PathRoots,
            realpath: RealPath = os.path.realpath) -> str:
    """The absolute path `value` names (relative to `base`), if a file operator may use it;
    PathRefused otherwise. `..` and symbolic links are resolved before the roots are checked,
    so neither leads out of them."""
    bad = control_characters(value)
    if bad:
        raise PathRefused(f"the path has control characters ({', '.join(bad)}); "
                          "name a file without them")
    if not value.strip():
        raise PathRefused("the path is empty")
    if len(value) > MAX_PATH_CHARS:
        raise PathRefused(f"the path has {len(value)} characters; at most {MAX_PATH_CHARS}")
    if value.endswith(("/", os.sep)) or os.path.basename(value) in (".", ".."):
        raise PathRefused(f"{value!r} names a folder; name a file in it")
    joined = value if os.path.isabs(value) else os.path.join(os.fspath(base), value)
    real = realpath(os.path.abspath(joined))
    if not any(inside(real, root) for root in roots.roots):
        shown = value if real == value else f"{value} (that is {real})"
        raise PathRefused(f"{shown} is outside the allowed folders ({roots.describe()}); "
                          "write under one of them, or let the operator add a folder with "
                          f"--path-root DIR (or ${ENV_VAR})")
    return os.path.abspath(joined)


def executor_roots(environ: Mapping[str, str] = os.environ,
                   realpath: RealPath = os.path.realpath) -> PathRoots:
    """The roots an executor opens files under: `$ELASTIQ_PATH_ROOTS` (set by `elastiq run`
    and `elastiq scheduler`), else the whole file system."""
    roots = roots_from_env(environ, realpath)
    return roots if roots is not None else PathRoots(("/",))


def confine_at_open(path: str, environ: Mapping[str, str] = os.environ,
                    realpath: RealPath = os.path.realpath) -> str:
    """The executor's re-check of a path it is about to open (defence in depth: the roots
    travel in its environment, `$ELASTIQ_PATH_ROOTS`, set by `elastiq run` and `elastiq
    scheduler`); without that variable, only the path's form is checked. The open itself then
    goes through `common.safe_open`, so the check still holds when the path changes later."""
    return confine(path, os.getcwd(), executor_roots(environ, realpath), realpath)


def inside(path: str, root: str) -> bool:
    """Whether the absolute `path` is `root` or lies under it (pure)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
