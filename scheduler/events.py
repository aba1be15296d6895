"""Events: facts the scheduler state machine learns about, one frozen dataclass each.

Owns the vocabulary of what happened (named as facts, in the past tense) and `new_stimulus_id`.
Every event carries a `stimulus_id` that follows it into every command and log line it causes.
Mesos-side events are made from pymesos callbacks by `scheduler.mesos_json` and
`scheduler.mesos_adapter` (an executor's framework message arrives typed: `HeartbeatReceived`,
`ControlAcknowledged`, or `MessageUnreadable`); requests come from the HTTP API; `Tick` from the
event loop's clock.
Does not own what the state machine does with them (`scheduler.state`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal, Mapping, Union

from common.messages import ControlAck, Heartbeat
from common.tasks import CompiledQuery
from scheduler.control import new_request_id
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
class HeartbeatReceived:
    """An executor's heartbeat (`common.messages.Heartbeat`: figures per mesos task id)."""

    stimulus_id: str
    agent_id: str
    executor_id: str
    heartbeat: Heartbeat


@dataclass(frozen=True)
class ControlAcknowledged:
    """An executor's answer to a control request on one task."""

    stimulus_id: str
    agent_id: str
    executor_id: str
    ack: ControlAck


@dataclass(frozen=True)
class MessageUnreadable:
    """A framework message from an executor that could not be read, and why."""

    stimulus_id: str
    agent_id: str
    executor_id: str
    why: str


@dataclass(frozen=True)
class QuerySubmitted:
    stimulus_id: str
    query: CompiledQuery
    source: QuerySource | None = None  # the spec it was compiled from (what is persisted)
    # each task's channel keypair, made by the shell (`scheduler.channel_keys.issue_keys`);
    # empty: plain-text channels (unit tests); otherwise it must cover every task
    keys: Mapping[str, Mapping[str, str]] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class QueryStopRequested:
    stimulus_id: str
    query_id: str
    force: bool = False  # stop even while other queries read a stream it publishes


@dataclass(frozen=True)
class QueryUpdateRequested:
    """Replace a running query's plan by `query` (compiled with the running tasks' ids pinned,
    docs/queries.md "Updating a running query"): applied all or nothing, or only diffed
    (`dry_run`); `drop_state` allows losing the state of stateful operators that change."""

    stimulus_id: str
    query: CompiledQuery
    source: QuerySource | None = None
    keys: Mapping[str, Mapping[str, str]] = field(default_factory=dict, repr=False)
    drop_state: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class ControlRequested:
    """Control tuples `<query, operator, parameter, value>` for a running query (the
    paper's section 4.5; docs/control.md), checked together and applied all or none."""

    stimulus_id: str
    query_id: str
    tuples: tuple[tuple[str, str, str], ...]  # (operator, parameter, value)
    request_id: str = ""  # minted by the edge (`scheduler.control.new_request_id`); "" mints one
    trigger: str = "manual"  # who asked: manual (the API: people, control sinks) | auto (policy)
    # | shed (the load shedding policy, docs/load.md)

    def __post_init__(self) -> None:
        if not self.request_id:
            object.__setattr__(self, "request_id", new_request_id(self.query_id))


@dataclass(frozen=True)
class TaskMigrationRequested:
    """Move a running task to `agent_id` (the paper's section 4.2, docs/control.md: quiesce,
    replicate the state, redirect the inputs, unquiesce)."""

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
    AgentLost, ExecutorLost, HeartbeatReceived, ControlAcknowledged, MessageUnreadable,
    QuerySubmitted, QueryStopRequested, QueryUpdateRequested,
    ControlRequested, TaskMigrationRequested, Tick,
]
