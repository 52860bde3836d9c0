"""The REST API over runs, against a real stack: each endpoint, its roles, and the same
shapes as ``interlock.Client`` (the CLI's ``--output json``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import msgspec
import pytest

from interlock import views
from interlock.client import Client
from interlock.transport.subjects import Subjects
from support.gateway import HELLO, PARKED, TIMEOUT, GatewayStack, gateway_stack
from support.runtime import eventually

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [HELLO, PARKED]) as stack:
        yield stack


def same_as(view: object) -> object:
    return json.loads(msgspec.json.encode(view))


async def test_start_then_wait_for_the_result_and_read_it_back(gs: GatewayStack) -> None:
    client = Client(gs.stack.client.nc, gs.stack.subjects)
    async with gs.http() as http:
        r = await http.post("/runs", json={"workflow": "hello", "inputs": {"message": "rest"}})
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        assert r.headers["location"] == f"/runs/{run_id}"
        r = await http.get(f"/runs/{run_id}/result", params={"timeout": TIMEOUT})
        assert r.status_code == 200
        assert r.json()["status"] == "completed"
        assert r.json()["outputs"] == {"echoed": "rest"}
        assert r.json() == same_as(await client.result(run_id))

        r = await http.get(f"/runs/{run_id}")
        assert r.json() == same_as(await client.describe(run_id))
        assert r.json()["status"] == "completed"

        async def indexed() -> object:
            listed = (await http.get("/runs", params={"workflow": "hello"})).json()
            return listed if [run["run_id"] for run in listed["runs"]] == [run_id] else None

        # The run index is written behind the run (within a few tens of milliseconds).
        listed = await eventually(indexed, what="the run listed")
        assert listed["next_offset"] is None
        assert listed["runs"] == same_as(await client.runs(workflow="hello"))
        assert (await http.get("/runs", params={"status": "failed"})).json()["runs"] == []

        records = await client.records(run_id)
        first = (await http.get(f"/runs/{run_id}/log", params={"limit": 2})).json()
        assert first["records"] == [views.record_view(r) for r in records[:2]]
        assert first["next_offset"] == 2
        assert first["finished"] is True
        rest = (await http.get(f"/runs/{run_id}/log", params={"offset": 2, "limit": 500})).json()
        assert len(first["records"]) + len(rest["records"]) == len(records)
        assert rest["next_offset"] is None

        r = await http.post("/runs", json={"workflow": "hello", "inputs": {}})
        assert r.status_code == 400
        assert "message" in r.json()["detail"]
        r = await http.post("/runs", json={"workflow": "nope"})
        assert r.status_code == 404
        r = await http.post(
            "/runs", json={"workflow": "hello", "inputs": {"message": "x"}, "run_id": run_id}
        )
        assert r.status_code == 409
        assert (await http.get("/runs/rnope")).status_code == 404


async def test_a_result_not_reached_within_the_timeout_says_running(gs: GatewayStack) -> None:
    async with gs.http() as http:
        run_id = (await http.post("/runs", json={"workflow": "parked"})).json()["run_id"]
        r = await http.get(f"/runs/{run_id}/result", params={"timeout": 0.2})
        assert r.status_code == 200
        assert r.json()["status"] == "running"
        described = (await http.get(f"/runs/{run_id}")).json()
        assert described["state"] == "waiting"
        assert [w["event"] for w in described["waiting_for"]] == ["approval.granted"]


async def test_a_run_started_with_a_deadline_ends_at_it(gs: GatewayStack) -> None:
    # parked waits for an approval that never comes, and declares no spec.deadline: the
    # deadline given at the start is the run's own timer, and without a goto it fails.
    async with gs.http() as http:
        r = await http.post("/runs", json={"workflow": "parked", "deadline": 1})
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        result = (await http.get(f"/runs/{run_id}/result", params={"timeout": TIMEOUT})).json()
        assert result["status"] == "failed"
        assert result["error"]["class"] == "timeout"
        assert result["error"]["message"] == "the run did not finish within 1s"
        timers = [
            r["data"]
            for r in (await http.get(f"/runs/{run_id}/log")).json()["records"]
            if r["type"] == "io.interlock.timer.scheduled"
        ]
        assert [t["purpose"] for t in timers] == ["run-deadline"]
        # 0: ended at once, nothing asked for.
        r = await http.post(
            "/runs", json={"workflow": "hello", "inputs": {"message": "x"}, "deadline": 0}
        )
        run_id = r.json()["run_id"]
        result = (await http.get(f"/runs/{run_id}/result", params={"timeout": TIMEOUT})).json()
        assert result["status"] == "failed"
        assert result["error"]["message"] == "the run did not finish within 0s"
        records = (await http.get(f"/runs/{run_id}/log")).json()["records"]
        assert "io.interlock.action.requested" not in [r["type"] for r in records]
        for bad in (-1, "2m", 10**12):
            r = await http.post("/runs", json={"workflow": "parked", "deadline": bad})
            assert r.status_code == 400, (bad, r.text)
            assert "deadline" in r.json()["detail"]


async def test_the_live_log_streams_until_a_signal_ends_the_run(gs: GatewayStack) -> None:
    async with gs.http() as http:
        run_id = (await http.post("/runs", json={"workflow": "parked"})).json()["run_id"]
        seen: list[str] = []
        ended = asyncio.Event()
        waiting = asyncio.Event()

        async def listen() -> None:
            async with http.stream("GET", f"/runs/{run_id}/log/stream") as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        seen.append(line.removeprefix("event: "))
                        if seen[-1] == "io.interlock.state.entered":
                            waiting.set()
                        if seen[-1] == "end":
                            ended.set()
                            return

        listener = asyncio.create_task(listen())
        await asyncio.wait_for(waiting.wait(), TIMEOUT)
        assert not ended.is_set()
        r = await http.post(f"/runs/{run_id}/signals/approval.granted", json={"by": "ana"})
        assert r.status_code == 200, r.text
        assert r.json()["outcome"] == "moved"
        await asyncio.wait_for(listener, TIMEOUT)
    assert seen[0] == "io.interlock.run.started"
    assert seen[-2:] == ["io.interlock.run.completed", "end"]


async def test_cancel(gs: GatewayStack) -> None:
    async with gs.http() as http:
        run_id = (await http.post("/runs", json={"workflow": "parked"})).json()["run_id"]
        r = await http.post(f"/runs/{run_id}/cancel", json={"reason": "not needed"})
        assert r.json() == {"run_id": run_id, "cancelled": True}
        r = await http.post(f"/runs/{run_id}/cancel")
        assert r.json() == {"run_id": run_id, "cancelled": False}
        result = (await http.get(f"/runs/{run_id}/result")).json()
        assert result["status"] == "cancelled"


async def test_workflows_and_agents(gs: GatewayStack) -> None:
    client = Client(gs.stack.client.nc, gs.stack.subjects)
    async with gs.http("reader") as http:
        listed = (await http.get("/workflows")).json()
        assert [w["name"] for w in listed] == ["hello", "parked"]
        assert listed == same_as(await client.workflows())
        one = await http.get("/workflows/hello")
        assert one.json() == same_as(await client.workflow("hello"))
        assert (await http.get("/workflows/default/hello")).json() == one.json()
        assert (await http.get("/workflows/nope")).status_code == 404
        agents = (await http.get("/agents")).json()
        assert [a["name"] for a in agents] == ["testagent"]


async def _letters(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    """The dead letters listed, once there are any (within ``TIMEOUT``)."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while not (found := (await http.get("/dead-letters")).json()):
        assert asyncio.get_running_loop().time() < deadline, "no dead letter"
        await asyncio.sleep(0.05)
    return found  # type: ignore[no-any-return]


