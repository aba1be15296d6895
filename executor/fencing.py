"""Fencing of task attempts: a stale attempt's writes are refused, whatever the cluster manager does.

Owns `Fence`, one attempt's fencing token (the epoch the scheduler issued with its launch, larger
for every later attempt, see `scheduler.state`) and the fence file of the task's checkpoint
folder, `<checkpoint>/fence` (JSON `{"epoch": n, "attempt": "<mesos task id>"}`), with its lock
file `fence.lock`. A launch `raise_()`s the fence to its epoch before it starts anything; every
commit of the attempt runs inside `holding()`, which checks the fence under a shared lock: once a
newer attempt has raised it, an older one's sink call fails with `Fenced` before writing, and Spark
commits no batch whose sink call failed. Raising takes the lock exclusively, so it waits for a
commit in progress: after `raise_()` returns, no older attempt writes again. Real Mesos never
fences an agent cut off from its master (it keeps running its tasks), so this is what keeps two
live attempts from both changing one checkpoint or one sink. Works across hosts as far as the
checkpoint folder's file system honours `flock` (local disks, NFSv4, CephFS; docs/deploy.md).
A task's channel writes are fenced the same way: its channel sink is its one sink, so a stale
producer's batch is refused before it reaches its channel writer (`executor.channels.writer` is
unchanged).
Epoch 0 means unfenced (a launch from a scheduler that issues no tokens). Does not own the epoch's
issue (`scheduler.state`) nor where the checkpoint folder is (`executor.mesos_executor`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from contextlib import contextmanager
from typing import Iterator

from common.atomic_file import replace_file

log = logging.getLogger(__name__)

FENCE_FILE = "fence"
LOCK_FILE = "fence.lock"


class Fenced(RuntimeError):
    """A write of a task attempt that a newer attempt has superseded; it is refused."""


class Fence:
    """One attempt's fencing token and the fence file of its task's checkpoint folder."""

    def __init__(self, folder: str, epoch: int, attempt: str = "") -> None:
        self.folder, self.epoch, self.attempt = folder, int(epoch), attempt
        self.refused = 0  # writes of this attempt refused

    @property
    def path(self) -> str:
        return os.path.join(self.folder, FENCE_FILE)

    def current(self) -> int:
        """The epoch the fence stands at (0: never raised; an unreadable file counts as 0 and is
        replaced by the next raise)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                epoch = json.load(f).get("epoch", 0)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, AttributeError):
            log.warning("fence %s is unreadable; taken as 0", self.path)
            return 0
        return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0

    def raise_(self, timeout: float = 60.0) -> None:
        """Raise the fence to this attempt's epoch (waiting at most `timeout` s for a commit in
        progress); `Fenced` if a newer attempt has raised it already, TimeoutError if a commit
        held it longer."""
        if not self.epoch:
            return
        os.makedirs(self.folder, exist_ok=True)
        with self._locked(fcntl.LOCK_EX, timeout):
            standing = self.current()
            if standing > self.epoch:
                raise Fenced(f"attempt {self.attempt or self.epoch} is stale: the fence of "
                             f"{self.folder} stands at epoch {standing} > {self.epoch}")
            if standing < self.epoch:
                self._write()
                log.info("fence %s raised to epoch %s (%s)", self.folder, self.epoch,
                         self.attempt)

    @contextmanager
    def holding(self, timeout: float = 60.0) -> Iterator[None]:
        """Run a commit of this attempt: `Fenced` before it if a newer attempt raised the fence;
        no newer attempt raises it while the commit runs."""
        if not self.epoch:
            yield
            return
        with self._locked(fcntl.LOCK_SH, timeout):
            standing = self.current()
            if standing > self.epoch:
                self.refused += 1
                message = (f"write of attempt {self.attempt or self.epoch} refused: a newer "
                           f"attempt (epoch {standing} > {self.epoch}) owns {self.folder}")
                log.warning("%s", message)
                raise Fenced(message)
            yield

    def _write(self) -> None:
        replace_file(self.path, json.dumps({"epoch": self.epoch, "attempt": self.attempt}),
                     fsync=True)

    @contextmanager
    def _locked(self, kind: int, timeout: float) -> Iterator[None]:
        os.makedirs(self.folder, exist_ok=True)
        fd = os.open(os.path.join(self.folder, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, kind | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"fence {self.folder} stayed locked {timeout} s") \
                            from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # releases the lock

