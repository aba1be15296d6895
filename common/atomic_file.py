"""Replacing a small file atomically: the one way Elastiq writes the files other processes
read while it runs (routing schedules, spool marks, endpoints, sink commit marks, fencing
tokens, channel key files, API tokens).

Owns `replace_file`: the text goes to a new temporary file beside the target (a name no other
writer uses: the process id and a random suffix; created exclusively, with the mode asked,
never following a link), is flushed (and fsynced when asked), then renamed over the target, so
a reader sees the old file or the new one, never half of one. A failure leaves the target as
it was and removes the temporary file. Does not own what the files say.
"""

from __future__ import annotations

import os
import secrets

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def replace_file(path: str | os.PathLike[str], text: str, *, mode: int = 0o644,
                 fsync: bool = False, dir_fd: int | None = None) -> None:
    """Make `path` hold `text` (UTF-8) in one rename; `mode` for a new file (e.g. 0o600 for a
    secret: the file is never readable by others, not even briefly); `fsync` before the rename
    when the content must survive a machine crash, not only the process's death. With
    `dir_fd` (an open folder, `common.safe_open`), `path` is a name in that folder: no path is
    resolved again, so a folder swapped meanwhile cannot redirect the write."""
    target = os.fspath(path)
    folder, name = os.path.split(target)
    temp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, _FLAGS, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            if fsync:
                os.fsync(out.fileno())
        os.replace(temp, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
