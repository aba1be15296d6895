"""The shared model and wire protocol of Elastiq: the values every component reads.

Owns what crosses between the compiler, the scheduler, the executors and the CLI: column types
and schemas (`types`), spec diagnostics (`diagnostics`), compiled queries and their tasks
(`tasks`), the control catalogue and its values (`control`), the output-schema facts both the
validator and the runtime use (`operator_schemas`), the path roots file operators are confined
to (`paths`), the typed scheduler<->executor messages (`messages`), the one dispatch idiom of
every state machine (`dispatch`), and the scheduler API's client and token lookup
(`api_client`, `api_token`). Does not own compiling (`compiler`), placing (`scheduler`),
running (`executor`) or the command line (`elastiq`).

Import rules (checked by tests/test_import_rules.py): `common` imports the standard library and
`common.*` only; every other package may import `common`. `compiler` imports common, compiler,
rewrite_rules, lxml and jinja2, never Spark, Mesos or sockets; `executor` imports common,
executor and the expression language `compiler.expr`; `scheduler` imports common, compiler and
scheduler, never executor or elastiq; `embedded_mesos` imports common and itself; generated
task programs import exactly `common.types` and `executor.runtime`.
"""
