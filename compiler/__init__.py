"""The Elastiq compiler: XML dataflow spec -> validated Spec -> logical graph -> physical graph ->
query tasks -> generated task programs.

Modules, in the order a query passes through them: `xmlsource` (safe XML reading with exact
positions), `spec` (frozen dataclasses of what the user wrote), `expressions` (the closed
expression language), `operators` (the operator catalogue), `validate` (semantic checks),
`graph` (logical and physical graphs, their notation and pictures), `tasks` (splitting into query
tasks), `codegen` (jinja2 task programs). The values they produce (column types, diagnostics,
compiled queries and tasks, the control catalogue) are in `common`. Nothing here touches Spark,
sockets or Mesos, except `expressions.to_column`, which imports pyspark lazily.
"""
