"""Splitting and merging a running stateless operator (issue 12, pattern 5 at run time), our own
logic without Spark or processes: `min-parallelism="0"` refused where it cannot hold, the
compiled plan (rewrite_rules/folding.rule: the splitter's last partition feeds an instance
folded into the merger's task, which is no slot), the `parallelism` control down to 0, the
splitter's routing at 0, the CLI's `--split`/`--merge`, and the scheduler's state machine
splitting the operator out onto another agent and folding it back with nothing else
restarted. The run with real processes is in tests/test_elastic_cluster.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from common.control import PARALLELISM, ControlRefused
from common.messages import ControlMessage
from common.tasks import CompiledQuery, ElasticOperator
from compiler.control import check_tuple
from compiler.pipeline import check_spec_text
from elastiq.control_cli import (instances_line, instances_settled, split_refusal,
                                  wanted_parallelism)
from elastiq.service_cli import elastic_lines
from executor import routing
from scheduler.commands import SendFrameworkMessage
from scheduler.elasticity import DRAIN_SETTLE_SECONDS
from scheduler.lifecycle import TaskState
from tests.test_elasticity import (Driver, compiled, drain_figures, filter_spec, kills,
                                   pattern_spec, refused_at_value, request_of, window_spec)
from tests.test_scheduler_state import of, update

FOLDED = 'parallelism="0" min-parallelism="0" max-parallelism="2"'
SPLIT = "split:q/f_s#1+q/f_s#2+q/f_s#3"


# --- validation -----------------------------------------------------------------------------------

BAD = [
    ("stateful", window_spec('max-parallelism="2" min-parallelism="0"'), 'min-parallelism="0"',
     "only a stateless operator with one input can do (window-aggregate)"),
    ("pattern", pattern_spec('max-parallelism="2" min-parallelism="0"'), 'min-parallelism="0"',
     "only a stateless operator"),
    ("auto", filter_spec('max-parallelism="2" min-parallelism="0" elastic="auto"'),
     'min-parallelism="0"', 'elastic="auto" keeps at least one instance of its own'),
    ("zero-without-min", filter_spec('parallelism="0" max-parallelism="2"'), 'parallelism="0"',
     "parallelism=0 is out of range"),
    ("no-slots", filter_spec('parallelism="0" min-parallelism="0"'), 'parallelism="0"',
     "parallelism=0 without max-parallelism= leaves no instance to split onto"),
    ("negative-min", filter_spec('max-parallelism="2" min-parallelism="-1"'),
     'min-parallelism="-1"', "min-parallelism=-1 is out of range"),
]


@pytest.mark.parametrize("text, attr, message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_folding_where_it_cannot_hold_is_refused_at_the_attribute(text: str, attr: str,
                                                                  message: str) -> None:
    refused_at_value(text, attr, message)


@pytest.mark.parametrize("attrs", [FOLDED, 'max-parallelism="1" min-parallelism="00"',
                                   'parallelism="1" max-parallelism="3" min-parallelism="0"'])
def test_folding_attributes_compile_without_a_word(attrs: str) -> None:
    graph, diagnostics = check_spec_text(filter_spec(attrs), "ok.xml")
    assert graph is not None and diagnostics == [], [d.render() for d in diagnostics]


# --- the compiled plan ----------------------------------------------------------------------------

def test_the_folded_instance_runs_in_the_mergers_task_and_is_no_slot(tmp_path: Path) -> None:
    q = compiled(FOLDED, tmp_path)
    (e,) = q.elastic
    assert e == ElasticOperator("f", ("q.t1", "q.t2"), (("q.t0", SPLIT),), 0, 0, "manual",
                                False, folded_into="q.t3")
    assert q.task("q.t0").outputs == ("q/f_s#1", "q/f_s#2", "q/f_s#3")
    program = q.task("q.t0").program
    assert "active=0," in program and "folded=True" in program
    folded = q.task("q.t3")  # reader of the last partition, the instance, the merger, the sink
    assert folded.operators == ("f_rd_0", "f_0", "f_merge", "sink")
    assert folded.inputs == ("q/f_s#3", "q/f_1_out", "q/f_2_out")
    # split, the first instance runs apart from the task it was folded into, and the
    # instances apart from each other (so M agents still hold M of them)
    assert folded.placement.apart_from == ("f.p1",)
    assert [q.task(t).placement.group for t in e.slots] == ["f.p1", "f.p2"]
    back = CompiledQuery.from_json(json.loads(json.dumps(q.to_json())))
    assert back == q and back.elastic == (e,)
    unfolded = compiled('parallelism="1" max-parallelism="2"', tmp_path).elastic[0]
    assert unfolded.folded_into is None and unfolded.minimum == 1


def test_the_parallelism_goes_down_to_zero_for_a_folding_operator_only(tmp_path: Path) -> None:
    catalog = compiled(FOLDED, tmp_path).controls
    assert catalog is not None
    adjustable = catalog.find("f", PARALLELISM)
    assert adjustable is not None and adjustable.bounds == (0, 2)
    assert [t.to_json() for t in adjustable.targets] == [["q.t0", SPLIT, "active"]]
    for value in ("0", "1", "2"):
        assert check_tuple(catalog, "q", "f", PARALLELISM, value).runtime_value == int(value)
    for value in ("-1", "3"):
        with pytest.raises(ControlRefused, match="outside 0..2"):
            check_tuple(catalog, "q", "f", PARALLELISM, value)
    plain = compiled('parallelism="1" max-parallelism="2"', tmp_path).controls
    assert plain is not None
    with pytest.raises(ControlRefused, match="outside 1..2") as refused:  # a --merge
        check_tuple(plain, "q", "f", PARALLELISM, "0")
    assert 'min-parallelism="0"' in str(refused.value)


def test_a_folding_splitter_at_zero_sends_every_row_to_its_last_partition() -> None:
    assert routing.folded(4, 3).tolist() == [2, 2, 2, 2]
    assert routing.folded(0, 3).tolist() == []
    hashes = np.array([-7, 0, 5, 12], dtype=np.int64)  # split again: by hash, never the last
    assert set(routing.partitions(hashes, None, routing.Schedule([(None, 2)])).tolist()) <= {0, 1}


# --- the CLI --------------------------------------------------------------------------------------

def test_scale_takes_a_number_or_split_or_merge() -> None:
    assert wanted_parallelism(3, False, False) == 3
    assert wanted_parallelism(None, True, False) == 1
    assert wanted_parallelism(None, False, True) == 0
    for bad in ((None, False, False), (2, True, False), (1, False, True)):
        assert "one of them" in str(wanted_parallelism(*bad))
    view = {"operator": "f", "parallelism": 0, "max": 2, "min": 0, "mode": "manual",
            "folded_into": "q.t3", "slots": [{"state": "dormant"}, {"state": "dormant"}]}
    assert instances_line(view) == "folded into q.t3" and instances_settled(view)
    assert "folded into q.t3" in elastic_lines([view])[0]
    assert instances_line({**view, "parallelism": 1}) == "1 instances"
    assert split_refusal(view, "f") is None
    assert "split already (2 instances)" in str(split_refusal({**view, "parallelism": 2}, "f"))
    assert "cannot fold" in str(split_refusal({**view, "folded_into": None}, "f"))
    assert "not an elastic operator" in str(split_refusal({}, "f"))


# --- the scheduler's state machine ----------------------------------------------------------------

@pytest.fixture
def folded(tmp_path: Path) -> Driver:
    """Query q with its filter folded into the merger's task q.t3; both slots dormant."""
    driver = Driver(compiled(FOLDED, tmp_path))
    assert driver.run(driver.offer("a1")) == {"q.t0": "a1", "q.t3": "a1"}
    assert [driver.state(t) for t in ("q.t1", "q.t2")] == [TaskState.DORMANT] * 2
    view = driver.view()
    assert (view["parallelism"], view["min"], view["folded_into"]) == (0, 0, "q.t3")
    assert instances_settled(view)
    return driver


