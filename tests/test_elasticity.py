"""Run-time parallelism (issue 12), our own logic without Spark or processes: the spec's
elasticity attributes refused where they are written, the compiled plan of an elastic operator
(slots, splitters, bounds, a JSON round trip), the `parallelism` control parameter of the
catalogue and its checks, and the scheduler's state machine driven with events by hand (dormant
slots, a scale-out placed on offers, a scale-in that retires instances only once drained, a
refused acknowledgement, a failure while retiring, stopping, persisting). Automatic mode has
tests/test_elastic_auto.py; the runs with real processes are tests/test_elastic_cluster.py
and tests/test_elastic_window_cluster.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.control import PARALLELISM, ControlRefused
from common.messages import RETAINED_PREFIX, ControlAck, ControlMessage, Heartbeat
from common.tasks import CompiledQuery, ElasticOperator
from compiler.control import check_tuple
from compiler.pipeline import check_spec_text, compile_spec_text
from elastiq.control_cli import instances_settled
from scheduler.commands import (Command, KillTask, ReplyToRequest, RetargetChannels,
                                ReviveOffers, SendFrameworkMessage)
from scheduler.elasticity import DRAIN_SETTLE_SECONDS, Rescale, unplaced_channels
from scheduler.events import (ControlAcknowledged, ControlRequested, HeartbeatReceived,
                              OffersReceived, QueryStopRequested, QuerySubmitted, Registered,
                              StatusUpdated, Tick)
from scheduler.lifecycle import TaskState
from scheduler.state import SchedulerState, durable_placements, restore_query
from scheduler.testing import offer
from scheduler.views import query_view, snapshot
from tests.spec_snippets import SINK, SOURCE, dataflow, locate
from tests.test_scheduler_state import CONFIG, launched, of, update

# --- specs ----------------------------------------------------------------------------------------

def _filter(attrs: str, name: str = "f", stream: str = "raw", out: str = "hot") -> str:
    return (f'  <operator name="{name}" type="filter" {attrs}>\n    <input name="{stream}"/>\n'
            f'    <param name="condition" value="{stream}.temp &gt; 20"/>\n'
            f'    <output name="{out}"/>\n  </operator>\n')


def _pattern(attrs: str, name: str = "w", out: str = "agg") -> str:
    """A pattern operator per sensor (its keyed state cannot be handed over at run time)."""
    return (f'  <operator name="{name}" type="pattern" {attrs}>\n'
            f'    <input name="raw"/>\n    <param name="time" value="ts"/>\n'
            f'    <param name="partition-by" value="sensor"/>\n'
            f'    <param name="pattern" value="A B+"/>\n'
            f'    <param name="within" value="10 seconds"/>\n'
            f'    <define name="B" value="temp &gt; prev(temp)"/>\n'
            f'    <field name="rises" value="count(B)"/>\n    <output name="{out}"/>\n'
            f'  </operator>\n')


def _window(attrs: str, group_by: bool = True, name: str = "w", out: str = "agg") -> str:
    """A sliding window aggregate (its keyed state is handed over at an event-time switch)."""
    by = '    <param name="group-by" value="sensor"/>\n' if group_by else ""
    return (f'  <operator name="{name}" type="window-aggregate" {attrs}>\n'
            f'    <input name="raw"/>\n    <param name="time" value="ts"/>\n'
            f'    <param name="size" value="10 seconds"/>\n'
            f'    <param name="slide" value="5 seconds"/>\n{by}'
            f'    <aggregate name="n" function="count"/>\n    <output name="{out}"/>\n'
            f'  </operator>\n')


def filter_spec(attrs: str) -> str:
    return dataflow(SOURCE + _filter(attrs) + SINK.format(stream="hot"), name="q")


def window_spec(attrs: str, group_by: bool = True) -> str:
    return dataflow(SOURCE + _window(attrs, group_by) + SINK.format(stream="agg"), name="q")


def pattern_spec(attrs: str) -> str:
    return dataflow(SOURCE + _pattern(attrs) + SINK.format(stream="agg"), name="q")


def at_value(text: str, attr: str) -> tuple[int, int]:
    """1-based (line, column) of the value of the attribute written `attr` (name="value")."""
    line, column = locate(text, attr)
    return line, column + attr.index('"') + 1


def errors_of(text: str) -> list:
    graph, diagnostics = check_spec_text(text, "bad.xml")
    errors = [d for d in diagnostics if d.severity == "error"]
    assert graph is None and errors, "a spec with an error must not compile"
    assert all(d.position.file == "bad.xml" for d in errors)
    return errors


# --- validation: every problem at its attribute, all at once ----------------------------------

BAD = [
    ("max-below-start", filter_spec('parallelism="3" max-parallelism="2"'),
     'max-parallelism="2"', "max-parallelism=2 is below parallelism=3"),
    ("min-above-start", filter_spec('parallelism="2" max-parallelism="4" min-parallelism="3"'),
     'min-parallelism="3"', "min-parallelism=3 is above the starting parallelism 2"),
    ("min-above-default-start", filter_spec('max-parallelism="4" min-parallelism="2"'),
     'min-parallelism="2"', "above the starting parallelism 1"),
    ("unknown-mode", filter_spec('max-parallelism="3" elastic="sometimes"'),
     'elastic="sometimes"', "elastic='sometimes' is not an elasticity mode"),
    ("stateful-max", pattern_spec('parallelism="2" max-parallelism="3"'),
     'max-parallelism="3"', "'w' is a stateful pattern"),
    ("stateful-auto", pattern_spec('parallelism="2" elastic="auto"'),
     'elastic="auto"', "'w' is a stateful pattern"),
    ("min-alone", filter_spec('min-parallelism="2"'),
     'min-parallelism="2"', "min-parallelism= needs parallelism= or max-parallelism="),
    ("elastic-alone", filter_spec('elastic="auto"'),
     'elastic="auto"', "elastic= needs parallelism= or max-parallelism="),
    ("not-partitionable", window_spec('max-parallelism="3"', group_by=False),
     'max-parallelism="3"', "'w' (window-aggregate) cannot be partitioned"),
    ("on-a-source", dataflow(SOURCE.replace('type="generator"',
                                            'type="generator" max-parallelism="3"')
                             + SINK.format(stream="raw"), name="q"),
     'max-parallelism="3"', "max-parallelism= applies to transform operators"),
    ("max-not-a-count", filter_spec('max-parallelism="many"'),
     'max-parallelism="many"', "many"),
]


@pytest.mark.parametrize("text, attr, message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_elasticity_attribute_is_refused_at_its_value(text: str, attr: str,
                                                            message: str) -> None:
    refused_at_value(text, attr, message)


def refused_at_value(text: str, attr: str, message: str) -> None:
    """The spec is refused with an error saying `message`, located at the value of the
    attribute written `attr`, with a hint."""
    errors = errors_of(text)
    matching = [d for d in errors if message in d.message + " " + d.hint]
    assert matching, [d.render() for d in errors]
    assert at_value(text, attr) in {(d.position.line, d.position.column) for d in matching}, \
        [d.render() for d in matching]
    assert all(d.hint for d in matching), "every refusal says what to write instead"


def test_every_elasticity_problem_of_a_spec_is_reported_in_one_run() -> None:
    text = dataflow(
        SOURCE
        + _filter('parallelism="3" max-parallelism="2"', "f1", out="h1")
        + _filter('max-parallelism="3" elastic="sometimes"', "f2", out="h2")
        + _filter('min-parallelism="2"', "f3", out="h3")
        + _pattern('parallelism="2" elastic="auto"')
        + SINK.format(stream="h1")
        + SINK.replace('name="sink"', 'name="s2"').format(stream="h2")
        + SINK.replace('name="sink"', 'name="s3"').format(stream="h3")
        + SINK.replace('name="sink"', 'name="s4"').format(stream="agg"), name="q")
    positions = {(d.position.line, d.position.column) for d in errors_of(text)}
    for attr in ('max-parallelism="2"', 'elastic="sometimes"', 'min-parallelism="2"',
                 'elastic="auto"'):
        assert at_value(text, attr) in positions, attr


@pytest.mark.parametrize("attrs", [
    'parallelism="2"', 'max-parallelism="3"', 'parallelism="1" max-parallelism="3"',
    'parallelism="2" max-parallelism="4" min-parallelism="2" elastic="auto"',
    'max-parallelism="2" elastic="manual"'])
def test_good_elasticity_attributes_compile_without_a_word(attrs: str) -> None:
    graph, diagnostics = check_spec_text(filter_spec(attrs), "ok.xml")
    assert graph is not None and diagnostics == [], [d.render() for d in diagnostics]


# --- the compiled plan ----------------------------------------------------------------------------

def compiled(attrs: str, base: Path, text: str | None = None) -> CompiledQuery:
    return compile_spec_text(text or filter_spec(attrs), str(base / "q.xml"),
                             base_dir=base).query


SPLIT = "split:q/f_s#1+q/f_s#2+q/f_s#3+q/f_s#4"


def test_an_elastic_filter_gets_a_slot_per_max_instance_and_starts_on_some(tmp_path: Path
                                                                          ) -> None:
    q = compiled('parallelism="2" max-parallelism="4" min-parallelism="2" elastic="auto"',
                 tmp_path)
    (e,) = q.elastic
    assert e == ElasticOperator("f", ("q.t1", "q.t2", "q.t3", "q.t4"), (("q.t0", SPLIT),), 2, 2,
                                "auto", False)
    assert (e.maximum, q.elastic_operator("f"), q.elastic_operator("sink")) == (4, e, None)
    for i, slot in enumerate(e.slots, 1):  # slot i reads partition i of the splitter
        assert q.task(slot).inputs == (f"q/f_s#{i}",)
        assert q.task(slot).operators == (f"f_rd_{i}", f"f_{i}")
    assert q.task("q.t0").outputs == tuple(f"q/f_s#{i}" for i in range(1, 5))
    assert "active=2," in q.task("q.t0").program  # the splitter starts on the first two
    back = CompiledQuery.from_json(json.loads(json.dumps(q.to_json())))
    assert back == q and back.elastic == (e,)
    assert ElasticOperator.from_json(json.loads(json.dumps(e.to_json()))) == e


def test_a_fixed_parallelism_is_elastic_within_one_to_k_and_routes_to_all(tmp_path: Path
                                                                         ) -> None:
    q = compiled('parallelism="3"', tmp_path)
    (e,) = q.elastic
    assert (e.initial, e.minimum, e.maximum, e.mode, e.stateful) == (3, 1, 3, "manual", False)
    assert "active=" not in q.task("q.t0").program  # all partitions: the program says nothing
    assert compiled("", tmp_path).elastic == ()


def test_a_partitioned_window_is_an_elastic_entry_marked_stateful(tmp_path: Path) -> None:
    q = compiled("", tmp_path, window_spec('parallelism="2"'))
    (e,) = q.elastic
    assert (e.operator, e.stateful, e.initial, e.maximum) == ("w", True, 2, 2)


def test_a_sliding_window_switches_with_bounded_copies(tmp_path: Path) -> None:
    """A sliding window is elastic: its splitter knows the slide, its instances read the
    window-start bounds, and its old instances retire once the windows before a switch end."""
    q = compiled("", tmp_path, window_spec('parallelism="1" max-parallelism="3" '
                                           'elastic="auto"'))
    (e,) = q.elastic
    assert (e.stateful, e.switch_time, e.switch_close_ms, e.mode) == (True, "ts", 5000, "auto")
    assert ElasticOperator.from_json(json.loads(json.dumps(e.to_json()))) == e
    splitter = next(t for t in q.tasks if len(t.outputs) == 3).program
    assert "switch=('ts', 10000, 40000, 5000)" in splitter
    for slot in e.slots:
        assert "ticks=True, bounded=True" in q.task(slot).program
    tumbling = compiled("", tmp_path, window_spec('max-parallelism="2"').replace(
        '<param name="slide" value="5 seconds"/>', ""))
    assert tumbling.elastic[0].switch_close_ms == 0
    assert all("bounded" not in tumbling.task(slot).program
               for slot in tumbling.elastic[0].slots)
    assert "ticks=True" in tumbling.task(tumbling.elastic[0].slots[0]).program


# --- the catalogue's parallelism ----------------------------------------------------------------

def test_the_parallelism_is_adjustable_within_its_bounds_on_the_splitters(tmp_path: Path) -> None:
    catalog = compiled('parallelism="2" max-parallelism="4" min-parallelism="2"',
                       tmp_path).controls
    assert catalog is not None
    a = catalog.find("f", PARALLELISM)
    assert a is not None
    assert (a.value_kind, a.value, a.bounds) == ("count", "2", (2, 4))
    assert [t.to_json() for t in a.targets] == [["q.t0", SPLIT, "active"]]
    assert "2 to 4" in a.doc
    assert check_tuple(catalog, "q", "f", PARALLELISM, " 3 ").runtime_value == 3
    assert check_tuple(catalog, "q", "f", PARALLELISM, "4").runtime_value == 4
    assert check_tuple(catalog, "q", "f", PARALLELISM, "2").runtime_value == 2


@pytest.mark.parametrize("value, words", [
    ("1", "1 is outside 2..4"), ("5", "5 is outside 2..4"), ("0", "outside 2..4"),
    ("-3", "outside 2..4"), ("three", "'three' is not a whole number; write one from 2 to 4"),
    ("2.5", "is not a whole number"), ("", "is not a whole number"),
    ("9" * 50, "is outside 2..4"), ("9" * 5000, "(5000 chars) is not a whole number"),
], ids=["1", "5", "0", "-3", "three", "2.5", "empty", "50-nines", "5000-nines"])
def test_a_parallelism_out_of_bounds_or_not_a_number_is_refused(tmp_path: Path, value: str,
                                                                words: str) -> None:
    catalog = compiled('parallelism="2" max-parallelism="4" min-parallelism="2"',
                       tmp_path).controls
    assert catalog is not None
    with pytest.raises(ControlRefused) as refused:
        check_tuple(catalog, "q", "f", PARALLELISM, value)
    assert words in str(refused.value) and refused.value.status == 400
    assert len(str(refused.value)) < 400  # a long value is not echoed whole


def test_a_stateful_operators_parallelism_is_fixed_with_the_reason(tmp_path: Path) -> None:
    catalog = compiled("", tmp_path, pattern_spec('parallelism="2"')).controls
    assert catalog is not None and catalog.find("w", PARALLELISM) is None
    (fixed,) = [f for f in catalog.fixed if (f.operator, f.parameter) == ("w", PARALLELISM)]
    assert "state" in fixed.reason
    with pytest.raises(ControlRefused) as refused:
        check_tuple(catalog, "q", "w", PARALLELISM, "1")
    assert "state" in str(refused.value)


# --- the scheduler's state machine ----------------------------------------------------------------

AGENTS = ("a1", "a2", "a3", "a4")
Q_SPEC = 'parallelism="1" max-parallelism="3"'


def exec_of(agent: str) -> str:
    return f"elastiq-exec-{agent}"


def warm(offer_id: str, agent: str):
    return offer(offer_id, agent, executor_ids=(exec_of(agent),))


class Driver:
    """A SchedulerState on a simulated clock, and the events of this test's cluster: offers,
    status updates, control acks and heartbeats of the elastic query q
    (src+splitter q.t0 -> filter slots q.t1..q.t3 -> merger+sink q.t4)."""

    def __init__(self, query: CompiledQuery) -> None:
        self.s = SchedulerState(CONFIG)
        self.query = query
        self.now = 100.0
        self.s.handle(Registered("r", "fw-1", "m:5050"))
        self.s.handle(Tick("t", self.now))
        self.s.handle(QuerySubmitted("s", query))
        self.offers = 0

    def record(self, task_id: str):
        return self.s.queries["q"].tasks[task_id]

    def state(self, task_id: str) -> TaskState:
        return self.record(task_id).state

    def mid(self, task_id: str) -> str:
        return self.record(task_id).mesos_task_id

    def offer(self, *agents: str) -> list[Command]:
        self.offers += 1
        return self.s.handle(OffersReceived("o", tuple(warm(f"o{self.offers}-{a}", a)
                                                       for a in agents)))

    def run(self, out: list[Command]) -> dict[str, str]:
        """Report every task launched in `out` RUNNING; task id -> agent."""
        placed = {m: a for m, (a, _) in launched(out).items()}
        for m, a in placed.items():
            self.s.handle(update(m, "RUNNING", a))
        return {m.rpartition(".a")[0]: a for m, a in placed.items()}

    def tick(self, seconds: float = 1.0) -> list[Command]:
        self.now += seconds
        return self.s.handle(Tick("tick", self.now))

    def scale(self, n: int | str, sid: str = "c") -> list[Command]:
        return self.s.handle(ControlRequested(sid, "q", (("f", PARALLELISM, str(n)),)))

    def ack(self, request: str, applied: bool = True, pause: float = 0.4,
            message: str = "") -> list[Command]:
        splitter = self.record("q.t0")
        version = self.s.queries["q"].control.requests[request].version
        return self.s.handle(ControlAcknowledged("a", splitter.agent_id or "", exec_of("a1"),
                                                 ControlAck(splitter.mesos_task_id, request,
                                                            version, applied, 9, pause,
                                                            message, 5.0)))

    def beat(self, figures: dict[str, dict[str, float]],
             usage: dict[str, dict[str, float]] | None = None) -> list[Command]:
        """One heartbeat per executor, carrying `figures` of its tasks (by task id) and, where
        `usage` has its agent, the executor's resource usage."""
        out: list[Command] = []
        by_agent: dict[str, dict[str, dict[str, float]]] = {}
        for task_id, figs in figures.items():
            record = self.record(task_id)
            by_agent.setdefault(record.agent_id or "", {})[record.mesos_task_id] = figs
        for agent, tasks in sorted(by_agent.items()):
            out += self.s.handle(HeartbeatReceived("hb", agent, exec_of(agent), Heartbeat(
                tasks, exec_of(agent), (usage or {}).get(agent, {}))))
        return out

    def view(self) -> dict:
        (e,) = query_view(self.s.queries["q"], self.s.unplaced)["elastic"]
        return e


