"""``GET /runs?since=&until=``: times to the second or the minute, in UTC or with an
offset, or dates; compared as instants (not as text), over a real stack."""

from __future__ import annotations

import pytest

from interlock.runtime.runlisting import put_entry
from interlock.transport.subjects import Subjects
from support.gateway import GatewayStack, gateway_stack

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects) as stack:
        yield stack


STARTS = {
    # Fractions of different lengths, as different writers write them.
    "rone": "2026-12-01T09:29:59.9Z",
    "rtwo": "2026-12-01T09:30:00.123456Z",
    "rthree": "2026-12-01T09:30:05Z",
    "rfour": "2026-12-02T00:00:00.000Z",
}


async def test_runs_started_between_two_instants(gs: GatewayStack) -> None:
    for run_id, started in STARTS.items():
        entry = {
            "run_id": run_id,
            "workflow": "hello",
            "namespace": "default",
            "version": 1,
            "status": "completed",
            "state": "done",
            "started_at": started,
            "updated_at": started,
        }
        await put_entry(gs.stack.client.nc, gs.stack.subjects, entry)

    async def listed(**params: str) -> list[str]:
        async with gs.http("reader") as http:
            r = await http.get("/runs", params=params)
            assert r.status_code == 200, r.text
            return sorted(x["run_id"] for x in r.json()["runs"])

    assert await listed(since="2026-12-01T09:30Z") == ["rfour", "rthree", "rtwo"]
    assert await listed(since="2026-12-01T09:30:00Z", until="2026-12-01T09:30:05Z") == ["rtwo"]
    assert await listed(since="2026-12-01T09:30:01") == ["rfour", "rthree"]
    # An offset is honoured: 10:30 in UTC+1 is 09:30 UTC.
    assert await listed(until="2026-12-01T10:30:00+01:00") == ["rone"]
    assert await listed(since="2026-12-02") == ["rfour"]
    assert await listed(until="2026-12-02") == ["rone", "rthree", "rtwo"]
    async with gs.http("reader") as http:
        for bad in ("yesterday", "2026-13-01", "09:30", ""):
            r = await http.get("/runs", params={"since": bad})
            assert r.status_code == 400, bad
            assert "since" in r.json()["detail"]
