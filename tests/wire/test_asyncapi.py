"""contracts/asyncapi.yaml: generated from the code, and valid for the AsyncAPI parser."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from interlock.auth import jwt, roles
from interlock.auth.accounts import JS_API_TAG
from interlock.auth.keys import KeyStore
from interlock.auth.roles import Role
from interlock.contracts import wire
from interlock.transport import tasks
from interlock.transport.subjects import Subjects
from support.node import ROOT, node_or_skip, npm_install

DOC = ROOT / "contracts" / "asyncapi.yaml"


def _doc() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(DOC.read_text(encoding="utf-8"))
    return loaded


def test_the_asyncapi_parser_finds_no_error() -> None:
    node, npm = node_or_skip()
    folder = ROOT / "contracts" / "validate"
    npm_install(npm, folder)
    done = subprocess.run(
        [node, "validate.mjs", str(DOC)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "valid AsyncAPI 3.0.0: 13 channels" in done.stdout


def test_the_validator_rejects_a_broken_document(tmp_path: Any) -> None:
    """The check can fail: an operation pointing at a channel that does not exist."""
    node, npm = node_or_skip()
    folder = ROOT / "contracts" / "validate"
    npm_install(npm, folder)
    broken = wire.document()
    broken["operations"]["receiveTask"]["channel"] = {"$ref": "#/channels/nowhere"}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    done = subprocess.run(
        [node, str(folder / "validate.mjs"), str(path)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "INVALID" in done.stdout


def test_channels_say_who_may_publish_as_the_roles_do() -> None:
    channels = _doc()["channels"]
    perms = {name: c["x-interlock-permissions"] for name, c in channels.items()}
    assert perms["taskRequests"]["publish"] == ["orchestrator"]
    assert "agent" in perms["taskRequests"]["readThroughJetStream"]
    assert perms["answers"]["publish"] == ["orchestrator", "agent"]
    # Answers by request: sent by the agents of the capability, served by the orchestrator.
    assert perms["answerRequests"]["publish"] == ["orchestrator", "agent"]
    assert perms["answerRequests"]["subscribe"] == ["orchestrator"]
    assert perms["cancelNotices"]["subscribe"] == ["orchestrator", "agent"]
    # Start and cancel append to a run's log: the CLI's and the HTTP gateway's.
    assert perms["runLog"]["publish"] == ["orchestrator", "operator", "gateway"]
    assert perms["addressedEvents"]["publish"] == ["orchestrator", "operator", "gateway"]
    assert perms["timerSchedules"]["publish"] == ["orchestrator"]
    assert "publisher" in perms["inboundEvents"]["publish"]
    assert "agent" in perms["heartbeats"]["publish"]
    assert "agent" not in perms["runLog"].get("readThroughJetStream", [])
    # The roles component is roles.templates() itself.
    templated = roles.templates(Subjects())
    component = _doc()["components"]["x-interlock-roles"]
    assert component["agent"]["publishAllow"] == list(templated["agent"].pub_allow)


def test_the_task_consumer_is_the_one_the_code_makes() -> None:
    consumer = _doc()["operations"]["receiveTask"]["x-interlock-consumer"]
    config = tasks.task_consumer_config(Subjects(), "x")
    assert consumer["durableName"] == "cap_{capability_token}"
    assert consumer["ackPolicy"] == "explicit"
    assert consumer["ackWaitSeconds"] == config.ack_wait == tasks.TASK_ACK_WAIT
    assert consumer["maxAckPending"] == config.max_ack_pending == tasks.TASK_MAX_ACK_PENDING
    assert consumer["stream"] == Subjects().tasks_stream


def test_examples_carry_every_header_the_encoders_write() -> None:
    """Each message example is the encoder's output, and its header schema names every
    header in it (so a new header cannot go undocumented)."""
    messages = _doc()["components"]["messages"]
    for name in ("TaskRequest", "TaskCompleted", "TaskFailed", "CancelNotice"):
        message = messages[name]
        documented = set(message["headers"]["properties"])
        for example in message["examples"]:
            missing = set(example["headers"]) - documented
            assert not missing, f"{name}: headers without a schema: {missing}"
            required = set(message["headers"].get("required", ()))
            assert required <= set(example["headers"]), f"{name}: {required}"
    answer = messages["TaskCompleted"]["headers"]["required"]
    assert {"ce-attempt", "ce-actionid", "ce-runid", tasks.TOKEN_HEADER} <= set(answer)


def test_the_description_names_every_party_a_role_is_made_for() -> None:
    """The document's first sentence lists who talks over NATS: one party per role of
    ``components.x-interlock-roles`` (each has a credential and permissions of its own)."""
    doc = _doc()
    first = doc["info"]["description"].split(". ", 1)[0]
    missing = [r for r in doc["components"]["x-interlock-roles"] if r not in first]
    assert missing == [], first


def test_each_party_s_api_prefix_is_the_one_its_credential_names(tmp_path: Any) -> None:
    """``x-interlock-accounts.jetStreamApiPrefix`` is the ``js-api:`` tag of each party's
    credential as ``interlock creds issue`` makes it: a publisher's included, which reads
    its own object bucket under it (a contract that said it used no API sent a client
    writing an event by reference to ``$JS.API``, which its account answers itself)."""
    prefixes = _doc()["components"]["x-interlock-accounts"]["jetStreamApiPrefix"]
    keys = KeyStore(tmp_path / "keys").ensure()
    named = {}
    for role in (
        Role("agent", capabilities=("demo.greet",)),
        Role("publisher", events=("acme.>",)),
        Role("gateway"),
    ):
        text, _ = keys.issue(role, Subjects(), name=f"a-{role.name}")
        tags = jwt.decode_claims(jwt.parse_creds(text)[0])["nats"]["tags"]
        [tag] = [t for t in tags if t.startswith(JS_API_TAG)]
        named[role.name] = tag.removeprefix(JS_API_TAG)
    assert prefixes == named
    assert prefixes["publisher"] == Subjects().party_js_api
