"""A run log survives a foreign message. Messages Interlock did not write are planted in a
waiting run's log, as a publisher can by reflection (an event published with the run's log
as its reply subject: JetStream writes its acknowledgement there) and as an admin of the
orchestrator's account can (junk, and a forged ``run.completed`` that decodes as a record
but carries no record MAC). Then, through the CLI on the operator's credential,
``logs``, ``describe`` (which warns of each), ``export``, ``signal`` and ``cancel`` of that
run work; ``GET /runs/{id}/log`` over a real socket on the gateway's credential answers
200; the orchestrator decides the run's next event; each foreign message is dead-lettered
once (``foreign-record``) however often the log is read; and the forged completion is
never folded."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
import pytest_asyncio
from nats.aio.client import Client
from prometheus_client import CollectorRegistry, generate_latest

from interlock.auth.roles import Role
from interlock.core import events as ev
from interlock.gateway.app import build_app
from interlock.gateway.auth import Tokens
from interlock.gateway.service import Gateway
from interlock.runtime.metrics import OrchestratorMetrics
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.httpserver import HttpServer
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

INTERLOCK = os.path.join(os.path.dirname(sys.executable), "interlock")


@dataclass
class Served:
    url: str
    token: str
    refusals: Refusals

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(secured: Secured) -> AsyncIterator[Served]:
    """The HTTP gateway on its own (gateway) credential."""
    creds = secured.issue(Role("gateway"), "gateway")
    refusals = Refusals()
    opts = ConnectOptions.resolve(secured.url, creds_file=str(creds), name="interlock gateway")
    nc = await connect(opts, error_cb=refusals.on_error)
    gateway = Gateway(nc, SUBJECTS)
    await gateway.start()
    server = HttpServer(build_app(gateway), 0, host="127.0.0.1")
    await server.start()
    token = await Tokens(secured.operator.js, SUBJECTS).issue("ops", "operator")
    try:
        yield Served(server.url, token, refusals)
    finally:
        await server.stop()
        await gateway.stop()
        await nc.close()


async def cli(secured: Secured, *args: str) -> subprocess.CompletedProcess[str]:
    """``interlock ARGS`` on the operator's credential, as a user types it (in a thread:
    the orchestrator runs on this event loop)."""
    return await asyncio.to_thread(_cli, secured, *args)


def _cli(secured: Secured, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("NATS_URL", None)
    env.update(INTERLOCK_URL=secured.url, INTERLOCK_CREDS=str(secured.auth.operator))
    return subprocess.run(
        [INTERLOCK, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


async def _state(secured: Secured, run_id: str, state: str) -> None:
    for _ in range(600):
        records = await secured.operator.read(run_id)
        if any(isinstance(r, ev.StateEntered) and r.data.state == state for r in records):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never entered {state}")


def _forged_completion(run_id: str) -> bytes:
    forged = ev.RunCompleted(
        specversion="1.0",
        id=f"{run_id}:forged",
        source="forged",
        subject=run_id,
        time="2026-01-01T00:00:00Z",
        datacontenttype="application/json",
        data=ev.RunCompletedData(state="done", outputs={"forged": True}),
    )
    return ev.encode_batch([forged])


async def _plant(secured: Secured, run_id: str) -> int:
    """Foreign messages in ``run_id``'s log; how many landed there."""
    log = f"il.runs.{run_id}"
    before = await secured.operator.log.last_seq(run_id)
    # As a publisher of acme.> may: an event whose reply subject is the run's log (where
    # the accounts keep parties apart this lands nowhere, and the admin's messages below
    # are what is planted).
    refusals = Refusals()
    publisher = await plain_client(
        secured.url, secured.issue(Role("publisher", events=("acme.>",)), "pub"), refusals
    )
    try:
        await publisher.publish("il.events.acme.reflected", b"{}", reply=log)
        await publisher.flush()
    finally:
        await publisher.close()
    # As an admin of the orchestrator's account may: junk, a reflected-looking ack, a
    # record that decodes but carries no MAC, and one with a MAC that does not check out.
    admin: Client = await plain_client(secured.url, secured.auth.orchestrator, Refusals())
    try:
        js = admin.jetstream()
        await js.publish(log, b'{"stream": "IL_EVENTS", "seq": 1}')
        await js.publish(log, b"not json at all \x00\xff")
        await js.publish(log, _forged_completion(run_id))
        mac = {"Interlock-Record-Mac": "A" * 43}
        await js.publish(log, _forged_completion(run_id), headers=mac)
    finally:
        await admin.close()
    await asyncio.sleep(0.2)
    # Nothing else writes to a waiting run's log meanwhile.
    planted = await secured.operator.log.last_seq(run_id) - before
    assert planted >= 4
    return planted