def request_of(out: list[Command]) -> str:
    (reply,) = of(ReplyToRequest, out)
    assert (reply.accepted, reply.status) == (True, 202), reply
    return reply.body["request"]


def retained(channel: str, n: int) -> dict[str, float]:
    return {f"{RETAINED_PREFIX}{channel}": float(n)}


@pytest.fixture
def d(tmp_path: Path) -> Driver:
    """Query q running on one instance of its three filter slots, all on agent a1."""
    driver = Driver(compiled(Q_SPEC, tmp_path))
    assert driver.run(driver.offer("a1")) == {"q.t0": "a1", "q.t1": "a1", "q.t4": "a1"}
    return driver


def scaled_to_three(d: Driver) -> str:
    """Scale q's filter from 1 to 3, place and run the new instances, acknowledge; the
    request id."""
    request = request_of(d.scale(3))
    placed = d.run(d.offer("a2", "a3"))
    assert set(placed) == {"q.t2", "q.t3"} and placed["q.t2"] != placed["q.t3"]
    d.ack(request)
    return request


def test_slots_beyond_the_start_are_dormant_and_never_placed(tmp_path: Path) -> None:
    d = Driver(compiled(Q_SPEC, tmp_path))
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.DORMANT] * 2
    placed = d.run(d.offer(*AGENTS))
    assert set(placed) == {"q.t0", "q.t1", "q.t4"}
    for _ in range(3):
        d.tick(10.0)
        assert launched(d.offer(*AGENTS)) == {}
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.DORMANT] * 2
    assert snapshot(d.s)["queries"]["q"]["status"] == "running"
    view = d.view()
    assert (view["parallelism"], view["min"], view["max"], view["mode"]) == (1, 1, 3, "manual")
    assert [s["state"] for s in view["slots"]] == ["running", "dormant", "dormant"]
    assert instances_settled(view)


