"""Opening a file operator's file so that no swap in its path can redirect the open.

Owns how the executor opens the files of file sources and sinks (and their commit marks): from
a descriptor of the path root (`common.paths.PathRoots`) each folder of the path is opened
relative to the one before (`dir_fd=`, openat-style) with `O_NOFOLLOW | O_DIRECTORY`, and the
file relative to its folder with `O_NOFOLLOW`, so a symbolic link at any step below the root,
put there before or during a run, is refused instead of followed; the file must be a regular
file (a FIFO, device or socket is refused with its own message, and opening never blocks on a
FIFO) and have one link (a hard link to a file elsewhere is refused: the sink would change it,
the source read it). `identity` (device, inode) lets a holder of a descriptor check on every use that the
path still names what it holds (`same_file`).

Where a file is, is decided once, when it is first opened: its real path (as
`common.paths.confine` resolves it, so a link that stays inside the roots works as `validate`
said it would) under the deepest root holding it (`rooted`). From then on that path is walked
without following any link: a link swapped in later, at any step, is refused, and so is a
path that resolves out of the roots when the file is opened again (a restarted task). Also owns
`private_folder`, how a folder holding tuples at rest (a spool, a channel log, an executor's
state) is made: 0700 (and made so if it was not), its data files 0600, so no other local user
reads what CURVE protects on the wire. Kept apart from
`common.paths` (a pure decision whether a path may be used, for the compiler and the API) because
this module is the I/O that makes the decision hold at the moment of each open.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from dataclasses import dataclass
from typing import Callable

from common.paths import PathRefused, PathRoots, inside

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # never block on a swapped-in FIFO
FOLDER_MODE = 0o700  # folders the executor makes for a sink, and every folder of data at rest
PRIVATE_FILE_MODE = 0o600  # a file holding tuples at rest (spool batches, channel log segments)

Identity = tuple[int, int]  # (st_dev, st_ino)


class FileRefused(OSError):
    """A file (or a folder on its path) the executor will not open: a symbolic link, not a
    regular file, a hard link, or no longer the file that was opened."""


@dataclass(frozen=True)
class RootedPath:
    """A file's path as its root and the names below it (folders, then the file)."""

    root: str
    parts: tuple[str, ...]

    @property
    def path(self) -> str:
        return os.path.join(self.root, *self.parts)

    @property
    def name(self) -> str:
        return self.parts[-1]

    def sibling(self, name: str) -> "RootedPath":
        return RootedPath(self.root, self.parts[:-1] + (name,))


def rooted(path: str, roots: PathRoots,
           realpath: Callable[[str], str] = os.path.realpath) -> RootedPath:
    """`path`'s real path (links resolved once, now) under the deepest root that holds it;
    PathRefused when none does."""
    real = realpath(os.path.abspath(path))
    holders = [r for r in roots.roots if inside(real, r) and real != r]
    if holders:
        root = max(holders, key=len)
        parts = tuple(os.path.relpath(real, root).split(os.sep))
        if not any(p in ("", ".", "..") for p in parts):
            return RootedPath(root, parts)
    raise PathRefused(f"{path} is not a file under the allowed folders ({roots.describe()})")


