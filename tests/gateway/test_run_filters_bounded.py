"""What a caller with a reader's token can make the gateway read with a run list's filters
the run index cannot select (``waiting``, ``since``, ``until``): each run's entry, one by
one, until the page is full. A filter nothing matches read every entry of the index at
every request. Past a bound (20,000 entries; lowered here to the runs a test starts) the
page is refused with a problem saying how to narrow it, and within it answered as
before (a real nats-server, HTTP over a socket)."""

from __future__ import annotations

import pytest

from interlock.client import Client
from interlock.gateway import runlist
from interlock.transport.subjects import Subjects
from support.gateway import WAITING, gateway_stack, wait_status

pytestmark = pytest.mark.asyncio


async def test_a_filter_that_reads_too_many_runs_is_refused(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlist, "FILTERED_MAX", 5)
    async with gateway_stack(nats_url, subjects, [WAITING]) as gs, gs.http("reader") as http:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        runs = [await client.start("waiting", {}) for _ in range(3)]
        for run_id in runs:
            await wait_status(gs, run_id, "running", "wait")
        found = await http.get("/runs", params={"waiting": "approval"})
        assert found.status_code == 200
        assert {r["run_id"] for r in found.json()["runs"]} == set(runs)
        for _ in range(4):  # more than the bound, none waiting for an agent
            await wait_status(gs, await client.start("waiting", {}), "running", "wait")
        for params in ({"waiting": "agent:nobody"}, {"since": "2999-01-01"}):
            refused = await http.get("/runs", params=params)
            assert refused.status_code == 422, refused.text
            problem = refused.json()
            assert problem["type"].endswith("/filter-too-wide")
            assert "workflow=" in problem["detail"]
            assert problem["max_examined"] == 5
        # Narrowed by what the index selects, no entry is read one by one.
        assert (await http.get("/runs", params={"workflow": "waiting"})).status_code == 200
