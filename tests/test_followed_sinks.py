"""Whatever shows a file sink follows the path in force after a control tuple moved it: the
scheduler's status view (`scheduler.control.sinks_in_force`), `elastiq run`'s and `elastiq
tail`'s list of files to follow (`elastiq.sink_watch.SinkWatch`), and `status`'s lines (agent id and
host). Pure: events fed by hand, real files in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastiq.sink_watch import Follower, SinkWatch
from elastiq.service_cli import _print_status
from scheduler.commands import ReplyToRequest
from scheduler.events import ControlRequested
from scheduler.views import snapshot
from tests.test_control import ack, query, running
from tests.test_scheduler_state import of

pytestmark = pytest.mark.usefixtures("scheduler_path_roots")


def test_status_shows_the_sink_path_a_control_tuple_set_and_the_old_one_after_a_refusal(
        tmp_path: Path) -> None:
    s = running(tmp_path)
    compiled = query(tmp_path).sinks["sink"]
    assert snapshot(s)["queries"]["q"]["sinks"] == {"sink": compiled}
    moved = str(tmp_path / "moved.jsonl")
    out = s.handle(ControlRequested("c", "q", (("sink", "path", moved),)))
    request = of(ReplyToRequest, out)[0].body["request"]
    s.handle(ack("q.t0.a1", request))
    assert snapshot(s)["queries"]["q"]["sinks"] == {"sink": moved}
    again = str(tmp_path / "refused.jsonl")
    out = s.handle(ControlRequested("c2", "q", (("sink", "path", again),)))
    request = of(ReplyToRequest, out)[0].body["request"]
    s.handle(ack("q.t0.a1", request, applied=False, message="cannot open"))
    assert snapshot(s)["queries"]["q"]["sinks"] == {"sink": moved}


def test_the_watch_follows_the_new_file_and_still_drains_the_old_one(tmp_path: Path) -> None:
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    watch, follower = SinkWatch(), Follower()
    assert watch.update({"sink": str(old)}) == [("sink", old)]
    old.write_text('{"a":1}\n')
    assert watch.update({"sink": str(old)}) == []
    assert watch.update({"sink": str(new)}) == [("sink", new)]
    old.write_text('{"a":1}\n{"a":2}\n')  # the batch in flight at the change
    new.write_text('{"a":3}\n')
    lines = [line for _, path in watch.files() for line in follower.lines(path)]
    assert sorted(lines) == ['{"a":1}', '{"a":2}', '{"a":3}']


def test_status_prints_the_agent_id_migrate_needs_with_the_host_and_the_sinks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = running(tmp_path)
    _print_status(snapshot(s)["queries"]["q"])
    out = capsys.readouterr().out
    assert "on agent a1 (host-a1)" in out
    assert f"sink sink -> {query(tmp_path).sinks['sink']}" in out


def test_a_control_sink_shows_what_it_sends_and_the_answer_as_a_run_prints_it() -> None:
    import io
    import re

    from common.api_client import RequestRejected, SchedulerUnavailable
    from executor.sinks import ControlSink
    from tests.test_control_sink import HOT30, HOT35, FakeClient

    shown = io.StringIO()
    client = FakeClient(None, RequestRejected(404, "no query monitored", []),
                        SchedulerUnavailable("no scheduler at http://fake:1"))
    sink = ControlSink("monitor.t0", client, out=lambda: shown)
    sink.send(3, [HOT35])
    sink.send(4, [HOT30])
    sink.send(5, [HOT30])  # (the same verdict as the accepted one would not be sent again)
    lines = shown.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("[monitor.t0 #3] control monitored: hot.condition = "
                               "'raw.temp > 35' -> accepted as request")
    assert lines[1] == ("[monitor.t0 #4] control monitored: hot.condition = 'raw.temp > 30' -> "
                        "refused: no query monitored")
    assert lines[2].endswith("-> not sent, the scheduler is unreachable")
    console = re.compile(r"^\[" + re.escape("monitor") + r"\.t\d+ #\d+\] ")  # elastiq run's
    assert all(console.match(line) for line in lines)
