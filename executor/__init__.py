"""The Elastiq Mesos executor: one process per agent running every task placed there.

Modules, from the outside in: `__main__` (the process), `mesos_executor` (the only module importing
pymesos: callbacks in, status updates and heartbeats out), `mesos_events` (the pure edge: TaskInfos
and framework messages to events, `common.messages` to bytes), `executor_state` (the pure
decisions), `task_runner` (one task: load its generated program, keep its query running), `runtime`
(the API generated programs call), `sources` and `sinks` (Spark data sources and foreachBatch
sinks), `channels` and `wire` (numbered Arrow batches over ZeroMQ), `shapes` (generator rows),
`spark_session`, `spark_worker_daemon` and `spark_python_path` (the shared SparkSession).
"""
