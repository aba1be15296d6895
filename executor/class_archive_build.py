"""Building the class archive of executor sessions: `python -m executor.class_archive_build`.

Owns writing this machine's archive (`executor.class_archive` says which and where) and proving
it. A JDK 17 dynamic archive (`-XX:ArchiveClassesAtExit`) is written by a JVM when it exits after
a representative run (a file source, an event-time window aggregate on the RocksDB state store and
a Python `foreachBatch`, as the executors' task queries run); a second run must then map it
(`-Xshare:on` ends the JVM otherwise) and counts the classes that came from it; only then is it
put in place with its stamp. Each run is a process of its own: the dump happens at the JVM's
exit, and a Python process starts one gateway JVM only. `scripts/setup.sh` runs
`build --if-missing`; `verify` maps the installed archive and counts its classes.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from executor.class_archive import (DIR_ENV, archive_path, proven, stamp_path, usable_path,
                                    write_stamp)

# A run that mapped the archive loads ~13,000 classes from it; fewer means it mostly did not.
VERIFY_MIN_SHARED_CLASSES = 2000
TOP_LAYER_SOURCE = "source: shared objects file (top)"
CHILD_TIMEOUT_S = 600
STALE_AFTER_S = 24 * 3600.0


def _write_inputs(folder: Path, files: int = 3, rows: int = 200) -> None:
    """A few JSON-lines files of keyed, timestamped rows: the representative run's input."""
    folder.mkdir(parents=True)
    for f in range(files):
        lines = (f'{{"key": "k{i % 3}", "value": {i}, "ts": "2024-01-01T00:{f:02d}:{i % 60:02d}Z"}}'
                 for i in range(rows))
        (folder / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")


def representative_run(java_options: str, work: Path) -> None:
    """Start a session with `java_options`, run what task queries run (a file source, an
    event-time window aggregate on the RocksDB state store, a Python foreachBatch) to its end,
    then end the session's JVM and wait for it: a dump happens at the JVM's exit."""
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, functions as F

    from executor.spark_session import build_session

    spark = build_session(2, "elastiq-class-archive", str(work / "session"),
                          java_options=java_options)
    _write_inputs(work / "input")
    counts: list[int] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        counts.append(batch.count())

    rows = (spark.readStream.schema("key STRING, value LONG, ts TIMESTAMP")
            .option("maxFilesPerTrigger", 1).json(str(work / "input"))
            .withWatermark("ts", "1 second")
            .groupBy(F.window("ts", "10 seconds"), "key")
            .agg(F.count("*").alias("n"), F.max("value").alias("top")))
    query = (rows.writeStream.outputMode("append").foreachBatch(collect)
             .option("checkpointLocation", str(work / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    query.stop()
    spark.stop()
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is not None and proc.stdin is not None:
        proc.stdin.close()  # the gateway JVM exits when its stdin ends
        proc.wait(timeout=120)
    if not any(counts):
        raise RuntimeError("the representative run produced no rows")


def _run_child(action: str, archive: Path) -> str:
    """Run `action` (`dump` or `count`) on `archive` in a process of its own (a JVM's dump
    happens at its exit, and a Python process starts one gateway JVM only); its last line."""
    done = subprocess.run([sys.executable, "-m", "executor.class_archive_build", action,
                           "--archive", str(archive)],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"class archive {action} failed ({done.returncode}): "
                           f"{done.stderr.strip()[-1500:]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def _dump(archive: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="elastiq-class-archive-") as work:
        representative_run(f"-XX:ArchiveClassesAtExit={archive} -Xlog:cds=off", Path(work))


def _count(archive: Path) -> int:
    """Classes a run that must map `archive` (`-Xshare:on` ends the JVM otherwise) loaded
    from it."""
    with tempfile.TemporaryDirectory(prefix="elastiq-class-archive-") as work:
        loads = Path(work) / "class-load.log"
        representative_run(f"-XX:SharedArchiveFile={archive} -Xshare:on "
                            f"-Xlog:class+load=info:file={loads}", Path(work))
        return sum(1 for line in loads.read_text(errors="replace").splitlines()
                   if TOP_LAYER_SOURCE in line)


def verify(archive: Path) -> int:
    """How many classes a real run maps from `archive`; raises when the JVM cannot map it."""
    line = _run_child("count", archive)
    try:
        return int(line)
    except ValueError:
        raise RuntimeError(f"class archive count: unexpected output {line!r}") from None


def build(folder: Path | None = None) -> tuple[Path, int]:
    """Write this machine's archive, map it once to prove it, then put it in place with its
    stamp (atomically: a session sees a whole, verified archive or none). Returns the archive
    and how many classes the proving run mapped from it."""
    target = archive_path(folder)
    if target is None:
        raise RuntimeError("no java found (JAVA_HOME or PATH): no class archive to build")
    if not usable_path(target):
        raise RuntimeError(f"the class archive folder {target.parent} has white space: Spark "
                           f"cannot pass it to the JVM; set {DIR_ENV} to another folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        _run_child("dump", partial)
        if not partial.is_file():
            raise RuntimeError(f"the JVM wrote no archive at {partial}")
        shared = verify(partial)
        if shared < VERIFY_MIN_SHARED_CLASSES:
            raise RuntimeError(f"a run mapped only {shared} classes from the new archive")
        stamp = stamp_path(target)
        stamp.unlink(missing_ok=True)
        os.replace(partial, target)
        write_stamp(stamp, target.stat().st_size, shared)
    finally:
        partial.unlink(missing_ok=True)
    remove_stale(target)
    return target, shared


def remove_stale(kept: Path, now: float | None = None) -> list[Path]:
    """Remove the folder's other archives, stamps and partial files untouched for a day (another
    JDK's or pyspark's, or a build that died): not younger ones, which may be another checkout's
    in use or a build still being written beside this one. Returns what it removed."""
    now = time.time() if now is None else now
    removed = []
    for path in kept.parent.iterdir():
        if path in (kept, stamp_path(kept)) or not path.name.startswith("spark-"):
            continue
        try:
            if now - path.stat().st_mtime > STALE_AFTER_S:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m executor.class_archive_build",
                                     description="the JVM class archive of executor sessions")
    parser.add_argument("action", choices=("build", "verify", "path", "dump", "count"),
                        help="build: write, prove and install this machine's archive; verify: "
                             "map the installed one and count its classes; path: print where it "
                             "belongs (dump and count: build's steps, each in its own process)")
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"the archive's folder (default: ${DIR_ENV}, else "
                             "elastiq/class-archive in $XDG_CACHE_HOME or ~/.cache)")
    parser.add_argument("--archive", type=Path, default=None, help="(dump, count) the file")
    parser.add_argument("--if-missing", action="store_true",
                        help="(build) keep a proven archive that is already there")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.action in ("dump", "count"):
        if args.archive is None:
            parser.error(f"{args.action} needs --archive")
        if args.action == "dump":
            _dump(args.archive)
        else:
            print(_count(args.archive))
        return 0
    target = archive_path(args.dir)
    if target is None:
        print("class archive: no java found (JAVA_HOME or PATH)", file=sys.stderr)
        return 1
    if args.action == "path":
        print(target)
        return 0
    if args.action == "build":
        if args.if_missing and proven(target):
            print(f"class archive: {target} (kept: already built and proven)")
            return 0
        built, shared = build(args.dir)
        print(f"class archive: {built} ({shared} classes mapped by a proving run)")
        return 0
    if not target.is_file():
        print(f"class archive: none at {target}: run "
              "`python -m executor.class_archive_build build`",
              file=sys.stderr)
        return 1
    shared = verify(target)
    print(f"class archive: {shared} classes mapped from {target}")
    return 0 if shared >= VERIFY_MIN_SHARED_CLASSES else 1


if __name__ == "__main__":
    sys.exit(main())
