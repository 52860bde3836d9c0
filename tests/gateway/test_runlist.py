"""The gateway's run list against the bucket it pages (a real nats-server): a listing is
never older than the bucket was when it was asked for, lists what ``Client.runs`` lists,
in the same order, and reads a page's worth of the index whatever it holds."""

from __future__ import annotations

import msgspec
import pytest

from interlock.client import Client
from interlock.client.reading import with_waiting
from interlock.runtime.runlisting import put_entries, put_entry
from interlock.transport.subjects import Subjects
from support.gateway import HELLO, TIMEOUT, GatewayStack, gateway_stack
from support.runtime import eventually

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [HELLO]) as stack:
        yield stack


def entry(run_id: str, status: str, started_at: str) -> dict[str, object]:
    return {
        "run_id": run_id,
        "workflow": "hello",
        "namespace": "default",
        "version": 1,
        "status": status,
        "state": "work",
        "started_at": started_at,
        "updated_at": started_at,
    }


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
    # Written straight into the bucket as the relay writes them, then listed at once:
    # each write is seen.
    nc, subjects = gs.stack.client.nc, gs.stack.subjects
    for i in range(20):
        made = entry(f"rmade{i:02d}", "running", f"2026-01-01T00:00:{i:02d}Z")
        await put_entry(nc, subjects, made)
        got = await listed.runs(status="running")
        assert got[0].run_id == f"rmade{i:02d}"
    # Its listing as running left behind (as by a writer stopped between its writes):
    # the entry says failed, and it is listed as that only.
    await put_entry(nc, subjects, entry("rmade05", "failed", "2026-01-01T00:00:05Z"))
    assert [r.run_id for r in await listed.runs(status="failed")] == ["rmade05"]
    assert "rmade05" not in [r.run_id for r in await listed.runs(status="running")]
    assert [r.run_id for r in await listed.runs()].count("rmade05") == 1
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


async def test_a_page_reads_a_page_of_a_large_index(gs: GatewayStack) -> None:
    """5,000 runs in the index: the first page and a filtered page each read a bounded
    number of messages (a gateway that loaded the index read all 5,000 entries)."""
    nc, subjects = gs.stack.client.nc, gs.stack.subjects
    total = 5000
    for first in range(0, total, 500):
        await put_entries(
            nc,
            subjects,
            [
                entry(f"rbig{i:05d}", "failed" if i % 100 == 0 else "completed", f"t{i:05d}")
                for i in range(first, first + 500)
            ],
        )
    gw_nc = gs.gateway.nc
    listed = gs.gateway.run_list

    async def read(**kwargs: object) -> tuple[list[str], int]:
        before = gw_nc.stats["in_msgs"]
        found, _ = await listed.page(**kwargs)  # type: ignore[arg-type]
        return [r.run_id for r in found], gw_nc.stats["in_msgs"] - before

    page, cost = await read(limit=50)
    assert page == [f"rbig{i:05d}" for i in range(total - 1, total - 51, -1)]
    assert cost < 400, cost
    failed, cost = await read(status="failed", limit=10)
    assert failed == [f"rbig{i:05d}" for i in range(4900, 3900, -100)]
    assert cost < 400, cost
    # An offset is skipped by reading the stream back past it: a message or two a run.
    deep, cost = await read(offset=4000, limit=20)
    assert deep == [f"rbig{i:05d}" for i in range(999, 979, -1)]
    assert cost < 2 * 4000 + 400, cost
    async with gs.http("reader") as http:
        r = await http.get("/runs", params={"status": "failed", "limit": "3", "offset": "47"})
        assert [x["run_id"] for x in r.json()["runs"]] == ["rbig00200", "rbig00100", "rbig00000"]
        assert r.json()["next_offset"] is None
