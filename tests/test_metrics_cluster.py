"""GET /metrics of a scheduler running a real query: the embedded cluster, the real pymesos
driver, a real executor with Spark, and the API server over HTTP on 127.0.0.1. Scraped while the
query deploys and again once the sink holds every result: offers and launches have moved, and
the tuples-out counter matches plain Python over the input file (the paper's filter, x < 42)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

import embedded_mesos as embedded  # noqa: E402

from compiler.pipeline import compile_spec_file  # noqa: E402
from scheduler.api import ApiServer  # noqa: E402
from scheduler.config import ExecutorSpec, SchedulerConfig  # noqa: E402
from scheduler.mesos_adapter import SchedulerService  # noqa: E402
from testkit.waiting import wait_for  # noqa: E402


def wait_for_slowly(what: str, check: Callable[[], Any], timeout: float) -> Any:
    return wait_for(what, check, timeout, step=0.5)


ROOT = Path(__file__).resolve().parent.parent
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$")


def scrape(url: str) -> dict[str, float]:
    """`name{labels}` -> value, parsed from the text exposition fetched over HTTP."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


def sink_rows(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def task_value(samples: dict[str, float], name: str) -> float:
    return samples.get(f'{name}{{query="paper-filter",task="paper-filter.t0"}}', 0.0)


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(150)
def test_metrics_move_as_a_real_query_runs(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "examples" / "paper-filter.xml", tmp_path / "spec.xml")
    shutil.copy(ROOT / "examples" / "data" / "numbers.jsonl", tmp_path / "data" / "numbers.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "data" / "numbers.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r["x"] < 42]
    query = compile_spec_file(tmp_path / "spec.xml", base_dir=tmp_path).query
    executor = ExecutorSpec(command=f"exec {sys.executable} -m executor", environment=(
        ("ELASTIQ_STATE_DIR", str(tmp_path / "state")), ("ELASTIQ_SPARK_CORES", "1"),
        ("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))))
    resources = {"cpus": 2, "mem": 6144, "ports": "31000-31999"}
    with embedded.EmbeddedCluster(agents=1, resources=resources, work_dir=tmp_path / "cluster",
                                  executor_grace_seconds=15.0) as cluster:
        credential = cluster.framework_credential
        service = SchedulerService(cluster.master_address,
                                   SchedulerConfig(executor=executor),
                                   principal=credential.principal,
                                   secret=credential.secret).start()
        api = ApiServer(service, token="metrics-cluster-token").start()  # /metrics: open
        try:
            wait_for_slowly("registration", lambda: service.status()["connected"], 30)
            submitted = time.monotonic()
            assert service.submit(query).accepted
            first = wait_for_slowly("a launch in /metrics", lambda: (s := scrape(api.url)).get(
                'elastiq_task_launches_total{query="paper-filter"}', 0) >= 1 and s, 60)
            assert first["elastiq_offers_received_total"] >= 1
            assert first["elastiq_offers_used_total"] >= 1
            assert first["elastiq_scheduler_connected_to_master"] == 1
            sink = Path(query.sinks["sink"])
            wait_for_slowly("the sink to match the oracle", lambda: sink_rows(sink) == len(kept), 80)
            second = wait_for_slowly("the heartbeat after the last batch", lambda: task_value(
                s := scrape(api.url), "elastiq_task_tuples_out_total") >= len(kept) and s, 15)
            wait_for_slowly("tuples in to reach the input's size", lambda: task_value(
                s := scrape(api.url), "elastiq_task_tuples_in_total") == len(rows) and s, 15)
            assert task_value(second, "elastiq_task_tuples_out_total") > \
                task_value(first, "elastiq_task_tuples_out_total")
            assert task_value(second, "elastiq_task_tuples_out_total") == len(kept)
            (task,) = (service.query_status(query.query_id) or {})["tasks"]
            busy_ms = task["figures"]["busy_ms"]  # the time its micro-batches took, summed
            assert 0 < busy_ms <= (time.monotonic() - submitted) * 1000, busy_ms
            assert len(rows) > len(kept) > 0
            assert second["elastiq_offers_received_total"] >= \
                first["elastiq_offers_received_total"]
            assert second['elastiq_tasks{query="paper-filter",state="running"}'] == 1
            assert task_value(second, "elastiq_task_running") == 1
            assert 'elastiq_failovers_total{pattern="restart",query="paper-filter"}' not in second

            # a failover: SIGKILL the executor; the scheduler relaunches the task (attempt 2)
            (pid,) = cluster.agents[0].executor_pids().values()
            os.killpg(pid, signal.SIGKILL)
            third = wait_for_slowly("a failover in /metrics", lambda: (s := scrape(api.url)).get(
                'elastiq_failovers_total{pattern="restart",query="paper-filter"}', 0) >= 1
                and s, 90)
            assert third['elastiq_task_launches_total{query="paper-filter"}'] == 2
            assert third['elastiq_task_restarts_total{query="paper-filter"}'] == 1
            assert third['elastiq_failover_gap_seconds_count{pattern="restart"}'] == 1
            assert task_value(third, "elastiq_task_attempt") == 2
            assert sink_rows(sink) == len(kept)  # the relaunch resumed, nothing written twice
        finally:
            api.stop()
            service.stop_query(query.query_id)
            wait_for_slowly("the query to stop", lambda: (service.query_status(query.query_id) or {})
                     .get("phase") in ("stopped", "finished", "failed"), 30)
            service.stop(failover=False)
