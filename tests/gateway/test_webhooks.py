"""``POST /webhooks/<name>``: each signature scheme valid, invalid, replayed and stale."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from standardwebhooks import Webhook as StandardSender

from interlock.transport.subjects import Subjects
from support.gateway import TIMEOUT, GatewayStack, gateway_stack, yaml

pytestmark = pytest.mark.asyncio

GITHUB_SECRET = "It's a Secret to Everybody"
STANDARD_SECRET = "whsec_" + base64.b64encode(b"standard webhooks secret, 32 b!!").decode()

REVIEW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: review
    spec:
      triggers:
        - event: com.github.pull_request
          filter: {action: opened}
          input: {title: "{{ data.pull_request.title }}"}
      inputs:
        title: {type: string, required: true}
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input: {message: "{{ inputs.title }}"}
          on:
            - {event: task.completed, goto: waiting}
        waiting:
          type: human_in_the_loop
          on:
            - {event: ci.passed, goto: done}
        done:
          type: terminal
          outputs:
            reviewed: "$.states.work.output.message"
    """
)

PAYMENTS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: payment
    spec:
      triggers:
        - event: com.stripe.invoice.paid
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input: {message: "{{ inputs.id }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


def webhooks(secret_dir: str) -> str:
    return yaml(
        f"""\
        apiVersion: interlock.io/v1
        kind: Webhook
        metadata:
          name: github
        spec:
          scheme: github
          secret: {{env: IL_TEST_GITHUB_SECRET}}
          source: https://github.com/acme/payments
          type: {{header: X-GitHub-Event, prefix: com.github., values: [pull_request, push]}}
          subject: {{field: pull_request.html_url}}
          signals:
            secret: {{file: {secret_dir}/signal-secret}}
        ---
        apiVersion: interlock.io/v1
        kind: Webhook
        metadata:
          name: billing
        spec:
          scheme: standard
          secret: {{file: {secret_dir}/standard-secret}}
          source: https://billing.example
          type: {{field: type, prefix: com.stripe.}}
          replay_window: 5m
        """
    )


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("IL_TEST_GITHUB_SECRET", GITHUB_SECRET)
    (tmp_path / "standard-secret").write_text(STANDARD_SECRET + "\n")
    (tmp_path / "signal-secret").write_text("signal secret\n")
    manifests = [REVIEW, PAYMENTS, webhooks(str(tmp_path))]
    async with gateway_stack(nats_url, subjects, manifests) as stack:
        yield stack


def pull_request(number: int = 7) -> bytes:
    return json.dumps(
        {
            "action": "opened",
            "number": number,
            "pull_request": {
                "title": f"Fix the thing #{number}",
                "html_url": f"https://github.com/acme/payments/pull/{number}",
            },
        }
    ).encode()


def github_headers(body: bytes, delivery: str, secret: str = GITHUB_SECRET) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": f"sha256={digest}",
    }


def standard_headers(body: bytes, msg_id: str, at: datetime | None = None) -> dict[str, str]:
    at = at or datetime.now(UTC)
    signature = StandardSender(STANDARD_SECRET).sign(msg_id, at, body.decode())
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


async def test_github_signed_pull_request_starts_a_run(gs: GatewayStack) -> None:
    body = pull_request()
    async with gs.http(None) as http:  # the signature is the credential
        r = await http.post("/webhooks/github", content=body, headers=github_headers(body, "d-1"))
    assert r.status_code == 202, r.text
    answer = r.json()
    assert answer["webhook"] == "default/github"
    assert answer["delivery"] == "d-1"
    [event] = answer["events"]
    assert event["type"] == "com.github.pull_request"
    assert event["source"] == "https://github.com/acme/payments"
    [run] = event["started"]
    assert run["workflow"] == "review"
    state = await _until_state(gs, run["run_id"], "waiting")
    assert state.inputs == {"title": "Fix the thing #7"}


async def _until_state(gs: GatewayStack, run_id: str, name: str):  # type: ignore[no-untyped-def]
    from support.runtime import eventually

    async def probe():  # type: ignore[no-untyped-def]
        try:
            state = await gs.stack.client.state(run_id)
        except LookupError:
            return None
        return state if state.state == name else None

    return await eventually(probe, within=TIMEOUT, what=f"{run_id} in {name}")


