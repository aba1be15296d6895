"""The endpoints file a task's channel sources watch (executor.endpoints_file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.endpoints_file import EndpointWatcher, endpoints_path, read_endpoints, write_endpoints


def test_written_endpoints_read_back_and_a_watcher_sees_each_change_once(tmp_path: Path) -> None:
    path = endpoints_path(str(tmp_path / "ckpt"))
    watcher = EndpointWatcher(path)
    assert watcher.changed() is None and read_endpoints(path) == {}
    write_endpoints(path, {"q/a": "tcp://127.0.0.1:5000"})
    assert watcher.changed() == {"q/a": "tcp://127.0.0.1:5000"}
    assert watcher.changed() is None
    write_endpoints(path, {"q/a": "tcp://127.0.0.2:5001", "q/b": "tcp://127.0.0.1:5002"})
    assert watcher.changed() == {"q/a": "tcp://127.0.0.2:5001", "q/b": "tcp://127.0.0.1:5002"}
    assert not list(Path(path).parent.glob("*.tmp"))


def test_a_file_that_is_not_a_mapping_of_strings_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"q/a": 5}))
    with pytest.raises(ValueError, match="channel id -> endpoint"):
        read_endpoints(str(path))
