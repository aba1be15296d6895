"""A streaming query's recent progress reports, read from its JVM a few calls at a time.

PySpark's `StreamingQuery.recentProgress` fetches and converts every report Spark keeps (up to
100) on each call: two py4j calls and a JSON parse per report, and a `StreamingQueryProgress`
object built from it. An executor reads its tasks' figures every poll, so that was most of an
executor's own CPU (half of its time holding the GIL over a rescaling cluster test). Spark's list
only grows at its end and drops at its front, so `RecentProgress.read` walks it from the newest
report back to the first one it already holds and parses only those (`merge_reports`, pure).
Reports are plain dicts of Spark's progress JSON, as pyspark's own are. Owns nothing else."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

Report = dict[str, Any]


def report_key(report: Report) -> tuple[str, int, str]:
    """What tells two reports apart: a batch's report, and each no-data report of an idle
    trigger (same batch id, a later timestamp)."""
    return (str(report.get("runId", "")), int(report.get("batchId", -1)),
            str(report.get("timestamp", "")))


def merge_reports(held: list[Report], newest_first: Iterable[Report], count: int) -> list[Report]:
    """The `count` reports Spark holds now, oldest first, from the ones `held` from the last read
    and Spark's reports walked newest first, stopping at the first one held (pure)."""
    if count <= 0:
        return []
    known = {report_key(r) for r in held}
    new: list[Report] = []
    for report in newest_first:
        if report_key(report) in known:
            break
        new.append(report)
    return (held + new[::-1])[-count:]


class RecentProgress:
    """One task's recent progress reports, as `query.recentProgress` gives them."""

    def __init__(self) -> None:
        self._held: list[Report] = []

    def read(self, query: Any) -> list[Report]:
        """The query's reports (a pyspark StreamingQuery), oldest first; a new list each time."""
        reports = query._jsq.recentProgress()  # one call: Spark's list, copied in the JVM
        count = len(reports)
        newest_first = (json.loads(reports[i].json()) for i in range(count - 1, -1, -1))
        self._held = merge_reports(self._held, newest_first, count)
        return list(self._held)