def test_a_scale_out_wakes_the_slots_places_them_and_tells_the_splitter(d: Driver) -> None:
    out = d.scale(3)
    request = request_of(out)
    assert not of(SendFrameworkMessage, out)  # the splitter switches once the new slots run
    assert of(ReviveOffers, out)
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.PENDING] * 2
    assert not instances_settled(d.view())
    placed = d.run(d.offer("a2", "a3"))
    assert set(placed) == {"q.t2", "q.t3"} and placed["q.t2"] != placed["q.t3"]  # kept apart
    (message,) = of(SendFrameworkMessage, d.tick())
    assert (message.agent_id, message.executor_id) == ("a1", exec_of("a1"))
    assert message.message == ControlMessage("q.t0.a1", request, 1,
                                             {"split:q/f_s#1+q/f_s#2+q/f_s#3": {"active": 3}})
    assert not of(SendFrameworkMessage, d.tick())  # once
    (rescale,) = d.view()["rescales"]
    assert (rescale["from"], rescale["to"], rescale["trigger"], rescale["state"]) == \
        (1, 3, "manual", "pending")
    d.ack(request, pause=0.4)
    (rescale,) = d.view()["rescales"]
    assert (rescale["state"], rescale["pause_s"], rescale["applied_at"]) == \
        ("applied", 0.4, d.now)
    assert d.view()["parallelism"] == 3 and instances_settled(d.view())
    # a relaunch of the splitter carries the new parallelism
    assert d.s.queries["q"].control.params_of("q.t0")["params"] == \
        {"split:q/f_s#1+q/f_s#2+q/f_s#3": {"active": 3}}


