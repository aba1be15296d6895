"""Scheduler metrics for cluster operators: one Prometheus registry per scheduler.

Owns `SchedulerMetrics`: a private `CollectorRegistry` (never the global one, so tests and several
schedulers in one process do not clash), fed by the event loop after every step with the event,
the commands it caused and the state (read only), plus functions the failover, rewrite, control,
elasticity and leadership code call (`record_failover`, `record_rewrite`, `record_control_applied`,
`record_control_refused`, `record_elastic_decision`, `record_rescale`, `set_parallelism`,
`set_leadership`). Heartbeat figures are cumulative per runner (they
restart at 0 with a new attempt or runner); they become monotonic counters here. Also owns the
rows of `elastiq status --watch` (`watch_rows`), which derive the same rates from the API's JSON.
Label values are bounded: query and task ids, state names and small fixed classes; never offer,
framework-message or stimulus ids, and never an endpoint (the route is unauthenticated).
Does not own any decision (`scheduler.state`), the HTTP route (`scheduler.api`) nor leadership
itself (the ZooKeeper code only reports it here).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest,
)

from scheduler.commands import (
    Command, DeclineOffers, LaunchTasks, ReplyToRequest, RetargetChannels,
)
from scheduler.elastic_policy import OUTCOMES, Capacity, Decision
from scheduler.events import OfferRescinded, OffersReceived
from scheduler.lifecycle import TaskRecord, TaskState, parse_mesos_task_id
from scheduler import elasticity
from scheduler.state import QueryRecord, SchedulerState, Stimulus

log = logging.getLogger("elastiq.scheduler.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
FAILOVER_PATTERNS = frozenset({"standby", "checkpoint", "hot-standby", "replica", "restart"})
QUERY_PHASES = ("active", "stopping", "stopped", "failed", "finished")
_CLASS = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
# (substring of a placement/decline reason, its class); the first match wins.
DECLINE_CLASSES: tuple[tuple[str, str], ...] = (
    ("no pending task needs it", "no_demand"),
    ("waits for the rest of its query", "gang"),
    ("apart_from", "anti_affinity"),
    ("no offer from an agent it may use", "agent_not_allowed"),
    ("cpus", "cpus"),
    ("MB memory", "mem"),
    ("ports", "ports"),
)
PLACEMENT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
GAP_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
PAUSE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60)
RESCALE_TRIGGERS = frozenset({"manual", "auto"})


def decline_class(reason: str) -> str:
    """A bounded class for a decline reason (which is free text naming tasks and numbers)."""
    return next((cls for needle, cls in DECLINE_CLASSES if needle in reason), "other")


def bounded(value: str, allowed: Iterable[str] | None = None) -> str:
    """`value` when it is a short lower-case class (and in `allowed`, if given), else "other"."""
    ok = bool(_CLASS.match(value)) and (allowed is None or value in allowed)
    return value if ok else "other"


@dataclass
class CumulativeCounter:
    """Turns figures that are cumulative per runner (reset to 0 by a new attempt or runner)
    into increments of a monotonic counter: a drop means a restart from 0."""

    last: dict[str, float] = field(default_factory=dict)

    def increment(self, key: str, value: float) -> float:
        previous = self.last.get(key)
        self.last[key] = value
        if previous is None or value < previous:
            return max(0.0, value)
        return value - previous

    def keep_only(self, keys: set[str]) -> None:
        for key in [k for k in self.last if k not in keys]:
            del self.last[key]


def _failing_over(task: TaskRecord) -> bool:
    """Failed or lost, or on its way back from that (a standby is pending again, or staging,
    in the very step it failed): its history reaches a failure before it reaches running."""
    for entry in reversed(task.history):
        if entry.finish is TaskState.RUNNING:
            return False
        if entry.finish in (TaskState.FAILED, TaskState.LOST):
            return True
    return False


class SchedulerMetrics:
    """The metrics of one scheduler. `observe_step` is called by the loop; the `record_*` and
    `set_leadership` functions by the code that knows those facts; `exposition()` for /metrics."""

    def __init__(self, leader: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._define_scheduler_metrics()
        self._define_task_metrics()
        self._define_reported_metrics()
        self._define_elastic_metrics()
        self._tuples_in = CumulativeCounter()
        self._tuples_out = CumulativeCounter()
        self._rows_dropped = CumulativeCounter()
        self._last_state: dict[str, TaskState] = {}
        self._failed_at: dict[tuple[str, str], float] = {}  # (query, task) -> when it failed
        self.leader.set(1 if leader else 0)

    # ---- definitions ---------------------------------------------------------------------
    def _define_scheduler_metrics(self) -> None:
        r = self.registry
        self.up = Gauge("elastiq_scheduler_up", "1 while this scheduler's event loop runs",
                        registry=r)
        self.connected = Gauge("elastiq_scheduler_connected_to_master",
                               "1 while registered with a Mesos master", registry=r)
        # the framework id only: /metrics is open, so it shows no endpoint (the master's
        # address, an agent's host:port) to whoever reaches it (issue 36)
        self.info = Info("elastiq_scheduler", "framework id of this scheduler", registry=r)
        self.events = Counter("elastiq_scheduler_events", "events handled, by kind", ["kind"],
                              registry=r)
        self.event_errors = Counter("elastiq_scheduler_event_errors",
                                    "events whose handling raised", ["kind"], registry=r)
        self.offers_received = Counter("elastiq_offers_received", "resource offers received",
                                       registry=r)
        self.offers_used = Counter("elastiq_offers_used", "offers used to launch tasks",
                                   registry=r)
        self.offers_declined = Counter("elastiq_offers_declined",
                                       "offers declined, by reason class", ["reason"], registry=r)
        self.offers_rescinded = Counter("elastiq_offers_rescinded", "offers rescinded by the "
                                        "master", registry=r)
        self.offers_held = Gauge("elastiq_offers_held", "offers held for pending demand",
                                 registry=r)
        self.queries = Gauge("elastiq_queries", "queries by phase", ["phase"], registry=r)
        self.leader = Gauge("elastiq_scheduler_is_leader", "1 while this scheduler leads",
                            registry=r)
        self.safe_mode = Gauge("elastiq_scheduler_safe_mode", "1 while the leader is in safe "
                               "mode (ZooKeeper SUSPENDED: no new launches)", registry=r)
        self.epoch = Gauge("elastiq_scheduler_leader_epoch", "leadership epoch of this "
                           "scheduler (0 when it never led)", registry=r)
        self.leadership_changes = Counter("elastiq_scheduler_leadership_changes",
                                          "times this scheduler gained or lost leadership",
                                          registry=r)
        self.suspicions = Counter("elastiq_executor_suspicions", "executors the failure "
                                  "detector took for dead (their tasks failed over)", registry=r)
        self.false_suspicions = Counter("elastiq_executor_false_suspicions", "executors taken "
                                        "for dead that sent a heartbeat afterwards (false "
                                        "positives of the failure detector)", registry=r)
        self._suspicions_seen = (0, 0)

    def _define_task_metrics(self) -> None:
        r, qt = self.registry, ["query", "task"]
        self.tasks = Gauge("elastiq_tasks", "tasks by query and state", ["query", "state"],
                           registry=r)
        self.placement = Histogram("elastiq_placement_seconds", "time from a task becoming "
                                   "pending to its launch", ["query"], buckets=PLACEMENT_BUCKETS,
                                   registry=r)
        self.launches = Counter("elastiq_task_launches", "task launches", ["query"], registry=r)
        self.restarts = Counter("elastiq_task_restarts", "launches of a task after it ended",
                                ["query"], registry=r)
        self.task_ends = Counter("elastiq_task_ends", "tasks reaching a terminal state",
                                 ["query", "state"], registry=r)
        self.task_running = Gauge("elastiq_task_running", "1 while the task runs", qt,
                                  registry=r)
        self.task_attempt = Gauge("elastiq_task_attempt", "current attempt of the task", qt,
                                  registry=r)
        self.tuples_in = Counter("elastiq_task_tuples_in", "input tuples (from heartbeats)", qt,
                                 registry=r)
        self.tuples_out = Counter("elastiq_task_tuples_out", "output tuples (from heartbeats)",
                                  qt, registry=r)
        self.rows_dropped = Counter("elastiq_task_rows_dropped", "rows the task's drop operators "
                                    "shed (load shedding, docs/load.md; from heartbeats)", qt,
                                    registry=r)
        self.backlog = Gauge("elastiq_task_backlog", "batches waiting in the task's inputs", qt,
                             registry=r)
        self.batch_seconds = Gauge("elastiq_task_batch_duration_seconds", "last micro-batch's "
                                   "duration", qt, registry=r)
        self.latency_seconds = Gauge("elastiq_task_latency_seconds", "last batch's end-to-end "
                                     "latency", qt, registry=r)
        self.dpc_mode = Gauge("elastiq_task_dpc_mode", "a DPC union's mode: 0 stable, 1 delaying, "
                              "2 tentative, 3 reconciling (docs/availability.md)", qt, registry=r)
        self.dpc_reconcile = Gauge("elastiq_task_dpc_reconcile_seconds", "how long the DPC "
                                   "task's last reconcile took", qt, registry=r)
        self.channel_blocked = Gauge(
            "elastiq_channel_blocked_seconds", "how long the task's channel sink has waited for "
            "room in its upstream backup (0: not blocked; readers absent or not acknowledging)",
            qt, registry=r)

    def _define_reported_metrics(self) -> None:
        r = self.registry
        self.control_requests = Counter(
            "elastiq_control_requests", "control requests by outcome: refused (checks failed, "
            "nothing sent), applied (every task acknowledged), undone (a task refused)",
            ["query", "outcome"], registry=r)
        self.control_seconds = Histogram(
            "elastiq_control_apply_seconds", "time from a control request to its last "
            "acknowledgement", ["query"], registry=r,
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0))
        self._control_seen: set[str] = set()
        self._rescales_seen: set[str] = set()  # control request ids of settled rescales
        self._decisions_seen: dict[str, int] = {}  # query id -> its policy decisions counted
        self.failovers = Counter("elastiq_failovers", "failovers, by pattern",
                                 ["query", "pattern"], registry=r)
        self.failover_gap = Histogram("elastiq_failover_gap_seconds", "gap in output a "
                                      "failover caused", ["pattern"], buckets=GAP_BUCKETS,
                                      registry=r)
        self.rewrites = Counter("elastiq_rewrites_applied", "rewrite rules applied, by rule",
                                ["rule"], registry=r)
        self.retargets = Counter("elastiq_channel_retargets", "consumer tasks told that a "
                                 "channel they read moved (one per consumer and relaunch)",
                                 ["query"], registry=r)
        self.control_applied = Counter("elastiq_control_tuples_applied", "control tuples "
                                       "applied", ["query"], registry=r)
        self.control_refused = Counter("elastiq_control_tuples_refused", "control tuples "
                                       "refused, by reason class", ["query", "reason"],
                                       registry=r)

    def _define_elastic_metrics(self) -> None:
        r = self.registry
        self.parallelism = Gauge("elastiq_operator_parallelism", "active instances of an "
                                 "elastic operator", ["query", "operator"], registry=r)
        self.rescales = Counter("elastiq_rescales", "rescales of an operator that completed, "
                                "by direction (out, in) and trigger (manual: elastiq scale; "
                                "auto: the elastic policy)",
                                ["query", "operator", "direction", "trigger"], registry=r)
        self.rescale_pause = Histogram("elastiq_rescale_pause_seconds", "how long a rescale "
                                       "held the operator's inputs (quiesce to unquiesce), by "
                                       "whether the operator keeps state",
                                       ["state"], buckets=PAUSE_BUCKETS, registry=r)
        self.elastic_decisions = Counter("elastiq_elastic_decisions", "decisions of the "
                                         "elastic policy: out, in, or hold_<reason>",
                                         ["outcome"], registry=r)
        self.capacity = Gauge("elastiq_operator_capacity_rows_per_second", "rows one instance "
                              "of an automatic operator processes per second, as the policy "
                              "knows it (model: sustained with batches within the target, from "
                              "the fitted batch cost model; measured: per busy second, seen "
                              "while rows waited; lower_bound: the best seen while the "
                              "instances kept up)",
                              ["query", "operator", "kind"], registry=r)
        self.shed_decisions = Counter("elastiq_shed_decisions", "decisions of the load "
                                      "shedding policy: shed, release, or hold_<reason>",
                                      ["query", "outcome"], registry=r)
        self.sink_quality = Gauge("elastiq_sink_expected_quality", "the share of a sink's "
                                  "unshed value the shedding plan in force expects it to "
                                  "deliver (1: nothing shed)", ["query", "sink"], registry=r)
        self._shed_seen: dict[str, int] = {}  # query id -> its shedding decisions counted
        self.distribution_moves = Counter("elastiq_distribution_moves", "tasks the load "
                                          "distributor moved (started: the migration protocol "
                                          "took the move; refused: it did not), docs/load.md",
                                          ["query", "outcome"], registry=r)
        self.distribution_decisions = Counter("elastiq_distribution_decisions", "rounds of the "
                                              "load distributor: move, or hold_<reason>",
                                              ["outcome"], registry=r)
        self._distribution_seen = (0, 0)  # (decisions, moves recorded) counted
        self._parallelism_seen: set[tuple[str, str]] = set()
        self._capacity_seen: dict[tuple[str, str], str] = {}  # (query, operator) -> kind

    # ---- fed by the loop -----------------------------------------------------------------
    def observe_step(self, event: Stimulus, commands: Iterable[Command], state: SchedulerState,
                     now: float | None = None) -> None:
        """One loop step: the event, the commands it caused, then the state it left behind.
        `now` is the loop's monotonic clock (the state's `pending_since` uses the same)."""
        now = time.monotonic() if now is None else now
        self.observe_event(event)
        for command in commands:
            self.observe_command(command, state, now)
        self.observe_state(state, now)

    def observe_event(self, event: Stimulus) -> None:
        self.events.labels(type(event).__name__).inc()
        if isinstance(event, OffersReceived):
            self.offers_received.inc(len(event.offers))
        elif isinstance(event, OfferRescinded):
            self.offers_rescinded.inc()

    def observe_error(self, event: Stimulus) -> None:
        self.event_errors.labels(type(event).__name__).inc()

    def observe_command(self, command: Command, state: SchedulerState, now: float) -> None:
        if isinstance(command, LaunchTasks):
            self.offers_used.inc(len(command.offer_ids))
            for launch in command.tasks:
                self._observe_launch(launch.mesos_task_id, state, now)
        elif isinstance(command, DeclineOffers):
            self.offers_declined.labels(decline_class(command.reason)).inc(
                len(command.offer_ids))
        elif isinstance(command, RetargetChannels):
            self.retargets.labels(command.query_id).inc()
        elif isinstance(command, ReplyToRequest) and command.body and "problems" in command.body:
            self.control_requests.labels(str(command.body.get("query_id", "")), "refused").inc()

    def _observe_control(self, state: SchedulerState) -> None:
        """Each control request once, when it settles."""
        for query_id, q in state.queries.items():
            for request in q.control.requests.values():
                if request.settled_at is None or request.request_id in self._control_seen:
                    continue
                self._control_seen.add(request.request_id)
                outcome = "applied" if request.state == "applied" else "undone"
                self.control_requests.labels(query_id, outcome).inc()
                self.control_seconds.labels(query_id).observe(
                    max(0.0, request.settled_at - request.asked_at))

    def _observe_launch(self, mesos_task_id: str, state: SchedulerState, now: float) -> None:
        found = _task(state, mesos_task_id)
        if found is None:
            log.debug("[metrics] launch of unknown task %s", mesos_task_id)
            return
        query_id, task = found
        self.launches.labels(query_id).inc()
        if task.launches > 1:
            self.restarts.labels(query_id).inc()
        self.placement.labels(query_id).observe(max(0.0, now - task.pending_since))

    def observe_state(self, state: SchedulerState, now: float | None = None) -> None:
        """Gauges from the state as this step left it; heartbeat figures become counters; a
        failed task running again counts as a failover (pattern "restart") with its gap."""
        now = time.monotonic() if now is None else now
        self.up.set(1)
        self._observe_control(state)
        self.connected.set(1 if state.connected else 0)
        self.offers_held.set(len(state.held))
        self._observe_detector(state)
        self._observe_distribution(state)
        self.info.info({"framework_id": state.framework_id or ""})
        phases = {p: 0 for p in QUERY_PHASES}
        current: set[str] = set()
        for query in state.queries.values():
            phases[query.phase] = phases.get(query.phase, 0) + 1
            self._observe_query(query.query_id, query.tasks.values(), now)
            self._observe_elastic(query)
            self._observe_shedding(query)
            current |= {t.mesos_task_id for t in query.tasks.values()}
        for phase, count in phases.items():
            self.queries.labels(phase).set(count)
        for counter in (self._tuples_in, self._tuples_out, self._rows_dropped):
            counter.keep_only(current)
        self._forget_parallelism({q for q, query in state.queries.items()
                                  if query.phase in ("active", "stopping")})
        self._last_state = {k: v for k, v in self._last_state.items() if k in current}
        self._failed_at = {k: v for k, v in self._failed_at.items() if k[0] in state.queries}

    def _observe_elastic(self, query: QueryRecord) -> None:
        """Each elastic operator's parallelism, each rescale once when it settled, each policy
        decision once."""
        if not query.query.elastic or query.phase not in ("active", "stopping"):
            return
        for e in query.query.elastic:
            self.set_parallelism(query.query_id, e.operator,
                                 elasticity.parallelism(e, query.control))
            latest = query.elastic.latest.get(e.operator)
            if latest is not None and latest.capacity is not None:
                self._set_capacity(query.query_id, e.operator, latest.capacity)
        for r in query.elastic.rescales:
            if r.state == "applied" and r.request not in self._rescales_seen:
                self._rescales_seen.add(r.request)
                stateful = any(e.stateful for e in query.query.elastic if e.operator == r.operator)
                self.record_rescale(query.query_id, r.operator, r.before, r.after, r.trigger,
                                    r.pause_s or 0.0, stateful)
        seen = self._decisions_seen.get(query.query_id, 0)
        fresh = min(max(0, query.elastic.decided - seen), len(query.elastic.decisions))
        for decision in query.elastic.decisions[len(query.elastic.decisions) - fresh:]:
            self.record_elastic_decision(decision)
        self._decisions_seen[query.query_id] = query.elastic.decided

    def _observe_shedding(self, query: QueryRecord) -> None:
        """Each shedding decision once, by outcome; each sink's expected quality."""
        record = query.shed
        seen = self._shed_seen.get(query.query_id, 0)
        fresh = min(max(0, record.decided - seen), len(record.decisions))
        for decision in record.decisions[len(record.decisions) - fresh:]:
            outcome = decision.kind if decision.kind != "hold" else f"hold_{decision.reason}"
            self.shed_decisions.labels(query.query_id, outcome).inc()
        self._shed_seen[query.query_id] = record.decided
        if record.decided and query.phase == "active":
            for sink in query.query.weights:
                self.sink_quality.labels(query.query_id, sink).set(record.quality.get(sink, 1.0))

    def _observe_distribution(self, state: SchedulerState) -> None:
        """Each round of the distributor once, by outcome; each move once, by outcome (a new
        state, e.g. after losing leadership, counts from 0 again)."""
        record = state.distribution
        decided, recorded = self._distribution_seen
        if record.decided < decided or record.moved + record.refused < recorded:
            decided, recorded = 0, 0
        fresh = min(record.decided - decided, len(record.decisions))
        for d in record.decisions[len(record.decisions) - fresh:]:
            self.distribution_decisions.labels(
                d.kind if d.kind == "move" else f"hold_{d.reason}").inc()
        new_moves = min(record.moved + record.refused - recorded, len(record.moves))
        for m in record.moves[len(record.moves) - new_moves:]:
            self.distribution_moves.labels(m.query_id, "started" if m.started
                                           else "refused").inc()
        self._distribution_seen = (record.decided, record.moved + record.refused)

    def _observe_detector(self, state: SchedulerState) -> None:
        """The state counts suspicions and false ones since it started; counters take the
        growth (a new state, e.g. after losing leadership, starts again at 0)."""
        seen, false_seen = self._suspicions_seen
        self.suspicions.inc(max(0, state.suspicions - seen))
        self.false_suspicions.inc(max(0, state.false_suspicions - false_seen))
        self._suspicions_seen = (state.suspicions, state.false_suspicions)

    def _observe_query(self, query_id: str, tasks: Iterable[TaskRecord], now: float) -> None:
        counts = {s.value: 0 for s in TaskState}
        for task in tasks:
            counts[task.state.value] += 1
            self._observe_task(query_id, task)
            self._observe_restart(query_id, task, now)
        for state_name, count in counts.items():
            self.tasks.labels(query_id, state_name).set(count)

    def _observe_task(self, query_id: str, task: TaskRecord) -> None:
        labels = (query_id, task.task_id)
        self.task_running.labels(*labels).set(1 if task.state is TaskState.RUNNING else 0)
        self.task_attempt.labels(*labels).set(task.attempt)
        self._observe_end(query_id, task)
        self._observe_figures(labels, task.mesos_task_id, task.figures)

    def _observe_restart(self, query_id: str, task: TaskRecord, now: float) -> None:
        """From a task's failure (failed or lost) to its next attempt running: one failover,
        labelled with the task's failover mode (standby, checkpoint, replica) or "restart"."""
        if _failing_over(task):
            self._failed_at.setdefault((query_id, task.task_id), now)
        elif task.state is TaskState.RUNNING:
            failed_at = self._failed_at.pop((query_id, task.task_id), None)
            if failed_at is not None:
                self.record_failover(query_id, task.task.failover or "restart", now - failed_at)

    def _observe_end(self, query_id: str, task: TaskRecord) -> None:
        previous = self._last_state.get(task.mesos_task_id)
        self._last_state[task.mesos_task_id] = task.state
        if task.state.terminal and previous is not None and previous is not task.state:
            self.task_ends.labels(query_id, task.state.value).inc()

    def _observe_figures(self, labels: tuple[str, str], key: str,
                         figures: Mapping[str, float]) -> None:
        if not figures:
            return
        if "tuples_in" in figures:
            self.tuples_in.labels(*labels).inc(self._tuples_in.increment(key, figures["tuples_in"]))
        if "tuples_out" in figures:
            self.tuples_out.labels(*labels).inc(
                self._tuples_out.increment(key, figures["tuples_out"]))
        if figures.get("rows_dropped"):
            self.rows_dropped.labels(*labels).inc(
                self._rows_dropped.increment(key, figures["rows_dropped"]))
        if "backlog" in figures:
            self.backlog.labels(*labels).set(figures["backlog"])
        if "batch_ms" in figures:
            self.batch_seconds.labels(*labels).set(figures["batch_ms"] / 1000.0)
        if "latency_ms" in figures:
            self.latency_seconds.labels(*labels).set(figures["latency_ms"] / 1000.0)
        if "channel_blocked_ms" in figures:
            self.channel_blocked.labels(*labels).set(figures["channel_blocked_ms"] / 1000.0)
        if "dpc_mode" in figures:
            self.dpc_mode.labels(*labels).set(figures["dpc_mode"])
        if figures.get("dpc_reconcile_ms", -1) >= 0:
            self.dpc_reconcile.labels(*labels).set(figures["dpc_reconcile_ms"] / 1000.0)

    # ---- reported by other parts of the scheduler ----------------------------------------
    def record_failover(self, query_id: str, pattern: str, gap_seconds: float) -> None:
        """A failover of `query_id` by `pattern` (standby, checkpoint, hot-standby, replica,
        restart; anything else counts as "other") whose output gap was `gap_seconds`."""
        name = bounded(pattern, FAILOVER_PATTERNS)
        self.failovers.labels(query_id, name).inc()
        self.failover_gap.labels(name).observe(max(0.0, gap_seconds))

    def record_rewrite(self, rule: str, times: int = 1) -> None:
        """`rule` (a rule file's name, e.g. "hot-standby") was applied `times` times."""
        self.rewrites.labels(bounded(rule.lower())).inc(times)

    def record_control_applied(self, query_id: str) -> None:
        self.control_applied.labels(query_id).inc()

    def record_control_refused(self, query_id: str, reason: str) -> None:
        """`reason` is a short class such as "stale-epoch", "unknown-task", "bad-value"."""
        self.control_refused.labels(query_id, bounded(reason)).inc()

    def record_elastic_decision(self, decision: Decision) -> None:
        """One decision of `scheduler.elastic_policy.decide` (hold included), by outcome."""
        outcome = decision.outcome if decision.outcome in OUTCOMES else "other"
        self.elastic_decisions.labels(outcome).inc()

    def record_rescale(self, query_id: str, operator_id: str, before: int, after: int,
                       trigger: str, pause_seconds: float, stateful: bool) -> None:
        """A rescale of `operator_id` from `before` to `after` instances completed after
        holding its inputs `pause_seconds`; `trigger` is "manual" or "auto" (else "other").
        Also sets the operator's parallelism to `after`."""
        direction = "out" if after > before else "in" if after < before else "none"
        self.rescales.labels(query_id, operator_id, direction,
                             bounded(trigger, RESCALE_TRIGGERS)).inc()
        self.rescale_pause.labels("stateful" if stateful else "stateless").observe(
            max(0.0, pause_seconds))
        self.set_parallelism(query_id, operator_id, after)

    def set_parallelism(self, query_id: str, operator_id: str, parallelism: int) -> None:
        """The operator's active instances now: at deployment and after each rescale. The
        series goes when its query is no longer active or stopping (`observe_state`)."""
        self.parallelism.labels(query_id, operator_id).set(parallelism)
        self._parallelism_seen.add((query_id, operator_id))

    def _set_capacity(self, query_id: str, operator_id: str, capacity: Capacity) -> None:
        kind = "model" if capacity.cost is not None else \
            "measured" if capacity.measured else "lower_bound"
        before = self._capacity_seen.get((query_id, operator_id))
        if before is not None and before != kind:
            self.capacity.remove(query_id, operator_id, before)
        self.capacity.labels(query_id, operator_id, kind).set(capacity.rate)
        self._capacity_seen[(query_id, operator_id)] = kind

    def _forget_parallelism(self, live_queries: set[str]) -> None:
        for key in [k for k in self._parallelism_seen if k[0] not in live_queries]:
            self.parallelism.remove(*key)
            self._parallelism_seen.discard(key)
        for key in [k for k in self._capacity_seen if k[0] not in live_queries]:
            self.capacity.remove(*key, self._capacity_seen.pop(key))

    def set_leadership(self, leader: bool, epoch: int | None = None,
                       safe_mode: bool = False) -> None:
        """Leadership as the ZooKeeper code sees it. A scheduler without ZooKeeper leads
        alone (the default); with ZooKeeper, call `set_leadership(False)` before electing."""
        if next(iter(self.leader.collect())).samples[0].value != (1.0 if leader else 0.0):
            self.leadership_changes.inc()
        self.leader.set(1 if leader else 0)
        self.safe_mode.set(1 if leader and safe_mode else 0)
        if epoch is not None:
            self.epoch.set(epoch)

    def set_down(self) -> None:
        """The loop stopped: this scheduler no longer acts."""
        self.up.set(0)

    # ---- exposition ----------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The registry in Prometheus text format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def sample_names(self) -> set[str]:
        """Every sample name this registry can expose (with _total, _bucket, ... suffixes),
        whether or not a labelled child exists yet: what alert rules and dashboards may use."""
        names: set[str] = set()
        for family in self.registry.collect():
            names |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
        return names


