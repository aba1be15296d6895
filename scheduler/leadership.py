"""Leadership decisions, pure: who leads, in which epoch, and what a change of either means.

Owns the values (`Term`, `Leadership`), the facts a coordination service reports (`Elected`,
`Suspended`, `Reconnected`, `SessionLost`, `Deposed`, `Clock`), the actions they cause
(`RestoreAndRegister`, `EnterSafeMode`, `LeaveSafeMode`, `StepDown`) through
`next_leadership(current, fact)` (one function per fact type, in `_NEXT`), the verdict on a
mutating command's epoch (`check_epoch`) and the scheduler-state events that carry leadership into
`SchedulerState` (`LeadershipGained`, `LeadershipUpdated`, `FencedRequest`). Does not own any I/O:
`scheduler.coordination` and `scheduler.zk` report the facts; `scheduler.mesos_adapter` runs the
actions.

SUSPENDED puts a leader in safe mode (no launches, decisions deferred); a leader still suspended
after a whole session timeout, or told LOST, steps down (its session is gone on the server).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, Union

from common.dispatch import handler

Role = Literal["standby", "leader", "safe_mode"]


@dataclass(frozen=True)
class Term:
    """One leader's reign: `epoch` grows with every new leader; `fence` is what the
    coordination service checks to refuse the writes of a deposed leader."""

    epoch: int
    fence: int


@dataclass(frozen=True)
class Leadership:
    role: Role = "standby"
    term: Term | None = None  # the term we lead; None unless leader or in safe mode
    leader: str = ""  # the current leader's address as far as we know ("" = unknown)
    suspended_at: float | None = None  # when the ZooKeeper connection went SUSPENDED

    @property
    def epoch(self) -> int:
        return self.term.epoch if self.term else 0

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "epoch": self.epoch, "leader": self.leader}


# ---- facts reported by the coordination service ----------------------------------------------
@dataclass(frozen=True)
class Elected:
    term: Term
    address: str


@dataclass(frozen=True)
class Suspended:
    at: float


@dataclass(frozen=True)
class Reconnected:
    at: float


@dataclass(frozen=True)
class SessionLost:
    at: float


@dataclass(frozen=True)
class Deposed:
    reason: str


@dataclass(frozen=True)
class LeaderSeen:
    """Another candidate leads (or nobody does: address "")."""

    address: str


@dataclass(frozen=True)
class Clock:
    now: float


Fact = Union[Elected, Suspended, Reconnected, SessionLost, Deposed, LeaderSeen, Clock]


# ---- actions for the I/O shell -------------------------------------------------------------
@dataclass(frozen=True)
class RestoreAndRegister:
    """Load persisted queries into the state, THEN register with Mesos (persisted id)."""

    term: Term


@dataclass(frozen=True)
class EnterSafeMode:
    pass


@dataclass(frozen=True)
class LeaveSafeMode:
    pass


@dataclass(frozen=True)
class StepDown:
    """Stop the Mesos driver with failover (tasks keep running) and drop the state."""

    reason: str


Action = Union[RestoreAndRegister, EnterSafeMode, LeaveSafeMode, StepDown]


Next = tuple[Leadership, tuple[Action, ...]]


def next_leadership(current: Leadership, fact: Fact, session_timeout: float = 10.0) -> Next:
    """The leadership after `fact`, and what must be done about it (the handler for the fact's
    type in `_NEXT`, through `common.dispatch`). Only an election or a leader sighting
    concerns a standby."""
    step = handler(_NEXT, fact, "next_leadership")
    if step not in _ANY_ROLE and current.role not in ("leader", "safe_mode"):
        return current, ()
    return step(current, fact, session_timeout)


def _elected(current: Leadership, fact: Elected, session_timeout: float) -> Next:
    leading = current.role in ("leader", "safe_mode")
    if leading and current.term == fact.term:
        return current, ()
    steps: tuple[Action, ...] = (StepDown("re-elected in a new term"),) if leading else ()
    return Leadership("leader", fact.term, fact.address), steps + (RestoreAndRegister(fact.term),)


def _leader_seen(current: Leadership, fact: LeaderSeen, session_timeout: float) -> Next:
    leading = current.role in ("leader", "safe_mode")
    return (current if leading else replace(current, leader=fact.address)), ()


def _suspended(current: Leadership, fact: Suspended, session_timeout: float) -> Next:
    if current.role == "safe_mode":
        return current, ()
    return replace(current, role="safe_mode", suspended_at=fact.at), (EnterSafeMode(),)


def _reconnected(current: Leadership, fact: Reconnected, session_timeout: float) -> Next:
    if current.role != "safe_mode":
        return current, ()
    return replace(current, role="leader", suspended_at=None), (LeaveSafeMode(),)


def _clock(current: Leadership, fact: Clock, session_timeout: float) -> Next:
    if current.suspended_at is None or fact.now - current.suspended_at < session_timeout:
        return current, ()
    return _standby(), (StepDown(f"suspended for over the {session_timeout:g} s session "
                                 "timeout"),)


def _session_lost(current: Leadership, fact: SessionLost, session_timeout: float) -> Next:
    return _standby(), (StepDown("ZooKeeper session lost"),)


def _deposed(current: Leadership, fact: Deposed, session_timeout: float) -> Next:
    return _standby(), (StepDown(fact.reason),)


_NEXT: dict[type, Callable[[Leadership, Any, float], Next]] = {
    Elected: _elected,
    LeaderSeen: _leader_seen,
    Suspended: _suspended,
    Reconnected: _reconnected,
    Clock: _clock,
    SessionLost: _session_lost,
    Deposed: _deposed,
}
_ANY_ROLE = (_elected, _leader_seen)  # the facts a standby acts on too


def _standby() -> Leadership:
    return Leadership("standby")


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    status: int  # HTTP-like: 200, 409 stale epoch, 421 not the leader, 503 safe mode
    message: str


def check_epoch(current: Leadership, epoch: int | None) -> Verdict:
    """May a mutating command carrying `epoch` (None: "whatever is current") be applied?"""
    if current.role == "standby":
        where = f"the leader is at {current.leader}" if current.leader else "no leader is known"
        return Verdict(False, 421, f"this scheduler is a standby; {where}")
    if current.role == "safe_mode":
        return Verdict(False, 503, "leadership is uncertain (coordination connection "
                                   "suspended); retry shortly")
    if epoch is not None and epoch != current.epoch:
        return Verdict(False, 409, f"stale leadership epoch {epoch}; the current epoch is "
                                   f"{current.epoch}")
    return Verdict(True, 200, "")


# ---- events for the scheduler state machine --------------------------------------------------
@dataclass(frozen=True)
class LeadershipGained:
    """Become leader: restore these persisted queries (`state.restore_query` inputs), each
    recompiled from its persisted source by the caller."""

    stimulus_id: str
    leadership: Leadership
    framework_id: str | None
    queries: tuple[tuple[Any, Any, dict[str, Any] | None], ...]  # (query, source, placements)


@dataclass(frozen=True)
class LeadershipUpdated:
    """Safe mode on or off, or stepped down (the state then forgets every query)."""

    stimulus_id: str
    leadership: Leadership


@dataclass(frozen=True)
class FencedRequest:
    """A mutating request (submit, stop, control) with the epoch its sender believes in."""

    stimulus_id: str
    epoch: int | None
    request: Any  # a request event with the same stimulus_id