def test_a_second_request_waits_for_the_first(d: Driver) -> None:
    request_of(d.scale(3))
    (busy,) = d.scale(2, "c2")
    assert (busy.accepted, busy.status) == (False, 409) and "still being applied" in busy.message
    (bad,) = d.scale(7, "c3")
    assert (bad.accepted, bad.status) == (False, 400) and "outside 1..3" in bad.message


def drain_figures(d: Driver, splitter: dict[str, int], own: dict[str, int]
                  ) -> dict[str, dict[str, float]]:
    """Heartbeat figures: the splitter's retained batches per partition channel (by slot
    number), and each listed instance's retained batches of its own output."""
    figs = {"q.t0": {k: v for n, left in splitter.items()
                     for k, v in retained(f"q/f_s#{n}", left).items()}}
    for slot, left in own.items():
        figs[f"q.t{slot}"] = retained(f"q/f_{slot}_out", left)
    return figs


def kills(out: list[Command]) -> set[str]:
    return {k.mesos_task_id for k in of(KillTask, out)}


def test_a_scale_in_retires_instances_only_once_drained_then_they_sleep(d: Driver) -> None:
    scaled_to_three(d)
    t2, t3 = d.mid("q.t2"), d.mid("q.t3")
    out = d.scale(1)
    request = request_of(out)
    assert kills(out) == set()
    assert [d.record(t).retiring for t in ("q.t1", "q.t2", "q.t3")] == [False, True, True]
    assert [s["retiring"] for s in d.view()["slots"]] == [False, True, True]
    # drained everywhere, but the request is not acknowledged yet: nothing stops
    assert kills(d.beat(drain_figures(d, {2: 0, 3: 0}, {2: 0, 3: 0}))) == set()
    for _ in range(5):
        assert kills(d.tick()) == set()
    d.ack(request)
    # the splitter still holds batches for slot 2 and 3: never stopped, however long
    for _ in range(int(DRAIN_SETTLE_SECONDS) + 3):
        d.tick()
        assert kills(d.beat(drain_figures(d, {2: 4, 3: 1}, {2: 0, 3: 0}))) == set()
    # the splitter's partitions are drained from now on; the instances' own figures must come
    # DRAIN_SETTLE_SECONDS later (measured after their last write), and be 0
    d.tick()
    drained_at = d.now
    assert kills(d.beat(drain_figures(d, {2: 0, 3: 0}, {2: 0, 3: 0}))) == set()
    stopped: dict[str, float] = {}
    while d.now < drained_at + DRAIN_SETTLE_SECONDS + 3:
        d.tick()
        own_t3 = 2 if d.now < drained_at + DRAIN_SETTLE_SECONDS + 2 else 0
        out = d.beat(drain_figures(d, {2: 0, 3: 0}, {2: 0, 3: own_t3}))
        for mid in kills(out):
            stopped.setdefault(mid, d.now)
    assert stopped == {t2: drained_at + DRAIN_SETTLE_SECONDS,
                       t3: drained_at + DRAIN_SETTLE_SECONDS + 2}
    assert d.state("q.t2") is TaskState.RUNNING  # until the agent says it is killed
    assert kills(d.tick()) == set()  # asked once
    for mid in (t2, t3):
        d.s.handle(update(mid, "KILLED", d.record(mid.rpartition(".a")[0]).agent_id or ""))
    assert [d.state(t) for t in ("q.t1", "q.t2", "q.t3")] == \
        [TaskState.RUNNING, TaskState.DORMANT, TaskState.DORMANT]
    assert not d.record("q.t2").retiring and not d.record("q.t2").kill_requested
    view = d.view()
    assert instances_settled(view) and view["parallelism"] == 1
    assert view["rescales"][-1]["retired_at"] == d.now
    assert d.s.queries["q"].phase == "active"
    assert snapshot(d.s)["queries"]["q"]["status"] == "running"
    assert d.s.queries["q"].tasks["q.t0"].launches == 1  # the splitter never restarted


def retire_to_one(d: Driver) -> list[Command]:
    """From 3 instances, scale q's filter in to 1 and drain slots 2 and 3 until they are
    killed and dormant; what the scheduler did at their KILLED updates."""
    d.ack(request_of(d.scale(1)))
    mids = {d.mid("q.t2"), d.mid("q.t3")}
    stopped: set[str] = set()
    while stopped != mids:
        d.tick()
        stopped |= kills(d.beat(drain_figures(d, {2: 0, 3: 0}, {2: 0, 3: 0})))
    out: list[Command] = []
    for mid in sorted(mids):
        out += d.s.handle(update(mid, "KILLED", d.record(mid.rpartition(".a")[0]).agent_id or ""))
    return out


def retargets(out: list[Command], task_id: str) -> dict[str, str]:
    """The endpoints the retargets in `out` send to task `task_id`'s current attempt."""
    return {c: e for r in of(RetargetChannels, out) if r.mesos_task_id.startswith(task_id + ".a")
            for c, e in r.endpoints}