_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "gauge": ("",),
}


def _task(state: SchedulerState, mesos_task_id: str) -> tuple[str, TaskRecord] | None:
    parsed = parse_mesos_task_id(mesos_task_id)
    if parsed is None:
        return None
    for query in state.queries.values():
        task = query.tasks.get(parsed[0])
        if task is not None:
            return query.query_id, task
    return None


# ---- `elastiq status --watch` ------------------------------------------------------------

@dataclass(frozen=True)
class WatchRow:
    query: str
    task: str
    state: str
    agent: str
    attempt: int
    tuples_per_second: float | None  # None until two readings of the same attempt
    backlog: float | None
    batch_ms: float | None
    latency_ms: float | None


WATCH_HEADER = ("QUERY", "TASK", "STATE", "AGENT", "ATTEMPT", "TUPLES/S IN", "BACKLOG",
                "BATCH MS", "LATENCY MS")
Readings = dict[str, tuple[float, float]]  # mesos task id -> (time, cumulative tuples in)


def watch_rows(reply: Mapping[str, Any], previous: Readings, now: float
               ) -> tuple[list[WatchRow], Readings]:
    """The rows of one `status --watch` frame and the readings to pass to the next one.
    Tuples in are cumulative per attempt: a rate is only taken between readings of one
    attempt, and a drop (a restarted runner) shows no rate for that frame."""
    queries = reply["queries"] if "queries" in reply else [reply]
    rows, readings = [], {}
    for q in queries:
        for t in q.get("tasks", []):
            figures = t.get("figures") or {}
            key = str(t.get("mesos_task_id", t.get("task_id")))
            rate = None
            if "tuples_in" in figures:
                readings[key] = (now, float(figures["tuples_in"]))
                rate = _rate(previous.get(key), readings[key])
            rows.append(WatchRow(str(q.get("query_id")), str(t.get("task_id")),
                                 str(t.get("state")), str(t.get("hostname") or "-"),
                                 int(t.get("attempt", 0)), rate, figures.get("backlog"),
                                 figures.get("batch_ms"), figures.get("latency_ms")))
    return rows, readings


def _rate(before: tuple[float, float] | None, after: tuple[float, float]) -> float | None:
    if before is None or after[0] <= before[0] or after[1] < before[1]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def format_watch(rows: list[WatchRow]) -> str:
    """A fixed-width table of the rows, with the header."""
    cells = [WATCH_HEADER] + [
        (r.query, r.task, r.state, r.agent, str(r.attempt), _num(r.tuples_per_second),
         _num(r.backlog), _num(r.batch_ms), _num(r.latency_ms)) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(WATCH_HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in cells)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


__all__ = ["SchedulerMetrics", "CumulativeCounter", "decline_class", "bounded", "WatchRow",
           "watch_rows", "format_watch", "CONTENT_TYPE"]
