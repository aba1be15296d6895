"""Failure detection of executors by the framework, pure: is an executor that went quiet dead?

Owns `Arrivals` (one executor's recent heartbeat intervals) and `phi` (the phi-accrual suspicion
level of Hayashibara et al., as Akka and Cassandra use it: how unlikely the present silence is
given the intervals seen, on a log10 scale) with its settings `DetectorSettings`. The threshold
adapts to each executor's own rhythm: a loaded machine whose heartbeats arrive late and irregular
widens the distribution, so it is not taken for a dead one, and `acceptable_pause` (added to the
mean) absorbs a long GC or a CPU hog. Real Mesos keeps a wedged executor's tasks RUNNING; this is
what lets the scheduler alone fail them over (`scheduler.state`). Does not own time (callers
pass it) nor what a suspicion does.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DetectorSettings:
    """`threshold`: phi above which an executor is taken for dead (None: detection off; 8 is
    Akka's default on a LAN, higher is more patient); `acceptable_pause`: seconds of silence
    beyond the usual interval that never count much (GC, load); `min_std`: the smallest spread
    assumed (s), so a metronome-regular executor is not suspected after one late beat;
    `first_interval`: the interval assumed before two heartbeats have been seen."""

    threshold: float | None = 8.0
    acceptable_pause: float = 10.0
    min_std: float = 0.5
    first_interval: float = 1.0
    window: int = 100


@dataclass
class Arrivals:
    """When one executor's heartbeats came (the last one and the recent intervals)."""

    last: float
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=100))

    def record(self, now: float) -> None:
        gap = now - self.last
        if gap > 0:
            self.intervals.append(gap)
        self.last = max(self.last, now)


def phi(arrivals: Arrivals, now: float, settings: DetectorSettings) -> float:
    """How unlikely a silence of `now - arrivals.last` is: -log10 of the probability that the next
    heartbeat comes even later, under a normal distribution of the intervals seen (the logistic
    approximation of its tail, as Akka computes it)."""
    seen = list(arrivals.intervals)[-settings.window:] or [settings.first_interval]
    mean = sum(seen) / len(seen)
    variance = sum((x - mean) ** 2 for x in seen) / len(seen)
    std = max(math.sqrt(variance), settings.min_std)
    y = max(-20.0, (now - arrivals.last - (mean + settings.acceptable_pause)) / std)
    e = math.exp(-y * (1.5976 + 0.070566 * y * y))
    tail = e / (1.0 + e) if y > 0 else 1.0 - 1.0 / (1.0 + e)
    return -math.log10(max(tail, 1e-300))


def suspected(arrivals: Arrivals, now: float, settings: DetectorSettings) -> bool:
    """Whether the executor is taken for dead now (never with detection off)."""
    return settings.threshold is not None and phi(arrivals, now, settings) > settings.threshold
