"""Channel CURVE keys, made in the scheduler's shell and handed to its pure core on events.

Owns `issue_keys` (a fresh keypair per task, from zmq's generator: the only randomness the
scheduler's channel security needs) and `with_missing_keys` (a restored query's placements with
a keypair for each task that had none persisted). `scheduler.loop` and `scheduler.mesos_adapter`
call them when they build `QuerySubmitted` and `LeadershipGained`; `scheduler.state` only stores
and hands out the keys it is given, so the same events give the same commands.
"""

from __future__ import annotations

from typing import Any, Iterable

import zmq

from common.tasks import CompiledQuery

Keys = dict[str, dict[str, str]]  # task id -> {"public": Z85, "secret": Z85}


def issue_keys(task_ids: Iterable[str]) -> Keys:
    """A fresh CURVE keypair (Z85 text) for each task."""
    keys = {}
    for task_id in task_ids:
        public, secret = zmq.curve_keypair()
        keys[task_id] = {"public": public.decode("ascii"), "secret": secret.decode("ascii")}
    return keys


def with_missing_keys(query: CompiledQuery,
                      placements: dict[str, Any] | None) -> dict[str, Any]:
    """`placements` (as persisted for a new leader) whose "keys" cover every task of `query`:
    the persisted keypairs kept, one issued for each task without."""
    restored = dict(placements or {})
    saved = dict(restored.get("keys") or {})
    missing = [t.task_id for t in query.tasks if t.task_id not in saved]
    restored["keys"] = saved | issue_keys(missing)
    return restored
