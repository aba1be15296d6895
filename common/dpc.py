"""Borealis DPC (delay, process tentatively, correct): the pure decision of one union's mode.

Given, per input, when it was last heard from (a data batch, or its writer answering a liveness
probe) and whether its writer answers now, the union's `max_delay` and the time, `step` returns
the next state: STABLE (every input reachable: run as usual), DELAYING (an input's writer is
unreachable, for less than max-delay since it was last heard: hand Spark nothing new, so nothing
is processed without it), TENTATIVE (past max-delay: go on with the inputs there are, every
output tentative, the stable point kept) and RECONCILING (the cut input is back: re-run from the
stable point with every input; `reconciled` ends it). An input that is silent while its writer
answers is idle, not cut: it never makes the union wait or go tentative. A hot-standby
selector's stream is one input, reachable while any replica is (`selector_view`). An input
that has ended (its writer said its stream ended at seq N, and N is spooled) is never cut: its
writer may go away (`InputView.ended`). An input with no writer placed (`InputView.dormant`: a
partitioned operator's instance slot that is dormant, never launched or retired by a scale-in,
which the scheduler says by giving the merger's channel no endpoint) is never cut either: a
merger waits for its active instances only (`waited_for`). A `max_delay` of None is a union
without max-delay: consistency without loss, it holds without a limit while an input is cut
and never goes tentative (DELAYING, then STABLE on heal: docs/availability.md, "Without max-delay").

No I/O, no clock of its own: times are the caller's monotonic seconds. `executor.dpc` applies
the decisions to a running task (docs/availability.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Mode(enum.Enum):
    STABLE = "stable"
    DELAYING = "delaying"
    TENTATIVE = "tentative"
    RECONCILING = "reconciling"


# A mode as a number, for heartbeats (their figures are numbers) and Prometheus
# (`elastiq_task_dpc_mode`): docs/availability.md, "Seeing the mode".
MODE_CODES = {Mode.STABLE: 0, Mode.DELAYING: 1, Mode.TENTATIVE: 2, Mode.RECONCILING: 3}


def mode_of_code(code: float) -> Mode | None:
    """The mode a heartbeat's `dpc_mode` names (None: not a DPC task, or an unknown code)."""
    return next((mode for mode, c in MODE_CODES.items() if c == code), None)


class Action(enum.Enum):
    NONE = "none"
    HOLD = "hold"  # stop handing input to Spark (a cut began)
    RELEASE = "release"  # hand input to Spark again (the cut healed within max-delay)
    GO_TENTATIVE = "go-tentative"  # keep the stable point, then run on, marking the output
    RECONCILE = "reconcile"  # re-run from the stable point with every input


@dataclass(frozen=True)
class InputView:
    """One input of the union as its receiver sees it."""

    name: str
    last_heard: float  # monotonic seconds of its last batch or answered liveness probe
    reachable: bool  # its writer answered the last probe (or sent data since)
    ended: bool = False  # its writer said its stream ended, and every batch of it is spooled
    # no writer is placed: a dormant instance slot of a partitioned operator (never launched,
    # or retired by a scale-in once drained: everything it wrote was committed here)
    dormant: bool = False

    @property
    def cut(self) -> bool:
        """Its writer is unreachable while more of its stream may come (an active writer)."""
        return not self.reachable and not self.ended and not self.dormant


def waited_for(inputs: tuple[InputView, ...]) -> tuple[str, ...]:
    """The inputs a union waits for now: the cut ones. For a partitioned operator's merger, the
    instances with a writer placed (running, launching, relaunching after a failure, or
    retiring and not yet drained) whose writer does not answer; a dormant slot (never
    launched, or retired by a rescale: its channel has no endpoint) is never waited for,
    however long its old writer is gone."""
    return tuple(i.name for i in inputs if i.cut)


def selector_view(name: str, replicas: tuple[InputView, ...]) -> InputView:
    """A hot-standby selector's stream (k replicas of one numbered stream) as one input: the
    selector reads whichever replica has the next batch, so the stream is cut only when every
    replica is unreachable, and it was last heard at the latest word from any replica."""
    if not replicas:
        raise ValueError(f"selector {name}: no replica to view")
    return InputView(name, max(r.last_heard for r in replicas),
                     any(r.reachable for r in replicas), any(r.ended for r in replicas),
                     all(r.dormant for r in replicas))


@dataclass(frozen=True)
class State:
    mode: Mode = Mode.STABLE
    since: float = 0.0  # when the mode began
    cut: tuple[str, ...] = ()  # the inputs whose writer is unreachable
    tentative_since: float | None = None  # when the open episode's first tentative batch began


@dataclass(frozen=True)
class Decision:
    state: State
    action: Action = Action.NONE

    @property
    def hold(self) -> bool:
        """Whether Spark is handed no new input now."""
        return self.state.mode is Mode.DELAYING


def step(state: State, inputs: tuple[InputView, ...], max_delay: float | None,
         now: float) -> Decision:
    """The next state of a union with `inputs` and `max_delay` (seconds > 0; None: wait without
    a limit, never tentative) at `now`."""
    if max_delay is not None and not max_delay > 0:
        raise ValueError(f"max_delay must be > 0 seconds, got {max_delay}")
    cut = waited_for(inputs)
    mode = state.mode
    if mode is Mode.STABLE:
        if cut:
            return Decision(State(Mode.DELAYING, now, cut), Action.HOLD)
        return Decision(state)
    if mode is Mode.DELAYING:
        if not cut:
            return Decision(State(Mode.STABLE, now), Action.RELEASE)
        if now >= delay_deadline(inputs, max_delay):
            return Decision(State(Mode.TENTATIVE, now, cut, now), Action.GO_TENTATIVE)
        return Decision(State(Mode.DELAYING, state.since, cut))
    if mode is Mode.TENTATIVE:
        if not cut:
            return Decision(State(Mode.RECONCILING, now, (), state.tentative_since),
                            Action.RECONCILE)
        return Decision(State(Mode.TENTATIVE, state.since, cut, state.tentative_since))
    return Decision(state)  # RECONCILING ends only by `reconciled`


def delay_deadline(inputs: tuple[InputView, ...], max_delay: float | None) -> float:
    """When the union stops waiting: max-delay after the earliest last word of a cut input
    (never without max-delay, or without a cut input)."""
    cut = [i.last_heard for i in inputs if i.cut]
    return min(cut) + max_delay if cut and max_delay is not None else float("inf")


def reconciled(state: State, now: float) -> State:
    """The re-run from the stable point has caught up: back to STABLE."""
    if state.mode is not Mode.RECONCILING:
        raise ValueError(f"reconciled while {state.mode.value}")
    return State(Mode.STABLE, now)
