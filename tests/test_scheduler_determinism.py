"""The scheduler's core is a function of its events: the same events give the same commands.

Channel keys, ids and time are made in the shell (`scheduler.channel_keys`, `scheduler.loop`)
and arrive on events; `SchedulerState.handle` makes none. Two fresh states fed one scripted
run (a submit with its keys, offers, status updates, heartbeats, a load step that makes the
automatic policy rescale, the splitter's acknowledgement) must answer command for command alike.
The import rules (tests/test_import_rules.py, R8) keep zmq and other sources of randomness out
of the core's modules.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.tasks import CompiledQuery
from scheduler.channel_keys import issue_keys
from scheduler.commands import Command, LaunchTasks
from scheduler.events import QuerySubmitted, Registered, Tick
from scheduler.state import SchedulerState
from tests.test_elastic_auto import BASE, STEP, Cluster
from tests.test_elasticity import CONFIG, Driver, compiled


class Recorded(Driver):
    """The elastic tests' driver, its query submitted with the keys the shell made, every
    command the state answers recorded."""

    def __init__(self, query: CompiledQuery, keys: dict[str, dict[str, str]]) -> None:
        self.commands: list[Command] = []
        self.s = SchedulerState(CONFIG)
        self.query, self.now, self.offers = query, 100.0, 0
        handle = self.s.handle

        def recording(event: object) -> list[Command]:
            out = handle(event)  # type: ignore[arg-type]
            self.commands += out
            return out

        self.s.handle = recording  # type: ignore[method-assign]
        self.s.handle(Registered("r", "fw-1", "m:5050"))
        self.s.handle(Tick("t", self.now))
        self.s.handle(QuerySubmitted("s", query, keys=keys))


def scripted_run(tmp_path: Path, keys: dict[str, dict[str, str]]) -> list[Command]:
    d = Recorded(compiled('parallelism="1" max-parallelism="4" elastic="auto"', tmp_path), keys)
    d.run(d.offer("a1"))
    d.offer("a2", "a3", "a4")
    c = Cluster(d)
    c.run(BASE, 20)
    for _ in range(30):  # the load step: the policy rescales on its own
        c.second(BASE * STEP)
        if d.view()["rescales"]:
            break
    c.run(BASE * STEP, 3)
    d.run(d.offer("a2", "a3"))
    c.run(BASE * STEP, 5)
    for message in c.sent:
        d.ack(message.message.request)
    c.run(BASE * STEP, 10)
    return d.commands


def test_the_same_events_give_the_same_commands(tmp_path: Path) -> None:
    query = compiled('parallelism="1" max-parallelism="4" elastic="auto"', tmp_path)
    keys = issue_keys(t.task_id for t in query.tasks)  # the shell's part, made once
    first, second = scripted_run(tmp_path, keys), scripted_run(tmp_path, keys)
    assert first == second
    auto = [c for c in first if "auto" in repr(getattr(c, "message", ""))]
    assert auto, "the run must include an automatic rescale's request"
    launched = [json.loads(t.data) for c in first if isinstance(c, LaunchTasks) for t in c.tasks]
    assert launched and all(d["keys"]["own"] == keys[d["task"]["task_id"]] for d in launched)
