"""A publisher's event whose data is a reference to an object of its own bucket, of a type
no workflow triggers on or correlates by, as the publisher would send it (its credential
as ``interlock creds issue publisher`` makes it, raw publishes). The orchestrator loaded the
object (its chunks read, hashed and decoded: up to 64 MiB, on the thread every run's
decisions share) before it looked whether the event reached anything, at every such
event: a few bytes of event for as many megabytes of work as the publisher uploaded once,
and a handful of objects larger than the orchestrator keeps at hand cycled so that none
stayed. Now an event's object is loaded only where the event reaches something."""

from __future__ import annotations

import json
import os

import pytest

from interlock.auth.jwt import creds_tags
from interlock.auth.roles import Role
from interlock.core.objects import digest_of
from interlock.transport.objects import store_object
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

SIZE = 2 * 1024 * 1024
EVENTS = 5


def _event(n: int, event_type: str, ref: dict[str, object]) -> tuple[dict[str, str], bytes]:
    headers = {
        "ce-specversion": "1.0", "ce-id": f"flood-{n}", "ce-source": "https://acme.example",
        "ce-type": event_type, "Content-Type": "application/json",
    }  # fmt: skip
    return headers, json.dumps({"$object": ref}).encode()


async def test_an_event_that_reaches_nothing_loads_no_object(secured: Secured) -> None:
    creds = secured.issue(Role("publisher", events=("acme.>",)), "flooding-publisher")
    [bucket] = [t.removeprefix("objects:") for t in creds_tags(creds) if t.startswith("objects:")]
    orchestrator = secured.orchestrator
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    js = nc.jetstream(prefix=SUBJECTS.party_js_api, timeout=10)
    data = json.dumps({"blob": os.urandom(SIZE // 2).hex()}).encode()
    ref = {"bucket": bucket, "name": "big", "size": len(data), "digest": digest_of(data)}
    unrouted = orchestrator.counters["events_unrouted"]
    try:
        await store_object(js, bucket, "big", data)
        reads = orchestrator.payloads.reads
        for n in range(EVENTS):  # a type nothing triggers on or correlates by
            headers, body = _event(n, "acme.nothing.reads.this", ref)
            await js.publish(
                f"{SUBJECTS.prefix}.events.acme.nothing.reads.this", body, headers=headers
            )

        async def handled() -> bool:
            return orchestrator.counters["events_unrouted"] >= unrouted + EVENTS

        await eventually(handled, what="the events handled (reaching nothing)")
        assert orchestrator.payloads.reads == reads  # no object read for them

        # The same reference on a type a workflow triggers on is loaded (and checked).
        headers, body = _event(EVENTS, "acme.order.placed", ref)
        await js.publish(f"{SUBJECTS.prefix}.events.acme.order.placed", body, headers=headers)

        async def loaded() -> bool:
            return orchestrator.payloads.reads == reads + 1

        await eventually(loaded, what="the triggering event's object loaded")
    finally:
        await nc.close()
    assert not refusals.errors
