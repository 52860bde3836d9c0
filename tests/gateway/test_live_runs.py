"""``GET /live/runs``: the run index's changes as Server-Sent Events, over a real socket
against a real stack: a started run is told as it starts and as it ends, a deleted entry is
told as gone, a follower that does not keep up is told to list again, and the stream has
the API's access rules."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from interlock.gateway import runlist
from interlock.transport.subjects import Subjects
from support.gateway import HELLO, TIMEOUT, GatewayStack, gateway_stack

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [HELLO]) as stack:
        yield stack


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    kind, data = "message", []
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            yield kind, json.loads("\n".join(data))
            kind, data = "message", []


async def test_changes_of_the_run_index_are_streamed(gs: GatewayStack) -> None:
    async with gs.http("reader") as http, http.stream("GET", "/live/runs") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response)
        assert await asyncio.wait_for(anext(events), TIMEOUT) == ("ready", {})
        async with gs.http() as operator:
            r = await operator.post("/runs", json={"workflow": "hello", "inputs": {"message": "x"}})
            run_id = r.json()["run_id"]
        seen: list[str] = []
        while "completed" not in seen:
            kind, data = await asyncio.wait_for(anext(events), TIMEOUT)
            assert kind == "run"
            assert data["run_id"] == run_id
            assert data["workflow"] == "hello"
            seen.append(data["status"])
        # (The index may take a short run's start and end together: its last word counts.)
        kv = await gs.stack.js.key_value(gs.stack.subjects.runs_bucket)
        await kv.delete(run_id)
        assert await asyncio.wait_for(anext(events), TIMEOUT) == ("gone", {"run_id": run_id})
    async with gs.http(None) as nobody:
        assert (await nobody.get("/live/runs")).status_code == 401
    async with gs.http("publisher") as publisher:
        assert (await publisher.get("/live/runs")).status_code == 403


async def test_a_follower_that_falls_behind_is_told_to_list_again(
    gs: GatewayStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlist, "WATCH_QUEUE", 3)
    listed = gs.gateway.run_list
    slow = await listed.follow()
    kept = await listed.follow()
    kv = await gs.stack.js.key_value(gs.stack.subjects.runs_bucket)
    entry = {"workflow": "hello", "namespace": "default", "version": 1, "status": "running"}
    got: list[Any] = []
    for i in range(5):
        await kv.put(f"rbehind{i}", json.dumps({**entry, "run_id": f"rbehind{i}"}).encode())
        # One follower keeps up, the other takes nothing.
        got.append(await asyncio.wait_for(kept.get(), TIMEOUT))
    assert [key for key, _ in got] == [f"rbehind{i}" for i in range(5)]
    told = [slow.get_nowait() for _ in range(slow.qsize())]
    # What it held, then None: it fell behind, and is not fed any more.
    assert told[-1] is None
    assert [key for key, _ in told[:-1]] == ["rbehind1", "rbehind2"]
    listed.unfollow(kept)
