"""The class-data-sharing archive that makes an executor's JVM start ~35 % cheaper: which one
this machine's sessions map.

Owns the JVM's AppCDS archive for Elastiq's Spark sessions as a session finds it: its name
(derived from the facts it depends on: the Java runtime, the pyspark release and the jars on
Spark's classpath, so a changed JDK or pyspark never maps a stale archive), where it lives
(`$ELASTIQ_CLASS_ARCHIVE_DIR`, else `elastiq/class-archive` in the user's cache folder: one per
machine and user, shared by every checkout, as the name tells the archives of different JVMs
and pysparks apart), the stamp that proves it whole, and the Java options that map it. Does not
own building it (`executor.class_archive_build`, run by `scripts/setup.sh`) or the session's other
settings (`executor.spark_session`).

Why: a SparkSession's start is ~10-15 s of CPU, most of it loading and verifying ~13,000 classes.
The archive holds them parsed and verified, so the JVM maps them instead; an executor starts
after every SIGKILL, failover, migration and scale-out (benchmarks/executor_start.py). Without a
proven archive the session starts as before. A JVM given a truncated or foreign archive can die
(of SIGBUS) even under `-Xshare:auto`, so a session is given only an archive whose size the
stamp `build` wrote after a run mapped it records.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

DIR_ENV = "ELASTIQ_CLASS_ARCHIVE_DIR"


@dataclass(frozen=True)
class JvmFacts:
    """What an archive depends on: the JVM that maps it must be the one that wrote it, with the
    same application classpath (Spark's jars)."""

    java: str                   # the java binary, symlinks resolved
    java_release: str           # the JDK's `release` file (its exact build)
    pyspark_version: str
    spark_jars: tuple[str, ...]  # file names in pyspark's jars/ folder, sorted


def archive_name(facts: JvmFacts) -> str:
    """The archive's file name for these facts (pure): a digest, so any change names a new one."""
    digest = hashlib.sha256()
    for part in (facts.java, facts.java_release, facts.pyspark_version, *facts.spark_jars):
        digest.update(part.encode())
        digest.update(b"\0")
    return f"spark-{facts.pyspark_version}-{digest.hexdigest()[:16]}.jsa"


def mapping_options(archive: Path) -> str:
    """The driver JVM options that map `archive` when it fits, and start without it otherwise."""
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto"


def usable_path(path: Path) -> bool:
    """Spark splits extra Java options on white space: a path with some cannot be passed."""
    return not any(ch.isspace() for ch in str(path))


def _java_binary() -> Path | None:
    """The java that pyspark's launcher runs: $JAVA_HOME/bin/java, else `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def current_facts() -> JvmFacts | None:
    """The facts of this machine's JVM and pyspark, or None without a java to run."""
    import pyspark

    java = _java_binary()
    if java is None:
        return None
    release = java.parent.parent / "release"
    jars = Path(pyspark.__file__).parent / "jars"
    return JvmFacts(java=str(java),
                    java_release=release.read_text(errors="replace") if release.is_file() else "",
                    pyspark_version=pyspark.__version__,
                    spark_jars=tuple(sorted(p.name for p in jars.glob("*.jar"))))


def archive_dir() -> Path:
    """$ELASTIQ_CLASS_ARCHIVE_DIR, else elastiq/class-archive in $XDG_CACHE_HOME or ~/.cache."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "elastiq" / "class-archive"


def archive_path(folder: Path | None = None) -> Path | None:
    """Where this machine's archive belongs (whether or not it exists), or None without java."""
    facts = current_facts()
    if facts is None:
        return None
    return (folder or archive_dir()) / archive_name(facts)


def stamp_path(archive: Path) -> Path:
    """The stamp `build` writes beside an archive it proved: its size and classes mapped."""
    return archive.with_name(archive.name + ".verified")


def write_stamp(stamp: Path, size: int, shared: int) -> None:
    partial = stamp.with_name(stamp.name + ".partial")
    partial.write_text(f"{size} {shared}\n")
    os.replace(partial, stamp)


def stamped_size(stamp: Path) -> int | None:
    """The archive size a stamp records, or None when it is absent or unreadable."""
    try:
        return int(stamp.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def proven(archive: Path) -> bool:
    """Whether `archive` is the whole file `build` proved (a JVM given a truncated or foreign
    archive can die of SIGBUS even under -Xshare:auto, so nothing else is ever given)."""
    try:
        size = archive.stat().st_size
    except OSError:
        return False
    return stamped_size(stamp_path(archive)) == size


def session_java_options() -> str:
    """The extra driver Java options of an executor's session: map the archive when a proven
    one is there, else none."""
    path = archive_path()
    if path is None or not usable_path(path) or not proven(path):
        return ""
    return mapping_options(path)
