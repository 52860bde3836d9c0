"""``GET /live/runs`` across a reconnection of the gateway's NATS connection: the gateway
hears the run index's writes on a subscription (its account imports them as a stream, no
consumer), which misses what is written while it is away, so the first write heard after a
reconnection ends each live stream with ``event: reset`` (list again), never a silent gap.
Real nats-server with authentication, the gateway on its own account's credential, a real
socket; the server closes the gateway's connection (a system-account kick)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx

from interlock.transport.subjects import Subjects
from support.accounts import kick
from support.gateway import HELLO, TIMEOUT, gateway_stack
from support.runtime import eventually


async def _events(stream: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) of each Server-Sent Event of ``stream``."""
    kind = ""
    async for line in stream.aiter_lines():
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield kind, line.removeprefix("data: ")


async def _until(events: AsyncIterator[tuple[str, str]], kind: str, run_id: str = "") -> str:
    async def find() -> str:
        async for got, data in events:
            if got == kind and run_id in data:
                return data
        raise AssertionError(f"the stream ended before {kind} {run_id}")

    return await asyncio.wait_for(find(), TIMEOUT)


async def test_a_reconnection_resets_the_live_runs(nats_url: str, subjects: Subjects) -> None:
    async with (
        gateway_stack(nats_url, subjects, [HELLO]) as gs,
        gs.http("reader") as http,
        http.stream("GET", "/live/runs") as stream,
    ):
        events = aiter(_events(stream))
        await _until(events, "ready")
        first = await gs.stack.client.start("hello", {"message": "before"})
        assert json.loads(await _until(events, "run", first))["run_id"] == first

        nc = gs.gateway.nc
        info = nc._server_info  # the server's id, for the kick
        await kick(nats_url, nc._client_id, info["server_id"])

        async def reconnected() -> bool:
            return nc.stats["reconnects"] >= 1 and nc.is_connected

        await eventually(reconnected, what="the gateway reconnected")
        await gs.stack.client.start("hello", {"message": "after"})
        await _until(events, "reset")
