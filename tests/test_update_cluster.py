"""An update in place on the embedded cluster (docs/queries.md, "Updating a running query"):
generator -> keyed window -> (file sink of every window, filter -> file sink). While it runs,
`elastiq update --dry-run` prints the diff and changes nothing; then the filter's predicate is
updated to its complement. Real executors and SparkSessions. The window's task (and its sink's)
keeps running, the same attempt; the filter's task is relaunched with its new program. The
window sink equals a plain-Python window oracle of the generator's rows; the filter's sink
equals the oracle's windows passed by the old predicate before a switch point and by the new
one from it on: windows reach the filter in window order over one channel, each micro-batch
holds whole window starts, so the switch point is the first window start the new attempt read
(found as the first window the new predicate passed, then checked against every window). The
pause (update request to the new attempt running, and to its first row) is printed."""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest

from testkit.e2e_support import (SPECS, Stack, cli, generator_rows, module_stack, read_sink,
                                 spec_params, wait_running, wait_until, window_oracle,
                                 multiset_diff)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]
SPEC = "e2e-update.xml"
QUERY = "e2e-update"
OLD, NEW = "countsPerWindow.readings &gt; 40", "countsPerWindow.readings &lt;= 40"


def old_passes(readings: int) -> bool:
    return readings > 40


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from module_stack(tmp_path_factory.mktemp("update-stack"), "update")


def windows_oracle() -> Counter:
    """(window start, sensor, readings) of every window the query emits, in plain Python."""
    rows = generator_rows(spec_params(SPEC)["src"])
    found = window_oracle(rows, "ts", ["sensor"], timedelta(seconds=2), timedelta(seconds=2),
                          timedelta(milliseconds=500))
    return Counter((start, sensor, len(rs)) for (start, sensor), rs in found.items())


def rows_of(path: Path) -> Counter:
    return Counter((r["window_start"], r["sensor"], r["readings"]) for r in read_sink(path))


def switched(windows: Counter, switch: Any) -> Counter:
    """The filter's sink for a switch at window start `switch`: the old predicate before it,
    the new one (its complement) from it on."""
    return Counter({w: n for w, n in windows.items()
                    if old_passes(w[2]) == (switch is None or w[0] < switch)})


def test_an_updated_predicate_switches_the_filter_and_keeps_the_window_running(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    from common.paths import ENV_VAR

    # the API compiles specs sent by clients within its path roots: the stack's folder
    monkeypatch.setenv(ENV_VAR, os.pathsep.join([str(stack.work), os.getcwd()]))
    old_spec = stack.work / "update-old.xml"
    new_spec = stack.work / "update-new.xml"
    text = (SPECS / SPEC).read_text()
    old_spec.write_text(text)
    new_spec.write_text(text.replace(OLD, NEW))
    assert new_spec.read_text() != text
    client = stack.client()
    client.submit_spec(old_spec)
    wait_running(stack, QUERY, timeout=240)
    out_path, windows_path = stack.work / "out/update-out.jsonl", \
        stack.work / "out/update-windows.jsonl"
    wait_until(lambda: sum(rows_of(out_path).values()) >= 5, 180,
               "the filter's sink to hold rows under the old predicate")
    before = stack.tasks(QUERY)

    dry = cli(stack, "update", QUERY, str(new_spec), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"= {QUERY}.t0 [src, counts]: kept" in dry.stdout
    assert f"~ {QUERY}.t2 [big, out]: changed (stateless" in dry.stdout, dry.stdout
    assert "dry run" in dry.stdout
    assert {t: v["attempt"] for t, v in stack.tasks(QUERY).items()} == \
        {t: v["attempt"] for t, v in before.items()}

    written_before = rows_of(out_path)
    asked = time.monotonic()
    reply = client.update_spec(QUERY, new_spec)
    assert reply["attempts"] == {f"{QUERY}.t2": before[f"{QUERY}.t2"]["attempt"] + 1}
    new_attempt = reply["attempts"][f"{QUERY}.t2"]
    wait_until(lambda: (t := stack.tasks(QUERY)[f"{QUERY}.t2"])["attempt"] == new_attempt
               and t["state"] == "running", 180, "the filter's new attempt to run",
               lambda: str(stack.tasks(QUERY)))
    running_after = time.monotonic() - asked
    old_rows = set(written_before)
    wait_until(lambda: any(not old_passes(w[2]) for w in rows_of(out_path)), 180,
               "a row under the new predicate")
    first_row_after = time.monotonic() - asked
    print(f"update pause: {running_after:.2f} s from the request to the new attempt running, "
          f"{first_row_after:.2f} s to its first row (goal: pause < 2 s)")

    windows = windows_oracle()
    wait_until(lambda: rows_of(windows_path) == windows, 300,
               "the window sink to hold every window of the oracle",
               lambda: multiset_diff(windows, rows_of(windows_path)))
    after = stack.tasks(QUERY)
    for kept in (f"{QUERY}.t0", f"{QUERY}.t1"):
        assert (after[kept]["attempt"], after[kept]["launches"]) == \
            (before[kept]["attempt"], before[kept]["launches"]), f"{kept} was restarted"

    def switch_point() -> Any:
        new_passed = [w[0] for w in rows_of(out_path) if not old_passes(w[2])]
        return min(new_passed) if new_passed else None

    expected = lambda: switched(windows, switch_point())  # noqa: E731
    wait_until(lambda: rows_of(out_path) == expected(), 120,
               "the filter's sink to equal the oracle switched at the first new window",
               lambda: f"switch at {switch_point()}\n"
                       + multiset_diff(expected(), rows_of(out_path)))
    switch = switch_point()
    assert switch is not None and all(w[0] < switch for w in old_rows), \
        "a window the old attempt wrote lies after the switch"
    assert any(w[0] >= switch for w in windows) and any(w[0] < switch for w in windows)
    client.stop(QUERY)
    wait_until(lambda: stack.status(QUERY).get("phase") in ("stopped", "finished"), 60,
               "the query to stop")
