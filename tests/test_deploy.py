"""The deployment files: the compose file validates with docker-compose, Prometheus scrapes both
schedulers and loads the alert rules, and every metric name the alert rules and the Grafana
dashboard query exists in a scheduler's registry (so a renamed metric breaks this test, not a
dashboard in production). The compose schedulers' command is parsed by `elastiq`'s own parser
and its path roots admit the deploy walkthrough's spec; setup.sh honours its options; the images
install the locked versions and build on supported bases."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any, Iterator

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


# --- the compose commands against the code they run -------------------------------------------

def compose_services() -> dict[str, dict]:
    services: dict[str, dict] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())[
        "services"]
    return services


def scheduler_args(name: str) -> Any:
    """The compose service's command parsed by `elastiq`'s own argument parser."""
    from elastiq.cli import _parser
    from elastiq.service_cli import cmd_scheduler

    args = _parser().parse_args([str(a) for a in compose_services()[name]["command"]])
    assert args.handler is cmd_scheduler
    return args


@pytest.mark.parametrize("name", ["scheduler-1", "scheduler-2"])
def test_the_compose_schedulers_admit_the_walkthroughs_spec_folder(name: str) -> None:
    """deploy/README.md submits /data/paper-filter.xml, reading /data/data/numbers.jsonl and
    writing /data/out/: the roots the scheduler derives from its compose arguments (as
    `elastiq scheduler` does, `common.paths.service_roots`) must admit them, in the container's
    own paths (no symbolic links resolved: none exist there)."""
    from common.paths import PathRefused, confine, service_roots

    args = scheduler_args(name)
    mounts = {str(v).split(":")[1]: str(v).split(":")[0]
              for v in compose_services()[name].get("volumes", [])}
    assert mounts.get("/data") == "./deploy/data" and "/data" in args.path_root
    roots = service_roots(args.state_dir, args.path_root, cwd="/var/lib/elastiq", environ={},
                          realpath=lambda p: p)
    for path in ("/data/paper-filter.xml", "/data/data/numbers.jsonl",
                 "/data/out/paper-filter.jsonl"):
        assert confine(path, "/data", roots, realpath=lambda p: p) == path
    with pytest.raises(PathRefused, match="outside the allowed folders"):
        confine("/etc/passwd", "/data", roots, realpath=lambda p: p)
    without = service_roots(args.state_dir, [], cwd="/var/lib/elastiq", environ={},
                            realpath=lambda p: p)  # the command as it was: no --path-root
    with pytest.raises(PathRefused):
        confine("/data/paper-filter.xml", "/data", without, realpath=lambda p: p)


def test_the_walkthroughs_spec_compiles_with_the_compose_schedulers_roots(tmp_path: Path
                                                                          ) -> None:
    """The walkthrough replayed in a folder standing for /data (deploy/README.md's `cp`s): the
    spec compiles, inputs checked, with the roots of scheduler-1's compose arguments."""
    from common.paths import service_roots
    from compiler.pipeline import compile_spec_file

    data = tmp_path / "data"
    (data / "out").mkdir(parents=True)
    (data / "data").mkdir()
    shutil.copy(ROOT / "examples" / "paper-filter.xml", data)
    shutil.copy(ROOT / "examples" / "data" / "numbers.jsonl", data / "data")
    args = scheduler_args("scheduler-1")
    here = {"/data": str(data)}
    roots = service_roots(tmp_path / "state", [here.get(p, p) for p in args.path_root],
                          environ={})
    compilation = compile_spec_file(data / "paper-filter.xml", path_roots=roots,
                                    check_inputs=True)
    assert compilation.query.sinks == {"sink": str(data / "out" / "paper-filter.jsonl")}


def test_setup_honours_its_options_and_refuses_unknown_ones() -> None:
    def plan(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), *options, "--dry-run"],
                              capture_output=True, text=True, timeout=30)

    def pip_line(out: str) -> str:
        return next(line for line in out.splitlines() if line.startswith("pip install"))

    assert pip_line(plan("--test").stdout).endswith("-e .[test]")
    assert "zookeeper" in plan("--test").stdout
    assert "class archive" in plan("--test").stdout
    quiet = plan("--test", "--no-test-extras", "--no-class-archive").stdout
    assert quiet.splitlines() == [pip_line(quiet)] and quiet.rstrip().endswith("-e .")
    assert "--constraint requirements.lock" in plan("--no-test-extras", "--locked").stdout
    bad = plan("--no-test-extra")
    assert bad.returncode == 2 and "unknown option '--no-test-extra'" in bad.stderr


def test_the_images_install_the_locked_versions_of_every_runtime_dependency() -> None:
    from packaging.requirements import Requirement

    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name] = version
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for text in declared:
        req = Requirement(text)
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        assert key in pins and req.specifier.contains(pins[key]), (text, pins.get(key))
    for dockerfile in (ROOT / "Dockerfile", DEPLOY / "agent" / "Dockerfile"):
        text = dockerfile.read_text()
        assert "requirements.lock" in text and "setup.sh --no-test-extras --locked" in text


def bases_of(dockerfile: Path) -> list[str]:
    """The images a Dockerfile builds on (`FROM x`) and its Ubuntu base argument."""
    return [line.split()[1] for line in dockerfile.read_text().splitlines()
            if line.startswith(("FROM ", "ARG UBUNTU="))]


def test_no_image_builds_on_an_end_of_life_base() -> None:
    """Bases out of support (Ubuntu 16.04 under the mesosphere 1.7 images, Debian 12 and
    older: bookworm left regular security support in June 2026; Python 3.8 and older): none may
    come back. The scheduler image takes the agents' Java (Temurin 17), not a distribution's."""
    end_of_life = re.compile(r"mesosphere/|ubuntu:(1[0-9]|20)\.|xenial|bionic|focal|bookworm|"
                             r"bullseye|buster|stretch|jessie|python:3\.[0-8]\b")
    dockerfiles = [ROOT / "Dockerfile", DEPLOY / "agent" / "Dockerfile"]
    bases = [b for f in dockerfiles for b in bases_of(f)] + [
        str(s["image"]) for s in compose_services().values() if "build" not in s]
    assert bases and not [b for b in bases if end_of_life.search(b.replace("ARG", ""))], bases
    assert "ubuntu:22.04" in (DEPLOY / "agent" / "Dockerfile").read_text()
    javas = [[b for b in bases_of(f) if b.startswith("eclipse-temurin:")] for f in dockerfiles]
    assert javas == [["eclipse-temurin:17-jre-jammy"]] * 2, javas
