"""Signed webhooks, tried by someone who holds one signed delivery (read from a proxy log,
a CI artifact, a sender's retry queue) and no token: what the signature does not cover
(GitHub signs the body only; Standard Webhooks the id, timestamp and body; neither signs
the path) cannot turn that delivery into a second run, another event type, or a signal to
another run. On a real nats-server, over a real socket."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from interlock.transport.subjects import Subjects
from support.accounts import pooled_subjects, secured_nats_url
from support.gateway import GatewayStack, gateway_stack, yaml

# The gateway on a server with authentication, on its own account's credential.
__all__ = ["pooled_subjects", "secured_nats_url"]  # fixtures: nats_url, subjects

pytestmark = pytest.mark.asyncio

SECRET = "github webhook secret"
SIGNAL_SECRET = "signal secret"

MANIFESTS = [
    yaml(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata:
          name: review
        spec:
          triggers:
            - event: com.github.pull_request
          initial_state: waiting
          states:
            waiting:
              type: human_in_the_loop
              on:
                - {event: ci.passed, goto: merged}
                - {event: ci.failed, goto: rejected}
            merged:
              type: terminal
            rejected:
              type: terminal
        ---
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata:
          name: deploy
        spec:
          triggers:
            - event: com.github.push
          initial_state: waiting
          states:
            waiting:
              type: human_in_the_loop
              on:
                - {event: ci.passed, goto: done}
            done:
              type: terminal
        ---
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata:
          name: payroll
          namespace: team-b
        spec:
          initial_state: waiting
          states:
            waiting:
              type: human_in_the_loop
              on:
                - {event: ci.passed, goto: paid}
            paid:
              type: terminal
        ---
        apiVersion: interlock.io/v1
        kind: Webhook
        metadata:
          name: github
        spec:
          scheme: github
          secret: {env: IL_TEST_FORGERY_SECRET}
          type: {header: X-GitHub-Event, prefix: com.github., values: [pull_request, push]}
          signals: {secret: {env: IL_TEST_FORGERY_SIGNAL_SECRET}}
        """
    )
]


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("IL_TEST_FORGERY_SECRET", SECRET)
    monkeypatch.setenv("IL_TEST_FORGERY_SIGNAL_SECRET", SIGNAL_SECRET)
    async with gateway_stack(nats_url, subjects, MANIFESTS) as stack:
        yield stack


def signed(body: bytes, delivery: str, event: str = "pull_request", secret: str = SECRET):  # type: ignore[no-untyped-def]
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": f"sha256={digest}",
    }


async def _workflows_run(gs: GatewayStack, count: int) -> list[str]:
    """The workflows of the runs listed, once ``count`` are (GET /runs, as an operator)."""
    from support.runtime import TIMEOUT, eventually

    async def probe() -> list[str] | None:
        async with gs.http() as http:
            runs = (await http.get("/runs")).json()["runs"]
        return [r["workflow"] for r in runs] if len(runs) >= count else None

    found: list[str] = await eventually(probe, within=TIMEOUT, what=f"{count} runs")
    return found


async def test_a_captured_delivery_resent_with_a_new_delivery_id_starts_nothing(
    gs: GatewayStack,
) -> None:
    body = json.dumps({"action": "opened", "number": 1}).encode()
    async with gs.http(None) as http:
        first = await http.post("/webhooks/github", content=body, headers=signed(body, "d-1"))
        assert first.status_code == 202, first.text
        replay = await http.post(
            "/webhooks/github", content=body, headers=signed(body, "forged-d-2")
        )
    assert replay.status_code == 202, replay.text
    assert replay.headers["interlock-replayed"] == "true"
    assert replay.json() == first.json()
    assert await _workflows_run(gs, 1) == ["review"]
    assert await gs.stored_events() == 1