def test_a_retired_instance_is_no_longer_placed_for_the_merger_until_it_runs_again(
        d: Driver) -> None:
    """The merger's task (q.t4) learns that a slot a scale-in retired has no writer (the
    endpoint "", `messages.UNPLACED`), so it does not wait for its writer, gone for good
    (`common.dpc.waited_for`); a scale-out that launches the slot again gives the merger its
    endpoint back, so it waits for it again; a merger relaunched meanwhile starts without it."""
    query = d.s.queries["q"]
    assert unplaced_channels(query.query, query.tasks) == {}  # dormant at the start: never
    scaled_to_three(d)                                        # placed, nothing to take back
    placed = dict(d.record("q.t4").endpoints)
    assert placed["q/f_2_out"].startswith("tcp://") and placed["q/f_3_out"].startswith("tcp://")
    out = retire_to_one(d)
    assert retargets(out, "q.t4") == {"q/f_2_out": "", "q/f_3_out": ""}
    assert d.record("q.t4").endpoints["q/f_2_out"] == ""
    assert d.record("q.t4").endpoints["q/f_1_out"] == placed["q/f_1_out"]  # active: kept
    assert unplaced_channels(query.query, query.tasks) == {}  # told once
    assert retargets(d.tick(), "q.t4") == {}
    # the merger's task fails and is relaunched: the dormant slots' channels are not placed
    d.s.handle(update(d.mid("q.t4"), "FAILED", "a1"))
    d.tick(5.0)
    relaunched = d.run(d.offer("a1"))
    assert "q.t4" in relaunched
    assert d.record("q.t4").endpoints["q/f_3_out"] == ""
    # a scale-out launches slot 2 again: the merger waits for it again
    request = request_of(d.scale(2, "up"))
    out = d.offer("a2")
    d.run(out)
    assert retargets(out, "q.t4")["q/f_2_out"].startswith("tcp://")
    assert d.record("q.t4").endpoints["q/f_3_out"] == ""  # still dormant
    d.ack(request)


def test_unplaced_channels_are_the_outputs_of_dormant_slots_a_consumer_was_given(
        tmp_path: Path) -> None:
    """The pure decision: only a dormant slot's channels whose consumer holds an endpoint."""
    d = Driver(compiled(Q_SPEC, tmp_path))
    d.run(d.offer("a1"))
    query = d.s.queries["q"]
    merger = d.record("q.t4")
    assert unplaced_channels(query.query, query.tasks) == {}
    merger.endpoints["q/f_3_out"] = "tcp://127.0.0.1:1"  # as if slot 3 had run and retired
    assert unplaced_channels(query.query, query.tasks) == {"q.t4": ("q/f_3_out",)}
    merger.endpoints["q/f_1_out"] = "tcp://127.0.0.1:2"  # slot 1 runs: never taken back
    assert unplaced_channels(query.query, query.tasks) == {"q.t4": ("q/f_3_out",)}


def test_a_drained_splitter_that_fills_again_restarts_the_settle_clock(d: Driver) -> None:
    scaled_to_three(d)
    d.ack(request_of(d.scale(2)))
    t3 = d.mid("q.t3")
    d.tick()
    d.beat(drain_figures(d, {3: 0}, {3: 0}))
    for _ in range(2):
        d.tick()
        assert kills(d.beat(drain_figures(d, {3: 0}, {3: 0}))) == set()
    d.tick()
    assert kills(d.beat(drain_figures(d, {3: 1}, {3: 0}))) == set()  # a late batch
    d.tick()
    again = d.now
    d.beat(drain_figures(d, {3: 0}, {3: 0}))
    first_kill = None
    for _ in range(int(DRAIN_SETTLE_SECONDS) + 1):
        d.tick()
        if kills(d.beat(drain_figures(d, {3: 0}, {3: 0}))) == {t3} and first_kill is None:
            first_kill = d.now
    assert first_kill == again + DRAIN_SETTLE_SECONDS
    assert d.state("q.t2") is TaskState.RUNNING and not d.record("q.t2").retiring


def test_a_retiring_instance_that_fails_on_its_own_restarts_instead_of_sleeping(d: Driver
                                                                               ) -> None:
    scaled_to_three(d)
    d.ack(request_of(d.scale(2)))
    assert d.record("q.t3").retiring
    d.tick()
    d.s.handle(update(d.mid("q.t3"), "FAILED", d.record("q.t3").agent_id or ""))
    assert d.state("q.t3") is TaskState.FAILED
    assert d.record("q.t3").restart_at is not None
    d.tick(10.0)
    assert d.state("q.t3") is TaskState.PENDING  # not dormant: it was not drained
    placed = d.run(d.offer("a3"))
    assert set(placed) == {"q.t3"}
    assert d.record("q.t3").retiring  # it still retires, once drained


def test_scaling_out_again_while_retiring_keeps_the_instances(d: Driver) -> None:
    scaled_to_three(d)
    d.ack(request_of(d.scale(1)))
    assert d.record("q.t2").retiring and d.record("q.t3").retiring
    out = d.scale(3, "up")
    request = request_of(out)
    assert not d.record("q.t2").retiring and not d.record("q.t3").retiring
    assert launched(out) == {} and kills(out) == set()  # they never stopped
    d.ack(request)
    for _ in range(int(DRAIN_SETTLE_SECONDS) + 3):
        d.tick()
        assert kills(d.beat(drain_figures(d, {2: 0, 3: 0}, {2: 0, 3: 0}))) == set()
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.RUNNING] * 2
    assert instances_settled(d.view()) and d.view()["parallelism"] == 3


def test_scaling_out_after_the_kill_was_sent_wakes_the_slot_again(d: Driver) -> None:
    scaled_to_three(d)
    d.ack(request_of(d.scale(2)))
    t3 = d.mid("q.t3")
    d.tick()
    d.beat(drain_figures(d, {3: 0}, {3: 0}))
    for _ in range(int(DRAIN_SETTLE_SECONDS)):
        d.tick()
        out = d.beat(drain_figures(d, {3: 0}, {3: 0}))
    assert kills(out) == {t3}
    d.ack(request_of(d.scale(3, "up")))
    d.s.handle(update(t3, "KILLED", d.record("q.t3").agent_id or ""))
    assert d.state("q.t3") is TaskState.DORMANT
    d.tick()
    assert d.state("q.t3") is TaskState.PENDING
    assert set(d.run(d.offer("a3"))) == {"q.t3"}
    assert instances_settled(d.view())


def test_a_refused_scale_out_puts_the_slots_that_never_launched_back_to_sleep(d: Driver
                                                                             ) -> None:
    out = d.scale(3)
    request = request_of(out)
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.PENDING] * 2
    d.ack(request, applied=False, message="the splitter cannot switch")
    control = d.s.queries["q"].control
    assert control.requests[request].state == "refused"
    assert d.view()["parallelism"] == 1
    assert d.view()["rescales"][-1]["state"] == "refused"
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.DORMANT] * 2
    assert launched(d.offer("a2", "a3")) == {}  # nothing to place
    assert instances_settled(d.view())


