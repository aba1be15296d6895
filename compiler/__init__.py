"""The Elastiq compiler: XML dataflow spec -> validated Spec -> logical graph -> physical graph ->
query tasks -> generated task programs.

Modules, in the order a query passes through them: `xmlsource` (safe XML reading with exact
positions), `spec` (frozen dataclasses of what the user wrote), `expr` (the closed expression
language: lexer, parser, type checker), `operators` (the operator catalogue), `validate`
(semantic checks), `graph` (logical and physical graphs, their notation and pictures), `guards`
(when a pattern applies), `rules` and `rewrite` (the rewrite rules and their engine), `tasks`
(splitting into query tasks), `codegen` (jinja2 task programs). The values they produce (column types, diagnostics,
compiled queries and tasks, the control catalogue) are in `common`. Nothing here touches Spark,
sockets or Mesos: the executor lowers a checked expression to Spark
(`executor.expression_lowering`).
"""
