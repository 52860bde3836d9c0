"""A ``Nats-Msg-Id`` is the sender's text, and a stream drops every message whose id it has
seen in its duplicate window, whoever sent the first: a party that may write a stream
others write too must not be able to have the others' messages dropped by sending their
ids first. Tried with each party's own credential as ``interlock creds issue`` makes it,
on a real nats-server with Interlock's decentralized auth.

- An agent of one team (capability ``teama``) and another team's worker answering through
  the results stream (``held``, the SDK sending every answer there): the answer's id is
  ``<source>:<action id>.<attempt>.result``, each part known to whoever knows the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from interlock.auth.roles import Role
from interlock.core import events as ev
from interlock.core.incoming import derive_run_id
from interlock.gateway.app import build_app
from interlock.gateway.auth import Tokens
from interlock.gateway.service import Gateway
from interlock.runtime.client import DeadLetter
from interlock.sdk import Worker
from interlock.transport import tasks
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.httpserver import HttpServer
from interlock.transport.streamconfigs import SHARED_DUPLICATE_WINDOW_S
from support.auth import (
    SUBJECTS,
    Refusals,
    Secured,
    plain_client,
    publish_event,
    publisher,
    secured,
    secured_server,
)

__all__ = ["secured", "secured_server"]  # the fixtures, used by name

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]


async def _requested(secured: Secured, run_id: str) -> ev.ActionRequested:
    async for record in secured.operator.follow(run_id, idle_timeout=30):
        if isinstance(record, ev.ActionRequested):
            return record
    raise AssertionError(f"{run_id} never requested its action")


async def test_an_agent_cannot_have_another_teams_answer_dropped(secured: Secured) -> None:
    attacker = secured.issue(Role("agent", capabilities=("teama",)), "teama-agent")
    victim = secured.issue(Role("agent", capabilities=("held",)), "held")
    run_id = await secured.operator.start("guarded", {}, run_id="dedup-answer-1")
    requested = await _requested(secured, run_id)
    answer_id = f"{requested.data.action_id}.{requested.data.attempt}.result"

    # Team A's agent sends, on its own results subject, junk under the id the other team's
    # worker will give its answer.
    refusals = Refusals()
    nc = await plain_client(secured.url, attacker, refusals)
    try:
        js = nc.jetstream(prefix=SUBJECTS.party_js_api)
        headers = {tasks.MSG_ID_HEADER: f"{tasks.agent_source('held')}:{answer_id}"}
        ack = await js.publish(SUBJECTS.result("teama", run_id), b"junk", headers=headers)
        assert not ack.duplicate
    finally:
        await nc.close()
    assert not refusals.errors
    # What the stream's duplicate window is for: an answer sent again at once is stored
    # once. Later than that (its worker's answer comes well after its handler ran), an
    # id sent first drops nothing.
    await asyncio.sleep(2 * SHARED_DUPLICATE_WINDOW_S)

    # The other team's worker answers through the results stream, as the SDK does when
    # the orchestrator does not reply to an answer request in time.
    worker = Worker("held", grace_period=1.0, answer_timeout=0)

    @worker.capability("held")
    async def held(inp: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    serving = asyncio.create_task(
        worker.run(ConnectOptions.resolve(secured.url, creds_file=str(victim)))
    )
    try:
        await asyncio.wait_for(worker.wait_ready(), 30)
        state = await secured.operator.wait(run_id, timeout=30)
    finally:
        await worker.stop(force=True)
        await serving
    assert state.status == "completed"


async def test_an_agent_cannot_hide_the_dead_letter_of_its_own_refused_answer(
    secured: Secured,
) -> None:
    """The orchestrator's letter about a message has an id made of the message's place
    (its stream and sequence, which its publisher's acknowledgement tells) and a digest:
    of the reason and detail alone, an agent worked it out, sent a letter of its own under
    it first, and the orchestrator's letter about its refused answer was dropped."""
    attacker = secured.issue(Role("agent", capabilities=("teama",)), "teama-agent")
    refusals = Refusals()
    nc = await plain_client(secured.url, attacker, refusals)
    try:
        js = nc.jetstream(prefix=SUBJECTS.party_js_api)
        ack = await js.publish(SUBJECTS.result("teama", "dlq-probe"), b"junk")
        probe = await _letter(secured, f"{SUBJECTS.results_stream}.{ack.seq}.")
        assert probe.reason == "bad-json"
        # What the letter about the next junk answer will be, sent first as its own.
        _, _, digest = probe.headers[tasks.MSG_ID_HEADER].rpartition(".")
        next_id = f"{SUBJECTS.results_stream}.{ack.seq + 1}.{digest}"
        decoy = await js.publish(
            f"il.dlq.agent.teama.{probe.reason}", b"", headers={tasks.MSG_ID_HEADER: next_id}
        )
        assert not decoy.duplicate
        ack = await js.publish(SUBJECTS.result("teama", "dlq-hidden"), b"junk")
    finally:
        await nc.close()
    assert not refusals.errors
    letter = await _letter(secured, f"{SUBJECTS.results_stream}.{ack.seq}.", "dlq-hidden")
    assert letter.data == b"junk"


async def _letter(secured: Secured, msg_id: str, subject: str = "") -> DeadLetter:
    """The orchestrator's dead letter whose ``Nats-Msg-Id`` starts with ``msg_id`` (about a
    message on a subject ending in ``subject``), once it is stored."""
    for _ in range(300):
        for letter in await secured.operator.dead_letters():
            if letter.headers.get(tasks.MSG_ID_HEADER, "").startswith(msg_id) and (
                letter.subject.endswith(subject)
            ):
                return letter
        await asyncio.sleep(0.1)
    raise AssertionError(f"no dead letter with an id starting {msg_id!r}")


BILLED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: billed
  namespace: billing
spec:
  triggers:
    - event: billing.invoice.issued
  initial_state: done
  states:
    done:
      type: terminal
"""
BILLING = "https://billing.example"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(secured: Secured) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """The gateway on its own credential, and two teams' publisher tokens: ``acme`` (types
    ``acme.>``) and ``billing`` (``billing.>``), as ``interlock tokens create`` makes them."""
    applied = await secured.operator.apply([("<billed>", BILLED)])
    applied.compiled.raise_for_errors()
    nc = await connect(ConnectOptions.resolve(secured.url, creds_file=str(secured.auth.gateway)))
    gw = Gateway(nc, SUBJECTS)
    await gw.start()
    server = HttpServer(build_app(gw, console=None), 0)
    await server.start()
    tokens = Tokens(secured.operator.js, SUBJECTS)
    issued = {
        "acme": await tokens.issue("acme-shop", "publisher", ["acme.>"]),
        "billing": await tokens.issue("billing", "publisher", ["billing.>"]),
    }
    try:
        yield server.url, issued
    finally:
        await server.stop()
        await gw.stop()
        await nc.close()


async def _post(url: str, token: str, event_type: str, source: str, event_id: str) -> Any:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post(
            "/events",
            headers={
                "Authorization": f"Bearer {token}",
                "ce-specversion": "1.0",
                "ce-id": event_id,
                "ce-source": source,
                "ce-type": event_type,
                "Content-Type": "application/json",
            },
            json={},
        )
    assert r.status_code == 202, r.text
    [answer] = r.json()["events"]
    return answer


async def _started(secured: Secured, event_id: str) -> None:
    definition, _ = await secured.operator.registry.latest("billing/billed")
    state = await secured.operator.wait(derive_run_id(definition, BILLING, event_id), timeout=30)
    assert state.status == "completed"


async def test_a_publisher_cannot_have_another_teams_posted_event_dropped(
    secured: Secured, gateway: tuple[str, dict[str, str]]
) -> None:
    """Another team's events posted to the gateway are stored under an id nobody can send
    first: neither a publisher's NATS credential sending the ``<source>:<id>`` the billing
    system's next invoice will have (the id a publisher's own client gives an event), nor
    a publisher's token posting an event of its own types with that source and id."""
    url, tokens = gateway
    nc, refusals = await publisher(secured, "acme.>", "acme-shop")
    try:
        forged = {tasks.MSG_ID_HEADER: f"{BILLING}:inv-1"}
        ack = await publish_event(nc, "inv-1", "acme.noise", {}, source=BILLING, headers=forged)
        assert not ack.duplicate
    finally:
        await nc.close()
    assert not refusals.errors
    first = await _post(url, tokens["acme"], "acme.noise", BILLING, "inv-2")
    assert first["duplicate"] is False
    for event_id in ("inv-1", "inv-2"):
        answer = await _post(url, tokens["billing"], "billing.invoice.issued", BILLING, event_id)
        assert answer["duplicate"] is False, answer
        await _started(secured, event_id)
    # What the window is for holds: the billing system's own event posted again is stored
    # once.
    again = await _post(url, tokens["billing"], "billing.invoice.issued", BILLING, "inv-1")
    assert again["duplicate"] is True
