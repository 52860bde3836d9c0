"""Dashboards, alert rules and the scrape configuration name only metrics the code exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

import interlock.sdk.metrics as agent_metrics
from interlock.gateway.metrics import _series as gateway_series
from interlock.runtime.cluster_metrics import ClusterMetrics, _Limit
from interlock.runtime.health import SweepMetrics
from interlock.runtime.metrics import OrchestratorMetrics
from interlock.runtime.plaincounts import PlainCounter, PlainHistogram
from interlock.transport.subjects import Subjects

REPO = Path(__file__).resolve().parents[2]
OBS = REPO / "observability"
DASHBOARDS = sorted((OBS / "grafana" / "dashboards").glob("*.json"))
RULES = OBS / "prometheus" / "rules" / "interlock.rules.yml"
PROMETHEUS = OBS / "prometheus" / "prometheus.yml"
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")
# Labels Prometheus adds at scrape time, and the histogram bucket label.
SCRAPE_LABELS = {"instance", "job", "le"}


def exported() -> dict[str, set[str]]:
    """Every metric family the orchestrator and the agents export, with its label names."""
    families: dict[str, set[str]] = {}
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    for value in vars(metrics).values():
        if isinstance(value, PlainCounter | PlainHistogram):
            families[value._name] = set(value._labelnames)
    cluster = ClusterMetrics(None, Subjects(), registry=None)
    cluster._lag = {("S", "c"): (1, 1)}
    cluster._queued = {"cap": 1}
    cluster._limits = {"default/w#1": _Limit()}
    cluster._paused = ["cap"]
    cluster._index("r", json.dumps({"status": "running", "workflow": "w", "state": "s"}).encode())
    for family in cluster.collect():
        families[family.name] = {k for s in family.samples for k in s.labels}
    for value in vars(agent_metrics).values():
        if isinstance(value, MetricWrapperBase):
            families[value._name] = set(value._labelnames)
    sweeper = SimpleNamespace(freed=Counter(), read=0)
    for family in SweepMetrics(sweeper).collect():  # type: ignore[arg-type]
        families[family.name] = {k for s in family.samples for k in s.labels}
    gateway = gateway_series(CollectorRegistry())
    for value in (gateway.requests, gateway.duration):
        families[value._name] = set(value._labelnames)
    return families


FAMILIES = exported()


def family_of(name: str) -> str | None:
    if name in FAMILIES:
        return name
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in FAMILIES:
            return name.removesuffix(suffix)
    return None


def exprs(node: Any) -> Iterator[str]:
    """Every PromQL expression in a dashboard (Prometheus targets and variable queries)."""
    if isinstance(node, dict):
        datasource = node.get("datasource")
        is_tempo = isinstance(datasource, dict) and datasource.get("type") == "tempo"
        promql = {"expr", "definition"} | (set() if is_tempo else {"query"})
        for key, value in node.items():
            if key in promql and isinstance(value, str):
                yield value
            else:
                yield from exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from exprs(item)


def check_expr(expr: str, where: str) -> list[str]:
    problems = []
    names = set(re.findall(r"\binterlock_[a-z0-9_]+", expr))
    labels: set[str] = set(SCRAPE_LABELS)
    for name in names:
        family = family_of(name)
        if family is None:
            problems.append(f"{where}: {name} is not exported")
        else:
            labels |= FAMILIES[family]
    for name, matchers in re.findall(r"\b(interlock_[a-z0-9_]+)\{([^}]*)\}", expr):
        family = family_of(name)
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
            if family is not None and label not in FAMILIES[family] | SCRAPE_LABELS:
                problems.append(f"{where}: {name} has no label {label!r}")
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in filter(None, (x.strip() for x in group.split(","))):
            if label not in labels:
                problems.append(f"{where}: no metric of {expr!r} has label {label!r}")
    return problems


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_exported_families_are_known() -> None:
    for name in (
        "interlock_runs_started",
        "interlock_action_duration_seconds",
        "interlock_consumer_lag_messages",
        "interlock_actions_in_flight",
        "interlock_agent_queue_wait_seconds",
        "interlock_agent_tasks",
    ):
        assert name in FAMILIES
    assert all(name.startswith("interlock_") for name in FAMILIES)
    # No run id label: cardinality stays bounded by workflows, states and capabilities.
    assert not any({"run", "run_id", "runid"} & labels for labels in FAMILIES.values())


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboards_name_exported_metrics(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    found = list(exprs(dashboard))
    assert found or path.name == "interlock-run.json"
    problems = [p for expr in found for p in check_expr(expr, path.name)]
    assert not problems, "\n".join(problems)


def test_dashboards_are_well_formed() -> None:
    assert {p.name for p in DASHBOARDS} == {
        "interlock-runs.json",
        "interlock-capabilities.json",
        "interlock-run.json",
    }
    sources = yaml.safe_load((OBS / "grafana/provisioning/datasources/datasources.yml").read_text())
    uids = {d["uid"] for d in sources["datasources"]}
    seen_uids = set()
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        assert d["uid"] not in seen_uids
        seen_uids.add(d["uid"])
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), path.name
        variables = {v["name"] for v in d["templating"]["list"]}
        text = path.read_text()
        for used in set(re.findall(r"\$\{?([a-z_]+)", text)) - {"__rate_interval", "__all"}:
            assert used in variables, f"{path.name}: ${used} is not a variable"
        for panel in d["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (path.name, panel["title"])
            ds = panel.get("datasource")
            if isinstance(ds, dict):
                assert ds["uid"] in uids | {"${datasource}"}, (path.name, panel["title"])
    # The drill-down opens a run's trace in Tempo by its run id attribute.
    run = json.loads((OBS / "grafana/dashboards/interlock-run.json").read_text())
    tempo = [p for p in run["panels"] if p.get("datasource", {}).get("type") == "tempo"]
    assert any(
        'span.interlock.run.id = "$run_id"' in t["query"] for p in tempo for t in p["targets"]
    )
    provider = yaml.safe_load((OBS / "grafana/provisioning/dashboards/dashboards.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def prometheus_sources(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        ds = node.get("datasource")
        if isinstance(ds, dict) and ds.get("type") == "prometheus":
            yield ds
        for value in node.values():
            yield from prometheus_sources(value)
    elif isinstance(node, list):
        for item in node:
            yield from prometheus_sources(item)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panels_use_the_datasource_variable(path: Path) -> None:
    """Every Prometheus query goes to the dashboard's $datasource (a hidden variable):
    the datasource chosen on import, not a hard-coded uid."""
    d = json.loads(path.read_text())
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    sources = list(prometheus_sources(d))
    assert sources
    assert {ds["uid"] for ds in sources} == {"${datasource}"}


def test_the_gateway_is_on_a_dashboard_and_scraped() -> None:
    runs = (OBS / "grafana/dashboards/interlock-runs.json").read_text()
    assert "interlock_gateway_requests_total" in runs
    assert "interlock_gateway_request_duration_seconds_bucket" in runs
    jobs = {j["job_name"]: j for j in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    assert jobs["interlock-gateway"]["dns_sd_configs"][0]["port"] == 8480


def test_alert_rules_name_exported_metrics() -> None:
    found = rules()
    names = {r["alert"] for r in found}
    assert {
        "InterlockRunStuckInState",
        "InterlockDeadLetters",
        "InterlockCapabilityWithoutWorker",
        "InterlockConsumerLag",
    } <= names
    problems = [p for r in found for p in check_expr(r["expr"], r["alert"])]
    assert not problems, "\n".join(problems)
    for rule in found:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]


def test_scrape_config_targets_the_documented_ports() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["interlock-orchestrator"]["dns_sd_configs"][0]["port"] == 9464
    assert jobs["interlock-agents"]["dns_sd_configs"][0]["port"] == 9465
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS.parent / rule_file).is_file()


def test_the_checker_catches_unknown_names() -> None:
    assert check_expr("rate(interlock_nonsense_total[5m])", "x")
    assert check_expr('interlock_runs_started_total{colour="red"}', "x")
    assert check_expr("sum by (colour) (interlock_runs_started_total)", "x")
    assert not check_expr("sum by (workflow) (rate(interlock_runs_started_total[5m]))", "x")


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)


def promtool(*args: str) -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_checks_the_rules_and_the_config() -> None:
    promtool("check", "rules", str(RULES))
    promtool("check", "config", str(PROMETHEUS))


@needs_promtool
def test_promtool_alert_unit_tests() -> None:
    promtool("test", "rules", str(RULES.with_name("interlock.rules.test.yml")))
