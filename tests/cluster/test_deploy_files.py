"""deploy/ cannot run here (no container engine): check that it is consistent instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from interlock.cli.main import build_parser
from interlock.runtime.embedded import nats_server_binary
from interlock.runtime.health import DEFAULT_AGENT_PORT, DEFAULT_SERVE_PORT

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and "metadata" in d]
    return docs


def test_compose_services_and_their_files() -> None:
    services = compose()["services"]
    assert {f"nats-{i}" for i in (1, 2, 3)} <= set(services)
    for name in ("orchestrator", "agent-echo", "prometheus", "tempo", "otel-collector", "grafana"):
        assert name in services, name
    assert services["orchestrator"]["deploy"]["replicas"] == 2
    # Every bind-mounted file or folder exists (paths are relative to deploy/).
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source == "./secrets" or source.startswith("./secrets/"):
                continue  # made by the `creds` setup step
            if source.startswith("."):
                assert (DEPLOY / source).resolve().exists(), f"{name}: {source}"
    build = services["orchestrator"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve().is_file()


def test_compose_interlock_settings() -> None:
    services = compose()["services"]
    for name in ("orchestrator", "gateway", "agent-echo", "agent-http-fetch"):
        env = services[name]["environment"]
        assert env["INTERLOCK_REPLICAS"] == "3", name
        urls = env["INTERLOCK_URL"].split(",")
        assert sorted(urls) == [f"nats://nats-{i}:4222" for i in (1, 2, 3)], name
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://otel-collector:")
    assert str(DEFAULT_SERVE_PORT) in services["orchestrator"]["command"]
    assert str(DEFAULT_AGENT_PORT) in services["agent-echo"]["command"]
    # The commands are ones the CLI accepts.
    parser = build_parser()
    for name in ("orchestrator", "agent-echo", "agent-http-fetch"):
        args = parser.parse_args(services[name]["command"])
        assert args.metrics_port in (DEFAULT_SERVE_PORT, DEFAULT_AGENT_PORT)
    gateway = parser.parse_args(services["gateway"]["command"])
    assert f"{gateway.http_port}:{gateway.http_port}" in services["gateway"]["ports"]
    assert str(gateway.http_port) in services["gateway"]["healthcheck"]["test"][-1]


def test_nats_cluster_config_is_valid() -> None:
    conf = DEPLOY / "nats" / "cluster.conf"
    text = conf.read_text()
    assert len(re.findall(r"nats://nats-\d:6222", text)) == 3
    done = subprocess.run(
        [nats_server_binary(), "-c", str(conf), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"NATS_SERVER_NAME": "nats-1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_kubernetes_manifests() -> None:
    docs = manifests()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    # Orchestrator and agents are scaled separately.
    assert set(deployments) == {
        "interlock-orchestrator",
        "interlock-gateway",
        "interlock-agent-echo",
    }
    assert ("ConfigMap", "interlock") in kinds
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert config["INTERLOCK_REPLICAS"] == "3"
    parser = build_parser()
    for name, deployment in deployments.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        port = container["ports"][0]["containerPort"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)
        args = parser.parse_args(container["args"])
        if name == "interlock-gateway":  # health and metrics on its HTTP port
            assert args.http_port == port, name
            continue
        assert args.metrics_port == port, name
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
    kustomization = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (DEPLOY / "kubernetes" / resource).is_file()
    values = yaml.safe_load((DEPLOY / "kubernetes" / "nats-values.yaml").read_text())
    assert values["config"]["cluster"]["replicas"] == 3
    assert values["config"]["jetstream"]["enabled"] is True


def test_dockerfile_copies_what_the_package_needs() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    for needed in ("pyproject.toml", "orchestrator", "agents", '".[otlp]"'):
        assert needed in text
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), source


def test_every_party_has_its_own_credential() -> None:
    """NATS trusts the installation's keys; the orchestrator and each agent get only their
    own creds, from the setup step that issues them (compose) or a Secret (Kubernetes)."""
    services = compose()["services"]
    assert services["nats-1"]["command"] == ["-c", "/etc/nats/secured.conf"]
    setup = services["creds"]
    assert setup["profiles"] == ["setup"]
    script = setup["command"][0]
    secrets = compose()["secrets"]
    for name in ("orchestrator", "gateway", "agent-echo", "agent-http-fetch"):
        secret = name.replace("-", "_") + "_creds"
        assert services[name]["secrets"] == [secret], name
        assert services[name]["environment"]["INTERLOCK_CREDS"] == f"/run/secrets/{secret}"
        assert secrets[secret]["file"] == f"./secrets/{name}.creds"
        assert f"issue {name} " in script, name
    parser = build_parser()
    for line in script.splitlines():
        line = line.strip()
        if line.startswith("issue ") and "()" not in line:
            words = line.replace("'", "").split()[2:]
            args = parser.parse_args(["creds", "issue", *words, "-o", "x.creds"])
            assert args.func.__name__ == "cmd_issue"
    deployments = {d["metadata"]["name"]: d for d in manifests() if d["kind"] == "Deployment"}
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["INTERLOCK_CREDS"] == "/var/run/interlock/nats.creds", name
        (volume,) = [v for v in pod["volumes"] if v["name"] == "nats-creds"]
        assert volume["secret"]["secretName"] == f"{name}-creds"


def test_secured_nats_config_is_valid(tmp_path: Path) -> None:
    """The nodes' secured.conf with an auth.conf from `interlock creds server-config`."""
    from interlock.auth.keys import KeyStore

    keys = KeyStore(tmp_path / "keys").ensure()
    for name in ("cluster.conf", "secured.conf"):
        (tmp_path / name).write_text((DEPLOY / "nats" / name).read_text())
    (tmp_path / "auth.conf").write_text(keys.server_config(tmp_path / "jwt"))
    done = subprocess.run(
        [nats_server_binary(), "-c", str(tmp_path / "secured.conf"), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"NATS_SERVER_NAME": "nats-1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
