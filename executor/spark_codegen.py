"""Whether a task's query runs with Spark's whole-stage code generation (pure).

Owns `query_settings`: the SQL settings a task's query is started with besides the session's
(a query clones the session's SQL conf when it starts, so they hold for that query only; the
runtime's `_start_query` sets, starts and restores them). Two decisions:

- a deterministic task starts with no-data micro-batches off (`executor.runtime`);
- a task whose expressions hold more than `WHOLE_STAGE_MAX_NODES` nodes in all runs without
  whole-stage code generation (`spark.sql.codegen.wholeStage` false), keeping Spark's
  expression-level generated code. Spark generates and compiles a micro-batch's whole-stage
  Java source at every micro-batch (each is planned anew); for large expressions that is most
  of a batch's fixed cost, and past Java's 64 KB method limit the compile fails and Spark falls
  back after paying for it, again at every batch. Measured in one local[1] session held to 0.3
  cpu (2026-11-30, docs/architecture.md "Whole-stage code generation"): a projection of 908 to
  14,576 expression nodes took 1.9-2.2x less time per micro-batch without it (0 and 200 rows);
  one of 227 nodes differed by less than the noise. Below the bound nothing changes.

Counts nodes of the checked trees (`compiler.expr.walk`), summed over the task's expressions:
a stage fuses its operators' code into one method, so their sizes add up. Does no I/O.
"""

from __future__ import annotations

from compiler.expr import Expr, walk

NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
WHOLE_STAGE = "spark.sql.codegen.wholeStage"
# expression nodes in a task above which its query runs without whole-stage code generation:
# between the 227 nodes where the two did not differ measurably and the 908 where it paid 2x
WHOLE_STAGE_MAX_NODES = 500


def nodes(expr: Expr) -> int:
    """How many nodes a checked expression tree holds."""
    return sum(1 for _ in walk(expr))


def whole_stage(expression_nodes: int) -> bool:
    """Whether a task whose expressions hold `expression_nodes` nodes keeps whole-stage code
    generation."""
    return expression_nodes <= WHOLE_STAGE_MAX_NODES


def query_settings(deterministic: bool, expression_nodes: int) -> dict[str, str]:
    """The SQL settings a task's query starts with beyond the session's (empty: none), its
    checked expressions holding `expression_nodes` nodes in all (`nodes`)."""
    settings: dict[str, str] = {}
    if deterministic:
        settings[NO_DATA_BATCHES] = "false"
    if not whole_stage(expression_nodes):
        settings[WHOLE_STAGE] = "false"
    return settings
