"""Following a query's file sinks from the terminal, shared by `elastiq run` and `elastiq tail`.

Owns `Follower` (each new complete line of growing files, once) and `SinkWatch` (which files of
each file sink to follow as control tuples move them). It reads files only; asking the scheduler
for the sinks in force is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator


@dataclass
class Follower:
    """Follows files that grow: yields each new complete line once."""

    offsets: dict[Path, int] = field(default_factory=dict)

    def lines(self, path: Path) -> Iterator[str]:
        try:
            size = path.stat().st_size
        except OSError:
            return
        start = self.offsets.get(path, 0)
        if size <= start:
            return
        with open(path, "rb") as f:
            f.seek(start)
            chunk = f.read(size - start)
        end = chunk.rfind(b"\n") + 1
        self.offsets[path] = start + end
        for line in chunk[:end].decode("utf-8", "replace").splitlines():
            yield line

    def skip_existing(self, path: Path) -> None:
        """Start following `path` at its current end (show this run's lines, not earlier ones)."""
        if path.exists():
            self.offsets[path] = path.stat().st_size


@dataclass
class SinkWatch:
    """The files of each file sink to follow: the path in force (a control tuple may change it)
    and every earlier one (the batch in flight at the change may still land there)."""

    paths: dict[str, list[Path]] = field(default_factory=dict)

    def update(self, sinks: dict[str, str]) -> list[tuple[str, Path]]:
        """Take the sinks' paths in force; returns the (sink, path) pairs that are new."""
        added = []
        for sink, path in sorted(sinks.items()):
            known = self.paths.setdefault(sink, [])
            if Path(path) not in known:
                known.append(Path(path))
                added.append((sink, Path(path)))
        return added

    def files(self) -> list[tuple[str, Path]]:
        return [(sink, path) for sink, paths in sorted(self.paths.items()) for path in paths]
