"""The framework's failure detector: phi-accrual on executor heartbeats (`scheduler.liveness`) and
what the scheduler state does with a suspicion, fed events by hand (no Mesos, no clock)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common.messages import Heartbeat
from scheduler.commands import DeclineOffers, KillTask, LaunchTasks, ShutdownExecutor
from scheduler.config import SchedulerConfig
from scheduler.events import ExecutorLost, HeartbeatReceived, OffersReceived, Tick
from scheduler.lifecycle import TaskState
from scheduler.liveness import Arrivals, DetectorSettings, phi, suspected
from scheduler.metrics import SchedulerMetrics
from scheduler.state import SchedulerState
from scheduler.testing import offer
from test_scheduler_state import CONFIG, of, running, update  # noqa: F401 (a fixture)

SETTINGS = DetectorSettings(threshold=8.0, acceptable_pause=2.0, min_std=0.2)


def beats(times: list[float]) -> Arrivals:
    arrivals = Arrivals(times[0])
    for t in times[1:]:
        arrivals.record(t)
    return arrivals


def test_phi_grows_with_silence_and_an_irregular_rhythm_is_given_more_time() -> None:
    regular = beats([float(i) for i in range(30)])
    levels = [phi(regular, 29.0 + s, SETTINGS) for s in (0.5, 2.0, 3.0, 4.0, 6.0)]
    assert levels == sorted(levels) and levels[0] < 0.01 and levels[-1] > 8.0
    jittery = beats([0, 1, 4, 4.5, 8, 8.2, 12, 13, 17, 17.5, 21])  # a loaded machine's beats
    assert not suspected(jittery, 21 + 6.0, SETTINGS)  # ... where a regular one is suspected
    assert suspected(regular, 29 + 6.0, SETTINGS)
    assert not suspected(regular, 29 + 600.0, replace(SETTINGS, threshold=None))  # off


def test_phi_is_finite_and_monotonic_over_extreme_silences() -> None:
    arrivals = beats([0.0, 1.0])
    levels = [phi(arrivals, 1.0 + s, SETTINGS) for s in (-5.0, 0.0, 1e-6, 10.0, 1e4, 1e9)]
    assert all(level == level and level < float("inf") for level in levels)
    assert levels == sorted(levels)


def beat(s: SchedulerState, at: float, agent: str = "a1") -> None:
    s.handle(Tick("t", at))
    s.handle(HeartbeatReceived("hb", agent, f"elastiq-exec-{agent}", Heartbeat({})))


@pytest.fixture
def watched(running: SchedulerState) -> SchedulerState:  # noqa: F811
    """`running` (q.t0, q.t1 on a1) with a detector of 2 s pause and heartbeats each second."""
    running.config = replace(CONFIG, detector=SETTINGS)
    for i in range(10):
        beat(running, float(i))
    return running


def test_a_silent_executor_has_its_tasks_failed_over_killed_and_itself_shut_down(
        watched: SchedulerState) -> None:
    s = watched
    assert s.handle(Tick("t", 11.0)) == []  # 2 s of silence: within the pause
    out = s.handle(Tick("t", 16.0))
    assert sorted(c.mesos_task_id for c in of(KillTask, out)) == ["q.t0.a1", "q.t1.a1"]
    (shutdown,) = of(ShutdownExecutor, out)
    assert (shutdown.executor_id, shutdown.agent_id) == ("elastiq-exec-a1", "a1")
    assert "silent for 7.0s" in shutdown.reason
    tasks = s.queries["q"].tasks
    assert all(t.state is TaskState.LOST and "silent" in t.last_failure and t.failures == 0
               for t in tasks.values())  # lost, not failed: no restart budget spent
    out = s.handle(Tick("t", 20.0))
    assert of(ShutdownExecutor, out) == [] and s.suspicions == 1  # suspected once
    assert all(t.state is TaskState.PENDING and t.attempt == 2 for t in tasks.values())
    # offers of its agent are declined while the executor is being shut down...
    out = s.handle(OffersReceived("o", (offer("o9", "a1"),)))
    assert of(LaunchTasks, out) == [] and of(DeclineOffers, out)[0].offer_ids == ("o9",)
    # ... and taken once Mesos reports it gone
    s.handle(ExecutorLost("x", "a1", "elastiq-exec-a1", 9))
    out = s.handle(OffersReceived("o", (offer("o10", "a1"),)))
    assert {t.mesos_task_id for c in of(LaunchTasks, out) for t in c.tasks} == \
        {"q.t0.a2", "q.t1.a2"}


def test_a_heartbeat_after_the_suspicion_is_counted_a_false_positive_in_prometheus(
        watched: SchedulerState) -> None:
    s = watched
    metrics = SchedulerMetrics()
    s.handle(Tick("t", 16.0))
    metrics.observe_state(s, 16.0)
    beat(s, 17.0)  # it was only slow
    metrics.observe_state(s, 17.0)
    assert (s.suspicions, s.false_suspicions) == (1, 1)
    sample = metrics.registry.get_sample_value
    assert sample("elastiq_executor_suspicions_total") == 1.0
    assert sample("elastiq_executor_false_suspicions_total") == 1.0
    metrics.observe_state(s, 18.0)  # counted once
    assert sample("elastiq_executor_false_suspicions_total") == 1.0
    # the failed-over attempts' late word is stale: they are killed, nothing else changes
    assert [type(c) for c in s.handle(update("q.t0.a1", "RUNNING"))] == [KillTask]


def test_idle_executors_and_a_detector_turned_off_are_left_alone(
        watched: SchedulerState) -> None:
    s = watched
    s.config = replace(s.config, detector=replace(SETTINGS, threshold=None))
    assert of(ShutdownExecutor, s.handle(Tick("t", 100.0))) == []
    s.config = replace(s.config, detector=SETTINGS)
    for t in s.queries["q"].tasks.values():  # nothing of ours runs there any more
        t.state = TaskState.FINISHED
    assert of(ShutdownExecutor, s.handle(Tick("t", 200.0))) == [] and s.suspicions == 0
    assert all(t.state is TaskState.FINISHED for t in s.queries["q"].tasks.values())


def test_the_default_detector_is_on_and_patient() -> None:
    settings = SchedulerConfig().detector
    assert settings.threshold is not None and settings.acceptable_pause >= 10.0
    regular = beats([float(i) for i in range(30)])
    assert not suspected(regular, 29.0 + 10.0, settings)
    assert suspected(regular, 29.0 + 30.0, settings)