async def test_dead_letters_list_show_redrive(gs: GatewayStack) -> None:
    await gs.stack.js.publish(gs.stack.subjects.event("com.example.broken"), b"{not json")
    async with gs.http() as http:
        [letter] = await _letters(http)
        seq = letter["seq"]
        assert letter["reason"] == "bad-json"
        assert letter["redrive_refusal"] is None
        shown = (await http.get(f"/dead-letters/{seq}")).json()
        assert shown == letter
        async with gs.http("reader") as reader:
            assert (await reader.post(f"/dead-letters/{seq}/redrive")).status_code == 403
        r = await http.post(f"/dead-letters/{seq}/redrive")
        assert r.status_code == 200
        assert r.json()["seq"] == seq
        assert (await http.get(f"/dead-letters/{seq}")).status_code == 404
        assert (await http.get("/dead-letters/0")).status_code == 400


async def test_a_letter_that_kept_only_the_start_of_its_message_is_a_409(
    gs: GatewayStack,
) -> None:
    """Redriving a letter that kept only the first 16 KiB of its message would publish a
    message nobody sent: the gateway answers 409 with a problem body and keeps the letter."""
    size = gs.stack.client.nc.max_payload - 4096
    body = json.dumps(
        {
            "specversion": "1.0",
            "id": "huge",
            "source": "t",
            "type": "com.example.huge",
            "data": {"blob": "x" * size},
        }
    ).encode()
    headers = {"Content-Type": "application/cloudevents+json"}
    await gs.stack.js.publish(gs.stack.subjects.event("com.example.huge"), body, headers=headers)
    async with gs.http() as http:
        [letter] = await _letters(http)
        assert letter["reason"] == "too-large"
        # The listing says so before anyone tries.
        assert f"of a {len(body):,}-byte message" in letter["redrive_refusal"]
        r = await http.post(f"/dead-letters/{letter['seq']}/redrive")
        assert r.status_code == 409
        assert r.headers["content-type"] == "application/problem+json"
        problem = r.json()
        assert problem["status"] == 409
        assert problem["type"].endswith("not-redrivable")
        assert f"of a {len(body):,}-byte message" in problem["detail"]
        assert (await http.get(f"/dead-letters/{letter['seq']}")).status_code == 200


