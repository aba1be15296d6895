"""Task lifecycle: the states of one query task, the allowed transitions, and the task record.

Owns `TaskState`, the transition table `TRANSITIONS` (every allowed edge with the trigger that
takes it), `IllegalTransition` (raised with the task's history for any other edge), the mapping
from Mesos task states to ours, and `TaskRecord`, the scheduler's mutable view of one task.
Does not own when transitions happen (`scheduler.state` decides) nor Mesos I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from common.tasks import QueryTask


class TaskState(str, Enum):
    PENDING = "pending"  # wants resources
    STAGING = "staging"  # launched on an offer, not yet reported by its executor
    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"
    DORMANT = "dormant"  # an elastic operator's instance slot beyond its parallelism: not run

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def launched(self) -> bool:
        return self in (TaskState.STAGING, TaskState.STARTING, TaskState.RUNNING)


TERMINAL = frozenset({TaskState.FINISHED, TaskState.FAILED, TaskState.KILLED, TaskState.LOST})
P, S, ST, R = TaskState.PENDING, TaskState.STAGING, TaskState.STARTING, TaskState.RUNNING
FIN, F, K, L = TaskState.FINISHED, TaskState.FAILED, TaskState.KILLED, TaskState.LOST
D = TaskState.DORMANT

# (from, to) -> the trigger that takes this edge. Nothing else is allowed.
TRANSITIONS: dict[tuple[TaskState, TaskState], str] = {
    (P, S): "placed on an offer; LaunchTasks sent",
    (P, K): "query stopped or failed before the task was launched",
    (S, ST): "TASK_STARTING from the executor",
    (S, R): "TASK_RUNNING before any TASK_STARTING",
    (ST, R): "TASK_RUNNING from the executor",
    (S, FIN): "TASK_FINISHED", (ST, FIN): "TASK_FINISHED", (R, FIN): "TASK_FINISHED",
    (S, F): "TASK_FAILED or TASK_ERROR", (ST, F): "TASK_FAILED or TASK_ERROR",
    (R, F): "TASK_FAILED or TASK_ERROR",
    (S, K): "TASK_KILLED", (ST, K): "TASK_KILLED", (R, K): "TASK_KILLED",
    (S, L): "TASK_LOST/DROPPED/GONE/UNKNOWN, or AgentLost/ExecutorLost",
    (ST, L): "TASK_LOST/DROPPED/GONE/UNKNOWN, or AgentLost/ExecutorLost",
    (R, L): "TASK_LOST/DROPPED/GONE/UNKNOWN, or AgentLost/ExecutorLost",
    # never for a failure tagged "[cannot heal]" (a pattern's overflow, a missing input): the
    # query fails at once with it (`common.failures`, `SchedulerState._after_terminal`)
    (F, P): "restart: backoff over (Tick), budget left, query active, the failure can heal; "
            "attempt + 1",
    (L, P): "restart: backoff over (Tick), budget left, query active; attempt + 1",
    (K, P): "restart of a task killed without our asking; attempt + 1",
    (P, D): "instance slot beyond the operator's parallelism: not launched",
    (K, D): "retired by a scale-in once drained",
    (D, P): "activated by a scale-out; attempt + 1",
    (D, K): "query stopped or failed while the slot was dormant",
}

# Mesos TaskState -> ours; KILLING and anything unknown map to None (no change).
FROM_MESOS: dict[str, TaskState] = {
    "STAGING": S, "STARTING": ST, "RUNNING": R, "FINISHED": FIN, "FAILED": F, "ERROR": F,
    "KILLED": K, "LOST": L, "DROPPED": L, "UNREACHABLE": L, "GONE": L, "GONE_BY_OPERATOR": L,
    "UNKNOWN": L,
}


class IllegalTransition(RuntimeError):
    """A transition outside `TRANSITIONS`; the message carries the task's history."""

    def __init__(self, task_id: str, start: TaskState, finish: TaskState,
                 history: list["HistoryEntry"]):
        lines = "\n".join(f"  {h}" for h in history) or "  (no history)"
        super().__init__(f"task {task_id}: illegal transition {start.value} -> {finish.value}; "
                         f"history:\n{lines}")
        self.task_id, self.start, self.finish = task_id, start, finish
        self.history = list(history)


