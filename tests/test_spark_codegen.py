"""executor.spark_codegen: which settings a task's query starts with (pure)."""

from __future__ import annotations

from compiler.expr import parse
from executor.spark_codegen import (NO_DATA_BATCHES, WHOLE_STAGE, WHOLE_STAGE_MAX_NODES, nodes,
                                    query_settings, whole_stage)


def test_nodes_count_every_node_of_the_tree() -> None:
    assert nodes(parse("a")) == 1
    assert nodes(parse("a + 1")) == 3
    assert nodes(parse("sqrt(a * b) > 2")) == 6  # >, sqrt, *, a, b, 2


def test_the_bound_is_inclusive() -> None:
    assert whole_stage(WHOLE_STAGE_MAX_NODES)
    assert not whole_stage(WHOLE_STAGE_MAX_NODES + 1)


def test_small_expressions_keep_the_sessions_settings() -> None:
    assert query_settings(False, nodes(parse("a + 1")) + nodes(parse("b > 2"))) == {}
    assert query_settings(True, nodes(parse("a + 1"))) == {NO_DATA_BATCHES: "false"}


def test_large_expressions_in_all_turn_whole_stage_code_generation_off() -> None:
    """The sizes add up over the task's expressions: a stage fuses its operators' code."""
    field = parse(" + ".join(f"a * {i}" for i in range(1, 40)))  # 39 x 3 + 38 = 155 nodes
    assert nodes(field) == 155
    assert query_settings(False, 3 * nodes(field)) == {}  # 465
    assert query_settings(False, 4 * nodes(field)) == {WHOLE_STAGE: "false"}  # 620
    assert query_settings(True, 4 * nodes(field)) == {NO_DATA_BATCHES: "false",
                                                    WHOLE_STAGE: "false"}
