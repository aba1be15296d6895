"""The deployment files: the compose file validates with docker-compose, Prometheus scrapes both
schedulers and loads the alert rules, and every metric name the alert rules and the Grafana
dashboard query exists in a scheduler's registry (so a renamed metric breaks this test, not a
dashboard in production)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from scheduler.metrics import SchedulerMetrics

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PROMETHEUS_OWN = {"up"}  # series Prometheus makes itself for every target
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                "group_right", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small scanner, enough for our files):
    strings, label matchers, ranges, label lists and function calls are not names."""
    text = re.sub(r'"[^"]*"', "", expr)
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)\b(\s*\()?", text):
        if not m.group(2) and m.group(1).lower() not in PROMQL_WORDS:
            names.add(m.group(1))
    return names


def test_metric_name_scanner_finds_names_and_skips_the_rest() -> None:
    expr = ('histogram_quantile(0.9, sum by (le, pattern) (rate(x_bucket{a="b c"}[5m]))) > 1 '
            'and on (instance) y_total offset 5m or absent(z) unless w{q=~"$query"}')
    assert metric_names(expr) == {"x_bucket", "y_total", "z", "w"}


@pytest.fixture(scope="module")
def exposed() -> set[str]:
    return SchedulerMetrics().sample_names() | PROMETHEUS_OWN


def alert_rules() -> Iterator[dict]:
    for group in yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"]:
        yield from group["rules"]


def dashboard_exprs() -> Iterator[str]:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "elastiq.json").read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for var in dash.get("templating", {}).get("list", []):
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        yield re.sub(r"^label_values\(([^,)]+).*\)$", r"\1", text)


def test_docker_compose_config_validates() -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")
    done = subprocess.run([exe, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_compose_has_every_service_the_deployment_needs() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert {"zookeeper", "mesos-master", "agent-1", "agent-2", "scheduler-1", "scheduler-2",
            "prometheus", "grafana"} <= set(services)
    for name in ("scheduler-1", "scheduler-2"):
        command = services[name]["command"]
        assert command[0] == "scheduler" and "zk://zookeeper:2181/mesos" in command
        assert command[command.index("--listen") + 1] == "0.0.0.0:8088"
    for name, service in services.items():  # published ports stay on the host's loopback
        assert all(str(p).startswith("127.0.0.1:") for p in service.get("ports", [])), name


def test_prometheus_scrapes_both_schedulers_and_loads_the_alerts() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "elastiq-scheduler"]
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {"scheduler-1:8088", "scheduler-2:8088"}
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]


def test_alert_rules_cover_the_operators_cases_and_use_existing_metrics(exposed: set[str]
                                                                      ) -> None:
    rules = list(alert_rules())
    names = {r["alert"] for r in rules}
    assert {"ElastiqTaskStalled", "ElastiqBacklogGrowing", "ElastiqNoLeader",
            "ElastiqSchedulerDown"} <= names
    for rule in rules:
        used = metric_names(rule["expr"])
        assert used, rule["alert"]
        assert used <= exposed, (rule["alert"], used - exposed)
        assert rule["annotations"]["summary"] and rule["labels"]["severity"]


def test_dashboard_parses_and_queries_only_existing_metrics(exposed: set[str]) -> None:
    exprs = list(dashboard_exprs())
    assert len(exprs) >= 15
    used = set().union(*(metric_names(e) for e in exprs))
    assert used <= exposed, used - exposed
    for needed in ("elastiq_task_tuples_in_total", "elastiq_task_backlog",
                   "elastiq_scheduler_is_leader", "elastiq_failovers_total",
                   "elastiq_offers_declined_total", "elastiq_placement_seconds_bucket",
                   "elastiq_operator_parallelism", "elastiq_rescales_total",
                   "elastiq_rescale_pause_seconds_bucket", "elastiq_elastic_decisions_total"):
        assert needed in used


def test_dashboard_shows_parallelism_over_time_per_operator() -> None:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "elastiq.json").read_text())
    (panel,) = [p for p in dash["panels"] if p["title"] == "Parallelism over time"]
    (target,) = panel["targets"]
    assert metric_names(target["expr"]) == {"elastiq_operator_parallelism"}
    assert "operator" in target["legendFormat"] and '$query' in target["expr"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_provisioning_points_at_the_dashboards_and_prometheus() -> None:
    prov = DEPLOY / "grafana" / "provisioning"
    (ds,) = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert ds["url"] == "http://prometheus:9090" and ds["type"] == "prometheus"
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "elastiq.json").read_text())
    uids = {t["datasource"]["uid"] for p in dash["panels"] for t in p.get("targets", [])}
    assert uids == {ds["uid"]}
    (provider,) = yaml.safe_load((prov / "dashboards" / "elastiq.yml").read_text())["providers"]
    compose = (ROOT / "docker-compose.yml").read_text()
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in compose
