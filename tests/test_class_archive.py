"""The JVM class archive of executor sessions (executor.class_archive): its name follows every
fact it depends on, the session maps it only when it is there, and a real JVM maps it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from executor import class_archive, class_archive_build
from executor.class_archive import JvmFacts, archive_name, mapping_options, usable_path
from executor.spark_session import session_settings

ROOT = Path(__file__).resolve().parent.parent
FACTS = JvmFacts(java="/usr/lib/jvm/java-17/bin/java", java_release='JAVA_VERSION="17.0.15"',
                 pyspark_version="4.1.4", spark_jars=("a.jar", "b.jar"))


def test_the_archive_name_changes_with_every_fact_it_depends_on() -> None:
    changed = (dataclasses.replace(FACTS, java="/opt/jdk/bin/java"),
               dataclasses.replace(FACTS, java_release='JAVA_VERSION="17.0.16"'),
               dataclasses.replace(FACTS, pyspark_version="4.1.5"),
               dataclasses.replace(FACTS, spark_jars=("a.jar", "c.jar")),
               dataclasses.replace(FACTS, spark_jars=("a.jar",)))
    names = {archive_name(f) for f in changed}
    assert archive_name(FACTS) not in names and len(names) == len(changed)
    assert archive_name(FACTS) == archive_name(dataclasses.replace(FACTS))
    assert archive_name(FACTS).startswith("spark-4.1.4-") and archive_name(FACTS).endswith(".jsa")


def test_the_jar_list_cannot_be_confused_by_where_one_name_ends() -> None:
    assert (archive_name(dataclasses.replace(FACTS, spark_jars=("ab.jar", "c.jar")))
            != archive_name(dataclasses.replace(FACTS, spark_jars=("a", "b.jarc.jar"))))


def test_the_session_is_given_the_archive_only_when_asked() -> None:
    options = mapping_options(Path("/cache/class-archive/x.jsa"))
    assert options == "-XX:SharedArchiveFile=/cache/class-archive/x.jsa -Xshare:auto"
    given = session_settings(2, "/state", java_options=options)
    assert given["spark.driver.extraJavaOptions"] == options
    assert "spark.driver.extraJavaOptions" not in session_settings(2, "/state")


def test_a_path_with_white_space_is_not_passed_to_the_jvm(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert not usable_path(Path("/my cache/x.jsa")) and usable_path(Path("/cache/x.jsa"))
    spaced = tmp_path / "my cache"
    monkeypatch.setenv(class_archive.DIR_ENV, str(spaced))
    target = class_archive.archive_path()
    assert target is not None
    target.parent.mkdir(parents=True)
    target.write_bytes(b"not an archive")
    class_archive.write_stamp(class_archive.stamp_path(target), target.stat().st_size, 9999)
    assert class_archive.session_java_options() == ""


def test_only_a_whole_proven_archive_is_given_to_the_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JVM given a truncated archive can die of SIGBUS even under -Xshare:auto: an archive
    without build's stamp, or of another size than the stamp records, is never given."""
    monkeypatch.setenv(class_archive.DIR_ENV, str(tmp_path))
    assert class_archive.session_java_options() == ""
    target = class_archive.archive_path()
    assert target is not None and target.parent == tmp_path
    target.write_bytes(b"placeholder")
    assert class_archive.session_java_options() == ""  # no stamp
    stamp = class_archive.stamp_path(target)
    class_archive.write_stamp(stamp, target.stat().st_size + 1, 9999)
    assert class_archive.session_java_options() == ""  # truncated or grown since proven
    stamp.write_text("garbage")
    assert class_archive.session_java_options() == ""
    class_archive.write_stamp(stamp, target.stat().st_size, 9999)
    assert class_archive.session_java_options() == mapping_options(target)


def test_only_day_old_archives_of_other_jvms_and_dead_builds_are_removed(tmp_path: Path) -> None:
    import os

    kept = tmp_path / "spark-4.1.4-aaaa.jsa"
    names = ("spark-4.1.4-aaaa.jsa.verified", "spark-4.0.0-bbbb.jsa",
             "spark-4.0.0-bbbb.jsa.verified", "spark-4.1.4-aaaa.jsa.77.partial",
             "spark-4.1.3-cccc.jsa", "unrelated.txt")
    for name in (kept.name, *names):
        (tmp_path / name).write_text("x")
    now = 1_000_000_000.0
    for name in ("spark-4.0.0-bbbb.jsa", "spark-4.0.0-bbbb.jsa.verified",
                 "spark-4.1.4-aaaa.jsa.77.partial", "unrelated.txt", kept.name,
                 "spark-4.1.4-aaaa.jsa.verified"):
        os.utime(tmp_path / name, (now - 2 * 86400, now - 2 * 86400))
    for name in ("spark-4.1.3-cccc.jsa",):  # young: another checkout's, in use
        os.utime(tmp_path / name, (now - 3600, now - 3600))
    removed = class_archive_build.remove_stale(kept, now=now)
    assert sorted(p.name for p in removed) == ["spark-4.0.0-bbbb.jsa",
                                               "spark-4.0.0-bbbb.jsa.verified",
                                               "spark-4.1.4-aaaa.jsa.77.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "spark-4.1.3-cccc.jsa", kept.name, "spark-4.1.4-aaaa.jsa.verified", "unrelated.txt"]


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_real_session_maps_thousands_of_classes_from_the_archive(tmp_path: Path) -> None:
    """The archive setup built (or, on a machine without one, one built here) is mapped by a
    JVM that must map it (-Xshare:on), and most of Spark's classes come from it."""
    folder = class_archive.archive_dir()
    target = class_archive.archive_path()
    assert target is not None, "no java found"
    run = [sys.executable, "-m", "executor.class_archive_build"]
    if not class_archive.proven(target):
        folder = tmp_path / "class-archive"
        built = subprocess.run([*run, "build", "--dir", str(folder)], cwd=ROOT,
                               capture_output=True, text=True, timeout=400)
        assert built.returncode == 0, built.stderr[-3000:]
    verified = subprocess.run([*run, "verify", "--dir", str(folder)], cwd=ROOT,
                              capture_output=True, text=True, timeout=400)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-3000:]
    shared = int(verified.stdout.split("class archive: ")[-1].split()[0])
    assert shared >= class_archive_build.VERIFY_MIN_SHARED_CLASSES, verified.stdout
