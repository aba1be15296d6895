"""Tuples at rest are the query's alone: spool batches (`.arrow`) and channel log segments
(`.seg`) are 0600 in 0700 folders, also where an older version left a folder 0755 or a segment
0644, and an executor's state folder (task programs, Spark checkpoints and state stores) is
0700. Oracle: the modes `os.stat` reports. No Spark."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pyarrow as pa

from executor import spool
from executor.channels.log import ChannelLog


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_spool_batches_are_0600_in_a_0700_folder(tmp_path: Path) -> None:
    folder = tmp_path / "spool" / "ch"
    os.makedirs(folder, 0o755)
    os.chmod(folder, 0o755)  # as an older version left it
    spool.write_committed(str(folder), 0)
    spool.write_batch(str(folder), 1, pa.table({"id": [1, 2, 3]}))
    (batch,) = [p for p in folder.iterdir() if p.suffix == ".arrow"]
    assert mode(batch) == 0o600 and mode(folder) == 0o700


def test_channel_log_segments_are_0600_in_a_0700_folder(tmp_path: Path) -> None:
    folder = tmp_path / "channels" / "ch"
    log = ChannelLog(folder, segment_bytes=64)
    log.append(1, 0, 1, b"x" * 100)
    log.append(2, 1, 1, b"y" * 100)  # a second segment
    log.close()
    segments = sorted(folder.glob("*.seg"))
    assert len(segments) == 2 and {mode(p) for p in segments} == {0o600}
    assert mode(folder) == 0o700
    os.chmod(segments[-1], 0o644)  # a segment an older version wrote
    os.chmod(folder, 0o755)
    reopened = ChannelLog(folder, segment_bytes=64)
    reopened.append(3, 2, 1, b"z")
    reopened.close()
    assert mode(segments[-1]) == 0o600 and mode(folder) == 0o700


def test_a_private_folder_is_made_0700_and_narrowed_if_wider(tmp_path: Path) -> None:
    from common.safe_open import private_folder

    state = tmp_path / "state"
    private_folder(state)
    assert mode(state) == 0o700
    os.chmod(state, 0o755)
    private_folder(state)
    assert mode(state) == 0o700
