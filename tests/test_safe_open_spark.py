"""Spark layer: the swap attack on a running query. A paced file replay writes to a file sink
under a path root; between micro-batches the sink's file is replaced by a symbolic link to a
file outside the root. The query fails on the next batch (the sink refuses the swapped path)
and the outside file keeps every byte; what the sink had written is the file's first rows, as a
plain-Python parse gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.paths import ENV_VAR
from executor.runtime import TaskRuntime
from test_file_lines import SENSOR, oracle_parse, sensor_rows, write_input
from test_runtime_support import read_sink, wait_for

pytestmark = pytest.mark.spark


def test_a_sink_file_swapped_for_a_link_mid_run_fails_the_query_and_spares_the_target(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    secret = outside / "secret.jsonl"
    secret.write_bytes(b'{"sensor":"x"}\n' * 5000)
    before = secret.read_bytes()
    monkeypatch.setenv(ENV_VAR, str(root))
    path, out = root / "in.csv", root / "out.jsonl"
    write_input(path, "csv", sensor_rows(3000))
    rt = TaskRuntime(spark, query_id="q", task_id="t-swap", checkpoint_dir=str(tmp_path / "ck"),
                     trigger_seconds=0.2)
    rt.file_source(op="replay", output="raw", schema=SENSOR, path=str(path), format="csv",
                   rate=200.0)
    rt.file_sink(op="sink", input="raw", path=str(out))
    query = rt.query
    assert query is not None
    try:
        wait_for(lambda: len(read_sink(out)) >= 1, 90.0, "the first rows in the sink")
        written = read_sink(out)
        (root / "kept.jsonl").write_bytes(out.read_bytes())
        out.unlink()
        out.symlink_to(secret)
        wait_for(lambda: not query.isActive, 60.0, "the query to fail on the swapped sink")
        assert "replaced since it was opened" in str(query.exception())
    finally:
        query.stop()
    assert secret.read_bytes() == before
    assert written == oracle_parse(path, "csv")[:len(written)]
