"""Updates in place on the embedded cluster (docs/queries.md, "Updating a running query"):
generator -> keyed window -> (file sink of every window, filter -> file sink). Real executors
and SparkSessions. While it runs, `elastiq update --dry-run` prints the diff and changes
nothing; then two updates: (1) the filter's predicate to its complement, a live change (a
control tuple switches it at a micro-batch boundary, the filter's task keeps its attempt);
(2) the predicate back and the sink's weight (a fixed parameter), so the filter's task is
relaunched in place with its new program. The window's task (and its sink's) keeps running
throughout, the same attempt and launches. The window sink equals a plain-Python window oracle
of the generator's rows; the filter's sink equals the oracle's windows passed by the first
predicate before switch point 1, by the second from it to switch point 2, by the first again
after: windows reach the filter in window order over one channel and each micro-batch holds
whole window starts, so a switch point is the first window start the new program read (found
as the first window its predicate alone passed, then checked against every window). Each
update's pause is printed."""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest

from testkit.e2e_support import (SPECS, Stack, cli, generator_rows, hurry, module_stack,
                                 multiset_diff, read_sink, spec_params, wait_running, wait_until,
                                 window_oracle)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]
SPEC = "e2e-update.xml"
QUERY = "e2e-update"
OLD, NEW = "countsPerWindow.readings &gt; 40", "countsPerWindow.readings &lt;= 40"
SINK_PATH = '<param name="path" value="out/update-out.jsonl"/>'
WEIGHT = '\n    <param name="weight" value="2"/>'


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


def switched(windows: Counter, one: Any, two: Any) -> Counter:
    """The filter's sink for switches at window starts `one` and `two`: the first predicate
    before `one`, its complement from `one` to `two`, the first again from `two` on."""
    def second(start: Any) -> bool:
        return one is not None and start >= one and (two is None or start < two)
    return Counter({w: n for w, n in windows.items() if old_passes(w[2]) != second(w[0])})


def test_updates_switch_the_filter_live_then_by_relaunch_and_keep_the_window_running(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    from common.paths import ENV_VAR

    # the API compiles specs sent by clients within its path roots: the stack's folder
    monkeypatch.setenv(ENV_VAR, os.pathsep.join([str(stack.work), os.getcwd()]))
    text = (SPECS / SPEC).read_text()
    specs = {name: stack.work / f"update-{name}.xml" for name in ("old", "live", "relaunch")}
    specs["old"].write_text(text)
    specs["live"].write_text(text.replace(OLD, NEW))
    specs["relaunch"].write_text(text.replace(SINK_PATH, SINK_PATH + WEIGHT))
    assert len({p.read_text() for p in specs.values()}) == 3
    client = stack.client()
    client.submit_spec(specs["old"])
    wait_running(stack, QUERY, timeout=240)
    out_path = stack.work / "out/update-out.jsonl"
    windows_path = stack.work / "out/update-windows.jsonl"
    wait_until(lambda: sum(rows_of(out_path).values()) >= 5, 180,
               "the filter's sink to hold rows under the first predicate")
    before = stack.tasks(QUERY)

    dry = cli(stack, "update", QUERY, str(specs["live"]), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"= {QUERY}.t0 [src, counts]: kept" in dry.stdout
    assert f"~ {QUERY}.t2 [big, out]: changed live" in dry.stdout, dry.stdout
    assert "dry run" in dry.stdout
    assert {t: v["attempt"] for t, v in stack.tasks(QUERY).items()} == \
        {t: v["attempt"] for t, v in before.items()}

    # (1) live: a control tuple at a micro-batch boundary, no restart
    first_rows = set(rows_of(out_path))
    asked = time.monotonic()
    reply = client.update_spec(QUERY, specs["live"])
    filter_task = f"{QUERY}.t2"
    assert reply["attempts"] == {filter_task: before[filter_task]["attempt"]}
    request = reply["live"][filter_task]
    applied = wait_until(lambda: (v := client.control_status(QUERY, request))["state"] ==
                         "applied" and v, 120, "the live switch to be applied",
                         lambda: str(client.control_status(QUERY, request)))
    answer = applied["tasks"][filter_task]
    applied_after = time.monotonic() - asked
    wait_until(lambda: any(not old_passes(w[2]) for w in rows_of(out_path)), 180,
               "a row under the second predicate")
    print(f"update 1 (live): applied {applied_after:.2f} s after the request, from micro-batch "
          f"{answer['epoch']}, the task's pause {answer['pause_s']:.3f} s; first row under the "
          f"new predicate {time.monotonic() - asked:.2f} s after the request (goal: pause < 2 s)")
    assert stack.tasks(QUERY)[filter_task]["attempt"] == before[filter_task]["attempt"]

    # (2) the predicate back and a fixed parameter: the filter's task is relaunched in place
    second_rows = set(rows_of(out_path))
    asked = time.monotonic()
    reply = client.update_spec(QUERY, specs["relaunch"])
    new_attempt = before[filter_task]["attempt"] + 1
    assert reply["attempts"] == {filter_task: new_attempt} and reply["live"] == {}
    wait_until(lambda: (t := stack.tasks(QUERY)[filter_task])["attempt"] == new_attempt
               and t["state"] == "running", 180, "the filter's new attempt to run",
               lambda: str(stack.tasks(QUERY)))
    running_after = time.monotonic() - asked
    switch_1 = lambda: min((w[0] for w in rows_of(out_path)  # noqa: E731
                            if not old_passes(w[2])), default=None)
    wait_until(lambda: any(old_passes(w[2]) and w[0] > switch_1() for w in rows_of(out_path)),
               180, "a row under the first predicate again")
    print(f"update 2 (relaunch): the new attempt ran {running_after:.2f} s after the request, "
          f"its first row {time.monotonic() - asked:.2f} s after it (goal: pause < 2 s)")
    hurry(stack, QUERY)  # the updates are done: the generator makes the rest of its input now

    windows = windows_oracle()
    wait_until(lambda: rows_of(windows_path) == windows, 300,
               "the window sink to hold every window of the oracle",
               lambda: multiset_diff(windows, rows_of(windows_path)))
    after = stack.tasks(QUERY)
    for kept in (f"{QUERY}.t0", f"{QUERY}.t1"):
        assert (after[kept]["attempt"], after[kept]["launches"]) == \
            (before[kept]["attempt"], before[kept]["launches"]), f"{kept} was restarted"

    def switch_points() -> tuple[Any, Any]:
        one = switch_1()
        two = min((w[0] for w in rows_of(out_path) if old_passes(w[2]) and one is not None
                   and w[0] > one), default=None)
        return one, two

    expected = lambda: switched(windows, *switch_points())  # noqa: E731
    wait_until(lambda: rows_of(out_path) == expected(), 120,
               "the filter's sink to equal the oracle switched at both switch points",
               lambda: f"switch points {switch_points()}\n"
                       + multiset_diff(expected(), rows_of(out_path)))
    one, two = switch_points()
    assert one is not None and two is not None
    assert all(w[0] < one for w in first_rows), "a row written before update 1 lies after it"
    assert all(w[0] < two for w in second_rows), "a row written before update 2 lies after it"
    assert [w for w in windows if w[0] < one] and [w for w in windows if one <= w[0] < two] \
        and [w for w in windows if w[0] >= two], "a switch at the first or last window"
    client.stop(QUERY)
    wait_until(lambda: stack.status(QUERY).get("phase") in ("stopped", "finished"), 60,
               "the query to stop")
