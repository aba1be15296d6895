"""Commands: what the state machine asks the I/O shell to do, one frozen dataclass each.

Owns the imperatives (`LaunchTasks`, `DeclineOffers`, `KillTask`, `RetargetChannels`, ...) and
`TaskLaunch`, the launch data of one task. Messages to executors are typed (`common.messages`);
each command's `data` is their JSON. Each command carries the `stimulus_id` of the event that
caused it.
Does not own how they are executed (`scheduler.mesos_adapter`) nor the Mesos JSON they become
(`scheduler.mesos_json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from common import messages


@dataclass(frozen=True)
class TaskLaunch:
    """One task to start: its Mesos id, what it holds and its launch data (JSON text)."""

    mesos_task_id: str  # f"{task_id}.a{attempt}"
    task_id: str
    name: str
    cpus: float
    mem_mb: float
    ports: tuple[int, ...]
    # `common.messages.LaunchData` as JSON text; holds the task's secret channel key, so it is
    # never in a repr
    data: str = field(repr=False)


@dataclass(frozen=True)
class LaunchTasks:
    stimulus_id: str
    offer_ids: tuple[str, ...]
    agent_id: str
    executor_id: str
    tasks: tuple[TaskLaunch, ...]


@dataclass(frozen=True)
class DeclineOffers:
    stimulus_id: str
    offer_ids: tuple[str, ...]
    refuse_seconds: float
    reason: str


@dataclass(frozen=True)
class KillTask:
    stimulus_id: str
    mesos_task_id: str
    agent_id: str = ""


@dataclass(frozen=True)
class ShutdownExecutor:
    """Mesos SHUTDOWN: the agent ends our executor (SIGTERM, SIGKILL after its grace), e.g. one
    the failure detector took for dead (`scheduler.liveness`)."""

    stimulus_id: str
    executor_id: str
    agent_id: str
    reason: str = ""


@dataclass(frozen=True)
class ReconcileTasks:
    """Explicit reconciliation of the given tasks; an empty tuple asks for all (implicit)."""

    stimulus_id: str
    tasks: tuple[tuple[str, str], ...] = ()  # (mesos task id, agent id)


@dataclass(frozen=True)
class ReviveOffers:
    stimulus_id: str


@dataclass(frozen=True)
class SuppressOffers:
    stimulus_id: str


@dataclass(frozen=True)
class SendFrameworkMessage:
    """A control message to a task's executor, or the readers of a published channel it
    serves (JSON `data`; the adapter adds base64)."""

    stimulus_id: str
    agent_id: str
    executor_id: str
    message: messages.ControlMessage | messages.ReadersMessage

    @property
    def data(self) -> bytes:
        return messages.encode(self.message)


@dataclass(frozen=True)
class RetargetChannels:
    """Tell a running consumer task, through its executor, that channels it reads moved (the
    paper's `target-addr` meta query). Sent as a framework message of JSON `data`."""

    stimulus_id: str
    agent_id: str
    executor_id: str
    query_id: str
    mesos_task_id: str  # the consumer's current attempt
    endpoints: tuple[tuple[str, str], ...]  # (channel id, new endpoint), sorted

    @property
    def message(self) -> messages.RetargetMessage:
        return messages.RetargetMessage(self.mesos_task_id, self.endpoints)

    @property
    def data(self) -> bytes:
        return messages.encode(self.message)


@dataclass(frozen=True)
class ReplyToRequest:
    """The answer to a request (submit, stop) that arrived with `stimulus_id`."""

    stimulus_id: str
    accepted: bool
    status: int  # HTTP-like: 200 done, 400 bad input, 404 unknown, 409 conflict
    message: str
    body: Mapping[str, Any] | None = None  # what the API returns besides the message


Command = Union[
    LaunchTasks, DeclineOffers, KillTask, ShutdownExecutor, ReconcileTasks, ReviveOffers,
    SuppressOffers, SendFrameworkMessage, RetargetChannels, ReplyToRequest,
]
