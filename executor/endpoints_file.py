"""A task's current channel endpoints, kept as a small JSON file in the task's folder.

Owns the one place where a running task learns that an upstream writer moved: the executor
writes `<checkpoint dir>/control/endpoints.json` ({channel id: endpoint}) when it launches the
task and again whenever the scheduler retargets a channel (the paper's `target-addr` control
tuple); the task's channel sources, which run in Spark's Python source-runner processes, watch
that file at every micro-batch and reconnect when their channel's endpoint changes. A file is
the simplest thing both processes can see; writes are atomic (write, fsync, rename).
Does not own the channel protocol (`executor.channels`) nor who decides a retarget
(`scheduler.state`).
"""

from __future__ import annotations

import json
import os
from typing import Mapping

from common.atomic_file import replace_file


def endpoints_path(checkpoint_dir: str) -> str:
    """Where the endpoints file of the task whose checkpoint folder is `checkpoint_dir` lives."""
    return os.path.join(checkpoint_dir, "control", "endpoints.json")


def write_endpoints(path: str, endpoints: Mapping[str, str]) -> None:
    """Replace the file atomically with `endpoints` (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, json.dumps(dict(sorted(endpoints.items()))), fsync=True)


def read_endpoints(path: str) -> dict[str, str]:
    """The endpoints recorded at `path`; {} when there is no file yet."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in data.items()):
        raise ValueError(f"{path}: expected a JSON object of channel id -> endpoint")
    return data


class EndpointWatcher:
    """Tells whether the endpoints file changed since the last look (one `stat` per call)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None

    def changed(self) -> dict[str, str] | None:
        """The new endpoints when the file changed since the last call, else None."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp == self._seen:
            return None
        self._seen = stamp
        return read_endpoints(self.path)