@dataclass(frozen=True)
class HistoryEntry:
    stimulus_id: str
    attempt: int
    start: TaskState
    finish: TaskState
    note: str

    def __str__(self) -> str:
        return (f"[{self.stimulus_id}] a{self.attempt} {self.start.value} -> "
                f"{self.finish.value}: {self.note}")


# figures that only grow within an attempt (rows_dropped: load shedding, docs/load.md)
COUNTERS = ("tuples_in", "tuples_out", "busy_ms", "rows_dropped")


def mesos_task_id(task_id: str, attempt: int) -> str:
    return f"{task_id}.a{attempt}"


def parse_mesos_task_id(value: str) -> tuple[str, int] | None:
    """`q.t0.a3` -> (`q.t0`, 3); None for ids that are not ours."""
    task_id, sep, attempt = value.rpartition(".a")
    if not sep or not task_id or not attempt.isdigit():
        return None
    return task_id, int(attempt)


@dataclass
class TaskRecord:
    """The scheduler's view of one query task across its attempts."""

    task: QueryTask
    state: TaskState = TaskState.PENDING
    attempt: int = 1  # the attempt number in this task's Mesos id
    epoch: int = 0  # the current attempt's fencing token, issued at its launch (0: none yet)
    launches: int = 0  # launches in this deployment (backoff grows with them)
    # times the task itself failed or was killed (not the loss of its executor or agent, which
    # the patterns exist to survive), counted against the restart budget
    failures: int = 0
    agent_id: str | None = None  # where the current (or last) attempt runs
    hostname: str | None = None
    ports: tuple[int, ...] = ()
    endpoints: dict[str, str] = field(default_factory=dict)
    restart_at: float | None = None  # set while a failed task waits for its backoff
    pending_since: float = 0.0
    kill_requested: bool = False
    retiring: bool = False  # a scale-in took its slot away: killed once drained, then dormant
    figures_at: float = 0.0  # scheduler time the current figures arrived
    # a splitter's event-time pace: ms of event time it routed per second, between its last
    # two heartbeats (`elasticity.routed_pace`; a source catching up runs far above 1000)
    routed_pace: float = 0.0
    migrate_to: str | None = None  # a requested migration's target agent, until it launches there
    last_failure: str = ""  # why it last failed; a kill or migration we asked for is none
    last_failure_attempt: int = 0  # the attempt `last_failure` ended (0: none failed)
    port_clashes: int = 0  # launches that found a port taken by another program
    avoid_ports: set[int] = field(default_factory=set)  # ports it found taken; not offered again
    figures: dict[str, float] = field(default_factory=dict)  # the current attempt's
    carried: dict[str, float] = field(default_factory=dict)  # counters of earlier attempts
    history: list[HistoryEntry] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def mesos_task_id(self) -> str:
        return mesos_task_id(self.task.task_id, self.attempt)

    def totals(self) -> dict[str, float]:
        """The figures with the counters (`COUNTERS`) summed over every attempt, so they never
        go back after a restart, a migration or a control rebuild."""
        return {**self.figures, **{k: self.figures.get(k, 0) + self.carried.get(k, 0)
                                   for k in COUNTERS if k in self.figures or k in self.carried}}

    def carry(self) -> None:
        """A new attempt starts: keep the counters of the one that ended."""
        self.carried = {k: v for k, v in self.totals().items() if k in COUNTERS}
        self.figures = {}

    def move(self, finish: TaskState, stimulus_id: str, note: str = "") -> None:
        """Take the edge to `finish` or raise `IllegalTransition`."""
        trigger = TRANSITIONS.get((self.state, finish))
        if trigger is None:
            raise IllegalTransition(self.task_id, self.state, finish, self.history)
        self.history.append(HistoryEntry(stimulus_id, self.attempt, self.state, finish,
                                         note or trigger))
        self.state = finish
