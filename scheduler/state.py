"""The scheduler's state machine: `SchedulerState.handle(event) -> list[Command]`.

Owns everything the scheduler knows (queries, their tasks and attempts, held offers, warm
executors, lost agents, the framework registration) and the only method that changes it.
It decides launches (through `scheduler.placement` and `scheduler.destinations`), restarts with
bounded attempts and backoff (standby, checkpoint and replica tasks fail over at once, elsewhere),
retargets the consumers of a channel whose producer moved, kills on stop, reconciliation
after (re)registration, and the control stream of each query (control tuples checked against
its catalogue, sent to the tasks they change, acknowledged with epochs, undone everywhere when
one task refuses; bookkeeping in `scheduler.control`), and the load distributor's rounds (each
task's load from heartbeats in `scheduler.load_history`, the decision in `scheduler.distributor`,
moves started with the migration protocol, bookkeeping in `scheduler.distribution_state`).
`handle` picks the handler for an event's type from `_HANDLERS` (through `common.dispatch`);
executors' messages arrive typed (`common.messages`), and `launch_data` builds the typed
`LaunchData` (the adapter does the JSON and base64). Time comes only from `Tick` events and a
control request's id from `ControlRequested.request_id` (an automatic rescale's from the query's
control version and the tick's time); channel keys arrive on `QuerySubmitted.keys` and in a
restored query's placements (made by the shell: `scheduler.channel_keys`). Leadership (`scheduler.leadership`) gates
it: a leader in safe mode launches, restarts and kills nothing; a standby forgets every query; a
mutating `FencedRequest` with a stale epoch is refused. `durable_placements` and `restore_query`
are what a new leader persists and restores. Does not own any I/O: `scheduler.mesos_adapter` runs
the commands and turns what Mesos says into events; views for the API are in `scheduler.views`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Literal, Mapping, Union

from common import messages
from common.control import PARALLELISM, ControlCatalog, ControlRefused
from common.dispatch import handler
from common.failures import FailureKind, kind_of
from common.messages import ControlMessage, LaunchData, LaunchQuery, ParamSet
from common.tasks import CompiledQuery
from compiler.control import check_tuples
from scheduler import (admission, control as ctl, distribution_state, elasticity, shed_state,
                       sharing, update_plan)
from scheduler.commands import (
    Command, DeclineOffers, KillTask, LaunchTasks, ReconcileTasks, ReplyToRequest,
    RetargetChannels, ReviveOffers, SendFrameworkMessage, ShutdownExecutor, SuppressOffers,
    TaskLaunch,
)
from scheduler.config import SchedulerConfig
from scheduler.distributor import DistributionView, decide_distribution
from scheduler.elastic_policy import SampleHistory, decide, sample_of
from scheduler.load_history import LoadHistory, cpu_seconds
from scheduler.shed_policy import ShedDecision, cannot_add_capacity, decide_shedding
from scheduler.shed_problem import (TaskRates, drop_operators, problem_of, rates_of,
                                    uniform_tuples)
from scheduler.liveness import Arrivals, phi, suspected
from scheduler.destinations import (
    IMMEDIATE_FAILOVER, Destinations, Past, apart_groups, destinations_for,
)
from scheduler.events import (
    AgentLost, ControlAcknowledged, ControlRequested, Disconnected, Event, ExecutorLost,
    HeartbeatReceived, MessageUnreadable, OfferRescinded, OffersReceived, QueryStopRequested,
    QuerySubmitted, QueryUpdateRequested, Registered, Reregistered, StatusUpdated,
    TaskMigrationRequested, Tick,
)
from scheduler.leadership import (
    FencedRequest, Leadership, LeadershipGained, LeadershipUpdated, check_epoch,
)
from scheduler.lifecycle import (
    FROM_MESOS, TaskRecord, TaskState, parse_mesos_task_id,
)
from scheduler.placement import (
    Offer, PlacementResult, QueryDemand, Share, TaskAssignment, TaskDemand, place,
)
from scheduler.placement_scores import Ranking, predicted_load, ranked_agents
from scheduler.query_source import QuerySource

# What `handle` takes: the scheduler's events and the leadership's (`scheduler.leadership`).
Stimulus = Union[Event, LeadershipGained, LeadershipUpdated, FencedRequest]

log = logging.getLogger("elastiq.scheduler.state")

QueryPhase = Literal["active", "stopping", "stopped", "failed", "finished"]


@dataclass
class QueryRecord:
    query: CompiledQuery
    tasks: dict[str, TaskRecord]
    phase: QueryPhase = "active"
    failure: str = ""
    control: ctl.QueryControl = field(default_factory=ctl.QueryControl)
    source: QuerySource | None = None  # None: not from a spec (tests), never persisted
    # task id -> its channel CURVE keypair {"public", "secret"} (Z85), issued at submit and kept
    # with the placements: secret, never shown by status, the API, logs or metrics
    keys: dict[str, dict[str, str]] = field(default_factory=dict)
    elastic: elasticity.ElasticState = field(default_factory=elasticity.ElasticState)
    shed: shed_state.ShedState = field(default_factory=shed_state.ShedState)

    @property
    def query_id(self) -> str:
        return self.query.query_id

    def all_terminal(self) -> bool:
        """Every task ended (a dormant elastic slot counts as ended: it runs nothing)."""
        return all((t.state.terminal or t.state is TaskState.DORMANT) and t.restart_at is None
                   for t in self.tasks.values())


@dataclass
class HeldOffer:
    offer: Offer
    received_at: float
    reason: str = "no pending task needs it"


@dataclass
class SchedulerState:
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    queries: dict[str, QueryRecord] = field(default_factory=dict)
    framework_id: str | None = None
    master: str | None = None
    connected: bool = False
    now: float = 0.0
    held: dict[str, HeldOffer] = field(default_factory=dict)
    warm_agents: set[str] = field(default_factory=set)  # our executor known to run there
    gone_agents: set[str] = field(default_factory=set)
    agents: dict[str, str] = field(default_factory=dict)  # agent id -> hostname, from offers
    # agent id -> its isolation, from its offers' `isolation` attribute (embedded agents say it)
    agent_isolation: dict[str, str] = field(default_factory=dict)
    # agent id -> (cpus, MB) it offered with no executor of ours on it: its size as far as we
    # can tell (the most seen), for refusing at submit a task no agent can ever hold
    agent_sizes: dict[str, tuple[float, float]] = field(default_factory=dict)
    suppressed: bool = False
    last_reconcile: float = 0.0
    heartbeats: dict[str, float] = field(default_factory=dict)  # executor id -> last seen
    # the failure detector (`scheduler.liveness`): heartbeat arrivals per (executor, agent),
    # executors taken for dead (-> their agent) until Mesos reports them gone or they speak again
    arrivals: dict[tuple[str, str], Arrivals] = field(default_factory=dict)
    suspected: dict[str, str] = field(default_factory=dict)
    suspicions: int = 0  # executors taken for dead
    false_suspicions: int = 0  # ... that spoke again afterwards (a detector's false positive)
    unplaced: dict[str, str] = field(default_factory=dict)  # task id -> why it waits
    leadership: Leadership | None = None  # None: not coordinated, acts as leader
    # the last fencing epoch issued (`executor.fencing`): every launch gets a larger one. The I/O
    # shell starts it at the wall clock in ms, a new leader at least at the persisted ones, so
    # epochs grow across restarts, leaders and a query's removal and resubmission.
    epoch_floor: int = 0
    # recent heartbeat figures of every task, by task id (the automatic elasticity policy's)
    samples: SampleHistory = field(default_factory=SampleHistory)
    # every task's load series (`scheduler.load_history`) and the load distributor's bookkeeping
    loads: LoadHistory = field(default_factory=LoadHistory)
    distribution: distribution_state.DistributionState = field(
        default_factory=distribution_state.DistributionState)

    def deferring(self) -> bool:
        """True while decisions wait: in safe mode or as a standby (no launches, no kills)."""
        return self.leadership is not None and self.leadership.role != "leader"

    # ---- the one entry point -------------------------------------------------------------
    def handle(self, event: Stimulus) -> list[Command]:
        """Apply one event; return the commands it causes. The only mutator of this state."""
        commands = handler(_HANDLERS, event, "SchedulerState")(self, event)
        for c in commands:
            log.debug("[%s] -> %s", event.stimulus_id, c)
        return commands

    # ---- registration --------------------------------------------------------------------
    def _on_registered(self, ev: Registered) -> list[Command]:
        self.framework_id, self.master, self.connected = ev.framework_id, ev.master, True
        log.info("[%s] registered as framework %s with master %s", ev.stimulus_id,
                 ev.framework_id, ev.master)
        return self._after_registration(ev.stimulus_id)

    def _on_reregistered(self, ev: Reregistered) -> list[Command]:
        self.master, self.connected = ev.master, True
        self.framework_id = ev.framework_id or self.framework_id
        log.info("[%s] re-registered with master %s", ev.stimulus_id, ev.master)
        return self._after_registration(ev.stimulus_id)

    def _after_registration(self, sid: str) -> list[Command]:
        """Reconcile explicitly (tasks we launched), then implicitly (tasks we do not know)."""
        self.last_reconcile = self.now
        ids = self._launched_ids()  # an empty explicit list would mean "all" to Mesos
        commands: list[Command] = [ReconcileTasks(sid, ids)] if ids else []
        commands.append(ReconcileTasks(sid))
        self.suppressed = False
        return commands + [ReviveOffers(sid) if self._pending() else self._suppress(sid)]

    def _on_disconnected(self, ev: Disconnected) -> list[Command]:
        self.connected = False
        if self.held:
            log.info("[%s] disconnected; dropping %s held offers", ev.stimulus_id, len(self.held))
        self.held.clear()
        return []

    # ---- offers --------------------------------------------------------------------------
    def _on_offers_received(self, ev: OffersReceived) -> list[Command]:
        shunned = set(self.suspected.values())  # its executor may take no task until it is gone
        refused = [o.offer_id for o in ev.offers if o.agent_id in shunned]
        if refused:
            return self._decline(ev.stimulus_id, refused, "our executor there is taken for "
                                 "dead and being shut down") + self._on_offers_received(
                replace(ev, offers=tuple(o for o in ev.offers if o.agent_id not in shunned)))
        for offer in ev.offers:
            self.gone_agents.discard(offer.agent_id)
            self.agents[offer.agent_id] = offer.hostname
            self.agent_isolation[offer.agent_id] = dict(offer.attributes).get("isolation", "")
            self.held[offer.offer_id] = HeldOffer(offer, self.now)
        self._note_sizes(ev.offers)
        return self._try_place(ev.stimulus_id)

    def _note_sizes(self, offers: Iterable[Offer]) -> None:
        """Keep the most each agent offered with nothing of ours on it (its offers of one
        event summed): what a task and our executor can have there at most."""
        idle: dict[str, tuple[float, float]] = {}
        for o in offers:
            if o.executor_ids or o.agent_id in self.warm_agents:
                continue
            cpus, mem = idle.get(o.agent_id, (0.0, 0.0))
            idle[o.agent_id] = (cpus + o.cpus, mem + o.mem_mb)
        for agent, (cpus, mem) in idle.items():
            seen = self.agent_sizes.get(agent, (0.0, 0.0))
            self.agent_sizes[agent] = (max(seen[0], cpus), max(seen[1], mem))

    def _on_offer_rescinded(self, ev: OfferRescinded) -> list[Command]:
        if self.held.pop(ev.offer_id, None) is not None:
            log.info("[%s] offer %s rescinded while held", ev.stimulus_id, ev.offer_id)
        return []

    def _try_place(self, sid: str) -> list[Command]:
        """Place pending demand on held offers; launch, hold or decline each offer."""
        if not self.held or self.deferring():
            return []
        demands = self._demands()
        if not demands:
            return self._decline(sid, list(self.held), "no pending task needs it") + \
                [self._suppress(sid)]
        result = place([h.offer for h in self.held.values()], demands,
                       executor_id_for={a: self._executor_id(a) for a in self._held_agents()},
                       executor_share=Share(self.config.executor.cpus,
                                            self.config.executor.mem_mb),
                       warm_agents=frozenset(self.warm_agents))
        return self._apply_placement(sid, result)

    def _apply_placement(self, sid: str, result: PlacementResult) -> list[Command]:
        launches: dict[str, list[TaskLaunch]] = {}
        for qp in result.placed:
            record = self.queries[qp.query_id]
            for a in qp.assignments:
                launches.setdefault(a.agent_id, []).append(self._launch(sid, record, a))
        for u in result.unplaced:  # logged when the reason changes, not on every retry
            if self.unplaced.get(u.task_id) != u.reason:
                log.info("[%s] task %s not placed: %s", sid, u.task_id, u.reason)
        self.unplaced = {u.task_id: u.reason for u in result.unplaced}
        commands: list[Command] = []
        for agent_id, tasks in launches.items():
            offer_ids = result.used_offers[agent_id]
            for oid in offer_ids:
                self.held.pop(oid, None)
            self.warm_agents.add(agent_id)
            commands.append(LaunchTasks(sid, offer_ids, agent_id, self._executor_id(agent_id),
                                        tuple(tasks)))
        for qp in result.placed:  # after the launches: consumers reconnect to what now starts
            commands += self._retargets(sid, self.queries[qp.query_id],
                                        {a.task_id for a in qp.assignments})
            commands += self._retarget_readers(sid, self.queries[qp.query_id],
                                               {a.task_id for a in qp.assignments})
        declined = [d for d in result.declined if d.offer_id in self.held]
        if not result.unplaced:
            return commands + self._decline(sid, [d.offer_id for d in declined],
                                            "no pending task needs it")
        for d in declined:
            self.held[d.offer_id].reason = d.reason
        return commands

    def _launch(self, sid: str, record: QueryRecord, a: TaskAssignment) -> TaskLaunch:
        task = record.tasks[a.task_id]
        where = self._destinations(task)  # as the demand saw it: same state, same time
        task.move(TaskState.STAGING, sid, f"placed on agent {a.agent_id}: {where.reason}")
        task.agent_id, task.hostname, task.ports = a.agent_id, a.hostname, a.ports
        endpoints, servers, serving = sharing.wire(record, task.task_id, self.queries)
        task.endpoints = dict(a.endpoints) | endpoints
        task.launches += 1
        task.migrate_to = None
        task.epoch = self.epoch_floor = self.epoch_floor + 1
        log.info("[%s] launching %s on agent %s (ports %s): %s", sid, task.mesos_task_id,
                 a.agent_id, a.ports, where.reason)
        data = launch_data(record.query, task, record.control, record.keys)
        data = replace(data, control=self._task_params(record, task.task_id),
                       keys=sharing.with_wiring(data.keys, servers, serving))
        return TaskLaunch(task.mesos_task_id, task.task_id, task.task_id, a.cpus, a.mem_mb,
                          a.ports, messages.encode(data).decode("utf-8"))

    def _retargets(self, sid: str, record: QueryRecord, launched: set[str]) -> list[Command]:
        """The live consumers of channels whose producer was just (re)launched with another
        endpoint than the one they were given learn the new one; every consumer's record keeps
        it (so its own relaunch gets it too)."""
        moved: dict[str, dict[str, str]] = {}  # consumer task id -> {channel id: endpoint}
        for channel in record.query.channels:
            producer = record.tasks.get(channel.producer)
            endpoint = producer.endpoints.get(channel.channel_id) if producer else None
            if channel.producer not in launched or endpoint is None:
                continue
            for consumer_id in channel.consumers:
                consumer = record.tasks.get(consumer_id)
                if consumer is None or consumer_id in launched or \
                        consumer.endpoints.get(channel.channel_id) == endpoint:
                    continue
                consumer.endpoints[channel.channel_id] = endpoint
                moved.setdefault(consumer_id, {})[channel.channel_id] = endpoint
        commands: list[Command] = []
        for consumer_id, endpoints in sorted(moved.items()):
            consumer = record.tasks[consumer_id]
            if not (consumer.state.launched and consumer.agent_id):
                log.info("[%s] task %s is %s; its next launch reads %s", sid, consumer_id,
                         consumer.state.value, endpoints)
                continue
            log.info("[%s] retargeting task %s on agent %s: %s", sid, consumer.mesos_task_id,
                     consumer.agent_id, endpoints)
            commands.append(RetargetChannels(
                sid, consumer.agent_id, self._executor_id(consumer.agent_id), record.query_id,
                consumer.mesos_task_id, tuple(sorted(endpoints.items()))))
        return commands

    def _unplace(self, sid: str, record: QueryRecord) -> list[Command]:
        """The live consumers of a dormant instance slot's channels learn that no writer is
        placed there (`elasticity.unplaced_channels`): a merger stops waiting for it."""
        commands: list[Command] = []
        for consumer_id, channels in elasticity.unplaced_channels(record.query,
                                                                  record.tasks).items():
            consumer = record.tasks[consumer_id]
            for channel in channels:
                consumer.endpoints[channel] = messages.UNPLACED
            if not (consumer.state.launched and consumer.agent_id):
                continue
            log.info("[%s] task %s: channels %s are no longer placed (dormant instances)", sid,
                     consumer_id, ", ".join(channels))
            commands.append(RetargetChannels(
                sid, consumer.agent_id, self._executor_id(consumer.agent_id), record.query_id,
                consumer.mesos_task_id, tuple((c, messages.UNPLACED) for c in channels)))
        return commands

    def _retarget_readers(self, sid: str, writer: QueryRecord,
                          launched: set[str]) -> list[Command]:
        """Other queries' live reader tasks of a published channel whose writer task was just
        (re)launched elsewhere learn where it is (their record keeps it for their launches)."""
        commands: list[Command] = []
        for q, task, channel, endpoint in sharing.reader_tasks(writer, launched, self.queries):
            if task.endpoints.get(channel) == endpoint:
                continue
            task.endpoints[channel] = endpoint
            if task.state.launched and task.agent_id:
                commands.append(RetargetChannels(
                    sid, task.agent_id, self._executor_id(task.agent_id), q.query_id,
                    task.mesos_task_id, ((channel, endpoint),)))
        return commands

    def _readers_changed(self, sid: str, reader: QueryRecord, admit: bool) -> list[Command]:
        """Tell the running writers of what `reader` reads that its tasks come (`admit`) or go:
        a writer then retains for them, or stops retaining (a stopped reader never holds a
        writer back)."""
        commands: list[Command] = []
        for producer, channel, ids in sharing.admissions(reader, self.queries):
            if not producer.agent_id:
                continue
            message = messages.ReadersMessage(
                producer.mesos_task_id, channel, tuple(sorted(ids.items())) if admit else (),
                () if admit else tuple(sorted(ids)))
            commands.append(SendFrameworkMessage(sid, producer.agent_id,
                                                 self._executor_id(producer.agent_id), message))
        return commands

    def _decline(self, sid: str, offer_ids: list[str], reason: str) -> list[Command]:
        for oid in offer_ids:
            self.held.pop(oid, None)
        if not offer_ids:
            return []
        log.info("[%s] declining %s offers: %s", sid, len(offer_ids), reason)
        return [DeclineOffers(sid, tuple(offer_ids), self.config.decline_seconds, reason)]

    def _revive(self, sid: str) -> list[Command]:
        """Ask for offers again, once registered: before, the framework has no id to ask with
        (a REVIVE needs it), and registering revives by itself when tasks are pending."""
        return [ReviveOffers(sid)] if self.connected else []

    def _suppress(self, sid: str) -> Command:
        self.suppressed = True
        return SuppressOffers(sid)

    def _demands(self) -> list[QueryDemand]:
        waiting = sharing.wait_reasons(self.queries)  # readers of an absent writer, once a round
        return [d for d in (self._query_demand(q, waiting) for q in self.queries.values()
                            if q.phase == "active") if d is not None]

    def _query_demand(self, q: QueryRecord, waiting: Mapping[str, str]) -> QueryDemand | None:
        pending = [t for t in q.tasks.values()
                   if t.state is TaskState.PENDING and t.task_id not in waiting]
        if not pending:
            return None
        live = [t for t in q.tasks.values() if t.state.launched and t.agent_id]
        occupied: dict[str, frozenset[str]] = {}
        avoids: dict[str, frozenset[str]] = {}
        for t in live:
            group, agent = t.task.placement.group, t.agent_id
            if agent is None:
                continue  # `live` has an agent each; this tells the type checker
            occupied[agent] = occupied.get(agent, frozenset()) | ({group} if group else set())
            avoids[agent] = avoids.get(agent, frozenset()) | set(t.task.placement.apart_from)
        known = known_endpoints(q.tasks.values(), live)
        return QueryDemand(q.query_id, tuple(self._task_demand(t) for t in pending),
                           occupied, avoids, known)

    def _task_demand(self, t: TaskRecord) -> TaskDemand:
        where = self._destinations(t)
        preferred_ports = dict(zip(t.task.outputs, t.ports)) if t.agent_id else {}
        placement = t.task.placement
        return TaskDemand(
            t.task_id, t.task.resources.cpus, float(t.task.resources.mem_mb), t.task.outputs,
            t.task.inputs, placement.group,
            apart_groups(placement.apart_from, placement.initially_apart_from, t.launches),
            where.allowed, where.preferred, preferred_ports,
            max(0, t.task.resources.ports - len(t.task.outputs)), where.excluded,
            frozenset(t.avoid_ports))

    def _destinations(self, t: TaskRecord) -> Destinations:
        """Where the pending task may go now: its migration target, else by its failover mode
        (`scheduler.destinations`)."""
        if t.migrate_to is not None:
            return Destinations(frozenset({t.migrate_to}), (t.migrate_to,),
                                reason=f"migration from {t.agent_id} to {t.migrate_to}")
        where = destinations_for(
            Past(t.task.failover, t.launches, t.agent_id, t.pending_since), t.attempt, self.now,
            frozenset(self.gone_agents) | frozenset(self.suspected.values()),
            frozenset(self.warm_agents),
            self.config.same_agent_wait, self.config.failover_wait)
        if where.preferred:
            return where
        ranking = self._load_ranking(t, where)
        if ranking is None:
            return where
        return replace(where, preferred=ranking.agents, reason=f"{where.reason}; {ranking.reason}")

    def _load_ranking(self, t: TaskRecord, where: Destinations) -> Ranking | None:
        """For a task of a query that distributes load, the agents it may go to in the order
        their load correlates with its expected load (`scheduler.placement_scores`), once the
        history holds `distribution.min_slots` slots of it; None otherwise."""
        found = self._find(t.task_id)
        if found is None or not found[0].query.distribute:
            return None
        query = found[0]
        live = sorted(set(self.agents) - self.gone_agents - set(self.suspected.values())
                      - where.excluded)
        live = [a for a in live if where.allowed is None or a in where.allowed]
        on: dict[str, list[str]] = {a: [] for a in live}
        for q in self.queries.values():
            for other in q.tasks.values():
                if other.state is TaskState.RUNNING and other.agent_id in on \
                        and other.task_id != t.task_id:
                    on[other.agent_id].append(other.task_id)
        siblings = [s for e in query.query.elastic if t.task_id in e.slots for s in e.slots
                    if s != t.task_id and query.tasks[s].state is TaskState.RUNNING]
        known = [t.task_id] if self.loads.slots(t.task_id, self.now) else siblings
        if not known:
            return None
        series, slots = self.loads.series(known + [x for ts in on.values() for x in ts],
                                          self.now)
        if slots < self.config.distribution.min_slots:
            return None
        predicted = predicted_load(series.get(t.task_id, []),
                                   [] if t.task_id in series else [series[s] for s in siblings])
        agents = {a: [sum(v) for v in zip(*(series[x] for x in ts))] if ts else [0.0] * slots
                  for a, ts in on.items()}
        return ranked_agents(predicted, agents)

    # ---- task status ---------------------------------------------------------------------
    def _on_status_updated(self, ev: StatusUpdated) -> list[Command]:
        parsed = parse_mesos_task_id(ev.mesos_task_id)
        found = self._find(parsed[0]) if parsed else None
        target = FROM_MESOS.get(ev.state)
        if found is None or parsed is None:
            return self._unknown_task(ev, target)
        query, task = found
        if parsed[1] != task.attempt:
            return self._stale_attempt(ev, task, target)
        if target is None or target is task.state:
            return []
        if task.state.terminal:
            log.info("[%s] task %s already %s; ignoring late %s", ev.stimulus_id,
                     ev.mesos_task_id, task.state.value, ev.state)
            return []
        note = f"TASK_{ev.state} {ev.reason} {ev.message}".strip()
        task.move(target, ev.stimulus_id, note)
        log.info("[%s] task %s is %s %s", ev.stimulus_id, ev.mesos_task_id, target.value,
                 ev.message)
        if target.terminal:
            kind = kind_of(ev.message) if target is TaskState.FAILED else "retry"
            undone = self._refuse_pending(ev.stimulus_id, query, task, ev.message) \
                if kind == "refused" else []
            return undone + self._after_terminal(
                ev.stimulus_id, query, task, note,
                infrastructure=ev.reason in INFRASTRUCTURE_REASONS,
                kind="retry" if kind == "refused" else kind) + self._fail_over(ev.stimulus_id)
        if target is TaskState.RUNNING:
            self._relaunched_with_params(query, task)
            return self._readers_again(ev.stimulus_id, query, task)
        return []

    def _readers_again(self, sid: str, writer: QueryRecord, task: TaskRecord) -> list[Command]:
        """A writer task that now runs is told again every other query's live reader of what it
        serves: a readers message sent while it started, before its executor subscribed, was
        dropped by the agent (framework messages are best effort, in Mesos too), and a reader
        never admitted would wait forever (admitting twice changes nothing)."""
        return [SendFrameworkMessage(sid, task.agent_id, self._executor_id(task.agent_id),
                                     messages.ReadersMessage(task.mesos_task_id, channel,
                                                             tuple(sorted(ids.items())), ()))
                for channel, ids in sharing.served_readers(writer, task.task_id, self.queries)
                if task.agent_id]

    def _relaunched_with_params(self, query: QueryRecord, task: TaskRecord) -> None:
        """A task relaunched while a control request waited for it started with the request's
        parameters (its launch carried them): count that as its acknowledgement."""
        for request in list(query.control.requests.values()):
            if request.state == "pending" and request.tasks.get(task.task_id) is None \
                    and task.task_id in request.tasks:
                ctl.acknowledge(query.control, request.request_id, task.task_id,
                                ctl.TaskAnswer(True, -1, 0.0, "applied at its relaunch"),
                                self.now)

    def _unknown_task(self, ev: StatusUpdated, target: TaskState | None) -> list[Command]:
        """A task of no query we know: kill it if it still runs (e.g. left by a lost deploy)."""
        if target is None or target.terminal or self.deferring():
            return []
        if not self.config.kill_unknown_tasks:
            log.warning("[%s] unknown task %s is %s; left alone", ev.stimulus_id,
                        ev.mesos_task_id, ev.state)
            return []
        log.warning("[%s] unknown task %s is %s; killing it", ev.stimulus_id, ev.mesos_task_id,
                    ev.state)
        return [KillTask(ev.stimulus_id, ev.mesos_task_id, ev.agent_id)]

    def _stale_attempt(self, ev: StatusUpdated, task: TaskRecord,
                       target: TaskState | None) -> list[Command]:
        """An update for an attempt that is not the current one: a zombie is killed."""
        log.info("[%s] stale update %s for %s (current attempt %s); ignored", ev.stimulus_id,
                 ev.state, ev.mesos_task_id, task.attempt)
        if target is None or target.terminal or self.deferring():
            return []
        return [KillTask(ev.stimulus_id, ev.mesos_task_id, ev.agent_id)]

    def _after_terminal(self, sid: str, query: QueryRecord, task: TaskRecord, why: str,
                        infrastructure: bool = False,
                        kind: FailureKind = "retry") -> list[Command]:
        """Decide what a task reaching a terminal state means: restart, fail, or settle.
        `infrastructure`: it ended because its executor or agent went away, which is no failure
        of the task and does not count against its restart budget (nor does TASK_LOST).
        `kind` (`common.failures`, from the executor's message): a failure retrying cannot heal
        fails the query at once; a port another program holds relaunches the task at once on
        other ports (`_port_clash`)."""
        if task.retiring and task.kill_requested and query.phase == "active":
            return self._retired(sid, query, task)
        deliberate = task.kill_requested or task.migrate_to is not None
        if task.state is not TaskState.FINISHED and not deliberate:
            task.last_failure, task.last_failure_attempt = why, task.attempt
        if query.phase != "active" or task.state is TaskState.FINISHED or task.kill_requested:
            return self._settle(sid, query)
        if kind == "permanent":
            return self._fail_query(sid, query, f"task {task.task_id} cannot run, and "
                                                f"retrying cannot heal it: {why}")
        if kind == "port":
            return self._port_clash(sid, query, task, why)
        if task.state is not TaskState.LOST and not infrastructure and task.migrate_to is None:
            task.failures += 1
        if task.failures >= self.config.max_attempts:
            reason = (f"task {task.task_id} failed {task.failures} times "
                      f"(max {self.config.max_attempts}); last: {why}")
            return self._fail_query(sid, query, reason)
        if task.task.failover in IMMEDIATE_FAILOVER or task.migrate_to is not None:
            task.restart_at = self.now  # no backoff: `_fail_over` restarts it in this step
            log.info("[%s] task %s fails over (%s) at once (launch %s, %s failures of %s)", sid,
                     task.task_id, task.task.failover, task.launches + 1, task.failures,
                     self.config.max_attempts)
            return []
        task.restart_at = self.now + self._backoff(task.launches)
        log.info("[%s] task %s will restart at %.1f (launch %s, %s failures of %s)", sid,
                 task.task_id, task.restart_at, task.launches + 1, task.failures,
                 self.config.max_attempts)
        return []

    def _port_clash(self, sid: str, query: QueryRecord, task: TaskRecord,
                    why: str) -> list[Command]:
        """The task could not bind a port another program holds: relaunch it at once on other
        ports (never those again), without counting it against its restart budget; the query
        fails after `max_port_clashes` clashes of one task."""
        task.port_clashes += 1
        if task.port_clashes > self.config.max_port_clashes:
            return self._fail_query(sid, query, f"task {task.task_id} found its port taken "
                                                f"{task.port_clashes} times; last: {why}")
        task.avoid_ports |= set(task.ports)
        task.ports = ()  # no preferred ports: the next launch takes free ones
        task.restart_at = self.now
        log.info("[%s] task %s: port %s taken by another program; relaunching it on another "
                 "port (clash %s of at most %s)", sid, task.task_id,
                 ", ".join(map(str, sorted(task.avoid_ports))), task.port_clashes,
                 self.config.max_port_clashes)
        return self._restart_due(sid, lambda t: t is task)

    def _backoff(self, launches: int) -> float:
        c = self.config
        return min(c.backoff_max, c.backoff_initial * c.backoff_factor ** max(0, launches - 1))

    def _settle(self, sid: str, query: QueryRecord) -> list[Command]:
        """Move a query to its final phase once every task of it is terminal."""
        if not query.all_terminal():
            return []
        if query.phase == "stopping":
            query.phase = "stopped"
        elif query.phase == "active" and all(
                t.state in (TaskState.FINISHED, TaskState.DORMANT) for t in query.tasks.values()):
            query.phase = "finished"
        log.info("[%s] query %s is %s", sid, query.query_id, query.phase)
        return [] if self._pending() else [self._suppress(sid)]

    def _fail_query(self, sid: str, query: QueryRecord, reason: str) -> list[Command]:
        log.warning("[%s] query %s failed: %s", sid, query.query_id, reason)
        released = self._readers_changed(sid, query, admit=False)  # before it leaves "active"
        query.phase, query.failure = "failed", reason
        return released + self._stop_tasks(sid, query, "query failed: " + reason)

    def _stop_tasks(self, sid: str, query: QueryRecord, why: str) -> list[Command]:
        commands: list[Command] = []
        for task in query.tasks.values():
            task.restart_at = None
            if task.state in (TaskState.PENDING, TaskState.DORMANT):
                task.move(TaskState.KILLED, sid, why)
            elif task.state.launched:
                task.kill_requested = True
                commands.append(KillTask(sid, task.mesos_task_id, task.agent_id or ""))
        return commands

    # ---- agents and executors ------------------------------------------------------------
    def _on_agent_lost(self, ev: AgentLost) -> list[Command]:
        log.warning("[%s] agent %s lost", ev.stimulus_id, ev.agent_id)
        self.gone_agents.add(ev.agent_id)
        self.warm_agents.discard(ev.agent_id)
        for task in (t for q in self.queries.values() for t in q.tasks.values()
                     if t.migrate_to == ev.agent_id):
            log.warning("[%s] migration of %s to lost agent %s abandoned", ev.stimulus_id,
                        task.task_id, ev.agent_id)
            task.migrate_to = None
        for oid in [o for o, h in self.held.items() if h.offer.agent_id == ev.agent_id]:
            del self.held[oid]
        return self._lose_tasks(ev.stimulus_id, lambda t: t.agent_id == ev.agent_id,
                                f"agent {ev.agent_id} lost")

    def _on_executor_lost(self, ev: ExecutorLost) -> list[Command]:
        log.warning("[%s] executor %s on agent %s lost (status %s)", ev.stimulus_id,
                    ev.executor_id, ev.agent_id, ev.status)
        self.warm_agents.discard(ev.agent_id)
        self.suspected.pop(ev.executor_id, None)  # gone for good: its agent may have a new one
        self.arrivals.pop((ev.executor_id, ev.agent_id), None)
        ours = ev.executor_id == self._executor_id(ev.agent_id)
        return self._lose_tasks(ev.stimulus_id, lambda t: ours and t.agent_id == ev.agent_id,
                                f"executor {ev.executor_id} lost (status {ev.status})")

    def _lose_tasks(self, sid: str, where: Callable[[TaskRecord], bool],
                    why: str) -> list[Command]:
        commands: list[Command] = []
        for query in list(self.queries.values()):
            for task in query.tasks.values():
                if task.state.launched and where(task):
                    task.move(TaskState.LOST, sid, why)
                    commands += self._after_terminal(sid, query, task, why)
        return commands + self._fail_over(sid)  # after every lost task is known lost

    def _on_message_unreadable(self, ev: MessageUnreadable) -> list[Command]:
        log.warning("[%s] unreadable message from %s on %s: %s", ev.stimulus_id,
                    ev.executor_id, ev.agent_id, ev.why)
        return []

    def _on_heartbeat_received(self, ev: HeartbeatReceived) -> list[Command]:
        self.heartbeats[ev.executor_id] = self.now
        key = (ev.executor_id, ev.agent_id)
        if ev.executor_id in self.suspected:
            self.false_suspicions += 1
            log.warning("[%s] executor %s on %s speaks again after it was taken for dead "
                        "(a false suspicion; its tasks were failed over)", ev.stimulus_id,
                        ev.executor_id, ev.agent_id)
            del self.suspected[ev.executor_id]
        if key in self.arrivals:
            self.arrivals[key].record(self.now)
        else:
            self.arrivals[key] = Arrivals(self.now)
        busy: dict[str, float] = {}
        for mid, figs in ev.heartbeat.figures().items():
            parsed = parse_mesos_task_id(mid)
            found = self._find(parsed[0]) if parsed else None
            if found and parsed and found[1].attempt == parsed[1]:
                task = found[1]
                task.routed_pace = elasticity.routed_pace(
                    task.figures.get("routed_ms"), task.figures_at, figs.get("routed_ms"),
                    self.now, task.routed_pace)
                task.figures, task.figures_at = figs, self.now
                self.samples.record(found[1].task_id, sample_of(self.now, found[1].totals()))
                if "busy_ms" in figs:
                    busy[task.task_id] = task.totals()["busy_ms"] / 1000.0
        self.loads.observe(self.now, ev.agent_id, cpu_seconds(ev.heartbeat.usage), busy)
        return self._rescale_steps(ev.stimulus_id)

    # ---- requests ------------------------------------------------------------------------
    def _on_query_submitted(self, ev: QuerySubmitted) -> list[Command]:
        q, sid = ev.query, ev.stimulus_id
        found = admission.problems(q) or admission.unholdable(
            q, {a: s for a, s in self.agent_sizes.items() if a not in self.gone_agents},
            (self.config.executor.cpus, self.config.executor.mem_mb))
        if found:
            return [ReplyToRequest(sid, False, 400, "; ".join(found))]
        old = self.queries.get(q.query_id)
        if old is not None and old.phase in ("active", "stopping"):
            return [ReplyToRequest(sid, False, 409, f"query {q.query_id} is {old.phase}")]
        clash = [t.task_id for t in q.tasks if (f := self._find(t.task_id)) and
                 f[0].query_id != q.query_id]
        if clash:
            return [ReplyToRequest(sid, False, 409, f"task ids in use: {', '.join(clash)}")]
        unkeyed = [t.task_id for t in q.tasks if t.task_id not in ev.keys]
        if ev.keys and unkeyed:
            return [ReplyToRequest(sid, False, 400, "channel keys missing for tasks "
                                                    f"{', '.join(unkeyed)}")]
        shared = sharing.submit_problems(q, self.queries)
        if shared:
            return [ReplyToRequest(sid, False, 400, "; ".join(shared))]
        first = {t: r.attempt + 1 for t, r in old.tasks.items()} if old else {}
        self.queries[q.query_id] = QueryRecord(q, {
            t.task_id: TaskRecord(t, attempt=first.get(t.task_id, 1), pending_since=self.now)
            for t in q.tasks}, source=ev.source, keys={t: dict(k) for t, k in ev.keys.items()})
        record = self.queries[q.query_id]
        self.samples.keep_only(t for query in self.queries.values() for t in query.tasks)
        self.loads.keep_only(t for query in self.queries.values() for t in query.tasks)
        for task_id in sorted(elasticity.dormant_at_start(q)):
            record.tasks[task_id].move(TaskState.DORMANT, sid)
        log.info("[%s] query %s submitted with %s tasks", sid, q.query_id, len(q.tasks))
        self.suppressed = False
        return [ReplyToRequest(sid, True, 200, f"query {q.query_id} accepted"),
                *self._readers_changed(sid, record, admit=True),
                *self._revive(sid)] + self._try_place(sid)

    def _on_query_stop_requested(self, ev: QueryStopRequested) -> list[Command]:
        sid, query = ev.stimulus_id, self.queries.get(ev.query_id)
        if query is None:
            return [ReplyToRequest(sid, False, 404, f"no query {ev.query_id}")]
        if query.phase != "active":
            return [ReplyToRequest(sid, True, 200, f"query {ev.query_id} is {query.phase}")]
        refusal = None if ev.force else sharing.stop_refusal(ev.query_id, self.queries)
        if refusal is not None:
            return [ReplyToRequest(sid, False, 409, refusal)]
        commands = self._readers_changed(sid, query, admit=False)
        query.phase = "stopping"
        log.info("[%s] stopping query %s", sid, ev.query_id)
        commands += self._stop_tasks(sid, query, "query stopped")
        return [ReplyToRequest(sid, True, 200, f"query {ev.query_id} stopping")] + commands + \
            self._settle(sid, query)

    def _on_query_update_requested(self, ev: QueryUpdateRequested) -> list[Command]:
        """Diff the running plan against `ev.query` (`scheduler.update_plan`) and refuse with
        every located problem, answer the diff alone (dry run), or apply it all at once: kept
        tasks run on (the same attempt; producers admit readers that come and drop those that
        go), removed tasks are killed, changed ones switch live by control tuples when every
        difference is a control parameter (`_switch_live`) or are relaunched in place with
        their new program (their checkpoint and their upstream's backup resume them), added
        ones placed. The reply names the attempt that first runs each changed or added task's
        new program (`attempts`) and the control request of the live ones (`live`)."""
        sid, new = ev.stimulus_id, ev.query
        record = self.queries.get(new.query_id)
        if record is None:
            return [ReplyToRequest(sid, False, 404, f"no query {new.query_id}")]
        if record.phase != "active":
            return [ReplyToRequest(sid, False, 409, f"query {new.query_id} is {record.phase}; "
                                                    "only an active query is updated")]
        diff = update_plan.diff_plans(record.query, new)
        problems = admission.problems(new) + update_plan.refusals(
            record.query, new, diff, ev.drop_state, self.queries)
        problems += [f"channel keys missing for added task {t.task_id}"
                     for t in diff.of("added") if ev.keys and t.task_id not in ev.keys]
        body = {"diff": diff.to_json(), "problems": problems}
        if problems:
            return [ReplyToRequest(sid, False, 409, "; ".join(problems), body)]
        if ev.dry_run:
            return [ReplyToRequest(sid, True, 200, f"query {new.query_id}: dry run, nothing "
                                                   "applied", body)]
        commands, live = self._apply_update(sid, record, ev, diff)
        # the attempt that first runs each changed or added task's new program
        switch = {t.task_id: record.tasks[t.task_id].attempt
                  + (1 if record.tasks[t.task_id].migrate_to is not None else 0)
                  for t in diff.tasks if t.change in ("changed", "added")}
        counts = ", ".join(f"{len(diff.of(c))} {c}"
                           for c in ("kept", "changed", "added", "removed"))
        log.info("[%s] query %s updated: %s", sid, new.query_id, counts)
        self.suppressed = False
        return [ReplyToRequest(sid, True, 200, f"query {new.query_id} updated: {counts}",
                               {**body, "attempts": switch, "live": live}),
                *commands, *self._revive(sid)] + self._try_place(sid)

    def _apply_update(self, sid: str, record: QueryRecord, ev: QueryUpdateRequested,
                      diff: update_plan.PlanDiff) -> tuple[list[Command], dict[str, str]]:
        """The update's commands, and the changed tasks switched live by control (task id ->
        the control request)."""
        old, new = record.query, ev.query
        removed = [t.task_id for t in diff.of("removed")]
        added = [t.task_id for t in diff.of("added")]
        live, commands = self._switch_live(sid, record, diff)
        commands += self._imports_changed(sid, record, [i for i in old.imports
                                                        if i.task_id in removed], admit=False)
        for task_id in removed:
            task = record.tasks.pop(task_id)
            record.keys.pop(task_id, None)
            self.unplaced.pop(task_id, None)
            if task.state.launched:
                task.kill_requested = True
                commands.append(KillTask(sid, task.mesos_task_id, task.agent_id or ""))
        for task_id in added:  # before the kept producers admit them with their keys
            if task_id in ev.keys:
                record.keys[task_id] = dict(ev.keys[task_id])
        for t in diff.tasks:
            if t.task_id not in record.tasks:
                continue
            task = record.tasks[t.task_id]
            task.task = new.task(t.task_id)
            if t.change == "changed" and task.state.launched and t.task_id not in live:
                task.migrate_to = task.agent_id  # relaunched at once in place (`_after_terminal`)
                commands.append(KillTask(sid, task.mesos_task_id, task.agent_id or ""))
            elif t.change in ("kept", "changed") and task.state.launched and task.agent_id:
                commands += self._readers_of_kept(sid, record, task, t)
        for task_id in added:
            record.tasks[task_id] = TaskRecord(new.task(task_id), pending_since=self.now)
        record.query = new
        if ev.source is not None:
            record.source = update_plan.updated_source(ev.source, record.source, old, new)
        catalog = new.controls or ControlCatalog()
        for dropped in ctl.drop_respecified(record.control, old.controls or ControlCatalog(),
                                            catalog) + \
                ctl.drop_refused(record.control, catalog, new.query_id):
            log.info("[%s] query %s: %s", sid, new.query_id, dropped)
        self.samples.keep_only(t for q in self.queries.values() for t in q.tasks)
        return commands + self._imports_changed(
            sid, record, [i for i in new.imports if i.task_id in added], admit=True), live

    def _switch_live(self, sid: str, record: QueryRecord, diff: update_plan.PlanDiff
                     ) -> tuple[dict[str, str], list[Command]]:
        """The running changed tasks whose differences are all control parameters switch at a
        micro-batch boundary, as one control request checked against the running plan's
        catalogue (`_on_control_requested`); when it is refused (a task not running, another
        request pending) they are relaunched instead. ({task switched: the control request's
        id}, its commands)."""
        tasks = [t for t in diff.of("changed") if t.live
                 and record.tasks[t.task_id].state is TaskState.RUNNING]
        if not tasks:
            return {}, []
        request = ControlRequested(sid, record.query_id, tuple(x for t in tasks for x in t.live),
                                   update_request_id(record.query_id, sid))
        out = self._on_control_requested(request)
        reply = next(c for c in out if isinstance(c, ReplyToRequest))
        if not reply.accepted:
            log.info("[%s] update of %s: the live switch was refused (%s); relaunching "
                     "instead", sid, record.query_id, reply.message)
            return {}, []
        log.info("[%s] update of %s: %s switch live by control %s", sid, record.query_id,
                 ", ".join(t.task_id for t in tasks), request.request_id)
        return ({t.task_id: request.request_id for t in tasks},
                [c for c in out if not isinstance(c, ReplyToRequest)])

    def _readers_of_kept(self, sid: str, record: QueryRecord, task: TaskRecord,
                         change: update_plan.TaskDiff) -> list[Command]:
        """A kept producer admits the reader tasks that come and drops those that go."""
        commands: list[Command] = []
        for channel in sorted({c for c, _ in change.readers_added + change.readers_dropped}):
            add = tuple(sorted((sharing.reader_id(r, channel),
                                record.keys.get(r, {}).get("public", ""))
                               for c, r in change.readers_added if c == channel))
            drop = tuple(sorted(sharing.reader_id(r, channel)
                                for c, r in change.readers_dropped if c == channel))
            commands.append(SendFrameworkMessage(
                sid, task.agent_id or "", self._executor_id(task.agent_id or ""),
                messages.ReadersMessage(task.mesos_task_id, channel, add, drop)))
        return commands

    def _imports_changed(self, sid: str, record: QueryRecord, imports: list[Any],
                         admit: bool) -> list[Command]:
        """Writers of other queries' streams admit (or drop) the reader tasks an update adds
        (or removes)."""
        if not imports:
            return []
        view = replace(record, query=replace(record.query, imports=tuple(imports)))
        return self._readers_changed(sid, view, admit)

    def _on_control_requested(self, ev: ControlRequested) -> list[Command]:
        """Check every tuple against the query's catalogue, and that every task they change
        runs; then record the new parameters (later launches carry them) and send each task
        its new set. Refused as a whole, touching nothing, when any check fails."""
        sid, query = ev.stimulus_id, self.queries.get(ev.query_id)
        if query is None:
            return [ReplyToRequest(sid, False, 404, f"no query {ev.query_id}")]
        if query.phase != "active":
            return [ReplyToRequest(sid, False, 409, f"query {ev.query_id} is {query.phase}")]
        catalog = query.query.controls or ControlCatalog()
        try:
            changes = check_tuples(catalog, ev.query_id, list(ev.tuples))
        except ControlRefused as exc:
            log.info("[%s] control of %s refused: %s", sid, ev.query_id, exc)
            return [ReplyToRequest(sid, False, exc.status, str(exc),
                                   {"problems": exc.problems, "query_id": ev.query_id})]
        changes = [c for c in changes if not ctl.in_force(query.control, c)]
        if not changes:
            done = ctl.settled_at_once(query.control, ev.request_id, [], self.now)
            return [ReplyToRequest(sid, True, 200, "every value is already in force; nothing "
                                                   "to apply", done.to_json())]
        targets = sorted({t.task_id for c in changes for t in c.adjustable.targets})
        busy = [f"{t} is {query.tasks[t].state.value}" for t in targets
                if query.tasks[t].state is not TaskState.RUNNING or query.tasks[t].migrate_to]
        pending = [r.request_id for r in query.control.requests.values() if r.state == "pending"
                   and set(r.tasks) & set(targets)]
        draining = [f"{t.task_id} of {e.operator} is still draining after a scale-in"
                    for e in query.query.elastic if e.stateful
                    and any(c.adjustable.operator == e.operator for c in changes)
                    for t in (query.tasks[s] for s in e.slots) if t.retiring]
        busy += draining
        if busy or pending:
            why = "; ".join(busy) or f"request {pending[0]} is still being applied"
            return [ReplyToRequest(sid, False, 409, f"control of {ev.query_id} refused: {why}; "
                                                    "try again when it runs",
                                   {"problems": [why], "query_id": ev.query_id})]
        before = {e.operator: elasticity.parallelism(e, query.control) for e in query.query.elastic}
        request = ctl.begin(query.control, ev.request_id, changes, self.now)
        self._note_rescales(query, request, before, ev.trigger)
        starting = elasticity.growing(query.query, before, query.control)
        if starting:  # the splitters switch once the new instances run
            query.elastic.deferred[request.request_id] = starting
            log.info("[%s] %s: %s start first; the splitters switch once they run", sid,
                     ev.query_id, ", ".join(starting))
        log.info("[%s] control %s of %s (version %s): %s -> tasks %s", sid, request.request_id,
                 ev.query_id, request.version, request.tuples, targets)
        return [ReplyToRequest(sid, True, 202, f"control {request.request_id} sent to "
                                              f"{', '.join(targets)}", request.to_json())] + \
            [self._send_params(sid, query, query.tasks[t], request.request_id) for t in targets
             if request.request_id not in query.elastic.deferred] + \
            self._rescale_steps(sid, query)

    def _send_params(self, sid: str, query: QueryRecord, task: TaskRecord,
                     request_id: str) -> Command:
        """A task's whole parameter set, as a framework message to its executor."""
        params = self._task_params(query, task.task_id, request_id)
        return SendFrameworkMessage(sid, task.agent_id or "", self._executor_id(task.agent_id or ""),
                                    ControlMessage(task.mesos_task_id, request_id, params.version,
                                                   params.params))

    def _task_params(self, query: QueryRecord, task_id: str,
                     request_id: str | None = None) -> ParamSet:
        """The parameters in force for a task; a join's splitters get the event time to switch
        at with their new parallelism, the same for all of them: planned at the first message
        of `request_id` from their latest heartbeats, and given again to a splitter launched
        while that request is pending (None: any pending one)."""
        params = query.control.param_set(task_id)
        sent = params.params
        for e in query.query.elastic:
            if not e.planned_spreads or task_id not in {t for t, _ in e.splitters}:
                continue
            pending = [r for r in query.control.requests.values() if r.state == "pending"
                       and (request_id is None or r.request_id == request_id)
                       and any((o, p) == (e.operator, PARALLELISM) for o, p, _ in r.tuples)]
            for request in pending:
                at = query.elastic.planned.setdefault(request.request_id, elasticity.planned_switch(
                    e, query.tasks, elasticity.last_switch(query.elastic, e.operator)))
                sent = elasticity.planned_params(e, task_id, sent, at)
        return ParamSet(params.version, sent)

    def _on_control_acknowledged(self, ev: ControlAcknowledged) -> list[Command]:
        """One task's answer to a control request; a refusal undoes the request on every task
        it reached, so the query runs on with its old parameters everywhere."""
        sid, ack = ev.stimulus_id, ev.ack
        parsed = parse_mesos_task_id(ack.task)
        found = self._find(parsed[0]) if parsed else None
        if found is None or parsed is None or parsed[1] != found[1].attempt:
            return []  # an older attempt's answer: the new one was launched with the request
        query, task = found
        answer = ctl.TaskAnswer(ack.applied, ack.epoch, ack.pause_s, ack.message, ack.at,
                                dict(ack.detail))
        return self._answered(sid, query, task, ack.request, answer)

    def _refuse_pending(self, sid: str, query: QueryRecord, task: TaskRecord,
                        why: str) -> list[Command]:
        """A task failed at its launch refusing the parameters of the requests pending for it
        (a join's splitter that routed past the planned switch before it died): each counts
        as refused by it and is undone everywhere, so its relaunch takes the old ones."""
        commands: list[Command] = []
        for request in list(query.control.requests.values()):
            if request.state == "pending" and task.task_id in request.tasks:
                commands += self._answered(sid, query, task, request.request_id,
                                           ctl.TaskAnswer(False, -1, 0.0, why, self.now))
        return commands

    def _answered(self, sid: str, query: QueryRecord, task: TaskRecord, request_id: str,
                  answer: ctl.TaskAnswer) -> list[Command]:
        """Record `task`'s answer to a control request; a refusal undoes the request on every
        other task it reached."""
        request = ctl.acknowledge(query.control, request_id, task.task_id, answer, self.now)
        if request is None:
            return []
        log.info("[%s] control %s on %s: %s", sid, request.request_id, task.task_id,
                 f"from batch {answer.epoch}" if answer.applied else f"refused: {answer.message}")
        self._settle_rescales(query, request)
        if request.state != "refused" or answer.applied:
            return self._rescale_steps(sid, query)
        resend = ctl.undo(query.control, request)
        if all(a is not None and not a.applied for a in request.tasks.values()):
            for slot in elasticity.never_launched_beyond(query.query, query.tasks, query.control):
                slot.move(TaskState.DORMANT, sid, f"scale-out {request.request_id} refused")
        undo_id = f"{request.request_id}-undo"
        return [self._send_params(sid, query, query.tasks[t], undo_id) for t in resend
                if t != task.task_id and query.tasks[t].state.launched] + \
            self._unplace(sid, query) + self._rescale_steps(sid, query)

    def _on_task_migration_requested(self, ev: TaskMigrationRequested) -> list[Command]:
        """Quiesce the task (a graceful kill: its query stops after its current micro-batch and
        its channel writers close), then relaunch it on the target agent at once, where it
        resumes from its checkpoint and channel logs on shared storage (its state replicated);
        its consumers are retargeted to it (its inputs redirected). Refused, touching nothing,
        when the query, task or agent is unknown, the task is not running, or the target already
        holds it or a group it must be kept apart from."""
        sid = ev.stimulus_id
        refusal = self._migration_refusal(ev)
        if refusal is not None:
            log.info("[%s] migration of %s refused: %s", sid, ev.task_id, refusal[1])
            return [ReplyToRequest(sid, False, *refusal)]
        task = self.queries[ev.query_id].tasks[ev.task_id]
        task.migrate_to = ev.agent_id
        log.info("[%s] migrating %s from agent %s to %s", sid, task.mesos_task_id,
                 task.agent_id, ev.agent_id)
        return [ReplyToRequest(sid, True, 202, f"task {ev.task_id} moves from agent "
                                              f"{task.agent_id} to {ev.agent_id}"),
                KillTask(sid, task.mesos_task_id, task.agent_id or "")]

    def _migration_refusal(self, ev: TaskMigrationRequested) -> tuple[int, str] | None:
        query = self.queries.get(ev.query_id)
        if query is None:
            return 404, f"no query {ev.query_id}"
        task = query.tasks.get(ev.task_id)
        if task is None:
            return 404, f"query {ev.query_id} has no task {ev.task_id} (its tasks: " \
                        f"{', '.join(sorted(query.tasks))})"
        if query.phase != "active" or task.state is not TaskState.RUNNING or task.migrate_to:
            what = f"moving to {task.migrate_to}" if task.migrate_to else task.state.value
            return 409, f"task {ev.task_id} is {what} (query {query.phase}); only a running " \
                        "task can move"
        known = set(self.agents) - self.gone_agents
        if ev.agent_id not in known:
            return 404, f"no agent {ev.agent_id} (agents: {', '.join(sorted(known)) or 'none'})"
        if ev.agent_id == task.agent_id:
            return 400, f"task {ev.task_id} already runs on agent {ev.agent_id}"
        clash = self._apart_clash(query, task, ev.agent_id)
        if clash:
            return 409, f"task {ev.task_id} must be kept apart from {', '.join(clash)}, which " \
                        f"run on agent {ev.agent_id}"
        return None

    def _apart_clash(self, query: QueryRecord, task: TaskRecord, agent_id: str) -> list[str]:
        """Tasks on `agent_id` that `task` must not share an agent with (either way round)."""
        group = task.task.placement.group
        return sorted(t.task_id for t in query.tasks.values()
                      if t is not task and t.state.launched and t.agent_id == agent_id
                      and ((t.task.placement.group or t.task_id) in task.task.placement.apart_from
                           or (group is not None and group in t.task.placement.apart_from)))

    # ---- elasticity (scheduler.elasticity) -------------------------------------------------
    def _note_rescales(self, query: QueryRecord, request: ctl.ControlRequest,
                       before: dict[str, int], trigger: str) -> None:
        for e in query.query.elastic:
            after = elasticity.parallelism(e, query.control)
            if after != before[e.operator]:
                query.elastic.record(elasticity.Rescale(
                    e.operator, before[e.operator], after, trigger, request.request_id,
                    self.now))
                log.info("[%s] %s: %s scales from %s to %s instances (%s)", request.request_id,
                         query.query_id, e.operator, before[e.operator], after, trigger)

    def _settle_rescales(self, query: QueryRecord, request: ctl.ControlRequest) -> None:
        if request.state == "pending":
            return
        query.elastic.planned.pop(request.request_id, None)
        for rescale in query.elastic.rescales:
            if rescale.request == request.request_id and rescale.state == "pending":
                rescale.state, rescale.applied_at = request.state, self.now
                pauses = [a.pause_s for a in request.tasks.values() if a is not None]
                rescale.pause_s = max(pauses, default=0.0)
                switches = [int(a.detail["switch_ms"]) for a in request.tasks.values()
                            if a is not None and "switch_ms" in a.detail]
                rescale.switch_ms = max(switches) if switches else None
                rescale.reason = rescale.reason or request.reason

    def _rescale_steps(self, sid: str, only: QueryRecord | None = None) -> list[Command]:
        """Keep elastic operators' slots in line with their parallelism: launch activated
        slots, stop retiring instances once drained."""
        if self.deferring():
            return []
        commands: list[Command] = []
        activated = False
        for query in [only] if only is not None else list(self.queries.values()):
            if query.phase != "active" or not query.query.elastic:
                continue
            commands += self._undefer(sid, query)
            steps = elasticity.reconcile(query.query, query.tasks, query.control, query.elastic,
                                         self.now)
            for note in steps.notes:
                log.info("[%s] %s: %s", sid, query.query_id, note)
            for task in steps.deactivate:
                task.move(TaskState.DORMANT, sid, "scaled in again before it was launched")
            for task in steps.activate:
                task.move(TaskState.PENDING, sid)
                task.attempt += 1
                task.pending_since, task.kill_requested = self.now, False
                task.carry()
                activated = True
            for task in steps.stop:
                log.info("[%s] %s drained; stopping it", sid, task.mesos_task_id)
                task.kill_requested = True
                commands.append(KillTask(sid, task.mesos_task_id, task.agent_id or ""))
        if activated:
            self.suppressed = False
            commands += self._revive(sid) + self._try_place(sid)
        return commands

    def _undefer(self, sid: str, query: QueryRecord) -> list[Command]:
        """Send each deferred scale-out to its splitters once its new instances run."""
        commands: list[Command] = []
        for request_id, waits in list(query.elastic.deferred.items()):
            request = query.control.requests.get(request_id)
            if request is None or request.state != "pending":
                del query.elastic.deferred[request_id]
                continue
            if not elasticity.ready(waits, query.tasks):
                if self.now - request.asked_at >= self.config.scale_out_wait:
                    commands += self._scale_out_expired(sid, query, request, waits)
                continue
            del query.elastic.deferred[request_id]
            log.info("[%s] %s: %s run; switching the splitters (control %s)", sid,
                     query.query_id, ", ".join(waits), request_id)
            commands += [self._send_params(sid, query, query.tasks[t], request_id)
                         for t in request.tasks if query.tasks[t].state.launched]
        return commands

    def _scale_out_expired(self, sid: str, query: QueryRecord, request: ctl.ControlRequest,
                           waits: tuple[str, ...]) -> list[Command]:
        """A deferred scale-out whose new instances did not all run within `scale_out_wait`
        (no agent had room, or they kept failing to start): refused with what each waits for,
        and undone. Its splitters never heard of it, so nothing was routed to the new slots:
        a pending one goes dormant again (`reconcile`), a launched one is stopped at once."""
        del query.elastic.deferred[request.request_id]
        late = [t for t in waits if query.tasks[t].state is not TaskState.RUNNING]
        why = "; ".join(f"{t} waits for {self.unplaced[t]}" if t in self.unplaced
                        else f"{t} is {query.tasks[t].state.value}" for t in late)
        if any(t in self.unplaced for t in late):
            query.shed.refused_for_room_at = self.now  # no capacity can be added: may shed
        ctl.refuse(request, f"its new instances did not run within "
                            f"{self.config.scale_out_wait:g} s ({why}); the scale-out is undone",
                   self.now)
        log.warning("[%s] %s: control %s %s", sid, query.query_id, request.request_id,
                    request.reason)
        ctl.undo(query.control, request)
        self._settle_rescales(query, request)  # the policy's cool-down counts from now
        commands: list[Command] = []
        for task in (query.tasks[t] for t in waits):
            if task.state.launched and not task.kill_requested:
                task.retiring = task.kill_requested = True
                commands.append(KillTask(sid, task.mesos_task_id, task.agent_id or ""))
        return commands

    def _live_agents(self) -> int:
        return len(set(self.agents) - self.gone_agents - set(self.suspected.values()))

    def _auto_scale(self, sid: str) -> list[Command]:
        """Let the policy (`scheduler.elastic_policy`) decide on every automatic operator that
        is not being rescaled; a decision to move becomes a control request of trigger auto."""
        if self.deferring():
            return []
        commands: list[Command] = []
        for query in list(self.queries.values()):
            if query.phase != "active":
                continue
            for e in query.query.elastic:
                view = elasticity.auto_view(e, query.tasks, query.control, query.elastic,
                                            self.samples, query.query_id, self.now)
                if view is None:
                    continue
                policy = elasticity.policy_of(e, self._live_agents())
                decision = decide(view, policy, self.now)
                query.elastic.decide(decision, self.now)
                if decision.kind == "hold":
                    continue
                log.info("[%s] %s: automatic elasticity: %s", sid, query.query_id,
                         decision.explanation)
                asked = ControlRequested(sid, query.query_id, (
                    (e.operator, PARALLELISM, str(decision.target)),),
                    auto_request_id(query.query_id, query.control.version, self.now),
                    trigger="auto")
                replies = self._on_control_requested(asked)
                for c in replies:
                    if isinstance(c, ReplyToRequest) and not c.accepted:
                        log.warning("[%s] %s: automatic rescale of %s refused (asked again "
                                    "in %g s at the earliest): %s", sid, query.query_id,
                                    e.operator, elasticity.REFUSED_BACKOFF_SECONDS, c.message)
                        query.elastic.backoff_until[e.operator] = \
                            self.now + elasticity.REFUSED_BACKOFF_SECONDS
                for rescale in query.elastic.rescales[-1:]:
                    if rescale.request == asked.request_id:
                        rescale.reason = decision.explanation
                commands += [c for c in replies if not isinstance(c, ReplyToRequest)]
            commands += self._shed(sid, query)
        return commands

    def _shed(self, sid: str, query: QueryRecord) -> list[Command]:
        """Let the shedding policy (`scheduler.shed_policy`) decide on a query with drop
        operators, at most every `config.shedding.every_seconds` and not while a control
        request to its drop tasks is pending; ratios to change become one control request of
        trigger `shed`."""
        drops = drop_operators(query.query)
        record = query.shed
        if not drops or (record.decided_at is not None and
                         self.now - record.decided_at < self.config.shedding.every_seconds):
            return []
        tasks = {task for task, _ in drops.values()}
        if any(r.state == "pending" and set(r.tasks) & tasks
               for r in query.control.requests.values()):
            return []
        decision = self._guarded_shed_decision(sid, query)
        record.decide(decision, self.now)
        if not decision.tuples:
            return []
        log.info("[%s] %s: load shedding: %s", sid, query.query_id, decision.explanation)
        asked = ControlRequested(sid, query.query_id, uniform_tuples(
            decision.tuples, {name: semantic for name, (_, semantic) in drops.items()}),
            shed_request_id(query.query_id, query.control.version, self.now), trigger="shed")
        replies = self._on_control_requested(asked)
        if any(isinstance(c, ReplyToRequest) and not c.accepted for c in replies):
            refusal = next(c for c in replies if isinstance(c, ReplyToRequest))
            log.warning("[%s] %s: load shedding's ratios refused: %s", sid, query.query_id,
                        refusal.message)
        else:
            record.last_change, record.changes = self.now, record.changes + 1
            record.quality = dict(decision.quality) if decision.kind == "shed" else {}
        return [c for c in replies if not isinstance(c, ReplyToRequest)]

    def _guarded_shed_decision(self, sid: str, query: QueryRecord) -> ShedDecision:
        """`_shed_decision`, or a hold that names the error it raised: a fault in the shedding
        decision (a figure the problem refuses) must not end the tick, whose rescales,
        automatic elasticity and load distribution for every query would go with it."""
        try:
            return self._shed_decision(query)
        except Exception as exc:  # noqa: BLE001 (any fault of the decision: logged, held)
            log.exception("[%s] %s: load shedding's decision failed; holding", sid,
                          query.query_id)
            return ShedDecision("hold", "error", f"the decision failed, holding: "
                                f"{type(exc).__name__}: {exc}")

    def _shed_decision(self, query: QueryRecord) -> ShedDecision:
        """The shedding policy's decision for a query, on the problem built from its running
        tasks' recent rates and each agent's capacity left by the other queries' tasks."""
        if not any(e.mode == "auto" for e in query.query.elastic):
            return ShedDecision("hold", "manual", "no automatic operator: shedding starts only "
                                "where the elastic policy holds at its bound or a scale-out is "
                                "refused for lack of room; ratios may be set by hand (elastiq "
                                "control)")
        running = {t.task_id: t.agent_id or "" for t in query.tasks.values()
                   if t.state is TaskState.RUNNING}
        rates = {t: r for t in running if (r := self._task_rates(t)) is not None}
        drop_tasks = {task for task, _ in drop_operators(query.query).values()}
        query.shed.observe_unshed(drop_tasks, rates)
        current = shed_state.ratios_in_force(query.query, query.control)
        shedding = any(v > 0 for v in current.values())
        query.shed.observe_saturation(rates, shedding)
        problem = problem_of(query.query, running, rates, self._capacity_for(query),
                             query.shed.unshed_for(rates), query.shed.last_costs,
                             query.shed.held_for(shedding))
        if not isinstance(problem, str):
            query.shed.observe_costs(problem, rates)
        can_add = not cannot_add_capacity(list(query.elastic.latest.values()),
                                          query.shed.refused_for_room(self.now),
                                          shedding and self._at_bound(query))
        if isinstance(problem, str):
            release = tuple((k.rsplit(".", 1)[0], k.rsplit(".", 1)[1], "0")
                            for k, v in sorted(current.items()) if v > 0 and can_add)
            return ShedDecision("release" if release else "hold",
                                "can_scale" if release else "no_data",
                                f"capacity can be added again ({problem})" if release
                                else f"no shedding problem: {problem}", release)
        return decide_shedding(problem, can_add, current, self.config.shedding, self.now,
                               query.shed.last_change)

    def _at_bound(self, query: QueryRecord) -> bool:
        """An automatic operator of the query runs at the largest parallelism its policy allows
        (its max-parallelism, or as many instances as there are agents)."""
        agents = self._live_agents()
        return any(elasticity.parallelism(e, query.control) >=
                   elasticity.policy_of(e, agents).max_parallelism
                   for e in query.query.elastic if e.mode == "auto")

    def _task_rates(self, task_id: str) -> TaskRates | None:
        """A task's rates over the shedding's window, with its cpu over the same window (its
        agent's cgroup cpu split by busy time, `LoadHistory.measured`) where it was measured."""
        since = self.now - shed_state.RATES_WINDOW_SECONDS
        return rates_of(self.samples.samples(task_id), shed_state.RATES_WINDOW_SECONDS, self.now,
                        self.loads.measured(task_id, since))

    def _capacity_for(self, query: QueryRecord) -> dict[str, float]:
        """Each known agent's CPUs (its largest offer with nothing of ours on it) less what the
        other queries' running tasks there use (their cpu where measured, else busy time)."""
        capacity = {a: size[0] for a, size in self.agent_sizes.items()
                    if a not in self.gone_agents}
        for other in self.queries.values():
            if other is query:
                continue
            for t in other.tasks.values():
                if t.state is TaskState.RUNNING and t.agent_id in capacity:
                    rates = self._task_rates(t.task_id)
                    capacity[t.agent_id] -= rates.load if rates is not None else 0.0
        return capacity

    def _retired(self, sid: str, query: QueryRecord, task: TaskRecord) -> list[Command]:
        """A retiring instance stopped after draining: its slot is dormant until a scale-out."""
        task.move(TaskState.DORMANT, sid, f"retired by a scale-in once drained "
                                          f"(ended {task.state.value})")
        task.retiring = task.kill_requested = False
        query.elastic.drained_at.pop(task.task_id, None)
        for e in query.query.elastic:
            last = query.elastic.last(e.operator)
            if task.task_id in e.slots and last is not None and all(
                    query.tasks[t].state is TaskState.DORMANT
                    for t in e.slots[elasticity.parallelism(e, query.control):]):
                last.retired_at = self.now
        return self._unplace(sid, query)

    # ---- load distribution (scheduler.distributor, docs/load.md) ----------------------------
    def _distribute(self, sid: str) -> list[Command]:
        """Every `distribution.period_seconds`, while an active query says distribute="true":
        one round of the load distributor over the running tasks of every live agent; each move
        it chooses starts with the migration protocol (`_on_task_migration_requested`), the
        one `elastiq migrate` uses, and is counted (`distribution_state`)."""
        settings, record = self.config.distribution, self.distribution
        if self.deferring() or not any(q.phase == "active" and q.query.distribute
                                       for q in self.queries.values()):
            return []
        if record.round_at is not None and self.now - record.round_at < settings.period_seconds:
            return []
        view = self._distribution_view()
        loads, slots = self.loads.series([t for ts in view.placed.values() for t in ts],
                                         self.now)
        decision = decide_distribution(
            view, loads, slots, settings, self.now, record.task_moved_at, record.pair_moved_at,
            [t for t in loads if len(self.loads.slots(t, self.now)) < settings.min_slots])
        record.decide(decision, self.now)
        if decision.kind == "hold":
            log.debug("[%s] load distribution holds (%s): %s", sid, decision.reason,
                      decision.explanation)
            return []
        log.info("[%s] load distribution: %s", sid, decision.explanation)
        commands: list[Command] = []
        for move in decision.moves:
            found = self._find(move.task)
            query_id = found[0].query_id if found is not None else ""
            replies = self._on_task_migration_requested(
                TaskMigrationRequested(sid, query_id, move.task, move.target))
            refusal = next((c.message for c in replies
                            if isinstance(c, ReplyToRequest) and not c.accepted), "")
            if refusal:
                log.warning("[%s] load distribution's move of %s refused: %s", sid, move.task,
                            refusal)
            record.record(distribution_state.MoveRecord(
                query_id, move.task, move.source, move.target, move.score, self.now,
                not refusal, refusal))
            commands += [c for c in replies if not isinstance(c, ReplyToRequest)]
        return commands

    def _distribution_view(self) -> DistributionView:
        """The running tasks on every live agent (every query's: all of them load it), those
        that may move (their query opted in and is not rescaling, migrating or restarting a
        task), each task's resources, each agent's free resources (its size less our executor's
        share and the tasks launched there or on their way) and the agents apart groups keep a
        movable task from."""
        live = sorted(set(self.agents) - self.gone_agents - set(self.suspected.values()))
        placed: dict[str, list[str]] = {a: [] for a in live}
        movable: set[str] = set()
        demand: dict[str, tuple[float, float]] = {}
        used: dict[str, tuple[float, float]] = {}
        for q in self.queries.values():
            settled = q.phase == "active" and q.query.distribute and self._settled(q)
            for t in q.tasks.values():
                share = (t.task.resources.cpus, float(t.task.resources.mem_mb))
                demand[t.task_id] = share
                for agent in {a for a in (t.agent_id if t.state.launched else None,
                                          t.migrate_to) if a is not None}:
                    cpus, mem = used.get(agent, (0.0, 0.0))
                    used[agent] = (cpus + share[0], mem + share[1])
                if t.state is TaskState.RUNNING and t.agent_id in placed:
                    placed[t.agent_id].append(t.task_id)
                    if settled and not (t.retiring or t.kill_requested):
                        movable.add(t.task_id)
        executor = self.config.executor
        free = {a: (self.agent_sizes[a][0] - executor.cpus - used.get(a, (0.0, 0.0))[0],
                    self.agent_sizes[a][1] - executor.mem_mb - used.get(a, (0.0, 0.0))[1])
                for a in live if a in self.agent_sizes}
        return DistributionView(placed, frozenset(movable), demand, free,
                                self._apart_forbidden(movable))

    def _apart_forbidden(self, movable: set[str]) -> frozenset[tuple[str, str]]:
        """(movable task, agent) where a launched task of its query keeps it away: the rule
        `elastiq migrate` applies (`_apart_clash`), over the agents the query's tasks are on."""
        out: set[tuple[str, str]] = set()
        for q in self.queries.values():
            agents = {t.agent_id for t in q.tasks.values() if t.state.launched and t.agent_id}
            out |= {(t.task_id, a) for t in q.tasks.values() if t.task_id in movable
                    for a in agents if a != t.agent_id and self._apart_clash(q, t, a)}
        return frozenset(out)

    def _settled(self, query: QueryRecord) -> bool:
        """No rescale, migration, restart or control request of the query is under way."""
        return not query.elastic.deferred and not any(
            r.state == "pending" for r in query.control.requests.values()) and all(
            t.migrate_to is None and not t.retiring and t.restart_at is None
            and t.state in (TaskState.RUNNING, TaskState.DORMANT, TaskState.FINISHED)
            for t in query.tasks.values())

    # ---- leadership ----------------------------------------------------------------------
    def _on_leadership_gained(self, ev: LeadershipGained) -> list[Command]:
        """Restore the persisted queries BEFORE registering, so reconciliation knows them."""
        self.leadership = ev.leadership
        self.framework_id = ev.framework_id or self.framework_id
        restored = [restore_query(q, s, p, self.now) for q, s, p in ev.queries]
        for record in restored:
            self.queries[record.query_id] = record
            self.epoch_floor = max([self.epoch_floor] + [t.epoch for t in record.tasks.values()])
        log.info("[%s] leading in epoch %s; restored %s queries (framework %s)", ev.stimulus_id,
                 ev.leadership.epoch, len(restored), self.framework_id)
        return [ReplyToRequest(ev.stimulus_id, True, 200, f"restored {len(restored)} queries")]

    def _on_leadership_updated(self, ev: LeadershipUpdated) -> list[Command]:
        self.leadership = ev.leadership
        log.info("[%s] leadership is now %s (epoch %s)", ev.stimulus_id, ev.leadership.role,
                 ev.leadership.epoch)
        if ev.leadership.role == "standby":  # the next leader owns the queries now
            self.queries, self.held, self.unplaced = {}, {}, {}
            self.framework_id, self.master, self.connected = None, None, False
            self.warm_agents, self.gone_agents, self.heartbeats = set(), set(), {}
            self.arrivals, self.suspected = {}, {}
        elif ev.leadership.role == "leader" and self._pending():
            self.suppressed = False
            return self._revive(ev.stimulus_id)
        return []

    def _on_fenced_request(self, ev: FencedRequest) -> list[Command]:
        if self.leadership is not None:
            verdict = check_epoch(self.leadership, ev.epoch)
            if not verdict.accepted:
                log.info("[%s] refused %s: %s", ev.stimulus_id, type(ev.request).__name__,
                         verdict.message)
                return [ReplyToRequest(ev.stimulus_id, False, verdict.status, verdict.message)]
        return self.handle(ev.request)

    # ---- time ----------------------------------------------------------------------------
    def _on_tick(self, ev: Tick) -> list[Command]:
        self.now = ev.now
        sid = ev.stimulus_id
        commands = self._detect_silent_executors(sid) + self._restart_due(sid) + \
            self._rescale_steps(sid) + self._auto_scale(sid) + self._distribute(sid)
        if self.held and self._pending():
            commands += self._try_place(sid)  # time may have widened where tasks may go
        expired = [oid for oid, h in self.held.items()
                   if self.now - h.received_at >= self.config.offer_hold_seconds]
        for reason in sorted({self.held[o].reason for o in expired}):
            commands += self._decline(sid, [o for o in expired if self.held[o].reason == reason],
                                      reason)
        if self.connected and self.now - self.last_reconcile >= self.config.reconcile_interval:
            commands += self._periodic_reconcile(sid)
        return commands

    def _detect_silent_executors(self, sid: str) -> list[Command]:
        """Executors the failure detector takes for dead while tasks of ours run there: their
        tasks are lost (and fail over), each attempt is killed, the executor shut down through
        Mesos (a wedged process keeps its tasks RUNNING on real Mesos)."""
        settings = self.config.detector
        if settings.threshold is None or self.deferring():
            return []
        commands: list[Command] = []
        for (executor_id, agent_id), arrivals in list(self.arrivals.items()):
            running = [t for q in self.queries.values() for t in q.tasks.values()
                       if t.state.launched and t.agent_id == agent_id]
            if not running or executor_id in self.suspected \
                    or not suspected(arrivals, self.now, settings):
                continue
            silent = self.now - arrivals.last
            why = (f"executor {executor_id} on {agent_id} silent for {silent:.1f}s "
                   f"(phi {phi(arrivals, self.now, settings):.1f} > {settings.threshold})")
            log.warning("[%s] %s: failing over %s", sid, why, [t.task_id for t in running])
            self.suspicions += 1
            self.suspected[executor_id] = agent_id
            del self.arrivals[(executor_id, agent_id)]
            self.warm_agents.discard(agent_id)
            commands += [KillTask(sid, t.mesos_task_id, agent_id) for t in running]
            commands.append(ShutdownExecutor(sid, executor_id, agent_id, why))
            lost = {id(t) for t in running}
            commands += self._lose_tasks(sid, lambda t: id(t) in lost, why)
        return commands

    def _fail_over(self, sid: str) -> list[Command]:
        """Restart the standby, checkpoint and replica tasks that just ended, and a migrating
        task once it stopped, in the same step."""
        return self._restart_due(sid, lambda t: t.task.failover in IMMEDIATE_FAILOVER
                                 or t.migrate_to is not None)

    def _restart_due(self, sid: str,
                     which: Callable[[TaskRecord], bool] = lambda t: True) -> list[Command]:
        if self.deferring():
            return []
        due = [(q, t) for q in self.queries.values() for t in q.tasks.values()
               if t.restart_at is not None and t.restart_at <= self.now and which(t)]
        for query, task in due:
            kind = f"{task.task.failover} failover" if task.task.failover else "restart"
            task.move(TaskState.PENDING, sid, f"{kind} after: {task.last_failure}")
            task.attempt += 1
            task.restart_at, task.kill_requested, task.pending_since = None, False, self.now
            task.carry()
        if not due:
            return []
        self.suppressed = False
        return self._revive(sid) + self._try_place(sid)

    def _periodic_reconcile(self, sid: str) -> list[Command]:
        """Explicit reconciliation, and kills repeated for tasks that ignored the first."""
        self.last_reconcile = self.now
        kills: list[Command] = [KillTask(sid, t.mesos_task_id, t.agent_id or "")
                                for q in self.queries.values() for t in q.tasks.values()
                                if t.kill_requested and t.state.launched]
        ids = self._launched_ids()
        return ([ReconcileTasks(sid, ids)] if ids else []) + kills

    # ---- lookups -------------------------------------------------------------------------
    def _find(self, task_id: str) -> tuple[QueryRecord, TaskRecord] | None:
        query_id = task_id.rpartition(".t")[0]
        query = self.queries.get(query_id)
        if query is not None and task_id in query.tasks:
            return query, query.tasks[task_id]
        for q in self.queries.values():  # task ids that do not follow "<query>.t<n>"
            if task_id in q.tasks:
                return q, q.tasks[task_id]
        return None

    def _launched_ids(self) -> tuple[tuple[str, str], ...]:
        return tuple((t.mesos_task_id, t.agent_id or "") for q in self.queries.values()
                     for t in q.tasks.values() if t.state.launched)

    def _pending(self) -> bool:
        return any(t.state is TaskState.PENDING or t.restart_at is not None
                   for q in self.queries.values() if q.phase == "active"
                   for t in q.tasks.values())

    def _held_agents(self) -> set[str]:
        return {h.offer.agent_id for h in self.held.values()}

    def _executor_id(self, agent_id: str) -> str:
        return self.config.executor.executor_id(agent_id)


def shed_request_id(query_id: str, version: int, now: float) -> str:
    """The id of the shedding policy's control request (deterministic, like `auto_request_id`)."""
    return f"{query_id}-shed{version + 1}-{int(now * 1000) % 10**9}"


def update_request_id(query_id: str, stimulus_id: str) -> str:
    """The id of the control request an update switches its live changes with, from the
    update's stimulus id (unique in the process; the state mints no ids of its own)."""
    return f"{query_id}-{stimulus_id}"


def auto_request_id(query_id: str, version: int, now: float) -> str:
    """The id of an automatic rescale's control request, from what the state knows (the next
    control version and the tick's time), so the same events give the same ids."""
    return f"{query_id}-auto{version + 1}-{int(now * 1000) % 10**9}"


def known_endpoints(tasks: Any, live: list[TaskRecord]) -> dict[str, str]:
    """Where each output channel of a query is (or was last) served: a task relaunched while its
    producer is itself waiting for a place starts with the producer's last endpoint (the same
    agent and port when the producer comes back there) and is retargeted if the producer moves.
    A dormant instance slot's channels are not placed (`messages.UNPLACED`: a merger launched
    meanwhile does not wait for it). Running producers' endpoints win over remembered ones."""
    remembered = {c: (messages.UNPLACED if t.state is TaskState.DORMANT else e)
                  for t in tasks if not t.state.launched for c, e in t.endpoints.items()
                  if c in t.task.outputs}
    return remembered | {c: e for t in live for c, e in t.endpoints.items()
                         if c in t.task.outputs}


def task_keys(query: CompiledQuery, task_id: str,
              keys: Mapping[str, Mapping[str, str]]) -> dict[str, Any] | None:
    """A task's "keys" launch data: its own keypair, the public key of the producer of each
    channel it reads and of each reader task of each channel it serves (None: no keys issued)."""
    if task_id not in keys:
        return None
    public = {t: k["public"] for t, k in keys.items()}
    return {
        "own": dict(keys[task_id]),
        "servers": {c.channel_id: public[c.producer] for c in query.channels
                    if task_id in c.consumers and c.producer in public},
        "readers": {c.channel_id: {t: public[t] for t in c.consumers if t in public}
                    for c in query.channels if c.producer == task_id},
    }


def launch_data(query: CompiledQuery, task: TaskRecord,
                control: ctl.QueryControl | None = None,
                keys: Mapping[str, Mapping[str, str]] | None = None) -> LaunchData:
    """What a task's executor receives: the task, its channel endpoints, its attempt and its
    fencing epoch, what it needs of its query (its channels and the sinks), the parameters
    control tuples set and its channel keys."""
    mine = set(task.task.inputs + task.task.outputs)
    return LaunchData(
        task.task, dict(task.endpoints), task.attempt,
        (control or ctl.QueryControl()).param_set(task.task_id),
        LaunchQuery(query.query_id, tuple(c for c in query.channels if c.channel_id in mine),
                    dict(query.sinks)),
        task_keys(query, task.task_id, keys or {}), task.epoch)


# Mesos reasons for a terminal update that say the task's executor or agent went away
INFRASTRUCTURE_REASONS = frozenset({
    "REASON_EXECUTOR_TERMINATED", "REASON_EXECUTOR_UNREGISTERED", "REASON_AGENT_REMOVED",
    "REASON_AGENT_DISCONNECTED", "REASON_AGENT_RESTARTED", "REASON_SLAVE_REMOVED",
    "REASON_SLAVE_DISCONNECTED", "REASON_SLAVE_RESTARTED", "REASON_CONTAINER_PREEMPTED",
})


__all__ = ["SchedulerState", "QueryRecord", "launch_data", "durable_placements",
           "restore_query"]


def durable_placements(q: QueryRecord) -> dict[str, Any]:
    """What a new leader needs of a query besides its source: its phase and, per task,
    the attempt (so reconciliation recognises the running attempt), launches, state and place."""
    return {"phase": q.phase, "failure": q.failure, "control": q.control.to_json(),
            "keys": {t: dict(k) for t, k in q.keys.items()}, "tasks": {
        t.task_id: {"attempt": t.attempt, "epoch": t.epoch, "launches": t.launches, "failures": t.failures,
                    "state": t.state.value,
                    "restarting": t.restart_at is not None, "agent_id": t.agent_id,
                    "hostname": t.hostname, "ports": list(t.ports),
                    "endpoints": dict(t.endpoints), "kill_requested": t.kill_requested,
                    "retiring": t.retiring, "migrate_to": t.migrate_to,
                    "last_failure": t.last_failure}
        for t in q.tasks.values()}}


def restore_query(query: CompiledQuery, source: QuerySource | None,
                  placements: dict[str, Any] | None, now: float) -> QueryRecord:
    """A persisted query (recompiled from its persisted source by the caller) as a record;
    launched tasks keep their last known state until reconciliation says otherwise, tasks that
    waited for a restart restart at once."""
    saved = (placements or {}).get("tasks", {})
    tasks = {t.task_id: _restore_task(t, saved.get(t.task_id), now) for t in query.tasks}
    control = ctl.QueryControl.from_json((placements or {}).get("control"))
    for dropped in ctl.drop_refused(control, query.controls or ControlCatalog(), query.query_id):
        log.warning("query %s: %s", query.query_id, dropped)  # stored before today's checks
    saved_keys = (placements or {}).get("keys") or {}
    keys = {t.task_id: dict(saved_keys[t.task_id]) for t in query.tasks
            if t.task_id in saved_keys}  # the shell issued any missing (channel_keys)
    return QueryRecord(query, tasks, (placements or {}).get("phase", "active"),
                       (placements or {}).get("failure", ""), control, source=source, keys=keys)


def _restore_task(task: Any, saved: dict[str, Any] | None, now: float) -> TaskRecord:
    if not saved:
        return TaskRecord(task, pending_since=now)
    state = TaskState(saved["state"])
    return TaskRecord(
        task, state, attempt=int(saved["attempt"]), epoch=int(saved.get("epoch", 0)),
        launches=int(saved["launches"]),
        failures=int(saved.get("failures", 0)), agent_id=saved.get("agent_id"),
        hostname=saved.get("hostname"), ports=tuple(saved.get("ports", ())),
        endpoints=dict(saved.get("endpoints", {})),
        restart_at=now if saved.get("restarting") else None, pending_since=now,
        kill_requested=bool(saved.get("kill_requested")), migrate_to=saved.get("migrate_to"),
        retiring=bool(saved.get("retiring")),
        last_failure=str(saved.get("last_failure", "")))



_HANDLERS: dict[type, Callable[[SchedulerState, Any], list[Command]]] = {
    LeadershipGained: SchedulerState._on_leadership_gained,
    LeadershipUpdated: SchedulerState._on_leadership_updated,
    FencedRequest: SchedulerState._on_fenced_request,
    Registered: SchedulerState._on_registered,
    Reregistered: SchedulerState._on_reregistered,
    Disconnected: SchedulerState._on_disconnected,
    OffersReceived: SchedulerState._on_offers_received,
    OfferRescinded: SchedulerState._on_offer_rescinded,
    StatusUpdated: SchedulerState._on_status_updated,
    AgentLost: SchedulerState._on_agent_lost,
    ExecutorLost: SchedulerState._on_executor_lost,
    HeartbeatReceived: SchedulerState._on_heartbeat_received,
    ControlAcknowledged: SchedulerState._on_control_acknowledged,
    MessageUnreadable: SchedulerState._on_message_unreadable,
    QuerySubmitted: SchedulerState._on_query_submitted,
    QueryStopRequested: SchedulerState._on_query_stop_requested,
    QueryUpdateRequested: SchedulerState._on_query_update_requested,
    TaskMigrationRequested: SchedulerState._on_task_migration_requested,
    ControlRequested: SchedulerState._on_control_requested,
    Tick: SchedulerState._on_tick,
}