async def _letters(secured: Secured) -> list[dict[str, object]]:
    done = await cli(secured, "dead-letters", "list", "--reason", "foreign-record", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


async def test_a_log_with_foreign_messages_reads_and_its_run_goes_on(
    secured: Secured, served: Served
) -> None:
    run_id = await secured.operator.start("awaiting", {})
    await _state(secured, run_id, "waiting")
    planted = await _plant(secured, run_id)
    assert planted >= 4

    # The CLI, on the operator's credential: every read works and says what it skipped.
    logs = await cli(secured, "logs", run_id)
    assert logs.returncode == 0, logs.stderr
    assert "Traceback" not in logs.stderr
    assert "forged" not in logs.stdout
    described = await cli(secured, "describe", "run", run_id)
    assert described.returncode == 0, described.stderr
    assert "status       running" in described.stdout
    warnings = [line for line in described.stdout.splitlines() if line.startswith("warning")]
    assert len(warnings) == planted, described.stdout
    assert all("is not a record Interlock wrote" in w for w in warnings)
    as_json = json.loads((await cli(secured, "describe", "run", run_id, "-o", "json")).stdout)
    assert len(as_json["warnings"]) == planted
    exported = await cli(secured, "export", run_id)
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    assert lines
    assert not [r for r in lines if r["source"] == "forged"]

    # Over HTTP on the gateway's credential: the log and the description.
    async with served.http() as http:
        r = await http.get(f"/runs/{run_id}/log")
        assert r.status_code == 200, r.text
        assert not r.json()["finished"]
        assert "forged" not in r.text
        r = await http.get(f"/runs/{run_id}")
        assert r.status_code == 200, r.text
        assert len(r.json()["warnings"]) == planted
    assert not served.refusals.errors

    # The orchestrator decides the run's next event (a signal through the CLI).
    signalled = await cli(secured, "signal", run_id, "acme.order.approved", "--data", "{}")
    assert signalled.returncode == 0, signalled.stderr + signalled.stdout
    state = await secured.operator.wait(run_id, 30)
    assert state.status == "completed"
    assert state.outputs == {}, "the forged completion's outputs were folded"

    # Each foreign message is dead-lettered once, however often the log was read (by the
    # orchestrator, the CLI and the gateway above, and again here).
    for _ in range(3):
        assert (await cli(secured, "describe", "run", run_id)).returncode == 0
    letters: list[dict[str, object]] = []
    for _ in range(300):
        letters = [x for x in await _letters(secured) if x["subject"] == f"il.runs.{run_id}"]
        if len(letters) >= planted:
            break
        await asyncio.sleep(0.1)
    assert len(letters) == planted, letters
    assert all("foreign message" in str(x["redrive_refusal"]) for x in letters)

    # Counted by stream.
    exposed = generate_latest(_registry_with_metrics()).decode()
    assert 'interlock_foreign_messages_total{stream="IL_RUNS"}' in exposed


def _registry_with_metrics() -> CollectorRegistry:
    registry = CollectorRegistry()
    OrchestratorMetrics(registry)
    return registry


async def test_a_cancel_of_a_run_with_foreign_messages_works(secured: Secured) -> None:
    run_id = await secured.operator.start("awaiting", {})
    await _state(secured, run_id, "waiting")
    await _plant(secured, run_id)
    cancelled = await cli(secured, "cancel", run_id, "--reason", "enough")
    assert cancelled.returncode == 0, cancelled.stderr
    state = await secured.operator.wait(run_id, 30)
    assert state.status == "cancelled"


EXPIRING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: expiring
spec:
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      timeout: {after: 2s, goto: expired}
      on:
        - {event: acme.order.approved, goto: done}
    expired:
      type: terminal
    done:
      type: terminal
"""


async def test_a_timer_of_a_run_with_foreign_messages_fires_once(secured: Secured) -> None:
    applied = await secured.operator.apply([("<expiring>", EXPIRING)])
    applied.compiled.raise_for_errors()
    run_id = await secured.operator.start("expiring", {})
    await _state(secured, run_id, "waiting")
    await _plant(secured, run_id)
    state = await secured.operator.wait(run_id, 30)
    assert state.status == "completed"
    assert state.state == "expired"
    fired = [r for r in await secured.operator.read(run_id) if isinstance(r, ev.TimerFired)]
    assert len(fired) == 1
    failed = await secured.operator.dead_letters("timer-failed")
    assert not failed


async def test_a_foreign_webhook_definition_is_no_webhook(secured: Secured, served: Served) -> None:
    admin: Client = await plain_client(secured.url, secured.auth.orchestrator, Refusals())
    try:
        bucket = SUBJECTS.webhooks_bucket
        await admin.jetstream().publish(f"$KV.{bucket}.default.planted", b"[[[ not json")
    finally:
        await admin.close()
    async with served.http() as http:
        r = await http.post("/webhooks/planted", content=b"{}")
    assert r.status_code == 404, r.text
    assert r.json()["type"].endswith("/unknown-webhook")