def test_a_refused_scale_out_retires_slots_that_already_launched(d: Driver) -> None:
    request = request_of(d.scale(3))
    d.run(d.offer("a2", "a3"))
    d.ack(request, applied=False, message="the splitter cannot switch")
    assert d.view()["parallelism"] == 1
    assert d.record("q.t2").retiring and d.record("q.t3").retiring


def expire_scale_out(d: Driver, offers: tuple[str, ...]) -> tuple[str, list[Command]]:
    """Ask q for 3 instances, then let `scale_out_wait` pass with `offers` made every 10 s;
    the request (pending until the end) and what the scheduler did meanwhile."""
    request = request_of(d.scale(3))
    out: list[Command] = []
    while d.now + 10.0 < 100.0 + CONFIG.scale_out_wait:
        alive = {t: {} for t in ("q.t0", "q.t1", "q.t2", "q.t3", "q.t4")
                 if d.record(t).state.launched}  # every executor heartbeats
        out += d.tick(10.0) + d.beat(alive) + d.offer(*offers)
        assert d.s.queries["q"].control.requests[request].state == "pending"
    return request, out + d.tick(10.0)


def test_a_scale_out_whose_instances_find_no_place_is_undone_after_the_wait(d: Driver
                                                                             ) -> None:
    """Only a1 offers, and it holds the first instance (the slots are kept apart): after
    `scale_out_wait` the request is refused with what the new slots wait for and undone, the
    splitter never heard of it, the slots sleep again and the query takes requests again."""
    request, out = expire_scale_out(d, ("a1",))
    done = d.s.queries["q"].control.requests[request]
    assert done.state == "refused" and "q.t2 waits for" in done.reason, done.reason
    assert "q.t3 waits for" in done.reason and "180 s" in done.reason, done.reason
    assert not of(SendFrameworkMessage, out) and not kills(out)
    assert d.view()["parallelism"] == 1 and d.view()["rescales"][-1]["state"] == "refused"
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.DORMANT] * 2
    assert instances_settled(d.view())
    request_of(d.scale(2))


def test_a_scale_out_whose_instances_never_start_stops_them_after_the_wait(d: Driver
                                                                            ) -> None:
    """The new instances are launched but never report running: after the wait they are
    killed (nothing was routed to them) and sleep once they ended."""
    placed = launched(d.offer("a2", "a3"))
    assert placed == {}  # nothing asked yet
    request, out = expire_scale_out(d, ("a2", "a3"))
    assert d.s.queries["q"].control.requests[request].state == "refused"
    assert "q.t2 is " in d.s.queries["q"].control.requests[request].reason
    assert kills(out) == {d.mid("q.t2"), d.mid("q.t3")}
    assert not of(SendFrameworkMessage, out)
    for task_id in ("q.t2", "q.t3"):
        d.s.handle(update(d.mid(task_id), "KILLED", d.record(task_id).agent_id or ""))
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.DORMANT] * 2
    assert d.view()["parallelism"] == 1 and instances_settled(d.view())


def test_stopping_the_query_kills_its_dormant_slots_and_it_settles(d: Driver) -> None:
    out = d.s.handle(QueryStopRequested("stop", "q"))
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.KILLED] * 2
    assert kills(out) == {"q.t0.a1", "q.t1.a1", "q.t4.a1"}
    for mid in sorted(kills(out)):
        d.s.handle(update(mid, "KILLED"))
    assert d.s.queries["q"].phase == "stopped"


def test_stopping_while_retiring_kills_every_launched_instance(d: Driver) -> None:
    scaled_to_three(d)
    d.ack(request_of(d.scale(1)))
    out = d.s.handle(QueryStopRequested("stop", "q"))
    assert kills(out) == {d.mid(t) for t in ("q.t0", "q.t1", "q.t2", "q.t3", "q.t4")}
    for mid in sorted(kills(out)):
        d.s.handle(update(mid, "KILLED", d.record(mid.rpartition(".a")[0]).agent_id or ""))
    assert d.s.queries["q"].phase == "stopped"
    assert d.state("q.t3") is TaskState.KILLED  # a stopped query's slot is not dormant


def persisted(d: Driver):
    """The query as a new leader restores it from what was persisted (JSON, as ZooKeeper
    keeps it)."""
    saved = json.loads(json.dumps(durable_placements(d.s.queries["q"])))
    return restore_query(d.query, None, saved, d.now + 100.0)


def test_a_new_leader_keeps_dormant_and_retiring_slots_and_the_parallelism(d: Driver) -> None:
    from scheduler.elasticity import parallelism

    (e,) = d.query.elastic
    restored = persisted(d)
    assert [restored.tasks[t].state for t in e.slots] == \
        [TaskState.RUNNING, TaskState.DORMANT, TaskState.DORMANT]
    assert parallelism(e, restored.control) == 1
    scaled_to_three(d)
    d.ack(request_of(d.scale(2)))
    restored = persisted(d)
    assert {t: r.state for t, r in restored.tasks.items()} == \
        {t: r.state for t, r in d.s.queries["q"].tasks.items()}
    assert [restored.tasks[t].retiring for t in e.slots] == [False, False, True]
    assert restored.control.values == {"f": {PARALLELISM: "2"}}
    assert parallelism(e, restored.control) == 2


def test_a_query_whose_running_tasks_finish_is_finished_with_its_slots_asleep(d: Driver
                                                                             ) -> None:
    """A bounded source ends: every launched task finishes; the dormant slots ran nothing and
    must not keep the query from settling."""
    for task_id in ("q.t0", "q.t1", "q.t4"):
        d.s.handle(update(d.mid(task_id), "FINISHED"))
    assert d.s.queries["q"].phase == "finished"
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.DORMANT] * 2
    assert kills(d.tick()) == set() and launched(d.offer("a2")) == {}


def test_a_scale_in_waits_for_a_scale_out_whose_slots_have_not_run_yet(d: Driver) -> None:
    """1 -> 3 waits for its new instances before the splitter switches (nothing is routed to
    them before they run); a scale-in asked meanwhile is refused, one request at a time; once
    they ran and the splitter switched, a scale-in retires them."""
    request = request_of(d.scale(3))
    (busy,) = d.scale(1, "down")
    assert (busy.accepted, busy.status) == (False, 409) and "still being applied" in busy.message
    assert [d.state(t) for t in ("q.t2", "q.t3")] == [TaskState.PENDING] * 2
    assert set(d.run(d.offer("a2", "a3"))) == {"q.t2", "q.t3"}
    assert of(SendFrameworkMessage, d.tick())  # now the splitter hears of it
    d.ack(request)
    d.ack(request_of(d.scale(1, "down")))
    d.tick()
    assert d.record("q.t2").retiring and d.record("q.t3").retiring