async def test_a_captured_delivery_resent_as_another_event_type_stays_what_it_was(
    gs: GatewayStack,
) -> None:
    body = json.dumps({"action": "opened", "number": 2}).encode()
    async with gs.http(None) as http:
        first = await http.post("/webhooks/github", content=body, headers=signed(body, "d-3"))
        assert first.status_code == 202, first.text
        [event] = first.json()["events"]
        assert event["type"] == "com.github.pull_request"
        as_push = await http.post(
            "/webhooks/github", content=body, headers=signed(body, "forged-d-4", "push")
        )
        # A type the webhook does not list is refused outright, even for a fresh body.
        fresh = json.dumps({"action": "opened", "number": 3}).encode()
        unlisted = await http.post(
            "/webhooks/github", content=fresh, headers=signed(fresh, "d-5", "org_block")
        )
    assert as_push.status_code == 202, as_push.text
    assert as_push.json() == first.json()  # still the pull request, not a push
    assert unlisted.status_code == 400, unlisted.text
    assert unlisted.headers["content-type"] == "application/problem+json"
    assert "org_block" in unlisted.json()["detail"]
    assert "pull_request, push" in unlisted.json()["detail"]
    assert await _workflows_run(gs, 1) == ["review"]
    assert await gs.stored_events() == 1


async def test_a_signal_signed_for_one_run_cannot_move_another(gs: GatewayStack) -> None:
    client = gs.stack.client
    mine = await client.start("review", {}, run_id="pr-mine")
    theirs = await client.start("review", {}, run_id="pr-theirs")
    for run_id in (mine, theirs):
        await _until_waiting(gs, run_id)
    body = json.dumps({"run_id": mine, "signal": "ci.passed"}).encode()
    headers = signed(body, "s-1", secret=SIGNAL_SECRET)
    async with gs.http(None) as http:
        other_run = await http.post(
            f"/webhooks/github/runs/{theirs}/signals/ci.passed", content=body, headers=headers
        )
        other_signal = await http.post(
            f"/webhooks/github/runs/{mine}/signals/ci.failed", content=body, headers=headers
        )
        unnamed = json.dumps({"status": "passed"}).encode()
        no_target = await http.post(
            f"/webhooks/github/runs/{theirs}/signals/ci.passed",
            content=unnamed,
            headers=signed(unnamed, "s-2", secret=SIGNAL_SECRET),
        )
        for r in (other_run, other_signal, no_target):
            assert r.status_code == 401, r.text
            assert r.json()["type"].endswith("/unsigned-target")
        assert f"not the run {theirs!r} of the path" in other_run.json()["detail"]
        assert "not the signal 'ci.failed' of the path" in other_signal.json()["detail"]
        assert "names none at run_id" in no_target.json()["detail"]
        assert await gs.stored_events() == 0
        # The same signed body, at the path it names, is taken.
        ok = await http.post(
            f"/webhooks/github/runs/{mine}/signals/ci.passed", content=body, headers=headers
        )
        assert ok.status_code == 202, ok.text
    state = await gs.stack.wait(mine)
    assert (state.status, state.state) == ("completed", "merged")
    assert (await client.state(theirs)).state == "waiting"


async def test_a_webhooks_signal_reaches_no_run_of_another_namespace(gs: GatewayStack) -> None:
    """The sender holding one team's webhook secret (its CI) signs a signal naming a run
    of another team's namespace, at the path that names it: refused, the run unmoved. A
    signal is another team's run's to take only from its own webhooks or an operator."""
    client = gs.stack.client
    theirs = await client.start("team-b/payroll", {}, run_id="payroll-1")
    await _until_waiting(gs, theirs)
    body = json.dumps({"run_id": theirs, "signal": "ci.passed"}).encode()
    async with gs.http(None) as http:
        r = await http.post(
            f"/webhooks/github/runs/{theirs}/signals/ci.passed",
            content=body,
            headers=signed(body, "s-9", secret=SIGNAL_SECRET),
        )
        assert r.status_code == 403, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"].endswith("/other-namespace")
        assert "team-b" in r.json()["detail"]
        unknown = await http.post(
            "/webhooks/github/runs/no-such-run/signals/ci.passed",
            content=(
                other := json.dumps({"run_id": "no-such-run", "signal": "ci.passed"}).encode()
            ),
            headers=signed(other, "s-10", secret=SIGNAL_SECRET),
        )
        assert unknown.status_code == 404, unknown.text
    assert await gs.stored_events() == 0
    assert (await client.state(theirs)).state == "waiting"


async def _until_waiting(gs: GatewayStack, run_id: str) -> None:
    from support.runtime import TIMEOUT, eventually

    async def probe() -> bool:
        try:
            return (await gs.stack.client.state(run_id)).state == "waiting"
        except LookupError:
            return False

    await eventually(probe, within=TIMEOUT, what=f"{run_id} waiting")
