"""The dashboards and alert rules against a real Prometheus (Debian's ``prometheus``)
scraping a running stack: ``interlock dev`` (the orchestrator's and agents' metrics, and the
HTTP gateway's), under ordinary traffic with failed runs, a cancelled run and a map that
fails fast. Every panel's query, and every variable's, evaluates without error; every rule
evaluates without error and none is pending or firing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
OBS = REPO / "observability"
DASHBOARDS = sorted((OBS / "grafana" / "dashboards").glob("*.json"))
RULES = OBS / "prometheus" / "rules" / "interlock.rules.yml"
INTERLOCK = str(Path(sys.executable).with_name("interlock"))
PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="prometheus is not installed (Debian: apt-get install prometheus)",
    ),
    pytest.mark.timeout(300),
]

WORKFLOWS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: obs-ok}
spec:
  inputs: {message: {type: string, default: hi}}
  initial_state: work
  states:
    work:
      actions:
        - capability: echo
          input: {message: "{{ inputs.message }}"}
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal}
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: obs-failing}
spec:
  initial_state: work
  states:
    work:
      actions:
        - capability: echo
          input: "not an object"
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal}
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: obs-waiting}
spec:
  initial_state: approval
  states:
    approval:
      type: human_in_the_loop
      on:
        - {event: approval.granted, goto: done}
    done: {type: terminal}
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: obs-fanout}
spec:
  inputs: {items: {type: list, required: true}}
  initial_state: fan
  states:
    fan:
      map:
        over: inputs.items
        as: item
        parallelism: 4
        action:
          capability: echo
          input: "{{ item }}"
      on:
        - {event: task.completed, goto: done}
      catch:
        - {errors: ["*"], goto: handled}
    done: {type: terminal}
    handled: {type: terminal}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, token: str | None = None) -> Any:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def post_json(url: str, body: Any, token: str) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


class Dev:
    """``interlock dev`` in a folder of its own, its output read as it comes."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.metrics_port = free_port()
        self.http_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
        env["INTERLOCK_CONTEXT"] = str(home / "context.json")
        self.env = env
        self.log = (home / "dev.log").open("w")
        self.process = subprocess.Popen(
            [
                INTERLOCK,
                "dev",
                "--port",
                "0",
                "--http-port",
                str(self.http_port),
                "--metrics-port",
                str(self.metrics_port),
                "--data-dir",
                str(home / ".interlock"),
            ],
            cwd=home,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = self.wait_for(r"export INTERLOCK_URL=(\S+)")
        self.wait_for("orchestrator running")
        self.token = (home / ".interlock" / "creds" / "http-operator.token").read_text().strip()
        self.http = f"http://127.0.0.1:{self.http_port}"

    def output(self) -> str:
        return (self.home / "dev.log").read_text()

    def wait_for(self, pattern: str, within: float = 60) -> str:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output())
            if found is not None:
                return found.group(1) if found.groups() else found.group(0)
            assert self.process.poll() is None, self.output()
            time.sleep(0.2)
        raise AssertionError(f"interlock dev never said {pattern!r}:\n{self.output()}")

    def cli(self, *args: str) -> str:
        env = dict(self.env)
        env["INTERLOCK_URL"] = self.url
        env["INTERLOCK_CREDS"] = str(self.home / ".interlock" / "creds" / "operator.creds")
        done = subprocess.run(
            [INTERLOCK, *args], cwd=self.home, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


class Prometheus:
    """A Prometheus server scraping ``targets`` (job name -> host:port) every second and
    evaluating the project's alert rules every second."""

    def __init__(self, home: Path, targets: dict[str, str]) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        path = home / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = (home / "prometheus.log").open("w")
        assert PROMETHEUS is not None
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={path}",
                f"--storage.tsdb.path={home / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.api = f"http://127.0.0.1:{self.port}/api/v1"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                get_json(f"{self.api}/status/runtimeinfo")
                break
            assert self.process.poll() is None, (home / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus never answered"
            time.sleep(0.3)

    def query(self, promql: str) -> dict[str, Any]:
        url = f"{self.api}/query?" + urllib.parse.urlencode({"query": promql})
        try:
            answer: dict[str, Any] = get_json(url)
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read() or b"{}")
        return answer

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Dev, Prometheus]]:
    home = tmp_path_factory.mktemp("watched")
    dev = Dev(home)
    prometheus = None
    try:
        prometheus = Prometheus(
            home,
            {
                "interlock-orchestrator": f"127.0.0.1:{dev.metrics_port}",
                "interlock-gateway": f"127.0.0.1:{dev.http_port}",
            },
        )
        traffic(dev)
        yield dev, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        dev.stop()


