"""The load distributor's bookkeeping at the scheduler, and its status view (docs/load.md).

Owns `DistributionState`: when the last round ran, the latest decision (for `elastiq status`), the
recent ones and their count (for the metrics), the moves started and those the migration protocol
refused, and when each task and each pair of agents last moved (the cool-downs); and `describe`,
what status shows. Pure. Does not own the decision (`scheduler.distributor`), the load history
(`scheduler.load_history`) nor starting a move (`scheduler.state`, with the migration protocol).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.distributor import DistributionDecision

DECISIONS_KEPT = 50
MOVES_KEPT = 50


@dataclass(frozen=True)
class MoveRecord:
    query_id: str
    task: str
    source: str
    target: str
    score: float
    at: float
    started: bool  # the migration protocol took it (False: refused, `refusal` says why)
    refusal: str = ""


@dataclass
class DistributionState:
    round_at: float | None = None
    latest: DistributionDecision | None = None
    decisions: list[DistributionDecision] = field(default_factory=list)
    decided: int = 0
    moves: list[MoveRecord] = field(default_factory=list)  # recent, oldest first
    moved: int = 0  # moves started, ever (the metrics count the growth)
    refused: int = 0  # moves the migration protocol refused, ever
    task_moved_at: dict[str, float] = field(default_factory=dict)
    pair_moved_at: dict[frozenset[str], float] = field(default_factory=dict)

    def decide(self, decision: DistributionDecision, now: float) -> None:
        self.round_at, self.latest = now, decision
        self.decisions.append(decision)
        self.decided += 1
        del self.decisions[:-DECISIONS_KEPT]

    def record(self, move: MoveRecord) -> None:
        self.moves.append(move)
        del self.moves[:-MOVES_KEPT]
        if move.started:
            self.moved += 1
            self.task_moved_at[move.task] = move.at
            self.pair_moved_at[frozenset({move.source, move.target})] = move.at
        else:
            self.refused += 1


def describe(state: DistributionState) -> dict[str, Any] | None:
    """What `elastiq status` shows of the distributor: its counts, latest decision with its
    numbers and recent moves; None before its first round (no query opted in yet)."""
    latest = state.latest
    if latest is None:
        return None
    return {
        "moves": state.moved,
        "refused": state.refused,
        "decision": {
            "kind": latest.kind, "reason": latest.reason, "explanation": latest.explanation,
            "at": state.round_at, "mean_loads": dict(latest.means),
            "peak_before": latest.peak_before, "peak_after": latest.peak_after},
        "recent": [{"query_id": m.query_id, "task": m.task, "from": m.source, "to": m.target,
                    "score": m.score, "at": m.at, "started": m.started, "refusal": m.refusal}
                   for m in state.moves[-10:]],
    }