def test_a_rescale_settles_when_it_last_moved() -> None:
    """The automatic policy's cool-down counts from the latest of asked, applied, retired."""
    r = Rescale("f", 1, 3, "auto", "req", asked_at=10.0)
    assert r.settled_at() == 10.0
    r.applied_at = 25.0  # the new instances took 15 s to start
    assert r.settled_at() == 25.0
    r.retired_at = 40.0
    assert r.settled_at() == 40.0


def test_status_lines_show_the_slots_the_last_rescale_and_the_policys_capacity() -> None:
    from elastiq.service_cli import elastic_lines

    view = {"operator": "f", "parallelism": 2, "max": 4, "min": 1, "mode": "auto",
            "slots": [{"task": "q.t1", "retiring": False}, {"task": "q.t2", "retiring": True}],
            "rescales": [{"from": 3, "to": 2, "trigger": "auto", "state": "applied",
                          "pause_s": 0.25}],
            "decision": {"explanation": "q/f: hold at 2: ...",
                         "capacity": {"rate": 2000.0, "measured": True, "at": 1.0}}}
    assert elastic_lines([view]) == [
        "  elastic f: 2 of 4 instances (min 1, auto), retiring q.t2",
        "    last rescale 3 -> 2 (auto, applied, paused 0.25 s)",
        "    capacity: 2,000 rows/s per instance (measured while rows queued)",
        "    policy: q/f: hold at 2: ..."]
    view["decision"]["capacity"] = {"rate": 640.4, "measured": False, "at": 1.0}
    assert elastic_lines([view])[2] == \
        "    capacity: 640 rows/s per instance (a lower bound, the best seen while keeping up)"
    view["decision"]["capacity"] = None
    assert not any("capacity" in line for line in elastic_lines([view]))


# --- a join: its splitters switch at one planned event time ---------------------------------------

def join_query(tmp_path: Path) -> CompiledQuery:
    text = (Path(__file__).parent / "specs" / "e2e-join.xml").read_text().replace(
        '<operator name="matched" type="join">',
        '<operator name="matched" type="join" parallelism="1" max-parallelism="3">')
    return compile_spec_text(text.encode(), str(tmp_path / "j.xml"), base_dir=tmp_path).query


def test_a_join_is_elastic_with_a_spread_on_its_right_input(tmp_path: Path) -> None:
    q = join_query(tmp_path)
    (e,) = q.elastic
    assert (e.operator, e.stateful, e.switch_time, e.switch_close_ms) == ("matched", True,
                                                                          "ts", 200)
    assert e.planned_spreads == (0, 200) and len(e.splitters) == 2
    assert ElasticOperator.from_json(json.loads(json.dumps(e.to_json()))) == e
    left, right = (q.task(t).program for t, _ in e.splitters)
    assert "switch=('ts', 1000, 32200, 1000, 0, 1)" in left
    assert "switch=('ts', 1000, 32200, 1000, 200, 1)" in right
    assert q.controls is not None and q.controls.find("matched", PARALLELISM) is not None


class RunningJoin:
    """A scheduler running the join query with every task placed."""

    def __init__(self, tmp_path: Path) -> None:
        self.q = join_query(tmp_path)
        (self.e,) = self.q.elastic
        self.s = SchedulerState(CONFIG)
        self.s.handle(Registered("r", "fw-1", "m:5050"))
        self.s.handle(Tick("t", 100.0))
        self.s.handle(QuerySubmitted("s", self.q))
        self.record = self.s.queries[self.q.query_id]
        self.place(*AGENTS)
        self.place(*AGENTS)
        assert all(self.record.tasks[t].state is TaskState.RUNNING for t, _ in self.e.splitters)

    def place(self, *agents: str) -> None:
        out = self.s.handle(OffersReceived("o", tuple(
            warm(f"o-{a}-{len(self.record.tasks)}-{i}", a) for i, a in enumerate(agents))))
        for m, (a, _) in launched(out).items():
            self.s.handle(update(m, "RUNNING", a))

    def routed(self, ms: dict[str, int]) -> None:
        """Each splitter's heartbeat reports it routed up to `ms[task]`."""
        for task_id, at in ms.items():
            task = self.record.tasks[task_id]
            agent = task.agent_id or ""
            self.s.handle(HeartbeatReceived("hb", agent, exec_of(agent), Heartbeat(
                {task.mesos_task_id: {"routed_ms": at}}, exec_of(agent))))

    def rescale(self, n: int, sid: str = "c") -> dict[str, Any]:
        """Ask for `n` instances, place any new ones; the parameters sent to each task."""
        out = self.s.handle(ControlRequested(sid, self.q.query_id,
                                             (("matched", PARALLELISM, str(n)),)))
        for _ in range(3):
            self.place(*AGENTS)
            out += self.s.handle(Tick("t", 101.0))
        return {c.message.task.rpartition(".a")[0]: c.message.params
                for c in of(SendFrameworkMessage, out)}

    def answer(self, switch_ms: int) -> None:
        """Every splitter applies the pending request, switching at `switch_ms`."""
        (request_id,) = [r for r, req in self.record.control.requests.items()
                         if req.state == "pending"]
        version = self.record.control.requests[request_id].version
        for task_id, _ in self.e.splitters:
            task = self.record.tasks[task_id]
            agent = task.agent_id or ""
            self.s.handle(ControlAcknowledged("a", agent, exec_of(agent), ControlAck(
                task.mesos_task_id, request_id, version, True, 9, 0.1, "", 5.0,
                {"switch_ms": float(switch_ms)})))


