"""Events: facts the scheduler state machine learns about, one frozen dataclass each.

Owns the vocabulary of what happened (named as facts, in the past tense) and `new_stimulus_id`.
Every event carries a `stimulus_id` that follows it into every command and log line it causes.
Mesos-side events are made from pymesos callbacks by `scheduler.mesos_json` and
`scheduler.mesos_adapter`; requests come from the HTTP API; `Tick` from the event loop's clock.
Does not own what the state machine does with them (`scheduler.state`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal, Union

from common.tasks import CompiledQuery
from scheduler.placement import Offer
from scheduler.query_source import QuerySource

_counter = itertools.count(1)


def new_stimulus_id(kind: str) -> str:
    """A process-unique id such as `offers-17`."""
    return f"{kind}-{next(_counter)}"


# The Mesos task states we act on (TaskState in mesos.proto, without the TASK_ prefix).
MesosTaskState = Literal[
    "STAGING", "STARTING", "RUNNING", "KILLING", "FINISHED", "FAILED", "KILLED", "ERROR",
    "LOST", "DROPPED", "UNREACHABLE", "GONE", "GONE_BY_OPERATOR", "UNKNOWN",
]


@dataclass(frozen=True)
class Registered:
    stimulus_id: str
    framework_id: str
    master: str


@dataclass(frozen=True)
class Reregistered:
    stimulus_id: str
    master: str
    framework_id: str = ""


@dataclass(frozen=True)
class Disconnected:
    stimulus_id: str


@dataclass(frozen=True)
class OffersReceived:
    stimulus_id: str
    offers: tuple[Offer, ...]


@dataclass(frozen=True)
class OfferRescinded:
    stimulus_id: str
    offer_id: str


@dataclass(frozen=True)
class StatusUpdated:
    stimulus_id: str
    mesos_task_id: str
    state: MesosTaskState
    reason: str = ""
    message: str = ""
    agent_id: str = ""
    executor_id: str = ""
    source: str = ""


@dataclass(frozen=True)
class AgentLost:
    stimulus_id: str
    agent_id: str


@dataclass(frozen=True)
class ExecutorLost:
    stimulus_id: str
    agent_id: str
    executor_id: str
    status: int


@dataclass(frozen=True)
class FrameworkMessageReceived:
    """A message from an executor; heartbeats are JSON
    `{"kind": "heartbeat", "tasks": {mesos_task_id: {figure: number}}}`."""

    stimulus_id: str
    agent_id: str
    executor_id: str
    data: bytes


@dataclass(frozen=True)
class QuerySubmitted:
    stimulus_id: str
    query: CompiledQuery
    source: QuerySource | None = None  # the spec it was compiled from (what is persisted)


@dataclass(frozen=True)
class QueryStopRequested:
    stimulus_id: str
    query_id: str


@dataclass(frozen=True)
class ControlRequested:
    """Control tuples `<query, operator, parameter, value>` for a running query (seeds/002
    section 4.5), checked together and applied all or none."""

    stimulus_id: str
    query_id: str
    tuples: tuple[tuple[str, str, str], ...]  # (operator, parameter, value)


@dataclass(frozen=True)
class TaskMigrationRequested:
    """Move a running task to `agent_id` (seeds/002 section 4.2: quiesce, replicate the state,
    redirect the inputs, unquiesce)."""

    stimulus_id: str
    query_id: str
    task_id: str
    agent_id: str


@dataclass(frozen=True)
class Tick:
    stimulus_id: str
    now: float  # seconds, monotonic clock of the event loop


Event = Union[
    Registered, Reregistered, Disconnected, OffersReceived, OfferRescinded, StatusUpdated,
    AgentLost, ExecutorLost, FrameworkMessageReceived, QuerySubmitted, QueryStopRequested,
    ControlRequested, TaskMigrationRequested, Tick,
]
