"""The gateway's in-memory run index against the bucket it watches (a real nats-server):
a listing is never older than the bucket was when it was asked for, and lists what
``Client.runs`` lists, in the same order."""

from __future__ import annotations

import json

import msgspec
import pytest
from gw_support import HELLO, TIMEOUT, GatewayStack, gateway_stack
from helpers import eventually

from interlock.client import Client
from interlock.client.reading import with_waiting
from interlock.transport.subjects import Subjects

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [HELLO]) as stack:
        yield stack


def entry(run_id: str, status: str, started_at: str) -> bytes:
    return json.dumps(
        {
            "run_id": run_id,
            "workflow": "hello",
            "namespace": "default",
            "version": 1,
            "status": status,
            "state": "work",
            "started_at": started_at,
            "updated_at": started_at,
        }
    ).encode()


async def test_listing_follows_every_write_of_the_bucket(gs: GatewayStack) -> None:
    client = Client(gs.stack.client.nc, gs.stack.subjects)
    listed = gs.gateway.run_list
    assert await listed.runs() == []
    async with gs.http() as http:
        r = await http.post("/runs", json={"workflow": "hello", "inputs": {"message": "x"}})
        run_id = r.json()["run_id"]
        await http.get(f"/runs/{run_id}/result", params={"timeout": TIMEOUT})

    # The index is written from the log behind the run: until it says the run completed,
    # its entry may still change (or not be there yet) between the two listings compared
    # at the end.
    async def indexed() -> bool:
        return [(r.run_id, r.status) for r in await client.runs()] == [(run_id, "completed")]

    await eventually(indexed, what="the run indexed as completed")
    kv = await gs.stack.js.key_value(gs.stack.subjects.runs_bucket)
    # Written straight into the bucket, then listed at once: each write is seen.
    for i in range(20):
        await kv.put(
            f"rmade{i:02d}", entry(f"rmade{i:02d}", "running", f"2026-01-01T00:00:{i:02d}Z")
        )
        got = await listed.runs(status="running")
        assert got[0].run_id == f"rmade{i:02d}"
    await kv.put("rmade05", entry("rmade05", "failed", "2026-01-01T00:00:05Z"))
    assert [r.run_id for r in await listed.runs(status="failed")] == ["rmade05"]
    await kv.delete("rmade06")
    assert "rmade06" not in [r.run_id for r in await listed.runs()]
    # With what each running run waits for, as GET /runs adds it to a page.
    ops = gs.gateway.api.ops
    mine = msgspec.to_builtins(await with_waiting(ops, await listed.runs()))
    assert mine == msgspec.to_builtins(await client.runs())
    failed = await listed.runs(workflow="default/hello", status="failed")
    assert msgspec.to_builtins(await with_waiting(ops, failed)) == (
        msgspec.to_builtins(await client.runs(workflow="default/hello", status="failed"))
    )