def traffic(dev: Dev) -> None:
    """Ordinary traffic: runs that complete, runs that fail, a run cancelled while it
    waits for a person, maps that fail fast (their siblings cancelled), events and reads."""
    (dev.home / "workflows.yaml").write_text(WORKFLOWS)
    dev.cli("apply", "workflows.yaml")
    started = [
        post_json(
            f"{dev.http}/runs", {"workflow": "obs-ok", "inputs": {"message": f"m{n}"}}, dev.token
        )
        for n in range(20)
    ]
    started += [
        post_json(f"{dev.http}/runs", {"workflow": "obs-failing"}, dev.token) for _ in range(2)
    ]
    items = [{"message": "a"}, {"message": "b"}, "not an object", {"message": "c"}]
    started += [
        post_json(
            f"{dev.http}/runs", {"workflow": "obs-fanout", "inputs": {"items": items}}, dev.token
        )
        for _ in range(3)
    ]
    waiting = post_json(f"{dev.http}/runs", {"workflow": "obs-waiting"}, dev.token)["run_id"]
    for answer in started:
        get_json(f"{dev.http}/runs/{answer['run_id']}/result?timeout=60", dev.token)
    dev.cli("cancel", waiting, "--reason", "not needed")
    get_json(f"{dev.http}/runs", dev.token)
    get_json(f"{dev.http}/agents", dev.token)


def until(probe: Any, what: str, within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


ANY_SERIES = '{__name__=~"interlock_.+"}'


def grafana_to_promql(expr: str) -> str:
    """A panel's query as Grafana would send it with every variable at "All"."""
    found = re.fullmatch(r"\s*label_values\((?:(.+),\s*)?(\w+)\)\s*", expr)
    if found is not None:  # a variable's query
        metric, label = found.groups()
        return f"count by ({label}) ({metric or ANY_SERIES})"
    expr = expr.replace("$__rate_interval", "1m").replace("${__rate_interval}", "1m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def dashboard_queries() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for variable in dashboard["templating"]["list"]:
            query = variable.get("query")
            text = query.get("query") if isinstance(query, dict) else None
            if variable["type"] == "query" and text:
                out.append((path.name, f"variable {variable['name']}", text))
        for panel in dashboard["panels"]:
            ds = panel.get("datasource") or {}
            if ds.get("type") == "tempo":
                continue
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((path.name, panel["title"], target["expr"]))
    return out


def test_every_dashboard_query_evaluates(watched: tuple[Dev, Prometheus]) -> None:
    _, prometheus = watched

    def scraped() -> bool:
        up = prometheus.query("up")["data"]["result"]
        jobs = {r["metric"]["job"] for r in up if r["value"][1] == "1"}
        done = prometheus.query('sum(interlock_runs_completed_total{workflow="obs-ok"})')
        counted = done["data"]["result"]
        # rate() needs two samples in its window: a few scrapes since the runs were counted.
        samples = prometheus.query(
            'min(count_over_time(interlock_runs_completed_total{workflow="obs-ok"}[1m]))'
        )["data"]["result"]
        return {"interlock-orchestrator", "interlock-gateway"} <= jobs and bool(
            counted
            and float(counted[0]["value"][1]) >= 20
            and samples
            and float(samples[0]["value"][1]) >= 5
        )

    until(scraped, "prometheus never scraped the stack's runs")
    queries = dashboard_queries()
    assert len(queries) > 30
    failures = []
    empty = []
    for dashboard, panel, expr in queries:
        promql = grafana_to_promql(expr)
        answer = prometheus.query(promql)
        if answer.get("status") != "success":
            failures.append(f"{dashboard} / {panel}: {promql}: {answer.get('error')}")
        elif not answer["data"]["result"]:
            empty.append(f"{dashboard} / {panel}")
    assert not failures, "\n".join(failures)
    # The stack's own series are there: most panels show something.
    assert len(empty) < len(queries) / 2, empty
    gateway = prometheus.query('sum(interlock_gateway_requests_total{route="/runs"})')
    assert gateway["data"]["result"], "the gateway's requests were not scraped"


def test_the_alert_rules_stay_quiet(watched: tuple[Dev, Prometheus]) -> None:
    dev, prometheus = watched

    def evaluated() -> list[dict[str, Any]] | None:
        groups = get_json(f"{prometheus.api}/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return (
            rules
            if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules)
            else None
        )

    until(evaluated, "the rules were never evaluated")
    time.sleep(5)  # a few more evaluations, over the traffic's series
    rules = evaluated()
    assert rules is not None
    broken = [f"{r['name']}: {r.get('lastError')}" for r in rules if r.get("health") != "ok"]
    assert not broken, broken
    alerts = get_json(f"{prometheus.api}/alerts")["data"]["alerts"]
    assert alerts == [], json.dumps(alerts, indent=1)
    # Map fail-fast's cancelled siblings answered late: dropped, not dead-lettered.
    letters = dev.cli("dead-letters", "list", "-o", "json").strip()
    assert json.loads(letters or "[]") == [], letters
    dead = prometheus.query("sum(interlock_dead_letters_total)")["data"]["result"]
    assert not dead or float(dead[0]["value"][1]) == 0, dead