ENDPOINTS = [
    ("GET", "/workflows"),
    ("GET", "/workflows/hello"),
    ("GET", "/agents"),
    ("GET", "/queues"),
    ("POST", "/workflows/default/hello/pause"),
    ("POST", "/workflows/default/hello/resume"),
    ("GET", "/runs"),
    ("POST", "/runs"),
    ("GET", "/runs/r1"),
    ("GET", "/runs/r1/result"),
    ("GET", "/runs/r1/log"),
    ("GET", "/runs/r1/log/stream"),
    ("POST", "/runs/r1/cancel"),
    ("POST", "/runs/r1/signals/go"),
    ("GET", "/dead-letters"),
    ("GET", "/dead-letters/1"),
    ("POST", "/dead-letters/1/redrive"),
    ("POST", "/events"),
]
OPERATOR_ONLY = {"POST"}


async def test_each_endpoint_asks_credentials_and_the_right_role(gs: GatewayStack) -> None:
    async def status(client: httpx.AsyncClient, method: str, path: str) -> int:
        return (await client.request(method, path, json={})).status_code

    async with (
        gs.http(None) as anonymous,
        gs.http("reader") as reader,
        gs.http("publisher") as publisher,
    ):
        for method, path in ENDPOINTS:
            assert await status(anonymous, method, path) == 401, (method, path)
            by_reader = await status(reader, method, path)
            if method in OPERATOR_ONLY:
                assert by_reader == 403, (method, path)
            else:
                assert by_reader != 403, (method, path)
            if path != "/events":
                assert await status(publisher, method, path) == 403, (method, path)
        # A publisher's token that asks to read is told what it may do instead.
        refused = await publisher.get("/runs")
        assert refused.json()["role"] == "publisher"
        assert refused.json()["detail"] == (
            "role publisher may not read runs: a publisher's token may only send events "
            "(POST /events) of the types com.example.*; reading takes a reader's or an "
            "operator's token"
        )
    async with gs.http(None) as http:
        doc = (await http.get("/openapi.json")).json()
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    for method, path in ENDPOINTS:
        template = {
            "/workflows/hello": "/workflows/{name}",
            "/runs/r1": "/runs/{run_id}",
            "/runs/r1/result": "/runs/{run_id}/result",
            "/runs/r1/log": "/runs/{run_id}/log",
            "/runs/r1/log/stream": "/runs/{run_id}/log/stream",
            "/runs/r1/cancel": "/runs/{run_id}/cancel",
            "/runs/r1/signals/go": "/runs/{run_id}/signals/{name}",
            "/dead-letters/1": "/dead-letters/{seq}",
            "/dead-letters/1/redrive": "/dead-letters/{seq}/redrive",
            "/workflows/default/hello/pause": "/workflows/{namespace}/{name}/pause",
            "/workflows/default/hello/resume": "/workflows/{namespace}/{name}/resume",
        }.get(path, path)
        assert (method, template) in documented