def test_a_joins_splitters_get_one_switch_time_past_what_both_routed(tmp_path: Path) -> None:
    from scheduler.elasticity import PLAN_AHEAD_MS

    join = RunningJoin(tmp_path)
    s, record, e = join.s, join.record, join.e
    join.routed({e.splitters[0][0]: 50_400, e.splitters[1][0]: 50_350})
    sent = join.rescale(3)
    assert set(sent) == {t for t, _ in e.splitters}, sent
    want = -(-(50_350 + 200 + PLAN_AHEAD_MS) // 1000) * 1000
    for task_id, op in e.splitters:
        assert sent[task_id][op]["active"] == [3, want], sent[task_id]
    # a splitter that fails before it answers is relaunched with the same planned time
    left, op = e.splitters[0]
    failed = record.tasks[left]
    s.handle(update(failed.mesos_task_id, "FAILED", failed.agent_id or ""))
    relaunched: dict = {}
    for _ in range(3):
        out = s.handle(OffersReceived("o", tuple(warm(f"r-{a}-{_}", a) for a in AGENTS)))
        relaunched.update({m.rpartition(".a")[0]: d for m, (_, d) in launched(out).items()})
        s.handle(Tick("t", 110.0 + 20 * _))
    assert relaunched[left]["control"]["params"][op]["active"] == [3, want], relaunched


def test_a_rescale_asked_before_the_splitters_routed_further_switches_after_the_last(
        tmp_path: Path) -> None:
    """The heartbeats have not moved since the last switch was planned: the next one lands a
    second after it, not on it (where it would undo it: the instances it added would get no
    row, nor the ticks that retire them)."""
    join = RunningJoin(tmp_path)
    join.routed({t: 50_000 for t, _ in join.e.splitters})
    sent = join.rescale(3)
    (at,) = {sent[t][o]["active"][1] for t, o in join.e.splitters}
    join.answer(at)
    assert (join.record.elastic.rescales[-1].state,
            join.record.elastic.rescales[-1].switch_ms) == ("applied", at)
    again = join.rescale(2, "c2")
    assert {again[t][o]["active"][1] for t, o in join.e.splitters} == {at + 1000}, again


def test_a_join_catching_up_is_planned_further_ahead_at_its_pace(tmp_path: Path) -> None:
    """The left splitter routed 20 s of event time in the last second (a backlog): 10 s ahead
    would be past before the switch reached it, so the plan lies PLAN_AHEAD_SECONDS of its
    pace ahead instead; the right one, at its real-time pace, does not move the plan."""
    from scheduler.elasticity import PLAN_AHEAD_SECONDS

    join = RunningJoin(tmp_path)
    (left, _), (right, _) = join.e.splitters
    join.routed({left: 50_000, right: 50_000})
    join.s.handle(Tick("t", 101.0))
    join.routed({left: 70_000, right: 51_000})
    assert (join.record.tasks[left].routed_pace, join.record.tasks[right].routed_pace) == \
        (20_000.0, 1_000.0)
    sent = join.rescale(3)
    want = 70_000 + int(20_000 * PLAN_AHEAD_SECONDS)
    assert {sent[t][o]["active"][1] for t, o in join.e.splitters} == {want}, sent


def test_a_splitters_pace_comes_from_two_heartbeats_that_tell() -> None:
    from scheduler.elasticity import routed_pace

    assert routed_pace(50_000, 10.0, 52_000, 12.0, 7.0) == 1_000.0
    for before, before_at, after, now in ((None, 10.0, 52_000, 12.0),  # a first heartbeat
                                          (50_000, 10.0, None, 12.0),  # a new attempt
                                          (-1, 10.0, 52_000, 12.0),  # nothing routed before
                                          (50_000, 10.0, -1, 12.0),  # nor now
                                          (50_000, 12.0, 52_000, 12.0)):  # time stood still
        assert routed_pace(before, before_at, after, now, 7.0) == 7.0


def test_a_joins_refused_scale_out_stops_its_new_instances_once_their_outputs_are_done(
        tmp_path: Path) -> None:
    """A splitter refuses the planned switch (it routed past it): the request is undone, and
    the two new instances, which own no pair (no left row was routed to them), retire as soon
    as their own outputs are acknowledged, without waiting for a watermark past a switch that
    never happened; the operator takes rescales again."""
    from scheduler.elasticity import DRAIN_SETTLE_SECONDS

    join = RunningJoin(tmp_path)
    join.routed({t: 50_000 for t, _ in join.e.splitters})
    join.rescale(3)
    new = [join.record.tasks[t] for t in join.e.slots[1:]]
    assert all(t.state is TaskState.RUNNING for t in new)
    left = join.record.tasks[join.e.splitters[0][0]]
    (request_id,) = join.record.control.requests
    agent = left.agent_id or ""
    join.s.handle(ControlAcknowledged("a", agent, exec_of(agent), ControlAck(
        left.mesos_task_id, request_id, join.record.control.requests[request_id].version,
        False, -1, 0.0, "event time already reached 61000 ms, past the planned switch")))
    assert join.record.elastic.rescales[-1].state == "refused"
    assert all(t.retiring for t in new)

    def beat(now: float) -> list[Command]:
        join.s.handle(Tick("t", now))
        out: list[Command] = []
        for task in new:
            done = {f"{RETAINED_PREFIX}{c}": 0.0 for c in task.task.outputs}
            out += join.s.handle(HeartbeatReceived("hb", task.agent_id or "",
                                                   exec_of(task.agent_id or ""), Heartbeat(
                {task.mesos_task_id: {**done, "watermark_ms": 40_000.0}},
                exec_of(task.agent_id or ""))))
        return out
    assert not kills(beat(102.0))
    stopped = beat(103.0 + DRAIN_SETTLE_SECONDS)
    assert kills(stopped) == {t.mesos_task_id for t in new}, stopped


def test_a_splitter_relaunched_past_the_planned_switch_has_the_rescale_undone(
        tmp_path: Path) -> None:
    """A join's splitter dies before it answers and, relaunched with the planned time, finds
    it routed past it (its launch fails "[switch refused]"): the rescale is refused and undone
    on the other splitter, and the failed one is relaunched with the old parallelism, not
    failed as a broken program nor relaunched into the same refusal."""
    from common.failures import tag

    join = RunningJoin(tmp_path)
    join.routed({t: 50_000 for t, _ in join.e.splitters})
    sent = join.rescale(3)
    (left, op), (right, right_op) = join.e.splitters
    failed = join.record.tasks[left]
    message = tag("refused", f"task {left} did not start: SwitchRefused: task {left}, operator "
                             f"{op}: cannot switch to 3 instances: event time already reached")
    agent = failed.agent_id or ""
    out = join.s.handle(StatusUpdated("f", failed.mesos_task_id, "FAILED", "REASON_TASK_FAILED",
                                      message, agent, exec_of(agent), "SOURCE_EXECUTOR"))
    (request,) = join.record.control.requests.values()
    assert request.state == "refused" and "SwitchRefused" in request.reason, request
    assert join.record.phase == "active", join.record.phase
    assert join.record.elastic.rescales[-1].state == "refused"
    undo = {c.message.task.rpartition(".a")[0]: c.message.params
            for c in of(SendFrameworkMessage, out)}
    # the undo puts back what the program says (no override: the compiled parallelism, 1)
    assert sent[right][right_op]["active"] != 1 and undo[right].get(right_op, {}) == {}, undo
    relaunched: dict = {}
    for i in range(3):
        out = join.s.handle(OffersReceived("o", tuple(warm(f"r-{a}-{i}", a) for a in AGENTS)))
        relaunched.update({m.rpartition(".a")[0]: d for m, (_, d) in launched(out).items()})
        join.s.handle(Tick("t", 110.0 + 5 * i))
    assert relaunched[left]["control"]["params"].get(op, {}) == {}, relaunched

