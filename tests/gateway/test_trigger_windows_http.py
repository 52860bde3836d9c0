"""A batched trigger fed over HTTP: an operator's token posting one batched request of
CloudEvents to the gateway (a publisher's is told only that they are stored). The answer
says which window each event joins; a full batch starts one run with its events; the rest
wait in their window, seen at ``GET /queues``; the run's description names its window's
events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from interlock.transport.subjects import Subjects
from support.gateway import GatewayStack, gateway_stack
from support.runtime import yaml

ROWS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: rows}
    spec:
      inputs: {events: {type: list, required: true}}
      triggers:
        - event: com.example.row
          batch: {key: data.table, max_events: 5, max_wait: 1h}
          input: {row: "{{ data.row }}"}
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - {event: com.example.go, goto: done}
        done: {type: terminal}
    """
)


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects) -> AsyncIterator[GatewayStack]:
    async with gateway_stack(nats_url, subjects, [ROWS]) as stack:
        yield stack


def row(n: int, table: str) -> dict[str, object]:
    return {
        "specversion": "1.0",
        "id": f"row-{n}",
        "source": "https://db.example/changes",
        "type": "com.example.row",
        "data": {"table": table, "row": n},
    }


async def test_a_batched_post_fills_its_windows(gs: GatewayStack) -> None:
    posted = [row(n, "orders") for n in range(7)] + [row(n, "users") for n in range(7, 12)]
    async with gs.http("operator") as http:
        r = await http.post(
            "/events",
            headers={"Content-Type": "application/cloudevents-batch+json"},
            content=json.dumps(posted),
        )
    assert r.status_code == 202, r.text
    answers = r.json()["events"]
    assert [a["gathered"] for a in answers] == [["default/rows#trigger1@batch orders"]] * 7 + [
        ["default/rows#trigger1@batch users"]
    ] * 5
    assert all(a["started"] == [] for a in answers)
    async with gs.http("operator") as http:
        keyless = {**row(99, "x"), "data": {"row": 99}}  # no table: no key
        r = await http.post(
            "/events",
            headers={"Content-Type": "application/cloudevents+json"},
            content=json.dumps(keyless),
        )
    [refused] = r.json()["events"][0]["refused"]
    assert refused["reason"] == "bad-trigger-key"
    assert r.json()["events"][0]["gathered"] == []
    async with gs.http("reader") as http:
        for _ in range(600):
            runs = (await http.get("/runs", params={"workflow": "rows"})).json()["runs"]
            queues = (await http.get("/queues", params={"workflow": "rows"})).json()
            if len(runs) == 2 and queues:
                break
            await asyncio.sleep(0.05)
        assert len(runs) == 2, runs
        assert [(q["limit"], q["key"], q["queued"]) for q in queues] == [
            ("default/rows#trigger1@batch", "orders", 2)
        ]
        described = [(await http.get(f"/runs/{r['run_id']}")).json() for r in runs]
    windows = sorted((d["window"]["key"], d["window"]["events"]) for d in described)
    assert windows == [
        ("orders", [f"row-{n}" for n in range(5)]),
        ("users", [f"row-{n}" for n in range(7, 12)]),
    ]
    inputs = sorted(d["inputs"]["events"][0]["row"] for d in described)
    assert inputs == [0, 7]
