"""A heartbeat names its worker (``name``, ``instance``) in bytes its agent writes, under
a key of the agent's own capability: an agent of one team that writes one naming another
team's worker (its name and instance are in any listing of workers a reader sees) does not
change how that worker is listed. Listings (``interlock agents``, ``GET /agents``, the
console) show the other team's worker with the capability it serves. The agent on its own
credential as ``interlock creds issue`` makes it, the other team's worker on the SDK."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.js.errors import BadRequestError, KeyNotFoundError

from interlock.auth.roles import Role
from interlock.sdk import Worker
from interlock.transport.connection import ConnectOptions
from interlock.transport.tasks import heartbeat_key
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # the fixtures, used by name

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

INSTANCE = "held-worker-1"


async def _listed(secured: Secured) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = (await secured.operator.agents())["workers"]
    return [w for w in workers if w.get("instance") == INSTANCE]


async def test_an_agent_cannot_hide_another_teams_worker_from_listings(secured: Secured) -> None:
    attacker = secured.issue(Role("agent", capabilities=("teama",)), "teama-agent")
    victim = secured.issue(Role("agent", capabilities=("held",)), "held")
    worker = Worker("held", grace_period=1.0, instance_id=INSTANCE, heartbeat_interval=0.5)

    @worker.capability("held")
    async def held(inp: dict[str, Any]) -> dict[str, Any]:
        return {}

    serving = asyncio.create_task(
        worker.run(ConnectOptions.resolve(secured.url, creds_file=str(victim)))
    )
    try:
        await asyncio.wait_for(worker.wait_ready(), 30)
        await eventually(lambda: _serving_held(secured), what="the held worker listed")
        forged_at = await _forge(secured, attacker)
        # The worker's own heartbeat written again since: the forged one is older, read
        # first, while it lives (15 s; the agent would write it again before then).
        await eventually(lambda: _beaten_since(secured, forged_at), what="a heartbeat since")
        listed = await _listed(secured)
        # Read while the forged heartbeat was there (else this tried nothing).
        kv = await secured.operator.js.key_value(SUBJECTS.workers_bucket)
        assert (await kv.get(heartbeat_key("teama", INSTANCE))).value
    finally:
        await worker.stop(force=True)
        await serving
    mine = [w for w in listed if w["name"] == "held" and "held" in w["capabilities"]]
    assert len(mine) == 1, listed
    assert mine[0]["capabilities"] == ["held"]


async def _serving_held(secured: Secured) -> bool:
    return any("held" in w["capabilities"] for w in await _listed(secured))


async def _beaten_since(secured: Secured, revision: int) -> bool:
    kv = await secured.operator.js.key_value(SUBJECTS.workers_bucket)
    entry = await kv.get(heartbeat_key("held", INSTANCE))
    return entry.revision is not None and entry.revision > revision


async def _forge(secured: Secured, attacker: Any) -> int:
    """Team A's agent writes, under its own capability's key, a heartbeat naming the held
    worker (its name and instance, as a reader's listing shows them); its revision."""
    refusals = Refusals()
    nc = await plain_client(secured.url, attacker, refusals)
    try:
        forged = {
            "name": "held",
            "instance": INSTANCE,
            "capabilities": ["teama"],
            "concurrency": 1,
            "in_flight": 0,
            "started_at": "2026-01-01T00:00:00Z",
            "heartbeat_at": "2026-01-01T00:00:00Z",
        }
        subject = f"$KV.{SUBJECTS.workers_bucket}.{heartbeat_key('teama', INSTANCE)}"
        ack = await nc.jetstream().publish(subject, json.dumps(forged).encode())
    finally:
        await nc.close()
    assert not refusals.errors
    return int(ack.seq)


async def test_an_agents_heartbeat_lives_no_longer_than_the_buckets_15_s(
    secured: Secured,
) -> None:
    """A heartbeat with a TTL of its own (``Nats-TTL: never``) outlived the bucket's 15 s:
    an agent's such heartbeats filled the bucket for good, after which every other agent's
    were refused and listings and metrics showed no worker of any capability. The bucket
    takes no message TTL: refused, nothing stored."""
    attacker = secured.issue(Role("agent", capabilities=("teama",)), "teama-agent")
    refusals = Refusals()
    nc = await plain_client(secured.url, attacker, refusals)
    kv = await secured.operator.js.key_value(SUBJECTS.workers_bucket)
    try:
        subject = f"$KV.{SUBJECTS.workers_bucket}.{heartbeat_key('teama', 'forever')}"
        with pytest.raises(BadRequestError, match="TTL"):
            await nc.jetstream().publish(subject, b"{}", headers={"Nats-TTL": "never"})
    finally:
        await nc.close()
    assert not refusals.errors
    with pytest.raises(KeyNotFoundError):
        await kv.get(heartbeat_key("teama", "forever"))
