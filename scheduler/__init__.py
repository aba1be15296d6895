"""The Elastiq Mesos framework scheduler: a pure state machine inside an I/O shell.

Modules, from decisions to I/O: `events` and `commands` (the vocabulary), `lifecycle` (task
states and the transition table), `placement` (pure first-fit gang placement), `destinations`
(where a task may go), `admission` (checks on a compiled query), `state` (`SchedulerState.handle`,
the only mutator), `views` (JSON snapshots), `mesos_json` (Mesos v1 JSON in and out), `loop`
(the event-loop thread), `mesos_adapter` (the only pymesos import; `SchedulerService`), `api`
(HTTP on 127.0.0.1, behind a Host/Origin check and a bearer token), `api_token` (making the
token's file) and `query_source` (a query's spec and compile options: what is persisted and
recompiled). The CLI's client and its token lookup are `common.api_client` and
`common.api_token`. Failover patterns, metrics and ZooKeeper leadership build on these.
"""
