"""Shared pytest fixtures: the one session-scoped SparkSession of the Spark test layer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator["object"]:
    """One SparkSession for every @pytest.mark.spark test (local[2], Elastiq settings)."""
    from executor.spark_session import build_session

    session = build_session(2, "elastiq-tests", str(tmp_path_factory.mktemp("spark-state")))
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def scheduler_path_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The path roots an operator gave the in-process scheduler (`elastiq scheduler
    --path-root`): this test's folder, where its specs write, and the working folder (the
    scheduler's default root). The scheduler compiles specs from clients with these roots only
    (common.paths.configured_roots)."""
    from common.paths import ENV_VAR

    monkeypatch.setenv(ENV_VAR, os.pathsep.join([str(tmp_path), os.getcwd()]))
    return tmp_path
