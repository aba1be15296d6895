"""The Elastiq Mesos framework scheduler: a pure state machine inside an I/O shell.

Modules, from decisions to I/O: `events` and `commands` (the vocabulary), `lifecycle` (task
states and the transition table), `placement` (pure first-fit gang placement), `destinations`
(where a task may go), `admission` (checks on a compiled query), `state` (`SchedulerState.handle`,
the only mutator), `views` (JSON snapshots), `mesos_json` (Mesos v1 JSON in and out), `loop`
(the event-loop thread), `mesos_adapter` (the only pymesos import; `SchedulerService`), `api`
(HTTP on 127.0.0.1, behind a Host/Origin check and a bearer token), `api_token` (the token's
file), `query_source` (a query's spec and compile options: what is persisted and recompiled)
and `client` (for the CLI). Failover patterns, metrics and ZooKeeper
leadership build on these.
"""
