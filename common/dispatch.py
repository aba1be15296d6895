"""The one dispatch idiom of the state machines: a table from event type to handler function.

Owns `handler`, which every state machine (`scheduler.state`, `scheduler.leadership`,
`executor.executor_state`, `embedded_mesos.master_state`) and command runner
(`scheduler.mesos_adapter`, `executor.mesos_executor`, `embedded_mesos.master`) uses to
pick the function for a value by its exact type, from a module-level `dict[type, Callable]` of
function objects (never method-name strings). Does not own the tables themselves (each lives
beside its handlers).
"""

from __future__ import annotations

from typing import Callable, Mapping, TypeVar

R = TypeVar("R")


def handler(table: Mapping[type, Callable[..., R]], event: object, owner: str) -> Callable[..., R]:
    """`table[type(event)]`; TypeError naming `owner` and the event when its type is unknown."""
    try:
        return table[type(event)]
    except KeyError:
        raise TypeError(f"{owner}: unknown event {event!r}") from None
