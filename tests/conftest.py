"""Shared pytest fixtures: the one session-scoped SparkSession of the Spark test layer."""

from __future__ import annotations

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
