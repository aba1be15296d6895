"""Spark's Python processes import the installed, compiled pyspark, not Spark's pyspark.zip
(executor/spark_python_path.py): the pure reordering, and, on the test session, the processes
Spark really starts (a UDF worker and a data source's planner) asked where pyspark came from."""

from __future__ import annotations

import os
import random
import sys

import pytest

from executor.spark_python_path import SITE_DIR, prefer_installed_pyspark, session_python_path

SITE = "/opt/py/lib/python3.11/site-packages"
ZIP = f"{SITE}/pyspark/python/lib/pyspark.zip"
PY4J = f"{SITE}/pyspark/python/lib/py4j-0.10.9.9-src.zip"


def test_the_installed_packages_zips_move_behind_their_site_packages() -> None:
    path = ["/work", ZIP, PY4J, "/usr/lib/python311.zip", SITE, "/other"]
    assert prefer_installed_pyspark(path) == [
        "/work", "/usr/lib/python311.zip", SITE, "/other", ZIP, PY4J]


def test_a_zip_of_another_spark_or_without_its_site_packages_stays_where_it_was() -> None:
    other = ["/spark-4.1/python/lib/pyspark.zip", "/spark-4.1/python/lib/py4j-0.10.9.9-src.zip",
             SITE]
    assert prefer_installed_pyspark(other) == other
    without_site = [ZIP, PY4J, "/elsewhere"]
    assert prefer_installed_pyspark(without_site) == without_site
    assert prefer_installed_pyspark([]) == []


def test_reordering_moves_exactly_the_installed_zips_to_the_end_in_order() -> None:
    rng = random.Random(4242)
    pool = [ZIP, PY4J, SITE, f"{SITE}/", "", "/a", "/a/pyspark/python/lib/pyspark.zip",
            "/x/pyspark/python/lib/py4j-1-src.zip", "/x", "pyspark.zip", "/lib/python.zip",
            "/y/pyspark/python/lib/other.zip"]

    def installed_zip(entry: str, path: list[str]) -> bool:  # the oracle, by string splitting
        head, sep, name = entry.partition("/pyspark/python/lib/")
        spark_zip = name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith(".zip"))
        return bool(sep) and spark_zip and head in {p.rstrip("/") for p in path}

    for _ in range(3000):
        path = [rng.choice(pool) for _ in range(rng.randint(0, 8))]
        expected = ([e for e in path if not installed_zip(e, path)]
                    + [e for e in path if installed_zip(e, path)])
        assert prefer_installed_pyspark(path) == expected, path


def test_the_session_path_has_the_site_folder_first_once() -> None:
    site = str(SITE_DIR)
    assert session_python_path(None) == site
    assert session_python_path(f"/a{os.pathsep}{site}{os.pathsep}/b") == \
        os.pathsep.join([site, "/a", "/b"])
    assert (SITE_DIR / "sitecustomize.py").is_file()


def _where_pyspark_is() -> str:
    import pyspark

    return "zip" if ".zip" in pyspark.__file__ else "installed"


@pytest.mark.spark
def test_spark_started_python_processes_import_the_installed_pyspark(spark) -> None:
    from pyspark import cloudpickle
    from pyspark.sql.datasource import DataSource, DataSourceReader
    from pyspark.sql.functions import udf

    installed = _where_pyspark_is()
    assert installed == "installed"  # the oracle: where this (driver) process has it

    class WhereFrom(DataSource):
        @classmethod
        def name(cls) -> str:
            return "elastiq_where_pyspark_is"

        def schema(self) -> str:  # runs in a planner process Spark starts
            return f"{_where_pyspark_is()} string"

        def reader(self, schema):  # type: ignore[no-untyped-def]
            return WhereFromReader()

    class WhereFromReader(DataSourceReader):
        def read(self, partition):  # type: ignore[no-untyped-def]
            yield (_where_pyspark_is(),)

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        spark.dataSource.register(WhereFrom)
        frame = spark.read.format("elastiq_where_pyspark_is").load()
        assert frame.columns == [installed]
        assert [r[0] for r in frame.collect()] == [installed]
        worker = udf(lambda _: _where_pyspark_is(), "string")
        assert [r[0] for r in spark.range(1).select(worker("id")).collect()] == [installed]
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
