"""Where the Python processes Spark starts import pyspark from.

Owns one decision and its wiring. Spark puts `$SPARK_HOME/python/lib/pyspark.zip` and py4j's
source zip first on the `PYTHONPATH` of every Python process it starts (UDF workers and their
daemon, the data-source planners, the streaming source runner). Python cannot cache bytecode for
modules it imports from a zip, so each of those processes compiled pyspark's sources again:
~0.7 CPU-s and ~0.7 s of start latency per process, several per query start
(docs/architecture.md). With a pip-installed pyspark the same files sit, compiled, in the
site-packages folder that holds the zip's `SPARK_HOME`. `spark_site/sitecustomize.py`, which
Python runs at the start of every process whose path holds that folder, moves the two zips
behind that site-packages folder, so pyspark imports from its bytecode cache. A zip from any
other Spark (a `SPARK_HOME` that is not the installed package) is left where Spark put it.

`session_python_path` puts the folder on the path the session's JVM passes on to its Python
processes; `build_session` calls it before the JVM starts. Does not own the session.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "spark_site"
PYTHONPATH_ENV = "PYTHONPATH"


def _installed_site(zip_entry: str) -> str | None:
    """The site-packages folder of a `<site>/pyspark/python/lib/<zip>` entry, else None."""
    lib = posixpath.dirname(posixpath.normpath(zip_entry))
    python = posixpath.dirname(lib)
    package = posixpath.dirname(python)
    if (posixpath.basename(lib), posixpath.basename(python),
            posixpath.basename(package)) != ("lib", "python", "pyspark"):
        return None
    return posixpath.dirname(package)


def _is_spark_zip(entry: str) -> bool:
    name = posixpath.basename(entry)
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip"))


def prefer_installed_pyspark(entries: Sequence[str]) -> list[str]:
    """`entries` (a `sys.path`) with Spark's pyspark and py4j zips moved to the end when they
    belong to a pyspark installed in a site-packages folder that is also on the path (pure).
    Any other order is returned unchanged."""
    normalized = {posixpath.normpath(e) for e in entries if e}
    movable = [e for e in entries if _is_spark_zip(e)
               and _installed_site(e) in normalized]
    if not movable:
        return list(entries)
    return [e for e in entries if e not in movable] + movable


def session_python_path(existing: str | None) -> str:
    """`PYTHONPATH` for a session's JVM: `SITE_DIR` first (once), then what was there (pure)."""
    parts = [p for p in (existing or "").split(os.pathsep) if p and p != str(SITE_DIR)]
    return os.pathsep.join([str(SITE_DIR), *parts])
