"""Where may a task go: allowed, excluded and preferred agents for one pending task, as a pure
function of the task's failover mode, its past and the time, with the reason in words.

Owns the restart policy per pattern (docs/patterns.md):
- default (no failover mode): a first launch may go anywhere; a restart prefers the agent of
  its previous attempt (its checkpoint and warm SparkSession are there) and waits for that agent
  alone for `same_agent_wait` seconds before taking any agent, unless that agent is gone.
- "standby", "checkpoint" and "replica": a restart goes at once to any agent but the one the
  task failed on (its checkpoint folder and its output channel's log are on storage every agent
  reaches), agents where our executor already runs (a warm SparkSession, ~2 s to a running
  query instead of ~25 s for a new JVM) first; only if no other agent took it within
  `failover_wait` seconds may it go back to its old agent. A replica still keeps apart from the
  other replicas (`apart_from`); the stream selector reads them meanwhile.
Does not own placement itself (`scheduler.placement`), the backoff before a restart nor task
state (`scheduler.state`).
"""

from __future__ import annotations

from dataclasses import dataclass

IMMEDIATE_FAILOVER = frozenset({"standby", "checkpoint", "replica"})  # at once, elsewhere


@dataclass(frozen=True)
class Destinations:
    allowed: frozenset[str] | None  # None: any agent
    preferred: tuple[str, ...] = ()
    excluded: frozenset[str] = frozenset()  # never these (checked after `allowed`)
    reason: str = "any agent"  # why, for the task's history


ANYWHERE = Destinations(None)


@dataclass(frozen=True)
class Past:
    """What a destination decision needs to know of one task."""

    failover: str | None  # QueryTask.failover
    launches: int  # launches so far in this deployment; 0: the first launch is next
    previous_agent: str | None
    pending_since: float


def destinations(attempt: int, previous_agent: str | None, pending_since: float, now: float,
                 gone_agents: frozenset[str], same_agent_wait: float) -> Destinations:
    """The default policy: allowed and preferred agents for attempt `attempt` of a task."""
    if attempt <= 1 or previous_agent is None:
        return Destinations(None, reason="first launch: any agent")
    if previous_agent in gone_agents:
        return Destinations(None, reason=f"restart: previous agent {previous_agent} is gone, "
                                         "any agent")
    if now - pending_since < same_agent_wait:
        return Destinations(frozenset({previous_agent}), (previous_agent,),
                            reason=f"restart: waits for previous agent {previous_agent} "
                                   f"(up to {same_agent_wait:g} s)")
    return Destinations(None, (previous_agent,),
                        reason=f"restart: previous agent {previous_agent} preferred, any agent "
                               f"after {same_agent_wait:g} s")


def failover_destinations(previous_agent: str, pending_since: float, now: float,
                          warm_agents: frozenset[str], failover_wait: float,
                          mode: str) -> Destinations:
    """A pattern's failover: any agent but `previous_agent`, warm agents first; after
    `failover_wait` seconds without a place, any agent (the old one last)."""
    warm = tuple(sorted(warm_agents - {previous_agent}))
    warm_words = f", warm first ({', '.join(warm)})" if warm else ""
    if now - pending_since < failover_wait:
        return Destinations(None, warm, frozenset({previous_agent}),
                            f"{mode} failover: any agent but {previous_agent}{warm_words}")
    return Destinations(None, warm + (previous_agent,), frozenset(),
                        f"{mode} failover: no other agent within {failover_wait:g} s, any "
                        f"agent including {previous_agent}{warm_words}")


def destinations_for(past: Past, attempt: int, now: float, gone_agents: frozenset[str],
                     warm_agents: frozenset[str], same_agent_wait: float,
                     failover_wait: float) -> Destinations:
    """The policy of the task's failover mode (see the module docstring)."""
    previous = past.previous_agent
    if past.launches > 0 and previous is not None and past.failover in IMMEDIATE_FAILOVER:
        return failover_destinations(previous, past.pending_since, now, warm_agents,
                                     failover_wait, past.failover)
    return destinations(attempt, past.previous_agent, past.pending_since, now, gone_agents,
                        same_agent_wait)


def apart_groups(apart_from: tuple[str, ...], initially_apart_from: tuple[str, ...],
                 launches: int) -> tuple[str, ...]:
    """The groups a task must avoid now: `initially_apart_from` counts at its first launch only
    (a protected task starts away from its neighbours; its failover may land next to them)."""
    if launches > 0:
        return apart_from
    return apart_from + tuple(g for g in initially_apart_from if g not in apart_from)
