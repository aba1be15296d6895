"""Where may a task go: allowed and preferred agents for one pending task, as a pure function.

Owns the default restart policy: a first attempt may go anywhere; a restarted task prefers the
agent of its previous attempt (its checkpoint and warm SparkSession are there) and waits for
that agent alone for `same_agent_wait` seconds before taking any agent, unless that agent is
gone. The failover patterns will add other policies here (e.g. "any agent but these").
Does not own placement itself (`scheduler.placement`) nor task state (`scheduler.state`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Destinations:
    allowed: frozenset[str] | None  # None: any agent
    preferred: tuple[str, ...] = ()


ANYWHERE = Destinations(None)


def destinations(attempt: int, previous_agent: str | None, pending_since: float, now: float,
                 gone_agents: frozenset[str], same_agent_wait: float) -> Destinations:
    """Allowed and preferred agents for a task about to be placed for attempt `attempt`."""
    if attempt <= 1 or previous_agent is None or previous_agent in gone_agents:
        return ANYWHERE
    if now - pending_since < same_agent_wait:
        return Destinations(frozenset({previous_agent}), (previous_agent,))
    return Destinations(None, (previous_agent,))
