"""A run an event starts, asked for by the id ``POST /events`` told before the orchestrator
has started it (its data kept by reference is copied first): ``GET /runs/{id}/result``
says it is not started yet (not unknown), and with ``?timeout=`` waits for it to start and
end, over HTTP on a real socket, the orchestrator started only after the asks."""

from __future__ import annotations

import asyncio

from interlock.runtime.service import Orchestrator
from interlock.transport.subjects import Subjects
from support.flow import eventually
from support.gateway import HELLO, gateway_stack
from support.runtime import connect

SIZE = 300 * 1024  # over the object threshold (256 KiB): the data goes by reference


async def test_a_told_run_not_started_yet_is_said_so_and_waited_for(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        gateway_stack(nats_url, subjects, [HELLO], max_body=1 << 20) as gs,
        gs.http() as http,
    ):
        await gs.stack.orchestrator.stop()  # nothing starts runs until one is started below
        event = {"specversion": "1.0", "id": "big-1", "source": "https://ci.example/builds",
                 "type": "com.example.greet", "datacontenttype": "application/json",
                 "data": {"message": "m" * SIZE, "lang": "en"}}  # fmt: skip
        got = await http.post(
            "/events", json=event, headers={"Content-Type": "application/cloudevents+json"}
        )
        assert got.status_code == 202, got.text[:500]
        [started] = got.json()["events"][0]["started"]
        run_id = started["run_id"]

        for path in (f"/runs/{run_id}/result", f"/runs/{run_id}"):
            got = await http.get(path)
            assert got.status_code == 404, got.text
            body = got.json()
            assert body["type"].endswith("/run-not-started"), (path, body)
            assert "not started yet" in body["detail"], body
        # A run nobody was told of is still unknown.
        got = await http.get("/runs/r-nobody-told/result")
        assert got.json()["type"].endswith("/unknown-run"), got.text
        # And a long poll for an id no event's run has is not kept waiting for it: an
        # event's run id is r and 24 hex digits (the HTTP client's own bound is 10 s).
        got = await http.get("/runs/r-nobody-told/result?timeout=120", timeout=10)
        assert got.json()["type"].endswith("/unknown-run"), got.text

        waiting = asyncio.ensure_future(http.get(f"/runs/{run_id}/result?timeout=60"))
        # The orchestrator starts once the long poll looks for the run (the gateway's
        # watcher listens for it), not before.
        watcher = gs.gateway.api.ops.watcher
        await eventually(lambda: waiting.done() or run_id in watcher._listeners, "the poll")
        nc = await connect(nats_url)
        orchestrator = Orchestrator(nc, subjects)
        try:
            await orchestrator.start()
            got = await waiting
            assert got.status_code == 200, got.text[:500]
            result = got.json()
            assert result["status"] == "completed", str(result)[:500]
            assert result["outputs"] == {"echoed": "m" * SIZE}
        finally:
            await orchestrator.stop()
            await nc.close()
