"""Scheduler settings: one frozen value read by the state machine and the Mesos adapter.

Owns `ExecutorSpec` (how our per-agent executor is started and what it asks for itself),
`SchedulerConfig` (framework identity, restart budget and backoff, offer handling) and
`CompileLimits` (what compiling one spec sent to the API may cost). Does not own reading them
from files or the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.distributor import DistributionSettings
from scheduler.shed_policy import ShedPolicy
from scheduler.liveness import DetectorSettings

ONE_WEEK = 7 * 24 * 3600.0


@dataclass(frozen=True)
class ExecutorSpec:
    """The executor every task on an agent shares (one per framework and agent)."""

    command: str = "exec python -m executor"  # exec: the agent tracks the executor, not a shell
    # the executor's own share, charged once per agent beside its tasks' (Mesos: executor
    # resources + task resources must fit the offer, and the container is held to their sum).
    # cpus: its own process is small (heartbeats, channels, control), as Mesos's default
    # executor's 0.1; the SparkSession JVM's cpu runs the tasks' micro-batches, so it is the
    # tasks' cpus= (docs/deploy.md, "Resources"). mem: the JVM's heap, shared by its tasks.
    cpus: float = 0.1
    mem_mb: float = 1500.0  # the JVM of the agent's SparkSession
    environment: tuple[tuple[str, str], ...] = ()
    id_prefix: str = "elastiq-exec-"

    def executor_id(self, agent_id: str) -> str:
        return f"{self.id_prefix}{agent_id}"


@dataclass(frozen=True)
class SchedulerConfig:
    framework_name: str = "elastiq"
    role: str = "*"
    failover_timeout: float = ONE_WEEK  # pymesos would use 100 s, too short for a restart
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    max_attempts: int = 4  # failures of a task before its query fails (losing its executor or
    # agent is no failure of the task: a query survives any number of those)
    max_port_clashes: int = 10  # launches of a task that found its port taken (not failures)
    backoff_initial: float = 1.0  # seconds before the second attempt
    backoff_factor: float = 2.0
    backoff_max: float = 30.0
    same_agent_wait: float = 5.0  # how long a restart waits for its previous agent's offer
    # how long a standby/checkpoint failover waits for another agent than the one it failed on
    # before it may go back there
    failover_wait: float = 10.0
    offer_hold_seconds: float = 2.0  # keep offers while some demand could not be placed
    decline_seconds: float = 5.0  # refuse filter for offers nothing needs
    reconcile_interval: float = 60.0
    # how long a scale-out waits for its new instances to run (placed, Spark started) before it
    # is refused and undone, so one the cluster has no room for does not block the query's
    # control for ever; its splitters never heard of it, so nothing was routed to them
    scale_out_wait: float = 180.0
    # Kill running tasks no query of ours knows (left by a deploy this scheduler has no record
    # of). A leader restores the persisted queries before it registers, so the tasks of known
    # queries are never among them; without ZooKeeper nothing persists across a restart.
    kill_unknown_tasks: bool = True
    # the failure detector on executor heartbeats (`scheduler.liveness`; threshold None: off)
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    # the load distributor (`scheduler.distributor`, docs/load.md): it moves only the tasks of
    # queries that say distribute="true"
    distribution: DistributionSettings = field(default_factory=DistributionSettings)
    # the load shedding policy (`scheduler.shed_policy`, docs/load.md): headroom, release,
    # cool-down between ratio changes, how often it looks at a query
    shedding: ShedPolicy = field(default_factory=ShedPolicy)


@dataclass(frozen=True)
class CompileLimits:
    """What compiling one spec sent to the API (`POST /queries`) may cost. Each compile runs in
    a worker process of its own (`scheduler.compile_worker`), never in the scheduler's
    interpreter, so no body can stall the API, the scheduler's loop or heartbeats; a worker over
    a limit is killed and the body refused with 413 naming the limit. Compiling is linear in
    the spec's size: a valid 1.1 MiB spec of 8,000 operators took 20 s and 174 MB on a 2-core
    machine at load 35, so one at the 4 MiB body limit fits these defaults."""

    seconds: float = 120.0  # wall-clock time a compile may take, also the wait for a free worker
    memory_mb: int = 1024  # the worker's address space (RLIMIT_AS), the compiler included
    workers: int = 2  # compiles at once; one more waits, then 503

    def __post_init__(self) -> None:
        if not (self.seconds > 0 and self.memory_mb >= 128 and self.workers >= 1):
            raise ValueError(f"compile limits need seconds > 0, memory_mb >= 128 and workers "
                             f">= 1, not {self}")