def identity(fd: int) -> Identity:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def open_folder(where: RootedPath, create: bool = False) -> int:
    """A descriptor of the folder holding `where`'s file, each step opened without following
    a link (`create`: missing folders are made, 0700)."""
    fd = os.open(where.root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the root itself is the operator's
    for index, part in enumerate(where.parts[:-1]):
        fd = _step(fd, part, where, index, create)  # closes the folder it steps from
    return fd


def _step(parent: int, part: str, where: RootedPath, index: int, create: bool) -> int:
    """Open folder `part` under `parent` (closed here either way)."""
    try:
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(part, FOLDER_MODE, dir_fd=parent)
            except FileExistsError:
                pass
            return os.open(part, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(parent, part):
                shown = os.path.join(where.root, *where.parts[:index + 1])
                raise FileRefused(exc.errno, "it is a symbolic link, not a folder; file "
                                             "operators follow no link", shown) from None
            raise
    finally:
        os.close(parent)


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind_of(mode: int) -> str | None:
    """What a file of `st_mode` is when it is not a regular file ("a FIFO (named pipe)", ...);
    None for a regular file (pure)."""
    if stat.S_ISREG(mode):
        return None
    return next((text for test, text in _KINDS if test(mode)), "not a regular file")


def _is_link(folder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=folder).st_mode)
    except OSError:
        return False


def _kind(folder: int, name: str) -> str:
    """What `name` in `folder` is, for a message (never followed)."""
    try:
        mode = os.lstat(name, dir_fd=folder).st_mode
    except OSError:
        return "it changed while it was opened"
    return f"it is {kind_of(mode) or 'a regular file'}"


def open_in(folder: int, where: RootedPath, write: bool = False, create: bool = False,
            mode: int = 0o644) -> tuple[int, bool]:
    """(descriptor, whether it was created) of `where`'s file in the open `folder`: read-only,
    or (`write`) read-write appending, made with `mode` if missing and `create`. FileRefused
    for a link, a file that is not regular, or one with more than one link."""
    flags = _FILE_FLAGS | (os.O_RDWR | os.O_APPEND if write else os.O_RDONLY)
    name, created = where.name, False
    try:
        if create:
            try:
                fd, created = os.open(name, flags | os.O_CREAT | os.O_EXCL, mode,
                                      dir_fd=folder), True
            except FileExistsError:
                fd = os.open(name, flags, dir_fd=folder)
        else:
            fd = os.open(name, flags, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EWOULDBLOCK):
            raise FileRefused(exc.errno, f"{_kind(folder, name)}, not a regular file; file "
                                         "operators use regular files only", where.path) from None
        raise
    try:
        _check_opened(fd, where)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def _check_opened(fd: int, where: RootedPath) -> None:
    st = os.fstat(fd)
    kind = kind_of(st.st_mode)
    if kind is not None:
        raise FileRefused(errno.EINVAL, f"it is {kind}, not a regular file; file operators use "
                                        "regular files only", where.path)
    if st.st_nlink > 1:
        raise FileRefused(errno.EMLINK, f"the file has {st.st_nlink} hard links; a file "
                                        "operator uses only a file with one (copy it)",
                          where.path)


def open_file(where: RootedPath, write: bool = False,
              create: bool = False) -> tuple[int, int, bool]:
    """(folder descriptor, file descriptor, whether created) of `where`, walked from its root
    (`open_folder`, folders made when `create`) and opened by `open_in`."""
    folder = open_folder(where, create=create)
    try:
        fd, created = open_in(folder, where, write=write, create=create)
    except BaseException:
        os.close(folder)
        raise
    return folder, fd, created


def same_file(where: RootedPath, folder: int, fd: int) -> None:
    """FileRefused unless `where`, walked again from its root, still names the folder and the
    file the descriptors hold (a regular file with one link): nothing swapped a link, another
    file or another folder in since they were opened."""
    now = open_folder(where)
    try:
        if identity(now) != identity(folder):
            raise FileRefused(errno.ESTALE, "its folder was replaced since it was opened",
                              where.path)
        try:
            st = os.lstat(where.name, dir_fd=now)
        except FileNotFoundError:
            raise FileRefused(errno.ESTALE, "the file was removed or renamed since it was "
                                            "opened", where.path) from None
        if (st.st_dev, st.st_ino) != identity(fd):
            raise FileRefused(errno.ESTALE, f"the file was replaced since it was opened "
                                            f"({_kind(now, where.name)[3:]})", where.path)
        if os.fstat(fd).st_nlink > 1:
            raise FileRefused(errno.EMLINK, "the file was given another hard link since it "
                                            "was opened", where.path)
    finally:
        os.close(now)


def read_in(folder: int, name: str, limit: int) -> bytes | None:
    """Up to `limit` bytes of the regular file `name` in `folder` (not followed); None when
    there is none."""
    try:
        fd, _ = open_in(folder, RootedPath("", (name,)))
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def private_folder(path: str | os.PathLike[str]) -> None:
    """Make `path` (and missing parents) a folder only its owner can enter (0700), also when
    it was there already with a wider mode."""
    os.makedirs(path, FOLDER_MODE, exist_ok=True)
    if stat.S_IMODE(os.stat(path).st_mode) != FOLDER_MODE:
        os.chmod(path, FOLDER_MODE)