def test_split_starts_an_instance_on_another_agent_and_merge_folds_it_back(folded: Driver
                                                                           ) -> None:
    d = folded
    request = request_of(d.scale(1))
    assert d.state("q.t1") is TaskState.PENDING and d.state("q.t2") is TaskState.DORMANT
    assert d.run(d.offer("a1")) == {}  # never beside the task it was folded into
    assert d.run(d.offer("a2")) == {"q.t1": "a2"}
    (message,) = of(SendFrameworkMessage, d.tick())  # the splitter switches once it runs
    assert message.message == ControlMessage("q.t0.a1", request, 1, {SPLIT: {"active": 1}})
    d.ack(request)
    assert d.view()["parallelism"] == 1 and instances_settled(d.view())

    merge = d.scale(0)  # at once: the folded instance runs already
    request = request_of(merge)
    (message,) = of(SendFrameworkMessage, merge)
    assert message.message == ControlMessage("q.t0.a1", request, 2, {SPLIT: {"active": 0}})
    assert d.record("q.t1").retiring
    d.ack(request)
    d.tick()
    drained_at = d.now
    stopped = set()
    while d.now < drained_at + DRAIN_SETTLE_SECONDS + 2:
        stopped |= kills(d.beat(drain_figures(d, {1: 0}, {1: 0})))
        d.tick()
    assert stopped == {d.mid("q.t1")}
    d.s.handle(update(d.mid("q.t1"), "KILLED", "a2"))
    view = d.view()
    assert d.state("q.t1") is TaskState.DORMANT and instances_settled(view)
    assert [(r["from"], r["to"], r["state"]) for r in view["rescales"]] == \
        [(0, 1, "applied"), (1, 0, "applied")]
    # nothing else restarted: the splitter's task and the one the operator folds into
    assert [d.record(t).launches for t in ("q.t0", "q.t3")] == [1, 1]
