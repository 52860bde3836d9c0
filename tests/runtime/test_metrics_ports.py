"""The metrics port as a user gives it: 0 picks a free port, as `--port 0` and `--http-port 0`
do, and the process says which; `--no-metrics` serves none."""

from __future__ import annotations

import signal
import socket
import urllib.request
import uuid
from pathlib import Path

import pytest

from support.runtime import cli_env, interlock_bg

pytestmark = pytest.mark.timeout(120)


def _answers(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as page:
        return int(page.status)


def test_dev_metrics_port_0_picks_a_free_port_and_prints_it(tmp_path: Path) -> None:
    dev = interlock_bg(
        "dev", "--port", "0", "--no-http", "--no-agents", "--metrics-port", "0",
        "--data-dir", str(tmp_path / "data"),
        env=cli_env("", "il", XDG_CONFIG_HOME=str(tmp_path / "config")), cwd=tmp_path,
    )  # fmt: skip
    try:
        found = dev.wait_for(r"metrics of the orchestrator and the agents at (http://\S+)/metrics")
        url = found.group(1)
        assert not url.endswith(":0"), url
        assert _answers(f"{url}/metrics") == 200
        dev.wait_for("orchestrator running")
    finally:
        dev.signal(signal.SIGINT)
        assert dev.wait() == 0, dev.output


BUSY = (
    r"cannot serve metrics on port {port}: .*; running without /metrics, /healthz and /readyz: "
    r"give --metrics-port \(INTERLOCK_METRICS_PORT\) a free port, 0 for any, or --no-metrics"
)


def test_a_busy_metrics_port_names_the_flag_and_variable_to_change(
    tmp_path: Path, nats_url: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = interlock_bg(
            "agent", "run", "echo", "--metrics-host", "127.0.0.1", "--metrics-port", str(port),
            env=cli_env(nats_url, "mb" + uuid.uuid4().hex[:8]),
        )  # fmt: skip
        try:
            agent.wait_for(BUSY.format(port=port))
            agent.wait_for("TASKS does not exist yet")  # and runs on
        finally:
            agent.signal(signal.SIGINT)
            assert agent.wait() == 0, agent.output
        dev = interlock_bg(
            "dev", "--port", "0", "--no-http", "--no-agents", "--metrics-port", str(port),
            "--data-dir", str(tmp_path / "data"),
            env=cli_env("", "il", XDG_CONFIG_HOME=str(tmp_path / "config")), cwd=tmp_path,
        )  # fmt: skip
        try:
            dev.wait_for(BUSY.format(port=port))
            dev.wait_for("orchestrator running")
        finally:
            dev.signal(signal.SIGINT)
            assert dev.wait() == 0, dev.output


def test_agent_metrics_port_0_picks_a_free_port_and_no_metrics_serves_none(
    nats_url: str,
) -> None:
    env = cli_env(nats_url, "mp" + uuid.uuid4().hex[:8])  # nothing provisioned: no orchestrator
    agent = interlock_bg("agent", "run", "echo", "--metrics-port", "0", env=env)
    try:
        found = agent.wait_for(r"metrics and health on 0\.0\.0\.0:(\d+) ")
        port = int(found.group(1))
        assert port != 0
        assert _answers(f"http://127.0.0.1:{port}/healthz") == 200
    finally:
        agent.signal(signal.SIGINT)
        assert agent.wait() == 0, agent.output
    none = interlock_bg("agent", "run", "echo", "--no-metrics", env=env)
    try:
        none.wait_for("TASKS does not exist yet")  # it runs, past where the endpoint starts...
        none.signal(signal.SIGINT)
        assert none.wait() == 0, none.output
        assert "metrics and health on" not in none.output  # ...with no endpoint
    finally:
        none.signal(signal.SIGINT)
