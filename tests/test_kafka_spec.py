"""kafka-source and kafka-sink in specs (pure): every problem located at its file:line:column,
all at once; the compiled call carries canonical values; the parameter decisions of
common.kafka_params and the sink's skip decision on their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.kafka_params import (KafkaParamError, parse_bootstrap, parse_starting_offsets,
                                 parse_topics, security_properties, transactional_id)
from common.types import ColumnType
from compiler.pipeline import check_spec_text, compile_spec_text
from executor.kafka_io import (KafkaUnavailable, Mark, SourceSettings, already_written, bounded,
                               mark_of, source_options, transient)
from tests.spec_snippets import locate

TYPES = """  <type name="reading">
    <column name="sensor" type="string"/>
    <column name="ts" type="timestamp"/>
    <column name="temp" type="double"/>
    <column name="off" type="int"/>
  </type>
"""


def spec(source_params: str, sink_params: str = "") -> str:
    return f"""<dataflow name="k">
{TYPES}  <operator name="src" type="kafka-source">
    <param name="bootstrap" value="127.0.0.1:9092"/>
{source_params}    <output name="raw" type="reading"/>
  </operator>
  <operator name="out" type="kafka-sink">
    <input name="raw"/>
    <param name="bootstrap" value="127.0.0.1:9092"/>
    <param name="topic" value="results"/>
{sink_params}  </operator>
</dataflow>
"""


def errors(text: str) -> list[tuple[int, int, str]]:
    graph, diagnostics = check_spec_text(text, "k.xml")
    return [(d.position.line, d.position.column, d.message) for d in diagnostics
            if d.severity == "error"]


def test_a_kafka_query_validates_and_compiles_to_canonical_arguments(tmp_path: Path) -> None:
    text = spec('    <param name="topic" value="a, b"/>\n'
                '    <param name="starting-offsets" value=\'{"a": {"1": 5, "0": -2}}\'/>\n'
                '    <param name="offset-column" value="off"/>\n'
                '    <param name="timestamp-column" value="ts"/>\n',
                '    <param name="key-column" value="sensor"/>\n'
                '    <param name="delivery" value="at-least-once"/>\n')
    assert errors(text) == []
    compiled = compile_spec_text(text, str(tmp_path / "k.xml"))
    (task,) = compiled.query.tasks
    assert "topics=('a', 'b')" in task.program
    assert """starting_offsets='{"a":{"0":-2,"1":5}}'""" in task.program
    assert "metadata=(('timestamp', 'ts'), ('offset', 'off'))" in task.program \
        or "metadata=(('offset', 'off'), ('timestamp', 'ts'))" in task.program
    assert "delivery='at-least-once'" in task.program and "key_column='sensor'" in task.program


def test_every_problem_is_located_and_reported_together() -> None:
    text = spec('    <param name="topic" value="a b"/>\n'
                '    <param name="topic-pattern" value="x.*"/>\n'
                '    <param name="starting-offsets" value=\'{"other": {"0": 1}}\'/>\n'
                '    <param name="offset-column" value="sensor"/>\n'
                '    <param name="key-column" value="nope"/>\n',
                '    <param name="key-column" value="sensr"/>\n').replace(
        'value="127.0.0.1:9092"/>\n    <param name="topic" value="results"',
        'value="127.0.0.1:99999"/>\n    <param name="topic" value="results"')
    found = errors(text)
    messages = " | ".join(m for _, _, m in found)
    assert "exactly one of topic and topic-pattern" in messages
    assert "'a b' is not a Kafka topic name" in messages
    assert "the record's offset is int, the column is string" in messages
    assert "names column 'nope', which its output type does not declare" in messages
    assert "'127.0.0.1:99999' is not HOST:PORT" in messages
    assert "names column 'sensr', which stream 'raw' does not have" in messages
    line, column = locate(text, "sensr")
    assert (line, column) in {(ln, c) for ln, c, _ in found}
    line, column = locate(text, "a b")
    assert (line, column) in {(ln, c) for ln, c, _ in found}


def test_starting_offsets_and_timestamp_exclude_each_other() -> None:
    text = spec('    <param name="topic" value="a"/>\n'
                '    <param name="starting-offsets" value="latest"/>\n'
                '    <param name="starting-timestamp" value="2024-01-01T00:00:00Z"/>\n')
    assert any("both starting-offsets and starting-timestamp" in m for _, _, m in errors(text))


def test_a_missing_security_file_is_an_error_at_its_value(tmp_path: Path) -> None:
    text = spec('    <param name="topic" value="a"/>\n'
                '    <param name="security-file" value="no-such.properties"/>\n')
    graph, diagnostics = check_spec_text(text, str(tmp_path / "k.xml"), check_inputs=True)
    assert graph is None
    assert any("does not exist" in d.message for d in diagnostics)


@pytest.mark.parametrize("text", ["", "host", "host:0", "host:70000", "a:1,,b:2", "h:1 x"])
def test_bootstrap_lists_are_host_port(text: str) -> None:
    with pytest.raises(KafkaParamError):
        parse_bootstrap(text)


def test_bootstrap_and_topics_are_canonical() -> None:
    assert parse_bootstrap(" a:1 , [::1]:2") == "a:1,[::1]:2"
    assert parse_topics("x, y.z") == ("x", "y.z")
    for bad in ("x,x", "..", "a/b", "ü", "x" * 250):
        with pytest.raises(KafkaParamError):
            parse_topics(bad)


@pytest.mark.parametrize("text", ["soon", "[]", "{}", '{"a": 3}', '{"a": {"x": 1}}',
                                  '{"a": {"0": -3}}', '{"a": {"0": true}}', '{"a": {"0": 1.5}}',
                                  '{"b": {"0": 1}}'])
def test_bad_starting_offsets_are_refused(text: str) -> None:
    with pytest.raises(KafkaParamError):
        parse_starting_offsets(text, ("a",))


def test_security_settings_only_pass_security_keys() -> None:
    text = "# creds\nsecurity.protocol=SASL_SSL\nsasl.mechanism = PLAIN\n\nssl.ca.location=/x\n"
    assert {p.key: p.value for p in security_properties(text, "c.properties")} == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "ssl.ca.location": "/x"}
    for bad in ("bootstrap.servers=evil:9092\n", "security.protocol\n", "=x\n"):
        with pytest.raises(KafkaParamError, match="c.properties:1"):
            security_properties(bad, "c.properties")


def test_transactional_ids_are_stable_per_sink_and_distinct_between_sinks() -> None:
    a = transactional_id("q", "t0", "out")
    assert a == transactional_id("q", "t0", "out")
    assert len({a, transactional_id("q", "t1", "out"), transactional_id("q", "t0", "o2"),
                transactional_id("q.t0", "", "out")}) == 4
    assert len(transactional_id("q" * 500, "t", "o")) < 220


def test_an_unstable_or_loading_mark_is_read_again_never_taken_as_none() -> None:
    KafkaError = pytest.importorskip("confluent_kafka").KafkaError  # noqa: N806

    for code in (KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                 KafkaError.NOT_COORDINATOR, KafkaError._TIMED_OUT):
        assert transient(code, retriable=False)
    assert transient(KafkaError.UNKNOWN, retriable=True)
    assert not transient(KafkaError.GROUP_AUTHORIZATION_FAILED, retriable=False)


def _stalling_sink(stalls: int, starts: int = 99) -> Any:
    """A KafkaSink whose transactions stall for its first `stalls` producers, then commit, and
    whose producers after the first `starts` cannot start (the sink's own retry logic alone: no
    producer, no broker)."""
    from confluent_kafka import KafkaError, KafkaException

    from executor.kafka_io import KafkaSink, KafkaStalled

    class StallingSink(KafkaSink):
        producers = 0

        def _start_transactions(self) -> None:
            if self._producer is None:
                if self.producers >= starts:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "init timed out"))
                self.producers += 1
                self._producer, self._run = object(), "run-1"

        def _write(self, records: Any, batch_id: int, run: str) -> None:
            if self.producers <= stalls:
                raise KafkaStalled(f"stall {self.producers}", "stalled")
            self.written.append(batch_id)

    sink = StallingSink("t", bootstrap="127.0.0.1:9", topic="o", fmt="jsonl", key_column=None,
                        exactly_once=True, transactional_id="tx", run_id=lambda: "run-1")
    sink.written = []
    return sink


class _Rows:
    def toArrow(self) -> Any:  # noqa: N802 (Spark's name)
        import pyarrow as pa

        return pa.table({"sensor": ["a"]})


def test_a_stalled_transaction_is_tried_again_with_fresh_producers_then_fails_the_batch() -> None:
    from executor.kafka_io import FRESH_PRODUCERS, KafkaStalled

    rides = _stalling_sink(FRESH_PRODUCERS)
    rides(_Rows(), 4)
    assert (rides.written, rides.fresh_producers) == ([4], FRESH_PRODUCERS)
    gives_up = _stalling_sink(FRESH_PRODUCERS + 1)
    with pytest.raises(KafkaStalled, match="stalled"):
        gives_up(_Rows(), 4)
    assert (gives_up.written, gives_up.producers) == ([], FRESH_PRODUCERS + 1)
    broker_away = _stalling_sink(stalls=1, starts=1)  # the fresh producer cannot start
    with pytest.raises(KafkaUnavailable) as refused:
        broker_away(_Rows(), 4)
    assert str(refused.value).startswith("stall 1, and a fresh producer could not start (")
    assert "init timed out" in str(refused.value) and "retried from its checkpoint" in \
        str(refused.value)
    assert not isinstance(refused.value, KafkaStalled) and broker_away.written == []


def test_a_transactional_call_that_does_not_return_fails_the_batch_in_bounded_time() -> None:
    import threading
    import time

    assert bounded(lambda: 42, "a call", 5.0) == 42
    with pytest.raises(ZeroDivisionError):
        bounded(lambda: 1 // 0, "a call", 5.0)
    never = threading.Event()
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailable, match="did not complete the commit of batch 3 "
                                                   "within 0 s.*retried from its checkpoint"):
            bounded(lambda: never.wait(60), "the commit of batch 3", 0.2)
    finally:
        never.set()
    assert time.monotonic() - started < 5.0


def test_a_batch_is_skipped_only_under_a_mark_of_the_same_run() -> None:
    assert mark_of(-1001, None) is None and mark_of(0, "r") is None
    mark = mark_of(8, "r1")
    assert mark == Mark(7, "r1")
    assert already_written(mark, "r1", 7) and already_written(mark, "r1", 3)
    assert not already_written(mark, "r1", 8)
    assert not already_written(mark, "r2", 0)
    assert not already_written(None, "r1", 0)


def test_source_options_name_topics_or_a_pattern_and_where_to_start() -> None:
    options = source_options(SourceSettings("h:1", ("a", "b"), None, "earliest", None, 500,
                                            (("sasl.mechanism", "PLAIN"),)))
    assert options == {"kafka.bootstrap.servers": "h:1", "includeHeaders": "false",
                       "subscribe": "a,b", "startingOffsets": "earliest",
                       "maxOffsetsPerTrigger": "500", "kafka.sasl.mechanism": "PLAIN"}
    options = source_options(SourceSettings("h:1", (), "x.*", "latest", 1700000000000, None))
    assert options["subscribePattern"] == "x.*" and options["startingTimestamp"] == \
        "1700000000000" and "startingOffsets" not in options


def test_metadata_columns_have_fixed_types() -> None:
    from common.kafka_params import METADATA_COLUMNS, metadata_type_problem

    assert {p: t for p, (_, t) in METADATA_COLUMNS.items()}["offset-column"] is ColumnType.INT
    assert metadata_type_problem("timestamp-column", ColumnType.TIMESTAMP) is None
    assert metadata_type_problem("key-column", ColumnType.INT) is not None


def test_sessions_carry_the_connector_jars_only_when_fetched() -> None:
    from executor.spark_session import session_settings

    assert "spark.jars" not in session_settings(2, "/tmp/s")
    jars = ("/c/spark-sql-kafka.jar", "/c/kafka-clients.jar")
    assert session_settings(2, "/tmp/s", jars)["spark.jars"] == ",".join(jars)


def test_missing_parts_say_how_to_fetch_them(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from common.kafka_jars import KafkaPartsMissing, broker_classpath, missing_parts

    monkeypatch.setenv("ELASTIQ_JVM_CACHE", str(tmp_path))
    assert "scripts/setup.sh --kafka" in str(missing_parts())
    with pytest.raises(KafkaPartsMissing, match="setup.sh --kafka"):
        broker_classpath()
    (tmp_path / "kafka-broker").mkdir()
    (tmp_path / "kafka-broker" / "a.jar").write_bytes(b"")
    with pytest.raises(KafkaPartsMissing):  # no .complete marker: an interrupted fetch
        broker_classpath()
    (tmp_path / "kafka-broker" / ".complete").write_bytes(b"")
    assert broker_classpath() == str(tmp_path / "kafka-broker" / "a.jar")