async def test_github_bad_or_missing_signature_is_401_and_stores_nothing(
    gs: GatewayStack,
) -> None:
    body = pull_request()
    async with gs.http(None) as http:
        wrong = await http.post(
            "/webhooks/github", content=body, headers=github_headers(body, "d-2", "not it")
        )
        headers = github_headers(body, "d-3")
        del headers["X-Hub-Signature-256"]
        missing = await http.post("/webhooks/github", content=body, headers=headers)
        tampered = await http.post(
            "/webhooks/github", content=pull_request(8), headers=github_headers(body, "d-4")
        )
    for r in (wrong, missing, tampered):
        assert r.status_code == 401, r.text
        assert r.headers["content-type"] == "application/problem+json"
    assert "X-Hub-Signature-256" in missing.json()["detail"]
    assert await gs.stored_events() == 0


async def test_github_replayed_delivery_gets_the_first_answer_and_starts_nothing(
    gs: GatewayStack,
) -> None:
    body = pull_request()
    headers = github_headers(body, "d-5")
    async with gs.http(None) as http:
        first = await http.post("/webhooks/github", content=body, headers=headers)
        again = await http.post("/webhooks/github", content=body, headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["interlock-replayed"] == "true"
    assert await gs.stored_events() == 1


async def test_standard_webhooks_valid_invalid_replayed_and_stale(gs: GatewayStack) -> None:
    body = json.dumps({"type": "invoice.paid", "id": "in_1"}).encode()
    async with gs.http(None) as http:
        ok = await http.post(
            "/webhooks/billing", content=body, headers=standard_headers(body, "msg_1")
        )
        assert ok.status_code == 202, ok.text
        [event] = ok.json()["events"]
        assert event["type"] == "com.stripe.invoice.paid"
        assert event["id"] == "msg_1"
        assert [r["workflow"] for r in event["started"]] == ["payment"]

        replay = await http.post(
            "/webhooks/billing", content=body, headers=standard_headers(body, "msg_1")
        )
        assert replay.status_code == 202
        assert replay.json() == ok.json()

        bad = standard_headers(body, "msg_2")
        bad["webhook-signature"] = "v1," + base64.b64encode(b"x" * 32).decode()
        r = await http.post("/webhooks/billing", content=body, headers=bad)
        assert r.status_code == 401
        assert r.json()["type"].endswith("/bad-signature")

        old = datetime.fromtimestamp(time.time() - 600, UTC)
        r = await http.post(
            "/webhooks/billing", content=body, headers=standard_headers(body, "msg_3", old)
        )
        assert r.status_code == 401
        assert r.json()["type"].endswith("/stale-timestamp")
        assert "replay window is 300 s" in r.json()["detail"]

        headers = standard_headers(body, "msg_4")
        del headers["webhook-timestamp"]
        r = await http.post("/webhooks/billing", content=body, headers=headers)
        assert r.status_code == 401
    assert await gs.stored_events() == 1


async def test_a_signed_signal_moves_a_waiting_run(gs: GatewayStack) -> None:
    body = pull_request(9)
    async with gs.http(None) as http:
        r = await http.post("/webhooks/github", content=body, headers=github_headers(body, "d-9"))
        run_id = r.json()["events"][0]["started"][0]["run_id"]
        await _until_state(gs, run_id, "waiting")
        signal = json.dumps({"run_id": run_id, "signal": "ci.passed"}).encode()
        path = f"/webhooks/github/runs/{run_id}/signals/ci.passed"
        start_secret = await http.post(path, content=signal, headers=github_headers(signal, "s-0"))
        assert start_secret.status_code == 401  # signals have their own secret here
        signed = github_headers(signal, "s-1", "signal secret")
        r = await http.post(path, content=signal, headers=signed)
        assert r.status_code == 202, r.text
        assert r.json()["events"][0]["run_id"] == run_id
    state = await gs.stack.wait(run_id)
    assert state.status == "completed"
    assert state.outputs == {"reviewed": "Fix the thing #9"}


async def test_a_webhook_of_a_namespace_signals_that_namespaces_runs(gs: GatewayStack) -> None:
    """A team's own webhook, at the path that names its namespace, signals its team's run
    (where only the default namespace's webhooks took signals); the default namespace's
    webhook of the same name is another webhook, refused for that run."""
    team = yaml(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: gate, namespace: team-b}
        spec:
          initial_state: waiting
          states:
            waiting:
              type: human_in_the_loop
              on:
                - {event: ci.passed, goto: done}
            done: {type: terminal}
        ---
        apiVersion: interlock.io/v1
        kind: Webhook
        metadata: {name: github, namespace: team-b}
        spec:
          scheme: github
          secret: {env: IL_TEST_GITHUB_SECRET}
          type: {value: com.example.ci}
          signals: {}
        """
    )
    applied = await gs.stack.client.apply([("team-b.yaml", team)])
    assert applied.compiled.ok, applied.compiled.diagnostics
    run_id = await gs.stack.client.start("team-b/gate", {}, run_id="gate-b1")
    await _until_state(gs, run_id, "waiting")
    signal = json.dumps({"run_id": run_id, "signal": "ci.passed"}).encode()
    async with gs.http(None) as http:
        default = await http.post(
            f"/webhooks/github/runs/{run_id}/signals/ci.passed",
            content=signal,
            headers=github_headers(signal, "s-b0", "signal secret"),
        )
        assert default.status_code == 403, default.text
        assert default.json()["type"].endswith("/other-namespace")
        r = await http.post(
            f"/webhooks/team-b/github/runs/{run_id}/signals/ci.passed",
            content=signal,
            headers=github_headers(signal, "s-b1"),
        )
        assert r.status_code == 202, r.text
        assert r.json()["webhook"] == "team-b/github"
        assert r.json()["events"][0]["run_id"] == run_id
    state = await gs.stack.wait(run_id)
    assert (state.status, state.state) == ("completed", "done")


async def test_unknown_webhook_and_unmappable_request(gs: GatewayStack) -> None:
    body = pull_request()
    async with gs.http(None) as http:
        r = await http.post("/webhooks/nope", content=body, headers=github_headers(body, "x"))
        assert r.status_code == 404
        headers = github_headers(body, "d-10")
        del headers["X-GitHub-Event"]
        r = await http.post("/webhooks/github", content=body, headers=headers)
        assert r.status_code == 400
        assert "X-GitHub-Event" in r.json()["detail"]
    assert await gs.stored_events() == 0


async def test_a_webhook_whose_secret_is_missing_here_is_503(
    gs: GatewayStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IL_TEST_GITHUB_SECRET")
    body = pull_request()
    async with gs.http(None) as http:
        r = await http.post("/webhooks/github", content=body, headers=github_headers(body, "x"))
    assert r.status_code == 503
    assert GITHUB_SECRET not in r.text


async def test_a_relative_secret_file_is_read_from_the_gateways_folder(
    gs: GatewayStack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relative = yaml(
        """\
        apiVersion: interlock.io/v1
        kind: Webhook
        metadata: {name: relative}
        spec:
          scheme: github
          secret: {file: secrets/relative}
          type: {header: X-GitHub-Event, prefix: com.github., values: [pull_request]}
        """
    )
    applied = await gs.stack.client.apply([("relative.yaml", relative)])
    assert applied.compiled.ok
    gateway_folder = tmp_path / "gateway"
    (gateway_folder / "secrets").mkdir(parents=True)
    monkeypatch.chdir(gateway_folder)
    body = pull_request()
    async with gs.http(None) as http:
        missing = await http.post(
            "/webhooks/relative", content=body, headers=github_headers(body, "r1")
        )
        assert missing.status_code == 503
        assert f"relative to the gateway's folder {gateway_folder}" in caplog.text
        (gateway_folder / "secrets" / "relative").write_text(GITHUB_SECRET + "\n")
        taken = await http.post(
            "/webhooks/relative", content=body, headers=github_headers(body, "r2")
        )
        assert taken.status_code == 202, taken.text
